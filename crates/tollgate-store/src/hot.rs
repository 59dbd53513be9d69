//! A few slots per shard where one-integer states (GCRA and the shaping leaky
//! bucket: a TAT) live, so that a check of one limit on such a key is one
//! compare-and-swap, with no lock.
//!
//! A key's TAT is in a hot slot or in the shard's table, never in both; keys
//! move in and out under the shard's lock only. Everything that writes under
//! that lock (new keys, checks of several limits, sweeps, evictions, resets)
//! locks each slot it touches and keeps it until it lets the shard go, so a
//! check without the lock never sees, or overwrites, a state such a writer may
//! still take back. A lock-free check that meets a locked slot, or a key not
//! in a slot, takes the shard's lock instead.
//!
//! Each slot is one 128-bit word (the TAT and a tag: whether the slot holds a
//! key, whether it is locked, and a version bumped by every change under the
//! lock) beside the key's 128-bit hash. The lock-free check swaps the whole
//! word, so it fails if anything but another such check touched the slot since
//! it read it, however the TAT compares.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use portable_atomic::AtomicU128;
use tollgate_core::{Decision, Nanos, Tat};

use crate::table::{Entries, Entry, Sweep, Table};

/// Slots per shard. A shard's hot keys are few: these are the keys whose
/// checks meet each other on one lock, and a miss costs a scan of two cache
/// lines.
const WAYS: usize = 4;

/// The tag's bits: the slot holds a key.
const LIVE: u64 = 0b10;
/// The tag's bits: a writer under the shard's lock holds the slot.
const LOCKED: u64 = 0b01;
/// The version, above the two flags, counts changes under the lock.
const VERSION: u64 = 0b100;

#[inline]
fn word(tat: Nanos, tag: u64) -> u128 {
    (u128::from(tag) << 64) | u128::from(tat)
}

#[inline]
fn tat_of(word: u128) -> Nanos {
    word as u64
}

#[inline]
fn tag_of(word: u128) -> u64 {
    (word >> 64) as u64
}

/// The tag of a slot's next state: the version moved on, the flags set.
#[inline]
fn next_tag(tag: u64, flags: u64) -> u64 {
    ((tag & !(LIVE | LOCKED)).wrapping_add(VERSION)) | flags
}

#[derive(Default)]
#[repr(align(32))]
struct Slot {
    word: AtomicU128,
    key: [AtomicU64; 2],
}

impl Slot {
    #[inline]
    fn key(&self) -> u128 {
        (u128::from(self.key[0].load(Ordering::Acquire)) << 64)
            | u128::from(self.key[1].load(Ordering::Acquire))
    }

    /// Only while locked. Released, so that a check that reads the new key
    /// then reads the word at or after the lock, whose tag it cannot match.
    fn set_key(&self, key: u128) {
        self.key[0].store((key >> 64) as u64, Ordering::Release);
        self.key[1].store(key as u64, Ordering::Release);
    }

    fn is_live(&self) -> bool {
        tag_of(self.word.load(Ordering::Acquire)) & LIVE != 0
    }

    /// Locks the slot against lock-free checks, which may still swap its TAT
    /// until this succeeds; returns the word it locked.
    fn lock(&self) -> u128 {
        let mut seen = self.word.load(Ordering::Acquire);
        loop {
            debug_assert!(tag_of(seen) & LOCKED == 0, "a slot locked twice");
            let locked = word(tat_of(seen), tag_of(seen) | LOCKED);
            match self
                .word
                .compare_exchange_weak(seen, locked, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return locked,
                Err(actual) => seen = actual,
            }
        }
    }

    /// Frees the slot if it holds a key at rest by `now` and no writer holds
    /// it: the state is then the same as none.
    fn free_at_rest(&self, now: Nanos) -> bool {
        let mut seen = self.word.load(Ordering::Acquire);
        loop {
            let tag = tag_of(seen);
            if tag & (LIVE | LOCKED) != LIVE || tat_of(seen) > now {
                return false;
            }
            match self.word.compare_exchange_weak(
                seen,
                word(0, next_tag(tag, 0)),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => seen = actual,
            }
        }
    }
}

/// Sixteen bits of a key for [`Lanes`]: from the high half's low bits, which
/// neither the shard (the high half's top bits) nor the table's buckets (the
/// low half) are picked by. Odd, so never 0, which is an empty lane.
#[inline]
fn lane_tag(key: u128) -> u64 {
    u64::from((key >> 64) as u16 | 1)
}

/// Which lanes of 16 bits in `lanes` hold `tag`, as the top bit of each.
#[inline]
fn matching(lanes: u64, tag: u64) -> u64 {
    const ONES: u64 = 0x0001_0001_0001_0001;
    const TOPS: u64 = 0x8000_8000_8000_8000;
    let x = lanes ^ tag.wrapping_mul(ONES);
    x.wrapping_sub(ONES) & !x & TOPS
}

/// Whether `lanes` say a slot may hold `key`: when not, none does, unless
/// the lanes have changed since.
#[inline]
pub(crate) fn may_hold(lanes: Lanes, key: u128) -> bool {
    matching(lanes, lane_tag(key)) != 0
}

/// A hint of which keys the hot slots hold: one 16-bit [`lane_tag`] per slot,
/// 0 for an empty one. Kept beside the shard's lock, so that a check of a key
/// in no slot costs no cache line the locked path does not touch anyway. A
/// stale hint costs a check the lock-free path, never a wrong answer: the
/// slots themselves are always validated.
pub(crate) type Lanes = u64;

/// One shard's hot slots, shared by the lock-free checks and the shard.
#[derive(Default)]
pub(crate) struct HotSlots {
    slots: [Slot; WAYS],
}

impl HotSlots {
    /// Checks the key `key` if a hot slot holds it and no writer does:
    /// `step` decides from the TAT and says the TAT to store, if any. `None`
    /// when the check must take the shard's lock. `lanes` says which slots
    /// may hold the key.
    #[inline(always)]
    pub(crate) fn check(
        &self,
        key: u128,
        lanes: Lanes,
        step: impl Fn(Tat) -> (Decision, Option<Tat>),
    ) -> Option<Decision> {
        let mut candidates = matching(lanes, lane_tag(key));
        // At most one slot holds the key.
        while candidates != 0 {
            let slot = &self.slots[candidates.trailing_zeros() as usize / 16];
            candidates &= candidates - 1;
            let seen = slot.word.load(Ordering::Acquire);
            if tag_of(seen) & (LIVE | LOCKED) != LIVE || slot.key() != key {
                continue;
            }
            return swap(slot, seen, step);
        }
        None
    }
}

/// Decides from `seen`, a word of `slot` read before the slot's key was found
/// to be the key checked, and swaps in the TAT decided, deciding again while
/// other lock-free checks beat it to it. `None` once a writer under the lock
/// has touched the slot.
///
/// The key read is trusted once the tag has not changed from `seen` to a
/// later read of the word: keys change only while a slot is locked, and
/// locking and unlocking each change the tag. The swap itself is that read
/// when it succeeds; a decision that writes nothing reads the tag once more.
#[inline]
fn swap(
    slot: &Slot,
    mut seen: u128,
    step: impl Fn(Tat) -> (Decision, Option<Tat>),
) -> Option<Decision> {
    let tag = tag_of(seen);
    loop {
        let (decision, write) = step(Tat(tat_of(seen)));
        let Some(Tat(tat)) = write else {
            return (tag_of(slot.word.load(Ordering::Acquire)) == tag).then_some(decision);
        };
        match slot.word.compare_exchange_weak(
            seen,
            word(tat, tag),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(decision),
            // Another lock-free check moved the TAT: decide again.
            Err(actual) if tag_of(actual) == tag => seen = actual,
            Err(_) => return None,
        }
    }
}

/// A key a writer holds: its slot, locked, and the state the writer sees and
/// writes.
struct Held {
    key: u128,
    slot: usize,
    entry: Entry<Tat>,
    /// False once removed: the slot is freed when let go.
    present: bool,
}

/// The lanes of the slots as they are now.
fn lanes_of(slots: &[Slot; WAYS]) -> Lanes {
    slots.iter().enumerate().fold(0, |lanes, (i, slot)| {
        if slot.is_live() {
            lanes | lane_tag(slot.key()) << (16 * i)
        } else {
            lanes
        }
    })
}

/// The shard's view of its TAT keys: the hot slots, then the table; see the
/// module's documentation. What a writer holds is written back and unlocked
/// by [`TatEntries::release`], which the shard's guard calls when it lets
/// the shard go.
///
/// Laid out for the check of a key in no slot, the most common in a shard of
/// many keys: what it reads (the table, the lanes, and whether anything is
/// held) is on the first cache line, and what is held is out of line (a
/// vector allocated once).
#[repr(C)]
pub(crate) struct TatEntries {
    table: Table<Tat>,
    /// The lanes as last read: every slot holding a key that no writer
    /// holds has its tag here, so that a key in no slot (most keys, in a
    /// shard of many) is told so without reading the slots.
    lanes: Lanes,
    /// Slots holding a key or held present.
    hot_len: usize,
    /// Whether a slot is held, or was emptied, since the last release.
    dirty: bool,
    held: Vec<Held>,
    hot: Arc<HotSlots>,
}

impl TatEntries {
    pub(crate) fn new(hot: Arc<HotSlots>) -> Self {
        Self {
            hot,
            table: Table::default(),
            held: Vec::new(),
            hot_len: 0,
            dirty: false,
            lanes: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len() + self.hot_len
    }

    /// Writes back and unlocks every slot held; the slots' new [`Lanes`] if
    /// their keys may have changed.
    #[inline]
    pub(crate) fn release(&mut self) -> Option<Lanes> {
        if !self.dirty {
            return None;
        }
        self.release_held()
    }

    #[cold]
    #[inline(never)]
    fn release_held(&mut self) -> Option<Lanes> {
        self.dirty = false;
        for held in self.held.drain(..) {
            let slot = &self.hot.slots[held.slot];
            let tag = tag_of(slot.word.load(Ordering::Relaxed));
            let next = if held.present {
                word(held.entry.state.0, next_tag(tag, LIVE))
            } else {
                word(0, next_tag(tag, 0))
            };
            slot.word.store(next, Ordering::Release);
        }
        self.lanes = lanes_of(&self.hot.slots);
        Some(self.lanes)
    }

    /// [`Entries::get_mut`] for a check that has just taken the shard's lock
    /// after `lanes`, read before, showed that no slot held `key`
    /// ([`may_hold`]). While the lanes are still those, no slot is free and
    /// none is held (as none is unless the sweep the lock ran touched them),
    /// the key is in the table or nowhere, and nothing else need be looked at.
    #[inline(always)]
    pub(crate) fn get_mut_missed(&mut self, key: u128, lanes: Lanes) -> Option<&mut Entry<Tat>> {
        if self.dirty || self.lanes != lanes || self.hot_len < WAYS {
            return self.get_mut(key);
        }
        self.table.get_mut(key)
    }

    #[inline]
    fn held(&mut self, key: u128) -> Option<usize> {
        if !self.dirty {
            return None;
        }
        self.held.iter().position(|h| h.key == key)
    }

    /// The slot holding `key`, if one does (and no writer holds it: this one
    /// would have found it among its own).
    #[inline]
    fn hot_slot(&self, key: u128) -> Option<usize> {
        let mut candidates = matching(self.lanes, lane_tag(key));
        while candidates != 0 {
            let index = candidates.trailing_zeros() as usize / 16;
            candidates &= candidates - 1;
            let slot = &self.hot.slots[index];
            if slot.is_live() && slot.key() == key {
                return Some(index);
            }
        }
        None
    }

    /// The slot `index` was just emptied.
    fn freed(&mut self, index: usize) {
        self.hot_len -= 1;
        self.lanes &= !(0xffff << (16 * index));
        self.dirty = true;
    }

    /// An empty slot no writer holds.
    #[inline]
    fn free_slot(&self) -> Option<usize> {
        // With every slot holding a key (a shard of many keys, nearly always)
        // there is none, and the scan below would be paid by every locked check.
        if self.hot_len == WAYS {
            return None;
        }
        (0..WAYS).find(|&i| {
            (self.lanes >> (16 * i)) as u16 == 0
                && self.held.iter().all(|h| h.slot != i)
                && !self.hot.slots[i].is_live()
        })
    }

    /// Locks the slot `index` and holds `key` in it with `entry`.
    fn claim(&mut self, index: usize, key: u128, entry: Entry<Tat>) -> &mut Entry<Tat> {
        let slot = &self.hot.slots[index];
        slot.lock();
        slot.set_key(key);
        self.hot_len += 1;
        &mut self.hold(index, key, entry).entry
    }

    /// Locks the slot `index`, which holds `key`, and holds its state.
    fn take(&mut self, index: usize, key: u128) -> &mut Held {
        let tat = tat_of(self.hot.slots[index].lock());
        let entry = Entry {
            state: Tat(tat),
            expires_at: tat,
        };
        self.hold(index, key, entry)
    }

    /// Where `key` is among those held, taking its slot first if one holds
    /// it; `None` when no slot does.
    fn held_or_taken(&mut self, key: u128) -> Option<usize> {
        if let held @ Some(_) = self.held(key) {
            return held;
        }
        let index = self.hot_slot(key)?;
        self.take(index, key);
        Some(self.held.len() - 1)
    }

    /// Locks the slot `index`, holding `key` with `entry`.
    fn hold(&mut self, index: usize, key: u128, entry: Entry<Tat>) -> &mut Held {
        self.dirty = true;
        self.held.push(Held {
            key,
            slot: index,
            entry,
            present: true,
        });
        self.held.last_mut().expect("just pushed")
    }
}

impl Entries<Tat> for TatEntries {
    #[inline]
    fn get_mut(&mut self, key: u128) -> Option<&mut Entry<Tat>> {
        if let Some(i) = self.held(key) {
            let held = &mut self.held[i];
            return held.present.then_some(&mut held.entry);
        }
        if let Some(index) = self.hot_slot(key) {
            return Some(&mut self.take(index, key).entry);
        }
        // A key found in the table moves to a slot that has come free, so
        // that its next checks need no lock.
        if let Some(index) = self.free_slot() {
            let entry = self.table.remove(key)?;
            return Some(self.claim(index, key, entry));
        }
        self.table.get_mut(key)
    }

    fn insert(&mut self, key: u128, entry: Entry<Tat>) {
        match self.held_or_taken(key) {
            Some(i) => {
                let held = &mut self.held[i];
                self.hot_len += usize::from(!held.present);
                held.present = true;
                held.entry = entry;
            }
            None => self.table.insert(key, entry),
        }
    }

    fn remove(&mut self, key: u128) -> Option<Entry<Tat>> {
        match self.held_or_taken(key) {
            Some(i) => {
                let held = &mut self.held[i];
                if !held.present {
                    return None;
                }
                held.present = false;
                self.hot_len -= 1;
                Some(Entry {
                    state: held.entry.state,
                    expires_at: held.entry.expires_at,
                })
            }
            None => self.table.remove(key),
        }
    }

    fn insert_new(&mut self, key: u128, entry: Entry<Tat>) {
        if let Some(i) = self.held(key) {
            let held = &mut self.held[i];
            held.present = true;
            held.entry = entry;
            self.hot_len += 1;
            return;
        }
        match self.free_slot() {
            Some(index) => {
                self.claim(index, key, entry);
            }
            None => self.table.insert_new(key, entry),
        }
    }
}

impl Sweep for TatEntries {
    fn sweep(&mut self, now: Nanos) {
        self.table.sweep(now);
        for index in 0..WAYS {
            if self.hot.slots[index].free_at_rest(now) {
                self.freed(index);
            }
        }
    }

    fn evict_at_rest(&mut self, start: usize, now: Nanos) -> Result<(), Nanos> {
        let mut soonest = Nanos::MAX;
        for index in 0..WAYS {
            let slot = &self.hot.slots[index];
            if slot.free_at_rest(now) {
                self.freed(index);
                return Ok(());
            }
            let seen = slot.word.load(Ordering::Acquire);
            if tag_of(seen) & LIVE != 0 {
                soonest = soonest.min(tat_of(seen));
            }
        }
        self.table
            .evict_at_rest(start, now)
            .map_err(|rests_at| rests_at.min(soonest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tat: Nanos) -> Entry<Tat> {
        Entry {
            state: Tat(tat),
            expires_at: tat,
        }
    }

    /// A decision that carries the TAT it was made from.
    fn saw(tat: Nanos) -> Decision {
        Decision::allow(1, tat, std::time::Duration::ZERO)
    }

    /// A lock-free check that adds `by` to the TAT and says what it saw.
    fn add(hot: &HotSlots, key: u128, by: u64) -> Option<u64> {
        hot.check(key, lanes_of(&hot.slots), |Tat(tat)| {
            (saw(tat), Some(Tat(tat + by)))
        })
        .map(|decision| decision.remaining())
    }

    fn entries() -> (Arc<HotSlots>, TatEntries) {
        let hot = Arc::<HotSlots>::default();
        (Arc::clone(&hot), TatEntries::new(hot))
    }

    #[test]
    fn a_key_is_checked_without_the_lock_only_once_released() {
        let (hot, mut tat) = entries();
        tat.insert_new(7, entry(100));
        assert_eq!(add(&hot, 7, 1), None, "held by the writer that put it");
        tat.release();
        assert_eq!(add(&hot, 7, 1), Some(100));
        assert_eq!(add(&hot, 7, 1), Some(101));
        assert_eq!(add(&hot, 8, 1), None, "not a hot key");
        // A writer holding it keeps lock-free checks out, and its write
        // stands over theirs.
        tat.get_mut(7).expect("held").state = Tat(500);
        assert_eq!(add(&hot, 7, 1), None);
        tat.release();
        assert_eq!(add(&hot, 7, 1), Some(500));
        assert_eq!(tat.len(), 1);
    }

    #[test]
    fn a_check_that_read_before_a_writer_came_and_went_does_not_write() {
        let (hot, mut tat) = entries();
        tat.insert_new(7, entry(100));
        tat.release();
        let slot = &hot.slots[0];
        let stale = slot.word.load(Ordering::Acquire);
        // The writer takes the key back to the TAT the check read.
        tat.get_mut(7).expect("held").state = Tat(100);
        tat.release();
        assert_eq!(tat_of(slot.word.load(Ordering::Acquire)), 100);
        assert_eq!(swap(slot, stale, |Tat(t)| (saw(t), Some(Tat(t + 1)))), None);
        assert_eq!(swap(slot, stale, |Tat(t)| (saw(t), None)), None);
        // The slot freed and taken by another key: the old key's read fails.
        let stale = slot.word.load(Ordering::Acquire);
        assert!(tat.remove(7).is_some());
        tat.release();
        tat.insert_new(9, entry(100));
        tat.release();
        assert_eq!(swap(slot, stale, |Tat(t)| (saw(t), Some(Tat(t + 1)))), None);
        assert_eq!(add(&hot, 7, 1), None);
        assert_eq!(add(&hot, 9, 1), Some(100));
    }

    #[test]
    fn keys_fill_the_slots_then_the_table_and_move_up_as_slots_come_free() {
        let (hot, mut tat) = entries();
        for key in 1..=WAYS as u128 + 1 {
            tat.insert_new(key, entry(key as u64 * 10));
        }
        tat.release();
        assert_eq!(tat.len(), WAYS + 1);
        let last = WAYS as u128 + 1;
        assert_eq!(add(&hot, last, 0), None, "in the table");
        // Key 1 comes to rest at 10 and is swept; the last key moves up.
        tat.sweep(10);
        assert_eq!(tat.len(), WAYS);
        assert_eq!(add(&hot, 1, 0), None);
        assert!(tat.get_mut(last).is_some());
        tat.release();
        assert_eq!(add(&hot, last, 0), Some(last as u64 * 10));
        assert_eq!(tat.len(), WAYS);
    }

    #[test]
    fn a_lookup_after_a_lane_miss_falls_back_whenever_the_slots_may_have_moved() {
        let (hot, mut tat) = entries();
        let empty = tat.lanes;
        for key in 1..=WAYS as u128 + 1 {
            tat.insert_new(key, entry(key as u64 * 10));
        }
        tat.release();
        let full = tat.lanes;
        let last = WAYS as u128 + 1;
        // The lanes read before still stand: the table alone decides.
        assert_eq!(
            tat.get_mut_missed(last, full).map(|e| e.state),
            Some(Tat(last as u64 * 10))
        );
        assert!(tat.get_mut_missed(99, full).is_none());
        // Lanes read before key 1 took its slot: it is found there.
        assert_eq!(tat.get_mut_missed(1, empty).map(|e| e.state), Some(Tat(10)));
        tat.release();
        // A slot came free: the table's key moves up, as with `get_mut`.
        tat.sweep(10);
        tat.release();
        assert!(tat.get_mut_missed(last, tat.lanes).is_some());
        tat.release();
        assert_eq!(add(&hot, last, 0), Some(last as u64 * 10));
    }

    #[test]
    fn a_removed_key_is_gone_and_an_undone_removal_puts_it_back() {
        let (hot, mut tat) = entries();
        tat.insert_new(7, entry(100));
        tat.release();
        let removed = tat.remove(7).expect("there");
        assert!(tat.get_mut(7).is_none());
        assert_eq!(tat.len(), 0);
        tat.insert(7, removed);
        tat.release();
        assert_eq!(tat.len(), 1);
        assert_eq!(add(&hot, 7, 0), Some(100));
    }

    #[test]
    fn inserting_over_a_hot_key_replaces_it_in_its_slot() {
        let (hot, mut tat) = entries();
        tat.insert_new(7, entry(100));
        tat.release();
        tat.insert(7, entry(300));
        tat.release();
        assert_eq!(tat.len(), 1);
        assert_eq!(add(&hot, 7, 0), Some(300));
    }

    #[test]
    fn eviction_frees_a_slot_at_rest_or_says_when_one_will_be() {
        let (_, mut tat) = entries();
        for key in 1..=WAYS as u128 {
            tat.insert_new(key, entry(100 + key as u64));
        }
        tat.release();
        assert_eq!(tat.evict_at_rest(0, 50), Err(101));
        assert_eq!(tat.evict_at_rest(0, 101), Ok(()));
        assert_eq!(tat.len(), WAYS - 1);
    }
}
