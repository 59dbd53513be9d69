//! What the Redis tests share: the real servers of `tollgate-testkit`, and
//! stores on them under a manual clock.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, ManualClock, Quota, Store};
use tollgate_redis::{RedisConfig, RedisStore, TimeSource};
use tollgate_store::conformance::{Scenario, scenarios};
use tollgate_store::{Hybrid, HybridConfig};

pub(crate) use tollgate_testkit::{RedisCluster, RedisServer, cli, free_port, wait_until};

/// The conformance scenarios as the Redis store is held to them. In Redis a
/// fixed window's or hit counter's state is a count per window, which a
/// check alone updates with a blind `INCRBY` (no script), so a request
/// counts in the window of its own time; the memory store stays in the
/// window of the latest time it saw. The two agree while the clock never
/// goes back, so scenarios with those algorithms run on such a clock
/// (their setting back is pinned by `native.rs`); every other scenario runs
/// as it is.
pub(crate) fn redis_scenarios() -> Vec<Scenario> {
    scenarios()
        .into_iter()
        .map(|scenario| {
            let counted = scenario.limits.iter().any(|(_, _, algorithm)| {
                matches!(algorithm, Algorithm::FixedWindow | Algorithm::HitCounter)
            });
            if counted {
                scenario.monotonic()
            } else {
                scenario
            }
        })
        .collect()
}

/// A store on `url` with an injected manual clock, a timeout long enough that a
/// busy test machine never times out, and TTLs padded so keys never expire in
/// real time under the manual clock.
pub(crate) async fn manual_store(url: &str, clock: &Arc<ManualClock>) -> RedisStore {
    manual_store_with(url, clock, |_| {}).await
}

pub(crate) async fn manual_store_with(
    url: &str,
    clock: &Arc<ManualClock>,
    tweak: impl FnOnce(&mut RedisConfig),
) -> RedisStore {
    let mut config = RedisConfig {
        time: TimeSource::Clock(Arc::clone(clock) as _),
        timeout: Duration::from_secs(5),
        extra_ttl: Duration::from_secs(600),
        ..RedisConfig::default()
    };
    tweak(&mut config);
    RedisStore::connect(url, config)
        .await
        .expect("connect to the test Redis")
}

/// The `FCALL`s a server ran since its stats were last reset.
pub(crate) fn fcalls(server: &RedisServer) -> usize {
    usize::try_from(server.command_calls("fcall")).unwrap_or(usize::MAX)
}

/// A GCRA limit on `key` of capacity 10,000 (no refill: the tests' clock
/// never moves).
pub(crate) fn gcra_of_10_000(key: &str) -> Limit<'_> {
    Limit {
        key,
        quota: Quota::per_hour(10_000).unwrap(),
        algorithm: Algorithm::Gcra,
        cost: 1,
        failure: FailurePolicy::Local,
    }
}

/// Units a hybrid instance leases at most of [`gcra_of_10_000`]: 0.5%.
pub(crate) const MAX_LEASE: u64 = 50;

/// A hybrid instance over `server` on a frozen clock, leasing at most
/// [`MAX_LEASE`] units of a [`gcra_of_10_000`] key.
pub(crate) async fn hybrid_of(server: &RedisServer) -> Arc<Hybrid<RedisStore>> {
    let clock = tollgate_store::conformance::clock();
    let redis = manual_store(&server.url(), &clock).await;
    let config = HybridConfig {
        max_lease_fraction: 0.005,
        ..HybridConfig::default()
    };
    Arc::new(Hybrid::with_clock(redis, config, clock as _))
}

/// Concurrent checks share calls (batches; on a cluster, across the slots
/// of a node), with every algorithm in one call: string states read before
/// anything is checked, beside sliding logs' and concurrency limiters' two
/// keys, several requests on one key, leases with their own ids. On a frozen
/// clock, each key admits exactly its capacity however its checks were
/// batched, as the memory store does; every lease taken is released, after
/// which the limiters admit their capacity again. `calls` counts the calls
/// Redis ran (since its stats were reset): fewer than the checks.
pub(crate) async fn batched_checks_decide_as_alone(url: &str, calls: impl Fn() -> usize) {
    use std::collections::{BTreeMap, HashSet};
    use tollgate_core::{Algorithm, FailurePolicy, Lease, Limit, Quota};

    let clock = tollgate_store::conformance::clock();
    let store = Arc::new(manual_store(url, &clock).await);
    let quota = Quota::per_hour(6).unwrap();
    let limit = |key: &str, algorithm, cost| Limit {
        key: key.to_owned().leak(),
        quota,
        algorithm,
        cost,
        failure: FailurePolicy::Local,
    };
    let algorithms: Vec<Algorithm> = Algorithm::RATE
        .into_iter()
        .chain([Algorithm::Concurrency])
        .collect();
    const KEYS: usize = 4;
    const TRIES: usize = 10;
    let tasks: Vec<_> = (0..TRIES)
        .flat_map(|_| algorithms.iter().copied())
        .flat_map(|algorithm| (0..KEYS).map(move |k| (algorithm, k)))
        .map(|(algorithm, k)| {
            let store = Arc::clone(&store);
            let limit = limit(&format!("batched-{algorithm}-{k}"), algorithm, 1);
            tokio::spawn(async move { (algorithm, k, store.check(&[limit]).await) })
        })
        .collect();
    let mut admitted = BTreeMap::new();
    let mut leases: Vec<Lease> = Vec::new();
    for task in tasks {
        let (algorithm, k, outcome) = task.await.unwrap();
        let outcome = outcome.unwrap_or_else(|e| panic!("{algorithm} key {k}: {e}"));
        *admitted.entry((algorithm.to_string(), k)).or_insert(0) += usize::from(outcome.allowed());
        leases.extend(outcome.leases);
    }
    for ((algorithm, k), n) in &admitted {
        assert_eq!(*n, 6, "{algorithm} key {k} admitted {n}");
    }
    let checks = TRIES * algorithms.len() * KEYS;
    let calls = calls();
    assert!(
        calls < checks,
        "{calls} calls for {checks} checks: no batch"
    );
    assert_eq!(leases.len(), 6 * KEYS, "one lease per admitted permit");
    let ids: HashSet<_> = leases.iter().map(|l| l.id.to_string()).collect();
    assert_eq!(ids.len(), leases.len(), "lease ids are distinct");
    store.release(&leases).await.unwrap();
    for k in 0..KEYS {
        let slots = limit(
            &format!("batched-{}-{k}", Algorithm::Concurrency),
            Algorithm::Concurrency,
            0,
        );
        let read = store.check(&[slots]).await.unwrap();
        assert_eq!(
            read.decisions[0].remaining(),
            6,
            "key {k}: every lease came back"
        );
    }
    let stats = store.stats();
    assert_eq!((stats.errors, stats.timeouts), (0, 0), "{stats:?}");
}

/// Waits (a bounded number of looks) until `done` says the store got there:
/// a task of its own, or Redis, which no injected clock can speed up.
pub(crate) async fn eventually<F: Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    for _ in 0..1000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never: {what}");
}

/// Checks `limit` through `hybrid`, every check admitted, at least
/// `at_least` times and until the instance holds nothing: after 200, the
/// key's lease has grown to its cap (each lease spent while live doubles
/// the next), so the next check asks Redis for its unit and a full lease.
/// Answers the checks admitted.
pub(crate) async fn spend_held(
    hybrid: &Hybrid<RedisStore>,
    limit: Limit<'_>,
    at_least: u64,
) -> u64 {
    let mut admitted = 0;
    while admitted < at_least || hybrid.held_units() > 0 {
        assert!(hybrid.check(&[limit]).await.unwrap().allowed());
        admitted += 1;
    }
    admitted
}
