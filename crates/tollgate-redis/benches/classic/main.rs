//! Tollgate's Redis store against its peers, in one run, on the same Redis:
//! the classic token bucket script, a minimal GCRA script, redis-cell's
//! `CL.THROTTLE` (a native module, when `TOLLGATE_REDIS_CELL_MODULE` names its
//! built `libredis_cell.so`; skipped with a note otherwise), Tollgate's own
//! module's `TOLLGATE.GCRA` (when `TOLLGATE_REDIS_MODULE` names its built
//! `libtollgate_redis_module.so`; likewise) and Tollgate's store (`sides.rs`
//! describes each).
//!
//! Cells: 50 concurrent callers (tokio tasks, 2 worker threads) on 1 hot key,
//! on 100,000 keys and on 10,000,000 keys (each check picks its key uniformly
//! at random), on one `redis-server` and on a Redis Cluster of 3 masters, all
//! on loopback. Each side runs `WARMUP` seconds, then `SECONDS` per run, sides
//! alternating, `REPETITIONS` times; the medians are reported:
//!
//! - decisions/s;
//! - Redis CPU µs per decision: `used_cpu_user + used_cpu_sys` (`INFO cpu`),
//!   summed over the masters, over the run, divided by the decisions;
//! - client CPU µs per decision: this process's (`/proc/self/stat`: the callers
//!   and either side's client code);
//! - the p99 latency of one check, as its caller sees it;
//! - bytes per key: `MEMORY USAGE` of every Redis key a side wrote for 1,000
//!   subjects (with an hourly quota, so nothing expires while sampling), per
//!   subject;
//! - the ratio of decisions/s to the classic script's in the same cell.
//!
//! The keys a cell's checks write expire within milliseconds (once their
//! state is full again), so before the cells of 1,000,000 keys or more the
//! masters are filled with that many other keys (`DEBUG POPULATE`, spread
//! over the masters), removed after the cell: every lookup then searches a
//! dictionary of that size, as in a Redis that holds that many limits.
//!
//! Each run starts with `CONFIG RESETSTAT`; `INFO commandstats` after it gives
//! each command's µs per call and calls per decision (commands called from a
//! script or a module included; a script's time, `EVALSHA` or `FCALL`,
//! includes theirs).
//!
//! Then, on one server, hybrid mode on a hot key. `scripts/bench-redis` builds
//! redis-cell and runs this; alone: `cargo bench -p tollgate-redis --bench
//! classic` (needs `redis-server` and `redis-cli` on the PATH). Environment:
//! `TOLLGATE_BENCH_KEYS=100000` runs one key count only (of the counting
//! and module cells too: 100000 or 1000),
//! `TOLLGATE_BENCH_TOPOLOGY=single` (or `cluster`) one topology only.
//!
//! Last, on one server, one limit a check at 1, 8 and 64 callers, on
//! 100,000 and 1,000 keys: counting rules against envoyproxy/ratelimit's
//! pipelined `INCRBY` + `EXPIRE` and Limitador's scripts, beside the code's
//! and the modules' cost (`counting.rs`). `TOLLGATE_BENCH_PART=counting`
//! runs only those, `classic` all but those. With both modules named, the
//! same cells compare GCRA: `CL.THROTTLE`, the module's `TOLLGATE.GCRA` and
//! the store's GCRA (batches to `TOLLGATE.CHECK`, a lone check to
//! `TOLLGATE.GCRA`), beside the floor of one command a decision (a bare
//! `SET … PX`); `TOLLGATE_BENCH_PART=module` runs only those (also run with `classic`).
//! With Tollgate's module named, the same cells compare the store's sliding
//! log through the module (`TOLLGATE.CHECK`) and through the code (a store
//! with `module: false`, `FCALL`) on one server: `TOLLGATE_BENCH_PART=log`
//! runs only those; and a hybrid instance's leasing check of a GCRA limit
//! (`LeaseStore::check_leasing`, op `h`) through each:
//! `TOLLGATE_BENCH_PART=lease` runs only those.

mod counting;
mod measure;
mod servers;
mod sides;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota, Store};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_store::{DenyCache, Hybrid, HybridConfig};

use measure::{CommandStats, latencies, median, own_cpu, redis_cpu};
use servers::{Deployment, Modules};
use sides::{Checker, Side};

const CALLERS: usize = 50;
const KEY_COUNTS: [u64; 3] = [1, 100_000, 10_000_000];
/// Cells of this many keys or more run on a keyspace filled to their size.
const BALLAST_FROM: u64 = 1_000_000;
const WARMUP: f64 = 1.0;
const SECONDS: f64 = 2.0;
const REPETITIONS: usize = 3;

/// What one run measured.
struct Run {
    rate: f64,
    redis_cpu: f64,
    client_cpu: f64,
    latency: Histogram<u64>,
    decisions: u64,
}

/// One row of the report: a side's medians in one cell.
struct Row {
    /// 1 for one server.
    masters: usize,
    keys: u64,
    side: Side,
    rate: f64,
    redis_cpu: f64,
    client_cpu: f64,
    p99: f64,
    bytes: f64,
}

/// A pseudo-random stream (splitmix64), one per caller and run, so runs and
/// sides draw fresh keys from large key spaces.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Runs one side on one key count for `seconds`.
async fn run<C>(
    checker: &Arc<Checker<C>>,
    side: Side,
    keys: u64,
    seed: u64,
    seconds: f64,
    admin: &mut [MultiplexedConnection],
) -> Run
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = redis_cpu(admin).await;
    let own_before = own_cpu();
    let start = Instant::now();
    let tasks: Vec<_> = (0..CALLERS as u64)
        .map(|c| {
            let (stop, checker) = (Arc::clone(&stop), Arc::clone(checker));
            let mut state = seed.wrapping_mul(1_000_003).wrapping_add(c);
            tokio::spawn(async move {
                let mut latency = latencies();
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let subject = if keys == 1 {
                        "hot".to_owned()
                    } else {
                        format!("user:{}", next(&mut state) % keys)
                    };
                    let key = side.key(&subject);
                    let t = Instant::now();
                    checker.check(side, &key, 1).await;
                    latency.saturating_record(t.elapsed().as_nanos() as u64);
                    done += 1;
                }
                (done, latency)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut latency = latencies();
    let mut decisions = 0;
    for t in tasks {
        let (done, h) = t.await.unwrap();
        decisions += done;
        latency.add(h).unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let own = own_cpu() - own_before;
    let cpu = redis_cpu(admin).await - cpu_before;
    let n = decisions as f64;
    Run {
        rate: n / elapsed,
        redis_cpu: cpu / n,
        client_cpu: own / n,
        latency,
        decisions,
    }
}

/// Sends one command to every master.
async fn on_masters(admin: &mut [MultiplexedConnection], args: &[&str]) {
    for conn in admin {
        let _: redis::Value = redis::cmd(args[0])
            .arg(&args[1..])
            .query_async(conn)
            .await
            .unwrap();
    }
}

/// Sums an `INFO` number over the masters: the one after `prefix` (e.g.
/// `used_memory:`, `db0:keys=`) up to the next comma; 0 where absent.
async fn info_sum(admin: &mut [MultiplexedConnection], section: &str, prefix: &str) -> u64 {
    let mut total = 0;
    for conn in admin {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(conn)
            .await
            .unwrap();
        total += info
            .lines()
            .find_map(|l| l.strip_prefix(prefix)?.split(',').next())
            .map_or(0, |v| v.trim().parse::<u64>().unwrap());
    }
    total
}

/// Bytes per subject for one side: 1,000 subjects checked once with 100 per
/// hour, then `MEMORY USAGE` of every key on every master that holds one
/// (whatever its layout, auxiliary keys included), over 1,000. Flushes the
/// masters before and after.
async fn bytes_per_key<C>(
    checker: &Checker<C>,
    side: Side,
    admin: &mut [MultiplexedConnection],
) -> f64
where
    C: ConnectionLike + Clone + Send + Sync,
{
    on_masters(admin, &["FLUSHALL"]).await;
    for i in 0..1000 {
        checker
            .check(side, &side.key(&format!("size:{i}")), 3600)
            .await;
    }
    let mut total = 0;
    for conn in admin.iter_mut() {
        let mut cursor = 0u64;
        loop {
            let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await
                .unwrap();
            for key in found {
                let size: Option<u64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&key)
                    .query_async(conn)
                    .await
                    .unwrap();
                total += size.unwrap_or(0);
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    on_masters(admin, &["FLUSHALL"]).await;
    total as f64 / 1000.0
}

/// Every cell of one deployment: rows for the tables, and lines on where the
/// time went and what was touched.
async fn deployment_cells<C>(
    deployment: &Deployment,
    checker: Arc<Checker<C>>,
    sides: &[Side],
    key_counts: &[u64],
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let topology = if deployment.is_cluster() {
        "cluster"
    } else {
        "single"
    };
    let mut admin = deployment.admin().await;
    let mut bytes = Vec::new();
    for &side in sides {
        bytes.push(bytes_per_key(&checker, side, &mut admin).await);
    }
    notes.push(format!(
        "bytes per key in Redis ({topology}; MEMORY USAGE): {}",
        sides
            .iter()
            .zip(&bytes)
            .map(|(s, b)| format!("{} {b:.0}", s.name()))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut seed = 0;
    for &keys in key_counts {
        eprintln!("== {topology}, {keys} keys");
        let ballast = keys >= BALLAST_FROM;
        if ballast {
            let per_master = (keys / admin.len() as u64).to_string();
            on_masters(
                &mut admin,
                &["DEBUG", "POPULATE", &per_master, "ballast", "16"],
            )
            .await;
        }
        for &side in sides {
            seed += 1;
            run(&checker, side, keys, seed, WARMUP, &mut admin).await;
        }
        let mut runs: Vec<Vec<Run>> = sides.iter().map(|_| Vec::new()).collect();
        let mut stats: Vec<CommandStats> = sides.iter().map(|_| CommandStats::default()).collect();
        for _ in 0..REPETITIONS {
            for (s, &side) in sides.iter().enumerate() {
                seed += 1;
                CommandStats::reset(&mut admin).await;
                runs[s].push(run(&checker, side, keys, seed, SECONDS, &mut admin).await);
                stats[s].add(&mut admin).await;
            }
        }
        for (s, &side) in sides.iter().enumerate() {
            let of = |f: fn(&Run) -> f64| median(runs[s].iter().map(f).collect());
            let decisions: u64 = runs[s].iter().map(|r| r.decisions).sum();
            rows.push(Row {
                masters: deployment.masters(),
                keys,
                side,
                rate: of(|r| r.rate),
                redis_cpu: of(|r| r.redis_cpu) * 1e6,
                client_cpu: of(|r| r.client_cpu) * 1e6,
                p99: of(|r| r.latency.value_at_quantile(0.99) as f64) / 1e3,
                bytes: bytes[s],
            });
            notes.push(format!(
                "commandstats, {topology}, {keys} keys, {}: {}",
                side.name(),
                stats[s].summary(decisions)
            ));
        }
        let live = info_sum(&mut admin, "keyspace", "db0:keys=").await;
        notes.push(format!(
            "touched, {topology}, {keys} keys: {} decisions per side over the measured runs; \
             {} keys live at the end (the ballast included; a side's expire once their state is back to full), \
             used_memory {:.1} MiB",
            sides
                .iter()
                .zip(&runs)
                .map(|(s, r)| format!(
                    "{} {}",
                    s.name(),
                    r.iter().map(|r| r.decisions).sum::<u64>()
                ))
                .collect::<Vec<_>>()
                .join(", "),
            live,
            info_sum(&mut admin, "memory", "used_memory:").await as f64 / (1 << 20) as f64,
        ));
        if ballast {
            on_masters(&mut admin, &["FLUSHALL"]).await;
        }
    }
    notes.push(format!(
        "tollgate stats ({topology}): {:?}",
        checker.store.inner().stats()
    ));
}

/// Hybrid mode on one hot key whose budget covers every request (1,000,000
/// per second): decisions/s, and decisions per Redis operation (script and
/// function calls counted by `INFO commandstats`).
async fn hybrid(url: &str, admin: &mut [MultiplexedConnection]) -> (f64, f64) {
    let redis = RedisStore::connect(url, config()).await.unwrap();
    let store = Arc::new(Hybrid::new(redis, HybridConfig::default()));
    CommandStats::reset(admin).await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (stop, done, store) = (Arc::clone(&stop), Arc::clone(&done), Arc::clone(&store));
            tokio::spawn(async move {
                let limit = Limit {
                    key: "hybrid-hot",
                    quota: Quota::per_second(1_000_000).unwrap(),
                    algorithm: Algorithm::Gcra,
                    cost: 1,
                    failure: FailurePolicy::Local,
                };
                while !stop.load(Ordering::Relaxed) {
                    store.check(&[limit]).await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(SECONDS)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut stats = CommandStats::default();
    stats.add(admin).await;
    let n = done.load(Ordering::Relaxed) as f64;
    (n / elapsed, n / (stats.script_calls() as f64).max(1.0))
}

fn config() -> RedisConfig {
    RedisConfig {
        // Long enough that a run on a machine busy with other jobs is
        // measured, not ended by a check that waited.
        timeout: Duration::from_secs(10),
        ..RedisConfig::default()
    }
}

/// The deny cache the service stacks over Redis.
async fn tollgate(url: &str) -> DenyCache<RedisStore> {
    DenyCache::new(RedisStore::connect(url, config()).await.unwrap(), 65_536)
}

fn print_tables(rows: &[Row]) {
    println!(
        "| topology | keys | side | decisions/s | Redis CPU µs/decision | client CPU µs/decision | p99 µs | bytes/key | ratio |"
    );
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for row in rows {
        let classic = rows
            .iter()
            .find(|r| r.masters == row.masters && r.keys == row.keys && r.side == Side::Classic)
            .map_or(f64::NAN, |r| r.rate);
        println!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.0} | {:.2}× |",
            if row.masters > 1 { "cluster" } else { "single" },
            row.keys,
            row.side.name(),
            row.rate,
            row.redis_cpu,
            row.client_cpu,
            row.p99,
            row.bytes,
            row.rate / classic
        );
    }
    let pairs: Vec<(&Row, &Row)> = rows
        .iter()
        .filter(|r| r.masters > 1)
        .filter_map(|c| {
            rows.iter()
                .find(|s| s.masters == 1 && s.keys == c.keys && s.side == c.side)
                .map(|s| (s, c))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!(
        "\nCluster against one server. Per master: the cluster's decisions/s over its masters; \
         Redis CPU: summed over the masters, per decision.\n"
    );
    println!(
        "| keys | side | single decisions/s | cluster decisions/s | cluster per master | per master ÷ single | Redis CPU µs/decision, cluster ÷ single |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    for (single, cluster) in pairs {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
            single.keys,
            single.side.name(),
            single.rate,
            cluster.rate,
            cluster.rate / cluster.masters as f64,
            cluster.rate / cluster.masters as f64 / single.rate,
            cluster.redis_cpu / single.redis_cpu
        );
    }
}

/// envoyproxy/ratelimit's pipeline on a Redis another program measures
/// (`scripts/bench-envoy-redis`, whose Tollgate serves Envoy on the same
/// server): `TOLLGATE_BENCH_DECISIONS` checks (default 100,000) by
/// `TOLLGATE_BENCH_CALLERS` callers (default 50) on 100,000 keys, against
/// `TOLLGATE_BENCH_REDIS`, at `TOLLGATE_BENCH_RATE` decisions/s when set,
/// `TOLLGATE_BENCH_BURST` callers at once (default 1): the rate Envoy's
/// side served, in bursts of the size its reads per decision show, so that
/// both sides' commands arrive alike (Redis pays for a read, whatever it
/// holds); prints its Redis CPU and reads per decision.
async fn peer() {
    let var = |name: &str, default: u64| {
        std::env::var(name).map_or(default, |v| {
            v.parse().unwrap_or_else(|_| panic!("{name}: a number"))
        })
    };
    let url = std::env::var("TOLLGATE_BENCH_REDIS").expect("TOLLGATE_BENCH_REDIS: the Redis URL");
    let (decisions, callers) = (
        var("TOLLGATE_BENCH_DECISIONS", 100_000),
        var("TOLLGATE_BENCH_CALLERS", 50),
    );
    let burst = var("TOLLGATE_BENCH_BURST", 1) as usize;
    let pace = std::env::var("TOLLGATE_BENCH_RATE").ok().map(|v| {
        let rate = v
            .parse::<f64>()
            .ok()
            .filter(|r| r.is_finite() && *r > 0.0)
            .unwrap_or_else(|| panic!("TOLLGATE_BENCH_RATE: decisions a second, not {v:?}"));
        counting::Pace { rate, burst }
    });
    let client = redis::Client::open(url.as_str()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut admin = vec![client.get_multiplexed_async_connection().await.unwrap()];
    let checker = Arc::new(Checker::new(conn, tollgate(&url).await));
    let cell = (100_000, callers as usize);
    let warmup = (decisions / 10, pace);
    counting::run(&checker, Side::Envoy, cell, warmup, 1, &mut admin).await;
    let (rate, cpu, reads) = counting::run(
        &checker,
        Side::Envoy,
        cell,
        (decisions, pace),
        2,
        &mut admin,
    )
    .await;
    println!(
        "envoyproxy pipeline, {callers} callers, {decisions} decisions: {rate:.0} decisions/s, Redis CPU {:.2} µs/decision, {reads:.3} reads/decision",
        cpu * 1e6
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let modules = Modules {
        cell: std::env::var_os("TOLLGATE_REDIS_CELL_MODULE").map(PathBuf::from),
        tollgate: std::env::var_os("TOLLGATE_REDIS_MODULE").map(PathBuf::from),
    };
    let only_keys: Option<u64> = std::env::var("TOLLGATE_BENCH_KEYS")
        .ok()
        .map(|v| v.parse().expect("TOLLGATE_BENCH_KEYS: a number of keys"));
    let topology = std::env::var("TOLLGATE_BENCH_TOPOLOGY").ok();
    let part = std::env::var("TOLLGATE_BENCH_PART").ok();
    let (classic, counting, module, log, lease) = match part.as_deref() {
        None => (true, true, true, true, true),
        Some("classic") => (true, false, true, false, false),
        Some("counting") => (false, true, false, false, false),
        Some("module") => (false, false, true, false, false),
        Some("log") => (false, false, false, true, false),
        Some("lease") => (false, false, false, false, true),
        Some("peer") => return runtime.block_on(peer()),
        Some(other) => panic!(
            "TOLLGATE_BENCH_PART: classic, counting, module, log, lease or peer, not {other:?}"
        ),
    };
    let log = log && modules.tollgate.is_some();
    let lease = lease && modules.tollgate.is_some();
    let module = module && modules.cell.is_some() && modules.tollgate.is_some();
    let sides: Vec<Side> = [
        Side::Classic,
        Side::Gcra,
        Side::Cell,
        Side::Module,
        Side::Tollgate,
    ]
    .into_iter()
    .filter(|s| *s != Side::Cell || modules.cell.is_some())
    .filter(|s| *s != Side::Module || modules.tollgate.is_some())
    .collect();
    let key_counts: Vec<u64> = KEY_COUNTS
        .into_iter()
        .filter(|k| only_keys.is_none_or(|o| o == *k))
        .collect();
    if classic {
        println!(
            "{CALLERS} callers, 100/s bursts of 100, {WARMUP} s warm-up then {SECONDS} s per run, sides alternating, median of {REPETITIONS}"
        );
        if modules.cell.is_none() {
            println!(
                "CL.THROTTLE skipped: TOLLGATE_REDIS_CELL_MODULE does not name redis-cell's module (scripts/bench-redis builds it)"
            );
        }
        if modules.tollgate.is_none() {
            println!(
                "tollgate module GCRA skipped: TOLLGATE_REDIS_MODULE does not name Tollgate's module (scripts/bench-redis builds it)"
            );
        }
        println!();
    }
    runtime.block_on(async {
        let mut rows = Vec::new();
        let mut notes = Vec::new();
        for cluster in [false, true].into_iter().filter(|_| classic) {
            let name = if cluster { "cluster" } else { "single" };
            if topology.as_deref().is_some_and(|t| t != name) {
                continue;
            }
            eprintln!("== starting Redis ({name})");
            let deployment = if cluster {
                Deployment::cluster(&modules)
            } else {
                Deployment::single(&modules)
            };
            let store = tollgate(&deployment.store_url()).await;
            if cluster {
                let client = redis::cluster::ClusterClient::new(deployment.node_urls()).unwrap();
                let conn = client.get_async_connection().await.unwrap();
                let checker = Arc::new(Checker::new(conn, store));
                deployment_cells(&deployment, checker, &sides, &key_counts, &mut rows, &mut notes).await;
            } else {
                let client = redis::Client::open(deployment.store_url()).unwrap();
                let conn = client.get_multiplexed_async_connection().await.unwrap();
                let checker = Arc::new(Checker::new(conn, store));
                deployment_cells(&deployment, checker, &sides, &key_counts, &mut rows, &mut notes).await;
                let (rate, per_op) = hybrid(&deployment.store_url(), &mut deployment.admin().await).await;
                notes.push(format!(
                    "hybrid mode, {CALLERS} callers, 1 hot key (1,000,000/s): {rate:.0} decisions/s, {per_op:.0} decisions per Redis operation"
                ));
            }
        }
        if classic {
            print_tables(&rows);
            println!();
            for note in notes {
                println!("{note}");
            }
            println!();
        }
        if counting {
            eprintln!("== starting Redis (single, counting)");
            let deployment = Deployment::single(&modules);
            // Without the module, so that its token bucket side is a call
            // of the code; the modules' sides are the module part's.
            let url = deployment.store_url();
            let store = RedisStore::connect(&url, RedisConfig { module: false, ..config() });
            let store = DenyCache::new(store.await.unwrap(), 65_536);
            let client = redis::Client::open(url).unwrap();
            let conn = client.get_multiplexed_async_connection().await.unwrap();
            let mut checker = Checker::new(conn, store);
            let mut sides = counting::SIDES.to_vec();
            match std::env::var_os("TOLLGATE_LIMITADOR_SCRIPT") {
                Some(path) => {
                    let script = std::fs::read_to_string(&path)
                        .unwrap_or_else(|e| panic!("TOLLGATE_LIMITADOR_SCRIPT {path:?}: {e}"));
                    checker = checker.with_limitador(&script);
                    sides.insert(1, Side::Limitador);
                }
                None => println!(
                    "limitador scripts skipped: TOLLGATE_LIMITADOR_SCRIPT does not name its update script (scripts/bench-redis extracts it)"
                ),
            }
            let rows = counting::cells(&Arc::new(checker), &sides, &mut deployment.admin().await).await;
            counting::print(&rows, "One limit a check");
        }
        if module {
            eprintln!("== starting Redis (single, GCRA with the modules)");
            let deployment = Deployment::single(&modules);
            let store = tollgate(&deployment.store_url()).await;
            let client = redis::Client::open(deployment.store_url()).unwrap();
            let conn = client.get_multiplexed_async_connection().await.unwrap();
            let checker = Arc::new(Checker::new(conn, store));
            let mut admin = deployment.admin().await;
            let rows = counting::cells(&checker, &counting::MODULE_SIDES, &mut admin).await;
            counting::print(&rows, "GCRA with the modules");
        }
        for (run, sides, what) in [
            (log, &counting::LOG_SIDES, "Sliding log, the module against the code"),
            (lease, &counting::LEASE_SIDES, "Hybrid leasing, the module against the code"),
        ] {
            if !run {
                continue;
            }
            eprintln!("== starting Redis (single, {what})");
            let deployment = Deployment::single(&modules);
            let url = deployment.store_url();
            let store = tollgate(&url).await;
            assert!(store.inner().uses_module(), "the module is loaded");
            let code = RedisStore::connect(&url, RedisConfig { module: false, ..config() });
            let code = DenyCache::new(code.await.unwrap(), 65_536);
            let client = redis::Client::open(url).unwrap();
            let conn = client.get_multiplexed_async_connection().await.unwrap();
            let checker = Arc::new(Checker::new(conn, store).with_code_store(code));
            let mut admin = deployment.admin().await;
            let rows = counting::cells(&checker, sides, &mut admin).await;
            counting::print(&rows, what);
        }
    });
}
