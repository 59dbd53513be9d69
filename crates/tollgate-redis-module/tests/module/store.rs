//! The store with the module loaded: it finds the module at connect and
//! sends its checks (every algorithm), refunds and lease releases to
//! `TOLLGATE.CHECK`, and the conformance suite still finds every decision
//! the memory store's, on one server and on a cluster whose nodes all load
//! the module.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::{RedisConfig, RedisStore, TimeSource};
use tollgate_store::conformance::{self, Scenario, assert_same, reference, run, scenarios};
use tollgate_testkit::{RedisCluster, RedisServer};

use crate::{module, server};

/// A store on the test's clock; with the module when `module` and the
/// server has it.
pub(crate) async fn store(url: &str, clock: &Arc<ManualClock>, module: bool) -> RedisStore {
    let config = RedisConfig {
        time: TimeSource::Clock(Arc::clone(clock) as _),
        timeout: Duration::from_secs(5),
        extra_ttl: Duration::from_secs(600),
        module,
        ..RedisConfig::default()
    };
    RedisStore::connect(url, config).await.unwrap()
}

/// The scenarios as tollgate-redis's suite runs them: with fixed windows or
/// hit counters, on a clock that never goes back (native counting).
fn redis_scenarios() -> Vec<Scenario> {
    scenarios()
        .into_iter()
        .map(|s| {
            let counted = s
                .limits
                .iter()
                .any(|(_, _, a)| matches!(a, Algorithm::FixedWindow | Algorithm::HitCounter));
            if counted { s.monotonic() } else { s }
        })
        .collect()
}

/// Runs the scenarios; answers the calls of `FCALL` the nodes saw.
async fn conformance(url: &str, nodes: &[RedisServer], what: &str) -> u64 {
    for scenario in redis_scenarios() {
        let reference = reference(&scenario).await;
        let clock = conformance::clock();
        let redis = store(url, &clock, true).await;
        assert!(redis.uses_module(), "{what}: the module was not found");
        let actual = run(&redis, &clock, &scenario).await;
        assert_same(&scenario, &reference, &actual, what);
        let stats = redis.stats();
        assert_eq!((stats.errors, stats.timeouts), (0, 0));
    }
    let used = |c| nodes.iter().map(|n| n.command_calls(c)).sum::<u64>();
    assert!(
        used("tollgate.check") > 0,
        "{what}: tollgate.check was not called"
    );
    used("fcall")
}

#[tokio::test]
async fn conformance_single_redis_with_the_module() {
    let server = server();
    let fcalls = conformance(
        &server.url(),
        std::slice::from_ref(&server),
        "single Redis, module",
    )
    .await;
    // Every algorithm, the concurrency limiter's releases too: nothing left
    // to the code (hybrid leasing: tests/module/leasing.rs).
    assert_eq!(fcalls, 0, "the code was called");
}

#[tokio::test]
async fn conformance_cluster_with_the_module() {
    let module = module();
    let cluster = RedisCluster::start_with(&["--loadmodule", module.to_str().unwrap()]);
    let fcalls = conformance(&cluster.url(), &cluster.nodes, "cluster, module").await;
    assert_eq!(fcalls, 0, "the code was called");
}

/// A request of a limit of each algorithm beside a full concurrency limit
/// on another slot: the narrow limit's slot, checked first, admits, the
/// full one denies, and the module gives the narrow limit its units back
/// (op `r`), so the narrow limit then admits its whole capacity.
#[tokio::test]
async fn a_cross_slot_deny_is_refunded_through_the_module() {
    let module = module();
    let cluster = RedisCluster::start_with(&["--loadmodule", module.to_str().unwrap()]);
    let clock = conformance::clock();
    let redis = store(&cluster.url(), &clock, true).await;
    let (narrow_quota, wide_quota) = (
        Quota::per_second(5).unwrap(),
        Quota::per_second(10).unwrap(),
    );
    let wide = Limit {
        key: "{wide}w",
        quota: wide_quota,
        algorithm: Algorithm::Concurrency,
        cost: 1,
        failure: FailurePolicy::Local,
    };
    let full = redis.check(&[Limit { cost: 10, ..wide }]).await.unwrap();
    assert!(full.allowed());
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::LeakyBucketShaping { delay_after: 5 },
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::Concurrency,
        Algorithm::HitCounter,
    ];
    for (i, algorithm) in algorithms.into_iter().enumerate() {
        let key = format!("{{narrow-{i}}}n");
        assert_ne!(cluster.keyslot(&key), cluster.keyslot("{wide}w"));
        let narrow = Limit {
            key: &key,
            quota: narrow_quota,
            algorithm,
            ..wide
        };
        let both = redis.check(&[narrow, wide]).await.unwrap();
        assert!(!both.allowed(), "{algorithm:?}: the full limit denies");
        assert!(
            both.decisions[0].allowed(),
            "{algorithm:?}: the narrow one admits"
        );
        for n in 0..5 {
            let alone = redis.check(&[narrow]).await.unwrap();
            assert!(alone.allowed(), "{algorithm:?}: unit {n} is back");
        }
        assert!(!redis.check(&[narrow]).await.unwrap().allowed());
    }
    assert_eq!(redis.stats().refunds, algorithms.len() as u64);
    let fcalls: u64 = cluster.nodes.iter().map(|n| n.command_calls("fcall")).sum();
    assert_eq!(fcalls, 0, "the refunds went to the module");
}

/// Without the module, or with `module: false`, the store calls the code.
#[tokio::test]
async fn the_code_without_the_module_or_when_asked() {
    let clock = conformance::clock();
    let plain = RedisServer::start();
    assert!(!store(&plain.url(), &clock, true).await.uses_module());
    let server = server();
    assert!(!store(&server.url(), &clock, false).await.uses_module());
}
