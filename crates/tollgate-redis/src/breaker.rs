//! A circuit breaker: after `threshold` consecutive failures it opens and keeps
//! checks away from Redis for a cool-down, then lets one probe through; the
//! probe's success closes it, its failure opens it again.
//!
//! It runs on real (monotonic) time whatever clock the checks use: it is about
//! Redis's health, not about rate limit time.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::BreakerState;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cool_down_ns: u64,
    origin: Instant,
    state: AtomicU8,
    failures: AtomicU32,
    opened_at: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cool_down_ns: u64::try_from(cool_down.as_nanos()).unwrap_or(u64::MAX),
            origin: Instant::now(),
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            opened_at: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether this call may go to Redis (possibly as the one probe).
    pub(crate) fn admit(&self) -> bool {
        match self.state.load(Ordering::Acquire) {
            CLOSED => true,
            OPEN => {
                let opened = self.opened_at.load(Ordering::Acquire);
                self.now().saturating_sub(opened) >= self.cool_down_ns
                    && self
                        .state
                        .compare_exchange(OPEN, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
            }
            _ => false,
        }
    }

    pub(crate) fn success(&self) {
        self.failures.store(0, Ordering::Release);
        if self.state.load(Ordering::Acquire) != CLOSED {
            self.state.store(CLOSED, Ordering::Release);
        }
    }

    /// Records a failure; true when it opened the breaker.
    pub(crate) fn failure(&self) -> bool {
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        let state = self.state.load(Ordering::Acquire);
        let open = match state {
            HALF_OPEN => true,
            CLOSED => failures >= self.threshold,
            _ => false,
        };
        if open
            && self
                .state
                .compare_exchange(state, OPEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.opened_at.store(self.now(), Ordering::Release);
            return true;
        }
        false
    }

    pub(crate) fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            CLOSED => BreakerState::Closed,
            OPEN => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_probes_once() {
        let b = Breaker::new(3, Duration::ZERO);
        assert!(b.admit());
        assert!(!b.failure());
        b.success();
        assert!(!b.failure() && !b.failure());
        assert!(b.failure(), "the third consecutive failure opens it");
        assert_eq!(b.state(), BreakerState::Open);
        // Cool-down zero: the next call is the probe, and only it.
        assert!(b.admit());
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(!b.admit());
        assert!(b.failure(), "a failed probe opens it again");
        assert!(b.admit());
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.admit() && b.admit());
    }

    #[test]
    fn stays_open_during_the_cool_down() {
        let b = Breaker::new(1, Duration::from_secs(3600));
        assert!(b.failure());
        assert!(!b.admit());
        assert_eq!(b.state(), BreakerState::Open);
    }
}
