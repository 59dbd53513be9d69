//! Properties every rate algorithm is held to under arbitrary arrival sequences.
//!
//! Quotas are tiny (periods of a few dozen nanoseconds, limits up to 5, bursts up
//! to 6) and costs run from 0 to above both the burst and the limit, so that
//! denials, window crossings and refills all happen often. Time is an integer
//! passed in; nothing sleeps.
//!
//! The bounds proved here, with `T = emission_ns = ceil(period / limit)`:
//!
//! * token bucket, GCRA, both leaky buckets: the cost admitted at times in any
//!   closed interval `[a, b]` is at most `burst + floor((b - a) / T)`;
//! * fixed window: at most `limit` per aligned window `[k·period, (k+1)·period)`
//!   (so up to `2·limit` in an unaligned period);
//! * sliding log: at most `limit` in every half-open `(t - period, t]`, and every
//!   decision equals a brute-force recount of its log;
//! * sliding counter: at most `limit` per aligned window and, for `t` at offset
//!   `e` in window `k` and `P` the cost admitted in window `k - 1`, at most
//!   `limit + floor(P·e / period) ≤ 2·limit − 1` in `(t − period, t]`. See
//!   [`sliding_counter_bound`] for the derivation; the bound is tight (the
//!   scenario tests reach `2·limit − 1`).

use std::fmt::Debug;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use tollgate_core::{
    Algorithm, Concurrency, Decision, FixedWindow, Gcra, LeakyBucket, LeakyBucketShaping, Leases,
    Nanos, Quota, SlidingCounter, SlidingLog, StateMachine, TokenBucket, Visitor,
};

/// A quota, the shaping bucket's `delay_after`, and `(now, cost)` arrivals.
#[derive(Debug, Clone)]
struct Case {
    quota: Quota,
    delay_after: u64,
    events: Vec<(Nanos, u64)>,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("durations in these tests fit in u64 nanoseconds")
}

/// A small quota: period 1..=40 ns, limit 1..=min(5, period), burst 1..=6.
fn small_quota() -> impl Strategy<Value = Quota> {
    (1u64..=40)
        .prop_flat_map(|period| (Just(period), 1..=period.min(5), 1u64..=6))
        .prop_map(|(period, limit, burst)| {
            Quota::new(limit, Duration::from_nanos(period))
                .and_then(|q| q.with_burst(burst))
                .expect("small quotas are valid")
        })
}

/// `(gap, cost)` pairs: many simultaneous arrivals, gaps up to a few periods, and
/// costs from 0 to two above the larger of burst and limit.
fn steps(quota: Quota, len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let period = quota.period_ns();
    let max_cost = quota.burst().max(quota.limit()) + 2;
    let gap = prop_oneof![
        3 => Just(0u64),
        5 => 0..=period,
        1 => 0..=4 * period,
    ];
    prop::collection::vec((gap, 0..=max_cost), len)
}

/// Sorted arrival times.
fn case() -> impl Strategy<Value = Case> {
    small_quota()
        .prop_flat_map(|quota| {
            (
                Just(quota),
                0..=quota.burst(),
                0..=3 * quota.period_ns(),
                steps(quota, 1..40),
            )
        })
        .prop_map(|(quota, delay_after, start, steps)| {
            let mut now = start;
            let events = steps
                .into_iter()
                .map(|(gap, cost)| {
                    now += gap;
                    (now, cost)
                })
                .collect();
            Case {
                quota,
                delay_after,
                events,
            }
        })
}

/// Arrival times in any order: the clock may jump backwards at any step.
fn unsorted_case() -> impl Strategy<Value = Case> {
    small_quota()
        .prop_flat_map(|quota| {
            let times = prop::collection::vec(0..=6 * quota.period_ns(), 1..40);
            (Just(quota), 0..=quota.burst(), times, steps(quota, 40..41))
        })
        .prop_map(|(quota, delay_after, times, steps)| Case {
            quota,
            delay_after,
            events: times
                .into_iter()
                .zip(steps)
                .map(|(t, (_, cost))| (t, cost))
                .collect(),
        })
}

fn rate_algorithms(delay_after: u64) -> [Algorithm; 7] {
    [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::LeakyBucketShaping { delay_after },
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
    ]
}

fn is_bucket(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::TokenBucket
            | Algorithm::Gcra
            | Algorithm::LeakyBucket
            | Algorithm::LeakyBucketShaping { .. }
    )
}

/// The most one request may cost: the burst for buckets, the limit for windows.
fn capacity(algorithm: Algorithm, quota: &Quota) -> u64 {
    if is_bucket(algorithm) {
        quota.burst()
    } else {
        quota.limit()
    }
}

fn run_from<M: StateMachine>(
    machine: &M,
    quota: &Quota,
    mut state: M::State,
    events: &[(Nanos, u64)],
) -> Vec<Decision> {
    events
        .iter()
        .map(|&(now, cost)| machine.step(quota, &mut state, now, cost))
        .collect()
}

/// Replays a sequence through any algorithm.
struct Replay<'a> {
    quota: Quota,
    events: &'a [(Nanos, u64)],
}

impl Visitor for Replay<'_> {
    type Output = Vec<Decision>;
    fn visit<M: StateMachine>(self, machine: M) -> Vec<Decision> {
        run_from(&machine, &self.quota, M::State::default(), self.events)
    }
}

fn replay(algorithm: Algorithm, quota: Quota, events: &[(Nanos, u64)]) -> Vec<Decision> {
    algorithm.visit(Replay { quota, events })
}

/// `(time, cost)` of every admission with a cost.
fn admitted(events: &[(Nanos, u64)], decisions: &[Decision]) -> Vec<(Nanos, u64)> {
    events
        .iter()
        .zip(decisions)
        .filter(|&(&(_, cost), d)| d.allowed() && cost > 0)
        .map(|(&e, _)| e)
        .collect()
}

fn sum_in(admitted: &[(Nanos, u64)], within: impl Fn(Nanos) -> bool) -> u64 {
    admitted
        .iter()
        .filter(|&&(t, _)| within(t))
        .map(|&(_, c)| c)
        .sum()
}

/// Every property that can be stated for any algorithm through `Algorithm::visit`,
/// checked at every step of the sequence on clones of the state.
struct StepProperties<'a> {
    algorithm: Algorithm,
    quota: Quota,
    events: &'a [(Nanos, u64)],
}

impl Visitor for StepProperties<'_> {
    type Output = Result<(), TestCaseError>;
    fn visit<M: StateMachine>(self, machine: M) -> Self::Output {
        step_properties(&machine, self.algorithm, &self.quota, self.events)
    }
}

fn step_properties<M: StateMachine>(
    m: &M,
    algorithm: Algorithm,
    quota: &Quota,
    events: &[(Nanos, u64)],
) -> Result<(), TestCaseError> {
    let cap = capacity(algorithm, quota);
    let shaping = matches!(algorithm, Algorithm::LeakyBucketShaping { .. });
    let read = |state: &M::State, at: Nanos| m.step(quota, &mut state.clone(), at, 0);
    let allows = |state: &M::State, at: Nanos, cost: u64| {
        m.step(quota, &mut state.clone(), at, cost).allowed()
    };
    let mut state = M::State::default();
    for (i, &(now, cost)) in events.iter().enumerate() {
        let rest = &events[i + 1..];
        let before = state.clone();
        let d = m.step(quota, &mut state, now, cost);

        // The shape of every decision.
        prop_assert_eq!(d.limit(), cap, "limit is the capacity");
        prop_assert!(
            d.remaining() <= d.limit(),
            "remaining {} > limit",
            d.remaining()
        );
        if d.allowed() {
            prop_assert_eq!(d.retry_after(), None, "an allow has no retry_after");
        }
        if !d.allowed() || !shaping {
            prop_assert_eq!(d.delay(), Duration::ZERO, "only shaping admissions wait");
        }
        if cost == 0 {
            prop_assert!(d.allowed(), "a read is always allowed");
        }

        // The decision reports the state it leaves: a read right after agrees.
        let after = read(&state, now);
        prop_assert_eq!(
            after.remaining(),
            d.remaining(),
            "remaining of the state left"
        );
        prop_assert_eq!(
            after.reset_after(),
            d.reset_after(),
            "reset of the state left"
        );

        // remaining is exact: the largest cost that would be admitted right now.
        let r = after.remaining();
        if r > 0 {
            prop_assert!(allows(&state, now, r), "remaining {} is not admitted", r);
        }
        prop_assert!(
            !allows(&state, now, r + 1),
            "more than remaining {} fits",
            r
        );

        if !d.allowed() {
            // retry_after is exact, and None only for a cost that can never fit.
            match d.retry_after() {
                None => prop_assert!(cost > cap, "retry None for cost {} <= {}", cost, cap),
                Some(retry) => {
                    let retry = ns(retry);
                    prop_assert!(cost <= cap);
                    prop_assert!(
                        allows(&state, now + retry, cost),
                        "denied at now + retry_after ({} + {})",
                        now,
                        retry
                    );
                    prop_assert!(retry > 0, "a deny says retry now");
                    prop_assert!(
                        !allows(&state, now + retry - 1, cost),
                        "allowed 1 ns before now + retry_after ({} + {})",
                        now,
                        retry
                    );
                }
            }
            // A deny consumes nothing: the rest goes as if it never came.
            prop_assert_eq!(
                run_from(m, quota, state.clone(), rest),
                run_from(m, quota, before.clone(), rest),
                "a deny at {} changed later decisions",
                now
            );
        }
        if cost > cap {
            prop_assert!(!d.allowed() && d.retry_after().is_none());
        }

        // A read changes nothing that follows.
        let mut read_state = state.clone();
        let _ = m.step(quota, &mut read_state, now, 0);
        prop_assert_eq!(
            run_from(m, quota, read_state, rest),
            run_from(m, quota, state.clone(), rest),
            "a read at {} changed later decisions",
            now
        );

        // reset_after is exact and stable. From a read at t1 with reset r1, the
        // instant t1 + r1 is when the capacity is whole again: any later read at
        // t2 (no admission in between) reports t2 + r2 = max(t1 + r1, t2), so the
        // announced instant never wobbles, and it is full then, not earlier.
        let r1 = ns(after.reset_after());
        let reset_at = now + r1;
        let at_reset = read(&state, reset_at);
        prop_assert_eq!(at_reset.remaining(), cap, "not full at the announced reset");
        prop_assert_eq!(at_reset.reset_after(), Duration::ZERO);
        if r1 > 0 {
            prop_assert!(
                read(&state, reset_at - 1).remaining() < cap,
                "full before the announced reset"
            );
        }
        for later in [1, r1.saturating_sub(1), r1 + 1, quota.period_ns(), 3 * r1] {
            let t2 = now + later;
            let r2 = ns(read(&state, t2).reset_after());
            prop_assert_eq!(t2 + r2, reset_at.max(t2), "reset wobbled: read at {}", t2);
        }
    }
    Ok(())
}

/// The admission bound for one algorithm, over the whole sequence.
fn admission_bound(
    algorithm: Algorithm,
    quota: &Quota,
    admitted: &[(Nanos, u64)],
) -> Result<(), TestCaseError> {
    let (limit, period) = (quota.limit(), quota.period_ns());
    if is_bucket(algorithm) {
        // Any closed [a, b]; the worst ones start and end at admissions.
        let t = quota.emission_ns();
        for &(a, _) in admitted {
            for &(b, _) in admitted.iter().filter(|&&(b, _)| b >= a) {
                let cost = sum_in(admitted, |x| a <= x && x <= b);
                let bound = quota.burst() + (b - a) / t;
                prop_assert!(
                    cost <= bound,
                    "{} admitted in [{}, {}] > {}",
                    cost,
                    a,
                    b,
                    bound
                );
            }
        }
        return Ok(());
    }
    for &(t, _) in admitted {
        let k = t / period;
        let window = sum_in(admitted, |x| x / period == k);
        let sliding = sum_in(admitted, |x| x + period > t && x <= t);
        match algorithm {
            Algorithm::FixedWindow => {
                prop_assert!(window <= limit, "{} in window {}", window, k);
            }
            Algorithm::SlidingLog => {
                prop_assert!(sliding <= limit, "{} in ({} - period, {}]", sliding, t, t);
            }
            Algorithm::SlidingCounter => sliding_counter_bound(quota, admitted, t, sliding)?,
            _ => unreachable!("every rate algorithm is covered"),
        }
    }
    Ok(())
}

/// The sliding counter's bound in the period `(t − period, t]`, `sliding` being
/// the cost admitted in it.
///
/// Let `t` be at offset `e` in window `k`, `P` the cost admitted in window
/// `k − 1` and `C` the cost admitted in window `k` up to `t`. The last admission
/// in window `k` up to `t`, at offset `e' ≤ e`, passed the test
/// `P·(period − e') + C·period ≤ limit·period`, so (C being an integer)
/// `C ≤ limit − ceil(P·(period − e)/period)`. The period `(t − period, t]` holds
/// `C` plus at most all of `P` (nothing older), hence
///
/// ```text
/// sliding ≤ C + P ≤ limit + P − ceil(P·(period − e)/period) = limit + floor(P·e/period)
/// ```
///
/// and, with `P ≤ limit`, `e ≤ period − 1` and `limit ≤ period` (a quota never
/// exceeds one unit per nanosecond), `sliding ≤ 2·limit − 1`. Per aligned window
/// the counter is a fixed window: `C ≤ limit`.
fn sliding_counter_bound(
    quota: &Quota,
    admitted: &[(Nanos, u64)],
    t: Nanos,
    sliding: u64,
) -> Result<(), TestCaseError> {
    let (limit, period) = (quota.limit(), quota.period_ns());
    let (k, e) = (t / period, t % period);
    let current = sum_in(admitted, |x| x / period == k);
    let previous = if k == 0 {
        0
    } else {
        sum_in(admitted, |x| x / period == k - 1)
    };
    prop_assert!(current <= limit, "{} in window {}", current, k);
    let bound = limit + previous * e / period;
    prop_assert!(
        sliding <= bound,
        "{} in the period ending {} > {}",
        sliding,
        t,
        bound
    );
    prop_assert!(sliding < 2 * limit);
    Ok(())
}

/// What an exact sliding log must answer, recounted from scratch.
fn naive_sliding_log(quota: &Quota, events: &[(Nanos, u64)]) -> Vec<Decision> {
    let (limit, period) = (quota.limit(), quota.period_ns());
    let mut log: Vec<(Nanos, u64)> = Vec::new();
    let mut out = Vec::new();
    for &(now, cost) in events {
        let in_window =
            |log: &[(Nanos, u64)], at: Nanos| sum_in(log, |t| t <= at && at < t + period);
        let used = in_window(&log, now);
        let allowed = used + cost <= limit;
        if allowed && cost > 0 {
            log.push((now, cost));
        }
        let used_after = in_window(&log, now);
        // Back to full when the newest admission in the window leaves it.
        let reset = log
            .iter()
            .filter(|&&(t, _)| now < t + period)
            .map(|&(t, _)| t + period - now)
            .max()
            .unwrap_or(0);
        // The earliest instant at which the cost fits: one at which an entry leaves.
        let retry = (!allowed && cost <= limit).then(|| {
            log.iter()
                .map(|&(t, _)| t + period)
                .filter(|&at| at > now && in_window(&log, at) + cost <= limit)
                .min()
                .expect("the cost fits once the window is empty")
                - now
        });
        let (remaining, reset) = (limit - used_after, Duration::from_nanos(reset));
        let decision = if allowed {
            Decision::allow(limit, remaining, reset)
        } else {
            Decision::deny(limit, remaining, reset, None)
        };
        out.push(decision.with_retry_after(retry.map(Duration::from_nanos)));
    }
    out
}

/// Reads and denies leave the state exactly as it was (needs `PartialEq`, so it
/// is run per concrete state machine rather than through `Algorithm::visit`).
fn reads_and_denies_keep_state<M>(
    m: &M,
    quota: &Quota,
    events: &[(Nanos, u64)],
) -> Result<(), TestCaseError>
where
    M: StateMachine,
    M::State: PartialEq + Debug,
{
    let mut state = M::State::default();
    for &(now, cost) in events {
        let mut probe = state.clone();
        let read = m.step(quota, &mut probe, now, 0);
        prop_assert!(read.allowed());
        prop_assert_eq!(&probe, &state, "a read at {} changed the state", now);
        let before = state.clone();
        if !m.step(quota, &mut state, now, cost).allowed() {
            prop_assert_eq!(&state, &before, "a deny at {} changed the state", now);
        }
    }
    Ok(())
}

proptest! {
    // Failing cases are saved next to the crate's manifest (the default location
    // needs a lib.rs beside the test file, which integration tests do not have)
    // and replayed first on every run.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/proptests.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_step_is_well_formed_exact_and_consumes_nothing_on_deny(case in case()) {
        for algorithm in rate_algorithms(case.delay_after) {
            algorithm.visit(StepProperties { algorithm, quota: case.quota, events: &case.events })
                .map_err(|e| TestCaseError::fail(format!("{algorithm}: {e}")))?;
        }
    }

    #[test]
    fn admitted_cost_stays_within_each_algorithms_bound(case in case()) {
        for algorithm in rate_algorithms(case.delay_after) {
            let decisions = replay(algorithm, case.quota, &case.events);
            admission_bound(algorithm, &case.quota, &admitted(&case.events, &decisions))
                .map_err(|e| TestCaseError::fail(format!("{algorithm}: {e}")))?;
        }
    }

    #[test]
    fn reads_and_denies_leave_the_state_untouched(case in case()) {
        let (q, ev) = (&case.quota, &case.events[..]);
        reads_and_denies_keep_state(&TokenBucket, q, ev)?;
        reads_and_denies_keep_state(&Gcra, q, ev)?;
        reads_and_denies_keep_state(&LeakyBucket, q, ev)?;
        reads_and_denies_keep_state(&LeakyBucketShaping { delay_after: case.delay_after }, q, ev)?;
        reads_and_denies_keep_state(&FixedWindow, q, ev)?;
        reads_and_denies_keep_state(&SlidingLog, q, ev)?;
        reads_and_denies_keep_state(&SlidingCounter, q, ev)?;
    }

    /// The three policing buckets are one algorithm stored three ways: same
    /// admissions, same numbers. The shaping bucket admits the same too; it only
    /// adds a delay.
    #[test]
    fn token_bucket_gcra_and_leaky_bucket_decide_identically(case in case()) {
        let token = replay(Algorithm::TokenBucket, case.quota, &case.events);
        let gcra = replay(Algorithm::Gcra, case.quota, &case.events);
        let leaky = replay(Algorithm::LeakyBucket, case.quota, &case.events);
        let shaping = replay(
            Algorithm::LeakyBucketShaping { delay_after: case.delay_after },
            case.quota,
            &case.events,
        );
        prop_assert_eq!(&gcra, &token);
        prop_assert_eq!(&leaky, &token);
        let undelayed: Vec<_> = shaping.iter().map(|d| d.with_delay(Duration::ZERO)).collect();
        prop_assert_eq!(&undelayed, &token);
    }

    /// With `delay_after = 0` the shaper forwards admitted work back to back at
    /// the drain rate: each request leaves at least `cost × T` after the one
    /// before it; with `delay_after = N`, N units of excess skip the queue.
    #[test]
    fn shaping_spaces_output_at_the_drain_rate(case in case()) {
        let t = case.quota.emission_ns();
        let full = replay(Algorithm::LeakyBucketShaping { delay_after: 0 }, case.quota, &case.events);
        let two_stage = replay(
            Algorithm::LeakyBucketShaping { delay_after: case.delay_after },
            case.quota,
            &case.events,
        );
        let mut next_free = 0;
        for ((&(now, cost), d), d2) in case.events.iter().zip(&full).zip(&two_stage) {
            if !d.allowed() {
                continue;
            }
            let leaves = now + ns(d.delay());
            prop_assert!(leaves >= next_free, "left at {} before {}", leaves, next_free);
            prop_assert!(ns(d.delay()) + cost * t <= case.quota.burst() * t, "waited past the queue");
            next_free = leaves + cost * t;
            prop_assert_eq!(ns(d2.delay()), ns(d.delay()).saturating_sub(case.delay_after * t));
        }
    }

    #[test]
    fn sliding_log_matches_a_naive_recount(case in case()) {
        prop_assert_eq!(
            replay(Algorithm::SlidingLog, case.quota, &case.events),
            naive_sliding_log(&case.quota, &case.events)
        );
    }

    /// A clock that goes backwards is read as no time passing. An algorithm
    /// stores time only when it admits (reads and denies write nothing), so the
    /// latest time it has seen is its latest admission: the token bucket, both
    /// windows, the log, the counter and the policing leaky bucket decide exactly
    /// as at `max(now, latest admission)`. GCRA and the shaper keep one future
    /// timestamp and cannot tell; each of their steps admits no more than at that
    /// time.
    #[test]
    fn a_clock_going_backwards_counts_as_no_time_passing(case in unsorted_case()) {
        for algorithm in rate_algorithms(case.delay_after) {
            let mut clamped = Vec::with_capacity(case.events.len());
            let mut latest = 0;
            for (i, &(now, cost)) in case.events.iter().enumerate() {
                let at = now.max(latest);
                clamped.push((at, cost));
                if cost > 0 && replay(algorithm, case.quota, &clamped)[i].allowed() {
                    latest = at;
                }
            }
            if matches!(algorithm, Algorithm::Gcra | Algorithm::LeakyBucketShaping { .. }) {
                // Step by step from the raw run's state, never more permissive.
                algorithm.visit(NoMoreThanAtLatest { quota: case.quota, events: &case.events })?;
            } else {
                prop_assert_eq!(
                    replay(algorithm, case.quota, &case.events),
                    replay(algorithm, case.quota, &clamped),
                    "{}",
                    algorithm
                );
            }
        }
    }

    #[test]
    fn concurrency_keeps_in_flight_within_the_limit(
        limit in 1u64..=6,
        ops in prop::collection::vec((any::<bool>(), 0u64..=8, 0u64..=1_500), 1..60),
    ) {
        // Leases of 1 s, numbered in order; the model keeps every live lease
        // and, on a release, drops the one named (one of the last few taken,
        // or one never taken), if it has not lapsed.
        let quota = Quota::new(limit, Duration::from_secs(1)).unwrap();
        let mut leases = Leases::default();
        let mut model: Vec<(u64, u64, u64)> = Vec::new();
        let mut now = 0u64;
        let mut next = 1u64;
        for (acquire, cost, step_ms) in ops {
            now += step_ms * 1_000_000;
            model.retain(|&(at, _, _)| at > now);
            if !acquire {
                let id = next.saturating_sub(cost);
                let held = model.iter().position(|&(_, _, i)| i == id);
                prop_assert_eq!(Concurrency::release(&mut leases, id, now), held.is_some());
                if let Some(i) = held {
                    model.remove(i);
                }
                prop_assert_eq!(leases.in_flight(), model.iter().map(|&(_, c, _)| c).sum::<u64>());
                continue;
            }
            let before: u64 = model.iter().map(|&(_, c, _)| c).sum();
            let d = Concurrency::lease(next).step(&quota, &mut leases, now, cost);
            prop_assert_eq!(d.allowed(), before + cost <= limit);
            if d.allowed() && cost > 0 {
                model.push((now + 1_000_000_000, cost, next));
            }
            next += 1;
            let in_flight = leases.in_flight();
            prop_assert_eq!(in_flight, model.iter().map(|&(_, c, _)| c).sum::<u64>());
            prop_assert!(in_flight <= limit);
            prop_assert_eq!(d.limit(), limit);
            prop_assert_eq!(d.remaining(), limit - in_flight);
            prop_assert_eq!(d.retry_after(), None);
            prop_assert_eq!(d.reset_after(), Duration::ZERO);
        }
    }
}

/// For GCRA and the shaper under a clock that jumps backwards: from the state
/// the raw run reaches, each step admits no more than the same step would at
/// `max(now, latest admission)`.
struct NoMoreThanAtLatest<'a> {
    quota: Quota,
    events: &'a [(Nanos, u64)],
}

impl Visitor for NoMoreThanAtLatest<'_> {
    type Output = Result<(), TestCaseError>;
    fn visit<M: StateMachine>(self, m: M) -> Self::Output {
        let mut state = M::State::default();
        let mut latest = 0;
        for &(now, cost) in self.events {
            let read = |at| m.step(&self.quota, &mut state.clone(), at, 0).remaining();
            prop_assert!(read(now) <= read(now.max(latest)));
            let at_latest = m.step(&self.quota, &mut state.clone(), now.max(latest), cost);
            let d = m.step(&self.quota, &mut state, now, cost);
            prop_assert!(
                !d.allowed() || at_latest.allowed(),
                "admitted at {} but not at {}",
                now,
                latest
            );
            if d.allowed() && cost > 0 {
                latest = latest.max(now);
            }
        }
        Ok(())
    }
}
