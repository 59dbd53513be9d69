//! What the check APIs take of a request: how large its body (a gRPC
//! message, an HTTP body) and its strings may be, how long its body may take
//! to arrive, and how many bytes of bodies the process reads at once.
//!
//! Without these, memory was the client's to spend (issue 39): one HTTP/2
//! connection opening 200 streams that each declared a 4,000,000-byte gRPC
//! message and sent all but its last byte held 778 MiB, past any idle
//! timeout (a stream in flight is not idle), and a 1 MiB value became a
//! 1 MiB Redis key. Now a body past `--max-request-bytes` is refused at
//! once (413, `RESOURCE_EXHAUSTED`), one still arriving after
//! `--body-read-timeout` is cut off (408, `DEADLINE_EXCEEDED`), and every
//! body being read holds its size (the most it may be, when not declared)
//! of one budget, `--request-body-budget`: when it is spent, a new request
//! is refused at once (503, `RESOURCE_EXHAUSTED`) rather than queued, so
//! held bodies cost at most the budget whatever the client does. The
//! string caps are the enforcer's ([`tollgate_policy::RequestLimits`]),
//! the same at every door.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tollgate_policy::RequestLimits;

/// The flags of what the check APIs take of a request; each also comes from
/// its `TOLLGATE_*` variable.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "requests")]
pub(crate) struct Args {
    /// The largest gRPC message and HTTP request body the check APIs take,
    /// in bytes (`RESOURCE_EXHAUSTED`, 413 beyond); a rate limit request
    /// takes a few hundred.
    #[arg(
        long,
        env = "TOLLGATE_MAX_REQUEST_BYTES",
        value_name = "BYTES",
        default_value_t = 64 * 1024,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_request_bytes: u32,

    /// How long a check API request's body may take to arrive, from its
    /// head; a gRPC call is answered within it too (`DEADLINE_EXCEEDED`, 408
    /// beyond).
    #[arg(
        long,
        env = "TOLLGATE_BODY_READ_TIMEOUT",
        value_name = "DURATION",
        default_value = "10s",
        value_parser = super::listeners::positive_duration
    )]
    pub(crate) body_read_timeout: Duration,

    /// The most bytes of check API request bodies being read at once, over
    /// every listener; a body counts its declared length, or
    /// `--max-request-bytes` when it declares none. Past it, a request is
    /// refused at once (`RESOURCE_EXHAUSTED`, 503).
    #[arg(
        long,
        env = "TOLLGATE_REQUEST_BODY_BUDGET",
        value_name = "BYTES",
        default_value_t = 64 * 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) request_body_budget: u64,

    /// The longest domain a check may name, in bytes (`INVALID_ARGUMENT`,
    /// 400 beyond).
    #[arg(
        long,
        env = "TOLLGATE_MAX_DOMAIN_BYTES",
        value_name = "BYTES",
        default_value_t = RequestLimits::default().domain_bytes
    )]
    pub(crate) max_domain_bytes: usize,

    /// The longest descriptor entry key, in bytes.
    #[arg(
        long,
        env = "TOLLGATE_MAX_KEY_BYTES",
        value_name = "BYTES",
        default_value_t = RequestLimits::default().key_bytes
    )]
    pub(crate) max_key_bytes: usize,

    /// The longest descriptor entry value, and `/v1/check`'s ad-hoc `key`,
    /// in bytes.
    #[arg(
        long,
        env = "TOLLGATE_MAX_VALUE_BYTES",
        value_name = "BYTES",
        default_value_t = RequestLimits::default().value_bytes
    )]
    pub(crate) max_value_bytes: usize,
}

impl Args {
    /// The enforcer's limits on a request's strings.
    pub(crate) fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            domain_bytes: self.max_domain_bytes,
            key_bytes: self.max_key_bytes,
            value_bytes: self.max_value_bytes,
            ..RequestLimits::default()
        }
    }

    /// The body policy these flags set.
    pub(crate) fn bodies(&self) -> Bodies {
        Bodies::new(
            self.max_request_bytes,
            self.body_read_timeout,
            self.request_body_budget,
        )
    }
}

/// How the check APIs read request bodies: see the module's documentation.
#[derive(Debug)]
pub(crate) struct Bodies {
    max_bytes: u32,
    read_timeout: Duration,
    budget: Arc<Semaphore>,
}

impl Default for Bodies {
    fn default() -> Self {
        Self::new(64 * 1024, Duration::from_secs(10), 64 * 1024 * 1024)
    }
}

/// Why a body is not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It declares more than `--max-request-bytes`.
    TooLarge,
    /// The budget of bytes being read is spent.
    Busy,
}

/// A body's share of the budget, given back when dropped.
#[derive(Debug)]
pub(crate) struct Reserved {
    _permit: OwnedSemaphorePermit,
}

impl Bodies {
    pub(crate) fn new(max_bytes: u32, read_timeout: Duration, budget: u64) -> Self {
        let permits = usize::try_from(budget)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self {
            max_bytes,
            read_timeout,
            budget: Arc::new(Semaphore::new(permits)),
        }
    }

    /// The largest body taken, in bytes.
    pub(crate) fn max_bytes(&self) -> u32 {
        self.max_bytes
    }

    /// The budget's share of a body that declares `declared` bytes (`None`:
    /// it does not say), or why it is not read.
    pub(crate) fn reserve(&self, declared: Option<u64>) -> Result<Reserved, Refused> {
        let bytes = match declared {
            Some(length) if length > u64::from(self.max_bytes) => return Err(Refused::TooLarge),
            Some(length) => u32::try_from(length).unwrap_or(self.max_bytes),
            None => self.max_bytes,
        };
        Arc::clone(&self.budget)
            .try_acquire_many_owned(bytes)
            .map(|permit| Reserved { _permit: permit })
            .map_err(|_| Refused::Busy)
    }

    /// `--body-read-timeout`.
    pub(crate) fn read_timeout(&self) -> Duration {
        self.read_timeout
    }

    /// `work` (reading a body, and answering it), or `None` once
    /// `--body-read-timeout` has passed.
    pub(crate) async fn within<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        tokio::time::timeout(self.read_timeout, work).await.ok()
    }

    /// A timer of `--body-read-timeout` from now.
    pub(crate) fn timer(&self) -> tokio::time::Sleep {
        tokio::time::sleep(self.read_timeout)
    }
}
