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
//! string caps are the enforcer's (`tollgate_policy::RequestLimits`),
//! the same at every door.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How the check APIs read request bodies: see the module's documentation.
#[derive(Debug)]
pub struct Bodies {
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
pub enum Refused {
    /// It declares more than `--max-request-bytes`.
    TooLarge,
    /// The budget of bytes being read is spent.
    Busy,
}

/// A body's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Reserved {
    _permit: OwnedSemaphorePermit,
}

impl Bodies {
    /// Bodies of at most `max_bytes`, each read within `read_timeout`, at
    /// most `budget` bytes of them at once (saturating at what a semaphore
    /// counts).
    pub fn new(max_bytes: u32, read_timeout: Duration, budget: u64) -> Self {
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
    pub fn max_bytes(&self) -> u32 {
        self.max_bytes
    }

    /// The budget's share of a body that declares `declared` bytes (`None`:
    /// it does not say), or why it is not read.
    pub fn reserve(&self, declared: Option<u64>) -> Result<Reserved, Refused> {
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
    pub fn read_timeout(&self) -> Duration {
        self.read_timeout
    }

    /// `work` (reading a body, and answering it), or `None` once
    /// `--body-read-timeout` has passed.
    pub async fn within<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        tokio::time::timeout(self.read_timeout, work).await.ok()
    }

    /// A timer of `--body-read-timeout` from now.
    pub fn timer(&self) -> tokio::time::Sleep {
        tokio::time::sleep(self.read_timeout)
    }
}
