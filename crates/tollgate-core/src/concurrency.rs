use std::collections::VecDeque;

use crate::{Decision, Nanos, Quota, StateMachine};

/// The concurrency limiter: at most `limit` units in flight.
///
/// [`StateMachine::step`] acquires a lease of `cost` units, known by the id
/// `lease`, that lapses one quota period after it was taken;
/// [`Concurrency::release`] gives back the lease of an id before that. The
/// id is the caller's to choose (a store picks one per acquisition), so the
/// machine stays a pure function of its inputs. The period bounds what a
/// holder that never releases (a crash, a lost connection, or an API such as
/// Envoy's that has no release call) keeps from others; the Redis store's
/// leases lapse the same way. Set the period above the longest request. A
/// deny has no `retry_after`: when a permit comes back depends on other
/// requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct Concurrency {
    /// The id of the lease this step takes, if it admits.
    pub lease: u64,
}

/// One acquisition not yet given back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    lapses_at: Nanos,
    cost: u64,
    id: u64,
}

/// The leases a concurrency limit holds: the units in flight and, for each
/// acquisition not yet given back, its id, cost and when it lapses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leases {
    in_flight: u64,
    /// In acquisition order.
    held: VecDeque<Held>,
}

impl Leases {
    /// Units in flight (taken and neither released nor lapsed, as of the
    /// last step or release).
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// When the last lease held lapses, if any is held.
    pub fn last_lapse(&self) -> Option<Nanos> {
        self.held.iter().map(|h| h.lapses_at).max()
    }

    /// When the lease `id` lapses, if it is held.
    pub fn lapses_at(&self, id: u64) -> Option<Nanos> {
        self.held.iter().find(|h| h.id == id).map(|h| h.lapses_at)
    }

    /// Drops the leases that lapsed by `now`.
    fn lapse(&mut self, now: Nanos) {
        let mut gone = 0;
        self.held.retain(|h| {
            let live = h.lapses_at > now;
            if !live {
                gone += h.cost;
            }
            live
        });
        self.in_flight -= gone;
    }
}

impl Concurrency {
    /// A step that takes its lease under the id `lease`.
    pub const fn lease(lease: u64) -> Self {
        Self { lease }
    }

    /// Gives back the lease `id` at `now`, exactly that one; returns whether
    /// it was held. A lease that lapsed by `now` is gone already: releasing
    /// it changes nothing.
    pub fn release(leases: &mut Leases, id: u64, now: Nanos) -> bool {
        leases.lapse(now);
        let Some(i) = leases.held.iter().position(|h| h.id == id) else {
            return false;
        };
        if let Some(held) = leases.held.remove(i) {
            leases.in_flight -= held.cost;
        }
        true
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
                    leases.held.push_back(Held {
                        lapses_at: now.saturating_add(quota.period_ns()),
                        cost,
                        id: self.lease,
                    });
                    leases.in_flight = after;
                }
                Decision::allow_ns(limit, limit - after, 0)
            }
            None => Decision::deny_ns(limit, limit.saturating_sub(leases.in_flight), 0, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_machine_acquires_and_releases_by_id() {
        let q = Quota::per_second(3).unwrap();
        let mut n = Leases::default();
        assert!(Concurrency::lease(1).step(&q, &mut n, 0, 2).allowed());
        assert!(Concurrency::lease(2).step(&q, &mut n, 500, 1).allowed());
        assert!(!Concurrency::lease(3).step(&q, &mut n, 500, 1).allowed());
        // The cost-2 lease goes, whatever its cost; the other keeps its lapse.
        assert!(Concurrency::release(&mut n, 1, 600));
        assert_eq!(n.in_flight(), 1);
        assert_eq!(n.lapses_at(2), Some(1_000_000_500));
        assert!(!Concurrency::release(&mut n, 1, 600), "released already");
        assert!(!Concurrency::release(&mut n, 9, 600), "never taken");
        assert_eq!(n.in_flight(), 1);
        // Lapsed: nothing left to release.
        assert!(!Concurrency::release(&mut n, 2, 1_000_000_500));
        assert_eq!(n.in_flight(), 0);
        assert!(n.is_empty());
    }
}
