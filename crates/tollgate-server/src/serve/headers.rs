//! Envoy's rate limit headers, for gRPC's `response_headers_to_add` (and so
//! `POST /json`), as envoyproxy/ratelimit makes them: the most restrictive
//! limit's `requests_per_unit`, what remains of it, and the seconds until it
//! resets. The native API's headers come from `tollgate_http::headers`, the
//! module every Tollgate HTTP surface shares.

use std::time::Duration;

use tollgate_policy::Verdict;

/// The most restrictive limit's `requests_per_unit`.
const LIMIT: &str = "X-RateLimit-Limit";
/// Units left after this request.
const REMAINING: &str = "X-RateLimit-Remaining";
/// Seconds until the limit is fully available again.
const RESET: &str = "X-RateLimit-Reset";

/// Whole seconds, rounded up, so a wait that is not over never reads as zero.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Whole milliseconds, rounded up.
pub(crate) fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// The headers for `verdict`, none when no limit applied.
pub(crate) fn envoy(verdict: &Verdict) -> Vec<(&'static str, String)> {
    let Some(reported) = verdict.most_restrictive() else {
        return Vec::new();
    };
    let (Some((requests_per_unit, _)), Some(decision)) = (reported.envoy_limit, reported.decision)
    else {
        return Vec::new();
    };
    // itoa rather than `to_string`: this runs on every gRPC check.
    let decimal = |n: u64| itoa::Buffer::new().format(n).to_owned();
    vec![
        (LIMIT, decimal(requests_per_unit)),
        (REMAINING, decimal(decision.remaining)),
        (RESET, decimal(ceil_secs(decision.reset_after))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
        assert_eq!(ceil_millis(Duration::from_micros(1_001)), 2);
        assert_eq!(ceil_millis(Duration::MAX), u64::MAX);
    }
}
