//! What every HTTP handler shares ([`AppState`]) and how it answers an
//! error ([`ApiError`]): below the handlers' modules (`http`, `admin`,
//! `native`), which each take them.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use tollgate_envoy::Health;
use tollgate_listen::bodies::Bodies;
use tollgate_policy::{Enforcer, Reloader};

use super::auth::Token;
use tollgate_observe::live;
use tollgate_observe::store_health;

/// What every handler shares.
pub(crate) struct AppState<S> {
    /// The shared check path.
    pub(crate) enforcer: Arc<Enforcer<S>>,
    /// Renders `/metrics`.
    pub(crate) metrics: PrometheusHandle,
    /// Records the store's own counters (Redis calls, fallbacks, the breaker)
    /// just before `/metrics` renders; `None` for a store that keeps none.
    pub(crate) store_metrics: Option<Box<dyn Fn() + Send + Sync>>,
    /// What the store reports of its health for `/live.json`; `None` for a
    /// store that reports none.
    pub(crate) store_health: Option<Box<dyn Fn() -> store_health::StoreHealth + Send + Sync>>,
    /// The Rate Limit Quota Service's rules as Envoys hold them, for
    /// `/live.json`; `None` where no quota service runs.
    pub(crate) quotas: Option<Box<dyn Fn() -> Vec<live::QuotaView> + Send + Sync>>,
    /// Where utilization reports are shared with the other replicas
    /// (`--redis`); `None` in memory, where they stay in this instance.
    pub(crate) shared_reports: Option<Arc<super::utilization::Shared>>,
    /// The gateway's load shedder, shown on the live page; `None` without
    /// one.
    pub(crate) gateway_shedder: Option<Arc<tollgate_http::Shedder>>,
    /// What the live page shows.
    pub(crate) live: Arc<live::Live>,
    /// The bearer token of the admin API; `None` disables it.
    pub(crate) admin_token: Option<Token>,
    /// The bearer tokens any of which the check APIs require; none: open.
    pub(crate) api_tokens: Vec<Token>,
    /// Reloads `--config` for `POST /admin/reload` and tells `/readyz` how
    /// the last reload went; `None` when the built-in policy is in force.
    pub(crate) reloader: Option<Reloader>,
    /// What `/healthcheck` reports, as the gRPC health service does.
    pub(crate) health: Arc<Health>,
    /// The headers and metadata `/json` answers carry.
    pub(crate) reply: Arc<tollgate_envoy::Reply>,
    /// Where `/metrics` is served: envoyproxy/ratelimit's `PROMETHEUS_PATH`
    /// in its mode.
    pub(crate) metrics_path: String,
    /// The rate limit headers `POST /v1/check` answers carry (`--v1-headers`).
    pub(crate) v1_headers: tollgate_http::HeaderStyle,
    /// How large a check API body may be and how long it may take.
    pub(crate) bodies: Arc<Bodies>,
}

/// An error answer: a status and `{"error": message}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    /// An error with `status`.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 400: the request cannot be read or checked.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message });
        (self.status, axum::Json(body)).into_response()
    }
}
