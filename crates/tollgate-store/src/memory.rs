use std::future::{Future, ready};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tollgate_core::IntoNanos;
use tollgate_core::{
    Algorithm, Clock, Concurrency, Decision, FixedWindow, Gcra, HitCounter, LeakyBucket,
    LeakyBucketShaping, Lease, LeaseId, LeaseStore, Leases, Level, Limit, Log, Nanos, Outcome,
    SlidingCounter, SlidingLog, Stamped, StateMachine, Store, StoreError, Tat, TokenBucket, Tokens,
    WindowCount, WindowPair,
};

use crate::FastClock;
use crate::hot::{HotSlots, Lanes, may_hold};
use crate::shard::{Shard, Slot};
use crate::table::{Entries, Entry};

/// How the memory store is sized.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// The most keys held at once, every kind of state (concurrency leases
    /// too) counted, split evenly across the shards. When a shard is full, a
    /// new key takes the place of an entry at rest (back to full, so that
    /// forgetting it changes no decision), found among a few sampled; when
    /// none of them is at rest, the new key's check is denied (see
    /// [`MemoryStats::refusals`]) and no state that still limits is forgotten.
    pub max_keys: usize,
    /// Number of shards, rounded up to a power of two (and down so that each
    /// holds at least 64 keys of `max_keys`). More shards, less contention.
    pub shards: usize,
    /// How often each shard drops the entries whose state is back to full.
    pub sweep_interval: Duration,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_keys: 1_000_000,
            shards: 128,
            sweep_interval: Duration::from_secs(1),
        }
    }
}

/// A snapshot of what a [`MemoryStore`] holds and has had to do to stay under
/// its cap, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Keys held now, including those back to full but not yet swept.
    pub keys: usize,
    /// Entries at rest dropped to make room for a new key, since the store
    /// was made (entries swept once back to full are not counted).
    pub evictions: u64,
    /// New keys denied because their shard was full and nothing sampled in
    /// it was at rest, since the store was made.
    pub refusals: u64,
}

/// A shard and its hot slots (see [`crate::hot`]), on their own cache lines,
/// so that threads working on different shards do not slow each other down.
/// The hot slots' lanes and address come first, on the line of the lock's
/// own word: a check that finds its key in no slot costs no line the lock
/// does not.
#[repr(C, align(128))]
struct Padded {
    lanes: AtomicU64,
    hot: Arc<HotSlots>,
    shard: Mutex<Shard>,
}

impl Padded {
    /// The shard locked, not swept (see [`Shard::maintain`]).
    #[inline(always)]
    fn lock(&self) -> Locked<'_> {
        Locked {
            shard: self.shard.lock(),
            lanes: &self.lanes,
        }
    }
}

/// A shard locked: when let go, it first writes back and unlocks the hot
/// slots it holds, so that none stays locked past the decision that took it,
/// and brings their lanes up to date.
struct Locked<'a> {
    shard: MutexGuard<'a, Shard>,
    lanes: &'a AtomicU64,
}

impl Deref for Locked<'_> {
    type Target = Shard;

    fn deref(&self) -> &Shard {
        &self.shard
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Shard {
        &mut self.shard
    }
}

impl Drop for Locked<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(lanes) = self.shard.release_hot() {
            self.lanes.store(lanes, Ordering::Relaxed);
        }
    }
}

/// The in-process store: keyed, sharded and bounded.
///
/// A key is stored as a 128-bit keyed hash of its algorithm and name (two
/// independently seeded hashes of the name, with seeds of the algorithm's
/// own), so every entry has the same small size and no key string is kept; the
/// seeds are random per store, so keys that collide cannot be crafted, and the
/// chance that any two of a billion live keys collide is below 10⁻²⁰.
pub struct MemoryStore<C = FastClock> {
    shards: Box<[Padded]>,
    shard_shift: u32,
    sweep_ns: Nanos,
    /// Two independent hashers per algorithm ([`Algorithm::index`]), so that
    /// one key under two algorithms is two states.
    hashers: [[foldhash::quality::RandomState; 2]; Algorithm::COUNT],
    lease_ids: LeaseIds,
    clock: C,
}

/// Where the memory store's lease ids come from: a keyed hash (SipHash, a
/// pseudo-random function) of a counter, under a key random per store, so
/// that an id cannot be guessed from others, yet two ids of one store
/// collide with a chance of about 2⁻⁶⁴ per pair.
#[derive(Default)]
struct LeaseIds {
    secret: RandomState,
    next: AtomicU64,
}

impl LeaseIds {
    fn next(&self) -> u64 {
        self.secret
            .hash_one(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// A memory store lease id as text: 16 hex digits.
fn lease_text(id: u64) -> LeaseId {
    LeaseId::new(format!("{id:016x}")).expect("hex digits make a lease id")
}

/// The number of a memory store lease id, if `id` is one.
fn lease_number(id: &LeaseId) -> Option<u64> {
    let text = id.as_str();
    (text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
}

/// The lease a check of `limit` took under the id `id`.
fn new_lease(limit: &Limit<'_>, id: u64) -> Lease {
    Lease {
        key: limit.key.to_owned(),
        cost: limit.cost,
        id: lease_text(id),
    }
}

/// The leases of a single-limit check that took one: out of line, as only
/// concurrency limits take leases.
#[cold]
#[inline(never)]
fn lease_of(limit: &Limit<'_>, id: u64) -> Vec<Lease> {
    vec![new_lease(limit, id)]
}

/// The lease id a check of `limit` takes if it admits: one for each
/// concurrency limit that costs something.
fn wants_lease(limit: &Limit<'_>) -> bool {
    limit.algorithm == Algorithm::Concurrency && limit.cost > 0
}

impl MemoryStore {
    /// A store on the real monotonic clock, read from the CPU's counter
    /// ([`FastClock`]).
    pub fn new(config: MemoryConfig) -> Self {
        Self::with_clock(config, FastClock::new())
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(MemoryConfig::default())
    }
}

/// What to do with the state a step of a multi-limit check produces (a single
/// limit just writes it: see [`commit`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Write it and remember how to take it back.
    Undoable,
    /// Only report: another limit of the request already denied it.
    Peek,
}

type Undo = Box<dyn FnOnce(&mut Shard) + Send>;

impl<C: Clock> MemoryStore<C> {
    /// A store that reads time from `clock`.
    pub fn with_clock(config: MemoryConfig, clock: C) -> Self {
        let max_keys = config.max_keys.max(1);
        // Each shard holds at least MIN_SHARD_KEYS (or all the keys), and
        // the shards' caps add up to exactly `max_keys`. A shard refuses a
        // new key once full, so with a few keys per shard a small cap turned
        // keys away while the store was nearly empty: 12 keys in 128 shards
        // of 2 met a full shard about once in 80 runs.
        let most_shards = 1 << (max_keys / MIN_SHARD_KEYS).max(1).ilog2();
        let shards = config
            .shards
            .clamp(1, 1 << 16)
            .next_power_of_two()
            .min(most_shards);
        let cap = |i: usize| max_keys / shards + usize::from(i < max_keys % shards);
        Self {
            shards: (0..shards)
                .map(|i| {
                    let hot = Arc::<HotSlots>::default();
                    Padded {
                        lanes: AtomicU64::new(0),
                        shard: Mutex::new(Shard::new(cap(i), Arc::clone(&hot))),
                        hot,
                    }
                })
                .collect(),
            shard_shift: 64 - shards.trailing_zeros(),
            sweep_ns: config.sweep_interval.into_nanos(),
            hashers: Default::default(),
            lease_ids: LeaseIds::default(),
            clock,
        }
    }

    /// Checks `limits` at the clock's current time; see [`Store::check`].
    #[inline]
    pub fn check_now(&self, limits: &[Limit<'_>]) -> Outcome {
        self.check_when(limits, || self.clock.now())
    }

    /// Checks `limits` at `now`: admitted only if all admit; a deny by one
    /// consumes nothing from any.
    #[inline]
    pub fn check_at(&self, limits: &[Limit<'_>], now: Nanos) -> Outcome {
        self.check_when(limits, || now)
    }

    /// Checks `limits` at the time `now` reads, read where each state is
    /// held (see [`Self::decide_tat`]), so that no check moves a state with
    /// a time older than the state's own.
    #[inline(always)]
    fn check_when(&self, limits: &[Limit<'_>], now: impl Fn() -> Nanos) -> Outcome {
        match limits {
            [limit] => {
                // The `Outcome` (320 bytes) is built here, in the caller,
                // from the decision alone. Built inside a function that
                // returned it, it was built on the stack and copied out
                // (memmove was 11% of a one-key benchmark's samples); here it
                // is written once where the caller wants it.
                let (decision, lease) = self.decide_one(limit, now);
                Outcome {
                    decisions: smallvec::smallvec![decision],
                    leases: lease.map_or_else(Vec::new, |id| lease_of(limit, id)),
                }
            }
            _ => self.check_all(limits, now),
        }
    }

    /// One limit alone: its decision and, when a concurrency limit admitted,
    /// the id of the lease it took.
    ///
    /// The two algorithms whose state is one TAT, GCRA the default among
    /// them, take a path of their own, inlined into the caller: at many keys
    /// a check waits on cache misses (the key's bytes, then its table entry),
    /// and the processor overlaps one check's misses with the next check's
    /// only while the instructions between them fit its reorder window. Each
    /// instruction on that path then costs 1–2 ns, and a function call with
    /// its saved registers and spills tens of instructions
    /// (docs/benchmarks.md, "The one-TAT path").
    #[inline(always)]
    fn decide_one(&self, limit: &Limit<'_>, now: impl Fn() -> Nanos) -> (Decision, Option<u64>) {
        match limit.algorithm {
            Algorithm::Gcra => (self.decide_tat(&Gcra, limit, now), None),
            Algorithm::LeakyBucketShaping { delay_after } => (
                self.decide_tat(&LeakyBucketShaping { delay_after }, limit, now),
                None,
            ),
            _ => self.decide_other(limit, now),
        }
    }

    /// One limit on a TAT: in a hot slot without the lock, else under it.
    ///
    /// The clock is read where the state is held: in the lock-free path
    /// after the slot's word is loaded (and again on each retry of its swap),
    /// under the lock once the key is looked up. A TAT cannot tell how
    /// recent the time that moved it was, so a `now` read before another
    /// check moved the state (a thread preempted, or waiting for the lock,
    /// between the two) turned the gap into a deny: about one answer in a
    /// million at 1,000,000,000 per second, burst 1,000,000 (issue 39).
    /// Read there, a check's time is never older than the state's: a swap
    /// succeeds only if the word is as loaded before the clock was read, and
    /// the lock orders the others.
    ///
    /// The key is hashed first: the hash waits on the key's bytes, and the
    /// clock's instructions, which depend on neither the key nor the
    /// state, run meanwhile.
    #[inline(always)]
    fn decide_tat<M: StateMachine<State = Tat>>(
        &self,
        machine: &M,
        limit: &Limit<'_>,
        now: impl Fn() -> Nanos,
    ) -> Decision {
        let (key, shard) = self.locate(limit.algorithm, limit.key);
        let cell = &self.shards[shard];
        let lanes = cell.lanes.load(Ordering::Relaxed);
        if may_hold(lanes, key) {
            if let Some(decision) = check_hot(machine, (&cell.hot, lanes), key, limit, &now) {
                return decision;
            }
            return self.decide_tat_locked(machine, cell, key, None, limit, now);
        }
        self.decide_tat_locked(machine, cell, key, Some(lanes), limit, now)
    }

    /// [`Self::decide_tat`] under the shard's lock: the key looked up (its
    /// hot slot taken, if it is in one; `lanes` are those read before the
    /// lock when they showed no slot held the key), then the clock read,
    /// then the step, then the shard's periodic sweep at that time.
    #[inline(always)]
    fn decide_tat_locked<M: StateMachine<State = Tat>>(
        &self,
        machine: &M,
        cell: &Padded,
        key: u128,
        lanes: Option<Lanes>,
        limit: &Limit<'_>,
        now: impl Fn() -> Nanos,
    ) -> Decision {
        let mut guard = cell.lock();
        let table = Tat::table(&mut guard);
        let found = match lanes {
            Some(lanes) => table.get_mut_missed(key, lanes),
            None => table.get_mut(key),
        };
        let now = now();
        let decision = match found {
            Some(entry) => step_entry(machine, entry, limit, now),
            None => insert(machine, &mut guard, key, limit, now),
        };
        guard.maintain(now, self.sweep_ns);
        decision
    }

    /// Every other algorithm's single limit, out of line. The clock is read
    /// under the lock: these algorithms read a time older than their state's
    /// as the state's time, but a concurrency limit cannot know when its
    /// leases were granted.
    #[inline(never)]
    fn decide_other(&self, limit: &Limit<'_>, now: impl Fn() -> Nanos) -> (Decision, Option<u64>) {
        let (key, shard) = self.locate(limit.algorithm, limit.key);
        let lease = wants_lease(limit).then(|| self.lease_ids.next());
        let decision = {
            let mut guard = self.shards[shard].lock();
            let now = now();
            guard.maintain(now, self.sweep_ns);
            self.commit(&mut guard, key, limit, now, lease.unwrap_or_default())
        };
        (decision, lease.filter(|_| decision.allowed()))
    }

    /// Several limits: every shard involved locked and every TAT key's hot
    /// slot taken before the clock is read (see [`Self::decide_tat`]). Out of
    /// line, so that the single-limit path stays small.
    #[inline(never)]
    fn check_all(&self, limits: &[Limit<'_>], now: impl Fn() -> Nanos) -> Outcome {
        if limits.is_empty() {
            return Outcome::default();
        }
        let located: SmallVec<[(u128, usize); 4]> = limits
            .iter()
            .map(|l| self.locate(l.algorithm, l.key))
            .collect();
        // Lock every shard involved in one global order, so two requests that
        // share shards cannot deadlock.
        let mut order: SmallVec<[usize; 4]> = located.iter().map(|&(_, s)| s).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[Locked<'_>; 4]> =
            order.iter().map(|&s| self.shards[s].lock()).collect();
        for (limit, &(key, shard)) in limits.iter().zip(&located) {
            if matches!(
                limit.algorithm,
                Algorithm::Gcra | Algorithm::LeakyBucketShaping { .. }
            ) {
                let slot = order.binary_search(&shard).expect("every shard was locked");
                Tat::table(&mut guards[slot]).get_mut(key);
            }
        }
        let now = now();
        for guard in &mut guards {
            guard.maintain(now, self.sweep_ns);
        }

        let mut undo: SmallVec<[(usize, Undo); 4]> = SmallVec::new();
        let mut decisions = SmallVec::new();
        let mut leases = Vec::new();
        let mut denied = false;
        for (limit, &(key, shard)) in limits.iter().zip(&located) {
            let slot = order.binary_search(&shard).expect("every shard was locked");
            let mode = if denied { Mode::Peek } else { Mode::Undoable };
            let lease = (wants_lease(limit) && !denied).then(|| self.lease_ids.next());
            let (decision, taken_back) = self.step(
                &mut guards[slot],
                key,
                limit,
                now,
                mode,
                lease.unwrap_or_default(),
            );
            denied |= !decision.allowed();
            undo.extend(taken_back.map(|u| (slot, u)));
            decisions.push(decision);
            leases.extend(lease.map(|id| new_lease(limit, id)));
        }
        if denied {
            for (slot, undo) in undo.into_iter().rev() {
                undo(&mut guards[slot]);
            }
            leases.clear();
        }
        Outcome { decisions, leases }
    }

    /// Forgets the state of each limit's key; see [`Store::reset`].
    pub fn reset_now(&self, limits: &[Limit<'_>]) {
        let now = self.clock.now();
        for limit in limits {
            let (key, shard) = self.locate(limit.algorithm, limit.key);
            let mut guard = self.lock(shard, now);
            let shard = &mut *guard;
            match limit.algorithm {
                Algorithm::TokenBucket => forget::<Tokens>(shard, key),
                Algorithm::Gcra | Algorithm::LeakyBucketShaping { .. } => forget::<Tat>(shard, key),
                Algorithm::LeakyBucket => forget::<Level>(shard, key),
                Algorithm::FixedWindow | Algorithm::HitCounter => {
                    forget::<WindowCount>(shard, key);
                }
                Algorithm::SlidingLog => forget::<Log>(shard, key),
                Algorithm::SlidingCounter => forget::<WindowPair>(shard, key),
                Algorithm::Concurrency => forget::<Leases>(shard, key),
            }
        }
    }

    /// Gives back exactly these leases; see [`Store::release`].
    pub fn release_now(&self, leases: &[Lease]) {
        let now = self.clock.now();
        for lease in leases {
            // Not an id this store makes: no lease of it can be held.
            let Some(id) = lease_number(&lease.id) else {
                continue;
            };
            let (key, shard) = self.locate(Algorithm::Concurrency, &lease.key);
            let mut guard = self.lock(shard, now);
            let table = Leases::table(&mut guard);
            if let Some(entry) = table.get_mut(key) {
                Concurrency::release(&mut entry.state, id, now);
                if entry.state.is_empty() {
                    table.remove(key);
                }
            }
        }
    }

    /// Keys held now, including those expired but not yet swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.shard.lock().len()).sum()
    }

    /// Keys held, evictions and refusals, summed over the shards (each shard
    /// read at its own moment).
    pub fn stats(&self) -> MemoryStats {
        self.shards
            .iter()
            .fold(MemoryStats::default(), |total, shard| {
                let shard = shard.shard.lock();
                MemoryStats {
                    keys: total.keys + shard.len(),
                    evictions: total.evictions.saturating_add(shard.evictions),
                    refusals: total.refusals.saturating_add(shard.refusals),
                }
            })
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry whose state is back to full, now, in every shard.
    pub fn sweep(&self) {
        let now = self.clock.now();
        // Not `maintain`, which would skip a shard whose periodic sweep
        // is not due yet.
        for shard in self.shards.iter() {
            shard.lock().sweep(now, self.sweep_ns);
        }
    }

    #[inline(always)]
    fn locate(&self, algorithm: Algorithm, name: &str) -> (u128, usize) {
        // The algorithm picks the seeds rather than being hashed along: the
        // same identity (shaping ignores `delay_after`, as its name does) for
        // a third of the hashing. A name alone is one `write`, whose length
        // foldhash mixes in, so no terminator is needed.
        let [first, second] = &self.hashers[usize::from(algorithm.index())];
        let hash = |hasher: &foldhash::quality::RandomState| {
            let mut state = hasher.build_hasher();
            state.write(name.as_bytes());
            state.finish()
        };
        let (high, low) = (hash(first), hash(second));
        // One shard means a shift by 64, which is zero, not an overflow.
        let shard = high.checked_shr(self.shard_shift).unwrap_or(0) as usize;
        ((u128::from(high) << 64) | u128::from(low), shard)
    }

    #[inline]
    fn lock(&self, shard: usize, now: Nanos) -> Locked<'_> {
        self.lock_cell(&self.shards[shard], now)
    }

    #[inline(always)]
    fn lock_cell<'s>(&self, cell: &'s Padded, now: Nanos) -> Locked<'s> {
        let mut guard = cell.lock();
        guard.maintain(now, self.sweep_ns);
        guard
    }

    /// One limit alone: no undo to prepare, nothing to peek. A concurrency
    /// limit that admits takes its lease under the id `lease`.
    fn commit(
        &self,
        shard: &mut Shard,
        key: u128,
        limit: &Limit<'_>,
        now: Nanos,
        lease: u64,
    ) -> Decision {
        match limit.algorithm {
            Algorithm::TokenBucket => commit(&TokenBucket, shard, key, limit, now),
            Algorithm::Gcra => commit(&Gcra, shard, key, limit, now),
            Algorithm::LeakyBucket => commit(&LeakyBucket, shard, key, limit, now),
            Algorithm::LeakyBucketShaping { delay_after } => {
                commit(&LeakyBucketShaping { delay_after }, shard, key, limit, now)
            }
            Algorithm::FixedWindow => commit(&FixedWindow, shard, key, limit, now),
            Algorithm::HitCounter => commit(&HitCounter, shard, key, limit, now),
            Algorithm::SlidingLog => commit(&SlidingLog, shard, key, limit, now),
            Algorithm::SlidingCounter => commit(&SlidingCounter, shard, key, limit, now),
            Algorithm::Concurrency => commit(&Concurrency::lease(lease), shard, key, limit, now),
        }
    }

    fn step(
        &self,
        shard: &mut Shard,
        key: u128,
        limit: &Limit<'_>,
        now: Nanos,
        mode: Mode,
        lease: u64,
    ) -> (Decision, Option<Undo>) {
        match limit.algorithm {
            Algorithm::TokenBucket => step(&TokenBucket, shard, key, limit, now, mode),
            Algorithm::Gcra => step(&Gcra, shard, key, limit, now, mode),
            Algorithm::LeakyBucket => step(&LeakyBucket, shard, key, limit, now, mode),
            Algorithm::LeakyBucketShaping { delay_after } => step(
                &LeakyBucketShaping { delay_after },
                shard,
                key,
                limit,
                now,
                mode,
            ),
            Algorithm::FixedWindow => step(&FixedWindow, shard, key, limit, now, mode),
            // Beside other limits a request is charged all or nothing, and a
            // denied hit counts for nothing: the fixed window's step.
            Algorithm::HitCounter => step(&FixedWindow, shard, key, limit, now, mode),
            Algorithm::SlidingLog => step(&SlidingLog, shard, key, limit, now, mode),
            Algorithm::SlidingCounter => step(&SlidingCounter, shard, key, limit, now, mode),
            Algorithm::Concurrency => {
                step(&Concurrency::lease(lease), shard, key, limit, now, mode)
            }
        }
    }
}

/// The fewest keys a shard is made to hold (see [`MemoryStore::with_clock`]).
const MIN_SHARD_KEYS: usize = 64;

/// One limit on a key in a hot slot, without the shard's lock: `None` when
/// the key is not in one, or a writer holds it.
#[inline]
fn check_hot<M: StateMachine<State = Tat>>(
    machine: &M,
    (hot, lanes): (&HotSlots, Lanes),
    key: u128,
    limit: &Limit<'_>,
    now: &impl Fn() -> Nanos,
) -> Option<Decision> {
    hot.check(key, lanes, |mut state| {
        let decision = machine.step(&limit.quota, &mut state, now(), limit.cost);
        (decision, writes::<M>(&decision, limit).then_some(state))
    })
}

/// One limit alone: write what it decides, with none of [`step`]'s undo and
/// peek machinery. The path of most checks.
#[inline]
fn commit<M>(machine: &M, shard: &mut Shard, key: u128, limit: &Limit<'_>, now: Nanos) -> Decision
where
    M: StateMachine,
    M::State: Slot,
{
    if let Some(entry) = M::State::table(shard).get_mut(key) {
        return step_entry(machine, entry, limit, now);
    }
    insert(machine, shard, key, limit, now)
}

/// [`commit`] of a key not held: step a new state, and keep it if it was
/// written and the shard has room.
#[inline]
fn insert<M>(machine: &M, shard: &mut Shard, key: u128, limit: &Limit<'_>, now: Nanos) -> Decision
where
    M: StateMachine,
    M::State: Slot,
{
    let mut state = M::State::default();
    let decision = machine.step(&limit.quota, &mut state, now, limit.cost);
    if writes::<M>(&decision, limit) {
        let entry = Entry {
            expires_at: state.expires_at(&decision, now),
            state,
        };
        if let Err(wait) = shard.insert_new(key, entry, now) {
            return refused(&decision, wait);
        }
    }
    decision
}

/// [`commit`] of a key held: step its state and write it.
#[inline(always)]
fn step_entry<M>(
    machine: &M,
    entry: &mut Entry<M::State>,
    limit: &Limit<'_>,
    now: Nanos,
) -> Decision
where
    M: StateMachine,
    M::State: Slot,
{
    let decision = machine.step(&limit.quota, &mut entry.state, now, limit.cost);
    if writes::<M>(&decision, limit) {
        entry.expires_at = entry.state.expires_at(&decision, now);
    }
    decision
}

fn forget<S: Slot>(shard: &mut Shard, key: u128) {
    S::table(shard).remove(key);
}

/// Whether a step of `limit` checked alone that decided `decision` wrote its
/// state.
#[inline(always)]
fn writes<M: StateMachine>(decision: &Decision, limit: &Limit<'_>) -> bool {
    (decision.allowed() || M::COUNTS_DENIED) && limit.cost > 0
}

/// The decision for a new key that its full shard had no room for: denied,
/// with nothing stored, and a retry after `wait_ns`, when room may have come
/// (see [`Shard::insert_new`]). Nothing remains meanwhile; the limit comes
/// back in full once the key is let in.
#[cold]
fn refused(admitted: &Decision, wait_ns: Nanos) -> Decision {
    let wait = Duration::from_nanos(wait_ns);
    Decision::deny(admitted.limit(), 0, wait, Some(wait))
}

fn step<M>(
    machine: &M,
    shard: &mut Shard,
    key: u128,
    limit: &Limit<'_>,
    now: Nanos,
    mode: Mode,
) -> (Decision, Option<Undo>)
where
    M: StateMachine,
    M::State: Slot,
{
    let writes = |d: &Decision| d.allowed() && limit.cost > 0 && mode != Mode::Peek;
    let table = M::State::table(shard);
    if let Some(entry) = table.get_mut(key) {
        if mode == Mode::Peek {
            let mut state = entry.state.clone();
            return (
                machine.step(&limit.quota, &mut state, now, limit.cost),
                None,
            );
        }
        let saved = (mode == Mode::Undoable).then(|| Entry {
            state: entry.state.clone(),
            expires_at: entry.expires_at,
        });
        let decision = machine.step(&limit.quota, &mut entry.state, now, limit.cost);
        if !writes(&decision) {
            return (decision, None);
        }
        entry.expires_at = entry.state.expires_at(&decision, now);
        let undo = saved.map(|saved| -> Undo {
            Box::new(move |shard: &mut Shard| {
                M::State::table(shard).insert(key, saved);
            })
        });
        return (decision, undo);
    }
    let mut state = M::State::default();
    let decision = machine.step(&limit.quota, &mut state, now, limit.cost);
    if !writes(&decision) {
        return (decision, None);
    }
    let entry = Entry {
        expires_at: state.expires_at(&decision, now),
        state,
    };
    if let Err(wait) = shard.insert_new(key, entry, now) {
        return (refused(&decision, wait), None);
    }
    let undo = (mode == Mode::Undoable).then(|| -> Undo {
        Box::new(move |shard: &mut Shard| {
            M::State::table(shard).remove(key);
        })
    });
    (decision, undo)
}

/// [`Store::check`] of the memory store: [`MemoryStore::check_now`], run
/// when first polled, which is always ready.
///
/// Doing the work in `poll` rather than wrapping its result in
/// [`std::future::ready`] writes the `Outcome` once, straight into the poll's
/// answer, instead of into the future and then out of it: with the `ready`
/// future an asynchronous check of one key took 38% longer than `check_now`
/// (docs/benchmarks.md). Like any future, it does nothing until polled.
struct CheckNow<'s, 'a, 'l, C> {
    store: &'s MemoryStore<C>,
    /// Taken by the one poll that checks, so that a second poll cannot
    /// consume the budget again.
    limits: Option<&'a [Limit<'l>]>,
}

impl<C: Clock> Future for CheckNow<'_, '_, '_, C> {
    type Output = Result<Outcome, StoreError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        let limits = self
            .limits
            .take()
            .expect("the memory store's check polled after it completed");
        Poll::Ready(Ok(self.store.check_now(limits)))
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn check(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        CheckNow {
            store: self,
            limits: Some(limits),
        }
    }

    /// Each limit checked in turn, in the first poll as [`Store::check`].
    fn check_each(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Vec<Result<Outcome, StoreError>>> + Send {
        let mut limits = Some(limits);
        std::future::poll_fn(move |_| {
            let limits = limits
                .take()
                .expect("the memory store's check polled after it completed");
            Poll::Ready(
                limits
                    .iter()
                    .map(|limit| Ok(self.check_now(std::slice::from_ref(limit))))
                    .collect(),
            )
        })
    }

    fn release(&self, leases: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.release_now(leases);
        ready(Ok(()))
    }

    /// Its check does its work in its first poll, and every other call
    /// is done before its future is made.
    fn decides_at_once(&self) -> bool {
        true
    }

    fn reset(&self, limits: &[Limit<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.reset_now(limits);
        ready(Ok(()))
    }
}

impl<C: Clock> LeaseStore for MemoryStore<C> {
    fn check_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Stamped, StoreError>> + Send {
        // The time the decision was made at: the last the check read.
        let decided = std::cell::Cell::new(0);
        let outcome = self.check_when(limits, || {
            let now = self.clock.now();
            decided.set(now);
            now
        });
        let now = decided.get();
        ready(Ok(Stamped {
            decided_at: Some(smallvec::smallvec![now / 1000; outcome.decisions.len()]),
            outcome,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread::JoinHandle;

    use tollgate_core::{ManualClock, Quota};

    use super::*;

    /// A clock that, on its first reading, is "preempted" just after the
    /// reading: time moves on by `gap`, and meanwhile `other` runs, at once
    /// when nothing stops it, or on a thread of its own when the shard it
    /// checks is locked (by the preempted thread, which then holds it).
    #[derive(Default)]
    struct Preempted {
        clock: ManualClock,
        on_first_read: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    }

    impl Clock for Preempted {
        fn now(&self) -> Nanos {
            let now = self.clock.now();
            let preempted = self.on_first_read.lock().take();
            if let Some(other) = preempted {
                other();
            }
            now
        }
    }

    type Shared = Arc<MemoryStore<Arc<Preempted>>>;

    /// One shard, so that keys fill its hot slots and then its table.
    fn store() -> (Shared, Arc<Preempted>) {
        let clock = Arc::new(Preempted::default());
        clock.clock.set(1_000_000_000);
        let config = MemoryConfig {
            max_keys: 1_000,
            shards: 1,
            sweep_interval: Duration::from_secs(1),
        };
        (
            Arc::new(MemoryStore::with_clock(config, Arc::clone(&clock))),
            clock,
        )
    }

    fn limit(algorithm: Algorithm, key: &str) -> Limit<'_> {
        // Issue 39's quota: one unit per nanosecond, a millisecond of burst.
        let quota = Quota::per_second(1_000_000_000)
            .unwrap()
            .with_burst(1_000_000)
            .unwrap();
        Limit::new(key, quota, algorithm)
    }

    /// Checks `limits` on `store` with the clock preempted after the check's
    /// first reading for 3 ms (three times the burst's tolerance), while a
    /// check of `other` moves its state; returns the preempted check's
    /// decisions and the other check's.
    fn preempted_check(
        store: &Shared,
        clock: &Arc<Preempted>,
        limits: &[Limit<'_>],
        other: Limit<'static>,
    ) -> (Vec<bool>, bool) {
        let handle: Arc<Mutex<Option<JoinHandle<bool>>>> = Arc::default();
        let (hook_store, hook_clock, hook_handle) =
            (Arc::clone(store), Arc::clone(clock), Arc::clone(&handle));
        *clock.on_first_read.lock() = Some(Box::new(move || {
            hook_clock.clock.advance(Duration::from_millis(3));
            let (_, shard) = hook_store.locate(other.algorithm, other.key);
            let held = hook_store.shards[shard].shard.is_locked();
            let run = move || hook_store.check_now(&[other]).allowed();
            if held {
                *hook_handle.lock() = Some(std::thread::spawn(run));
            } else {
                assert!(run(), "the other check is admitted");
            }
        }));
        let preempted = store
            .check_now(limits)
            .decisions
            .iter()
            .map(|d| d.allowed())
            .collect();
        let spawned = handle.lock().take();
        let other = spawned.is_none_or(|h| h.join().expect("the other check ran"));
        (preempted, other)
    }

    #[test]
    fn regression_a_check_preempted_after_reading_the_clock_was_denied_by_the_state_another_moved()
    {
        let (store, clock) = store();
        for algorithm in [
            Algorithm::Gcra,
            Algorithm::LeakyBucketShaping { delay_after: 0 },
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
            Algorithm::SlidingLog,
        ] {
            let name = algorithm.name();
            // Hot slots first (a key new to the shard takes a free slot,
            // and the next checks of it are lock-free), then, the slots
            // full, keys in the table: each key checked new, then held.
            let keys: Vec<&'static str> = (0..8)
                .map(|i| &*Box::leak(format!("{name}-{i}").into_boxed_str()))
                .collect();
            for round in ["new", "held"] {
                for &key in &keys {
                    let (preempted, other) = preempted_check(
                        &store,
                        &clock,
                        &[limit(algorithm, key)],
                        limit(algorithm, key),
                    );
                    assert_eq!(
                        preempted,
                        [true],
                        "{name} {key} {round}: the preempted check"
                    );
                    assert!(other, "{name} {key} {round}: the other check");
                }
            }
            // Several limits in one check, one of them moved meanwhile.
            let (preempted, other) = preempted_check(
                &store,
                &clock,
                &[limit(algorithm, keys[0]), limit(algorithm, keys[7])],
                limit(algorithm, keys[7]),
            );
            assert_eq!(preempted, [true, true], "{name}: several limits");
            assert!(other, "{name}: several limits, the other check");
        }
    }

    #[test]
    fn a_clock_gone_back_is_still_no_time_passing_and_a_tat_still_stricter() {
        let (store, clock) = store();
        let check = |algorithm| store.check_now(&[limit(algorithm, "k")]).decisions[0];
        // The burst spent at one instant.
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
            let spend = Limit {
                cost: 1_000_000,
                ..limit(algorithm, "k")
            };
            assert!(store.check_now(&[spend]).allowed());
            assert!(!check(algorithm).allowed(), "{algorithm}: spent");
        }
        // Half a millisecond later half the burst is back; then the clock
        // goes back a millisecond.
        clock.clock.advance(Duration::from_micros(500));
        clock.clock.set(clock.clock.now() - 1_000_000);
        // The token bucket counts no time as passed: nothing refilled.
        assert!(!check(Algorithm::TokenBucket).allowed());
        // GCRA is stricter by the jump: nothing back until the clock is
        // past the instant the burst was spent at.
        assert!(!check(Algorithm::Gcra).allowed());
        clock.clock.advance(Duration::from_micros(500));
        assert!(!check(Algorithm::Gcra).allowed());
        clock.clock.advance(Duration::from_nanos(1));
        assert!(check(Algorithm::Gcra).allowed());
    }
}
