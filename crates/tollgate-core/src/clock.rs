use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Time in nanoseconds since a clock's origin.
pub type Nanos = u64;

/// The one conversion from a [`Duration`] to [`Nanos`], saturating at
/// `u64::MAX` nanoseconds (about 584 years), so that no caller writes the
/// cast again and no very long duration wraps.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::IntoNanos;
///
/// assert_eq!(Duration::from_millis(3).into_nanos(), 3_000_000);
/// assert_eq!(Duration::MAX.into_nanos(), u64::MAX);
/// ```
pub trait IntoNanos {
    /// Whole nanoseconds, saturated at `u64::MAX`.
    fn into_nanos(self) -> Nanos;
}

impl IntoNanos for Duration {
    #[inline]
    fn into_nanos(self) -> Nanos {
        u64::try_from(self.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A source of time for limiters and stores. Algorithms never call it
/// themselves: whoever steps them reads the clock and passes `now` in.
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds since this clock's origin.
    fn now(&self) -> Nanos;
}

/// The real clock: monotonic nanoseconds since the clock was made.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        // 584 years of uptime before this saturates.
        self.origin.elapsed().into_nanos()
    }
}

/// Wall-clock time: nanoseconds since the Unix epoch.
///
/// Services use it so that fixed windows align to calendar seconds, minutes and
/// days (as envoyproxy/ratelimit's do) and reset times can be sent as epoch
/// seconds. It can step backwards (NTP); every algorithm treats that as no
/// time passing, or, with a single timestamp, as stricter, never looser.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, IntoNanos::into_nanos)
    }
}

/// A clock that moves only when told to: the clock of tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A manual clock reading `now` nanoseconds.
    pub fn new(now: Nanos) -> Self {
        Self {
            now: AtomicU64::new(now),
        }
    }

    /// Moves the clock forward by `by`, saturating at `u64::MAX` nanoseconds.
    pub fn advance(&self, by: Duration) {
        let by = by.into_nanos();
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the clock to `now`, which may be earlier than its current reading.
    pub fn set(&self, now: Nanos) {
        self.now.store(now, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Relaxed)
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_advances_and_saturates() {
        let clock = ManualClock::new(5);
        clock.advance(Duration::from_nanos(10));
        assert_eq!(clock.now(), 15);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), u64::MAX);
        clock.set(3);
        assert_eq!(clock.now(), 3);
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let clock = MonotonicClock::new();
        let a = clock.now();
        assert!(clock.now() >= a);
    }
}
