//! `RateLimitResponse` written from an [`Answer`] straight into tonic's frame
//! buffer, with prost's encoding primitives, instead of through prost's owned
//! message: building that message allocated a vector of statuses, one of
//! headers, and a string for every rule name and header name, all encoded
//! once and freed. The bytes are the ones prost writes for that message
//! (fields in tag order, each left out at its proto3 default), which
//! `tests::the_bytes_are_prosts` holds for every kind of answer.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{
    Duration as ProtoDuration, ListValue, NullValue, Struct, Value,
};
use prost::bytes::BufMut;
use prost::encoding::{self, WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tollgate_policy::{Metadata, MetadataValue};

use super::answer::{self, Answer, CurrentLimit, HeaderText, Status};

/// A message written from borrowed parts: its length, then its fields.
trait Fields {
    /// What [`Fields::write`] writes, in bytes.
    fn len(&self) -> usize;
    /// The fields, without the key and length of the message itself.
    fn write(&self, buf: &mut impl BufMut);
}

/// The largest answer written through a stack buffer first.
const STACK: usize = 512;

/// Writes `answer` as a `RateLimitResponse`. An answer that fits (most do)
/// goes through a stack buffer: prost writes varints a byte at a time, and
/// each byte put into tonic's buffer is a `BytesMut::put_slice` call with
/// its capacity check, where into a slice it is one store.
pub(crate) fn response(answer: &Answer<'_>, buf: &mut impl BufMut) {
    let len = answer.len();
    if len <= STACK {
        let mut stack = [0; STACK];
        answer.write(&mut &mut stack[..len]);
        buf.put_slice(&stack[..len]);
    } else {
        answer.write(buf);
    }
}

/// `RateLimitResponse`.
impl Fields for Answer<'_> {
    fn len(&self) -> usize {
        enumeration_len(1, code(self.ok))
            + self
                .statuses
                .iter()
                .map(|s| nested_len(2, s))
                .sum::<usize>()
            + self.headers.iter().map(|h| nested_len(3, h)).sum::<usize>()
            + self.dynamic_metadata.as_ref().map_or(0, |metadata| {
                encoding::message::encoded_len(6, &proto_struct(metadata))
            })
    }

    fn write(&self, buf: &mut impl BufMut) {
        enumeration(1, code(self.ok), buf);
        for status in &self.statuses {
            nested(2, status, buf);
        }
        for header in &self.headers {
            nested(3, header, buf);
        }
        if let Some(metadata) = &self.dynamic_metadata {
            // Only with RESPONSE_DYNAMIC_METADATA: through prost's own message.
            encoding::message::encode(6, &proto_struct(metadata), buf);
        }
    }
}

/// `DescriptorStatus`.
impl Fields for Status<'_> {
    fn len(&self) -> usize {
        enumeration_len(1, code(self.ok))
            + self.current_limit.as_ref().map_or(0, |l| nested_len(2, l))
            + uint32_len(3, self.limit_remaining)
            + self
                .duration_until_reset
                .map_or(0, |d| encoding::message::encoded_len(4, &proto_duration(d)))
    }

    fn write(&self, buf: &mut impl BufMut) {
        enumeration(1, code(self.ok), buf);
        if let Some(limit) = &self.current_limit {
            nested(2, limit, buf);
        }
        uint32(3, self.limit_remaining, buf);
        if let Some(d) = self.duration_until_reset {
            encoding::message::encode(4, &proto_duration(d), buf);
        }
    }
}

/// `RateLimitResponse.RateLimit`.
impl Fields for CurrentLimit<'_> {
    fn len(&self) -> usize {
        uint32_len(1, self.requests_per_unit)
            + enumeration_len(2, unit(self))
            + string_len(3, self.name)
    }

    fn write(&self, buf: &mut impl BufMut) {
        uint32(1, self.requests_per_unit, buf);
        enumeration(2, unit(self), buf);
        string(3, self.name, buf);
    }
}

/// `HeaderValue`: its key and value (no `raw_value`).
impl Fields for (&str, HeaderText) {
    fn len(&self) -> usize {
        // A number's digits counted rather than written twice.
        let value = match &self.1 {
            HeaderText::Number(n) => n.checked_ilog10().map_or(1, |d| d as usize + 1),
            text @ HeaderText::Field(_) => text.as_str(&mut itoa::Buffer::new()).len(),
        };
        string_len(1, self.0) + delimited_len(2, value)
    }

    fn write(&self, buf: &mut impl BufMut) {
        string(1, self.0, buf);
        string(2, self.1.as_str(&mut itoa::Buffer::new()), buf);
    }
}

fn nested_len(tag: u32, message: &impl Fields) -> usize {
    let len = message.len();
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn nested(tag: u32, message: &impl Fields, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(message.len() as u64, buf);
    message.write(buf);
}

fn string_len(tag: u32, s: &str) -> usize {
    delimited_len(tag, s.len())
}

/// A string or bytes field of `len` bytes, left out when empty.
fn delimited_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(len as u64) + len
    }
}

/// prost's `string::encode` takes a `&String`; this is the same for a `&str`.
fn string(tag: u32, s: &str, buf: &mut impl BufMut) {
    if !s.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(s.len() as u64, buf);
        buf.put_slice(s.as_bytes());
    }
}

fn uint32_len(tag: u32, n: u32) -> usize {
    if n == 0 {
        0
    } else {
        encoding::uint32::encoded_len(tag, &n)
    }
}

fn uint32(tag: u32, n: u32, buf: &mut impl BufMut) {
    if n != 0 {
        encoding::uint32::encode(tag, &n, buf);
    }
}

fn enumeration_len(tag: u32, n: i32) -> usize {
    if n == 0 {
        0
    } else {
        encoding::int32::encoded_len(tag, &n)
    }
}

fn enumeration(tag: u32, n: i32, buf: &mut impl BufMut) {
    if n != 0 {
        encoding::int32::encode(tag, &n, buf);
    }
}

/// A status's `Code`.
pub(crate) fn code(ok: bool) -> i32 {
    if ok { Code::Ok } else { Code::OverLimit }.into()
}

fn unit(limit: &CurrentLimit<'_>) -> i32 {
    answer::proto_unit(limit.unit).into()
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // Below 10⁹, so it always fits.
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn proto_struct(fields: &Metadata) -> Struct {
    Struct {
        fields: fields
            .iter()
            .map(|(key, value)| (key.clone(), proto_value(value)))
            .collect(),
    }
}

fn proto_value(value: &MetadataValue) -> Value {
    let kind = match value {
        MetadataValue::Null => Kind::NullValue(NullValue::NullValue.into()),
        MetadataValue::Bool(b) => Kind::BoolValue(*b),
        MetadataValue::Number(n) => Kind::NumberValue(*n),
        MetadataValue::String(s) => Kind::StringValue(s.clone()),
        MetadataValue::List(values) => Kind::ListValue(ListValue {
            values: values.iter().map(proto_value).collect(),
        }),
        MetadataValue::Struct(fields) => Kind::StructValue(proto_struct(fields)),
    };
    Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        DescriptorStatus, RateLimit,
    };
    use prost::Message;
    use tollgate_policy::Unit;

    use super::*;

    /// The answer as prost's owned message, built as the door did before
    /// this encoder: what its bytes must equal.
    fn message(answer: &Answer<'_>) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: code(answer.ok),
            statuses: answer
                .statuses
                .iter()
                .map(|s| DescriptorStatus {
                    code: code(s.ok),
                    current_limit: s.current_limit.as_ref().map(|l| RateLimit {
                        name: l.name.to_owned(),
                        requests_per_unit: l.requests_per_unit,
                        unit: unit(l),
                    }),
                    limit_remaining: s.limit_remaining,
                    duration_until_reset: s.duration_until_reset.map(proto_duration),
                    quota: None,
                })
                .collect(),
            response_headers_to_add: answer
                .headers
                .iter()
                .map(|(key, value)| HeaderValue {
                    key: (*key).to_owned(),
                    value: value.as_str(&mut itoa::Buffer::new()).to_owned(),
                    ..HeaderValue::default()
                })
                .collect(),
            dynamic_metadata: answer.dynamic_metadata.as_ref().map(proto_struct),
            ..RateLimitResponse::default()
        }
    }

    fn encoded(answer: &Answer<'_>) -> Vec<u8> {
        let mut buf = Vec::new();
        response(answer, &mut buf);
        buf
    }

    fn limit(name: &str, requests_per_unit: u32, unit: Unit) -> Option<CurrentLimit<'_>> {
        Some(CurrentLimit {
            name,
            requests_per_unit,
            unit,
        })
    }

    fn ok(current_limit: Option<CurrentLimit<'_>>, remaining: u32, reset: Duration) -> Status<'_> {
        Status {
            ok: true,
            current_limit,
            limit_remaining: remaining,
            duration_until_reset: Some(reset),
        }
    }

    /// A descriptor no rule matches: `OK`, no limit, no reset.
    fn unknown() -> Status<'static> {
        Status {
            ok: true,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: None,
        }
    }

    /// Header values that are numbers are given as such, as the
    /// `ratelimit` and `x-ratelimit` families give them; others as text,
    /// as the draft's fields.
    fn answer<'a>(ok: bool, statuses: Vec<Status<'a>>, headers: &[(&'a str, &str)]) -> Answer<'a> {
        let text = |v: &str| match v.parse() {
            Ok(n) => HeaderText::Number(n),
            Err(_) => HeaderText::Field(v.parse().expect("a header value")),
        };
        Answer {
            ok,
            statuses,
            headers: headers.iter().map(|(k, v)| (*k, text(v))).collect(),
            dynamic_metadata: None,
        }
    }

    fn answers() -> Vec<(&'static str, Answer<'static>)> {
        let over = Status {
            ok: false,
            current_limit: limit("per-key", 1000, Unit::Second),
            limit_remaining: 0,
            duration_until_reset: Some(Duration::from_nanos(999_999)),
        };
        let x_ratelimit = [
            ("X-RateLimit-Limit", "1000"),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", "1"),
        ];
        vec![
            (
                "OK",
                answer(
                    true,
                    vec![ok(
                        limit("per-key", 1000, Unit::Second),
                        999,
                        Duration::from_millis(1),
                    )],
                    &[],
                ),
            ),
            ("OVER_LIMIT", answer(false, vec![over], &x_ratelimit)),
            (
                "multiple descriptors",
                answer(
                    false,
                    vec![
                        ok(limit("", 10, Unit::Minute), 9, Duration::from_secs(58)),
                        Status {
                            ok: false,
                            current_limit: limit("daily", u32::MAX, Unit::Day),
                            limit_remaining: 0,
                            duration_until_reset: Some(Duration::new(86_399, 5)),
                        },
                        ok(limit("weekly", 7, Unit::Week), u32::MAX, Duration::ZERO),
                        ok(limit("monthly", 1, Unit::Month), 1, Duration::MAX),
                        ok(limit("yearly", 2, Unit::Year), 1, Duration::from_secs(1)),
                        ok(limit("hourly", 3, Unit::Hour), 1, Duration::from_secs(1)),
                        unknown(),
                    ],
                    &[],
                ),
            ),
            (
                "headers to add",
                answer(
                    true,
                    vec![ok(
                        limit("per-key", 1000, Unit::Second),
                        17,
                        Duration::from_secs(1),
                    )],
                    &[
                        ("RateLimit-Limit", "1000"),
                        ("RateLimit-Remaining", "17"),
                        ("RateLimit-Reset", "1"),
                        ("RateLimit-Policy", "\"per-key\";q=1000;w=1"),
                        ("RateLimit", "\"per-key\";r=17;t=1"),
                        ("x-ünïcode", ""),
                        ("X-RateLimit-Reset", "18446744073709551615"),
                        ("X-RateLimit-Remaining", "9"),
                        ("X-RateLimit-Remaining", "10"),
                    ],
                ),
            ),
            ("unknown descriptor", answer(true, vec![unknown()], &[])),
            (
                "unlimited descriptor",
                answer(
                    true,
                    vec![Status {
                        limit_remaining: u32::MAX,
                        ..unknown()
                    }],
                    &[],
                ),
            ),
            ("no statuses", answer(true, vec![], &[])),
            (
                "larger than the stack buffer",
                answer(
                    false,
                    (0..40)
                        .map(|_| {
                            ok(
                                limit("a-rule-with-a-long-name", 5, Unit::Hour),
                                4,
                                Duration::from_secs(3599),
                            )
                        })
                        .collect(),
                    &x_ratelimit,
                ),
            ),
        ]
    }

    #[test]
    fn the_bytes_are_prosts() {
        let sizes: Vec<usize> = answers().iter().map(|(_, a)| encoded(a).len()).collect();
        assert!(sizes.iter().any(|&n| n > STACK) && sizes.iter().any(|&n| n <= STACK));
        for (case, answer) in answers() {
            let expected = message(&answer);
            let bytes = encoded(&answer);
            assert_eq!(bytes, expected.encode_to_vec(), "{case}");
            let decoded = RateLimitResponse::decode(bytes.as_slice()).expect(case);
            assert_eq!(decoded, expected, "{case}");
        }
    }

    /// Dynamic metadata is a protobuf `Struct`, a map, whose entries prost
    /// writes in its `HashMap`'s order: the bytes may differ from another
    /// encoding of the same map, the message may not.
    #[test]
    fn dynamic_metadata_decodes_to_prosts_message() {
        let mut inner = Metadata::new();
        inner.insert(
            "entries".into(),
            MetadataValue::List(vec![
                MetadataValue::String("key=k1".into()),
                MetadataValue::Null,
                MetadataValue::Bool(true),
            ]),
        );
        let mut fields = Metadata::new();
        fields.insert("domain".into(), MetadataValue::String("bench".into()));
        fields.insert("hitsAddend".into(), MetadataValue::Number(3.0));
        fields.insert(
            "descriptors".into(),
            MetadataValue::List(vec![MetadataValue::Struct(inner)]),
        );
        fields.insert("metadata".into(), MetadataValue::Struct(Metadata::new()));
        for (case, mut answer) in answers() {
            answer.dynamic_metadata = Some(fields.clone());
            let decoded = RateLimitResponse::decode(encoded(&answer).as_slice()).expect(case);
            assert_eq!(decoded, message(&answer), "{case}");
            assert!(decoded.dynamic_metadata.is_some(), "{case}");
        }
    }
}
