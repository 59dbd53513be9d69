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

use tollgate_testkit::RedisServer;

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
