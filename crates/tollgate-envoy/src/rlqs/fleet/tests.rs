use proptest::prelude::*;
use tollgate_core::{Clock, ManualClock};

use super::*;
use crate::rlqs::envoy::EnvoyBucket;

const MINUTE: Nanos = 60 * SECOND;

fn rule(plan: Plan) -> Rule {
    Rule {
        domain: Arc::from("edge"),
        name: Arc::from("user"),
        plan,
    }
}

fn usage(allowed: u64, denied: u64) -> Usage {
    Usage { allowed, denied }
}

fn tokens(grant: Grant) -> u32 {
    match grant {
        Grant::Tokens(t) => t.max_tokens,
        Grant::DenyAll => 0,
    }
}

#[test]
fn a_window_is_shared_and_deny_all_once_spent() {
    let mut fleet = Fleet::new();
    let plan = Plan::Window {
        limit: 10,
        period: MINUTE,
    };
    let mut envoys = [EnvoyBucket::default(), EnvoyBucket::default()];
    let mut admitted = 0;
    // Each Envoy admits its first request before any grant, then spends
    // what it is granted, ten requests a second.
    for second in 0..20 {
        let now = second * SECOND;
        for (i, envoy) in envoys.iter_mut().enumerate() {
            for _ in 0..10 {
                admitted += u64::from(envoy.admit(now).admitted);
                if envoy.grant().is_none() {
                    // Envoy reports a new bucket at once.
                    let grant = fleet.report(i as u64, "k", &rule(plan), envoy.take_usage(), now);
                    envoy.apply(grant, now);
                }
            }
            let grant = fleet.report(i as u64, "k", &rule(plan), envoy.take_usage(), now);
            envoy.apply(grant, now);
        }
    }
    assert_eq!(admitted, 10, "the window's limit, no more and no less");
    assert!(envoys.iter().all(|e| e.grant() == Some(Grant::DenyAll)));
    // The next window starts new leases.
    let a = fleet
        .report(0, "k", &rule(plan), usage(0, 10), MINUTE)
        .grant;
    assert!(tokens(a) > 0);
}

#[test]
fn an_unchanged_grant_is_sent_unchanged() {
    let mut fleet = Fleet::new();
    let plan = Plan::Window {
        limit: 100,
        period: MINUTE,
    };
    let first = fleet.report(1, "k", &rule(plan), usage(1, 0), 0).grant;
    // Nothing spent of it: the same grant, so Envoy keeps its tokens.
    let again = fleet.report(1, "k", &rule(plan), usage(0, 0), SECOND).grant;
    assert_eq!(first, again);
}

#[test]
fn an_envoy_leaving_gives_its_rate_share_once_its_grant_expired() {
    let mut fleet = Fleet::new();
    let plan = Plan::Rate {
        limit: 100,
        period: SECOND,
        burst: 100,
    };
    fleet.report(1, "k", &rule(plan), usage(1, 0), 0);
    fleet.report(2, "k", &rule(plan), usage(1, 0), 0);
    let Answer { grant: a, ttl, .. } = fleet.report(1, "k", &rule(plan), usage(50, 0), SECOND);
    fleet.report(2, "k", &rule(plan), usage(50, 0), SECOND);
    let a2 = fleet
        .report(1, "k", &rule(plan), usage(50, 0), SECOND)
        .grant;
    assert_eq!(
        a, a2,
        "shares taken at the rebalance, not moved at every report"
    );
    let Grant::Tokens(half) = a else {
        panic!("{a:?}")
    };
    assert_eq!(half.tokens_per_fill, 50);
    fleet.leave(2);
    // Still held while stream 2's grant may be in force.
    let a = fleet
        .report(1, "k", &rule(plan), usage(50, 0), 2 * SECOND)
        .grant;
    assert_eq!(a, Grant::Tokens(half));
    let later = 2 * SECOND + nanos(ttl) + SECOND;
    let a = fleet.report(1, "k", &rule(plan), usage(50, 0), later).grant;
    let Grant::Tokens(all) = a else {
        panic!("{a:?}")
    };
    assert_eq!((all.tokens_per_fill, all.max_tokens), (100, 100));
    assert_eq!(fleet.stats("k").map(|s| s.envoys), Some(1));
}

#[test]
fn a_changed_plan_reaches_the_next_answer() {
    let mut fleet = Fleet::new();
    let plan = Plan::Rate {
        limit: 10,
        period: SECOND,
        burst: 10,
    };
    fleet.report(1, "k", &rule(plan), usage(1, 0), 0);
    let smaller = Plan::Rate {
        limit: 2,
        period: SECOND,
        burst: 2,
    };
    let g = fleet
        .report(1, "k", &rule(smaller), usage(1, 0), SECOND)
        .grant;
    assert!(
        matches!(
            g,
            Grant::Tokens(TokenBucket {
                max_tokens: 2,
                tokens_per_fill: 2,
                ..
            })
        ),
        "{g:?}"
    );
}

#[test]
fn rates_below_a_token_a_second_fill_over_longer_intervals() {
    // 3 a minute split in two: 1.5 a minute each, one token per 40 s.
    assert_eq!(fill(3, MINUTE, 1, 2), (1, 60));
    assert_eq!(fill(1, MINUTE, 1, 2), (1, 121));
    assert_eq!(fill(10, SECOND, 1, 3), (3, 1));
    assert_eq!(fill(u64::MAX, SECOND, 1, 1), (u32::MAX, 1));
}

#[test]
fn a_grant_lives_two_intervals_and_a_second_in_whole_seconds() {
    assert_eq!(ttl(SECOND), MIN_TTL);
    assert_eq!(ttl(5 * SECOND), Duration::from_secs(11));
    assert_eq!(ttl(10 * SECOND), Duration::from_secs(21));
    assert_eq!(ttl(SECOND / 2), MIN_TTL);
    assert_eq!(ttl(u64::MAX), Duration::from_secs(300));
}

/// One Envoy's traffic in the simulation: requests per 10 ms step, from
/// when to when.
#[derive(Debug, Clone)]
struct Traffic {
    per_step: u32,
    start: u32,
    stop: u32,
    phase: u32,
}

fn traffic() -> impl Strategy<Value = Traffic> {
    (0u32..4, 0u32..300, 0u32..600, 0u32..100).prop_map(|(per_step, start, len, phase)| Traffic {
        per_step,
        start,
        stop: start + len,
        phase,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The bound of a windowed quota: per aligned window, the fleet admits
    /// at most the limit plus what Envoys admitted before their first grant
    /// (each Envoy's stream, reporting every second, answered within a step).
    #[test]
    fn a_window_admits_its_limit_plus_what_came_before_a_grant(
        limit in 1u64..60,
        fleets in prop::collection::vec(traffic(), 1..5),
    ) {
        const STEP: Nanos = SECOND / 100;
        const WINDOW: Nanos = 2 * SECOND;
        let plan = Plan::Window { limit, period: WINDOW };
        let clock = ManualClock::new(0);
        let mut fleet = Fleet::new();
        let mut envoys: Vec<EnvoyBucket> = fleets.iter().map(|_| EnvoyBucket::default()).collect();
        let mut pending: Vec<Option<Answer>> = vec![None; envoys.len()];
        let mut subscribed = vec![false; envoys.len()];
        let windows = 1000 * STEP / WINDOW + 1;
        let mut admitted = vec![0u64; windows as usize + 1];
        let mut before = vec![0u64; windows as usize + 1];
        for step in 0..1000u32 {
            let now = clock.now();
            let w = (now / WINDOW) as usize;
            for (i, (envoy, t)) in envoys.iter_mut().zip(&fleets).enumerate() {
                // Answers sent last step arrive now.
                if let Some(grant) = pending[i].take() {
                    envoy.apply(grant, now);
                }
                let live = step >= t.start && step < t.stop;
                if live {
                    for _ in 0..t.per_step {
                        let a = envoy.admit(now);
                        let (ok, early) = (a.admitted, a.before_grant);
                        admitted[w] += u64::from(ok);
                        before[w] += u64::from(ok && early);
                    }
                }
                let first = live && !subscribed[i] && envoy.unreported() != Usage::default();
                let timer = subscribed[i] && step % 100 == t.phase;
                if first || (timer && live) {
                    subscribed[i] = true;
                    let answer = fleet.report(i as u64, "k", &rule(plan), envoy.take_usage(), now);
                    pending[i] = Some(answer);
                }
                if step == t.stop && subscribed[i] {
                    fleet.leave(i as u64);
                }
            }
            clock.advance(Duration::from_nanos(STEP));
        }
        for w in 0..admitted.len() {
            prop_assert!(
                admitted[w] <= limit + before[w],
                "window {w}: {} admitted, limit {limit}, {} before a grant",
                admitted[w], before[w]
            );
        }
    }

    /// The shares of a rate never add up to more than the rate, nor their
    /// buckets to more than the burst and one token per Envoy.
    #[test]
    fn rate_shares_add_up_to_at_most_the_rate(
        limit in 1u64..10_000,
        burst in 1u64..10_000,
        period_ms in 100u64..120_000,
        demands in prop::collection::vec(0u64..1000, 1..8),
    ) {
        let period = period_ms * 1_000_000;
        let plan = Plan::Rate { limit, period, burst };
        let mut fleet = Fleet::new();
        for (i, _) in demands.iter().enumerate() {
            fleet.report(i as u64, "k", &rule(plan), usage(1, 0), 0);
        }
        let mut rate = 0f64;
        let mut caps = 0u64;
        for (i, d) in demands.iter().enumerate() {
            let grant = fleet.report(i as u64, "k", &rule(plan), usage(*d, 0), SECOND).grant;
            let Grant::Tokens(t) = grant else { panic!("{grant:?}") };
            rate += f64::from(t.tokens_per_fill) / t.fill_secs as f64;
            caps += u64::from(t.max_tokens);
        }
        let quota = limit as f64 * SECOND as f64 / period as f64;
        prop_assert!(rate <= quota * (1.0 + 1e-9), "{rate} > {quota}");
        prop_assert!(caps <= burst + demands.len() as u64);
    }
}

#[test]
fn leases_start_full_and_rate_shares_carry_their_fill() {
    let mut fleet = Fleet::new();
    let window = Plan::Window {
        limit: 100,
        period: MINUTE,
    };
    let lease = fleet.report(1, "w", &rule(window), usage(1, 0), 0);
    assert!(lease.fresh);
    let again = fleet.report(1, "w", &rule(window), usage(0, 0), SECOND);
    assert!(
        !again.fresh,
        "an unchanged grant only extends its time to live"
    );
    let rate = Plan::Rate {
        limit: 10,
        period: SECOND,
        burst: 10,
    };
    let first = fleet.report(1, "r", &rule(rate), usage(1, 0), 0);
    let second = fleet.report(2, "r", &rule(rate), usage(1, 0), 0);
    let moved = fleet.report(1, "r", &rule(rate), usage(1, 0), SECOND);
    assert_ne!(first.grant, moved.grant, "a second Envoy takes half");
    assert!(!first.fresh && !second.fresh && !moved.fresh);
}
