use crate::meter::meter;
use crate::{Decision, Nanos, Quota, StateMachine, Tat};

/// A policing leaky bucket's state: its water level and when it last leaked.
///
/// The level is in nanoseconds of draining (one unit is one emission interval).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Level {
    /// The level at `last`, in nanoseconds of draining.
    pub level: u64,
    /// When the level was last measured.
    pub last: Nanos,
}

/// The leaky bucket as a meter (policing): water leaks at `limit / period`; a
/// request pours in `cost` units, and is rejected at once when the bucket would
/// overflow its `burst`. This is NGINX's `limit_req` with `nodelay`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeakyBucket;

impl StateMachine for LeakyBucket {
    type State = Level;

    #[inline]
    fn step(&self, quota: &Quota, state: &mut Level, now: Nanos, cost: u64) -> Decision {
        let now = now.max(state.last);
        let metered = meter(
            quota,
            now,
            state.level.saturating_sub(now - state.last),
            cost,
        );
        if let Some(level) = metered.used {
            *state = Level { level, last: now };
        }
        metered.decision
    }
}

/// The leaky bucket as a queue (shaping): NGINX's `limit_req` without `nodelay`.
///
/// Requests join a queue that drains one unit per emission interval. The state is
/// the time the queue's tail leaves. A request is admitted while the queue has
/// room (at most `burst` units back to back, counting the one being served, so
/// NGINX's `burst=B` is a Tollgate burst of `B + 1`), with a [`Decision::delay`]
/// equal to its wait in the queue minus `delay_after` emission intervals, so that
/// what leaves is spaced at the drain rate. `delay_after = 0` shapes every
/// request; `delay_after = N` is NGINX's two-stage `delay=N`; `delay_after ≥
/// burst − 1` is `nodelay`. A full queue rejects at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeakyBucketShaping {
    /// Units of excess forwarded without delay.
    pub delay_after: u64,
}

impl StateMachine for LeakyBucketShaping {
    type State = Tat;

    #[inline]
    fn step(&self, quota: &Quota, state: &mut Tat, now: Nanos, cost: u64) -> Decision {
        let wait = state.0.saturating_sub(now);
        let metered = meter(quota, now, wait, cost);
        let mut decision = metered.decision;
        if let Some(used) = metered.used {
            // `meter` admits only what drains by u64::MAX: this cannot saturate.
            state.0 = now + used;
        }
        if decision.allowed() {
            let free = self.delay_after.saturating_mul(quota.emission_ns());
            decision = decision.delayed_ns(wait.saturating_sub(free));
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn policing_rejects_overflow_at_once() {
        let q = Quota::per_second(10).unwrap().with_burst(1).unwrap();
        let mut s = Level::default();
        assert!(LeakyBucket.step(&q, &mut s, 0, 1).allowed());
        let d = LeakyBucket.step(&q, &mut s, 50_000_000, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(50)));
        assert!(LeakyBucket.step(&q, &mut s, 100_000_000, 1).allowed());
    }

    /// NGINX `rate=10r/s burst=2` (Tollgate burst 3): one request passes, two wait
    /// 100 ms and 200 ms, the fourth is rejected.
    #[test]
    fn shaping_delays_like_nginx_burst_without_nodelay() {
        let q = Quota::per_second(10).unwrap().with_burst(3).unwrap();
        let shaper = LeakyBucketShaping::default();
        let mut s = Tat::default();
        let delays: Vec<_> = (0..3)
            .map(|_| shaper.step(&q, &mut s, 0, 1).delay())
            .collect();
        assert_eq!(delays, [0, 100, 200].map(Duration::from_millis).to_vec());
        let d = shaper.step(&q, &mut s, 0, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
    }

    /// NGINX `burst=4 delay=2` (Tollgate burst 5, delay_after 2): three pass at
    /// once, the next two are delayed, the sixth is rejected.
    #[test]
    fn shaping_two_stage_delay() {
        let q = Quota::per_second(10).unwrap().with_burst(5).unwrap();
        let shaper = LeakyBucketShaping { delay_after: 2 };
        let mut s = Tat::default();
        let delays: Vec<_> = (0..5)
            .map(|_| shaper.step(&q, &mut s, 0, 1).delay())
            .collect();
        assert_eq!(
            delays,
            [0, 0, 0, 100, 200].map(Duration::from_millis).to_vec()
        );
        assert!(!shaper.step(&q, &mut s, 0, 1).allowed());
    }
}
