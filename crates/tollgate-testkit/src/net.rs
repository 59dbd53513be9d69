use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on now, whose Redis Cluster bus port
/// (+10000) is free too, so that any server of the kit can take it.
pub fn free_port() -> u16 {
    for _ in 0..100 {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = l.local_addr().expect("a bound address").port();
        if port < 55_000 && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair found");
}

/// Polls `f` every 20 ms until it holds; fails the test, naming `what`, if it
/// has not held within `limit`. For waiting on another process, which no
/// injected clock can speed up.
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
