//! One shard of the memory store: a table per kind of algorithm state.
//!
//! Keeping the kinds apart lets each entry be exactly as large as its state: a
//! GCRA key costs its 128-bit key hash, one `u64` TAT and one `u64` expiry.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use tollgate_core::{Level, Log, Nanos, Tat, Tokens, WindowCount, WindowPair};

/// Keys are already uniformly distributed 128-bit hashes; hashing them again
/// would only cost time.
#[derive(Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, _: &[u8]) {
        unreachable!("only u128 keys are hashed")
    }

    fn write_u128(&mut self, key: u128) {
        // hashbrown takes its bucket from the low bits and its tag from the high
        // ones; the shard was picked from the key's top bits, so use the bottom.
        self.0 = key as u64;
    }
}

pub(crate) struct Entry<S> {
    pub(crate) state: S,
    /// When the state is back to full and the entry can go.
    pub(crate) expires_at: Nanos,
}

pub(crate) type Table<S> = HashMap<u128, Entry<S>, BuildHasherDefault<PassThrough>>;

/// A state kind and the shard table that holds it.
pub(crate) trait Slot: Default + Clone + Send + 'static {
    fn table(shard: &mut Shard) -> &mut Table<Self>;
}

/// What the shard needs of a table without knowing its state type.
trait Sweep {
    fn len(&self) -> usize;
    fn sweep(&mut self, now: Nanos);
    /// Removes one entry, choosing among a few the one closest to full anyway.
    fn evict_soonest(&mut self);
}

/// How many entries eviction looks at before choosing.
const EVICTION_SAMPLE: usize = 5;

impl<S> Sweep for Table<S> {
    fn len(&self) -> usize {
        HashMap::len(self)
    }

    fn sweep(&mut self, now: Nanos) {
        self.retain(|_, e| e.expires_at > now);
    }

    fn evict_soonest(&mut self) {
        let victim = self
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, e)| e.expires_at)
            .map(|(k, _)| *k);
        if let Some(key) = victim {
            self.remove(&key);
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
        })*
        $(impl Slot for $kept_state {
            fn table(shard: &mut Shard) -> &mut Table<Self> {
                &mut shard.tables.$kept
            }
        })*

        impl Tables {
            fn evictable(&mut self) -> impl Iterator<Item = &mut dyn Sweep> {
                [$(&mut self.$field as &mut dyn Sweep,)*].into_iter()
            }

            fn all(&mut self) -> impl Iterator<Item = &mut dyn Sweep> {
                [$(&mut self.$field as &mut dyn Sweep,)* $(&mut self.$kept as &mut dyn Sweep,)*].into_iter()
            }
        }
    };
}

// Concurrency permits are never evicted: forgetting one would let more requests
// be in flight than the limit allows. Live requests bound their number.
tables! {
    evictable { tat: Tat, tokens: Tokens, level: Level, window: WindowCount, pair: WindowPair, log: Log }
    kept { in_flight: u64 }
}

pub(crate) struct Shard {
    tables: Tables,
    next_sweep: Nanos,
}

impl Shard {
    pub(crate) fn new() -> Self {
        Self {
            tables: Tables::default(),
            next_sweep: 0,
        }
    }

    pub(crate) fn len(&mut self) -> usize {
        self.tables.all().map(|t| t.len()).sum()
    }

    /// Drops expired entries once per `interval`.
    pub(crate) fn maintain(&mut self, now: Nanos, interval: Nanos) {
        if now >= self.next_sweep {
            self.tables.all().for_each(|t| t.sweep(now));
            self.next_sweep = now.saturating_add(interval);
        }
    }

    /// Makes room for one new key when the shard holds `cap` already, by
    /// evicting from its largest evictable table. Expired entries went at the
    /// last sweep, so what goes now is live: its key starts afresh next time.
    pub(crate) fn make_room(&mut self, cap: usize) {
        if self.len() < cap {
            return;
        }
        if let Some(table) = self.tables.evictable().max_by_key(|t| t.len()) {
            table.evict_soonest();
        }
    }
}
