//! The module loaded into a real `redis-server`: `CL.THROTTLE` answering as
//! redis-cell does, and the `TOLLGATE.*` commands agreeing with the store's
//! Lua code on one key, and the store using the module when it is loaded.

mod check;
mod leasing;
mod lone;
mod mixed;
mod store;
mod throttle;

use std::path::PathBuf;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tollgate_testkit::{RedisCluster, RedisServer};

/// The module this test was built with: cargo builds the package's library
/// (the `.so`) before its tests, into the directory beside the test binary.
fn module() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().expect("the test binary's directory");
    let so = [
        "libtollgate_redis_module.so",
        "../libtollgate_redis_module.so",
    ]
    .iter()
    .map(|name| dir.join(name))
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("libtollgate_redis_module.so is not built in {dir:?}"));
    so.canonicalize().expect("the module's path")
}

/// A `redis-server` with the module loaded.
fn server() -> RedisServer {
    let module = module();
    let server = RedisServer::start_with(&["--loadmodule", module.to_str().expect("a UTF-8 path")]);
    assert!(
        server.cli(&["MODULE", "LIST"]).contains("tollgate"),
        "the module did not load"
    );
    server
}

/// A cluster with the module loaded, and a hash tag of a slot its node 0
/// serves: every key of a test that starts with it is on that node.
fn cluster_and_tag() -> (RedisCluster, String) {
    let module = module();
    let cluster = RedisCluster::start_with(&["--loadmodule", module.to_str().unwrap()]);
    let served = cluster.slots_of(0);
    let tag = (0..1000)
        .map(|n| format!("{{t{n}}}"))
        .find(|t| {
            let slot = cluster.keyslot(t);
            served.iter().any(|&(a, b)| (a..=b).contains(&slot))
        })
        .expect("a tag on node 0");
    (cluster, tag)
}

/// A server with the module, a replica of it without, in sync, and a
/// connection to the server.
async fn with_replica() -> (RedisServer, RedisServer, MultiplexedConnection) {
    let master = server();
    // Diskless sync waits 5 s by default for more replicas to share it.
    master.cli(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]);
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    tollgate_testkit::wait_until("the replica to sync", Duration::from_secs(10), || {
        replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
    let client = redis::Client::open(master.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    (master, replica, conn)
}

/// Waits until `replica` has applied everything `master` has written so far
/// (its replication offset): no ack to wait for, which a loaded machine can
/// hold back past `WAIT`'s timeout.
fn caught_up(master: &RedisServer, replica: &RedisServer) {
    let offset = |node: &RedisServer, field: &str| -> Option<u64> {
        let info = node.cli(&["INFO", "replication"]);
        info.lines()
            .find_map(|l| l.trim().strip_prefix(field)?.parse().ok())
    };
    let written = offset(master, "master_repl_offset:").expect("the master's offset");
    tollgate_testkit::wait_until("the replica to catch up", Duration::from_secs(10), || {
        offset(replica, "slave_repl_offset:") >= Some(written)
    });
}

/// The integers of a reply as redis-cli prints them, one a line.
fn ints(reply: &str) -> Vec<i64> {
    reply
        .lines()
        .map(|l| {
            l.trim()
                .parse()
                .unwrap_or_else(|_| panic!("not an integer reply: {reply:?}"))
        })
        .collect()
}
