//! `TOLLGATE.CHECK` called as any client calls it: its keys declared, so a
//! cluster refuses keys of several slots and redirects a key served
//! elsewhere before the command runs; its errors; and a bad request among
//! good ones fails the call with nothing written.

use tollgate_testkit::RedisCluster;

use crate::{module, server};

/// A request as the store packs it: time (µs), number of limits, then seven
/// numbers per limit, little-endian doubles.
fn request(now_us: f64, limits: &[[u64; 7]]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [now_us, limits.len() as f64] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in limits.iter().flatten() {
        out.extend_from_slice(&(*v as f64).to_le_bytes());
    }
    out
}

/// GCRA, 10 per second, burst 3, cost 1.
const GCRA: [u64; 7] = [1, 10, 1_000_000, 3, 100_000, 1, 0];
/// A sliding log, 10 per second, cost 1.
const LOG: [u64; 7] = [5, 10, 1_000_000, 10, 100_000, 1, 0];

#[test]
fn keys_are_declared_so_a_cluster_routes_and_refuses_them() {
    let module = module();
    let cluster = RedisCluster::start_with(&["--loadmodule", module.to_str().unwrap()]);
    let node = &cluster.nodes[0];
    let served = cluster.slots_of(0);
    let on_node = |slot: u16| served.iter().any(|&(a, b)| (a..=b).contains(&slot));
    // A key of a slot node 0 serves, and one of a slot it does not.
    let key_of = |here: bool| {
        (0..100)
            .map(|n| format!("k:{{{n}}}"))
            .find(|k| on_node(cluster.keyslot(k)) == here)
            .expect("a key")
    };
    let (here, elsewhere) = (key_of(true), key_of(false));
    let crossing = node.cli(&["TOLLGATE.CHECK", "2", &here, &elsewhere, "c", "0", "x"]);
    assert!(crossing.starts_with("CROSSSLOT"), "{crossing:?}");
    let moved = node.cli(&["TOLLGATE.CHECK", "1", &elsewhere, "c", "0", "x"]);
    assert!(moved.starts_with("MOVED"), "{moved:?}");
    // Served here: the command runs (and refuses the request).
    let ran = node.cli(&["TOLLGATE.CHECK", "1", &here, "c", "0", "x"]);
    assert!(ran.contains("a request is at least 16 bytes"), "{ran:?}");
}

#[tokio::test]
async fn refuses_bad_calls_and_writes_nothing() {
    let server = server();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let good = request(1_800_000_000_000_000.0, &[GCRA]);
    let log = request(1.0, &[LOG]);
    let mut cut = good.clone();
    cut.truncate(30);
    let calls: [(&[&[u8]], &str); 10] = [
        (&[b"1"], "wrong number of arguments"),
        (&[b"x", b"a", b"c", b"0"], "usage"),
        (
            &[b"1", b"a", b"x", b"0", &good],
            "takes the ops c (check), d (dry run), h (hybrid leasing), r (refund) and l (release)",
        ),
        (
            &[b"2", b"a", b"b", b"r", b"0", &good, &good, &good],
            "r takes one request, and its leases",
        ),
        (&[b"2", b"a", b"b", b"c", b"0", &good], "take 1 keys, got 2"),
        (&[b"1", b"a", b"c", b"0", &log], "take 2 keys, got 1"),
        (
            &[b"4", b"s", b"s.n", b"s", b"s.n", b"l", b"0", b"1|a", b"x|y"],
            "a lease is <cost>|<id>, got x|y",
        ),
        (
            &[b"1", b"s", b"l", b"0", b"1|a"],
            "1 leases take 2 keys, got 1",
        ),
        (
            &[b"2", b"a", b"b", b"c", b"0", &good, &cut],
            "at least 72 bytes",
        ),
        (&[b"1", b"a", b"c", b"0", &request(0.5, &[GCRA])], "time"),
    ];
    for (args, error) in calls {
        let mut cmd = redis::cmd("TOLLGATE.CHECK");
        for a in args {
            cmd.arg(*a);
        }
        let e = cmd
            .query_async::<Vec<u8>>(&mut conn)
            .await
            .expect_err("refused");
        assert!(e.to_string().contains(error), "{args:?}: {e}");
    }
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "0", "nothing was written");
    // A string that is not its limit's state, and a key of another type.
    server.cli(&["SET", "a", "not a time"]);
    server.cli(&["LPUSH", "l", "x"]);
    for (key, error) in [("a", "does not hold its limit's state"), ("l", "WRONGTYPE")] {
        let e = redis::cmd("TOLLGATE.CHECK")
            .arg(1)
            .arg(key)
            .arg("c")
            .arg(0)
            .arg(&good)
            .query_async::<Vec<u8>>(&mut conn)
            .await
            .expect_err("refused");
        assert!(e.to_string().contains(error), "{key}: {e}");
    }
    // A sliding log on a string, or beside a count that is not one, and a
    // log that admits beside a limit whose key is of another type: refused,
    // the log's keys untouched.
    let now = 1_800_000_000_000_000.0;
    let log_and_gcra = request(now, &[LOG, GCRA]);
    let cases: [(&[&str], &[u8], &str); 3] = [
        (&["a", "s.n"], &request(now, &[LOG]), "WRONGTYPE"),
        (
            &["s", "a"],
            &request(now, &[LOG]),
            "does not hold its limit's state",
        ),
        (&["s", "s.n", "l"], &log_and_gcra, "WRONGTYPE"),
    ];
    for (keys, blob, error) in cases {
        let e = redis::cmd("TOLLGATE.CHECK")
            .arg(keys.len())
            .arg(keys)
            .arg("c")
            .arg(0)
            .arg(blob)
            .query_async::<Vec<u8>>(&mut conn)
            .await
            .expect_err("refused");
        assert!(e.to_string().contains(error), "{keys:?}: {e}");
    }
    assert_eq!(server.cli(&["EXISTS", "s", "s.n"]).trim(), "0");
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "2", "only the test's keys");
}
