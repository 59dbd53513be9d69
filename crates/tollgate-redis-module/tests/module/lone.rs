//! A store with the module sends a lone check of one bucket limit to that
//! bucket's own command (`TOLLGATE.GCRA`, `TOLLGATE.TOKENBUCKET`,
//! `TOLLGATE.LEAKYBUCKET`), and everything else the module takes to
//! `TOLLGATE.CHECK`; the lone path answers and writes as the code does, so
//! instances of a mixed fleet agree on a key.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, Decision, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::{RedisConfig, RedisStore, TimeSource};
use tollgate_testkit::RedisServer;

use crate::server;

/// A store under `clock`; `module` false calls the code whatever is loaded.
/// `max_batch` 1 sends every check alone, not through the batcher.
async fn store(
    server: &RedisServer,
    clock: &Arc<ManualClock>,
    module: bool,
    max_batch: usize,
) -> RedisStore {
    let config = RedisConfig {
        time: TimeSource::Clock(Arc::clone(clock) as _),
        timeout: Duration::from_secs(5),
        extra_ttl: Duration::from_secs(600),
        module,
        max_batch,
        ..RedisConfig::default()
    };
    RedisStore::connect(&server.url(), config).await.unwrap()
}

fn limit(key: &str, algorithm: Algorithm, cost: u64) -> Limit<'_> {
    Limit {
        key,
        // 3 per second: an interval of 333,333.34 µs, rounded up alike.
        quota: Quota::per_second(3).unwrap().with_burst(4).unwrap(),
        algorithm,
        cost,
        failure: FailurePolicy::Local,
    }
}

const BUCKETS: [(Algorithm, &str, &str); 3] = [
    (Algorithm::Gcra, "tollgate.gcra", "gcra2"),
    (Algorithm::TokenBucket, "tollgate.tokenbucket", "tb2"),
    (Algorithm::LeakyBucket, "tollgate.leakybucket", "lb2"),
];

#[tokio::test]
async fn a_lone_bucket_check_goes_to_its_command_and_the_rest_to_check() {
    let server = server();
    let clock = tollgate_store::conformance::clock();
    for max_batch in [64, 1] {
        let store = store(&server, &clock, true, max_batch).await;
        assert!(store.uses_module());
        for (algorithm, command, _) in BUCKETS {
            assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
            let key = format!("{algorithm}:{max_batch}");
            assert!(
                store
                    .check(&[limit(&key, algorithm, 1)])
                    .await
                    .unwrap()
                    .allowed()
            );
            assert_eq!(
                server.command_calls(command),
                1,
                "{algorithm}, batches of {max_batch}"
            );
            assert_eq!(server.command_calls("tollgate.check"), 0, "{algorithm}");
            assert_eq!(server.command_calls("fcall"), 0, "{algorithm}");
            // Two limits: all or nothing, one TOLLGATE.CHECK.
            let two = [limit(&key, algorithm, 1), limit(&key, Algorithm::Gcra, 1)];
            store.check(&two).await.unwrap();
            assert_eq!(server.command_calls("tollgate.check"), 1, "{algorithm}");
        }
        // A bucket without a command of its own, and a window.
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
        let shaping = Algorithm::LeakyBucketShaping { delay_after: 1 };
        store.check(&[limit("s", shaping, 1)]).await.unwrap();
        store
            .check(&[limit("w", Algorithm::SlidingCounter, 1)])
            .await
            .unwrap();
        assert_eq!(server.command_calls("tollgate.check"), 2);
        assert_eq!(server.command_calls("tollgate.gcra"), 0);
    }
}

/// The decisions, the stored bytes and the TTLs of the lone path are the
/// code's: steps alternating between a store with the module and one
/// without on one key answer as the code alone on another key.
#[tokio::test]
async fn lone_checks_alternating_with_the_code_answer_as_the_code_alone() {
    let server = server();
    let clock = tollgate_store::conformance::clock();
    let lone = store(&server, &clock, true, 64).await;
    let code = store(&server, &clock, false, 64).await;
    let steps: [(u64, u64); 13] = [
        (0, 1),
        (0, 2),
        (0, 1),
        (1, 0),
        (100_000, 1),
        (333_334, 1),
        (1, 5),
        (2_000_000, 3),
        (0, 2),
        (333_333, 1),
        (1, 1),
        (10_000_000, 4),
        (1, 1),
    ];
    for (algorithm, _, segment) in BUCKETS {
        let mut alone: Vec<Decision> = Vec::new();
        let mut mixed: Vec<Decision> = Vec::new();
        for (i, (advance_us, cost)) in steps.into_iter().enumerate() {
            clock.advance(Duration::from_micros(advance_us));
            let by_code = code
                .check(&[limit("alone", algorithm, cost)])
                .await
                .unwrap();
            alone.push(by_code.decisions[0]);
            let store = if i % 2 == 0 { &lone } else { &code };
            let step = store
                .check(&[limit("mixed", algorithm, cost)])
                .await
                .unwrap();
            mixed.push(step.decisions[0]);
        }
        assert_eq!(mixed, alone, "{algorithm}");
        assert!(alone.iter().any(Decision::allowed), "{algorithm}");
        assert!(!alone.iter().all(Decision::allowed), "{algorithm}");
        let key = |k: &str| format!("tollgate:{segment}:{{{k}}}");
        assert_eq!(
            server.cli(&["GET", &key("mixed")]),
            server.cli(&["GET", &key("alone")]),
            "{algorithm}"
        );
        // The last step came through the lone path on "mixed": the same
        // TTL as the code's, padded alike (read a moment apart).
        let pttl = |k: &str| -> i64 { server.cli(&["PTTL", &key(k)]).trim().parse().unwrap() };
        let (mixed_ttl, alone_ttl) = (pttl("mixed"), pttl("alone"));
        assert!(alone_ttl > 600_000, "{algorithm}: padded, {alone_ttl}");
        assert!(
            (mixed_ttl - alone_ttl).abs() < 1_000,
            "{algorithm}: {mixed_ttl} against {alone_ttl}"
        );
    }
}
