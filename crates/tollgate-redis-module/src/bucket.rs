//! `TOLLGATE.GCRA`, `TOLLGATE.TOKENBUCKET` and `TOLLGATE.LEAKYBUCKET`: one
//! bucket's step (`step`) on the state tollgate-redis's Lua code keeps, with
//! its arguments as a person types them (a limit per period, a burst).
//!
//! The emission interval is rounded up to a whole microsecond as the store
//! rounds it before calling the code, so that both paths step alike.

use std::time::Duration;

use tollgate_core::{Quota, parse_duration};

use crate::step::{END_US, GCRA, LEAKY, Limit, State, TOKEN_BUCKET};

/// The bucket a command steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Gcra,
    TokenBucket,
    LeakyBucket,
}

impl Kind {
    pub(crate) fn usage(self) -> &'static str {
        match self {
            Kind::Gcra => {
                "ERR usage: TOLLGATE.GCRA <key> <limit> <period> <burst> [<cost>] [AT <unix time in us>] [PAD <ms>]"
            }
            Kind::TokenBucket => {
                "ERR usage: TOLLGATE.TOKENBUCKET <key> <limit> <period> <burst> [<cost>] [AT <unix time in us>] [PAD <ms>]"
            }
            Kind::LeakyBucket => {
                "ERR usage: TOLLGATE.LEAKYBUCKET <key> <limit> <period> <burst> [<cost>] [AT <unix time in us>] [PAD <ms>]"
            }
        }
    }
}

/// The largest count (limit, burst) the Lua code takes: 2^52, so that its
/// doubles stay exact (tollgate-redis refuses larger quotas alike).
const MAX_COUNT: u64 = 1 << 52;

/// A parsed `TOLLGATE.GCRA`, `TOLLGATE.TOKENBUCKET` or `TOLLGATE.LEAKYBUCKET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    limit: Limit,
    /// The caller's time in µs, else Redis's clock.
    at_us: Option<u64>,
    /// Milliseconds added to the TTL of what it writes.
    pad_ms: u64,
}

/// The answer: allowed, remaining, reset after (µs), retry after (µs, -1
/// when none) and the time decided at (µs).
pub(crate) type Answer = [i64; 5];

/// A new state to store, with its TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) state: State,
    pub(crate) ttl: Duration,
}

/// Parses the arguments after the key.
pub(crate) fn parse(kind: Kind, args: &[&[u8]]) -> Result<Step, String> {
    let usage = || kind.usage().to_owned();
    let (quota_args, rest) = match args {
        [l, p, b, rest @ ..] => ([*l, *p, *b], rest),
        _ => return Err(usage()),
    };
    // An optional cost, then options: AT <µs>, PAD <ms>.
    let (cost, mut options) = match rest {
        [c, options @ ..] if options.len() % 2 == 0 => (count("cost", c)?, options),
        options => (1, options),
    };
    let (mut at, mut pad_ms) = (None, 0);
    while let [name, value, more @ ..] = options {
        if name.eq_ignore_ascii_case(b"AT") {
            at = Some(*value);
        } else if name.eq_ignore_ascii_case(b"PAD") {
            pad_ms = count("PAD", value)?;
        } else {
            return Err(usage());
        }
        options = more;
    }
    if !options.is_empty() {
        return Err(usage());
    }
    let at_us = at.map(|t| count("AT", t)).transpose()?;
    if at_us.is_some_and(|t| t >= END_US) {
        return Err(format!(
            "ERR AT must be below 2^53 us, got {}",
            at_us.unwrap_or(0)
        ));
    }
    let [limit, period, burst] = quota_args;
    let limit = count("limit", limit)?;
    let burst = count("burst", burst)?;
    if limit > MAX_COUNT || burst > MAX_COUNT {
        return Err("ERR limit and burst must be at most 2^52".to_owned());
    }
    let period = std::str::from_utf8(period)
        .ok()
        .and_then(|p| parse_duration(p).ok())
        .ok_or_else(|| {
            format!(
                "ERR period must be a duration such as 1s, 250ms or 100us, got {}",
                period.escape_ascii()
            )
        })?;
    let quota = Quota::new(limit, period)
        .and_then(|q| q.with_burst(burst))
        .and_then(|q| {
            // The interval the store sends the code: whole µs, rounded up.
            let emission_us = q.emission_ns().div_ceil(1000);
            Quota::new(1, Duration::from_micros(emission_us))?.with_burst(burst)
        })
        .map_err(|e| format!("ERR {e}"))?;
    if quota.emission_ns() * quota.burst() / 1000 >= END_US {
        return Err("ERR burst x emission interval must be below 2^53 us".to_owned());
    }
    let alg = match kind {
        Kind::Gcra => GCRA,
        Kind::TokenBucket => TOKEN_BUCKET,
        Kind::LeakyBucket => LEAKY,
    };
    Ok(Step {
        limit: Limit {
            alg,
            limit: quota.limit(),
            period: quota.period_ns() / 1000,
            burst: quota.burst(),
            emission: quota.emission_ns() / 1000,
            cost,
            delay_after: 0,
        },
        at_us,
        pad_ms,
    })
}

fn count(name: &str, arg: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "ERR {name} must be a whole number of 0 or more, got {}",
                arg.escape_ascii()
            )
        })
}

impl Step {
    /// The time to decide at: the caller's, else `clock_us`.
    pub(crate) fn at(&self, clock_us: u64) -> u64 {
        self.at_us.unwrap_or(clock_us)
    }

    /// Decides at `now_us` on the stored value (`None`: no key); an error
    /// for a value that is not this bucket's state.
    pub(crate) fn decide(
        &self,
        stored: Option<&[u8]>,
        now_us: u64,
    ) -> Result<(Answer, Option<Write>), String> {
        let stepped = self.limit.step(stored, now_us, true)?;
        let v = stepped.verdict;
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let answer = [
            i64::from(v.allowed),
            int(v.remaining),
            int(v.reset),
            v.retry.map_or(-1, int),
            now_us as i64,
        ];
        let write = stepped.write.map(|(state, ttl_us)| Write {
            state,
            ttl: Duration::from_micros(ttl_us) + Duration::from_millis(self.pad_ms),
        });
        Ok((answer, write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(args: &[&str]) -> Result<Step, String> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        parse(Kind::Gcra, &args)
    }

    #[test]
    fn emission_rounds_up_to_whole_microseconds() {
        // 3 per second: 333,333.34 µs, so 333,334 µs a unit, as the store sends it.
        let s = step(&["3", "1s", "1"]).unwrap();
        let (a, w) = s.decide(None, 10_000_000).unwrap();
        assert_eq!(a, [1, 0, 333_334, -1, 10_000_000]);
        assert_eq!(w.unwrap().state, State::Int(10_333_334));
        let (a, w) = s.decide(Some(b"10333334"), 10_000_001).unwrap();
        assert_eq!(a, [0, 0, 333_333, 333_333, 10_000_001]);
        assert!(w.is_none());
    }

    #[test]
    fn refuses_bad_arguments() {
        let usage = Kind::Gcra.usage();
        assert_eq!(step(&["1", "1s"]).unwrap_err(), usage);
        assert_eq!(step(&["1", "1s", "1", "1", "AT"]).unwrap_err(), usage);
        assert!(
            step(&["0", "1s", "1"])
                .unwrap_err()
                .contains("limit must be at least 1")
        );
        assert!(
            step(&["1", "1", "1"])
                .unwrap_err()
                .contains("period must be a duration")
        );
        assert!(
            step(&["1", "1s", "-1"])
                .unwrap_err()
                .contains("burst must be a whole")
        );
        assert!(
            step(&["1", "1s", "1", "1", "AT", "9007199254740992"])
                .unwrap_err()
                .contains("below 2^53")
        );
        assert_eq!(step(&["1", "1s", "1"]).unwrap().at(7), 7);
        assert_eq!(step(&["1", "1s", "1", "PAD", "9"]).unwrap().pad_ms, 9);
        assert_eq!(
            step(&["1", "1s", "1", "PAD", "9", "X", "1"]).unwrap_err(),
            usage
        );
        let s = step(&["1", "1s", "1", "2", "at", "5"]).unwrap();
        assert_eq!(
            (s.limit.cost, s.limit.emission, s.at_us),
            (2, 1_000_000, Some(5))
        );
    }

    #[test]
    fn a_token_bucket_starts_full() {
        let tb = parse(Kind::TokenBucket, &[b"2", b"1s", b"2"]).unwrap();
        assert!(tb.decide(Some(b"12345"), 0).is_err());
        let (a, w) = tb.decide(None, 1_000_000).unwrap();
        assert_eq!(a, [1, 1, 500_000, -1, 1_000_000]);
        assert_eq!(w.unwrap().state, State::pair(1_000_000, 500_000));
    }

    #[test]
    fn a_leaky_bucket_is_a_pair_that_starts_empty() {
        let lb = parse(Kind::LeakyBucket, &[b"2", b"1s", b"2"]).unwrap();
        let (a, w) = lb.decide(None, 1_000_000).unwrap();
        assert_eq!(a, [1, 1, 500_000, -1, 1_000_000]);
        // Last leak at the check, level one unit (500 ms of draining).
        assert_eq!(w.unwrap().state, State::pair(1_000_000, 500_000));
        let State::Packed { bytes, len } = State::pair(1_000_000, 1_000_000) else {
            panic!("a pair is packed");
        };
        let (a, w) = lb.decide(Some(&bytes[..len]), 1_000_000).unwrap();
        assert_eq!(a, [0, 0, 1_000_000, 500_000, 1_000_000]);
        assert!(w.is_none());
    }
}
