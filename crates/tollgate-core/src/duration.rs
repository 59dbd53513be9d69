use std::time::Duration;

/// Nanoseconds in one of each unit that [`parse_duration`] accepts.
const UNITS: [(&str, u64); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// A duration (in a config file or on the command line) that [`parse_duration`] could not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseDurationError {
    /// The text does not start with an integer amount.
    #[error(
        "invalid duration {text:?}: expected an integer followed by a unit, e.g. 250ms, 1s, 1m (units: ns, us, ms, s, m, h, d)"
    )]
    NotANumber {
        /// The text that was given.
        text: String,
    },
    /// The amount has no unit after it.
    #[error(
        "invalid duration {text:?}: missing unit, e.g. {text}ms or {text}s (units: ns, us, ms, s, m, h, d)"
    )]
    MissingUnit {
        /// The text that was given.
        text: String,
    },
    /// The amount has a fractional part.
    #[error(
        "invalid duration {text:?}: the amount must be an integer; use a smaller unit (e.g. 1500ms, not 1.5s)"
    )]
    Fraction {
        /// The text that was given.
        text: String,
    },
    /// The unit is not one of `ns`, `us`, `ms`, `s`, `m`, `h`, `d`.
    #[error("invalid duration {text:?}: unknown unit {unit:?} (units: ns, us, ms, s, m, h, d)")]
    UnknownUnit {
        /// The text that was given.
        text: String,
        /// The unit that was not recognised.
        unit: String,
    },
    /// The duration does not fit in 64 bits of nanoseconds.
    #[error("invalid duration {text:?}: longer than 2^64 ns (about 584 years)")]
    TooLong {
        /// The text that was given.
        text: String,
    },
}

/// Reads a duration written as an integer amount and a unit, with nothing
/// between or around them: `250ms`, `1s`, `1m`, `1h`, `15ns`, `100us`, `2d`.
///
/// Units are `ns`, `us` (or `µs`), `ms`, `s`, `m` (minutes), `h` and `d`
/// (24 hours). A bare number is refused rather than guessed at, and so are
/// fractions (`1.5s`: write `1500ms`). Zero is accepted here; whether a zero
/// period makes sense is for the quota to say.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tollgate_core::parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert!(tollgate_core::parse_duration("1").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, ParseDurationError> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (amount, unit) = text.split_at(digits);
    if amount.is_empty() {
        return Err(ParseDurationError::NotANumber {
            text: text.to_owned(),
        });
    }
    if unit.is_empty() {
        return Err(ParseDurationError::MissingUnit {
            text: text.to_owned(),
        });
    }
    if unit.starts_with(['.', ',']) {
        return Err(ParseDurationError::Fraction {
            text: text.to_owned(),
        });
    }
    let scale = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|&(_, ns)| ns)
        .ok_or_else(|| ParseDurationError::UnknownUnit {
            text: text.to_owned(),
            unit: unit.to_owned(),
        })?;
    let too_long = || ParseDurationError::TooLong {
        text: text.to_owned(),
    };
    // Only ASCII digits, so the parse fails only on overflow.
    let amount: u64 = amount.parse().map_err(|_| too_long())?;
    let ns = amount.checked_mul(scale).ok_or_else(too_long)?;
    Ok(Duration::from_nanos(ns))
}

/// Writes `ns` in the largest unit that divides it exactly, in the form that
/// [`parse_duration`] reads: `250ms`, `1s`, `90s`, `0s`.
pub fn format_duration(ns: u64) -> String {
    if ns == 0 {
        return "0s".to_owned();
    }
    let (unit, scale) = UNITS
        .iter()
        .rev()
        .filter(|(unit, _)| *unit != "µs")
        .find(|&&(_, scale)| ns.is_multiple_of(scale))
        .copied()
        .unwrap_or(("ns", 1));
    format!("{}{unit}", ns / scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_unit() {
        let cases = [
            ("15ns", Duration::from_nanos(15)),
            ("100us", Duration::from_micros(100)),
            ("100µs", Duration::from_micros(100)),
            ("250ms", Duration::from_millis(250)),
            ("1s", Duration::from_secs(1)),
            ("0s", Duration::ZERO),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("1d", Duration::from_secs(86_400)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        for (ns, text) in [
            (0, "0s"),
            (7, "7ns"),
            (250_000_000, "250ms"),
            (90_000_000_000, "90s"),
            (7_200_000_000_000, "2h"),
            (1_500, "1500ns"),
            (u64::MAX, "18446744073709551615ns"),
        ] {
            assert_eq!(format_duration(ns), text);
            assert_eq!(parse_duration(text), Ok(Duration::from_nanos(ns)));
        }
    }

    #[test]
    fn refuses_anything_else() {
        for text in [
            "", "1", "s", "1.5s", "-1s", "1 s", " 1s", "1s ", "1S", "1sec", "1ms5",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?} was accepted");
        }
        assert!(matches!(
            parse_duration("1"),
            Err(ParseDurationError::MissingUnit { .. })
        ));
        assert!(matches!(
            parse_duration("300000d"),
            Err(ParseDurationError::TooLong { .. })
        ));
        assert!(matches!(
            parse_duration("99999999999999999999999ns"),
            Err(ParseDurationError::TooLong { .. })
        ));
        assert!(matches!(
            parse_duration("1.5s"),
            Err(ParseDurationError::Fraction { .. })
        ));
        let message = parse_duration("5x").unwrap_err().to_string();
        assert!(message.contains("unknown unit \"x\""), "{message}");
    }
}
