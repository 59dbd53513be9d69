//! gRPC: Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! with the protos of the `envoy-types` crate.
//!
//! [`should_rate_limit`] is also what `POST /json` calls, so the two answer
//! exactly alike (as in envoyproxy/ratelimit).

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ResponseUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tollgate_core::Store;
use tollgate_policy::{Descriptor, Entry, LimitOverride, Request, Unit};
use tonic::{Response, Status};

use super::headers;
use super::metrics::{self, Api, CheckResult};
use tollgate_policy::{Check, DescriptorVerdict, Enforcer, State, Verdict};

pub(crate) use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// The gRPC service over the shared [`Enforcer`].
pub(crate) struct RateLimitGrpc<S> {
    enforcer: Arc<Enforcer<S>>,
}

impl<S> RateLimitGrpc<S> {
    /// Serves `enforcer`.
    pub(crate) fn new(enforcer: Arc<Enforcer<S>>) -> Self {
        Self { enforcer }
    }
}

#[tonic::async_trait]
impl<S: Store + 'static> RateLimitService for RateLimitGrpc<S> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let answer = should_rate_limit(&self.enforcer, request.into_inner()).await;
        metrics::check(Api::Grpc, result_of(&answer), started.elapsed());
        answer.map(Response::new)
    }
}

/// How `answer` is counted in `tollgate_checks_total`.
pub(crate) fn result_of(answer: &Result<RateLimitResponse, Status>) -> CheckResult {
    match answer {
        Ok(r) if r.overall_code == Code::OverLimit as i32 => CheckResult::OverLimit,
        Ok(_) => CheckResult::Ok,
        Err(_) => CheckResult::Invalid,
    }
}

/// Answers one `ShouldRateLimit` request; a malformed one is
/// `INVALID_ARGUMENT` with the reason.
pub(crate) async fn should_rate_limit<S: Store>(
    enforcer: &Enforcer<S>,
    mut request: RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    let descriptors = descriptors(std::mem::take(&mut request.descriptors))?;
    // Envoy's protocol has no release call: a concurrency permit lapses
    // after its rule's period.
    let verdict = enforcer
        .enforce(Check::Policy(Request {
            domain: &request.domain,
            descriptors: &descriptors,
            hits_addend: u64::from(request.hits_addend),
        }))
        .await
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(response(&verdict))
}

/// The request's descriptors, their strings moved rather than copied.
fn descriptors(descriptors: Vec<RateLimitDescriptor>) -> Result<Vec<Descriptor>, Status> {
    descriptors
        .into_iter()
        .enumerate()
        .map(|(index, d)| {
            if d.is_negative_hits {
                return Err(Status::invalid_argument(format!(
                    "descriptor {index}: negative hits are not supported"
                )));
            }
            Ok(Descriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry::new(e.key, e.value))
                    .collect(),
                limit: d.limit.map(|o| limit_override(index, o)).transpose()?,
                hits_addend: d.hits_addend.map(|h| h.value),
            })
        })
        .collect()
}

fn limit_override(index: usize, o: RateLimitOverride) -> Result<LimitOverride, Status> {
    // By number: newer Envoy protos add WEEK (7), which `RateLimitUnit` of
    // these protos does not name yet; the response's unit enum has it.
    let unit = match ResponseUnit::try_from(o.unit) {
        Ok(ResponseUnit::Second) => Unit::Second,
        Ok(ResponseUnit::Minute) => Unit::Minute,
        Ok(ResponseUnit::Hour) => Unit::Hour,
        Ok(ResponseUnit::Day) => Unit::Day,
        Ok(ResponseUnit::Week) => Unit::Week,
        Ok(ResponseUnit::Month) => Unit::Month,
        Ok(ResponseUnit::Year) => Unit::Year,
        Ok(ResponseUnit::Unknown) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "descriptor {index} has an invalid limit override: unknown unit {}",
                o.unit
            )));
        }
    };
    Ok(LimitOverride {
        requests_per_unit: u64::from(o.requests_per_unit),
        unit,
    })
}

fn response(verdict: &Verdict) -> RateLimitResponse {
    let overall = if verdict.allowed() {
        Code::Ok
    } else {
        Code::OverLimit
    };
    RateLimitResponse {
        overall_code: overall.into(),
        statuses: verdict.descriptors.iter().map(status).collect(),
        response_headers_to_add: headers::envoy(verdict)
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_owned(),
                value,
                ..HeaderValue::default()
            })
            .collect(),
        ..RateLimitResponse::default()
    }
}

/// One descriptor's status, as envoyproxy/ratelimit reports it: a current
/// limit only where a limit was checked; unlimited descriptors remain
/// `u32::MAX`.
fn status(d: &DescriptorVerdict) -> DescriptorStatus {
    let code = if d.allowed() {
        Code::Ok
    } else {
        Code::OverLimit
    };
    let current_limit = d
        .decision
        .and(d.envoy_limit)
        .map(|(requests_per_unit, unit)| RateLimit {
            name: d
                .rule
                .as_ref()
                .map(|r| r.id().to_owned())
                .unwrap_or_default(),
            requests_per_unit: saturate(requests_per_unit),
            unit: response_unit(unit).into(),
        });
    let limit_remaining = match (d.state, d.decision) {
        (State::Unlimited, _) => u32::MAX,
        (_, Some(decision)) => saturate(decision.remaining),
        (_, None) => 0,
    };
    DescriptorStatus {
        code: code.into(),
        current_limit,
        limit_remaining,
        duration_until_reset: d
            .decision
            .map(|decision| proto_duration(decision.reset_after)),
        quota: None,
    }
}

fn response_unit(unit: Unit) -> ResponseUnit {
    match unit {
        Unit::Second => ResponseUnit::Second,
        Unit::Minute => ResponseUnit::Minute,
        Unit::Hour => ResponseUnit::Hour,
        Unit::Day => ResponseUnit::Day,
        Unit::Week => ResponseUnit::Week,
        Unit::Month => ResponseUnit::Month,
        Unit::Year => ResponseUnit::Year,
    }
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // Below 10⁹, so it always fits.
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
