use std::collections::VecDeque;

use crate::{Decision, Nanos, Quota, StateMachine};

/// A sliding log's state: the admissions that were inside the window at the
/// latest admission, oldest first.
///
/// Admissions that have left the window since are dropped at the next
/// admission, not before: reads and denies leave the state as it was.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// `(time, cost)` of each admission; equal times are merged.
    pub entries: VecDeque<(Nanos, u64)>,
    /// The sum of the costs in `entries`.
    pub total: u64,
}

/// The exact sliding window log: a request is admitted when the cost admitted in
/// `(now − period, now]` plus its own is at most `limit`. Memory grows with the
/// admissions in a window; it is the reference the other algorithms are measured
/// against. A clock that goes backwards is read as the latest time seen (the
/// latest admission).
#[derive(Debug, Clone, Copy, Default)]
pub struct SlidingLog;

impl StateMachine for SlidingLog {
    type State = Log;

    fn step(&self, quota: &Quota, state: &mut Log, now: Nanos, cost: u64) -> Decision {
        let period = quota.period_ns();
        let limit = quota.limit();
        let now = state.entries.back().map_or(now, |&(t, _)| now.max(t));
        // An admission at t counts while `now - t < period` (now >= t here). The
        // sum `t + period` saturated near u64::MAX and let such an admission
        // expire early, admitting twice the limit at the end of time.
        //
        // The expired prefix is skipped here and dropped only on an admission. A
        // read or a deny that dropped it changed the state, and, once it dropped
        // the newest entry, forgot the latest time seen: a clock going back after
        // it was then read as the earlier time, admitting more than at the latest.
        let expired = state.entries.partition_point(|&(t, _)| now - t >= period);
        let total = state.total - state.entries.range(..expired).map(|&(_, c)| c).sum::<u64>();
        let newest = state.entries.range(expired..).next_back().map(|&(t, _)| t);
        // Back to full when the newest admission leaves: exact, even past u64::MAX.
        let reset_after = |newest: Option<Nanos>| newest.map_or(0, |t| period - (now - t));
        match total.checked_add(cost).filter(|&c| c <= limit) {
            Some(after) => {
                let newest = if cost > 0 {
                    state.entries.drain(..expired);
                    match state.entries.back_mut() {
                        Some((t, c)) if *t == now => *c += cost,
                        _ => state.entries.push_back((now, cost)),
                    }
                    state.total = after;
                    Some(now)
                } else {
                    newest
                };
                Decision::allow_ns(limit, limit - after, reset_after(newest))
            }
            None => {
                let live = state.entries.range(expired..);
                let retry = (cost <= limit)
                    .then(|| retry_after(live, total, limit, cost, period, now))
                    .flatten();
                Decision::deny_ns(
                    limit,
                    limit.saturating_sub(total),
                    reset_after(newest),
                    retry,
                )
            }
        }
    }
}

/// The time until enough of the oldest admissions in the window (`live`, whose
/// costs sum to `total`) have left it for `cost` to fit; `None` if that moment
/// is past the end of time.
fn retry_after<'a>(
    live: impl Iterator<Item = &'a (Nanos, u64)>,
    mut total: u64,
    limit: u64,
    cost: u64,
    period: Nanos,
    now: Nanos,
) -> Option<Nanos> {
    for &(t, c) in live {
        total -= c;
        // Not `total + cost <= limit`: both may be near u64::MAX.
        if cost <= limit - total {
            return t.checked_add(period).map(|leaves| leaves - now);
        }
    }
    unreachable!("the cost fits once the window is empty")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn admits_exactly_limit_in_any_sliding_period() {
        let q = Quota::per_second(3).unwrap();
        let mut s = Log::default();
        for t in [0, 100, 200] {
            assert!(SlidingLog.step(&q, &mut s, t * 1_000_000, 1).allowed());
        }
        let d = SlidingLog.step(&q, &mut s, 999_000_000, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1)));
        assert!(SlidingLog.step(&q, &mut s, 1_000_000_000, 1).allowed());
        assert!(!SlidingLog.step(&q, &mut s, 1_000_000_000, 1).allowed());
    }

    #[test]
    fn a_big_cost_waits_for_several_entries() {
        let q = Quota::per_second(4).unwrap();
        let mut s = Log::default();
        for t in [0, 10, 20, 30] {
            assert!(SlidingLog.step(&q, &mut s, t, 1).allowed());
        }
        let d = SlidingLog.step(&q, &mut s, 40, 3);
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_nanos(1_000_000_000 + 20 - 40))
        );
    }
}
