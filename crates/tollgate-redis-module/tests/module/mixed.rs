//! Mixed fleets: instances stepping a key through the store's Lua code and
//! others through the module's `TOLLGATE.*` command agree, because both keep
//! the same state. A sequence of steps alternating between the two on one
//! key answers exactly as the same sequence through the code alone.

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
