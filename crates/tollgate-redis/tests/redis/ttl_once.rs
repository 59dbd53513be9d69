//! Native counting sends a window's TTL once per key and window, not once
//! per check, and still never leaves a count without a TTL: a key removed
//! and made anew by a later `INCRBY` gets its TTL from that check.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota, Store};

use crate::support::{RedisServer, manual_store};

/// Every key of the server with its `PTTL` (-1: none).
fn ttls(server: &RedisServer) -> Vec<(String, i64)> {
    server
        .cli(&["--scan"])
        .lines()
        .filter(|k| !k.is_empty())
        .map(|k| {
            let ttl = server.cli(&["PTTL", k]).trim().parse().expect("a PTTL");
            (k.to_owned(), ttl)
        })
        .collect()
}

fn limit(key: &str, algorithm: Algorithm) -> Limit<'_> {
    Limit {
        key,
        quota: Quota::per_second(1000).unwrap(),
        algorithm,
        cost: 1,
        failure: FailurePolicy::Local,
    }
}

#[tokio::test]
async fn a_windows_ttl_is_sent_once_and_again_for_a_key_made_anew() {
    let server = RedisServer::start();
    let clock = tollgate_store::conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    for algorithm in [Algorithm::HitCounter, Algorithm::FixedWindow] {
        for _ in 0..10 {
            assert!(
                store
                    .check(&[limit("busy", algorithm)])
                    .await
                    .unwrap()
                    .allowed()
            );
        }
    }
    // Ten checks of each window, one TTL each: the first makes the count
    // with its TTL (`SET … NX PX`), the nine others `INCRBY` it.
    assert_eq!(server.command_calls("set"), 2);
    assert_eq!(server.command_calls("incrby"), 18);
    assert_eq!(server.command_calls("pexpire"), 0);
    let keys = ttls(&server);
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|(_, ttl)| *ttl > 0), "{keys:?}");

    // Another client removes the counts mid-window; the next check makes
    // each anew, sees so in its answer, and gives it a TTL.
    for (key, _) in &keys {
        server.cli(&["DEL", key]);
    }
    for algorithm in [Algorithm::HitCounter, Algorithm::FixedWindow] {
        let outcome = store.check(&[limit("busy", algorithm)]).await.unwrap();
        assert_eq!(outcome.decisions[0].remaining(), 999, "a count made anew");
    }
    assert_eq!(server.command_calls("pexpire"), 2);
    let again = ttls(&server);
    assert_eq!(again.len(), 2, "{again:?}");
    assert!(again.iter().all(|(_, ttl)| *ttl > 0), "{again:?}");

    // The next window is another key: its own TTL, sent beside its first
    // `INCRBY` (a key counted in the window before is a busy one, which
    // other instances have likely made already).
    clock.advance(Duration::from_secs(1));
    store
        .check(&[limit("busy", Algorithm::HitCounter)])
        .await
        .unwrap();
    assert_eq!(server.command_calls("pexpire"), 3);
    assert_eq!(server.command_calls("set"), 2);
}

/// Two stores (two instances) count the same keys concurrently while a
/// third client keeps deleting them: whatever the interleaving, every count
/// left has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_count_is_left_without_a_ttl_under_deletes_and_two_instances() {
    let server = RedisServer::start();
    let clock = tollgate_store::conformance::clock();
    let stores = [
        Arc::new(manual_store(&server.url(), &clock).await),
        Arc::new(manual_store(&server.url(), &clock).await),
    ];
    let url = server.url();
    let deleter = tokio::spawn(async move {
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        for _ in 0..200 {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*")
                .query_async(&mut conn)
                .await
                .unwrap();
            if !keys.is_empty() {
                let _: i64 = redis::cmd("DEL")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
            tokio::task::yield_now().await;
        }
    });
    let checkers: Vec<_> = (0..8)
        .map(|i| {
            let store = Arc::clone(&stores[i % 2]);
            tokio::spawn(async move {
                for n in 0..300 {
                    let key = format!("k{}", n % 5);
                    let algorithm = if n % 2 == 0 {
                        Algorithm::HitCounter
                    } else {
                        Algorithm::FixedWindow
                    };
                    store.check(&[limit(&key, algorithm)]).await.unwrap();
                }
            })
        })
        .collect();
    for c in checkers {
        c.await.unwrap();
    }
    deleter.await.unwrap();
    // The deleter may have finished first: a last round on every key.
    for n in 0..10 {
        let key = format!("k{}", n % 5);
        stores[n % 2]
            .check(&[limit(&key, Algorithm::HitCounter)])
            .await
            .unwrap();
    }
    let keys = ttls(&server);
    assert!(!keys.is_empty());
    let without: Vec<_> = keys.iter().filter(|(_, ttl)| *ttl < 0).collect();
    assert!(without.is_empty(), "counts without a TTL: {without:?}");
}
