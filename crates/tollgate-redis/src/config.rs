//! How the Redis store is configured.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::Clock;
#[cfg(doc)]
use tollgate_core::StoreError;

/// Where checks read the time.
#[derive(Clone, Default)]
pub enum TimeSource {
    /// Redis's `TIME`, read inside the script: every app server sees the same
    /// clock, so their skew does not matter. The default.
    #[default]
    Redis,
    /// A clock passed in (nanoseconds, truncated to microseconds for the
    /// script). For tests and simulations: with a `ManualClock` the Redis store
    /// decides exactly like the memory store on the same clock. Give the
    /// wrappers above it the same clock.
    Clock(Arc<dyn Clock>),
}

impl fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeSource::Redis => f.write_str("Redis"),
            TimeSource::Clock(_) => f.write_str("Clock(..)"),
        }
    }
}

/// The Redis store's settings. `RedisConfig::default()` is what a service wants.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Prepended to every key: `<prefix>:<algorithm>:{<tag>}...`. No braces.
    pub prefix: String,
    /// How long one round trip to Redis may take before the call fails with
    /// [`StoreError::Timeout`]. Default 10 ms: a healthy Redis answers a script
    /// in well under a millisecond on a LAN, so 10 ms only trips on a real stall
    /// (a fork, a failover, a lost connection) while bounding the latency it adds.
    pub timeout: Duration,
    /// Where the time comes from. Default [`TimeSource::Redis`].
    pub time: TimeSource,
    /// Added to every TTL. Zero by default: a key lives exactly until its state
    /// is back to full. Tests that inject a clock running apart from Redis's set
    /// it so keys do not expire in real time under them.
    pub extra_ttl: Duration,
    /// The most checks sent in one script call to a single server: concurrent
    /// checks queue while calls are in flight and go together in the next one
    /// (each still all-or-nothing on its own). 1 sends every check alone.
    /// Default 64. A cluster sends every check alone.
    pub max_batch: usize,
    /// Load the store's code as a Redis Function (`FUNCTION LOAD`, `FCALL`)
    /// where the server has functions (Redis ≥ 7.0) and allows them; else,
    /// or when false, as a script (`EVALSHA`). A function survives a
    /// failover and a restart with persistence; a script is reloaded by the
    /// first call that misses it. Default true.
    pub functions: bool,
    /// Send checks to the Tollgate module's `TOLLGATE.CHECK` (the code's
    /// entry point, natively) when the server has the module loaded (asked
    /// at connect, `COMMAND INFO`): checks, dry runs, refunds and lease
    /// releases of every algorithm, on the same state as the Lua code; what
    /// writes hybrid leases' records still calls the code. Default true;
    /// false always calls the code.
    pub module: bool,
    /// The CA, client certificate and hostname check of a `rediss://` or
    /// `rediss+cluster://` URL's TLS. Default: the system's roots, no client
    /// certificate, hostnames checked. Refused with a URL without TLS.
    pub tls: RedisTls,
}

/// TLS settings for `rediss://` and `rediss+cluster://` URLs (rustls).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// The PEM certificates of the CAs that sign the servers' certificates,
    /// in place of the system's roots.
    pub ca: Option<Vec<u8>>,
    /// The PEM certificate chain and private key the client presents, for
    /// servers that require client certificates (`tls-auth-clients yes`).
    pub client_identity: Option<ClientIdentity>,
    /// Accepts a server certificate that does not name the host connected to;
    /// its chain is still verified against the roots.
    pub skip_hostname_verification: bool,
}

impl RedisTls {
    /// Whether anything differs from the default.
    pub(crate) fn is_set(&self) -> bool {
        *self != RedisTls::default()
    }
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.as_ref().map(|_| ".."))
            .field("client_identity", &self.client_identity)
            .field(
                "skip_hostname_verification",
                &self.skip_hostname_verification,
            )
            .finish()
    }
}

/// A client certificate chain and its key, PEM. Its `Debug` shows neither.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate chain, PEM.
    pub cert: Vec<u8>,
    /// The private key, PEM.
    pub key: Vec<u8>,
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientIdentity(..)")
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            prefix: "tollgate".to_owned(),
            timeout: Duration::from_millis(10),
            time: TimeSource::Redis,
            extra_ttl: Duration::ZERO,
            max_batch: 64,
            functions: true,
            module: true,
            tls: RedisTls::default(),
        }
    }
}
