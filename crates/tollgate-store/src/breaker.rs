//! The fallback's circuit breaker: after `threshold` consecutive failures it
//! opens and keeps every check away from the inner store. Requests never
//! close it: the fallback's prober task does, when a probe of the inner store
//! succeeds (half-open is "a probe is out"). So no request, cancelled or not,
//! can leave it half-open.
//!
//! Its time is the prober's (tokio's) timer: it is about the inner store's
//! health, not about rate limit time.
//!
//! An inner store made of parts that fail alone (`Store::domain`: a Redis
//! Cluster's slot ranges) gets a breaker per part, so that a failing part
//! sends only its own keys to the failure policies.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use parking_lot::RwLock;
use tokio::sync::Notify;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// The circuit breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BreakerState {
    /// Checks go to the inner store.
    #[default]
    Closed,
    /// Checks are decided by their failure policies without calling the inner
    /// store; the prober waits out the cool-down.
    Open,
    /// The prober is asking the inner store whether it answers; checks still
    /// use their failure policies.
    HalfOpen,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    state: AtomicU8,
    failures: AtomicU32,
    opens: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(threshold: u32) -> Self {
        Self {
            threshold: threshold.max(1),
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            opens: AtomicU64::new(0),
        }
    }

    /// Whether a call may go to the inner store.
    pub(crate) fn admit(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED
    }

    /// Whether the last call answered (no failure since the last success
    /// or probe).
    pub(crate) fn answering(&self) -> bool {
        self.failures.load(Ordering::Acquire) == 0
    }

    pub(crate) fn success(&self) {
        self.failures.store(0, Ordering::Release);
    }

    /// Records a failure; true when it opened the breaker.
    pub(crate) fn failure(&self) -> bool {
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if failures < self.threshold
            || self
                .state
                .compare_exchange(CLOSED, OPEN, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return false;
        }
        self.opens.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The prober sends a probe.
    pub(crate) fn probing(&self) {
        self.state.store(HALF_OPEN, Ordering::Release);
    }

    /// The probe's answer: closes the breaker, or opens it for another cool-down.
    pub(crate) fn probed(&self, answered: bool) {
        if answered {
            self.failures.store(0, Ordering::Release);
            self.state.store(CLOSED, Ordering::Release);
        } else {
            self.state.store(OPEN, Ordering::Release);
        }
    }

    pub(crate) fn opens(&self) -> u64 {
        self.opens.load(Ordering::Relaxed)
    }

    pub(crate) fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            CLOSED => BreakerState::Closed,
            OPEN => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }
}

/// A part of the inner store and its breaker; `None` names the whole store.
pub(crate) type Part = (Option<Arc<str>>, Arc<Breaker>);

/// The breakers of the inner store: one for the whole, one per part.
#[derive(Debug)]
pub(crate) struct Breakers {
    threshold: u32,
    whole: Arc<Breaker>,
    /// Parts are few (a cluster's slot ranges), so this stays small.
    parts: RwLock<HashMap<Arc<str>, Arc<Breaker>>>,
    /// Wakes the prober when a breaker opens.
    pub(crate) opened: Notify,
}

impl Breakers {
    pub(crate) fn new(threshold: u32) -> Self {
        Self {
            threshold,
            whole: Arc::new(Breaker::new(threshold)),
            parts: RwLock::new(HashMap::new()),
            opened: Notify::new(),
        }
    }

    /// The breaker of the part `domain` names (of the whole store for `None`).
    pub(crate) fn of(&self, domain: Option<Arc<str>>) -> Part {
        let Some(name) = domain else {
            return (None, Arc::clone(&self.whole));
        };
        if let Some(breaker) = self.parts.read().get(&name) {
            return (Some(name), Arc::clone(breaker));
        }
        let breaker = Arc::clone(
            self.parts
                .write()
                .entry(Arc::clone(&name))
                .or_insert_with(|| Arc::new(Breaker::new(self.threshold))),
        );
        (Some(name), breaker)
    }

    /// Records a failure of `part`; true when it opened its breaker (the
    /// prober is woken).
    pub(crate) fn failure(&self, part: &Part) -> bool {
        let opened = part.1.failure();
        if opened {
            self.opened.notify_one();
        }
        opened
    }

    /// The parts whose breaker is not closed.
    pub(crate) fn not_closed(&self) -> Vec<Part> {
        let whole =
            (self.whole.state() != BreakerState::Closed).then(|| (None, Arc::clone(&self.whole)));
        let parts = self.parts.read();
        let open = parts
            .iter()
            .filter(|(_, b)| b.state() != BreakerState::Closed)
            .map(|(name, b)| (Some(Arc::clone(name)), Arc::clone(b)));
        whole.into_iter().chain(open).collect()
    }

    /// The least healthy state of any breaker: open if one is.
    pub(crate) fn state(&self) -> BreakerState {
        let parts = self.parts.read();
        let states = std::iter::once(self.whole.state()).chain(parts.values().map(|b| b.state()));
        states
            .max_by_key(|s| match s {
                BreakerState::Closed => 0,
                BreakerState::HalfOpen => 1,
                BreakerState::Open => 2,
            })
            .unwrap_or_default()
    }

    /// Times any breaker opened.
    pub(crate) fn opens(&self) -> u64 {
        let parts = self.parts.read();
        parts
            .values()
            .fold(self.whole.opens(), |n, b| n.saturating_add(b.opens()))
    }

    /// Each part's name and breaker state, by name.
    pub(crate) fn parts(&self) -> Vec<(Arc<str>, BreakerState)> {
        let mut parts: Vec<_> = self
            .parts
            .read()
            .iter()
            .map(|(name, b)| (Arc::clone(name), b.state()))
            .collect();
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_only_a_probe_closes_it() {
        let b = Breaker::new(3);
        assert!(b.admit());
        assert!(!b.failure());
        b.success();
        assert!(!b.failure() && !b.failure());
        assert!(b.failure(), "the third consecutive failure opens it");
        assert_eq!((b.state(), b.opens()), (BreakerState::Open, 1));
        assert!(!b.admit());
        assert!(!b.failure(), "already open");
        b.success();
        assert!(!b.admit(), "a late success of a request does not close it");
        b.probing();
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(!b.admit());
        b.probed(false);
        assert_eq!(b.state(), BreakerState::Open);
        b.probing();
        b.probed(true);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.admit());
        assert!(!b.failure(), "the count started again");
        assert_eq!(b.opens(), 1);
    }
}
