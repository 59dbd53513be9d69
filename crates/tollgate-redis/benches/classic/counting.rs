//! Counting rules as Envoy asks for them: Redis CPU per decision at 1, 8 and
//! 64 concurrent callers, on 100,000 keys of one `redis-server`, for
//! envoyproxy/ratelimit's pipelined `INCRBY` + `EXPIRE` (the peer),
//! Tollgate's hit counter and fixed window (natively counted), and
//! Tollgate's token bucket (one `FCALL` per batch, for what the code costs).
//! The same cells compare GCRA with the module loaded: redis-cell's
//! `CL.THROTTLE` (the peer), the module's `TOLLGATE.GCRA` and the store's
//! GCRA (batches to `TOLLGATE.CHECK`).
//!
//! Each run makes a fixed number of decisions, split over the callers; the
//! Redis CPU of a run is the change in `used_cpu_user + used_cpu_sys` over
//! it, divided by its decisions. Sides alternate; medians of the runs.

use std::sync::Arc;
use std::time::Instant;

use redis::aio::{ConnectionLike, MultiplexedConnection};

use crate::measure::{CommandStats, median, redis_cpu};
use crate::sides::{Checker, Side};

/// Concurrent callers of each cell.
pub(crate) const CALLERS: [usize; 3] = [1, 8, 64];
/// The counting sides, the peer first.
pub(crate) const SIDES: [Side; 4] = [
    Side::Envoy,
    Side::HitCounter,
    Side::FixedWindow,
    Side::Tollgate,
];
/// GCRA's sides with the modules loaded, the peer first.
pub(crate) const MODULE_SIDES: [Side; 3] = [Side::Cell, Side::Module, Side::TollgateGcra];
const KEYS: u64 = 100_000;
const DECISIONS: u64 = 32_000;
const WARMUP: u64 = 4_000;
const REPETITIONS: usize = 5;

/// One side's medians at one number of callers.
pub(crate) struct Row {
    callers: usize,
    side: Side,
    rate: f64,
    redis_cpu: f64,
    commands: String,
}

/// `decisions` checks by `callers` tasks, each on a key drawn at random:
/// (decisions/s, Redis CPU s per decision).
async fn run<C>(
    checker: &Arc<Checker<C>>,
    side: Side,
    callers: usize,
    decisions: u64,
    seed: u64,
    admin: &mut [MultiplexedConnection],
) -> (f64, f64)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let per_caller = decisions / callers as u64;
    let cpu_before = redis_cpu(admin).await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers as u64)
        .map(|c| {
            let checker = Arc::clone(checker);
            let mut state = seed.wrapping_mul(1_000_003).wrapping_add(c);
            tokio::spawn(async move {
                for _ in 0..per_caller {
                    let key = side.key(&format!("user:{}", crate::next(&mut state) % KEYS));
                    checker.check(side, &key, 1).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = redis_cpu(admin).await - cpu_before;
    let n = (per_caller * callers as u64) as f64;
    (n / elapsed, cpu / n)
}

/// Every cell of `sides`: rows for the table.
pub(crate) async fn cells<C>(
    checker: &Arc<Checker<C>>,
    admin: &mut [MultiplexedConnection],
    sides: &[Side],
) -> Vec<Row>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut rows = Vec::new();
    let mut seed = 1 << 40;
    for callers in CALLERS {
        eprintln!("== {} and others, {callers} callers", sides[0].name());
        for &side in sides {
            seed += 1;
            run(checker, side, callers, WARMUP, seed, admin).await;
        }
        let mut runs: Vec<Vec<(f64, f64)>> = sides.iter().map(|_| Vec::new()).collect();
        let mut stats: Vec<CommandStats> = sides.iter().map(|_| CommandStats::default()).collect();
        for _ in 0..REPETITIONS {
            for (s, &side) in sides.iter().enumerate() {
                seed += 1;
                CommandStats::reset(admin).await;
                runs[s].push(run(checker, side, callers, DECISIONS, seed, admin).await);
                stats[s].add(admin).await;
            }
        }
        for (s, &side) in sides.iter().enumerate() {
            let decisions = DECISIONS / callers as u64 * callers as u64 * REPETITIONS as u64;
            rows.push(Row {
                callers,
                side,
                rate: median(runs[s].iter().map(|r| r.0).collect()),
                redis_cpu: median(runs[s].iter().map(|r| r.1).collect()) * 1e6,
                commands: stats[s].summary(decisions),
            });
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
        "{what}, one redis-server, {KEYS} keys, 100 per second per key, {DECISIONS} decisions per run, median of {REPETITIONS}\n"
    );
    println!(
        "| callers | side | decisions/s | Redis CPU µs/decision | ÷ {}'s |",
        peer.name()
    );
    println!("| ---: | --- | ---: | ---: | ---: |");
    for row in rows {
        let peer = rows
            .iter()
            .find(|r| r.callers == row.callers && r.side == peer)
            .map_or(f64::NAN, |r| r.redis_cpu);
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2}× |",
            row.callers,
            row.side.name(),
            row.rate,
            row.redis_cpu,
            row.redis_cpu / peer
        );
    }
    println!();
    for row in rows {
        println!(
            "commandstats, {} callers, {}: {}",
            row.callers,
            row.side.name(),
            row.commands
        );
    }
}
