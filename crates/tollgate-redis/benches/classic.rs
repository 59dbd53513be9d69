//! Tollgate's Redis store against the classic token bucket script, in one run,
//! on the same `redis-server`.
//!
//! The peer is the script the common articles give: `HMGET` tokens and last
//! refill, compute in floating point, `HMSET`, `EXPIRE`; one `EVALSHA` per
//! check with the client's time, over the same kind of multiplexed connection.
//! Tollgate runs its token bucket (same quota, same admissions up to float
//! drift) with Redis's own `TIME` and its defaults (deny cache on).
//!
//! Cells: 50 concurrent callers (tokio tasks) on 1 hot key, and on 100,000
//! keys picked pseudo-randomly. Quota: 100 per second, burst 100. Each cell runs
//! for `SECONDS` after a warm-up, sides alternating, `REPETITIONS` times; the
//! median decisions/s is reported with Redis's CPU time per decision (`INFO
//! cpu`), this process's (the callers and the client side of either store,
//! from `/proc/self/stat`), and the bytes one key takes in Redis (`MEMORY
//! USAGE`, averaged over sampled keys).
//!
//! Run with `cargo bench -p tollgate-redis --bench classic` (needs
//! `redis-server` on the PATH; it starts its own on a free loopback port);
//! `TOLLGATE_BENCH_KEYS=100000` runs one workload only.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota, Store};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_store::{DenyCache, Hybrid, HybridConfig};

const CALLERS: usize = 50;
const MANY_KEYS: u64 = 100_000;
const SECONDS: f64 = 2.0;
const REPETITIONS: usize = 3;

const CLASSIC: &str = r"
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])
local bucket = redis.call('HMGET', key, 'tokens', 'last_refill')
local tokens = tonumber(bucket[1]) or capacity
local last = tonumber(bucket[2]) or now
local delta = math.max(0, now - last)
tokens = math.min(capacity, tokens + delta * rate)
local allowed = 0
if tokens >= requested then
  tokens = tokens - requested
  allowed = 1
end
redis.call('HMSET', key, 'tokens', tokens, 'last_refill', now)
redis.call('EXPIRE', key, math.ceil(capacity / rate) * 2)
return { allowed, math.floor(tokens) }
";

struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on the PATH (apt-get install redis-server)");
    let server = Server {
        child,
        port,
        _dir: dir,
    };
    for _ in 0..500 {
        if redis::Client::open(server.url())
            .and_then(|c| c.get_connection())
            .is_ok()
        {
            return server;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("redis-server did not start");
}

impl Server {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Classic,
    Tollgate,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Classic => "classic script",
            Side::Tollgate => "tollgate",
        }
    }
}

fn key_of(keys: u64, i: u64) -> String {
    if keys == 1 {
        "hot".to_owned()
    } else {
        // A cheap scramble so callers spread over the key space.
        format!("user:{}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys)
    }
}

fn quota() -> Quota {
    Quota::per_second(100).unwrap()
}

async fn redis_cpu(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .map(|v| v.trim().parse::<f64>().unwrap())
        .sum()
}

/// This process's CPU time (user + system) so far, in seconds, from
/// `/proc/self/stat` (Linux, like `redis-server` here).
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) closed by ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a stat line") + 2..]
        .split(' ')
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // USER_HZ is 100 on every Linux platform Redis runs on.
    ticks / 100.0
}

/// What one cell measured, per second and per decision.
struct Measured {
    rate: f64,
    redis_cpu: f64,
    client_cpu: f64,
}

/// Runs one cell: decisions per second, and Redis's and this process's CPU
/// seconds per decision.
async fn cell(
    side: Side,
    keys: u64,
    prefix: &str,
    conn: &MultiplexedConnection,
    store: &Arc<DenyCache<RedisStore>>,
) -> Measured {
    let script = Arc::new(redis::Script::new(CLASSIC));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut admin = conn.clone();
    let cpu_before = redis_cpu(&mut admin).await;
    let own_before = own_cpu();
    let start = Instant::now();
    let tasks: Vec<_> = (0..CALLERS as u64)
        .map(|c| {
            let (stop, done, store, script) = (
                Arc::clone(&stop),
                Arc::clone(&done),
                Arc::clone(store),
                Arc::clone(&script),
            );
            let mut conn = conn.clone();
            let prefix = prefix.to_owned();
            tokio::spawn(async move {
                let mut i = c * 7919;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = format!("{prefix}{}", key_of(keys, i));
                    match side {
                        Side::Classic => {
                            let now = SystemTime::now()
                                .duration_since(UNIX_EPOCH)
                                .unwrap()
                                .as_secs_f64();
                            let _: Vec<i64> = script
                                .key(&key)
                                .arg(100)
                                .arg(100)
                                .arg(now)
                                .arg(1)
                                .invoke_async(&mut conn)
                                .await
                                .unwrap();
                        }
                        Side::Tollgate => {
                            let limit = Limit {
                                key: &key,
                                quota: quota(),
                                algorithm: Algorithm::TokenBucket,
                                cost: 1,
                                failure: FailurePolicy::Local,
                            };
                            store.check(&[limit]).await.unwrap();
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
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
    let own = own_cpu() - own_before;
    let cpu = redis_cpu(&mut admin).await - cpu_before;
    let n = done.load(Ordering::Relaxed) as f64;
    Measured {
        rate: n / elapsed,
        redis_cpu: cpu / n,
        client_cpu: own / n,
    }
}

/// Hybrid mode on one hot key whose budget covers every request (1,000,000
/// per second): decisions/s, and decisions per Redis operation (script calls
/// counted by `INFO commandstats`).
async fn hybrid(url: &str, conn: &MultiplexedConnection) -> (f64, f64) {
    let redis = RedisStore::connect(
        url,
        RedisConfig {
            timeout: Duration::from_secs(1),
            ..RedisConfig::default()
        },
    )
    .await
    .unwrap();
    let store = Arc::new(Hybrid::new(redis, HybridConfig::default()));
    let mut admin = conn.clone();
    let calls = |info: String| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|v| v.split(',').next())
            .map_or(0.0, |v| v.parse().unwrap())
    };
    let before = calls(
        redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut admin)
            .await
            .unwrap(),
    );
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
    let after = calls(
        redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut admin)
            .await
            .unwrap(),
    );
    let n = done.load(Ordering::Relaxed) as f64;
    (n / elapsed, n / (after - before).max(1.0))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Bytes one key takes in Redis on each side: 1,000 keys written with a slow
/// quota (100 per hour, so nothing expires while sampling), `MEMORY USAGE`
/// averaged.
async fn bytes_per_key(conn: &MultiplexedConnection, store: &RedisStore) -> (f64, f64) {
    let mut conn = conn.clone();
    let script = redis::Script::new(CLASSIC);
    let hourly = Quota::per_hour(100).unwrap();
    for i in 0..1000 {
        let key = format!("size:{i}");
        let _: Vec<i64> = script
            .key(format!("c:{key}"))
            .arg(100.0 / 3600.0)
            .arg(100)
            .arg(1.0)
            .arg(1)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        let limit = Limit {
            key: &key,
            quota: hourly,
            algorithm: Algorithm::TokenBucket,
            cost: 1,
            failure: FailurePolicy::Local,
        };
        store.check(&[limit]).await.unwrap();
    }
    let mut sizes = (0.0, 0.0);
    for i in 0..1000 {
        for (name, total) in [
            (format!("c:size:{i}"), &mut sizes.0),
            (format!("tollgate:tb2:{{size:{i}}}"), &mut sizes.1),
        ] {
            let size: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&name)
                .query_async(&mut conn)
                .await
                .unwrap();
            *total += size.expect("the key is there") as f64 / 1000.0;
        }
    }
    sizes
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = start_server();
        let client = redis::Client::open(server.url()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        // The deny cache the service stacks over Redis, as measured before it
        // became a wrapper.
        let store = Arc::new(DenyCache::new(
            RedisStore::connect(
                &server.url(),
                RedisConfig {
                    timeout: Duration::from_secs(1),
                    ..RedisConfig::default()
                },
            )
            .await
            .unwrap(),
            65_536,
        ));
        println!(
            "{CALLERS} callers, token bucket 100/s burst 100, {SECONDS} s per run, median of {REPETITIONS}\n"
        );
        println!(
            "| keys | side | decisions/s | Redis CPU µs/decision | client CPU µs/decision | ratio |\n| --- | --- | ---: | ---: | ---: | ---: |"
        );
        // TOLLGATE_BENCH_KEYS=1 or =100000 runs one workload only (profiling).
        let only: Option<u64> = std::env::var("TOLLGATE_BENCH_KEYS")
            .ok()
            .and_then(|v| v.parse().ok());
        for keys in [1, MANY_KEYS].into_iter().filter(|k| only.is_none_or(|o| o == *k)) {
            // Warm-up: scripts loaded, keys created.
            cell(Side::Classic, keys, "c:", &conn, &store).await;
            cell(Side::Tollgate, keys, "", &conn, &store).await;
            let mut results: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..REPETITIONS {
                for (s, side) in [Side::Classic, Side::Tollgate].into_iter().enumerate() {
                    let prefix = if side == Side::Classic { "c:" } else { "" };
                    results[s].push(cell(side, keys, prefix, &conn, &store).await);
                }
            }
            let of = |s: usize, f: fn(&Measured) -> f64| median(results[s].iter().map(f).collect());
            let classic = of(0, |m| m.rate);
            for (s, side) in [Side::Classic, Side::Tollgate].into_iter().enumerate() {
                let rate = of(s, |m| m.rate);
                println!(
                    "| {keys} | {} | {rate:.0} | {:.2} | {:.2} | {:.2}× |",
                    side.name(),
                    of(s, |m| m.redis_cpu) * 1e6,
                    of(s, |m| m.client_cpu) * 1e6,
                    rate / classic
                );
            }
        }
        let stats = store.stats();
        println!("\ntollgate stats: {stats:?}");
        let mut admin = conn.clone();
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut admin).await.unwrap();
        for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
            println!("{line}");
        }
        let (rate, per_op) = hybrid(&server.url(), &conn).await;
        println!(
            "hybrid mode, {CALLERS} callers, 1 hot key (1,000,000/s): {rate:.0} decisions/s, {per_op:.0} decisions per Redis operation"
        );
        let (classic, tollgate) = bytes_per_key(&conn, store.inner()).await;
        println!(
            "bytes per key in Redis (MEMORY USAGE, token bucket): classic {classic:.0}, tollgate {tollgate:.0}"
        );
    });
}
