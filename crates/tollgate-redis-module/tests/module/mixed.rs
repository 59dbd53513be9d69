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

/// The store's code's function name on `server` (the store loads it).
async fn function(server: &RedisServer, clock: &Arc<ManualClock>) -> String {
    store(server, clock).await;
    let list = server.cli(&["FUNCTION", "LIST", "LIBRARYNAME", "tollgate_*"]);
    list.lines()
        .map(str::trim)
        .find(|l| l.starts_with("tollgate_"))
        .unwrap_or_else(|| panic!("no tollgate library in {list:?}"))
        .to_owned()
}

/// A request as the store packs it (`script::request`): its time (µs) and
/// number of limits, then seven numbers per limit, little-endian doubles.
fn request(now_us: u64, limits: &[[u64; 7]]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [now_us as f64, limits.len() as f64] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in limits.iter().flatten() {
        out.extend_from_slice(&(*v as f64).to_le_bytes());
    }
    out
}

/// One call, through the code (`FCALL`) or the module (`TOLLGATE.CHECK`):
/// its reply's bytes.
async fn call(
    conn: &mut redis::aio::MultiplexedConnection,
    code: Option<&str>,
    keys: &[String],
    op: &str,
    requests: &[Vec<u8>],
) -> Vec<u8> {
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
    for r in requests {
        cmd.arg(r);
    }
    cmd.query_async(conn).await.unwrap()
}

/// Every algorithm whose state is one string, through `TOLLGATE.CHECK`
/// alone and alternating with the code, in batches of a request of the
/// limit alone and one of it beside a GCRA limit on another key, and a dry
/// run: every reply's bytes and every key's bytes are the code's alone.
#[tokio::test]
async fn every_string_algorithm_through_the_module_answers_and_writes_as_the_code() {
    let server = server();
    let clock = tollgate_store::conformance::clock();
    let function = function(&server, &clock).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // 3 per second (333,334 µs a unit), burst 4; shaping with one free.
    let algorithms = [
        (Algorithm::TokenBucket, 0),
        (Algorithm::Gcra, 0),
        (Algorithm::LeakyBucket, 0),
        (Algorithm::LeakyBucketShaping { delay_after: 1 }, 1),
        (Algorithm::FixedWindow, 0),
        (Algorithm::SlidingCounter, 0),
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
        let limit = |cost| [code, 3, 1_000_000, 4, 333_334, cost, delay_after];
        let mut now = 1_800_000_000_000_000 + 250_000;
        let mut replies: [Vec<Vec<u8>>; 3] = Default::default();
        // "a": the code alone; "m": alternating; "n": the module alone.
        for (i, (advance, cost)) in steps.into_iter().enumerate() {
            now += advance;
            let requests = [
                request(now, &[limit(cost)]),
                request(now, &[limit(cost), generous]),
            ];
            let op = if i == 2 { "d" } else { "c" };
            for (p, prefix) in ["a", "m", "n"].into_iter().enumerate() {
                let keys: Vec<String> = ["k", "k", "g"]
                    .iter()
                    .map(|k| format!("{prefix}:{k}"))
                    .collect();
                let by_code = match prefix {
                    "a" => true,
                    "m" => i % 2 == 0,
                    _ => false,
                };
                let code = by_code.then_some(function.as_str());
                replies[p].push(call(&mut conn, code, &keys, op, &requests).await);
            }
        }
        let [alone, mixed, native] = replies;
        assert_eq!(mixed, alone, "{algorithm:?}: alternating");
        assert_eq!(native, alone, "{algorithm:?}: the module alone");
        let decisions: Vec<Vec<i64>> = alone
            .iter()
            .map(|r| {
                r.chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect()
            })
            .collect();
        // The sequence admits and denies, so the comparison means something.
        assert!(decisions.iter().any(|d| d[1] == 1) && decisions.iter().any(|d| d[1] == 0));
        let mut states: [Vec<(String, String)>; 3] = Default::default();
        for (p, prefix) in ["a", "m", "n"].into_iter().enumerate() {
            let mut keys: Vec<String> = server
                .cli(&["KEYS", &format!("{prefix}:*")])
                .lines()
                .map(|k| k.trim().to_owned())
                .collect();
            keys.sort();
            for key in keys {
                let value = server.cli(&["GET", &key]);
                server.cli(&["DEL", &key]);
                states[p].push((key[1..].to_owned(), value));
            }
        }
        assert!(
            !states[0].is_empty(),
            "{algorithm:?}: something was written"
        );
        assert_eq!(states[1], states[0], "{algorithm:?}: alternating, the keys");
        assert_eq!(
            states[2], states[0],
            "{algorithm:?}: the module alone, the keys"
        );
    }
}
