//! What the store reports of its health on the live page (`/live.json`):
//! made by the server's store (its `Backend::health`), shown by the page.

use serde::Serialize;

/// What the store reports of itself (the server's `Backend::health` makes it).
#[derive(Debug, Serialize)]
pub struct StoreHealth {
    /// `memory`, `redis`, `redis, hybrid`, `redis cluster`, ...
    pub kind: &'static str,
    /// The memory store's, when it is the store.
    pub memory: Option<MemoryHealth>,
    /// The Redis stack's, with `--redis`.
    pub redis: Option<RedisHealth>,
    /// Hybrid mode's, with `--hybrid`.
    pub hybrid: Option<HybridHealth>,
}

/// The memory store's keys and what `--max-keys` cost.
#[derive(Debug, Serialize)]
pub struct MemoryHealth {
    /// Keys held now.
    pub keys: usize,
    /// Keys at rest evicted to stay within `--max-keys`.
    pub evictions: u64,
    /// New keys refused because nothing at rest could be evicted.
    pub refusals: u64,
}

/// The Redis stack's counters and its breaker.
#[derive(Debug, Serialize)]
pub struct RedisHealth {
    /// Checks Redis decided.
    pub checks: u64,
    /// Checks whose Redis calls failed.
    pub errors: u64,
    /// Checks whose Redis calls timed out.
    pub timeouts: u64,
    /// Cross-slot checks refunded after a later slot denied.
    pub refunds: u64,
    /// Checks the deny cache answered without Redis.
    pub deny_cache_hits: u64,
    /// `closed`, `half_open` or `open`.
    pub breaker: &'static str,
    /// Times the breaker opened.
    pub breaker_opens: u64,
    /// On a cluster, the ranges of slots (`<first>-<last>`) whose breaker
    /// is not closed: their keys alone are decided by their failure
    /// policies.
    pub open_slots: Vec<String>,
    /// Limits decided without Redis, by failure policy.
    pub fallbacks: Fallbacks,
}

/// Limits decided by each failure policy.
#[derive(Debug, Serialize)]
pub struct Fallbacks {
    /// By `fail_open`.
    pub fail_open: u64,
    /// By `fail_closed`.
    pub fail_closed: u64,
    /// By `local`.
    pub local: u64,
}

/// Hybrid mode's leases.
#[derive(Debug, Serialize)]
pub struct HybridHealth {
    /// Checks decided from local leases.
    pub local_decisions: u64,
    /// Checks sent on to Redis.
    pub redis_checks: u64,
    /// Units leased from Redis.
    pub units_leased: u64,
    /// Unspent leased units given back to Redis.
    pub units_returned: u64,
}
