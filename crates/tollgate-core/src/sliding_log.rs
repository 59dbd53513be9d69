use std::collections::VecDeque;

use crate::{Decision, Nanos, Quota, StateMachine};

/// A sliding log's state: the admissions still inside the window, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// `(time, cost)` of each admission in the window; equal times are merged.
    pub entries: VecDeque<(Nanos, u64)>,
    /// The sum of the costs in `entries`.
    pub total: u64,
}

/// The exact sliding window log: a request is admitted when the cost admitted in
/// `(now − period, now]` plus its own is at most `limit`. Memory grows with the
/// admissions in a window; it is the reference the other algorithms are measured
/// against. A clock that goes backwards is read as the latest time seen.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlidingLog;

impl StateMachine for SlidingLog {
    type State = Log;

    fn step(&self, quota: &Quota, state: &mut Log, now: Nanos, cost: u64) -> Decision {
        let period = quota.period_ns();
        let limit = quota.limit();
        let now = state.entries.back().map_or(now, |&(t, _)| now.max(t));
        // An admission at t counts while now < t + period.
        while let Some(&(t, c)) = state.entries.front() {
            if t.saturating_add(period) > now {
                break;
            }
            state.entries.pop_front();
            state.total -= c;
        }
        let reset_after = |log: &Log| {
            log.entries
                .back()
                .map_or(0, |&(t, _)| t.saturating_add(period) - now)
        };
        match state.total.checked_add(cost).filter(|&c| c <= limit) {
            Some(after) => {
                if cost > 0 {
                    match state.entries.back_mut() {
                        Some((t, c)) if *t == now => *c += cost,
                        _ => state.entries.push_back((now, cost)),
                    }
                    state.total = after;
                }
                Decision::allow(limit, limit - after, reset_after(state))
            }
            None => {
                let retry = (cost <= limit).then(|| retry_after(state, limit, cost, period, now));
                Decision::deny(
                    limit,
                    limit.saturating_sub(state.total),
                    reset_after(state),
                    retry.flatten(),
                )
            }
        }
    }
}

/// The time until enough of the oldest admissions have left the window for `cost`
/// to fit; `None` if that moment is past the end of time.
fn retry_after(log: &Log, limit: u64, cost: u64, period: Nanos, now: Nanos) -> Option<Nanos> {
    let mut total = log.total;
    for &(t, c) in &log.entries {
        total -= c;
        if total + cost <= limit {
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
            assert!(SlidingLog.step(&q, &mut s, t * 1_000_000, 1).allowed);
        }
        let d = SlidingLog.step(&q, &mut s, 999_000_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(1)));
        assert!(SlidingLog.step(&q, &mut s, 1_000_000_000, 1).allowed);
        assert!(!SlidingLog.step(&q, &mut s, 1_000_000_000, 1).allowed);
    }

    #[test]
    fn a_big_cost_waits_for_several_entries() {
        let q = Quota::per_second(4).unwrap();
        let mut s = Log::default();
        for t in [0, 10, 20, 30] {
            assert!(SlidingLog.step(&q, &mut s, t, 1).allowed);
        }
        let d = SlidingLog.step(&q, &mut s, 40, 3);
        assert_eq!(
            d.retry_after,
            Some(Duration::from_nanos(1_000_000_000 + 20 - 40))
        );
    }
}
