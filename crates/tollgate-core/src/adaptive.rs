//! An adaptive concurrency limit learned from latency: Envoy's
//! `adaptive_concurrency` gradient controller, as a pure state machine.
//!
//! The limit moves once per sample window (at least twice `min_rtt`) by
//! the gradient
//! `min_rtt × (1 + buffer) / sample_rtt`, clamped to `[0.5, 2]`, plus a
//! headroom of `√limit`:
//!
//! - `min_rtt` is the service's latency with almost nothing queued, measured
//!   in a probe: the limit is pinned to its floor until `probe_samples`
//!   requests have completed, and their median is taken. A probe runs at the
//!   start and again every `probe_interval`, so a service that became slower
//!   for good (heavier requests, a smaller machine) is re-measured rather than
//!   leaving the limit stuck at its floor;
//! - `sample_rtt` is the median of the latencies completed in the window
//!   (Envoy's default), so that a few slow requests do not move the limit
//!   while a queue, which slows every request, does.
//!
//! A gradient rather than Vegas: Vegas needs the queue length in requests,
//! which it estimates as `limit × (1 − min_rtt / rtt)` and compares with
//! fixed thresholds tuned per service; the gradient is the same ratio without
//! the thresholds, so it reacts in proportion (halving at most, doubling at
//! most per window) and one configuration fits services of any size.
//!
//! The limit never rises above four times the most requests seen in flight
//! during the window: a service that was never pushed has not shown it can
//! take more, and a limit far above the load would take several windows to
//! come down when the load arrives. (Four rather than two, so that traffic
//! allowed half the limit, as low priority is by default, still raises it.)

use std::time::Duration;

use crate::clock::Nanos;

/// The most latencies one window keeps.
const MAX_SAMPLES: usize = 4_096;

/// The controller's parameters. [`Gradient::new`] checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GradientConfig {
    /// The lowest limit, and the limit during a probe (at least 1).
    pub floor: u32,
    /// The highest limit.
    pub ceiling: u32,
    /// How long latencies are gathered before the limit moves.
    pub sample_window: Duration,
    /// How many completed requests a probe takes the median of (at least 1).
    pub probe_samples: u32,
    /// How often `min_rtt` is measured again.
    pub probe_interval: Duration,
    /// How much latency over `min_rtt` is tolerated before the limit falls,
    /// in percent.
    pub buffer_percent: u32,
}

impl Default for GradientConfig {
    fn default() -> Self {
        Self {
            floor: 3,
            ceiling: 1_000,
            sample_window: Duration::from_millis(100),
            probe_samples: 25,
            probe_interval: Duration::from_secs(60),
            buffer_percent: 25,
        }
    }
}

/// Parameters that make no controller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GradientError {
    /// A floor of 0 would never admit a request.
    #[error("the floor must be at least 1")]
    ZeroFloor,
    /// The ceiling is under the floor.
    #[error("the ceiling ({ceiling}) is under the floor ({floor})")]
    CeilingUnderFloor {
        /// The floor given.
        floor: u32,
        /// The ceiling given.
        ceiling: u32,
    },
    /// A probe of no samples measures nothing.
    #[error("a probe takes at least one sample")]
    ZeroProbeSamples,
    /// A window or interval of zero would move the limit on every request.
    #[error("the sample window and the probe interval must be longer than zero")]
    ZeroPeriod,
}

/// Where the controller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Measuring `min_rtt` at the floor.
    Probing,
    /// Moving the limit by the gradient until `next_probe`.
    Tracking { min_rtt: Nanos, next_probe: Nanos },
}

/// The learned limit: feed it each forwarded request's latency with
/// [`Gradient::sample`]; read it with [`Gradient::limit`].
#[derive(Debug, Clone)]
pub struct Gradient {
    config: GradientConfig,
    phase: Phase,
    limit: u32,
    /// The limit a probe goes back to once it has measured `min_rtt`.
    before_probe: u32,
    /// When the current window closes.
    window_end: Nanos,
    /// The latencies of the current window (or probe).
    samples: Vec<Nanos>,
    /// The most requests in flight seen in the window.
    peak_in_flight: u32,
}

impl Gradient {
    /// A controller that starts with a probe at `now`.
    ///
    /// # Errors
    ///
    /// When the parameters make no controller.
    pub fn new(config: GradientConfig, now: Nanos) -> Result<Self, GradientError> {
        if config.floor == 0 {
            return Err(GradientError::ZeroFloor);
        }
        if config.ceiling < config.floor {
            return Err(GradientError::CeilingUnderFloor {
                floor: config.floor,
                ceiling: config.ceiling,
            });
        }
        if config.probe_samples == 0 {
            return Err(GradientError::ZeroProbeSamples);
        }
        if config.sample_window.is_zero() || config.probe_interval.is_zero() {
            return Err(GradientError::ZeroPeriod);
        }
        Ok(Self {
            config,
            phase: Phase::Probing,
            limit: config.floor,
            // Until the first probe says more, start where a probe would end
            // on a service that has shown nothing: a few times the floor.
            before_probe: config.floor.saturating_mul(4).min(config.ceiling),
            window_end: now.saturating_add(nanos(config.sample_window)),
            samples: Vec::new(),
            peak_in_flight: 0,
        })
    }

    /// The requests that may be in flight now.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Whether the controller is measuring `min_rtt` (the limit is pinned
    /// to its floor).
    pub fn probing(&self) -> bool {
        self.phase == Phase::Probing
    }

    /// The latency with almost nothing queued, once a probe has measured it.
    pub fn min_rtt(&self) -> Option<Duration> {
        match self.phase {
            Phase::Probing => None,
            Phase::Tracking { min_rtt, .. } => Some(Duration::from_nanos(min_rtt)),
        }
    }

    /// The parameters.
    pub fn config(&self) -> &GradientConfig {
        &self.config
    }

    /// Records that a request was let in with `in_flight` requests in flight
    /// (itself included), for the cap on how far the limit may rise.
    pub fn admitted(&mut self, in_flight: u32) {
        self.peak_in_flight = self.peak_in_flight.max(in_flight);
    }

    /// Records that a forwarded request completed after `rtt` at `now`, and
    /// moves the limit when that closes a window or a probe. A `now` before
    /// an earlier one counts as no time passing.
    pub fn sample(&mut self, rtt: Duration, now: Nanos) {
        // The first samples of a window stand for it: memory stays bounded
        // however many requests one window sees.
        if self.samples.len() < MAX_SAMPLES {
            self.samples.push(nanos(rtt));
        }
        match self.phase {
            Phase::Probing => {
                if self.samples.len() >= self.config.probe_samples as usize {
                    let min_rtt = percentile(&mut self.samples, 50).max(1);
                    self.phase = Phase::Tracking {
                        min_rtt,
                        next_probe: now.saturating_add(nanos(self.config.probe_interval)),
                    };
                    self.limit = self.before_probe;
                    self.start_window(now, min_rtt);
                }
            }
            Phase::Tracking {
                min_rtt,
                next_probe,
            } => {
                if now < self.window_end {
                    return;
                }
                if now >= next_probe {
                    self.before_probe = self.limit;
                    self.limit = self.config.floor;
                    self.phase = Phase::Probing;
                    self.samples.clear();
                    return;
                }
                let sample_rtt = percentile(&mut self.samples, 50).max(1);
                self.limit = self.next_limit(min_rtt, sample_rtt);
                self.start_window(now, min_rtt);
            }
        }
    }

    /// The limit after a window whose latency was `sample_rtt`.
    fn next_limit(&self, min_rtt: Nanos, sample_rtt: Nanos) -> u32 {
        let tolerated = min_rtt as f64 * (1.0 + f64::from(self.config.buffer_percent) / 100.0);
        let gradient = (tolerated / sample_rtt as f64).clamp(0.5, 2.0);
        let moved = gradient * f64::from(self.limit);
        let proposed = moved + moved.sqrt();
        let cap = self
            .config
            .ceiling
            .min(self.peak_in_flight.saturating_mul(4).max(self.config.floor));
        // Only a rise is capped by the load: a fall always applies.
        let upper = if proposed > f64::from(self.limit) {
            f64::from(cap.max(self.limit))
        } else {
            f64::from(self.config.ceiling)
        };
        // In range by the clamp, so the cast cannot truncate.
        proposed
            .clamp(f64::from(self.config.floor), upper)
            .min(f64::from(self.config.ceiling)) as u32
    }

    /// Opens a window of at least twice `min_rtt`: a shorter one would be
    /// judged by requests let in under the limit before the last, and the
    /// limit would swing past its mark and back.
    fn start_window(&mut self, now: Nanos, min_rtt: Nanos) {
        self.samples.clear();
        self.peak_in_flight = 0;
        let window = nanos(self.config.sample_window).max(min_rtt.saturating_mul(2));
        self.window_end = now.saturating_add(window);
    }
}

/// The `p`th percentile of `samples` (not empty), by nearest rank.
fn percentile(samples: &mut [Nanos], p: usize) -> Nanos {
    let rank = (samples.len() * p).div_ceil(100).max(1) - 1;
    *samples.select_nth_unstable(rank).1
}

/// A duration in nanoseconds, saturating.
fn nanos(duration: Duration) -> Nanos {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A service that answers in `base` up to `capacity` requests in
    /// flight, and proportionally slower past it (a queue).
    fn latency(base: u64, capacity: u32, in_flight: u32) -> Duration {
        let load = u64::from(in_flight.max(capacity));
        Duration::from_nanos(base * load / u64::from(capacity))
    }

    /// Runs `windows` sample windows of a closed loop: as many requests in
    /// flight as the limit allows (capped by `demand`), each taking the
    /// service's latency at that concurrency. Returns the time reached.
    fn drive(
        gradient: &mut Gradient,
        now: &mut Nanos,
        windows: u32,
        demand: u32,
        service: impl Fn(u32) -> Duration,
    ) {
        for _ in 0..windows {
            let end = *now + 100 * MS;
            while *now < end {
                let in_flight = gradient.limit().min(demand);
                gradient.admitted(in_flight);
                let rtt = service(in_flight);
                *now += nanos(rtt) / u64::from(in_flight.max(1));
                gradient.sample(rtt, *now);
            }
        }
    }

    fn controller() -> (Gradient, Nanos) {
        (Gradient::new(GradientConfig::default(), 0).unwrap(), 0)
    }

    #[test]
    fn a_probe_pins_the_limit_to_the_floor_and_measures_the_median() {
        let (mut gradient, _) = controller();
        assert!(gradient.probing());
        assert_eq!(gradient.limit(), 3);
        for i in 0..24 {
            gradient.sample(Duration::from_millis(10 + i % 3), i * MS);
            assert!(gradient.probing());
        }
        gradient.sample(Duration::from_millis(500), 25 * MS);
        assert!(!gradient.probing());
        assert_eq!(gradient.min_rtt(), Some(Duration::from_millis(11)));
        assert_eq!(gradient.limit(), 12, "back to where a probe starts from");
    }

    #[test]
    fn the_limit_settles_near_the_capacity_of_a_saturating_service() {
        let (mut gradient, mut now) = controller();
        let service = |n| latency(10 * MS, 40, n);
        drive(&mut gradient, &mut now, 50, 400, service);
        let limit = gradient.limit();
        assert!((36..=70).contains(&limit), "limit {limit}");
    }

    #[test]
    fn the_limit_falls_when_the_service_slows_and_rises_when_it_recovers() {
        let (mut gradient, mut now) = controller();
        drive(&mut gradient, &mut now, 40, 400, |n| {
            latency(10 * MS, 100, n)
        });
        let healthy = gradient.limit();
        assert!(healthy >= 90, "healthy limit {healthy}");
        // The service loses most of its capacity.
        drive(&mut gradient, &mut now, 10, 400, |n| {
            latency(10 * MS, 10, n)
        });
        let degraded = gradient.limit();
        assert!(degraded <= 20, "degraded limit {degraded}");
        drive(&mut gradient, &mut now, 40, 400, |n| {
            latency(10 * MS, 100, n)
        });
        let recovered = gradient.limit();
        assert!(recovered >= 90, "recovered limit {recovered}");
    }

    #[test]
    fn a_service_slower_for_good_is_reprobed_rather_than_held_at_the_floor() {
        let (mut gradient, mut now) = controller();
        drive(&mut gradient, &mut now, 20, 400, |n| {
            latency(10 * MS, 50, n)
        });
        assert_eq!(gradient.min_rtt(), Some(Duration::from_millis(10)));
        // Every request now takes ten times longer, with the same capacity:
        // against the old min_rtt every window looks overloaded.
        let slow = |n| latency(100 * MS, 50, n);
        drive(&mut gradient, &mut now, 20, 400, slow);
        assert_eq!(
            gradient.limit(),
            3,
            "pinned at the floor by a stale min_rtt"
        );
        // Past the probe interval a probe measures the new latency.
        drive(&mut gradient, &mut now, 700, 400, slow);
        assert_eq!(gradient.min_rtt(), Some(Duration::from_millis(100)));
        assert!(gradient.limit() >= 40, "limit {}", gradient.limit());
    }

    #[test]
    fn an_idle_service_does_not_raise_the_limit_past_four_times_its_load() {
        let (mut gradient, mut now) = controller();
        drive(&mut gradient, &mut now, 30, 5, |n| latency(10 * MS, 100, n));
        assert_eq!(gradient.limit(), 20, "four times a load of 5");
        drive(&mut gradient, &mut now, 30, 20, |n| {
            latency(10 * MS, 100, n)
        });
        assert_eq!(gradient.limit(), 80, "four times a load of 20");
        assert!(gradient.limit() >= 20, "limit {}", gradient.limit());
    }

    #[test]
    fn the_limit_stays_within_floor_and_ceiling() {
        let config = GradientConfig {
            floor: 5,
            ceiling: 20,
            ..GradientConfig::default()
        };
        let mut gradient = Gradient::new(config, 0).unwrap();
        let mut now = 0;
        drive(&mut gradient, &mut now, 30, 400, |n| latency(MS, 1_000, n));
        assert_eq!(gradient.limit(), 20);
        drive(&mut gradient, &mut now, 30, 400, |n| latency(MS, 1, n));
        assert_eq!(gradient.limit(), 5);
    }

    #[test]
    fn a_clock_going_backwards_moves_nothing() {
        let (mut gradient, mut now) = controller();
        drive(&mut gradient, &mut now, 5, 400, |n| latency(10 * MS, 50, n));
        let limit = gradient.limit();
        for _ in 0..100 {
            gradient.sample(Duration::from_secs(1), 0);
        }
        assert_eq!(gradient.limit(), limit);
    }

    #[test]
    fn bad_parameters_are_refused() {
        let base = GradientConfig::default();
        let with = |f: fn(&mut GradientConfig)| {
            let mut config = base;
            f(&mut config);
            Gradient::new(config, 0).unwrap_err()
        };
        assert_eq!(with(|c| c.floor = 0), GradientError::ZeroFloor);
        assert_eq!(
            with(|c| c.ceiling = 2),
            GradientError::CeilingUnderFloor {
                floor: 3,
                ceiling: 2
            }
        );
        assert_eq!(
            with(|c| c.probe_samples = 0),
            GradientError::ZeroProbeSamples
        );
        assert_eq!(
            with(|c| c.sample_window = Duration::ZERO),
            GradientError::ZeroPeriod
        );
    }
}
