//! Load shedding by priority tier: which [`Tier`] a request is in, and the
//! pure decision of whether a utilization sheds it ([`Thresholds`]). Every
//! shedder decides with these: the one in front of an upstream (in flight
//! over a learned limit) and the enforcer's (a utilization the protected
//! service reports), so a tier is shed alike at every door.

/// A request's priority tier: the lowest is shed first as the protected
/// service fills, critical last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Shed last: what the business cannot lose (Stripe's charges).
    Critical,
    /// Shed before critical.
    High,
    /// Shed first (Stripe's webhooks, test traffic); a request that names
    /// no tier, or one that is not known, is low.
    Low,
}

impl Tier {
    /// Every tier, most important first.
    pub const ALL: [Tier; 3] = [Tier::Critical, Tier::High, Tier::Low];

    /// The tier a value names (`critical`, `high` or `low`, in any case);
    /// anything else is [`Tier::Low`], so a client cannot raise its priority
    /// by sending a value that is not known.
    pub fn from_header(value: &[u8]) -> Self {
        if value.eq_ignore_ascii_case(b"critical") {
            Tier::Critical
        } else if value.eq_ignore_ascii_case(b"high") {
            Tier::High
        } else {
            Tier::Low
        }
    }

    /// The tier's name: `critical`, `high` or `low`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Critical => "critical",
            Tier::High => "high",
            Tier::Low => "low",
        }
    }

    /// The tier's place in [`Tier::ALL`], to index counters by tier.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The utilization (in percent) each tier may fill: a request is shed when
/// the utilization with it counted is past its tier's threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// The utilization critical requests may fill (100 by default).
    pub critical: u32,
    /// The utilization high-priority requests may fill (75 by default).
    pub high: u32,
    /// The utilization low-priority requests may fill (50 by default).
    pub low: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            critical: 100,
            high: 75,
            low: 50,
        }
    }
}

/// Thresholds that would shed a tier before a lower one, or none at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "thresholds must be percentages from 1 to 100 with critical >= high >= low (got {}, {}, {})",
    .0.critical, .0.high, .0.low
)]
pub struct ThresholdsError(pub Thresholds);

impl Thresholds {
    /// The thresholds, if each is 1–100 % and no tier is shed before a lower
    /// one.
    ///
    /// # Errors
    ///
    /// [`ThresholdsError`] otherwise.
    pub fn validate(self) -> Result<Self, ThresholdsError> {
        let Thresholds {
            critical,
            high,
            low,
        } = self;
        if (1..=100).contains(&critical) && (1..=high).contains(&low) && high <= critical {
            Ok(self)
        } else {
            Err(ThresholdsError(self))
        }
    }

    /// The threshold of `tier`, in percent.
    pub fn of(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Critical => self.critical,
            Tier::High => self.high,
            Tier::Low => self.low,
        }
    }

    /// Whether a request of `tier` may pass at `utilization` percent (its
    /// own share counted): at or below its tier's threshold.
    pub fn admits(&self, tier: Tier, utilization: u32) -> bool {
        utilization <= self.of(tier)
    }
}

/// How full a protected service is, in whole percent (100 is full; more is
/// past capacity), as the service reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Utilization(u32);

/// A utilization that is not a finite, non-negative number, or a limit of 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UtilizationError(String);

impl Utilization {
    /// A utilization of `percent`.
    pub fn from_percent(percent: u32) -> Self {
        Self(percent)
    }

    /// A utilization given as a fraction (`0.8` is 80 %), rounded down to a
    /// whole percent as the in-flight shedder rounds; large values saturate.
    ///
    /// # Errors
    ///
    /// A negative, infinite or NaN fraction.
    pub fn from_fraction(fraction: f64) -> Result<Self, UtilizationError> {
        if !fraction.is_finite() || fraction < 0.0 {
            return Err(UtilizationError(format!(
                "utilization must be a finite number >= 0 (0.8 is 80 %), got {fraction}"
            )));
        }
        // Rounded to a hundredth of a percent first, so that 0.07 (which is
        // 7.000000000000001 % in binary) is 7 % and 0.57 is 57 %, not 56.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let basis_points = (fraction * 10_000.0).round().min(f64::from(u32::MAX)) as u32;
        Ok(Self(basis_points / 100))
    }

    /// `in_flight` requests against a concurrency `limit`, rounded down to a
    /// whole percent, saturating.
    ///
    /// # Errors
    ///
    /// A `limit` of 0.
    pub fn from_in_flight(in_flight: u64, limit: u64) -> Result<Self, UtilizationError> {
        if limit == 0 {
            return Err(UtilizationError("limit must be at least 1".to_owned()));
        }
        let percent = u128::from(in_flight) * 100 / u128::from(limit);
        Ok(Self(u32::try_from(percent).unwrap_or(u32::MAX)))
    }

    /// The utilization in percent.
    pub fn percent(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_tier_is_shed_first_and_critical_last() {
        let thresholds = Thresholds::default();
        let admitted = |utilization| Tier::ALL.map(|tier| thresholds.admits(tier, utilization));
        assert_eq!(admitted(0), [true, true, true]);
        assert_eq!(admitted(50), [true, true, true], "a threshold is inclusive");
        assert_eq!(admitted(51), [true, true, false]);
        assert_eq!(admitted(76), [true, false, false]);
        assert_eq!(admitted(100), [true, false, false]);
        assert_eq!(admitted(101), [false, false, false]);
        assert_eq!(admitted(u32::MAX), [false, false, false]);
    }

    #[test]
    fn thresholds_out_of_order_or_range_are_refused() {
        for (critical, high, low) in [(100, 90, 95), (90, 100, 50), (101, 90, 75), (100, 90, 0)] {
            let thresholds = Thresholds {
                critical,
                high,
                low,
            };
            assert_eq!(thresholds.validate(), Err(ThresholdsError(thresholds)));
        }
        assert!(Thresholds::default().validate().is_ok());
    }

    #[test]
    fn unknown_tiers_are_low() {
        for (value, tier) in [
            (&b"critical"[..], Tier::Critical),
            (b"HIGH", Tier::High),
            (b"low", Tier::Low),
            (b"urgent", Tier::Low),
            (b"", Tier::Low),
        ] {
            assert_eq!(Tier::from_header(value), tier);
        }
    }

    #[test]
    fn utilization_is_read_as_a_fraction_or_in_flight_over_a_limit() {
        let percent = |f| Utilization::from_fraction(f).map(Utilization::percent);
        assert_eq!(percent(0.0), Ok(0));
        assert_eq!(percent(0.07), Ok(7));
        assert_eq!(percent(0.57), Ok(57));
        assert_eq!(
            percent(0.509),
            Ok(50),
            "rounded down, as the shedder rounds"
        );
        assert_eq!(percent(1.5), Ok(150), "past capacity is kept");
        assert_eq!(percent(1e300), Ok(u32::MAX / 100), "saturates");
        for bad in [-0.1, f64::NAN, f64::INFINITY] {
            assert!(Utilization::from_fraction(bad).is_err(), "{bad}");
        }
        let in_flight = |n, limit| Utilization::from_in_flight(n, limit).map(Utilization::percent);
        assert_eq!(in_flight(3, 4), Ok(75));
        assert_eq!(in_flight(u64::MAX, 1), Ok(u32::MAX));
        assert!(in_flight(1, 0).is_err());
    }
}
