//! gRPC: Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! with the protos of the `envoy-types` crate. The request is read straight
//! into the enforcer's [`Request`] and the answer encoded from
//! [`envoy::Answer`], the model `POST /json` encodes too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{
    Duration as ProtoDuration, ListValue, NullValue, Struct, Value,
};
use tollgate_core::Store;
use tollgate_policy::{Check, Enforcer, Entry, Metadata, MetadataValue, Request};
use tonic::{Response, Status};

use super::auth::{self, Token};
use super::envoy::{self, Answer, Refusal, Reply, RequestDescriptor};
use super::metrics::{self, Api, CheckResult};

pub(crate) use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

/// The gRPC service over the shared [`Enforcer`].
pub(crate) struct RateLimitGrpc<S> {
    enforcer: Arc<Enforcer<S>>,
    /// The bearer tokens any of which a call must carry in its
    /// `authorization` metadata; none: open.
    tokens: Vec<Token>,
    /// The headers and metadata answers carry.
    reply: Arc<Reply>,
}

impl<S> RateLimitGrpc<S> {
    /// Serves `enforcer` to callers with one of `tokens` (to any caller when
    /// there are none), answering as `reply` says.
    pub(crate) fn new(enforcer: Arc<Enforcer<S>>, tokens: Vec<Token>, reply: Arc<Reply>) -> Self {
        Self {
            enforcer,
            tokens,
            reply,
        }
    }
}

#[tonic::async_trait]
impl<S: Store + 'static> RateLimitService for RateLimitGrpc<S> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        if !self.tokens.is_empty() {
            let given = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok());
            if !auth::admits(&self.tokens, given) {
                return Err(Status::unauthenticated(
                    "missing or wrong `authorization: Bearer <API token>` metadata",
                ));
            }
        }
        let started = Instant::now();
        let answer = should_rate_limit(&self.enforcer, &self.reply, request.into_inner()).await;
        metrics::check(Api::Grpc, result_of(&answer), started.elapsed());
        answer.map(Response::new)
    }
}

/// How `answer` is counted in `tollgate_checks_total`.
fn result_of(answer: &Result<RateLimitResponse, Status>) -> CheckResult {
    match answer {
        Ok(r) if r.overall_code == Code::OverLimit as i32 => CheckResult::OverLimit,
        Ok(_) => CheckResult::Ok,
        Err(_) => CheckResult::Invalid,
    }
}

/// Answers one `ShouldRateLimit` request; a malformed one fails with the
/// reason (see [`status`]).
async fn should_rate_limit<S: Store>(
    enforcer: &Enforcer<S>,
    reply: &Reply,
    mut request: RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    let descriptors = envoy::descriptors(
        &request.domain,
        descriptors(std::mem::take(&mut request.descriptors)),
    )
    .map_err(status)?;
    // Envoy's protocol has no release call: a concurrency permit lapses
    // after its rule's period.
    let checked = Request {
        domain: &request.domain,
        descriptors: &descriptors,
        hits_addend: u64::from(request.hits_addend),
    };
    let verdict = enforcer
        .enforce(Check::Policy(checked))
        .await
        .map_err(|e| status(e.into()))?;
    let families = reply.families(enforcer, &request.domain);
    Ok(response(envoy::answer(&checked, &verdict, reply, families)))
}

/// The failure a refusal is: envoyproxy/ratelimit's own refusals with its
/// code and words, Tollgate's `INVALID_ARGUMENT`.
fn status(refusal: Refusal) -> Status {
    match refusal {
        Refusal::Service(error) => Status::unknown(error.to_string()),
        Refusal::Invalid(reason) => Status::invalid_argument(reason),
    }
}

/// The request's descriptors, their strings moved rather than copied.
fn descriptors(descriptors: Vec<RateLimitDescriptor>) -> impl Iterator<Item = RequestDescriptor> {
    descriptors.into_iter().map(|d| RequestDescriptor {
        entries: d
            .entries
            .into_iter()
            .map(|e| Entry::new(e.key, e.value))
            .collect(),
        limit: d.limit.map(|o| (o.requests_per_unit, o.unit)),
        hits_addend: d.hits_addend.map(|h| h.value),
        is_negative_hits: d.is_negative_hits,
    })
}

fn code(ok: bool) -> i32 {
    if ok { Code::Ok } else { Code::OverLimit }.into()
}

fn response(answer: Answer<'_>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(answer.ok),
        statuses: answer
            .statuses
            .into_iter()
            .map(|s| DescriptorStatus {
                code: code(s.ok),
                current_limit: s.current_limit.map(|l| RateLimit {
                    name: l.name.to_owned(),
                    requests_per_unit: l.requests_per_unit,
                    unit: envoy::proto_unit(l.unit).into(),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(proto_duration),
                quota: None,
            })
            .collect(),
        response_headers_to_add: answer
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_owned(),
                value,
                ..HeaderValue::default()
            })
            .collect(),
        dynamic_metadata: answer.dynamic_metadata.map(proto_struct),
        ..RateLimitResponse::default()
    }
}

fn proto_struct(fields: Metadata) -> Struct {
    Struct {
        fields: fields
            .into_iter()
            .map(|(key, value)| (key, proto_value(value)))
            .collect(),
    }
}

fn proto_value(value: MetadataValue) -> Value {
    let kind = match value {
        MetadataValue::Null => Kind::NullValue(NullValue::NullValue.into()),
        MetadataValue::Bool(b) => Kind::BoolValue(b),
        MetadataValue::Number(n) => Kind::NumberValue(n),
        MetadataValue::String(s) => Kind::StringValue(s),
        MetadataValue::List(values) => Kind::ListValue(ListValue {
            values: values.into_iter().map(proto_value).collect(),
        }),
        MetadataValue::Struct(fields) => Kind::StructValue(proto_struct(fields)),
    };
    Value { kind: Some(kind) }
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // Below 10⁹, so it always fits.
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
