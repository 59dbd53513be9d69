//! The memory store's behaviour: atomic multi-limit checks, expiry, the key cap,
//! concurrency permits and thread safety. Time comes from a manual clock.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_store::{MemoryConfig, MemoryStore};

fn store(config: MemoryConfig) -> (MemoryStore<Arc<ManualClock>>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    (MemoryStore::with_clock(config, Arc::clone(&clock)), clock)
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

fn per_second(n: u64) -> Quota {
    Quota::per_second(n).unwrap()
}

#[test]
fn a_deny_by_one_layer_consumes_nothing_from_the_others() {
    for algorithm in Algorithm::RATE {
        let (store, _) = store(MemoryConfig::default());
        let global = limit("global", per_second(100), algorithm);
        let user = limit("user:1", per_second(2), algorithm);
        assert!(store.check_now(&[global, user]).allowed(), "{algorithm}");
        assert!(store.check_now(&[global, user]).allowed(), "{algorithm}");
        let outcome = store.check_now(&[global, user]);
        assert!(!outcome.allowed(), "{algorithm}");
        assert!(
            outcome.decisions[0].allowed(),
            "the global layer alone would allow"
        );
        assert!(!outcome.decisions[1].allowed());
        // The global layer still has 98 left: the denied request took nothing.
        let read = store.check_now(&[Limit { cost: 0, ..global }]);
        assert_eq!(read.decisions[0].remaining(), 98, "{algorithm}");
    }
}

#[test]
fn a_deny_undoes_an_earlier_layer_of_the_same_request_even_on_a_shared_key() {
    let (store, _) = store(MemoryConfig::default());
    let shared = limit("bucket", per_second(3), Algorithm::Gcra);
    let strict = limit("strict", per_second(1), Algorithm::SlidingLog);
    assert!(store.check_now(&[shared, shared, strict]).allowed());
    // shared has 1 left, strict has 0: the whole request is refused...
    assert!(!store.check_now(&[shared, strict]).allowed());
    // ...and shared still has exactly 1.
    assert_eq!(
        store.check_now(&[Limit { cost: 0, ..shared }]).decisions[0].remaining(),
        1
    );
    // Two uses of one shared bucket in one request see each other.
    let outcome = store.check_now(&[shared, shared]);
    assert!(!outcome.allowed());
    assert_eq!(
        store.check_now(&[Limit { cost: 0, ..shared }]).decisions[0].remaining(),
        1
    );
}

#[test]
fn most_restrictive_layer_is_reported() {
    let (store, _) = store(MemoryConfig::default());
    let wide = limit("wide", per_second(10), Algorithm::TokenBucket);
    let narrow = limit("narrow", per_second(3), Algorithm::TokenBucket);
    let outcome = store.check_now(&[wide, narrow]);
    assert_eq!(outcome.most_restrictive().unwrap().remaining(), 2);
}

#[test]
fn entries_expire_once_their_state_is_back_to_full() {
    let (store, clock) = store(MemoryConfig::default());
    for algorithm in Algorithm::RATE {
        for key in ["a", "b", "c"] {
            assert!(
                store
                    .check_now(&[limit(key, per_second(10), algorithm)])
                    .allowed()
            );
        }
    }
    assert_eq!(store.len(), 3 * Algorithm::RATE.len());
    clock.advance(Duration::from_millis(500));
    store.sweep();
    // Sliding windows and the fixed window still remember the admissions.
    assert!(!store.is_empty());
    clock.advance(Duration::from_secs(2));
    store.sweep();
    assert_eq!(store.len(), 0);
}

#[test]
fn a_sweep_asked_for_drops_what_is_at_rest_though_no_periodic_sweep_is_due() {
    let (store, clock) = store(MemoryConfig {
        sweep_interval: Duration::from_secs(3600),
        ..MemoryConfig::default()
    });
    let quota = Quota::new(1, Duration::from_millis(1)).unwrap();
    assert!(
        store
            .check_now(&[limit("a", quota, Algorithm::Gcra)])
            .allowed()
    );
    clock.advance(Duration::from_millis(1));
    store.sweep();
    assert!(store.is_empty());
}

#[test]
fn denied_and_read_only_requests_store_nothing() {
    let (store, _) = store(MemoryConfig::default());
    let q = per_second(1);
    for i in 0..100 {
        let key = format!("k{i}");
        store.check_now(&[Limit {
            cost: 0,
            ..limit(&key, q, Algorithm::Gcra)
        }]);
        store.check_now(&[Limit {
            cost: 2,
            ..limit(&key, q, Algorithm::Gcra)
        }]);
    }
    assert!(store.is_empty());
}

#[test]
fn the_key_cap_holds_under_a_flood_of_unique_keys() {
    let (store, _) = store(MemoryConfig {
        max_keys: 1000,
        shards: 8,
        ..MemoryConfig::default()
    });
    let q = per_second(5);
    let mut admitted = 0;
    for i in 0..50_000 {
        let key = format!("attacker:{i}");
        let outcome = store.check_now(&[limit(&key, q, Algorithm::Gcra)]);
        if outcome.allowed() {
            admitted += 1;
        } else {
            // The clock stands still, so nothing comes to rest: a new key
            // past the cap is refused, and told to come back when a sampled
            // key is back to full (one emission interval, 200 ms, from now).
            assert_eq!(
                outcome.decisions[0].retry_after(),
                Some(Duration::from_millis(200))
            );
        }
    }
    let stats = store.stats();
    assert!(stats.keys <= 1000, "held {}", stats.keys);
    assert_eq!(stats.keys, admitted);
    assert_eq!(stats.evictions, 0);
    assert_eq!(stats.refusals, 50_000 - admitted as u64);
}

#[test]
fn a_flood_fills_the_key_cap_exactly_and_no_further() {
    for (max_keys, shards) in [(1000, 8), (1000, 128), (3, 128), (1, 1)] {
        let (store, clock) = store(MemoryConfig {
            max_keys,
            shards,
            ..MemoryConfig::default()
        });
        // One key's state is back to full 1 ms after its request, so the
        // flood's older keys are at rest and make room for its newer ones.
        let q = per_second(1000);
        for i in 0..50 * max_keys {
            clock.advance(Duration::from_micros(100));
            let key = format!("attacker:{i}");
            store.check_now(&[limit(&key, q, Algorithm::Gcra)]);
            assert!(store.len() <= max_keys);
        }
        let stats = store.stats();
        assert_eq!(stats.keys, max_keys, "{max_keys} keys in {shards} shards");
        assert!(stats.evictions > 0, "{stats:?}");
    }
}

#[test]
fn concurrency_permits_are_held_until_released_or_lapsed_and_never_evicted_while_held() {
    let (store, clock) = store(MemoryConfig {
        max_keys: 8,
        shards: 1,
        ..MemoryConfig::default()
    });
    let slots = limit(
        "uploads",
        Quota::per_minute(2).unwrap(),
        Algorithm::Concurrency,
    );
    let first = store.check_now(&[slots]).leases;
    let second = store.check_now(&[slots]).leases;
    assert_eq!((first.len(), second.len()), (1, 1));
    let denied = store.check_now(&[slots]);
    assert!(!denied.allowed());
    assert!(denied.leases.is_empty(), "a deny takes no lease");
    assert_eq!(denied.decisions[0].retry_after(), None);
    // Neither a sweep nor a flood of other keys frees a permit before its
    // lease (the quota's period, a minute) lapses.
    clock.advance(Duration::from_secs(59));
    store.sweep();
    for i in 0..100 {
        let key = format!("k{i}");
        store.check_now(&[limit(&key, per_second(1), Algorithm::Gcra)]);
    }
    assert!(!store.check_now(&[slots]).allowed());
    store.release_now(&second);
    let third = store.check_now(&[slots]).leases;
    assert_eq!(third.len(), 1);
    assert!(!store.check_now(&[slots]).allowed());
    // A holder that never releases loses its permit a period after taking it.
    clock.advance(Duration::from_secs(1));
    store.sweep();
    assert!(store.check_now(&[slots]).allowed(), "the 0 s lease lapsed");
    // Releasing the lapsed lease, or a released one again, frees nothing.
    store.release_now(&first);
    store.release_now(&second);
    assert!(!store.check_now(&[slots]).allowed());
    store.release_now(&third);
    assert!(store.check_now(&[slots]).allowed());
}

#[test]
fn a_release_gives_back_exactly_the_lease_it_names() {
    let (store, clock) = store(MemoryConfig::default());
    let slots = limit(
        "jobs",
        Quota::per_minute(3).unwrap(),
        Algorithm::Concurrency,
    );
    let a = store.check_now(&[slots]).leases;
    clock.advance(Duration::from_secs(30));
    let b = store.check_now(&[slots]).leases;
    // One request holding the key twice takes two leases.
    let both = store.check_now(&[slots.with_cost(0), slots]).leases;
    assert_eq!(both.len(), 1, "a cost-0 limit takes no lease");
    assert_ne!(a[0].id, b[0].id);
    assert_eq!((a[0].key.as_str(), a[0].cost), ("jobs", 1));
    store.release_now(&both);
    store.release_now(&b);
    // A's lease is left, and still lapses at A's time: a minute after A.
    assert_eq!(
        store.check_now(&[slots.with_cost(0)]).decisions[0].remaining(),
        2
    );
    clock.advance(Duration::from_nanos(29_999_999_999));
    assert_eq!(
        store.check_now(&[slots.with_cost(0)]).decisions[0].remaining(),
        2
    );
    clock.advance(Duration::from_nanos(1));
    assert_eq!(
        store.check_now(&[slots.with_cost(0)]).decisions[0].remaining(),
        3
    );
    // Ids of another store, another key, or not this store's kind do nothing.
    let c = store.check_now(&[slots]).leases;
    let other = store
        .check_now(&[limit(
            "other",
            Quota::per_minute(3).unwrap(),
            Algorithm::Concurrency,
        )])
        .leases;
    let mut misnamed = c[0].clone();
    misnamed.id = other[0].id.clone();
    let mut foreign = c[0].clone();
    foreign.id = "not-ours".parse().unwrap();
    store.release_now(&[misnamed, foreign]);
    assert_eq!(
        store.check_now(&[slots.with_cost(0)]).decisions[0].remaining(),
        2
    );
}

#[test]
fn threads_sharing_a_key_admit_exactly_the_burst() {
    let (store, _) = store(MemoryConfig::default());
    let store = Arc::new(store);
    let q = per_second(1000);
    let admitted: usize = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                (0..1000)
                    .filter(|_| {
                        let hot = limit("hot", q, Algorithm::TokenBucket);
                        let layer = limit("layer", q, Algorithm::SlidingLog);
                        store.check_now(&[hot, layer]).allowed()
                    })
                    .count()
            })
        })
        .map(|t| t.join().unwrap())
        .sum();
    assert_eq!(admitted, 1000);
}

/// What any faster path for one-integer states (GCRA, shaping) must keep:
/// under threads racing on one key, single-limit checks, multi-limit checks
/// that another limit denies, sweeps and evictions of other keys together
/// admit exactly the key's burst, and a multi-limit check denied elsewhere
/// takes nothing from it.
#[test]
fn racing_single_and_multi_limit_checks_admit_exactly_the_burst() {
    let burst = 3_000;
    let (store, clock) = store(MemoryConfig {
        // Small enough that the flood below fills it and evicts.
        max_keys: 256,
        shards: 4,
        ..MemoryConfig::default()
    });
    // One more per hour: the 20 ms the flood moves the clock adds nothing.
    let hot = Quota::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(burst)
        .unwrap();
    // Back to full a millisecond after its one admission.
    let brief = Quota::new(1, Duration::from_millis(1)).unwrap();
    // Admits 500 of the multi-limit checks (the 20 ms stay in one window)
    // and denies the rest, each of which must then give back what it took
    // from the hot key.
    let gate = per_second(500);
    let algorithms = [
        Algorithm::Gcra,
        Algorithm::LeakyBucketShaping { delay_after: burst },
        Algorithm::TokenBucket,
    ];
    // Races are rare per run: a few rounds each.
    for algorithm in algorithms.into_iter().flat_map(|a| [a; 4]) {
        // The last round's flood comes to rest and is swept, so that both
        // keys are let in before this round's flood fills their shards
        // (with the shards full of keys not at rest, a new key may be
        // refused, as it should be).
        clock.advance(Duration::from_millis(1));
        store.sweep();
        let charged = [
            limit("hot", hot, algorithm),
            limit("gate", gate, Algorithm::FixedWindow),
        ];
        assert!(store.check_now(&charged).allowed(), "{algorithm:?}");
        let (store, clock) = (&store, &clock);
        let admitted: u64 = std::thread::scope(|scope| {
            let single: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(move || {
                        (0..2_000)
                            .filter(|_| store.check_now(&[limit("hot", hot, algorithm)]).allowed())
                            .count() as u64
                    })
                })
                .collect();
            let multi: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(move || {
                        (0..2_000)
                            .filter(|_| {
                                let both = [
                                    limit("hot", hot, algorithm),
                                    limit("gate", gate, Algorithm::FixedWindow),
                                ];
                                store.check_now(&both).allowed()
                            })
                            .count() as u64
                    })
                })
                .collect();
            let churn = scope.spawn(move || {
                for i in 0..2_000 {
                    let key = format!("flood:{i}");
                    store.check_now(&[limit(&key, brief, algorithm)]);
                    if i % 100 == 0 {
                        clock.advance(Duration::from_millis(1));
                    }
                    if i % 500 == 0 {
                        store.sweep();
                    }
                }
            });
            let admitted = single
                .into_iter()
                .chain(multi)
                .map(|t| t.join().unwrap())
                .sum();
            churn.join().unwrap();
            admitted
        });
        assert_eq!(admitted, burst - 1, "{algorithm:?}");
        let after = store.check_now(&[limit("hot", hot, algorithm).with_cost(0)]);
        assert_eq!(after.decisions[0].remaining(), 0, "{algorithm:?}");
        store.reset_now(&charged);
    }
    assert!(
        store.stats().evictions > 0,
        "the flood made room by evicting"
    );
}

#[test]
fn the_store_trait_answers_without_an_executor_wait() {
    let (store, _) = store(MemoryConfig::default());
    let limits = [limit("k", per_second(1), Algorithm::FixedWindow)];
    let mut check = std::pin::pin!(store.check(&limits));
    let waker = std::task::Waker::noop();
    let polled = check
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker));
    match polled {
        std::task::Poll::Ready(Ok(outcome)) => assert!(outcome.allowed()),
        other => panic!("memory store should be ready at once, got {other:?}"),
    }
}

#[test]
fn the_store_trait_check_consumes_once_when_polled_and_not_before() {
    let (store, _) = store(MemoryConfig::default());
    let limits = [limit("k", per_second(1), Algorithm::Gcra)];
    // Made and dropped unpolled: a future that was never run took nothing.
    drop(store.check(&limits));
    let waker = std::task::Waker::noop();
    let mut check = std::pin::pin!(store.check(&limits));
    let polled = check
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker));
    assert!(matches!(polled, std::task::Poll::Ready(Ok(ref o)) if o.allowed()));
    // Polled again after it completed, it panics rather than checking again.
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = check
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker));
    }));
    assert!(again.is_err());
    // The one unit of the burst went to the one poll that checked.
    let next = store.check_now(&limits);
    assert!(!next.allowed());
}

use std::future::Future;
