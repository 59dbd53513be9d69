//! The key cap under floods of unique keys: the store never holds more keys
//! than its cap, eviction forgets only state at rest, and a victim's limited
//! state survives any flood, in every kind of table. Time comes from a manual
//! clock; nothing sleeps.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate_core::{
    Algorithm, Clock, Limit, Log, ManualClock, Nanos, Quota, SlidingLog, StateMachine, Visitor,
};
use tollgate_store::{MemoryConfig, MemoryStore};

type Store = MemoryStore<Arc<ManualClock>>;

fn store(max_keys: usize, shards: usize, sweep_interval: Duration) -> (Store, Arc<ManualClock>) {
    // Aligned to a second, so per-second windows start with the test.
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let config = MemoryConfig {
        max_keys,
        shards,
        sweep_interval,
    };
    (MemoryStore::with_clock(config, Arc::clone(&clock)), clock)
}

fn every_algorithm() -> impl Iterator<Item = Algorithm> {
    Algorithm::RATE.into_iter().chain([Algorithm::Concurrency])
}

/// Victims of a short, a middling and a long period: a per-second victim is
/// the one that eviction by soonest expiry used to forget first.
fn victims() -> [(&'static str, Quota); 3] {
    [
        ("victim:second", Quota::per_second(3).unwrap()),
        ("victim:minute", Quota::per_minute(4).unwrap()),
        ("victim:hour", Quota::per_hour(5).unwrap()),
    ]
}

/// Flood keys that are back to full soon (a millisecond for the buckets) and
/// flood keys under a per-day rule on an attacker-chosen value, which stay
/// limiting all day.
fn flood_quota(i: usize) -> Quota {
    if i.is_multiple_of(2) {
        Quota::per_second(1000).unwrap()
    } else {
        Quota::new(1000, Duration::from_secs(86_400)).unwrap()
    }
}

fn assert_denied(store: &Store, algorithm: Algorithm, when: &str) {
    for (key, quota) in victims() {
        let outcome = store.check_now(&[Limit::new(key, quota, algorithm)]);
        assert!(!outcome.allowed(), "{algorithm} {key} admitted {when}");
    }
}

#[test]
fn victims_at_their_limit_stay_limited_through_a_flood_of_every_table_kind() {
    const CAP: usize = 64;
    for algorithm in every_algorithm() {
        let (store, clock) = store(CAP, 4, Duration::from_secs(1));
        for (key, quota) in victims() {
            let limit = Limit::new(key, quota, algorithm);
            let admitted = (0..10)
                .take_while(|_| store.check_now(&[limit]).allowed())
                .count();
            assert_eq!(admitted as u64, quota.burst(), "{algorithm} {key}");
        }
        // Twenty caps' worth of unique keys over 128 ms: less than the
        // per-second victim takes to earn back one unit (333 ms), and within
        // its aligned window.
        for i in 0..20 * CAP {
            clock.advance(Duration::from_micros(100));
            let key = format!("flood:{i}");
            store.check_now(&[Limit::new(&key, flood_quota(i), algorithm)]);
            assert!(store.len() <= CAP, "{algorithm}: {} keys", store.len());
            assert_denied(&store, algorithm, &format!("during the flood, at key {i}"));
        }
        assert_denied(&store, algorithm, "after the flood");
        let stats = store.stats();
        assert!(stats.keys <= CAP, "{algorithm}: {stats:?}");
        // The per-day keys fill the store, and then no new key can stay.
        assert!(stats.refusals > 0, "{algorithm}: {stats:?}");
    }
}

/// Tracker issue 10: unique-key leases were never evicted, so they grew past
/// the cap, and once it was full every other key went on the next insert: a
/// victim limited to 5 per hour was admitted on every try.
#[test]
fn regression_a_lease_flood_neither_passes_the_cap_nor_lifts_other_limits() {
    const CAP: usize = 64;
    let (store, clock) = store(CAP, 4, Duration::from_secs(1));
    let day = Quota::new(1, Duration::from_secs(86_400)).unwrap();
    let victims: Vec<_> = Algorithm::RATE
        .into_iter()
        .map(|algorithm| Limit::new("victim", Quota::per_hour(5).unwrap(), algorithm))
        .collect();
    for victim in &victims {
        while store.check_now(&[*victim]).allowed() {}
    }
    for i in 0..20 * CAP {
        clock.advance(Duration::from_millis(10));
        let key = format!("lease:{i}");
        store.check_now(&[Limit::new(&key, day, Algorithm::Concurrency)]);
        assert!(store.len() <= CAP, "{} keys", store.len());
        for victim in &victims {
            let algorithm = victim.algorithm;
            assert!(
                !store.check_now(&[*victim]).allowed(),
                "{algorithm} at lease {i}"
            );
        }
    }
    assert!(store.stats().refusals > 0);
}

#[test]
fn a_refused_key_is_let_in_once_a_held_key_is_at_rest() {
    let (store, clock) = store(1, 1, Duration::from_secs(1));
    let held = Limit::new("held", Quota::per_second(10).unwrap(), Algorithm::Gcra);
    let newcomer = Limit::new("new", Quota::per_hour(1).unwrap(), Algorithm::Gcra);
    assert!(store.check_now(&[held]).allowed());
    let refused = store.check_now(&[newcomer]).decisions[0];
    assert!(!refused.allowed());
    assert_eq!(refused.remaining(), 0);
    // "held" is back to full one emission interval (100 ms) after its check.
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(100)));
    clock.advance(Duration::from_millis(99));
    assert!(!store.check_now(&[newcomer]).allowed());
    clock.advance(Duration::from_millis(1));
    assert!(store.check_now(&[newcomer]).allowed());
    let stats = store.stats();
    assert_eq!((stats.keys, stats.evictions, stats.refusals), (1, 1, 2));
}

#[test]
fn a_refusal_in_a_multi_limit_check_consumes_nothing_from_the_other_limits() {
    let (store, _) = store(2, 1, Duration::from_secs(1));
    let q = Quota::per_hour(2).unwrap();
    let own = Limit::new("own", q, Algorithm::TokenBucket);
    assert!(store.check_now(&[own]).allowed());
    assert!(
        store
            .check_now(&[Limit::new("filler", q, Algorithm::Gcra)])
            .allowed()
    );
    // The store is full of limiting state: the new key is refused, and the
    // request's other limit is left as it was.
    let outcome = store.check_now(&[own, Limit::new("new", q, Algorithm::Gcra)]);
    assert!(!outcome.allowed());
    assert!(store.check_now(&[own]).allowed(), "one unit was left");
    assert!(!store.check_now(&[own]).allowed());
}

#[test]
fn lapsed_leases_make_room_and_live_ones_do_not() {
    let (store, clock) = store(4, 1, Duration::from_secs(3600));
    let lease = |key| Limit::new(key, Quota::per_second(1).unwrap(), Algorithm::Concurrency);
    for key in ["a", "b", "c", "d"] {
        assert!(store.check_now(&[lease(key)]).allowed());
    }
    let refused = store.check_now(&[lease("e")]).decisions[0];
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(1)));
    clock.advance(Duration::from_secs(1));
    assert!(store.check_now(&[lease("e")]).allowed());
    assert_eq!(store.stats().evictions, 1);
    assert!(store.len() <= 4);
}

/// One check of a replay: which key, after how long.
#[derive(Debug, Clone)]
struct Step {
    key: u8,
    advance_us: u32,
}

const MODEL_CAP: usize = 4;

/// Each key keeps one quota: a short, a middling and a long one.
fn model_quota(key: u8) -> Quota {
    match key % 3 {
        0 => Quota::new(2, Duration::from_millis(10)).unwrap(),
        1 => Quota::per_second(3).unwrap(),
        _ => Quota::per_minute(2).unwrap(),
    }
}

/// Replays checks through a store with a small cap and through an unbounded
/// model (one state per key, never forgotten), and holds the store to the
/// model's decisions: the store may refuse a new key when every key it holds
/// still limits, and in no other way differ. An eviction of state that still
/// limited would show as an admission the model denies.
struct Replay {
    algorithm: Algorithm,
    steps: Vec<Step>,
}

impl Visitor for Replay {
    type Output = Result<(), TestCaseError>;

    fn visit<M: StateMachine>(self, machine: M) -> Self::Output {
        // Sweeping at every check drops every entry at rest before a new key
        // can need room, so a refusal means nothing held is at rest.
        let (store, clock) = store(MODEL_CAP, 1, Duration::ZERO);
        let mut model: HashMap<u8, M::State> = HashMap::new();
        let mut refusals = 0;
        for step in self.steps {
            clock.advance(Duration::from_micros(u64::from(step.advance_us)));
            let now: Nanos = clock.now();
            let (name, quota) = (format!("k{}", step.key), model_quota(step.key));
            let got = store
                .check_now(&[Limit::new(&name, quota, self.algorithm)])
                .decisions[0];
            let mut state = model.get(&step.key).cloned().unwrap_or_default();
            let want = machine.step(&quota, &mut state, now, 1);
            if got == want {
                model.insert(step.key, state);
            } else {
                prop_assert!(
                    want.allowed() && !got.allowed(),
                    "{got:?} where the model has {want:?}"
                );
                let limiting = model
                    .iter()
                    .filter(|&(&key, state)| {
                        let read = machine.step(&model_quota(key), &mut state.clone(), now, 0);
                        read.reset_after() > Duration::ZERO
                    })
                    .count();
                prop_assert!(
                    limiting >= MODEL_CAP,
                    "refused with {limiting} keys limiting"
                );
                refusals += 1;
            }
            let stats = store.stats();
            prop_assert!(stats.keys <= MODEL_CAP);
            prop_assert_eq!(stats.refusals, refusals);
        }
        Ok(())
    }
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = (0u8..12, prop_oneof![Just(0u32), 0u32..2_000, 0u32..400_000])
        .prop_map(|(key, advance_us)| Step { key, advance_us });
    proptest::collection::vec(step, 1..200)
}

proptest! {
    // Failing cases are saved beside the manifest, as tollgate-core's are.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/flood.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn eviction_forgets_only_state_at_rest_and_refuses_only_when_none_is(
        algorithm in proptest::sample::select(Algorithm::RATE.to_vec()),
        steps in steps(),
    ) {
        algorithm.visit(Replay { algorithm, steps })?;
    }

    /// A sliding log keeps one entry per admission time inside its window and
    /// every entry holds at least one unit, so one key's log holds at most
    /// `limit` entries however it is driven.
    #[test]
    fn a_sliding_log_holds_at_most_its_limit_of_entries(
        limit in 1u64..8,
        steps in proptest::collection::vec((0u64..400_000_000, 0u64..10), 1..300),
    ) {
        let quota = Quota::per_second(limit).unwrap();
        let mut log = Log::default();
        let mut now = 0;
        for (advance, cost) in steps {
            now += advance;
            SlidingLog.step(&quota, &mut log, now, cost);
            prop_assert!(log.entries.len() as u64 <= limit, "{log:?}");
            prop_assert!(log.total <= limit);
        }
    }
}
