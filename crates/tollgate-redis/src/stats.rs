//! Counters for metrics: how often Redis decided, failed or timed out.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of the store's counters, all monotonic since the store was
/// made. Export them as Prometheus counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RedisStats {
    /// Checks decided by Redis.
    pub redis_checks: u64,
    /// Redis calls that failed with an error.
    pub errors: u64,
    /// Redis calls that timed out.
    pub timeouts: u64,
    /// Cross-slot checks whose earlier slot groups were refunded after a later deny.
    pub refunds: u64,
    /// Checks of a cluster batch sent again on their own because the node
    /// the batch went to no longer served their slot (a reshard or a
    /// failover since the store last read the slot map).
    pub moved: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) redis_checks: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) refunds: AtomicU64,
    pub(crate) moved: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> RedisStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RedisStats {
            redis_checks: get(&self.redis_checks),
            errors: get(&self.errors),
            timeouts: get(&self.timeouts),
            refunds: get(&self.refunds),
            moved: get(&self.moved),
        }
    }
}
