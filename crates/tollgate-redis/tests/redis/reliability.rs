//! Issue 39 on a real `redis-server`: hybrid leases keep their cap under
//! concurrent misses.

use std::sync::Arc;

use tokio::task::JoinSet;
use tollgate_core::{Limit, Store};

use crate::support::{MAX_LEASE, RedisServer, gcra_of_10_000, hybrid_of, spend_held};

const KEY: &str = "contended";

fn limit() -> Limit<'static> {
    gcra_of_10_000(KEY)
}

#[tokio::test]
async fn regression_concurrent_misses_of_one_key_held_many_times_the_lease_cap() {
    let server = RedisServer::start();
    let hybrid = hybrid_of(&server).await;
    let max_lease = MAX_LEASE;
    // Grow the key's lease to its cap, then spend what is held, so that
    // the next checks all miss.
    let mut admitted = spend_held(&hybrid, limit(), 200).await;
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
        admitted += spend_held(&hybrid, limit(), 0).await;
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
