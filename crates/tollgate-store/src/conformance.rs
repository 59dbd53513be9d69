//! The conformance scenarios, written once and run on every store and every
//! wrapper: the memory store (the reference), a single Redis and a Redis
//! Cluster, and the deny cache, fallback and hybrid wrappers over each, all on
//! the same injected manual clock.
//!
//! A backend must give the reference's decisions exactly ([`assert_same`]).
//! Times, periods and emission intervals are whole microseconds, where the
//! Redis store is specified to decide exactly as the memory store does; the one
//! documented difference is that a sliding counter's `retry_after` is the
//! memory store's rounded up to the microsecond, so `retry_after` is compared
//! after that rounding (the identity for every other algorithm).
//!
//! A wrapper must give them exactly where it is specified to pass checks
//! through (a fallback over a healthy store, hybrid mode on requests with an
//! algorithm it does not lease, see [`Scenario::unleased`]); a deny cache, which
//! answers a cached key's request without the others' decisions, must admit
//! and deny exactly the same requests ([`assert_same_verdicts`]).
//!
//! Every key of a scenario starts with the same hash tag, so on a cluster the
//! whole request is one slot and one atomic script, as on a single server.
//!
//! Enabled by the `conformance` feature, for the tests of any backend crate.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{
    Algorithm, Clock, Decision, FailurePolicy, Lease, Limit, ManualClock, Outcome, Quota, Store,
};

use crate::{MemoryConfig, MemoryStore};

/// What a scenario does next.
#[derive(Debug, Clone)]
pub enum Step {
    /// Moves the clock (backwards when negative), in microseconds.
    Advance(i64),
    /// Checks these limits (indexes into the scenario's limit table, with costs).
    Check(Vec<(usize, u64)>),
    /// Releases the concurrency leases of the n-th admitted request still
    /// held (of those that took leases), which are then no longer held.
    Release(usize),
    /// Releases once more the leases the last [`Step::Release`] gave back.
    ReleaseAgain,
    /// Releases the leases of the n-th admitted request still held, each id
    /// under the key of the scenario's limit at the second index instead of
    /// its own; they stay held.
    ReleaseUnder(usize, usize),
}

/// A named sequence of steps over a table of limits.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// What it exercises, for failure messages.
    pub name: String,
    /// The limits its checks index: key, quota, algorithm.
    pub limits: Vec<(String, Quota, Algorithm)>,
    /// What it does, in order.
    pub steps: Vec<Step>,
}

impl Scenario {
    /// Whether no limit of the scenario has an algorithm that `leased` says is
    /// leased: hybrid mode then passes every check to its inner store as it
    /// is, and must decide exactly as the reference.
    pub fn unleased(&self, leased: impl Fn(Algorithm) -> bool) -> bool {
        self.limits
            .iter()
            .all(|(_, _, algorithm)| !leased(*algorithm))
    }

    /// The scenario with its clock never moving backwards (those steps stand
    /// still instead), for parts whose answers are specified on a monotonic
    /// clock only: a deny cached until `sent + retry_after` outlasts a clock
    /// set back.
    pub fn monotonic(&self) -> Scenario {
        let steps = self
            .steps
            .iter()
            .map(|step| match step {
                Step::Advance(us) => Step::Advance((*us).max(0)),
                other => other.clone(),
            })
            .collect();
        Scenario {
            name: format!("{} (monotonic)", self.name),
            limits: self.limits.clone(),
            steps,
        }
    }
}

/// A small deterministic generator (an LCG), so scenarios are the same on
/// every run and every store.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn quota(limit: u64, period_ms: u64, burst: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(period_ms))
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

/// Random requests of one to three limits, costs 0 to 3 (mostly 1), times
/// moving by whole microseconds, sometimes backwards.
fn random(
    name: &str,
    seed: u64,
    limits: Vec<(String, Quota, Algorithm)>,
    steps: usize,
) -> Scenario {
    let mut rng = Rng(seed);
    let advances: [i64; 10] = [
        0, 0, 1, 999, 13_000, 50_000, 100_000, 250_007, 1_000_000, -30_000,
    ];
    let mut out = Vec::new();
    for _ in 0..steps {
        out.push(Step::Advance(
            advances[rng.below(advances.len() as u64) as usize],
        ));
        let n = 1 + rng.below(3) as usize;
        let check = (0..n)
            .map(|_| {
                let cost = match rng.below(10) {
                    0 => 0,
                    1 => 2,
                    2 => 3,
                    _ => 1,
                };
                (rng.below(limits.len() as u64) as usize, cost)
            })
            .collect();
        out.push(Step::Check(check));
    }
    Scenario {
        name: name.to_owned(),
        limits,
        steps: out,
    }
}

fn key(name: &str) -> String {
    format!("{{conformance}}{name}")
}

/// Every scenario: each rate algorithm alone under random traffic, all of them
/// mixed in one request, the concurrency limiter with releases, and the
/// hand-written all-or-nothing cases.
pub fn scenarios() -> Vec<Scenario> {
    let mut all = Vec::new();
    for (i, algorithm) in Algorithm::RATE
        .into_iter()
        .chain([Algorithm::LeakyBucketShaping { delay_after: 1 }])
        .enumerate()
    {
        let limits = vec![
            (
                key(&format!("{i}-{algorithm}-a")),
                quota(10, 1000, 3),
                algorithm,
            ),
            (
                key(&format!("{i}-{algorithm}-b")),
                quota(4, 2000, 6),
                algorithm,
            ),
            (
                key(&format!("{i}-{algorithm}-c")),
                quota(7, 700, 2),
                algorithm,
            ),
        ];
        all.push(random(
            &format!("random {algorithm} {i}"),
            17 + i as u64,
            limits,
            250,
        ));
    }
    // Rates whose emission intervals are whole microseconds (1 s / n).
    let mixed = Algorithm::RATE
        .into_iter()
        .enumerate()
        .zip([5, 8, 10, 4, 20, 25, 16])
        .map(|((i, a), n)| (key(&format!("mixed-{i}")), quota(n, 1000, 3 + i as u64), a))
        .collect();
    all.push(random("mixed algorithms in one request", 99, mixed, 300));

    // Concurrency: acquire and release, with costs.
    let mut rng = Rng(7);
    let mut steps = Vec::new();
    for _ in 0..200 {
        match rng.below(3) {
            0 => steps.push(Step::Release(rng.below(4) as usize)),
            _ => {
                let a = (0, 1 + rng.below(2));
                let check = if rng.below(3) == 0 {
                    vec![a, (1, 1)]
                } else {
                    vec![a]
                };
                steps.push(Step::Check(check));
            }
        }
        steps.push(Step::Advance(1_000));
    }
    all.push(Scenario {
        name: "concurrency leases".into(),
        limits: vec![
            (
                key("slots"),
                Quota::per_hour(4).unwrap(),
                Algorithm::Concurrency,
            ),
            (key("slots-rate"), quota(20, 1000, 20), Algorithm::Gcra),
        ],
        steps,
    });

    all.push(exact_leases());

    // A deny by one layer consumes nothing from the others, for every algorithm.
    for algorithm in Algorithm::RATE {
        all.push(Scenario {
            name: format!("all-or-nothing {algorithm}"),
            limits: vec![
                (
                    key(&format!("aon-global-{algorithm}")),
                    quota(100, 1000, 100),
                    algorithm,
                ),
                (
                    key(&format!("aon-user-{algorithm}")),
                    quota(2, 1000, 2),
                    algorithm,
                ),
            ],
            steps: vec![
                Step::Check(vec![(0, 1), (1, 1)]),
                Step::Check(vec![(0, 1), (1, 1)]),
                Step::Check(vec![(0, 1), (1, 1)]),
                Step::Check(vec![(0, 0)]),
                Step::Check(vec![(1, 1), (0, 1)]),
                Step::Check(vec![(0, 0), (1, 0)]),
            ],
        });
    }
    // A shared key used twice in one request sees its own first use, and a
    // deny undoes it.
    all.push(Scenario {
        name: "shared key twice, then a deny undoes it".into(),
        limits: vec![
            (key("shared"), quota(4, 1000, 3), Algorithm::Gcra),
            (key("strict"), quota(1, 1000, 1), Algorithm::SlidingLog),
            (key("log-shared"), quota(3, 1000, 3), Algorithm::SlidingLog),
        ],
        steps: vec![
            Step::Check(vec![(0, 1), (0, 1), (1, 1)]),
            Step::Check(vec![(0, 1), (1, 1)]),
            Step::Check(vec![(0, 0)]),
            Step::Check(vec![(0, 1), (0, 1)]),
            Step::Check(vec![(2, 2), (2, 1), (2, 1)]),
            Step::Check(vec![(2, 1), (2, 1), (2, 1)]),
            Step::Advance(400_000),
            Step::Check(vec![(2, 2), (2, 1)]),
            Step::Advance(700_000),
            Step::Check(vec![(2, 1), (1, 1), (2, 1)]),
            Step::Check(vec![(2, 3)]),
        ],
    });
    all
}

/// A release gives back exactly the lease it names: of two leases of the
/// same cost on one key, the second taken (B) is released and the first (A)
/// still lapses at its own time, a period after it was taken; releasing B
/// again, releasing another key's lease under this key, and releasing A once
/// it lapsed give back nothing. The reference's answers are pinned by a test
/// of this module.
pub fn exact_leases() -> Scenario {
    let second = Quota::per_second(2).unwrap();
    Scenario {
        name: "a release names its exact lease".into(),
        limits: vec![
            (key("exact"), second, Algorithm::Concurrency),
            (key("exact-other"), second, Algorithm::Concurrency),
        ],
        steps: vec![
            // 0: A.
            Step::Check(vec![(0, 1)]),
            Step::Advance(500_000),
            // 1: B; 2: full.
            Step::Check(vec![(0, 1)]),
            Step::Check(vec![(0, 1)]),
            // 3: the other key's lease.
            Step::Check(vec![(1, 1)]),
            Step::ReleaseUnder(2, 0),
            // 4: still full.
            Step::Check(vec![(0, 0)]),
            Step::Release(1),
            // 5: B came back.
            Step::Check(vec![(0, 0)]),
            Step::ReleaseAgain,
            // 6: nothing more did.
            Step::Check(vec![(0, 0)]),
            Step::Advance(499_999),
            // 7: A is still held a microsecond before it lapses...
            Step::Check(vec![(0, 0)]),
            Step::Advance(1),
            // 8: ...and lapsed at its time, not at B's.
            Step::Check(vec![(0, 0)]),
            // 9, 10: C and D fill the key again.
            Step::Check(vec![(0, 1)]),
            Step::Check(vec![(0, 1)]),
            // A lapsed: its release gives nothing back. 11: full.
            Step::Release(0),
            Step::Check(vec![(0, 1)]),
        ],
    }
}

/// Runs a scenario on `store`, whose time is `clock`; returns every outcome.
pub async fn run<S: Store>(
    store: &S,
    clock: &Arc<ManualClock>,
    scenario: &Scenario,
) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let mut held: Vec<Vec<Lease>> = Vec::new();
    let mut released: Vec<Lease> = Vec::new();
    for step in &scenario.steps {
        match step {
            Step::Advance(us) => {
                let now = clock.now();
                let to = now.saturating_add_signed(us * 1000);
                clock.set(to);
            }
            Step::Check(parts) => {
                let limits: Vec<Limit<'_>> = parts
                    .iter()
                    .map(|&(i, cost)| {
                        let (key, quota, algorithm) = &scenario.limits[i];
                        Limit {
                            key,
                            quota: *quota,
                            algorithm: *algorithm,
                            cost,
                            failure: FailurePolicy::Local,
                        }
                    })
                    .collect();
                let outcome = store.check(&limits).await.expect("check");
                if !outcome.leases.is_empty() {
                    held.push(outcome.leases.clone());
                }
                outcomes.push(outcome);
            }
            Step::Release(n) => {
                if !held.is_empty() {
                    released = held.remove(n % held.len());
                    store.release(&released).await.expect("release");
                }
            }
            Step::ReleaseAgain => store.release(&released).await.expect("release"),
            Step::ReleaseUnder(n, limit) => {
                if !held.is_empty() {
                    let (key, _, _) = &scenario.limits[*limit];
                    let misplaced: Vec<Lease> = held[n % held.len()]
                        .iter()
                        .map(|lease| Lease {
                            key: key.clone(),
                            ..lease.clone()
                        })
                        .collect();
                    store.release(&misplaced).await.expect("release");
                }
            }
        }
    }
    outcomes
}

/// Rounds a retry up to whole microseconds (the Redis store's resolution).
fn ceil_us(d: Duration) -> Duration {
    Duration::from_micros(u64::try_from(d.as_nanos().div_ceil(1000)).unwrap())
}

fn normalized(d: &Decision) -> Decision {
    d.with_retry_after(d.retry_after().map(ceil_us))
}

/// Asserts that `actual` matches the reference outcomes decision by decision
/// (`retry_after` of both rounded up to whole microseconds).
pub fn assert_same(scenario: &Scenario, reference: &[Outcome], actual: &[Outcome], store: &str) {
    assert_eq!(
        reference.len(),
        actual.len(),
        "{}: number of checks",
        scenario.name
    );
    let checks = scenario
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Check(_)));
    for (i, ((want, got), step)) in reference.iter().zip(actual).zip(checks).enumerate() {
        let want: Vec<Decision> = want.decisions.iter().map(normalized).collect();
        let got: Vec<Decision> = got.decisions.iter().map(normalized).collect();
        assert_eq!(
            want, got,
            "{store}, scenario {:?}, check #{i} {step:?}: memory store said left, {store} said right",
            scenario.name
        );
    }
}

/// Asserts that `actual` admits and denies exactly the requests `reference`
/// does (the decisions of the single limits may differ).
pub fn assert_same_verdicts(
    scenario: &Scenario,
    reference: &[Outcome],
    actual: &[Outcome],
    store: &str,
) {
    let want: Vec<bool> = reference.iter().map(Outcome::allowed).collect();
    let got: Vec<bool> = actual.iter().map(Outcome::allowed).collect();
    assert_eq!(
        want, got,
        "{store}, scenario {:?}: which requests the memory store (left) and {store} (right) admitted",
        scenario.name
    );
}

/// The memory store's configuration for the suite: it never sweeps within
/// a scenario. A sweep drops the keys at rest at the latest time the store
/// has seen; a scenario whose clock then goes back reads such a key as new,
/// and whether its shard had swept by then depends on how its keys hash, so
/// two runs of one scenario could differ.
pub fn memory_config() -> MemoryConfig {
    MemoryConfig {
        sweep_interval: Duration::from_secs(1 << 40),
        ..MemoryConfig::default()
    }
}

/// The reference outcomes of `scenario`: the memory store's, on a fresh
/// [`clock`]. Asserts that they are sane and that the scenario both admits
/// and denies (one that never denies tests little).
pub async fn reference(scenario: &Scenario) -> Vec<Outcome> {
    let clock = clock();
    let memory = MemoryStore::with_clock(memory_config(), Arc::clone(&clock));
    let outcomes = run(&memory, &clock, scenario).await;
    assert_sane(&outcomes);
    assert!(
        outcomes.iter().any(Outcome::allowed),
        "{}: a scenario that never admits tests little",
        scenario.name
    );
    assert!(
        outcomes.iter().any(|o| !o.allowed()),
        "{}: a scenario that never denies tests little",
        scenario.name
    );
    outcomes
}

/// What every decision of the reference must satisfy.
pub fn assert_sane(outcomes: &[Outcome]) {
    for o in outcomes {
        for d in &o.decisions {
            assert!(d.remaining() <= d.limit(), "{d:?}");
            if d.allowed() {
                assert_eq!(d.retry_after(), None, "{d:?}");
            }
        }
    }
}

/// A fresh manual clock at a whole-microsecond time of today's order of
/// magnitude (about 2026 in Unix microseconds).
pub fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_780_000_000_000_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DenyCache, Fallback, FallbackConfig, Hybrid, HybridConfig, hybrid_leases};

    fn memory(clock: &Arc<ManualClock>) -> MemoryStore<Arc<ManualClock>> {
        MemoryStore::with_clock(memory_config(), Arc::clone(clock))
    }

    /// A fallback that never falls back on a busy test machine.
    fn patient() -> FallbackConfig {
        FallbackConfig {
            timeout: Duration::from_secs(60),
            ..FallbackConfig::default()
        }
    }

    #[tokio::test]
    async fn the_memory_store_is_a_sane_reference_that_admits_and_denies() {
        for scenario in scenarios() {
            let reference = reference(&scenario).await;
            let clock = clock();
            let again = run(&memory(&clock), &clock, &scenario).await;
            assert_same(&scenario, &reference, &again, "memory");
        }
    }

    #[tokio::test]
    async fn the_reference_releases_exactly_the_lease_named() {
        let scenario = exact_leases();
        let outcomes = reference(&scenario).await;
        let said: Vec<(bool, u64)> = outcomes
            .iter()
            .map(|o| (o.allowed(), o.decisions[0].remaining()))
            .collect();
        assert_eq!(
            said,
            [
                (true, 1),
                (true, 0),
                (false, 0),
                (true, 1),
                (true, 0),
                (true, 1),
                (true, 1),
                (true, 1),
                (true, 2),
                (true, 1),
                (true, 0),
                (false, 0),
            ]
        );
        let took: Vec<usize> = outcomes.iter().map(|o| o.leases.len()).collect();
        assert_eq!(took, [1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0]);
    }

    #[tokio::test]
    async fn a_fallback_over_a_healthy_store_decides_as_the_store() {
        for scenario in scenarios() {
            let reference = reference(&scenario).await;
            let clock = clock();
            let store = Fallback::with_clock(memory(&clock), patient(), Arc::clone(&clock) as _);
            let actual = run(&store, &clock, &scenario).await;
            assert_same(&scenario, &reference, &actual, "fallback over memory");
            assert_eq!(store.stats().fallbacks, 0);
        }
    }

    #[tokio::test]
    async fn a_deny_cache_admits_and_denies_what_the_store_does() {
        for scenario in scenarios().iter().map(Scenario::monotonic) {
            let reference = reference(&scenario).await;
            let clock = clock();
            let store = DenyCache::with_clock(memory(&clock), 1024, Arc::clone(&clock) as _);
            let actual = run(&store, &clock, &scenario).await;
            assert_same_verdicts(&scenario, &reference, &actual, "deny cache over memory");
        }
    }

    #[tokio::test]
    async fn hybrid_mode_passes_unleased_requests_through_exactly() {
        let mut ran = 0;
        for scenario in scenarios().iter().filter(|s| s.unleased(hybrid_leases)) {
            let reference = reference(scenario).await;
            let clock = clock();
            let store = Hybrid::with_clock(
                memory(&clock),
                HybridConfig::default(),
                Arc::clone(&clock) as _,
            );
            let actual = run(&store, &clock, scenario).await;
            assert_same(scenario, &reference, &actual, "hybrid over memory");
            assert_eq!(store.stats().local_decisions, 0);
            ran += 1;
        }
        assert!(ran >= 4, "only {ran} scenarios without leased algorithms");
    }

    #[tokio::test]
    async fn the_whole_stack_admits_and_denies_what_the_store_does() {
        for scenario in scenarios()
            .iter()
            .filter(|s| s.unleased(hybrid_leases))
            .map(Scenario::monotonic)
        {
            let scenario = &scenario;
            let reference = reference(scenario).await;
            let clock = clock();
            let hybrid = Hybrid::with_clock(
                memory(&clock),
                HybridConfig::default(),
                Arc::clone(&clock) as _,
            );
            let fallback = Fallback::with_clock(hybrid, patient(), Arc::clone(&clock) as _);
            let store = DenyCache::with_clock(fallback, 1024, Arc::clone(&clock) as _);
            let actual = run(&store, &clock, scenario).await;
            assert_same_verdicts(scenario, &reference, &actual, "the whole stack");
        }
    }
}

/// Asserts that [`Store::reset`] forgets a key under every algorithm: a
/// spent quota (and held concurrency) is whole again, and keys beside it
/// keep theirs. `tag` keeps the keys of several runs on one server apart.
pub async fn assert_reset_forgets<S: Store>(store: &S, tag: &str) {
    let quota = Quota::per_hour(3).expect("a valid quota");
    for algorithm in Algorithm::RATE.into_iter().chain([Algorithm::Concurrency]) {
        let reset_key = format!("{{{tag}}}reset-{algorithm}");
        let kept_key = format!("{{{tag}}}kept-{algorithm}");
        for key in [&reset_key, &kept_key] {
            let limit = Limit::new(key, quota, algorithm);
            for _ in 0..3 {
                let outcome = store.check(&[limit]).await.expect("the store answers");
                assert!(outcome.allowed(), "{algorithm}: {key}");
            }
            let outcome = store.check(&[limit]).await.expect("the store answers");
            assert!(!outcome.allowed(), "{algorithm}: {key} is spent");
        }
        store
            .reset(&[Limit::new(&reset_key, quota, algorithm)])
            .await
            .expect("the store resets");
        let fresh = store
            .check(&[Limit::new(&reset_key, quota, algorithm)])
            .await
            .expect("the store answers");
        assert!(fresh.allowed(), "{algorithm}: reset");
        assert_eq!(
            fresh.decisions[0].remaining(),
            2,
            "{algorithm}: whole again"
        );
        let kept = store
            .check(&[Limit::new(&kept_key, quota, algorithm)])
            .await
            .expect("the store answers");
        assert!(
            !kept.allowed(),
            "{algorithm}: the key beside it keeps its state"
        );
    }
}

#[cfg(test)]
mod reset {
    use super::*;
    use crate::{DenyCache, Fallback, FallbackConfig, Hybrid, HybridConfig};

    #[tokio::test]
    async fn every_store_of_this_crate_resets() {
        let memory = || MemoryStore::with_clock(memory_config(), clock());
        assert_reset_forgets(&memory(), "memory").await;
        assert_reset_forgets(&DenyCache::with_clock(memory(), 64, clock()), "deny").await;
        let fallback = Fallback::with_clock(memory(), FallbackConfig::default(), clock());
        assert_reset_forgets(&fallback, "fallback").await;
        let hybrid = Hybrid::with_clock(memory(), HybridConfig::default(), clock());
        assert_reset_forgets(&hybrid, "hybrid").await;
    }
}
