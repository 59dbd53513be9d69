use crate::fixed_window::until_window_end;
use crate::{Decision, Nanos, Quota, StateMachine};

/// A sliding window counter's state: the last time seen and the admitted cost
/// in its window and in the window before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowPair {
    /// The latest time seen; its window is `last / period`.
    pub last: Nanos,
    /// Units admitted in the window before `last`'s.
    pub previous: u64,
    /// Units admitted in `last`'s window.
    pub current: u64,
}

/// The sliding window counter (Cloudflare's approximation of the sliding log).
///
/// With `e` the time elapsed in the current window, the estimate is
/// `previous × (period − e) / period + current`. The rounding rule is: there is
/// none. A request is admitted when
/// `previous × (period − e) + (current + cost) × period ≤ limit × period`,
/// compared exactly in 128-bit integers, and `remaining` is that slack divided by
/// `period`, rounded down.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlidingCounter;

/// The counts seen at `now`: `(previous, current, elapsed in window)`.
fn rolled(state: &WindowPair, now: Nanos, period: Nanos) -> (u64, u64) {
    match (now / period).saturating_sub(state.last / period) {
        0 => (state.previous, state.current),
        1 => (state.current, 0),
        _ => (0, 0),
    }
}

/// `previous × (period − e) + current × period`: the estimate, scaled by `period`.
fn weighted(previous: u64, current: u64, e: Nanos, period: Nanos) -> u128 {
    let (p, c) = (u128::from(previous), u128::from(current));
    (p * u128::from(period - e)).saturating_add(c * u128::from(period))
}

/// The first offset in a window, at or after `from`, at which `cost` fits
/// beside `previous` and `current` (which do not change within the window).
fn first_fit(
    previous: u64,
    current: u64,
    cost: u64,
    limit: u64,
    period: Nanos,
    from: Nanos,
) -> Option<Nanos> {
    if current.checked_add(cost).is_none_or(|c| c > limit) {
        return None;
    }
    let over = u128::from(previous) + u128::from(current) + u128::from(cost);
    let at = match over.saturating_sub(u128::from(limit)) {
        0 => 0,
        // previous > 0 here, since current + cost <= limit.
        excess => (excess * u128::from(period)).div_ceil(u128::from(previous)),
    };
    let at = u64::try_from(at).ok()?.max(from);
    (at < period).then_some(at)
}

impl StateMachine for SlidingCounter {
    type State = WindowPair;

    #[inline]
    fn step(&self, quota: &Quota, state: &mut WindowPair, now: Nanos, cost: u64) -> Decision {
        let period = quota.period_ns();
        let limit = quota.limit();
        let now = now.max(state.last);
        let (previous, current) = rolled(state, now, period);
        let e = now % period;
        let ceiling = u128::from(limit) * u128::from(period);
        let remaining = |current: u64| {
            let slack = ceiling.saturating_sub(weighted(previous, current, e, period));
            u64::try_from(slack / u128::from(period)).unwrap_or(u64::MAX)
        };
        // Back to full when `current` has aged through the next window too.
        let reset_after = |current: u64| match (previous, current) {
            (0, 0) => 0,
            (_, 0) => until_window_end(now, period, 0),
            _ => until_window_end(now, period, 1),
        };
        // Checked, not saturating: a saturated `current + cost` could pass as
        // u64::MAX ≤ limit and admit more than the limit in one window.
        let fits = current
            .checked_add(cost)
            .filter(|&after| weighted(previous, after, e, period) <= ceiling);
        if let Some(after) = fits {
            if cost > 0 {
                *state = WindowPair {
                    last: now,
                    previous,
                    current: after,
                };
            }
            return Decision::allow_ns(limit, remaining(after), reset_after(after));
        }
        // The instant at which the cost first fits, if the clock reaches it: in
        // this window, in the next one (where `current` becomes the previous
        // count), or at the start of the one after, which is empty.
        let start = now - e;
        let retry_at = if cost > limit {
            None
        } else if let Some(at) = first_fit(previous, current, cost, limit, period, e) {
            start.checked_add(at)
        } else {
            let at = first_fit(current, 0, cost, limit, period, 0).unwrap_or(period);
            start
                .checked_add(period)
                .and_then(|next| next.checked_add(at))
        };
        let retry = retry_at.map(|at| at - now);
        Decision::deny_ns(limit, remaining(current), reset_after(current), retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn weighs_the_previous_window() {
        let q = Quota::per_second(10).unwrap();
        let mut s = WindowPair::default();
        assert!(SlidingCounter.step(&q, &mut s, 900_000_000, 10).allowed());
        // At 1.25 s, 75% of the previous window's 10 still count: 2 fit, not 3.
        let d = SlidingCounter.step(&q, &mut s, 1_250_000_000, 0);
        assert_eq!(d.remaining(), 2);
        assert!(!SlidingCounter.step(&q, &mut s, 1_250_000_000, 3).allowed());
        let d = SlidingCounter.step(&q, &mut s, 1_250_000_000, 2);
        assert!(d.allowed());
        let d = SlidingCounter.step(&q, &mut s, 1_250_000_000, 1);
        // 10·(1 − e/1s) + 3 ≤ 10 once e ≥ 300 ms.
        assert_eq!(d.retry_after(), Some(Duration::from_millis(50)));
    }
}
