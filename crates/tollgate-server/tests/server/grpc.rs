//! The gRPC Rate Limit Service against a real `tollgate serve`: every field
//! of `ShouldRateLimit`, malformed requests, the health service, and the
//! decisions envoyproxy/ratelimit's README documents for its config examples.
//!
//! Fixed windows counted here are days (or the request is decided by its
//! cost alone), so no test depends on where a window boundary falls.

use crate::common;

use common::{Server, rls_request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::Code as GrpcCode;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// envoyproxy/ratelimit README, example 1.
const MONGO_CPS: &str = "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
";

/// Example 2.
const MESSAGING: &str = "
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

/// Example 3.
const EDGE_PROXY_PER_IP: &str = "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
";

/// Example 4, the configuration that does not match two-entry requests.
const EXAMPLE4: &str = "
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
";

/// Example 4, the configuration that does.
const EXAMPLE4_NESTED: &str = "
domain: example4_nested
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
";

/// Example 5.
const INTERNAL: &str = "
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

/// Example 6.
const EXAMPLE6: &str = "
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
";

/// Example 7.
const EXAMPLE7: &str = "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";

/// Wildcard values: a prefix match, each value with its own budget; an exact
/// value beats the wildcard.
const WILDCARD: &str = r#"
domain: wildcard
descriptors:
  - key: path
    value: "/api/*"
    rate_limit:
      unit: day
      requests_per_unit: 2
  - key: path
    value: /api/special
    rate_limit:
      unit: day
      requests_per_unit: 1
"#;

/// A day-long limit, to count against without window boundaries.
const FIELDS: &str = "
domain: fields
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
";

/// Native layers for the atomicity check.
const LAYERS: &str = "
domain: layers
rules:
  - name: per-user
    match: [{ key: user }]
    limit: { requests: 2, per: 1h }
  - name: global
    match: [{ key: global }]
    limit: { requests: 100, per: 1h }
";

fn readme_server() -> Server {
    Server::with_config(
        &[
            ("mongo_cps.yaml", MONGO_CPS),
            ("messaging.yaml", MESSAGING),
            ("edge_proxy_per_ip.yaml", EDGE_PROXY_PER_IP),
            ("example4.yaml", EXAMPLE4),
            ("example4_nested.yaml", EXAMPLE4_NESTED),
            ("internal.yaml", INTERNAL),
            ("example6.yaml", EXAMPLE6),
            ("example7.yaml", EXAMPLE7),
            ("wildcard.yaml", WILDCARD),
            ("fields.yaml", FIELDS),
            ("layers.yaml", LAYERS),
        ],
        // These domains are in envoyproxy/ratelimit's format, whose answers
        // carry no headers by default; these tests check Tollgate's
        // `X-RateLimit-*` (`tests/envoy_answers.rs` checks the defaults).
        &["--envoy-headers", "x-ratelimit"],
    )
}

async fn ask(server: &Server, request: RateLimitRequest) -> RateLimitResponse {
    server
        .grpc_client()
        .await
        .should_rate_limit(request)
        .await
        .unwrap_or_else(|status| panic!("ShouldRateLimit failed: {status:?}"))
        .into_inner()
}

fn code(c: i32) -> Code {
    Code::try_from(c).unwrap_or(Code::Unknown)
}

/// `(requests_per_unit, unit)` of a status, if it has a current limit.
fn limit_of(status: &DescriptorStatus) -> Option<(u32, Unit)> {
    status.current_limit.as_ref().map(|l| {
        (
            l.requests_per_unit,
            Unit::try_from(l.unit).unwrap_or(Unit::Unknown),
        )
    })
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

fn with_hits(mut request: RateLimitRequest, hits: u32) -> RateLimitRequest {
    request.hits_addend = hits;
    request
}

#[tokio::test]
async fn every_response_field_is_filled() {
    let server = readme_server();
    let request = || rls_request("fields", &[&[("user", "ann")]]);
    let first = ask(&server, request()).await;
    assert_eq!(code(first.overall_code), Code::Ok);
    assert_eq!(first.statuses.len(), 1);
    let status = &first.statuses[0];
    assert_eq!(code(status.code), Code::Ok);
    assert_eq!(limit_of(status), Some((3, Unit::Day)));
    assert_eq!(
        status.current_limit.as_ref().map(|l| l.name.as_str()),
        Some(""),
        "the rate_limit has no name"
    );
    assert_eq!(status.limit_remaining, 2);
    let reset = status.duration_until_reset.expect("a reset");
    assert!((1..=86_400).contains(&reset.seconds), "{reset:?}");
    assert_eq!(
        reset.nanos, 0,
        "whole seconds, as envoyproxy/ratelimit sends"
    );
    assert_eq!(header(&first, "X-RateLimit-Limit"), Some("3"));
    assert_eq!(header(&first, "X-RateLimit-Remaining"), Some("2"));
    let reset_header: i64 = header(&first, "X-RateLimit-Reset")
        .and_then(|v| v.parse().ok())
        .expect("a numeric reset");
    // The header rounds the store's exact time up; the store reads the clock
    // after the check started, possibly a second later.
    assert!(
        (reset.seconds - 1..=reset.seconds).contains(&reset_header),
        "seconds until the window ends: {reset_header} for {reset:?}"
    );

    // Request-level hits_addend spends several units at once.
    let second = ask(&server, with_hits(request(), 2)).await;
    assert_eq!(code(second.overall_code), Code::Ok);
    assert_eq!(second.statuses[0].limit_remaining, 0);
    let third = ask(&server, request()).await;
    assert_eq!(code(third.overall_code), Code::OverLimit);
    assert_eq!(code(third.statuses[0].code), Code::OverLimit);
    assert_eq!(header(&third, "X-RateLimit-Remaining"), Some("0"));
}

#[tokio::test]
async fn descriptor_hits_addend_and_limit_override() {
    let server = readme_server();
    let mut request = rls_request("fields", &[&[("user", "bo")]]);
    request.hits_addend = 1;
    request.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    let response = ask(&server, request).await;
    assert_eq!(
        response.statuses[0].limit_remaining, 1,
        "the descriptor's 2 overrides the request's 1"
    );

    let mut overridden = rls_request("fields", &[&[("user", "cy")]]);
    overridden.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 7,
        unit: Unit::Hour as i32,
    });
    let response = ask(&server, overridden).await;
    assert_eq!(limit_of(&response.statuses[0]), Some((7, Unit::Hour)));
    assert_eq!(response.statuses[0].limit_remaining, 6);
}

#[tokio::test]
async fn unknown_domains_and_unmatched_descriptors_are_ok_without_a_limit() {
    let server = readme_server();
    for request in [
        rls_request("nobody", &[&[("database", "users")]]),
        rls_request("mongo_cps", &[&[("database", "other")]]),
        rls_request("mongo_cps", &[&[("table", "users")]]),
    ] {
        let response = ask(&server, request).await;
        assert_eq!(code(response.overall_code), Code::Ok);
        assert_eq!(code(response.statuses[0].code), Code::Ok);
        assert_eq!(response.statuses[0].current_limit, None);
        assert!(response.response_headers_to_add.is_empty());
    }
}

/// What envoyproxy/ratelimit refuses, it refuses with a plain error, which
/// gRPC clients see as `UNKNOWN` with its words: `TestEmptyDomain` and
/// `TestEmptyDescriptors` in its `test/service/ratelimit_test.go`
/// (`shouldRateLimitWorker`).
#[tokio::test]
async fn an_empty_domain_or_descriptor_list_is_unknown_in_envoyproxy_ratelimits_words() {
    let server = readme_server();
    let mut client = server.grpc_client().await;
    for (request, message) in [
        (
            rls_request("", &[&[("hello", "world")]]),
            "rate limit domain must not be empty",
        ),
        (
            rls_request("test-domain", &[]),
            "rate limit descriptor list must not be empty",
        ),
        // The domain is checked first.
        (rls_request("", &[]), "rate limit domain must not be empty"),
    ] {
        let status = client
            .should_rate_limit(request)
            .await
            .expect_err("refused");
        assert_eq!(status.code(), GrpcCode::Unknown, "{status:?}");
        assert_eq!(status.message(), message);
    }
}

fn with_override(
    mut request: RateLimitRequest,
    requests_per_unit: u32,
    unit: Unit,
) -> RateLimitRequest {
    request.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit,
        unit: unit as i32,
    });
    request
}

/// envoyproxy/ratelimit answers these: a descriptor without entries, or
/// with an empty key, matches no rule (`GetLimit`; its `TestBasicConfig`
/// asks for an empty descriptor), unless it carries a limit override, which
/// applies whatever the entries; an override of 0 is a limit every hit is
/// over (`GetResponseDescriptorStatus`).
#[tokio::test]
async fn descriptors_without_entries_or_keys_and_zero_overrides_are_answered() {
    let server = readme_server();
    let no_entries = || {
        let mut r = rls_request("fields", &[&[("user", "x")]]);
        r.descriptors[0].entries.clear();
        r
    };
    let empty_key = || rls_request("fields", &[&[("", "x")]]);
    let after_a_match = rls_request("example4_nested", &[&[("key", "value"), ("", "x")]]);
    let no_limit = DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    };
    for request in [no_entries(), empty_key(), after_a_match] {
        let response = ask(&server, request).await;
        assert_eq!(code(response.overall_code), Code::Ok);
        assert_eq!(response.statuses, std::slice::from_ref(&no_limit));
        assert!(response.response_headers_to_add.is_empty());
    }

    for request in [no_entries(), empty_key()] {
        let response = ask(&server, with_override(request, 1, Unit::Day)).await;
        assert_eq!(code(response.overall_code), Code::Ok);
        assert_eq!(limit_of(&response.statuses[0]), Some((1, Unit::Day)));
        assert_eq!(response.statuses[0].limit_remaining, 0);
    }

    let zero = with_override(rls_request("fields", &[&[("user", "z")]]), 0, Unit::Minute);
    let zero = ask(&server, zero).await;
    assert_eq!(code(zero.overall_code), Code::OverLimit);
    let status = &zero.statuses[0];
    assert_eq!(code(status.code), Code::OverLimit);
    assert_eq!(limit_of(status), Some((0, Unit::Minute)));
    assert_eq!(
        status.current_limit.as_ref().map(|l| l.name.as_str()),
        Some("")
    );
    assert_eq!(status.limit_remaining, 0);
    let reset = status.duration_until_reset.expect("a reset");
    assert!(
        (1..=60).contains(&reset.seconds) && reset.nanos == 0,
        "{reset:?}"
    );
}

/// What Tollgate refuses beyond envoyproxy/ratelimit: an override whose unit
/// has no name (envoyproxy/ratelimit panics on it) and negative hits.
#[tokio::test]
async fn what_tollgate_cannot_count_is_invalid_argument() {
    let server = readme_server();
    let mut client = server.grpc_client().await;
    let override_unit = |unit| {
        let mut r = rls_request("fields", &[&[("user", "x")]]);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit,
        });
        r
    };
    let negative = {
        let mut r = rls_request("fields", &[&[("user", "x")]]);
        r.descriptors[0].is_negative_hits = true;
        r
    };
    for (request, reason) in [
        (override_unit(0), "unknown unit"),
        (override_unit(42), "unknown unit"),
        (negative, "negative hits are not supported"),
    ] {
        let status = client
            .should_rate_limit(request)
            .await
            .expect_err("a malformed request fails");
        assert_eq!(status.code(), GrpcCode::InvalidArgument, "{status:?}");
        assert!(status.message().contains(reason), "{reason}: {status:?}");
    }
}

/// `current_limit.name` is the YAML `rate_limit.name`, empty without one, as
/// envoyproxy/ratelimit sends it (`NewRateLimit` puts the name in the limit
/// it answers with); a native rule sends its name.
#[tokio::test]
async fn current_limit_names_the_rate_limit() {
    let server = &readme_server();
    let name = |domain, entries| async move {
        let response = ask(server, rls_request(domain, &[entries])).await;
        response.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.name.clone())
    };
    let named = [("key_1", "value_1"), ("user", "bkthomps")];
    assert_eq!(
        name("example7", &named).await.as_deref(),
        Some("specific_limit")
    );
    let unnamed = [("key_2", "value_2"), ("user", "bkthomps")];
    assert_eq!(name("example7", &unnamed).await.as_deref(), Some(""));
    let native = [("user", "nat")];
    assert_eq!(name("layers", &native).await.as_deref(), Some("per-user"));
}

/// envoyproxy/ratelimit's rules report the whole seconds to the end of
/// their window (`utils.CalculateReset`); a native rule reports its
/// algorithm's exact time: GCRA's 2 an hour is full again one emission
/// interval, 30 minutes, after one request.
#[tokio::test]
async fn duration_until_reset_is_envoyproxy_ratelimits_for_its_rules_and_exact_for_native_ones() {
    let server = readme_server();
    let envoy = ask(
        &server,
        rls_request("mongo_cps", &[&[("database", "users")]]),
    )
    .await;
    let reset = envoy.statuses[0].duration_until_reset.expect("a reset");
    assert_eq!(
        (reset.seconds, reset.nanos),
        (1, 0),
        "a second's window ends within the second"
    );
    let native = ask(&server, rls_request("layers", &[&[("user", "exact")]])).await;
    let reset = native.statuses[0].duration_until_reset.expect("a reset");
    assert_eq!((reset.seconds, reset.nanos), (1800, 0));
}

async fn health_client(server: &Server) -> HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .expect("a valid URI")
        .connect()
        .await
        .expect("the gRPC listener accepts");
    HealthClient::new(channel)
}

/// The name envoyproxy/ratelimit's probes ask for (`ratelimit`), the
/// server's overall health and the service's full name.
const HEALTH_NAMES: [&str; 3] = [
    "ratelimit",
    "",
    "envoy.service.ratelimit.v3.RateLimitService",
];

#[tokio::test]
async fn health_service_reports_serving() {
    let server = readme_server();
    let mut health = health_client(&server).await;
    for service in HEALTH_NAMES {
        let response = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health answers")
            .into_inner();
        assert_eq!(
            response.status,
            ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
}

/// SIGTERM turns every name `NOT_SERVING` before the listeners stop, as
/// envoyproxy/ratelimit's health checker fails on SIGTERM (its
/// `src/server/health.go`), so a watching Envoy stops sending first.
// Multi-threaded, so the client's connection closes while the test waits
// for the process to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_service_turns_not_serving_on_shutdown() {
    let mut server = readme_server();
    let mut health = health_client(&server).await;
    let mut watches = Vec::new();
    for service in HEALTH_NAMES {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        let mut watch = health.watch(request).await.expect("watch").into_inner();
        let first = watch.message().await.expect("a status").expect("one");
        assert_eq!(first.status, ServingStatus::Serving as i32, "{service:?}");
        watches.push((service, watch));
    }
    server.signal("TERM");
    for (service, watch) in &mut watches {
        let next = watch.message().await.expect("a status").expect("one");
        assert_eq!(next.status, ServingStatus::NotServing as i32, "{service:?}");
    }
    drop((watches, health));
    let exit = server.wait(common::SHUTDOWN).expect("it exits");
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn readme_example1_exact_values() {
    let server = readme_server();
    for database in ["users", "default"] {
        let response = ask(
            &server,
            rls_request("mongo_cps", &[&[("database", database)]]),
        )
        .await;
        assert_eq!(code(response.overall_code), Code::Ok);
        assert_eq!(limit_of(&response.statuses[0]), Some((500, Unit::Second)));
        assert_eq!(
            response.statuses[0].limit_remaining, 499,
            "the first request of its window"
        );
    }
    // More than the limit in one request can never pass; nothing is consumed.
    let response = ask(
        &server,
        with_hits(rls_request("mongo_cps", &[&[("database", "users")]]), 501),
    )
    .await;
    assert_eq!(code(response.overall_code), Code::OverLimit);
}

#[tokio::test]
async fn readme_example2_nested_descriptors_and_layers() {
    let server = readme_server();
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let number = [("to_number", "2061111111")];
    for sent in 1..=5u32 {
        let response = ask(&server, rls_request("messaging", &[&marketing, &number])).await;
        assert_eq!(code(response.overall_code), Code::Ok, "message {sent}");
        assert_eq!(limit_of(&response.statuses[0]), Some((5, Unit::Day)));
        assert_eq!(limit_of(&response.statuses[1]), Some((100, Unit::Day)));
        assert_eq!(response.statuses[0].limit_remaining, 5 - sent);
        assert_eq!(response.statuses[1].limit_remaining, 100 - sent);
    }
    let sixth = ask(&server, rls_request("messaging", &[&marketing, &number])).await;
    assert_eq!(code(sixth.overall_code), Code::OverLimit);
    assert_eq!(code(sixth.statuses[0].code), Code::OverLimit);
    assert_eq!(
        code(sixth.statuses[1].code),
        Code::Ok,
        "the per-number limit alone would admit"
    );
    assert_eq!(
        header(&sixth, "X-RateLimit-Limit"),
        Some("5"),
        "headers name the denying limit"
    );

    // Counted as envoyproxy/ratelimit counts by default: the denied sixth
    // took one from the per-number budget too.
    let alone = ask(&server, rls_request("messaging", &[&number])).await;
    assert_eq!(alone.statuses[0].limit_remaining, 93);

    // Another number has its own marketing budget.
    let other = ask(
        &server,
        rls_request(
            "messaging",
            &[&[("message_type", "marketing"), ("to_number", "2062222222")]],
        ),
    )
    .await;
    assert_eq!(code(other.overall_code), Code::Ok);
    assert_eq!(other.statuses[0].limit_remaining, 4);
}

#[tokio::test]
async fn readme_example3_most_specific_match_and_blacklist() {
    let server = readme_server();
    let any = ask(
        &server,
        rls_request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]]),
    )
    .await;
    assert_eq!(code(any.overall_code), Code::Ok);
    assert_eq!(limit_of(&any.statuses[0]), Some((10, Unit::Second)));
    let banned = ask(
        &server,
        rls_request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]]),
    )
    .await;
    assert_eq!(code(banned.overall_code), Code::OverLimit);
    assert_eq!(limit_of(&banned.statuses[0]), Some((0, Unit::Second)));
    assert_eq!(banned.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn readme_example4_levels_must_match() {
    let server = readme_server();
    let two = [("key", "value"), ("subkey", "subvalue")];
    let flat = ask(&server, rls_request("example4", &[&two])).await;
    assert_eq!(
        flat.statuses[0].current_limit, None,
        "two entries do not match a one-level rule"
    );
    let one = ask(&server, rls_request("example4", &[&[("key", "value")]])).await;
    assert_eq!(limit_of(&one.statuses[0]), Some((300, Unit::Second)));
    let nested = ask(&server, rls_request("example4_nested", &[&two])).await;
    assert_eq!(limit_of(&nested.statuses[0]), Some((300, Unit::Second)));
}

#[tokio::test]
async fn readme_example5_unlimited() {
    let server = readme_server();
    let ldap = ask(&server, rls_request("internal", &[&[("ldap", "x")]])).await;
    assert_eq!(code(ldap.statuses[0].code), Code::Ok);
    assert_eq!(ldap.statuses[0].current_limit, None);
    assert_eq!(
        ldap.statuses[0].limit_remaining,
        u32::MAX,
        "as envoyproxy/ratelimit documents"
    );
    let azure = ask(&server, rls_request("internal", &[&[("azure", "x")]])).await;
    assert_eq!(limit_of(&azure.statuses[0]), Some((100, Unit::Minute)));
}

#[tokio::test]
async fn readme_example6_shadow_mode_never_denies_but_is_counted() {
    let server = readme_server();
    let user_a = [("service", "auth-service"), ("user", "user-a")];
    let user_b = [("service", "auth-service"), ("user", "user-b")];
    let shadow = ask(&server, with_hits(rls_request("example6", &[&user_a]), 11)).await;
    assert_eq!(
        code(shadow.overall_code),
        Code::Ok,
        "shadow mode: over the limit, yet OK"
    );
    assert_eq!(code(shadow.statuses[0].code), Code::Ok);
    assert_eq!(limit_of(&shadow.statuses[0]), Some((10, Unit::Second)));
    let enforced = ask(&server, with_hits(rls_request("example6", &[&user_b]), 21)).await;
    assert_eq!(code(enforced.overall_code), Code::OverLimit);

    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("a text body");
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("tollgate_shadow_denials_total") && l.contains(r#"domain="example6""#)
        })
        .unwrap_or_else(|| panic!("no shadow denial counted:\n{metrics}"));
    assert!(line.ends_with(" 1"), "{line}");
}

#[tokio::test]
async fn readme_example7_replaces() {
    let server = readme_server();
    let first = [("key_1", "value_1"), ("user", "bkthomps")];
    let second = [("key_2", "value_2"), ("user", "bkthomps")];
    let alone = ask(&server, rls_request("example7", &[&first])).await;
    assert_eq!(limit_of(&alone.statuses[0]), Some((5, Unit::Second)));
    let both = ask(&server, rls_request("example7", &[&first, &second])).await;
    assert_eq!(code(both.overall_code), Code::Ok);
    assert_eq!(
        both.statuses[0].current_limit, None,
        "replaced: not evaluated"
    );
    assert_eq!(limit_of(&both.statuses[1]), Some((10, Unit::Second)));
}

#[tokio::test]
async fn wildcard_values_match_by_prefix_with_a_budget_per_value() {
    let server = readme_server();
    let path = |p: &'static str| rls_request("wildcard", &[&[("path", p)]]);
    for _ in 0..2 {
        let response = ask(&server, path("/api/a")).await;
        assert_eq!(code(response.overall_code), Code::Ok);
        assert_eq!(limit_of(&response.statuses[0]), Some((2, Unit::Day)));
    }
    assert_eq!(
        code(ask(&server, path("/api/a")).await.overall_code),
        Code::OverLimit
    );
    assert_eq!(
        code(ask(&server, path("/api/b")).await.overall_code),
        Code::Ok
    );
    let special = ask(&server, path("/api/special")).await;
    assert_eq!(
        limit_of(&special.statuses[0]),
        Some((1, Unit::Day)),
        "exact beats wildcard"
    );
    let other = ask(&server, path("/apix")).await;
    assert_eq!(other.statuses[0].current_limit, None);
}

#[tokio::test]
async fn layers_are_all_or_nothing() {
    let server = readme_server();
    let layers = [&[("user", "dee")][..], &[("global", "all")][..]];
    for _ in 0..2 {
        assert_eq!(
            code(
                ask(&server, rls_request("layers", &layers))
                    .await
                    .overall_code
            ),
            Code::Ok
        );
    }
    let denied = ask(&server, rls_request("layers", &layers)).await;
    assert_eq!(code(denied.overall_code), Code::OverLimit);
    assert_eq!(code(denied.statuses[0].code), Code::OverLimit);
    let global = ask(&server, rls_request("layers", &[&[("global", "all")]])).await;
    assert_eq!(
        global.statuses[0].limit_remaining, 97,
        "2 admitted + this one: the deny took nothing"
    );
}
