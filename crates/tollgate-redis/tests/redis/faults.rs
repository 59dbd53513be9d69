//! Faults, each bounded to seconds: Redis killed while checks run and brought
//! back, `FUNCTION FLUSH` and `SCRIPT FLUSH` under load, a slow Redis behind a delaying proxy, a
//! cluster master killed, and the fail-open / fail-closed policies.
//!
//! The store is the Redis store under the `Fallback` wrapper, as a service
//! runs it. Every test asserts that no check returns an error, that the
//! fallback engages and releases (the stats counters), and that the admitted
//! count stays within
//! the documented bound: with the clock frozen, each independent state (Redis
//! before the fault, the local fallback store, a Redis restarted without its
//! data) admits at most one burst, so a key admits at most `states × burst`.
//! Time for the limits is a frozen manual clock; the tests sleep only to wait
//! for servers and for the breaker's real-time cool-down, in bounded polls.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_core::{Algorithm, Limit, ManualClock, Quota, Store};
use tollgate_redis::{FailurePolicy, RedisStore};
use tollgate_store::conformance;
use tollgate_store::{BreakerState, Fallback, FallbackConfig, FallbackStats};

use crate::support::{RedisCluster, RedisServer, manual_store_with};

/// The Redis store as a service runs it: under a fallback.
type Stack = Fallback<RedisStore>;

const BURST: u64 = 20;

fn quota() -> Quota {
    Quota::per_second(10).unwrap().with_burst(BURST).unwrap()
}

/// A fault-test store on `url`: a short timeout (the Redis store's and the
/// fallback's), a quick breaker.
async fn fast(url: &str, clock: &Arc<ManualClock>, timeout_ms: u64) -> Stack {
    let timeout = Duration::from_millis(timeout_ms);
    let redis = manual_store_with(url, clock, |c| c.timeout = timeout).await;
    let config = FallbackConfig {
        timeout,
        breaker_failures: 3,
        breaker_cool_down: Duration::from_millis(100),
        ..FallbackConfig::default()
    };
    Fallback::with_clock(redis, config, Arc::clone(clock) as _)
}

/// The fallback's counters, and the checks Redis decided.
fn stats(store: &Stack) -> (FallbackStats, u64) {
    (store.stats(), store.inner().stats().redis_checks)
}

/// Checks running in the background until stopped: admitted counts per key.
struct Load {
    stop: Arc<AtomicBool>,
    admitted: Arc<Vec<AtomicU64>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(store: &Arc<Stack>, keys: &[String], tasks: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let admitted: Arc<Vec<AtomicU64>> =
            Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
        let tasks = (0..tasks)
            .map(|t| {
                let (store, stop, admitted) =
                    (Arc::clone(store), Arc::clone(&stop), Arc::clone(&admitted));
                let keys = keys.to_vec();
                tokio::spawn(async move {
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        let k = i % keys.len();
                        i += 1;
                        let limit = Limit {
                            key: &keys[k],
                            quota: quota(),
                            algorithm: Algorithm::Gcra,
                            cost: 1,
                            failure: FailurePolicy::Local,
                        };
                        let outcome = store
                            .check(&[limit])
                            .await
                            .expect("a check never errs because Redis is down");
                        if outcome.allowed() {
                            admitted[k].fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            admitted,
            tasks,
        }
    }

    async fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a check task panicked");
        }
        self.admitted
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    }
}

/// Waits (bounded) until `f` holds, polling every 20 ms.
async fn eventually(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_while_checks_run_falls_back_and_returns() {
    let mut server = RedisServer::start();
    let clock = conformance::clock();
    let store = Arc::new(fast(&server.url(), &clock, 200).await);
    let keys = vec!["victim".to_owned()];
    let load = Load::start(&store, &keys, 4);
    eventually("Redis to decide", Duration::from_secs(5), || {
        stats(&store).1 >= 30
    })
    .await;

    server.kill();
    eventually("the fallback to engage", Duration::from_secs(5), || {
        let s = store.stats();
        s.fallbacks >= 30 && s.breaker_opens >= 1
    })
    .await;
    assert_ne!(store.stats().breaker, BreakerState::Closed);

    server.restart();
    let before = stats(&store).1;
    eventually(
        "decisions to come from Redis again",
        Duration::from_secs(10),
        || {
            let (s, redis_checks) = stats(&store);
            redis_checks >= before + 30 && s.breaker == BreakerState::Closed
        },
    )
    .await;
    let fallbacks = store.stats().fallbacks;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.stats().fallbacks, fallbacks, "the fallback released");
    let admitted = load.stop().await;
    // Redis before the kill, the local store, and Redis restarted empty: one
    // burst each at a frozen clock.
    assert!(
        admitted[0] >= 2 * BURST,
        "{admitted:?}: both Redis and the fallback admitted"
    );
    assert!(admitted[0] <= 3 * BURST, "{admitted:?} exceeds 3 × burst");
}

/// The code flushed from Redis under load, five times, loses no decision:
/// a function library (`FUNCTION FLUSH`) and a script (`SCRIPT FLUSH`) alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_of_the_code_mid_run_loses_no_decision() {
    for functions in [true, false] {
        code_flush_mid_run(functions).await;
    }
}

async fn code_flush_mid_run(functions: bool) {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let redis = manual_store_with(&server.url(), &clock, |c| c.functions = functions).await;
    assert_eq!(redis.uses_functions(), functions);
    let config = FallbackConfig {
        timeout: Duration::from_secs(5),
        ..FallbackConfig::default()
    };
    let store = Arc::new(Fallback::with_clock(redis, config, Arc::clone(&clock) as _));
    let keys: Vec<String> = (0..4).map(|i| format!("flush-{i}")).collect();
    let load = Load::start(&store, &keys, 4);
    let flush = if functions { "FUNCTION" } else { "SCRIPT" };
    for _ in 0..5 {
        let before = stats(&store).1;
        eventually("checks", Duration::from_secs(5), || {
            stats(&store).1 > before
        })
        .await;
        assert_eq!(server.cli(&[flush, "FLUSH"]).trim(), "OK");
    }
    let before = stats(&store).1;
    eventually("checks after the flushes", Duration::from_secs(5), || {
        stats(&store).1 >= before + 20
    })
    .await;
    let admitted = load.stop().await;
    let stats = store.stats();
    assert_eq!(
        (stats.fallbacks, stats.errors, stats.timeouts),
        (0, 0, 0),
        "{stats:?}"
    );
    // Exactly the burst of each key, as if nothing had happened.
    assert_eq!(admitted, vec![BURST; 4], "functions: {functions}");
}

/// A TCP proxy in front of Redis that, when `slow` is set, holds every chunk
/// Redis sends back for `delay`.
struct SlowProxy {
    port: u16,
    slow: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowProxy {
    async fn start(upstream: u16, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let slow = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&slow);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let flag = Arc::clone(&flag);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if flag.load(Ordering::Relaxed) {
                            tokio::time::sleep(delay).await;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self { port, slow, task }
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_times_out_into_the_fallback_and_back() {
    let server = RedisServer::start();
    let proxy = SlowProxy::start(server.port, Duration::from_millis(300)).await;
    let clock = conformance::clock();
    let url = format!("redis://127.0.0.1:{}/0", proxy.port);
    let store = Arc::new(fast(&url, &clock, 50).await);
    let keys = vec!["slow".to_owned()];
    let load = Load::start(&store, &keys, 4);
    eventually("Redis to decide", Duration::from_secs(5), || {
        stats(&store).1 >= 10
    })
    .await;

    proxy.slow.store(true, Ordering::Relaxed);
    eventually(
        "timeouts to trigger the fallback",
        Duration::from_secs(5),
        || {
            let s = store.stats();
            s.timeouts >= 3 && s.fallbacks >= 20 && s.breaker_opens >= 1
        },
    )
    .await;

    proxy.slow.store(false, Ordering::Relaxed);
    let before = stats(&store).1;
    eventually(
        "decisions to come from Redis again",
        Duration::from_secs(10),
        || {
            let (s, redis_checks) = stats(&store);
            redis_checks >= before + 10 && s.breaker == BreakerState::Closed
        },
    )
    .await;
    let admitted = load.stop().await;
    let stats = store.stats();
    assert_eq!(stats.errors, 0, "{stats:?}");
    // A timed-out check may still have run in Redis: Redis and the local store
    // each admit at most one burst.
    assert!(admitted[0] <= 2 * BURST, "{admitted:?} exceeds 2 × burst");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_killed_keeps_checks_answering() {
    let mut cluster = RedisCluster::start();
    let clock = conformance::clock();
    let store = Arc::new(fast(&cluster.url(), &clock, 200).await);
    // Enough keys that every master owns some.
    let keys: Vec<String> = (0..24).map(|i| format!("tenant-{i}")).collect();
    let load = Load::start(&store, &keys, 4);
    eventually("the cluster to decide", Duration::from_secs(5), || {
        stats(&store).1 >= 50
    })
    .await;

    cluster.nodes[1].kill();
    eventually("the fallback to engage", Duration::from_secs(10), || {
        store.stats().fallbacks >= 20
    })
    .await;

    cluster.nodes[1].restart();
    cluster.wait_ok(Duration::from_secs(20));
    // Released when a whole 300 ms passes with the breaker closed and no fallback.
    let start = Instant::now();
    loop {
        let before = store.stats().fallbacks;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s = store.stats();
        if s.breaker == BreakerState::Closed && s.fallbacks == before {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the cluster never took over again: {s:?}"
        );
    }
    let admitted = load.stop().await;
    for (key, n) in keys.iter().zip(&admitted) {
        assert!(*n <= 3 * BURST, "{key}: {n} exceeds 3 × burst");
    }
    let (stats, redis_checks) = stats(&store);
    assert!(stats.fallbacks > 0 && redis_checks > 0, "{stats:?}");
}

#[tokio::test]
async fn each_limit_falls_back_by_its_own_failure_policy() {
    let mut server = RedisServer::start();
    let clock = conformance::clock();
    let store = fast(&server.url(), &clock, 100).await;
    let limit = |key, failure| Limit {
        key,
        quota: Quota::per_second(1).unwrap(),
        algorithm: Algorithm::Gcra,
        cost: 1,
        failure,
    };
    let open = limit("open", FailurePolicy::FailOpen);
    let closed = limit("closed", FailurePolicy::FailClosed);
    let local = limit("local", FailurePolicy::Local);
    for l in [open, closed, local] {
        assert!(store.check(&[l]).await.unwrap().allowed());
        assert!(
            !store.check(&[l]).await.unwrap().allowed(),
            "Redis counted the first"
        );
    }
    server.kill();
    // Redis is gone: fail_open admits without counting, fail_closed refuses
    // with the breaker's cool-down, local counts on this instance from where
    // Redis left off (its budget spent) or, for a key Redis did not report
    // on, afresh.
    for _ in 0..5 {
        let o = store.check(&[open]).await.expect("no error");
        assert!(o.allowed());
        assert_eq!(o.decisions[0].remaining(), 1);
        let c = store.check(&[closed]).await.expect("no error");
        assert!(!c.allowed());
        assert_eq!(
            c.decisions[0].retry_after(),
            Some(Duration::from_millis(100))
        );
    }
    assert!(
        !store.check(&[local]).await.unwrap().allowed(),
        "spent in Redis, so spent here"
    );
    // One request mixing them stays all-or-nothing: the fail_closed limit
    // refuses it, and the local limit beside it is not charged.
    let fresh = limit("fresh", FailurePolicy::Local);
    let mixed = store.check(&[fresh, closed, open]).await.unwrap();
    assert!(!mixed.allowed());
    assert!(mixed.decisions[0].allowed() && mixed.decisions[2].allowed());
    assert!(!mixed.decisions[1].allowed());
    assert!(store.check(&[fresh, open]).await.unwrap().allowed());
    assert!(
        !store.check(&[fresh, open]).await.unwrap().allowed(),
        "the local limit counted only the admitted request"
    );
    assert_eq!(store.stats().fallbacks, 14);
    // Open, or half-open while the prober asks the dead server.
    assert_ne!(store.stats().breaker, BreakerState::Closed);
}

#[tokio::test]
async fn permits_taken_in_the_fallback_are_given_back_to_it() {
    let mut server = RedisServer::start();
    let clock = conformance::clock();
    let store = fast(&server.url(), &clock, 100).await;
    let slots = Limit {
        key: "uploads",
        quota: Quota::per_minute(1).unwrap(),
        algorithm: Algorithm::Concurrency,
        cost: 1,
        failure: FailurePolicy::Local,
    };
    server.kill();
    let held = store.check(&[slots]).await.unwrap().leases;
    assert_eq!(held.len(), 1);
    assert!(!store.check(&[slots]).await.unwrap().allowed());
    store.release(&held).await.unwrap();
    assert!(store.check(&[slots]).await.unwrap().allowed());
    assert_eq!(store.stats().fallbacks, 3);
}
