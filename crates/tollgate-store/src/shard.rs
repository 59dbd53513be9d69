//! One shard of the memory store: a table per kind of algorithm state.
//!
//! Keeping the kinds apart lets each entry be exactly as large as its state: a
//! GCRA key costs its 128-bit key hash, one `u64` TAT and one `u64` expiry.

use hashbrown::HashTable;
use tollgate_core::{Decision, Leases, Level, Log, Nanos, Tat, Tokens, WindowCount, WindowPair};

pub(crate) struct Entry<S> {
    pub(crate) state: S,
    /// When the state is back to full and the entry can go.
    pub(crate) expires_at: Nanos,
}

/// The bucket hash of a key. Keys are already uniformly distributed 128-bit
/// hashes, so hashing them again would only cost time; hashbrown takes its
/// bucket from the low bits and its tag from the high ones, and the shard was
/// picked from the key's top bits, so use the bottom 64.
#[inline]
fn bucket_hash(key: u128) -> u64 {
    key as u64
}

/// The entries of one kind of state, keyed by their 128-bit key hash.
pub(crate) struct Table<S> {
    entries: HashTable<(u128, Entry<S>)>,
}

impl<S> Default for Table<S> {
    fn default() -> Self {
        Self {
            entries: HashTable::new(),
        }
    }
}

impl<S> Table<S> {
    #[inline]
    pub(crate) fn get_mut(&mut self, key: u128) -> Option<&mut Entry<S>> {
        self.entries
            .find_mut(bucket_hash(key), |(k, _)| *k == key)
            .map(|(_, entry)| entry)
    }

    /// Inserts `entry` under `key`, replacing what was there.
    pub(crate) fn insert(&mut self, key: u128, entry: Entry<S>) {
        match self.entries.entry(
            bucket_hash(key),
            |(k, _)| *k == key,
            |(k, _)| bucket_hash(*k),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut held) => held.get_mut().1 = entry,
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                vacant.insert((key, entry));
            }
        }
    }

    pub(crate) fn remove(&mut self, key: u128) -> Option<Entry<S>> {
        self.entries
            .find_entry(bucket_hash(key), |(k, _)| *k == key)
            .ok()
            .map(|held| held.remove().0.1)
    }

    /// Inserts a key known to be absent. When `full` (the shard is at its cap)
    /// the table is not let grow: if removals have left no free slot, it is
    /// rebuilt at its size instead. A table at its cap churns (evict one,
    /// insert one), and hashbrown's deletions leave tombstones that use up its
    /// spare slots; left alone it would then double, though it holds no more.
    fn insert_new(&mut self, key: u128, entry: Entry<S>, full: bool) {
        if full && self.entries.capacity() == self.entries.len() {
            let mut rebuilt = HashTable::with_capacity(self.entries.len() + 1);
            for item in self.entries.drain() {
                rebuilt.insert_unique(bucket_hash(item.0), item, |(k, _)| bucket_hash(*k));
            }
            self.entries = rebuilt;
        }
        self.entries
            .insert_unique(bucket_hash(key), (key, entry), |(k, _)| bucket_hash(*k));
    }

    #[cfg(test)]
    fn buckets(&self) -> usize {
        self.entries.num_buckets()
    }
}

/// A state kind and the shard table that holds it.
pub(crate) trait Slot: Default + Clone + Send + 'static {
    fn table(shard: &mut Shard) -> &mut Table<Self>;

    /// When an entry in this state, just written with `decision` at `now`,
    /// can be forgotten.
    fn expires_at(&self, decision: &Decision, now: Nanos) -> Nanos;
}

/// What the shard needs of a table without knowing its state type.
trait Sweep {
    fn len(&self) -> usize;
    fn sweep(&mut self, now: Nanos);
    /// Removes one entry: of the first few found from bucket `start` on, the
    /// one closest to full anyway.
    fn evict_soonest(&mut self, start: usize);
}

/// How many entries eviction looks at before choosing.
const EVICTION_SAMPLE: usize = 5;

impl<S> Sweep for Table<S> {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn sweep(&mut self, now: Nanos) {
        self.entries.retain(|(_, e)| e.expires_at > now);
    }

    fn evict_soonest(&mut self, start: usize) {
        // Keys are uniform hashes, so the entries after a random bucket are a
        // random sample; always starting at bucket 0 instead would empty the
        // front of the table and make every later search longer.
        let buckets = self.entries.num_buckets();
        let mut victim: Option<(usize, Nanos)> = None;
        let mut seen = 0;
        for offset in 0..buckets {
            let index = (start + offset) & (buckets - 1);
            if let Some((_, entry)) = self.entries.get_bucket(index) {
                if victim.is_none_or(|(_, soonest)| entry.expires_at < soonest) {
                    victim = Some((index, entry.expires_at));
                }
                seen += 1;
                if seen == EVICTION_SAMPLE {
                    break;
                }
            }
        }
        if let Some((index, _)) = victim
            && let Ok(held) = self.entries.get_bucket_entry(index)
        {
            held.remove();
        }
    }
}

macro_rules! tables {
    (evictable { $($field:ident: $state:ty),* } kept { $($kept:ident: $kept_state:ty),* }) => {
        #[derive(Default)]
        struct Tables {
            $($field: Table<$state>,)*
            $($kept: Table<$kept_state>,)*
        }

        $(impl Slot for $state {
            fn table(shard: &mut Shard) -> &mut Table<Self> {
                &mut shard.tables.$field
            }

            // Once back to full, the state is the same as a new one.
            fn expires_at(&self, decision: &Decision, now: Nanos) -> Nanos {
                let reset = u64::try_from(decision.reset_after.as_nanos()).unwrap_or(u64::MAX);
                now.saturating_add(reset)
            }
        })*
        $(impl Slot for $kept_state {
            fn table(shard: &mut Shard) -> &mut Table<Self> {
                &mut shard.tables.$kept
            }

            // Held until the last lease is released or lapses.
            fn expires_at(&self, _: &Decision, now: Nanos) -> Nanos {
                self.last_lapse().unwrap_or(now)
            }
        })*

        impl Tables {
            fn len(&self) -> usize {
                0 $(+ self.$field.entries.len())* $(+ self.$kept.entries.len())*
            }

            fn evictable(&mut self) -> impl Iterator<Item = &mut dyn Sweep> {
                [$(&mut self.$field as &mut dyn Sweep,)*].into_iter()
            }

            fn all(&mut self) -> impl Iterator<Item = &mut dyn Sweep> {
                [$(&mut self.$field as &mut dyn Sweep,)* $(&mut self.$kept as &mut dyn Sweep,)*].into_iter()
            }
        }
    };
}

// Concurrency leases are never evicted: forgetting one would let more requests
// be in flight than the limit allows. They go when released or lapsed.
tables! {
    evictable { tat: Tat, tokens: Tokens, level: Level, window: WindowCount, pair: WindowPair, log: Log }
    kept { leases: Leases }
}

pub(crate) struct Shard {
    tables: Tables,
    next_sweep: Nanos,
    /// The most keys this shard holds (the store's cap, split across shards).
    cap: usize,
}

impl Shard {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            tables: Tables::default(),
            next_sweep: 0,
            cap,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.tables.len()
    }

    /// Drops expired entries once per `interval`.
    #[inline]
    pub(crate) fn maintain(&mut self, now: Nanos, interval: Nanos) {
        if now >= self.next_sweep {
            self.sweep(now, interval);
        }
    }

    #[cold]
    fn sweep(&mut self, now: Nanos, interval: Nanos) {
        self.tables.all().for_each(|t| t.sweep(now));
        self.next_sweep = now.saturating_add(interval);
    }

    /// Inserts a key that is not in its table yet. When the shard already
    /// holds its cap, first evicts from its largest evictable table. Expired
    /// entries went at the last sweep, so what goes now is live: its key starts
    /// afresh next time.
    pub(crate) fn insert_new<S: Slot>(&mut self, key: u128, entry: Entry<S>) {
        let full = self.len() >= self.cap;
        if full && let Some(table) = self.tables.evictable().max_by_key(|t| t.len()) {
            // The new key's bits are as random as any, and cost nothing.
            table.evict_soonest((key >> 64) as usize);
        }
        S::table(self).insert_new(key, entry, full);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(expires_at: Nanos) -> Entry<Tat> {
        Entry {
            state: Tat(expires_at),
            expires_at,
        }
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
        let mut shard = Shard::new(cap);
        for i in 0..cap as u64 {
            shard.insert_new(key(i), entry(i));
        }
        let buckets = shard.tables.tat.buckets();
        for i in cap as u64..50 * cap as u64 {
            shard.insert_new(key(i), entry(i));
            assert_eq!(shard.len(), cap);
        }
        assert_eq!(shard.tables.tat.buckets(), buckets);
        // The newest key is always kept.
        let last = key(50 * cap as u64 - 1);
        assert!(Tat::table(&mut shard).get_mut(last).is_some());
    }

    #[test]
    fn eviction_takes_the_soonest_to_expire_of_its_sample() {
        let mut shard = Shard::new(3);
        shard.insert_new(key(1), entry(100));
        shard.insert_new(key(2), entry(5));
        shard.insert_new(key(3), entry(50));
        // All three are in any sample of five: the one expiring first goes.
        shard.insert_new(key(4), entry(70));
        let table = Tat::table(&mut shard);
        assert!(table.get_mut(key(2)).is_none());
        for kept in [1, 3, 4] {
            assert!(table.get_mut(key(kept)).is_some(), "{kept}");
        }
    }

    #[test]
    fn insert_replaces_and_remove_takes_out() {
        let mut table = Table::<Tat>::default();
        table.insert(key(1), entry(1));
        table.insert(key(1), entry(2));
        assert_eq!(table.get_mut(key(1)).map(|e| e.expires_at), Some(2));
        assert_eq!(table.remove(key(1)).map(|e| e.expires_at), Some(2));
        assert!(table.remove(key(1)).is_none());
        assert_eq!(Sweep::len(&table), 0);
    }
}
