//! Counters for metrics: how checks were answered and the breaker's state.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::FailurePolicy;

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
    /// Checks decided by their limits' failure policies (Redis failed, timed
    /// out, or the breaker was open).
    pub fallbacks: u64,
    /// Limits decided by [`FailurePolicy::FailOpen`] in those checks.
    pub fallback_fail_open: u64,
    /// Limits decided by [`FailurePolicy::FailClosed`] in those checks.
    pub fallback_fail_closed: u64,
    /// Limits decided by [`FailurePolicy::Local`] in those checks.
    pub fallback_local: u64,
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
    /// Limits decided by each failure policy, indexed by [`policy_index`].
    pub(crate) fallback_limits: [AtomicU64; 3],
    pub(crate) errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) refunds: AtomicU64,
    pub(crate) breaker_opens: AtomicU64,
}

/// Where a policy's count is in [`Counters::fallback_limits`].
pub(crate) fn policy_index(policy: FailurePolicy) -> usize {
    match policy {
        FailurePolicy::FailOpen => 0,
        FailurePolicy::FailClosed => 1,
        FailurePolicy::Local => 2,
    }
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
            fallback_fail_open: get(&self.fallback_limits[0]),
            fallback_fail_closed: get(&self.fallback_limits[1]),
            fallback_local: get(&self.fallback_limits[2]),
            errors: get(&self.errors),
            timeouts: get(&self.timeouts),
            refunds: get(&self.refunds),
            breaker_opens: get(&self.breaker_opens),
            breaker,
        }
    }
}
