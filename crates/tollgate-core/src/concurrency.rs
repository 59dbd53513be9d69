use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Decision, Nanos, Quota, StateMachine};

/// The concurrency limiter: at most `limit` units in flight.
///
/// [`StateMachine::step`] acquires a lease of `cost` units that lapses one
/// quota period after it was taken; [`Concurrency::release`] gives one back
/// before that. The period bounds what a holder that never releases (a crash,
/// a lost connection, or an API such as Envoy's that has no release call)
/// keeps from others; the Redis store's leases lapse the same way. Set the
/// period above the longest request. A deny has no `retry_after`: when a
/// permit comes back depends on other requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct Concurrency;

/// The leases a concurrency limit holds: the units in flight and, for each
/// acquisition not yet given back, its cost and when it lapses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leases {
    in_flight: u64,
    /// `(lapses_at, cost)` in acquisition order.
    held: VecDeque<(Nanos, u64)>,
}

impl Leases {
    /// Units in flight (taken and neither released nor lapsed, as of the
    /// last step).
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// When the last lease held lapses, if any is held.
    pub fn last_lapse(&self) -> Option<Nanos> {
        self.held.iter().map(|&(at, _)| at).max()
    }

    /// Drops the leases that lapsed by `now`.
    fn lapse(&mut self, now: Nanos) {
        let mut gone = 0;
        self.held.retain(|&(at, cost)| {
            let live = at > now;
            if !live {
                gone += cost;
            }
            live
        });
        self.in_flight -= gone;
    }
}

impl Concurrency {
    /// Gives back `cost` units: the oldest lease of exactly that cost, or
    /// else from the oldest leases on. Never goes below zero.
    pub fn release(leases: &mut Leases, cost: u64) {
        if let Some(i) = leases.held.iter().position(|&(_, c)| c == cost) {
            leases.held.remove(i);
            leases.in_flight -= cost;
            return;
        }
        let mut left = cost;
        while left > 0
            && let Some(front) = leases.held.front_mut()
        {
            let taken = front.1.min(left);
            front.1 -= taken;
            left -= taken;
            leases.in_flight -= taken;
            if front.1 == 0 {
                leases.held.pop_front();
            }
        }
    }
}

impl StateMachine for Concurrency {
    type State = Leases;

    fn step(&self, quota: &Quota, leases: &mut Leases, now: Nanos, cost: u64) -> Decision {
        leases.lapse(now);
        let limit = quota.limit();
        match leases.in_flight.checked_add(cost).filter(|&n| n <= limit) {
            Some(after) => {
                if cost > 0 {
                    leases
                        .held
                        .push_back((now.saturating_add(quota.period_ns()), cost));
                    leases.in_flight = after;
                }
                Decision::allow(limit, limit - after, 0)
            }
            None => Decision::deny(limit, limit.saturating_sub(leases.in_flight), 0, None),
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
        let mut n = Leases::default();
        assert!(Concurrency.step(&q, &mut n, 0, 2).allowed);
        assert!(!Concurrency.step(&q, &mut n, 0, 1).allowed);
        // No lease of cost 1: one unit comes off the cost-2 lease.
        Concurrency::release(&mut n, 1);
        assert_eq!(n.in_flight(), 1);
        assert!(Concurrency.step(&q, &mut n, 0, 1).allowed);
        Concurrency::release(&mut n, 10);
        assert_eq!(n.in_flight(), 0);
        assert!(n.is_empty());
    }
}
