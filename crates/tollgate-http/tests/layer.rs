//! The tower layer: without sockets (`oneshot` into an axum router), and over
//! real HTTP (an axum server on 127.0.0.1:0 and a reqwest client).

use std::future::{Future, ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::{Notify, oneshot};
use tollgate_core::{Lease, Limit, Outcome, Store, StoreError, SystemClock};
use tollgate_http::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_BUCKET, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
};
use tollgate_http::{
    ClientIpConfig, ClientIpKey, FixedKey, HeaderKey, HeaderStyle, PolicyHandle, RateLimit,
    RateLimitLayer, RouteKey,
};
use tollgate_policy::{KillSwitch, Policy};
use tollgate_store::{MemoryConfig, MemoryStore};
use tower::ServiceExt;

fn policy(yaml: &str) -> Policy {
    Policy::parse("test.yaml", yaml).expect("a valid test policy")
}

/// A memory store that counts the calls it gets.
#[derive(Default)]
struct Counting {
    inner: MemoryStore,
    checks: Arc<AtomicUsize>,
    releases: Arc<AtomicUsize>,
}

impl Store for Counting {
    fn check(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.inner.check(limits)
    }

    fn release(&self, leases: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(leases)
    }
}

/// A store that is always down.
struct Down;

impl Store for Down {
    fn check(&self, _: &[Limit<'_>]) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        ready(Err(StoreError::Timeout(Duration::from_millis(5))))
    }

    fn release(&self, _: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(Err(StoreError::Timeout(Duration::from_millis(5))))
    }
}

fn limited(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// A request from `peer`, as axum's `ConnectInfo` would record it.
fn from(peer: &str) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    request.extensions_mut().insert(axum::extract::ConnectInfo(
        peer.parse::<SocketAddr>().unwrap(),
    ));
    request
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

fn text(headers: &HeaderMap, name: impl http::header::AsHeaderName) -> &str {
    headers.get(name).map_or("", |v| v.to_str().unwrap())
}

const PER_IP: &str = "
domain: api
rules:
  - name: per-ip
    match: [{ key: remote_address }]
    limit: { requests: 2, per: 1h }
";

#[tokio::test]
async fn headers_on_every_response_and_a_json_429() {
    let layer = RateLimitLayer::builder("api", policy(PER_IP), MemoryStore::default()).build();
    let app = limited(layer);
    for remaining in ["1", "0"] {
        let (status, headers, body) = send(&app, from("192.0.2.1:1000")).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
        assert_eq!(text(&headers, X_RATELIMIT_LIMIT), "2");
        assert_eq!(text(&headers, X_RATELIMIT_REMAINING), remaining);
        assert_eq!(text(&headers, RATELIMIT_POLICY), r#""per-ip";q=2;w=3600"#);
        assert!(text(&headers, RATELIMIT).starts_with(r#""per-ip";r="#));
        assert!(headers.get("retry-after").is_none());
    }
    let (status, headers, body) = send(&app, from("192.0.2.1:2000")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(text(&headers, "content-type"), "application/json");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"], "rate_limit_exceeded");
    let retry_after = text(&headers, "retry-after");
    assert_eq!(body["retry_after"].to_string(), retry_after);
    assert!(body["message"].as_str().unwrap().contains("per-ip"));

    // Another address has its own budget.
    let (status, ..) = send(&app, from("192.0.2.2:1000")).await;
    assert_eq!(status, StatusCode::OK);
}

/// A check on a store that decides at once is made within `call`, so a
/// request counts once it is called, even if its future is dropped unpolled;
/// on a store that waits it is made when the future is first polled.
#[tokio::test]
async fn a_store_that_decides_at_once_is_asked_within_call() {
    use tower::{Layer, Service};
    let one = PER_IP.replace("requests: 2", "requests: 1");
    let inner = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    let status = |service: &RateLimit<_>| {
        let service = service.clone();
        async move { service.oneshot(from("192.0.2.1:1")).await.unwrap().status() }
    };

    let memory = RateLimitLayer::builder("api", policy(&one), MemoryStore::default())
        .build()
        .layer(inner);
    drop(memory.clone().call(from("192.0.2.1:1")));
    assert_eq!(status(&memory).await, StatusCode::TOO_MANY_REQUESTS);

    let store = Counting::default();
    let checks = Arc::clone(&store.checks);
    let waits = RateLimitLayer::builder("api", policy(&one), store)
        .build()
        .layer(inner);
    drop(waits.clone().call(from("192.0.2.1:1")));
    assert_eq!(
        checks.load(Ordering::SeqCst),
        0,
        "never polled, never asked"
    );
    assert_eq!(status(&waits).await, StatusCode::OK);
    assert_eq!(checks.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_local_pre_check_stops_traffic_before_the_store_of_record() {
    let remote = Counting::default();
    let remote_checks = Arc::clone(&remote.checks);
    let layer = RateLimitLayer::builder("api", policy(PER_IP), remote)
        .local(MemoryStore::default())
        .build();
    let app = limited(layer);
    for _ in 0..2 {
        assert_eq!(send(&app, from("192.0.2.1:1")).await.0, StatusCode::OK);
    }
    assert_eq!(remote_checks.load(Ordering::SeqCst), 2);
    for _ in 0..5 {
        let (status, headers, _) = send(&app, from("192.0.2.1:1")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(headers.contains_key("retry-after"));
    }
    assert_eq!(
        remote_checks.load(Ordering::SeqCst),
        2,
        "denied locally: the store of record never saw them"
    );

    // A looser local policy lets the store of record decide.
    let remote = Counting::default();
    let remote_checks = Arc::clone(&remote.checks);
    let loose = PER_IP.replace("requests: 2", "requests: 4");
    let layer = RateLimitLayer::builder("api", policy(PER_IP), remote)
        .local_with_policy(MemoryStore::default(), policy(&loose))
        .build();
    let app = limited(layer);
    let statuses: Vec<StatusCode> = {
        let mut s = Vec::new();
        for _ in 0..6 {
            s.push(send(&app, from("192.0.2.1:1")).await.0);
        }
        s
    };
    assert_eq!(statuses.iter().filter(|s| s.is_success()).count(), 2);
    assert_eq!(
        remote_checks.load(Ordering::SeqCst),
        4,
        "the local budget of 4"
    );
}

#[tokio::test]
async fn failure_policies_decide_when_the_store_is_down() {
    let open = PER_IP.replace("limit:", "failure: fail_open\n    limit:");
    let app_open = limited(RateLimitLayer::builder("api", policy(&open), Down).build());
    let (status, headers, _) = send(&app_open, from("192.0.2.1:1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers.get(X_RATELIMIT_LIMIT).is_none(),
        "nothing was decided"
    );

    let local = limited(RateLimitLayer::builder("api", policy(PER_IP), Down).build());
    assert_eq!(send(&local, from("192.0.2.1:1")).await.0, StatusCode::OK);

    let closed = PER_IP.replace("limit:", "failure: fail_closed\n    limit:");
    let app_closed = limited(RateLimitLayer::builder("api", policy(&closed), Down).build());
    // Denied as over limit, as through every door (DESIGN §3).
    let (status, headers, body) = send(&app_closed, from("192.0.2.1:1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.contains_key("retry-after"));
    assert!(body.contains("rate_limit_exceeded"), "{body}");

    // With a pre-check, a store that is down leaves the local decision in force.
    let guarded = limited(
        RateLimitLayer::builder("api", policy(PER_IP), Down)
            .local(MemoryStore::default())
            .build(),
    );
    let statuses = [
        send(&guarded, from("192.0.2.1:1")).await.0,
        send(&guarded, from("192.0.2.1:1")).await.0,
        send(&guarded, from("192.0.2.1:1")).await.0,
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

const LAYERS: &str = "
domain: api
rules:
  - name: global
    match: [{ key: generic_key, value: global }]
    limit: { requests: 100, per: 1h }
  - name: per-key
    match: [{ key: api_key }]
    limit: { requests: 1, per: 1h }
  - name: dark
    match: [{ key: route }]
    limit: { requests: 1, per: 1h }
    shadow: true
  - name: search
    match: [{ key: user }, { key: route, value: GET /search }]
    bucket: expensive
    limit: { requests: 5, per: 1m }
";

#[tokio::test]
async fn layers_shadow_limits_buckets_and_the_kill_switch() {
    let store = Counting::default();
    let kill_switch = Arc::new(KillSwitch::default());
    let layer = RateLimitLayer::builder("api", policy(LAYERS), store)
        .descriptor(FixedKey::new("global"))
        .descriptor(HeaderKey::new(
            http::HeaderName::from_static("x-api-key"),
            "api_key",
        ))
        .descriptor(RouteKey::new())
        .headers(HeaderStyle::ALL)
        .kill_switch(Arc::clone(&kill_switch))
        .build();
    let app = limited(layer);
    let keyed = |key: &str| {
        let mut r = from("192.0.2.1:1");
        r.headers_mut().insert("x-api-key", key.parse().unwrap());
        r
    };

    // Both enforcing layers are listed; the tighter one is reported. The shadow
    // rule `dark` (1 per hour on the route) is never reported and never denies.
    let (status, headers, _) = send(&app, keyed("a")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        text(&headers, RATELIMIT_POLICY),
        r#""global";q=100;w=3600, "per-key";q=1;w=3600"#
    );
    assert!(text(&headers, RATELIMIT).starts_with(r#""per-key";r=0"#));
    // The second request is denied by per-key, and per-key's deny takes nothing
    // from the global budget.
    let (status, headers, _) = send(&app, keyed("a")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(text(&headers, RATELIMIT).starts_with(r#""per-key";r=0;t="#));
    let (status, headers, _) = send(&app, keyed("b")).await;
    assert_eq!(status, StatusCode::OK, "the shadow limit never denies");
    assert!(text(&headers, RATELIMIT).starts_with(r#""per-key""#));
    let (_, headers, _) = send(&app, from("192.0.2.1:1")).await;
    assert_eq!(
        text(&headers, X_RATELIMIT_REMAINING),
        "97",
        "two admitted + this one"
    );

    // Switched off, per-key neither counts nor denies.
    kill_switch.set("api", Some("per-key"), false);
    assert_eq!(send(&app, keyed("a")).await.0, StatusCode::OK);
    kill_switch.set("api", Some("per-key"), true);
    assert_eq!(
        send(&app, keyed("a")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );

    // A shared bucket names itself.
    let layer = RateLimitLayer::builder("api", policy(LAYERS), MemoryStore::default())
        .descriptor(
            tollgate_http::Composite::new()
                .with(HeaderKey::new(
                    http::HeaderName::from_static("x-user"),
                    "user",
                ))
                .with(RouteKey::new()),
        )
        .headers(HeaderStyle::ALL)
        .build();
    let app = Router::new()
        .route("/search", get(|| async { "found" }))
        .layer(layer);
    let mut request = Request::get("/search").body(Body::empty()).unwrap();
    request
        .headers_mut()
        .insert("x-user", "alice".parse().unwrap());
    let (status, headers, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text(&headers, X_RATELIMIT_BUCKET), "expensive");
    assert_eq!(text(&headers, RATELIMIT_POLICY), r#""expensive";q=5;w=60"#);
}

#[tokio::test]
async fn a_rule_of_zero_refuses_without_asking_the_store() {
    let envoy = "
domain: api
descriptors:
  - key: api_key
    value: banned
    rate_limit: { unit: minute, requests_per_unit: 0 }
";
    let store = Counting::default();
    let checks = Arc::clone(&store.checks);
    let layer = RateLimitLayer::builder("api", policy(envoy), store)
        .descriptor(HeaderKey::new(
            http::HeaderName::from_static("x-api-key"),
            "api_key",
        ))
        .build();
    let app = limited(layer);
    let mut request = from("192.0.2.1:1");
    request
        .headers_mut()
        .insert("x-api-key", "banned".parse().unwrap());
    let (status, headers, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = text(&headers, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry_after), "until the minute ends");
    assert_eq!(text(&headers, X_RATELIMIT_LIMIT), "0");
    assert_eq!(checks.load(Ordering::SeqCst), 0);
    // Other keys match no rule and pass without headers.
    let mut request = from("192.0.2.1:1");
    request
        .headers_mut()
        .insert("x-api-key", "fine".parse().unwrap());
    let (status, headers, _) = send(&app, request).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get(X_RATELIMIT_LIMIT).is_none());
}

#[tokio::test]
async fn a_policy_can_be_swapped_while_serving() {
    let handle = PolicyHandle::new(policy(PER_IP));
    let layer = RateLimitLayer::builder("api", handle.clone(), MemoryStore::default()).build();
    let app = limited(layer);
    for _ in 0..2 {
        send(&app, from("192.0.2.1:1")).await;
    }
    let (status, headers, body) = send(&app, from("192.0.2.1:1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(text(&headers, X_RATELIMIT_LIMIT), "2");
    assert!(body.contains(r#"\"per-ip\""#), "{body}");
    // A reloaded rule denies in its own words, not in the last 429's
    // (which this thread keeps for denials that read the same).
    handle.store(policy(
        &PER_IP.replace("per-ip", "per-client").replace("2,", "1,"),
    ));
    // Its own budget, or the old one's state: spent by this one either way.
    send(&app, from("192.0.2.1:1")).await;
    let (status, headers, body) = send(&app, from("192.0.2.1:1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(text(&headers, X_RATELIMIT_LIMIT), "1");
    assert_eq!(
        text(&headers, RATELIMIT_POLICY),
        r#""per-client";q=1;w=3600"#
    );
    assert!(body.contains(r#"\"per-client\""#), "{body}");
    handle.store(policy("domain: other\nrules: []\n"));
    assert_eq!(send(&app, from("192.0.2.1:1")).await.0, StatusCode::OK);
}

const IN_FLIGHT: &str = "
domain: api
rules:
  - name: in-flight
    match: [{ key: remote_address }]
    algorithm: concurrency
    limit: { requests: 1 }
";

/// An app whose handler waits until told to answer, and says when it started.
fn held_app(layer: RateLimitLayer, started: Arc<Notify>, go: Arc<Notify>) -> Router {
    Router::new()
        .route(
            "/",
            get(move || {
                let (started, go) = (Arc::clone(&started), Arc::clone(&go));
                async move {
                    started.notify_one();
                    go.notified().await;
                    "done"
                }
            }),
        )
        .layer(layer)
}

#[tokio::test]
async fn concurrency_permits_come_back_when_the_response_is_ready_or_abandoned() {
    let store = Counting::default();
    let releases = Arc::clone(&store.releases);
    let layer = RateLimitLayer::builder("api", policy(IN_FLIGHT), store).build();
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let app = held_app(layer, Arc::clone(&started), Arc::clone(&go));

    // One request in flight holds the only permit.
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, from("192.0.2.1:1")).await.0 }
    });
    started.notified().await;
    let (status, headers, _) = send(&app, from("192.0.2.1:2")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(text(&headers, "retry-after"), "1");
    assert_eq!(
        text(&headers, RATELIMIT_POLICY),
        r#""in-flight";q=1;qu="concurrent-requests""#
    );
    go.notify_one();
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    assert_eq!(releases.load(Ordering::SeqCst), 1);

    // Abandoned mid-flight: dropping the response future gives the permit back.
    let abandoned = tokio::spawn({
        let app = app.clone();
        async move { send(&app, from("192.0.2.1:3")).await.0 }
    });
    started.notified().await;
    abandoned.abort();
    assert!(abandoned.await.unwrap_err().is_cancelled());
    assert_eq!(releases.load(Ordering::SeqCst), 2);
    let next = tokio::spawn({
        let app = app.clone();
        async move { send(&app, from("192.0.2.1:4")).await.0 }
    });
    started.notified().await;
    go.notify_one();
    assert_eq!(next.await.unwrap(), StatusCode::OK);
}

#[tokio::test]
async fn grpc_clients_get_resource_exhausted() {
    let layer = RateLimitLayer::builder("api", policy(PER_IP), MemoryStore::default()).build();
    let app = Router::new()
        .route("/pkg.Service/Method", axum::routing::post(|| async { "" }))
        .layer(layer);
    let call = || {
        let mut request = Request::post("/pkg.Service/Method")
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .unwrap();
        request
            .extensions_mut()
            .insert("192.0.2.9:1".parse::<SocketAddr>().unwrap());
        request
    };
    for _ in 0..2 {
        assert_eq!(send(&app, call()).await.0, StatusCode::OK);
    }
    let (status, headers, body) = send(&app, call()).await;
    assert_eq!(status, StatusCode::OK, "gRPC errors travel in grpc-status");
    assert_eq!(text(&headers, "grpc-status"), "8");
    assert!(text(&headers, "grpc-message").contains("per-ip"));
    assert!(headers.contains_key("retry-after"));
    assert!(body.is_empty());
}

// --- Over real HTTP ------------------------------------------------------

/// An axum server on 127.0.0.1:0 that stops cleanly.
struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self { addr, stop, task }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn over_http_429_with_json_retry_after_and_a_stable_reset() {
    let per_ip = "
domain: api
rules:
  - name: per-ip
    match: [{ key: remote_address }]
    algorithm: gcra
    limit: { requests: 3, per: 1h }
";
    // The store on the wall clock, like the headers: the reset instant is then
    // exact to the nanosecond on both sides.
    let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
    let server = Server::start(limited(
        RateLimitLayer::builder("api", policy(per_ip), store).build(),
    ))
    .await;
    let client = reqwest::Client::new();

    let mut resets = Vec::new();
    for remaining in ["2", "1", "0"] {
        let response = client.get(server.url()).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "x-ratelimit-limit"), "3");
        assert_eq!(header(&response, "x-ratelimit-remaining"), remaining);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            r#""per-ip";q=3;w=3600"#
        );
        assert!(
            header(&response, "ratelimit").starts_with(&format!(r#""per-ip";r={remaining};t="#))
        );
        resets.push(header(&response, "x-ratelimit-reset"));
        assert_eq!(response.text().await.unwrap(), "ok");
    }
    for spoof in [None, Some("198.51.100.1"), Some("10.0.0.1, 198.51.100.2")] {
        let mut request = client.get(server.url());
        if let Some(spoof) = spoof {
            // The peer (127.0.0.1) is not a trusted proxy: this changes nothing.
            request = request.header("x-forwarded-for", spoof);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{spoof:?}"
        );
        let retry_after = header(&response, "retry-after");
        assert!(retry_after.parse::<u64>().unwrap() >= 1);
        assert_eq!(header(&response, "x-ratelimit-remaining"), "0");
        assert!(header(&response, "ratelimit").starts_with(r#""per-ip";r=0;t="#));
        resets.push(header(&response, "x-ratelimit-reset"));
        assert_eq!(header(&response, "content-type"), "application/json");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"], "rate_limit_exceeded");
        assert_eq!(body["retry_after"].to_string(), retry_after);
        assert!(body["message"].is_string());
    }
    // The last admission fixed the reset; three denials did not move it.
    assert!(resets[2..].iter().all(|r| *r == resets[2]), "{resets:?}");
    let seconds: Vec<u64> = resets.iter().map(|r| r.parse().unwrap()).collect();
    assert!(
        seconds[0] < seconds[1] && seconds[1] < seconds[2],
        "admissions move it"
    );
    server.stop().await;
}

/// Two layers of one request, one a key each, both 1 an hour.
const TWO_LAYERS: &str = "
domain: api
rules:
  - name: per-ip
    match: [{ key: remote_address }]
    limit: { requests: 1, per: 1h }
  - name: per-key
    match: [{ key: api_key }]
    limit: { requests: 1, per: 1h }
";

#[tokio::test]
async fn over_http_a_client_that_asks_gets_problem_details_naming_every_violated_policy() {
    let layer = RateLimitLayer::builder("api", policy(TWO_LAYERS), MemoryStore::default())
        .descriptor(ClientIpKey::new(ClientIpConfig::new()))
        .descriptor(HeaderKey::new(
            http::HeaderName::from_static("x-api-key"),
            "api_key",
        ))
        .headers("x-ratelimit,draft-every-limit".parse().unwrap())
        .build();
    let server = Server::start(limited(layer)).await;
    let client = reqwest::Client::new();
    let get = |accept: &'static str| {
        client
            .get(server.url())
            .header("x-api-key", "k")
            .header("accept", accept)
            .send()
    };
    let admitted = get("application/problem+json").await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    // Every limit's state in `RateLimit`, as the style asks.
    let every = header(&admitted, "ratelimit");
    assert!(
        every.starts_with(r#""per-ip";r=0;t="#) && every.contains(r#", "per-key";r=0;t="#),
        "{every}"
    );

    let denied = get("text/html, application/problem+json;q=0.9")
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "content-type"), "application/problem+json");
    assert_eq!(header(&denied, "vary"), "accept");
    let retry_after = header(&denied, "retry-after");
    let problem: serde_json::Value = denied.json().await.unwrap();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["status"], 429);
    assert!(problem["title"].is_string());
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["per-ip", "per-key"])
    );
    assert_eq!(problem["retry_after"].to_string(), retry_after);
    assert!(problem["detail"].as_str().unwrap().contains("exceeded"));

    // A client that does not ask keeps the JSON it always got.
    for accept in ["*/*", "application/json"] {
        let denied = get(accept).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&denied, "content-type"), "application/json");
        let body: serde_json::Value = denied.json().await.unwrap();
        assert_eq!(body["error"], "rate_limit_exceeded", "{accept}");
    }
    server.stop().await;
}

#[tokio::test]
async fn over_http_a_trusted_proxy_names_the_client() {
    let per_ip = "
domain: api
rules:
  - name: per-ip
    match: [{ key: remote_address }]
    limit: { requests: 1, per: 1h }
";
    let trusted = ClientIpConfig::new().trust(["127.0.0.0/8".parse().unwrap()]);
    let layer = RateLimitLayer::builder("api", policy(per_ip), MemoryStore::default())
        .descriptor(ClientIpKey::new(trusted))
        .build();
    let server = Server::start(limited(layer)).await;
    let client = reqwest::Client::new();
    let status = |xff: Option<&'static str>| {
        let mut request = client.get(server.url());
        if let Some(xff) = xff {
            request = request.header("x-forwarded-for", xff);
        }
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(status(Some("203.0.113.5")).await, StatusCode::OK);
    assert_eq!(
        status(Some("203.0.113.5")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A client cannot escape by prepending: the proxy's entry is right-most.
    assert_eq!(
        status(Some("192.0.2.99, 203.0.113.5")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(Some("203.0.113.6")).await, StatusCode::OK);
    assert_eq!(status(None).await, StatusCode::OK, "the proxy itself");
    server.stop().await;
}

#[tokio::test]
async fn a_service_told_its_connection_peer_keys_requests_by_it() {
    use std::convert::Infallible;

    use tower::Layer;

    let layer = RateLimitLayer::builder("api", policy(PER_IP), MemoryStore::default()).build();
    let inner = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(http::Response::new(Body::from("ok")))
    });
    let mut one = layer.layer(inner);
    one.set_peer("192.0.2.1".parse().unwrap());
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let request = Request::get("/").body(Body::empty()).unwrap();
        statuses.push(one.clone().oneshot(request).await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // Another connection's peer has its own budget.
    let mut other = one.clone();
    other.set_peer("192.0.2.2".parse().unwrap());
    let request = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(
        other.oneshot(request).await.unwrap().status(),
        StatusCode::OK
    );
    // A peer the request itself carries is the one it is keyed by.
    assert_eq!(
        one.oneshot(from("192.0.2.3:1")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_connection_from_a_trusted_proxy_is_keyed_per_request() {
    use std::convert::Infallible;

    use tower::Layer;

    // The connection's descriptors are made once for a peer whose requests
    // are all keyed alike, and per request for a proxy that names clients.
    let trusted = ClientIpConfig::new().trust(["10.0.0.0/8".parse().unwrap()]);
    let layer = RateLimitLayer::builder("api", policy(PER_IP), MemoryStore::default())
        .descriptor(ClientIpKey::new(trusted))
        .build();
    let inner = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(http::Response::new(Body::from("ok")))
    });
    let status = |service: &RateLimit<_>, xff: &'static str| {
        let request = Request::get("/")
            .header("x-forwarded-for", xff)
            .body(Body::empty())
            .unwrap();
        let service = service.clone();
        async move { service.oneshot(request).await.unwrap().status() }
    };
    let mut proxy = layer.layer(inner);
    proxy.set_peer("10.0.0.1".parse().unwrap());
    let mut direct = proxy.clone();
    direct.set_peer("192.0.2.9".parse().unwrap());

    // Through the proxy, each named client has its own budget of two.
    for _ in 0..2 {
        assert_eq!(status(&proxy, "192.0.2.1").await, StatusCode::OK);
    }
    assert_eq!(
        status(&proxy, "192.0.2.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(&proxy, "192.0.2.2").await, StatusCode::OK);
    // A peer that is no proxy spends its own budget, whatever it names.
    for xff in ["192.0.2.1", "192.0.2.3"] {
        assert_eq!(status(&direct, xff).await, StatusCode::OK);
    }
    assert_eq!(
        status(&direct, "192.0.2.4").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_connection_keyed_by_its_peer_follows_a_reload() {
    use std::convert::Infallible;

    use tower::Layer;

    let handle = PolicyHandle::new(policy(PER_IP));
    let layer = RateLimitLayer::builder("api", handle.clone(), MemoryStore::default()).build();
    let inner = tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(http::Response::new(Body::from("ok")))
    });
    // Its descriptors resolved when the connection began, under PER_IP.
    let mut connection = layer.layer(inner);
    connection.set_peer("192.0.2.1".parse().unwrap());
    let send = || async {
        let request = Request::get("/").body(Body::empty()).unwrap();
        let response = connection.clone().oneshot(request).await.unwrap();
        let limit = text(response.headers(), X_RATELIMIT_LIMIT).to_owned();
        (response.status(), limit)
    };
    assert_eq!(send().await, (StatusCode::OK, "2".into()));
    handle.store(policy(
        &PER_IP.replace("per-ip", "per-client").replace("2,", "5,"),
    ));
    assert_eq!(send().await, (StatusCode::OK, "5".into()));
    handle.store(policy("domain: api\nrules: []\n"));
    assert_eq!(send().await, (StatusCode::OK, String::new()));
}

#[tokio::test]
async fn over_http_a_plain_hyper_server_passes_the_peer_as_a_socket_addr() {
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;

    let layer = RateLimitLayer::builder("api", policy(PER_IP), MemoryStore::default()).build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, mut stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => accepted.unwrap(),
                _ = &mut stopped => return,
            };
            let service = tower::ServiceBuilder::new()
                .map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(peer);
                    request
                })
                .layer(layer.clone())
                .service_fn(|_: Request<Incoming>| async {
                    Ok::<_, Infallible>(http::Response::new(Full::new(bytes::Bytes::from("ok"))))
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
            );
        }
    });
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let response = client.get(&url).send().await.unwrap();
        assert!(response.headers().contains_key("ratelimit"));
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let _ = stop.send(());
    server.await.unwrap();
}

#[tokio::test]
async fn over_grpc_a_tonic_server_answers_resource_exhausted() {
    use tonic_health::pb::HealthCheckRequest;

    let calls = "
domain: api
rules:
  - name: calls
    match: [{ key: generic_key, value: grpc }]
    limit: { requests: 2, per: 1h }
";
    let (mut client, stop, server) = health_behind(calls).await;
    let check = || HealthCheckRequest {
        service: String::new(),
    };
    for _ in 0..2 {
        client.check(check()).await.unwrap();
    }
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("calls"), "{status:?}");
    assert!(status.metadata().get("retry-after").is_some());
    drop(client);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn axum_route_templates_key_the_route() {
    let per_route = "
domain: api
rules:
  - name: per-route
    match: [{ key: route }]
    limit: { requests: 1, per: 1h }
";
    let layer = RateLimitLayer::builder("api", policy(per_route), MemoryStore::default())
        .descriptor(RouteKey::new())
        .build();
    let app = Router::new()
        .route("/users/{id}", get(|| async { "user" }))
        .layer(layer);
    let get_user = |id: u32| {
        let mut request = Request::get(format!("/users/{id}"))
            .body(Body::empty())
            .unwrap();
        request
            .extensions_mut()
            .insert("192.0.2.1:1".parse::<SocketAddr>().unwrap());
        request
    };
    assert_eq!(send(&app, get_user(1)).await.0, StatusCode::OK);
    // Another id, the same template: the same budget.
    assert_eq!(
        send(&app, get_user(2)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// The tower layer's door of tollgate-server's `tests/doors.rs`: the same
/// semantics, under the same names, checked through the layer.
mod doors {
    use std::sync::Mutex;

    use tollgate_policy::{Decided, Observer};

    use super::*;

    const POLICY: &str = "
domain: api
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

    /// The decision results the layer's enforcer reported, per request.
    #[derive(Default)]
    struct Results(Mutex<Vec<Vec<&'static str>>>);

    impl Observer for Results {
        fn decided(&self, decided: &Decided<'_>) {
            let results = decided
                .verdict
                .descriptors
                .iter()
                .map(|d| d.result())
                .collect();
            self.0.lock().unwrap().push(results);
        }
    }

    /// A layer making one descriptor per `x-<key>` header of `keys`.
    fn layer(yaml: &str, store: impl Store + 'static, keys: &[&str]) -> (Router, Arc<Results>) {
        counted(yaml, store, keys, tollgate_policy::Counting::default())
    }

    fn counted(
        yaml: &str,
        store: impl Store + 'static,
        keys: &[&str],
        counting: tollgate_policy::Counting,
    ) -> (Router, Arc<Results>) {
        let results = Arc::new(Results::default());
        let mut builder = RateLimitLayer::builder("api", policy(yaml), store)
            .observer(results.clone())
            .envoy_counting(counting);
        for key in keys {
            let header = http::HeaderName::try_from(format!("x-{key}")).unwrap();
            builder = builder.descriptor(HeaderKey::new(header, *key));
        }
        (limited(builder.build()), results)
    }

    fn with(headers: &[(&str, &str)]) -> Request<Body> {
        let mut request = from("192.0.2.1:1");
        for (key, value) in headers {
            request.headers_mut().insert(
                http::HeaderName::try_from(format!("x-{key}")).unwrap(),
                value.parse().unwrap(),
            );
        }
        request
    }

    #[tokio::test]
    async fn shadow_limits_count_denied_requests_too() {
        let (app, results) = layer(POLICY, MemoryStore::default(), &["user", "dark"]);
        let both = [("user", "alice"), ("dark", "x")];
        assert_eq!(send(&app, with(&both)).await.0, StatusCode::OK);
        assert_eq!(
            send(&app, with(&both)).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(send(&app, with(&[("dark", "x")])).await.0, StatusCode::OK);
        assert_eq!(
            *results.0.lock().unwrap(),
            [
                vec!["ok", "ok"],
                vec!["over_limit", "shadow_over_limit"],
                vec!["shadow_over_limit"],
            ]
        );
    }

    #[tokio::test]
    async fn blocked_shadow_rule_is_a_shadow_denial() {
        let (app, results) = layer(
            POLICY,
            MemoryStore::default(),
            &["dark_banned", "banned", "user"],
        );
        assert_eq!(
            send(&app, with(&[("dark_banned", "x")])).await.0,
            StatusCode::OK
        );
        let blocked = send(&app, with(&[("banned", "x"), ("user", "carol")])).await;
        assert_eq!(blocked.0, StatusCode::TOO_MANY_REQUESTS);
        // The blocked request charged Carol's limit: an envoyproxy-format
        // domain counts every descriptor, as envoyproxy/ratelimit does.
        assert_eq!(
            send(&app, with(&[("user", "carol")])).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            *results.0.lock().unwrap(),
            [
                vec!["shadow_over_limit"],
                vec!["over_limit", "ok"],
                vec!["over_limit"],
            ]
        );
    }

    #[tokio::test]
    async fn all_or_nothing_counting_charges_nothing_beside_a_blocked_rule() {
        let (app, results) = counted(
            POLICY,
            MemoryStore::default(),
            &["banned", "user"],
            tollgate_policy::Counting::AllOrNothing,
        );
        let blocked = send(&app, with(&[("banned", "x"), ("user", "carol")])).await;
        assert_eq!(blocked.0, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            send(&app, with(&[("user", "carol")])).await.0,
            StatusCode::OK
        );
        assert_eq!(
            *results.0.lock().unwrap(),
            [vec!["over_limit", "ok"], vec!["ok"]]
        );
    }

    #[tokio::test]
    async fn fail_closed_store_failure_is_over_limit() {
        let closed = "
domain: api
rules:
  - name: closed
    match: [{ key: closed }]
    limit: { requests: 100, per: 1h }
    failure: fail_closed
";
        let (app, results) = layer(closed, Down, &["closed"]);
        let (status, _, body) = send(&app, with(&[("closed", "a")])).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert!(body.contains("rate_limit_exceeded"), "{body}");
        assert_eq!(*results.0.lock().unwrap(), [vec!["over_limit"]]);
    }
}

#[tokio::test]
async fn over_grpc_a_shed_call_answers_unavailable() {
    use tonic_health::pb::HealthCheckRequest;

    // A shared budget of two calls an hour, shed by tier: the fixed key's
    // value names no tier, so the calls are low and may spend half of it.
    let budget = "
domain: api
shed: { priority_key: generic_key }
rules:
  - name: calls
    match: [{ key: generic_key }]
    algorithm: fixed-window
    limit: { requests: 2, per: 1h }
    shed: true
";
    let (mut client, stop, server) = health_behind(budget).await;
    let check = || HealthCheckRequest {
        service: String::new(),
    };
    client.check(check()).await.unwrap();
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(
        status.code(),
        tonic::Code::Unavailable,
        "shed, not over a limit: {status:?}"
    );
    assert!(status.message().contains("sheds"), "{status:?}");
    assert!(status.metadata().get("retry-after").is_some());
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
    drop(client);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// tonic's health service behind a [`RateLimitLayer`] of `policy_text`
/// (every call keyed `generic_key: grpc`: tonic records the peer as its own
/// `TcpConnectInfo`, and a fixed key keeps a test about the gRPC answer), on
/// a real listener: a client, the server's stop and its task.
async fn health_behind(
    policy_text: &str,
) -> (
    tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let layer = RateLimitLayer::builder("api", policy(policy_text), MemoryStore::default())
        .descriptor(FixedKey::new("grpc"))
        .build();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = tonic_health::pb::health_client::HealthClient::new(channel);
    (client, stop, server)
}
