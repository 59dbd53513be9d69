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

/// The fixed window as envoyproxy/ratelimit counts it: every hit is added to
/// the window's count, denied or not (its `INCRBY`), so once a request has
/// gone over, the window stays over for smaller ones too. Admissions are the
/// [`FixedWindow`]'s otherwise. A denied hit is written (see
/// [`StateMachine::COUNTS_DENIED`]); the count is kept at most one past the
/// limit, which is all a decision can tell apart.
#[derive(Debug, Clone, Copy, Default)]
pub struct HitCounter;

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

    #[inline]
    fn step(&self, quota: &Quota, state: &mut WindowCount, now: Nanos, cost: u64) -> Decision {
        window_step(quota, state, now, cost, false)
    }
}

impl StateMachine for HitCounter {
    type State = WindowCount;
    const COUNTS_DENIED: bool = true;

    #[inline]
    fn step(&self, quota: &Quota, state: &mut WindowCount, now: Nanos, cost: u64) -> Decision {
        window_step(quota, state, now, cost, true)
    }
}

fn window_step(
    quota: &Quota,
    state: &mut WindowCount,
    now: Nanos,
    cost: u64,
    counts_denied: bool,
) -> Decision {
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
            Decision::allow_ns(limit, limit - after, reset_after(after))
        }
        None => {
            // The next window starts empty; a cost above the limit never fits,
            // and neither does any once the next window would start past the
            // end of time.
            let retry =
                (cost <= limit && now.checked_add(until_end).is_some()).then_some(until_end);
            let mut seen = count;
            if counts_denied && cost > 0 {
                seen = count.saturating_add(cost).min(limit.saturating_add(1));
                *state = WindowCount {
                    last: now,
                    count: seen,
                };
            }
            Decision::deny_ns(limit, limit.saturating_sub(count), reset_after(seen), retry)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    #[test]
    fn counts_per_aligned_window() {
        let q = Quota::per_second(2).unwrap();
        let mut s = WindowCount::default();
        assert!(FixedWindow.step(&q, &mut s, 400_000_000, 2).allowed());
        let d = FixedWindow.step(&q, &mut s, 900_000_000, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(std::time::Duration::from_millis(100)));
        assert!(FixedWindow.step(&q, &mut s, 1_000_000_000, 2).allowed());
    }

    /// envoyproxy/ratelimit's counter (`test/redis/fixed_cache_impl_test.go`:
    /// every `INCRBY` lands): a denied hit keeps the window over for a smaller
    /// one, where the fixed window would admit it.
    #[test]
    fn hit_counter_counts_denied_hits_until_the_window_ends() {
        let q = Quota::per_second(10).unwrap();
        let (mut fixed, mut counter) = (WindowCount::default(), WindowCount::default());
        for machine_state in [&mut fixed, &mut counter] {
            *machine_state = WindowCount {
                last: 100,
                count: 9,
            };
        }
        assert!(!FixedWindow.step(&q, &mut fixed, 200, 5).allowed());
        assert!(FixedWindow.step(&q, &mut fixed, 300, 1).allowed());

        let over = HitCounter.step(&q, &mut counter, 200, 5);
        assert!(!over.allowed());
        assert_eq!(over.remaining(), 1);
        assert_eq!(
            over.retry_after(),
            Some(std::time::Duration::from_nanos(SEC - 200))
        );
        assert_eq!(counter.count, 11, "kept one past the limit");
        let after = HitCounter.step(&q, &mut counter, 300, 1);
        assert!(!after.allowed());
        assert_eq!(after.remaining(), 0);
        assert_eq!(counter.count, 11);
        // A read still counts nothing, and the next window starts empty.
        assert!(!HitCounter.step(&q, &mut counter, 400, 0).allowed());
        assert!(HitCounter.step(&q, &mut counter, SEC, 10).allowed());
    }

    #[test]
    fn hit_counter_keeps_what_it_counted_for_the_store_to_expire() {
        let q = Quota::per_second(2).unwrap();
        let mut s = WindowCount::default();
        let d = HitCounter.step(&q, &mut s, 250_000_000, 3);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), None, "a cost above the limit never fits");
        assert_eq!(d.reset_after(), std::time::Duration::from_millis(750));
        assert_eq!(s.count, 3);
    }
}
