//! The policy a layer enforces, swappable at run time.

use std::sync::Arc;

use crate::Policy;
use arc_swap::ArcSwap;

/// A shared, atomically replaceable [`Policy`]: keep a clone to reload the
/// policy of running layers (every request that starts after
/// [`PolicyHandle::store`] sees the new one; requests in flight keep theirs).
#[derive(Debug, Clone)]
pub struct PolicyHandle(Arc<ArcSwap<Policy>>);

impl PolicyHandle {
    /// A handle holding `policy`.
    pub fn new(policy: Policy) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(policy)))
    }

    /// The policy in force now.
    pub fn load(&self) -> Arc<Policy> {
        self.0.load_full()
    }

    /// The policy in force now, for the length of one request: cheaper than
    /// [`PolicyHandle::load`] on a hot path (no reference count is touched,
    /// so concurrent requests do not contend on one cache line).
    pub fn guard(&self) -> arc_swap::Guard<Arc<Policy>> {
        self.0.load()
    }

    /// Puts `policy` in force.
    pub fn store(&self, policy: Policy) {
        self.0.store(Arc::new(policy));
    }
}

impl From<Policy> for PolicyHandle {
    fn from(policy: Policy) -> Self {
        Self::new(policy)
    }
}

impl From<Arc<ArcSwap<Policy>>> for PolicyHandle {
    /// Shares a policy cell that something else (a reloader) already swaps.
    fn from(cell: Arc<ArcSwap<Policy>>) -> Self {
        Self(cell)
    }
}
