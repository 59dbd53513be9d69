//! The table every kind of algorithm state is kept in: entries keyed by a
//! 128-bit key hash, with expiry, sweeping and eviction of entries at rest.
//! Below both the shard and the hot slots, which use it.

use hashbrown::HashTable;
use tollgate_core::Nanos;

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

/// Where the entries of one kind of state are, keyed by their 128-bit key
/// hash: what checks, resets and undos need of them.
pub(crate) trait Entries<S> {
    fn get_mut(&mut self, key: u128) -> Option<&mut Entry<S>>;
    /// Inserts `entry` under `key`, replacing what was there.
    fn insert(&mut self, key: u128, entry: Entry<S>);
    fn remove(&mut self, key: u128) -> Option<Entry<S>>;
    /// Inserts a key known to be absent (the shard made room for it).
    fn insert_new(&mut self, key: u128, entry: Entry<S>);
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
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn buckets(&self) -> usize {
        self.entries.num_buckets()
    }
}

impl<S> Entries<S> for Table<S> {
    #[inline]
    fn get_mut(&mut self, key: u128) -> Option<&mut Entry<S>> {
        self.entries
            .find_mut(bucket_hash(key), |(k, _)| *k == key)
            .map(|(_, entry)| entry)
    }

    fn insert(&mut self, key: u128, entry: Entry<S>) {
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

    fn remove(&mut self, key: u128) -> Option<Entry<S>> {
        self.entries
            .find_entry(bucket_hash(key), |(k, _)| *k == key)
            .ok()
            .map(|held| held.remove().0.1)
    }

    /// If removals have left no free slot
    /// though the table is not at its load factor (hashbrown's 7/8), the
    /// table is first rebuilt at the size its entries need, rather than let
    /// hashbrown double it once it is over half full. Evictions and sweeps
    /// leave tombstones that use up a table's spare slots; a table near the
    /// shard's cap churns (entries come to rest and go, new keys come), and,
    /// left alone, would double though it holds no more. A table that is
    /// truly full grows as hashbrown grows it, which is cheaper.
    fn insert_new(&mut self, key: u128, entry: Entry<S>) {
        let len = self.entries.len();
        let tombstoned = len.saturating_mul(8) < self.entries.num_buckets().saturating_mul(7);
        if tombstoned && self.entries.capacity() == len {
            let mut rebuilt = HashTable::with_capacity(len + 1);
            for item in self.entries.drain() {
                rebuilt.insert_unique(bucket_hash(item.0), item, |(k, _)| bucket_hash(*k));
            }
            self.entries = rebuilt;
        }
        self.entries
            .insert_unique(bucket_hash(key), (key, entry), |(k, _)| bucket_hash(*k));
    }
}

/// What the shard needs of a table without knowing its state type.
pub(crate) trait Sweep {
    fn sweep(&mut self, now: Nanos);
    /// Removes one entry at rest by `now` (see [`Shard::insert_new`]) among the
    /// first few found from bucket `start` on; when none of them is at rest,
    /// removes nothing and says when the first of them comes to rest.
    fn evict_at_rest(&mut self, start: usize, now: Nanos) -> Result<(), Nanos>;
}

/// How many entries of each table eviction looks at before giving up.
const EVICTION_SAMPLE: usize = 5;

/// How many buckets of each table eviction searches for its sample at most:
/// enough for a full sample in a table a sixteenth full, and a bound on the
/// work a new key does in a full shard whose tables sweeps have left sparse.
const EVICTION_SCAN: usize = 16 * EVICTION_SAMPLE;

impl<S> Sweep for Table<S> {
    fn sweep(&mut self, now: Nanos) {
        self.entries.retain(|(_, e)| e.expires_at > now);
    }

    fn evict_at_rest(&mut self, start: usize, now: Nanos) -> Result<(), Nanos> {
        // A table that sweeps have emptied keeps its buckets: searching them
        // all for nothing would cost every new key in a full shard.
        if self.entries.is_empty() {
            return Err(Nanos::MAX);
        }
        // Keys are uniform hashes, so the entries after a random bucket are a
        // random sample; always starting at bucket 0 instead would empty the
        // front of the table and make every later search longer.
        let buckets = self.entries.num_buckets();
        let mut soonest = Nanos::MAX;
        let mut seen = 0;
        for offset in 0..buckets.min(EVICTION_SCAN) {
            let index = (start + offset) & (buckets - 1);
            if let Some((_, entry)) = self.entries.get_bucket(index) {
                if entry.expires_at <= now {
                    if let Ok(held) = self.entries.get_bucket_entry(index) {
                        held.remove();
                    }
                    return Ok(());
                }
                soonest = soonest.min(entry.expires_at);
                seen += 1;
                if seen == EVICTION_SAMPLE {
                    break;
                }
            }
        }
        Err(soonest)
    }
}
