//! Issue 39 on a real `redis-server`: a hybrid check that leases units and
//! is dropped while Redis takes them (a fallback's timeout cancels it)
//! keeps the units it took, as leases of this instance.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};

use tollgate_core::{Limit, Store};

use crate::support::{MAX_LEASE, RedisServer, eventually, gcra_of_10_000, hybrid_of, spend_held};

fn limit() -> Limit<'static> {
    gcra_of_10_000("dropped")
}

#[tokio::test]
async fn regression_a_leasing_check_dropped_while_redis_took_its_units_lost_them() {
    let server = RedisServer::start();
    let hybrid = hybrid_of(&server).await;
    let max_lease = MAX_LEASE;
    let taken = || async {
        let read = hybrid
            .inner()
            .check(&[Limit { cost: 0, ..limit() }])
            .await
            .unwrap();
        10_000 - read.decisions[0].remaining()
    };
    // Grow the key's lease to its cap, then spend what is held: the next
    // check asks Redis for its unit and a lease of 50.
    let mut admitted = spend_held(&hybrid, limit(), 200).await;
    assert_eq!(taken().await, admitted);

    // Sent to a Redis that holds it (paused for writes), then dropped, as
    // a fallback's timeout drops it: Redis takes the units when it resumes.
    server.cli(&["CLIENT", "PAUSE", "600000", "WRITE"]);
    {
        let limits = [limit()];
        let mut check = pin!(hybrid.check(&limits));
        let mut held = false;
        for _ in 0..1000 {
            let polled = check.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending(), "waits for Redis");
            if server
                .cli(&["INFO", "clients"])
                .contains("blocked_clients:1")
            {
                held = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(held, "the leasing call never reached Redis");
    }
    server.cli(&["CLIENT", "UNPAUSE"]);
    eventually("Redis took the unit and the lease", || async {
        taken().await == admitted + 1 + max_lease
    })
    .await;
    // Once: 0 units held, the 50 taken for it lost (the store's record of
    // this instance overwritten by its next lease).
    eventually("the lease is kept", || async {
        hybrid.held_units() == max_lease
    })
    .await;
    // Spent locally, then given back whole: Redis keeps only what was
    // admitted, and the unit of the check nobody waited for.
    for _ in 0..10 {
        assert!(hybrid.check(&[limit()]).await.unwrap().allowed());
        admitted += 1;
    }
    hybrid.flush().await;
    assert_eq!(hybrid.held_units(), 0);
    assert_eq!(taken().await, admitted + 1);
}
