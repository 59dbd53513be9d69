//! The HTTP API: its router, shared state, errors, and the operational
//! endpoints (`/metrics`, `/healthz`, `/readyz`).
//!
//! | endpoint | answer |
//! | --- | --- |
//! | `/json` (any method; `POST` in practice) | envoyproxy/ratelimit's JSON shape (see `tollgate_envoy`) |
//! | `POST /v1/check` | Tollgate's JSON shape (see `native`) |
//! | `POST /v1/release` | gives back a checked request's concurrency permits |
//! | `POST /v1/utilization` | the protected service reports its load, for shedding (see `utilization`) |
//! | `GET /metrics` | Prometheus text |
//! | `GET /` | the live page (see `live`) |
//! | `GET /live.json` | what the live page shows; behind the admin token when there is one |
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 when the store answers a probe check, 503 otherwise; the body also says when the last config reload was refused or failed (still 200: the last good config is enforced) |
//! | `/healthcheck` | envoyproxy/ratelimit's probe: 200 `OK` while healthy (see `health`), 500 with an empty body otherwise |
//! | `/admin/...` | see `admin` |
//!
//! Errors are `{"error": "..."}` with a 4xx or 5xx status, except at
//! envoyproxy/ratelimit's endpoints, which answer as it does.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use tollgate_core::Store;
use tollgate_listen::bodies::{Bodies, Refused, Reserved};

use super::admin;
use super::auth;
use super::state::{ApiError, AppState};
use super::{answered, native, reload, utilization};
use tollgate_observe::{live, metrics};

/// Which endpoints one listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Surface {
    /// Every endpoint: the HTTP listener without `--admin-listen`.
    Everything,
    /// The check APIs and the health probes: the HTTP listener beside an
    /// admin listener.
    Public,
    /// The admin API, `/metrics`, the live page and the health probes: the
    /// admin listener.
    Operator,
}

impl Surface {
    fn checks(self) -> bool {
        self != Self::Operator
    }

    fn operations(self) -> bool {
        self != Self::Public
    }
}

/// The HTTP endpoints of `surface` over `state`.
pub(crate) fn router<S: Store + 'static>(state: Arc<AppState<S>>, surface: Surface) -> Router {
    let mut router = Router::new()
        // envoyproxy/ratelimit's endpoints take any method, as its router does.
        .route("/healthcheck", any(healthcheck::<S>))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz::<S>));
    if surface.checks() {
        let checks = Router::new()
            .route("/json", any(json::<S>))
            .route("/v1/check", post(native::check::<S>))
            .route("/v1/release", post(native::release::<S>))
            .route("/v1/utilization", post(utilization::report::<S>))
            .route_layer(middleware::from_fn_with_state(
                Arc::clone(&state),
                bounded_body::<S>,
            ))
            .route_layer(middleware::from_fn_with_state(
                Arc::clone(&state),
                authorize_checks::<S>,
            ))
            .layer(DefaultBodyLimit::max(state.bodies.max_bytes() as usize));
        router = router.merge(checks);
    }
    if surface.operations() {
        router = router
            .route(&state.metrics_path, get(render_metrics::<S>))
            .route("/", get(live::page))
            .route(live::JSON_PATH, get(live_json::<S>))
            .merge(admin::routes(Arc::clone(&state)));
    }
    router.fallback(not_found).with_state(state)
}

/// The HTTP service: [`router`], except that `POST /v1/check` and `/json`,
/// the endpoints clients call on every request they make, go straight to
/// their handlers. Through the router a request also pays a route lookup, a clone of
/// the boxed route, URL parameters in its extensions and a boxed handler
/// future, together about a tenth of a check's CPU time. The handler and its
/// extractors are the same, so the answers are the router's, byte for byte.
pub(crate) fn service<S: Store + 'static>(
    state: Arc<AppState<S>>,
    surface: Surface,
) -> HttpService<S> {
    HttpService {
        router: router(Arc::clone(&state), surface),
        checks: surface.checks(),
        state,
    }
}

/// See [`service`].
pub(crate) struct HttpService<S> {
    router: Router,
    /// Whether `/v1/check` and `/json` are served here.
    checks: bool,
    state: Arc<AppState<S>>,
}

impl<S> Clone for HttpService<S> {
    fn clone(&self) -> Self {
        Self {
            router: self.router.clone(),
            checks: self.checks,
            state: Arc::clone(&self.state),
        }
    }
}

impl<S: Store + 'static> tower_service::Service<Request> for HttpService<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The router is always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let path = request.uri().path();
        if self.checks && request.method() == Method::POST && path == "/v1/check" {
            Box::pin(v1_check(Arc::clone(&self.state), request))
        } else if self.checks && path == "/json" {
            // Any method, as the router's route takes.
            Box::pin(json_check(Arc::clone(&self.state), request))
        } else {
            Box::pin(self.router.call(request))
        }
    }
}

/// `POST /v1/check`, as the router would answer it. The request's head is
/// dropped before anything is awaited, and a check its store decides at
/// once is made where it stands ([`native::check_now`]), so the future this
/// returns, boxed for every check, fits glibc's per-thread cache.
fn v1_check<S: Store + 'static>(
    state: Arc<AppState<S>>,
    request: Request,
) -> impl Future<Output = Result<Response, Infallible>> + Send {
    let head = CheckHead::new(&state, request);
    async move {
        let body = match head.read(&state.bodies).await {
            Ok(body) => body,
            Err(rejection) => return Ok(rejection),
        };
        // The answer's body has an exact length, which hyper writes as
        // Content-Length (the router's route puts it in the map first).
        Ok(match native::check_now(&state, &body) {
            Some(response) => response,
            None => Box::pin(native::check(State(state), body)).await,
        })
    }
}

/// `/json`, as the router would answer it (its route layers cost about a
/// tenth of the answer's CPU time, as `/v1/check`'s did).
fn json_check<S: Store + 'static>(
    state: Arc<AppState<S>>,
    request: Request,
) -> impl Future<Output = Result<Response, Infallible>> + Send {
    let head = CheckHead::new(&state, request);
    async move {
        Ok(match head.read(&state.bodies).await {
            Ok(body) => json(State(state), body).await,
            Err(rejection) => rejection,
        })
    }
}

/// What a check API request brings that its route layers look at, taken
/// before anything is awaited so that the request's head is not kept.
struct CheckHead {
    /// Whether its API token, if one is needed, is one of them.
    authorized: bool,
    /// Its share of the request body budget.
    reserved: Result<Reserved, Refused>,
    max: u64,
    body: Body,
}

impl CheckHead {
    fn new<S: Store + 'static>(state: &AppState<S>, request: Request) -> Self {
        Self {
            authorized: may_check(state, &request),
            reserved: state.bodies.reserve(request.body().size_hint().exact()),
            max: u64::from(state.bodies.max_bytes()),
            body: request.into_body(),
        }
    }

    /// The body, read as the route layers and the extractor read it: the
    /// API token first, then the budget's share while it arrives, the size
    /// cap and the read timeout; else the answer that refuses it.
    async fn read(self, bodies: &Bodies) -> Result<Bytes, Response> {
        if !self.authorized {
            return Err(admin::unauthorized("API token"));
        }
        let _reserved = self.reserved.map_err(refusal)?;
        body_frames(self.body, self.max, bodies).await
    }
}

/// The answer to a check API request whose body is not read.
fn refusal(refused: Refused) -> Response {
    match refused {
        // The words of axum's extractor past its limit.
        Refused::TooLarge => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "Failed to buffer the request body: length limit exceeded",
        )
            .into_response(),
        Refused::Busy => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many request bytes in flight (--request-body-budget); retry",
        )
        .into_response(),
    }
}

/// The answer to a body that did not arrive in time.
fn too_slow() -> Response {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "the request body did not arrive within --body-read-timeout",
    )
    .into_response()
}

/// The check API routes' bound on bodies, as [`v1_check`] applies it: the
/// budget's share held while the request is handled (its extractor reads the
/// body, within [`DefaultBodyLimit`]), within the body read timeout.
async fn bounded_body<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    request: Request,
    next: Next,
) -> Response {
    let _reserved = match state.bodies.reserve(request.body().size_hint().exact()) {
        Ok(reserved) => reserved,
        Err(refused) => return refusal(refused),
    };
    state
        .bodies
        .within(next.run(request))
        .await
        .unwrap_or_else(too_slow)
}

/// The frames of `body`, joined: at most `max` bytes (413 beyond), within the
/// body read timeout (408 beyond). A body that has arrived with its head, as
/// nearly every check's has, is read without a timer: one is armed only once
/// the body makes the read wait.
async fn body_frames(mut body: Body, max: u64, bodies: &Bodies) -> Result<Bytes, Response> {
    let mut first = Bytes::new();
    let mut joined = Vec::new();
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let mut length = 0u64;
    loop {
        let next = std::future::poll_fn(|cx| match Pin::new(&mut body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Some(frame)),
            Poll::Pending => {
                let timer = timer.get_or_insert_with(|| Box::pin(bodies.timer()));
                timer.as_mut().poll(cx).map(|()| None)
            }
        });
        let Some(frame) = next.await.ok_or_else(too_slow)? else {
            break;
        };
        let frame = frame.map_err(|error| {
            // The extractor's answer to a body that broke off.
            let reason = format!("Failed to buffer the request body: {error}");
            (StatusCode::BAD_REQUEST, reason).into_response()
        })?;
        // Trailers are not part of the body, as for the extractor.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        length += data.len() as u64;
        if length > max {
            return Err(refusal(Refused::TooLarge));
        }
        if first.is_empty() {
            first = data;
        } else {
            if joined.is_empty() {
                joined.extend_from_slice(&first);
            }
            joined.extend_from_slice(&data);
        }
    }
    Ok(if joined.is_empty() {
        first
    } else {
        Bytes::from(joined)
    })
}

/// Whether `request` may use the check APIs: any request when no API token
/// is set, else one that carries one of them.
fn may_check<S>(state: &AppState<S>, request: &Request) -> bool {
    state.api_tokens.is_empty() || auth::admits(&state.api_tokens, admin::authorization(request))
}

async fn authorize_checks<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    request: Request,
    next: Next,
) -> Response {
    if may_check(&state, &request) {
        next.run(request).await
    } else {
        admin::unauthorized("API token")
    }
}

/// `/json`, envoyproxy/ratelimit's door, counted in the check metrics.
async fn json<S: Store + 'static>(State(state): State<Arc<AppState<S>>>, body: Bytes) -> Response {
    tollgate_envoy::json(&state.enforcer, &state.reply, body, |outcome, elapsed| {
        metrics::check(metrics::Api::Json, answered::envoy(outcome), elapsed);
    })
    .await
}

/// `GET /live.json`: behind the admin token when there is one.
async fn live_json<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    request: Request,
) -> Response {
    if let Some(token) = &state.admin_token
        && !auth::admits(std::slice::from_ref(token), admin::authorization(&request))
    {
        return admin::unauthorized("admin token");
    }
    let store = state.store_health.as_ref().map(|health| health());
    let quotas = state
        .quotas
        .as_ref()
        .map(|quotas| quotas())
        .unwrap_or_default();
    let policy = state.enforcer.policy();
    let shedding = live::Shedding {
        gateway: state
            .gateway_shedder
            .as_ref()
            .map(|shedder| live::GatewayShed::from(&shedder.snapshot())),
        reported: policy
            .domains()
            .filter(|domain| policy.shedding(domain).is_some())
            .map(|domain| {
                let reported = state.enforcer.reported_utilization(domain);
                live::Reported {
                    domain: domain.to_owned(),
                    utilization: reported.map(|(u, _)| f64::from(u.percent()) / 100.0),
                    instances: reported.map_or(0, |(_, n)| n),
                    shed: state.live.enforcer_shed(domain),
                }
            })
            .collect(),
    };
    live::json(
        &state.live,
        &policy,
        state.enforcer.kill_switch().disabled(),
        store,
        quotas,
        shedding,
    )
}

async fn render_metrics<S: Store + 'static>(State(state): State<Arc<AppState<S>>>) -> Response {
    if let Some(record) = &state.store_metrics {
        record();
    }
    let policy = state.enforcer.policy();
    for domain in policy.domains() {
        if policy.shedding(domain).is_some() {
            metrics::reported(domain, state.enforcer.reported_utilization(domain));
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render(&state.metrics),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz<S: Store + 'static>(State(state): State<Arc<AppState<S>>>) -> Response {
    if state.enforcer.ready().await {
        let note = state.reloader.as_ref().and_then(reload::readiness_note);
        match note {
            Some(note) => format!("ready\n{note}\n").into_response(),
            None => "ready\n".into_response(),
        }
    } else {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the store does not answer").into_response()
    }
}

async fn healthcheck<S>(State(state): State<Arc<AppState<S>>>) -> Response {
    if state.health.healthy() {
        "OK".into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such endpoint")
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tollgate_core::SystemClock;
    use tollgate_envoy::Health;
    use tollgate_policy::{Enforcer, Policy};
    use tollgate_store::{MemoryConfig, MemoryStore};
    use tower::ServiceExt;

    use super::*;

    fn test_live() -> Arc<live::Live> {
        Arc::new(live::Live::new(
            Arc::new(SystemClock),
            "built-in default".into(),
        ))
    }

    async fn app(admin_token: Option<&str>) -> Router {
        let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
        let state = AppState {
            enforcer: Arc::new(Enforcer::new(Policy::builtin(), store)),
            metrics: metrics::recorder().expect("valid buckets").handle(),
            store_metrics: None,
            store_health: None,
            quotas: None,
            shared_reports: None,
            gateway_shedder: None,
            live: test_live(),
            admin_token: admin_token.map(|t| t.parse().expect("a token")),
            api_tokens: Vec::new(),
            reloader: None,
            health: Health::start().await.0,
            reply: Arc::default(),
            metrics_path: "/metrics".into(),
            v1_headers: Default::default(),
            bodies: Arc::default(),
        };
        router(Arc::new(state), Surface::Everything)
    }

    async fn call(app: Router, request: Request<Body>) -> (StatusCode, serde_json::Value) {
        let response = app
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("a small body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    fn post(uri: &str, body: &str) -> Request<Body> {
        Request::post(uri)
            .body(Body::from(body.to_owned()))
            .expect("a valid request")
    }

    #[test]
    fn a_check_is_a_small_allocation() {
        /// The largest allocation glibc serves from its per-thread cache.
        const SMALL_ALLOCATION: usize = 1032;
        fn future_size<F: Future>(
            _: &impl Fn(Arc<AppState<MemoryStore>>, axum::extract::Request) -> F,
        ) -> usize {
            std::mem::size_of::<F>()
        }
        let size = future_size(&|state, request| v1_check(state, request));
        assert!(
            size <= SMALL_ALLOCATION,
            "the check future takes {size} bytes"
        );
    }

    #[tokio::test]
    async fn json_checks_the_builtin_policy_without_a_content_type() {
        let body = r#"{"domain": "default", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]}"#;
        let (status, json) = call(app(None).await, post("/json", body)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(json["overallCode"], "OK");
        assert_eq!(json["statuses"][0]["currentLimit"]["requestsPerUnit"], 10);
        assert_eq!(json["statuses"][0]["limitRemaining"], 19);
    }

    #[tokio::test]
    async fn bad_bodies_are_400_with_a_reason() {
        for (uri, body, needle) in [
            ("/v1/check", "[]", "expected a JSON object"),
            (
                "/v1/check",
                r#"{"key": "k", "limit": "ten", "period": "1s"}"#,
                "limit",
            ),
            ("/v1/check", r#"{"key": "k", "limit": 10}"#, "period"),
            (
                "/v1/check",
                r#"{"key": "k", "limit": 10, "period": "soon"}"#,
                "period: invalid duration",
            ),
            ("/v1/check", r#"{"domain": "default"}"#, "descriptors"),
        ] {
            let (status, json) = call(app(None).await, post(uri, body)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} {body}");
            let error = json["error"].as_str().unwrap_or_default();
            assert!(error.contains(needle), "{uri} {body}: {error}");
        }
    }

    #[tokio::test]
    async fn json_errors_are_a_plain_bad_request() {
        for body in ["{", r#"{"domain": "", "descriptors": []}"#] {
            let response = app(None)
                .await
                .oneshot(post("/json", body))
                .await
                .expect("infallible");
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
            let nosniff = response.headers().get(header::X_CONTENT_TYPE_OPTIONS);
            assert_eq!(
                nosniff.map(axum::http::HeaderValue::as_bytes),
                Some(&b"nosniff"[..])
            );
            let text = axum::body::to_bytes(response.into_body(), 1 << 10)
                .await
                .expect("a small body");
            assert_eq!(&text[..], b"Bad Request\n", "{body}");
        }
    }

    #[tokio::test]
    async fn healthcheck_follows_the_health_state() {
        let (health, _grpc) = Health::start().await;
        let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
        let app = router(
            Arc::new(AppState {
                enforcer: Arc::new(Enforcer::new(Policy::builtin(), store)),
                metrics: metrics::recorder().expect("valid buckets").handle(),
                store_metrics: None,
                store_health: None,
                quotas: None,
                shared_reports: None,
                gateway_shedder: None,
                live: test_live(),
                admin_token: None,
                api_tokens: Vec::new(),
                reloader: None,
                health: Arc::clone(&health),
                reply: Arc::default(),
                metrics_path: "/metrics".into(),
                v1_headers: Default::default(),
                bodies: Arc::default(),
            }),
            Surface::Everything,
        );
        let probe = async || {
            let request = Request::get("/healthcheck").body(Body::empty());
            let response = app
                .clone()
                .oneshot(request.expect("valid"))
                .await
                .expect("infallible");
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 10).await;
            (status, body.expect("a small body"))
        };
        assert_eq!(probe().await, (StatusCode::OK, "OK".into()));
        health.stop().await;
        assert_eq!(
            probe().await,
            (StatusCode::INTERNAL_SERVER_ERROR, Bytes::new())
        );
    }

    /// A body in the frames given, with a known length.
    struct Frames(std::collections::VecDeque<Bytes>, u64);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|data| Ok(http_body::Frame::data(data))),
            )
        }

        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(self.1)
        }
    }

    #[tokio::test]
    async fn the_direct_path_answers_like_the_router() {
        let state = || async {
            let store = MemoryStore::with_clock(MemoryConfig::default(), SystemClock);
            Arc::new(AppState {
                enforcer: Arc::new(Enforcer::new(Policy::builtin(), store)),
                metrics: metrics::recorder().expect("valid buckets").handle(),
                store_metrics: None,
                store_health: None,
                quotas: None,
                shared_reports: None,
                gateway_shedder: None,
                live: test_live(),
                admin_token: None,
                api_tokens: Vec::new(),
                reloader: None,
                health: Health::start().await.0,
                reply: Arc::default(),
                metrics_path: "/metrics".into(),
                v1_headers: Default::default(),
                bodies: Arc::default(),
            })
        };
        let too_big = format!(r#"{{"key": "{}"}}"#, "k".repeat(3 << 20));
        let requests = [
            (
                "POST",
                "/v1/check",
                r#"{"key": "k", "limit": 2, "period": "1s"}"#.to_owned(),
            ),
            (
                "POST",
                "/v1/check",
                r#"{"key": "k", "limit": 2, "period": "1s"}"#.to_owned(),
            ),
            (
                "POST",
                "/v1/check",
                r#"{"key": "k", "limit": 2, "period": "1s"}"#.to_owned(),
            ),
            ("POST", "/v1/check", "{".to_owned()),
            // Sent in frames of 7 bytes below.
            (
                "POST",
                "/v1/check",
                r#"{"key": "k", "limit": 3, "period": "1s", "cost": 2}"#.to_owned(),
            ),
            ("POST", "/v1/check", too_big),
            ("GET", "/v1/check", String::new()),
            ("POST", "/v1/check/", "{}".to_owned()),
            ("GET", "/healthz", String::new()),
        ];
        let (direct, routed) = (state().await, state().await);
        for (method, uri, body) in requests {
            let request = || {
                // A body in several frames, its length known (as hyper gives
                // one with a `Content-Length`), must be read whole.
                let body = if body.contains("cost") {
                    Body::new(Frames(
                        body.as_bytes()
                            .chunks(7)
                            .map(Bytes::copy_from_slice)
                            .collect(),
                        body.len() as u64,
                    ))
                } else {
                    Body::from(body.clone())
                };
                Request::builder()
                    .method(method)
                    .uri(uri)
                    .body(body)
                    .expect("a valid request")
            };
            let a = service(Arc::clone(&direct), Surface::Everything)
                .oneshot(request())
                .await
                .expect("infallible");
            let b = router(Arc::clone(&routed), Surface::Everything)
                .oneshot(request())
                .await
                .expect("infallible");
            assert_eq!(a.status(), b.status(), "{method} {uri}");
            // The router puts Content-Length in the map; the direct path
            // leaves it to hyper, which writes the body's exact length (see
            // tests/http.rs, `v1_check_answers_carry_their_content_length`).
            let length = |r: &Response| {
                r.headers()
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
                    .or_else(|| usize::try_from(r.body().size_hint().exact()?).ok())
            };
            let lengths = (length(&a), length(&b));
            let headers = |r: &Response| {
                let mut h: Vec<(String, String)> = r
                    .headers()
                    .iter()
                    .filter(|(name, _)| !name.as_str().ends_with("reset"))
                    .filter(|(name, _)| *name != header::CONTENT_LENGTH)
                    // Times vary between the two calls; their digits are not compared.
                    .map(|(n, v)| {
                        let v = v.to_str().unwrap_or("").replace(char::is_numeric, "");
                        (n.to_string(), v)
                    })
                    .collect();
                h.sort();
                h
            };
            assert_eq!(headers(&a), headers(&b), "{method} {uri}");
            let body = |r: Response| axum::body::to_bytes(r.into_body(), 1 << 20);
            let (a, b) = (body(a).await.expect("small"), body(b).await.expect("small"));
            // Each says its own length: the numbers in them may differ in digits.
            assert_eq!(lengths, (Some(a.len()), Some(b.len())), "{method} {uri}");
            let text = |b: &[u8]| String::from_utf8_lossy(b).replace(char::is_numeric, "");
            assert_eq!(text(&a), text(&b), "{method} {uri}");
        }
    }

    #[tokio::test]
    async fn admin_needs_the_token() {
        let list = || {
            Request::get("/admin/kill-switch")
                .body(Body::empty())
                .expect("valid")
        };
        assert_eq!(call(app(None).await, list()).await.0, StatusCode::FORBIDDEN);
        assert_eq!(
            call(app(Some("s3cret")).await, list()).await.0,
            StatusCode::UNAUTHORIZED
        );
        let authorized = Request::get("/admin/kill-switch")
            .header("authorization", "Bearer s3cret")
            .body(Body::empty())
            .expect("valid");
        assert_eq!(
            call(app(Some("s3cret")).await, authorized).await.0,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn health_and_readiness() {
        let get = |uri: &str| Request::get(uri).body(Body::empty()).expect("valid");
        let response = app(None)
            .await
            .oneshot(get("/healthz"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        let response = app(None)
            .await
            .oneshot(get("/readyz"))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            call(app(None).await, get("/nope")).await.0,
            StatusCode::NOT_FOUND
        );
    }
}
