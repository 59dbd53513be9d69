//! Tollgate's Redis and Redis Cluster store.
//!
//! [`RedisStore`] implements [`tollgate_core::Store`] for every algorithm of
//! tollgate-core, so the same limits hold across every instance of a service.
//! It only talks to Redis: deciding when Redis cannot answer, caching denies
//! and leasing budgets are the wrappers of `tollgate_store` (`Fallback`,
//! `DenyCache`, `Hybrid`), stacked over it as a service wants:
//!
//! - **One atomic call per check.** All the limits of a request whose keys
//!   share a slot are stepped by one call of Tollgate's Lua code, a Redis
//!   Function (`FCALL`) where the server has functions, else a script
//!   (`EVALSHA`); either is loaded again when a call finds it missing (a
//!   restart, `FUNCTION FLUSH`, `SCRIPT FLUSH`). All-or-nothing exactly like
//!   the memory store: a deny by one limit consumes nothing from the others,
//!   and each decision says what that limit alone says.
//! - **Counting without a script.** A fixed window or hit counter checked
//!   alone is `INCRBY` and `PEXPIRE … NX` on its window's count, in one
//!   pipeline, as envoyproxy/ratelimit counts; the code steps the same count
//!   when the limit is checked beside others (all-or-nothing needs it). A
//!   request counts in the window of its own time.
//! - **Redis's clock.** The script reads `TIME`, so app servers' clock skew does
//!   not matter ([`TimeSource::Clock`] injects a clock for tests).
//! - **Microseconds inside Redis.** Lua numbers are doubles, exact up to 2^53;
//!   nanoseconds since 1970 do not fit, microseconds do (until 2255). Periods and
//!   emission intervals are rounded *up* to whole microseconds, and quotas whose
//!   numbers exceed 2^52 are refused with [`tollgate_core::StoreError::Invalid`].
//!   With whole-microsecond times, periods and emission intervals, decisions are
//!   identical to the memory store's, except that a sliding counter's
//!   `retry_after` is the memory store's rounded up to the microsecond.
//! - **TTLs.** Every key expires when its state is back to full; set on
//!   admission only, never extended by a deny.
//! - **Redis Cluster.** Keys are hash-tagged: the whole caller key is the tag,
//!   unless it starts with one (`{user:42}api`), braces inside are escaped. The
//!   limits of a request on several slots are checked slot group by slot group,
//!   the narrowest first; a later deny refunds what earlier groups took.
//! - **Throughput.** One multiplexed connection (or the cluster client's few)
//!   pipelines every concurrent check; checks that arrive while calls are in
//!   flight share the next call (each still atomic on its own), on a cluster
//!   across the slots of each node.
//! - **Failures are typed.** A call that exceeds the timeout (10 ms by
//!   default) is a [`StoreError::Timeout`]; a Redis error is a
//!   [`StoreError::Backend`] saying whether a retry could help. The `Fallback`
//!   wrapper turns them into each limit's [`FailurePolicy`].
//!   [`RedisStore::stats`] counts calls, errors, timeouts and refunds.
//! - **TLS.** `rediss://` (one server) and `rediss+cluster://` (a cluster)
//!   connect over TLS (rustls), with [`RedisConfig::tls`]'s CA, client
//!   certificate and hostname check.
//! - **Hybrid mode.** The store gives units back ([`LeaseStore::give_back`]) at the
//!   script's time ([`LeaseStore::check_stamped`]), which the `Hybrid` wrapper needs
//!   to lease slices of hot keys' budgets.
//!
//! ```no_run
//! use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota};
//! use tollgate_redis::{RedisConfig, RedisStore};
//! use tollgate_core::Store;
//! use tollgate_store::{DenyCache, Fallback, FallbackConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisStore::connect("redis://127.0.0.1:6379/0", RedisConfig::default()).await?;
//! // or: RedisStore::connect("redis+cluster://10.0.0.1:7000,10.0.0.2:7000", ...)
//! let store = DenyCache::new(Fallback::new(redis, FallbackConfig::default()), 65_536);
//! let user = Limit::new("{user:42}api", Quota::per_minute(60)?, Algorithm::Gcra);
//! // Uploads are refused rather than counted per instance while Redis is down.
//! let uploads = Limit::new("{user:42}uploads", Quota::per_hour(10)?, Algorithm::SlidingLog)
//!     .with_failure(FailurePolicy::FailClosed);
//! let outcome = store.check(&[user, uploads]).await?;
//! if !outcome.allowed() {
//!     let retry = outcome.most_restrictive().and_then(|d| d.retry_after());
//! }
//! # Ok(()) }
//! ```
//!
//! `docs/redis.md` describes the scripts, the key layout and every behaviour
//! that differs from the memory store.

mod batch;
mod cells;
mod code;
mod config;
mod conn;
mod keys;
mod lone;
mod native;
mod nodes;
mod script;
mod stats;
mod store;

pub use cells::{Cell, Cells};
pub use config::{ClientIdentity, RedisConfig, RedisTls, TimeSource};
pub use conn::ConnectError;
pub use stats::RedisStats;
pub use store::RedisStore;
pub use tollgate_core::FailurePolicy;

#[cfg(doc)]
use tollgate_core::{Store, StoreError};
