//! [`TokioClock`]: the service's time read from tokio's clock.

use tollgate_core::{Clock, IntoNanos, Nanos};

/// Epoch nanoseconds that follow tokio's clock: a fixed `base` plus the
/// time [`tokio::time::Instant`] says has passed since the clock was made.
///
/// Under `#[tokio::test(start_paused = true)]` the algorithms and the
/// enforcer then read the same virtual time that tokio's timers (a shaped
/// request's delay, the reload watcher's interval) run on, so seconds of
/// the service's time pass at once instead of being waited for. In
/// production the service reads [`tollgate_core::SystemClock`]; this clock
/// does not follow the wall clock's steps.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: Nanos,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `base` (epoch nanoseconds) now. Made inside a paused
    /// runtime, it starts at that runtime's current instant.
    pub fn new(base: Nanos) -> Self {
        Self {
            base,
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        let elapsed = self.origin.elapsed().into_nanos();
        self.base.saturating_add(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_time_from_its_base() {
        let clock = TokioClock::new(1_000);
        assert_eq!(clock.now(), 1_000, "no time passes while paused");
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now(), 1_000 + 1_500_000_000);
    }
}
