//! The store the service runs on, built at start-up from flags: in memory by
//! default, or, with `--redis`, a stack of parts over Redis / Redis Cluster:
//!
//! ```text
//! DenyCache → Fallback (timeout, breaker, failure policies, local store) → [Hybrid] → Redis
//! ```

use std::time::Duration;

use tollgate_core::{Lease, Limit, Outcome, Stamped, Store, StoreError, SystemClock};
use tollgate_redis::{RedisConfig, RedisStats, RedisStore};
use tollgate_store::{
    DenyCache, DenyCacheStats, Fallback, FallbackConfig, FallbackStats, Hybrid, HybridConfig,
    HybridStats, MemoryConfig, MemoryStore,
};

/// Keys the deny cache holds when it is on.
const DENY_CACHE_KEYS: usize = 65_536;

/// How the Redis stack is built (with `--redis`; ignored in memory).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// Whether keys that Redis denied are denied locally until their
    /// `retry_after` passes, without a Redis call (`true` or `false`).
    #[arg(
        long,
        env = "TOLLGATE_DENY_CACHE",
        value_name = "BOOL",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    deny_cache: bool,

    /// Consecutive Redis failures (errors or timeouts) that open the circuit
    /// breaker: checks are then decided by each rule's failure policy
    /// without calling Redis.
    #[arg(
        long,
        env = "TOLLGATE_BREAKER_FAILURES",
        value_name = "N",
        default_value_t = 5,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    breaker_failures: u32,

    /// How long the open breaker waits between background probes of Redis;
    /// decisions return to Redis within one cool-down and one probe after it
    /// answers again.
    #[arg(
        long,
        env = "TOLLGATE_BREAKER_COOL_DOWN",
        value_name = "DURATION",
        default_value = "1s",
        value_parser = positive_duration
    )]
    breaker_cool_down: Duration,

    /// Hybrid mode: lease slices of hot keys' budgets from Redis and spend
    /// them locally (token bucket, GCRA, leaky bucket, fixed window). With N
    /// instances a key may admit up to N × max lease more than its limit.
    #[arg(long, env = "TOLLGATE_HYBRID")]
    hybrid: bool,

    /// In hybrid mode, the most units an instance holds unspent for one key,
    /// as a fraction of the key's capacity (at least one unit).
    #[arg(
        long,
        env = "TOLLGATE_HYBRID_MAX_LEASE",
        value_name = "FRACTION",
        default_value_t = 0.05,
        value_parser = fraction
    )]
    hybrid_max_lease: f64,

    /// In hybrid mode, how long leased units may stay unspent before they go
    /// back to Redis.
    #[arg(
        long,
        env = "TOLLGATE_HYBRID_LEASE_TTL",
        value_name = "DURATION",
        default_value = "1s",
        value_parser = positive_duration
    )]
    hybrid_lease_ttl: Duration,
}

/// A duration above zero and at most an hour.
fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = tollgate_policy::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() || d > Duration::from_secs(3600) {
        return Err("must be above 0 and at most 1h".into());
    }
    Ok(d)
}

/// A fraction in (0, 1].
fn fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if !(f > 0.0 && f <= 1.0) {
        return Err("must be above 0 and at most 1".into());
    }
    Ok(f)
}

/// What sits under the fallback: Redis, or hybrid leases over Redis.
pub(crate) enum Remote {
    /// Every check goes to Redis.
    Direct(Box<RedisStore>),
    /// Hot keys are spent from local leases.
    Hybrid(Hybrid<RedisStore>),
}

impl Remote {
    fn redis(&self) -> &RedisStore {
        match self {
            Remote::Direct(r) => r,
            Remote::Hybrid(h) => h.inner(),
        }
    }
}

impl Store for Remote {
    async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        Ok(self.check_stamped(limits).await?.outcome)
    }

    async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        match self {
            Remote::Direct(r) => r.release(leases).await,
            Remote::Hybrid(h) => h.release(leases).await,
        }
    }

    async fn ready(&self) -> bool {
        self.redis().reachable().await
    }

    async fn check_stamped(&self, limits: &[Limit<'_>]) -> Result<Stamped, StoreError> {
        match self {
            Remote::Direct(r) => r.check_stamped(limits).await,
            Remote::Hybrid(h) => h.check_stamped(limits).await,
        }
    }

    async fn give_back(&self, limit: &Limit<'_>, taken_at: u64) -> Result<(), StoreError> {
        self.redis().give_back(limit, taken_at).await
    }
}

/// The Redis stack `serve --redis` runs.
pub(crate) type RedisStack = DenyCache<Fallback<Remote>>;

/// The counters of every part of the Redis stack, for metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StackStats {
    pub(crate) redis: RedisStats,
    pub(crate) deny_cache: DenyCacheStats,
    pub(crate) fallback: FallbackStats,
    /// With `--hybrid` only.
    pub(crate) hybrid: Option<HybridStats>,
}

/// One of the stores `tollgate serve` can run on.
pub(crate) enum Backend {
    /// One process's memory, on the wall clock so fixed windows align to
    /// calendar units as envoyproxy/ratelimit's do.
    Memory(MemoryStore<SystemClock>),
    /// Shared state in Redis; decides locally when Redis cannot answer.
    Redis(Box<RedisStack>),
}

impl Backend {
    /// Connects to `redis` (a `redis://` or `redis+cluster://` URL), each of
    /// whose round trips waits at most `timeout`, and stacks the parts `args`
    /// ask for over it; or, without one, makes a memory store.
    pub(crate) async fn open(
        redis: Option<&str>,
        timeout: Duration,
        args: &StoreArgs,
    ) -> anyhow::Result<Self> {
        let Some(url) = redis else {
            return Ok(Backend::Memory(MemoryStore::with_clock(
                MemoryConfig::default(),
                SystemClock,
            )));
        };
        let config = RedisConfig {
            timeout,
            ..RedisConfig::default()
        };
        let store = RedisStore::connect(url, config)
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to Redis: {e}"))?;
        let remote = if args.hybrid {
            Remote::Hybrid(Hybrid::new(
                store,
                HybridConfig {
                    max_lease_fraction: args.hybrid_max_lease,
                    lease_ttl: args.hybrid_lease_ttl,
                },
            ))
        } else {
            Remote::Direct(Box::new(store))
        };
        let fallback = FallbackConfig {
            // Each round trip is bounded by `timeout`; a hybrid check may make
            // three (returning a stale lease, a check with a lease, one
            // without), so the whole check gets three.
            timeout: timeout.saturating_mul(3),
            breaker_failures: args.breaker_failures,
            breaker_cool_down: args.breaker_cool_down,
            ..FallbackConfig::default()
        };
        let capacity = if args.deny_cache { DENY_CACHE_KEYS } else { 0 };
        Ok(Backend::Redis(Box::new(DenyCache::new(
            Fallback::new(remote, fallback),
            capacity,
        ))))
    }

    /// The counters of the Redis stack's parts; `None` in memory.
    pub(crate) fn redis_stats(&self) -> Option<StackStats> {
        let Backend::Redis(stack) = self else {
            return None;
        };
        let remote = stack.inner().inner();
        Some(StackStats {
            redis: remote.redis().stats(),
            deny_cache: stack.stats(),
            fallback: stack.inner().stats(),
            hybrid: match remote {
                Remote::Direct(_) => None,
                Remote::Hybrid(h) => Some(h.stats()),
            },
        })
    }

    /// Which store this is, for the start-up log.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis(stack) => {
                let remote = stack.inner().inner();
                match (remote.redis().is_cluster(), remote) {
                    (true, Remote::Hybrid(_)) => "redis cluster, hybrid",
                    (true, Remote::Direct(_)) => "redis cluster",
                    (false, Remote::Hybrid(_)) => "redis, hybrid",
                    (false, Remote::Direct(_)) => "redis",
                }
            }
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

    async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        match self {
            Backend::Memory(m) => m.release(leases).await,
            Backend::Redis(r) => Box::pin(r.release(leases)).await,
        }
    }

    async fn ready(&self) -> bool {
        match self {
            Backend::Memory(_) => true,
            Backend::Redis(r) => Box::pin(r.ready()).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_fractions_are_checked() {
        assert_eq!(positive_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(positive_duration("0s").is_err());
        assert!(positive_duration("2h").is_err());
        assert_eq!(fraction("0.1"), Ok(0.1));
        assert_eq!(fraction("1"), Ok(1.0));
        for bad in ["0", "-0.5", "1.5", "NaN", "x"] {
            assert!(fraction(bad).is_err(), "{bad}");
        }
    }
}
