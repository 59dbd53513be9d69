//! What the wrappers derive from a limit without asking their inner store.

use tollgate_core::{Limit, Outcome, Stamped, StoreError};

/// The identity of a limit's budget: algorithm and key, as the stores keep it.
pub(crate) fn budget(limit: &Limit<'_>) -> String {
    format!("{}\u{0}{}", limit.algorithm.name(), limit.key)
}

/// What a wrapper answers for a limit its inner store's
/// [`tollgate_core::LeaseStore::check_each_stamped`] left unanswered (it answered fewer
/// limits than it was asked): a failure of that store, so that the
/// limit's failure policy decides.
pub(crate) fn unanswered() -> StoreError {
    StoreError::Backend {
        source: "the store answered fewer limits than it was asked".into(),
        retryable: false,
    }
}

/// The outcomes of stamped answers, for a wrapper's [`tollgate_core::Store::check_each`].
pub(crate) fn outcomes(
    stamped: Vec<Result<Stamped, StoreError>>,
) -> Vec<Result<Outcome, StoreError>> {
    stamped
        .into_iter()
        .map(|answer| answer.map(|s| s.outcome))
        .collect()
}
