//! `CL.THROTTLE` as redis-cell 0.5.0 answers it: the expected values are its
//! README's example, its end-to-end test and its own table of cases
//! (`it_rate_limits`), as the five integers it replies with.

use tollgate_testkit::RedisServer;

use crate::{ints, server};

/// A connection of its own to `server`: its calls take microseconds where
/// a redis-cli process takes milliseconds, and the expected answers hold
/// while less than a second of real time passes in a table.
fn connect(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("a connection to the test server")
}

fn throttle(conn: &mut redis::Connection, args: &[&str]) -> Vec<i64> {
    redis::cmd("CL.THROTTLE").arg(args).query(conn).unwrap()
}

/// Moves a key's time on by `ms` without waiting: its stored TAT (ns) goes
/// back by as much, which is what redis-cell's state looks like that much
/// later. A key that is gone stays gone (it is full either way).
fn advance(conn: &mut redis::Connection, key: &str, ms: u64) {
    let tat: Option<u64> = redis::cmd("GET").arg(key).query(conn).unwrap();
    if let Some(tat) = tat {
        let () = redis::cmd("SET")
            .arg(key)
            .arg(tat - ms * 1_000_000)
            .arg("KEEPTTL")
            .query(conn)
            .unwrap();
    }
}

#[test]
fn answers_readmes_example_and_end_to_end_test() {
    let server = server();
    let mut conn = connect(&server);
    assert_eq!(
        throttle(&mut conn, &["user123", "15", "30", "60"]),
        [0, 16, 15, -1, 2]
    );
    // redis-cell's tests/e2e.rs: burst 0, 1 token per 2 s.
    let args = ["e2e", "0", "1", "2", "1"];
    assert_eq!(throttle(&mut conn, &args), [0, 1, 0, -1, 2]);
    assert_eq!(throttle(&mut conn, &args), [1, 1, 0, 2, 2]);
    advance(&mut conn, "e2e", 2000);
    assert_eq!(throttle(&mut conn, &args), [0, 1, 0, -1, 2]);
}

/// redis-cell's `it_rate_limits`: limit 5 (max_burst 4), 1 per second;
/// (ms after the start, quantity, then the answer). Its durations become
/// whole seconds as CL.THROTTLE rounds them (3.9 s is 4).
#[test]
fn answers_redis_cells_table() {
    let server = server();
    let mut conn = connect(&server);
    let rows: [(u64, &str, [i64; 5]); 15] = [
        (0, "6", [1, 5, 5, -1, 0]),
        (0, "1", [0, 5, 4, -1, 1]),
        (0, "1", [0, 5, 3, -1, 2]),
        (0, "1", [0, 5, 2, -1, 3]),
        (0, "1", [0, 5, 1, -1, 4]),
        (0, "1", [0, 5, 0, -1, 5]),
        (0, "1", [1, 5, 0, 1, 5]),
        (3000, "1", [0, 5, 2, -1, 3]),
        (3100, "1", [0, 5, 1, -1, 4]),
        (4000, "1", [0, 5, 1, -1, 4]),
        (8000, "1", [0, 5, 4, -1, 1]),
        (9500, "1", [0, 5, 4, -1, 1]),
        (9500, "0", [0, 5, 4, -1, 1]),
        (9500, "2", [0, 5, 2, -1, 3]),
        (9500, "5", [1, 5, 2, 3, 3]),
    ];
    let mut at = 0;
    for (i, (ms, quantity, expected)) in rows.into_iter().enumerate() {
        advance(&mut conn, "foo", ms - at);
        at = ms;
        let answer = throttle(&mut conn, &["foo", "4", "1", "1", quantity]);
        assert_eq!(answer, expected, "row {i}");
    }
}

/// The state is redis-cell's: the key holds the TAT in ns since 1970, with
/// a TTL until it no longer matters, so either module reads the other's.
#[test]
fn keeps_redis_cells_state() {
    let server = server();
    server.cli(&["CL.THROTTLE", "k", "4", "1", "1"]);
    let tat: u64 = server.cli(&["GET", "k"]).trim().parse().unwrap();
    let now: u64 = {
        let t = server.cli(&["TIME"]);
        let mut parts = t.lines().map(|l| l.trim().parse::<u64>().unwrap());
        parts.next().unwrap() * 1_000_000_000 + parts.next().unwrap() * 1000
    };
    // Written within the last few seconds, one second ahead.
    assert!(tat > now && tat <= now + 1_000_000_000, "{tat} {now}");
    let pttl: u64 = server.cli(&["PTTL", "k"]).trim().parse().unwrap();
    assert!((1..=1000).contains(&pttl), "{pttl}");
}

#[test]
fn refuses_bad_arguments_as_redis_cell_does() {
    let server = server();
    let usage =
        "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";
    for args in [
        &["CL.THROTTLE"][..],
        &["CL.THROTTLE", "k"],
        &["CL.THROTTLE", "k", "1", "2"],
        &["CL.THROTTLE", "k", "1", "2", "3", "4", "5"],
    ] {
        assert_eq!(server.cli(args).trim(), usage, "{args:?}");
    }
    assert_eq!(
        server.cli(&["CL.THROTTLE", "k", "1", "x", "3"]).trim(),
        "Cell error: Couldn't parse as integer: x"
    );
    assert_eq!(
        server.cli(&["CL.THROTTLE", "k", "1", "é", "3"]).trim(),
        "Cell error: Couldn't parse as integer: \\xc3\\xa9"
    );
    assert_eq!(
        server.cli(&["CL.THROTTLE", "k", "1", "0", "3"]).trim(),
        "Cell error: Zero rates are not supported"
    );
    // What redis-cell takes and answers nonsense for is refused.
    assert_eq!(
        server.cli(&["CL.THROTTLE", "k", "-2", "1", "3"]).trim(),
        "Cell error: max_burst must not be negative: -2"
    );
    assert_eq!(server.cli(&["LPUSH", "list", "a"]).trim(), "1");
    assert!(
        server
            .cli(&["CL.THROTTLE", "list", "1", "1", "3"])
            .starts_with("WRONGTYPE")
    );
    // A bad call changed nothing.
    assert_eq!(server.cli(&["EXISTS", "k"]).trim(), "0");
}

/// Loaded with `without-cl-throttle`, the module leaves the command to
/// redis-cell (two modules cannot register one name) and keeps its own.
#[test]
fn leaves_the_command_to_redis_cell_when_asked() {
    let module = crate::module();
    let server = tollgate_testkit::RedisServer::start_with(&[
        "--loadmodule",
        module.to_str().unwrap(),
        "without-cl-throttle",
    ]);
    assert!(
        server
            .cli(&["CL.THROTTLE", "k", "1", "1", "1"])
            .contains("unknown command")
    );
    assert_eq!(
        ints(&server.cli(&["TOLLGATE.GCRA", "g", "1", "1s", "1", "1", "AT", "5"])),
        [1, 0, 1_000_000, -1, 5]
    );
}
