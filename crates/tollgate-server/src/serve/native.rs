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
//!   keys live in their own namespace, by algorithm and quota
//!   (`AdHoc::store_key`).
//!
//! A policy check may carry `"utilization": 0.8`, its sender's own load,
//! which decides whether a domain with a `shed:` section sheds it (in place
//! of what `POST /v1/utilization` reported; see `utilization`).
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

mod lease_token;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tollgate_core::{Algorithm, Decision, Quota, Store, Utilization, at_first_poll};
use tollgate_http::HeaderStyle;
use tollgate_http::headers::reports;
use tollgate_policy::{Descriptor, Entry, LimitOverride, Request, Unit, parse_duration};

use super::state::{ApiError, AppState};
use tollgate_http::headers::ceil_millis;
use tollgate_observe::metrics::{self, Api, CheckResult};
use tollgate_policy::{AdHoc, Check, DescriptorVerdict, Enforcer, Pressure, Shed, Verdict};

/// A check against the policy.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyCheck {
    domain: String,
    descriptors: Vec<NativeDescriptor>,
    #[serde(default)]
    hits_addend: u64,
    /// The sender's own utilization (0.8 is 80 %), deciding this check's
    /// shed in place of the domain's reported one.
    #[serde(default)]
    utilization: Option<f64>,
}

/// A descriptor as `/v1/check` takes it and `serve --record` writes it.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NativeDescriptor {
    entries: Vec<NativeEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hits_addend: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limit: Option<NativeOverride>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct NativeEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize, Serialize)]
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

/// The answer.
#[derive(Debug, Serialize)]
struct CheckResponse<'a> {
    allowed: bool,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: Option<u64>,
    retry_after_ms: Option<u64>,
    delay_ms: u64,
    descriptors: Vec<DescriptorResponse<'a>>,
    /// The token `POST /v1/release` takes to give back the concurrency
    /// permits this check took; absent when it took none.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<String>,
}

#[derive(Debug, Serialize)]
struct DescriptorResponse<'a> {
    allowed: bool,
    state: &'static str,
    rule: Option<&'a str>,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: Option<u64>,
    retry_after_ms: Option<u64>,
}

impl CheckResponse<'_> {
    /// Appends exactly what `serde_json::to_writer` writes for `self` (a test
    /// holds them equal), several times faster.
    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"allowed\":");
        bool_json(out, self.allowed);
        decision_json(
            out,
            [
                self.limit,
                self.remaining,
                self.reset_after_ms,
                self.retry_after_ms,
            ],
        );
        out.extend_from_slice(b",\"delay_ms\":");
        u64_json(out, Some(self.delay_ms));
        out.extend_from_slice(b",\"descriptors\":[");
        for (i, d) in self.descriptors.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"allowed\":");
            bool_json(out, d.allowed);
            out.extend_from_slice(b",\"state\":");
            str_json(out, d.state);
            out.extend_from_slice(b",\"rule\":");
            match d.rule {
                Some(rule) => str_json(out, rule),
                None => out.extend_from_slice(b"null"),
            }
            decision_json(
                out,
                [d.limit, d.remaining, d.reset_after_ms, d.retry_after_ms],
            );
            out.push(b'}');
        }
        out.push(b']');
        if let Some(lease) = &self.lease {
            out.extend_from_slice(b",\"lease\":");
            str_json(out, lease);
        }
        out.push(b'}');
    }
}

/// The fields a decision has at the top and in each descriptor, in order.
fn decision_json(out: &mut Vec<u8>, values: [Option<u64>; 4]) {
    let names: [&[u8]; 4] = [
        b",\"limit\":",
        b",\"remaining\":",
        b",\"reset_after_ms\":",
        b",\"retry_after_ms\":",
    ];
    for (name, value) in names.into_iter().zip(values) {
        out.extend_from_slice(name);
        u64_json(out, value);
    }
}

fn bool_json(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

fn u64_json(out: &mut Vec<u8>, n: Option<u64>) {
    match n {
        Some(n) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

/// A JSON string, escaped as serde_json escapes it.
fn str_json(out: &mut Vec<u8>, s: &str) {
    let plain = |b: u8| b >= 0x20 && b != b'"' && b != b'\\' && b != 0x7f;
    if s.bytes().all(plain) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Rare (a rule id with quotes or control characters): serde_json's
        // own escaping. Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
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
        adhoc(
            self.key,
            self.limit,
            &self.period,
            self.burst,
            self.algorithm.as_deref(),
            self.cost,
        )
    }
}

/// [`AdHocCheck`] with its strings borrowed from the body where they have no
/// escapes: the fast path's (see `answer`). The same fields, defaults and
/// refusal of unknown fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdHocCheckRef<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    limit: u64,
    #[serde(borrow)]
    period: Cow<'a, str>,
    #[serde(default)]
    burst: Option<u64>,
    /// Not `Option<Cow>`, which serde always copies into a `String`: an
    /// algorithm name has no escapes, and one that has some fails here and
    /// takes the careful path, which names what is wrong with it.
    #[serde(default, borrow)]
    algorithm: Option<&'a str>,
    #[serde(default = "one")]
    cost: u64,
}

impl AdHocCheckRef<'_> {
    fn validate(self) -> Result<AdHoc, ApiError> {
        adhoc(
            self.key.into_owned(),
            self.limit,
            &self.period,
            self.burst,
            self.algorithm,
            self.cost,
        )
    }
}

fn adhoc(
    key: String,
    limit: u64,
    period: &str,
    burst: Option<u64>,
    algorithm: Option<&str>,
    cost: u64,
) -> Result<AdHoc, ApiError> {
    if key.is_empty() {
        return Err(ApiError::bad_request("key: must not be empty"));
    }
    let (quota, algorithm) = quota_of(limit, period, burst, algorithm)?;
    Ok(AdHoc {
        key,
        quota,
        algorithm,
        cost,
    })
}

impl NativeDescriptor {
    /// The wire form of `descriptor`: what [`NativeDescriptor::into_descriptor`]
    /// reads back as `descriptor`.
    pub(crate) fn of(descriptor: &Descriptor) -> Self {
        Self {
            entries: descriptor
                .entries
                .iter()
                .map(|e| NativeEntry {
                    key: e.key.clone(),
                    value: e.value.clone(),
                })
                .collect(),
            hits_addend: descriptor.hits_addend,
            limit: descriptor.limit.map(|o| NativeOverride {
                requests_per_unit: o.requests_per_unit,
                unit: o.unit.name().to_owned(),
            }),
        }
    }

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
    let answer = answer(&state.enforcer, &body).await;
    respond(&state, answer, started)
}

/// [`check`] decided where it is asked, when the enforcer's store decides at
/// once ([`Enforcer::decides_at_once`]); `None`, having done nothing, when
/// it waits. The check's future then takes no room in its caller's.
pub(crate) fn check_now<S: Store>(state: &AppState<S>, body: &[u8]) -> Option<Response> {
    if !state.enforcer.decides_at_once() {
        return None;
    }
    let started = Instant::now();
    let answer = at_first_poll(answer(&state.enforcer, body));
    Some(respond(state, answer, started))
}

/// The answer to a check begun at `started`, counted.
fn respond<S>(
    state: &AppState<S>,
    answer: Result<Verdict, ApiError>,
    started: Instant,
) -> Response {
    let result = match &answer {
        Ok(verdict) if verdict.allowed() => CheckResult::Ok,
        Ok(verdict) if verdict.shed.is_some() => CheckResult::Shed,
        Ok(_) => CheckResult::OverLimit,
        Err(_) => CheckResult::Invalid,
    };
    metrics::check(Api::V1, result, started.elapsed());
    match answer {
        Ok(verdict) => render(&verdict, state.v1_headers),
        Err(error) => error.into_response(),
    }
}

/// A request body of `/v1/check` or `/v1/release`, validated.
enum Checked {
    AdHoc(AdHoc),
    Policy(PolicyRequest),
}

/// A policy check's request, owning what [`Request`] borrows.
pub(crate) struct PolicyRequest {
    pub(crate) domain: String,
    pub(crate) descriptors: Vec<Descriptor>,
    pub(crate) hits_addend: u64,
    /// The utilization the check carries, if any.
    pub(crate) utilization: Option<Utilization>,
}

impl PolicyRequest {
    pub(crate) fn request(&self) -> Request<'_> {
        Request {
            domain: &self.domain,
            descriptors: &self.descriptors,
            hits_addend: self.hits_addend,
        }
    }
}

fn parse(body: &[u8]) -> Result<Checked, ApiError> {
    // The fast path: one typed parse. A body that parses as an ad-hoc check
    // has `key` and no `domain` (unknown fields are refused), and one that
    // parses as a policy check has `domain` and no `key`, so both are what
    // the careful path below would have chosen. Anything else, including
    // every malformed body, takes the careful path, which names the field at
    // fault. The body's UTF-8 is checked once, in one pass, rather than each
    // string's as the parser meets it (about 500 instructions of 25,000).
    if let Ok(text) = std::str::from_utf8(body) {
        if let Ok(check) = serde_json::from_str::<AdHocCheckRef<'_>>(text) {
            return Ok(Checked::AdHoc(check.validate()?));
        }
        if let Ok(check) = serde_json::from_str::<PolicyCheck>(text) {
            return check.validate();
        }
    }
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
            check.validate()
        }
        (false, true) => {
            let Json(check) = Json::<AdHocCheck>::from_bytes(body).map_err(rejection)?;
            Ok(Checked::AdHoc(check.validate()?))
        }
        (true, true) => Err(ApiError::bad_request(
            "a check has either `domain` (a policy check) or `key` (an ad-hoc check), not both",
        )),
        (false, false) => Err(ApiError::bad_request(
            "expected `domain` and `descriptors` (a policy check) or `key`, `limit` and `period` (an ad-hoc check)",
        )),
    }
}

async fn answer<S: Store>(enforcer: &Enforcer<S>, body: &[u8]) -> Result<Verdict, ApiError> {
    let checked = parse(body)?;
    let mut utilization = None;
    let check = match &checked {
        Checked::AdHoc(adhoc) => Check::AdHoc(adhoc),
        Checked::Policy(policy) => {
            utilization = policy.utilization;
            let request = policy.request();
            // Stricter than the Envoy doors, which answer these as
            // envoyproxy/ratelimit does.
            request
                .well_formed()
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            Check::Policy(request)
        }
    };
    enforcer
        .enforce_with_utilization(check, utilization)
        .await
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

impl PolicyCheck {
    fn validate(self) -> Result<Checked, ApiError> {
        self.into_request().map(Checked::Policy)
    }

    fn into_request(self) -> Result<PolicyRequest, ApiError> {
        let descriptors = self
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(index, d)| d.into_descriptor(index))
            .collect::<Result<Vec<_>, _>>()?;
        let utilization = self
            .utilization
            .map(Utilization::from_fraction)
            .transpose()
            .map_err(|e| ApiError::bad_request(format!("utilization: {e}")))?;
        Ok(PolicyRequest {
            domain: self.domain,
            descriptors,
            hits_addend: self.hits_addend,
            utilization,
        })
    }
}

/// A well-formed request in `/v1/check`'s policy shape (`domain` and
/// `descriptors`), as the admin API's reset takes it.
pub(crate) fn policy_request(body: &[u8]) -> Result<PolicyRequest, ApiError> {
    let Json(check) =
        Json::<PolicyCheck>::from_bytes(body).map_err(|r| ApiError::bad_request(r.body_text()))?;
    let policy = check.into_request()?;
    policy
        .request()
        .well_formed()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(policy)
}

/// A well-formed request in `/v1/check`'s policy shape, from a JSON value (a
/// line of a request file, its time taken out); the error is the 400's reason.
pub(crate) fn policy_request_of(value: serde_json::Value) -> Result<PolicyRequest, String> {
    let check: PolicyCheck = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let policy = check.into_request().map_err(|e| e.message)?;
    policy.request().well_formed().map_err(|e| e.to_string())?;
    Ok(policy)
}

/// The body of `POST /v1/release`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseRequest {
    /// The `lease` of the `/v1/check` answer that admitted the request.
    lease: String,
}

/// `POST /v1/release`: `{"lease": "..."}`, the `lease` of the `/v1/check`
/// answer that admitted a request, sent when that request ends; gives back
/// exactly the leases its concurrency limits took (on any instance that
/// shares the store), whatever the policy says now. Answers
/// `{"released": N}`, the number of leases handed back to the store (one
/// already released or lapsed counts, and gives nothing back).
pub(crate) async fn release<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    body: Bytes,
) -> Response {
    let permit = Json::<ReleaseRequest>::from_bytes(&body)
        .map_err(|r| ApiError::bad_request(r.body_text()))
        .and_then(|Json(request)| {
            lease_token::permit(&request.lease)
                .map_err(|e| ApiError::bad_request(format!("lease: {e}")))
        });
    match permit {
        Ok(permit) => {
            let released = state.enforcer.release(permit).await;
            Json(serde_json::json!({ "released": released })).into_response()
        }
        Err(error) => error.into_response(),
    }
}

fn render(verdict: &Verdict, style: HeaderStyle) -> Response {
    if let Some(shed) = &verdict.shed {
        return shed_response(shed, verdict);
    }
    let allowed = verdict.allowed();
    let top: Option<Decision> = verdict.most_restrictive().and_then(|d| d.decision);
    let delay = verdict.delay();
    let lease = (!verdict.permit.is_empty()).then(|| lease_token::token(&verdict.permit));
    let body = CheckResponse {
        allowed,
        limit: top.map(|d| d.limit()),
        remaining: top.map(|d| d.remaining()),
        reset_after_ms: top.map(|d| ceil_millis(d.reset_after())),
        retry_after_ms: top.and_then(|d| d.retry_after()).map(ceil_millis),
        delay_ms: ceil_millis(delay),
        descriptors: verdict.descriptors.iter().map(descriptor).collect(),
        lease,
    };
    let status = if allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    // Written by hand straight into a buffer of about the right size: axum's
    // `Json` and serde_json's serializer cost more than the check itself.
    let mut json = Vec::with_capacity(RESPONSE_CAPACITY);
    body.write_json(&mut json);
    let mut response = Response::new(Body::from(json));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    // Content-Type and the rate limit headers, without regrowing: the map's
    // table then fits glibc's per-thread cache with the default headers
    // (six of them), where room for seven takes malloc's slow path.
    // Content-Length and Date are written by hyper, not put in the map.
    headers.reserve(1 + style.most_headers(allowed));
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    style.write(&reports(verdict), verdict.started_at, headers);
    response
}

/// A shed check's answer: `503` with `Retry-After` (the client is not over
/// a limit of its own: the service is full, as the gateway's shedder
/// answers) and `"code": "shed"`.
fn shed_response(shed: &Shed, verdict: &Verdict) -> Response {
    let seconds = shed.retry_after.as_secs() + u64::from(shed.retry_after.subsec_nanos() > 0);
    let tier = shed.tier.name();
    let mut body = serde_json::json!({
        "allowed": false,
        "code": "shed",
        "tier": tier,
        "retry_after_ms": ceil_millis(shed.retry_after),
        "descriptors": verdict.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    });
    let (message, field, percent) = match shed.pressure {
        Pressure::Reported(utilization) => {
            let percent = utilization.percent();
            (
                format!(
                    "the service is at {percent} % of its capacity and sheds {tier}-priority requests; retry in {seconds} s"
                ),
                "utilization",
                percent,
            )
        }
        Pressure::Budget(share) => (
            format!(
                "the shared budget is past {share} % spent, where {tier}-priority requests are shed; retry in {seconds} s"
            ),
            "budget_share",
            share,
        ),
    };
    body["message"] = message.into();
    body[field] = (f64::from(percent) / 100.0).into();
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}

/// A one-descriptor answer is about 230 bytes.
const RESPONSE_CAPACITY: usize = 256;
/// The answer's content type.
const JSON: &str = "application/json";

fn descriptor(d: &DescriptorVerdict) -> DescriptorResponse<'_> {
    DescriptorResponse {
        allowed: d.allowed(),
        state: d.state.name(),
        rule: d.rule.as_ref().map(|r| r.id()),
        limit: d.decision.map(|d| d.limit()),
        remaining: d.decision.map(|d| d.remaining()),
        reset_after_ms: d.decision.map(|d| ceil_millis(d.reset_after())),
        retry_after_ms: d.decision.and_then(|d| d.retry_after()).map(ceil_millis),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_read_as_utf8_and_refused_when_they_are_not() {
        let key = |body: &[u8]| match parse(body) {
            Ok(Checked::AdHoc(adhoc)) => adhoc.key,
            Ok(Checked::Policy(_)) => panic!("a policy check"),
            Err(error) => panic!("refused: {}", error.message),
        };
        assert_eq!(
            key(r#"{"key": "caf\u00e9 é \"q\"", "limit": 2, "period": "1s"}"#.as_bytes()),
            "café é \"q\""
        );
        let Err(error) = parse(b"{\"key\": \"k\xff\", \"limit\": 2, \"period\": \"1s\"}") else {
            panic!("a body that is not UTF-8 parsed");
        };
        assert!(
            error.message.starts_with("invalid JSON: ") && error.message.contains("line 1"),
            "{}",
            error.message
        );
    }

    #[test]
    fn hand_written_json_is_serde_jsons() {
        let descriptor = |rule, n: Option<u64>| DescriptorResponse {
            allowed: n.is_some(),
            state: "limited",
            rule,
            limit: n,
            remaining: n.map(|n| n / 2),
            reset_after_ms: Some(u64::MAX),
            retry_after_ms: n.filter(|n| n % 2 == 0),
        };
        let responses = [
            CheckResponse {
                allowed: true,
                limit: Some(20),
                remaining: Some(19),
                reset_after_ms: Some(100),
                retry_after_ms: None,
                delay_ms: 0,
                descriptors: vec![descriptor(None, Some(20))],
                lease: None,
            },
            CheckResponse {
                allowed: false,
                limit: None,
                remaining: None,
                reset_after_ms: None,
                retry_after_ms: Some(7),
                delay_ms: 12,
                descriptors: vec![
                    descriptor(Some("per-ip"), Some(3)),
                    descriptor(Some("say \"hi\" \\ \u{1}\u{7f} caf\u{e9}"), None),
                ],
                lease: Some("1:5:1000000000:l:6b".into()),
            },
            CheckResponse {
                allowed: true,
                limit: None,
                remaining: None,
                reset_after_ms: None,
                retry_after_ms: None,
                delay_ms: 0,
                descriptors: vec![],
                lease: None,
            },
        ];
        for response in responses {
            let mut ours = Vec::new();
            response.write_json(&mut ours);
            let theirs = serde_json::to_vec(&response).expect("serializable");
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs)
            );
        }
    }
}
