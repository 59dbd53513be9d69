//! Issue 39 item 4 on a real `redis-server`: the units a hybrid instance
//! held when it crashed come back. Each instance is a `Hybrid` over its own
//! Redis store, all on one Redis; a crash is an instance dropped without
//! giving back (its returner task ends with it). Time is a manual clock,
//! which the Redis store passes to the script as its time; the lease TTL is
//! long enough (a minute) that the returner task, on real time, never runs
//! during a test.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_store::conformance;
use tollgate_store::{Hybrid, HybridConfig};

use crate::support::{RedisCluster, RedisServer, manual_store};

const LIMIT: u64 = 1_000;
/// 5% of the limit, the default fraction.
const MAX_LEASE: u64 = 50;
const LEASE_TTL: Duration = Duration::from_secs(60);

/// 1,000 per 30 days: nothing refills, and no window ends, in a test.
fn limit(algorithm: Algorithm) -> Limit<'static> {
    Limit {
        key: "crashy",
        quota: Quota::new(LIMIT, Duration::from_secs(30 * 86_400)).unwrap(),
        algorithm,
        cost: 1,
        failure: FailurePolicy::Local,
    }
}

async fn instance(server: &RedisServer, clock: &Arc<ManualClock>) -> Hybrid<RedisStore> {
    instance_on(&server.url(), clock).await
}

async fn instance_on(url: &str, clock: &Arc<ManualClock>) -> Hybrid<RedisStore> {
    let redis = manual_store(url, clock).await;
    let config = HybridConfig {
        lease_ttl: LEASE_TTL,
        ..HybridConfig::default()
    };
    Hybrid::with_clock(redis, config, Arc::clone(clock) as _)
}

/// Checks `n` times, all admitted.
async fn admit(store: &Hybrid<RedisStore>, limit: Limit<'_>, n: u64) {
    admit_all(store, &[limit], n).await;
}

async fn admit_all(store: &Hybrid<RedisStore>, limits: &[Limit<'_>], n: u64) {
    for i in 0..n {
        assert!(store.check(limits).await.unwrap().allowed(), "check {i}");
    }
}

/// Checks until the first deny; returns how many were admitted.
async fn drain(store: &Hybrid<RedisStore>, limit: Limit<'_>) -> u64 {
    drain_all(store, &[limit]).await
}

async fn drain_all(store: &Hybrid<RedisStore>, limits: &[Limit<'_>]) -> u64 {
    let mut admitted = 0;
    while store.check(limits).await.unwrap().allowed() {
        admitted += 1;
        assert!(admitted <= LIMIT, "more admitted than the limit");
    }
    admitted
}

const LEASED: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
];

#[tokio::test]
async fn units_a_crashed_instance_held_come_back_after_its_record_expires() {
    let server = RedisServer::start();
    for algorithm in LEASED {
        let clock = conformance::clock();
        let l = limit(algorithm);
        let crashed = instance(&server, &clock).await;
        admit(&crashed, l, 300).await;
        // Its periodic report tells Redis what it holds now.
        crashed.return_expired().await;
        let held = crashed.held_units();
        assert!(held > 0 && held <= MAX_LEASE, "{algorithm:?}: {held} held");
        drop(crashed);

        let other = instance(&server, &clock).await;
        // Before the record's time the units stay with the crashed holder:
        // the others get the rest, exactly.
        let before = drain(&other, l).await;
        assert_eq!(before, LIMIT - 300 - held, "{algorithm:?}");
        // Past it (twice the lease TTL), the next check credits them back.
        clock.advance(2 * LEASE_TTL + Duration::from_millis(1));
        let after = drain(&other, l).await;
        assert_eq!(after, held, "{algorithm:?}: the crashed units came back");
        assert_eq!(300 + before + after, LIMIT, "{algorithm:?}");
    }
}

#[tokio::test]
async fn a_crash_right_after_a_lease_was_taken_loses_nothing() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let l = limit(Algorithm::Gcra);
    let crashed = instance(&server, &clock).await;
    // Spend until a check takes a new lease from Redis, and crash then:
    // the record says what the lease left it holding.
    let mut admitted = 0;
    loop {
        let inner = crashed.stats().inner_checks;
        admit(&crashed, l, 1).await;
        admitted += 1;
        if admitted > 100 && crashed.stats().inner_checks > inner {
            break;
        }
    }
    assert!(crashed.held_units() > 0);
    drop(crashed);
    clock.advance(2 * LEASE_TTL + Duration::from_millis(1));
    let other = instance(&server, &clock).await;
    assert_eq!(admitted + drain(&other, l).await, LIMIT);
}

#[tokio::test]
async fn a_crash_after_unreported_spending_credits_back_at_most_one_lease_too_many() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let l = limit(Algorithm::TokenBucket);
    let crashed = instance(&server, &clock).await;
    admit(&crashed, l, 300).await;
    crashed.return_expired().await;
    let reported = crashed.held_units();
    // Spent locally after the report, without a new lease: Redis cannot
    // know, and credits back what was reported.
    let spent = reported / 2;
    let inner = crashed.stats().inner_checks;
    admit(&crashed, l, spent).await;
    assert_eq!(crashed.stats().inner_checks, inner, "spent locally");
    drop(crashed);
    clock.advance(2 * LEASE_TTL + Duration::from_millis(1));
    let other = instance(&server, &clock).await;
    let total = 300 + spent + drain(&other, l).await;
    assert_eq!(total, LIMIT + spent);
    assert!(spent <= MAX_LEASE);
}

#[tokio::test]
async fn units_given_back_by_a_live_instance_are_never_credited_twice() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    for algorithm in LEASED {
        let l = limit(algorithm);
        let a = instance(&server, &clock).await;
        admit(&a, l, 300).await;
        // Back on time, by itself: its record goes with the units.
        a.flush().await;
        clock.advance(2 * LEASE_TTL + Duration::from_millis(1));
        let b = instance(&server, &clock).await;
        assert_eq!(300 + drain(&b, l).await, LIMIT, "{algorithm:?}");

        // An instance that stalls past its record's time: another check
        // credits its units, and its own late give back then gives none.
        let l = Limit {
            key: "stalled",
            ..l
        };
        let stalled = instance(&server, &clock).await;
        admit(&stalled, l, 300).await;
        stalled.return_expired().await;
        let held = stalled.held_units();
        assert!(held > 0);
        clock.advance(2 * LEASE_TTL + Duration::from_millis(1));
        let c = instance(&server, &clock).await;
        let got = drain(&c, l).await;
        assert_eq!(300 + got, LIMIT, "{algorithm:?}: {held} credited back");
        stalled.flush().await;
        assert_eq!(
            drain(&c, l).await,
            0,
            "{algorithm:?}: the late give back gave nothing"
        );
    }
}

#[tokio::test]
async fn on_a_cluster_a_request_across_slots_gets_its_crashed_units_back() {
    let cluster = RedisCluster::start();
    let clock = conformance::clock();
    // Two keys on two slots: the request's groups go in two calls, each
    // recording its own limit.
    let limits = [
        Limit {
            key: "{slot-a}crashy",
            ..limit(Algorithm::Gcra)
        },
        Limit {
            key: "{slot-b}crashy",
            ..limit(Algorithm::TokenBucket)
        },
    ];
    let crashed = instance_on(&cluster.url(), &clock).await;
    admit_all(&crashed, &limits, 300).await;
    crashed.return_expired().await;
    let held = crashed.held_units();
    assert!(held > 0);
    drop(crashed);
    clock.advance(2 * LEASE_TTL + Duration::from_millis(1));
    let other = instance_on(&cluster.url(), &clock).await;
    assert_eq!(300 + drain_all(&other, &limits).await, LIMIT);
}
