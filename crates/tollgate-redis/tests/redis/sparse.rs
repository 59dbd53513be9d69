//! Native counting on sparse keys: a window's first check from a store that
//! did not count the key's previous window makes the count with its TTL in
//! one `SET … NX PX`; where the count exists already (another instance made
//! it), it writes nothing and the check counts with `INCRBY` + `PEXPIRE …
//! NX`, deciding as if it had gone there at once.

use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota, Store};

use crate::support::{RedisServer, manual_store};

fn limit(key: &str, algorithm: Algorithm, cost: u64) -> Limit<'_> {
    Limit {
        key,
        quota: Quota::per_second(3).unwrap(),
        algorithm,
        cost,
        failure: FailurePolicy::Local,
    }
}

/// Every key of the server with its `PTTL` (-1: none) and value.
fn keys(server: &RedisServer) -> Vec<(String, i64, String)> {
    let mut keys: Vec<_> = server
        .cli(&["--scan"])
        .lines()
        .filter(|k| !k.is_empty())
        .map(|k| {
            let ttl = server.cli(&["PTTL", k]).trim().parse().expect("a PTTL");
            (k.to_owned(), ttl, server.cli(&["GET", k]).trim().to_owned())
        })
        .collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_sparse_keys_first_check_is_one_set_with_its_ttl() {
    let server = RedisServer::start();
    let clock = tollgate_store::conformance::clock();
    let store = manual_store(&server.url(), &clock).await;
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
    for (n, algorithm) in [Algorithm::HitCounter, Algorithm::FixedWindow]
        .into_iter()
        .enumerate()
    {
        let key = format!("user:{n}");
        let outcome = store.check(&[limit(&key, algorithm, 2)]).await.unwrap();
        assert!(outcome.allowed());
        assert_eq!(outcome.decisions[0].remaining(), 1);
    }
    assert_eq!(server.command_calls("set"), 2);
    for command in ["incrby", "pexpire", "expire"] {
        assert_eq!(server.command_calls(command), 0, "{command}");
    }
    let stored = keys(&server);
    assert_eq!(stored.len(), 2, "{stored:?}");
    for (key, ttl, value) in &stored {
        assert_eq!(value, "2", "{key}: the cost, a decimal integer");
        // The time left in the window, padded by the store's extra TTL.
        let padding = 600_000;
        assert!(
            *ttl > padding - 5_000 && *ttl <= padding + 1000,
            "{key}: a TTL of the window's end, {ttl}"
        );
    }
    // The key's next checks in the window count on it.
    let outcome = store
        .check(&[limit("user:1", Algorithm::FixedWindow, 2)])
        .await
        .unwrap();
    assert!(!outcome.allowed(), "2 + 2 is past 3");
    assert_eq!(outcome.decisions[0].remaining(), 1);
    assert_eq!(server.command_calls("set"), 2);
    assert_eq!(server.command_calls("incrby"), 1);
}

/// Two instances: the second's first check of a window the first made finds
/// the count there, writes nothing with its `SET`, and counts on it.
#[tokio::test]
async fn a_count_another_instance_made_is_counted_on_not_overwritten() {
    let server = RedisServer::start();
    let clock = tollgate_store::conformance::clock();
    let (a, b) = (
        manual_store(&server.url(), &clock).await,
        manual_store(&server.url(), &clock).await,
    );
    for algorithm in [Algorithm::HitCounter, Algorithm::FixedWindow] {
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).trim(), "OK");
        let key = format!("shared:{algorithm}");
        let first = a.check(&[limit(&key, algorithm, 2)]).await.unwrap();
        assert_eq!(first.decisions[0].remaining(), 1);
        let second = b.check(&[limit(&key, algorithm, 1)]).await.unwrap();
        assert!(second.allowed(), "{algorithm}");
        assert_eq!(second.decisions[0].remaining(), 0, "{algorithm}");
        let third = b.check(&[limit(&key, algorithm, 1)]).await.unwrap();
        assert!(!third.allowed(), "{algorithm}");
        // Each store's first check a SET; the second store's then counted
        // with the pipeline, its TTL beside (NX: the one it has stays).
        assert_eq!(server.command_calls("set"), 2, "{algorithm}");
        assert_eq!(server.command_calls("incrby"), 2, "{algorithm}");
        // (and the fixed window's deny gives its unit back: DECRBY, its
        // TTL beside).
        let pexpires = if algorithm == Algorithm::FixedWindow {
            2
        } else {
            1
        };
        assert_eq!(server.command_calls("pexpire"), pexpires, "{algorithm}");
    }
    let stored = keys(&server);
    // The hit counter keeps its deny; the fixed window gave it back.
    let values: Vec<&str> = stored.iter().map(|(_, _, v)| v.as_str()).collect();
    assert_eq!(values, ["3", "4"], "{stored:?}");
    assert!(stored.iter().all(|(_, ttl, _)| *ttl > 0), "{stored:?}");
}
