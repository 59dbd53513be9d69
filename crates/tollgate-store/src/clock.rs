//! The memory store's default clock.

use tollgate_core::{Clock, Nanos};

/// Monotonic nanoseconds since the clock was made, read from the CPU's time
/// stamp counter where it is invariant (and from the operating system's
/// monotonic clock where it is not), through the `quanta` crate.
///
/// It means what [`tollgate_core::MonotonicClock`] means, at a third of the
/// cost: reading the counter and scaling it took about 13 ns on the benchmark
/// machine (a KVM guest), where `Instant::now()`, through `clock_gettime`,
/// took about 37 ns. That difference was a third of an in-process check, so
/// the memory store reads this clock unless given another. (It is the clock
/// `governor` reads, too.)
#[derive(Debug, Clone)]
pub struct FastClock {
    clock: quanta::Clock,
    origin: u64,
    /// Nanoseconds per 2³² raw units, as quanta's calibration scales them:
    /// a multiply and a constant shift per reading, where quanta's own
    /// `delta_as_nanos` also matches on its clock's kind and shifts by a
    /// variable amount (ten instructions more, on a path where each costs).
    per_2_32: u64,
}

/// The fixed point of [`FastClock::per_2_32`].
const SHIFT: u32 = 32;

impl FastClock {
    /// A clock whose origin is now. The first one made in a process calibrates
    /// the counter against the monotonic clock, which takes from half a
    /// millisecond to 200 ms.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        let per_2_32 = clock.delta_as_nanos(0, 1 << SHIFT);
        Self {
            clock,
            origin,
            per_2_32,
        }
    }

    /// `raw` units in nanoseconds.
    #[inline]
    fn scale(&self, raw: u64) -> Nanos {
        ((u128::from(raw) * u128::from(self.per_2_32)) >> SHIFT) as Nanos
    }
}

impl Default for FastClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for FastClock {
    #[inline]
    fn now(&self) -> Nanos {
        // 584 years of uptime before this wraps; a reading that is not after the
        // origin (counters a few cycles apart between cores) counts as the origin.
        self.scale(self.clock.raw().saturating_sub(self.origin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn fast_clock_scales_as_quanta_does() {
        let clock = FastClock::new();
        for raw in [
            0,
            1,
            999,
            1 << 20,
            3_000_000_000,
            1 << 40,
            1 << 50,
            u64::MAX >> 8,
        ] {
            let quanta = clock.clock.delta_as_nanos(0, raw);
            // The fixed point's rounding: under a nanosecond per 2³² units.
            let apart = clock.scale(raw).abs_diff(quanta);
            assert!(apart <= (raw >> SHIFT) + 1, "{raw} units: {apart} ns apart");
        }
    }

    #[test]
    fn fast_clock_never_goes_back_and_keeps_up_with_the_monotonic_clock() {
        let clock = FastClock::new();
        let start = Instant::now();
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(20));
        let b = clock.now();
        let elapsed = start.elapsed();
        assert!(b >= a);
        // The readings bracket a sleep of at least 20 ms and are bracketed by
        // the OS clock's; a generous band, as calibration is not exact.
        let ns = u64::try_from(elapsed.as_nanos()).unwrap();
        assert!(b - a >= 10_000_000, "{} ns across a 20 ms sleep", b - a);
        assert!(b - a <= ns * 2, "{} ns where the OS clock saw {ns}", b - a);
    }
}
