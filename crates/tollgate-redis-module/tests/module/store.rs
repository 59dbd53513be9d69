//! The store with the module loaded: it finds the module at connect and
//! sends its checks (every algorithm) and lease releases to
//! `TOLLGATE.CHECK`, and the conformance suite still finds every decision
//! the memory store's, on one server and on a cluster whose nodes all load
//! the module.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, ManualClock};
use tollgate_redis::{RedisConfig, RedisStore, TimeSource};
use tollgate_store::conformance::{self, Scenario, assert_same, reference, run, scenarios};
use tollgate_testkit::{RedisCluster, RedisServer};

use crate::{module, server};

async fn store(url: &str, clock: &Arc<ManualClock>, module: bool) -> RedisStore {
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

/// Calls of a command on `node` since its stats were last reset.
fn calls(node: &RedisServer, command: &str) -> u64 {
    node.cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
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
    let used = |c| nodes.iter().map(|n| calls(n, c)).sum::<u64>();
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
    // Every algorithm, the concurrency limiter's releases too: no check
    // left to the code (refunds are a cluster's, leasing checks Hybrid's).
    assert_eq!(fcalls, 0, "the code was called");
}

#[tokio::test]
async fn conformance_cluster_with_the_module() {
    let module = module();
    let cluster = RedisCluster::start_with(&["--loadmodule", module.to_str().unwrap()]);
    // The code is still called there for cross-slot refunds (op `r`).
    conformance(&cluster.url(), &cluster.nodes, "cluster, module").await;
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
