//! Policies read from both config formats: the decisions envoyproxy/ratelimit
//! documents for its examples, the native format's features, and errors that
//! name file, line and field.

use std::time::Duration;

use tollgate_core::Algorithm;
use tollgate_policy::{
    Descriptor, Entry, LimitOverride, Policy, Request, RequestError, Resolved, Unit,
};

fn descriptor(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
        ..Descriptor::default()
    }
}

fn resolve(policy: &Policy, domain: &str, descriptors: &[&[(&str, &str)]]) -> Vec<Resolved> {
    let descriptors: Vec<_> = descriptors.iter().map(|d| descriptor(d)).collect();
    policy
        .resolve(&Request {
            domain,
            descriptors: &descriptors,
            hits_addend: 1,
        })
        .expect("a valid request")
}

fn one(policy: &Policy, domain: &str, entries: &[(&str, &str)]) -> Resolved {
    resolve(policy, domain, &[entries]).remove(0)
}

/// `(requests per unit, unit, storage key)` of a limit.
fn limit(resolved: &Resolved) -> (u64, Unit, String) {
    match resolved {
        Resolved::Limit(a) => (a.envoy_limit.0, a.envoy_limit.1, a.key.clone()),
        other => panic!("expected a limit, got {other:?}"),
    }
}

const MESSAGING: &str = r#"
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

#[test]
fn envoy_example_2_nested_and_per_value_limits() {
    let p = Policy::parse("messaging.yaml", MESSAGING).unwrap();
    let a = limit(&one(
        &p,
        "messaging",
        &[("message_type", "marketing"), ("to_number", "2061111111")],
    ));
    let b = limit(&one(
        &p,
        "messaging",
        &[("message_type", "marketing"), ("to_number", "2062222222")],
    ));
    assert_eq!((a.0, a.1), (5, Unit::Day));
    assert_ne!(a.2, b.2, "each number has its own budget");
    let c = limit(&one(&p, "messaging", &[("to_number", "2061111111")]));
    assert_eq!((c.0, c.1), (100, Unit::Day));
    assert!(matches!(
        one(
            &p,
            "messaging",
            &[("message_type", "transactional"), ("to_number", "1")]
        ),
        Resolved::NoRule
    ));
    // Several descriptors in one call: one layer each.
    let layers = resolve(
        &p,
        "messaging",
        &[
            &[("message_type", "marketing"), ("to_number", "1")],
            &[("to_number", "1")],
        ],
    );
    assert_eq!(layers.len(), 2);
    assert!(
        layers
            .iter()
            .all(|l| matches!(l, Resolved::Limit(a) if a.algorithm == Algorithm::FixedWindow))
    );
}

#[test]
fn envoy_example_3_most_specific_match_and_zero_blocks() {
    let p = Policy::parse(
        "edge.yaml",
        r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"#,
    )
    .unwrap();
    assert_eq!(
        limit(&one(
            &p,
            "edge_proxy_per_ip",
            &[("remote_address", "50.0.0.1")]
        ))
        .0,
        10
    );
    assert!(matches!(
        one(&p, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]),
        Resolved::Blocked(_, Unit::Second)
    ));
}

#[test]
fn envoy_example_4_depth_must_match() {
    let flat = Policy::parse(
        "flat.yaml",
        "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit:\n      requests_per_unit: 300\n      unit: second\n",
    )
    .unwrap();
    assert!(matches!(
        one(
            &flat,
            "example4",
            &[("key", "value"), ("subkey", "subvalue")]
        ),
        Resolved::NoRule
    ));
    let nested = Policy::parse(
        "nested.yaml",
        "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit:\n          requests_per_unit: 300\n          unit: second\n",
    )
    .unwrap();
    assert_eq!(
        limit(&one(
            &nested,
            "example4",
            &[("key", "value"), ("subkey", "subvalue")]
        ))
        .0,
        300
    );
    assert!(matches!(
        one(&nested, "example4", &[("key", "value")]),
        Resolved::NoRule
    ));
}

#[test]
fn envoy_example_5_unlimited() {
    let p = Policy::parse(
        "internal.yaml",
        "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n  - key: azure\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n",
    )
    .unwrap();
    assert!(matches!(
        one(&p, "internal", &[("ldap", "x")]),
        Resolved::Unlimited(_)
    ));
    assert_eq!(
        limit(&one(&p, "internal", &[("azure", "x")])).1,
        Unit::Minute
    );
}

#[test]
fn envoy_example_6_shadow_mode() {
    let p = Policy::parse(
        "example6.yaml",
        r#"
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
"#,
    )
    .unwrap();
    let a = one(
        &p,
        "example6",
        &[("service", "auth-service"), ("user", "user-a")],
    );
    let b = one(
        &p,
        "example6",
        &[("service", "auth-service"), ("user", "user-b")],
    );
    assert!(matches!(a, Resolved::Limit(ref x) if x.shadow && x.quota.limit() == 10));
    assert!(matches!(b, Resolved::Limit(ref x) if !x.shadow && x.quota.limit() == 20));
}

#[test]
fn envoy_example_7_replaces() {
    let p = Policy::parse(
        "example7.yaml",
        r#"
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"#,
    )
    .unwrap();
    let d1: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let d2: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    assert_eq!(limit(&one(&p, "example7", d1)).0, 5);
    let both = resolve(&p, "example7", &[d1, d2]);
    assert!(matches!(both[0], Resolved::Replaced(_)));
    assert_eq!(limit(&both[1]).0, 10);
}

#[test]
fn envoy_example_8_detailed_metric() {
    let p = Policy::parse(
        "example8.yaml",
        "domain: example8\ndescriptors:\n  - key: key1\n    detailed_metric: true\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
    )
    .unwrap();
    assert!(
        matches!(one(&p, "example8", &[("key1", "other")]), Resolved::Limit(ref a) if a.rule.detailed_metric() && a.quota.limit() == 10)
    );
    assert_eq!(limit(&one(&p, "example8", &[("key1", "value1")])).0, 20);
}

#[test]
fn envoy_example_9_wildcard_values() {
    let p = Policy::parse(
        "example9.yaml",
        "domain: example9\ndescriptors:\n  - key: key1\n    value: value*\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n",
    )
    .unwrap();
    let a = limit(&one(&p, "example9", &[("key1", "value1")]));
    let b = limit(&one(&p, "example9", &[("key1", "value2")]));
    assert_eq!(a.0, 20);
    assert_ne!(a.2, b.2, "a wildcard keeps one budget per matched value");
    assert!(matches!(
        one(&p, "example9", &[("key1", "other")]),
        Resolved::NoRule
    ));
}

/// envoyproxy/ratelimit tries its wildcards in file order and takes the first
/// that matches (`GetLimit` in `src/config/config_impl.go`); an exact value
/// beats them all and the key alone comes last.
#[test]
fn envoy_wildcards_match_in_file_order_after_exact_values() {
    let config = |first: &str, second: &str| {
        format!(
            r#"
domain: w
descriptors:
  - key: path
    value: {first}
    rate_limit: {{ unit: second, requests_per_unit: 1 }}
  - key: path
    value: {second}
    rate_limit: {{ unit: second, requests_per_unit: 2 }}
  - key: path
    value: /api/search/exact
    rate_limit: {{ unit: second, requests_per_unit: 3 }}
  - key: path
    rate_limit: {{ unit: second, requests_per_unit: 4 }}
"#
        )
    };
    let short_first = Policy::parse("w.yaml", &config("/api*", "/api/search*")).unwrap();
    let long_first = Policy::parse("w.yaml", &config("/api/search*", "/api*")).unwrap();
    for (policy, path, expected) in [
        (&short_first, "/api/x", 1),
        (&short_first, "/api/search?q", 1),
        (&long_first, "/api/search?q", 1),
        (&long_first, "/api/x", 2),
        (&short_first, "/api/search/exact", 3),
        (&long_first, "/api/search/exact", 3),
        (&short_first, "/other", 4),
    ] {
        assert_eq!(
            limit(&one(policy, "w", &[("path", path)])).0,
            expected,
            "{path}"
        );
    }
}

/// The native format keeps its own order: the longest prefix wins, whatever
/// the order of the rules.
#[test]
fn native_prefixes_match_longest_first_whatever_their_order() {
    let p = Policy::parse(
        "n.yaml",
        r#"
domain: n
rules:
  - name: api
    match: [{ key: path, value: /api* }]
    limit: { requests: 1, per: 1s }
  - name: search
    match: [{ key: path, value: /api/search* }]
    limit: { requests: 2, per: 1s }
"#,
    )
    .unwrap();
    let got = |path: &str| applied(one(&p, "n", &[("path", path)])).quota.limit();
    assert_eq!((got("/api/x"), got("/api/search?q")), (1, 2));
}

#[test]
fn unknown_domains_and_unmatched_descriptors_have_no_limit() {
    let p = Policy::parse("messaging.yaml", MESSAGING).unwrap();
    assert!(matches!(
        one(&p, "nope", &[("to_number", "1")]),
        Resolved::NoRule
    ));
    assert!(matches!(
        one(&p, "messaging", &[("nope", "1")]),
        Resolved::NoRule
    ));
}

/// envoyproxy/ratelimit refuses only an empty domain and an empty descriptor
/// list (`shouldRateLimitWorker`; `TestEmptyDomain`, `TestEmptyDescriptors`
/// in its `test/service/ratelimit_test.go`). A descriptor without entries
/// or with an empty key matches no rule there (`GetLimit`), and an override
/// of 0 is a limit every hit is over. Tollgate's own API refuses all of
/// them (`Request::well_formed`).
#[test]
fn malformed_requests_are_refused_with_a_reason() {
    let p = Policy::parse("messaging.yaml", MESSAGING).unwrap();
    let empty = [Descriptor::default()];
    let no_key = [descriptor(&[("", "v")])];
    let zero = [Descriptor {
        limit: Some(LimitOverride {
            requests_per_unit: 0,
            unit: Unit::Second,
        }),
        ..descriptor(&[("k", "v")])
    }];
    let request = |domain, descriptors| Request {
        domain,
        descriptors,
        hits_addend: 1,
    };
    for (domain, descriptors, expected) in [
        ("", &no_key[..], RequestError::EmptyDomain),
        ("messaging", &[], RequestError::NoDescriptors),
    ] {
        let request = request(domain, descriptors);
        assert_eq!(p.resolve(&request).unwrap_err(), expected);
        assert_eq!(request.well_formed().unwrap_err(), expected);
    }

    let resolved = |descriptors| p.resolve(&request("messaging", descriptors)).unwrap();
    assert!(matches!(resolved(&empty)[..], [Resolved::NoRule]));
    assert!(matches!(resolved(&no_key)[..], [Resolved::NoRule]));
    match &resolved(&zero)[..] {
        [Resolved::Blocked(rule, Unit::Second)] => {
            assert_eq!(rule.name(), None, "an override has no name");
            assert_eq!(rule.envoy_window(), Some(Unit::Second));
        }
        other => panic!("{other:?}"),
    }

    let refusal = |descriptors| request("messaging", descriptors).well_formed().unwrap_err();
    assert_eq!(refusal(&empty), RequestError::EmptyDescriptor { index: 0 });
    assert_eq!(refusal(&no_key), RequestError::EmptyKey { index: 0 });
    let got = refusal(&zero);
    assert!(
        got.to_string().contains("limit must be at least 1"),
        "{got}"
    );
    let fine = [descriptor(&[("to_number", "1")])];
    assert_eq!(request("messaging", &fine).well_formed(), Ok(()));
}

#[test]
fn hits_addend_defaults_to_one_and_a_descriptor_overrides_it() {
    let p = Policy::parse("messaging.yaml", MESSAGING).unwrap();
    let plain = descriptor(&[("to_number", "1")]);
    let costly = Descriptor {
        hits_addend: Some(7),
        ..plain.clone()
    };
    let got = p
        .resolve(&Request {
            domain: "messaging",
            descriptors: &[plain, costly],
            hits_addend: 0,
        })
        .unwrap();
    let costs: Vec<u64> = got
        .iter()
        .map(|r| match r {
            Resolved::Limit(a) => a.cost,
            _ => 0,
        })
        .collect();
    assert_eq!(costs, [1, 7]);
}

#[test]
fn a_limit_override_replaces_the_config_for_its_descriptor() {
    let p = Policy::parse("messaging.yaml", MESSAGING).unwrap();
    let d = Descriptor {
        limit: Some(LimitOverride {
            requests_per_unit: 42,
            unit: Unit::Hour,
        }),
        ..descriptor(&[("anything", "x")])
    };
    let got = p
        .resolve(&Request {
            domain: "messaging",
            descriptors: &[d],
            hits_addend: 1,
        })
        .unwrap();
    let (rpu, unit, _) = limit(&got[0]);
    assert_eq!((rpu, unit), (42, Unit::Hour));
}

const NATIVE: &str = r#"
domain: api
defaults:
  algorithm: sliding-counter
rules:
  - name: per-user
    match: [{ key: user }, { key: tier }]
    algorithm: gcra
    tiers:
      by: tier
      default: free
      limits:
        free: { requests: 60, per: 1m }
        paid: { requests: 600, per: 1m, burst: 100 }
  - name: search
    match: [{ key: user }, { key: path, value: /search }]
    bucket: heavy
    limit: { requests: 10, per: 1s }
  - name: export
    match: [{ key: user }, { key: path, value: /export }]
    bucket: heavy
    limit: { requests: 10, per: 1s }
  - name: shed
    match: [{ key: priority }]
    algorithm: leaky-bucket
    limit: { requests: 100, per: 1s }
    priority:
      by: priority
      default: low
      shares: { critical: 100, low: 50 }
  - name: uploads
    match: [{ key: uploads }]
    algorithm: concurrency
    limit: { requests: 5 }
  - name: shaped
    match: [{ key: shaped }]
    algorithm: leaky-bucket-shaping
    delay_after: 2
    limit: { requests: 10, per: 1s, burst: 5 }
    failure: fail_closed
  - name: dark
    match: [{ key: beta }]
    shadow: true
    limit: { requests: 1, per: 1h }
"#;

fn applied(r: Resolved) -> tollgate_policy::Applied {
    match r {
        Resolved::Limit(a) => a,
        other => panic!("expected a limit, got {other:?}"),
    }
}

#[test]
fn native_tiers_pick_the_quota_and_fall_back_to_the_default() {
    let p = Policy::parse("api.yaml", NATIVE).unwrap();
    let free = applied(one(&p, "api", &[("user", "u1"), ("tier", "free")]));
    let paid = applied(one(&p, "api", &[("user", "u1"), ("tier", "paid")]));
    let unknown = applied(one(&p, "api", &[("user", "u1"), ("tier", "platinum")]));
    assert_eq!(
        (free.quota.limit(), paid.quota.limit(), paid.quota.burst()),
        (60, 600, 100)
    );
    assert_eq!(unknown.quota, free.quota);
    assert_eq!(
        free.key, paid.key,
        "a user's budget does not depend on the tier entry"
    );
    assert_eq!(free.algorithm, Algorithm::Gcra);
}

#[test]
fn native_shared_buckets_share_one_key_per_subject() {
    let p = Policy::parse("api.yaml", NATIVE).unwrap();
    let search = applied(one(&p, "api", &[("user", "u1"), ("path", "/search")]));
    let export = applied(one(&p, "api", &[("user", "u1"), ("path", "/export")]));
    let other_user = applied(one(&p, "api", &[("user", "u2"), ("path", "/search")]));
    assert_eq!(search.key, export.key);
    assert_ne!(search.key, other_user.key);
    assert_eq!(search.rule.bucket(), Some("heavy"));
    assert_eq!(
        search.algorithm,
        Algorithm::SlidingCounter,
        "the domain default"
    );
}

#[test]
fn native_priority_reserve_shrinks_the_tolerance_of_low_classes_on_one_budget() {
    let p = Policy::parse("api.yaml", NATIVE).unwrap();
    let critical = applied(one(&p, "api", &[("priority", "critical")]));
    let low = applied(one(&p, "api", &[("priority", "low")]));
    let unnamed = applied(one(&p, "api", &[("priority", "whatever")]));
    assert_eq!(critical.key, low.key, "one shared budget");
    assert_eq!((critical.quota.burst(), low.quota.burst()), (100, 50));
    assert_eq!(
        critical.quota.emission_ns(),
        low.quota.emission_ns(),
        "same drain rate"
    );
    assert_eq!(unnamed.quota, low.quota, "unknown classes get the default");
}

#[test]
fn native_algorithms_flags_and_failure_policies() {
    let p = Policy::parse("api.yaml", NATIVE).unwrap();
    let uploads = applied(one(&p, "api", &[("uploads", "u1")]));
    assert_eq!(uploads.algorithm, Algorithm::Concurrency);
    assert_eq!(
        uploads.quota.period(),
        Duration::from_secs(60),
        "the default lease"
    );
    let shaped = applied(one(&p, "api", &[("shaped", "x")]));
    assert_eq!(
        shaped.algorithm,
        Algorithm::LeakyBucketShaping { delay_after: 2 }
    );
    assert_eq!(shaped.failure, tollgate_policy::FailurePolicy::FailClosed);
    assert!(applied(one(&p, "api", &[("beta", "x")])).shadow);
}

#[test]
fn storage_keys_cannot_be_forged_with_separators_in_values() {
    let p = Policy::parse("messaging.yaml", MESSAGING).unwrap();
    let a = limit(&one(
        &p,
        "messaging",
        &[("message_type", "marketing"), ("to_number", "1|2")],
    ))
    .2;
    let b = limit(&one(&p, "messaging", &[("to_number", "1|2")])).2;
    let c = limit(&one(&p, "messaging", &[("to_number", "1")])).2;
    assert_ne!(a, b);
    assert_ne!(b, c);
}

/// `(line, field)` of the error a config gives, with its reason.
fn error(name: &str, text: &str) -> (u64, String, String) {
    let e = Policy::parse(name, text).expect_err("the config is invalid");
    assert!(e.to_string().starts_with(name), "{e}");
    (e.line, e.field, e.reason)
}

#[test]
fn errors_name_the_file_line_and_field() {
    let cases: &[(&str, u64, &str, &str)] = &[
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
            5,
            "descriptors[0].rate_limit.unit",
            "invalid rate limit unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n",
            6,
            "descriptors[0].rate_limit.unit",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
            4,
            "descriptors[1].key",
            "duplicate descriptor composite key",
        ),
        (
            "domain: d\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 5 }\n",
            5,
            "rules[0].limit.per",
            "missing `per`",
        ),
        (
            "domain: d\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 5, per: 1 fortnight }\n",
            5,
            "rules[0].limit.per",
            "invalid duration",
        ),
        (
            "domain: d\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 0, per: 1s }\n",
            5,
            "rules[0].limit.requests",
            "limit must be at least 1",
        ),
        (
            "domain: d\nrules:\n  - name: r\n    match: [{ key: a }]\n    limit: { requests: 1, per: 1s }\n  - name: r\n    match: [{ key: b }]\n    limit: { requests: 1, per: 1s }\n",
            6,
            "rules[1].name",
            "duplicate rule name",
        ),
        (
            "domain: d\nrules:\n  - name: r\n    match: [{ key: a }]\n    tiers: { by: tier, default: free, limits: { free: { requests: 1, per: 1s } } }\n",
            5,
            "rules[0].tiers.by",
            "not one of the rule's match keys",
        ),
        (
            "domain: d\nrules:\n  - name: r\n    match: [{ key: p }]\n    algorithm: token-bucket\n    limit: { requests: 1, per: 1s }\n    priority: { by: p, default: low, shares: { low: 50 } }\n",
            7,
            "rules[0].priority",
            "token bucket",
        ),
        (
            "domain: d\nrules:\n  - name: a\n    match: [{ key: a }]\n    bucket: b\n    limit: { requests: 1, per: 1s }\n  - name: c\n    match: [{ key: c }]\n    bucket: b\n    limit: { requests: 2, per: 1s }\n",
            9,
            "rules[1].bucket",
            "must have the same algorithm and limit",
        ),
        (
            "domain: d\nrules:\n  - name: a\n    match: [{ key: a }]\n    algorithm: leaky\n    limit: { requests: 1, per: 1s }\n",
            5,
            "rules[0].algorithm",
            "unknown algorithm",
        ),
        (
            "domain: d\nrules:\n  - name: a\n    match: [{ key: a }]\n    limit: { requests: 1, per: 1s }\n    limits: 3\n",
            6,
            "yaml",
            "limits",
        ),
        ("domain: d\nrules:\n  - name: [unclosed\n", 3, "yaml", ""),
    ];
    for &(text, line, field, reason) in cases {
        let (got_line, got_field, got_reason) = error("bad.yaml", text);
        assert_eq!(
            (got_line, got_field.as_str()),
            (line, field),
            "{text}\n{got_reason}"
        );
        assert!(
            got_reason.contains(reason),
            "{got_reason:?} should say {reason:?}"
        );
    }
}

#[test]
fn a_directory_loads_both_formats_and_refuses_a_domain_twice() {
    let dir = std::env::temp_dir().join(format!("tollgate-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.yaml"), MESSAGING).unwrap();
    std::fs::write(dir.join("b.yml"), NATIVE).unwrap();
    std::fs::write(dir.join("notes.txt"), "not yaml").unwrap();
    let p = Policy::load(&dir).unwrap();
    assert_eq!(p.domains().collect::<Vec<_>>(), ["api", "messaging"]);
    std::fs::write(dir.join("c.yaml"), MESSAGING).unwrap();
    let e = Policy::load(&dir).unwrap_err();
    assert!(
        e.to_string().contains("c.yaml") && e.reason.contains("duplicate domain"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_builtin_policy_and_every_example_are_valid() {
    let builtin = Policy::builtin();
    assert!(matches!(
        one(&builtin, "default", &[("remote_address", "10.0.0.1")]),
        Resolved::Limit(_)
    ));
    assert!(
        matches!(
            one(&builtin, "gateway", &[("remote_address", "2001:db8::/64")]),
            Resolved::Limit(ref a) if a.rule.id() == "per-client-ip"
        ),
        "the gateway works with no config"
    );
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(examples).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "yaml") {
            Policy::load(&path).unwrap_or_else(|e| panic!("{e}"));
            seen += 1;
        }
    }
    assert!(
        seen >= 5,
        "examples/ should hold one config per seed pattern, found {seen}"
    );
}

/// Regression: a native file of ~17,800 rules was refused with an unexplained
/// "budget breached". 200,000 rules load; a file past one of the parser's
/// bounds is refused with a reason that says what to do.
#[test]
fn a_config_of_200000_rules_loads_and_a_larger_budget_breach_is_explained() {
    let mut text = String::from("domain: big\nrules:\n");
    for i in 0..200_000 {
        text.push_str(&format!(
            "  - name: r{i}\n    match: [{{ key: k{i} }}]\n    limit: {{ requests: 10, per: 1m }}\n"
        ));
    }
    let policy = Policy::parse("big.yaml", &text).expect("200,000 rules load");
    assert_eq!(policy.rules("big").len(), 200_000);

    // Nesting is the cheapest of the parser's bounds to breach.
    let deep = format!(
        "domain: deep\nrules: {}{}\n",
        "[".repeat(100),
        "]".repeat(100)
    );
    let error = Policy::parse("deep.yaml", &deep).expect_err("past the bound");
    assert!(
        error.reason.contains("split it into several files"),
        "{error}"
    );
}

mod store_section {
    use std::time::Duration;

    use tollgate_policy::{Policy, StoreSettings};

    #[test]
    fn a_native_file_or_a_file_of_its_own_holds_the_store_section() {
        let inline = Policy::parse(
            "api.yaml",
            "
domain: api
store:
  redis: redis://127.0.0.1:6379
  redis_timeout: 20ms
  hybrid: true
  hybrid_max_lease: 0.1
rules:
  - name: user
    match: [{ key: user }]
    limit: { requests: 5, per: 1m }
",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (file, store) = inline.store().expect("a store section");
        assert_eq!(file.to_str(), Some("api.yaml"));
        assert_eq!(
            store,
            &StoreSettings {
                redis: Some("redis://127.0.0.1:6379".into()),
                redis_timeout: Some(Duration::from_millis(20)),
                hybrid: Some(true),
                hybrid_max_lease: Some(0.1),
                ..StoreSettings::default()
            }
        );
        assert_eq!(inline.rules("api").len(), 1);

        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::write(
            dir.path().join("store.yaml"),
            "store:\n  deny_cache: false\n  max_keys: 10\n",
        )
        .expect("written");
        std::fs::write(
            dir.path().join("envoy.yaml"),
            "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
        )
        .expect("written");
        let policy = Policy::load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let (_, store) = policy.store().expect("a store section");
        assert_eq!((store.deny_cache, store.max_keys), (Some(false), Some(10)));
        assert_eq!(policy.domains().collect::<Vec<_>>(), ["e"]);
    }

    #[test]
    fn store_mistakes_name_the_file_line_and_field() {
        let unknown = Policy::parse("s.yaml", "store:\n  redis: redis://x:1\n  hybird: true\n")
            .expect_err("a misspelt field");
        assert_eq!((unknown.line, unknown.path.to_str()), (3, Some("s.yaml")));
        assert!(unknown.to_string().contains("hybird"), "{unknown}");
        let duration =
            Policy::parse("s.yaml", "store:\n  redis_timeout: soon\n").expect_err("not a duration");
        assert_eq!(duration.line, 2, "{duration}");
        let envoy = Policy::parse(
            "e.yaml",
            "domain: e\nstore: {}\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
        )
        .expect_err("store in an envoyproxy/ratelimit file");
        assert_eq!(envoy.field, "store");

        let dir = tempfile::tempdir().expect("a temp dir");
        for name in ["a.yaml", "b.yaml"] {
            std::fs::write(dir.path().join(name), "store:\n  hybrid: true\n").expect("written");
        }
        let twice = Policy::load(dir.path()).expect_err("two store sections");
        assert!(
            twice.to_string().contains("a second `store` section"),
            "{twice}"
        );
    }
}

/// `Policy::load_errors` finds what `Policy::load_files` refuses, every
/// file's first error rather than the first file's, then what the files that
/// read well refuse together; and nothing when the path loads.
#[test]
fn load_errors_gives_every_files_first_error_then_the_clashes() {
    use tollgate_policy::ConfigFiles;
    let rule = |domain: &str, per: &str| {
        format!(
            "domain: {domain}\nrules:\n  - name: r\n    match: [{{ key: k }}]\n    limit: {{ requests: 1, per: {per} }}\n"
        )
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    let files = [
        ("a.yaml", rule("a", "1 sec")),
        ("b.yaml", rule("b", "1s")),
        ("c.yaml", rule("b", "1s")),
        ("d.yaml", rule("d", "fortnight")),
    ];
    for (name, text) in &files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let first = Policy::load(dir.path()).expect_err("refused");
    let errors = Policy::load_errors(dir.path(), ConfigFiles::default());
    assert_eq!(errors[0], first, "the loader's own error comes first");
    let alone = |name: &str| Policy::load(&dir.path().join(name)).expect_err("refused");
    let clash = errors.last().unwrap();
    assert_eq!(errors[..2], [alone("a.yaml"), alone("d.yaml")]);
    assert_eq!(errors.len(), 3);
    assert!(clash.path.ends_with("c.yaml"), "{clash}");
    assert_eq!((clash.line, clash.field.as_str()), (1, "domain"));
    assert!(clash.reason.contains("b.yaml"), "{clash}");

    for name in ["a.yaml", "c.yaml", "d.yaml"] {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    assert!(Policy::load(dir.path()).is_ok());
    assert_eq!(Policy::load_errors(dir.path(), ConfigFiles::default()), []);
}

/// `(line, field, reason)` of every error `Policy::load_errors` finds in a
/// file holding `text`, once it is checked that the load path (a file, a
/// directory, a text) reports the first of them, as it always has.
fn every_error(text: &str) -> Vec<(u64, String, String)> {
    use tollgate_policy::ConfigFiles;
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, text).unwrap();
    let errors = Policy::load_errors(&path, ConfigFiles::default());
    let first = Policy::load(&path).expect_err("refused");
    assert_eq!(errors.first(), Some(&first), "{errors:#?}");
    assert_eq!(Policy::load(dir.path()).expect_err("refused"), first);
    assert_eq!(Policy::parse(&path, text).expect_err("refused"), first);
    errors
        .into_iter()
        .map(|e| (e.line, e.field, e.reason))
        .collect()
}

/// `(line, field)` of each error.
fn where_(errors: &[(u64, String, String)]) -> Vec<(u64, &str)> {
    errors.iter().map(|(l, f, _)| (*l, f.as_str())).collect()
}

/// The loader goes on past every bad field and descriptor of an
/// envoyproxy/ratelimit file: each is listed once, in the order it checks,
/// and a refused descriptor's nested descriptors are left out (those under
/// a bad limit and an empty key hold a bad unit; one under a repeated key
/// would match the same descriptors as the first's).
#[test]
fn every_error_of_an_envoy_file_is_listed_once() {
    let text = "\
domain: \"\"
descriptors:
  - key: a
    rate_limit:
      unit: fortnight
      requests_per_unit: -1
      unit_multiplier: 0
    descriptors:
      - key: inner
        rate_limit: { unit: eon }
  - key: \"\"
    descriptors:
      - key: inner
        rate_limit: { unit: eon }
  - key: c
    descriptors:
      - key: inner
        rate_limit: { unit: second, requests_per_unit: 1 }
  - key: c
    descriptors:
      - key: inner
        rate_limit: { unit: second, requests_per_unit: 1 }
  - key: d
    value: v
    share_threshold: true
    algorithm: gcra
  - key: e
    rate_limit:
      name: e
      replaces: [{ name: e }, { name: \"\" }]
      unit: second
      requests_per_unit: 1
  - key: f
    rate_limit: { unit: second, requests_per_unit: 1, algorithm: concurrency }
";
    let errors = every_error(text);
    assert_eq!(
        where_(&errors),
        [
            (1, "domain"),
            (5, "descriptors[0].rate_limit.unit"),
            (6, "descriptors[0].rate_limit.requests_per_unit"),
            (7, "descriptors[0].rate_limit.unit_multiplier"),
            (11, "descriptors[1].key"),
            (19, "descriptors[3].key"),
            (26, "descriptors[4].algorithm"),
            (25, "descriptors[4].share_threshold"),
            (29, "descriptors[5].rate_limit.replaces"),
            (34, "descriptors[6].rate_limit.algorithm"),
        ],
        "{errors:#?}"
    );
    let reasons: Vec<&str> = errors.iter().map(|(.., r)| r.as_str()).collect();
    for (reason, says) in reasons.iter().zip([
        "empty domain",
        "invalid rate limit unit \"fortnight\"",
        "not -1",
        "not 0",
        "descriptor has empty key",
        "duplicate descriptor composite key \"c\"",
        "algorithm belongs in rate_limit",
        "share_threshold can only be used with wildcard values",
        // The first bad entry only: one field, one error.
        "replaces should not contain name of same descriptor",
        "concurrency is not for envoyproxy/ratelimit's format",
    ]) {
        assert!(reason.contains(says), "{reason:?} should say {says:?}");
    }
}

/// Every bad key is listed, and a file with one is checked no further: a
/// misspelt `unit` is not reported again as a missing unit.
#[test]
fn every_bad_key_of_an_envoy_file_is_listed_and_nothing_more() {
    let text = "\
domain: d
descriptors:
  - key: a
    rate_limit: { uint: second, requests_per_unit: 1 }
  - key: b
    ratelimit: { unit: second, requests_per_unit: 1 }
  - key: c
    rate_limit: { unit: second, requests_per_unit: 1.5 }
  - [nested, list]
";
    let errors = every_error(text);
    assert_eq!(
        where_(&errors),
        [
            (4, "descriptors[0].rate_limit.uint"),
            (6, "descriptors[1].ratelimit"),
            (8, "descriptors[2].rate_limit.requests_per_unit"),
            (9, "descriptors[3]"),
        ],
        "{errors:#?}"
    );
}

/// The loader goes on past every bad field and rule of a native file: each
/// is listed once, in the order it checks, and a refused rule is left out
/// of the comparisons with the others (a repeated name is not also an
/// overlap; a default tier whose limit is bad is not also a missing one).
#[test]
fn every_error_of_a_native_file_is_listed_once() {
    let text = "\
domain: \"\"
rules:
  - name: \"\"
    match: [{ key: \"\" }, { key: k }]
    limit: { requests: 1, per: 10 parsecs }
  - name: dup
    match: [{ key: a }]
    limit: { requests: 1, per: 1s }
  - name: dup
    match: [{ key: a }]
    limit: { requests: 1, per: 1s }
  - name: tiered
    match: [{ key: t }]
    tiers: { by: t, default: free, limits: { free: { requests: 0, per: 1s }, paid: { requests: 5, per: 1 eon } } }
  - name: reserved
    match: [{ key: p }]
    algorithm: token-bucket
    limit: { requests: 1, per: 1s }
    priority: { by: q, default: low, shares: { high: 0, low: 101 } }
  - name: shaped
    match: [{ key: s }]
    delay_after: 3
    failure: sometimes
    limit: { requests: 1, per: 1s }
";
    let errors = every_error(text);
    assert_eq!(
        where_(&errors),
        [
            (1, "domain"),
            (3, "rules[0].name"),
            (4, "rules[0].match[0].key"),
            (5, "rules[0].limit.per"),
            (9, "rules[2].name"),
            (14, "rules[3].tiers.limits.free.requests"),
            (14, "rules[3].tiers.limits.paid.per"),
            (19, "rules[4].priority.by"),
            (19, "rules[4].priority"),
            (19, "rules[4].priority.shares.high"),
            (19, "rules[4].priority.shares.low"),
            (22, "rules[5].delay_after"),
            (23, "rules[5].failure"),
        ],
        "{errors:#?}"
    );
    assert!(
        errors[4].2.contains("duplicate rule name \"dup\""),
        "{errors:#?}"
    );
}

/// A refused default is reported once: a rule that takes it is checked
/// for what does not depend on it, and not refused for what does (a limit
/// without `per` needs one only if the algorithm is not concurrency).
#[test]
fn a_refused_default_is_not_reported_again_by_the_rules_that_take_it() {
    let text = "\
domain: d
defaults: { algorithm: quantum }
rules:
  - name: a
    match: [{ key: a }]
    limit: { requests: 5 }
  - name: b
    match: [{ key: b }]
    limit: { requests: 5, per: 10 parsecs }
";
    let errors = every_error(text);
    assert_eq!(
        where_(&errors),
        [(2, "defaults.algorithm"), (9, "rules[1].limit.per")],
        "{errors:#?}"
    );
}

/// What serde refuses stops the file at its first error: there is no value
/// to go on with.
#[test]
fn a_syntax_or_type_error_is_its_files_only_error() {
    for text in [
        "domain: d\nrules:\n  - name: [unclosed\n  - name: \"\"\n",
        "domain: d\nrules:\n  - name: a\n    match: [{ key: a }]\n    limit: { requests: -1, per: 1s }\n  - name: \"\"\n",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: true }\n  - key: \"\"\n",
    ] {
        let errors = every_error(text);
        assert_eq!(errors.len(), 1, "{text}: {errors:#?}");
    }
}
