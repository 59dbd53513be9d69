//! Shedding where Tollgate does not see the protected service: the service
//! reports its utilization (`POST /v1/utilization`, or a check's own
//! `utilization`), and every door sheds a domain's checks by priority tier
//! alike: the HTTP API with 503 and `Retry-After`, Envoy's APIs (gRPC and
//! `/json`) with `OVER_LIMIT` and a `retry-after` header for Envoy to add.
//! In process, on paused time, so a report's lapse passes at once.

use std::time::Duration;

use crate::common::rls_request;
use crate::in_process::{arrived, client, gateway_of, live_json, metrics, start};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use tollgate_server::serve::Running;

/// Two requests an hour per user; the service behind sheds by the tier in
/// the `priority` entry.
const SHEDDING: &str = "
domain: api
shed:
  thresholds: { critical: 100, high: 75, low: 50 }
  report_ttl: 10s
  retry_after: 2s
rules:
  - name: per-user
    match: [{ key: user }]
    limit: { requests: 2, per: 1h }
";

async fn post(running: &Running, path: &str, body: Value) -> (u16, Option<String>, Value) {
    let response = client()
        .post(format!("http://{}{path}", running.http_addr()))
        .json(&body)
        .send()
        .await
        .expect("the HTTP API answers");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("an ASCII header").to_owned());
    (
        status,
        retry_after,
        response.json().await.expect("a JSON body"),
    )
}

/// A check of user `u1` in `tier`, the tier in a descriptor of its own.
fn check(tier: &str) -> Value {
    json!({"domain": "api", "descriptors": [
        {"entries": [{"key": "user", "value": "u1"}]},
        {"entries": [{"key": "priority", "value": tier}]},
    ]})
}

async fn report(running: &Running, body: Value) -> (u16, Value) {
    let (status, _, body) = post(running, "/v1/utilization", body).await;
    (status, body)
}

#[tokio::test(start_paused = true)]
async fn the_http_api_sheds_by_tier_with_503_and_retry_after_until_the_report_lapses() {
    let (running, _dir) = start(&[("api.yaml", SHEDDING)], &[]).await;
    let (status, body) = report(
        &running,
        json!({"domain": "api", "instance": "pod-1", "in_flight": 6, "limit": 10}),
    )
    .await;
    assert_eq!(
        (status, &body),
        (
            200,
            &json!({"domain": "api", "utilization": 0.6, "instances": 1})
        )
    );

    let (status, retry_after, body) = post(&running, "/v1/check", check("low")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry_after.as_deref(), Some("2"));
    assert_eq!(body["code"], "shed");
    assert_eq!(body["tier"], "low");
    assert_eq!(body["utilization"], 0.6);
    assert_eq!(body["retry_after_ms"], 2000);
    assert_eq!(body["allowed"], false);

    // A shed request was charged nothing: both of the user's requests are
    // left for the tiers still admitted.
    for tier in ["high", "critical"] {
        let (status, _, body) = post(&running, "/v1/check", check(tier)).await;
        assert_eq!(status, 200, "{tier}: {body}");
    }
    let (status, _, body) = post(&running, "/v1/check", check("critical")).await;
    assert_eq!(status, 429, "{body}");

    let metrics = metrics(&running).await;
    for line in [
        r#"tollgate_reported_utilization{domain="api"} 0.6"#,
        r#"tollgate_reported_instances{domain="api"} 1"#,
        r#"tollgate_enforcer_shed_total{domain="api",tier="low"} 1"#,
        r#"tollgate_checks_total{api="v1",result="shed"} 1"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    let live: Value = live_json(&running).await;
    assert_eq!(
        live["shedding"],
        json!({"gateway": null, "reported": [
            {"domain": "api", "utilization": 0.6, "instances": 1, "shed": [0, 0, 1]}
        ]})
    );

    // The service stops reporting: ten seconds later it is no longer shed for.
    tokio::time::sleep(Duration::from_millis(10_001)).await;
    let (status, _, body) = post(&running, "/v1/check", check("low")).await;
    assert_eq!(status, 429, "shed no more, over the user's limit: {body}");
    assert_eq!(body["descriptors"][0]["state"], "limited");
}

#[tokio::test(start_paused = true)]
async fn a_checks_own_utilization_sheds_it_through_the_http_api() {
    let (running, _dir) = start(&[("api.yaml", SHEDDING)], &[]).await;
    let mut high = check("high");
    high["utilization"] = json!(0.8);
    let (status, retry_after, body) = post(&running, "/v1/check", high).await;
    assert_eq!((status, retry_after.as_deref()), (503, Some("2")), "{body}");
    assert_eq!(body["tier"], "high");
    let mut critical = check("critical");
    critical["utilization"] = json!(0.8);
    let (status, _, body) = post(&running, "/v1/check", critical).await;
    assert_eq!(status, 200, "{body}");
    let mut bad = check("low");
    bad["utilization"] = json!(-1);
    let (status, _, body) = post(&running, "/v1/check", bad).await;
    assert_eq!(status, 400);
    assert!(
        body["error"].as_str().unwrap().contains("utilization"),
        "{body}"
    );
}

#[tokio::test(start_paused = true)]
async fn bad_reports_get_a_clear_400_and_change_nothing() {
    let (running, _dir) = start(&[("api.yaml", SHEDDING)], &[]).await;
    for (body, needle) in [
        (json!({"domain": "api"}), "expected `utilization`"),
        (
            json!({"domain": "api", "utilization": 0.5, "in_flight": 1, "limit": 2}),
            "expected `utilization`",
        ),
        (
            json!({"domain": "api", "in_flight": 1}),
            "expected `utilization`",
        ),
        (
            json!({"domain": "api", "in_flight": 1, "limit": 0}),
            "limit must be at least 1",
        ),
        (
            json!({"domain": "api", "utilization": -0.5}),
            "finite number >= 0",
        ),
        (
            json!({"domain": "nowhere", "utilization": 0.9}),
            "does not shed",
        ),
        (
            json!({"domain": "api", "utilization": 0.9, "extra": 1}),
            "unknown field",
        ),
    ] {
        let (status, answer) = report(&running, body.clone()).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        let error = answer["error"].as_str().expect("an error message");
        assert!(error.contains(needle), "{body} -> {error}");
    }
    let (status, _, body) = post(&running, "/v1/check", check("low")).await;
    assert_eq!(status, 200, "nothing was reported: {body}");
}

#[tokio::test(start_paused = true)]
async fn envoys_apis_answer_a_shed_with_over_limit_and_retry_after() {
    let (running, _dir) = start(&[("api.yaml", SHEDDING)], &[]).await;
    let (status, _) = report(&running, json!({"domain": "api", "utilization": 0.8})).await;
    assert_eq!(status, 200);

    let mut grpc = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr()))
        .await
        .expect("the gRPC listener accepts");
    let ask = async |grpc: &mut RateLimitServiceClient<_>, tier| {
        grpc.should_rate_limit(rls_request(
            "api",
            &[&[("user", "u1")], &[("priority", tier)]],
        ))
        .await
        .expect("ShouldRateLimit answers")
        .into_inner()
    };
    let shed = ask(&mut grpc, "high").await;
    assert_eq!(shed.overall_code, Code::OverLimit as i32);
    let retry: Vec<_> = shed
        .response_headers_to_add
        .iter()
        .filter(|h| h.key == "retry-after")
        .map(|h| h.value.as_str())
        .collect();
    assert_eq!(retry, ["2"]);
    let critical = ask(&mut grpc, "critical").await;
    assert_eq!(critical.overall_code, Code::Ok as i32);
    assert!(
        critical
            .response_headers_to_add
            .iter()
            .all(|h| h.key != "retry-after")
    );

    let (status, _, body) = post(
        &running,
        "/json",
        json!({"domain": "api", "descriptors": [
            {"entries": [{"key": "user", "value": "u2"}]},
            {"entries": [{"key": "priority", "value": "low"}]},
        ]}),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["overallCode"], "OVER_LIMIT");
    let headers = body["responseHeadersToAdd"].as_array().expect("headers");
    assert!(
        headers.contains(&json!({"key": "retry-after", "value": "2"})),
        "{body}"
    );
}

/// stripe.yaml's shape, shedding on reported utilization: the gateway makes
/// the `priority` descriptor from `x-priority`.
const GATEWAY: &str = "
domain: api
shed:
  retry_after: 3s
rules:
  - name: per-client
    match: [{ key: remote_address }]
    limit: { requests: 100, per: 1s }
gateway:
  domain: api
  rate_limits:
    - actions:
        - remote_address: {}
    - actions:
        - request_headers: { header_name: x-priority, descriptor_key: priority }
";

#[tokio::test(start_paused = true)]
async fn the_gateway_sheds_on_reported_utilization_with_503_before_the_upstream() {
    // The policy's own file, read again for its `gateway:` section.
    let (running, arrivals, _dirs) = gateway_of("api.yaml", GATEWAY).await;
    let (status, _) = report(&running, json!({"domain": "api", "utilization": 0.9})).await;
    assert_eq!(status, 200);
    let base = format!("http://{}", running.gateway_addr().expect("a gateway"));
    let get = async |path: &str, tier: &str| {
        let response = client()
            .get(format!("{base}{path}"))
            .header("x-priority", tier)
            .send()
            .await
            .expect("the gateway answers");
        let retry_after = response.headers().get("retry-after").cloned();
        (response.status().as_u16(), retry_after)
    };
    let (status, retry_after) = get("/low", "low").await;
    assert_eq!(status, 503);
    assert_eq!(retry_after.expect("a Retry-After"), "3");
    assert_eq!(get("/critical", "critical").await.0, 200);
    let paths = arrived(&arrivals);
    assert_eq!(
        paths,
        ["/critical"],
        "a shed request never reaches the upstream"
    );
    let metrics = metrics(&running).await;
    let line = r#"tollgate_checks_total{api="gateway",result="shed"} 1"#;
    assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
}
