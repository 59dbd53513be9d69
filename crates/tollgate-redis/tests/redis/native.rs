//! Counting without a script: a fixed window or hit counter checked alone is
//! `INCRBY` and `PEXPIRE … NX` on its window's count, which the Lua code
//! steps too when the limit is checked beside others.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, Clock, FailurePolicy, Limit, Quota, Store};
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_store::MemoryStore;
use tollgate_store::conformance;

use crate::support::{RedisServer, manual_store, manual_store_with};

fn limit(key: &str, quota: Quota, algorithm: Algorithm, cost: u64) -> Limit<'_> {
    Limit {
        key,
        quota,
        algorithm,
        cost,
        failure: FailurePolicy::Local,
    }
}

/// The window's count key of a limit at the clock's time.
fn window_key(segment: &str, key: &str, quota: Quota, now_ns: u64) -> String {
    format!(
        "tollgate:{segment}:{{{key}}}:{}",
        now_ns / quota.period_ns()
    )
}

/// Checks alone go without a script, checks beside others through it, and
/// both count on one state: every decision is the memory store's.
#[tokio::test]
async fn a_limit_alone_is_counted_natively_on_the_count_the_script_steps() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    let memory = MemoryStore::with_clock(Default::default(), Arc::clone(&clock));
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    let quota = Quota::per_second(5).unwrap();
    let other = limit(
        "{n}other",
        Quota::per_second(100).unwrap(),
        Algorithm::Gcra,
        1,
    );
    for algorithm in [Algorithm::FixedWindow, Algorithm::HitCounter] {
        let key = format!("{{n}}{algorithm}");
        for (round, cost) in [1, 2, 1, 0, 1, 3, 1, 1].into_iter().enumerate() {
            let counted = limit(&key, quota, algorithm, cost);
            let limits = if round % 3 == 2 {
                vec![counted, other]
            } else {
                vec![counted]
            };
            let got = store.check(&limits).await.unwrap();
            let want = memory.check(&limits).await.unwrap();
            assert_eq!(got.decisions, want.decisions, "{algorithm}, round {round}");
            clock.advance(Duration::from_millis(50));
        }
    }
    // Per algorithm: five checks alone of a non-zero cost, the first making
    // the window's count (`SET … NX PX`), the others each an INCRBY (the
    // read of cost 0 a GET), and two beside the GCRA limit, each an FCALL.
    assert_eq!(server.command_calls("incrby"), 2 * 4);
    assert_eq!(server.command_calls("fcall"), 2 * 2);
}

/// A fixed window gives a denied check's units back; a hit counter keeps
/// them (envoyproxy/ratelimit's counting). The TTL ends with the window and
/// a deny does not move it.
#[tokio::test]
async fn a_denied_fixed_window_gives_its_units_back_and_a_hit_counter_keeps_them() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    clock.advance(Duration::from_millis(250));
    let store = manual_store_with(&server.url(), &clock, |c| c.extra_ttl = Duration::ZERO).await;
    let memory = MemoryStore::with_clock(Default::default(), Arc::clone(&clock));
    let quota = Quota::per_second(3).unwrap();
    for (algorithm, segment, count_after) in [
        (Algorithm::FixedWindow, "fw3", "2"),
        (Algorithm::HitCounter, "hc3", "4"),
    ] {
        let key = format!("back-{algorithm}");
        let redis_key = window_key(segment, &key, quota, clock.now());
        let mut ttls = Vec::new();
        for cost in [2, 2] {
            let l = limit(&key, quota, algorithm, cost);
            let got = store.check(&[l]).await.unwrap();
            let want = memory.check(&[l]).await.unwrap();
            assert_eq!(got.decisions, want.decisions, "{algorithm}, cost {cost}");
            let ttl: u64 = server.cli(&["PTTL", &redis_key]).trim().parse().unwrap();
            assert!((1..=750).contains(&ttl), "{algorithm}: TTL {ttl} ms");
            ttls.push(ttl);
        }
        assert!(ttls[1] <= ttls[0], "{algorithm}: a deny moved the TTL");
        assert_eq!(server.cli(&["GET", &redis_key]).trim(), count_after);
        let l = limit(&key, quota, algorithm, 1);
        let got = store.check(&[l]).await.unwrap();
        let want = memory.check(&[l]).await.unwrap();
        assert_eq!(got.decisions, want.decisions, "{algorithm}, after");
        assert_eq!(got.allowed(), algorithm == Algorithm::FixedWindow);
    }
}

/// What native counting cannot do: keep the window of the latest time seen
/// when the clock is set back (the memory store does). A request counts in
/// its own time's window, as envoyproxy/ratelimit's do; no window ever
/// admits more than the limit.
#[tokio::test]
async fn a_clock_set_back_counts_in_the_window_of_its_own_time() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    let quota = Quota::per_second(2).unwrap();
    for algorithm in [Algorithm::FixedWindow, Algorithm::HitCounter] {
        let key = format!("back-in-time-{algorithm}");
        let check = || async {
            let l = limit(&key, quota, algorithm, 1);
            store.check(&[l]).await.unwrap().allowed()
        };
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            [check().await, check().await, check().await],
            [true, true, false]
        );
        // Back 10 ms, into the window before.
        clock.set(clock.now() - 10_000_000);
        assert_eq!(
            [check().await, check().await, check().await],
            [true, true, false]
        );
        clock.advance(Duration::from_millis(10));
        assert!(
            !check().await,
            "{algorithm}: the later window is still full"
        );
        clock.advance(Duration::from_secs(1));
        assert!(check().await);
    }
}

/// With Redis's time (the default), native counting names windows by
/// Redis's clock as the store follows it.
#[tokio::test]
async fn native_windows_follow_redis_time() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url(), RedisConfig::default())
        .await
        .unwrap();
    let quota = Quota::per_hour(10).unwrap();
    let outcome = store
        .check(&[limit("hourly", quota, Algorithm::FixedWindow, 1)])
        .await
        .unwrap();
    assert!(outcome.allowed());
    let time = server.cli(&["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let now_ns = (parts.next().unwrap() * 1_000_000 + parts.next().unwrap()) * 1000;
    // The hour may have turned between the check and TIME.
    let found = [now_ns, now_ns - 1_000_000_000].iter().any(|&t| {
        server
            .cli(&["GET", &window_key("fw3", "hourly", quota, t)])
            .trim()
            == "1"
    });
    assert!(found, "no count in Redis's current hour");
}
