//! Watching decisions: the [`Observer`] every decision is reported to, and
//! what it is told ([`Decided`]).

use std::time::Duration;

use tollgate_core::StoreError;

use crate::Descriptor;

use super::verdict::Verdict;

/// One decision, as observers see it.
#[derive(Debug, Clone, Copy)]
pub struct Decided<'a> {
    /// The request's domain (`None` for an ad-hoc check).
    pub domain: Option<&'a str>,
    /// The request's descriptors, in the order of the verdict's (empty for an
    /// ad-hoc check).
    pub descriptors: &'a [Descriptor],
    /// What was decided.
    pub verdict: &'a Verdict,
    /// The request's `hits_addend` (0 for an ad-hoc check); see
    /// [`Decided::cost`].
    pub hits_addend: u64,
    /// An ad-hoc check's key, as the caller named it (before namespacing);
    /// `None` for a policy request.
    pub adhoc_key: Option<&'a str>,
}

impl Decided<'_> {
    /// What the descriptor at `index` cost: its own `hits_addend`, else the
    /// request's (Envoy reads 0 as 1).
    pub fn cost(&self, index: usize) -> u64 {
        self.descriptors
            .get(index)
            .and_then(|d| d.hits_addend)
            .unwrap_or(self.hits_addend.max(1))
    }
}

/// Watches every decision the enforcer makes, whatever the door: metrics,
/// logs, live pages. Called on the request's task, after the decision and
/// before the door answers, so it must be quick.
pub trait Observer: Send + Sync + 'static {
    /// One request was decided.
    fn decided(&self, decided: &Decided<'_>);

    /// The store could not check a request's limits (enforcing ones, or only
    /// `shadow` ones); the failure policies decided.
    fn store_failed(&self, error: &StoreError, shadow: bool) {
        let _ = (error, shadow);
    }

    /// A store check took `elapsed` (`ok`: it answered).
    fn store_call(&self, elapsed: Duration, ok: bool) {
        let _ = (elapsed, ok);
    }

    /// A permit could not be given back; it lapses after its period.
    fn release_failed(&self, error: &StoreError) {
        let _ = error;
    }
}

/// An observer that watches nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn decided(&self, _: &Decided<'_>) {}
}

/// Two observers watching the same decisions, `A` first: how a service
/// attaches both its metrics and a live view to its one enforcer.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn decided(&self, decided: &Decided<'_>) {
        self.0.decided(decided);
        self.1.decided(decided);
    }

    fn store_failed(&self, error: &StoreError, shadow: bool) {
        self.0.store_failed(error, shadow);
        self.1.store_failed(error, shadow);
    }

    fn store_call(&self, elapsed: Duration, ok: bool) {
        self.0.store_call(elapsed, ok);
        self.1.store_call(elapsed, ok);
    }

    fn release_failed(&self, error: &StoreError) {
        self.0.release_failed(error);
        self.1.release_failed(error);
    }
}
