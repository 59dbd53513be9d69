//! The wrappers of tollgate-store over real Redis: the conformance scenarios
//! through each of them on a single server and a cluster, and the fallback's
//! recovery when a real `redis-server` dies and comes back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_store::conformance::{
    self, Scenario, assert_same, assert_same_verdicts, reference, run,
};
use tollgate_store::{
    BreakerState, DenyCache, Fallback, FallbackConfig, Hybrid, HybridConfig, hybrid_leases,
};

use crate::support::{RedisCluster, RedisServer, manual_store_with, redis_scenarios};

/// A Redis store whose keys no other run on the same server shares.
async fn fresh(url: &str, clock: &Arc<ManualClock>, run: &str) -> RedisStore {
    manual_store_with(url, clock, |c| c.prefix = format!("stack-{run}")).await
}

/// A fallback that never falls back on a busy test machine.
fn patient() -> FallbackConfig {
    FallbackConfig {
        timeout: Duration::from_secs(5),
        ..FallbackConfig::default()
    }
}

/// Every wrapper over Redis at `url`, held to the suite: a fallback over a
/// healthy store and hybrid mode on unleased requests decide exactly as the
/// memory store; a deny cache, alone or atop the whole stack, admits and denies
/// the same requests.
async fn wrappers_conform(url: &str, name: &str) {
    // A reset goes through every wrapper to Redis.
    let clock = conformance::clock();
    let stack = DenyCache::with_clock(
        Fallback::with_clock(
            fresh(url, &clock, "reset").await,
            patient(),
            Arc::clone(&clock) as _,
        ),
        1024,
        Arc::clone(&clock) as _,
    );
    conformance::assert_reset_forgets(&stack, "stack").await;

    for (n, scenario) in redis_scenarios().iter().enumerate() {
        let expected = reference(scenario).await;
        let clock = conformance::clock();
        let redis = fresh(url, &clock, &format!("fallback-{n}")).await;
        let store = Fallback::with_clock(redis, patient(), Arc::clone(&clock) as _);
        let actual = run(&store, &clock, scenario).await;
        assert_same(
            scenario,
            &expected,
            &actual,
            &format!("fallback over {name}"),
        );
        assert_eq!(store.stats().fallbacks, 0);

        let monotonic = scenario.monotonic();
        let expected = reference(&monotonic).await;
        let clock = conformance::clock();
        let redis = fresh(url, &clock, &format!("deny-{n}")).await;
        let store = DenyCache::with_clock(redis, 1024, Arc::clone(&clock) as _);
        let actual = run(&store, &clock, &monotonic).await;
        let what = format!("deny cache over {name}");
        assert_same_verdicts(&monotonic, &expected, &actual, &what);
    }
    let unleased: Vec<Scenario> = redis_scenarios()
        .into_iter()
        .filter(|s| s.unleased(hybrid_leases))
        .collect();
    assert!(unleased.len() >= 4);
    for (n, scenario) in unleased.iter().enumerate() {
        let expected = reference(scenario).await;
        let clock = conformance::clock();
        let redis = fresh(url, &clock, &format!("hybrid-{n}")).await;
        let store = Hybrid::with_clock(redis, HybridConfig::default(), Arc::clone(&clock) as _);
        let actual = run(&store, &clock, scenario).await;
        assert_same(scenario, &expected, &actual, &format!("hybrid over {name}"));

        let monotonic = scenario.monotonic();
        let expected = reference(&monotonic).await;
        let clock = conformance::clock();
        let redis = fresh(url, &clock, &format!("stack-{n}")).await;
        let hybrid = Hybrid::with_clock(redis, HybridConfig::default(), Arc::clone(&clock) as _);
        let fallback = Fallback::with_clock(hybrid, patient(), Arc::clone(&clock) as _);
        let store = DenyCache::with_clock(fallback, 1024, Arc::clone(&clock) as _);
        let actual = run(&store, &clock, &monotonic).await;
        let what = format!("the whole stack over {name}");
        assert_same_verdicts(&monotonic, &expected, &actual, &what);
    }
}

#[tokio::test]
async fn every_wrapper_over_a_single_redis_conforms() {
    let server = RedisServer::start();
    wrappers_conform(&server.url(), "single Redis").await;
}

#[tokio::test]
async fn every_wrapper_over_a_redis_cluster_conforms() {
    let cluster = RedisCluster::start();
    wrappers_conform(&cluster.url(), "Redis Cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_return_to_a_restarted_redis_without_checks() {
    let mut server = RedisServer::start();
    let clock = conformance::clock();
    let cool_down = Duration::from_millis(300);
    let timeout = Duration::from_millis(100);
    let redis = manual_store_with(&server.url(), &clock, |c| c.timeout = timeout).await;
    let config = FallbackConfig {
        timeout,
        breaker_failures: 1,
        breaker_cool_down: cool_down,
        ..FallbackConfig::default()
    };
    let store = Fallback::with_clock(redis, config, Arc::clone(&clock) as _);
    let limit = Limit::new("recovering", Quota::per_hour(2).unwrap(), Algorithm::Gcra)
        .with_failure(FailurePolicy::Local);
    assert!(store.check(&[limit]).await.unwrap().allowed());
    assert_eq!(store.stats().checks, 1);

    server.kill();
    assert!(store.check(&[limit]).await.unwrap().allowed(), "local");
    let down = store.stats();
    assert_eq!((down.fallbacks, down.breaker_opens), (1, 1));
    assert_ne!(down.breaker, BreakerState::Closed);

    // Down for a few probes (counted, not timed), then back; no check is
    // sent until the breaker has closed by itself. How soon it closes (one
    // cool-down and one probe) is pinned on paused time by the fallback's
    // `the_breaker_is_closed_by_a_background_probe_with_no_checks_sent`; a
    // real server on a loaded machine gets a generous bound here instead.
    let patience = Duration::from_secs(30);
    let waited = Instant::now();
    while store.stats().probes < 2 {
        assert!(
            waited.elapsed() < patience,
            "no probes: {:?}",
            store.stats()
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(cool_down / 10).await;
    }
    assert_ne!(store.stats().breaker, BreakerState::Closed);
    server.restart();
    let probes_before = store.stats().probes;
    let back = Instant::now();
    while store.stats().breaker != BreakerState::Closed {
        assert!(
            back.elapsed() < patience,
            "still {:?} after Redis came back",
            store.stats().breaker
        );
        tokio::time::sleep(cool_down / 10).await;
    }
    let closed = store.stats();
    assert_eq!(
        (closed.checks, closed.fallbacks),
        (1, 1),
        "no check was sent"
    );
    assert!(closed.probes >= 2, "{closed:?}");
    // Within one probe after the restart, or two when one was already out
    // while Redis came up: the first probe after a restart does not fail on
    // the connection Redis dropped.
    assert!(
        closed.probes <= probes_before + 2,
        "{} probes after the restart: {closed:?}",
        closed.probes - probes_before
    );

    // Redis restarted empty (SIGKILL, no persistence): it is paid the one
    // admitted locally while it was down, then decides again.
    let first = store.check(&[limit]).await.unwrap();
    assert!(first.allowed());
    assert_eq!(
        first.decisions[0].remaining(),
        0,
        "2 an hour: paid 1, this 1"
    );
    assert_eq!(store.stats().checks, 2);
    assert_eq!(
        store.inner().stats().redis_checks,
        3,
        "the payment and the check"
    );
    assert!(
        !store.check(&[limit]).await.unwrap().allowed(),
        "2 an hour: the check and the local one"
    );
}
