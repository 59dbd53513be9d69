//! `CL.THROTTLE`: redis-cell 0.5.0's command, answered as it answers, so
//! that its users swap modules and keep their code.
//!
//! The state is redis-cell's too: the key itself holds the theoretical
//! arrival time in nanoseconds since 1970, a decimal integer, so a server
//! that loads this module in place of redis-cell keeps its limits' state.
//! The decision is tollgate-core's GCRA step, which admits exactly when
//! redis-cell does (`max(TAT, now) + c·T − now ≤ (max_burst + 1)·T`); only
//! `remaining` and the rounding to seconds are computed redis-cell's way.

use std::time::Duration;

use tollgate_core::{Gcra, Quota, StateMachine, Tat};

/// What `CL.THROTTLE` was asked, parsed and validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Throttle {
    quota: Quota,
    /// `max_burst + 1`: what redis-cell reports as the limit.
    limit: i64,
    cost: u64,
}

/// The five integers of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) limited: bool,
    pub(crate) limit: i64,
    pub(crate) remaining: i64,
    /// Seconds, -1 when admitted or when waiting cannot help.
    pub(crate) retry_after: i64,
    pub(crate) reset_after: i64,
}

impl Answer {
    pub(crate) fn to_array(self) -> [i64; 5] {
        [
            i64::from(self.limited),
            self.limit,
            self.remaining,
            self.retry_after,
            self.reset_after,
        ]
    }
}

/// The new TAT to store and how long it matters (its TTL), on an admission
/// that costs something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) tat_ns: u64,
    pub(crate) ttl: Duration,
}

pub(crate) const USAGE: &str =
    "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";

/// Parses the arguments after the key (`max_burst`, `count`, `period` in
/// seconds, optional `quantity`), with redis-cell's error messages for what
/// it refuses. What it accepts and answers nonsense for (a negative number,
/// a quota whose capacity overflows) is refused here, with its own message.
pub(crate) fn parse(args: &[&[u8]]) -> Result<Throttle, String> {
    let (max_burst, count, period, quantity) = match args {
        [b, c, p] => (int(b)?, int(c)?, int(p)?, 1),
        [b, c, p, q] => (int(b)?, int(c)?, int(p)?, int(q)?),
        _ => return Err(USAGE.to_owned()),
    };
    for (name, v) in [
        ("max_burst", max_burst),
        ("count per period", count),
        ("period", period),
        ("quantity", quantity),
    ] {
        if v < 0 {
            return Err(format!("Cell error: {name} must not be negative: {v}"));
        }
    }
    // redis-cell's emission interval: the period's nanoseconds over the
    // count, as a double, truncated (not tollgate-core's rounding up), so
    // that its answers come out the same.
    let period_ns = i128::from(period) * 1_000_000_000;
    let emission_ns = if count == 0 {
        0
    } else {
        (period_ns as f64 / count as f64) as u64
    };
    if emission_ns == 0 {
        return Err("Cell error: Zero rates are not supported".to_owned());
    }
    let limit = max_burst
        .checked_add(1)
        .ok_or_else(|| format!("Cell error: max_burst is too large: {max_burst}"))?;
    let quota = Quota::new(1, Duration::from_nanos(emission_ns))
        .and_then(|q| q.with_burst(limit as u64))
        .map_err(|e| format!("Cell error: {e}"))?;
    Ok(Throttle {
        quota,
        limit,
        cost: quantity as u64,
    })
}

fn int(arg: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "Cell error: Couldn't parse as integer: {}",
                arg.escape_ascii()
            )
        })
}

impl Throttle {
    /// Decides at `now_ns` (nanoseconds since 1970) on the stored TAT.
    pub(crate) fn decide(&self, tat_ns: Option<u64>, now_ns: u64) -> (Answer, Option<Write>) {
        let mut tat = Tat(tat_ns.unwrap_or(0));
        let d = Gcra.step(&self.quota, &mut tat, now_ns, self.cost);
        let ttl = d.reset_after();
        let emission = self.quota.emission_ns();
        let capacity = emission * self.quota.burst();
        // redis-cell counts what is left from whole microseconds, as a
        // double, and reports none once less than one unit is left.
        let next = capacity as i128 - ttl.as_nanos() as i128;
        let remaining = if next > -(emission as i128) {
            ((next / 1000) as f64 / (emission / 1000) as f64) as i64
        } else {
            0
        };
        let retry_after = match d.retry_after() {
            Some(r) if !d.allowed() => seconds_up(r),
            _ => -1,
        };
        let write = (d.allowed() && self.cost > 0).then_some(Write { tat_ns: tat.0, ttl });
        let answer = Answer {
            limited: !d.allowed(),
            limit: self.limit,
            remaining,
            retry_after,
            reset_after: seconds_up(ttl),
        };
        (answer, write)
    }
}

/// Whole seconds, plus one when a whole millisecond is left over: redis-cell
/// rounds that way (a part below a millisecond is dropped).
fn seconds_up(d: Duration) -> i64 {
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    if d.subsec_millis() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn throttle(args: &[&str]) -> Result<Throttle, String> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        parse(&args)
    }

    /// redis-cell's own table (`it_rate_limits` in src/cell/mod.rs): limit 5
    /// (max_burst 4), one per second, from a start time; each row is (time
    /// after start, quantity, remaining, reset_after, retry_after, limited).
    /// Its durations are exact there; here they go through the reply's
    /// rounding to seconds, so the expected seconds are derived from them.
    #[test]
    fn redis_cell_table() {
        let start = 1_700_000_000 * S;
        let rows: [(u64, i64, i64, u64, Option<u64>, bool); 15] = [
            (0, 6, 5, 0, None, true),
            (0, 1, 4, S, None, false),
            (0, 1, 3, 2 * S, None, false),
            (0, 1, 2, 3 * S, None, false),
            (0, 1, 1, 4 * S, None, false),
            (0, 1, 0, 5 * S, None, false),
            (0, 1, 0, 5 * S, Some(S), true),
            (3000 * MS, 1, 2, 3000 * MS, None, false),
            (3100 * MS, 1, 1, 3900 * MS, None, false),
            (4000 * MS, 1, 1, 4000 * MS, None, false),
            (8000 * MS, 1, 4, 1000 * MS, None, false),
            (9500 * MS, 1, 4, 1000 * MS, None, false),
            (9500 * MS, 0, 4, S, None, false),
            (9500 * MS, 2, 2, 3 * S, None, false),
            (9500 * MS, 5, 2, 3 * S, Some(3 * S), true),
        ];
        let mut tat = None;
        for (i, (at, quantity, remaining, reset, retry, limited)) in rows.into_iter().enumerate() {
            let t = throttle(&["4", "1", "1", &quantity.to_string()]).unwrap();
            let (answer, write) = t.decide(tat, start + at);
            let expected = [
                i64::from(limited),
                5,
                remaining,
                retry.map_or(-1, |r| seconds_up(Duration::from_nanos(r))),
                seconds_up(Duration::from_nanos(reset)),
            ];
            assert_eq!(answer.to_array(), expected, "row {i}");
            if let Some(w) = write {
                assert_eq!(w.ttl, Duration::from_nanos(reset), "row {i}");
                tat = Some(w.tat_ns);
            }
        }
    }

    #[test]
    fn redis_cell_errors() {
        assert_eq!(throttle(&["1", "2"]).unwrap_err(), USAGE);
        assert_eq!(throttle(&["1", "2", "3", "4", "5"]).unwrap_err(), USAGE);
        assert_eq!(
            throttle(&["x", "2", "3"]).unwrap_err(),
            "Cell error: Couldn't parse as integer: x"
        );
        assert_eq!(
            throttle(&["1", "0", "3"]).unwrap_err(),
            "Cell error: Zero rates are not supported"
        );
        assert_eq!(
            throttle(&["1", "2", "0"]).unwrap_err(),
            "Cell error: Zero rates are not supported"
        );
        assert_eq!(
            throttle(&["1", "2", "3", "-1"]).unwrap_err(),
            "Cell error: quantity must not be negative: -1"
        );
        assert!(
            throttle(&[&i64::MAX.to_string(), "1", "1"])
                .unwrap_err()
                .starts_with("Cell error: max_burst is too large")
        );
        assert!(
            throttle(&[&(i64::MAX / 2).to_string(), "1", "100"])
                .unwrap_err()
                .starts_with("Cell error: burst")
        );
    }

    #[test]
    fn rounds_to_seconds_as_redis_cell() {
        assert_eq!(seconds_up(Duration::from_nanos(999_999)), 0);
        assert_eq!(seconds_up(Duration::from_millis(1)), 1);
        assert_eq!(seconds_up(Duration::from_millis(2_001)), 3);
        assert_eq!(seconds_up(Duration::from_secs(2)), 2);
    }
}
