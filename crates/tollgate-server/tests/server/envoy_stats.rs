//! envoyproxy/ratelimit's per-rule stats on `/metrics`, driven by gRPC
//! `ShouldRateLimit` against a real `tollgate serve`.
//!
//! The expected names and labels are envoyproxy/ratelimit's (commit f2fb157):
//! the stat names from `src/stats/manager_impl.go` (`NewStats`: `<key>.total_hits`,
//! `.over_limit`, `.near_limit`, `.within_limit`, `.shadow_mode` under
//! `ratelimit.service.rate_limit`), their keys from `src/config/config_impl.go`
//! (`GetLimit`), the Prometheus names and labels from
//! `src/stats/prom/default_mapper.yaml` as `src/stats/prom/prometheus_sink_test.go`
//! checks them (`ratelimit_service_rate_limit_over_limit` with `domain`,
//! `key1` and `key2`), and the counts from `src/limiter/base_limiter.go`.
//!
//! Windows are days, so no test depends on where a window boundary falls.

use crate::common;

use std::collections::BTreeMap;

use common::{Server, descriptor, rls_request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

const STATS: &str = "
domain: stats
descriptors:
  - key: plan
    value: free
    rate_limit: { unit: day, requests_per_unit: 5 }
  - key: bulk
    rate_limit: { unit: day, requests_per_unit: 10 }
  - key: dark
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: user
    detailed_metric: true
    rate_limit: { unit: day, requests_per_unit: 10 }
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: { unit: day, requests_per_unit: 10 }
  - key: free
    rate_limit: { unlimited: true }
  - key: layer
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: closed
    rate_limit: { unit: day, requests_per_unit: 0 }
";

const NATIVE: &str = "
domain: native
rules:
  - name: per_user
    match: [{ key: user }]
    limit: { requests: 5, per: 1h }
";

fn server() -> Server {
    Server::with_config(&[("stats.yaml", STATS), ("native.yaml", NATIVE)], &[])
}

/// Sends `request` `times` times.
async fn send(server: &Server, request: RateLimitRequest, times: usize) {
    let mut client = server.grpc_client().await;
    for _ in 0..times {
        client
            .should_rate_limit(request.clone())
            .await
            .unwrap_or_else(|status| panic!("ShouldRateLimit failed: {status:?}"));
    }
}

fn with_hits(mut request: RateLimitRequest, hits: u32) -> RateLimitRequest {
    request.hits_addend = hits;
    request
}

/// `/metrics`, and its `ratelimit_service_*` samples by series
/// (`name{labels}`, as rendered).
async fn envoy_series(server: &Server) -> (String, BTreeMap<String, u64>) {
    let text = reqwest::get(server.url("/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("a text body");
    let series = text
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_"))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            (series.to_owned(), value.parse().expect("an integer count"))
        })
        .collect();
    (text, series)
}

/// The series of `stat` for `labels` (`domain`, `key1`, `key2` in that order).
fn series(stat: &str, labels: &[&str]) -> String {
    let names = ["domain", "key1", "key2"];
    let labels: Vec<String> = names
        .iter()
        .zip(labels)
        .map(|(name, value)| format!("{name}=\"{value}\""))
        .collect();
    format!(
        "ratelimit_service_rate_limit_{stat}{{{}}}",
        labels.join(",")
    )
}

#[tokio::test]
async fn per_rule_stats_are_envoyproxy_ratelimits() {
    let server = server();
    // Limit 5, near threshold floor(5 * 0.8) = 4: hits 1-4 within, 5 near
    // (and within), 6-7 over.
    send(&server, rls_request("stats", &[&[("plan", "free")]]), 7).await;
    // Limit 10, near 8: 0 -> 7 within; 7 -> 10 within, 2 of them near;
    // 10 -> 12 over.
    let bulk = rls_request("stats", &[&[("bulk", "x")]]);
    send(&server, with_hits(bulk.clone(), 7), 1).await;
    send(&server, with_hits(bulk.clone(), 3), 1).await;
    send(&server, with_hits(bulk, 2), 1).await;
    // Limit 1, near 0: the first hit is near (and within), the second over
    // and let through.
    send(&server, rls_request("stats", &[&[("dark", "x")]]), 2).await;
    // detailed_metric: one series per value.
    send(&server, rls_request("stats", &[&[("user", "alice")]]), 2).await;
    send(&server, rls_request("stats", &[&[("user", "bob")]]), 1).await;
    // value_to_metric on `route`: its value joins the key, `method`'s does not.
    let routed = rls_request("stats", &[&[("route", "api"), ("method", "GET")]]);
    send(&server, routed, 1).await;
    // A limit of 0 denies every hit; the layer beside it is charged all the
    // same (envoyproxy/ratelimit's counting): 0 -> 1 within, 1 -> 2 near
    // (threshold floor(2 * 0.8) = 1) and within.
    let layered = rls_request("stats", &[&[("layer", "x")], &[("closed", "x")]]);
    send(&server, layered, 2).await;
    // Unlimited rules and native rules have no such stats.
    send(&server, rls_request("stats", &[&[("free", "x")]]), 1).await;
    send(&server, rls_request("native", &[&[("user", "a")]]), 1).await;

    let (text, got) = envoy_series(&server).await;
    let want: BTreeMap<String, u64> = [
        (series("total_hits", &["stats", "plan_free"]), 7),
        (series("within_limit", &["stats", "plan_free"]), 5),
        (series("near_limit", &["stats", "plan_free"]), 1),
        (series("over_limit", &["stats", "plan_free"]), 2),
        (series("total_hits", &["stats", "bulk"]), 12),
        (series("within_limit", &["stats", "bulk"]), 10),
        (series("near_limit", &["stats", "bulk"]), 2),
        (series("over_limit", &["stats", "bulk"]), 2),
        (series("total_hits", &["stats", "dark"]), 2),
        (series("within_limit", &["stats", "dark"]), 1),
        (series("near_limit", &["stats", "dark"]), 1),
        (series("over_limit", &["stats", "dark"]), 1),
        (series("shadow_mode", &["stats", "dark"]), 1),
        (series("total_hits", &["stats", "user_alice"]), 2),
        (series("within_limit", &["stats", "user_alice"]), 2),
        (series("total_hits", &["stats", "user_bob"]), 1),
        (series("within_limit", &["stats", "user_bob"]), 1),
        (series("total_hits", &["stats", "layer"]), 2),
        (series("within_limit", &["stats", "layer"]), 2),
        (series("near_limit", &["stats", "layer"]), 1),
        (series("total_hits", &["stats", "closed"]), 2),
        (series("over_limit", &["stats", "closed"]), 2),
        (series("total_hits", &["stats", "route_api", "method"]), 1),
        (series("within_limit", &["stats", "route_api", "method"]), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want, "\n{text}");
    for stat in [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ] {
        let family = format!("# TYPE ratelimit_service_rate_limit_{stat} counter");
        assert!(text.contains(&family), "no {family}:\n{text}");
    }
    // Tollgate's own metrics stay as they were.
    assert!(
        text.contains(
            r#"tollgate_decisions_total{domain="stats",rule="user_alice",result="ok"} 2"#
        ),
        "{text}"
    );
}

/// A rule's request-made keys are bounded as its detailed
/// `tollgate_decisions_total` labels are: past 1,000 values, the rest count
/// under `key1="detailed_metric_overflow"`.
#[tokio::test]
async fn request_made_keys_are_bounded_per_rule() {
    let server = server();
    let mut client = server.grpc_client().await;
    // 1,010 users in 10 requests of 101 descriptors.
    for batch in 0..10 {
        let descriptors = (0..101)
            .map(|i| descriptor(&[("user", &format!("u{}", batch * 101 + i))]))
            .collect();
        let request = RateLimitRequest {
            domain: "stats".into(),
            descriptors,
            hits_addend: 0,
        };
        client
            .should_rate_limit(request)
            .await
            .unwrap_or_else(|status| panic!("ShouldRateLimit failed: {status:?}"));
    }
    let (text, got) = envoy_series(&server).await;
    let totals: Vec<(&String, &u64)> = got
        .iter()
        .filter(|(s, _)| s.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .collect();
    assert_eq!(totals.len(), 1_001, "{text}");
    assert_eq!(
        got.get(&series(
            "total_hits",
            &["stats", "detailed_metric_overflow"]
        )),
        Some(&10),
        "{text}"
    );
}
