//! What the wrappers derive from a limit without asking their inner store.

use tollgate_core::Limit;

/// The identity of a limit's budget: algorithm and key, as the stores keep it.
pub(crate) fn budget(limit: &Limit<'_>) -> String {
    format!("{}\u{0}{}", limit.algorithm.name(), limit.key)
}
