use crate::meter::meter;
use crate::{Decision, Nanos, Quota, StateMachine};

/// GCRA's state: the theoretical arrival time, one `u64`.
///
/// `0` (the default) is a key that is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tat(pub Nanos);

/// The generic cell rate algorithm (virtual scheduling form).
///
/// A request of cost `c` is admitted when `max(TAT, now) + c·T − now ≤ burst·T`,
/// with `T` the emission interval; admitting moves the TAT by `c·T`. It makes
/// exactly the token bucket's decisions from a single timestamp, which is why it
/// is the cheapest algorithm to keep in memory and in Redis.
///
/// A clock that goes backwards cannot be told from time not passing with one
/// timestamp, so GCRA treats it as time going backwards: it becomes stricter by
/// the size of the jump, and never admits more than it would have.
///
/// The TAT is a `u64`, so an admission whose TAT would pass `u64::MAX` ns (584
/// years after the clock's origin) is refused rather than saturated; the other
/// buckets follow the same rule, so they keep deciding alike.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gcra;

impl StateMachine for Gcra {
    type State = Tat;

    #[inline]
    fn step(&self, quota: &Quota, state: &mut Tat, now: Nanos, cost: u64) -> Decision {
        let metered = meter(quota, now, state.0.saturating_sub(now), cost);
        if let Some(used) = metered.used {
            // `meter` admits only what drains by u64::MAX: this cannot saturate.
            state.0 = now + used;
        }
        metered.decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_one_per_interval() {
        let q = Quota::per_second(10).unwrap().with_burst(3).unwrap();
        let mut s = Tat::default();
        for remaining in [2, 1, 0] {
            let d = Gcra.step(&q, &mut s, 0, 1);
            assert!(d.allowed());
            assert_eq!(d.remaining(), remaining);
        }
        let d = Gcra.step(&q, &mut s, 0, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
        assert_eq!(d.reset_after(), Duration::from_millis(300));
        assert!(!Gcra.step(&q, &mut s, 99_999_999, 1).allowed());
        assert!(Gcra.step(&q, &mut s, 100_000_000, 1).allowed());
    }
}
