use std::any::Any;
use std::collections::VecDeque;
use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Log, Nanos, Quota, SlidingLog, StateMachine, Visitor};

use crate::{Report, Request, Trace};

/// How many time buckets a [`Timeline`] aims for (it may use fewer, so that
/// the bucket width is a round number of nanoseconds).
const BUCKETS: u64 = 100;

/// Bytes one logged admission of the sliding log takes: a `(time, cost)` pair.
const LOG_ENTRY_BYTES: u64 = 16;

/// A trace and a quota, ready to be replayed through any algorithm.
///
/// Making one replays the exact sliding window log on the trace, with its own
/// state per key, and keeps its decisions: they are the reference that
/// [`Simulation::run`] compares every algorithm with, request by request.
#[derive(Debug)]
pub struct Simulation<'a> {
    trace: &'a Trace,
    quota: Quota,
    reference: Vec<bool>,
    frame: Timeline,
}

/// The outcome of replaying one algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replay {
    /// The counts, compared with the sliding log.
    pub report: Report,
    /// Admitted requests over time.
    pub admitted: Timeline,
}

/// Requests counted in equal time buckets across a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timeline {
    /// Where the first bucket starts: the first request's time, rounded down to
    /// a multiple of the period so that buckets line up with fixed windows.
    pub start: Nanos,
    /// The width of every bucket, in nanoseconds: 1, 2 or 5 times a power of ten.
    pub bucket: Nanos,
    /// Requests in each bucket, the first starting at `start`. Empty for an
    /// empty trace.
    pub counts: Vec<u64>,
}

impl Timeline {
    /// Empty buckets covering `trace`.
    fn covering(trace: &Trace, period: Nanos) -> Self {
        let (Some(first), Some(last)) = (trace.requests().first(), trace.requests().last()) else {
            return Timeline {
                start: 0,
                bucket: 1,
                counts: Vec::new(),
            };
        };
        let start = first.time - first.time % period;
        let span = last.time - start;
        // Every request falls in one of at most BUCKETS buckets.
        let bucket = round_width(span / BUCKETS + 1);
        let count = span / bucket + 1;
        Timeline {
            start,
            bucket,
            counts: vec![0; usize::try_from(count).unwrap_or(usize::MAX)],
        }
    }

    fn add(&mut self, time: Nanos) {
        let i = (time - self.start) / self.bucket;
        if let Some(n) = usize::try_from(i).ok().and_then(|i| self.counts.get_mut(i)) {
            *n += 1;
        }
    }
}

/// The smallest width of 1, 2 or 5 times a power of ten nanoseconds that is at
/// least `min`, or `u64::MAX` if there is none.
fn round_width(min: u64) -> u64 {
    let mut decade: u128 = 1;
    loop {
        for step in [1, 2, 5] {
            let width = decade * step;
            if width >= u128::from(min) {
                return u64::try_from(width).unwrap_or(u64::MAX);
            }
        }
        decade *= 10;
    }
}

/// Admissions of one key within the last period, for `max_in_period`.
#[derive(Debug, Clone, Default)]
struct Window {
    entries: VecDeque<(Nanos, u64)>,
    total: u128,
}

impl Window {
    /// Records `cost` admitted at `time` and returns the cost admitted in
    /// `(time − period, time]`.
    fn admit(&mut self, time: Nanos, cost: u64, period: Nanos) -> u128 {
        while let Some(&(t, c)) = self.entries.front() {
            if t.saturating_add(period) > time {
                break;
            }
            self.entries.pop_front();
            self.total -= u128::from(c);
        }
        if cost > 0 {
            match self.entries.back_mut() {
                Some((t, c)) if *t == time && c.checked_add(cost).is_some() => *c += cost,
                _ => self.entries.push_back((time, cost)),
            }
            self.total += u128::from(cost);
        }
        self.total
    }
}

/// Steps `machine` through every request of `trace`, one state per key, and
/// hands each decision (with the key's state after it) to `each`.
fn drive<M: StateMachine>(
    machine: &M,
    trace: &Trace,
    quota: &Quota,
    mut each: impl FnMut(usize, &Request, &Decision, &M::State),
) {
    let mut states = vec![M::State::default(); trace.key_count()];
    for (i, request) in trace.requests().iter().enumerate() {
        let state = &mut states[request.key.index()];
        let decision = machine.step(quota, state, request.time, request.cost);
        each(i, request, &decision, state);
    }
}

impl<'a> Simulation<'a> {
    /// Prepares `trace` for replay under `quota`, running the reference sliding log.
    pub fn new(trace: &'a Trace, quota: Quota) -> Self {
        let mut reference = Vec::with_capacity(trace.len());
        drive(&SlidingLog, trace, &quota, |_, _, decision, _| {
            reference.push(decision.allowed());
        });
        Simulation {
            trace,
            quota,
            reference,
            frame: Timeline::covering(trace, quota.period_ns()),
        }
    }

    /// The trace being replayed.
    pub fn trace(&self) -> &'a Trace {
        self.trace
    }

    /// The quota every key is limited by.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Every request of the trace over time, in the buckets of the replays' timelines.
    pub fn offered(&self) -> Timeline {
        let mut offered = self.frame.clone();
        for request in self.trace.requests() {
            offered.add(request.time);
        }
        offered
    }

    /// Replays the trace through `algorithm`, each key with its own state
    /// starting from the default, and compares every decision with the
    /// reference log's decision on the same request.
    pub fn run(&self, algorithm: Algorithm) -> Replay {
        algorithm.visit(Run {
            simulation: self,
            algorithm,
        })
    }

    fn replay<M: StateMachine>(&self, algorithm: Algorithm, machine: &M) -> Replay {
        let period = self.quota.period_ns();
        let mut report = Report {
            algorithm,
            requests: self.trace.len() as u64,
            admitted: 0,
            denied: 0,
            false_admits: 0,
            false_denies: 0,
            max_in_period: 0,
            max_delay: Duration::ZERO,
            state_bytes: 0,
        };
        let mut admitted = self.frame.clone();
        let mut windows = vec![Window::default(); self.trace.key_count()];
        let mut max_in_period: u128 = 0;
        let mut peak_log_entries = 0usize;
        drive(
            machine,
            self.trace,
            &self.quota,
            |i, request, decision, state| {
                let reference = self.reference[i];
                if decision.allowed() {
                    report.admitted += 1;
                    report.false_admits += u64::from(!reference);
                    report.max_delay = report.max_delay.max(decision.delay());
                    let window = &mut windows[request.key.index()];
                    max_in_period =
                        max_in_period.max(window.admit(request.time, request.cost, period));
                    admitted.add(request.time);
                } else {
                    report.denied += 1;
                    report.false_denies += u64::from(reference);
                }
                if let Some(log) = (state as &dyn Any).downcast_ref::<Log>() {
                    peak_log_entries = peak_log_entries.max(log.entries.len());
                }
            },
        );
        report.max_in_period = u64::try_from(max_in_period).unwrap_or(u64::MAX);
        report.state_bytes = (size_of::<M::State>() as u64)
            .saturating_add(LOG_ENTRY_BYTES.saturating_mul(peak_log_entries as u64));
        Replay { report, admitted }
    }
}

/// The visitor that replays a simulation through one algorithm's state machine.
struct Run<'s, 'a> {
    simulation: &'s Simulation<'a>,
    algorithm: Algorithm,
}

impl Visitor for Run<'_, '_> {
    type Output = Replay;

    fn visit<M: StateMachine>(self, machine: M) -> Replay {
        self.simulation.replay(self.algorithm, &machine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn trace(text: &str) -> Trace {
        Trace::parse(text.as_bytes()).unwrap()
    }

    fn quota(limit: u64, period: Nanos) -> Quota {
        Quota::new(limit, Duration::from_nanos(period)).unwrap()
    }

    #[test]
    fn sliding_log_agrees_with_itself() {
        let trace = crate::Generator::new(crate::Workload::Bursty)
            .generate()
            .unwrap();
        let sim = Simulation::new(&trace, quota(100, S));
        let r = sim.run(Algorithm::SlidingLog).report;
        assert_eq!((r.false_admits, r.false_denies), (0, 0));
        assert!(r.denied > 0, "the bursty trace should go over the limit");
        assert_eq!(r.max_in_period, 100);
    }

    #[test]
    fn max_in_period_by_hand() {
        // Limit 5 per 10 ns: the sliding window at t is (t − 10, t].
        let trace = trace(
            "5 a 3\n\
             9 a 2\n\
             10 a 3\n\
             12 b 4\n\
             14 a 2\n",
        );
        let sim = Simulation::new(&trace, quota(5, 10));
        // The fixed window admits everything: a has 3 + 2 in [0, 10) and 3 + 2
        // in [10, 20), b has 4. At t = 14, a's (4, 14] holds 3 + 2 + 3 + 2.
        let fixed = sim.run(Algorithm::FixedWindow).report;
        assert_eq!((fixed.admitted, fixed.denied), (5, 0));
        assert_eq!(fixed.max_in_period, 10);
        // The log admits a's 3 and 2, then (0, 10] holds 5 at t = 10 and
        // (4, 14] holds 5 at t = 14: both denied. b's 4 is admitted.
        let log = sim.run(Algorithm::SlidingLog).report;
        assert_eq!((log.admitted, log.denied, log.max_in_period), (3, 2, 5));
        assert_eq!((fixed.false_admits, fixed.false_denies), (2, 0));
        // The token bucket (capacity 5, one unit per 2 ns): 10 − 6 = 4 tokens
        // after t = 5, 4 + 4 − 4 = 4 after t = 9, 5 at t = 10 (too few for 3),
        // 9 at t = 14 (enough for 2). (4, 14] then holds 3 + 2 + 2.
        let bucket = sim.run(Algorithm::TokenBucket).report;
        assert_eq!((bucket.admitted, bucket.max_in_period), (4, 7));
        assert_eq!((bucket.false_admits, bucket.false_denies), (1, 0));
    }

    #[test]
    fn window_counts_the_half_open_period() {
        let mut w = Window::default();
        assert_eq!(w.admit(0, 2, 10), 2);
        assert_eq!(w.admit(9, 1, 10), 3);
        assert_eq!(w.admit(10, 1, 10), 2, "the admission at 0 left at 10");
        assert_eq!(w.admit(10, 0, 10), 2);
        assert_eq!(w.admit(10, u64::MAX, 10), 2 + u128::from(u64::MAX));
        assert_eq!(w.admit(10, u64::MAX, 10), 2 + 2 * u128::from(u64::MAX));
        assert_eq!(w.admit(100, 1, 10), 1);
    }

    #[test]
    fn false_admits_and_denies_against_the_log() {
        // Limit 2 per second. The fixed window admits 2 before the edge and 2
        // after it; the log denies the two after.
        let trace = trace("900000000 k\n900000000 k\n1000000000 k\n1000000001 k\n");
        let sim = Simulation::new(&trace, quota(2, S));
        let fixed = sim.run(Algorithm::FixedWindow).report;
        assert_eq!(
            (fixed.admitted, fixed.false_admits, fixed.false_denies),
            (4, 2, 0)
        );
        assert_eq!(fixed.max_in_period, 4);
        // The token bucket (burst 2, 2/s) has refilled 0.2 tokens by the edge.
        let bucket = sim.run(Algorithm::TokenBucket).report;
        assert_eq!((bucket.admitted, bucket.false_admits), (2, 0));
    }

    #[test]
    fn a_false_deny_is_counted() {
        // Limit 2 per second. At 1 s the log's window (0, 1 s] holds only the
        // request at 0.9 s, so it admits one of the two requests at 1 s.
        let trace = trace("0 k\n900000000 k\n1000000000 k\n1000000000 k\n");
        let sim = Simulation::new(&trace, quota(2, S));
        let log = sim.run(Algorithm::SlidingLog).report;
        assert_eq!((log.admitted, log.denied), (3, 1));
        // The token bucket: 2 − 1 = 1 token after 0; refilled to 2 (capped) by
        // 0.9 s, 1 left; 1.2 at 1 s: admits one, denies the next, like the log.
        let bucket = sim.run(Algorithm::TokenBucket).report;
        assert_eq!((bucket.false_admits, bucket.false_denies), (0, 0));
        // The sliding counter at 1 s: the previous window [0, 1 s) holds 2 and
        // weighs in fully (e = 0), so both requests at 1 s are denied.
        let counter = sim.run(Algorithm::SlidingCounter).report;
        assert_eq!((counter.admitted, counter.false_denies), (2, 1));
    }

    #[test]
    fn shaping_reports_its_longest_delay() {
        let trace = trace("0 k\n0 k\n0 k\n");
        let sim = Simulation::new(&trace, quota(10, S));
        let r = sim
            .run(Algorithm::LeakyBucketShaping { delay_after: 0 })
            .report;
        assert_eq!(r.admitted, 3);
        assert_eq!(r.max_delay, Duration::from_millis(200));
        assert_eq!(sim.run(Algorithm::Gcra).report.max_delay, Duration::ZERO);
    }

    #[test]
    fn state_bytes_grow_with_the_log_only() {
        let trace = trace("0 k\n1 k\n2 k\n3 k\n");
        let sim = Simulation::new(&trace, quota(3, S));
        assert_eq!(sim.run(Algorithm::Gcra).report.state_bytes, 8);
        let log = sim.run(Algorithm::SlidingLog).report;
        assert_eq!(log.state_bytes, size_of::<Log>() as u64 + 3 * 16);
    }

    #[test]
    fn keys_are_limited_separately() {
        let trace = trace("0 a\n0 b\n0 a\n0 b\n");
        let sim = Simulation::new(&trace, quota(1, S));
        for algorithm in Algorithm::RATE {
            let r = sim.run(algorithm).report;
            assert_eq!((r.admitted, r.denied), (2, 2), "{algorithm}");
            assert_eq!(r.max_in_period, 1, "{algorithm}");
        }
    }

    #[test]
    fn timeline_buckets_are_round_and_cover_the_trace() {
        let trace = trace("1400000000 k\n1500000000 k\n20900000000 k\n");
        let sim = Simulation::new(&trace, quota(10, S));
        let offered = sim.offered();
        assert_eq!(offered.start, S);
        // Span 19.9 s: at least 199 ms per bucket, rounded to 200 ms.
        assert_eq!(offered.bucket, 200_000_000);
        assert_eq!(offered.counts.len(), 100);
        assert_eq!(offered.counts.iter().sum::<u64>(), 3);
        assert_eq!(offered.counts[2], 2);
        assert_eq!(offered.counts[99], 1);
        assert_eq!(sim.run(Algorithm::Gcra).admitted.counts, offered.counts);
    }

    #[test]
    fn empty_trace_replays_to_zeros() {
        let trace = Trace::new();
        let sim = Simulation::new(&trace, quota(1, S));
        let replay = sim.run(Algorithm::SlidingCounter);
        assert_eq!(replay.report.requests, 0);
        assert_eq!(replay.report.max_in_period, 0);
        assert!(replay.admitted.counts.is_empty());
    }

    #[test]
    fn extreme_times_and_costs_do_not_panic() {
        let max = u64::MAX;
        let trace = trace(&format!("0 a {max}\n{max} a {max}\n{max} a 0\n{max} b 1\n"));
        let sim = Simulation::new(&trace, quota(1, max));
        for algorithm in Algorithm::RATE {
            let replay = sim.run(algorithm);
            assert_eq!(replay.report.requests, 4);
        }
        assert_eq!(round_width(max), max);
    }
}
