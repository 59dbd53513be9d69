//! A real 3-master Redis Cluster: conformance, hash tags, cross-slot requests
//! with refunds, and NOSCRIPT reloads on every node.

use std::sync::Arc;

use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota, Store};
use tollgate_store::MemoryStore;
use tollgate_store::conformance::{self, assert_same, reference, run};

use crate::support::{
    RedisCluster, batched_checks_decide_as_alone, cli, fcalls, manual_store, manual_store_with,
    redis_scenarios,
};

#[tokio::test]
async fn cluster_conformance_tags_cross_slot_refunds_and_script_reloads() {
    let cluster = RedisCluster::start();
    let url = cluster.url();

    // 1. Every conformance scenario (its keys share one hash tag: one slot).
    for scenario in redis_scenarios() {
        let reference = reference(&scenario).await;
        let clock = conformance::clock();
        let redis = manual_store(&url, &clock).await;
        assert!(redis.is_cluster());
        let actual = run(&redis, &clock, &scenario).await;
        assert_same(&scenario, &reference, &actual, "Redis Cluster");
        let stats = redis.stats();
        assert_eq!((stats.timeouts, stats.errors, stats.refunds), (0, 0, 0));
    }
    let clock = conformance::clock();
    conformance::assert_reset_forgets(&manual_store(&url, &clock).await, "cluster").await;

    // 2. Keys land where the cluster says their tag hashes.
    let port = cluster.nodes[0].port;
    let slot = |key: &str| cli(port, &["CLUSTER", "KEYSLOT", key]).trim().to_owned();
    assert_eq!(
        slot("tollgate:gcra2:{user:42}:api"),
        slot("tollgate:log.n:{user:42}:uploads")
    );
    let clock = conformance::clock();
    let store = manual_store(&url, &clock).await;
    let api = Limit {
        key: "{user:42}api",
        quota: Quota::per_second(10).unwrap(),
        algorithm: Algorithm::Gcra,
        cost: 1,
        failure: FailurePolicy::Local,
    };
    assert!(store.check(&[api]).await.unwrap().allowed());
    let exists = std::process::Command::new("redis-cli")
        .args([
            "-c",
            "-p",
            &port.to_string(),
            "EXISTS",
            "tollgate:gcra2:{user:42}:api",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&exists.stdout).trim(), "1");

    // 3. Cross-slot requests: all-or-nothing through refunds, for every algorithm.
    for algorithm in Algorithm::RATE.into_iter().chain([Algorithm::Concurrency]) {
        cross_slot(&url, algorithm, &slot).await;
    }

    // 4. The code flushed on every node (`FUNCTION FLUSH`, or `SCRIPT FLUSH`
    // for a store told to use scripts): checks load it again and go on.
    for functions in [true, false] {
        let clock = conformance::clock();
        let store = manual_store_with(&url, &clock, |c| c.functions = functions).await;
        assert_eq!(store.uses_functions(), functions);
        let keys: Vec<String> = (0..12).map(|i| format!("flush-{functions}-{i}")).collect();
        let check = |key: &str| Limit {
            key: key.to_owned().leak(),
            quota: Quota::per_second(1000).unwrap(),
            algorithm: Algorithm::TokenBucket,
            cost: 1,
            failure: FailurePolicy::Local,
        };
        for key in &keys {
            assert!(store.check(&[check(key)]).await.unwrap().allowed());
        }
        let flush = if functions { "FUNCTION" } else { "SCRIPT" };
        for node in &cluster.nodes {
            assert_eq!(node.cli(&[flush, "FLUSH"]).trim(), "OK");
        }
        for key in &keys {
            let outcome = store.check(&[check(key)]).await.unwrap();
            assert_eq!(outcome.decisions[0].remaining(), 998, "{key}");
        }
        let stats = store.stats();
        assert_eq!((stats.timeouts, stats.errors), (0, 0), "{stats:?}");
    }
}

/// A narrow per-user limit and a wider global one on different slots. The
/// user's group is checked first; when the global one then denies, what the
/// user's group took is refunded, so the denied request consumed nothing.
async fn cross_slot(url: &str, algorithm: Algorithm, slot: &impl Fn(&str) -> String) {
    let (user_q, global_q) = if algorithm == Algorithm::Concurrency {
        (Quota::per_hour(3).unwrap(), Quota::per_hour(5).unwrap())
    } else {
        let q = |n, burst| Quota::per_second(n).unwrap().with_burst(burst).unwrap();
        (q(4, 3), q(5, 5))
    };
    let global_key = format!("global-{algorithm}");
    let user_keys: Vec<String> = (0..7).map(|i| format!("user-{i}-{algorithm}")).collect();
    let seg = |k: &str| format!("x:{{{k}}}");
    for u in &user_keys {
        assert_ne!(
            slot(&seg(u)),
            slot(&seg(&global_key)),
            "the test needs two slots"
        );
    }
    let limit = |key: &str, quota, cost| Limit {
        key: key.to_owned().leak(),
        quota,
        algorithm,
        cost,
        failure: FailurePolicy::Local,
    };
    let clock = conformance::clock();
    let memory = MemoryStore::with_clock(conformance::memory_config(), Arc::clone(&clock));
    let store = manual_store(url, &clock).await;
    // Five users spend the global budget.
    for u in &user_keys[..5] {
        let request = [limit(&global_key, global_q, 1), limit(u, user_q, 1)];
        let redis = store.check(&request).await.unwrap();
        assert!(redis.allowed(), "{algorithm}");
        let reference = memory.check_now(&request);
        // Lease ids are each store's own; the decisions and leases taken match.
        assert_eq!(redis.decisions, reference.decisions, "{algorithm}");
        assert_eq!(redis.leases.len(), reference.leases.len(), "{algorithm}");
    }
    // A sixth: its own limit admits (checked first, narrower), the global one
    // denies, and the user's admission is given back.
    let request = [
        limit(&global_key, global_q, 1),
        limit(&user_keys[5], user_q, 1),
    ];
    let redis = store.check(&request).await.unwrap();
    let reference = memory.check_now(&request);
    assert!(!redis.allowed(), "{algorithm}");
    assert_eq!(
        redis
            .decisions
            .iter()
            .map(|d| d.allowed())
            .collect::<Vec<_>>(),
        reference
            .decisions
            .iter()
            .map(|d| d.allowed())
            .collect::<Vec<_>>(),
        "{algorithm}"
    );
    assert_eq!(store.stats().refunds, 1, "{algorithm}");
    // The refund is exact: the user is back to full, as in the memory store.
    for key in [&user_keys[5], &global_key] {
        let q = if key == &global_key { global_q } else { user_q };
        let read = [limit(key, q, 0)];
        assert_eq!(
            store.check(&read).await.unwrap(),
            memory.check_now(&read),
            "{algorithm}: {key} after the refund"
        );
    }
    // And the user can spend its whole own budget elsewhere... once the global
    // one allows again: a request of the user alone is admitted.
    let alone = [limit(&user_keys[5], user_q, 1)];
    assert_eq!(
        store.check(&alone).await.unwrap().decisions,
        memory.check_now(&alone).decisions
    );
}

/// Concurrent checks on a cluster share calls across the slots of each
/// node (the function's `allow-cross-slot-keys`); see
/// `support::batched_checks_decide_as_alone`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_cross_the_slots_of_a_node() {
    let cluster = RedisCluster::start();
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    }
    batched_checks_decide_as_alone(&cluster.url(), || cluster.nodes.iter().map(fcalls).sum()).await;
}

/// A slot moves to another node after the store read the slot map: a batch
/// sent to the old node finds the key is not served there before writing
/// anything, its checks go again on their own (Redis redirects them), the
/// map is read again, and every decision is the one a fresh store gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_finds_its_slot_moved_loses_no_decision() {
    let cluster = RedisCluster::start();
    let clock = conformance::clock();
    let store = Arc::new(manual_store(&cluster.url(), &clock).await);
    let node_of = |key: &str| {
        let slot: u16 = cluster.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .unwrap();
        let owner = cluster
            .nodes
            .iter()
            .position(|n| {
                n.cli(&["CLUSTER", "NODES"])
                    .lines()
                    .any(|l| l.contains("myself") && owns(l, slot))
            })
            .expect("a node serves every slot");
        (slot, owner)
    };
    let (slot, from) = node_of("moving");
    // Keys on the same node, on other slots, to share its batches.
    let neighbours: Vec<String> = (0..200)
        .map(|i| format!("neighbour-{i}"))
        .filter(|k| {
            let (s, n) = node_of(k);
            n == from && s != slot
        })
        .take(6)
        .collect();
    assert_eq!(neighbours.len(), 6);
    // The empty slot moves to another node; every node is told at once.
    let to = (from + 1) % cluster.nodes.len();
    cluster.move_slot(slot, to);
    assert_eq!(node_of("moving").1, to);

    let quota = Quota::per_hour(5).unwrap();
    let keys: Vec<String> = std::iter::once("moving".to_owned())
        .chain(neighbours)
        .collect();
    let tasks: Vec<_> = (0..10)
        .flat_map(|_| keys.clone())
        .map(|key| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let limit = Limit {
                    key: key.clone().leak(),
                    quota,
                    algorithm: Algorithm::TokenBucket,
                    cost: 1,
                    failure: FailurePolicy::Local,
                };
                (key, store.check(&[limit]).await.unwrap().allowed())
            })
        })
        .collect();
    let mut admitted = std::collections::BTreeMap::new();
    for task in tasks {
        let (key, allowed) = task.await.unwrap();
        *admitted.entry(key).or_insert(0) += usize::from(allowed);
    }
    for (key, n) in &admitted {
        assert_eq!(*n, 5, "{key} admitted {n}");
    }
    let stats = store.stats();
    assert!(stats.moved > 0, "no batch met the moved slot: {stats:?}");
    assert_eq!((stats.errors, stats.timeouts), (0, 0), "{stats:?}");
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn owns(line: &str, slot: u16) -> bool {
    line.split_whitespace().skip(8).any(|range| {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        match (first.parse::<u16>(), last.parse::<u16>()) {
            (Ok(first), Ok(last)) => (first..=last).contains(&slot),
            _ => false,
        }
    })
}
