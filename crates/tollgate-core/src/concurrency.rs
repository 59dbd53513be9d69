use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Decision, Nanos, Quota, StateMachine};

/// The concurrency limiter: at most `limit` units in flight; time plays no part.
///
/// [`StateMachine::step`] acquires; [`Concurrency::release`] gives back. Stores
/// that hold permits across a network keep them as leases with an expiry (the
/// quota's period) so a crashed holder cannot leak one. A deny has no
/// `retry_after`: when a permit comes back depends on other requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct Concurrency;

impl Concurrency {
    /// Gives back `cost` units; never goes below zero.
    pub fn release(in_flight: &mut u64, cost: u64) {
        *in_flight = in_flight.saturating_sub(cost);
    }
}

impl StateMachine for Concurrency {
    type State = u64;

    fn step(&self, quota: &Quota, in_flight: &mut u64, _now: Nanos, cost: u64) -> Decision {
        let limit = quota.limit();
        match in_flight.checked_add(cost).filter(|&n| n <= limit) {
            Some(after) => {
                *in_flight = after;
                Decision::allow(limit, limit - after, 0)
            }
            None => Decision::deny(limit, limit.saturating_sub(*in_flight), 0, None),
        }
    }
}

/// A single in-process concurrency limit whose permits give themselves back
/// when dropped.
#[derive(Debug, Clone)]
pub struct ConcurrencyLimiter {
    in_flight: Arc<AtomicU64>,
    max: u64,
}

/// One admitted request's share of a [`ConcurrencyLimiter`], released on drop.
#[derive(Debug)]
#[must_use = "the permit is released as soon as it is dropped"]
pub struct Permit {
    in_flight: Arc<AtomicU64>,
    cost: u64,
}

impl ConcurrencyLimiter {
    /// A limiter that lets `max` units be in flight at once.
    pub fn new(max: u64) -> Self {
        Self {
            in_flight: Arc::new(AtomicU64::new(0)),
            max,
        }
    }

    /// Takes `cost` units if they fit; the permit returns them when dropped.
    pub fn try_acquire(&self, cost: u64) -> Result<Permit, Decision> {
        let max = self.max;
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(cost).filter(|&after| after <= max)
            })
            .map(|_| Permit {
                in_flight: Arc::clone(&self.in_flight),
                cost,
            })
            .map_err(|n| Decision::deny(max, max.saturating_sub(n), 0, None))
    }

    /// Units in flight now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(self.cost, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_come_back_on_drop() {
        let limiter = ConcurrencyLimiter::new(2);
        let a = limiter.try_acquire(1).unwrap();
        let b = limiter.try_acquire(1).unwrap();
        let denied = limiter.try_acquire(1).unwrap_err();
        assert!(!denied.allowed && denied.retry_after.is_none());
        drop(a);
        assert_eq!(limiter.in_flight(), 1);
        let _c = limiter.try_acquire(1).unwrap();
        drop(b);
        assert_eq!(limiter.in_flight(), 1);
    }

    #[test]
    fn state_machine_acquires_and_releases() {
        let q = Quota::per_second(2).unwrap();
        let mut n = 0;
        assert!(Concurrency.step(&q, &mut n, 0, 2).allowed);
        assert!(!Concurrency.step(&q, &mut n, 0, 1).allowed);
        Concurrency::release(&mut n, 1);
        assert!(Concurrency.step(&q, &mut n, 0, 1).allowed);
        Concurrency::release(&mut n, 10);
        assert_eq!(n, 0);
    }
}
