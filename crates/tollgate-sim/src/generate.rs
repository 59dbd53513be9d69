use std::fmt::{self, Write as _};
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use tollgate_core::{IntoNanos, Nanos, Quota};

use crate::Trace;
use tollgate_core::format_duration;

/// The most requests one generated trace may hold (about 1.2 GB in memory).
pub(crate) const MAX_REQUESTS: u64 = 50_000_000;

/// The most keys one generated trace may draw from.
pub(crate) const MAX_KEYS: u32 = 10_000_000;

/// Mean length of a bursty trace's on phase.
const ON_MEAN_NS: f64 = 1e9;
/// Mean length of a bursty trace's off phase.
const OFF_MEAN_NS: f64 = 3e9;
/// How many times the mean rate requests arrive during an on phase, so that the
/// long-run rate is the mean rate: `(ON + OFF) / ON`.
const ON_RATE_FACTOR: f64 = (ON_MEAN_NS + OFF_MEAN_NS) / ON_MEAN_NS;
/// The share of a period on each side of a window edge that a boundary attack
/// spreads its bursts over: 1/100 of the period.
const ATTACK_SPREAD_DIVISOR: u64 = 100;

/// A kind of synthetic traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Workload {
    /// Poisson arrivals at `rate`: exponential gaps between requests; each
    /// request goes to one of `keys` keys picked uniformly.
    Poisson,
    /// On/off traffic: on phases (exponentially distributed, 1 s on average)
    /// with Poisson arrivals at 4 × `rate`, then silent off phases (3 s on
    /// average), so that the long-run rate is `rate`. Keys as for Poisson.
    Bursty,
    /// An attack on fixed windows: at every other window edge (`period`, `3 ×
    /// period`, `5 × period`, …), each key sends `limit` requests spread over the
    /// last 1/100 of a period before the edge and `limit` more over the first
    /// 1/100 after it, then nothing until the next attack. Each aligned window
    /// holds `limit`, so the fixed window admits `2 × limit` within a few
    /// milliseconds, while the exact log admits `limit`. `rate` is not used.
    BoundaryAttack,
    /// Many keys with a heavy-tailed popularity: Poisson arrivals at `rate` over
    /// all keys, each request going to the key of rank `r` (from 1) with
    /// probability proportional to `1 / r` (Zipf with exponent 1). Key `k0` is
    /// the busiest.
    ManyKeys,
}

impl Workload {
    /// Every workload, in the order of the documentation.
    pub const ALL: [Workload; 4] = [
        Workload::Poisson,
        Workload::Bursty,
        Workload::BoundaryAttack,
        Workload::ManyKeys,
    ];

    /// The workload's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Poisson => "poisson",
            Workload::Bursty => "bursty",
            Workload::BoundaryAttack => "boundary-attack",
            Workload::ManyKeys => "many-keys",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A workload name that the generator does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown workload {name:?}; expected one of poisson, bursty, boundary-attack, many-keys")]
pub struct ParseWorkloadError {
    /// The name that was given.
    pub name: String,
}

impl FromStr for Workload {
    type Err = ParseWorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| ParseWorkloadError { name: s.to_owned() })
    }
}

/// Why a trace could not be generated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// The rate is zero, negative or not a number.
    #[error("rate must be a positive number of requests per second, not {0}")]
    BadRate(f64),
    /// There must be at least one key, and at most 10,000,000.
    #[error("keys must be from 1 to {max}, not {keys}", max = MAX_KEYS)]
    BadKeys {
        /// The number of keys asked for.
        keys: u32,
    },
    /// The duration is zero or does not fit in 64 bits of nanoseconds.
    #[error("duration must be longer than zero and at most 2^64 ns, not {0:?}")]
    BadDuration(Duration),
    /// The trace would hold more than 50,000,000 requests.
    #[error(
        "the trace would hold about {requests} requests, more than the {max} a generated trace may hold; lower the rate, duration, keys or limit",
        max = MAX_REQUESTS
    )]
    TooLarge {
        /// About how many requests the trace would hold.
        requests: u128,
    },
}

/// Makes synthetic traces, deterministically for a seed.
///
/// The random numbers come from rand's `StdRng` seeded with `seed`, so the same
/// generator with the same build of Tollgate always makes the same trace.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Generator {
    /// What kind of traffic to make.
    pub workload: Workload,
    /// Mean requests per second over all keys (not used by the boundary attack).
    pub rate: f64,
    /// How long the trace lasts: every timestamp is in `[0, duration)`.
    pub duration: Duration,
    /// How many keys requests are spread over.
    pub keys: u32,
    /// The seed of the random numbers.
    pub seed: u64,
    /// The quota a boundary attack aims at: `limit` requests on each side of
    /// edges of windows of `period`. Other workloads do not use it.
    pub quota: Quota,
}

impl Generator {
    /// A generator of `workload` with the defaults: 60 s at 100 requests per
    /// second on one key, seed 1, and a boundary attack on 100 per second;
    /// many keys means 10,000 keys at 10,000 requests per second in all.
    pub fn new(workload: Workload) -> Self {
        let (rate, keys) = match workload {
            Workload::ManyKeys => (10_000.0, 10_000),
            _ => (100.0, 1),
        };
        Generator {
            workload,
            rate,
            duration: Duration::from_secs(60),
            keys,
            seed: 1,
            quota: Quota::per_second(100).expect("100 per second is a valid quota"),
        }
    }

    /// Makes the trace.
    pub fn generate(&self) -> Result<Trace, GenerateError> {
        let duration = u64::try_from(self.duration.as_nanos())
            .ok()
            .filter(|&d| d > 0)
            .ok_or(GenerateError::BadDuration(self.duration))?;
        if self.keys == 0 || self.keys > MAX_KEYS {
            return Err(GenerateError::BadKeys { keys: self.keys });
        }
        let expected = if self.workload == Workload::BoundaryAttack {
            self.attack_edge_count(duration)
                * 2
                * u128::from(self.quota.limit())
                * u128::from(self.keys)
        } else {
            if !(self.rate.is_finite() && self.rate > 0.0) {
                return Err(GenerateError::BadRate(self.rate));
            }
            // Saturating float-to-int conversion.
            (self.rate * self.duration.as_secs_f64()) as u128
        };
        if expected > u128::from(MAX_REQUESTS) {
            return Err(GenerateError::TooLarge { requests: expected });
        }
        let mut out = Output {
            trace: Trace::new(),
            name: String::new(),
            rng: StdRng::seed_from_u64(self.seed),
        };
        match self.workload {
            Workload::Poisson => self.poisson(&mut out, duration)?,
            Workload::Bursty => self.bursty(&mut out, duration)?,
            Workload::BoundaryAttack => self.boundary_attack(&mut out, duration)?,
            Workload::ManyKeys => self.many_keys(&mut out, duration)?,
        }
        Ok(out.trace)
    }

    fn poisson(&self, out: &mut Output, duration: Nanos) -> Result<(), GenerateError> {
        let gap = 1e9 / self.rate;
        let mut t: Nanos = 0;
        loop {
            t = t.saturating_add(out.exponential(gap));
            if t >= duration {
                return Ok(());
            }
            let key = out.rng.random_range(0..self.keys);
            out.push(t, key)?;
        }
    }

    fn bursty(&self, out: &mut Output, duration: Nanos) -> Result<(), GenerateError> {
        let gap = 1e9 / (self.rate * ON_RATE_FACTOR);
        let mut t: Nanos = 0;
        let mut on_until = out.exponential(ON_MEAN_NS);
        loop {
            let next = t.saturating_add(out.exponential(gap));
            if next >= on_until {
                // Arrivals are memoryless, so the one that fell past the end of
                // the on phase is simply dropped.
                t = on_until.saturating_add(out.exponential(OFF_MEAN_NS));
                on_until = t.saturating_add(out.exponential(ON_MEAN_NS));
            } else {
                t = next;
                if t >= duration {
                    return Ok(());
                }
                let key = out.rng.random_range(0..self.keys);
                out.push(t, key)?;
            }
            if t >= duration {
                return Ok(());
            }
        }
    }

    /// The window edges a boundary attack strikes: `period`, `3 × period`, …,
    /// each with its whole spread after it inside the duration.
    fn attack_edges(&self, duration: Nanos) -> impl Iterator<Item = Nanos> {
        let period = self.quota.period_ns();
        let spread = attack_spread(period);
        std::iter::successors(Some(period), move |&edge| {
            edge.checked_add(period.saturating_mul(2))
        })
        .take_while(move |&edge| edge.checked_add(spread).is_some_and(|end| end <= duration))
    }

    /// How many edges [`Generator::attack_edges`] yields, without counting them one by one.
    fn attack_edge_count(&self, duration: Nanos) -> u128 {
        let period = u128::from(self.quota.period_ns());
        let spread = u128::from(attack_spread(self.quota.period_ns()));
        match u128::from(duration).checked_sub(period + spread) {
            Some(room) => room / (2 * period) + 1,
            None => 0,
        }
    }

    fn boundary_attack(&self, out: &mut Output, duration: Nanos) -> Result<(), GenerateError> {
        let spread = attack_spread(self.quota.period_ns());
        let limit = self.quota.limit();
        let mut batch = Vec::new();
        for edge in self.attack_edges(duration) {
            batch.clear();
            for key in 0..self.keys {
                for _ in 0..limit {
                    batch.push((edge - spread + out.rng.random_range(0..spread), key));
                    batch.push((edge + out.rng.random_range(0..spread), key));
                }
            }
            batch.sort_unstable();
            for &(t, key) in &batch {
                out.push(t, key)?;
            }
        }
        Ok(())
    }

    fn many_keys(&self, out: &mut Output, duration: Nanos) -> Result<(), GenerateError> {
        // Cumulative popularity of ranks 1..=keys, weights 1/r.
        let mut total = 0.0;
        let cumulative: Vec<f64> = (1..=self.keys)
            .map(|rank| {
                total += 1.0 / f64::from(rank);
                total
            })
            .collect();
        let gap = 1e9 / self.rate;
        let mut t: Nanos = 0;
        loop {
            t = t.saturating_add(out.exponential(gap));
            if t >= duration {
                return Ok(());
            }
            let x = out.unit() * total;
            let rank = cumulative
                .partition_point(|&c| c <= x)
                .min(cumulative.len() - 1);
            // rank < keys, which is a u32.
            out.push(t, rank as u32)?;
        }
    }
}

/// How far before and after an edge a boundary attack spreads its bursts.
fn attack_spread(period: Nanos) -> Nanos {
    (period / ATTACK_SPREAD_DIVISOR).max(1)
}

/// Writes the generator as the command-line options that make the same trace.
impl fmt::Display for Generator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--generate {}", self.workload)?;
        if self.workload != Workload::BoundaryAttack {
            write!(f, " --rate {}", self.rate)?;
        }
        let duration = self.duration.into_nanos();
        write!(
            f,
            " --duration {} --keys {} --seed {}",
            format_duration(duration),
            self.keys,
            self.seed
        )?;
        if self.workload == Workload::BoundaryAttack {
            write!(
                f,
                " --limit {} --period {}",
                self.quota.limit(),
                format_duration(self.quota.period_ns())
            )?;
        }
        Ok(())
    }
}

/// The trace being generated and the random numbers that make it.
struct Output {
    trace: Trace,
    name: String,
    rng: StdRng,
}

impl Output {
    /// A uniform number in `[0, 1)` with 53 random bits.
    fn unit(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An exponentially distributed number of nanoseconds with mean `mean`.
    fn exponential(&mut self, mean: f64) -> Nanos {
        // 1 − u is in (0, 1], so the logarithm is finite; `as` saturates.
        (-(1.0 - self.unit()).ln() * mean).round() as Nanos
    }

    /// Appends a request of cost 1 for key `k{key}`.
    fn push(&mut self, time: Nanos, key: u32) -> Result<(), GenerateError> {
        if self.trace.len() as u64 >= MAX_REQUESTS {
            return Err(GenerateError::TooLarge {
                requests: u128::from(MAX_REQUESTS) + 1,
            });
        }
        self.name.clear();
        let _ = write!(self.name, "k{key}");
        self.trace
            .push(time, &self.name, 1)
            .expect("generated requests are in time order, with at most MAX_KEYS plain keys");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Simulation;
    use tollgate_core::Algorithm;

    fn times(trace: &Trace) -> Vec<Nanos> {
        trace.requests().iter().map(|r| r.time).collect()
    }

    #[test]
    fn names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>(), Ok(w));
        }
        assert!("poison".parse::<Workload>().is_err());
    }

    #[test]
    fn same_seed_same_trace_other_seed_other_trace() {
        for workload in Workload::ALL {
            let mut g = Generator::new(workload);
            g.duration = Duration::from_secs(10);
            let a = g.generate().unwrap();
            let b = g.generate().unwrap();
            assert!(!a.is_empty(), "{workload}");
            assert_eq!(a.requests(), b.requests(), "{workload}");
            g.seed = 2;
            let c = g.generate().unwrap();
            assert_ne!(a.requests(), c.requests(), "{workload}");
        }
    }

    #[test]
    fn traces_are_sorted_and_inside_the_duration() {
        for workload in Workload::ALL {
            let mut g = Generator::new(workload);
            g.duration = Duration::from_secs(10);
            g.keys = 3;
            let trace = g.generate().unwrap();
            let t = times(&trace);
            assert!(t.is_sorted(), "{workload}");
            assert!(*t.last().unwrap() < 10_000_000_000, "{workload}");
            assert_eq!(trace.key_count(), 3, "{workload}");
        }
    }

    #[test]
    fn poisson_has_the_asked_rate() {
        let g = Generator::new(Workload::Poisson);
        let n = g.generate().unwrap().len() as f64;
        // 6000 expected; the standard deviation is about 77.
        assert!((n - 6000.0).abs() < 400.0, "{n}");
    }

    #[test]
    fn bursty_has_the_mean_rate_and_long_silences() {
        let mut g = Generator::new(Workload::Bursty);
        g.duration = Duration::from_secs(600);
        let trace = g.generate().unwrap();
        let n = trace.len() as f64;
        assert!((n - 60_000.0).abs() < 12_000.0, "{n}");
        let t = times(&trace);
        let silences = t.windows(2).filter(|w| w[1] - w[0] > 1_000_000_000).count();
        assert!(silences > 50, "{silences}");
    }

    #[test]
    fn many_keys_is_heavy_tailed() {
        let g = Generator::new(Workload::ManyKeys);
        let trace = g.generate().unwrap();
        let mut counts = vec![0u64; trace.key_count()];
        for r in trace.requests() {
            counts[r.key.index()] += 1;
        }
        let k0 = counts[trace
            .requests()
            .iter()
            .find(|r| trace.key(r.key) == "k0")
            .unwrap()
            .key
            .index()];
        // Rank 1 gets 1 / H(10000) ≈ 10.2% of 600,000 requests.
        assert!((55_000..67_000).contains(&k0), "{k0}");
        assert!(trace.key_count() > 9_000, "{}", trace.key_count());
        assert_eq!(counts.iter().max(), Some(&k0));
    }

    #[test]
    fn boundary_attack_doubles_the_fixed_window_only() {
        for (limit, period) in [(100, 1_000_000_000), (7, 250_000_000), (1, 1_000)] {
            let mut g = Generator::new(Workload::BoundaryAttack);
            g.quota = Quota::new(limit, Duration::from_nanos(period)).unwrap();
            g.keys = 2;
            g.duration = Duration::from_nanos(period * 10);
            let trace = g.generate().unwrap();
            // Edges at 1, 3, 5, 7 and 9 periods; 2 keys.
            assert_eq!(trace.len() as u64, 5 * 2 * 2 * limit);
            let sim = Simulation::new(&trace, g.quota);
            let fixed = sim.run(Algorithm::FixedWindow).report;
            assert_eq!(fixed.max_in_period, 2 * limit, "{limit}/{period}");
            assert_eq!(fixed.denied, 0);
            let log = sim.run(Algorithm::SlidingLog).report;
            assert_eq!(log.max_in_period, limit, "{limit}/{period}");
            assert_eq!(log.admitted, trace.len() as u64 / 2);
            assert_eq!(fixed.false_admits, log.denied);
        }
    }

    #[test]
    fn refuses_bad_parameters() {
        let mut g = Generator::new(Workload::Poisson);
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            g.rate = rate;
            assert!(matches!(g.generate(), Err(GenerateError::BadRate(_))));
        }
        g.rate = 1e9;
        g.duration = Duration::from_secs(3600);
        assert!(matches!(g.generate(), Err(GenerateError::TooLarge { .. })));
        g.duration = Duration::ZERO;
        assert!(matches!(g.generate(), Err(GenerateError::BadDuration(_))));
        g.duration = Duration::MAX;
        assert!(matches!(g.generate(), Err(GenerateError::BadDuration(_))));
        g.duration = Duration::from_secs(1);
        g.keys = 0;
        assert!(matches!(
            g.generate(),
            Err(GenerateError::BadKeys { keys: 0 })
        ));
        let mut attack = Generator::new(Workload::BoundaryAttack);
        attack.quota = Quota::per_second(1_000_000_000).unwrap();
        attack.keys = 1000;
        assert!(matches!(
            attack.generate(),
            Err(GenerateError::TooLarge { .. })
        ));
    }

    #[test]
    fn displays_as_the_options_that_make_it() {
        assert_eq!(
            Generator::new(Workload::Bursty).to_string(),
            "--generate bursty --rate 100 --duration 1m --keys 1 --seed 1"
        );
        assert_eq!(
            Generator::new(Workload::BoundaryAttack).to_string(),
            "--generate boundary-attack --duration 1m --keys 1 --seed 1 --limit 100 --period 1s"
        );
    }
}
