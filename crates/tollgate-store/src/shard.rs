//! One shard of the memory store: a table per kind of algorithm state.
//!
//! Keeping the kinds apart lets each entry be exactly as large as its state: a
//! GCRA key costs its 128-bit key hash, one `u64` TAT and one `u64` expiry.
//! GCRA and shaping keys also have the shard's hot slots (see [`crate::hot`]).

use std::sync::Arc;

use tollgate_core::IntoNanos;
use tollgate_core::{Decision, Leases, Level, Log, Nanos, Tat, Tokens, WindowCount, WindowPair};

use crate::hot::{HotSlots, Lanes, TatEntries};
use crate::table::{Entries, Entry, Sweep, Table};

/// A state kind and where the shard holds it.
pub(crate) trait Slot: Default + Clone + Send + 'static {
    type Entries: Entries<Self>;

    fn table(shard: &mut Shard) -> &mut Self::Entries;

    /// When an entry in this state, just written with `decision` at `now`,
    /// can be forgotten.
    fn expires_at(&self, decision: &Decision, now: Nanos) -> Nanos;
}

macro_rules! tables {
    (
        until_reset { $($field:ident: $state:ty),* }
        until_lapse { $($leases:ident: $lease_state:ty),* }
        hot { $hot:ident: $hot_state:ty }
    ) => {
        // The hot table first, on the line of the shard's lock (see
        // [`Shard`]): GCRA, the default, is the most checked.
        #[repr(C)]
        struct Tables {
            $hot: TatEntries,
            $($field: Table<$state>,)*
            $($leases: Table<$lease_state>,)*
        }

        impl Tables {
            fn new(hot: Arc<HotSlots>) -> Self {
                Self {
                    $($field: Table::default(),)*
                    $($leases: Table::default(),)*
                    $hot: TatEntries::new(hot),
                }
            }
        }

        $(impl Slot for $state {
            type Entries = Table<Self>;

            fn table(shard: &mut Shard) -> &mut Self::Entries {
                &mut shard.tables.$field
            }

            #[inline]
            fn expires_at(&self, decision: &Decision, now: Nanos) -> Nanos {
                until_reset(self, decision, now)
            }
        })*

        impl Slot for $hot_state {
            type Entries = TatEntries;

            fn table(shard: &mut Shard) -> &mut Self::Entries {
                &mut shard.tables.$hot
            }

            // A TAT is the instant the state is back to full.
            #[inline]
            fn expires_at(&self, _: &Decision, _: Nanos) -> Nanos {
                self.0
            }
        }

        $(impl Slot for $lease_state {
            type Entries = Table<Self>;

            fn table(shard: &mut Shard) -> &mut Self::Entries {
                &mut shard.tables.$leases
            }

            // Held until the last lease is released or lapses. A release
            // leaves this as it was: later than need be, never earlier.
            fn expires_at(&self, _: &Decision, now: Nanos) -> Nanos {
                self.last_lapse().unwrap_or(now)
            }
        })*

        impl Tables {
            fn len(&self) -> usize {
                0 $(+ self.$field.len())* $(+ self.$leases.len())* + self.$hot.len()
            }

            fn all(&mut self) -> impl Iterator<Item = &mut dyn Sweep> {
                [
                    $(&mut self.$field as &mut dyn Sweep,)*
                    $(&mut self.$leases as &mut dyn Sweep,)*
                    &mut self.$hot as &mut dyn Sweep,
                ]
                .into_iter()
            }
        }
    };
}

/// Once back to full, the state is the same as a new one. The reset counts
/// from the latest time the state has seen, which is later than `now` when the
/// clock went back: counted from `now`, the entry was swept while still spent.
#[inline]
fn until_reset<S: Latest>(state: &S, decision: &Decision, now: Nanos) -> Nanos {
    let reset = decision.reset_after().into_nanos();
    now.max(latest(state)).saturating_add(reset)
}

/// The latest time a state has seen, which its algorithm reads a clock that
/// went back as.
trait Latest {
    fn latest(&self) -> Nanos;
}

fn latest<S: Latest>(state: &S) -> Nanos {
    state.latest()
}

impl Latest for Tokens {
    fn latest(&self) -> Nanos {
        self.last
    }
}

impl Latest for Level {
    fn latest(&self) -> Nanos {
        self.last
    }
}

impl Latest for WindowCount {
    fn latest(&self) -> Nanos {
        self.last
    }
}

impl Latest for WindowPair {
    fn latest(&self) -> Nanos {
        self.last
    }
}

impl Latest for Log {
    fn latest(&self) -> Nanos {
        self.entries.back().map_or(0, |&(t, _)| t)
    }
}

// Every table counts against the cap and gives up only entries at rest: a
// concurrency key rests once its last lease is released or has lapsed.
tables! {
    until_reset { tokens: Tokens, level: Level, window: WindowCount, pair: WindowPair, log: Log }
    until_lapse { leases: Leases }
    hot { tat: Tat }
}

/// Laid out for a check: the tables first, then when to sweep, beside the
/// lock.
#[repr(C)]
pub(crate) struct Shard {
    tables: Tables,
    next_sweep: Nanos,
    /// The most keys this shard holds (the store's cap, split across shards).
    cap: usize,
    /// Entries dropped at rest to make room for a new key.
    pub(crate) evictions: u64,
    /// New keys refused because nothing sampled was at rest.
    pub(crate) refusals: u64,
}

impl Shard {
    pub(crate) fn new(cap: usize, hot: Arc<HotSlots>) -> Self {
        Self {
            tables: Tables::new(hot),
            next_sweep: 0,
            cap,
            evictions: 0,
            refusals: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.tables.len()
    }

    /// Writes back and unlocks the hot slots this holder of the shard's lock
    /// holds, and says their new lanes if they moved; see [`crate::hot`].
    /// Called as the lock is let go.
    #[inline]
    pub(crate) fn release_hot(&mut self) -> Option<Lanes> {
        self.tables.tat.release()
    }

    /// Drops expired entries once per `interval`.
    #[inline]
    pub(crate) fn maintain(&mut self, now: Nanos, interval: Nanos) {
        if now >= self.next_sweep {
            self.sweep(now, interval);
        }
    }

    /// Drops expired entries now, and next after `interval`.
    #[cold]
    pub(crate) fn sweep(&mut self, now: Nanos, interval: Nanos) {
        self.tables.all().for_each(|t| t.sweep(now));
        self.next_sweep = now.saturating_add(interval);
    }

    /// Inserts a key that is not in its table yet, at `now`.
    ///
    /// When the shard already holds its cap, an entry at rest goes first: one
    /// whose state is back to full (`expires_at <= now`), so that the next
    /// request for its key, and every later one, is decided exactly as if it
    /// had been kept. State that still limits anything is never evicted: if no
    /// entry sampled is at rest, the new key is refused, and the error is the
    /// wait, in nanoseconds (at least 1), until the first of them comes to
    /// rest: from then on a new key's sample can take it, and the next sweep
    /// drops it (if the search found no entry, until the next sweep). A
    /// hint, not a promise: another new key may take the room.
    pub(crate) fn insert_new<S: Slot>(
        &mut self,
        key: u128,
        entry: Entry<S>,
        now: Nanos,
    ) -> Result<(), Nanos> {
        if self.len() >= self.cap {
            self.make_room(key, now)?;
        }
        S::table(self).insert_new(key, entry);
        Ok(())
    }

    #[cold]
    fn make_room(&mut self, key: u128, now: Nanos) -> Result<(), Nanos> {
        // The new key's bits are as random as any, and cost nothing.
        let start = (key >> 64) as usize;
        let mut soonest = Nanos::MAX;
        for table in self.tables.all() {
            match table.evict_at_rest(start, now) {
                Ok(()) => {
                    self.evictions = self.evictions.saturating_add(1);
                    return Ok(());
                }
                Err(rests_at) => soonest = soonest.min(rests_at),
            }
        }
        self.refusals = self.refusals.saturating_add(1);
        // A search that found no entry at all (sparse tables) knows of no
        // time; the next sweep is the next chance of room then.
        let rests_at = if soonest == Nanos::MAX {
            self.next_sweep
        } else {
            soonest
        };
        Err(rests_at.saturating_sub(now).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(expires_at: Nanos) -> Entry<Level> {
        Entry {
            state: Level::default(),
            expires_at,
        }
    }

    fn shard(cap: usize) -> Shard {
        Shard::new(cap, Arc::default())
    }

    /// Distinct, well spread keys, as the store's hashes are.
    fn key(i: u64) -> u128 {
        let a = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5555;
        let b = a.rotate_left(29).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        (u128::from(b) << 64) | u128::from(a.wrapping_mul(0x94D0_49BB_1331_11EB) | 1)
    }

    #[test]
    fn a_full_shard_churns_without_growing() {
        let cap = 700;
        let mut shard = shard(cap);
        // Key i is at rest from i on, so every older key is at rest when a
        // newer one comes.
        for i in 0..cap as u64 {
            assert_eq!(shard.insert_new(key(i), entry(i), i), Ok(()));
        }
        let buckets = shard.tables.level.buckets();
        for i in cap as u64..50 * cap as u64 {
            assert_eq!(shard.insert_new(key(i), entry(i), i), Ok(()));
            assert_eq!(shard.len(), cap);
        }
        assert_eq!(shard.tables.level.buckets(), buckets);
        assert_eq!(shard.evictions, 49 * cap as u64);
        // The newest key is always kept.
        let last = key(50 * cap as u64 - 1);
        assert!(Level::table(&mut shard).get_mut(last).is_some());
    }

    #[test]
    fn a_shard_churning_through_evictions_and_sweeps_does_not_grow() {
        let cap = 781;
        let mut shard = shard(cap);
        let mut buckets = None;
        // Key i is at rest from i on: at the cap each new key evicts one,
        // and every 5,000 keys a sweep drops all the others, so the table
        // churns between empty and full with tombstones left by both.
        for i in 0..100_000u64 {
            shard.maintain(i, 5_000);
            assert_eq!(shard.insert_new(key(i), entry(i), i), Ok(()));
            if shard.len() == cap {
                let now = shard.tables.level.buckets();
                assert_eq!(*buckets.get_or_insert(now), now, "key {i}");
            }
        }
    }

    #[test]
    fn eviction_takes_only_entries_at_rest_and_else_refuses() {
        let mut shard = shard(3);
        for (i, expires_at) in [(1, 100), (2, 5), (3, 50)] {
            assert_eq!(shard.insert_new(key(i), entry(expires_at), 0), Ok(()));
        }
        // All three are in any sample of five: the one at rest goes.
        assert_eq!(shard.insert_new(key(4), entry(70), 10), Ok(()));
        // None is at rest now: the new key is refused until the soonest
        // (key 3, at 50) is.
        assert_eq!(shard.insert_new(key(5), entry(70), 10), Err(40));
        let table = Level::table(&mut shard);
        for gone in [2, 5] {
            assert!(table.get_mut(key(gone)).is_none(), "{gone}");
        }
        for kept in [1, 3, 4] {
            assert!(table.get_mut(key(kept)).is_some(), "{kept}");
        }
        assert_eq!((shard.evictions, shard.refusals), (1, 1));
    }

    #[test]
    fn a_refusal_whose_search_found_nothing_waits_for_the_next_sweep() {
        let mut shard = shard(200);
        for i in 0..200 {
            assert_eq!(shard.insert_new(key(i), entry(0), 0), Ok(()));
        }
        // The sweep empties the table but leaves its 256 buckets.
        shard.maintain(1, 1000);
        shard.cap = 1;
        // Bucket 0 holds the one entry; a search from bucket 128 looks at
        // buckets 128 to 207 and finds none.
        assert_eq!(shard.insert_new(0, entry(5000), 1), Ok(()));
        let far = (128 << 64) | 1;
        assert_eq!(shard.insert_new(far, entry(5000), 2), Err(999));
        assert_eq!(shard.len(), 1);
    }

    #[test]
    fn leases_count_against_the_cap_and_go_only_once_lapsed() {
        let mut shard = shard(1);
        let leases = Entry {
            state: Leases::default(),
            expires_at: 100,
        };
        assert_eq!(shard.insert_new(key(1), leases, 0), Ok(()));
        assert_eq!(shard.insert_new(key(2), entry(1), 99), Err(1));
        assert_eq!(shard.insert_new(key(2), entry(200), 100), Ok(()));
        assert!(Leases::table(&mut shard).get_mut(key(1)).is_none());
        assert_eq!(shard.len(), 1);
    }

    #[test]
    fn insert_replaces_and_remove_takes_out() {
        let mut table = Table::<Level>::default();
        table.insert(key(1), entry(1));
        table.insert(key(1), entry(2));
        assert_eq!(table.get_mut(key(1)).map(|e| e.expires_at), Some(2));
        assert_eq!(table.remove(key(1)).map(|e| e.expires_at), Some(2));
        assert!(table.remove(key(1)).is_none());
        assert_eq!(table.len(), 0);
    }
}
