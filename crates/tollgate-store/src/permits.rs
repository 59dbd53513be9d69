//! Which store holds each concurrency permit a wrapper admitted, so that
//! `release` gives it back where it was taken.
//!
//! `Store::check` returns no permit handle, so the wrapper remembers, per
//! budget, the permits it admitted and from where, and `release` takes one of
//! the same cost back. A permit of the inner store it forgets (a release that
//! never comes, a crash) lapses there after the quota's period.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Where a permit was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// The inner store.
    Inner,
    /// The local fallback store.
    Local,
}

#[derive(Debug)]
struct Permit {
    held: Held,
    cost: u64,
    /// `None`: never (a local permit, held until released).
    expires: Option<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct Permits {
    map: Mutex<HashMap<String, Vec<Permit>>>,
}

impl Permits {
    pub(crate) fn insert(&self, budget: String, held: Held, cost: u64, period: Duration) {
        let now = Instant::now();
        let mut map = self.map.lock();
        let permits = map.entry(budget).or_default();
        // Permits past their period have lapsed in the inner store too.
        permits.retain(|p| p.expires.is_none_or(|e| e > now));
        permits.push(Permit {
            held,
            cost,
            expires: match held {
                Held::Inner => now.checked_add(period),
                Held::Local => None,
            },
        });
    }

    /// Takes back the newest permit of `cost` on `budget` (or of any cost, if
    /// none matches).
    pub(crate) fn take(&self, budget: &str, cost: u64) -> Option<Held> {
        let mut map = self.map.lock();
        let permits = map.get_mut(budget)?;
        let at = permits
            .iter()
            .rposition(|p| p.cost == cost)
            .or_else(|| permits.len().checked_sub(1))?;
        let permit = permits.remove(at);
        if permits.is_empty() {
            map.remove(budget);
        }
        Some(permit.held)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_newest_permit_of_the_same_cost() {
        let permits = Permits::default();
        let hour = Duration::from_secs(3600);
        permits.insert("k".into(), Held::Inner, 1, hour);
        permits.insert("k".into(), Held::Inner, 2, hour);
        permits.insert("k".into(), Held::Local, 1, hour);
        assert_eq!(permits.take("k", 2), Some(Held::Inner));
        assert_eq!(permits.take("k", 1), Some(Held::Local));
        assert_eq!(permits.take("k", 5), Some(Held::Inner));
        assert_eq!(permits.take("k", 1), None);
        assert_eq!(permits.len(), 0);
    }

    #[test]
    fn lapsed_inner_permits_are_forgotten_local_ones_never() {
        let permits = Permits::default();
        permits.insert("k".into(), Held::Inner, 1, Duration::ZERO);
        permits.insert("k".into(), Held::Local, 1, Duration::ZERO);
        permits.insert("k".into(), Held::Inner, 1, Duration::from_secs(60));
        assert_eq!(permits.len(), 2);
    }
}
