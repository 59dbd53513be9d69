//! The store the service runs on, built at start-up from flags: in memory by
//! default, or, with `--redis`, a stack of parts over Redis / Redis Cluster:
//!
//! ```text
//! DenyCache → Fallback (timeout, breaker, failure policies, local store) → [Hybrid] → Redis
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{
    Algorithm, Clock, Holder, Lease, LeaseStore, Leased, Limit, Outcome, Quota, Stamped, Store,
    StoreError,
};
use tollgate_envoy::{RedisFiles, RedisTlsFlags};
use tollgate_observe::metrics::StackStats;
use tollgate_observe::store_health;
use tollgate_policy::StoreSettings;
use tollgate_redis::{RedisConfig, RedisStore};
use tollgate_store::{
    BreakerState, DenyCache, Fallback, FallbackConfig, Hybrid, HybridConfig, MemoryConfig,
    MemoryStore,
};

/// Keys the deny cache holds when it is on.
const DENY_CACHE_KEYS: usize = 65_536;

/// How the store is built: the memory store's bound, and the Redis stack
/// (with `--redis`). Each flag (or its environment variable) overrides the
/// config's `store:` section, which overrides the default.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// The most keys the in-process store holds (the memory store, or with
    /// `--redis` the local fallback store). A new key past it evicts a key
    /// whose state is back to full, and when none is, it is refused (its
    /// check denied) rather than forgetting a key that is limiting
    /// [default: 1000000].
    #[arg(
        long,
        env = "TOLLGATE_MAX_KEYS",
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    max_keys: Option<u64>,

    /// Whether keys that Redis denied are denied locally until their
    /// `retry_after` passes, without a Redis call (`true` or `false`)
    /// [default: true].
    #[arg(long, env = "TOLLGATE_DENY_CACHE", value_name = "BOOL")]
    pub(crate) deny_cache: Option<bool>,

    /// Prepended to every Redis key (envoyproxy/ratelimit's
    /// `CACHE_KEY_PREFIX`).
    #[arg(skip)]
    pub(crate) key_prefix: Option<String>,

    /// Consecutive Redis failures (errors or timeouts) that open the circuit
    /// breaker: checks are then decided by each rule's failure policy
    /// without calling Redis [default: 5].
    #[arg(
        long,
        env = "TOLLGATE_BREAKER_FAILURES",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    breaker_failures: Option<u32>,

    /// How long the open breaker waits between background probes of Redis;
    /// decisions return to Redis within one cool-down and one probe after it
    /// answers again [default: 1s].
    #[arg(
        long,
        env = "TOLLGATE_BREAKER_COOL_DOWN",
        value_name = "DURATION",
        value_parser = positive_duration
    )]
    breaker_cool_down: Option<Duration>,

    /// Hybrid mode: lease slices of hot keys' budgets from Redis and spend
    /// them locally (token bucket, GCRA, leaky bucket, fixed window). With N
    /// instances a key may admit up to N × max lease more than its limit.
    #[arg(
        long,
        env = "TOLLGATE_HYBRID",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    hybrid: Option<bool>,

    /// In hybrid mode, the most units an instance holds unspent for one key,
    /// as a fraction of the key's capacity (at least one unit) [default: 0.05].
    #[arg(
        long,
        env = "TOLLGATE_HYBRID_MAX_LEASE",
        value_name = "FRACTION",
        value_parser = fraction
    )]
    hybrid_max_lease: Option<f64>,

    /// In hybrid mode, how long leased units may stay unspent before they go
    /// back to Redis [default: 1s].
    #[arg(
        long,
        env = "TOLLGATE_HYBRID_LEASE_TTL",
        value_name = "DURATION",
        value_parser = positive_duration
    )]
    hybrid_lease_ttl: Option<Duration>,

    /// When Redis does not answer, the part of what it last reported
    /// remaining for a key (of the key's capacity, when it reported nothing
    /// recently) that this instance may spend locally: 1 keeps one instance
    /// within the limit; 1/N keeps N instances within it [default: 1].
    #[arg(
        long,
        env = "TOLLGATE_FALLBACK_SHARE",
        value_name = "FRACTION",
        value_parser = fraction
    )]
    fallback_share: Option<f64>,

    /// With a `rediss://` or `rediss+cluster://` Redis URL: the CA
    /// certificates (PEM) that sign Redis's certificates, in place of the
    /// system's roots. Read at start-up.
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CA", value_name = "PATH")]
    pub(crate) redis_tls_ca: Option<PathBuf>,

    /// With a `rediss` URL: the client certificate chain (PEM) shown to a
    /// Redis that requires one (`tls-auth-clients yes`); needs
    /// `--redis-tls-key`.
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CERT", value_name = "PATH")]
    pub(crate) redis_tls_cert: Option<PathBuf>,

    /// The private key (PEM) of `--redis-tls-cert`.
    #[arg(long, env = "TOLLGATE_REDIS_TLS_KEY", value_name = "PATH")]
    pub(crate) redis_tls_key: Option<PathBuf>,

    /// With a `rediss` URL: accept a Redis certificate that does not name the
    /// host connected to (its chain is still verified).
    #[arg(long, env = "TOLLGATE_REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")]
    pub(crate) redis_tls_skip_hostname_verification: bool,

    /// The TLS files as envoyproxy/ratelimit's `REDIS_TLS_*` variables name
    /// them (under the flags), so errors name the variable.
    #[arg(skip)]
    pub(crate) redis_tls: Option<RedisFiles>,
}

impl StoreArgs {
    /// The `--redis-tls-*` flags.
    pub(crate) fn redis_tls_flags(&self) -> RedisTlsFlags {
        RedisTlsFlags {
            ca: self.redis_tls_ca.clone(),
            cert: self.redis_tls_cert.clone(),
            key: self.redis_tls_key.clone(),
            skip_hostname_verification: self.redis_tls_skip_hostname_verification,
        }
    }
}

/// The settings in force: each flag, else the config's `store:` section,
/// else the default.
struct Effective {
    redis: Option<String>,
    redis_timeout: Duration,
    max_keys: u64,
    deny_cache: bool,
    breaker_failures: u32,
    breaker_cool_down: Duration,
    hybrid: bool,
    hybrid_max_lease: f64,
    hybrid_lease_ttl: Duration,
    fallback_share: f64,
}

impl Effective {
    /// Merges `flags` over the `store:` section `file` (read from `path`);
    /// a file value the flag would refuse is an error naming the file and
    /// the field.
    fn resolve(
        redis: Option<&str>,
        redis_timeout: Option<Duration>,
        flags: &StoreArgs,
        file: Option<(&Path, &StoreSettings)>,
    ) -> anyhow::Result<Self> {
        let empty = StoreSettings::default();
        let (path, settings) = file.map_or((Path::new(""), &empty), |(p, s)| (p, s));
        let checked = |field: &str, result: Result<(), String>| {
            result
                .map_err(|reason| anyhow::anyhow!("store.{field} in {}: {reason}", path.display()))
        };
        if let Some(d) = settings.redis_timeout {
            checked("redis_timeout", check_redis_timeout(d).map(drop))?;
        }
        for (field, d) in [
            ("breaker_cool_down", settings.breaker_cool_down),
            ("hybrid_lease_ttl", settings.hybrid_lease_ttl),
        ] {
            if let Some(d) = d {
                checked(field, check_positive(d).map(drop))?;
            }
        }
        for (field, f) in [
            ("hybrid_max_lease", settings.hybrid_max_lease),
            ("fallback_share", settings.fallback_share),
        ] {
            if let Some(f) = f {
                checked(field, check_fraction(f).map(drop))?;
            }
        }
        if settings.breaker_failures == Some(0) {
            checked("breaker_failures", Err("must be at least 1".into()))?;
        }
        if settings.max_keys == Some(0) {
            checked("max_keys", Err("must be at least 1".into()))?;
        }
        Ok(Self {
            redis: redis.map(str::to_owned).or_else(|| settings.redis.clone()),
            redis_timeout: redis_timeout
                .or(settings.redis_timeout)
                .unwrap_or(DEFAULT_REDIS_TIMEOUT),
            max_keys: flags.max_keys.or(settings.max_keys).unwrap_or(1_000_000),
            deny_cache: flags.deny_cache.or(settings.deny_cache).unwrap_or(true),
            breaker_failures: flags
                .breaker_failures
                .or(settings.breaker_failures)
                .unwrap_or(5),
            breaker_cool_down: flags
                .breaker_cool_down
                .or(settings.breaker_cool_down)
                .unwrap_or(Duration::from_secs(1)),
            hybrid: flags.hybrid.or(settings.hybrid).unwrap_or(false),
            hybrid_max_lease: flags
                .hybrid_max_lease
                .or(settings.hybrid_max_lease)
                .unwrap_or(0.05),
            hybrid_lease_ttl: flags
                .hybrid_lease_ttl
                .or(settings.hybrid_lease_ttl)
                .unwrap_or(Duration::from_secs(1)),
            fallback_share: flags
                .fallback_share
                .or(settings.fallback_share)
                .unwrap_or(1.0),
        })
    }
}

/// How long a Redis round trip may take unless told otherwise.
const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(10);

/// A Redis timeout: above zero and at most a minute.
pub(crate) fn check_redis_timeout(d: Duration) -> Result<Duration, String> {
    if d.is_zero() || d > Duration::from_secs(60) {
        return Err("must be above 0 and at most 1m".into());
    }
    Ok(d)
}

/// A duration above zero and at most an hour.
fn check_positive(d: Duration) -> Result<Duration, String> {
    if d.is_zero() || d > Duration::from_secs(3600) {
        return Err("must be above 0 and at most 1h".into());
    }
    Ok(d)
}

/// A fraction in (0, 1].
fn check_fraction(f: f64) -> Result<f64, String> {
    if !(f > 0.0 && f <= 1.0) {
        return Err("must be above 0 and at most 1".into());
    }
    Ok(f)
}

/// A duration above zero and at most an hour, from a flag.
fn positive_duration(s: &str) -> Result<Duration, String> {
    check_positive(tollgate_policy::parse_duration(s).map_err(|e| e.to_string())?)
}

/// A fraction in (0, 1], from a flag.
fn fraction(s: &str) -> Result<f64, String> {
    check_fraction(s.parse().map_err(|e| format!("{e}"))?)
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
    fn supports(&self, algorithm: Algorithm, quota: &Quota) -> Result<(), StoreError> {
        self.redis().supports(algorithm, quota)
    }

    async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        Ok(self.check_stamped(limits).await?.outcome)
    }

    async fn check_each(&self, limits: &[Limit<'_>]) -> Vec<Result<Outcome, StoreError>> {
        let answers = self.check_each_stamped(limits).await;
        answers.into_iter().map(|a| a.map(|s| s.outcome)).collect()
    }

    async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        match self {
            Remote::Direct(r) => r.release(leases).await,
            Remote::Hybrid(h) => h.release(leases).await,
        }
    }

    async fn ready(&self) -> bool {
        self.redis().ready().await
    }

    fn domain(&self, key: &str) -> Option<std::sync::Arc<str>> {
        self.redis().domain(key)
    }

    async fn domain_ready(&self, domain: &str) -> bool {
        self.redis().domain_ready(domain).await
    }

    async fn reset(&self, limits: &[Limit<'_>]) -> Result<(), StoreError> {
        match self {
            Remote::Direct(r) => r.reset(limits).await,
            Remote::Hybrid(h) => h.reset(limits).await,
        }
    }
}

impl LeaseStore for Remote {
    async fn check_stamped(&self, limits: &[Limit<'_>]) -> Result<Stamped, StoreError> {
        match self {
            Remote::Direct(r) => r.check_stamped(limits).await,
            Remote::Hybrid(h) => h.check_stamped(limits).await,
        }
    }

    async fn check_each_stamped(&self, limits: &[Limit<'_>]) -> Vec<Result<Stamped, StoreError>> {
        match self {
            Remote::Direct(r) => r.check_each_stamped(limits).await,
            Remote::Hybrid(h) => h.check_each_stamped(limits).await,
        }
    }

    async fn check_leasing(
        &self,
        limits: &[Limit<'_>],
        holder: Holder,
        leased: &[Option<Leased>],
    ) -> Result<Stamped, StoreError> {
        match self {
            Remote::Direct(r) => r.check_leasing(limits, holder, leased).await,
            Remote::Hybrid(h) => h.check_leasing(limits, holder, leased).await,
        }
    }

    fn leased(&self, limit: &Limit<'_>) -> u64 {
        match self {
            Remote::Direct(r) => r.leased(limit),
            Remote::Hybrid(h) => h.leased(limit),
        }
    }

    async fn give_back(
        &self,
        limit: &Limit<'_>,
        taken_at: u64,
        holder: Option<(Holder, Leased)>,
    ) -> Result<(), StoreError> {
        self.redis().give_back(limit, taken_at, holder).await
    }
}

/// The Redis stack `serve --redis` runs.
pub(crate) type RedisStack = DenyCache<Fallback<Remote>>;

/// One of the stores `tollgate serve` can run on.
#[allow(
    clippy::large_enum_variant,
    reason = "made once and held in the enforcer's Arc: boxing the memory store would cost an indirection on every check"
)]
pub(crate) enum Backend {
    /// One process's memory, on the service's clock: the wall clock, so
    /// fixed windows align to calendar units as envoyproxy/ratelimit's do
    /// (tests give one that follows tokio's paused time).
    Memory(MemoryStore<Arc<dyn Clock>>),
    /// Shared state in Redis; decides locally when Redis cannot answer.
    Redis(Box<RedisStack>),
}

impl Backend {
    /// Builds the store the flags and the config's `store:` section ask
    /// for: Redis (a `redis://` or `redis+cluster://` URL, each of whose round
    /// trips waits at most the Redis timeout) with the parts stacked over
    /// it, or, without Redis, a memory store on `clock`.
    pub(crate) async fn open(
        redis: Option<&str>,
        redis_timeout: Option<Duration>,
        flags: &StoreArgs,
        file: Option<(&Path, &StoreSettings)>,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        let args = Effective::resolve(redis, redis_timeout, flags, file)?;
        let timeout = args.redis_timeout;
        let memory = MemoryConfig {
            max_keys: usize::try_from(args.max_keys).unwrap_or(usize::MAX),
            ..MemoryConfig::default()
        };
        let Some(url) = args.redis.as_deref() else {
            return Ok(Backend::Memory(MemoryStore::with_clock(memory, clock)));
        };
        let tls = match &flags.redis_tls {
            Some(files) => files.clone(),
            None => RedisFiles::from_flags(&flags.redis_tls_flags()),
        };
        let mut config = RedisConfig {
            timeout,
            tls: tls.read()?,
            ..RedisConfig::default()
        };
        if let Some(prefix) = &flags.key_prefix {
            config.prefix.insert_str(0, prefix);
        }
        // Its errors say what failed ("cannot connect to Redis: …").
        let store = RedisStore::connect(url, config).await?;
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
            local: memory,
            local_share: args.fallback_share,
        };
        let capacity = if args.deny_cache { DENY_CACHE_KEYS } else { 0 };
        Ok(Backend::Redis(Box::new(DenyCache::new(
            Fallback::new(remote, fallback),
            capacity,
        ))))
    }

    /// Copies the store's counters into the metrics registry (at each scrape).
    pub(crate) fn record_metrics(&self) {
        match self {
            Backend::Memory(m) => tollgate_observe::metrics::memory(&m.stats()),
            Backend::Redis(_) => {
                if let Some(stats) = self.redis_stats() {
                    tollgate_observe::metrics::redis(&stats);
                }
            }
        }
    }

    /// What `/live.json` shows of the store: its kind and its parts' counters.
    pub(crate) fn health(&self) -> store_health::StoreHealth {
        let memory = match self {
            Backend::Memory(m) => {
                let stats = m.stats();
                Some(store_health::MemoryHealth {
                    keys: stats.keys,
                    evictions: stats.evictions,
                    refusals: stats.refusals,
                })
            }
            Backend::Redis(_) => None,
        };
        let stats = self.redis_stats();
        store_health::StoreHealth {
            kind: self.describe(),
            memory,
            redis: stats.as_ref().map(|s| store_health::RedisHealth {
                checks: s.redis.redis_checks,
                errors: s.fallback.errors,
                timeouts: s.fallback.timeouts,
                refunds: s.redis.refunds,
                deny_cache_hits: s.deny_cache.hits,
                breaker: match s.fallback.breaker {
                    BreakerState::Closed => "closed",
                    BreakerState::HalfOpen => "half_open",
                    BreakerState::Open => "open",
                },
                breaker_opens: s.fallback.breaker_opens,
                open_slots: s
                    .slots
                    .iter()
                    .filter(|(_, state)| *state != BreakerState::Closed)
                    .map(|(range, _)| range.to_string())
                    .collect(),
                fallbacks: store_health::Fallbacks {
                    fail_open: s.fallback.fallback_fail_open,
                    fail_closed: s.fallback.fallback_fail_closed,
                    local: s.fallback.fallback_local,
                },
            }),
            hybrid: stats
                .as_ref()
                .and_then(|s| s.hybrid)
                .map(|h| store_health::HybridHealth {
                    local_decisions: h.local_decisions,
                    redis_checks: h.inner_checks,
                    units_leased: h.units_leased,
                    units_returned: h.units_returned,
                }),
        }
    }

    /// The Redis store under the stack, if the service runs on Redis.
    pub(crate) fn redis(&self) -> Option<&RedisStore> {
        let Backend::Redis(stack) = self else {
            return None;
        };
        Some(stack.inner().inner().redis())
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
            slots: stack.inner().parts(),
            hybrid: match remote {
                Remote::Direct(_) => None,
                Remote::Hybrid(h) => Some(h.stats()),
            },
        })
    }

    /// How Redis runs the store's code (`function` or `script`); `None`
    /// without Redis.
    pub(crate) fn redis_code(&self) -> Option<&'static str> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(stack) => Some(if stack.inner().inner().redis().uses_functions() {
                "function"
            } else {
                "script"
            }),
        }
    }

    /// Whether single GCRA and bucket checks go to the Tollgate module's
    /// commands (loaded on the server); `None` without Redis.
    pub(crate) fn redis_module(&self) -> Option<bool> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(stack) => Some(stack.inner().inner().redis().uses_module()),
        }
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
    fn supports(&self, algorithm: Algorithm, quota: &Quota) -> Result<(), StoreError> {
        match self {
            Backend::Memory(m) => m.supports(algorithm, quota),
            Backend::Redis(r) => r.supports(algorithm, quota),
        }
    }

    fn decides_at_once(&self) -> bool {
        match self {
            Backend::Memory(m) => m.decides_at_once(),
            Backend::Redis(_) => false,
        }
    }

    fn known(&self, limits: &[Limit<'_>]) -> Option<Outcome> {
        match self {
            Backend::Memory(m) => m.known(limits),
            Backend::Redis(r) => r.known(limits),
        }
    }

    async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        match self {
            Backend::Memory(m) => m.check(limits).await,
            // Boxed: the Redis future is kilobytes, and unboxed it would make
            // every check's future (memory ones too) that size, to be copied
            // on each request; a network call can afford the allocation.
            Backend::Redis(r) => Box::pin(r.check(limits)).await,
        }
    }

    async fn check_each(&self, limits: &[Limit<'_>]) -> Vec<Result<Outcome, StoreError>> {
        match self {
            Backend::Memory(m) => m.check_each(limits).await,
            // Boxed, as a check is.
            Backend::Redis(r) => Box::pin(r.check_each(limits)).await,
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

    async fn reset(&self, limits: &[Limit<'_>]) -> Result<(), StoreError> {
        match self {
            Backend::Memory(m) => m.reset(limits).await,
            Backend::Redis(r) => Box::pin(r.reset(limits)).await,
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
