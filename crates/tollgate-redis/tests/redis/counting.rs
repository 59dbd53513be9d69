//! A request whose counting limits are each checked on its own
//! (`check_each`) counts them as checks of each alone do: a sparse key's
//! first check is one `SET … NX PX`, a count another instance made is
//! counted on, and a key whose slot moved loses no decision.

use tollgate_core::{Algorithm, Limit, Quota, Store};
use tollgate_store::conformance;

use crate::support::{RedisCluster, RedisServer, manual_store};

fn counted(key: &str, algorithm: Algorithm) -> Limit<'_> {
    Limit {
        cost: 2,
        ..Limit::new(key, Quota::per_second(3).unwrap(), algorithm)
    }
}

/// Each limit's `(allowed, remaining)` as `check_each` answered.
async fn check_each(store: &impl Store, limits: &[Limit<'_>]) -> Vec<(bool, u64)> {
    store
        .check_each(limits)
        .await
        .into_iter()
        .map(|answer| {
            let d = answer.unwrap().decisions[0];
            (d.allowed(), d.remaining())
        })
        .collect()
}

#[tokio::test]
async fn a_batch_of_new_keys_is_one_set_with_its_ttl_per_key_and_nothing_else() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    let limits = [
        counted("new-0", Algorithm::HitCounter),
        counted("new-1", Algorithm::FixedWindow),
        counted("new-2", Algorithm::HitCounter),
        counted("new-3", Algorithm::FixedWindow),
    ];
    assert_eq!(check_each(&store, &limits).await, [(true, 1); 4]);
    assert_eq!(server.command_calls("set"), 4);
    for command in ["incrby", "pexpire", "expire", "decrby", "get", "fcall"] {
        assert_eq!(server.command_calls(command), 0, "{command}");
    }
    for key in server.cli(&["--scan"]).lines().filter(|k| !k.is_empty()) {
        assert_eq!(server.cli(&["GET", key]).trim(), "2", "{key}: the cost");
        let ttl: i64 = server.cli(&["PTTL", key]).trim().parse().unwrap();
        assert!(ttl > 0, "{key}: made with its TTL, {ttl}");
    }
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "4");
    // Counted on in the rest of the window: the fixed windows' denies give
    // their units back, the hit counters keep theirs.
    assert_eq!(check_each(&store, &limits).await, [(false, 1); 4]);
    assert_eq!(server.command_calls("incrby"), 4);
    assert_eq!(server.command_calls("decrby"), 2);
    let values: Vec<String> = (0..4)
        .map(|i| {
            let kind = if i % 2 == 0 { "hc3" } else { "fw3" };
            let window = tollgate_core::Clock::now(&*clock) / 1_000_000_000;
            let key = format!("tollgate:{kind}:{{new-{i}}}:{window}");
            server.cli(&["GET", &key]).trim().to_owned()
        })
        .collect();
    assert_eq!(values, ["4", "2", "4", "2"]);
}

/// A batch whose `SET … NX` finds some counts made by another instance
/// counts on those (`INCRBY`, the TTL beside) and makes the others.
#[tokio::test]
async fn a_batch_counts_on_the_counts_another_instance_made() {
    let server = RedisServer::start();
    let clock = conformance::clock();
    let (a, b) = (
        manual_store(&server.url(), &clock).await,
        manual_store(&server.url(), &clock).await,
    );
    let made = counted("made-by-a", Algorithm::FixedWindow);
    assert!(a.check(&[made]).await.unwrap().allowed());
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    let limits = [
        made,
        counted("new-for-b", Algorithm::FixedWindow),
        counted("made-by-a", Algorithm::HitCounter),
    ];
    // 2 + 2 is past 3: the window a made denies, and gives its units back.
    assert_eq!(
        check_each(&b, &limits).await,
        [(false, 1), (true, 1), (true, 1)]
    );
    assert_eq!(server.command_calls("set"), 3);
    assert_eq!(server.command_calls("incrby"), 1);
    assert_eq!(server.command_calls("decrby"), 1);
    // Beside the INCRBY, and again beside the DECRBY.
    assert_eq!(server.command_calls("pexpire"), 2);
    let stats = b.stats();
    assert_eq!((stats.errors, stats.timeouts), (0, 0), "{stats:?}");
}

/// A slot moves to another node after the store and its cluster client
/// read the slot map: the pipeline of its keys, sent to the old node with
/// the pipeline of a neighbour's slot there, is refused before anything is
/// written and resent where the slot is served, the neighbour's counted
/// once, and every key admits exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_slot_moved_loses_no_decision() {
    let cluster = RedisCluster::start();
    let clock = conformance::clock();
    let store = manual_store(&cluster.url(), &clock).await;
    let node_of = |key: &str| {
        let slot = cluster.keyslot(key);
        let node = (0..cluster.nodes.len())
            .find(|&n| {
                cluster
                    .slots_of(n)
                    .iter()
                    .any(|&(a, b)| (a..=b).contains(&slot))
            })
            .expect("a node serves every slot");
        (slot, node)
    };
    let (slot, from) = node_of("moving");
    let neighbour = (0..)
        .map(|i| format!("neighbour-{i}"))
        .find(|k| {
            let (s, n) = node_of(k);
            n == from && s != slot
        })
        .unwrap();
    let to = (from + 1) % cluster.nodes.len();
    cluster.move_slot(slot, to);
    assert_eq!(node_of("moving").1, to);

    let quota = Quota::per_hour(5).unwrap();
    let limits: Vec<Limit<'_>> = [Algorithm::HitCounter, Algorithm::FixedWindow]
        .into_iter()
        .flat_map(|algorithm| {
            ["moving", neighbour.as_str()].map(|key| Limit::new(key, quota, algorithm))
        })
        .collect();
    let mut admitted = vec![0; limits.len()];
    for _ in 0..8 {
        for (n, (allowed, _)) in admitted.iter_mut().zip(check_each(&store, &limits).await) {
            *n += usize::from(allowed);
        }
    }
    assert_eq!(admitted, [5; 4]);
    // The hit counters keep every hit, each counted once, where the slot
    // map says.
    let window = tollgate_core::Clock::now(&*clock) / 3_600_000_000_000;
    for (key, node) in [("moving", to), (neighbour.as_str(), from)] {
        let count = format!("tollgate:hc3:{{{key}}}:{window}");
        assert_eq!(
            cluster.nodes[node].cli(&["GET", &count]).trim(),
            "8",
            "{key}"
        );
    }
    let stats = store.stats();
    assert_eq!((stats.errors, stats.timeouts), (0, 0), "{stats:?}");
}
