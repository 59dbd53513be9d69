//! envoyproxy/ratelimit's answer settings, honoured by the real binary:
//! `LIMIT_RESPONSE_HEADERS_ENABLED` with its header names,
//! `RESPONSE_DYNAMIC_METADATA`, `NEAR_LIMIT_RATIO` and `PROMETHEUS_PATH`,
//! set in the environment of `tollgate serve --envoy-env`, and
//! `--envoy-headers`, Tollgate's choice of headers, outside that mode.
//!
//! Expected values come from envoyproxy/ratelimit at commit f2fb157:
//! `src/service/ratelimit.go` (`shouldRateLimitWorker`'s choice of the
//! descriptor its headers describe, `rateLimitLimitHeader`,
//! `rateLimitRemainingHeader`, `rateLimitResetHeader`, `ratelimitToMetadata`,
//! `descriptorToStruct`, `mergeMetadata`), its tests
//! (`test/service/ratelimit_test.go`, `src/service/ratelimit_test.go`), and
//! `src/limiter/base_limiter.go` for the near-limit count. Windows are days,
//! so no test depends on where a window boundary falls; each test counts
//! its own descriptor values.

use crate::common;

use std::collections::BTreeMap;

use common::{Redis, Server, descriptor, rls_request, tollgate};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use serde_json::json;

const SHOP: &str = "
domain: shop
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 10 }
  - key: plan
    rate_limit: { unit: day, requests_per_unit: 3 }
  - key: dark
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: quota
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: free
    rate_limit: { unlimited: true }
  - key: tag
    metadata: { name: service_1, team: { a: 1 } }
    rate_limit: { unit: day, requests_per_unit: 5 }
  - key: svc
    metadata: { name: service_2, some_other_name: service_2, team: { b: two } }
    rate_limit: { unit: day, requests_per_unit: 1 }
";

const NATIVE: &str = "
domain: native
rules:
  - name: per_user
    match: [{ key: user }]
    limit: { requests: 5, per: 1h }
";

/// `tollgate serve --envoy-env` on free loopback ports with `SHOP`, over
/// `redis`, with envoyproxy/ratelimit's variables `env` and `args` added.
fn envoy_server(redis: &Redis, env: &[(&str, &str)], args: &[&str]) -> Server {
    let mut command = tollgate();
    command.envs([("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", "0")]);
    command.envs(env.iter().copied());
    let url = redis.url();
    let mut all = vec!["--envoy-env", "--redis", url.as_str()];
    all.extend_from_slice(args);
    Server::with_config_by(command, &[("shop.yaml", SHOP)], &all)
}

async fn ask(server: &Server, request: RateLimitRequest) -> RateLimitResponse {
    server
        .grpc_client()
        .await
        .should_rate_limit(request)
        .await
        .unwrap_or_else(|status| panic!("ShouldRateLimit failed: {status:?}\n{}", server.log()))
        .into_inner()
}

/// `response_headers_to_add` as (key, value) pairs, in order.
fn headers(response: &RateLimitResponse) -> Vec<(&str, &str)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect()
}

/// The `duration_until_reset` seconds of status `i`, as the reset header
/// must say them (`rateLimitResetHeader` is `CalculateReset`, as the
/// status's duration is).
fn reset(response: &RateLimitResponse, i: usize) -> String {
    let reset = response.statuses[i]
        .duration_until_reset
        .expect("a limited status has a reset");
    assert!((1..=86_400).contains(&reset.seconds), "{reset:?}");
    reset.seconds.to_string()
}

/// `TestServiceWithCustomRatelimitHeaders`: with the headers enabled and
/// renamed, the answer carries the three of them for the descriptor with
/// the fewest remaining; the limit header is `requests_per_unit` alone.
#[tokio::test]
async fn enabled_headers_describe_the_descriptor_with_the_fewest_remaining() {
    let redis = Redis::start();
    let server = envoy_server(
        &redis,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_LIMIT_HEADER", "A-Ratelimit-Limit"),
            ("LIMIT_REMAINING_HEADER", "A-Ratelimit-Remaining"),
            ("LIMIT_RESET_HEADER", "A-Ratelimit-Reset"),
        ],
        &[],
    );
    let first = ask(
        &server,
        rls_request(
            "shop",
            &[&[("user", "enabled")], &[("plan", "e1")], &[("free", "x")]],
        ),
    )
    .await;
    assert_eq!(first.statuses[0].limit_remaining, 9);
    assert_eq!(first.statuses[1].limit_remaining, 2);
    assert_eq!(
        headers(&first),
        [
            ("A-Ratelimit-Limit", "3"),
            ("A-Ratelimit-Remaining", "2"),
            ("A-Ratelimit-Reset", reset(&first, 1).as_str()),
        ]
    );

    // Ties keep the first: only a smaller remaining takes the place.
    let tie = ask(
        &server,
        rls_request("shop", &[&[("plan", "e2")], &[("plan", "e3")]]),
    )
    .await;
    assert_eq!(headers(&tie)[0], ("A-Ratelimit-Limit", "3"));
    assert_eq!(tie.statuses[0].limit_remaining, 2);
    assert_eq!(tie.statuses[1].limit_remaining, 2);

    // Unlimited and unmatched descriptors have no current limit: none.
    let none = ask(
        &server,
        rls_request("shop", &[&[("free", "x")], &[("nobody", "y")]]),
    )
    .await;
    assert!(none.response_headers_to_add.is_empty());
}

/// `TestServiceWithDefaultRatelimitHeaders` and `shouldRateLimitWorker`'s
/// override: an over-limit descriptor not in quota mode is reported even
/// after one with as few remaining (a `shadow_mode` rule past its limit:
/// `OK`, 0 remaining), whichever comes first; one in quota mode is not.
#[tokio::test]
async fn an_over_limit_descriptor_takes_the_headers_unless_in_quota_mode() {
    let redis = Redis::start();
    let server = envoy_server(&redis, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")], &[]);
    // Spend the shadow rule's 1, the plan's 3 and the quota rule's 2.
    ask(&server, rls_request("shop", &[&[("dark", "over")]])).await;
    for _ in 0..3 {
        ask(&server, rls_request("shop", &[&[("plan", "over")]])).await;
    }
    for _ in 0..2 {
        ask(&server, rls_request("shop", &[&[("quota", "over")]])).await;
    }

    let shadow_first = ask(
        &server,
        rls_request("shop", &[&[("dark", "over")], &[("plan", "over")]]),
    )
    .await;
    assert_eq!(shadow_first.statuses[0].code, Code::Ok as i32);
    assert_eq!(shadow_first.statuses[0].limit_remaining, 0);
    assert_eq!(shadow_first.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(
        headers(&shadow_first),
        [
            ("RateLimit-Limit", "3"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", reset(&shadow_first, 1).as_str()),
        ]
    );
    let over_first = ask(
        &server,
        rls_request("shop", &[&[("plan", "over")], &[("dark", "over")]]),
    )
    .await;
    assert_eq!(headers(&over_first)[0], ("RateLimit-Limit", "3"));

    let quota = ask(
        &server,
        rls_request("shop", &[&[("dark", "over")], &[("quota", "over")]]),
    )
    .await;
    assert_eq!(quota.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(
        headers(&quota)[0],
        ("RateLimit-Limit", "1"),
        "the quota-mode descriptor does not override"
    );
}

/// `QUOTA_MODE=true` puts every descriptor in quota mode
/// (`isQuotaMode := globalQuotaMode || ...`): an over-limit one no longer
/// overrides, so the first with the fewest remaining is reported.
#[tokio::test]
async fn global_quota_mode_keeps_over_limit_descriptors_from_the_headers() {
    let redis = Redis::start();
    let server = envoy_server(
        &redis,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("QUOTA_MODE", "true"),
        ],
        &[],
    );
    ask(&server, rls_request("shop", &[&[("dark", "global")]])).await;
    for _ in 0..3 {
        ask(&server, rls_request("shop", &[&[("plan", "global")]])).await;
    }
    let answer = ask(
        &server,
        rls_request("shop", &[&[("dark", "global")], &[("plan", "global")]]),
    )
    .await;
    assert_eq!(answer.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(
        headers(&answer),
        [
            ("RateLimit-Limit", "1"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", reset(&answer, 0).as_str()),
        ]
    );
}

/// `SHADOW_MODE=true` keeps each status's `OVER_LIMIT` and turns only
/// `overall_code` to `OK` (`TestServiceGlobalShadowMode`), so an over-limit
/// descriptor still takes the headers, after a `shadow_mode` rule's (whose
/// status is `OK`).
#[tokio::test]
async fn global_shadow_mode_still_reports_the_over_limit_descriptor() {
    let redis = Redis::start();
    let server = envoy_server(
        &redis,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("SHADOW_MODE", "true"),
        ],
        &[],
    );
    ask(&server, rls_request("shop", &[&[("dark", "shadow")]])).await;
    for _ in 0..3 {
        ask(&server, rls_request("shop", &[&[("plan", "shadow")]])).await;
    }
    let answer = ask(
        &server,
        rls_request("shop", &[&[("dark", "shadow")], &[("plan", "shadow")]]),
    )
    .await;
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].code, Code::Ok as i32);
    assert_eq!(answer.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(headers(&answer)[0], ("RateLimit-Limit", "3"));
}

/// envoyproxy/ratelimit's default (`LIMIT_RESPONSE_HEADERS_ENABLED=false`):
/// no headers, at either door, in any domain; `--envoy-headers` still
/// chooses.
#[tokio::test]
async fn envoy_mode_adds_no_headers_unless_enabled() {
    let redis = Redis::start();
    let server = envoy_server(&redis, &[], &[]);
    let answer = ask(&server, rls_request("shop", &[&[("user", "default")]])).await;
    assert_eq!(answer.statuses[0].limit_remaining, 9);
    assert!(answer.response_headers_to_add.is_empty());
    let json = post_json(
        &server,
        r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"default"}]}]}"#,
    )
    .await;
    assert_eq!(json["statuses"][0]["limitRemaining"], 8);
    assert_eq!(json.get("responseHeadersToAdd"), None, "{json}");
    assert_eq!(json.get("dynamicMetadata"), None, "{json}");
    assert_eq!(answer.dynamic_metadata, None);
    drop(server);

    let flagged = envoy_server(&redis, &[], &["--envoy-headers", "x-ratelimit"]);
    let answer = ask(&flagged, rls_request("shop", &[&[("user", "flagged")]])).await;
    let names: Vec<&str> = headers(&answer).iter().map(|(k, _)| *k).collect();
    assert_eq!(
        names,
        [
            "X-RateLimit-Limit",
            "X-RateLimit-Remaining",
            "X-RateLimit-Reset"
        ]
    );
}

async fn post_json(server: &Server, body: &'static str) -> serde_json::Value {
    reqwest::Client::new()
        .post(server.url("/json"))
        .body(body)
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON")
}

/// `/json` marshals the same response (`NewJsonHandler`): the headers as
/// `responseHeadersToAdd`, the metadata as `dynamicMetadata`.
#[tokio::test]
async fn json_answers_carry_the_same_headers_and_metadata() {
    let redis = Redis::start();
    let server = envoy_server(
        &redis,
        &[
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
        ],
        &[],
    );
    let json = post_json(
        &server,
        r#"{"domain":"shop","hitsAddend":2,"descriptors":[{"entries":[{"key":"tag","value":"json"}]}]}"#,
    )
    .await;
    let reset = json["statuses"][0]["durationUntilReset"]
        .as_str()
        .and_then(|d| d.strip_suffix('s'))
        .expect("a duration")
        .to_owned();
    assert_eq!(
        json["responseHeadersToAdd"],
        json!([
            {"key": "RateLimit-Limit", "value": "5"},
            {"key": "RateLimit-Remaining", "value": "3"},
            {"key": "RateLimit-Reset", "value": reset},
        ])
    );
    assert_eq!(
        json["dynamicMetadata"],
        json!({
            "domain": "shop",
            "descriptors": [{"entries": ["tag=json"]}],
            "hitsAddend": 2,
            "metadata": {"name": "service_1", "team": {"a": 1}},
        })
    );
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(
            envoy_types::pb::google::protobuf::ListValue { values },
        )),
    }
}

fn object(fields: &[(&str, Value)]) -> Struct {
    Struct {
        fields: fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    }
}

fn structure(fields: &[(&str, Value)]) -> Value {
    Value {
        kind: Some(Kind::StructValue(object(fields))),
    }
}

/// `ratelimitToMetadata` with `descriptorToStruct` (`TestRatelimitToMetadata`)
/// and the metadata of the descriptors that passed
/// (`TestMetadataReturnedForAllPassedDescriptors`: both merged;
/// `TestOverlappingMetadataReturnsTheFirstValue`: the first wins a key;
/// `TestMetadataReturnedForPassedDescriptors`: an over-limit one gives none).
#[tokio::test]
async fn dynamic_metadata_is_ratelimit_to_metadata() {
    let redis = Redis::start();
    let server = envoy_server(&redis, &[("RESPONSE_DYNAMIC_METADATA", "true")], &[]);
    let request = || rls_request("shop", &[&[("tag", "meta")], &[("svc", "meta")]]);
    let first = ask(&server, request()).await;
    let descriptors = list(vec![
        structure(&[("entries", list(vec![string("tag=meta")]))]),
        structure(&[("entries", list(vec![string("svc=meta")]))]),
    ]);
    assert_eq!(
        first.dynamic_metadata,
        Some(object(&[
            ("domain", string("shop")),
            ("descriptors", descriptors.clone()),
            (
                "metadata",
                structure(&[
                    ("name", string("service_1")),
                    ("some_other_name", string("service_2")),
                    (
                        "team",
                        structure(&[("a", number(1.0)), ("b", string("two"))])
                    ),
                ])
            ),
        ]))
    );

    // `svc` is over its limit of 1 now: only `tag` passed. The request's
    // `hits_addend` of 1 is not 0, so it is reported.
    let mut second = request();
    second.hits_addend = 1;
    let second = ask(&server, second).await;
    assert_eq!(second.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(
        second.dynamic_metadata,
        Some(object(&[
            ("domain", string("shop")),
            ("descriptors", descriptors),
            ("hitsAddend", number(1.0)),
            (
                "metadata",
                structure(&[
                    ("name", string("service_1")),
                    ("team", structure(&[("a", number(1.0))])),
                ])
            ),
        ]))
    );

    // A descriptor's override and hits: `limit` as the override's text,
    // `hitsAddend` as set; no rule metadata for an unmatched one.
    let mut request = rls_request("shop", &[]);
    let mut custom = descriptor(&[("other", "o")]);
    custom.limit = Some(
        envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 42,
            unit: Unit::Minute as i32,
        },
    );
    custom.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    request.descriptors.push(custom);
    let third = ask(&server, request).await;
    assert_eq!(
        third.dynamic_metadata,
        Some(object(&[
            ("domain", string("shop")),
            (
                "descriptors",
                list(vec![structure(&[
                    ("entries", list(vec![string("other=o")])),
                    ("limit", string("requests_per_unit:42 unit:MINUTE")),
                    ("hitsAddend", number(0.0)),
                ])])
            ),
        ]))
    );
}

/// Outside envoyproxy/ratelimit's mode, `auto` answers each domain as its
/// format's service would: none for envoyproxy/ratelimit's, Tollgate's
/// `X-RateLimit-*` for Tollgate's; `--envoy-headers` picks families for
/// every domain, `draft` listing every descriptor.
#[tokio::test]
async fn envoy_headers_choose_the_families() {
    let auto = Server::with_config(&[("shop.yaml", SHOP), ("native.yaml", NATIVE)], &[]);
    let envoy = ask(&auto, rls_request("shop", &[&[("user", "ann")]])).await;
    assert!(envoy.response_headers_to_add.is_empty());
    let native = ask(&auto, rls_request("native", &[&[("user", "ann")]])).await;
    let names: BTreeMap<&str, &str> = headers(&native).into_iter().collect();
    assert_eq!(names.get("X-RateLimit-Limit"), Some(&"5"));
    assert_eq!(names.get("X-RateLimit-Remaining"), Some(&"4"));
    drop(auto);

    let both = Server::with_config(
        &[("shop.yaml", SHOP), ("native.yaml", NATIVE)],
        &["--envoy-headers", "ratelimit,draft"],
    );
    let answer = ask(
        &both,
        rls_request("shop", &[&[("user", "ann")], &[("plan", "p")]]),
    )
    .await;
    assert_eq!(
        headers(&answer),
        [
            ("RateLimit-Limit", "3"),
            ("RateLimit-Remaining", "2"),
            ("RateLimit-Reset", reset(&answer, 1).as_str()),
            (
                "RateLimit-Policy",
                "\"user\";q=10;w=86400, \"plan\";q=3;w=86400"
            ),
            (
                "RateLimit",
                format!(
                    "\"user\";r=9;t={}, \"plan\";r=2;t={}",
                    reset(&answer, 0),
                    reset(&answer, 1)
                )
                .as_str()
            ),
        ]
    );
}

/// `NEAR_LIMIT_RATIO`: `checkNearLimitThreshold` counts the hits past
/// `floor(limit × ratio)`: with 10 a day at 0.5, the 6th and 7th of 7.
#[tokio::test]
async fn near_limit_ratio_moves_the_near_limit_count() {
    let redis = Redis::start();
    let server = envoy_server(&redis, &[("NEAR_LIMIT_RATIO", "0.5")], &[]);
    for _ in 0..7 {
        ask(&server, rls_request("shop", &[&[("user", "near")]])).await;
    }
    let text = reqwest::get(server.url("/metrics"))
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    let sample = |name: &str| {
        let series = format!("{name}{{domain=\"shop\",key1=\"user\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map(|v| v.trim().to_owned())
    };
    assert_eq!(
        sample("ratelimit_service_rate_limit_near_limit").as_deref(),
        Some("2"),
        "{text}"
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_within_limit").as_deref(),
        Some("7")
    );
}

/// `PROMETHEUS_PATH`: the Prometheus sink serves at that path on
/// `PROMETHEUS_ADDR` (`NewPrometheusSink`'s `http.Handle(path, ...)`), and
/// not at `/metrics`.
#[tokio::test]
async fn prometheus_path_moves_the_metrics() {
    let redis = Redis::start();
    let server = envoy_server(
        &redis,
        &[
            ("USE_PROMETHEUS", "true"),
            // Port 0: the log says which, with no race for a free one.
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            ("PROMETHEUS_PATH", "/stats/prometheus"),
        ],
        &[],
    );
    ask(&server, rls_request("shop", &[&[("user", "prom")]])).await;
    let admin = server.admin();
    let at = |path: &str| reqwest::get(format!("http://{admin}{path}"));
    let metrics = at("/stats/prometheus").await.expect("answers");
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.expect("text");
    assert!(
        text.contains("ratelimit_service_rate_limit_total_hits{domain=\"shop\",key1=\"user\"} 1"),
        "{text}"
    );
    assert_eq!(at("/metrics").await.expect("answers").status(), 404);
    assert!(!server.log().contains("PROMETHEUS_PATH"), "no warning left");
}
