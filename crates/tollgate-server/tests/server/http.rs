//! The HTTP API against a real `tollgate serve`: `/json` in
//! envoyproxy/ratelimit's shape, `/v1/check` in both its shapes with headers,
//! `/metrics`, `/healthz`, `/readyz`, `/healthcheck`, errors, and the admin
//! API.

use crate::common;

use common::{Server, tollgate};
use reqwest::header::HeaderMap;
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};

/// Day-long limits, so that counting does not depend on window boundaries.
const DAILY: &str = "
domain: daily
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 1
";

const ADMIN_TOKEN: &str = "test-admin-token";

fn daily_server() -> Server {
    Server::with_config(&[("daily.yaml", DAILY)], &["--admin-token", ADMIN_TOKEN])
}

/// The service's `/metrics` text.
async fn scrape(server: &Server) -> String {
    reqwest::get(server.url("/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("text")
}

async fn post(server: &Server, path: &str, body: &str) -> Response {
    Client::new()
        .post(server.url(path))
        .body(body.to_owned())
        .send()
        .await
        .expect("the HTTP listener answers")
}

async fn post_json(server: &Server, path: &str, body: Value) -> (StatusCode, Value, HeaderMap) {
    let response = post(server, path, &body.to_string()).await;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.json().await.expect("a JSON body");
    (status, body, headers)
}

fn header(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

async fn admin(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = Client::new()
        .request(method, server.url(path))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(body) = body {
        request = request.body(body.to_string());
    }
    let response = request.send().await.expect("the HTTP listener answers");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn now_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[tokio::test]
async fn json_endpoint_speaks_envoyproxy_ratelimit() {
    let server = Server::start(&[]);
    // As envoyproxy/ratelimit's README sends it: no content type.
    let body = r#"{"domain": "default", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]}"#;
    let response = post(&server, "/json", body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let json: Value = response.json().await.expect("JSON");
    assert_eq!(json["overallCode"], "OK");
    let status = &json["statuses"][0];
    assert_eq!(status["code"], "OK");
    assert_eq!(status["currentLimit"]["requestsPerUnit"], 10);
    assert_eq!(status["currentLimit"]["unit"], "SECOND");
    assert_eq!(status["limitRemaining"], 19);
    let reset = status["durationUntilReset"]
        .as_str()
        .expect("a duration string");
    assert!(reset.ends_with('s'), "{reset}");
    let headers = json["responseHeadersToAdd"].as_array().expect("headers");
    assert!(
        headers
            .iter()
            .any(|h| h["key"] == "X-RateLimit-Limit" && h["value"] == "10")
    );
}

#[tokio::test]
async fn json_endpoint_status_codes() {
    let server = daily_server();
    let request = json!({"domain": "daily", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}], "hitsAddend": 3});
    let (status, body, _) = post_json(&server, "/json", request.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body["statuses"][0].get("limitRemaining").is_none(),
        "zero is left out: {body}"
    );
    let (status, body, _) = post_json(&server, "/json", request).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["overallCode"], "OVER_LIMIT");
    assert_eq!(body["statuses"][0]["code"], "OVER_LIMIT");

    let unknown =
        json!({"domain": "nobody", "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]});
    let (status, body, _) = post_json(&server, "/json", unknown).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"overallCode": "OK", "statuses": [{"code": "OK"}]})
    );
}

/// Every request `/json` cannot read or check gets what envoyproxy/ratelimit
/// writes: `TestJsonHandler` in its `test/server/server_impl_test.go` (no
/// body, a body that is not JSON, a service error such as `{"domain":
/// "foo"}` with no descriptors).
#[tokio::test]
async fn json_endpoint_errors_are_envoyproxy_ratelimits_bad_request() {
    let server = daily_server();
    for bad in [
        "",
        "}",
        r#"{"domain": "foo"}"#,
        r#"{"domain": "", "descriptors": [{"entries": [{"key": "user"}]}]}"#,
        r#"{"domain": "daily", "descriptors": [{"entries": [{"key": 7}]}]}"#,
        r#"{"domain": "daily", "descriptors": [{"entries": [{"key": "user"}]}], "extra": 1}"#,
        r#"{"domain": "daily", "descriptors": [{"entries": [{"key": "user"}], "limit": {"requestsPerUnit": 1}}]}"#,
    ] {
        let response = post(&server, "/json", bad).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        let content_type = response.headers().get("content-type").cloned();
        assert_eq!(
            content_type.as_ref().and_then(|v| v.to_str().ok()),
            Some("text/plain; charset=utf-8"),
            "{bad}"
        );
        assert_eq!(response.text().await.expect("a body"), "Bad Request\n");
    }
    // Any method reaches the handler, whose empty body is no request.
    let response = reqwest::get(server.url("/json")).await.expect("answers");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.text().await.expect("a body"), "Bad Request\n");
}

/// envoyproxy/ratelimit's probe: 200 `OK` while healthy, on any method, as
/// its router takes it (`src/server/health.go`, `ServeHTTP`).
#[tokio::test]
async fn healthcheck_answers_ok() {
    let server = daily_server();
    for method in [reqwest::Method::GET, reqwest::Method::POST] {
        let response = Client::new()
            .request(method.clone(), server.url("/healthcheck"))
            .send()
            .await
            .expect("answers");
        assert_eq!(response.status(), StatusCode::OK, "{method}");
        let content_type = response.headers().get("content-type").cloned();
        assert_eq!(
            content_type.as_ref().and_then(|v| v.to_str().ok()),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(response.text().await.expect("a body"), "OK");
    }
}

#[tokio::test]
async fn v1_check_policy_shape_with_headers() {
    let server = daily_server();
    let request = json!({"domain": "daily", "descriptors": [
        {"entries": [{"key": "user", "value": "b"}]},
        {"entries": [{"key": "nothing", "value": "here"}]}
    ]});
    let (status, body, response) = post_json(&server, "/v1/check", request.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["allowed"], true);
    assert_eq!(body["limit"], 3);
    assert_eq!(body["remaining"], 2);
    assert_eq!(body["retry_after_ms"], Value::Null);
    assert_eq!(body["delay_ms"], 0);
    let reset_ms = body["reset_after_ms"].as_u64().expect("a reset");
    assert!(reset_ms <= 86_400_000);
    assert_eq!(body["descriptors"][0]["state"], "limited");
    assert_eq!(body["descriptors"][0]["rule"], "user");
    assert_eq!(
        body["descriptors"][1],
        json!({
            "allowed": true, "state": "no_rule", "rule": null, "limit": null,
            "remaining": null, "reset_after_ms": null, "retry_after_ms": null
        })
    );
    assert_eq!(header(&response, "x-ratelimit-limit"), Some(3));
    assert_eq!(header(&response, "x-ratelimit-remaining"), Some(2));
    let reset = header(&response, "x-ratelimit-reset").expect("an epoch reset");
    assert!(
        reset >= now_epoch() && reset <= now_epoch() + 86_400,
        "{reset}"
    );
    assert!(response.get("retry-after").is_none());
    let policy = response
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok());
    assert_eq!(
        policy,
        Some(r#""user";q=3;w=86400"#),
        "the IETF draft fields too"
    );

    let (_, body, _) = post_json(
        &server,
        "/v1/check",
        json!({"domain": "daily", "hits_addend": 2,
        "descriptors": [{"entries": [{"key": "user", "value": "b"}]}]}),
    )
    .await;
    assert_eq!(body["remaining"], 0);
    let (status, body, response) = post_json(&server, "/v1/check", request).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["allowed"], false);
    assert_eq!(body["descriptors"][0]["allowed"], false);
    let retry_ms = body["retry_after_ms"].as_u64().expect("a retry time");
    let retry = header(&response, "retry-after").expect("Retry-After on 429");
    assert_eq!(retry, retry_ms.div_ceil(1000));
    assert_eq!(
        header(&response, "x-ratelimit-reset"),
        Some(reset),
        "the reset is stable"
    );
}

/// `/v1/check`'s answer, admitted and denied, carries the length of its
/// body over HTTP/1.1 and HTTP/2: hyper writes it from the body, as the
/// router's route would have put it in the map.
#[tokio::test]
async fn v1_check_answers_carry_their_content_length() {
    use http_body_util::{BodyExt, Full};
    use hyper::client::conn::{http1, http2};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let server = daily_server();
    let request = |user: &str| {
        let body = json!({"domain": "daily",
            "descriptors": [{"entries": [{"key": "tenant", "value": user}]}]});
        hyper::Request::post(server.url("/v1/check"))
            .header("host", "tollgate")
            .body(Full::new(bytes::Bytes::from(body.to_string())))
            .expect("a valid request")
    };
    let connect = || async {
        TokioIo::new(
            tokio::net::TcpStream::connect(server.http)
                .await
                .expect("the HTTP listener accepts"),
        )
    };
    let mut answers = Vec::new();
    let (mut h1, connection) = http1::handshake(connect().await).await.expect("HTTP/1.1");
    tokio::spawn(connection);
    let (mut h2, connection) = http2::handshake(TokioExecutor::new(), connect().await)
        .await
        .expect("HTTP/2");
    tokio::spawn(connection);
    for (version, user) in [("HTTP/1.1", "one"), ("HTTP/2", "two")] {
        // The tenant's limit is one a day: admitted, then denied.
        for expected in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
            let response = if version == "HTTP/1.1" {
                h1.send_request(request(user)).await
            } else {
                h2.send_request(request(user)).await
            }
            .expect("an answer");
            let (parts, body) = response.into_parts();
            let body = body.collect().await.expect("a body").to_bytes();
            answers.push((version, parts.status, parts.headers, body));
            assert_eq!(answers.last().map(|a| a.1), Some(expected), "{version}");
        }
    }
    for (version, status, headers, body) in answers {
        let length = headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        assert_eq!(length, Some(body.len()), "{version} {status}: {headers:?}");
        assert!(
            headers.contains_key("x-ratelimit-remaining"),
            "{version} {status}"
        );
    }
}

#[tokio::test]
async fn v1_headers_picks_the_families_and_every_limit_in_ratelimit() {
    let server = Server::with_config(
        &[("daily.yaml", DAILY)],
        &["--v1-headers", "reset-after,draft-every-limit"],
    );
    let request = json!({"domain": "daily", "descriptors": [
        {"entries": [{"key": "user", "value": "c"}]},
        {"entries": [{"key": "tenant", "value": "t"}]}
    ]});
    let (status, _, headers) = post_json(&server, "/v1/check", request).await;
    assert_eq!(status, StatusCode::OK);
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        text("ratelimit-policy").as_deref(),
        Some(r#""user";q=3;w=86400, "tenant";q=1;w=86400"#)
    );
    let every = text("ratelimit").expect("RateLimit");
    assert!(
        every.starts_with(r#""user";r=2;t="#) && every.contains(r#", "tenant";r=0;t="#),
        "{every}"
    );
    assert!(text("x-ratelimit-reset-after").is_some());
    assert!(text("x-ratelimit-limit").is_none(), "not asked for");

    let refused = tollgate()
        .args(["serve", "--v1-headers", "x-ratelimit,github"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the binary runs");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("unknown rate limit header family \"github\""),
        "{stderr}"
    );
}

#[tokio::test]
async fn v1_check_adhoc_shape() {
    let server = daily_server();
    let check = json!({"key": "k", "limit": 2, "period": "1h"});
    for remaining in [1, 0] {
        let (status, body, _) = post_json(&server, "/v1/check", check.clone()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["remaining"], remaining);
        assert_eq!(body["descriptors"][0]["state"], "limited");
        assert_eq!(body["descriptors"][0]["rule"], Value::Null);
    }
    let (status, body, first) = post_json(&server, "/v1/check", check.clone()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let retry_ms = body["retry_after_ms"].as_u64().expect("a retry time");
    assert!(
        retry_ms > 0 && retry_ms <= 1_800_000,
        "one emission interval at most: {retry_ms}"
    );
    let (_, _, second) = post_json(&server, "/v1/check", check).await;
    // A deny consumes nothing, so the reset does not move; the clock read
    // before the store may put it a second early only when the true reset is
    // within that gap above a whole second.
    let (first, second) = (
        header(&first, "x-ratelimit-reset"),
        header(&second, "x-ratelimit-reset"),
    );
    assert!(
        first.zip(second).is_some_and(|(a, b)| a.abs_diff(b) <= 1),
        "{first:?} {second:?}"
    );

    // Other algorithms, burst and cost.
    let (status, body, _) = post_json(
        &server,
        "/v1/check",
        json!({"key": "w", "limit": 5, "period": "1d", "algorithm": "fixed-window", "cost": 5}),
    )
    .await;
    assert_eq!(
        (status, body["remaining"].as_u64()),
        (StatusCode::OK, Some(0))
    );
    let (_, body, _) = post_json(
        &server,
        "/v1/check",
        json!({"key": "b", "limit": 1, "period": "1h", "burst": 10, "cost": 4}),
    )
    .await;
    assert_eq!(body["remaining"], 6);

    // The admin API reads the same key without spending it: ad-hoc keys are
    // namespaced by algorithm and quota (limit, period in ns, burst).
    for _ in 0..2 {
        let (status, state) = admin(
            &server,
            reqwest::Method::GET,
            "/admin/keys/adhoc:gcra:2:3600000000000:2:k?limit=2&period=1h",
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{state}");
        assert_eq!(state["remaining"], 0);
        assert_eq!(state["algorithm"], "gcra");
    }
    let (status, state) = admin(
        &server,
        reqwest::Method::GET,
        "/admin/keys/k?limit=2&period=1h",
        None,
    )
    .await;
    assert_eq!(
        (status, &state["remaining"]),
        (StatusCode::OK, &json!(2)),
        "the raw key is another budget"
    );
    let (status, _) = admin(&server, reqwest::Method::GET, "/admin/keys/k?limit=2", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn v1_check_errors_name_the_field() {
    let server = daily_server();
    for (body, reason) in [
        ("not json", "invalid JSON"),
        (r#"{"key": "k", "limit": 2}"#, "period"),
        (r#"{"key": "k", "limit": "two", "period": "1s"}"#, "limit"),
        (
            r#"{"key": "k", "limit": 0, "period": "1s"}"#,
            "limit: limit must be at least 1",
        ),
        (
            r#"{"key": "k", "limit": 1, "period": "1s", "algorithm": "magic"}"#,
            "algorithm: unknown algorithm",
        ),
        (
            r#"{"key": "", "limit": 1, "period": "1s"}"#,
            "key: must not be empty",
        ),
        (r#"{"key": "k", "domain": "d"}"#, "not both"),
        (r#"{"limit": 1}"#, "expected `domain`"),
        (
            r#"{"domain": "daily", "descriptors": [{"entries": [{"key": "user"}], "limit": {"requests_per_unit": 1, "unit": "fortnight"}}]}"#,
            "descriptors[0].limit.unit",
        ),
        (
            r#"{"domain": "daily", "descriptors": [{"entries": []}]}"#,
            "descriptor 0 has no entries",
        ),
        (
            r#"{"domain": "daily", "descriptors": [{"entries": [{"key": ""}]}]}"#,
            "descriptor 0 has an entry with an empty key",
        ),
        (
            r#"{"domain": "daily", "descriptors": [{"entries": [{"key": "user"}], "limit": {"requests_per_unit": 0, "unit": "second"}}]}"#,
            "limit must be at least 1",
        ),
        (
            r#"{"domain": "daily", "descriptors": [{"entries": [{"key": "user"}]}], "extra": 1}"#,
            "extra",
        ),
    ] {
        let response = post(&server, "/v1/check", body).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
        let error: Value = response.json().await.expect("a JSON error");
        let text = error["error"].as_str().unwrap_or_default();
        assert!(text.contains(reason), "{body}: {text}");
    }
}

/// A request's own limit makes a rule for that request alone, which keeps
/// no series of its own: its decisions are counted under `override`, one
/// series however many requests make one.
#[tokio::test]
async fn overrides_are_counted_under_one_label() {
    let server = daily_server();
    let check = json!({"domain": "daily", "descriptors": [{
        "entries": [{"key": "tenant", "value": "o"}],
        "limit": {"requests_per_unit": 2, "unit": "hour"}
    }]});
    for _ in 0..3 {
        post_json(&server, "/v1/check", check.clone()).await;
    }
    let metrics = scrape(&server).await;
    for needle in [
        r#"tollgate_decisions_total{domain="daily",rule="override",result="ok"} 2"#,
        r#"tollgate_decisions_total{domain="daily",rule="override",result="over_limit"} 1"#,
    ] {
        assert!(metrics.contains(needle), "missing {needle}:\n{metrics}");
    }
}

#[tokio::test]
async fn metrics_health_and_readiness() {
    let server = daily_server();
    let check =
        json!({"domain": "daily", "descriptors": [{"entries": [{"key": "tenant", "value": "t"}]}]});
    post_json(&server, "/v1/check", check.clone()).await;
    post_json(&server, "/v1/check", check).await;
    post(&server, "/v1/check", "{").await;
    let metrics = scrape(&server).await;
    for needle in [
        r#"tollgate_checks_total{api="v1",result="ok"} 1"#,
        r#"tollgate_checks_total{api="v1",result="over_limit"} 1"#,
        r#"tollgate_checks_total{api="v1",result="invalid"} 1"#,
        r#"tollgate_decisions_total{domain="daily",rule="tenant",result="ok"} 1"#,
        r#"tollgate_decisions_total{domain="daily",rule="tenant",result="over_limit"} 1"#,
        "tollgate_check_duration_seconds_bucket",
        "tollgate_store_duration_seconds_count",
    ] {
        assert!(metrics.contains(needle), "missing {needle}:\n{metrics}");
    }
    let healthz = reqwest::get(server.url("/healthz")).await.expect("answers");
    assert_eq!(healthz.status(), StatusCode::OK);
    let readyz = reqwest::get(server.url("/readyz")).await.expect("answers");
    assert_eq!(readyz.status(), StatusCode::OK);
}

#[tokio::test]
async fn admin_api_needs_the_token() {
    let server = daily_server();
    let client = Client::new();
    let list = server.url("/admin/kill-switch");
    let none = client.get(&list).send().await.expect("answers");
    assert_eq!(none.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        none.headers().get("www-authenticate").map(|v| v.as_bytes()),
        Some(&b"Bearer"[..])
    );
    let wrong = client
        .get(&list)
        .bearer_auth("nope")
        .send()
        .await
        .expect("answers");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let reload = client
        .post(server.url("/admin/reload"))
        .send()
        .await
        .expect("answers");
    assert_eq!(reload.status(), StatusCode::UNAUTHORIZED);
    let right = client
        .get(&list)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("answers");
    assert_eq!(right.status(), StatusCode::OK);

    let off = Server::start(&[]);
    let response = client
        .get(off.url("/admin/kill-switch"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("answers");
    assert_eq!(
        response.status(),
        StatusCode::FORBIDDEN,
        "no --admin-token: the admin API is off"
    );
}

#[tokio::test]
async fn kill_switch_disables_a_rule_at_run_time() {
    let server = daily_server();
    let check =
        json!({"domain": "daily", "descriptors": [{"entries": [{"key": "tenant", "value": "x"}]}]});
    assert_eq!(
        post_json(&server, "/v1/check", check.clone()).await.0,
        StatusCode::OK
    );
    assert_eq!(
        post_json(&server, "/v1/check", check.clone()).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );

    let post_switch = |body: Value| {
        admin(
            &server,
            reqwest::Method::POST,
            "/admin/kill-switch",
            Some(body),
        )
    };
    let (status, listing) =
        post_switch(json!({"domain": "daily", "rule": "tenant", "enforce": false})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        listing,
        json!({"disabled": [{"domain": "daily", "rule": "tenant"}]})
    );
    let (status, body, _) = post_json(&server, "/v1/check", check.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["descriptors"][0]["state"], "disabled");
    let (_, listing) = admin(&server, reqwest::Method::GET, "/admin/kill-switch", None).await;
    assert_eq!(listing["disabled"][0]["rule"], "tenant");

    let (status, _) =
        post_switch(json!({"domain": "daily", "rule": "tennant", "enforce": false})).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a typo is refused, not silently ignored"
    );
    let (status, _) = post_switch(json!({"domain": "nope", "enforce": false})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = post_switch(json!({"domain": "daily"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "enforce is required");

    let (status, _) =
        post_switch(json!({"domain": "daily", "rule": "tenant", "enforce": true})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        post_json(&server, "/v1/check", check.clone()).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );

    // A whole domain.
    post_switch(json!({"domain": "daily", "enforce": false})).await;
    assert_eq!(
        post_json(&server, "/v1/check", check).await.0,
        StatusCode::OK
    );
}

/// A concurrency rule beside a rate rule: two requests of a user in flight.
const INFLIGHT: &str = "
domain: inflight
rules:
  - name: slots
    match: [{ key: user }]
    algorithm: concurrency
    limit: { requests: 2, per: 1h }
  - name: rate
    match: [{ key: route }]
    limit: { requests: 100, per: 1h }
";

#[tokio::test]
async fn v1_release_gives_back_concurrency_permits() {
    let server = Server::with_config(&[("inflight.yaml", INFLIGHT)], &[]);
    let body = json!({"domain": "inflight", "descriptors": [
        {"entries": [{"key": "user", "value": "alice"}]},
        {"entries": [{"key": "route", "value": "/upload"}]}]});
    let status = |b: Value| {
        let server = &server;
        async move { post_json(server, "/v1/check", b).await.0 }
    };
    let lease_of = |answer: &Value| {
        answer["lease"]
            .as_str()
            .expect("a concurrency rule admitted: a lease")
            .to_owned()
    };
    let (code, first, _) = post_json(&server, "/v1/check", body.clone()).await;
    assert_eq!(code, StatusCode::OK);
    let first = lease_of(&first);
    let (code, second, _) = post_json(&server, "/v1/check", body.clone()).await;
    assert_eq!(code, StatusCode::OK);
    let second = lease_of(&second);
    assert_ne!(first, second);
    // Safe as it is in a URL, a header or JSON.
    assert!(
        second
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)),
        "{second}"
    );
    assert_eq!(status(body.clone()).await, StatusCode::TOO_MANY_REQUESTS);
    // The second request ends: exactly its lease comes back, once; the rate
    // rule beside it has nothing to give back and is not in the lease.
    for _ in 0..2 {
        let (code, released, _) = post_json(&server, "/v1/release", json!({"lease": second})).await;
        assert_eq!((code, released), (StatusCode::OK, json!({"released": 1})));
    }
    assert_eq!(status(body.clone()).await, StatusCode::OK);
    assert_eq!(
        status(body.clone()).await,
        StatusCode::TOO_MANY_REQUESTS,
        "the second release gave back nothing of the first request's"
    );
    let (code, _, _) = post_json(&server, "/v1/release", json!({"lease": first})).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(status(body.clone()).await, StatusCode::OK);

    // Ad-hoc concurrency limits work the same way; a rate limit takes no lease.
    let adhoc = json!({"key": "jobs", "limit": 1, "period": "10m", "algorithm": "concurrency"});
    let (code, first, _) = post_json(&server, "/v1/check", adhoc.clone()).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(status(adhoc.clone()).await, StatusCode::TOO_MANY_REQUESTS);
    let lease = json!({"lease": first["lease"]});
    let (code, released, _) = post_json(&server, "/v1/release", lease).await;
    assert_eq!((code, released), (StatusCode::OK, json!({"released": 1})));
    assert_eq!(status(adhoc).await, StatusCode::OK);
    let rate = json!({"key": "r", "limit": 1, "period": "10m"});
    let (_, answer, _) = post_json(&server, "/v1/check", rate).await;
    assert!(answer.get("lease").is_none(), "{answer}");

    // Describing the request again releases nothing: it is not a lease.
    let (code, error, _) = post_json(&server, "/v1/release", body).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(
        error["error"].as_str().unwrap().contains("lease"),
        "{error}"
    );
    let (code, error, _) = post_json(&server, "/v1/release", json!({"lease": "1:2:3"})).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(
        error["error"].as_str().unwrap().contains("invalid lease"),
        "{error}"
    );
}

#[tokio::test]
async fn detailed_metric_labels_decisions_by_descriptor_value() {
    let config = "
domain: detailed
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: plan
    rate_limit: { unit: day, requests_per_unit: 1 }
";
    let server = Server::with_config(&[("detailed.yaml", config)], &[]);
    for (key, value) in [
        ("user", "alice"),
        ("user", "alice"),
        ("user", "bob"),
        ("plan", "pro"),
    ] {
        let body = json!({"domain": "detailed",
            "descriptors": [{"entries": [{"key": key, "value": value}]}]});
        post_json(&server, "/json", body).await;
    }
    let metrics = scrape(&server).await;
    for needle in [
        r#"tollgate_decisions_total{domain="detailed",rule="user_alice",result="ok"} 1"#,
        r#"tollgate_decisions_total{domain="detailed",rule="user_alice",result="over_limit"} 1"#,
        r#"tollgate_decisions_total{domain="detailed",rule="user_bob",result="ok"} 1"#,
        // Without `detailed_metric`, the rule's id: one series for every value.
        r#"tollgate_decisions_total{domain="detailed",rule="plan",result="ok"} 1"#,
    ] {
        assert!(metrics.contains(needle), "missing {needle}:\n{metrics}");
    }
}

/// Regression: `detailed_metric` turned client-chosen values into an unbounded
/// label set (50,000 values: 3.6 MB of `/metrics`). A rule gets 1,000 values;
/// the rest share the `detailed_metric_overflow` label.
#[tokio::test]
async fn detailed_metric_labels_are_bounded_with_an_overflow_label() {
    let config = "
domain: detailed
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: { unit: day, requests_per_unit: 10 }
";
    let server = Server::with_config(&[("detailed.yaml", config)], &[]);
    let http = reqwest::Client::new();
    for i in 0..1_010 {
        let body = json!({"domain": "detailed",
            "descriptors": [{"entries": [{"key": "user", "value": format!("u{i}")}]}]});
        let status = http
            .post(server.url("/json"))
            .json(&body)
            .send()
            .await
            .expect("an answer")
            .status();
        assert_eq!(status, StatusCode::OK);
    }
    let metrics = scrape(&server).await;
    let series = metrics
        .lines()
        .filter(|l| l.starts_with(r#"tollgate_decisions_total{domain="detailed""#))
        .count();
    assert_eq!(series, 1_001, "1,000 values and the overflow");
    assert!(
        metrics.contains(
            r#"tollgate_decisions_total{domain="detailed",rule="detailed_metric_overflow",result="ok"} 10"#
        ),
        "{metrics}"
    );
}

/// `POST /admin/reset` forgets a descriptor's state: its limit is whole
/// again, the descriptors beside it keep theirs, and the answer names the
/// rule reset per descriptor.
#[tokio::test]
async fn the_admin_api_resets_a_descriptors_state() {
    let server = daily_server();
    let check = |tenant: &str| {
        json!({
            "domain": "daily",
            "descriptors": [{"entries": [{"key": "tenant", "value": tenant}]}]
        })
    };
    for tenant in ["acme", "initech"] {
        let (status, first, _) = post_json(&server, "/v1/check", check(tenant)).await;
        assert_eq!(
            (status, first["allowed"].as_bool()),
            (StatusCode::OK, Some(true))
        );
        let (_, second, _) = post_json(&server, "/v1/check", check(tenant)).await;
        assert_eq!(second["allowed"], false, "{tenant} is spent");
    }

    let reset = json!({
        "domain": "daily",
        "descriptors": [
            {"entries": [{"key": "tenant", "value": "acme"}]},
            {"entries": [{"key": "nobody", "value": "x"}]}
        ]
    });
    let (status, body) = admin(&server, reqwest::Method::POST, "/admin/reset", Some(reset)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"reset": ["tenant", null]}));

    let (_, again, _) = post_json(&server, "/v1/check", check("acme")).await;
    assert_eq!(again["allowed"], true, "{again}");
    let (_, other, _) = post_json(&server, "/v1/check", check("initech")).await;
    assert_eq!(other["allowed"], false, "{other}");

    let bad = json!({"domain": "daily", "descriptors": [{"entries": []}]});
    let (status, body) = admin(&server, reqwest::Method::POST, "/admin/reset", Some(bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = admin(&server, reqwest::Method::POST, "/admin/reset", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let unauthorized = post(&server, "/admin/reset", &check("acme").to_string()).await;
    assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);
}
