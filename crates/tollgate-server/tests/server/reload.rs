//! Hot reload against a real `tollgate serve`: `POST /admin/reload`
//! reports the domains loaded or the error (path, line, field, reason)
//! while the old config keeps answering, and a config that would turn
//! limits off refuses to start unless a flag allows it.
//!
//! The watcher, which takes the service's time to notice a change, is
//! tested in process under paused time (tests/in_process.rs).

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{STARTUP, Server, config_dir, rls_request, tollgate};
use reqwest::{Client, StatusCode};
use serde_json::Value;

const ADMIN_TOKEN: &str = "reload-token";

fn config(requests_per_unit: u32) -> String {
    config_of("reload", requests_per_unit)
}

fn config_of(domain: &str, requests_per_unit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      requests_per_unit: {requests_per_unit}\n"
    )
}

/// Line 6 names a unit that does not exist.
const BROKEN: &str = "domain: reload\ndescriptors:\n  - key: user\n    rate_limit:\n      requests_per_unit: 5\n      unit: fortnight\n";

/// The `requests_per_unit` the server applies to `user` now (reported
/// whether or not this request is admitted).
async fn current_limit(server: &Server) -> Option<u32> {
    limit_in(server, "reload").await
}

/// The `requests_per_unit` that `domain` applies to `user` now.
async fn limit_in(server: &Server, domain: &str) -> Option<u32> {
    let response = server
        .grpc_client()
        .await
        .should_rate_limit(rls_request(domain, &[&[("user", "u")]]))
        .await
        .expect("ShouldRateLimit answers")
        .into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).expect("a writable config");
}

#[tokio::test]
async fn admin_reload_reports_domains_or_the_error() {
    let server = Server::with_config(&[("a.yaml", &config(1))], &["--admin-token", ADMIN_TOKEN]);
    let reload = || async {
        let response = Client::new()
            .post(server.url("/admin/reload"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("answers");
        let status = response.status();
        (status, response.json::<Value>().await.expect("JSON"))
    };
    let (status, body) = reload().await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["domains"], serde_json::json!(["reload"]));

    let file = server.config_path().join("a.yaml");
    write(&file, BROKEN);
    let (status, body) = reload().await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["path"], file.display().to_string());
    assert!(body["line"].as_u64().is_some_and(|l| l >= 4), "{body}");
    assert!(
        body["field"].as_str().is_some_and(|f| f.contains("unit")),
        "{body}"
    );
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("fortnight")),
        "{body}"
    );
    assert_eq!(
        current_limit(&server).await,
        Some(1),
        "the old config stays"
    );

    let builtin = Server::start(&["--admin-token", ADMIN_TOKEN]);
    let response = Client::new()
        .post(builtin.url("/admin/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("answers");
    assert_eq!(
        response.status(),
        StatusCode::CONFLICT,
        "nothing to reload without --config"
    );
}

/// Runs `tollgate serve` on `dir` with `args` to its exit (bounded): its
/// status and stderr.
fn serve_to_exit(dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = tollgate()
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .arg("--config")
        .arg(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the tollgate binary starts");
    let deadline = Instant::now() + STARTUP;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be polled") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tollgate serve did not exit within {STARTUP:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(
        &mut child.stderr.take().expect("stderr is piped"),
        &mut stderr,
    )
    .expect("UTF-8 stderr");
    (status, stderr)
}

#[test]
fn start_up_on_an_empty_directory_fails_unless_allowed() {
    // A file that is not a config does not count.
    let dir = config_dir(&[("README.txt", "not a config")]);
    let (status, stderr) = serve_to_exit(dir.path(), &[]);
    assert!(!status.success());
    for needle in [
        "refusing to start",
        &dir.path().display().to_string(),
        "defines no rules",
        "--allow-empty-config",
    ] {
        assert!(
            stderr.contains(needle),
            "{needle:?} missing from:\n{stderr}"
        );
    }
    // With --allow-empty-config it starts (and picks up a config that arrives
    // later: tests/in_process.rs).
    let server = Server::with_config(&[], &["--allow-empty-config"]);
    assert!(
        server.log().contains("the config has no rules"),
        "{}",
        server.log()
    );
}
