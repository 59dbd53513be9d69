//! What the store reports of its health on the live page (`/live.json`):
//! made by the store (`Backend::health`), shown by the page.

use serde::Serialize;

/// What the store reports of itself (see `Backend::health`).
#[derive(Debug, Serialize)]
pub(crate) struct StoreHealth {
    /// `memory`, `redis`, `redis, hybrid`, `redis cluster`, ...
    pub(crate) kind: &'static str,
    /// The memory store's, when it is the store.
    pub(crate) memory: Option<MemoryHealth>,
    /// The Redis stack's, with `--redis`.
    pub(crate) redis: Option<RedisHealth>,
    /// Hybrid mode's, with `--hybrid`.
    pub(crate) hybrid: Option<HybridHealth>,
}

/// The memory store's keys and what `--max-keys` cost.
#[derive(Debug, Serialize)]
pub(crate) struct MemoryHealth {
    pub(crate) keys: usize,
    pub(crate) evictions: u64,
    pub(crate) refusals: u64,
}

/// The Redis stack's counters and its breaker.
#[derive(Debug, Serialize)]
pub(crate) struct RedisHealth {
    pub(crate) checks: u64,
    pub(crate) errors: u64,
    pub(crate) timeouts: u64,
    pub(crate) refunds: u64,
    pub(crate) deny_cache_hits: u64,
    /// `closed`, `half_open` or `open`.
    pub(crate) breaker: &'static str,
    pub(crate) breaker_opens: u64,
    /// Limits decided without Redis, by failure policy.
    pub(crate) fallbacks: Fallbacks,
}

/// Limits decided by each failure policy.
#[derive(Debug, Serialize)]
pub(crate) struct Fallbacks {
    pub(crate) fail_open: u64,
    pub(crate) fail_closed: u64,
    pub(crate) local: u64,
}

/// Hybrid mode's leases.
#[derive(Debug, Serialize)]
pub(crate) struct HybridHealth {
    pub(crate) local_decisions: u64,
    pub(crate) redis_checks: u64,
    pub(crate) units_leased: u64,
    pub(crate) units_returned: u64,
}
