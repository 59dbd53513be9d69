//! envoyproxy/ratelimit's answer to a verdict, shared by its two doors: gRPC
//! `ShouldRateLimit` and `POST /json` each parse their wire format straight
//! into the enforcer's [`Request`](tollgate_policy::Request) and encode this
//! [`Answer`] back, so the two answer exactly alike (as in envoyproxy/ratelimit)
//! with no detour through the other's format.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use tollgate_http::headers::{envoy_headers, reports};
use tollgate_policy::{Descriptor, DescriptorVerdict, Entry, LimitOverride, State, Unit, Verdict};

/// A verdict as envoyproxy/ratelimit reports it.
pub(crate) struct Answer<'a> {
    /// `overall_code`: `OK` unless a descriptor is over its limit.
    pub(crate) ok: bool,
    /// One per descriptor, in request order.
    pub(crate) statuses: Vec<Status<'a>>,
    /// `response_headers_to_add`, spelled as envoyproxy/ratelimit spells them.
    pub(crate) headers: Vec<(&'static str, String)>,
}

/// One descriptor's `DescriptorStatus`.
pub(crate) struct Status<'a> {
    /// `code`: `OK` or `OVER_LIMIT`.
    pub(crate) ok: bool,
    /// `current_limit`: only where a limit was checked.
    pub(crate) current_limit: Option<CurrentLimit<'a>>,
    /// `limit_remaining` (unlimited descriptors report `u32::MAX`).
    pub(crate) limit_remaining: u32,
    /// `duration_until_reset`, where a limit was checked.
    pub(crate) duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
pub(crate) struct CurrentLimit<'a> {
    pub(crate) name: &'a str,
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: Unit,
}

/// The answer to `verdict`.
pub(crate) fn answer(verdict: &Verdict) -> Answer<'_> {
    // itoa rather than `to_string`: this runs on every Envoy check.
    let decimal = |n: u64| itoa::Buffer::new().format(n).to_owned();
    Answer {
        ok: verdict.allowed(),
        statuses: verdict.descriptors.iter().map(status).collect(),
        headers: envoy_headers(&reports(verdict))
            .map(|pairs| pairs.map(|(name, value)| (name, decimal(value))).to_vec())
            .unwrap_or_default(),
    }
}

fn status(d: &DescriptorVerdict) -> Status<'_> {
    let current_limit = d
        .decision
        .and(d.envoy_limit)
        .map(|(requests_per_unit, unit)| CurrentLimit {
            name: d.rule.as_deref().map_or("", |r| r.id()),
            requests_per_unit: saturate(requests_per_unit),
            unit,
        });
    let limit_remaining = match (d.state, d.decision) {
        (State::Unlimited, _) => u32::MAX,
        (_, Some(decision)) => saturate(decision.remaining),
        (_, None) => 0,
    };
    Status {
        ok: d.allowed(),
        current_limit,
        limit_remaining,
        duration_until_reset: d.decision.map(|decision| decision.reset_after),
    }
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The unit a request's limit override names by number (the response's unit
/// enum, which also names `WEEK`, added to the request's in newer protos);
/// `None` for `UNKNOWN` or a number no unit has.
fn unit(number: i32) -> Option<Unit> {
    Some(match ProtoUnit::try_from(number).ok()? {
        ProtoUnit::Second => Unit::Second,
        ProtoUnit::Minute => Unit::Minute,
        ProtoUnit::Hour => Unit::Hour,
        ProtoUnit::Day => Unit::Day,
        ProtoUnit::Week => Unit::Week,
        ProtoUnit::Month => Unit::Month,
        ProtoUnit::Year => Unit::Year,
        ProtoUnit::Unknown => return None,
    })
}

/// `unit` as the response's unit enum.
pub(crate) fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

/// One `RateLimitDescriptor` as it arrives at either door, its strings
/// already owned: turned into the enforcer's [`Descriptor`] by
/// [`RequestDescriptor::into_descriptor`], the one place both doors check it.
pub(crate) struct RequestDescriptor {
    pub(crate) entries: Vec<Entry>,
    /// `limit`: requests per unit and the unit's number.
    pub(crate) limit: Option<(u32, i32)>,
    pub(crate) hits_addend: Option<u64>,
    pub(crate) is_negative_hits: bool,
}

impl RequestDescriptor {
    /// The descriptor, or why descriptor `index` cannot be checked: negative
    /// hits, or an override whose unit has no name.
    pub(crate) fn into_descriptor(self, index: usize) -> Result<Descriptor, String> {
        if self.is_negative_hits {
            return Err(format!(
                "descriptor {index}: negative hits are not supported"
            ));
        }
        let limit = self
            .limit
            .map(|(requests_per_unit, number)| {
                let unit = unit(number).ok_or_else(|| {
                    format!(
                        "descriptor {index} has an invalid limit override: unknown unit {number}"
                    )
                })?;
                Ok::<_, String>(LimitOverride {
                    requests_per_unit: u64::from(requests_per_unit),
                    unit,
                })
            })
            .transpose()?;
        Ok(Descriptor {
            entries: self.entries,
            limit,
            hits_addend: self.hits_addend,
        })
    }
}
