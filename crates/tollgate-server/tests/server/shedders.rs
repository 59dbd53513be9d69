//! Stripe's fleet load shedder on the fleet's shared budget: a rule with
//! `shed: true` sheds each priority tier past its share of the budget with
//! 503 and `Retry-After` (not the 429 of a limit), through the gateway in
//! front of a real upstream; a critical request past the whole budget is
//! limited. In process, on paused time. Utilization reports shared by the
//! replicas of one real `redis-server`. And a real Envoy asking Tollgate
//! through two ratelimit filters: 429 for limits, 503 for sheds.

use std::time::Duration;

use crate::common::{Redis, Server};
use crate::in_process::{arrived, client, counter, gateway_of, live_json, metrics};
use crate::real_envoy::{self, Envoy};

use serde_json::{Value, json};

/// stripe.yaml's fleet budget, eight requests an hour, through stripe.yaml's
/// gateway actions (the tier from `x-priority`, low without it).
const FLEET: &str = "
domain: stripe
shed:
  thresholds: { critical: 100, high: 75, low: 50 }
rules:
  - name: fleet-load-shedder
    match: [{ key: fleet }, { key: priority }]
    algorithm: fixed-window
    limit: { requests: 8, per: 1h }
    shed: true
gateway:
  domain: stripe
  rate_limits:
    - actions:
        - generic_key: { descriptor_key: fleet, descriptor_value: api }
        - request_headers: { header_name: x-priority, descriptor_key: priority }
    - actions:
        - generic_key: { descriptor_key: fleet, descriptor_value: api }
        - header_value_match:
            descriptor_key: priority
            descriptor_value: low
            headers: [{ name: x-priority, present_match: false }]
";

#[tokio::test(start_paused = true)]
async fn the_gateway_sheds_each_tier_past_its_share_of_the_fleet_budget_with_503() {
    let (running, arrivals, _dirs) = gateway_of("stripe.yaml", FLEET).await;
    let base = format!("http://{}", running.gateway_addr().expect("a gateway"));
    let get = async |path: &str, tier: Option<&str>| {
        let mut request = client().get(format!("{base}{path}"));
        if let Some(tier) = tier {
            request = request.header("x-priority", tier);
        }
        let response = request.send().await.expect("the gateway answers");
        let status = response.status().as_u16();
        let retry_after: Option<u64> = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().expect("delta-seconds"));
        let body: Value = response.json().await.unwrap_or(Value::Null);
        (status, retry_after, body)
    };

    // Low may spend half the budget: four of eight.
    for i in 0..4 {
        assert_eq!(get(&format!("/low-{i}"), Some("low")).await.0, 200);
    }
    let (status, retry_after, body) = get("/low-shed", Some("low")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "overloaded", "{body}");
    // When the tier's share has room again: the hour window's end.
    assert!(
        retry_after.is_some_and(|s| (1..=3600).contains(&s)),
        "{retry_after:?}"
    );
    assert_eq!(get("/none-shed", None).await.0, 503, "no tier is low");
    // A shed request was charged nothing: high still has its two, to 75 %.
    for i in 0..2 {
        assert_eq!(get(&format!("/high-{i}"), Some("high")).await.0, 200);
    }
    assert_eq!(get("/high-shed", Some("high")).await.0, 503);
    // Critical keeps the last quarter, then is over the limit: 429.
    for i in 0..2 {
        assert_eq!(
            get(&format!("/critical-{i}"), Some("critical")).await.0,
            200
        );
    }
    let (status, retry_after, _) = get("/critical-limited", Some("critical")).await;
    assert_eq!(status, 429);
    assert!(retry_after.is_some());

    let paths = arrived(&arrivals);
    assert_eq!(
        paths,
        [
            "/low-0",
            "/low-1",
            "/low-2",
            "/low-3",
            "/high-0",
            "/high-1",
            "/critical-0",
            "/critical-1"
        ],
        "no shed or limited request reaches the upstream"
    );
    let metrics = metrics(&running).await;
    let shed = |labels: &str| counter(&metrics, &format!("tollgate_{labels}"));
    assert_eq!(shed(r#"checks_total{api="gateway",result="shed"}"#), 3);
    assert_eq!(
        shed(r#"enforcer_shed_total{domain="stripe",tier="low"}"#),
        2
    );
    assert_eq!(
        shed(r#"enforcer_shed_total{domain="stripe",tier="high"}"#),
        1
    );
    // The live page's shedding panel shows the enforcer's sheds by tier.
    let live: Value = live_json(&running).await;
    assert_eq!(
        live["shedding"]["reported"],
        json!([{"domain": "stripe", "utilization": null, "instances": 0, "shed": [0, 1, 2]}]),
        "{live}"
    );
}

/// Shedding on reported utilization, one hour's budget per user.
const REPORTED: &str = "
domain: api
shed:
  report_ttl: 1h
rules:
  - name: per-user
    match: [{ key: user }]
    limit: { requests: 100, per: 1h }
";

/// `POST path` with `body` to `server`: the status and the JSON answer.
async fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let response = client()
        .post(server.url(path))
        .json(&body)
        .send()
        .await
        .expect("the HTTP API answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

fn low_check() -> Value {
    json!({"domain": "api", "descriptors": [
        {"entries": [{"key": "user", "value": "u1"}]},
        {"entries": [{"key": "priority", "value": "low"}]},
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_posted_to_one_replica_sheds_at_every_replica_through_redis() {
    let redis = Redis::start();
    let url = redis.url();
    let args = ["--redis", &url, "--redis-timeout", "5s"];
    let a = Server::with_config(&[("api.yaml", REPORTED)], &args);
    let b = Server::with_config(&[("api.yaml", REPORTED)], &args);
    assert_eq!(post(&b, "/v1/check", low_check()).await.0, 200);

    let (status, body) = post(
        &a,
        "/v1/utilization",
        json!({"domain": "api", "instance": "pod-1", "utilization": 0.9}),
    )
    .await;
    assert_eq!((status, &body["instances"]), (200, &json!(1)), "{body}");
    // B learns it from Redis within its sync period: a bounded number of
    // tries, each a check of B.
    let mut shed = None;
    for _ in 0..100 {
        let (status, body) = post(&b, "/v1/check", low_check()).await;
        if status == 503 {
            shed = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shed = shed.unwrap_or_else(|| panic!("B never shed\n{}", b.log()));
    assert_eq!(
        (&shed["code"], &shed["utilization"]),
        (&json!("shed"), &json!(0.9))
    );

    // B's own report joins A's: the fleet's mean, at both.
    let (status, body) = post(
        &b,
        "/v1/utilization",
        json!({"domain": "api", "instance": "pod-2", "utilization": 0.1}),
    )
    .await;
    assert_eq!(
        (status, &body["utilization"], &body["instances"]),
        (200, &json!(0.5), &json!(2)),
        "{body}"
    );
    let mut admitted = false;
    for _ in 0..100 {
        if post(&a, "/v1/check", low_check()).await.0 == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted, "A never took B's report\n{}", a.log());
    // Kept in Redis, lapsing with the domain's report_ttl.
    let keys = redis.cli(&["--scan", "--pattern", "*utilization*"]);
    let key = keys.lines().next().expect("a utilization key in Redis");
    let ttl: u64 = redis.cli(&["pttl", key]).trim().parse().expect("a TTL");
    assert!((1..=3_600_000).contains(&ttl), "{key} lapses: {ttl} ms");
}

/// The client's own limit (three an hour per API key), and the fleet's
/// shared budget (ten an hour), shed by tier in a domain of its own, as
/// `deploy/envoy/shed.yaml` asks them.
const LIMITS: &str = "
domain: api
rules:
  - name: per-key
    match: [{ key: api_key }]
    algorithm: fixed-window
    limit: { requests: 3, per: 1h }
";
const SHED: &str = "
domain: api-shed
shed: {}
rules:
  - name: fleet
    match: [{ key: fleet }, { key: priority }]
    algorithm: fixed-window
    limit: { requests: 10, per: 1h }
    shed: true
";

/// A real Envoy with `deploy/envoy/shed.yaml`: two ratelimit filters asking
/// Tollgate, a limit answered 429 and a shed 503 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_answers_429_for_limits_and_503_for_sheds_through_two_filters() {
    let Some(binary) = real_envoy::envoy() else {
        return;
    };
    let server = Server::with_config(&[("api.yaml", LIMITS), ("shed.yaml", SHED)], &[]);
    let up = real_envoy::upstream().await;
    let envoy = Envoy::with(&binary, "shed.yaml", server.grpc, up, real_envoy::patient).await;
    let http = client();
    let get = async |key: &str, tier: Option<&str>| {
        let mut request = http.get(envoy.url()).header("x-api-key", key);
        if let Some(tier) = tier {
            request = request.header("x-priority", tier);
        }
        let response = request.send().await.expect("Envoy answers");
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (response.status().as_u16(), retry_after)
    };

    // Low may spend half the budget (Envoy's readiness probe, a low request,
    // may have spent one), then is shed: 503 from the second filter.
    let mut admitted = 0;
    let shed = loop {
        let (status, retry_after) = get(&format!("low-{admitted}"), None).await;
        match status {
            200 if admitted < 5 => admitted += 1,
            503 => break retry_after,
            other => panic!("a low request answered {other} after {admitted} admitted"),
        }
    };
    assert!(admitted >= 3, "only {admitted} low requests were admitted");
    let seconds: u64 = shed
        .expect("a shed answer carries Retry-After")
        .parse()
        .expect("delta-seconds");
    assert!((1..=3600).contains(&seconds), "{seconds}");

    // Critical keeps the rest of the budget; the client's own limit still
    // answers 429, from the first filter.
    for _ in 0..3 {
        assert_eq!(get("a", Some("critical")).await.0, 200);
    }
    assert_eq!(get("a", Some("critical")).await.0, 429);
    // Eight or nine of ten spent: past high's three quarters, not the whole.
    assert_eq!(get("h", Some("high")).await.0, 503);
    assert_eq!(get("c", Some("critical")).await.0, 200);
}
