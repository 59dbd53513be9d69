//! The Lua script's arguments and replies: quotas in microseconds, validated so
//! that every number the script handles is exact in a double.

use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Limit, Quota, StoreError};

/// The largest count (limit, burst, cost) the script handles: 2^52, so that a
/// sum of two is still exact in a double.
pub(crate) const MAX_COUNT: u64 = 1 << 52;
/// The largest duration, in microseconds, the script handles (2^52 µs, about
/// 142 years), so that a time (below 2^53 µs until the year 2255) plus a
/// duration stays within the exact range of a double.
pub(crate) const MAX_MICROS: u64 = 1 << 52;

/// A limit as the script sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Params {
    pub(crate) code: u8,
    pub(crate) limit: u64,
    pub(crate) period_us: u64,
    pub(crate) burst: u64,
    pub(crate) emission_us: u64,
    pub(crate) cost: u64,
    pub(crate) delay_after: u64,
}

/// `ns` rounded up to whole microseconds.
pub(crate) fn micros_up(ns: u64) -> u64 {
    ns.div_ceil(1000)
}

/// Whether the script holds `q`'s numbers exactly; if not, why.
pub(crate) fn check(q: &Quota) -> Result<(), String> {
    let (period_us, emission_us) = (micros_up(q.period_ns()), micros_up(q.emission_ns()));
    let beyond = |what: String, bound: &str| {
        Err(format!(
            "{what}, beyond what the Redis store holds exactly ({bound})"
        ))
    };
    if q.limit() > MAX_COUNT || q.burst() > MAX_COUNT {
        return beyond(format!("limit {} / burst {}", q.limit(), q.burst()), "2^52");
    }
    if period_us > MAX_MICROS {
        return beyond(
            format!("period {:?}", q.period()),
            "2^52 µs, about 142 years",
        );
    }
    if q.burst()
        .checked_mul(emission_us)
        .is_none_or(|c| c > MAX_MICROS)
    {
        return beyond(
            format!("burst {} × emission interval {emission_us} µs", q.burst()),
            "2^52 µs, about 142 years",
        );
    }
    Ok(())
}

impl Params {
    /// Converts a limit to microseconds: the period and the emission interval are
    /// rounded up to whole microseconds (never looser than the quota), counts are
    /// kept. Quotas whose numbers the script could not hold exactly are refused.
    /// A hit counter counts its denies only when it is the request's one
    /// limit: beside others it is charged all or nothing, which is the fixed
    /// window's step on the same state, so it is sent as one (a cross-slot
    /// request's groups cannot tell on their own).
    pub(crate) fn new(limit: &Limit<'_>, alone: bool) -> Result<Self, StoreError> {
        let q: &Quota = &limit.quota;
        check(q).map_err(|why| StoreError::Invalid(format!("key {:?}: {why}", limit.key)))?;
        let (period_us, emission_us) = (micros_up(q.period_ns()), micros_up(q.emission_ns()));
        let delay_after = match limit.algorithm {
            // delay_after ≥ burst shapes nothing, whatever its size.
            Algorithm::LeakyBucketShaping { delay_after } => delay_after.min(q.burst()),
            _ => 0,
        };
        Ok(Self {
            code: match limit.algorithm {
                Algorithm::HitCounter if !alone => Algorithm::FixedWindow.index(),
                algorithm => algorithm.index(),
            },
            limit: q.limit(),
            period_us,
            burst: q.burst(),
            emission_us,
            // Any cost above every count is refused alike: clamping keeps it exact.
            cost: limit.cost.min(MAX_COUNT + 1),
            delay_after,
        })
    }

    /// Whether the script keeps an auxiliary key beside the state (and so
    /// takes two keys for this limit): a sliding log's total, a concurrency
    /// limiter's in-flight count.
    pub(crate) fn has_aux(&self) -> bool {
        self.code == Algorithm::SlidingLog.index() || self.code == Algorithm::Concurrency.index()
    }

    /// Appends the limit's part of a request argument: seven little-endian
    /// doubles (every value is at most 2^52 + 1, so exact).
    fn write(&self, out: &mut Vec<u8>) {
        for v in [
            u64::from(self.code),
            self.limit,
            self.period_us,
            self.burst,
            self.emission_us,
            self.cost,
            self.delay_after,
        ] {
            out.extend_from_slice(&(v as f64).to_le_bytes());
        }
    }
}

/// One request's script argument: its time in µs (`None`: Redis's `TIME`)
/// and number of limits as little-endian doubles, each limit's seven, then,
/// when it has a concurrency limit, the base of the lease ids as text.
pub(crate) fn request<'a>(
    now_us: Option<u64>,
    lease: &str,
    limits: impl ExactSizeIterator<Item = &'a Params>,
) -> Vec<u8> {
    let count = limits.len();
    let mut out = Vec::with_capacity(16 + 56 * count + lease.len());
    // Times are below 2^53 µs (checked by the caller): exact.
    let now = now_us.map_or(-1.0, |us| us as f64);
    out.extend_from_slice(&now.to_le_bytes());
    out.extend_from_slice(&(count as f64).to_le_bytes());
    let mut leases = false;
    for params in limits {
        params.write(&mut out);
        leases |= params.code == Algorithm::Concurrency.index();
    }
    if leases {
        out.extend_from_slice(lease.as_bytes());
    }
    out
}

/// Decodes a packed reply: little-endian doubles, each an integer.
pub(crate) fn decode(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as i64)
        .collect()
}

/// Parses a check reply, given the capacity of each limit checked:
/// `(now_us, all_allowed, decisions)`.
pub(crate) fn parse_check(
    reply: &[i64],
    capacities: &[u64],
) -> Result<(u64, bool, Vec<Decision>), StoreError> {
    let limits = capacities.len();
    if reply.len() != 2 + 5 * limits {
        return Err(StoreError::Backend {
            source: format!(
                "the script answered {} numbers for {limits} limits",
                reply.len()
            )
            .into(),
            retryable: false,
        });
    }
    let n = |i: usize| u64::try_from(reply[i]).unwrap_or(0);
    let us = |i: usize| Duration::from_micros(n(i));
    let decisions = capacities
        .iter()
        .enumerate()
        .map(|(l, &limit)| {
            let o = 2 + 5 * l;
            let (remaining, reset_after) = (n(o + 1), us(o + 2));
            let decision = if reply[o] == 1 {
                Decision::allow(limit, remaining, reset_after)
            } else {
                let retry_after = (reply[o + 3] >= 0).then(|| us(o + 3));
                Decision::deny(limit, remaining, reset_after, retry_after)
            };
            decision.with_delay(us(o + 4))
        })
        .collect();
    Ok((n(0), reply[1] == 1, decisions))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(quota: Quota, algorithm: Algorithm, cost: u64) -> Limit<'static> {
        Limit {
            key: "k",
            quota,
            algorithm,
            cost,
            failure: tollgate_core::FailurePolicy::Local,
        }
    }

    #[test]
    fn quotas_are_converted_to_microseconds_rounding_up() {
        let q = Quota::per_second(3).unwrap(); // 333_333_334 ns per unit
        let p = Params::new(&limit(q, Algorithm::Gcra, 1), true).unwrap();
        assert_eq!((p.period_us, p.emission_us), (1_000_000, 333_334));
        let fast = Quota::new(10, Duration::from_nanos(10)).unwrap();
        let p = Params::new(&limit(fast, Algorithm::Gcra, 1), true).unwrap();
        assert_eq!(
            (p.period_us, p.emission_us),
            (1, 1),
            "at most one unit per µs"
        );
    }

    #[test]
    fn numbers_beyond_exact_doubles_are_refused_or_clamped() {
        let huge = Quota::new(1 << 53, Duration::from_secs(1 << 30)).unwrap();
        assert!(matches!(
            Params::new(&limit(huge, Algorithm::FixedWindow, 1), true),
            Err(StoreError::Invalid(_))
        ));
        let long = Quota::new(1, Duration::from_secs(200 * 365 * 86_400)).unwrap();
        assert!(Params::new(&limit(long, Algorithm::FixedWindow, 1), true).is_err());
        let wide = Quota::per_second(1000)
            .unwrap()
            .with_burst(1 << 43)
            .unwrap();
        assert!(Params::new(&limit(wide, Algorithm::Gcra, 1), true).is_err());
        let ok = Quota::per_hour(1_000_000_000).unwrap();
        let p = Params::new(&limit(ok, Algorithm::SlidingCounter, u64::MAX), true).unwrap();
        assert_eq!(p.cost, MAX_COUNT + 1);
        let blob = request(Some(7), "ab-1", [p].iter());
        assert_eq!(
            blob.len(),
            16 + 56,
            "no lease base without a concurrency limit"
        );
        let slots = Params::new(&limit(ok, Algorithm::Concurrency, 1), true).unwrap();
        let leased = request(None, "ab-1", [p, slots].iter());
        assert_eq!(decode(&leased[..16]), [-1, 2], "Redis's TIME, two limits");
        assert_eq!(&leased[16 + 2 * 56..], b"ab-1");
        assert_eq!(
            decode(&blob[..16 + 56]),
            [
                7,
                1,
                6,
                1_000_000_000,
                3_600_000_000,
                1_000_000_000,
                4,
                (MAX_COUNT + 1) as i64,
                0
            ]
        );
    }
}
