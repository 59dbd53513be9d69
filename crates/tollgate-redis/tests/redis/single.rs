//! One `redis-server`: conformance with the memory store, TTLs, the deny cache
//! over Redis, leases, script reloads and URLs.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{
    Algorithm, Clock, FailurePolicy, Lease, Limit, ManualClock, Quota, Store, StoreError,
};
use tollgate_redis::{ConnectError, RedisConfig, RedisStore};
use tollgate_store::conformance::{self, assert_same, reference, run};
use tollgate_store::{DenyCache, MemoryStore};

use crate::support::{
    RedisServer, batched_checks_decide_as_alone, fcalls, manual_store, manual_store_with,
    redis_scenarios,
};

fn limit(key: &str, quota: Quota, algorithm: Algorithm, cost: u64) -> Limit<'_> {
    Limit {
        key,
        quota,
        algorithm,
        cost,
        failure: FailurePolicy::Local,
    }
}

/// Checks `l` on the Redis store and on the memory reference, and asserts
/// that both decide alike: admitted or not, and what remains.
async fn assert_decides_as_memory(
    store: &RedisStore,
    memory: &MemoryStore<Arc<ManualClock>>,
    l: Limit<'_>,
    what: &str,
) {
    let redis = store.check(&[l]).await.unwrap();
    let reference = memory.check(&[l]).await.unwrap();
    assert_eq!(
        redis.decisions[0].remaining(),
        reference.decisions[0].remaining(),
        "{what}"
    );
    assert_eq!(redis.allowed(), reference.allowed(), "{what}");
}

#[tokio::test]
async fn conformance_single_redis_decides_like_the_memory_store() {
    let server = RedisServer::start();
    for scenario in redis_scenarios() {
        let reference = reference(&scenario).await;
        let clock = conformance::clock();
        let redis = manual_store(&server.url(), &clock).await;
        let actual = run(&redis, &clock, &scenario).await;
        assert_same(&scenario, &reference, &actual, "single Redis");
        let stats = redis.stats();
        assert_eq!((stats.errors, stats.timeouts), (0, 0));
    }
    let clock = conformance::clock();
    let redis = manual_store(&server.url(), &clock).await;
    conformance::assert_reset_forgets(&redis, "single").await;
}

#[tokio::test]
async fn ttls_are_the_time_to_full_and_denies_never_extend_them() {
    let server = RedisServer::start();
    let store = RedisStore::connect(
        &server.url(),
        RedisConfig {
            timeout: Duration::from_secs(5),
            ..RedisConfig::default()
        },
    )
    .await
    .unwrap();
    let pttl = |key: &str| server.cli(&["PTTL", key]).trim().parse::<i64>().unwrap();
    // GCRA, 3 a minute, burst 3: each admission adds 20 s until full (so
    // however slow the machine, nothing refills during the test).
    let q = Quota::per_minute(3).unwrap();
    let gcra = limit("user:7", q, Algorithm::Gcra, 1);
    assert!(store.check(&[gcra]).await.unwrap().allowed());
    let key = "tollgate:gcra2:{user:7}";
    assert_eq!(
        server.cli(&["OBJECT", "ENCODING", key]).trim(),
        "int",
        "GCRA's state is one integer, held in the value's pointer"
    );
    let t = pttl(key);
    assert!(
        (10_000..=20_000).contains(&t),
        "PTTL {t} after one admission"
    );
    store.check(&[gcra, gcra]).await.unwrap();
    let full = pttl(key);
    assert!((50_000..=60_000).contains(&full), "PTTL {full} after three");
    let denied = store.check(&[gcra]).await.unwrap();
    assert!(!denied.allowed());
    assert!(pttl(key) <= full, "a deny extended the TTL");
    // A read stores nothing.
    store
        .check(&[limit("fresh", q, Algorithm::Gcra, 0)])
        .await
        .unwrap();
    assert_eq!(
        server.cli(&["EXISTS", "tollgate:gcra2:{fresh}"]).trim(),
        "0"
    );
    // Sliding log: both keys live one period after an admission.
    let log = limit(
        "{u}log",
        Quota::per_minute(5).unwrap(),
        Algorithm::SlidingLog,
        1,
    );
    store.check(&[log]).await.unwrap();
    for key in ["tollgate:log:{u}:log", "tollgate:log.n:{u}:log"] {
        let t = pttl(key);
        assert!((59_000..=60_000).contains(&t), "{key}: PTTL {t}");
    }
    // Concurrency leases live for the quota's period.
    let slots = limit(
        "slots",
        Quota::per_minute(2).unwrap(),
        Algorithm::Concurrency,
        1,
    );
    store.check(&[slots]).await.unwrap();
    let t = pttl("tollgate:lease:{slots}");
    assert!((59_000..=60_000).contains(&t), "lease PTTL {t}");
    // Redis's own TIME decides: 3 at once, then a retry of at most 20 s.
    assert_eq!(denied.decisions[0].limit(), 3);
    let retry = denied.decisions[0].retry_after().unwrap();
    assert!(
        retry <= Duration::from_secs(20) && retry > Duration::ZERO,
        "{retry:?}"
    );
}

#[tokio::test]
async fn a_release_removes_exactly_the_member_its_lease_names() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    let slots = limit(
        "{s}slots",
        Quota::per_minute(4).unwrap(),
        Algorithm::Concurrency,
        2,
    );
    let a = store.check(&[slots]).await.unwrap().leases;
    let b = store.check(&[slots]).await.unwrap().leases;
    let members = || {
        let mut listed: Vec<String> = server
            .cli(&["ZRANGE", "tollgate:lease:{s}:slots", "0", "-1"])
            .lines()
            .map(str::to_owned)
            .collect();
        listed.sort();
        listed
    };
    let member = |lease: &[Lease]| format!("2|{}", lease[0].id);
    let mut both = vec![member(&a), member(&b)];
    both.sort();
    assert_eq!(members(), both, "each lease's id is its member");
    // Another instance sharing the Redis releases it: the lease is a value.
    let elsewhere = manual_store(&server.url(), &clock).await;
    elsewhere.release(&b).await.unwrap();
    assert_eq!(members(), [member(&a)]);
    assert_eq!(
        server.cli(&["GET", "tollgate:lease.n:{s}:slots"]).trim(),
        "2"
    );
    // Again, or at another cost (another member), nothing more goes.
    elsewhere.release(&b).await.unwrap();
    let cheaper = Lease {
        cost: 1,
        ..a[0].clone()
    };
    elsewhere.release(&[cheaper]).await.unwrap();
    assert_eq!(members(), [member(&a)]);
    assert_eq!(
        server.cli(&["GET", "tollgate:lease.n:{s}:slots"]).trim(),
        "2"
    );
}

#[tokio::test]
async fn the_deny_cache_answers_hot_denied_keys_without_redis() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let redis = manual_store(&server.url(), &clock).await;
    let store = DenyCache::with_clock(redis, 1024, Arc::clone(&clock) as _);
    let q = Quota::per_second(10).unwrap().with_burst(2).unwrap();
    let hot = limit("hot", q, Algorithm::Gcra, 1);
    let other = limit(
        "other",
        Quota::per_second(100).unwrap(),
        Algorithm::FixedWindow,
        1,
    );
    assert!(store.check(&[hot, hot]).await.unwrap().allowed());
    let denied = store.check(&[hot, other]).await.unwrap();
    assert!(!denied.allowed());
    assert_eq!(
        denied.decisions[0].retry_after(),
        Some(Duration::from_millis(100))
    );
    let before = (store.stats(), store.inner().stats());
    clock.advance(Duration::from_millis(40));
    for cost in [1, 2] {
        let cached = store
            .check(&[limit("hot", q, Algorithm::Gcra, cost), other])
            .await
            .unwrap();
        assert!(!cached.allowed());
        assert_eq!(
            cached.decisions[0].retry_after(),
            Some(Duration::from_millis(60))
        );
        // `other` is read, not charged, and reported as a denied check's
        // admitting limit is: what it would have left after this request.
        assert_eq!(cached.decisions[1].remaining(), 99);
    }
    let after = store.inner().stats();
    assert_eq!(
        after.redis_checks,
        before.1.redis_checks + 2,
        "no Redis check of the cached key: one read of `other` each"
    );
    assert_eq!(store.stats().hits, before.0.hits + 2);
    // A cheaper request or another quota on the key is not "the same request".
    let read = store
        .check(&[limit("hot", q, Algorithm::Gcra, 0)])
        .await
        .unwrap();
    assert!(read.allowed());
    assert_eq!(store.inner().stats().redis_checks, after.redis_checks + 1);
    // Once retry_after passes, Redis decides again, and admits.
    clock.advance(Duration::from_millis(60));
    assert!(store.check(&[hot]).await.unwrap().allowed());
    assert_eq!(store.inner().stats().redis_checks, after.redis_checks + 2);
    // The denied request consumed nothing from `other`: 100 - 1 = 99 left after
    // the first check's admission... and the cached one never reached Redis.
    let read = store
        .check(&[limit(
            "other",
            Quota::per_second(100).unwrap(),
            Algorithm::FixedWindow,
            0,
        )])
        .await
        .unwrap();
    assert_eq!(read.decisions[0].remaining(), 100);
}

#[tokio::test]
async fn concurrency_leases_are_released_by_their_holder_and_expire_when_it_crashes() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let a = manual_store(&server.url(), &clock).await;
    let b = manual_store(&server.url(), &clock).await;
    let slots = limit(
        "uploads",
        Quota::per_minute(2).unwrap(),
        Algorithm::Concurrency,
        1,
    );
    assert!(a.check(&[slots]).await.unwrap().allowed());
    let held = b.check(&[slots]).await.unwrap().leases;
    let denied = a.check(&[slots]).await.unwrap();
    assert!(!denied.allowed());
    assert_eq!(denied.decisions[0].retry_after(), None);
    // b's lease goes back, once: a second release frees nothing of a's.
    b.release(&held).await.unwrap();
    b.release(&held).await.unwrap();
    assert!(b.check(&[slots]).await.unwrap().allowed());
    assert!(!b.check(&[slots]).await.unwrap().allowed());
    // Both holders "crash" (never release): their leases expire after the period.
    clock.advance(Duration::from_secs(59));
    assert!(!a.check(&[slots]).await.unwrap().allowed());
    clock.advance(Duration::from_secs(1));
    let after = a.check(&[slots, slots]).await.unwrap();
    assert!(after.allowed(), "expired leases free their permits");
    assert_eq!(after.decisions[1].remaining(), 0);
}

#[tokio::test]
async fn quotas_beyond_exact_doubles_are_invalid_input_not_backend_errors() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    let huge = Quota::new(1 << 53, Duration::from_secs(1 << 30)).unwrap();
    let err = store
        .check(&[limit("k", huge, Algorithm::FixedWindow, 1)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert!(!err.is_retryable());
    // A large but exact sliding counter is fine: a million a day, whose
    // weighting multiplies counts by microseconds beyond 2^53.
    let memory = MemoryStore::with_clock(conformance::memory_config(), Arc::clone(&clock));
    let daily = Quota::new(1_000_000, Duration::from_secs(86_400)).unwrap();
    let big = limit("daily", daily, Algorithm::SlidingCounter, 999_999);
    assert!(store.check(&[big]).await.unwrap().allowed());
    assert!(memory.check_now(&[big]).allowed());
    for step in [86_400 - 3_601, 7_207, 1, 3_333] {
        clock.advance(Duration::from_secs(step) + Duration::from_micros(step));
        for cost in [0, 1, 40_000, 500_000] {
            let l = limit("daily", daily, Algorithm::SlidingCounter, cost);
            let redis = store.check(&[l]).await.unwrap();
            let reference = memory.check_now(&[l]);
            let ceil = |d: Duration| Duration::from_micros(d.as_nanos().div_ceil(1000) as u64);
            assert_eq!(
                redis.decisions[0].allowed(),
                reference.decisions[0].allowed()
            );
            assert_eq!(
                redis.decisions[0].remaining(),
                reference.decisions[0].remaining()
            );
            assert_eq!(
                redis.decisions[0].retry_after(),
                reference.decisions[0].retry_after().map(ceil)
            );
        }
    }
}

/// Where the server has functions (Redis ≥ 7.0, as on every machine the
/// suite runs on), the code is a function library; a flush of it (or of the
/// script cache, for a store told to use scripts) is survived by loading it
/// again, with no check lost or failed.
#[tokio::test]
async fn the_code_is_a_function_and_either_kind_survives_a_flush() {
    let server = RedisServer::start();
    let version = server.cli(&["INFO", "server"]);
    let major: u32 = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO server gives redis_version");
    assert!(major >= 7, "the suite runs on Redis 7 or later: {version}");
    let clock = conformance::clock();
    for functions in [true, false] {
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
        let store = manual_store_with(&server.url(), &clock, |c| c.functions = functions).await;
        assert_eq!(store.uses_functions(), functions);
        let q = Quota::per_second(5).unwrap();
        let key = format!("flushed-{functions}");
        let l = limit(&key, q, Algorithm::TokenBucket, 1);
        assert_eq!(store.check(&[l]).await.unwrap().decisions[0].remaining(), 4);
        let flush = if functions { "FUNCTION" } else { "SCRIPT" };
        assert_eq!(server.cli(&[flush, "FLUSH"]).trim(), "OK");
        if functions {
            assert_eq!(server.cli(&["FUNCTION", "LIST"]).trim(), "");
        }
        assert_eq!(store.check(&[l]).await.unwrap().decisions[0].remaining(), 3);
        let stats = store.stats();
        assert_eq!((stats.timeouts, stats.errors), (0, 0));
        let commands = server.cli(&["INFO", "commandstats"]);
        let called = |command: &str| commands.contains(&format!("cmdstat_{command}:calls="));
        assert_eq!(
            (called("fcall"), called("evalsha")),
            (functions, !functions),
            "{commands}"
        );
    }
    assert!(server.cli(&["FUNCTION", "LIST"]).contains("tollgate_"));
}

#[tokio::test]
async fn urls_are_checked() {
    let err = RedisStore::connect("http://localhost:6379", RedisConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::InvalidUrl { .. }), "{err}");
    let err = RedisStore::connect("redis+cluster://", RedisConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ConnectError::InvalidUrl { .. }), "{err}");
    let err = RedisStore::connect(
        "redis://127.0.0.1:1/0",
        RedisConfig {
            prefix: "a{b}".into(),
            ..RedisConfig::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ConnectError::Config(_)), "{err}");
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), RedisConfig::default())
        .await
        .unwrap();
    assert!(!store.is_cluster());
}

#[tokio::test]
async fn the_store_trait_is_implemented() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    let l = [limit(
        "trait",
        Quota::per_second(1).unwrap(),
        Algorithm::Gcra,
        1,
    )];
    assert!(Store::check(&store, &l).await.unwrap().allowed());
    assert!(!Store::check(&store, &l).await.unwrap().allowed());
    let slots = [limit(
        "trait-slots",
        Quota::per_second(1).unwrap(),
        Algorithm::Concurrency,
        1,
    )];
    let leases = Store::check(&store, &slots).await.unwrap().leases;
    assert!(!Store::check(&store, &slots).await.unwrap().allowed());
    Store::release(&store, &leases).await.unwrap();
    assert!(Store::check(&store, &slots).await.unwrap().allowed());
    assert!(
        Store::check(&store, &[])
            .await
            .unwrap()
            .decisions
            .is_empty()
    );
}

/// Concurrent checks share calls, whatever their algorithms; see
/// `support::batched_checks_decide_as_alone`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_checks_of_every_algorithm_decide_as_checked_alone() {
    let server = RedisServer::start();
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    batched_checks_decide_as_alone(&server.url(), || fcalls(&server)).await;
}

/// States are stored as small as Redis holds them: GCRA's time and a
/// window's count as integers (no allocation), a time and an amount in 12
/// bytes, and in two doubles (16 bytes) once the amount reaches 2^40; each
/// is read back exactly as the memory store decides.
#[tokio::test]
async fn states_take_the_smallest_encoding_that_holds_them() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    let memory = MemoryStore::with_clock(Default::default(), Arc::clone(&clock));
    let month = Duration::from_secs(30 * 86_400);
    let cases = [
        (
            "small",
            Quota::per_second(100).unwrap(),
            Algorithm::TokenBucket,
            1,
            "tb2",
            12,
        ),
        // Capacity 30 days > 2^40 µs.
        (
            "wide",
            Quota::new(1000, month).unwrap(),
            Algorithm::TokenBucket,
            1,
            "tb2",
            16,
        ),
        (
            "level",
            Quota::per_second(100).unwrap(),
            Algorithm::LeakyBucket,
            3,
            "lb2",
            12,
        ),
        (
            "count",
            Quota::new(1 << 42, month).unwrap(),
            Algorithm::FixedWindow,
            1 << 41,
            "fw3",
            0,
        ),
        (
            "few",
            Quota::per_minute(10).unwrap(),
            Algorithm::HitCounter,
            2,
            "hc3",
            0,
        ),
        (
            "tat",
            Quota::per_minute(10).unwrap(),
            Algorithm::Gcra,
            1,
            "gcra2",
            0,
        ),
    ];
    for (key, quota, algorithm, cost, segment, bytes) in cases {
        let l = limit(key, quota, algorithm, cost);
        for round in 0..2 {
            assert_decides_as_memory(&store, &memory, l, &format!("{key} {round}")).await;
            clock.advance(Duration::from_millis(7));
        }
        let mut redis_key = format!("tollgate:{segment}:{{{key}}}");
        if matches!(algorithm, Algorithm::FixedWindow | Algorithm::HitCounter) {
            // One count per window: `:` and the window's number.
            let window = clock.now() / quota.period_ns();
            redis_key = format!("{redis_key}:{window}");
        }
        if bytes == 0 {
            assert_eq!(
                server.cli(&["OBJECT", "ENCODING", &redis_key]).trim(),
                "int",
                "{key}"
            );
        } else {
            let len: usize = server.cli(&["STRLEN", &redis_key]).trim().parse().unwrap();
            assert_eq!(len, bytes, "{key}");
        }
    }
}

/// The Lua code keeps what a request staged for its limits in tables that
/// outlive a call: a call that fails half-way (here a sliding log whose key
/// holds a string, after the GCRA limit beside it was stepped) must leave
/// nothing the next call reads, which decides as if the failed one never
/// ran.
#[tokio::test]
async fn a_call_that_fails_half_way_leaves_no_state_to_the_next() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    let memory = MemoryStore::with_clock(Default::default(), Arc::clone(&clock));
    let quota = Quota::per_minute(10).unwrap();
    let gcra = limit("{t}a", quota, Algorithm::Gcra, 1);
    let log = limit("{t}b", quota, Algorithm::SlidingLog, 1);
    assert_eq!(
        server
            .cli(&["SET", "tollgate:log:{t}:b", "not a sorted set"])
            .trim(),
        "OK"
    );
    assert!(store.check(&[gcra, log]).await.is_err());
    for round in 0..3 {
        assert_decides_as_memory(&store, &memory, gcra, &format!("round {round}")).await;
    }
}
