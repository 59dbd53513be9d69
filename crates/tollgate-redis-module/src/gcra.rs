//! `TOLLGATE.GCRA`: one GCRA step on the state tollgate-redis's Lua code
//! keeps, so instances calling the code and the module on one key agree.
//!
//! The state is the theoretical arrival time in whole microseconds, a decimal
//! integer (`P:gcra2:{T}` when tollgate-redis names the key). Times are
//! microseconds because the Lua's numbers are doubles; the emission interval
//! is rounded up to a whole microsecond as the store rounds it before calling
//! the code, and the step is tollgate-core's on those microseconds expressed
//! in nanoseconds, so every result is a whole number of microseconds.

use std::time::Duration;

use tollgate_core::{Gcra, Quota, StateMachine, Tat, parse_duration};

/// The largest count (limit, burst) the Lua code takes: 2^52, so that its
/// doubles stay exact (tollgate-redis refuses larger quotas alike).
const MAX_COUNT: u64 = 1 << 52;
/// The Lua's end of time: 2^53 µs (the year 2255).
const END_US: u64 = 1 << 53;

/// A parsed `TOLLGATE.GCRA`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    quota: Quota,
    cost: u64,
    /// The caller's time in µs, else Redis's clock.
    at_us: Option<u64>,
}

/// The answer: allowed, remaining, reset after (µs), retry after (µs, -1
/// when none) and the time decided at (µs).
pub(crate) type Answer = [i64; 5];

/// A new TAT (µs) to store, with its TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) tat_us: u64,
    pub(crate) ttl: Duration,
}

pub(crate) const USAGE: &str =
    "ERR usage: TOLLGATE.GCRA <key> <limit> <period> <burst> [<cost>] [AT <unix time in µs>]";

/// Parses the arguments after the key.
pub(crate) fn parse(args: &[&[u8]]) -> Result<Step, String> {
    let (quota_args, rest) = match args {
        [l, p, b, rest @ ..] => ([*l, *p, *b], rest),
        _ => return Err(USAGE.to_owned()),
    };
    let (cost, at) = match rest {
        [] => (1, None),
        [c] => (count("cost", c)?, None),
        [c, at, t] if at.eq_ignore_ascii_case(b"AT") => (count("cost", c)?, Some(*t)),
        [at, t] if at.eq_ignore_ascii_case(b"AT") => (1, Some(*t)),
        _ => return Err(USAGE.to_owned()),
    };
    let at_us = at.map(|t| count("AT", t)).transpose()?;
    if at_us.is_some_and(|t| t >= END_US) {
        return Err(format!(
            "ERR AT must be below 2^53 µs, got {}",
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
                String::from_utf8_lossy(period)
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
        return Err("ERR burst × emission interval must be below 2^53 µs".to_owned());
    }
    Ok(Step { quota, cost, at_us })
}

fn count(name: &str, arg: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "ERR {name} must be a whole number of 0 or more, got {}",
                String::from_utf8_lossy(arg)
            )
        })
}

impl Step {
    /// The time to decide at: the caller's, else `clock_us`.
    pub(crate) fn at(&self, clock_us: u64) -> u64 {
        self.at_us.unwrap_or(clock_us)
    }

    /// Decides at `now_us` on the stored TAT (µs).
    pub(crate) fn decide(&self, tat_us: Option<u64>, now_us: u64) -> (Answer, Option<Write>) {
        let mut tat = Tat(tat_us.unwrap_or(0).saturating_mul(1000));
        let d = Gcra.step(&self.quota, &mut tat, now_us * 1000, self.cost);
        let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let answer = [
            i64::from(d.allowed()),
            i64::try_from(d.remaining()).unwrap_or(i64::MAX),
            micros(d.reset_after()),
            d.retry_after().map_or(-1, micros),
            now_us as i64,
        ];
        let write = (d.allowed() && self.cost > 0).then(|| Write {
            tat_us: tat.0 / 1000,
            ttl: d.reset_after(),
        });
        (answer, write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(args: &[&str]) -> Result<Step, String> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        parse(&args)
    }

    #[test]
    fn emission_rounds_up_to_whole_microseconds() {
        // 3 per second: 333,333.34 µs, so 333,334 µs a unit, as the store sends it.
        let s = step(&["3", "1s", "1"]).unwrap();
        let (a, w) = s.decide(None, 10_000_000);
        assert_eq!(a, [1, 0, 333_334, -1, 10_000_000]);
        assert_eq!(w.unwrap().tat_us, 10_333_334);
        let (a, w) = s.decide(Some(10_333_334), 10_000_001);
        assert_eq!(a, [0, 0, 333_333, 333_333, 10_000_001]);
        assert!(w.is_none());
    }

    #[test]
    fn refuses_bad_arguments() {
        assert_eq!(step(&["1", "1s"]).unwrap_err(), USAGE);
        assert_eq!(step(&["1", "1s", "1", "1", "AT"]).unwrap_err(), USAGE);
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
        assert_eq!(
            step(&["1", "1s", "1", "2", "at", "5"]).unwrap(),
            Step {
                quota: Quota::per_second(1).unwrap(),
                cost: 2,
                at_us: Some(5)
            }
        );
    }
}
