//! A failure domain the size of a node: a Redis Cluster master killed under
//! load, its replica promoted. The fallback's breaker is per range of slots
//! (`Store::domain`), so only the dead master's keys are decided locally;
//! keys on the other masters keep Redis's exact decisions throughout, and
//! the dead master's keys return to Redis once its replica serves them.
//!
//! Time for the limits is a frozen manual clock, so a key admits exactly its
//! burst from Redis and nothing more: a key decided locally even once would
//! show in the count. The test waits (bounded polls) only for the cluster's
//! failover, which takes its node timeout (2 s) and an election.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, LeaseStore, Limit, Quota};
use tollgate_redis::{FailurePolicy, RedisStore};
use tollgate_store::conformance;
use tollgate_store::{BreakerState, Fallback, FallbackConfig};

use crate::support::{RedisCluster, manual_store_with};

const BURST: u64 = 20;

/// Per key: checks Redis decided, checks decided without it, admits.
#[derive(Default)]
struct Tally {
    redis: AtomicU64,
    local: AtomicU64,
    admitted: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_sends_only_its_own_keys_to_the_fallback_until_its_replica_serves_them() {
    // Without it, every master refuses every key (CLUSTERDOWN) from the
    // moment the dead one is marked failed until its replica is promoted.
    let mut cluster = RedisCluster::with_replicas(&["--cluster-require-full-coverage", "no"]);
    let clock = conformance::clock();
    let timeout = Duration::from_millis(200);
    let redis = manual_store_with(&cluster.url(), &clock, |c| c.timeout = timeout).await;
    let config = FallbackConfig {
        timeout,
        breaker_failures: 3,
        breaker_cool_down: Duration::from_millis(100),
        ..FallbackConfig::default()
    };
    let store: Arc<Fallback<RedisStore>> =
        Arc::new(Fallback::with_clock(redis, config, Arc::clone(&clock) as _));

    const VICTIM: usize = 1;
    let victim_slots = cluster.slots_of(VICTIM);
    assert!(!victim_slots.is_empty(), "node {VICTIM} is a master");
    let keys: Vec<String> = (0..30).map(|i| format!("tenant-{i}")).collect();
    let on_victim: Vec<bool> = keys
        .iter()
        .map(|k| {
            let slot = cluster.keyslot(k);
            victim_slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
        })
        .collect();
    assert!(
        on_victim.iter().any(|&v| v) && on_victim.iter().any(|&v| !v),
        "keys on the victim and elsewhere: {on_victim:?}"
    );

    let tallies: Arc<Vec<Tally>> = Arc::new(keys.iter().map(|_| Tally::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (store, stop, tallies, keys) = (
                Arc::clone(&store),
                Arc::clone(&stop),
                Arc::clone(&tallies),
                keys.clone(),
            );
            tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % keys.len();
                    i += 1;
                    let limit = Limit::new(
                        &keys[k],
                        Quota::per_second(10).unwrap().with_burst(BURST).unwrap(),
                        Algorithm::Gcra,
                    )
                    .with_failure(FailurePolicy::Local);
                    let stamped = store
                        .check_stamped(&[limit])
                        .await
                        .expect("a check never errs because a node is down");
                    let tally = &tallies[k];
                    match stamped.decided_at {
                        Some(_) => tally.redis.fetch_add(1, Ordering::Relaxed),
                        None => tally.local.fetch_add(1, Ordering::Relaxed),
                    };
                    if stamped.outcome.allowed() {
                        tally.admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    let sum = |victim: bool, f: fn(&Tally) -> u64| -> u64 {
        tallies
            .iter()
            .zip(&on_victim)
            .filter(|(_, v)| **v == victim)
            .map(|(t, _)| f(t))
            .sum()
    };
    let redis_of = |t: &Tally| t.redis.load(Ordering::Relaxed);
    let local_of = |t: &Tally| t.local.load(Ordering::Relaxed);
    let poll = async |what: &str, limit: Duration, f: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < limit, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    poll(
        "Redis to decide every key",
        Duration::from_secs(10),
        &|| tallies.iter().all(|t| redis_of(t) >= 3),
    )
    .await;

    cluster.nodes[VICTIM].kill();
    let killed = Instant::now();
    let victim_range = format!("{}-{}", victim_slots[0].0, victim_slots[0].1);
    poll(
        "the dead master's breaker to open",
        Duration::from_secs(10),
        &|| {
            store
                .parts()
                .iter()
                .any(|(name, state)| **name == *victim_range && *state != BreakerState::Closed)
        },
    )
    .await;
    let open: Vec<_> = store
        .parts()
        .into_iter()
        .filter(|(_, state)| *state != BreakerState::Closed)
        .collect();
    assert!(
        open.iter().all(|(name, _)| victim_slots
            .iter()
            .any(|&(a, b)| **name == *format!("{a}-{b}"))),
        "only the dead master's ranges are open: {open:?}"
    );

    // Its replica takes over (node timeout 2 s and an election); the probe
    // closes the breaker, and its keys are Redis's again.
    let local_at_kill = sum(true, local_of);
    let redis_before = sum(true, redis_of);
    poll(
        "the replica to serve the dead master's keys",
        Duration::from_secs(30),
        &|| {
            store
                .parts()
                .iter()
                .all(|(_, s)| *s == BreakerState::Closed)
                && sum(true, redis_of) > redis_before + 20
        },
    )
    .await;
    let back = killed.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a check task panicked");
    }

    let (healthy_redis, healthy_local) = (sum(false, redis_of), sum(false, local_of));
    let (victim_redis, victim_local) = (sum(true, redis_of), sum(true, local_of));
    eprintln!(
        "killed master served {victim_range}; decisions back from Redis {back:?} after the kill; \
         keys on healthy masters: {healthy_redis} Redis, {healthy_local} local; \
         keys on the dead master: {victim_redis} Redis, {victim_local} local \
         ({local_at_kill} local when its breaker opened)"
    );
    assert_eq!(healthy_local, 0, "keys on healthy masters never fall back");
    assert!(victim_local > 0, "the dead master's keys fell back");
    for ((key, tally), victim) in keys.iter().zip(tallies.iter()).zip(&on_victim) {
        let admitted = tally.admitted.load(Ordering::Relaxed);
        if *victim {
            // Redis's burst before the kill (kept by the replica, or not if
            // replication lagged), and the local store seeded with what Redis
            // last reported: at most two bursts.
            assert!(admitted <= 2 * BURST, "{key}: {admitted}");
        } else {
            assert_eq!(admitted, BURST, "{key}: exact, Redis's alone");
        }
    }
}
