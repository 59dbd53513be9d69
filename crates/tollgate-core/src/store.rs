use std::future::Future;
use std::time::Duration;

use smallvec::SmallVec;

use crate::{Algorithm, Decision, Quota};

/// One limit that a request must pass: whose budget (`key`), how much
/// (`quota`), how it is counted (`algorithm`) and what this request costs.
///
/// Everything is data, so the same limit can be checked in memory or sent to
/// Redis. Keys are the caller's namespace: two limits with the same key and
/// algorithm share one budget (a shared bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit<'a> {
    /// Whose budget this is, e.g. `"api:user:42"`.
    pub key: &'a str,
    /// How much may pass.
    pub quota: Quota,
    /// How it is counted.
    pub algorithm: Algorithm,
    /// What this request costs (Envoy's `hits_addend`); 0 only reads.
    pub cost: u64,
}

/// The decisions for all the limits of one request, in the order they were given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// One decision per limit. When any limit denies, nothing was consumed from
    /// any of them, and each decision says what that limit alone would have said.
    pub decisions: SmallVec<[Decision; 4]>,
}

impl Outcome {
    /// Whether every limit admitted the request.
    pub fn allowed(&self) -> bool {
        self.decisions.iter().all(|d| d.allowed)
    }

    /// The decision to report to the client: on a deny, the denying limit that
    /// asks the client to wait longest; on an allow, the one with the fewest
    /// units left (then the latest reset). `None` when there were no limits.
    pub fn most_restrictive(&self) -> Option<&Decision> {
        if self.allowed() {
            self.decisions
                .iter()
                .min_by_key(|d| (d.remaining, std::cmp::Reverse(d.reset_after)))
        } else {
            // A denial that can never pass (`None`) outranks any finite wait.
            self.decisions
                .iter()
                .filter(|d| !d.allowed)
                .max_by_key(|d| d.retry_after.map_or((1, Duration::ZERO), |r| (0, r)))
        }
    }
}

/// Why a store could not decide. A store that can decide never errs: a deny is
/// an [`Outcome`], not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend did not answer in time.
    #[error("store timed out after {0:?}")]
    Timeout(Duration),
    /// The backend failed.
    #[error("store backend failed: {source}")]
    Backend {
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Whether the same call may succeed if tried again.
        retryable: bool,
    },
    /// The request itself cannot be checked (e.g. a key the backend cannot hold).
    #[error("invalid limit: {0}")]
    Invalid(String),
}

impl StoreError {
    /// Whether trying the same call again may help (a timeout or a passing fault).
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Timeout(_) => true,
            StoreError::Backend { retryable, .. } => *retryable,
            StoreError::Invalid(_) => false,
        }
    }
}

/// Where limits keep their state: in memory, in Redis, or both.
///
/// One call checks all the limits of one request atomically: the request is
/// admitted only if every limit admits it, and a deny by any limit consumes
/// nothing from the others.
pub trait Store: Send + Sync {
    /// Checks and, if every limit allows, consumes `limits`.
    fn check(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// Gives back what admitted concurrency limits hold (other algorithms
    /// ignore it): call once per admitted request when it ends.
    fn release(&self, limits: &[Limit<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send;
}
