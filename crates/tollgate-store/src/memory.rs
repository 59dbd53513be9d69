use std::future::{Future, ready};
use std::hash::BuildHasher;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tollgate_core::{
    Algorithm, Clock, Concurrency, Decision, FixedWindow, Gcra, LeakyBucket, LeakyBucketShaping,
    Limit, MonotonicClock, Nanos, Outcome, SlidingCounter, SlidingLog, StateMachine, Store,
    StoreError, TokenBucket,
};

use crate::shard::{Entry, Shard, Slot};

/// How the memory store is sized.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// The most keys held at once. When a shard is full, a new key evicts the
    /// entry that is closest to full among a few; concurrency permits are never
    /// evicted (live requests bound them).
    pub max_keys: usize,
    /// Number of shards, rounded up to a power of two. More shards, less contention.
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

/// Shards on their own cache lines, so that threads working on different
/// shards do not slow each other down.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// The in-process store: keyed, sharded and bounded.
///
/// A key is stored as a 128-bit keyed hash of its algorithm and name (two
/// independently seeded hashes), so every entry has the same small size and no
/// key string is kept; the seeds are random per store, so keys that collide
/// cannot be crafted, and the chance that any two of a billion live keys
/// collide is below 10⁻²⁰.
pub struct MemoryStore<C = MonotonicClock> {
    shards: Box<[Padded]>,
    shard_shift: u32,
    shard_cap: usize,
    sweep_ns: Nanos,
    hashers: [foldhash::quality::RandomState; 2],
    clock: C,
}

impl MemoryStore {
    /// A store on the real monotonic clock.
    pub fn new(config: MemoryConfig) -> Self {
        Self::with_clock(config, MonotonicClock::new())
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(MemoryConfig::default())
    }
}

/// What to do with the state a step produces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Write it.
    Commit,
    /// Write it and remember how to take it back.
    Undoable,
    /// Only report: another limit of the request already denied it.
    Peek,
}

type Undo = Box<dyn FnOnce(&mut Shard) + Send>;

impl<C: Clock> MemoryStore<C> {
    /// A store that reads time from `clock`.
    pub fn with_clock(config: MemoryConfig, clock: C) -> Self {
        let shards = config.shards.clamp(1, 1 << 16).next_power_of_two();
        Self {
            shards: (0..shards)
                .map(|_| Padded(Mutex::new(Shard::new())))
                .collect(),
            shard_shift: 64 - shards.trailing_zeros(),
            shard_cap: config.max_keys.div_ceil(shards).max(1),
            sweep_ns: u64::try_from(config.sweep_interval.as_nanos()).unwrap_or(u64::MAX),
            hashers: Default::default(),
            clock,
        }
    }

    /// Checks `limits` at the clock's current time; see [`Store::check`].
    pub fn check_now(&self, limits: &[Limit<'_>]) -> Outcome {
        self.check_at(limits, self.clock.now())
    }

    /// Checks `limits` at `now`: admitted only if all admit; a deny by one
    /// consumes nothing from any.
    pub fn check_at(&self, limits: &[Limit<'_>], now: Nanos) -> Outcome {
        match limits {
            [] => Outcome::default(),
            [limit] => {
                let (key, shard) = self.locate(limit);
                let mut guard = self.lock(shard, now);
                let (decision, _) = self.step(&mut guard, key, limit, now, Mode::Commit);
                Outcome {
                    decisions: smallvec::smallvec![decision],
                }
            }
            _ => self.check_all(limits, now),
        }
    }

    fn check_all(&self, limits: &[Limit<'_>], now: Nanos) -> Outcome {
        let located: SmallVec<[(u128, usize); 4]> = limits.iter().map(|l| self.locate(l)).collect();
        // Lock every shard involved in one global order, so two requests that
        // share shards cannot deadlock.
        let mut order: SmallVec<[usize; 4]> = located.iter().map(|&(_, s)| s).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 4]> =
            order.iter().map(|&s| self.lock(s, now)).collect();

        let mut undo: SmallVec<[(usize, Undo); 4]> = SmallVec::new();
        let mut decisions = SmallVec::new();
        let mut denied = false;
        for (limit, &(key, shard)) in limits.iter().zip(&located) {
            let slot = order.binary_search(&shard).expect("every shard was locked");
            let mode = if denied { Mode::Peek } else { Mode::Undoable };
            let (decision, taken_back) = self.step(&mut guards[slot], key, limit, now, mode);
            denied |= !decision.allowed;
            undo.extend(taken_back.map(|u| (slot, u)));
            decisions.push(decision);
        }
        if denied {
            for (slot, undo) in undo.into_iter().rev() {
                undo(&mut guards[slot]);
            }
        }
        Outcome { decisions }
    }

    /// Gives back what admitted concurrency limits among `limits` hold.
    pub fn release_now(&self, limits: &[Limit<'_>]) {
        let now = self.clock.now();
        for limit in limits
            .iter()
            .filter(|l| l.algorithm == Algorithm::Concurrency)
        {
            let (key, shard) = self.locate(limit);
            let mut guard = self.lock(shard, now);
            let table = u64::table(&mut guard);
            if let Some(entry) = table.get_mut(&key) {
                Concurrency::release(&mut entry.state, limit.cost);
                if entry.state == 0 {
                    table.remove(&key);
                }
            }
        }
    }

    /// Keys held now, including those expired but not yet swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every entry whose state is back to full, now, in every shard.
    pub fn sweep(&self) {
        let now = self.clock.now();
        for shard in self.shards.iter() {
            shard.0.lock().maintain(now, 0);
        }
    }

    fn locate(&self, limit: &Limit<'_>) -> (u128, usize) {
        let id = (limit.algorithm.name(), limit.key);
        let high = self.hashers[0].hash_one(id);
        let low = self.hashers[1].hash_one(id);
        // One shard means a shift by 64, which is zero, not an overflow.
        let shard = high.checked_shr(self.shard_shift).unwrap_or(0) as usize;
        ((u128::from(high) << 64) | u128::from(low), shard)
    }

    fn lock(&self, shard: usize, now: Nanos) -> MutexGuard<'_, Shard> {
        let mut guard = self.shards[shard].0.lock();
        guard.maintain(now, self.sweep_ns);
        guard
    }

    fn step(
        &self,
        shard: &mut Shard,
        key: u128,
        limit: &Limit<'_>,
        now: Nanos,
        mode: Mode,
    ) -> (Decision, Option<Undo>) {
        let cap = self.shard_cap;
        match limit.algorithm {
            Algorithm::TokenBucket => step(&TokenBucket, shard, key, limit, now, mode, cap),
            Algorithm::Gcra => step(&Gcra, shard, key, limit, now, mode, cap),
            Algorithm::LeakyBucket => step(&LeakyBucket, shard, key, limit, now, mode, cap),
            Algorithm::LeakyBucketShaping { delay_after } => step(
                &LeakyBucketShaping { delay_after },
                shard,
                key,
                limit,
                now,
                mode,
                cap,
            ),
            Algorithm::FixedWindow => step(&FixedWindow, shard, key, limit, now, mode, cap),
            Algorithm::SlidingLog => step(&SlidingLog, shard, key, limit, now, mode, cap),
            Algorithm::SlidingCounter => step(&SlidingCounter, shard, key, limit, now, mode, cap),
            Algorithm::Concurrency => step(&Concurrency, shard, key, limit, now, mode, cap),
        }
    }
}

/// When an entry whose latest decision is `decision` can be forgotten.
fn expiry(decision: &Decision, now: Nanos, concurrency: bool) -> Nanos {
    if concurrency {
        // Held until released, however long that takes.
        return Nanos::MAX;
    }
    let reset = u64::try_from(decision.reset_after.as_nanos()).unwrap_or(u64::MAX);
    now.saturating_add(reset)
}

fn step<M>(
    machine: &M,
    shard: &mut Shard,
    key: u128,
    limit: &Limit<'_>,
    now: Nanos,
    mode: Mode,
    cap: usize,
) -> (Decision, Option<Undo>)
where
    M: StateMachine,
    M::State: Slot,
{
    let concurrency = limit.algorithm == Algorithm::Concurrency;
    let writes = |d: &Decision| d.allowed && limit.cost > 0 && mode != Mode::Peek;
    let table = M::State::table(shard);
    if let Some(entry) = table.get_mut(&key) {
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
        entry.expires_at = expiry(&decision, now, concurrency);
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
    shard.make_room(cap);
    let entry = Entry {
        state,
        expires_at: expiry(&decision, now, concurrency),
    };
    M::State::table(shard).insert(key, entry);
    let undo = (mode == Mode::Undoable).then(|| -> Undo {
        Box::new(move |shard: &mut Shard| {
            M::State::table(shard).remove(&key);
        })
    });
    (decision, undo)
}

impl<C: Clock> Store for MemoryStore<C> {
    fn check(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        ready(Ok(self.check_now(limits)))
    }

    fn release(&self, limits: &[Limit<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.release_now(limits);
        ready(Ok(()))
    }
}
