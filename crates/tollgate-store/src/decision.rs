//! What the wrappers derive from a limit without asking their inner store.

use std::time::Duration;

use tollgate_core::Limit;

/// The identity of a limit's budget: algorithm and key, as the stores keep it.
pub(crate) fn budget(limit: &Limit<'_>) -> String {
    format!("{}\u{0}{}", limit.algorithm.name(), limit.key)
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
