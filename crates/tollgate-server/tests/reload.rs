//! Hot reload against a real `tollgate serve`: a changed file is picked up
//! (written in place or renamed over), a broken one is reported with its
//! path, line and reason and counted while the old config keeps answering,
//! and `POST /admin/reload` does the same on demand.
//!
//! The watcher polls twice a second; tests wait for it in bounded loops.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Server, rls_request};
use reqwest::{Client, StatusCode};
use serde_json::Value;

/// How long the watcher may take on a loaded machine.
const WITHIN: Duration = Duration::from_secs(30);

const ADMIN_TOKEN: &str = "reload-token";

fn config(requests_per_unit: u32) -> String {
    format!(
        "domain: reload\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      requests_per_unit: {requests_per_unit}\n"
    )
}

/// Line 6 names a unit that does not exist.
const BROKEN: &str = "domain: reload\ndescriptors:\n  - key: user\n    rate_limit:\n      requests_per_unit: 5\n      unit: fortnight\n";

/// The `requests_per_unit` the server applies to `user` now (reported
/// whether or not this request is admitted).
async fn current_limit(server: &Server) -> Option<u32> {
    let response = server
        .grpc_client()
        .await
        .should_rate_limit(rls_request("reload", &[&[("user", "u")]]))
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
