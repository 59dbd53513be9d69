//! `POST /json`: envoyproxy/ratelimit's HTTP endpoint, in its shape.
//!
//! The body is a `RateLimitRequest` and the answer a `RateLimitResponse`, both
//! in the protobuf JSON mapping (as envoyproxy/ratelimit reads and writes them
//! with `protojson`): camelCase names (the proto's snake_case names are read
//! too), enums by name, 64-bit integers as numbers or strings, durations as
//! `"1.500s"`, and fields left out when they hold their default value. The
//! request goes through the very function the gRPC service calls. The status
//! is 200 when the overall code is `OK`, 429 when it is `OVER_LIMIT`, and 400
//! with `{"error": "..."}` for a request that cannot be read or checked.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ResponseUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt64Value};
use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::{Deserialize, Serialize};
use tollgate_core::Store;
use tonic::Status;

use super::grpc;
use super::http::{ApiError, AppState};
use super::metrics::{self, Api};

/// `RateLimitRequest`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(
        default,
        rename = "hitsAddend",
        alias = "hits_addend",
        deserialize_with = "uint32"
    )]
    hits_addend: u32,
}

/// `RateLimitDescriptor`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(
        default,
        rename = "hitsAddend",
        alias = "hits_addend",
        deserialize_with = "uint64"
    )]
    hits_addend: Option<u64>,
    #[serde(default, rename = "isNegativeHits", alias = "is_negative_hits")]
    is_negative_hits: bool,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(
        default,
        rename = "requestsPerUnit",
        alias = "requests_per_unit",
        deserialize_with = "uint32"
    )]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "unit")]
    unit: i32,
}

impl JsonRequest {
    fn into_proto(self) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain,
            descriptors: self
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit: d.limit.map(|o| RateLimitOverride {
                        requests_per_unit: o.requests_per_unit,
                        unit: o.unit,
                    }),
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: self.hits_addend,
        }
    }
}

/// `RateLimitResponse`, default values left out.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonResponse {
    overall_code: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit>,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "is_zero")]
    requests_per_unit: u32,
    unit: &'static str,
}

/// `config.core.v3.HeaderValue`.
#[derive(Debug, Serialize)]
struct JsonHeader {
    key: String,
    value: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl From<RateLimitResponse> for JsonResponse {
    fn from(r: RateLimitResponse) -> Self {
        JsonResponse {
            overall_code: code_name(r.overall_code),
            statuses: r.statuses.into_iter().map(JsonStatus::from).collect(),
            response_headers_to_add: r
                .response_headers_to_add
                .into_iter()
                .map(|h| JsonHeader {
                    key: h.key,
                    value: h.value,
                })
                .collect(),
        }
    }
}

impl From<DescriptorStatus> for JsonStatus {
    fn from(s: DescriptorStatus) -> Self {
        JsonStatus {
            code: code_name(s.code),
            current_limit: s.current_limit.map(|l: RateLimit| JsonLimit {
                name: l.name,
                requests_per_unit: l.requests_per_unit,
                unit: ResponseUnit::try_from(l.unit)
                    .unwrap_or(ResponseUnit::Unknown)
                    .as_str_name(),
            }),
            limit_remaining: s.limit_remaining,
            duration_until_reset: s.duration_until_reset.as_ref().map(duration),
        }
    }
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).unwrap_or(Code::Unknown).as_str_name()
}

/// A duration as the protobuf JSON mapping writes it: seconds with 0, 3, 6 or
/// 9 fractional digits and an `s`.
fn duration(d: &ProtoDuration) -> String {
    let (seconds, nanos) = (d.seconds, d.nanos);
    if nanos == 0 {
        format!("{seconds}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{seconds}.{nanos:09}s")
    }
}

/// `POST /json`.
pub(crate) async fn json<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let answer = match Json::<JsonRequest>::from_bytes(&body) {
        Ok(Json(request)) => grpc::should_rate_limit(&state.enforcer, request.into_proto()).await,
        Err(rejection) => Err(Status::invalid_argument(rejection.body_text())),
    };
    metrics::check(Api::Json, grpc::result_of(&answer), started.elapsed());
    match answer {
        Ok(response) => {
            let status = if response.overall_code == i32::from(Code::OverLimit) {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, Json(JsonResponse::from(response))).into_response()
        }
        Err(status) => ApiError::bad_request(status.message()).into_response(),
    }
}

/// Reads a protobuf JSON integer: a number or a decimal string; `null` is the
/// default (absent).
struct ProtoInt;

impl Visitor<'_> for ProtoInt {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-negative integer (a number or a decimal string)")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v)
            .map(Some)
            .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        v.parse()
            .map(Some)
            .map_err(|_| E::invalid_value(Unexpected::Str(v), &self))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

fn uint64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    d.deserialize_any(ProtoInt)
}

fn uint32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let value = d.deserialize_any(ProtoInt)?.unwrap_or(0);
    u32::try_from(value).map_err(|_| {
        de::Error::invalid_value(
            Unexpected::Unsigned(value),
            &"an integer that fits in 32 bits",
        )
    })
}

/// Reads a `RateLimitUnit`: its name (`"MINUTE"`) or its number.
struct ProtoUnit;

impl Visitor<'_> for ProtoUnit {
    type Value = i32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rate limit unit: SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        i32::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        i32::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        // The response's unit enum: it also names WEEK (same numbers).
        ResponseUnit::from_str_name(v)
            .map(i32::from)
            .ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(0)
    }
}

fn unit<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    d.deserialize_any(ProtoUnit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_use_the_protobuf_json_mapping() {
        let d = |seconds, nanos| duration(&ProtoDuration { seconds, nanos });
        assert_eq!(d(1, 0), "1s");
        assert_eq!(d(0, 500_000_000), "0.500s");
        assert_eq!(d(2, 1_000), "2.000001s");
        assert_eq!(d(0, 1), "0.000000001s");
    }

    #[test]
    fn reads_both_field_spellings_and_string_integers() {
        let body = br#"{"domain": "d", "hits_addend": "3", "descriptors": [
            {"entries": [{"key": "k"}], "hitsAddend": 2, "limit": {"requests_per_unit": 5, "unit": "MINUTE"}}]}"#;
        let Json(request) = Json::<JsonRequest>::from_bytes(body).expect("valid body");
        let proto = request.into_proto();
        assert_eq!(proto.hits_addend, 3);
        assert_eq!(
            proto.descriptors[0].hits_addend,
            Some(UInt64Value { value: 2 })
        );
        let limit = proto.descriptors[0].limit.expect("override");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (5, ResponseUnit::Minute as i32)
        );
        assert_eq!(proto.descriptors[0].entries[0].value, "");
    }

    #[test]
    fn names_the_bad_field() {
        let body = br#"{"domain": "d", "descriptors": [{"entries": [{"key": 1}]}]}"#;
        let error = Json::<JsonRequest>::from_bytes(body).expect_err("a number is not a key");
        assert!(
            error.body_text().contains("descriptors[0].entries[0].key"),
            "{}",
            error.body_text()
        );
        let unknown = Json::<JsonRequest>::from_bytes(br#"{"domian": "d"}"#).expect_err("typo");
        assert!(
            unknown.body_text().contains("domian"),
            "{}",
            unknown.body_text()
        );
    }
}
