//! When the process runs out of file descriptors, a listener says so at
//! WARN, counts it in `tollgate_accept_errors_total`, and serves again once
//! descriptors come back (regression: it logged the failure only at DEBUG).
//!
//! Its own test binary: it lowers the whole process's open-file limit, which
//! no other test may share.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Resource, Rlimit, setrlimit};
use tokio::net::TcpListener;
use tollgate_server::TokioClock;
use tollgate_server::serve::{self, Args, Listeners};

/// Files this process may open beyond those open when the test starts.
const HEADROOM: u64 = 64;

fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_is_warned_counted_and_survived() {
    let log = common::capture_log();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let args = Args::parse_from(["--http", "127.0.0.1:1", "--grpc", "127.0.0.1:1"]).unwrap();
    let running = serve::start(args, Listeners { http, grpc }, Arc::new(TokioClock::new(0)))
        .await
        .expect("the service starts");
    let addr = running.http_addr();

    // Soft and hard: the service cannot raise it back.
    let limit = open_files() + HEADROOM;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    )
    .expect("a process may lower its own limit");

    // Connections until this process has no descriptor left: the client's
    // end of each, and the service's while it holds one.
    let (exhausted, at_limit) = tokio::task::spawn_blocking(move || {
        let mut held = Vec::new();
        loop {
            match std::net::TcpStream::connect(addr) {
                Ok(stream) => held.push(stream),
                Err(error) => break (held, error),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(at_limit.raw_os_error(), Some(24), "EMFILE: {at_limit}");
    // One descriptor freed and taken again by a new connection, which the
    // service then cannot accept: nothing is left for its end. The
    // service's accept retry may take a freed descriptor first (for a
    // connection already waiting): free another then.
    let mut exhausted = exhausted;
    loop {
        assert!(exhausted.pop().is_some(), "a descriptor to free");
        match std::net::TcpStream::connect(addr) {
            Ok(stream) => break exhausted.push(stream),
            Err(e) if e.raw_os_error() == Some(24) => continue,
            Err(e) => panic!("the freed descriptor: {e}"),
        }
    }

    let waiting = Arc::clone(&log);
    let warned = tokio::task::spawn_blocking(move || {
        waiting.wait_for(Duration::from_secs(10), |text| {
            text.lines().any(|l| {
                l.contains("WARN")
                    && l.contains("cannot accept a connection")
                    && l.contains("listener=\"http\"")
            })
        })
    })
    .await
    .unwrap();
    assert!(warned, "{}", log.text());

    drop(exhausted);
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("the HTTP API serves again")
        .text()
        .await
        .unwrap();
    let errors: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"tollgate_accept_errors_total{listener="http"} "#))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(errors >= 1, "{metrics}");
    running.shutdown().await.expect("a clean shutdown");
}
