//! Hybrid mode over Redis: several `Hybrid` wrappers (instances), each over a
//! deny cache over its own Redis store, share one Redis and spend leased
//! slices locally. The admitted count stays within the documented bound
//! `burst + rate × T + N × max_lease`, hot keys get many decisions per Redis
//! operation, and unspent units go back exactly.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_store::conformance;
use tollgate_store::{DenyCache, Hybrid, HybridConfig};

use crate::support::{RedisServer, manual_store, manual_store_with};

type Instance = Hybrid<DenyCache<RedisStore>>;

const INSTANCES: usize = 3;

async fn instances(server: &RedisServer, clock: &Arc<ManualClock>) -> Vec<Instance> {
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        let redis = manual_store(&server.url(), clock).await;
        let cached = DenyCache::with_clock(redis, 1024, Arc::clone(clock) as _);
        stores.push(Hybrid::with_clock(
            cached,
            HybridConfig::default(),
            Arc::clone(clock) as _,
        ));
    }
    stores
}

fn limit(key: &str, quota: Quota, algorithm: Algorithm) -> Limit<'_> {
    Limit {
        key,
        quota,
        algorithm,
        cost: 1,
        failure: FailurePolicy::Local,
    }
}

/// Redis operations of all instances: checks Redis decided plus returns.
fn redis_ops(stores: &[Instance]) -> u64 {
    stores
        .iter()
        .map(|s| s.inner().inner().stats().redis_checks + s.stats().returns)
        .sum()
}

#[tokio::test]
async fn overshoot_across_instances_stays_within_the_bound() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let stores = instances(&server, &clock).await;
    // 1000 per second, burst 1000: max_lease = 5% = 50 units per instance.
    let quota = Quota::per_second(1000).unwrap();
    let max_lease = 50;
    let l = limit("saturated", quota, Algorithm::Gcra);
    let steps = 400; // 1 ms each: rate × T = 400 units
    let mut admitted = 0u64;
    for _ in 0..steps {
        clock.advance(Duration::from_millis(1));
        for store in &stores {
            for _ in 0..4 {
                if store.check(&[l]).await.unwrap().allowed() {
                    admitted += 1;
                }
            }
            store.return_expired().await;
        }
    }
    let exact = 1000 + steps; // what one exact limiter admits
    eprintln!("saturated: admitted {admitted}, exact {exact}");
    let bound = exact + INSTANCES as u64 * max_lease;
    assert!(admitted <= bound, "admitted {admitted} > bound {bound}");
    assert!(
        admitted + INSTANCES as u64 * max_lease >= exact,
        "admitted {admitted}: more than N × max_lease held back"
    );
}

#[tokio::test]
async fn a_hot_key_gets_many_decisions_per_redis_operation_and_returns_exactly() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let stores = instances(&server, &clock).await;
    // A large budget: max_lease = 5,000 units per instance.
    let quota = Quota::per_second(100_000).unwrap();
    let l = limit("hot", quota, Algorithm::Gcra);
    let mut decisions = 0u64;
    let mut admitted = 0u64;
    for round in 0..2_000 {
        let store = &stores[round % INSTANCES];
        for _ in 0..10 {
            decisions += 1;
            admitted += u64::from(store.check(&[l]).await.unwrap().allowed());
        }
    }
    assert_eq!(admitted, 20_000, "the budget covers every request");
    let ops = redis_ops(&stores);
    assert!(
        decisions >= 10 * ops,
        "{decisions} decisions for {ops} Redis operations"
    );
    // Unspent units go back: the global state then holds exactly what was
    // admitted (the clock did not move, so nothing refilled).
    eprintln!("hot key: {decisions} decisions, {ops} Redis operations");
    for store in &stores {
        store.flush().await;
    }
    let returned: u64 = stores.iter().map(|s| s.stats().units_returned).sum();
    let leased: u64 = stores.iter().map(|s| s.stats().units_leased).sum();
    assert!(returned > 0 && returned <= leased);
    let read = stores[0]
        .inner()
        .inner()
        .check(&[Limit { cost: 0, ..l }])
        .await
        .unwrap();
    assert_eq!(read.decisions[0].remaining(), 100_000 - admitted);
}

#[tokio::test]
async fn fixed_window_leases_never_let_a_window_admit_more_than_its_limit() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let stores = instances(&server, &clock).await;
    let quota = Quota::per_second(200).unwrap(); // max_lease 10
    let l = limit("windowed", quota, Algorithm::FixedWindow);
    for window in 0..3 {
        let mut admitted = 0;
        for round in 0..300 {
            let store = &stores[round % INSTANCES];
            admitted += u32::from(store.check(&[l]).await.unwrap().allowed());
        }
        eprintln!("window {window}: admitted {admitted}");
        assert!(admitted <= 200, "window {window}: {admitted} > 200");
        assert!(admitted >= 200 - 3 * 10, "window {window}: only {admitted}");
        clock.advance(Duration::from_secs(1));
        for store in &stores {
            store.return_expired().await;
        }
    }
}

#[tokio::test]
async fn requests_with_unleased_algorithms_and_multi_limit_atomicity_go_through() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let stores = instances(&server, &clock).await;
    let store = &stores[0];
    let bucket = limit(
        "{u}bucket",
        Quota::per_second(100).unwrap(),
        Algorithm::TokenBucket,
    );
    let log = limit(
        "{u}log",
        Quota::per_second(2).unwrap(),
        Algorithm::SlidingLog,
    );
    assert!(store.check(&[bucket, log]).await.unwrap().allowed());
    assert!(store.check(&[bucket, log]).await.unwrap().allowed());
    let denied = store.check(&[bucket, log]).await.unwrap();
    assert!(!denied.allowed() && denied.decisions[0].allowed());
    // The bucket alone is served from its lease, all or nothing.
    assert!(store.check(&[bucket]).await.unwrap().allowed());
    assert!(store.stats().local_decisions >= 1);
}

#[tokio::test]
async fn the_worst_case_overshoot_is_reached_and_not_exceeded() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let stores = instances(&server, &clock).await;
    let quota = Quota::per_second(1000).unwrap(); // max_lease 50
    let l = limit("worst", quota, Algorithm::Gcra);
    // Each instance warms up until it holds a full lease of 50 units.
    for store in &stores {
        for _ in 0..1000 {
            store.check(&[l]).await.unwrap();
            if store.held_units() == 50 {
                break;
            }
        }
        assert_eq!(store.held_units(), 50);
    }
    // The bucket refills (999 ms at one unit per ms, leases still live), then at
    // one instant an exact client drains it while the instances spend.
    clock.advance(Duration::from_millis(999));
    let exact = manual_store_with(&server.url(), &clock, |_| {}).await;
    let mut admitted = 0u64;
    while exact.check(&[l]).await.unwrap().allowed() {
        admitted += 1;
    }
    for store in &stores {
        while store.check(&[l]).await.unwrap().allowed() {
            admitted += 1;
        }
    }
    // burst + rate × 0 + N × max_lease, reached exactly.
    assert_eq!(admitted, 1000 + INSTANCES as u64 * 50);
}
