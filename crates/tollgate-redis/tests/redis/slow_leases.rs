//! Issue 39 item 4 on a real `redis-server` that is slow rather than dead:
//! hybrid leases whose calls outlast the Redis store's timeout, leases of
//! one key taken by concurrent checks, and a fallback over a hybrid
//! instance when Redis goes away. Time is a manual clock, which the Redis
//! store passes to the script as its time; the lease TTL is a minute, so
//! the returner task, on real time, never runs during a test.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::RedisStore;
use tollgate_store::conformance;
use tollgate_store::{BreakerState, Fallback, FallbackConfig, Hybrid, HybridConfig};

use crate::support::{RedisServer, eventually, manual_store_with, spend_held};

const LIMIT: u64 = 1_000;
/// 5% of the limit, the default fraction.
const MAX_LEASE: u64 = 50;
const LEASE_TTL: Duration = Duration::from_secs(60);
/// Past a record's deadline: twice the lease TTL.
const PAST_DEADLINE: Duration = Duration::from_secs(121);

/// 1,000 per 30 days: nothing refills, and no window ends, in a test.
fn limit(key: &str, algorithm: Algorithm) -> Limit<'_> {
    Limit {
        key,
        quota: Quota::new(LIMIT, Duration::from_secs(30 * 86_400)).unwrap(),
        algorithm,
        cost: 1,
        failure: FailurePolicy::Local,
    }
}

const LEASED: [Algorithm; 4] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
];

/// A hybrid instance whose Redis store gives up on a call after `timeout`.
async fn instance(
    server: &RedisServer,
    clock: &Arc<ManualClock>,
    timeout: Duration,
) -> Hybrid<RedisStore> {
    let redis = manual_store_with(&server.url(), clock, |c| c.timeout = timeout).await;
    let config = HybridConfig {
        lease_ttl: LEASE_TTL,
        ..HybridConfig::default()
    };
    Hybrid::with_clock(redis, config, Arc::clone(clock) as _)
}

/// Checks until the first deny; returns how many were admitted.
async fn drain<S: Store>(store: &S, limit: Limit<'_>) -> u64 {
    let mut admitted = 0;
    while store.check(&[limit]).await.unwrap().allowed() {
        admitted += 1;
        assert!(admitted <= LIMIT, "more admitted than the limit");
    }
    admitted
}

/// The units Redis counts taken of `limit` (a read at cost 0).
async fn taken(store: &RedisStore, limit: Limit<'_>) -> u64 {
    let read = store.check(&[Limit { cost: 0, ..limit }]).await.unwrap();
    LIMIT - read.decisions[0].remaining()
}

/// Before: Redis took a unit and a lease of 50 and recorded them for the
/// instance, which had stopped waiting; its next lease overwrote the record
/// with what it thought it held, so the 50 never came back.
#[tokio::test]
async fn regression_a_leasing_call_past_the_redis_timeout_lost_its_units() {
    let server = RedisServer::start();
    for algorithm in LEASED {
        let clock = conformance::clock();
        let key = format!("slow-{algorithm}");
        let l = limit(&key, algorithm);
        let hybrid = instance(&server, &clock, Duration::from_secs(1)).await;
        // Grow the key's lease to its cap, then spend what is held: the
        // next check asks Redis for its unit and a lease of 50.
        let mut admitted = spend_held(&hybrid, l, 200).await;
        assert_eq!(taken(hybrid.inner(), l).await, admitted, "{algorithm}");

        // Redis holds the call past the store's timeout (paused for
        // writes): the check errs, and Redis takes the units when it
        // resumes.
        server.cli(&["CLIENT", "PAUSE", "600000", "WRITE"]);
        let late = hybrid.check(&[l]).await;
        assert!(late.is_err(), "{algorithm}: answered {late:?}");
        server.cli(&["CLIENT", "UNPAUSE"]);
        eventually("Redis took the unit and the lease", || async {
            taken(hybrid.inner(), l).await == admitted + 1 + MAX_LEASE
        })
        .await;
        assert_eq!(hybrid.held_units(), 0, "{algorithm}: never told");

        // The instance goes on leasing and giving back; the units it never
        // learnt of stay in their record until its deadline.
        for _ in 0..120 {
            assert!(hybrid.check(&[l]).await.unwrap().allowed());
            admitted += 1;
        }
        hybrid.flush().await;
        assert_eq!(
            taken(hybrid.inner(), l).await,
            admitted + 1 + MAX_LEASE,
            "{algorithm}: held in the record"
        );
        // Past it, the next leasing check credits them back: every unit is
        // spent or back, the timed-out check's own unit charged (its
        // caller stopped waiting).
        clock.advance(PAST_DEADLINE);
        let rest = drain(&hybrid, l).await;
        assert_eq!(admitted + 1 + rest, LIMIT, "{algorithm}");
    }
}

/// Before: each concurrent leasing call set the record to what the
/// instance held plus its own extra, so the record kept only the last
/// call's extra, and a crash lost the others.
#[tokio::test]
async fn leases_of_one_key_taken_by_concurrent_checks_all_come_back_after_a_crash() {
    let server = RedisServer::start();
    for algorithm in LEASED {
        let clock = conformance::clock();
        let key = format!("concurrent-{algorithm}");
        let l = limit(&key, algorithm);
        let crashed = Arc::new(instance(&server, &clock, Duration::from_secs(5)).await);
        // A few checks, so that leases are still small (each a few units,
        // well under the cap), and what is held is spent: concurrent misses
        // then each ask for an extra.
        let mut admitted = 0u64;
        while admitted < 5 || crashed.held_units() > 0 {
            assert!(crashed.check(&[l]).await.unwrap().allowed());
            admitted += 1;
        }
        let checks: Vec<_> = (0..16)
            .map(|_| {
                let store = Arc::clone(&crashed);
                let key = key.clone();
                tokio::spawn(async move {
                    store
                        .check(&[limit(&key, algorithm)])
                        .await
                        .unwrap()
                        .allowed()
                })
            })
            .collect();
        for check in checks {
            assert!(check.await.unwrap());
            admitted += 1;
        }
        let stats = crashed.stats();
        assert!(
            stats.inner_checks > 2,
            "{algorithm}: several leasing calls ({stats:?})"
        );
        assert!(crashed.held_units() > 0, "{algorithm}");
        drop(crashed);

        clock.advance(PAST_DEADLINE);
        let other = instance(&server, &clock, Duration::from_secs(5)).await;
        assert_eq!(admitted + drain(&other, l).await, LIMIT, "{algorithm}");
    }
}

/// Redis killed while a hybrid instance holds a lease: the fallback over
/// it starts from what Redis last said was left, not from the instance's
/// lease. Before: the hybrid's decisions said only what its lease held,
/// the fallback started from that, and denied with 700 of 1,000 left
/// (the lease's units spent, then not one more).
#[tokio::test]
async fn a_fallback_over_a_hybrid_instance_starts_from_what_redis_last_said() {
    for algorithm in LEASED {
        let mut server = RedisServer::start();
        let clock = conformance::clock();
        let key = format!("fallen-{algorithm}");
        let l = limit(&key, algorithm);
        let hybrid = instance(&server, &clock, Duration::from_secs(5)).await;
        let config = FallbackConfig {
            timeout: Duration::from_secs(5),
            ..FallbackConfig::default()
        };
        let store = Fallback::with_clock(hybrid, config, Arc::clone(&clock) as _);
        for i in 0..300 {
            assert!(store.check(&[l]).await.unwrap().allowed(), "check {i}");
        }
        assert!(store.inner().held_units() > 0, "{algorithm}");
        server.kill();
        // The lease is spent from the instance, the rest from the fallback:
        // what Redis last said was left, and what the instance held.
        let outage = drain(&store, l).await;
        assert!(store.stats().fallbacks > 0, "{algorithm}");
        assert_eq!(300 + outage, LIMIT, "{algorithm}");
    }
}

/// With the breaker open (another key's checks failed first), a key the
/// instance holds a lease of is decided by the fallback alone: it spends
/// its share of what Redis said was left, and its own lease whole (the
/// lease is this instance's, not a part of what others may also spend).
#[tokio::test]
async fn with_the_breaker_open_an_instance_spends_its_share_of_what_redis_left_and_its_lease() {
    for algorithm in LEASED {
        let mut server = RedisServer::start();
        let clock = conformance::clock();
        let key = format!("shared-{algorithm}");
        let other = format!("other-{algorithm}");
        let l = limit(&key, algorithm);
        let hybrid = instance(&server, &clock, Duration::from_secs(5)).await;
        let config = FallbackConfig {
            timeout: Duration::from_secs(5),
            local_share: 0.5,
            ..FallbackConfig::default()
        };
        let store = Fallback::with_clock(hybrid, config, Arc::clone(&clock) as _);
        for i in 0..300 {
            assert!(store.check(&[l]).await.unwrap().allowed(), "check {i}");
        }
        let held = store.inner().held_units();
        assert!(held > 1, "{algorithm}");
        // Every unit Redis gave went to this instance: admitted, or held.
        let left = LIMIT - 300 - held;
        server.kill();
        let o = limit(&other, algorithm);
        while store.stats().breaker != BreakerState::Open {
            store.check(&[o]).await.unwrap();
        }
        let outage = drain(&store, l).await;
        assert_eq!(outage, left / 2 + held, "{algorithm}: {held} held");
    }
}
