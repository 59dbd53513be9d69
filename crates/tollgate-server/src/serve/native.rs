//! `POST /v1/check`: Tollgate's own JSON API.
//!
//! Two request shapes, told apart by their fields:
//!
//! - a policy check, `{"domain": "api", "descriptors": [{"entries": [{"key":
//!   "user", "value": "42"}], "hits_addend": 2, "limit": {"requests_per_unit":
//!   5, "unit": "minute"}}], "hits_addend": 1}` (per-descriptor `hits_addend`
//!   and `limit` are optional; a request-level `hits_addend` of 0 or none
//!   counts as 1, a descriptor's own 0 only reads);
//! - an ad-hoc check with no config, `{"key": "k", "limit": 10, "period":
//!   "1s", "burst": 20, "algorithm": "gcra", "cost": 1}` (`burst`,
//!   `algorithm` (default `gcra`) and `cost` (default 1) are optional). Ad-hoc
//!   keys live in their own namespace, `adhoc:<key>` in the store.
//!
//! The answer is 200 when allowed, 429 when denied, with the most restrictive
//! decision at the top and one entry per descriptor:
//!
//! ```json
//! {"allowed": true, "limit": 20, "remaining": 19, "reset_after_ms": 100,
//!  "retry_after_ms": null, "delay_ms": 0,
//!  "descriptors": [{"allowed": true, "state": "limited", "rule": "per-client-ip",
//!                   "limit": 20, "remaining": 19, "reset_after_ms": 100,
//!                   "retry_after_ms": null}]}
//! ```
//!
//! and the same as headers, made by `tollgate_http::headers` like every
//! Tollgate HTTP surface's: `X-RateLimit-Limit`, `X-RateLimit-Remaining`,
//! `X-RateLimit-Reset` (epoch seconds), the IETF draft's `RateLimit-Policy`
//! and `RateLimit`, and, on 429, `Retry-After` (delta-seconds, at least 1).

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tollgate_core::{Algorithm, Decision, Quota, Store};
use tollgate_http::{HeaderStyle, LimitReport};
use tollgate_policy::{Descriptor, Entry, LimitOverride, Request, Unit, parse_duration};

use super::headers::ceil_millis;
use super::http::{ApiError, AppState};
use super::metrics::{self, Api, CheckResult};
use super::service::{AdHoc, DescriptorVerdict, RateLimiter, State as DescriptorState, Verdict};

/// A check against the policy.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyCheck {
    domain: String,
    descriptors: Vec<NativeDescriptor>,
    #[serde(default)]
    hits_addend: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeDescriptor {
    entries: Vec<NativeEntry>,
    #[serde(default)]
    hits_addend: Option<u64>,
    #[serde(default)]
    limit: Option<NativeOverride>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeOverride {
    requests_per_unit: u64,
    unit: String,
}

/// A check of a limit given in the request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdHocCheck {
    key: String,
    limit: u64,
    period: String,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default = "one")]
    cost: u64,
}

fn one() -> u64 {
    1
}

/// How `RateLimit-Policy` names an ad-hoc limit (its key is the caller's and
/// may be anything).
const ADHOC_NAME: &str = "adhoc";

/// The answer.
#[derive(Debug, Serialize)]
struct CheckResponse {
    allowed: bool,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: Option<u64>,
    retry_after_ms: Option<u64>,
    delay_ms: u64,
    descriptors: Vec<DescriptorResponse>,
}

#[derive(Debug, Serialize)]
struct DescriptorResponse {
    allowed: bool,
    state: &'static str,
    rule: Option<String>,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: Option<u64>,
    retry_after_ms: Option<u64>,
}

/// The quota and algorithm of a limit named in a request (ad-hoc checks and
/// `GET /admin/keys/...`), each bad field named in the error.
pub(crate) fn quota_of(
    limit: u64,
    period: &str,
    burst: Option<u64>,
    algorithm: Option<&str>,
) -> Result<(Quota, Algorithm), ApiError> {
    let bad = |field: &str, reason: String| ApiError::bad_request(format!("{field}: {reason}"));
    let algorithm: Algorithm = algorithm
        .unwrap_or("gcra")
        .parse()
        .map_err(|e: tollgate_core::ParseAlgorithmError| bad("algorithm", e.to_string()))?;
    if algorithm == Algorithm::Concurrency {
        return Err(bad(
            "algorithm",
            "concurrency limits need a release when the request ends, which this API has no call for"
                .into(),
        ));
    }
    let period = parse_duration(period).map_err(|e| bad("period", e.to_string()))?;
    let quota = Quota::new(limit, period).map_err(|e| bad("limit", e.to_string()))?;
    let quota = match burst {
        Some(burst) => quota
            .with_burst(burst)
            .map_err(|e| bad("burst", e.to_string()))?,
        None => quota,
    };
    Ok((quota, algorithm))
}

impl AdHocCheck {
    fn validate(self) -> Result<AdHoc, ApiError> {
        if self.key.is_empty() {
            return Err(ApiError::bad_request("key: must not be empty"));
        }
        let (quota, algorithm) = quota_of(
            self.limit,
            &self.period,
            self.burst,
            self.algorithm.as_deref(),
        )?;
        Ok(AdHoc {
            key: self.key,
            quota,
            algorithm,
            cost: self.cost,
        })
    }
}

impl NativeDescriptor {
    fn into_descriptor(self, index: usize) -> Result<Descriptor, ApiError> {
        let limit = match self.limit {
            Some(o) => {
                let unit: Unit = o.unit.parse().map_err(|reason| {
                    ApiError::bad_request(format!("descriptors[{index}].limit.unit: {reason}"))
                })?;
                Some(LimitOverride {
                    requests_per_unit: o.requests_per_unit,
                    unit,
                })
            }
            None => None,
        };
        Ok(Descriptor {
            entries: self
                .entries
                .into_iter()
                .map(|e| Entry::new(e.key, e.value))
                .collect(),
            limit,
            hits_addend: self.hits_addend,
        })
    }
}

/// `POST /v1/check`.
pub(crate) async fn check<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let answer = answer(&state.limiter, &body).await;
    let result = match &answer {
        Ok(verdict) if verdict.allowed() => CheckResult::Ok,
        Ok(_) => CheckResult::OverLimit,
        Err(_) => CheckResult::Invalid,
    };
    metrics::check(Api::V1, result, started.elapsed());
    match answer {
        Ok(verdict) => render(&verdict),
        Err(error) => error.into_response(),
    }
}

async fn answer<S: Store>(limiter: &RateLimiter<S>, body: &[u8]) -> Result<Verdict, ApiError> {
    let shape: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    let Some(object) = shape.as_object() else {
        return Err(ApiError::bad_request("expected a JSON object"));
    };
    let rejection =
        |r: axum::extract::rejection::JsonRejection| ApiError::bad_request(r.body_text());
    match (object.contains_key("domain"), object.contains_key("key")) {
        (true, false) => {
            let Json(check) = Json::<PolicyCheck>::from_bytes(body).map_err(rejection)?;
            let descriptors = check
                .descriptors
                .into_iter()
                .enumerate()
                .map(|(index, d)| d.into_descriptor(index))
                .collect::<Result<Vec<_>, _>>()?;
            let request = Request {
                domain: &check.domain,
                descriptors: &descriptors,
                hits_addend: check.hits_addend,
            };
            limiter
                .check(&request)
                .await
                .map_err(|e| ApiError::bad_request(e.to_string()))
        }
        (false, true) => {
            let Json(check) = Json::<AdHocCheck>::from_bytes(body).map_err(rejection)?;
            Ok(limiter.check_adhoc(&check.validate()?).await)
        }
        (true, true) => Err(ApiError::bad_request(
            "a check has either `domain` (a policy check) or `key` (an ad-hoc check), not both",
        )),
        (false, false) => Err(ApiError::bad_request(
            "expected `domain` and `descriptors` (a policy check) or `key`, `limit` and `period` (an ad-hoc check)",
        )),
    }
}

fn render(verdict: &Verdict) -> Response {
    let allowed = verdict.allowed();
    let top: Option<Decision> = verdict.most_restrictive().and_then(|d| d.decision);
    let delay = verdict
        .descriptors
        .iter()
        .filter(|d| allowed && d.state == DescriptorState::Limited)
        .filter_map(|d| d.decision.map(|decision| decision.delay))
        .max()
        .unwrap_or_default();
    let body = CheckResponse {
        allowed,
        limit: top.map(|d| d.limit),
        remaining: top.map(|d| d.remaining),
        reset_after_ms: top.map(|d| ceil_millis(d.reset_after)),
        retry_after_ms: top.and_then(|d| d.retry_after).map(ceil_millis),
        delay_ms: ceil_millis(delay),
        descriptors: verdict.descriptors.iter().map(descriptor).collect(),
    };
    let status = if allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut response = (status, Json(body)).into_response();
    HeaderStyle::default().write(
        &reports(verdict),
        verdict.started_at,
        response.headers_mut(),
    );
    response
}

/// What the headers describe: every enforcing limit that was decided.
fn reports(verdict: &Verdict) -> Vec<LimitReport<'_>> {
    verdict
        .descriptors
        .iter()
        .filter(|d| d.enforcing())
        .filter_map(|d| {
            let decision = d.decision?;
            let rule = d.rule.as_deref();
            let bucket = rule.and_then(|r| r.bucket());
            let name = bucket.or(rule.map(|r| r.id())).unwrap_or(ADHOC_NAME);
            let report = match (d.applied, d.envoy_limit) {
                (Some((quota, algorithm)), _) => {
                    LimitReport::new(name, &quota, algorithm, decision)
                }
                // A rule that blocks everything: a quota of zero per unit.
                (None, Some((_, unit))) => LimitReport {
                    name,
                    quota: 0,
                    window: Some(unit.duration()),
                    concurrency: false,
                    bucket: None,
                    decision,
                },
                (None, None) => return None,
            };
            Some(report.with_bucket(bucket))
        })
        .collect()
}

fn descriptor(d: &DescriptorVerdict) -> DescriptorResponse {
    DescriptorResponse {
        allowed: d.allowed(),
        state: d.state.name(),
        rule: d.rule.as_ref().map(|r| r.id().to_owned()),
        limit: d.decision.map(|d| d.limit),
        remaining: d.decision.map(|d| d.remaining),
        reset_after_ms: d.decision.map(|d| ceil_millis(d.reset_after)),
        retry_after_ms: d.decision.and_then(|d| d.retry_after).map(ceil_millis),
    }
}
