//! envoyproxy/ratelimit's answer to a verdict, shared by its two doors: gRPC
//! `ShouldRateLimit` and `POST /json` each parse their wire format straight
//! into the enforcer's [`Request`](tollgate_policy::Request) and encode this
//! [`Answer`] back, so the two answer exactly alike (as in envoyproxy/ratelimit)
//! with no detour through the other's format.

use std::fmt;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use tollgate_core::Nanos;
use tollgate_http::headers::{envoy_headers, reports};
use tollgate_policy::{
    Descriptor, DescriptorVerdict, Entry, LimitOverride, RequestError, Rule, State, Unit, Verdict,
};

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
    /// `duration_until_reset`, where a limit was checked: whole seconds to
    /// the end of an envoyproxy/ratelimit window (see [`until_window_end`]),
    /// a native rule's exact time until it is fully available again.
    pub(crate) duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
pub(crate) struct CurrentLimit<'a> {
    /// The rule's name (envoyproxy/ratelimit's `rate_limit.name`, a native
    /// rule's `name`); empty when it has none, as for a limit override.
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
        statuses: verdict
            .descriptors
            .iter()
            .map(|d| status(d, verdict.started_at))
            .collect(),
        headers: envoy_headers(&reports(verdict))
            .map(|pairs| pairs.map(|(name, value)| (name, decimal(value))).to_vec())
            .unwrap_or_default(),
    }
}

fn status(d: &DescriptorVerdict, started_at: Nanos) -> Status<'_> {
    let rule = d.rule.as_deref();
    let current_limit = d
        .decision
        .and(d.envoy_limit)
        .map(|(requests_per_unit, unit)| CurrentLimit {
            name: rule.and_then(Rule::name).unwrap_or_default(),
            requests_per_unit: saturate(requests_per_unit),
            unit,
        });
    let duration_until_reset = d.decision.map(|decision| {
        rule.and_then(Rule::envoy_window)
            .map_or(decision.reset_after, |unit| {
                until_window_end(unit, started_at)
            })
    });
    let limit_remaining = match (d.state, d.decision) {
        (State::Unlimited, _) => u32::MAX,
        // Over the limit, nothing is left for this request, whatever smaller
        // one might fit (`GetResponseDescriptorStatus`).
        (_, Some(decision)) if !decision.allowed => 0,
        (_, Some(decision)) => saturate(decision.remaining),
        (_, None) => 0,
    };
    Status {
        ok: d.allowed(),
        current_limit,
        limit_remaining,
        duration_until_reset,
    }
}

/// The time from `now` (epoch nanoseconds) to the end of its `unit` window,
/// as envoyproxy/ratelimit computes it (`utils.CalculateReset`): from the
/// current whole second, so 1 to `unit` whole seconds.
fn until_window_end(unit: Unit, now: Nanos) -> Duration {
    let unit = unit.duration().as_secs();
    let second = now / 1_000_000_000;
    Duration::from_secs(unit - second % unit)
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
/// [`descriptors`], the one place both doors check it.
pub(crate) struct RequestDescriptor {
    pub(crate) entries: Vec<Entry>,
    /// `limit`: requests per unit and the unit's number.
    pub(crate) limit: Option<(u32, i32)>,
    pub(crate) hits_addend: Option<u64>,
    pub(crate) is_negative_hits: bool,
}

/// Why an Envoy door does not answer a request.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// One of envoyproxy/ratelimit's own refusals (an empty domain, no
    /// descriptors), with its words. It returns them as plain Go errors, so
    /// gRPC clients see `UNKNOWN`.
    Service(RequestError),
    /// What Tollgate refuses beyond it (`INVALID_ARGUMENT`): negative hits,
    /// an override's unit it cannot name or a quota it cannot keep, a
    /// request larger than the enforcer takes.
    Invalid(String),
}

impl From<RequestError> for Refusal {
    fn from(error: RequestError) -> Self {
        match error {
            RequestError::EmptyDomain | RequestError::NoDescriptors => Refusal::Service(error),
            other => Refusal::Invalid(other.to_string()),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Service(error) => error.fmt(f),
            Refusal::Invalid(reason) => f.write_str(reason),
        }
    }
}

/// The descriptors of a request to `domain`, as the enforcer takes them.
///
/// # Errors
///
/// An empty domain first, as envoyproxy/ratelimit checks it before it reads
/// anything else; then the first descriptor asking to subtract hits, or
/// whose override names no unit.
pub(crate) fn descriptors(
    domain: &str,
    descriptors: impl IntoIterator<Item = RequestDescriptor>,
) -> Result<Vec<Descriptor>, Refusal> {
    if domain.is_empty() {
        return Err(RequestError::EmptyDomain.into());
    }
    descriptors
        .into_iter()
        .enumerate()
        .map(|(index, d)| d.into_descriptor(index).map_err(Refusal::Invalid))
        .collect()
}

impl RequestDescriptor {
    /// The descriptor, or why descriptor `index` cannot be checked: negative
    /// hits, or an override whose unit has no name.
    fn into_descriptor(self, index: usize) -> Result<Descriptor, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `utils.CalculateReset` as envoyproxy/ratelimit's
    /// `test/service/ratelimit_test.go` runs it (its clock at 2222 s: a
    /// minute's reset header says 58), and at window edges.
    #[test]
    fn window_ends_are_whole_seconds_from_the_current_second() {
        let at = |seconds: u64, nanos: u64| seconds * 1_000_000_000 + nanos;
        for (unit, now, seconds) in [
            (Unit::Minute, at(2222, 0), 58),
            (Unit::Minute, at(2222, 999_999_999), 58),
            (Unit::Second, at(2222, 0), 1),
            (Unit::Second, at(2222, 500_000_000), 1),
            (Unit::Minute, at(2220, 0), 60),
            (Unit::Minute, at(2279, 999_999_999), 1),
            (Unit::Hour, at(3600 * 5 + 1, 0), 3599),
            (Unit::Day, at(86_400 + 7, 0), 86_393),
            // Weeks, months and years are aligned to the epoch too.
            (Unit::Week, at(604_800 * 3 + 100, 0), 604_700),
            (Unit::Month, at(2_592_000 + 1, 0), 2_591_999),
            (Unit::Year, at(0, 0), 31_536_000),
        ] {
            assert_eq!(
                until_window_end(unit, now),
                Duration::from_secs(seconds),
                "{unit} at {now}"
            );
        }
    }
}
