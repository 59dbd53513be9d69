//! `TOLLGATE.GCRA`, `TOLLGATE.TOKENBUCKET` and `TOLLGATE.LEAKYBUCKET`: one
//! step of a bucket on the state tollgate-redis's Lua code keeps, so
//! instances calling the code and the module on one key agree.
//!
//! The states are the code's: GCRA's theoretical arrival time in whole
//! microseconds, a decimal integer (`P:gcra2:{T}` when tollgate-redis names
//! the key); the token bucket's last refill and tokens (µs of refill), packed
//! little-endian in 12 bytes (7 + 5) while the tokens are below 2^40, else
//! as two doubles (`P:tb2:{T}`); the policing leaky bucket's last leak and
//! level, packed alike (`P:lb2:{T}`). Times are microseconds because the Lua's
//! numbers are doubles; the emission interval is rounded up to a whole
//! microsecond as the store rounds it before calling the code, and the step
//! is tollgate-core's on those microseconds expressed in nanoseconds, so
//! every result is a whole number of microseconds.

use std::time::Duration;

use tollgate_core::{
    Gcra, LeakyBucket, Level, Quota, StateMachine, Tat, TokenBucket, Tokens, parse_duration,
};

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
/// The Lua's end of time: 2^53 µs (the year 2255).
const END_US: u64 = 1 << 53;

/// A parsed `TOLLGATE.GCRA` or `TOLLGATE.TOKENBUCKET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    kind: Kind,
    quota: Quota,
    cost: u64,
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

/// A state as the Lua code writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// A decimal integer (GCRA's TAT, µs).
    Int(u64),
    /// Packed bytes (the token bucket's pair): the first `len` of them.
    Packed { bytes: [u8; 16], len: usize },
}

/// The token bucket's tokens the 12-byte form holds: below 2^40.
const COMPACT: u64 = 1 << 40;

impl State {
    fn pair(time: u64, amount: u64) -> Self {
        let mut bytes = [0; 16];
        if amount < COMPACT {
            bytes[..7].copy_from_slice(&time.to_le_bytes()[..7]);
            bytes[7..12].copy_from_slice(&amount.to_le_bytes()[..5]);
            State::Packed { bytes, len: 12 }
        } else {
            // Both below 2^53: exact as doubles.
            bytes[..8].copy_from_slice(&(time as f64).to_le_bytes());
            bytes[8..].copy_from_slice(&(amount as f64).to_le_bytes());
            State::Packed { bytes, len: 16 }
        }
    }
}

/// A (time, amount) pair as the code packs it; `None` for anything else.
fn unpack_pair(v: &[u8]) -> Option<(u64, u64)> {
    let le = |b: &[u8]| {
        let mut x = [0; 8];
        x[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(x)
    };
    let double = |b: &[u8]| {
        let d = f64::from_le_bytes(b.try_into().ok()?);
        (d >= 0.0 && d <= END_US as f64 && d.fract() == 0.0).then_some(d as u64)
    };
    match v.len() {
        12 => Some((le(&v[..7]), le(&v[7..]))),
        16 => Some((double(&v[..8])?, double(&v[8..])?)),
        _ => None,
    }
}

/// A decimal integer; `None` for anything else.
pub(crate) fn decimal(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
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
    Ok(Step {
        kind,
        quota,
        cost,
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
        let now = now_us * 1000;
        let not_state = || "ERR the key does not hold this algorithm's state".to_owned();
        let (d, state) = match self.kind {
            Kind::Gcra => {
                let tat_us = stored
                    .map(|v| decimal(v).ok_or_else(not_state))
                    .transpose()?;
                let mut tat = Tat(tat_us.unwrap_or(0).saturating_mul(1000));
                let d = Gcra.step(&self.quota, &mut tat, now, self.cost);
                (d, State::Int(tat.0 / 1000))
            }
            Kind::TokenBucket => {
                let mut tokens = match stored {
                    Some(v) => {
                        let (last, held) = unpack_pair(v).ok_or_else(not_state)?;
                        Tokens {
                            tokens: held.saturating_mul(1000),
                            last: last.saturating_mul(1000),
                        }
                    }
                    None => Tokens::default(),
                };
                let d = TokenBucket.step(&self.quota, &mut tokens, now, self.cost);
                (d, State::pair(tokens.last / 1000, tokens.tokens / 1000))
            }
            Kind::LeakyBucket => {
                let mut level = match stored {
                    Some(v) => {
                        let (last, held) = unpack_pair(v).ok_or_else(not_state)?;
                        Level {
                            level: held.saturating_mul(1000),
                            last: last.saturating_mul(1000),
                        }
                    }
                    None => Level::default(),
                };
                let d = LeakyBucket.step(&self.quota, &mut level, now, self.cost);
                (d, State::pair(level.last / 1000, level.level / 1000))
            }
        };
        let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let answer = [
            i64::from(d.allowed()),
            i64::try_from(d.remaining()).unwrap_or(i64::MAX),
            micros(d.reset_after()),
            d.retry_after().map_or(-1, micros),
            now_us as i64,
        ];
        let write = (d.allowed() && self.cost > 0).then(|| Write {
            state,
            ttl: d.reset_after() + Duration::from_millis(self.pad_ms),
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
        assert_eq!(
            step(&["1", "1s", "1", "2", "at", "5"]).unwrap(),
            Step {
                kind: Kind::Gcra,
                quota: Quota::per_second(1).unwrap(),
                cost: 2,
                at_us: Some(5),
                pad_ms: 0,
            }
        );
    }

    #[test]
    fn token_bucket_pairs_are_packed_as_the_code_packs_them() {
        for (time, amount, len) in [(1_795_839_000_000_000, 999_999, 12), (5, COMPACT, 16)] {
            let State::Packed { bytes, len: l } = State::pair(time, amount) else {
                panic!("a pair is packed");
            };
            assert_eq!(l, len);
            assert_eq!(unpack_pair(&bytes[..l]), Some((time, amount)));
        }
        // struct.pack('<I7I5', 1, 2) in Redis's Lua.
        assert_eq!(
            unpack_pair(&[1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0]),
            Some((1, 2))
        );
        assert_eq!(unpack_pair(b"123"), None);
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
