use crate::{Decision, Nanos, Quota, StateMachine};

/// A fixed window's state: the last time seen and the cost admitted in its window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCount {
    /// The latest time seen; its window is `last / period`.
    pub last: Nanos,
    /// Units admitted in that window.
    pub count: u64,
}

/// The fixed window counter: windows are aligned to multiples of the period and
/// each admits up to `limit` units. Cheap, but lets through up to `2 × limit`
/// across a window boundary. A clock that goes backwards stays in the window of
/// the latest time seen.
#[derive(Debug, Clone, Copy, Default)]
pub struct FixedWindow;

/// Nanoseconds from `t` to the end of the window that holds it and of
/// `windows_ahead` more after it: exact, saturating only past u64::MAX ns.
///
/// A duration, not an instant: the end of the last window may lie past
/// u64::MAX. Saturating the instant there made a used window at the end of time
/// report a reset (and a retry) of zero.
pub(crate) fn until_window_end(t: Nanos, period: Nanos, windows_ahead: u64) -> Nanos {
    let left = u128::from(period - t % period) + u128::from(period) * u128::from(windows_ahead);
    u64::try_from(left).unwrap_or(u64::MAX)
}

impl StateMachine for FixedWindow {
    type State = WindowCount;

    fn step(&self, quota: &Quota, state: &mut WindowCount, now: Nanos, cost: u64) -> Decision {
        let period = quota.period_ns();
        let limit = quota.limit();
        let now = now.max(state.last);
        let count = if now / period == state.last / period {
            state.count
        } else {
            0
        };
        let until_end = until_window_end(now, period, 0);
        let reset_after = |count: u64| if count == 0 { 0 } else { until_end };
        match count.checked_add(cost).filter(|&c| c <= limit) {
            Some(after) => {
                if cost > 0 {
                    *state = WindowCount {
                        last: now,
                        count: after,
                    };
                }
                Decision::allow(limit, limit - after, reset_after(after))
            }
            None => {
                // The next window starts empty; a cost above the limit never fits,
                // and neither does any once the next window would start past the
                // end of time.
                let retry =
                    (cost <= limit && now.checked_add(until_end).is_some()).then_some(until_end);
                Decision::deny(
                    limit,
                    limit.saturating_sub(count),
                    reset_after(count),
                    retry,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_aligned_window() {
        let q = Quota::per_second(2).unwrap();
        let mut s = WindowCount::default();
        assert!(FixedWindow.step(&q, &mut s, 400_000_000, 2).allowed);
        let d = FixedWindow.step(&q, &mut s, 900_000_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(std::time::Duration::from_millis(100)));
        assert!(FixedWindow.step(&q, &mut s, 1_000_000_000, 2).allowed);
    }
}
