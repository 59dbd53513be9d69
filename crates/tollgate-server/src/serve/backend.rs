//! The store the service runs on, chosen at start-up: in memory by default, or
//! Redis / Redis Cluster with `--redis`.

use std::time::Duration;

use tollgate_core::{Limit, Outcome, Store, StoreError, SystemClock};
use tollgate_redis::{RedisConfig, RedisStats, RedisStore};
use tollgate_store::{MemoryConfig, MemoryStore};

/// One of the stores `tollgate serve` can run on.
pub(crate) enum Backend {
    /// One process's memory, on the wall clock so fixed windows align to
    /// calendar units as envoyproxy/ratelimit's do.
    Memory(MemoryStore<SystemClock>),
    /// Shared state in Redis; decides locally when Redis cannot answer.
    Redis(Box<RedisStore>),
}

impl Backend {
    /// Connects to `redis` (a `redis://` or `redis+cluster://` URL), whose
    /// checks wait at most `timeout`, or, without one, makes a memory store.
    pub(crate) async fn open(redis: Option<&str>, timeout: Duration) -> anyhow::Result<Self> {
        Ok(match redis {
            None => Backend::Memory(MemoryStore::with_clock(
                MemoryConfig::default(),
                SystemClock,
            )),
            Some(url) => Backend::Redis(Box::new(
                RedisStore::connect(
                    url,
                    RedisConfig {
                        timeout,
                        ..RedisConfig::default()
                    },
                )
                .await
                .map_err(|e| anyhow::anyhow!("cannot connect to Redis: {e}"))?,
            )),
        })
    }

    /// The Redis store's counters and breaker state; `None` in memory.
    pub(crate) fn redis_stats(&self) -> Option<RedisStats> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(r) => Some(r.stats()),
        }
    }

    /// Which store this is, for the start-up log.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis(r) if r.is_cluster() => "redis cluster",
            Backend::Redis(_) => "redis",
        }
    }
}

impl Store for Backend {
    async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        match self {
            Backend::Memory(m) => m.check(limits).await,
            // Boxed: the Redis future is kilobytes, and unboxed it would make
            // every check's future (memory ones too) that size, to be copied
            // on each request; a network call can afford the allocation.
            Backend::Redis(r) => Box::pin(r.check(limits)).await,
        }
    }

    async fn release(&self, limits: &[Limit<'_>]) -> Result<(), StoreError> {
        match self {
            Backend::Memory(m) => m.release(limits).await,
            Backend::Redis(r) => Box::pin(r.release(limits)).await,
        }
    }

    async fn ready(&self) -> bool {
        match self {
            Backend::Memory(_) => true,
            Backend::Redis(r) => r.reachable().await,
        }
    }
}
