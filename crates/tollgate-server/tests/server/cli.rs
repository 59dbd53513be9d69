//! `tollgate serve`'s command line against the real binary: flags and their
//! environment variables, clear failures (bad flag, unusable address, invalid
//! config, `--redis`), and graceful shutdown on SIGTERM and SIGINT.

use crate::common;

use std::process::{Command, ExitStatus};
use std::time::Instant;

use common::{SHUTDOWN, Server, config_dir, exit_of, logged_number, rls_request, tollgate};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const DAILY: &str = "
domain: daily
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 3 }
";

/// Runs `tollgate args...` to its exit (bounded) and gives its status and stderr.
fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let mut command = tollgate();
    command.args(args);
    exit_of(command)
}

#[test]
fn help_shows_every_flag_its_default_and_its_variable() {
    let output = tollgate()
        .args(["serve", "--help"])
        .output()
        .expect("the tollgate binary runs");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "--config <PATH>",
        "--http <ADDR>",
        "--grpc <ADDR>",
        "--redis <URL>",
        "--admin-token <TOKEN>",
        "--redis-timeout <DURATION>",
        "[default: 10ms]",
        "TOLLGATE_REDIS_TIMEOUT",
        "[default: 127.0.0.1:8080]",
        "[default: 127.0.0.1:8081]",
        "TOLLGATE_CONFIG",
        "TOLLGATE_HTTP",
        "TOLLGATE_GRPC",
        "TOLLGATE_REDIS",
        "TOLLGATE_ADMIN_TOKEN",
        "--allow-empty-config",
        "TOLLGATE_ALLOW_EMPTY_CONFIG",
        "--allow-domain-removal",
        "TOLLGATE_ALLOW_DOMAIN_REMOVAL",
    ] {
        assert!(help.contains(needle), "{needle} missing from:\n{help}");
    }
}

#[test]
fn a_bad_flag_fails() {
    let (status, stderr) = run_to_exit(&["serve", "--nope"]);
    assert!(!status.success());
    assert!(stderr.contains("--nope"), "{stderr}");
}

#[test]
fn an_unusable_address_fails_clearly() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("bound").port().to_string();
    let busy = format!("127.0.0.1:{port}");
    let (status, stderr) = run_to_exit(&["serve", "--http", &busy, "--grpc", "127.0.0.1:0"]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("cannot listen for HTTP on {busy}")),
        "{stderr}"
    );
    let (status, stderr) = run_to_exit(&["serve", "--http", "127.0.0.1:0", "--grpc", &busy]);
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("cannot listen for gRPC on {busy}")),
        "{stderr}"
    );
    let (status, stderr) = run_to_exit(&[
        "serve",
        "--http",
        "no-such-address",
        "--grpc",
        "127.0.0.1:0",
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("cannot listen for HTTP on no-such-address"),
        "{stderr}"
    );
}

#[test]
fn an_invalid_config_fails_with_file_line_and_reason() {
    let dir = config_dir(&[(
        "bad.yaml",
        "domain: bad\ndescriptors:\n  - key: user\n    rate_limit:\n      requests_per_unit: 5\n",
    )]);
    let path = dir.path().to_str().expect("UTF-8").to_owned();
    let (status, stderr) = run_to_exit(&[
        "serve",
        "--config",
        &path,
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "127.0.0.1:0",
    ]);
    assert!(!status.success());
    let file = dir.path().join("bad.yaml");
    assert!(stderr.contains("config does not validate"), "{stderr}");
    assert!(stderr.contains(&format!("{}:", file.display())), "{stderr}");
    assert!(stderr.contains("missing rate limit unit"), "{stderr}");

    let (status, stderr) = run_to_exit(&["serve", "--config", "/no/such/config.yaml"]);
    assert!(!status.success());
    assert!(stderr.contains("/no/such/config.yaml"), "{stderr}");
}

#[test]
fn a_bad_redis_url_is_refused() {
    let (status, stderr) = run_to_exit(&["serve", "--redis", "http://localhost:6379"]);
    assert!(!status.success());
    assert!(stderr.contains("redis://"), "{stderr}");
}

#[test]
fn a_bad_redis_timeout_is_refused() {
    for bad in ["0ms", "soon", "2m"] {
        let (status, stderr) = run_to_exit(&["serve", "--redis-timeout", bad]);
        assert!(!status.success(), "{bad}");
        assert!(stderr.contains("--redis-timeout"), "{bad}: {stderr}");
    }
}

/// The service's workers are one per CPU unless `TOKIO_WORKER_THREADS` says
/// otherwise (the advice in docs/service.md for CPUs shared with other busy
/// processes), and the listening lines say how many there are.
#[test]
fn the_worker_count_follows_tokio_worker_threads() {
    let workers_logged = |command: Command| {
        let server = Server::with_config_by(command, &[("daily.yaml", DAILY)], &[]);
        logged_number(&server.log(), "workers=")
    };
    for n in [1, 3] {
        let mut command = tollgate();
        command.env("TOKIO_WORKER_THREADS", n.to_string());
        assert_eq!(workers_logged(command), n);
    }
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut command = tollgate();
    command.env_remove("TOKIO_WORKER_THREADS");
    assert_eq!(workers_logged(command), cpus);
}

#[tokio::test]
async fn every_flag_can_come_from_the_environment() {
    let dir = config_dir(&[("daily.yaml", DAILY)]);
    let mut command = tollgate();
    command
        .env("TOLLGATE_CONFIG", dir.path())
        .env("TOLLGATE_HTTP", "127.0.0.1:0")
        .env("TOLLGATE_GRPC", "127.0.0.1:0")
        .env("TOLLGATE_ADMIN_TOKEN", "from-env");
    let server = Server::spawn(command, &["serve"], Some(dir));
    let response = server
        .grpc_client()
        .await
        .should_rate_limit(rls_request("daily", &[&[("user", "u")]]))
        .await
        .expect("answers")
        .into_inner();
    assert_eq!(
        response.statuses[0].limit_remaining, 2,
        "the config came from TOLLGATE_CONFIG"
    );
    let admin = reqwest::Client::new()
        .get(server.url("/admin/kill-switch"))
        .bearer_auth("from-env")
        .send()
        .await
        .expect("answers");
    assert_eq!(admin.status(), reqwest::StatusCode::OK);
    assert!(
        !server.log().contains("from-env"),
        "the token is never logged"
    );

    let mut with_redis = tollgate();
    with_redis
        .env("TOLLGATE_REDIS", "redis+cluster://")
        .arg("serve");
    let (status, stderr) = exit_of(with_redis);
    assert!(!status.success());
    assert!(
        stderr.contains("TOLLGATE_REDIS") || stderr.contains("--redis"),
        "{stderr}"
    );
}

// Multi-threaded, so that the clients' connections keep answering (h2
// pings) while this thread waits for the process to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_gracefully_with_connections_open() {
    let mut server = Server::start(&[]);
    // Open connections on both listeners; they must not hold the shutdown up.
    let mut client = server.grpc_client().await;
    let response = client
        .should_rate_limit(rls_request("default", &[&[("remote_address", "10.1.1.1")]]))
        .await
        .expect("answers")
        .into_inner();
    assert_eq!(response.overall_code, Code::Ok as i32);
    let http = reqwest::Client::new();
    let healthz = http
        .get(server.url("/healthz"))
        .send()
        .await
        .expect("answers");
    assert!(healthz.status().is_success());

    let started = Instant::now();
    let status = server.stop_with("TERM");
    assert!(status.success(), "exit status {status:?}\n{}", server.log());
    assert!(started.elapsed() < SHUTDOWN);
    let log = server.log();
    assert!(log.contains("SIGTERM: shutting down"), "{log}");
    assert!(log.contains("stopped"), "{log}");
    assert!(
        !log.contains("still open"),
        "the open connections closed in time: {log}"
    );
    drop(client);
}

#[test]
fn sigint_stops_gracefully() {
    let mut server = Server::start(&[]);
    let status = server.stop_with("INT");
    assert!(status.success(), "exit status {status:?}\n{}", server.log());
    assert!(server.log().contains("SIGINT: shutting down"));
}
