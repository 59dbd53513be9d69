//! Mixed fleets: instances stepping a key through the store's Lua code and
//! others through the module's `TOLLGATE.*` command agree, because both keep
//! the same state. A sequence of steps alternating between the two on one
//! key answers exactly as the same sequence through the code alone; and
//! `TOLLGATE.CHECK`, the code's entry point natively, answers and writes
//! every byte as the code does.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, Clock, Decision, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::{RedisConfig, RedisStore, TimeSource};
use tollgate_testkit::RedisServer;

use crate::{ints, server};

/// What both paths answer: allowed, remaining, reset after (µs), retry
/// after (µs, -1 for none).
type Answer = [i64; 4];

fn from_decision(d: &Decision) -> Answer {
    let us = |d: Duration| i64::try_from(d.as_micros()).unwrap();
    [
        i64::from(d.allowed()),
        i64::try_from(d.remaining()).unwrap(),
        us(d.reset_after()),
        d.retry_after().map_or(-1, us),
    ]
}

async fn store(server: &RedisServer, clock: &Arc<ManualClock>) -> RedisStore {
    let config = RedisConfig {
        time: TimeSource::Clock(Arc::clone(clock) as _),
        timeout: Duration::from_secs(5),
        extra_ttl: Duration::from_secs(600),
        // The code on every check, whatever the server has loaded.
        module: false,
        ..RedisConfig::default()
    };
    RedisStore::connect(&server.url(), config).await.unwrap()
}

/// The module's command for an algorithm, and the segment of the Redis key
/// the store names its state with.
fn command(algorithm: Algorithm) -> (&'static str, &'static str) {
    match algorithm {
        Algorithm::Gcra => ("TOLLGATE.GCRA", "gcra2"),
        Algorithm::TokenBucket => ("TOLLGATE.TOKENBUCKET", "tb2"),
        Algorithm::LeakyBucket => ("TOLLGATE.LEAKYBUCKET", "lb2"),
        other => panic!("no command for {other:?}"),
    }
}

/// One step through the code.
async fn by_code(
    store: &RedisStore,
    algorithm: Algorithm,
    key: &str,
    quota: Quota,
    cost: u64,
) -> Answer {
    let limit = Limit {
        key,
        quota,
        algorithm,
        cost,
        failure: FailurePolicy::Local,
    };
    let outcome = store.check(&[limit]).await.unwrap();
    from_decision(&outcome.decisions[0])
}

/// One step through the module, on the key the store names
/// (`tollgate:<segment>:{<key>}`), at the clock's time in µs.
fn by_module(
    server: &RedisServer,
    algorithm: Algorithm,
    key: &str,
    args: &[&str; 3],
    cost: u64,
    now_ns: u64,
) -> Answer {
    let (command, segment) = command(algorithm);
    let redis_key = format!("tollgate:{segment}:{{{key}}}");
    let reply = ints(&server.cli(&[
        command,
        &redis_key,
        args[0],
        args[1],
        args[2],
        &cost.to_string(),
        "AT",
        &(now_ns / 1000).to_string(),
    ]));
    assert_eq!(reply[4], (now_ns / 1000) as i64, "the time decided at");
    [reply[0], reply[1], reply[2], reply[3]]
}

/// Steps alternating between the code and the module on one key answer as
/// the same steps through the code alone on another, and leave the same
/// state.
async fn alternating_answers_as_the_code_alone(algorithm: Algorithm) {
    let server = server();
    let clock = tollgate_store::conformance::clock();
    let store = store(&server, &clock).await;
    // 3 per second (an interval of 333,333.34 µs, rounded up alike on both
    // paths), burst 4; costs of 0 (a read) to 5 (above the burst).
    let args = ["3", "1s", "4"];
    let quota = Quota::per_second(3).unwrap().with_burst(4).unwrap();
    let steps: [(u64, u64); 14] = [
        (0, 1),
        (0, 2),
        (0, 1),
        (0, 1),
        (1, 0),
        (100_000, 1),
        (333_334, 1),
        (1, 5),
        (50_000, 1),
        (2_000_000, 3),
        (0, 2),
        (333_333, 1),
        (1, 1),
        (10_000_000, 4),
    ];
    let mut alone = Vec::new();
    let mut mixed = Vec::new();
    for (i, (advance_us, cost)) in steps.into_iter().enumerate() {
        clock.advance(Duration::from_micros(advance_us));
        alone.push(by_code(&store, algorithm, "alone", quota, cost).await);
        mixed.push(if i % 2 == 0 {
            by_code(&store, algorithm, "mixed", quota, cost).await
        } else {
            by_module(&server, algorithm, "mixed", &args, cost, clock.now())
        });
    }
    assert_eq!(mixed, alone);
    // The sequence admits and denies, so the comparison means something.
    assert!(alone.iter().any(|a| a[0] == 1) && alone.iter().any(|a| a[0] == 0));
    let (_, segment) = command(algorithm);
    assert_eq!(
        server.cli(&["GET", &format!("tollgate:{segment}:{{mixed}}")]),
        server.cli(&["GET", &format!("tollgate:{segment}:{{alone}}")])
    );
}

#[tokio::test]
async fn gcra_alternating_with_the_code_answers_as_the_code_alone() {
    alternating_answers_as_the_code_alone(Algorithm::Gcra).await;
}

#[tokio::test]
async fn token_bucket_alternating_with_the_code_answers_as_the_code_alone() {
    alternating_answers_as_the_code_alone(Algorithm::TokenBucket).await;
}

#[tokio::test]
async fn leaky_bucket_alternating_with_the_code_answers_as_the_code_alone() {
    alternating_answers_as_the_code_alone(Algorithm::LeakyBucket).await;
}

/// The store's code's function name on `node` (a store on `url` loads
/// it).
pub(crate) async fn function(url: &str, node: &RedisServer, clock: &Arc<ManualClock>) -> String {
    let config = RedisConfig {
        time: TimeSource::Clock(Arc::clone(clock) as _),
        module: false,
        ..RedisConfig::default()
    };
    RedisStore::connect(url, config).await.unwrap();
    let list = node.cli(&["FUNCTION", "LIST", "LIBRARYNAME", "tollgate_*"]);
    list.lines()
        .map(str::trim)
        .find(|l| l.starts_with("tollgate_"))
        .unwrap_or_else(|| panic!("no tollgate library in {list:?}"))
        .to_owned()
}

/// A request as the store packs it (`script::request`): its time (µs) and
/// number of limits, then seven numbers per limit, little-endian doubles,
/// then the base of its lease ids.
pub(crate) fn request(now_us: u64, limits: &[[u64; 7]], lease: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [now_us as f64, limits.len() as f64] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in limits.iter().flatten() {
        out.extend_from_slice(&(*v as f64).to_le_bytes());
    }
    out.extend_from_slice(lease.as_bytes());
    out
}

/// One call, through the code (`FCALL`) or the module (`TOLLGATE.CHECK`):
/// its reply.
pub(crate) async fn call(
    conn: &mut redis::aio::MultiplexedConnection,
    code: Option<&str>,
    keys: &[String],
    op: &str,
    args: &[Vec<u8>],
) -> redis::Value {
    let mut cmd = match code {
        Some(function) => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(function);
            cmd
        }
        None => redis::cmd("TOLLGATE.CHECK"),
    };
    // TTLs padded by 600 s: the test's clock runs ahead of Redis's.
    cmd.arg(keys.len()).arg(keys).arg(op).arg(600_000);
    for r in args {
        cmd.arg(r);
    }
    cmd.query_async(conn).await.unwrap()
}

/// Every key of `node` whose name starts with `prefix`, as (its name without
/// the prefix, its value: a string's bytes or a sorted set's members and
/// scores, its expiry in ms), deleted.
fn states(node: &RedisServer, prefix: &str) -> Vec<(String, String, i64)> {
    let mut keys: Vec<String> = node
        .cli(&["KEYS", &format!("{prefix}*")])
        .lines()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
        .collect();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let value = match node.cli(&["TYPE", &key]).trim() {
                "zset" => node.cli(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]),
                _ => node.cli(&["GET", &key]),
            };
            // Its expiry, absolute: read later than another key's, it is
            // still comparable.
            let ttl: i64 = node.cli(&["PEXPIRETIME", &key]).trim().parse().unwrap();
            node.cli(&["DEL", &key]);
            (key[prefix.len()..].to_owned(), value, ttl)
        })
        .collect()
}

/// Every algorithm through `TOLLGATE.CHECK` alone and alternating with the
/// code, in batches of a request of the limit alone and one of it beside a
/// GCRA limit on another key, and a dry run, refunds, then releases of the
/// leases taken: every reply and every key (bytes, members, scores, TTLs) is the
/// code's alone. `tag` starts every key (a cluster's hash tag, so that a
/// call's keys share a slot on `node`).
async fn fleet(url: &str, node: &RedisServer, tag: &str) {
    let clock = tollgate_store::conformance::clock();
    let function = function(url, node, &clock).await;
    let client = redis::Client::open(node.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // 3 per second (333,334 µs a unit), burst 4; shaping with one free.
    let algorithms = [
        (Algorithm::TokenBucket, 0),
        (Algorithm::Gcra, 0),
        (Algorithm::LeakyBucket, 0),
        (Algorithm::LeakyBucketShaping { delay_after: 1 }, 1),
        (Algorithm::FixedWindow, 0),
        (Algorithm::SlidingLog, 0),
        (Algorithm::SlidingCounter, 0),
        (Algorithm::Concurrency, 0),
        (Algorithm::HitCounter, 0),
    ];
    let steps: [(u64, u64); 12] = [
        (0, 1),
        (0, 2),
        (1, 0),
        (100_000, 1),
        (333_334, 1),
        (1, 5),
        (50_000, 2),
        (700_000, 3),
        (0, 2),
        (333_333, 1),
        (1_000_000, 1),
        (10_000_000, 4),
    ];
    let generous = [
        u64::from(Algorithm::Gcra.index()),
        1000,
        1_000_000,
        1000,
        1000,
        1,
        0,
    ];
    for (algorithm, delay_after) in algorithms {
        let code = u64::from(algorithm.index());
        let sets = matches!(algorithm, Algorithm::SlidingLog | Algorithm::Concurrency);
        let limit = |cost| [code, 3, 1_000_000, 4, 333_334, cost, delay_after];
        let mut now = 1_800_000_000_000_000 + 250_000;
        let mut replies: [Vec<redis::Value>; 3] = Default::default();
        // "a": the code alone; "m": alternating; "n": the module alone.
        let prefixes = ["a", "m", "n"].map(|p| format!("{tag}{p}:"));
        let keys_of = |prefix: &str| -> Vec<String> {
            let names: &[&str] = if sets {
                &["k", "k.n", "k", "k.n", "g"]
            } else {
                &["k", "k", "g"]
            };
            names.iter().map(|k| format!("{prefix}{k}")).collect()
        };
        for (i, (advance, cost)) in steps.into_iter().enumerate() {
            now += advance;
            let requests = [
                request(now, &[limit(cost)], &format!("ab-{i:x}x")),
                request(now, &[limit(cost), generous], &format!("ab-{i:x}y")),
            ];
            let op = if i == 2 { "d" } else { "c" };
            for (p, prefix) in prefixes.iter().enumerate() {
                let by_code = match p {
                    0 => true,
                    1 => i % 2 == 0,
                    _ => false,
                };
                let code = by_code.then_some(function.as_str());
                let keys = keys_of(prefix);
                replies[p].push(call(&mut conn, code, &keys, op, &requests).await);
                if i % 3 == 1 {
                    // A refund of the second request (the code's op `r`, as
                    // a cross-slot deny sends it): its keys are the last.
                    let own = &keys[if sets { 2 } else { 1 }..];
                    let refund = std::slice::from_ref(&requests[1]);
                    replies[p].push(call(&mut conn, code, own, "r", refund).await);
                }
            }
        }
        if algorithm == Algorithm::Concurrency {
            // Releases: a lease taken at step 0 (expired, and dropped by a
            // later admission), one of step 10's (expired, not dropped: the
            // last step denied), and one never taken.
            let leases = ["1|ab-0x_1", "1|ab-ax_1", "1|never_1"];
            for (p, prefix) in prefixes.iter().enumerate() {
                let keys: Vec<String> = leases
                    .iter()
                    .flat_map(|_| ["k", "k.n"])
                    .map(|k| format!("{prefix}{k}"))
                    .collect();
                let args: Vec<Vec<u8>> = leases.iter().map(|l| l.as_bytes().to_vec()).collect();
                let code = (p == 0).then_some(function.as_str());
                replies[p].push(call(&mut conn, code, &keys, "l", &args).await);
            }
        }
        let [alone, mixed, native] = replies;
        assert_eq!(mixed, alone, "{algorithm:?}: alternating");
        assert_eq!(native, alone, "{algorithm:?}: the module alone");
        let decisions: Vec<Vec<i64>> = alone
            .iter()
            .filter_map(|r| match r {
                redis::Value::BulkString(b) => Some(b),
                _ => None,
            })
            .map(|r| {
                r.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect()
            })
            .collect();
        // The sequence admits and denies, so the comparison means something.
        assert!(decisions.iter().any(|d| d[1] == 1) && decisions.iter().any(|d| d[1] == 0));
        let [a, m, n] = prefixes.map(|p| states(node, &p));
        assert!(!a.is_empty(), "{algorithm:?}: something was written");
        let same = |x: &[(String, String, i64)], what: &str| {
            assert_eq!(
                x.len(),
                a.len(),
                "{algorithm:?}: {what}: {x:?} against {a:?}"
            );
            for (x, a) in x.iter().zip(&a) {
                assert_eq!((&x.0, &x.1), (&a.0, &a.1), "{algorithm:?}: {what}");
                // Set by calls made one after the other: within a few ms.
                assert!(
                    (x.2 - a.2).abs() < 100,
                    "{algorithm:?}: {what}: expiries {x:?} against {a:?}"
                );
            }
        };
        same(&m, "alternating, the keys");
        same(&n, "the module alone, the keys");
    }
}

#[tokio::test]
async fn every_algorithm_through_the_module_answers_and_writes_as_the_code() {
    let server = server();
    fleet(&server.url(), &server, "").await;
}

#[tokio::test]
async fn every_algorithm_through_the_module_answers_and_writes_as_the_code_on_a_cluster() {
    let (cluster, tag) = crate::cluster_and_tag();
    fleet(&cluster.url(), &cluster.nodes[0], &tag).await;
}

/// A replica (without the module) of a server where `TOLLGATE.CHECK`
/// checks, refunds and releases on sorted sets and strings ends up with the
/// same keys: the module replicates its writes as the commands that make
/// them, which any replica applies.
#[tokio::test]
async fn a_replica_gets_every_write_the_module_makes() {
    let (master, replica, mut conn) = crate::with_replica().await;
    let limits = |cost| {
        [
            [
                u64::from(Algorithm::SlidingLog.index()),
                3,
                1_000_000,
                3,
                333_334,
                cost,
                0,
            ],
            [
                u64::from(Algorithm::Concurrency.index()),
                3,
                1_000_000,
                3,
                333_334,
                cost,
                0,
            ],
            [
                u64::from(Algorithm::Gcra.index()),
                3,
                1_000_000,
                3,
                333_334,
                cost,
                0,
            ],
        ]
    };
    let keys: Vec<String> = ["l", "l.n", "c", "c.n", "g"].map(String::from).to_vec();
    let mut now = 1_800_000_000_000_000;
    for (i, (advance, cost)) in [(0, 1), (1, 1), (400_000, 1), (0, 2), (1_200_000, 1)]
        .into_iter()
        .enumerate()
    {
        now += advance;
        let blob = request(now, &limits(cost), &format!("r-{i}"));
        call(&mut conn, None, &keys, "c", std::slice::from_ref(&blob)).await;
        if i == 2 {
            call(&mut conn, None, &keys, "r", &[blob]).await;
        }
    }
    let lease = b"1|r-4_2".to_vec();
    call(&mut conn, None, &keys[2..4], "l", &[lease]).await;
    // A batch whose string writes are replicated together, around a sorted
    // set's, one key written by two of its requests: in order.
    let [log, _, gcra] = limits(1);
    let batch: Vec<String> = ["b1", "bl", "bl.n", "b1", "b2"].map(String::from).to_vec();
    let blobs = [&[gcra][..], &[log], &[gcra], &[gcra]].map(|l| request(now, l, "b"));
    call(&mut conn, None, &batch, "c", &blobs).await;
    crate::caught_up(&master, &replica);
    let (copy, original) = (states(&replica, ""), states(&master, ""));
    // The lease set, emptied by the release, is gone from both.
    assert_eq!(original.len(), 8, "{original:?}");
    for (c, o) in copy.iter().zip(&original) {
        assert_eq!((&c.0, &c.1), (&o.0, &o.1));
        // The replica's absolute expiry is the master's, give or take the
        // command's own time (a key without one would read -1).
        assert!((c.2 - o.2).abs() <= 50, "expiries {c:?} against {o:?}");
    }
    assert_eq!(copy.len(), original.len());
    // The batch's three string writes came as one command, the other
    // calls' one at a time.
    assert_eq!(replica.command_calls("eval"), 1);
}
