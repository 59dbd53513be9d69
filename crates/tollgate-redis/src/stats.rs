//! Counters for metrics: how checks were answered and the breaker's state.

use std::sync::atomic::{AtomicU64, Ordering};

/// The circuit breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Checks go to Redis.
    Closed,
    /// Checks are decided by the failure policy without calling Redis.
    Open,
    /// One probe is on its way to Redis; other checks use the failure policy.
    HalfOpen,
}

/// A snapshot of the store's counters, all monotonic since the store was made
/// (except `breaker`). Export them as Prometheus counters and a gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisStats {
    /// Checks decided by Redis.
    pub redis_checks: u64,
    /// Checks answered from the local deny cache, without a Redis call.
    pub deny_cache_hits: u64,
    /// Checks decided by the failure policy (Redis failed, timed out, or the
    /// breaker was open).
    pub fallbacks: u64,
    /// Redis calls that failed with an error.
    pub errors: u64,
    /// Redis calls that timed out.
    pub timeouts: u64,
    /// Cross-slot checks whose earlier slot groups were refunded after a later deny.
    pub refunds: u64,
    /// Times the breaker opened.
    pub breaker_opens: u64,
    /// The breaker's state now.
    pub breaker: BreakerState,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) redis_checks: AtomicU64,
    pub(crate) deny_cache_hits: AtomicU64,
    pub(crate) fallbacks: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) refunds: AtomicU64,
    pub(crate) breaker_opens: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self, breaker: BreakerState) -> RedisStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RedisStats {
            redis_checks: get(&self.redis_checks),
            deny_cache_hits: get(&self.deny_cache_hits),
            fallbacks: get(&self.fallbacks),
            errors: get(&self.errors),
            timeouts: get(&self.timeouts),
            refunds: get(&self.refunds),
            breaker_opens: get(&self.breaker_opens),
            breaker,
        }
    }
}
