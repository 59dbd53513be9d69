//! Issue 39 on a real `redis-server`: hybrid leases keep their cap under
//! concurrent misses.

use std::sync::Arc;

use tokio::task::JoinSet;
use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota, Store};
use tollgate_store::conformance;
use tollgate_store::{Hybrid, HybridConfig};

use crate::support::{RedisServer, manual_store};

const KEY: &str = "contended";

fn limit() -> Limit<'static> {
    Limit {
        key: KEY,
        // Capacity 10,000 (no refill: the clock never moves).
        quota: Quota::per_hour(10_000).unwrap(),
        algorithm: Algorithm::Gcra,
        cost: 1,
        failure: FailurePolicy::Local,
    }
}

#[tokio::test]
async fn regression_concurrent_misses_of_one_key_held_many_times_the_lease_cap() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let redis = manual_store(&server.url(), &clock).await;
    // max_lease = 0.5% of 10,000 = 50 units.
    let config = HybridConfig {
        max_lease_fraction: 0.005,
        ..HybridConfig::default()
    };
    let max_lease = 50;
    let hybrid = Arc::new(Hybrid::with_clock(redis, config, Arc::clone(&clock) as _));
    let mut admitted = 0u64;
    // Grow the key's lease to its cap (each lease spent while live doubles
    // the next), then spend what is held, so that the next checks all miss.
    for _ in 0..200 {
        assert!(hybrid.check(&[limit()]).await.unwrap().allowed());
        admitted += 1;
    }
    while hybrid.held_units() > 0 {
        assert!(hybrid.check(&[limit()]).await.unwrap().allowed());
        admitted += 1;
    }
    let before = hybrid.stats().inner_checks;
    for round in 0..5 {
        let mut checks = JoinSet::new();
        for _ in 0..16 {
            let hybrid = Arc::clone(&hybrid);
            checks.spawn(async move { hybrid.check(&[limit()]).await.unwrap().allowed() });
        }
        let answers = checks.join_all().await;
        assert!(
            answers.iter().all(|&a| a),
            "round {round}: every check admitted"
        );
        admitted += 16;
        let held = hybrid.held_units();
        assert!(
            held <= max_lease,
            "round {round}: {held} units held, over the cap of {max_lease}"
        );
        while hybrid.held_units() > 0 {
            assert!(hybrid.check(&[limit()]).await.unwrap().allowed());
            admitted += 1;
        }
    }
    assert!(
        hybrid.stats().inner_checks > before + 16,
        "the checks missed concurrently"
    );
    // Redis took exactly what was admitted: every extra kept was spent.
    let read = hybrid
        .inner()
        .check(&[Limit { cost: 0, ..limit() }])
        .await
        .unwrap();
    assert_eq!(10_000 - read.decisions[0].remaining(), admitted);
}
