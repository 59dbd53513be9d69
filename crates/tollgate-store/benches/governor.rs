//! Tollgate's in-process store against `governor`'s keyed limiter, in one run.
//!
//! Both sides run GCRA with the same quota, one unit per period with a burst no
//! run comes near: every request is admitted, and every admission keeps the
//! key's state for another period, so nothing is denied and nothing expires.
//! What is measured is therefore the decision path itself: find the key's
//! state, decide, write the new state. The period is a minute with 1 key (a
//! burst of 250 million for the tens of millions of checks it gets) and an
//! hour with 1,000,000 keys (a burst of 1 million), so that a key that happens
//! not to be picked for a while does not expire however slow a run is.
//!
//! Cells: 1 key and 1,000,000 keys, on 1 and 2 threads. Keys are `String`s such
//! as `"user:123456"`, built up front; each request picks one with a cheap
//! pseudo-random index sequence that both sides share, so the 1,000,000-key cells
//! miss the caches on both sides alike. Each thread makes a fixed number of
//! checks and the wall time of the whole batch is taken. Every cell is the
//! median of [`REPETITIONS`] timed batches per side after one warm-up batch, the
//! sides taking turns going first; the 1,000,000 keys are inserted on both sides before
//! anything is timed. Bytes per key come from a counting global allocator: what
//! is allocated after inserting the keys minus what was allocated before.
//! Every 64th check of each thread is timed on its own, for the p99 latency
//! printed beside each median.
//!
//! Two more sides bound what a store can do. The floor only reads and hashes
//! each key, as every side must: at 1,000,000 keys the key's `String` header
//! and bytes are cache misses that both limiters pay alike, so
//! `floor / governor` (printed as the ceiling) bounds the ratio any store
//! could reach in that cell. The bare map ([`BareMap`]) is the least a
//! sharded store does: where Tollgate keeps up with it, the cell is bound by
//! the memory rather than by Tollgate's code.
//!
//! Run with `cargo bench -p tollgate-store --bench governor`; add
//! `-- --keys 1` (or `-- --keys 1000000`) to run only that pair of cells.

use std::alloc::System;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use cap::Cap;
use governor::DefaultKeyedRateLimiter;
use tollgate_core::{Algorithm, Clock, FailurePolicy, Limit, Quota, Store};
use tollgate_store::{FastClock, MemoryConfig, MemoryStore};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// The quota of both sides in a cell: one unit per `period`, so that each
/// admission keeps the key's state for another period, and a burst no run comes
/// near (`period × burst` must fit 64 bits of nanoseconds).
#[derive(Clone, Copy)]
struct CellQuota {
    period: Duration,
    burst: u32,
}

impl std::fmt::Display for CellQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "1 per {:?}, burst {}", self.period, self.burst)
    }
}

const MANY_KEYS: usize = 1_000_000;
const REPETITIONS: usize = 5;
const TARGET_RATIO: f64 = 1.5;

/// One side of the comparison: a keyed limiter that says yes or no.
trait Limiter: Sync {
    /// governor's keyed limiter takes its key as `&K`, here `&String`.
    #[allow(clippy::ptr_arg)]
    fn check(&self, key: &String) -> bool;
}

struct Governor(DefaultKeyedRateLimiter<String>);

impl Governor {
    fn new(cell: CellQuota) -> Self {
        let quota = governor::Quota::with_period(cell.period)
            .expect("a period longer than zero")
            .allow_burst(NonZeroU32::new(cell.burst).expect("a burst of at least 1"));
        Self(DefaultKeyedRateLimiter::keyed(quota))
    }
}

impl Limiter for Governor {
    fn check(&self, key: &String) -> bool {
        self.0.check_key(key).is_ok()
    }
}

/// Tollgate's memory store through `check_now`.
struct Tollgate {
    store: MemoryStore,
    quota: Quota,
}

impl Tollgate {
    fn new(cell: CellQuota) -> Self {
        Self {
            store: MemoryStore::new(MemoryConfig {
                // Room for every key: nothing is evicted.
                max_keys: 2 * MANY_KEYS,
                ..MemoryConfig::default()
            }),
            quota: Quota::new(1, cell.period)
                .and_then(|q| q.with_burst(cell.burst.into()))
                .expect("a valid quota"),
        }
    }

    fn limit<'a>(&self, key: &'a str) -> [Limit<'a>; 1] {
        [Limit {
            key,
            quota: self.quota,
            algorithm: Algorithm::Gcra,
            cost: 1,
            failure: FailurePolicy::Local,
        }]
    }
}

impl Limiter for Tollgate {
    fn check(&self, key: &String) -> bool {
        self.store.check_now(&self.limit(key)).allowed()
    }
}

/// The same store through the asynchronous `Store::check`, whose future is
/// ready at once: polled once with a waker that does nothing.
struct TollgateAsync(Tollgate);

impl Limiter for TollgateAsync {
    fn check(&self, key: &String) -> bool {
        let limits = self.0.limit(key);
        let future = pin!(self.0.store.check(&limits));
        match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(outcome)) => outcome.allowed(),
            Poll::Ready(Err(error)) => panic!("the memory store failed: {error}"),
            Poll::Pending => unreachable!("the memory store's future is ready at once"),
        }
    }
}

/// The floor: what every side pays before its store does anything, to read the
/// key (its `String` header, then its bytes) and hash it once. No limiter can
/// check faster than this, so `floor / governor` is the most any store could
/// reach in a cell: where it is below the target, the target cannot be met by
/// any store on this machine.
struct Floor(foldhash::quality::RandomState);

impl Limiter for Floor {
    fn check(&self, key: &String) -> bool {
        use std::hash::BuildHasher;
        std::hint::black_box(self.0.hash_one(key.as_bytes())) != 1
    }
}

/// The bare map: the least a store of Tollgate's design does. The key is
/// hashed once (64-bit foldhash), one of 128 `parking_lot` mutexes is
/// locked, a hashbrown table is probed, and the GCRA arithmetic runs inline,
/// with no expiry, eviction, hot slots or decision to hand back. Where Tollgate keeps up with it, what is
/// left of a cell is the memory, not the store's code: its ratio to governor
/// is what a sharded hash table reaches there.
struct BareMap {
    shards: Vec<Padded>,
    hasher: foldhash::quality::RandomState,
    clock: FastClock,
    /// GCRA's emission interval and tolerance, in nanoseconds.
    emission: u64,
    tolerance: u64,
}

/// A shard on a cache line pair of its own, as the store's are.
#[repr(align(128))]
struct Padded(parking_lot::Mutex<hashbrown::HashTable<(u64, u64)>>);

impl BareMap {
    fn new(cell: CellQuota) -> Self {
        let emission = cell.period.as_nanos() as u64;
        Self {
            shards: (0..128)
                .map(|_| Padded(parking_lot::Mutex::new(hashbrown::HashTable::new())))
                .collect(),
            hasher: Default::default(),
            clock: FastClock::new(),
            emission,
            tolerance: emission * (u64::from(cell.burst) - 1),
        }
    }
}

impl Limiter for BareMap {
    fn check(&self, key: &String) -> bool {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(key.as_bytes());
        let now = self.clock.now();
        // The shard from the middle bits: hashbrown takes the bucket from the
        // low bits and the tag from the top 7, which would otherwise be the
        // same for every key of a shard.
        let mut table = self.shards[(hash >> 32) as usize & 127].0.lock();
        let entry = match table.find_mut(hash, |e| e.0 == hash) {
            Some(entry) => entry,
            None => table.insert_unique(hash, (hash, 0), |e| e.0).into_mut(),
        };
        let tat = entry.1.max(now);
        let admitted = tat - now <= self.tolerance;
        if admitted {
            entry.1 = tat + self.emission;
        }
        admitted
    }
}

/// A cheap pseudo-random index sequence in `0..n` (an LCG, high bits scaled).
struct Picks {
    state: u64,
    n: u64,
}

impl Picks {
    fn new(seed: u64, n: usize) -> Self {
        Self {
            state: seed,
            n: n as u64,
        }
    }

    #[inline]
    fn next(&mut self) -> usize {
        self.state = self
            .state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (((self.state >> 32) * self.n) >> 32) as usize
    }
}

/// Every this many checks, one is timed on its own, for the latency
/// percentiles: two clock reads per 64 checks, the same on every side.
const SAMPLE_EVERY: usize = 64;

/// What one thread of a batch did: checks admitted, and the latency of every
/// [`SAMPLE_EVERY`]th check in nanoseconds.
#[derive(Default)]
struct Done {
    admitted: u64,
    latencies: Vec<u64>,
}

/// One timed batch: `threads` threads each make `per_thread` checks.
/// Returns the wall time, how many were admitted and the sampled latencies.
fn batch<L: Limiter>(
    limiter: &L,
    keys: &[String],
    threads: usize,
    per_thread: usize,
    seed: u64,
) -> (Duration, Done) {
    let start = Instant::now();
    let done = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads as u64)
            .map(|t| {
                scope.spawn(move || {
                    let mut picks =
                        Picks::new(seed ^ (t + 1).wrapping_mul(0x9E37_79B9), keys.len());
                    let mut done = Done {
                        admitted: 0,
                        latencies: Vec::with_capacity(per_thread / SAMPLE_EVERY + 1),
                    };
                    for i in 0..per_thread {
                        let key = &keys[picks.next()];
                        if i % SAMPLE_EVERY == 0 {
                            let at = Instant::now();
                            done.admitted += u64::from(limiter.check(key));
                            done.latencies.push(at.elapsed().as_nanos() as u64);
                        } else {
                            done.admitted += u64::from(limiter.check(key));
                        }
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a benchmark thread panicked"))
            .fold(Done::default(), |mut all, done| {
                all.admitted += done.admitted;
                all.latencies.extend(done.latencies);
                all
            })
    });
    (start.elapsed(), done)
}

/// What one side did in one cell.
#[derive(Default)]
struct Side {
    rates: Vec<f64>,
    admitted: u64,
    checked: u64,
    latencies: Vec<u64>,
}

impl Side {
    fn median(&self) -> f64 {
        let mut rates = self.rates.clone();
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    }

    /// The 99th percentile of the sampled latencies of all timed batches.
    fn p99(&self) -> u64 {
        let mut latencies = self.latencies.clone();
        latencies.sort_unstable();
        latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]
    }
}

/// Bytes per key a limiter took to hold its keys.
#[derive(Clone, Copy)]
struct PerKey {
    /// Asked of the allocator (what the limiter allocated, without malloc's overhead).
    allocated: f64,
    /// Resident set growth (malloc's rounding and headers included).
    resident: f64,
}

/// The resident set size, from `/proc/self/status`, in bytes.
fn resident() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Inserts every key with one check each; returns what that took per key.
fn populate<L: Limiter>(make: impl FnOnce() -> L, keys: &[String]) -> (L, PerKey) {
    let (before, rss_before) = (ALLOCATOR.allocated(), resident());
    let limiter = make();
    for key in keys {
        assert!(limiter.check(key), "the quota admits every first request");
    }
    let allocated = ALLOCATOR.allocated().saturating_sub(before);
    let rss = resident()
        .zip(rss_before)
        .map_or(0, |(a, b)| a.saturating_sub(b));
    let n = keys.len() as f64;
    let per_key = PerKey {
        allocated: allocated as f64 / n,
        resident: rss as f64 / n,
    };
    (limiter, per_key)
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user:{i:06}")).collect()
}

fn per_second(rate: f64) -> String {
    format!("{:.2} M/s", rate / 1e6)
}

/// The processor count and model, from `/proc/cpuinfo`.
fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpus} CPUs, {model}")
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

struct Row {
    keys: usize,
    threads: usize,
    governor: Side,
    tollgate: Side,
    tollgate_async: Side,
    bare: Side,
    floor: Side,
}

fn main() {
    let started = Instant::now();
    let cells = [
        (
            1,
            2_000_000,
            CellQuota {
                period: Duration::from_secs(60),
                burst: 250_000_000,
            },
        ),
        (
            MANY_KEYS,
            600_000,
            CellQuota {
                period: Duration::from_secs(3600),
                burst: 1_000_000,
            },
        ),
    ];
    // `cargo bench` passes `--bench`; `--keys N` runs only the cells of N keys.
    let mut args = std::env::args().skip(1);
    let mut only = None;
    while let Some(arg) = args.next() {
        if arg == "--keys" {
            let n = args.next().and_then(|n| n.parse::<usize>().ok());
            only = Some(
                n.filter(|n| cells.iter().any(|c| c.0 == *n))
                    .unwrap_or_else(|| {
                        eprintln!("--keys takes 1 or {MANY_KEYS}");
                        std::process::exit(2)
                    }),
            );
        }
    }
    let cells: Vec<_> = cells
        .into_iter()
        .filter(|c| only.is_none_or(|n| n == c.0))
        .collect();
    println!(
        "Tollgate MemoryStore vs governor keyed limiter, GCRA on both; median of {REPETITIONS} \
         batches per cell after a warm-up; p99 of every {SAMPLE_EVERY}th check's latency \
         (two clock reads included)"
    );
    println!("machine: {}; load average at start: {}", machine(), load());
    for &(n, per_thread, quota) in &cells {
        println!("- {n} keys: {quota}, {per_thread} checks per thread per batch");
    }
    println!();
    let mut rows = Vec::new();
    let mut bytes_per_key = None;
    for &(n, per_thread, quota) in &cells {
        let keys = keys(n);
        let (governor, governor_bytes) = populate(|| Governor::new(quota), &keys);
        let (tollgate, tollgate_bytes) = populate(|| Tollgate::new(quota), &keys);
        let (bare, _) = populate(|| BareMap::new(quota), &keys);
        if n == MANY_KEYS {
            bytes_per_key = Some((governor_bytes, tollgate_bytes));
        }
        let tollgate = TollgateAsync(tollgate);
        let floor = Floor(Default::default());
        for threads in [1, 2] {
            let mut row = Row {
                keys: n,
                threads,
                governor: Side::default(),
                tollgate: Side::default(),
                tollgate_async: Side::default(),
                bare: Side::default(),
                floor: Side::default(),
            };
            for repetition in 0..=REPETITIONS {
                let seed = 0x5EED_0000 + repetition as u64;
                let time = |limiter: &dyn Fn() -> (Duration, Done), side: &mut Side| {
                    let (elapsed, done) = limiter();
                    // Repetition 0 is the warm-up.
                    if repetition > 0 {
                        let checked = (threads * per_thread) as u64;
                        side.rates.push(checked as f64 / elapsed.as_secs_f64());
                        side.admitted += done.admitted;
                        side.checked += checked;
                        side.latencies.extend(done.latencies);
                    }
                };
                // The sides take turns going first, so that no side is always
                // the one that runs right after another's batch.
                for side in (0..5).map(|i| (i + repetition) % 5) {
                    match side {
                        0 => time(
                            &|| batch(&governor, &keys, threads, per_thread, seed),
                            &mut row.governor,
                        ),
                        1 => time(
                            &|| batch(&tollgate.0, &keys, threads, per_thread, seed),
                            &mut row.tollgate,
                        ),
                        2 => time(
                            &|| batch(&tollgate, &keys, threads, per_thread, seed),
                            &mut row.tollgate_async,
                        ),
                        3 => time(
                            &|| batch(&bare, &keys, threads, per_thread, seed),
                            &mut row.bare,
                        ),
                        _ => time(
                            &|| batch(&floor, &keys, threads, per_thread, seed),
                            &mut row.floor,
                        ),
                    }
                }
            }
            rows.push(row);
        }
        assert_eq!(tollgate.0.store.len(), n, "nothing was evicted or expired");
        assert_eq!(governor.0.len(), n);
        let held: usize = bare.shards.iter().map(|s| s.0.lock().len()).sum();
        assert_eq!(held, n);
    }

    println!(
        "| keys | threads | governor | p99 | tollgate check_now | p99 | ratio | tollgate Store::check | p99 | ratio | bare map | ratio | floor | ceiling |"
    );
    println!(
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let mut met = true;
    for row in &rows {
        let g = row.governor.median();
        let t = row.tollgate.median();
        let a = row.tollgate_async.median();
        let b = row.bare.median();
        let f = row.floor.median();
        met &= t / g >= TARGET_RATIO && a / g >= TARGET_RATIO;
        println!(
            "| {} | {} | {} | {} ns | {} | {} ns | {:.2}× | {} | {} ns | {:.2}× | {} | {:.2}× | {} | {:.2}× |",
            row.keys,
            row.threads,
            per_second(g),
            row.governor.p99(),
            per_second(t),
            row.tollgate.p99(),
            t / g,
            per_second(a),
            row.tollgate_async.p99(),
            a / g,
            per_second(b),
            b / g,
            per_second(f),
            f / g,
        );
    }
    println!(
        "(bare map: 128 mutexes over hashbrown tables and the GCRA arithmetic, the least a \
         sharded store does; floor: reading and hashing the key alone, no store; ceiling: \
         floor / governor, the most any store could reach in that cell)"
    );
    println!();
    for row in &rows {
        println!(
            "admitted ({} keys, {} threads): governor {} of {}, tollgate {} of {} (check_now) and {} of {} (Store::check), bare map {} of {}",
            row.keys,
            row.threads,
            row.governor.admitted,
            row.governor.checked,
            row.tollgate.admitted,
            row.tollgate.checked,
            row.tollgate_async.admitted,
            row.tollgate_async.checked,
            row.bare.admitted,
            row.bare.checked,
        );
    }
    // Unknown (and so not met) when the 1,000,000-key cells were left out.
    let mut memory_met = None;
    if let Some((governor_bytes, tollgate_bytes)) = bytes_per_key {
        println!();
        println!(
            "bytes per key at {MANY_KEYS} keys (allocated after inserting them minus before; \
             resident set growth in brackets):"
        );
        for (name, bytes) in [("governor", governor_bytes), ("tollgate", tollgate_bytes)] {
            println!(
                "- {name}: {:.1} ({:.1} resident)",
                bytes.allocated, bytes.resident
            );
        }
        memory_met = Some(
            tollgate_bytes.allocated <= governor_bytes.allocated
                && tollgate_bytes.resident <= governor_bytes.resident,
        );
    }
    println!();
    println!(
        "target (≥ {TARGET_RATIO}× governor's decisions/s in every cell, through check_now and \
         Store::check, ≤ its bytes per key): {}; decisions/s {}, bytes per key {}",
        if met && memory_met == Some(true) {
            "MET"
        } else {
            "MISSED"
        },
        if met { "met" } else { "missed" },
        match memory_met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "not measured",
        },
    );
    println!(
        "(load average at end: {}; total {:.1} s)",
        load(),
        started.elapsed().as_secs_f64()
    );
}
