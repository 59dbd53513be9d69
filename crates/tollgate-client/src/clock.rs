//! Time and sleeping, injectable so the schedule can be tested without waiting.

use std::future::{Future, ready};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Where the client reads time and how it waits.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time since an arbitrary origin.
    fn now(&self) -> Duration;
    /// The wall clock, to read `Retry-After` dates and epoch resets.
    fn wall(&self) -> SystemTime;
    /// Waits for `duration`.
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send;
}

/// Real time, through tokio's timer (so tests may also pause it).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(duration)
    }
}

/// A clock that moves only when slept on: every `sleep` returns at once,
/// advances the clock by its duration and is recorded, so a test can read the
/// exact schedule the client followed.
#[derive(Debug)]
pub struct ManualClock {
    state: Mutex<Manual>,
}

#[derive(Debug)]
struct Manual {
    now: Duration,
    wall: SystemTime,
    sleeps: Vec<Duration>,
}

impl ManualClock {
    /// A clock at zero whose wall clock reads `wall`.
    pub fn new(wall: SystemTime) -> Self {
        Self {
            state: Mutex::new(Manual {
                now: Duration::ZERO,
                wall,
                sleeps: Vec::new(),
            }),
        }
    }

    /// Moves both clocks forward by `by` without recording a sleep.
    pub fn advance(&self, by: Duration) {
        let mut state = self.lock();
        state.now += by;
        state.wall += by;
    }

    /// Every sleep so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.lock().sleeps.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Manual> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        self.lock().now
    }

    fn wall(&self) -> SystemTime {
        self.lock().wall
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        let mut state = self.lock();
        state.now += duration;
        state.wall += duration;
        state.sleeps.push(duration);
        ready(())
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }

    fn wall(&self) -> SystemTime {
        (**self).wall()
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        (**self).sleep(duration)
    }
}
