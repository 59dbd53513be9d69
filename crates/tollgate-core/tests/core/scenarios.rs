//! Hand-written scenarios over a [`ManualClock`]: bursts and refills, the
//! window-boundary attack, clocks that go backwards, costs above the capacity,
//! reads, and values at the edges of `u64`.
//!
//! Each test is named after what it pins. Numbers are derived in the comments.

use std::fmt::Debug;
use std::time::Duration;

use tollgate_core::{
    Clock, Concurrency, Decision, FixedWindow, Gcra, LeakyBucket, LeakyBucketShaping, Leases, Log,
    ManualClock, Nanos, Quota, QuotaError, SlidingCounter, SlidingLog, StateMachine, Tat,
    TokenBucket, WindowCount, WindowPair,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const MAX: u64 = u64::MAX;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("fits in u64 nanoseconds")
}

/// 10 per second (one unit per 100 ms) with a burst of 3.
fn ten_per_second_burst_3() -> Quota {
    Quota::per_second(10).unwrap().with_burst(3).unwrap()
}

/// Steps `cost` at `now` on a copy of `state`.
fn probe<M: StateMachine>(m: &M, q: &Quota, state: &M::State, now: Nanos, cost: u64) -> Decision {
    m.step(q, &mut state.clone(), now, cost)
}

/// Sends `n` requests of cost 1 at `now` and counts the admitted ones.
fn admit_many<M: StateMachine>(m: &M, q: &Quota, state: &mut M::State, now: Nanos, n: u64) -> u64 {
    (0..n)
        .filter(|_| m.step(q, state, now, 1).allowed())
        .count() as u64
}

/// What every decision must satisfy, at any value: `remaining ≤ limit`, and a
/// `retry_after` that points at a reachable instant where the request passes,
/// with the nanosecond before it still denied.
fn assert_sane<M: StateMachine>(
    m: &M,
    q: &Quota,
    state: &M::State,
    now: Nanos,
    cost: u64,
    d: &Decision,
) {
    assert!(d.remaining() <= d.limit(), "{d:?}");
    if d.allowed() {
        assert_eq!(d.retry_after(), None);
    }
    if let Some(retry) = d.retry_after() {
        let retry = ns(retry);
        assert!(retry > 0, "a deny that says retry now: {d:?}");
        let at = now
            .checked_add(retry)
            .expect("retry_after points past the end of time");
        assert!(probe(m, q, state, at, cost).allowed(), "denied at {at}");
        assert!(
            !probe(m, q, state, at - 1, cost).allowed(),
            "allowed at {at} - 1"
        );
    }
}

// ---------------------------------------------------------------------------
// Burst, then refill.
// ---------------------------------------------------------------------------

/// Three pass at once; the fourth waits exactly 100 ms; 250 ms later two and a
/// half units have come back, of which two are whole; an hour later the bucket
/// holds its burst of 3, never more.
fn bursts_then_refills_one_unit_per_100ms<M: StateMachine>(m: M) {
    let q = ten_per_second_burst_3();
    let clock = ManualClock::new(7 * SEC);
    let mut s = M::State::default();
    for remaining in [2, 1, 0] {
        let d = m.step(&q, &mut s, clock.now(), 1);
        assert!(d.allowed());
        assert_eq!(d.remaining(), remaining);
    }
    let d = m.step(&q, &mut s, clock.now(), 1);
    assert!(!d.allowed());
    assert_eq!(d.limit(), 3);
    assert_eq!(d.retry_after(), Some(ms(100)));
    assert_eq!(d.reset_after(), ms(300));

    clock.advance(ms(99));
    let d = m.step(&q, &mut s, clock.now(), 1);
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Some(ms(1)));

    clock.advance(ms(1));
    let d = m.step(&q, &mut s, clock.now(), 1);
    assert!(d.allowed());
    assert_eq!((d.remaining(), d.reset_after()), (0, ms(300)));

    clock.advance(ms(250));
    let read = m.step(&q, &mut s, clock.now(), 0);
    assert_eq!((read.remaining(), read.reset_after()), (2, ms(50)));
    assert!(!m.step(&q, &mut s, clock.now(), 3).allowed());
    assert!(m.step(&q, &mut s, clock.now(), 2).allowed());

    clock.advance(Duration::from_secs(3600));
    let read = m.step(&q, &mut s, clock.now(), 0);
    assert_eq!((read.remaining(), read.reset_after()), (3, Duration::ZERO));
    assert_eq!(admit_many(&m, &q, &mut s, clock.now(), 10), 3);
}

#[test]
fn token_bucket_bursts_then_refills_one_unit_per_100ms() {
    bursts_then_refills_one_unit_per_100ms(TokenBucket);
}

#[test]
fn gcra_bursts_then_refills_one_unit_per_100ms() {
    bursts_then_refills_one_unit_per_100ms(Gcra);
}

#[test]
fn leaky_bucket_bursts_then_leaks_one_unit_per_100ms() {
    bursts_then_refills_one_unit_per_100ms(LeakyBucket);
}

#[test]
fn shaping_leaky_bucket_admits_the_same_burst_and_refill() {
    bursts_then_refills_one_unit_per_100ms(LeakyBucketShaping::default());
}

/// The shaper's delays through a burst and its drain: a full queue of 3 leaves
/// at 0, 100 and 200 ms. 150 ms later the queue still holds 150 ms of work, so
/// one more joins it with a 150 ms delay, and the next must wait 50 ms to join.
#[test]
fn shaping_leaky_bucket_delays_a_burst_then_drains_at_the_rate() {
    let q = ten_per_second_burst_3();
    let shaper = LeakyBucketShaping::default();
    let clock = ManualClock::new(SEC);
    let mut s = Tat::default();
    let delays: Vec<_> = (0..3)
        .map(|_| shaper.step(&q, &mut s, clock.now(), 1).delay())
        .collect();
    assert_eq!(delays, [ms(0), ms(100), ms(200)]);
    assert!(!shaper.step(&q, &mut s, clock.now(), 1).allowed());

    clock.advance(ms(150));
    let d = shaper.step(&q, &mut s, clock.now(), 1);
    assert!(d.allowed());
    assert_eq!(d.delay(), ms(150));
    let d = shaper.step(&q, &mut s, clock.now(), 1);
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Some(ms(50)));
    assert_eq!(d.delay(), Duration::ZERO, "a deny is not delayed");
}

// ---------------------------------------------------------------------------
// The window-boundary attack: `limit` at the end of one window and `limit`
// right after the boundary. Quota 10 per second; the first burst is 1 µs
// before the boundary at 1 s.
// ---------------------------------------------------------------------------

const FIRST_BURST: Nanos = SEC - 1_000;

/// Admitted counts of two bursts of 10: at `FIRST_BURST` and at `second`.
fn boundary_attack<M: StateMachine>(m: M, second: Nanos) -> (u64, u64) {
    let q = Quota::per_second(10).unwrap();
    let clock = ManualClock::new(FIRST_BURST);
    let mut s = M::State::default();
    let first = admit_many(&m, &q, &mut s, clock.now(), 10);
    clock.set(second);
    (first, admit_many(&m, &q, &mut s, clock.now(), 10))
}

/// 10 at 0.999999 s and 10 at 1.1 s: all 20 pass, within 100 ms.
#[test]
fn boundary_attack_fixed_window_admits_2x_limit_within_one_period() {
    assert_eq!(boundary_attack(FixedWindow, SEC + 100 * MS), (10, 10));
    // Also right at the boundary, 1 µs apart.
    assert_eq!(boundary_attack(FixedWindow, SEC), (10, 10));
}

/// The log still holds the first 10 at 1.1 s (they leave at 1.999999 s).
#[test]
fn boundary_attack_sliding_log_admits_exactly_limit() {
    assert_eq!(boundary_attack(SlidingLog, SEC + 100 * MS), (10, 0));
    assert_eq!(boundary_attack(SlidingLog, SEC), (10, 0));
    // One nanosecond after the first burst leaves, all 10 pass again.
    assert_eq!(boundary_attack(SlidingLog, FIRST_BURST + SEC), (10, 10));
    assert_eq!(boundary_attack(SlidingLog, FIRST_BURST + SEC - 1), (10, 0));
}

/// At 1.1 s the previous window weighs 10 × 0.9 = 9, so exactly 1 more fits;
/// at the boundary itself it weighs the full 10 and nothing fits.
#[test]
fn boundary_attack_sliding_counter_admits_limit_plus_one_at_100ms_past_the_boundary() {
    assert_eq!(boundary_attack(SlidingCounter, SEC + 100 * MS), (10, 1));
    assert_eq!(boundary_attack(SlidingCounter, SEC), (10, 0));
}

/// The sliding counter's bound, `limit + floor(P·e/period) ≤ 2·limit − 1` per
/// sliding period, is reached: at 1.999998 s (e = period − 2 µs) the first
/// burst weighs 10 × 2 µs / 1 s = 0.00002, so 9 more fit, and the period
/// (0.999998 s, 1.999998 s] holds 19. The fixed window lets 20 through there.
#[test]
fn boundary_attack_sliding_counter_worst_case_is_2x_limit_minus_1() {
    let second = 2 * SEC - 2_000;
    assert!(
        second - SEC < FIRST_BURST,
        "both bursts in one sliding period"
    );
    assert_eq!(boundary_attack(SlidingCounter, second), (10, 9));
    assert_eq!(boundary_attack(FixedWindow, second), (10, 10));
    assert_eq!(boundary_attack(SlidingLog, second), (10, 0));
}

// ---------------------------------------------------------------------------
// A clock that goes backwards.
//
// Algorithms write time only when they admit (reads and denies must leave the
// state as it was), so "the latest time seen" by a key is its latest admission.
// ---------------------------------------------------------------------------

/// Admits 3 of 5 at 1.5 s, then the clock jumps back to 0.9 s (into the
/// previous aligned window): every decision is the one at 1.5 s, and what is
/// admitted back there is counted as admitted at 1.5 s.
fn clock_back_is_no_time_passing<M>(m: M)
where
    M: StateMachine,
    M::State: PartialEq + Debug,
{
    let q = Quota::per_second(5).unwrap();
    let clock = ManualClock::new(SEC + 500 * MS);
    let mut s = M::State::default();
    assert!(m.step(&q, &mut s, clock.now(), 3).allowed());
    let latest = clock.now();

    clock.set(900 * MS);
    for cost in 0..=6 {
        assert_eq!(
            probe(&m, &q, &s, clock.now(), cost),
            probe(&m, &q, &s, latest, cost),
            "cost {cost}"
        );
    }
    let mut at_latest = s.clone();
    let back: Vec<_> = (0..4).map(|_| m.step(&q, &mut s, clock.now(), 1)).collect();
    let ahead: Vec<_> = (0..4)
        .map(|_| m.step(&q, &mut at_latest, latest, 1))
        .collect();
    assert_eq!(back, ahead);
    assert_eq!(back.iter().filter(|d| d.allowed()).count(), 2);
    assert_eq!(
        s, at_latest,
        "the jump back left the state of no time passing"
    );

    // And once the clock is past the latest time again, time runs from there.
    clock.set(latest + 300 * MS);
    assert_eq!(
        probe(&m, &q, &s, clock.now(), 2),
        probe(&m, &q, &at_latest, clock.now(), 2)
    );
}

#[test]
fn token_bucket_treats_a_clock_going_back_as_no_time_passing() {
    clock_back_is_no_time_passing(TokenBucket);
}

#[test]
fn leaky_bucket_treats_a_clock_going_back_as_no_time_passing() {
    clock_back_is_no_time_passing(LeakyBucket);
}

#[test]
fn fixed_window_treats_a_clock_going_back_as_no_time_passing() {
    clock_back_is_no_time_passing(FixedWindow);
    // Going back into the previous window does not open a fresh one.
    let q = Quota::per_second(5).unwrap();
    let mut s = WindowCount::default();
    assert!(FixedWindow.step(&q, &mut s, SEC + 500 * MS, 5).allowed());
    assert!(!FixedWindow.step(&q, &mut s, 900 * MS, 1).allowed());
}

#[test]
fn sliding_log_treats_a_clock_going_back_as_no_time_passing() {
    clock_back_is_no_time_passing(SlidingLog);
}

#[test]
fn sliding_counter_treats_a_clock_going_back_as_no_time_passing() {
    clock_back_is_no_time_passing(SlidingCounter);
    let q = Quota::per_second(5).unwrap();
    let mut s = WindowPair::default();
    assert!(SlidingCounter.step(&q, &mut s, SEC + 500 * MS, 5).allowed());
    assert!(!SlidingCounter.step(&q, &mut s, 900 * MS, 1).allowed());
}

/// Limit 1 per second. Admitted at 1 s; a read at 2.5 s finds the admission
/// expired; the clock then jumps back to 1.5 s. The log must still count the
/// admission at 1 s (its latest time seen), so the request at 1.5 s is denied,
/// exactly as if the read had not happened.
#[test]
fn sliding_log_read_after_expiry_then_clock_back_keeps_the_latest_admission() {
    let q = Quota::per_second(1).unwrap();
    let clock = ManualClock::new(SEC);
    let mut s = Log::default();
    assert!(SlidingLog.step(&q, &mut s, clock.now(), 1).allowed());
    let without_read = s.clone();

    clock.set(2 * SEC + 500 * MS);
    let read = SlidingLog.step(&q, &mut s, clock.now(), 0);
    assert_eq!((read.remaining(), read.reset_after()), (1, Duration::ZERO));
    assert_eq!(s, without_read, "a read changes nothing");
    // The same goes for a deny of a cost that can never fit.
    assert!(!SlidingLog.step(&q, &mut s, clock.now(), 2).allowed());
    assert_eq!(s, without_read, "a deny changes nothing");

    clock.set(SEC + 500 * MS);
    let d = SlidingLog.step(&q, &mut s, clock.now(), 1);
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Some(ms(500)));
}

/// GCRA keeps one future timestamp, so a jump back looks like less time
/// elapsed and it gets stricter by the size of the jump: at 1 s, after one
/// admission, 2 more fit; 50 ms earlier only 1 does.
fn clock_back_never_admits_more<M: StateMachine>(m: M) {
    let q = ten_per_second_burst_3();
    let clock = ManualClock::new(SEC);
    let mut s = M::State::default();
    assert!(m.step(&q, &mut s, clock.now(), 1).allowed());
    let latest = clock.now();
    clock.set(latest - 50 * MS);
    for cost in 0..=4 {
        let back = probe(&m, &q, &s, clock.now(), cost);
        let ahead = probe(&m, &q, &s, latest, cost);
        assert!(!back.allowed() || ahead.allowed(), "cost {cost}");
    }
    let read_back = probe(&m, &q, &s, clock.now(), 0);
    assert!(read_back.remaining() <= probe(&m, &q, &s, latest, 0).remaining());
    assert_eq!(admit_many(&m, &q, &mut s.clone(), latest, 5), 2);
    assert_eq!(admit_many(&m, &q, &mut s, clock.now(), 5), 1);
}

#[test]
fn gcra_never_admits_more_when_the_clock_goes_back() {
    clock_back_never_admits_more(Gcra);
}

#[test]
fn shaping_leaky_bucket_never_admits_more_when_the_clock_goes_back() {
    clock_back_never_admits_more(LeakyBucketShaping::default());
}

// ---------------------------------------------------------------------------
// Costs above the capacity: burst for buckets, limit for windows.
// ---------------------------------------------------------------------------

/// Quota 10 per second, burst 5. A cost of 6 never fits a bucket: denied with
/// no retry, on a full bucket and on an empty one, and nothing is taken.
fn cost_above_burst_never_fits<M: StateMachine>(m: M) {
    let q = Quota::per_second(10).unwrap().with_burst(5).unwrap();
    let clock = ManualClock::new(3 * SEC);
    let mut s = M::State::default();
    for cost in [6, 100, MAX] {
        let d = m.step(&q, &mut s, clock.now(), cost);
        assert!(!d.allowed());
        assert_eq!((d.retry_after(), d.remaining(), d.limit()), (None, 5, 5));
    }
    assert!(m.step(&q, &mut s, clock.now(), 5).allowed());
    let d = m.step(&q, &mut s, clock.now(), 6);
    assert_eq!(
        (d.allowed(), d.retry_after(), d.remaining()),
        (false, None, 0)
    );
    clock.advance(Duration::from_secs(3600));
    assert_eq!(m.step(&q, &mut s, clock.now(), 6).retry_after(), None);
}

#[test]
fn token_bucket_denies_cost_above_burst_without_retry() {
    cost_above_burst_never_fits(TokenBucket);
}

#[test]
fn gcra_denies_cost_above_burst_without_retry() {
    cost_above_burst_never_fits(Gcra);
}

#[test]
fn leaky_bucket_denies_cost_above_burst_without_retry() {
    cost_above_burst_never_fits(LeakyBucket);
}

#[test]
fn shaping_leaky_bucket_denies_cost_above_burst_without_retry() {
    cost_above_burst_never_fits(LeakyBucketShaping { delay_after: 2 });
}

/// Windows ignore the burst: with limit 10 and burst 5 a cost of 10 fits; 11
/// never does.
fn cost_above_limit_never_fits<M: StateMachine>(m: M) {
    let q = Quota::per_second(10).unwrap().with_burst(5).unwrap();
    let clock = ManualClock::new(3 * SEC + 10 * MS);
    let mut s = M::State::default();
    for cost in [11, MAX] {
        let d = m.step(&q, &mut s, clock.now(), cost);
        assert!(!d.allowed());
        assert_eq!((d.retry_after(), d.remaining(), d.limit()), (None, 10, 10));
    }
    let d = m.step(&q, &mut s, clock.now(), 10);
    assert!(d.allowed());
    assert_eq!(d.remaining(), 0);
    let d = m.step(&q, &mut s, clock.now(), 11);
    assert_eq!((d.allowed(), d.retry_after()), (false, None));
}

#[test]
fn fixed_window_denies_cost_above_limit_without_retry() {
    cost_above_limit_never_fits(FixedWindow);
}

#[test]
fn sliding_log_denies_cost_above_limit_without_retry() {
    cost_above_limit_never_fits(SlidingLog);
}

#[test]
fn sliding_counter_denies_cost_above_limit_without_retry() {
    cost_above_limit_never_fits(SlidingCounter);
}

#[test]
fn concurrency_denies_cost_above_limit_without_retry() {
    let q = Quota::per_second(10).unwrap();
    let mut leases = Leases::default();
    let d = Concurrency::default().step(&q, &mut leases, 0, 11);
    assert_eq!(
        (d.allowed(), d.retry_after(), d.remaining()),
        (false, None, 10)
    );
    assert_eq!(leases.in_flight(), 0);
    let d = Concurrency::default().step(&q, &mut leases, 0, MAX);
    assert_eq!((d.allowed(), d.retry_after()), (false, None));
    assert!(
        Concurrency::default()
            .step(&q, &mut leases, 0, 10)
            .allowed()
    );
    assert_eq!(leases.in_flight(), 10);
}

#[test]
fn concurrency_leases_lapse_one_period_after_they_were_taken() {
    // 2 in flight, leases of one minute.
    let q = Quota::per_minute(2).unwrap();
    let mut leases = Leases::default();
    let clock = ManualClock::new(0);
    assert!(
        Concurrency::lease(1)
            .step(&q, &mut leases, clock.now(), 1)
            .allowed()
    );
    clock.advance(Duration::from_secs(30));
    assert!(
        Concurrency::lease(2)
            .step(&q, &mut leases, clock.now(), 1)
            .allowed()
    );
    assert!(
        !Concurrency::default()
            .step(&q, &mut leases, clock.now(), 1)
            .allowed()
    );
    // The first holder never released: its lease lapses at 60 s, not before.
    clock.advance(Duration::from_nanos(29_999_999_999));
    assert!(
        !Concurrency::default()
            .step(&q, &mut leases, clock.now(), 1)
            .allowed()
    );
    clock.advance(Duration::from_nanos(1));
    let d = Concurrency::lease(3).step(&q, &mut leases, clock.now(), 1);
    assert_eq!((d.allowed(), d.remaining()), (true, 0));
    // A release gives back the lease it names at once.
    assert!(Concurrency::release(&mut leases, 2, clock.now()));
    assert_eq!(leases.in_flight(), 1);
    assert_eq!(
        leases.last_lapse(),
        Some(clock.now() + 60_000_000_000),
        "the newest lease is the one left"
    );
}

// ---------------------------------------------------------------------------
// Cost 0 only reads.
// ---------------------------------------------------------------------------

/// A read is allowed, changes nothing and reports what is left: all of it on a
/// new key, what is left after a partial use, and zero (still allowed) when
/// exhausted.
fn cost_zero_only_reads<M>(m: M, capacity: u64)
where
    M: StateMachine,
    M::State: PartialEq + Debug,
{
    let q = Quota::per_second(5).unwrap().with_burst(4).unwrap();
    let clock = ManualClock::new(2 * SEC + 10 * MS);
    let mut s = M::State::default();
    let read = |s: &mut M::State, expect: u64| {
        let before = s.clone();
        let d = m.step(&q, s, clock.now(), 0);
        assert!(d.allowed());
        assert_eq!(
            (d.remaining(), d.limit(), d.retry_after()),
            (expect, capacity, None)
        );
        assert_eq!(*s, before, "a read changed the state");
        d
    };
    assert_eq!(read(&mut s, capacity).reset_after(), Duration::ZERO);
    assert!(m.step(&q, &mut s, clock.now(), 3).allowed());
    assert!(read(&mut s, capacity - 3).reset_after() > Duration::ZERO);
    assert!(m.step(&q, &mut s, clock.now(), capacity - 3).allowed());
    read(&mut s, 0);
}

#[test]
fn token_bucket_cost_zero_only_reads() {
    cost_zero_only_reads(TokenBucket, 4);
}

#[test]
fn gcra_cost_zero_only_reads() {
    cost_zero_only_reads(Gcra, 4);
}

#[test]
fn leaky_bucket_cost_zero_only_reads() {
    cost_zero_only_reads(LeakyBucket, 4);
}

#[test]
fn shaping_leaky_bucket_cost_zero_only_reads() {
    cost_zero_only_reads(LeakyBucketShaping::default(), 4);
}

#[test]
fn fixed_window_cost_zero_only_reads() {
    cost_zero_only_reads(FixedWindow, 5);
}

#[test]
fn sliding_log_cost_zero_only_reads() {
    cost_zero_only_reads(SlidingLog, 5);
}

#[test]
fn sliding_counter_cost_zero_only_reads() {
    cost_zero_only_reads(SlidingCounter, 5);
}

#[test]
fn concurrency_cost_zero_only_reads() {
    let q = Quota::per_second(5).unwrap();
    let mut leases = Leases::default();
    assert!(Concurrency::default().step(&q, &mut leases, 0, 3).allowed());
    let before = leases.clone();
    let d = Concurrency::default().step(&q, &mut leases, 0, 0);
    assert_eq!((d.allowed(), d.remaining()), (true, 2));
    assert_eq!(leases, before);
}

// ---------------------------------------------------------------------------
// Values at the edges of u64: no panic, no wrap, sensible decisions.
// ---------------------------------------------------------------------------

/// Runs the body once per rate algorithm, as a function generic over the state
/// machine `$m`, given the quota `$q` and the capacity `$cap` (burst or limit)
/// that the algorithm's decisions report.
macro_rules! for_each_rate_algorithm {
    ($quota:expr, |$m:ident, $q:ident, $cap:ident| $body:block) => {{
        fn run<M: StateMachine>($m: M, $q: Quota, $cap: u64) {
            let _ = $cap;
            $body
        }
        let q: Quota = $quota;
        run(TokenBucket, q, q.burst());
        run(Gcra, q, q.burst());
        run(LeakyBucket, q, q.burst());
        run(LeakyBucketShaping { delay_after: 1 }, q, q.burst());
        run(FixedWindow, q, q.limit());
        run(SlidingLog, q, q.limit());
        run(SlidingCounter, q, q.limit());
    }};
}

#[test]
fn quotas_near_u64_max_build_or_fail_with_a_typed_error() {
    let q = Quota::new(MAX, Duration::from_nanos(MAX)).unwrap();
    assert_eq!((q.limit(), q.burst(), q.emission_ns()), (MAX, MAX, 1));
    let q = Quota::new(1, Duration::from_nanos(MAX)).unwrap();
    assert_eq!((q.emission_ns(), q.burst()), (MAX, 1));
    // 5 divides u64::MAX, so a burst of 5 drains in exactly u64::MAX ns.
    assert_eq!(
        Quota::new(5, Duration::from_nanos(MAX))
            .unwrap()
            .emission_ns(),
        MAX / 5
    );
    // The emission interval rounds up, so these bursts would take longer than
    // u64::MAX ns to drain: refused, not wrapped.
    for limit in [MAX - 1, MAX / 2, 10] {
        assert!(matches!(
            Quota::new(limit, Duration::from_nanos(MAX)),
            Err(QuotaError::BurstTooLarge { .. })
        ));
    }
    assert!(matches!(
        Quota::new(MAX, Duration::from_nanos(MAX - 1)),
        Err(QuotaError::RateTooHigh { .. })
    ));
    assert!(matches!(
        Quota::per_second(1).unwrap().with_burst(MAX),
        Err(QuotaError::BurstTooLarge { .. })
    ));
}

/// Limit and burst u64::MAX per u64::MAX ns (one unit per nanosecond). A cost
/// of u64::MAX passes once on a new key and takes everything: the next unit is
/// denied, and the retry (when the clock can reach it) is exact.
#[test]
fn u64_max_cost_on_a_u64_max_quota_is_admitted_once_then_nothing_fits() {
    for_each_rate_algorithm!(
        Quota::new(MAX, Duration::from_nanos(MAX)).unwrap(),
        |m, q, cap| {
            let clock = ManualClock::new(0);
            let mut s = M::State::default();
            let d = m.step(&q, &mut s, clock.now(), MAX);
            assert!(d.allowed());
            assert_eq!((d.limit(), d.remaining()), (cap, 0));
            for cost in [1, 2, MAX] {
                let before = s.clone();
                let d = m.step(&q, &mut s, clock.now(), cost);
                assert!(!d.allowed(), "cost {cost} admitted on top of u64::MAX");
                assert_sane(&m, &q, &before, clock.now(), cost, &d);
            }
        }
    );
}

/// The same quota, with a small admission first and then a near-u64::MAX one:
/// the sums overflow u64 and must not wrap or saturate into an admission.
#[test]
fn near_u64_max_costs_do_not_wrap_into_an_admission() {
    for_each_rate_algorithm!(
        Quota::new(MAX, Duration::from_nanos(MAX)).unwrap(),
        |m, q, _cap| {
            let mut s = M::State::default();
            assert!(m.step(&q, &mut s, 0, 1).allowed());
            for now in [0, MAX / 2] {
                let before = s.clone();
                let d = m.step(&q, &mut s, now, MAX);
                assert!(!d.allowed(), "1 + u64::MAX admitted at {now}");
                assert_sane(&m, &q, &before, now, MAX, &d);
            }
            assert!(m.step(&q, &mut s, 0, MAX - 1).allowed());
        }
    );
}

/// A sliding log holding 1 and u64::MAX − 2 of a u64::MAX − 1 limit: the retry
/// for a cost of 3 sums past u64::MAX while looking for it, and must still say
/// "when the second entry leaves", exactly.
#[test]
fn sliding_log_retry_with_near_u64_max_costs_does_not_overflow() {
    let q = Quota::new(MAX - 1, Duration::from_nanos(MAX - 1)).unwrap();
    let mut s = Log::default();
    assert!(SlidingLog.step(&q, &mut s, 0, 1).allowed());
    assert!(SlidingLog.step(&q, &mut s, 1, MAX - 2).allowed());
    let before = s.clone();
    let d = SlidingLog.step(&q, &mut s, 2, 3);
    assert!(!d.allowed());
    // The entry at 1 leaves at 1 + (u64::MAX − 1) = u64::MAX.
    assert_eq!(d.retry_after(), Some(Duration::from_nanos(MAX - 2)));
    assert_sane(&SlidingLog, &q, &before, 2, 3, &d);
}

/// At now = u64::MAX time cannot pass any more. Nothing may admit more than its
/// capacity there, every retry must be reachable (so: none), and the bucket
/// algorithms still agree with each other.
#[test]
fn at_now_u64_max_no_algorithm_admits_more_than_its_capacity() {
    for_each_rate_algorithm!(ten_per_second_burst_3(), |m, q, cap| {
        let clock = ManualClock::new(0);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), MAX);
        let mut s = M::State::default();
        let mut admitted = 0;
        for _ in 0..20 {
            let before = s.clone();
            let d = m.step(&q, &mut s, clock.now(), 1);
            assert_sane(&m, &q, &before, clock.now(), 1, &d);
            admitted += u64::from(d.allowed());
        }
        assert!(admitted <= cap, "{admitted} admitted at the end of time");
        let read = m.step(&q, &mut s, clock.now(), 0);
        assert!(read.allowed() && read.remaining() <= cap);
        if admitted > 0 {
            assert!(
                read.reset_after() > Duration::ZERO,
                "used, yet reports full"
            );
        }
    });
    // The policing buckets stay one algorithm even there.
    let q = ten_per_second_burst_3();
    let runs = [
        (0..5)
            .map(|_| TokenBucket.step(&q, &mut Default::default(), MAX, 1))
            .collect::<Vec<_>>(),
        (0..5)
            .map(|_| Gcra.step(&q, &mut Default::default(), MAX, 1))
            .collect(),
        (0..5)
            .map(|_| LeakyBucket.step(&q, &mut Default::default(), MAX, 1))
            .collect(),
    ];
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], runs[2]);
}

/// A key used shortly before the end of time: the admissions that still fit
/// are exact, none wraps, and the bucket bound (burst + elapsed / T) holds.
#[test]
fn approaching_u64_max_the_buckets_stay_within_their_bound_and_agree() {
    let q = ten_per_second_burst_3();
    let t = q.emission_ns();
    let start = MAX - 10 * t;
    let mut token = Default::default();
    let mut gcra = Default::default();
    let mut leaky = Default::default();
    let mut shaping = Default::default();
    let mut admitted = 0;
    for step in 0..=40 {
        let now = start.saturating_add(step * t / 4);
        let d = TokenBucket.step(&q, &mut token, now, 1);
        assert_eq!(Gcra.step(&q, &mut gcra, now, 1), d, "at {now}");
        assert_eq!(LeakyBucket.step(&q, &mut leaky, now, 1), d, "at {now}");
        let shaped = LeakyBucketShaping::default().step(&q, &mut shaping, now, 1);
        assert_eq!(
            (shaped.allowed(), shaped.retry_after()),
            (d.allowed(), d.retry_after())
        );
        admitted += u64::from(d.allowed());
        assert!(
            admitted <= q.burst() + (now - start) / t,
            "{admitted} by {now}"
        );
    }
    assert!(admitted > q.burst(), "the last 10 intervals still refill");
}

/// A u64::MAX-nanosecond period: window 0 is [0, u64::MAX) and window 1 starts
/// at u64::MAX and never ends. Its count is never reset, so a deny there has no
/// retry, and the reset is not reported as now.
#[test]
fn windows_at_the_end_of_time_never_promise_a_retry_they_cannot_keep() {
    let q = Quota::new(5, Duration::from_nanos(MAX)).unwrap();
    let mut fixed = WindowCount::default();
    let mut counter = WindowPair::default();
    let mut log = Log::default();
    assert!(FixedWindow.step(&q, &mut fixed, MAX - 1, 5).allowed());
    let d = FixedWindow.step(&q, &mut fixed, MAX - 1, 1);
    assert_eq!(d.retry_after(), Some(Duration::from_nanos(1)));
    assert!(FixedWindow.step(&q, &mut fixed, MAX, 5).allowed());
    let d = FixedWindow.step(&q, &mut fixed, MAX, 1);
    assert_eq!((d.allowed(), d.retry_after()), (false, None));
    assert!(
        d.reset_after() > Duration::ZERO,
        "a used window reported as reset"
    );

    assert!(SlidingCounter.step(&q, &mut counter, MAX, 5).allowed());
    let d = SlidingCounter.step(&q, &mut counter, MAX, 1);
    assert_eq!((d.allowed(), d.retry_after()), (false, None));
    assert!(d.reset_after() > Duration::ZERO);

    assert!(SlidingLog.step(&q, &mut log, MAX, 5).allowed());
    let d = SlidingLog.step(&q, &mut log, MAX, 1);
    assert_eq!((d.allowed(), d.retry_after()), (false, None));
    assert_eq!(d.reset_after(), Duration::from_nanos(MAX));
}

/// Limit 1 per 10 ns, admitted at u64::MAX − 5: that admission counts until
/// u64::MAX + 5, so at u64::MAX it is still in the window.
#[test]
fn sliding_log_entry_near_u64_max_does_not_expire_early() {
    let q = Quota::new(1, Duration::from_nanos(10)).unwrap();
    let mut s = Log::default();
    assert!(SlidingLog.step(&q, &mut s, MAX - 5, 1).allowed());
    let d = SlidingLog.step(&q, &mut s, MAX, 1);
    assert!(!d.allowed(), "the admission at u64::MAX - 5 expired early");
    assert_eq!(d.retry_after(), None);
    assert_eq!(d.reset_after(), Duration::from_nanos(5));
}

/// The longest period with the smallest limit: one unit per u64::MAX ns. A new
/// key admits it at 0; nothing else fits before the end of time.
#[test]
fn one_unit_per_u64_max_nanoseconds_is_admitted_once() {
    for_each_rate_algorithm!(
        Quota::new(1, Duration::from_nanos(MAX)).unwrap(),
        |m, q, _cap| {
            let mut s = M::State::default();
            assert!(m.step(&q, &mut s, 0, 1).allowed());
            for now in [0, 1, MAX / 2, MAX - 1] {
                let before = s.clone();
                let d = m.step(&q, &mut s, now, 1);
                assert!(!d.allowed(), "second unit admitted at {now}");
                assert_sane(&m, &q, &before, now, 1, &d);
            }
            let before = s.clone();
            let d = m.step(&q, &mut s, MAX, 1);
            assert_sane(&m, &q, &before, MAX, 1, &d);
        }
    );
}
