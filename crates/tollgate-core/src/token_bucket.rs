use crate::meter::meter;
use crate::{Decision, Nanos, Quota, StateMachine};

/// A token bucket's state: the tokens it holds and when it was last refilled.
///
/// Tokens are fixed point, in nanoseconds of refill (one token is one emission
/// interval), so refilling adds elapsed nanoseconds exactly. A new key holds
/// `u64::MAX`, which the first refill clamps to the capacity: a full bucket,
/// without the state having to know its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// Tokens held at `last`, in nanoseconds of refill.
    pub tokens: u64,
    /// When the tokens were last counted.
    pub last: Nanos,
}

impl Default for Tokens {
    fn default() -> Self {
        Self {
            tokens: u64::MAX,
            last: 0,
        }
    }
}

/// The token bucket: lazily refilled at `limit / period` up to `burst` tokens; a
/// request takes `cost` tokens or is denied. A clock that goes backwards refills
/// nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenBucket;

impl StateMachine for TokenBucket {
    type State = Tokens;

    #[inline]
    fn step(&self, quota: &Quota, state: &mut Tokens, now: Nanos, cost: u64) -> Decision {
        let capacity = quota.capacity_ns();
        let now = now.max(state.last);
        let tokens = state.tokens.saturating_add(now - state.last).min(capacity);
        let metered = meter(quota, now, capacity - tokens, cost);
        if let Some(used) = metered.used {
            *state = Tokens {
                tokens: capacity - used,
                last: now,
            };
        }
        metered.decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn refills_lazily_up_to_capacity() {
        let q = Quota::per_second(2).unwrap();
        let mut s = Tokens::default();
        assert!(TokenBucket.step(&q, &mut s, 0, 2).allowed());
        let d = TokenBucket.step(&q, &mut s, 0, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        // Hours later the bucket holds its capacity, not more.
        let d = TokenBucket.step(&q, &mut s, 7_200_000_000_000, 0);
        assert_eq!(d.remaining(), 2);
        assert!(!TokenBucket.step(&q, &mut s, 7_200_000_000_000, 3).allowed());
    }
}
