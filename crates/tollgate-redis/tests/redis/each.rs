//! Limits checked each on its own (`check_each`, envoyproxy/ratelimit's
//! format): the counting ones of one request go to each node in one
//! pipeline, decide as checks of each alone do, and a node that fails
//! fails only its own limits.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota, Store};
use tollgate_store::conformance;
use tollgate_store::{Fallback, FallbackConfig, MemoryStore};

use crate::support::{RedisCluster, RedisServer, manual_store, manual_store_with};

fn counted(key: &str, limit: u64, algorithm: Algorithm) -> Limit<'_> {
    Limit::new(key, Quota::per_second(limit).unwrap(), algorithm)
}

/// Read events the server processed (`INFO stats`): one per round trip of
/// a client that sends a pipeline in one write, as the store does.
fn reads(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has total_reads_processed")
}

#[tokio::test]
async fn one_requests_counted_limits_go_in_one_round_trip_and_decide_as_each_alone() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    let memory = MemoryStore::with_clock(Default::default(), Arc::clone(&clock));
    // The fixed window admits every round but the last two, whose denies
    // give their units back in a second round trip.
    let limits = [
        counted("each-window", 5, Algorithm::FixedWindow),
        counted("each-hits", 2, Algorithm::HitCounter),
        counted("each-wide", 1_000, Algorithm::HitCounter),
    ];
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    // What asking for the stats costs by itself.
    let idle = {
        let before = reads(&server);
        reads(&server) - before
    };
    for round in 0..7 {
        let before = reads(&server);
        let got = store.check_each(&limits).await;
        let trips = reads(&server) - before - idle;
        let want = memory.check_each(&limits).await;
        for (i, (got, want)) in got.into_iter().zip(want).enumerate() {
            assert_eq!(
                got.unwrap().decisions,
                want.unwrap().decisions,
                "round {round}, limit {i}"
            );
        }
        let denied_window = round >= 5;
        assert_eq!(
            trips,
            if denied_window { 2 } else { 1 },
            "round {round}: round trips"
        );
    }
    // Each key's first check made its count with its TTL (`SET … NX PX`),
    // the six others INCRBY it; the TTL went again with the units given
    // back.
    assert_eq!(server.command_calls("set"), 3);
    assert_eq!(server.command_calls("incrby"), 3 * 6);
    assert_eq!(server.command_calls("decrby"), 2);
    assert_eq!(server.command_calls("fcall"), 0, "no script");
    assert_eq!(server.command_calls("pexpire"), 2);
    let stats = store.stats();
    assert_eq!((stats.errors, stats.timeouts), (0, 0));
}

#[tokio::test]
async fn a_limit_redis_refuses_fails_alone_and_the_others_are_scripted_beside() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    // A hit counter whose count is not a number: Redis refuses its INCRBY.
    let broken = counted("each-broken", 10, Algorithm::HitCounter);
    let window = tollgate_core::Clock::now(&*clock) / broken.quota.period_ns();
    let key = format!("tollgate:hc3:{{each-broken}}:{window}");
    assert_eq!(server.cli(&["SET", &key, "not a count"]).trim(), "OK");
    let limits = [
        counted("each-fine", 10, Algorithm::FixedWindow),
        broken,
        counted("each-gcra", 10, Algorithm::Gcra),
    ];
    let got = store.check_each(&limits).await;
    assert!(got[0].as_ref().unwrap().allowed());
    assert!(got[1].is_err(), "{:?}", got[1]);
    assert!(got[2].as_ref().unwrap().allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_fails_fails_only_its_own_limits() {
    // The live masters keep serving their slots while one is down.
    let mut cluster = RedisCluster::start_with(&["--cluster-require-full-coverage", "no"]);
    let clock = conformance::clock();
    let timeout = Duration::from_millis(300);
    let store = manual_store_with(&cluster.url(), &clock, |c| c.timeout = timeout).await;
    let fallback = Fallback::with_clock(
        manual_store_with(&cluster.url(), &clock, |c| c.timeout = timeout).await,
        FallbackConfig {
            timeout,
            ..FallbackConfig::default()
        },
        Arc::clone(&clock) as _,
    );
    const VICTIM: usize = 1;
    let on = |node: usize, key: &str| {
        let slot = cluster.keyslot(key);
        cluster
            .slots_of(node)
            .iter()
            .any(|&(a, b)| (a..=b).contains(&slot))
    };
    // Two keys on a live master (one pipeline), one on the victim.
    let mut live = (0..).map(|i| format!("live-{i}")).filter(|k| on(0, k));
    let (live_a, live_b) = (live.next().unwrap(), live.next().unwrap());
    let doomed = (0..)
        .map(|i| format!("doomed-{i}"))
        .find(|k| on(VICTIM, k))
        .unwrap();
    let limits = [
        counted(&live_a, 10, Algorithm::HitCounter),
        counted(&doomed, 10, Algorithm::HitCounter).with_failure(FailurePolicy::FailClosed),
        counted(&live_b, 10, Algorithm::FixedWindow),
    ];
    for answer in store.check_each(&limits).await {
        assert!(answer.unwrap().allowed());
    }
    // The live master's two new keys, each made by a `SET … NX PX`, then
    // counted with `INCRBY`.
    let live_calls = |cluster: &RedisCluster| {
        let node = &cluster.nodes[0];
        (node.command_calls("set"), node.command_calls("incrby"))
    };
    assert_eq!(live_calls(&cluster), (2, 0));

    cluster.nodes[VICTIM].kill();
    let got = store.check_each(&limits).await;
    assert_eq!(got[0].as_ref().unwrap().decisions[0].remaining(), 8);
    assert!(got[1].is_err(), "the victim's limit fails");
    assert_eq!(got[2].as_ref().unwrap().decisions[0].remaining(), 8);
    assert_eq!(live_calls(&cluster), (2, 2));

    // Through the fallback: the victim's limit is decided by its policy,
    // the others by Redis.
    let got = fallback.check_each(&limits).await;
    let remaining: Vec<(bool, u64)> = got
        .into_iter()
        .map(|a| {
            let d = a.unwrap().decisions[0];
            (d.allowed(), d.remaining())
        })
        .collect();
    assert_eq!(remaining, [(true, 7), (false, 0), (true, 7)]);
    assert_eq!(fallback.stats().fallbacks, 1);
    assert_eq!(fallback.stats().checks, 2);
}

/// Through hybrid mode: a limit it leases is spent from its lease, and the
/// ones it never leases (hit counters) go to Redis, each
/// admitting exactly what it would alone.
#[tokio::test]
async fn hybrid_mode_spends_its_leases_and_counts_the_rest_in_redis() {
    let server = RedisServer::start();
    let hybrid = crate::support::hybrid_of(&server).await;
    let limits = [
        crate::support::gcra_of_10_000("each-leased"),
        counted("each-counted", 3, Algorithm::HitCounter),
    ];
    let mut admitted = [0u64; 2];
    for _ in 0..10 {
        let answers = hybrid.check_each(&limits).await;
        for (n, answer) in admitted.iter_mut().zip(answers) {
            *n += u64::from(answer.unwrap().allowed());
        }
    }
    assert_eq!(admitted, [10, 3]);
    let stats = hybrid.stats();
    assert!(stats.local_decisions > 0, "{stats:?}");
    // Every hit counted: the first made the count (`SET … NX PX`).
    assert_eq!(server.command_calls("incrby"), 9);
}
