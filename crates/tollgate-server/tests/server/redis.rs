//! `tollgate serve --redis`: instances sharing one real `redis-server` share
//! their limits (in hybrid mode within the documented overshoot), and a Redis
//! that cannot be reached at start-up is a clear error.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Redis, Server, free_port, rls_request, tollgate};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::json;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const HOURLY: &str = "domain: shared\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_one_limit() {
    let redis = Redis::start();
    let url = redis.url();
    // A timeout no loaded test machine reaches: a check decided locally
    // would be each instance's own.
    let args = ["--redis", &url, "--redis-timeout", "5s"];
    let a = Server::with_config(&[("shared.yaml", HOURLY)], &args);
    let b = Server::with_config(&[("shared.yaml", HOURLY)], &args);
    let mut clients = [a.grpc_client().await, b.grpc_client().await];
    assert!(
        a.wait_for_log(
            &[
                "store ready",
                "redis_code=\"function\"",
                "redis_module=false"
            ],
            common::STARTUP
        )
        .await,
        "Redis 7 without the module runs the code as a function: {}",
        a.log()
    );
    let mut admitted = 0;
    for i in 0..12 {
        let response = clients[i % 2]
            .should_rate_limit(rls_request("shared", &[&[("user", "alice")]]))
            .await
            .expect("answers")
            .into_inner();
        admitted += usize::from(response.overall_code == 1);
    }
    assert_eq!(
        admitted, 5,
        "two instances together admit the limit once, not twice"
    );
}

#[test]
fn an_unreachable_redis_at_start_up_is_a_clear_error() {
    let port = free_port();
    let output = tollgate()
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(["--redis", &format!("redis://127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot connect to Redis"), "{stderr}");
}

/// One rule refuses while Redis is down, the other counts on this instance.
const FAILURES: &str = r#"domain: failures
rules:
  - name: payments
    match: [{ key: payments }]
    failure: fail_closed
    limit: { requests: 2, per: 1h }
  - name: search
    match: [{ key: search }]
    limit: { requests: 2, per: 1h }
"#;

async fn code(client: &mut RateLimitServiceClient<Channel>, key: &str) -> i32 {
    client
        .should_rate_limit(rls_request("failures", &[&[(key, "x")]]))
        .await
        .expect("answers, Redis or not")
        .into_inner()
        .overall_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rule_falls_back_by_its_failure_policy_and_readyz_follows_redis() {
    const OK: i32 = 1;
    const OVER_LIMIT: i32 = 2;
    let mut redis = Redis::start();
    // While Redis is up, no check may time out on a loaded machine (a
    // fail_closed rule would refuse it); once it is killed, checks fail at
    // once (connection refused), whatever the timeout.
    let url = redis.url();
    let server = Server::with_config(
        &[("failures.yaml", FAILURES)],
        &["--redis", &url, "--redis-timeout", "5s"],
    );
    let mut client = server.grpc_client().await;
    let ready = || async {
        reqwest::get(server.url("/readyz"))
            .await
            .expect("answers")
            .status()
    };
    assert_eq!(ready().await, 200);
    assert_eq!(code(&mut client, "payments").await, OK);
    assert_eq!(code(&mut client, "search").await, OK);

    redis.kill();
    assert_eq!(ready().await, 503, "Redis is gone");
    for _ in 0..3 {
        assert_eq!(
            code(&mut client, "payments").await,
            OVER_LIMIT,
            "fail_closed refuses"
        );
    }
    // `local`: counted on this instance, with the rule's quota, from where
    // Redis left off: one of two left.
    assert_eq!(code(&mut client, "search").await, OK);
    assert_eq!(code(&mut client, "search").await, OVER_LIMIT);
    assert_eq!(code(&mut client, "search").await, OVER_LIMIT);

    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    assert_eq!(
        value("tollgate_redis_fallbacks_total{failure=\"fail_closed\"}"),
        3.0
    );
    // `local`: the three `search` checks, and the readiness poll's probe
    // read (a `local` limit) if one was between its PING and its read when
    // Redis died.
    let local = value("tollgate_redis_fallbacks_total{failure=\"local\"}");
    assert!((3.0..=4.0).contains(&local), "{local} local fallbacks");
    assert!(value("tollgate_redis_checks_total") >= 2.0);
    assert!(value("tollgate_redis_errors_total") + value("tollgate_redis_timeouts_total") >= 1.0);
    assert!(
        value("tollgate_redis_breaker_state") > 0.0,
        "the breaker opened"
    );

    // The live page's store health says the same.
    let live = live_json(&server).await;
    let store = &live["store"];
    assert_eq!(store["kind"], "redis");
    assert_eq!(store["memory"], serde_json::Value::Null);
    assert_eq!(store["redis"]["fallbacks"]["fail_closed"], 3);
    assert_eq!(store["redis"]["fallbacks"]["local"], local as u64);
    assert_ne!(store["redis"]["breaker"], "closed", "{store}");
    assert!(
        store["redis"]["breaker_opens"].as_u64() >= Some(1),
        "{store}"
    );
}

/// The live page's data, `/live.json`.
async fn live_json(server: &Server) -> serde_json::Value {
    reqwest::get(server.url("/live.json"))
        .await
        .expect("answers")
        .error_for_status()
        .expect("200")
        .json()
        .await
        .expect("JSON")
}

/// `GET /healthcheck` and gRPC health follow the store as `/readyz` does,
/// as envoyproxy/ratelimit's follow its Redis connection (its
/// `src/server/health.go`, `TestHealthCheck` and `TestGrpcHealthCheck`
/// in `test/server/health_test.go`): 200 `OK` and `SERVING` while it
/// answers, 500 with an empty body and `NOT_SERVING` while it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_follow_redis() {
    let mut redis = Redis::start();
    let url = redis.url();
    let server = Server::with_config(
        &[("shared.yaml", HOURLY)],
        &["--redis", &url, "--redis-timeout", "5s"],
    );
    let channel = Channel::from_shared(format!("http://{}", server.grpc))
        .expect("a valid URI")
        .connect()
        .await
        .expect("the gRPC listener accepts");
    let mut grpc = HealthClient::new(channel);
    let probes = async |grpc: &mut HealthClient<Channel>| {
        let response = reqwest::get(server.url("/healthcheck"))
            .await
            .expect("answers");
        let status = response.status().as_u16();
        let body = response.text().await.expect("a body");
        let mut serving = Vec::new();
        for service in [
            "ratelimit",
            "",
            "envoy.service.ratelimit.v3.RateLimitService",
        ] {
            let request = HealthCheckRequest {
                service: service.to_owned(),
            };
            let answer = grpc.check(request).await.expect("health answers");
            serving.push(answer.into_inner().status == ServingStatus::Serving as i32);
        }
        (status, body, serving)
    };
    let healthy = (200, "OK".to_owned(), vec![true; 3]);
    let unhealthy = (500, String::new(), vec![false; 3]);
    assert_eq!(probes(&mut grpc).await, healthy);

    redis.kill();
    health_becomes(&mut grpc, ServingStatus::NotServing).await;
    assert_eq!(probes(&mut grpc).await, unhealthy, "Redis is gone");

    redis.restart();
    health_becomes(&mut grpc, ServingStatus::Serving).await;
    assert_eq!(probes(&mut grpc).await, healthy, "Redis is back");
}

/// Waits (bounded) for gRPC health's `Watch` to report `status` for the
/// Rate Limit Service's full name, the last name the service publishes a
/// change under (after `/healthcheck` and the other names).
async fn health_becomes(grpc: &mut HealthClient<Channel>, status: ServingStatus) {
    let request = HealthCheckRequest {
        service: "envoy.service.ratelimit.v3.RateLimitService".to_owned(),
    };
    let mut updates = grpc.watch(request).await.expect("watch").into_inner();
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(update) = updates.message().await.expect("health updates") {
            if update.status == status as i32 {
                return;
            }
        }
        panic!("the health stream ended");
    })
    .await;
    assert!(seen.is_ok(), "no {status:?} within 20 s");
}

/// One GCRA budget of 1,000 per hour (burst 1,000) shared by every instance.
const HOT: &str = r#"domain: hot
rules:
  - name: api
    match: [{ key: api }]
    algorithm: gcra
    limit: { requests: 1000, per: 1h }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_instances_on_one_redis_stay_within_the_documented_overshoot() {
    const OK: i32 = 1;
    const INSTANCES: u64 = 2;
    const LIMIT: u64 = 1000;
    // --hybrid-max-lease 0.05 of a capacity of 1,000.
    const MAX_LEASE: u64 = 50;
    let redis = Redis::start();
    let url = redis.url();
    // The floor holds while no call to Redis fails: a leasing call past
    // the default 10 ms (a loaded test machine) holds its units in its
    // record until the record's deadline, two lease TTLs away.
    let args = [
        "--redis",
        &url,
        "--redis-timeout",
        "1s",
        "--hybrid",
        "--hybrid-max-lease",
        "0.05",
        "--hybrid-lease-ttl",
        "1h",
    ];
    let a = Server::with_config(&[("hot.yaml", HOT)], &args);
    let b = Server::with_config(&[("hot.yaml", HOT)], &args);
    let mut clients = [a.grpc_client().await, b.grpc_client().await];
    let started = Instant::now();
    let mut admitted = 0u64;
    let mut denied_in_a_row = 0;
    let mut i = 0;
    // Until both instances deny, several times each: the budget and every
    // lease are spent.
    while denied_in_a_row < 20 {
        let code = clients[i % 2]
            .should_rate_limit(rls_request("hot", &[&[("api", "x")]]))
            .await
            .expect("answers")
            .into_inner()
            .overall_code;
        i += 1;
        if code == OK {
            admitted += 1;
            denied_in_a_row = 0;
        } else {
            denied_in_a_row += 1;
        }
        assert!(i < 5_000, "still admitting after {i} requests");
    }
    // burst + rate × T + N × max_lease, with T the test's duration.
    let refilled = (started.elapsed().as_secs_f64() * LIMIT as f64 / 3600.0).ceil() as u64;
    let bound = LIMIT + refilled + INSTANCES * MAX_LEASE;
    eprintln!("hybrid: admitted {admitted} of {LIMIT} (bound {bound}) in {i} requests");
    assert!(admitted <= bound, "admitted {admitted} > {bound}");
    assert!(
        admitted + INSTANCES * MAX_LEASE >= LIMIT,
        "admitted {admitted}: more than N × max lease held back"
    );

    let metrics = reqwest::get(a.url("/metrics"))
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    let local = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("tollgate_hybrid_local_decisions_total")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no hybrid metrics in\n{metrics}"));
    assert!(local > 0.0, "decisions were made from leases");

    // The live page's store health shows the leases.
    let live = live_json(&a).await;
    let store = &live["store"];
    assert_eq!(store["kind"], "redis, hybrid");
    let hybrid = &store["hybrid"];
    assert!(
        hybrid["local_decisions"].as_f64() >= Some(local),
        "{hybrid}"
    );
    assert!(hybrid["units_leased"].as_u64() > Some(0), "{hybrid}");
}

/// Five per hour for each `user`, shared by every instance.
const SHARED: &str = "domain: shared\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n";

/// One gRPC check with a 1 ms deadline and one `/json` check whose client
/// hangs up after 1 ms.
async fn give_up(
    client: &mut RateLimitServiceClient<Channel>,
    http: &reqwest::Client,
    server: &Server,
) {
    let mut request = tonic::Request::new(rls_request("shared", &[&[("user", "eve")]]));
    request.set_timeout(Duration::from_millis(1));
    let _ = client.should_rate_limit(request).await;
    let body = r#"{"domain":"shared","descriptors":[{"entries":[{"key":"user","value":"eve"}]}]}"#;
    let _ = tokio::time::timeout(
        Duration::from_millis(1),
        http.post(server.url("/json")).body(body).send(),
    )
    .await;
}

/// Regression: the breaker's probe rode on a request, so a request cancelled
/// by its client (a gRPC deadline shorter than the Redis timeout, an HTTP
/// client hanging up) left it half-open forever: every later check was
/// decided locally while Redis was healthy again, and two instances admitted
/// twice the shared limit. Probing is the store's own now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_checks_cannot_keep_decisions_from_returning_to_redis() {
    let mut redis = Redis::start();
    let url = redis.url();
    let args = [
        "--redis",
        url.as_str(),
        "--redis-timeout",
        "50ms",
        "--breaker-cool-down",
        "200ms",
    ];
    let a = Server::with_config(&[("shared.yaml", SHARED)], &args);
    let b = Server::with_config(&[("shared.yaml", SHARED)], &args);
    let mut clients = [a.grpc_client().await, b.grpc_client().await];
    let http = reqwest::Client::new();
    for server in [&a, &b] {
        assert!(
            server.wait_for_log(&["store ready"], common::STARTUP).await,
            "{}",
            server.log()
        );
    }

    redis.kill();
    // While Redis is down and after it is back, `a`'s clients give up on
    // every check before it can answer.
    for _ in 0..20 {
        give_up(&mut clients[0], &http, &a).await;
    }
    redis.restart();
    for _ in 0..20 {
        give_up(&mut clients[0], &http, &a).await;
    }

    // Within a bound (a cool-down and a probe, with room for a loaded
    // machine), both instances decide with Redis again: they share one
    // budget of 5, so together they admit exactly 5.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut round = 0;
    loop {
        let user = format!("user-{round}");
        let mut admitted = 0;
        for i in 0..12 {
            let answer = clients[i % 2]
                .should_rate_limit(rls_request("shared", &[&[("user", &user)]]))
                .await
                .unwrap_or_else(|e| panic!("{e}\na:\n{}\nb:\n{}", a.log(), b.log()))
                .into_inner();
            admitted += usize::from(answer.overall_code == 1);
        }
        if admitted == 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still deciding locally after the restart: {admitted} admitted for a shared limit of 5"
        );
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The config's `store:` section builds the stack when no flag says
/// otherwise, and a flag overrides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_section_builds_the_stack_and_flags_override_it() {
    let redis = Redis::start();
    let store = format!(
        "store:\n  redis: {}\n  hybrid: true\n  hybrid_max_lease: 0.1\n  redis_timeout: 100ms\n",
        redis.url()
    );
    let files = [("shared.yaml", SHARED), ("store.yaml", store.as_str())];
    let from_file = Server::with_config(&files, &[]);
    assert!(
        from_file
            .wait_for_log(&["store ready", "redis, hybrid"], common::STARTUP)
            .await,
        "{}",
        from_file.log()
    );
    let overridden = Server::with_config(&files, &["--hybrid", "false"]);
    assert!(
        overridden
            .wait_for_log(&["store ready store=\"redis\""], common::STARTUP)
            .await,
        "{}",
        overridden.log()
    );
    // Both decide with the one Redis: together they admit the shared 5.
    let mut clients = [
        from_file.grpc_client().await,
        overridden.grpc_client().await,
    ];
    let mut admitted = 0;
    for i in 0..12 {
        let answer = clients[i % 2]
            .should_rate_limit(rls_request("shared", &[&[("user", "zoe")]]))
            .await
            .expect("answers")
            .into_inner();
        admitted += usize::from(answer.overall_code == 1);
    }
    assert!(
        (5..=6).contains(&admitted),
        "{admitted} admitted for a shared limit of 5 (hybrid may lease one more)"
    );

    let bad = "store:\n  breaker_failures: 0\n";
    let mut refused = common::tollgate();
    let dir = common::config_dir(&[("shared.yaml", SHARED), ("store.yaml", bad)]);
    let output = refused
        .args(["serve", "--config"])
        .arg(dir.path())
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("store.breaker_failures") && stderr.contains("store.yaml"),
        "{stderr}"
    );
}

/// A rule of two centuries: more microseconds than the Redis store holds
/// exactly (2^52, about 142 years).
const CENTURIES: &str = "domain: long
rules:
  - name: fine
    match: [{ key: user }]
    limit: { requests: 5, per: 1d }
  - name: centuries
    match: [{ key: archive }]
    limit: { requests: 5, per: 73000d }
";

const FINE: &str = "domain: long
rules:
  - name: fine
    match: [{ key: user }]
    limit: { requests: 5, per: 1d }
";

/// Regression: a quota the Redis store cannot hold loaded fine, then every
/// check of it was a store error (admitted by `local`, denied by
/// `fail_closed`). Now it is refused where it is written: at start-up, on
/// reload, and in a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_redis_cannot_hold_are_refused_at_load_and_in_requests() {
    let redis = Redis::start();
    let url = redis.url();

    let dir = common::config_dir(&[("long.yaml", CENTURIES)]);
    let output = tollgate()
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(["--redis", &url, "--config", dir.path().to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in [
        "long.yaml:6",
        "rule `centuries`",
        "2^52 µs, about 142 years",
    ] {
        assert!(stderr.contains(needle), "{needle}: {stderr}");
    }
    // The memory store holds it.
    let memory = Server::with_config(&[("long.yaml", CENTURIES)], &[]);
    drop(memory);

    let server = Server::with_config(&[("long.yaml", FINE)], &["--redis", &url]);
    std::fs::write(server.config_path().join("long.yaml"), CENTURIES).unwrap();
    let refused = server
        .wait_for_log(
            &["config reload failed", "rule `centuries`"],
            Duration::from_secs(10),
        )
        .await;
    assert!(refused, "{}", server.log());
    let http = reqwest::Client::new();
    let fine =
        json!({"domain": "long", "descriptors": [{"entries": [{"key": "user", "value": "u"}]}]});
    let answer = http
        .post(server.url("/json"))
        .json(&fine)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "the last good config serves");

    let adhoc = json!({"key": "k", "limit": 5, "period": "73000d"});
    let answer = http
        .post(server.url("/v1/check"))
        .json(&adhoc)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    let body = answer.text().await.unwrap();
    assert!(body.contains("cannot enforce this limit exactly"), "{body}");
}
