//! The `store:` section of a config file: how `tollgate serve` builds the
//! store the limits live in. Every field is optional; a command-line flag (or
//! its environment variable) overrides the file, and the file overrides the
//! defaults. The store is built once, at start-up: a reload that changes this
//! section changes nothing until the next start.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// How the service's store is built (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// Redis: `redis://host:port` for one server, or
    /// `redis+cluster://host:port,host:port` for a cluster (`--redis`).
    pub redis: Option<String>,
    /// How long a Redis round trip may take (`--redis-timeout`), e.g. `10ms`.
    #[serde(default, deserialize_with = "duration")]
    pub redis_timeout: Option<Duration>,
    /// Deny keys that Redis denied locally until their `retry_after` passes
    /// (`--deny-cache`).
    pub deny_cache: Option<bool>,
    /// Consecutive Redis failures that open the breaker (`--breaker-failures`).
    pub breaker_failures: Option<u32>,
    /// How long the open breaker waits between probes (`--breaker-cool-down`).
    #[serde(default, deserialize_with = "duration")]
    pub breaker_cool_down: Option<Duration>,
    /// Hybrid mode: local leases of hot keys' budgets (`--hybrid`).
    pub hybrid: Option<bool>,
    /// In hybrid mode, the most an instance leases of a key's capacity, as a
    /// fraction (`--hybrid-max-lease`).
    pub hybrid_max_lease: Option<f64>,
    /// In hybrid mode, how long leased units may stay unspent
    /// (`--hybrid-lease-ttl`).
    #[serde(default, deserialize_with = "duration")]
    pub hybrid_lease_ttl: Option<Duration>,
    /// The most keys the in-process store holds (`--max-keys`).
    pub max_keys: Option<u64>,
    /// The part of what Redis last reported remaining that one instance may
    /// spend locally when Redis does not answer (`--fallback-share`).
    pub fallback_share: Option<f64>,
}

/// A duration written as Tollgate's configs write them (`10ms`, `1s`, `1m`).
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = Option::<String>::deserialize(d)?;
    text.map(|t| crate::parse_duration(&t).map_err(serde::de::Error::custom))
        .transpose()
}
