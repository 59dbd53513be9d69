//! The admin API, behind `Authorization: Bearer <--admin-token>`.
//!
//! | endpoint | does |
//! | --- | --- |
//! | `POST /admin/reload` | reloads `--config` now: 200 `{"domains": [...]}`; 422 with the config error, or 409 `{"error", "refused": true, "removed_domains"}` when the safeguards refuse it (either way the old config stays); 409 without `--config` |
//! | `GET /admin/kill-switch` | `{"disabled": [{"domain": "api", "rule": "per-ip" or null}]}` |
//! | `POST /admin/kill-switch` | `{"domain": "api", "rule": "per-ip" (optional), "enforce": false}` turns enforcement of a rule or a whole domain off (or back on); answers the listing; 404 when disabling a domain or rule the current policy does not have |
//! | `GET /admin/keys/{key}?limit=10&period=1s[&burst=20][&algorithm=gcra]` | the state of store key `key` under that limit, read at cost 0 (nothing consumed) |
//! | `POST /admin/reset` | `{"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "42"}]}]}` (`/v1/check`'s policy shape) forgets the state of each descriptor's limit, on every instance that shares the store: each starts again with its whole quota. Answers `{"reset": ["<rule id>" or null, ...]}`, per descriptor the rule reset (null where no limit keeps state); 400 for a bad request, 503 when the store did not reset |
//!
//! Without a token the request is 401 (with `WWW-Authenticate: Bearer`); when
//! the service was started without `--admin-token` the admin API is off and
//! every admin endpoint answers 403. Tokens are compared in constant time.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tollgate_core::Store;
use tollgate_policy::{Refusal, ReloadError, ResetError};

use super::auth;
use super::native::quota_of;
use super::state::{ApiError, AppState};

/// The admin routes, each behind the bearer token check.
pub(crate) fn routes<S: Store + 'static>(state: Arc<AppState<S>>) -> Router<Arc<AppState<S>>> {
    Router::new()
        .route("/admin/reload", post(reload_now::<S>))
        .route(
            "/admin/kill-switch",
            get(list_kill_switch::<S>).post(set_kill_switch::<S>),
        )
        .route("/admin/keys/{*key}", get(read_key::<S>))
        .route("/admin/reset", post(reset::<S>))
        .route_layer(middleware::from_fn_with_state(state, authorize::<S>))
}

async fn authorize<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &state.admin_token else {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "the admin API is off: start `tollgate serve` with --admin-token to turn it on",
        )
        .into_response();
    };
    if auth::admits(std::slice::from_ref(token), authorization(&request)) {
        return next.run(request).await;
    }
    unauthorized("admin token")
}

/// The request's `Authorization` value.
pub(crate) fn authorization(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// 401, asking for a bearer token (`what` names which).
pub(crate) fn unauthorized(what: &str) -> Response {
    let mut response = ApiError::new(
        StatusCode::UNAUTHORIZED,
        format!("missing or wrong `Authorization: Bearer <{what}>`"),
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

async fn reload_now<S: Store + 'static>(State(state): State<Arc<AppState<S>>>) -> Response {
    let Some(reloader) = state.reloader.clone() else {
        return ApiError::new(
            StatusCode::CONFLICT,
            "no --config was given: the built-in policy has nothing to reload",
        )
        .into_response();
    };
    // Logged and counted by the reloader's observer.
    let reload = match tokio::task::spawn_blocking(move || reloader.reload()).await {
        Ok(reload) => reload,
        Err(e) => {
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the reload task failed: {e}"),
            )
            .into_response();
        }
    };
    let error = match reload.outcome {
        Ok(domains) => return Json(serde_json::json!({ "domains": domains })).into_response(),
        Err(error) => error,
    };
    let (status, body) = match &error {
        ReloadError::Invalid(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            serde_json::json!({
                "error": e.to_string(),
                "path": e.path.display().to_string(),
                "line": e.line,
                "column": e.column,
                "field": e.field,
                "reason": e.reason,
            }),
        ),
        ReloadError::Refused { refusal, .. } => {
            let removed = match refusal {
                Refusal::DomainsRemoved { domains } => domains.as_slice(),
                _ => &[],
            };
            (
                StatusCode::CONFLICT,
                serde_json::json!({
                    "error": error.to_string(),
                    "refused": true,
                    "removed_domains": removed,
                }),
            )
        }
        _ => (
            StatusCode::UNPROCESSABLE_ENTITY,
            serde_json::json!({ "error": error.to_string() }),
        ),
    };
    (status, Json(body)).into_response()
}

/// A switched-off domain or rule.
#[derive(Debug, Serialize)]
struct Disabled {
    domain: String,
    rule: Option<String>,
}

#[derive(Debug, Serialize)]
struct KillSwitchList {
    disabled: Vec<Disabled>,
}

/// `POST /admin/kill-switch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KillSwitchChange {
    domain: String,
    #[serde(default)]
    rule: Option<String>,
    enforce: bool,
}

fn kill_switch_list<S: Store>(state: &AppState<S>) -> Json<KillSwitchList> {
    let disabled = state
        .enforcer
        .kill_switch()
        .disabled()
        .into_iter()
        .map(|(domain, rule)| Disabled { domain, rule })
        .collect();
    Json(KillSwitchList { disabled })
}

async fn list_kill_switch<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
) -> Json<KillSwitchList> {
    kill_switch_list(&state)
}

async fn set_kill_switch<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    body: Bytes,
) -> Result<Json<KillSwitchList>, ApiError> {
    let Json(change) = Json::<KillSwitchChange>::from_bytes(&body)
        .map_err(|r| ApiError::bad_request(r.body_text()))?;
    if change.domain.is_empty() {
        return Err(ApiError::bad_request("domain: must not be empty"));
    }
    if !change.enforce {
        // Switching off something that does not exist is most likely a typo
        // that would leave the intended rule enforced.
        let policy = state.enforcer.policy();
        if !policy.domains().any(|d| d == change.domain) {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("unknown domain {:?}", change.domain),
            ));
        }
        if let Some(rule) = &change.rule {
            let rules = policy.rules(&change.domain);
            if !rules.iter().any(|r| r.id() == rule) {
                let known: Vec<&str> = rules.iter().map(|r| r.id()).collect();
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "domain {:?} has no rule {rule:?}; its rules are {known:?}",
                        change.domain
                    ),
                ));
            }
        }
    }
    state
        .enforcer
        .kill_switch()
        .set(&change.domain, change.rule.as_deref(), change.enforce);
    tracing::info!(
        domain = %change.domain,
        rule = change.rule.as_deref().unwrap_or("*"),
        enforce = change.enforce,
        "kill switch changed"
    );
    Ok(kill_switch_list(&state))
}

/// The limit a key is read under.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyQuery {
    limit: u64,
    period: String,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    algorithm: Option<String>,
}

#[derive(Debug, Serialize)]
struct KeyState {
    key: String,
    algorithm: &'static str,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
}

async fn reset<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, ApiError> {
    let policy = super::native::policy_request(&body)?;
    let rules = state
        .enforcer
        .reset(&policy.request())
        .await
        .map_err(|e| match e {
            ResetError::Store(e) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}"))
            }
            other => ApiError::bad_request(other.to_string()),
        })?;
    let reset: Vec<Option<&str>> = rules.iter().map(|r| r.as_deref().map(|r| r.id())).collect();
    Ok(Json(serde_json::json!({ "reset": reset })))
}

async fn read_key<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    Path(key): Path<String>,
    query: Result<Query<KeyQuery>, QueryRejection>,
) -> Result<Json<KeyState>, ApiError> {
    let Query(query) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    let (quota, algorithm) = quota_of(
        query.limit,
        &query.period,
        query.burst,
        query.algorithm.as_deref(),
    )?;
    let decision = state
        .enforcer
        .read(&key, quota, algorithm)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}")))?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the store gave no decision",
            )
        })?;
    Ok(Json(KeyState {
        key,
        algorithm: algorithm.name(),
        limit: decision.limit(),
        remaining: decision.remaining(),
        reset_after_ms: tollgate_http::headers::ceil_millis(decision.reset_after()),
    }))
}
