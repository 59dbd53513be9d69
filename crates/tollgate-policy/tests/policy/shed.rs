//! Shedding on reported utilization: a domain's `shed:` section, the reports
//! of its service, and the enforcer's shed by priority tier (each door turns
//! the shed into its answer: tested in tollgate-server).

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, ManualClock, Tier, Utilization};
use tollgate_policy::{
    Check, Descriptor, Enforcer, Entry, Policy, Pressure, ReportError, Request, RequestLimits,
    Shed, Verdict,
};
use tollgate_store::{MemoryConfig, MemoryStore};

const POLICY: &str = "
domain: api
shed:
  priority_key: priority
  thresholds: { critical: 100, high: 75, low: 50 }
  report_ttl: 10s
  retry_after: 2s
rules:
  - name: per-user
    match: [{ key: user }]
    limit: { requests: 2, per: 1h }
";

const NO_SHED: &str = "
domain: plain
rules:
  - name: per-user
    match: [{ key: user }]
    limit: { requests: 2, per: 1h }
";

struct Fixture {
    enforcer: Enforcer<MemoryStore<ManualClock>>,
    /// The enforcer's clock, which reports are timed by.
    timer: Arc<ManualClock>,
}

fn fixture(text: &str) -> Fixture {
    let timer = Arc::new(ManualClock::new(1_000_000_000));
    let store = MemoryStore::with_clock(MemoryConfig::default(), ManualClock::new(1_000_000_000));
    let policy = Policy::parse("test.yaml", text).expect("valid test policy");
    let enforcer = Enforcer::new(policy, store).with_clock(Arc::clone(&timer) as Arc<dyn Clock>);
    Fixture { enforcer, timer }
}

/// A request of user `u1` in `tier` (no priority entry when `None`): the
/// tier in a descriptor of its own, as the gateway's actions make it.
fn descriptors(tier: Option<&str>) -> Vec<Descriptor> {
    let one = |key: &str, value: &str| Descriptor {
        entries: vec![Entry::new(key, value)],
        ..Descriptor::default()
    };
    let mut descriptors = vec![one("user", "u1")];
    descriptors.extend(tier.map(|tier| one("priority", tier)));
    descriptors
}

async fn check(
    enforcer: &Enforcer<MemoryStore<ManualClock>>,
    domain: &str,
    tier: Option<&str>,
    own: Option<u32>,
) -> Verdict {
    decide(enforcer, domain, &descriptors(tier), own).await
}

/// One check of `descriptors` in `domain`, with the utilization its sender
/// reports (`own`, in percent), if any.
async fn decide(
    enforcer: &Enforcer<MemoryStore<ManualClock>>,
    domain: &str,
    descriptors: &[Descriptor],
    own: Option<u32>,
) -> Verdict {
    enforcer
        .enforce_with_utilization(
            Check::Policy(Request {
                domain,
                descriptors,
                hits_addend: 1,
            }),
            own.map(Utilization::from_percent),
        )
        .await
        .expect("a valid request")
}

fn percent(p: u32) -> Utilization {
    Utilization::from_percent(p)
}

#[tokio::test]
async fn a_reported_utilization_sheds_the_lowest_tier_first_and_critical_last() {
    let Fixture { enforcer, .. } = fixture(POLICY);
    let admitted = async |utilization| {
        enforcer
            .report_utilization("api", "", percent(utilization))
            .unwrap();
        let mut admitted = Vec::new();
        for tier in ["critical", "high", "low"] {
            let verdict = check(&enforcer, "api", Some(tier), Some(0)).await;
            assert!(verdict.allowed(), "a check's own utilization wins");
            enforcer
                .reset(&Request {
                    domain: "api",
                    descriptors: &descriptors(None),
                    hits_addend: 1,
                })
                .await
                .unwrap();
            admitted.push(check(&enforcer, "api", Some(tier), None).await.allowed());
            enforcer
                .reset(&Request {
                    domain: "api",
                    descriptors: &descriptors(None),
                    hits_addend: 1,
                })
                .await
                .unwrap();
        }
        admitted
    };
    assert_eq!(admitted(50).await, [true, true, true]);
    assert_eq!(admitted(51).await, [true, true, false]);
    assert_eq!(admitted(76).await, [true, false, false]);
    assert_eq!(admitted(101).await, [false, false, false]);
}

#[tokio::test]
async fn a_shed_request_is_charged_nothing_and_says_why() {
    let Fixture { enforcer, .. } = fixture(POLICY);
    enforcer
        .report_utilization("api", "pod-1", percent(60))
        .unwrap();
    for _ in 0..5 {
        let verdict = check(&enforcer, "api", None, None).await;
        assert!(!verdict.allowed());
        assert_eq!(
            verdict.shed,
            Some(Box::new(Shed {
                tier: Tier::Low,
                pressure: Pressure::Reported(percent(60)),
                retry_after: Duration::from_secs(2),
            })),
            "no priority entry is low"
        );
        assert!(verdict.permit.is_empty());
    }
    // The user's two requests an hour are all still there.
    for _ in 0..2 {
        let verdict = check(&enforcer, "api", Some("high"), None).await;
        assert!(verdict.allowed() && verdict.shed.is_none());
    }
    assert!(!check(&enforcer, "api", Some("high"), None).await.allowed());
}

#[tokio::test]
async fn a_stale_report_stops_shedding() {
    let Fixture { enforcer, timer } = fixture(POLICY);
    enforcer
        .report_utilization("api", "pod-1", percent(90))
        .unwrap();
    assert!(
        check(&enforcer, "api", Some("low"), None)
            .await
            .shed
            .is_some()
    );
    timer.advance(Duration::from_secs(10));
    assert_eq!(enforcer.reported_utilization("api"), Some((percent(90), 1)));
    timer.advance(Duration::from_millis(1));
    assert_eq!(enforcer.reported_utilization("api"), None);
    assert!(check(&enforcer, "api", Some("low"), None).await.allowed());
}

#[tokio::test]
async fn the_fleet_is_the_mean_of_its_instances_reports() {
    let Fixture { enforcer, .. } = fixture(POLICY);
    enforcer
        .report_utilization("api", "pod-1", percent(90))
        .unwrap();
    enforcer
        .report_utilization("api", "pod-2", percent(20))
        .unwrap();
    assert_eq!(enforcer.reported_utilization("api"), Some((percent(55), 2)));
    let verdict = check(&enforcer, "api", Some("low"), None).await;
    assert_eq!(
        verdict.shed.map(|s| s.pressure),
        Some(Pressure::Reported(percent(55)))
    );
    assert!(check(&enforcer, "api", Some("high"), None).await.allowed());
}

#[tokio::test]
async fn a_checks_own_utilization_decides_it_and_is_not_kept() {
    let Fixture { enforcer, .. } = fixture(POLICY);
    let verdict = check(&enforcer, "api", Some("high"), Some(80)).await;
    assert_eq!(verdict.shed.map(|s| s.tier), Some(Tier::High));
    assert_eq!(enforcer.reported_utilization("api"), None);
    assert!(check(&enforcer, "api", Some("high"), None).await.allowed());
}

#[tokio::test]
async fn prepared_requests_are_shed_too() {
    let Fixture { enforcer, .. } = fixture(POLICY);
    let prepared = enforcer
        .prepare("api", Arc::from(descriptors(Some("low"))), 1)
        .unwrap();
    assert!(
        enforcer
            .enforce_prepared(&prepared)
            .await
            .unwrap()
            .allowed()
    );
    enforcer.report_utilization("api", "", percent(70)).unwrap();
    let verdict = enforcer.enforce_prepared(&prepared).await.unwrap();
    assert_eq!(verdict.shed.map(|s| s.tier), Some(Tier::Low));
}

#[tokio::test]
async fn global_shadow_mode_sheds_nothing() {
    let Fixture { enforcer, .. } = fixture(POLICY);
    let enforcer = enforcer.with_shadow_mode(true);
    enforcer
        .report_utilization("api", "", percent(200))
        .unwrap();
    let verdict = check(&enforcer, "api", Some("critical"), None).await;
    assert!(verdict.allowed() && verdict.shed.is_none());
}

#[tokio::test]
async fn a_domain_without_shedding_is_never_shed_and_refuses_reports() {
    let Fixture { enforcer, .. } = fixture(NO_SHED);
    assert_eq!(
        enforcer.report_utilization("plain", "", percent(99)),
        Err(ReportError::NoShedding("plain".into()))
    );
    assert_eq!(
        enforcer.report_utilization("nowhere", "", percent(99)),
        Err(ReportError::NoShedding("nowhere".into()))
    );
    assert!(
        check(&enforcer, "plain", Some("low"), Some(500))
            .await
            .allowed()
    );
}

#[tokio::test]
async fn an_instance_name_past_the_value_limit_is_refused() {
    let Fixture { enforcer, .. } = fixture(POLICY);
    let limits = RequestLimits {
        value_bytes: 8,
        ..RequestLimits::default()
    };
    let enforcer = enforcer.with_request_limits(limits);
    assert_eq!(
        enforcer.report_utilization("api", "a-long-pod-name", percent(10)),
        Err(ReportError::InstanceTooLong(8))
    );
    enforcer
        .report_utilization("api", "pod-1", percent(10))
        .unwrap();
}

/// Ten requests a minute for the whole fleet, whatever the user: the
/// domain's shared budget, shed by tier as it fills.
const BUDGET: &str = "
domain: api
shed:
  thresholds: { critical: 100, high: 70, low: 50 }
  retry_after: 2s
rules:
  - name: fleet
    match: [{ key: priority }]
    algorithm: fixed-window
    limit: { requests: 10, per: 1m }
    shed: true
";

/// One check of the fleet budget at `tier`.
async fn spend(enforcer: &Enforcer<MemoryStore<ManualClock>>, tier: &str) -> Verdict {
    let descriptors = [Descriptor {
        entries: vec![Entry::new("priority", tier)],
        ..Descriptor::default()
    }];
    decide(enforcer, "api", &descriptors, None).await
}

#[tokio::test]
async fn a_shared_budget_sheds_each_tier_past_its_share_and_limits_critical_past_the_whole() {
    let Fixture { enforcer, .. } = fixture(BUDGET);
    // Low may spend the budget up to 50 %: five of ten.
    for _ in 0..5 {
        assert!(spend(&enforcer, "low").await.allowed());
    }
    let shed = spend(&enforcer, "low").await;
    let expected = |tier, share| Shed {
        tier,
        pressure: Pressure::Budget(share),
        // The fixed window's end: when the tier's share has room again.
        retry_after: Duration::from_secs(59),
    };
    assert_eq!(shed.shed.as_deref(), Some(&expected(Tier::Low, 50)));
    assert!(!shed.allowed() && shed.permit.is_empty());
    assert_eq!(
        spend(&enforcer, "unknown").await.shed.map(|s| s.tier),
        Some(Tier::Low),
        "an unknown tier is low"
    );
    // A shed was charged nothing: high still gets its two to 70 %.
    for _ in 0..2 {
        assert!(
            spend(&enforcer, "HIGH").await.allowed(),
            "tiers in any case"
        );
    }
    assert_eq!(
        spend(&enforcer, "high").await.shed.as_deref(),
        Some(&expected(Tier::High, 70))
    );
    // Critical spends the rest, then is over the limit: limited, not shed.
    for _ in 0..3 {
        assert!(spend(&enforcer, "critical").await.allowed());
    }
    let limited = spend(&enforcer, "critical").await;
    assert!(!limited.allowed() && limited.shed.is_none());
}

#[tokio::test]
async fn a_request_another_limit_denies_is_limited_not_shed() {
    let text = "
domain: api
shed: {}
rules:
  - name: fleet
    match: [{ key: priority }]
    algorithm: gcra
    limit: { requests: 100, per: 1s }
    shed: true
  - name: per-user
    match: [{ key: user }]
    limit: { requests: 1, per: 1h }
";
    let Fixture { enforcer, .. } = fixture(text);
    let descriptors = [
        Descriptor {
            entries: vec![Entry::new("priority", "low")],
            ..Descriptor::default()
        },
        Descriptor {
            entries: vec![Entry::new("user", "u1")],
            ..Descriptor::default()
        },
    ];
    let with_user = async || decide(&enforcer, "api", &descriptors, None).await;
    assert!(with_user().await.allowed());
    for _ in 0..49 {
        assert!(spend(&enforcer, "low").await.allowed());
    }
    // Past low's share of the budget and over the user's own limit.
    let verdict = with_user().await;
    assert!(!verdict.allowed() && verdict.shed.is_none());
    assert_eq!(
        spend(&enforcer, "low").await.shed.map(|s| s.tier),
        Some(Tier::Low)
    );
}

#[test]
fn a_shared_budget_needs_the_domains_shed_section_and_its_priority_key() {
    let refused = |text: &str| Policy::parse("test.yaml", text).unwrap_err().to_string();
    let rule = "rules:\n  - name: fleet\n    match: [{ key: tier }]\n    limit: { requests: 10, per: 1s }\n    shed: true\n";
    let e = refused(&format!("domain: api\n{rule}"));
    assert!(
        e.contains("test.yaml:6:") && e.contains("rules[0].shed") && e.contains("`shed:` section"),
        "{e}"
    );
    let e = refused(&format!("domain: api\nshed: {{}}\n{rule}"));
    assert!(
        e.contains("shed.priority_key \"priority\" is not one of the rule's match keys"),
        "{e}"
    );
    let e = refused(&format!(
        "domain: api\nshed: {{ priority_key: tier }}\n{rule}    algorithm: token-bucket\n"
    ));
    assert!(e.contains("a token bucket clamps"), "{e}");
    Policy::parse(
        "test.yaml",
        &format!("domain: api\nshed: {{ priority_key: tier }}\n{rule}"),
    )
    .expect("a budget keyed by the domain's priority key");
}

#[test]
fn a_bad_shed_section_is_refused_at_its_line() {
    let refused = |section: &str| {
        let text = format!("domain: api\nshed:\n{section}\nrules: []\n");
        Policy::parse("test.yaml", &text).unwrap_err().to_string()
    };
    let e = refused("  thresholds: { critical: 50, high: 75, low: 50 }");
    assert!(
        e.contains("test.yaml:3:")
            && e.contains("shed.thresholds")
            && e.contains("critical >= high >= low"),
        "{e}"
    );
    let e = refused("  report_ttl: 0s");
    assert!(e.contains("shed.report_ttl: must be longer than 0"), "{e}");
    let e = refused("  retry_after: soon");
    assert!(e.contains("shed.retry_after"), "{e}");
    let e = refused("  priority_key: \"\"");
    assert!(e.contains("shed.priority_key: must not be empty"), "{e}");
    let e = refused("  tiers: 3");
    assert!(e.contains("tiers"), "{e}");
    let policy = Policy::parse("test.yaml", "domain: api\nshed: {}\nrules: []\n").unwrap();
    let shedding = policy.shedding("api").expect("a shed section of defaults");
    assert_eq!(shedding.priority_key(), "priority");
    assert_eq!(shedding.report_ttl(), Duration::from_secs(10));
    assert_eq!(shedding.retry_after(), Duration::from_secs(1));
}
