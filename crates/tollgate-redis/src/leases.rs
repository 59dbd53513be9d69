//! Which concurrency leases this store holds in Redis, so `release` gives
//! back the right one.
//!
//! `Store::check` returns no permit handle, so the store remembers, per key,
//! the leases it acquired, and `release` takes one of the same cost back: the
//! Redis lease it names (its member in the key's sorted set). A store releases
//! only leases it acquired, never another instance's; a lease it forgets (a
//! release that never comes, a crash) expires in Redis after the quota's period.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Debug)]
struct Lease {
    /// The member of the key's sorted set.
    member: String,
    cost: u64,
    expires: Option<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct Leases {
    map: Mutex<HashMap<String, Vec<Lease>>>,
}

impl Leases {
    pub(crate) fn insert(&self, key: &str, member: String, cost: u64, period: Duration) {
        let now = Instant::now();
        let mut map = self.map.lock();
        let leases = map.entry(key.to_owned()).or_default();
        // Leases past their period have expired in Redis too: forget them.
        leases.retain(|l| l.expires.is_none_or(|e| e > now));
        leases.push(Lease {
            member,
            cost,
            expires: now.checked_add(period),
        });
    }

    /// Takes back the newest lease of `cost` on `key` (or of any cost, if none
    /// matches).
    pub(crate) fn take(&self, key: &str, cost: u64) -> Option<String> {
        let mut map = self.map.lock();
        let leases = map.get_mut(key)?;
        let at = leases
            .iter()
            .rposition(|l| l.cost == cost)
            .or_else(|| leases.len().checked_sub(1))?;
        let lease = leases.remove(at);
        if leases.is_empty() {
            map.remove(key);
        }
        Some(lease.member)
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
    fn takes_the_newest_lease_of_the_same_cost() {
        let leases = Leases::default();
        let hour = Duration::from_secs(3600);
        leases.insert("k", "1|a".into(), 1, hour);
        leases.insert("k", "2|b".into(), 2, hour);
        leases.insert("k", "1|c".into(), 1, hour);
        assert_eq!(leases.take("k", 2).as_deref(), Some("2|b"));
        assert_eq!(leases.take("k", 1).as_deref(), Some("1|c"));
        assert_eq!(leases.take("k", 5).as_deref(), Some("1|a"));
        assert_eq!(leases.take("k", 1), None);
        assert_eq!(leases.len(), 0);
    }

    #[test]
    fn expired_leases_are_forgotten() {
        let leases = Leases::default();
        leases.insert("k", "1|a".into(), 1, Duration::ZERO);
        leases.insert("k", "1|b".into(), 1, Duration::from_secs(60));
        assert_eq!(leases.len(), 1);
        leases.insert("k", "1|c".into(), 1, Duration::MAX);
        assert_eq!(leases.len(), 2);
    }
}
