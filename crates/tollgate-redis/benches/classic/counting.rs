//! Rules as Envoy asks for them, one limit a check: Redis CPU per decision
//! at 1, 8 and 64 concurrent callers (tasks sharing each side's one
//! multiplexed connection: calls in flight, which is what Envoy's few
//! HTTP/2 connections with many calls on each come to at the store), on
//! one `redis-server`, on 100,000 keys (almost every check its key's first
//! in its window) and on 1,000 keys (tens of checks a key and window). The
//! sides: envoyproxy/ratelimit's pipelined `INCRBY` + `EXPIRE` (the peer),
//! Limitador's scripts, Tollgate's hit counter and fixed window (natively
//! counted), Tollgate's token bucket through the code (one `FCALL` per
//! batch), and with the modules loaded `TOLLGATE.GCRA` and `CL.THROTTLE`.
//!
//! Each run makes a fixed number of decisions, split over the callers; the
//! Redis CPU of a run is the change in `used_cpu_user + used_cpu_sys` over
//! it and until the keys it made have expired, divided by its decisions,
//! and its reads the change in `total_reads_processed`. Sides alternate;
//! medians of the runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use tokio::time::MissedTickBehavior;

use crate::measure::{CommandStats, median, redis_cpu, redis_reads};
use crate::sides::{Checker, Side};

/// Concurrent callers of each cell.
pub(crate) const CALLERS: [usize; 3] = [1, 8, 64];
/// The sides that need nothing but Redis, the peer first.
pub(crate) const SIDES: [Side; 4] = [
    Side::Envoy,
    Side::HitCounter,
    Side::FixedWindow,
    Side::Tollgate,
];
/// GCRA's sides with the modules loaded, the peer first: redis-cell's
/// `CL.THROTTLE`, the module's `TOLLGATE.GCRA`, the store's GCRA
/// (batches to `TOLLGATE.CHECK`), and the floor (a bare `SET … PX`).
pub(crate) const MODULE_SIDES: [Side; 4] =
    [Side::Cell, Side::Module, Side::TollgateGcra, Side::Floor];
/// The sliding log's sides, the code first: the store with the module
/// loaded (`TOLLGATE.CHECK`) against the same store calling the code.
pub(crate) const LOG_SIDES: [Side; 2] = [Side::LogCode, Side::LogModule];
/// Hybrid leasing's sides, the code first: a leasing check (op `h`)
/// through the module against the same through the code.
pub(crate) const LEASE_SIDES: [Side; 2] = [Side::LeaseCode, Side::LeaseModule];
/// Keys of each cell: sparse, then busy.
const KEY_COUNTS: [u64; 2] = [100_000, 1_000];
const DECISIONS: u64 = 32_000;
const WARMUP: u64 = 4_000;
const REPETITIONS: usize = 5;

/// One side's medians at one number of callers.
pub(crate) struct Row {
    keys: u64,
    callers: usize,
    side: Side,
    rate: f64,
    redis_cpu: f64,
    reads: f64,
    commands: String,
}

/// `decisions` checks by `callers` tasks, each on one of `keys` keys drawn
/// at random, as fast as they answer or, with a [`Pace`], at its rate:
/// (decisions/s, Redis CPU s per decision, reads per decision).
pub(crate) async fn run<C>(
    checker: &Arc<Checker<C>>,
    side: Side,
    (keys, callers): (u64, usize),
    (decisions, pace): (u64, Option<Pace>),
    seed: u64,
    admin: &mut [MultiplexedConnection],
) -> (f64, f64, f64)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let per_caller = decisions / callers as u64;
    // Each caller a check every `callers / rate` s, the callers' turns
    // (`burst` callers each) spread evenly over that period. A caller held
    // up skips the turns it missed: catching up, or counting the period
    // from its late check, would line every caller's turn up after a stall.
    let pace = pace.map(|Pace { rate, burst }| {
        let period = callers as f64 / rate;
        let burst = burst.clamp(1, callers);
        let turns = callers.div_ceil(burst);
        (
            Duration::from_secs_f64(period),
            Duration::from_secs_f64(period / turns as f64),
            burst as u64,
        )
    });
    let keys_before = key_count(admin).await;
    let cpu_before = redis_cpu(admin).await;
    let reads_before = redis_reads(admin).await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers as u64)
        .map(|c| {
            let checker = Arc::clone(checker);
            let mut state = seed.wrapping_mul(1_000_003).wrapping_add(c);
            tokio::spawn(async move {
                let mut ticks = pace.map(|(period, stagger, burst)| {
                    let first = tokio::time::Instant::now() + stagger * (c / burst) as u32;
                    let mut ticks = tokio::time::interval_at(first, period);
                    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
                    ticks
                });
                for _ in 0..per_caller {
                    if let Some(ticks) = ticks.as_mut() {
                        ticks.tick().await;
                    }
                    let key = side.key(&format!("user:{}", crate::next(&mut state) % keys));
                    checker.check(side, &key, 1).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let polls = expired(admin, keys_before).await;
    let cpu = redis_cpu(admin).await - cpu_before;
    // The harness's own INFO between the two counts is one read, and each
    // poll of the keyspace one more.
    let reads = (redis_reads(admin).await - reads_before).saturating_sub(1 + polls);
    let n = (per_caller * callers as u64) as f64;
    (n / elapsed, cpu / n, reads as f64 / n)
}

/// How paced callers check.
#[derive(Clone, Copy)]
pub(crate) struct Pace {
    /// Decisions a second over all callers.
    pub(crate) rate: f64,
    /// Callers whose checks go at once: Redis reads the commands that
    /// arrive together in one read, which costs it less a decision than a
    /// read each (a service behind Envoy gets its calls in such bursts).
    pub(crate) burst: usize,
}

/// The keys of every master (`DBSIZE`).
async fn key_count(admin: &mut [MultiplexedConnection]) -> u64 {
    let mut keys = 0;
    for conn in admin.iter_mut() {
        let n: u64 = redis::cmd("DBSIZE").query_async(conn).await.unwrap();
        keys += n;
    }
    keys
}

/// Waits until the keys are back to `before` (at most 5 s), so that a
/// side's Redis CPU counts expiring the keys it made, not those of the
/// side before it: a key lives until its window's end on Tollgate's
/// counting sides, a second after its last `EXPIRE` on envoyproxy's, and
/// most of a short run's keys outlive it. Answers the polls it sent.
async fn expired(admin: &mut [MultiplexedConnection], before: u64) -> u64 {
    let start = Instant::now();
    let mut polls = 0;
    loop {
        polls += 1;
        if key_count(admin).await <= before || start.elapsed().as_secs() >= 5 {
            return polls;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Every cell, for `sides`: rows for the table.
pub(crate) async fn cells<C>(
    checker: &Arc<Checker<C>>,
    sides: &[Side],
    admin: &mut [MultiplexedConnection],
) -> Vec<Row>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut rows = Vec::new();
    let mut seed = 1 << 40;
    let only: Option<u64> = std::env::var("TOLLGATE_BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok());
    for keys in KEY_COUNTS
        .into_iter()
        .filter(|k| only.is_none_or(|o| o == *k))
    {
        for callers in CALLERS {
            eprintln!("== counting, {keys} keys, {callers} callers");
            let cell = (keys, callers);
            for &side in sides {
                seed += 1;
                run(checker, side, cell, (WARMUP, None), seed, admin).await;
            }
            let mut runs: Vec<Vec<(f64, f64, f64)>> = sides.iter().map(|_| Vec::new()).collect();
            let mut stats: Vec<CommandStats> =
                sides.iter().map(|_| CommandStats::default()).collect();
            for _ in 0..REPETITIONS {
                for (s, &side) in sides.iter().enumerate() {
                    seed += 1;
                    CommandStats::reset(admin).await;
                    runs[s].push(run(checker, side, cell, (DECISIONS, None), seed, admin).await);
                    stats[s].add(admin).await;
                }
            }
            for (s, &side) in sides.iter().enumerate() {
                let decisions = DECISIONS / callers as u64 * callers as u64 * REPETITIONS as u64;
                rows.push(Row {
                    keys,
                    callers,
                    side,
                    rate: median(runs[s].iter().map(|r| r.0).collect()),
                    redis_cpu: median(runs[s].iter().map(|r| r.1).collect()) * 1e6,
                    reads: median(runs[s].iter().map(|r| r.2).collect()),
                    commands: stats[s].summary(decisions),
                });
            }
        }
    }
    rows
}

/// The table of `rows`, whose first side is the peer, titled `what`.
pub(crate) fn print(rows: &[Row], what: &str) {
    let Some(peer) = rows.first().map(|r| r.side) else {
        return;
    };
    println!(
        "{what}, one redis-server, 100 per second per key, {DECISIONS} decisions per run, median of {REPETITIONS}\n"
    );
    println!(
        "| keys | callers | side | decisions/s | Redis CPU µs/decision | reads/decision | ÷ {}'s CPU |",
        peer.name()
    );
    println!("| ---: | ---: | --- | ---: | ---: | ---: | ---: |");
    for row in rows {
        let peer = rows
            .iter()
            .find(|r| r.keys == row.keys && r.callers == row.callers && r.side == peer)
            .map_or(f64::NAN, |r| r.redis_cpu);
        println!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.3} | {:.2}× |",
            row.keys,
            row.callers,
            row.side.name(),
            row.rate,
            row.redis_cpu,
            row.reads,
            row.redis_cpu / peer
        );
    }
    println!();
    for row in rows {
        println!(
            "commandstats, {} keys, {} callers, {}: {}",
            row.keys,
            row.callers,
            row.side.name(),
            row.commands
        );
    }
}
