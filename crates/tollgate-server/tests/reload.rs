//! Hot reload against a real `tollgate serve`: a changed file is picked up
//! (written in place or renamed over), a broken one is reported with its
//! path, line and reason and counted while the old config keeps answering,
//! and `POST /admin/reload` does the same on demand.
//!
//! A config that would silently turn limits off (an emptied directory, a
//! domain gone) is refused unless a flag allows it, at start-up and on
//! reload.
//!
//! The watcher polls twice a second; tests wait for it in bounded loops.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{STARTUP, Server, config_dir, rls_request, tollgate};
use reqwest::{Client, StatusCode};
use serde_json::Value;

/// How long the watcher may take on a loaded machine.
const WITHIN: Duration = Duration::from_secs(30);

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

/// Waits (bounded) until the server applies `limit`.
async fn wait_for_limit(server: &Server, limit: u32) {
    let deadline = Instant::now() + WITHIN;
    while Instant::now() < deadline {
        if current_limit(server).await == Some(limit) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the limit did not become {limit} within {WITHIN:?}\n{}",
        server.log()
    );
}

async fn metrics(server: &Server) -> String {
    reqwest::get(server.url("/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("text")
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).expect("a writable config");
}

#[tokio::test]
async fn a_changed_file_is_picked_up() {
    let server = Server::with_config(&[("a.yaml", &config(1))], &[]);
    assert_eq!(current_limit(&server).await, Some(1));
    write(&server.config_path().join("a.yaml"), &config(5));
    wait_for_limit(&server, 5).await;
    assert!(server.wait_for_log(&["config reloaded"], WITHIN).await);
    let metrics = metrics(&server).await;
    assert!(
        metrics.contains(r#"tollgate_config_reloads_total{result="ok",trigger="watch"}"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_file_renamed_over_the_old_one_is_picked_up() {
    let server = Server::with_config(&[("a.yaml", &config(1))], &[]);
    let dir = server.config_path();
    // What many editors do: write a new file, then rename it over the old.
    write(&dir.join(".a.yaml.swp"), &config(7));
    std::fs::rename(dir.join(".a.yaml.swp"), dir.join("a.yaml")).expect("rename");
    wait_for_limit(&server, 7).await;
    // A new file in the directory is read too.
    write(
        &dir.join("b.yml"),
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 2 }\n",
    );
    assert!(
        server
            .wait_for_log(&["config reloaded", "other"], WITHIN)
            .await,
        "{}",
        server.log()
    );
}

#[tokio::test]
async fn a_broken_file_is_reported_and_the_old_config_stays() {
    let server = Server::with_config(&[("a.yaml", &config(3))], &[]);
    let file = server.config_path().join("a.yaml");
    write(&file, BROKEN);
    let at = format!("{}:", file.display());
    let reported = server
        .wait_for_log(&["config reload failed", &at, "unit", "fortnight"], WITHIN)
        .await;
    assert!(reported, "{}", server.log());
    let line = server
        .log()
        .lines()
        .find(|l| l.contains("config reload failed"))
        .map(str::to_owned)
        .unwrap_or_default();
    let position = line.split(&at).nth(1).unwrap_or_default();
    let line_number: u64 = position
        .split(':')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(line_number >= 4, "a line number is given: {line}");

    assert_eq!(
        current_limit(&server).await,
        Some(3),
        "the last good config stays in force"
    );
    let metrics = metrics(&server).await;
    // At least one: a write caught half-done for a whole poll may fail too.
    let failures: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"tollgate_config_reloads_total{result="error",trigger="watch"} "#)
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(failures >= 1, "{metrics}");

    // Fixed again: reloaded.
    write(&file, &config(4));
    wait_for_limit(&server, 4).await;
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

/// The value of the counter line that starts with `series` (0 when absent).
fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn readyz(server: &Server) -> (StatusCode, String) {
    let response = reqwest::get(server.url("/readyz")).await.expect("answers");
    (response.status(), response.text().await.expect("text"))
}

#[tokio::test]
async fn an_emptied_directory_keeps_the_old_limits() {
    let server = Server::with_config(&[("a.yaml", &config(3))], &[]);
    let dir = server.config_path();
    // A ConfigMap whose keys were removed, or the `rm` of an `rm; cp` deploy.
    std::fs::remove_file(dir.join("a.yaml")).expect("removable");
    let refused = server
        .wait_for_log(
            &[
                "ERROR",
                "config reload refused",
                "defines no rules",
                "--allow-empty-config",
            ],
            WITHIN,
        )
        .await;
    assert!(refused, "{}", server.log());
    assert_eq!(current_limit(&server).await, Some(3), "still enforced");
    let metrics = metrics(&server).await;
    assert_eq!(
        counter(
            &metrics,
            r#"tollgate_config_reloads_total{result="refused",trigger="watch"}"#
        ),
        1,
        "{metrics}"
    );
    let (status, body) = readyz(&server).await;
    assert_eq!(status, StatusCode::OK, "the last good config is enforced");
    assert!(
        body.contains("last config reload refused") && body.contains("defines no rules"),
        "{body}"
    );

    // The deploy's copy lands: reloaded, and readiness no longer complains.
    write(&dir.join("a.yaml"), &config(6));
    wait_for_limit(&server, 6).await;
    assert_eq!(readyz(&server).await.1, "ready\n");
}

#[tokio::test]
async fn removing_one_of_two_domains_is_refused() {
    let server = Server::with_config(
        &[("a.yaml", &config(3)), ("b.yaml", &config_of("other", 2))],
        &["--admin-token", ADMIN_TOKEN],
    );
    std::fs::remove_file(server.config_path().join("b.yaml")).expect("removable");
    let refused = server
        .wait_for_log(
            &[
                "ERROR",
                "config reload refused",
                "drops domains in force: other",
                "--allow-domain-removal",
            ],
            WITHIN,
        )
        .await;
    assert!(refused, "{}", server.log());
    assert_eq!(limit_in(&server, "other").await, Some(2), "still enforced");

    // On demand too: 409, with the domains it would drop.
    let response = Client::new()
        .post(server.url("/admin/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["refused"], true, "{body}");
    assert_eq!(body["removed_domains"], serde_json::json!(["other"]));
    let metrics = metrics(&server).await;
    assert_eq!(
        counter(
            &metrics,
            r#"tollgate_config_reloads_total{result="refused",trigger="admin"}"#
        ),
        1,
        "{metrics}"
    );
    assert_eq!(limit_in(&server, "other").await, Some(2));
}

#[tokio::test]
async fn the_allow_flags_let_domains_and_every_rule_go() {
    let server = Server::with_config(
        &[("a.yaml", &config(3)), ("b.yaml", &config_of("other", 2))],
        &["--allow-domain-removal", "--allow-empty-config"],
    );
    let dir = server.config_path();
    std::fs::remove_file(dir.join("b.yaml")).expect("removable");
    let reloaded = server
        .wait_for_log(&["config reloaded", r#"domains=["reload"]"#], WITHIN)
        .await;
    assert!(reloaded, "{}", server.log());
    assert_eq!(limit_in(&server, "other").await, None, "no longer limited");

    std::fs::remove_file(dir.join("a.yaml")).expect("removable");
    let reloaded = server
        .wait_for_log(&["config reloaded", "domains=[]"], WITHIN)
        .await;
    assert!(reloaded, "{}", server.log());
    assert_eq!(current_limit(&server).await, None, "no longer limited");
    assert!(!server.log().contains("refused"), "{}", server.log());
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

#[tokio::test]
async fn start_up_on_an_empty_directory_fails_unless_allowed() {
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

    let server = Server::with_config(&[], &["--allow-empty-config"]);
    assert!(
        server
            .wait_for_log(&["WARN", "the config has no rules"], WITHIN)
            .await,
        "{}",
        server.log()
    );
    assert_eq!(limit_in(&server, "reload").await, None);
    // And a config that arrives later is loaded.
    write(&server.config_path().join("a.yaml"), &config(2));
    wait_for_limit(&server, 2).await;
}
