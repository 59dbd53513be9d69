//! Decisions the wrappers make up without asking their inner store.

use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Limit};

/// The decision's `limit`: the burst for buckets, the limit otherwise (as the
/// core's state machines report it).
pub(crate) fn capacity(limit: &Limit<'_>) -> u64 {
    match limit.algorithm {
        Algorithm::TokenBucket
        | Algorithm::Gcra
        | Algorithm::LeakyBucket
        | Algorithm::LeakyBucketShaping { .. } => limit.quota.burst(),
        _ => limit.quota.limit(),
    }
}

/// The decision of a limit that was not counted: allowed, its whole capacity
/// left.
pub(crate) fn untouched(limit: &Limit<'_>) -> Decision {
    Decision {
        allowed: true,
        limit: capacity(limit),
        remaining: capacity(limit),
        reset_after: Duration::ZERO,
        retry_after: None,
        delay: Duration::ZERO,
    }
}

/// The identity of a limit's budget: algorithm and key, as the stores keep it.
pub(crate) fn budget(limit: &Limit<'_>) -> String {
    format!("{}\u{0}{}", limit.algorithm.name(), limit.key)
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
