//! `/json`: envoyproxy/ratelimit's HTTP endpoint, in its shape, on any
//! method as there (clients `POST`).
//!
//! The body is a `RateLimitRequest` and the answer a `RateLimitResponse`, both
//! in the protobuf JSON mapping (as envoyproxy/ratelimit reads and writes them
//! with `protojson`): camelCase names (the proto's snake_case names are read
//! too), enums by name, 64-bit integers as numbers or strings, durations as
//! `"1.500s"`, and fields left out when they hold their default value. The
//! request goes through the very function the gRPC service calls. The status
//! is 200 when the overall code is `OK`, 429 when it is `OVER_LIMIT`, and a
//! request that cannot be read or checked gets what envoyproxy/ratelimit's
//! `NewJsonHandler` writes (Go's `http.Error`): 400, `text/plain`, `Bad
//! Request` and a newline. The reason is logged at debug level.

use std::fmt;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::http::header::{CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ResponseUnit;
use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::{Deserialize, Serialize};
use tollgate_core::Store;
use tollgate_policy::{Check, Descriptor, Enforcer, Entry, Metadata, MetadataValue, Request};

use super::answer::{self, Answer, Answered, Outcome, Refusal, Reply, RequestDescriptor};

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
    /// The domain, the descriptors as the enforcer takes them and the
    /// hits, or why the request is refused (see [`answer::descriptors`]).
    fn descriptors(self) -> Result<(String, Vec<Descriptor>, u32), Refusal> {
        let descriptors = answer::descriptors(
            &self.domain,
            self.descriptors.into_iter().map(|d| RequestDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry::new(e.key, e.value))
                    .collect(),
                limit: d.limit.map(|o| (o.requests_per_unit, o.unit)),
                hits_addend: d.hits_addend,
                is_negative_hits: d.is_negative_hits,
            }),
        )?;
        Ok((self.domain, descriptors, self.hits_addend))
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
    #[serde(skip_serializing_if = "Option::is_none")]
    dynamic_metadata: Option<serde_json::Value>,
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

impl From<Answer<'_>> for JsonResponse {
    fn from(answer: Answer<'_>) -> Self {
        JsonResponse {
            overall_code: code_name(answer.ok),
            statuses: answer
                .statuses
                .into_iter()
                .map(|s| JsonStatus {
                    code: code_name(s.ok),
                    current_limit: s.current_limit.map(|l| JsonLimit {
                        name: l.name.to_owned(),
                        requests_per_unit: l.requests_per_unit,
                        unit: answer::proto_unit(l.unit).as_str_name(),
                    }),
                    limit_remaining: s.limit_remaining,
                    duration_until_reset: s.duration_until_reset.map(duration),
                })
                .collect(),
            response_headers_to_add: answer
                .headers
                .into_iter()
                .map(|(key, value)| JsonHeader {
                    key: key.to_owned(),
                    value: value.as_str(&mut itoa::Buffer::new()).to_owned(),
                })
                .collect(),
            dynamic_metadata: answer.dynamic_metadata.map(json_struct),
        }
    }
}

/// A `google.protobuf.Struct` in the protobuf JSON mapping: an object.
fn json_struct(fields: Metadata) -> serde_json::Value {
    serde_json::Value::Object(
        fields
            .into_iter()
            .map(|(key, value)| (key, json_value(value)))
            .collect(),
    )
}

/// A `google.protobuf.Value` in the protobuf JSON mapping. A number is
/// written as Go's `protojson` writes a double: without a fraction when it
/// has none (`5`, not `5.0`).
fn json_value(value: MetadataValue) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        MetadataValue::Null => J::Null,
        MetadataValue::Bool(b) => J::Bool(b),
        #[expect(
            clippy::cast_possible_truncation,
            reason = "whole and within 2^53, so exact"
        )]
        MetadataValue::Number(n) if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 => {
            J::from(n as i64)
        }
        MetadataValue::Number(n) => serde_json::Number::from_f64(n).map_or(J::Null, J::Number),
        MetadataValue::String(s) => J::String(s),
        MetadataValue::List(values) => J::Array(values.into_iter().map(json_value).collect()),
        MetadataValue::Struct(fields) => json_struct(fields),
    }
}

fn code_name(ok: bool) -> &'static str {
    if ok { "OK" } else { "OVER_LIMIT" }
}

/// A duration as the protobuf JSON mapping writes it: seconds with 0, 3, 6 or
/// 9 fractional digits and an `s`.
fn duration(d: Duration) -> String {
    let (seconds, nanos) = (d.as_secs(), d.subsec_nanos());
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

/// `/json`: the answer to `body` from `enforcer`, with what `reply` asks
/// for; `answered` is told how it went.
pub async fn json<S: Store>(
    enforcer: &Enforcer<S>,
    reply: &Reply,
    body: Bytes,
    answered: Answered,
) -> Response {
    let started = Instant::now();
    let answer = answer(enforcer, reply, &body).await;
    let outcome = match &answer {
        Ok(response) if response.overall_code == "OK" => Outcome::Ok,
        Ok(_) => Outcome::OverLimit,
        Err(_) => Outcome::Invalid,
    };
    answered(outcome, started.elapsed());
    match answer {
        Ok(response) => {
            let status = if response.overall_code == "OK" {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            (status, Json(response)).into_response()
        }
        Err(reason) => {
            tracing::debug!(%reason, "/json: bad request");
            bad_request()
        }
    }
}

/// Go's `http.Error(w, "Bad Request", 400)`, as envoyproxy/ratelimit
/// answers every request it cannot read or check.
fn bad_request() -> Response {
    (
        StatusCode::BAD_REQUEST,
        [
            (CONTENT_TYPE, "text/plain; charset=utf-8"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        "Bad Request\n",
    )
        .into_response()
}

/// The answer, or why there is none.
async fn answer<S: Store>(
    enforcer: &Enforcer<S>,
    reply: &Reply,
    body: &[u8],
) -> Result<JsonResponse, String> {
    let Json(request) =
        Json::<JsonRequest>::from_bytes(body).map_err(|rejection| rejection.body_text())?;
    let (domain, descriptors, hits_addend) = request
        .descriptors()
        .map_err(|refusal| refusal.to_string())?;
    let checked = Request {
        domain: &domain,
        descriptors: &descriptors,
        hits_addend: u64::from(hits_addend),
    };
    let verdict = enforcer
        .enforce(Check::Policy(checked))
        .await
        .map_err(|e| e.to_string())?;
    let families = reply.families(enforcer, &domain);
    Ok(JsonResponse::from(answer::answer(
        &checked, &verdict, reply, families,
    )))
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
    use tollgate_policy::LimitOverride;

    use super::*;

    #[test]
    fn durations_use_the_protobuf_json_mapping() {
        let d = |seconds, nanos| duration(Duration::new(seconds, nanos));
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
        let (_, descriptors, hits_addend) = request.descriptors().expect("valid descriptors");
        assert_eq!(hits_addend, 3);
        assert_eq!(descriptors[0].hits_addend, Some(2));
        assert_eq!(
            descriptors[0].limit,
            Some(LimitOverride {
                requests_per_unit: 5,
                unit: tollgate_policy::Unit::Minute
            })
        );
        assert_eq!(descriptors[0].entries[0].value, "");
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
