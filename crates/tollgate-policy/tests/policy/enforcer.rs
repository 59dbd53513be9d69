//! The enforcer's semantics, door-independent: the same decisions the
//! server's doors and the tower layer turn into their wire formats (each door
//! is tested on the wire in tollgate-server and tollgate-http).

use std::future::{Future, ready};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_core::{
    Algorithm, Lease, Limit, ManualClock, Outcome, Quota, Store, StoreError, at_first_poll,
};
use tollgate_policy::{
    AdHoc, Check, Counting, Decided, Descriptor, Enforcer, Entry, FailurePolicy, LimitOverride,
    Observer, Policy, Request, State, Unit, Verdict,
};
use tollgate_store::{DenyCache, MemoryConfig, MemoryStore};

/// A store that is always down.
struct DownStore;

impl Store for DownStore {
    fn check(&self, _: &[Limit<'_>]) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        ready(Err(StoreError::Timeout(Duration::from_millis(5))))
    }

    fn release(&self, _: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(Err(StoreError::Timeout(Duration::from_millis(5))))
    }
}

const POLICY: &str = "
domain: api
rules:
  - name: open
    match: [{ key: open }]
    limit: { requests: 1, per: 1h }
    failure: fail_open
  - name: closed
    match: [{ key: closed }]
    limit: { requests: 1, per: 1h }
    failure: fail_closed
  - name: user
    match: [{ key: user }]
    limit: { requests: 2, per: 1h }
  - name: global
    match: [{ key: global }]
    limit: { requests: 100, per: 1h }
  - name: dark
    match: [{ key: dark }]
    limit: { requests: 1, per: 1h }
    shadow: true
  - name: inflight
    match: [{ key: job }]
    algorithm: concurrency
    limit: { requests: 1, per: 1h }
  - name: pool
    match: [{ key: pool }]
    algorithm: concurrency
    limit: { requests: 2, per: 1h }
";

/// envoyproxy/ratelimit's way to block: `requests_per_unit: 0`, here also
/// marked shadow.
const BLOCKED: &str = "
domain: blocked
descriptors:
  - key: banned
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: dark_banned
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 10 }
";

fn descriptor(key: &str, value: &str) -> Descriptor {
    Descriptor {
        entries: vec![Entry::new(key, value)],
        ..Descriptor::default()
    }
}

fn policy(text: &str) -> Policy {
    Policy::parse("test.yaml", text).expect("valid test policy")
}

fn memory(text: &str) -> Enforcer<MemoryStore<ManualClock>> {
    let clock = ManualClock::new(1_000_000_000);
    Enforcer::new(
        policy(text),
        MemoryStore::with_clock(MemoryConfig::default(), clock),
    )
}

async fn run<S: Store>(
    enforcer: &Enforcer<S>,
    domain: &str,
    descriptors: &[Descriptor],
) -> Verdict {
    enforcer
        .enforce(Check::Policy(Request {
            domain,
            descriptors,
            hits_addend: 1,
        }))
        .await
        .expect("a valid request")
}

#[tokio::test]
async fn failure_policies_decide_when_the_store_is_down() {
    let enforcer = Enforcer::new(policy(POLICY), DownStore);
    let open = run(&enforcer, "api", &[descriptor("open", "a")]).await;
    assert!(open.allowed());
    assert_eq!(
        open.descriptors[0].state,
        State::StoreFailed(FailurePolicy::FailOpen)
    );
    let closed = run(
        &enforcer,
        "api",
        &[descriptor("open", "a"), descriptor("closed", "a")],
    )
    .await;
    assert!(!closed.allowed());
    assert_eq!(
        closed.descriptors[1].state,
        State::StoreFailed(FailurePolicy::FailClosed)
    );
    assert_eq!(closed.descriptors[1].result(), "over_limit");
    let local = run(&enforcer, "api", &[descriptor("user", "a")]).await;
    assert!(
        local.allowed(),
        "`local` with no local fallback in this store lets the request through"
    );
    assert!(!enforcer.ready().await);
}

#[tokio::test]
async fn a_deny_by_one_layer_consumes_nothing_from_the_others() {
    let enforcer = memory(POLICY);
    let layers = [descriptor("user", "alice"), descriptor("global", "all")];
    for _ in 0..2 {
        assert!(run(&enforcer, "api", &layers).await.allowed());
    }
    let denied = run(&enforcer, "api", &layers).await;
    assert!(!denied.allowed());
    let reported = denied.most_restrictive().expect("a limit applied");
    assert!(reported.rule.as_ref().is_some_and(|r| r.id() == "user"));
    let global = run(&enforcer, "api", &[descriptor("global", "all")]).await;
    assert_eq!(
        global.descriptors[0].decision.map(|d| d.remaining()),
        Some(97),
        "two admitted + this one; the deny took nothing"
    );
}

#[tokio::test]
async fn shadow_limits_count_denied_requests_too() {
    let enforcer = memory(POLICY);
    let user = descriptor("user", "carol");
    let dark = descriptor("dark", "x");
    for _ in 0..2 {
        assert!(
            run(&enforcer, "api", std::slice::from_ref(&user))
                .await
                .allowed()
        );
    }
    // The enforcing limit denies; the shadow limit still sees the request,
    // as it would if it were enforcing: its first unit is spent.
    let denied = run(&enforcer, "api", &[user.clone(), dark.clone()]).await;
    assert!(!denied.allowed());
    assert_eq!(denied.descriptors[1].state, State::Shadow);
    assert!(!denied.descriptors[1].shadow_denied());
    // So the next request through the shadow rule is a would-be denial.
    let second = run(&enforcer, "api", &[dark]).await;
    assert!(second.allowed(), "shadow limits never deny");
    assert!(second.descriptors[0].shadow_denied());
    assert_eq!(second.descriptors[0].result(), "shadow_over_limit");
}

#[tokio::test]
async fn blocked_shadow_rule_is_a_shadow_denial() {
    let enforcer = memory(BLOCKED);
    let verdict = run(&enforcer, "blocked", &[descriptor("dark_banned", "x")]).await;
    assert!(verdict.allowed());
    assert_eq!(verdict.descriptors[0].state, State::Shadow);
    assert!(verdict.descriptors[0].shadow_denied());
    let enforced = run(&enforcer, "blocked", &[descriptor("banned", "x")]).await;
    assert!(!enforced.allowed());
    assert_eq!(enforced.descriptors[0].state, State::Blocked);
    assert_eq!(
        enforced.descriptors[0]
            .decision
            .and_then(|d| d.retry_after()),
        None
    );
}

/// envoyproxy/ratelimit's `SHADOW_MODE=true`: nothing denies, every limit
/// is still counted as it would be if enforced, and past its limit a rule
/// reports a would-be denial.
#[tokio::test]
async fn global_shadow_mode_counts_everything_and_denies_nothing() {
    let enforcer = memory(POLICY).with_shadow_mode(true);
    let layers = [descriptor("user", "erin"), descriptor("global", "all")];
    for _ in 0..3 {
        let verdict = run(&enforcer, "api", &layers).await;
        assert!(verdict.allowed());
        assert!(verdict.descriptors.iter().all(|d| d.state == State::Shadow));
    }
    let user = run(&enforcer, "api", &[descriptor("user", "erin")]).await;
    assert!(user.allowed());
    assert!(user.descriptors[0].shadow_denied(), "counted: 2 of 2 spent");
    // The rule is no shadow rule itself: Envoy's answer keeps its code.
    assert!(user.descriptors[0].global_shadow);
    let global = run(&enforcer, "api", &[descriptor("global", "all")]).await;
    // Counted as enforcement would count: the third request, a would-be
    // denial by `user`, charged nothing beside it (all-or-nothing).
    assert_eq!(
        global.descriptors[0].decision.map(|d| d.remaining()),
        Some(97)
    );

    let blocked = memory(BLOCKED).with_shadow_mode(true);
    let banned = run(&blocked, "blocked", &[descriptor("banned", "x")]).await;
    assert!(banned.allowed());
    assert!(banned.descriptors[0].shadow_denied());
    let dark = run(&blocked, "blocked", &[descriptor("dark_banned", "x")]).await;
    assert!(!dark.descriptors[0].global_shadow, "a shadow_mode rule");

    let overridden = Descriptor {
        limit: Some(LimitOverride {
            requests_per_unit: 0,
            unit: Unit::Minute,
        }),
        ..descriptor("user", "frank")
    };
    let verdict = run(&enforcer, "api", &[overridden]).await;
    assert!(
        verdict.allowed(),
        "a request's own override is shadowed too"
    );
    assert!(verdict.descriptors[0].shadow_denied());

    let off = memory(POLICY).with_shadow_mode(false);
    for _ in 0..2 {
        assert!(
            run(&off, "api", &[descriptor("user", "erin")])
                .await
                .allowed()
        );
    }
    assert!(
        !run(&off, "api", &[descriptor("user", "erin")])
            .await
            .allowed()
    );
}

#[tokio::test]
async fn a_blocked_rule_charges_nothing_to_the_limits_beside_it_all_or_nothing() {
    let enforcer = memory(BLOCKED).with_envoy_counting(Counting::AllOrNothing);
    let denied = run(
        &enforcer,
        "blocked",
        &[descriptor("user", "dave"), descriptor("banned", "x")],
    )
    .await;
    assert!(!denied.allowed());
    assert_eq!(
        denied.descriptors[0].decision.map(|d| d.remaining()),
        Some(10)
    );
    assert!(denied.descriptors[0].peeked);
    let alone = run(&enforcer, "blocked", &[descriptor("user", "dave")]).await;
    assert_eq!(
        alone.descriptors[0].decision.map(|d| d.remaining()),
        Some(9)
    );
}

/// envoyproxy/ratelimit's default counting (`fixed_cache_impl.go`, `DoLimit`
/// with `stopCacheKeyIncrementWhenOverlimit` false): every descriptor's
/// window takes its hits, whatever the others say.
#[tokio::test]
async fn envoy_domains_charge_every_descriptor_of_a_denied_request() {
    let enforcer = memory(BLOCKED);
    let denied = run(
        &enforcer,
        "blocked",
        &[descriptor("user", "dave"), descriptor("banned", "x")],
    )
    .await;
    assert!(!denied.allowed());
    assert!(denied.descriptors[0].allowed());
    assert_eq!(
        denied.descriptors[0].decision.map(|d| d.remaining()),
        Some(9)
    );
    assert!(!denied.descriptors[0].peeked);
    let alone = run(&enforcer, "blocked", &[descriptor("user", "dave")]).await;
    assert_eq!(
        alone.descriptors[0].decision.map(|d| d.remaining()),
        Some(8)
    );

    // A native domain stays all-or-nothing.
    let native = memory(POLICY);
    for _ in 0..2 {
        assert!(
            run(&native, "api", &[descriptor("user", "ann")])
                .await
                .allowed()
        );
    }
    let both = [descriptor("global", "all"), descriptor("user", "ann")];
    assert!(!run(&native, "api", &both).await.allowed());
    let global = run(&native, "api", &[descriptor("global", "all")]).await;
    assert_eq!(
        global.descriptors[0].decision.map(|d| d.remaining()),
        Some(99)
    );
}

const ENVOY: &str = "
domain: envoy
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: tight
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: plan
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: bonus
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
";

fn costing(key: &str, value: &str, hits: u64) -> Descriptor {
    Descriptor {
        hits_addend: Some(hits),
        ..descriptor(key, value)
    }
}

/// `test/redis/fixed_cache_impl_test.go`: `INCRBY` counts denied hits, so a
/// window that went over stays over for smaller requests.
#[tokio::test]
async fn a_denied_hit_keeps_its_window_over() {
    for (counting, second) in [(Counting::EachHit, false), (Counting::AllOrNothing, true)] {
        let enforcer = memory(ENVOY).with_envoy_counting(counting);
        let nine = run(&enforcer, "envoy", &[costing("user", "u", 9)]).await;
        assert!(nine.allowed(), "{counting:?}");
        let five = run(&enforcer, "envoy", &[costing("user", "u", 5)]).await;
        assert!(!five.allowed(), "{counting:?}");
        let one = run(&enforcer, "envoy", &[costing("user", "u", 1)]).await;
        assert_eq!(one.allowed(), second, "{counting:?}");
    }
}

/// `GenerateCacheKey`: a request's override counts in the window of the
/// descriptor's entries and unit, the same count as the rule's.
#[tokio::test]
async fn an_override_of_the_rules_unit_shares_its_count() {
    let enforcer = memory(ENVOY);
    for _ in 0..3 {
        assert!(
            run(&enforcer, "envoy", &[descriptor("user", "u")])
                .await
                .allowed()
        );
    }
    let overridden = |requests_per_unit, unit| Descriptor {
        limit: Some(LimitOverride {
            requests_per_unit,
            unit,
        }),
        ..descriptor("user", "u")
    };
    let minute = run(&enforcer, "envoy", &[overridden(5, Unit::Minute)]).await;
    assert_eq!(
        minute.descriptors[0].decision.map(|d| d.remaining()),
        Some(1)
    );
    let hour = run(&enforcer, "envoy", &[overridden(5, Unit::Hour)]).await;
    assert_eq!(hour.descriptors[0].decision.map(|d| d.remaining()), Some(4));
    let rule = run(&enforcer, "envoy", &[descriptor("user", "u")]).await;
    assert_eq!(rule.descriptors[0].decision.map(|d| d.remaining()), Some(5));
}

/// `shouldRateLimitWorker`: over a quota-mode limit, a request is denied only
/// when every quota-mode limit of it is over, or a rate limit denies.
#[tokio::test]
async fn quota_mode_denies_when_every_quota_is_spent() {
    for counting in [Counting::EachHit, Counting::AllOrNothing] {
        let enforcer = memory(ENVOY).with_envoy_counting(counting);
        let quotas = [descriptor("plan", "p"), descriptor("bonus", "p")];
        let mut answers = Vec::new();
        for _ in 0..4 {
            let verdict = run(&enforcer, "envoy", &quotas).await;
            answers.push((
                verdict.allowed(),
                verdict.descriptors[0].allowed(),
                verdict.descriptors[1].allowed(),
            ));
        }
        assert_eq!(
            answers,
            [
                (true, true, true),
                (true, false, true),
                (false, false, false),
                (false, false, false)
            ],
            "{counting:?}"
        );
        // A rate limit's deny still denies.
        let with_rate = [descriptor("tight", "t"), descriptor("bonus", "q")];
        assert!(run(&enforcer, "envoy", &with_rate).await.allowed());
        assert!(!run(&enforcer, "envoy", &with_rate).await.allowed());

        // QUOTA_MODE puts every rule in quota mode.
        let global = memory(ENVOY)
            .with_envoy_counting(counting)
            .with_quota_mode(true);
        let two = [descriptor("tight", "t"), descriptor("user", "u")];
        assert!(run(&global, "envoy", &two).await.allowed());
        let second = run(&global, "envoy", &two).await;
        assert!(second.allowed(), "one quota left: {counting:?}");
        assert!(!second.descriptors[0].allowed());
    }
}

#[tokio::test]
async fn the_kill_switch_disables_a_rule() {
    let enforcer = memory(POLICY);
    let user = [descriptor("user", "bob")];
    for _ in 0..2 {
        assert!(run(&enforcer, "api", &user).await.allowed());
    }
    assert!(!run(&enforcer, "api", &user).await.allowed());
    enforcer.kill_switch().set("api", Some("user"), false);
    let off = run(&enforcer, "api", &user).await;
    assert!(off.allowed());
    assert_eq!(off.descriptors[0].state, State::Disabled);
    enforcer.kill_switch().set("api", Some("user"), true);
    assert!(!run(&enforcer, "api", &user).await.allowed());
}

#[tokio::test]
async fn adhoc_keys_are_namespaced_and_reads_consume_nothing() {
    let enforcer = memory(POLICY);
    let adhoc = AdHoc {
        key: "k".into(),
        quota: Quota::per_hour(2).expect("valid"),
        algorithm: Algorithm::Gcra,
        cost: 1,
    };
    assert!(
        enforcer
            .enforce(Check::AdHoc(&adhoc))
            .await
            .expect("ad hoc")
            .allowed()
    );
    let read = |key: String| {
        let enforcer = &enforcer;
        async move {
            enforcer
                .read(&key, adhoc.quota, adhoc.algorithm)
                .await
                .expect("memory answers")
                .map(|d| d.remaining())
        }
    };
    assert_eq!(read(adhoc.store_key()).await, Some(1));
    assert_eq!(
        read(adhoc.store_key()).await,
        Some(1),
        "reading took nothing"
    );
    assert_eq!(
        read("k".into()).await,
        Some(2),
        "the raw key is another budget"
    );
}

#[tokio::test]
async fn permits_are_values_that_survive_a_reload() {
    let enforcer = memory(POLICY);
    let job = [descriptor("job", "render")];
    let mut first = run(&enforcer, "api", &job).await;
    assert!(first.allowed());
    let permit = std::mem::take(&mut first.permit);
    assert!(!permit.is_empty());
    assert!(!run(&enforcer, "api", &job).await.allowed());
    // A reload that drops the rule does not change which budget the permit
    // goes back to.
    enforcer
        .policy_handle()
        .store(policy("domain: other\nrules: []\n"));
    assert_eq!(enforcer.release(permit).await, 1);
    enforcer.policy_handle().store(policy(POLICY));
    let again = run(&enforcer, "api", &job).await;
    assert!(again.allowed(), "the permit came back");
}

/// What one decision looked like to an observer: its domain, its ad-hoc key
/// and each descriptor's result.
type Sight = (Option<String>, Option<String>, Vec<&'static str>);

/// Counts what it sees, as the service's metrics do; clones share the list.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<Sight>>>);

impl Observer for Seen {
    fn decided(&self, decided: &Decided<'_>) {
        let results = decided
            .verdict
            .descriptors
            .iter()
            .map(|d| d.result())
            .collect();
        self.0.lock().unwrap().push((
            decided.domain.map(str::to_owned),
            decided.adhoc_key.map(str::to_owned),
            results,
        ));
    }
}

#[tokio::test]
async fn the_observers_see_every_decision() {
    // Two observers as a pair, as the service attaches metrics and its live
    // page: each sees everything.
    let (seen, beside) = (Seen::default(), Seen::default());
    let enforcer = memory(POLICY).with_observer(Arc::new((seen.clone(), beside.clone())));
    for _ in 0..3 {
        let _ = run(
            &enforcer,
            "api",
            &[descriptor("user", "eve"), descriptor("dark", "y")],
        )
        .await;
    }
    let adhoc = AdHoc {
        key: "k".into(),
        quota: Quota::per_hour(1).expect("valid"),
        algorithm: Algorithm::Gcra,
        cost: 1,
    };
    let _ = enforcer.enforce(Check::AdHoc(&adhoc)).await;
    let seen = seen.0.lock().unwrap().clone();
    let api = Some("api".to_owned());
    assert_eq!(
        seen,
        [
            (api.clone(), None, vec!["ok", "ok"]),
            (api.clone(), None, vec!["ok", "shadow_over_limit"]),
            (api, None, vec!["over_limit", "shadow_over_limit"]),
            (None, Some("k".to_owned()), vec!["ok"]),
        ]
    );
    assert_eq!(*beside.0.lock().unwrap(), seen);
}

/// Regression: checking someone's ad-hoc key with a quota of 1 per 900 days
/// locked its owner out, since both quotas spent one budget. The quota is
/// part of the ad-hoc key now.
#[tokio::test]
async fn an_adhoc_key_checked_with_another_quota_is_another_budget() {
    let enforcer = memory(POLICY);
    let owner = AdHoc {
        key: "tenant-7".into(),
        quota: Quota::per_hour(2).expect("valid"),
        algorithm: Algorithm::Gcra,
        cost: 1,
    };
    let attacker = AdHoc {
        quota: Quota::new(1, Duration::from_secs(900 * 86_400)).expect("valid"),
        ..owner.clone()
    };
    for _ in 0..3 {
        let _ = enforcer.enforce(Check::AdHoc(&attacker)).await;
    }
    for _ in 0..2 {
        let verdict = enforcer
            .enforce(Check::AdHoc(&owner))
            .await
            .expect("ad hoc");
        assert!(verdict.allowed(), "the owner's budget is untouched");
    }
    assert_ne!(owner.store_key(), attacker.store_key());
    let shaping = AdHoc {
        algorithm: Algorithm::LeakyBucketShaping { delay_after: 3 },
        ..owner.clone()
    };
    assert_ne!(
        shaping.store_key(),
        AdHoc {
            algorithm: Algorithm::LeakyBucketShaping { delay_after: 4 },
            ..owner
        }
        .store_key()
    );
}

/// Regression: one gRPC request of 100,000 descriptors held a worker for
/// hundreds of milliseconds while every other check waited. Requests past
/// the limits are refused whole, before any rule or store is touched.
#[tokio::test]
async fn requests_past_the_limits_are_refused_before_the_store() {
    let enforcer = memory(POLICY).with_request_limits(tollgate_policy::RequestLimits {
        descriptors: 3,
        entries: 2,
        ..tollgate_policy::RequestLimits::default()
    });
    let many: Vec<Descriptor> = (0..4)
        .map(|i| descriptor("user", &format!("u{i}")))
        .collect();
    let request = |descriptors| {
        Check::Policy(Request {
            domain: "api",
            descriptors,
            hits_addend: 1,
        })
    };
    let error = enforcer.enforce(request(&many)).await.expect_err("4 > 3");
    assert_eq!(
        error.to_string(),
        "the request has 4 descriptors; at most 3 are taken"
    );
    let wide = [Descriptor {
        entries: (0..3).map(|i| Entry::new(format!("k{i}"), "v")).collect(),
        ..Descriptor::default()
    }];
    let error = enforcer.enforce(request(&wide)).await.expect_err("3 > 2");
    assert_eq!(
        error.to_string(),
        "descriptor 0 has 3 entries; at most 2 are taken"
    );
    // Nothing was spent by the refused requests.
    let verdict = run(&enforcer, "api", &many[..1]).await;
    assert_eq!(
        verdict.descriptors[0].decision.map(|d| d.remaining()),
        Some(1)
    );
}

#[tokio::test]
async fn a_prepared_request_is_decided_as_the_request_is() {
    const NOW: u64 = 1_000_000_000;
    let cases: [(&str, &str, Vec<Descriptor>); 5] = [
        ("api", POLICY, vec![descriptor("user", "ann")]),
        (
            "api",
            POLICY,
            vec![descriptor("global", "all"), descriptor("user", "ann")],
        ),
        (
            "api",
            POLICY,
            vec![descriptor("dark", "x"), descriptor("nobody", "x")],
        ),
        (
            "blocked",
            BLOCKED,
            vec![descriptor("user", "dave"), descriptor("banned", "x")],
        ),
        ("blocked", BLOCKED, vec![descriptor("dark_banned", "x")]),
    ];
    for (domain, text, descriptors) in cases {
        // One instant for the stores and the verdicts' `started_at`.
        let enforcer = || {
            let store = MemoryStore::with_clock(MemoryConfig::default(), ManualClock::new(NOW));
            Enforcer::new(policy(text), store).with_clock(Arc::new(ManualClock::new(NOW)))
        };
        let (prepared_side, plain_side) = (enforcer(), enforcer());
        let prepared = prepared_side
            .prepare(domain, descriptors.clone().into(), 1)
            .expect("a valid request");
        for round in 0..4 {
            let once = prepared_side
                .enforce_prepared(&prepared)
                .await
                .expect("a valid request");
            let each = run(&plain_side, domain, &descriptors).await;
            assert_eq!(
                format!("{once:?}"),
                format!("{each:?}"),
                "{domain} {descriptors:?}, request {round}"
            );
        }
    }
}

#[tokio::test]
async fn a_prepared_request_follows_a_reload() {
    let enforcer = memory(POLICY);
    let prepared = enforcer
        .prepare("api", vec![descriptor("user", "ann")].into(), 1)
        .unwrap();
    assert!(
        enforcer
            .enforce_prepared(&prepared)
            .await
            .unwrap()
            .allowed()
    );
    // The user's budget goes from two an hour to one: the request already
    // counted fills it.
    enforcer
        .policy_handle()
        .store(policy(&POLICY.replace("requests: 2", "requests: 1")));
    let after = enforcer.enforce_prepared(&prepared).await.unwrap();
    assert!(!after.allowed());
    assert_eq!(after.descriptors[0].decision.map(|d| d.limit()), Some(1));
    // A policy that no longer takes the request refuses it.
    enforcer
        .policy_handle()
        .store(policy("domain: api\nrules: []\n"));
    let gone = enforcer.enforce_prepared(&prepared).await.unwrap();
    assert_eq!(gone.descriptors[0].state, State::NoRule);
}

#[test]
fn a_request_the_policy_cannot_take_is_not_prepared() {
    let enforcer = memory(POLICY);
    assert!(
        enforcer
            .prepare("", vec![descriptor("user", "ann")].into(), 1)
            .is_err()
    );
    assert!(enforcer.prepare("api", Vec::new().into(), 1).is_err());
}

#[test]
fn a_memory_enforcer_decides_everything_at_its_first_poll() {
    let enforcer = memory(POLICY);
    assert!(enforcer.decides_at_once());
    let request = |descriptors: &[Descriptor]| {
        let mut verdict = at_first_poll(enforcer.enforce(Check::Policy(Request {
            domain: "api",
            descriptors,
            hits_addend: 1,
        })))
        .expect("a valid request");
        let permit = std::mem::take(&mut verdict.permit);
        (verdict, at_first_poll(enforcer.release(permit)))
    };
    // A limit, a shadow one beside it, and concurrency.
    assert!(
        request(&[descriptor("user", "a"), descriptor("dark", "a")])
            .0
            .allowed()
    );
    let (job, released) = request(&[descriptor("job", "a")]);
    assert!(job.allowed());
    assert_eq!(released, 1);
    // A concurrency permit taken beside a limit that denies is given back
    // within the decision.
    for _ in 0..2 {
        assert!(request(&[descriptor("user", "b")]).0.allowed());
    }
    let (denied, released) = request(&[descriptor("pool", "b"), descriptor("user", "b")]);
    assert!(!denied.allowed());
    assert_eq!(released, 0, "given back before the verdict");
    // Prepared requests, ad-hoc limits.
    let prepared = enforcer
        .prepare("api", vec![descriptor("global", "a")].into(), 1)
        .expect("a valid request");
    assert!(at_first_poll(enforcer.enforce_prepared(&prepared)).is_ok());
    let adhoc = AdHoc {
        key: "k".into(),
        quota: Quota::per_hour(2).expect("valid"),
        algorithm: Algorithm::Gcra,
        cost: 1,
    };
    assert!(at_first_poll(enforcer.enforce(Check::AdHoc(&adhoc))).is_ok());

    // envoyproxy/ratelimit's counting checks each limit in a call of its own
    // (joined), and a blocked rule reads what the others have left.
    for (text, domain, descriptors) in [
        (
            ENVOY,
            "envoy",
            vec![descriptor("user", "u"), descriptor("tight", "t")],
        ),
        (
            BLOCKED,
            "blocked",
            vec![descriptor("banned", "x"), descriptor("user", "u")],
        ),
    ] {
        let enforcer = memory(text).with_envoy_counting(Counting::EachHit);
        let verdict = at_first_poll(enforcer.enforce(Check::Policy(Request {
            domain,
            descriptors: &descriptors,
            hits_addend: 1,
        })));
        assert!(verdict.is_ok(), "{domain}");
    }

    // A store that says nothing of itself is awaited.
    assert!(!Enforcer::new(policy(POLICY), DownStore).decides_at_once());
}

/// A memory store whose checks take `takes` on `timer`.
struct Taking {
    inner: MemoryStore<ManualClock>,
    timer: Arc<ManualClock>,
    takes: Duration,
}

impl Store for Taking {
    fn check(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        self.timer.advance(self.takes);
        self.inner.check(limits)
    }

    fn release(&self, leases: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.release(leases)
    }
}

/// The durations of the store calls it is told of.
#[derive(Default)]
struct Timed(Mutex<Vec<Duration>>);

impl Observer for Timed {
    fn decided(&self, _: &Decided<'_>) {}

    fn store_call(&self, elapsed: Duration, _: bool) {
        self.0.lock().unwrap().push(elapsed);
    }
}

#[tokio::test]
async fn store_calls_are_timed_by_the_timer_given() {
    let timer = Arc::new(ManualClock::new(1_000));
    let timed = Arc::new(Timed::default());
    let store = Taking {
        inner: MemoryStore::with_clock(MemoryConfig::default(), ManualClock::new(0)),
        timer: Arc::clone(&timer),
        takes: Duration::from_millis(3),
    };
    let enforcer = Enforcer::new(policy(POLICY), store)
        .with_timer(Arc::clone(&timer) as Arc<dyn tollgate_core::Clock>)
        .with_observer(Arc::clone(&timed) as Arc<dyn Observer>);
    assert!(
        run(&enforcer, "api", &[descriptor("user", "a")])
            .await
            .allowed()
    );
    assert_eq!(*timed.0.lock().unwrap(), [Duration::from_millis(3)]);
}

/// What [`Enforcer::enforce_known`] answers for `descriptors` of `domain`.
fn known<S: Store>(
    enforcer: &Enforcer<S>,
    domain: &str,
    descriptors: &[Descriptor],
) -> Option<Verdict> {
    enforcer
        .enforce_known(&Request {
            domain,
            descriptors,
            hits_addend: 1,
        })
        .map(|verdict| verdict.expect("a valid request"))
}

#[tokio::test]
async fn what_is_known_without_the_store_is_answered_as_enforce_answers_it() {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let memory = MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(&clock));
    let store = DenyCache::with_clock(memory, 64, Arc::clone(&clock) as _);
    let seen = Seen::default();
    let enforcer = Enforcer::new(
        Policy::parse_all([("native.yaml", POLICY), ("envoy.yaml", ENVOY)]).unwrap(),
        store,
    )
    .with_observer(Arc::new(seen.clone()));
    let ann = [descriptor("user", "ann")];
    // Not known: nothing answered, nothing charged.
    assert!(known(&enforcer, "api", &ann).is_none());
    for _ in 0..2 {
        assert!(run(&enforcer, "api", &ann).await.allowed());
    }
    assert!(!run(&enforcer, "api", &ann).await.allowed());
    // Denied by the store: the deny cache knows it now.
    let full = run(&enforcer, "api", &ann).await;
    let fast = known(&enforcer, "api", &ann).expect("known over");
    assert!(!fast.allowed());
    assert_eq!(
        format!("{:?}", fast.descriptors),
        format!("{:?}", full.descriptors)
    );
    // A limit the cache does not know beside it: not known as a whole.
    let both = [descriptor("user", "ann"), descriptor("global", "all")];
    assert!(known(&enforcer, "api", &both).is_none());
    // Nothing to count: known.
    assert!(
        known(&enforcer, "api", &[descriptor("unmatched", "x")])
            .expect("known")
            .allowed()
    );
    // envoyproxy/ratelimit's counting, each descriptor alone.
    let tight = [descriptor("tight", "t")];
    assert!(run(&enforcer, "envoy", &tight).await.allowed());
    assert!(!run(&enforcer, "envoy", &tight).await.allowed());
    assert!(
        !known(&enforcer, "envoy", &tight)
            .expect("known over")
            .allowed()
    );
    // Each answer is a decision the observers see.
    let results: Vec<Vec<&str>> = seen
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, r)| r.clone())
        .collect();
    assert_eq!(
        results,
        [
            vec!["ok"],
            vec!["ok"],
            vec!["over_limit"],
            vec!["over_limit"],
            vec!["over_limit"],
            vec!["no_rule"],
            vec!["ok"],
            vec!["over_limit"],
            vec!["over_limit"],
        ]
    );
}
