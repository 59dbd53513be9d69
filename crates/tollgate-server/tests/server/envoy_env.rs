//! The binary run as envoyproxy/ratelimit's `/bin/ratelimit`: under the name
//! `ratelimit`, with no arguments, configured by its environment alone (a
//! deployment's variables and a config mounted under `RUNTIME_ROOT` as a
//! Kubernetes ConfigMap is), and `tollgate serve --envoy-env`.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::{Redis, Server, exit_of, free_port, ratelimit, rls_request, tollgate};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

fn config(requests_per_unit: u32) -> String {
    format!(
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: {requests_per_unit}\n"
    )
}

/// Writes `config.yaml` in a new timestamped directory of the ConfigMap
/// volume `dir` and swaps `..data` to it, as the kubelet does.
fn configmap(dir: &Path, stamp: &str, contents: &str) {
    let target = format!("..{stamp}");
    std::fs::create_dir_all(dir.join(&target)).expect("writable");
    std::fs::write(dir.join(&target).join("config.yaml"), contents).expect("writable");
    std::os::unix::fs::symlink(&target, dir.join("..data_tmp")).expect("a symlink");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("renamed");
    let link = dir.join("config.yaml");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/config.yaml", link).expect("a symlink");
    }
}

#[tokio::test]
async fn a_deployments_env_and_mounted_config_start_it() {
    let redis = Redis::start();
    let root = tempfile::tempdir().expect("a temp dir");
    let volume = root.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&volume).expect("writable");
    configmap(&volume, "2026_01_01_v1", &config(5));
    // Read with RUNTIME_IGNOREDOTFILES=false; it must stay out of force.
    std::fs::write(volume.join(".draft.yaml"), "not: [yaml").expect("writable");
    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    let redis_url = redis.url();
    let bin = tempfile::tempdir().expect("a temp dir");
    let mut command = ratelimit(bin.path());
    command.envs([
        ("HOST", "127.0.0.1"),
        ("PORT", &http.to_string()),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", &grpc.to_string()),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", &debug.to_string()),
        ("RUNTIME_ROOT", root.path().to_str().expect("UTF-8")),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        (
            "REDIS_URL",
            redis_url.strip_prefix("redis://").expect("a redis:// URL"),
        ),
        ("REDIS_POOL_SIZE", "10"),
        ("USE_STATSD", "false"),
        ("LOG_LEVEL", "info"),
    ]);
    let server = Server::spawn(command, &[], None);
    assert_eq!(server.http, SocketAddr::from(([127, 0, 0, 1], http)));
    assert_eq!(server.grpc, SocketAddr::from(([127, 0, 0, 1], grpc)));

    let health = reqwest::get(server.url("/healthcheck"))
        .await
        .expect("answers");
    assert_eq!(health.status(), 200);

    let json: serde_json::Value = reqwest::Client::new()
        .post(server.url("/json"))
        .body(r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#)
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON");
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 5);
    assert_eq!(json["statuses"][0]["limitRemaining"], 4);

    let answer = server
        .grpc_client()
        .await
        .should_rate_limit(rls_request("shop", &[&[("user", "ann")]]))
        .await
        .expect("ShouldRateLimit answers")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].limit_remaining, 3, "counted in Redis");

    let rlconfig = format!("http://127.0.0.1:{debug}/rlconfig");
    let dump = reqwest::get(&rlconfig)
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    assert_eq!(
        dump,
        "shop.user: unit=MINUTE requests_per_unit=5, shadow_mode: false\n"
    );

    configmap(&volume, "2026_01_01_v2", &config(7));
    let reloaded = server
        .wait_for_log(&["config reloaded"], Duration::from_secs(20))
        .await;
    assert!(reloaded, "the swap was not reloaded\n{}", server.log());
    let dump = reqwest::get(&rlconfig)
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    assert!(dump.contains("requests_per_unit=7"), "{dump}");

    let log = server.log();
    assert_eq!(
        log.matches("REDIS_POOL_SIZE=10 is ignored").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("USE_STATSD=false is ignored").count(), 1);
    assert!(
        !log.contains("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
        "{log}"
    );
}

#[test]
fn a_bad_value_is_an_error_naming_the_variable() {
    let dir = tempfile::tempdir().expect("a temp dir");
    for (var, value, needle) in [
        ("PORT", "x", "error: PORT=\"x\": not an integer"),
        ("REDIS_TYPE", "sentinel", "error: REDIS_TYPE=sentinel: "),
        (
            "REDIS_TLS",
            "true",
            "error: REDIS_TLS=true with REDIS_SOCKET_TYPE=unix",
        ),
        // envconfig's float32 (`strconv.ParseFloat(value, 32)`) refuses
        // these two.
        (
            "NEAR_LIMIT_RATIO",
            "high",
            "error: NEAR_LIMIT_RATIO=\"high\": not a number",
        ),
        (
            "NEAR_LIMIT_RATIO",
            "1e39",
            "error: NEAR_LIMIT_RATIO=\"1e39\": out of range",
        ),
        (
            "PROMETHEUS_PATH",
            "metrics",
            "error: PROMETHEUS_PATH=\"metrics\": not a path",
        ),
        (
            "PROMETHEUS_PATH",
            "/healthz",
            "error: PROMETHEUS_PATH=\"/healthz\": Tollgate serves",
        ),
    ] {
        let mut command = ratelimit(dir.path());
        // PROMETHEUS_PATH is read with USE_PROMETHEUS only.
        command.env(var, value).env("USE_PROMETHEUS", "true");
        let (status, stderr) = exit_of(command);
        assert!(!status.success(), "{var}={value} started");
        assert!(stderr.contains(needle), "{var}={value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn serve_reads_the_env_only_when_asked() {
    let mut asked = tollgate();
    asked
        .args(["serve", "--envoy-env"])
        .env("GRPC_PORT", "not-a-port");
    let (status, stderr) = exit_of(asked);
    assert!(!status.success());
    assert!(stderr.contains("GRPC_PORT=\"not-a-port\""), "{stderr}");

    let mut by_variable = tollgate();
    by_variable
        .arg("serve")
        .env("TOLLGATE_ENVOY_ENV", "true")
        .env("GRPC_PORT", "not-a-port");
    assert!(!exit_of(by_variable).0.success());

    // A platform's PORT (or any of its variables) changes nothing otherwise.
    let mut plain = tollgate();
    plain
        .env("PORT", "not-a-port")
        .env("REDIS_TLS", "true")
        .env("RUNTIME_ROOT", "/nowhere");
    let server = Server::spawn(
        plain,
        &["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"],
        None,
    );
    assert_eq!(server.http.ip(), std::net::Ipv4Addr::LOCALHOST);
}

#[test]
fn a_tls_file_that_cannot_be_used_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = common::pki::Ca::new("CA");
    let server = ca.issue(
        dir.path(),
        "server",
        &["localhost"],
        common::pki::Role::Server,
    );
    let other = ca.issue(
        dir.path(),
        "other",
        &["localhost"],
        common::pki::Role::Server,
    );
    std::fs::create_dir_all(dir.path().join("config")).expect("writable");
    std::fs::write(dir.path().join("config").join("config.yaml"), config(5)).expect("writable");
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("notes.txt");
    std::fs::write(&not_pem, "not a certificate").expect("writable");
    let path = |p: &Path| p.to_str().expect("UTF-8").to_owned();
    for (vars, needle) in [
        (
            vec![
                ("GRPC_SERVER_TLS_CERT", path(&missing)),
                ("GRPC_SERVER_TLS_KEY", path(&server.key)),
            ],
            format!("GRPC_SERVER_TLS_CERT: cannot read {}", missing.display()),
        ),
        (
            vec![
                ("GRPC_SERVER_TLS_CERT", path(&server.cert)),
                ("GRPC_SERVER_TLS_KEY", path(&not_pem)),
            ],
            format!(
                "GRPC_SERVER_TLS_KEY: {}: no PEM private key",
                not_pem.display()
            ),
        ),
        (
            vec![
                ("GRPC_SERVER_TLS_CERT", path(&server.cert)),
                ("GRPC_SERVER_TLS_KEY", path(&other.key)),
            ],
            "not a certificate and its key".to_owned(),
        ),
        (
            vec![
                ("GRPC_SERVER_TLS_CERT", path(&server.cert)),
                ("GRPC_SERVER_TLS_KEY", path(&server.key)),
                ("GRPC_CLIENT_TLS_CACERT", path(&not_pem)),
            ],
            format!(
                "GRPC_CLIENT_TLS_CACERT: {}: no PEM certificate",
                not_pem.display()
            ),
        ),
    ] {
        let mut command = ratelimit(dir.path());
        command
            .env("GRPC_SERVER_USE_TLS", "true")
            .env("RUNTIME_ROOT", dir.path())
            .env("REDIS_SOCKET_TYPE", "tcp")
            .env("REDIS_URL", "127.0.0.1:1")
            .envs(vars.iter().map(|(k, v)| (*k, v.as_str())));
        let (status, stderr) = exit_of(command);
        assert!(!status.success(), "{vars:?} started");
        assert!(stderr.contains(&needle), "{needle}: {stderr}");
    }
}
