//! Every door gives the same answer: the same traffic through gRPC
//! `ShouldRateLimit`, `POST /json`, `POST /v1/check` and the gateway (each
//! against its own fresh `tollgate serve`) is admitted and denied alike and
//! leaves the same per-rule metrics. Each test pins one semantics of DESIGN
//! §3 that the doors once disagreed on; the tower layer's door is pinned
//! in-process by tollgate-http's `tests/layer.rs` under the same names.

use crate::common;

use std::net::SocketAddr;

use axum::Router;
use common::{Redis, Server, config_dir, rls_request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use serde_json::{Value, json};

/// The policy the doors share: the gateway's domain, one descriptor per key.
const POLICY: &str = "
domain: gateway
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: dark
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: banned
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: dark_banned
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 0 }
";

/// The same, with failure policies (Tollgate's format).
const FAILURES: &str = "
domain: gateway
rules:
  - name: closed
    match: [{ key: closed }]
    limit: { requests: 100, per: 1h }
    failure: fail_closed
  - name: open
    match: [{ key: open }]
    limit: { requests: 100, per: 1h }
    failure: fail_open
";

/// The gateway makes one descriptor per `x-<key>` header.
const ACTIONS: &str = "
rate_limits:
  - actions: [{ request_headers: { header_name: x-user, descriptor_key: user } }]
  - actions: [{ request_headers: { header_name: x-dark, descriptor_key: dark } }]
  - actions: [{ request_headers: { header_name: x-banned, descriptor_key: banned } }]
  - actions: [{ request_headers: { header_name: x-dark_banned, descriptor_key: dark_banned } }]
  - actions: [{ request_headers: { header_name: x-closed, descriptor_key: closed } }]
  - actions: [{ request_headers: { header_name: x-open, descriptor_key: open } }]
";

#[derive(Debug, Clone, Copy)]
enum Door {
    Grpc,
    Json,
    V1,
    Gateway,
}

const DOORS: [Door; 4] = [Door::Grpc, Door::Json, Door::V1, Door::Gateway];

/// One request: its descriptors, one `(key, value)` entry each.
type Descriptors<'a> = &'a [(&'a str, &'a str)];

/// An upstream that answers 200 to everything, for the gateway.
async fn upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let addr = listener.local_addr().expect("a bound address");
    let app = Router::new().fallback(|| async { "upstream" });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// `tollgate serve` with the gateway in front of an upstream, `policy` and
/// the extra `args`.
async fn serve(policy: &str, args: &[&str]) -> (Server, tempfile::TempDir) {
    let upstream = format!("http://{}", upstream().await);
    let actions = config_dir(&[("actions.yaml", ACTIONS)]);
    let file = actions.path().join("actions.yaml");
    let mut all = vec![
        "--proxy-listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream,
        "--gateway-config",
        file.to_str().expect("a UTF-8 path"),
    ];
    all.extend_from_slice(args);
    (
        Server::with_config(&[("policy.yaml", policy)], &all),
        actions,
    )
}

/// Sends one request through `door`; whether it was admitted.
async fn send(server: &Server, door: Door, descriptors: Descriptors<'_>) -> bool {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client");
    let body = json!({"domain": "gateway", "descriptors": descriptors
        .iter()
        .map(|(k, v)| json!({"entries": [{"key": k, "value": v}]}))
        .collect::<Vec<Value>>()});
    match door {
        Door::Grpc => {
            let entries: Vec<[(&str, &str); 1]> = descriptors.iter().map(|e| [*e]).collect();
            let entries: Vec<&[(&str, &str)]> = entries.iter().map(|e| &e[..]).collect();
            let answer = server
                .grpc_client()
                .await
                .should_rate_limit(rls_request("gateway", &entries))
                .await
                .expect("an answer")
                .into_inner();
            answer.overall_code == Code::Ok as i32
        }
        Door::Json | Door::V1 => {
            let path = if matches!(door, Door::Json) {
                "/json"
            } else {
                "/v1/check"
            };
            let status = http
                .post(server.url(path))
                .json(&body)
                .send()
                .await
                .expect("an answer")
                .status();
            assert!(status == 200 || status == 429, "{door:?}: {status}");
            status == 200
        }
        Door::Gateway => {
            let mut request = http.get(format!("http://{}/echo", server.gateway()));
            for (key, value) in descriptors {
                request = request.header(format!("x-{key}"), *value);
            }
            let response = request.send().await.expect("an answer");
            let status = response.status();
            assert!(status == 200 || status == 429, "{door:?}: {status}");
            if status == 429 {
                let body: Value = response.json().await.expect("a JSON body");
                assert_eq!(body["error"], "rate_limit_exceeded");
            }
            status == 200
        }
    }
}

/// The per-rule lines of `/metrics`: decisions and shadow denials, sorted.
async fn rule_metrics(server: &Server) -> Vec<String> {
    let text = reqwest::get(server.url("/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| {
            l.starts_with("tollgate_decisions_total{")
                || l.starts_with("tollgate_shadow_denials_total{")
        })
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// Runs `traffic` through each door on a fresh server; returns, per door,
/// what was admitted and the per-rule metrics, after checking that every
/// door agrees.
async fn through_every_door(policy: &str, traffic: &[Descriptors<'_>]) -> (Vec<bool>, Vec<String>) {
    let mut answers = Vec::new();
    for door in DOORS {
        let (server, _actions) = serve(policy, &[]).await;
        let mut admitted = Vec::new();
        for descriptors in traffic {
            admitted.push(send(&server, door, descriptors).await);
        }
        answers.push((door, admitted, rule_metrics(&server).await));
    }
    let (_, admitted, metrics) = answers[0].clone();
    for (door, other_admitted, other_metrics) in &answers[1..] {
        assert_eq!(
            other_admitted, &admitted,
            "{door:?} admits differently from gRPC"
        );
        assert_eq!(
            other_metrics, &metrics,
            "{door:?} counts differently from gRPC"
        );
    }
    (admitted, metrics)
}

fn count(metrics: &[String], needle: &[&str]) -> u64 {
    metrics
        .iter()
        .filter(|l| needle.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_limits_count_denied_requests_too() {
    let traffic: [Descriptors; 3] = [
        &[("user", "alice"), ("dark", "x")],
        &[("user", "alice"), ("dark", "x")],
        &[("dark", "x")],
    ];
    let (admitted, metrics) = through_every_door(POLICY, &traffic).await;
    assert_eq!(admitted, [true, false, true]);
    // The second request, denied by `user`, still spent the shadow rule's
    // check: its would-be denial is counted, and so is the third's.
    let shadow = count(&metrics, &["tollgate_shadow_denials_total", "dark"]);
    assert_eq!(shadow, 2, "{metrics:#?}");
    let over = count(
        &metrics,
        &["tollgate_decisions_total", "over_limit", "user"],
    );
    assert_eq!(over, 1, "{metrics:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_shadow_rule_is_a_shadow_denial() {
    let traffic: [Descriptors; 3] = [
        &[("dark_banned", "x")],
        &[("dark_banned", "x"), ("user", "bob")],
        &[("banned", "x"), ("user", "carol")],
    ];
    let (admitted, metrics) = through_every_door(POLICY, &traffic).await;
    assert_eq!(admitted, [true, true, false]);
    let shadow = count(&metrics, &["tollgate_shadow_denials_total", "dark_banned"]);
    assert_eq!(shadow, 2, "{metrics:#?}");
    // The blocked rule charged nothing to the limit beside it.
    let carol = count(
        &metrics,
        &["tollgate_decisions_total", "user", "result=\"ok\""],
    );
    assert_eq!(
        carol, 2,
        "bob's admission and carol's untouched limit: {metrics:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_store_failure_is_over_limit() {
    for door in DOORS {
        let mut redis = Redis::start();
        let url = redis.url();
        // A generous timeout: on a loaded machine a healthy Redis may take
        // longer than the default 10 ms, and `closed` would then refuse.
        let args = ["--redis", &url, "--redis-timeout", "2s"];
        let (server, _actions) = serve(FAILURES, &args).await;
        assert!(send(&server, door, &[("closed", "a")]).await);
        redis.kill();
        assert!(
            !send(&server, door, &[("closed", "a"), ("open", "a")]).await,
            "{door:?}: a fail_closed rule refuses while its store is down"
        );
        assert!(
            send(&server, door, &[("open", "a")]).await,
            "{door:?}: a fail_open rule admits"
        );
    }
}

/// One request may not carry more than 128 descriptors: gRPC answers
/// INVALID_ARGUMENT and the JSON doors 400, each saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_refused_at_every_door() {
    let (server, _actions) = serve(POLICY, &[]).await;
    let values: Vec<String> = (0..129).map(|i| format!("u{i}")).collect();
    let entries: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("user", v.as_str())]).collect();
    let entries: Vec<&[(&str, &str)]> = entries.iter().map(|e| &e[..]).collect();
    let status = server
        .grpc_client()
        .await
        .should_rate_limit(rls_request("gateway", &entries))
        .await
        .expect_err("too many descriptors");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("at most 128"),
        "{}",
        status.message()
    );
    let body = json!({"domain": "gateway", "descriptors": values
        .iter()
        .map(|v| json!({"entries": [{"key": "user", "value": v}]}))
        .collect::<Vec<Value>>()});
    let post = |path: &str, body: &Value| {
        reqwest::Client::new()
            .post(server.url(path))
            .json(body)
            .send()
    };
    let response = post("/v1/check", &body).await.expect("an answer");
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("a JSON body");
    assert!(
        error["error"]
            .as_str()
            .unwrap_or_default()
            .contains("at most 128"),
        "{error}"
    );
    // As envoyproxy/ratelimit answers what it refuses.
    let response = post("/json", &body).await.expect("an answer");
    assert_eq!(response.status(), 400);
    assert_eq!(response.text().await.expect("a body"), "Bad Request\n");
}

/// The two Envoy doors answer what envoyproxy/ratelimit answers (see
/// `tests/grpc.rs` for where it says so) alike, and `/v1/check` refuses it:
/// a descriptor without entries or with an empty key has no limit, an
/// override of 0 is over the limit, an empty domain is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_doors_answer_malformed_requests_as_envoyproxy_ratelimit_does() {
    let (server, _actions) = serve(POLICY, &[]).await;
    let zero = json!({"requestsPerUnit": 0, "unit": "MINUTE"});
    let cases = [
        (
            json!({"domain": "gateway", "descriptors": [{"entries": []}]}),
            Some(Code::Ok),
        ),
        (
            json!({"domain": "gateway", "descriptors": [{"entries": [{"key": "", "value": "x"}]}]}),
            Some(Code::Ok),
        ),
        (
            json!({"domain": "gateway", "descriptors": [{"entries": [{"key": "user", "value": "z"}], "limit": zero}]}),
            Some(Code::OverLimit),
        ),
        (
            json!({"domain": "", "descriptors": [{"entries": [{"key": "user", "value": "z"}]}]}),
            None,
        ),
    ];
    let http = reqwest::Client::new();
    for (body, expected) in cases {
        let request: RateLimitRequest = grpc_request(&body);
        let grpc = server.grpc_client().await.should_rate_limit(request).await;
        let json = http
            .post(server.url("/json"))
            .json(&body)
            .send()
            .await
            .expect("an answer");
        let v1 = http
            .post(server.url("/v1/check"))
            .json(&native(&body))
            .send()
            .await
            .expect("an answer");
        assert_eq!(v1.status(), 400, "{body}");
        match expected {
            Some(code) => {
                let grpc = grpc.expect("an answer").into_inner();
                assert_eq!(grpc.overall_code, code as i32, "{body}");
                let status = if code == Code::Ok { 200 } else { 429 };
                assert_eq!(json.status(), status, "{body}");
                let answer: Value = json.json().await.expect("a JSON answer");
                assert_eq!(
                    answer["statuses"].as_array().map(Vec::len),
                    Some(1),
                    "{answer}"
                );
                let limit = &answer["statuses"][0]["currentLimit"];
                assert_eq!(
                    grpc.statuses[0].current_limit.is_some(),
                    !limit.is_null(),
                    "{body}"
                );
            }
            None => {
                let status = grpc.expect_err("refused");
                assert_eq!(status.code(), tonic::Code::Unknown);
                assert_eq!(json.status(), 400, "{body}");
            }
        }
    }
}

/// `body` (a `/json` request) as gRPC's request.
fn grpc_request(body: &Value) -> RateLimitRequest {
    let descriptors = body["descriptors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| RateLimitDescriptor {
            entries: d["entries"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| Entry {
                    key: e["key"].as_str().unwrap_or_default().to_owned(),
                    value: e["value"].as_str().unwrap_or_default().to_owned(),
                })
                .collect(),
            limit: d.get("limit").map(|l| RateLimitOverride {
                requests_per_unit: l["requestsPerUnit"]
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or_default(),
                unit: Unit::from_str_name(l["unit"].as_str().unwrap_or_default())
                    .map_or(0, |u| u as i32),
            }),
            ..RateLimitDescriptor::default()
        })
        .collect();
    RateLimitRequest {
        domain: body["domain"].as_str().unwrap_or_default().to_owned(),
        descriptors,
        ..RateLimitRequest::default()
    }
}

/// `body` (a `/json` request) as `/v1/check`'s policy check.
fn native(body: &Value) -> Value {
    let mut body = body.clone();
    for d in body["descriptors"].as_array_mut().into_iter().flatten() {
        if let Some(limit) = d.get("limit").cloned() {
            d["limit"] = json!({
                "requests_per_unit": limit["requestsPerUnit"],
                "unit": limit["unit"].as_str().unwrap_or_default().to_lowercase(),
            });
        }
    }
    body
}
