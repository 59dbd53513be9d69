use std::num::NonZeroU64;
use std::time::Duration;

use crate::Nanos;

/// Why a quota (or a cost against it) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit was zero; a limit that admits nothing is spelled as a deny rule, not a quota.
    #[error("limit must be at least 1")]
    ZeroLimit,
    /// The period was zero.
    #[error("period must be longer than zero")]
    ZeroPeriod,
    /// The burst was zero.
    #[error("burst must be at least 1")]
    ZeroBurst,
    /// The period does not fit in 64 bits of nanoseconds (about 584 years).
    #[error("period {period:?} is longer than the longest supported period (about 584 years)")]
    PeriodTooLong {
        /// The period asked for.
        period: Duration,
    },
    /// More than one unit per nanosecond: the emission interval would round to zero.
    #[error("rate {limit} per {period:?} is faster than one unit per nanosecond")]
    RateTooHigh {
        /// The limit asked for.
        limit: u64,
        /// The period asked for.
        period: Duration,
    },
    /// `burst × emission interval` overflows 64 bits of nanoseconds.
    #[error(
        "burst {burst} at one unit per {emission_ns} ns takes longer than about 584 years to refill"
    )]
    BurstTooLarge {
        /// The burst asked for.
        burst: u64,
        /// The emission interval of the quota, in nanoseconds.
        emission_ns: u64,
    },
    /// A fixed cost larger than the burst: such a request could never be admitted.
    #[error("cost {cost} exceeds the burst {burst}: such a request could never be admitted")]
    CostExceedsBurst {
        /// The cost asked for.
        cost: u64,
        /// The quota's burst.
        burst: u64,
    },
}

/// `limit` units per `period`, with a `burst` (capacity) that defaults to `limit`.
///
/// Bucket algorithms (token bucket, GCRA, both leaky buckets) admit up to `burst`
/// units at once and refill at `limit / period`; window algorithms admit `limit`
/// units per window and ignore `burst`. The refill rate is kept as an integer
/// *emission interval* of `ceil(period / limit)` nanoseconds per unit, so every
/// bucket computation is exact integer arithmetic; rounding up means a bucket can
/// only ever be stricter than the nominal rate, by less than one nanosecond per unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: NonZeroU64,
    period: NonZeroU64,
    burst: NonZeroU64,
    emission: NonZeroU64,
}

impl Quota {
    /// `limit` units per `period`, with `burst` equal to `limit`.
    pub fn new(limit: u64, period: Duration) -> Result<Self, QuotaError> {
        let limit = NonZeroU64::new(limit).ok_or(QuotaError::ZeroLimit)?;
        let period_ns =
            u64::try_from(period.as_nanos()).map_err(|_| QuotaError::PeriodTooLong { period })?;
        let period_ns = NonZeroU64::new(period_ns).ok_or(QuotaError::ZeroPeriod)?;
        if limit > period_ns {
            return Err(QuotaError::RateTooHigh {
                limit: limit.get(),
                period,
            });
        }
        let emission = NonZeroU64::new(period_ns.get().div_ceil(limit.get()))
            .expect("limit <= period, so the quotient is at least 1");
        Self {
            limit,
            period: period_ns,
            burst: limit,
            emission,
        }
        .validated()
    }

    /// `limit` units per second.
    pub fn per_second(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` units per minute.
    pub fn per_minute(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` units per hour.
    pub fn per_hour(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(3600))
    }

    /// The same rate with another burst (capacity).
    pub fn with_burst(self, burst: u64) -> Result<Self, QuotaError> {
        let burst = NonZeroU64::new(burst).ok_or(QuotaError::ZeroBurst)?;
        Self { burst, ..self }.validated()
    }

    fn validated(self) -> Result<Self, QuotaError> {
        self.burst
            .get()
            .checked_mul(self.emission.get())
            .map(|_| self)
            .ok_or(QuotaError::BurstTooLarge {
                burst: self.burst.get(),
                emission_ns: self.emission.get(),
            })
    }

    /// Refuses a fixed cost that no request could ever pay under this quota.
    pub fn check_cost(&self, cost: u64) -> Result<(), QuotaError> {
        if cost > self.burst.get().max(self.limit.get()) {
            return Err(QuotaError::CostExceedsBurst {
                cost,
                burst: self.burst.get(),
            });
        }
        Ok(())
    }

    /// Units admitted per period.
    pub fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// The period in nanoseconds.
    pub fn period_ns(&self) -> Nanos {
        self.period.get()
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period.get())
    }

    /// The capacity of the bucket algorithms.
    pub fn burst(&self) -> u64 {
        self.burst.get()
    }

    /// Nanoseconds per unit: `ceil(period / limit)`.
    pub fn emission_ns(&self) -> Nanos {
        self.emission.get()
    }

    /// Nanoseconds per unit, never zero.
    #[inline]
    pub(crate) fn emission(&self) -> NonZeroU64 {
        self.emission
    }

    /// The capacity expressed as the time a full bucket takes to drain: `burst × emission`.
    pub(crate) fn capacity_ns(&self) -> Nanos {
        // Checked when the quota was built.
        self.burst.get() * self.emission.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_every_field() {
        assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
        assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
        assert_eq!(
            Quota::per_second(1).unwrap().with_burst(0),
            Err(QuotaError::ZeroBurst)
        );
        assert!(matches!(
            Quota::new(1, Duration::MAX),
            Err(QuotaError::PeriodTooLong { .. })
        ));
        assert!(matches!(
            Quota::new(2, Duration::from_nanos(1)),
            Err(QuotaError::RateTooHigh { .. })
        ));
        assert!(matches!(
            Quota::new(1, Duration::from_nanos(u64::MAX))
                .unwrap()
                .with_burst(2),
            Err(QuotaError::BurstTooLarge { .. })
        ));
    }

    #[test]
    fn emission_interval_rounds_up() {
        let q = Quota::per_second(3).unwrap();
        assert_eq!(q.emission_ns(), 333_333_334);
        assert_eq!(q.capacity_ns(), 3 * 333_333_334);
        assert_eq!(Quota::per_second(1000).unwrap().emission_ns(), 1_000_000);
    }

    #[test]
    fn cost_above_burst_is_refused() {
        let q = Quota::per_second(10).unwrap().with_burst(5).unwrap();
        assert!(
            q.check_cost(10).is_ok(),
            "window algorithms admit up to the limit"
        );
        assert_eq!(
            q.check_cost(11),
            Err(QuotaError::CostExceedsBurst { cost: 11, burst: 5 })
        );
    }
}
