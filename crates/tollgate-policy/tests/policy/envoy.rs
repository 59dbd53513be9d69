//! envoyproxy/ratelimit's own config fixtures (`tests/envoy/`, copied from its
//! `test/config/`), each expected to load or be refused as its
//! `test/config/config_test.go` expects, with the limits that test asserts;
//! then the matching rules of that format, through `Policy::resolve`.

use std::path::{Path, PathBuf};

use tollgate_policy::{
    ConfigError, ConfigFiles, Descriptor, Entry, LimitOverride, Policy, Request, Resolved, Unit,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/envoy")
        .join(name)
}

fn load(name: &str) -> Policy {
    Policy::load(&fixture(name)).unwrap_or_else(|e| panic!("{e}"))
}

fn descriptor(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
        ..Descriptor::default()
    }
}

fn resolve_all(policy: &Policy, descriptors: &[Descriptor]) -> Vec<Resolved> {
    policy
        .resolve(&Request {
            domain: "test-domain",
            descriptors,
            hits_addend: 1,
        })
        .expect("a valid request")
}

fn one(policy: &Policy, entries: &[(&str, &str)]) -> Resolved {
    resolve_all(policy, &[descriptor(entries)]).remove(0)
}

/// `(requests per unit, unit, storage key)` of the limit a descriptor gets.
fn limit(policy: &Policy, entries: &[(&str, &str)]) -> (u64, Unit, String) {
    match one(policy, entries) {
        Resolved::Limit(a) => (a.envoy_limit.0, a.envoy_limit.1, a.key),
        other => panic!("{entries:?}: expected a limit, got {other:?}"),
    }
}

fn no_rule(policy: &Policy, entries: &[(&str, &str)]) {
    let got = one(policy, entries);
    assert!(matches!(got, Resolved::NoRule), "{entries:?}: {got:?}");
}

/// Asserts the error names the file, then gives `(line, field, reason)`.
fn refused(e: ConfigError, file: &str) -> (u64, String, String) {
    assert_eq!(e.path.file_name().unwrap(), file, "{e}");
    assert!(e.to_string().contains(file), "{e}");
    (e.line, e.field, e.reason)
}

fn assert_refused(file: &str, line: u64, field: &str, reason: &str) {
    let e = Policy::load(&fixture(file)).expect_err("the fixture is refused");
    let (got_line, got_field, got_reason) = refused(e, file);
    assert_eq!(
        (got_line, got_field.as_str()),
        (line, field),
        "{got_reason}"
    );
    assert!(
        got_reason.contains(reason),
        "{got_reason:?} should say {reason:?}"
    );
}

/// A directory holding copies of `files`, for the cases that load several.
fn dir_of(files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tollgate-envoy-{}-{}",
        std::process::id(),
        files.iter().map(|f| f.1).collect::<Vec<_>>().join("-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for (source, target) in files {
        std::fs::copy(fixture(source), dir.join(target)).unwrap();
    }
    dir
}

// TestBasicConfig
#[test]
fn basic_config_loads_with_its_limits_and_its_exempted_values() {
    let p = load("basic_config.yaml");
    let empty = resolve_all(&p, &[Descriptor::default()]);
    assert!(matches!(empty[..], [Resolved::NoRule]), "{empty:?}");
    // Not in its test: `GetLimit` looks an empty key up as `_value`, then as
    // ``, and no descriptor has either.
    no_rule(&p, &[("", "value1")]);
    no_rule(&p, &[("key1", "value1"), ("", "subvalue1")]);
    no_rule(&p, &[("key1", "something")]);
    no_rule(&p, &[("key1", "value1")]);
    no_rule(&p, &[("key2", "value2"), ("subkey", "subvalue")]);
    no_rule(&p, &[("key5", "value5"), ("subkey5", "subvalue")]);
    let (n, unit, _) = limit(&p, &[("key1", "value1"), ("subkey1", "something")]);
    assert_eq!((n, unit), (5, Unit::Second));
    let (n, unit, _) = limit(&p, &[("key1", "value1"), ("subkey1", "subvalue1")]);
    assert_eq!((n, unit), (10, Unit::Second));
    let (n, unit, _) = limit(&p, &[("key2", "something")]);
    assert_eq!((n, unit), (20, Unit::Minute));
    let (n, unit, _) = limit(&p, &[("key2", "value2")]);
    assert_eq!((n, unit), (30, Unit::Minute));
    // `key2: value3` is listed without a rate_limit: exempt from key2's 20/min.
    no_rule(&p, &[("key2", "value3")]);
    let (n, unit, _) = limit(&p, &[("key3", "foo")]);
    assert_eq!((n, unit), (1, Unit::Hour));
    match one(&p, &[("key4", "foo")]) {
        Resolved::Limit(a) => assert_eq!(
            (a.envoy_limit, a.rule.id(), a.rule.name()),
            ((1, Unit::Day), "key4", Some("key4_rate_limit")),
            "the id is the path, the name is the file's"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        one(&p, &[("key6", "foo")]),
        Resolved::Unlimited(_)
    ));
    for value in ["unspecified_value", "another_value"] {
        match one(&p, &[("key7", value)]) {
            Resolved::Limit(a) => {
                assert_eq!(a.envoy_limit, (70, Unit::Minute));
                assert!(a.rule.detailed_metric());
            }
            other => panic!("{other:?}"),
        }
    }
}

// TestConfigLimitOverride
#[test]
fn basic_config_gives_way_to_a_limit_override_keyed_by_every_value() {
    let p = load("basic_config.yaml");
    let with = |value: &str, requests_per_unit, unit| Descriptor {
        limit: Some(LimitOverride {
            requests_per_unit,
            unit,
        }),
        ..descriptor(&[("key1", "value1"), ("subkey1", value)])
    };
    let got = resolve_all(
        &p,
        &[
            with("something", 10, Unit::Day),
            with("something_else", 42, Unit::Hour),
        ],
    );
    let (a, b) = match (&got[0], &got[1]) {
        (Resolved::Limit(a), Resolved::Limit(b)) => (a, b),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (a.envoy_limit, b.envoy_limit),
        ((10, Unit::Day), (42, Unit::Hour))
    );
    assert_ne!(a.key, b.key, "a different value is a different counter");
}

// The fixtures of TestDomainMerge, each alone.
#[test]
fn merge_domain_files_load_alone() {
    let (n, _, _) = limit(&load("merge_domain_key1.yaml"), &[("key1", "value1")]);
    assert_eq!(n, 10);
    let (n, _, _) = limit(&load("merge_domain_key2.yaml"), &[("key2", "value2")]);
    assert_eq!(n, 20);
}

// TestEmptyDomain
#[test]
fn empty_domain_is_refused() {
    assert_refused(
        "empty_domain.yaml",
        0,
        "domain",
        "config file cannot have empty domain",
    );
}

// TestDuplicateDomain
#[test]
fn duplicate_domain_after_basic_config_is_refused() {
    let dir = dir_of(&[
        ("basic_config.yaml", "basic_config.yaml"),
        ("duplicate_domain.yaml", "duplicate_domain.yaml"),
    ]);
    let e = Policy::load(&dir).expect_err("test-domain twice");
    std::fs::remove_dir_all(&dir).unwrap();
    let (line, field, reason) = refused(e, "duplicate_domain.yaml");
    assert_eq!((line, field.as_str()), (1, "domain"));
    assert!(
        reason.contains("duplicate domain \"test-domain\""),
        "{reason}"
    );
}

// TestDomainMerge (MERGE_DOMAIN_CONFIG=true); without it, the second file
// is refused, as envoyproxy/ratelimit refuses it by default.
#[test]
fn merged_domains_take_both_files_descriptors() {
    let dir = dir_of(&[
        ("merge_domain_key1.yaml", "merge_domain_key1.yaml"),
        ("merge_domain_key2.yaml", "merge_domain_key2.yaml"),
    ]);
    let merged = Policy::load_files(&dir, ConfigFiles::default().merge_domains(true));
    let refused_unmerged = Policy::load(&dir).expect_err("test-domain twice");
    std::fs::remove_dir_all(&dir).unwrap();
    let p = merged.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(limit(&p, &[("key1", "value1")]).0, 10);
    assert_eq!(limit(&p, &[("key2", "value2")]).0, 20);
    no_rule(&p, &[("key1", "value2")]);
    assert!(p.is_envoy("test-domain"));
    let (line, field, _) = refused(refused_unmerged, "merge_domain_key2.yaml");
    assert_eq!((line, field.as_str()), (1, "domain"));
}

// TestDuplicateKeyDomainMerge
#[test]
fn merging_a_descriptor_twice_is_refused() {
    let dir = dir_of(&[
        ("merge_domain_key1.yaml", "a.yaml"),
        ("merge_domain_key1.yaml", "b.yaml"),
    ]);
    let e = Policy::load_files(&dir, ConfigFiles::default().merge_domains(true))
        .expect_err("key1_value1 twice");
    std::fs::remove_dir_all(&dir).unwrap();
    let (line, field, reason) = refused(e, "b.yaml");
    assert_eq!((line, field.as_str()), (5, "descriptors[0].key"));
    assert!(
        reason.contains("duplicate descriptor composite key \"key1_value1\""),
        "{reason}"
    );
}

/// Only envoyproxy-format domains merge: a native file of the same domain is
/// still refused.
#[test]
fn a_native_domain_never_merges() {
    let dir = std::env::temp_dir().join(format!("tollgate-merge-native-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("merge_domain_key1.yaml"), dir.join("a.yaml")).unwrap();
    std::fs::write(
        dir.join("b.yaml"),
        "domain: test-domain\nrules:\n  - name: n\n    match: [{ key: k }]\n    limit: { requests: 1, per: 1s }\n",
    )
    .unwrap();
    let e = Policy::load_files(&dir, ConfigFiles::default().merge_domains(true))
        .expect_err("mixed formats");
    std::fs::remove_dir_all(&dir).unwrap();
    let (_, field, reason) = refused(e, "b.yaml");
    assert_eq!(field, "domain");
    assert!(reason.contains("duplicate domain"), "{reason}");
}

/// The same file alone is valid: a domain with an empty `descriptors:`.
#[test]
fn duplicate_domain_alone_is_a_domain_without_descriptors() {
    let p = load("duplicate_domain.yaml");
    assert_eq!(p.domains().collect::<Vec<_>>(), ["test-domain"]);
    assert!(p.rules("test-domain").is_empty());
    no_rule(&p, &[("anything", "x")]);
}

// TestEmptyKey
#[test]
fn empty_key_is_refused() {
    assert_refused(
        "empty_key.yaml",
        3,
        "descriptors[0].key",
        "descriptor has empty key",
    );
}

// TestDuplicateKey
#[test]
fn duplicate_key_is_refused() {
    assert_refused(
        "duplicate_key.yaml",
        6,
        "descriptors[1].key",
        "duplicate descriptor composite key \"key1_value1\"",
    );
}

// TestBadLimitUnit
#[test]
fn bad_limit_unit_is_refused() {
    assert_refused(
        "bad_limit_unit.yaml",
        6,
        "descriptors[0].rate_limit.unit",
        "invalid rate limit unit \"foo\"",
    );
}

// TestReplacesSelf
#[test]
fn replaces_self_is_refused() {
    assert_refused(
        "replaces_self.yaml",
        8,
        "descriptors[0].descriptors[0].rate_limit.replaces",
        "replaces should not contain name of same descriptor",
    );
}

// TestReplacesEmpty
#[test]
fn replaces_empty_is_refused() {
    assert_refused(
        "replaces_empty.yaml",
        8,
        "descriptors[0].descriptors[0].rate_limit.replaces",
        "should not have an empty replaces entry",
    );
}

// TestBadYaml
#[test]
fn bad_yaml_is_refused() {
    let e = Policy::load(&fixture("bad_yaml.yaml")).expect_err("not YAML");
    let (line, field, reason) = refused(e, "bad_yaml.yaml");
    assert_eq!(field, "yaml", "{reason}");
    assert!(line >= 1, "points into the file: {line}");
}

// TestMisspelledKey
#[test]
fn misspelled_keys_are_refused() {
    assert_refused(
        "misspelled_key.yaml",
        5,
        "descriptors[0].ratelimit",
        "unknown key 'ratelimit'",
    );
    assert_refused(
        "misspelled_key2.yaml",
        7,
        "descriptors[0].rate_limit.requestsperunit",
        "unknown key 'requestsperunit'",
    );
}

// TestNonStringKey
#[test]
fn non_string_key_is_refused() {
    assert_refused(
        "non_string_key.yaml",
        1,
        "0.25",
        "key is not of type string: 0.25",
    );
}

// TestNonMapList
#[test]
fn non_map_list_is_refused() {
    assert_refused(
        "non_map_list.yaml",
        3,
        "descriptors[0]",
        "list of type other than map: a",
    );
}

// TestUnlimitedWithRateLimitUnit
#[test]
fn unlimited_with_unit_is_refused() {
    assert_refused(
        "unlimited_with_unit.yaml",
        6,
        "descriptors[0].rate_limit.unit",
        "should not specify rate limit unit when unlimited",
    );
}

// TestShadowModeConfig
#[test]
fn shadowmode_config_loads_with_shadow_only_where_set() {
    let p = load("shadowmode_config.yaml");
    for (entries, expected) in [
        (
            &[("key1", "value1"), ("subkey1", "something")][..],
            (false, 5, Unit::Second),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            (true, 10, Unit::Second),
        ),
        (&[("key2", "something")], (true, 20, Unit::Minute)),
        (&[("key2", "value2")], (false, 30, Unit::Minute)),
    ] {
        match one(&p, entries) {
            Resolved::Limit(a) => assert_eq!(
                (a.shadow, a.envoy_limit.0, a.envoy_limit.1),
                expected,
                "{entries:?}"
            ),
            other => panic!("{other:?}"),
        }
    }
}

// TestWildcardConfig
#[test]
fn wildcard_config_matches_trailing_middle_and_multiple_stars() {
    let p = load("wildcard.yaml");
    let (n, _, a) = limit(&p, &[("noVal", "foo1")]);
    let (_, _, b) = limit(&p, &[("noVal", "foo2")]);
    assert_eq!(n, 20);
    assert_ne!(a, b, "a key alone keeps one budget per value");
    let (n, _, a) = limit(&p, &[("wild", "foo1")]);
    let (_, _, b) = limit(&p, &[("wild", "foo2")]);
    assert_eq!(n, 20);
    assert_ne!(
        a, b,
        "without share_threshold each matching value has its own budget"
    );
    assert_eq!(limit(&p, &[("nestedWild", "val1"), ("wild", "goo2")]).0, 20);
    no_rule(&p, &[("wild", "bar")]);
    no_rule(&p, &[("noWild", "foo1")]);
    for value in ["barab", "bar123b", "barb"] {
        assert_eq!(limit(&p, &[("midWild", value)]).0, 20, "{value}");
    }
    no_rule(&p, &[("midWild", "bara")]);
    no_rule(&p, &[("midWild", "xbarb")]);
    for value in ["foo123bar456baz", "foobarbaz"] {
        assert_eq!(limit(&p, &[("multiWild", value)]).0, 10, "{value}");
    }
    no_rule(&p, &[("multiWild", "foo123baz")]);
    no_rule(&p, &[("multiWild", "bar456baz")]);
}

/// Every descriptor of `cases` gets `requests` and one shared budget.
fn shared(p: &Policy, requests: u64, cases: &[&[(&str, &str)]]) {
    let keys: Vec<String> = cases
        .iter()
        .map(|entries| {
            let (n, _, key) = limit(p, entries);
            assert_eq!(n, requests, "{entries:?}");
            key
        })
        .collect();
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "{cases:?}: {keys:?}");
}

// TestShareThreshold
#[test]
fn share_threshold_gives_every_wildcard_match_one_budget() {
    let p = load("share_threshold.yaml");
    shared(
        &p,
        100,
        &[
            &[("files", "files/a.pdf")],
            &[("files", "files/b.csv")],
            &[("files", "files/c.txt")],
        ],
    );
    shared(
        &p,
        200,
        &[
            &[("nested", "parent"), ("files", "nested/file1.txt")],
            &[("nested", "parent"), ("files", "nested/file2.txt")],
        ],
    );
    shared(
        &p,
        300,
        &[
            &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
            &[("files", "top/x"), ("files", "nested/y")],
        ],
    );
    shared(
        &p,
        60,
        &[
            &[("route", "api/v1"), ("method", "GET")],
            &[("route", "api/v2"), ("method", "GET")],
        ],
    );
    assert_ne!(
        limit(&p, &[("route", "api/v1"), ("method", "GET")]).2,
        limit(&p, &[("route", "api/v1"), ("method", "POST")]).2,
        "the key-only level below still tells values apart"
    );
    match one(&p, &[("service", "svc/user"), ("endpoint", "get")]) {
        Resolved::Limit(a) => assert!(a.envoy_limit.0 == 80 && a.rule.detailed_metric()),
        other => panic!("{other:?}"),
    }
    // `path/*` shares, `file/*` below it does not.
    shared(
        &p,
        120,
        &[
            &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
            &[("path", "path/bar"), ("file", "file/doc1"), ("type", "pdf")],
        ],
    );
    assert_ne!(
        limit(
            &p,
            &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")]
        )
        .2,
        limit(
            &p,
            &[("path", "path/foo"), ("file", "file/doc2"), ("type", "pdf")]
        )
        .2,
    );
    shared(
        &p,
        150,
        &[
            &[("user", "user/1"), ("resource", "res/a"), ("action", "get")],
            &[("user", "user/2"), ("resource", "res/b"), ("action", "get")],
        ],
    );
    // An exact value still wins over a sharing wildcard.
    assert_eq!(limit(&p, &[("file", "test1")]).0, 50);
    shared(&p, 100, &[&[("file", "test2")], &[("file", "testABC")]]);
    assert_ne!(
        limit(&p, &[("file", "test1")]).2,
        limit(&p, &[("file", "test2")]).2
    );
    shared(
        &p,
        100,
        &[
            &[("midpath", "/api/v1")],
            &[("midpath", "/api-beta-v1")],
            &[("midpath", "/apiXYZv1")],
        ],
    );
    no_rule(&p, &[("midpath", "/api/v2")]);
    shared(
        &p,
        50,
        &[
            &[("multiroute", "svcAepBrpc")],
            &[("multiroute", "svcXXXepYYYrpc")],
            &[("multiroute", "svceprpc")],
        ],
    );
    no_rule(&p, &[("multiroute", "svcABCrpc")]);
    shared(
        &p,
        80,
        &[&[("midroute", "/api/v2")], &[("midroute", "/api-beta-v2")]],
    );
    shared(
        &p,
        60,
        &[
            &[("tenant", "t1prod"), ("resource", "resAv2")],
            &[("tenant", "t99prod"), ("resource", "resBBBv2")],
        ],
    );
}

// TestMetadata
#[test]
fn metadata_is_accepted_and_changes_no_limit() {
    let p = load("metadata.yaml");
    no_rule(&p, &[("key1", "value1")]);
    let (n, unit, _) = limit(&p, &[("key1", "value1"), ("subkey1", "something")]);
    assert_eq!((n, unit), (5, Unit::Second));
    let (n, unit, _) = limit(&p, &[("key2", "something")]);
    assert_eq!((n, unit), (20, Unit::Minute));
}

/// Every fixture config_test.go loads successfully, together in one directory
/// (as a deployment would hold them): none keeps the others from loading.
#[test]
fn the_accepted_fixtures_load_side_by_side() {
    let dir = dir_of(&[
        ("basic_config.yaml", "a.yaml"),
        ("shadowmode_config.yaml", "b.yaml"),
        ("wildcard.yaml", "c.yaml"),
        ("share_threshold.yaml", "d.yaml"),
        ("metadata.yaml", "e.yaml"),
    ]);
    let rename = |from: &str, domain: &str| {
        let path = dir.join(from);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("domain: test-domain", domain)).unwrap();
    };
    rename("b.yaml", "domain: b");
    rename("c.yaml", "domain: c");
    rename("d.yaml", "domain: d");
    rename("e.yaml", "domain: e");
    let p = Policy::load(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    let p = p.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        p.domains().collect::<Vec<_>>(),
        ["b", "c", "d", "e", "test-domain"]
    );
}

fn parse(text: &str) -> Policy {
    Policy::parse("inline.yaml", text).unwrap_or_else(|e| panic!("{e}"))
}

/// `(line, field, reason)` of the error `text` gives.
fn parse_error(text: &str) -> (u64, String, String) {
    refused(
        Policy::parse("inline.yaml", text).expect_err("refused"),
        "inline.yaml",
    )
}

/// README: "If the rate limit is not present and there are no nested
/// descriptors, then the descriptor is effectively whitelisted"; `GetLimit`
/// takes the `key_value` node before the key alone, limit or not.
#[test]
fn a_value_listed_without_rate_limit_is_exempt_from_its_keys_rule() {
    let p = parse(
        r#"
domain: test-domain
descriptors:
  - key: service
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 10 }
      - key: user
        value: batch
      - key: user
        value: admin
        descriptors:
          - key: action
            rate_limit: { unit: minute, requests_per_unit: 1 }
"#,
    );
    assert_eq!(limit(&p, &[("service", "s"), ("user", "alice")]).0, 10);
    no_rule(&p, &[("service", "s"), ("user", "batch")]);
    no_rule(&p, &[("service", "s"), ("user", "admin")]);
    assert_eq!(
        limit(&p, &[("service", "s"), ("user", "admin"), ("action", "x")]).0,
        1
    );
}

/// `constructLimitsToCheck` (src/service/ratelimit.go) gathers `replaces` from
/// every matched limit, unlimited ones included, then drops the named ones.
#[test]
fn replaces_of_an_unlimited_rule_still_drop_the_named_limit() {
    let p = parse(
        r#"
domain: test-domain
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: second, requests_per_unit: 5 }
  - key: vip
    rate_limit:
      unlimited: true
      replaces: [{ name: per_user }, { name: blocked }]
  - key: banned
    rate_limit: { name: blocked, unit: second, requests_per_unit: 0 }
"#,
    );
    let got = resolve_all(
        &p,
        &[
            descriptor(&[("user", "u")]),
            descriptor(&[("vip", "yes")]),
            descriptor(&[("banned", "u")]),
        ],
    );
    assert!(matches!(got[0], Resolved::Replaced(_)), "{got:?}");
    assert!(matches!(got[1], Resolved::Unlimited(_)), "{got:?}");
    assert!(matches!(got[2], Resolved::Replaced(_)), "{got:?}");
    let alone = resolve_all(&p, &[descriptor(&[("user", "u")])]);
    assert!(matches!(alone[0], Resolved::Limit(_)), "{alone:?}");
}

/// README example 10: `value_to_metric` per level, kept on the rule for metrics.
#[test]
fn value_to_metric_is_kept_on_the_rule_level_by_level() {
    let p = parse(
        r#"
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
"#,
    );
    match one(
        &p,
        &[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "1"),
        ],
    ) {
        Resolved::Limit(a) => {
            assert_eq!(a.envoy_limit.0, 60);
            assert_eq!(a.rule.value_to_metric(), [true, false, false]);
        }
        other => panic!("{other:?}"),
    }
    match one(&p, &[("user", "u")]) {
        Resolved::Limit(a) => assert_eq!(a.rule.value_to_metric(), [false]),
        other => panic!("{other:?}"),
    }
}

/// Fields of its schema with no effect on Tollgate's limits are read, not
/// refused: `quota_mode` is kept on the rule, `metadata` (any mapping) ignored.
#[test]
fn quota_mode_is_kept_and_metadata_accepted() {
    let p = parse(
        r#"
domain: test-domain
descriptors:
  - key: tenant
    quota_mode: true
    metadata:
      owner: { team: payments, tags: [a, 1, 2.5], 3: three }
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: other
    rate_limit: { unit: hour, requests_per_unit: 1 }
"#,
    );
    match one(&p, &[("tenant", "t")]) {
        Resolved::Limit(a) => {
            assert_eq!(a.envoy_limit, (100, Unit::Hour));
            assert!(a.rule.quota_mode());
        }
        other => panic!("{other:?}"),
    }
    match one(&p, &[("other", "t")]) {
        Resolved::Limit(a) => assert!(!a.rule.quota_mode()),
        other => panic!("{other:?}"),
    }
}

/// Its key check knows names, not places, and its decoder drops a field that
/// is not at its place: such a file loads there, and here, with no effect.
#[test]
fn a_known_key_out_of_place_is_ignored() {
    let p = parse(
        r#"
domain: test-domain
descriptors:
  - key: k
    unit: second
    rate_limit: { unit: minute, requests_per_unit: 3, shadow_mode: true, key: x }
"#,
    );
    match one(&p, &[("k", "v")]) {
        Resolved::Limit(a) => {
            assert_eq!(a.envoy_limit, (3, Unit::Minute));
            assert!(!a.shadow, "shadow_mode belongs to the descriptor");
        }
        other => panic!("{other:?}"),
    }
}

/// Go's YAML decoder reads null as the zero value and any scalar into a string
/// field; units are read case-insensitively; with `unlimited` only a unit it
/// can read is refused.
#[test]
fn nulls_scalars_and_units_read_as_envoyproxy_ratelimit_reads_them() {
    let p = parse(
        r#"
domain: test-domain
descriptors:
  - key: a
    value:
    rate_limit: { unit: SECOND, requests_per_unit: 7 }
    descriptors:
  - key: b
    rate_limit:
  - key: c
    value: 42
    rate_limit: { unlimited: true, unit: fortnight }
"#,
    );
    assert_eq!(limit(&p, &[("a", "x")]).0, 7);
    no_rule(&p, &[("b", "x")]);
    assert!(matches!(one(&p, &[("c", "42")]), Resolved::Unlimited(_)));
    no_rule(&p, &[("c", "43")]);
}

#[test]
fn values_it_cannot_read_are_refused_with_line_and_field() {
    let rpu = |n: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: {n}\n"
        )
    };
    // The largest count it reads; per minute, as Tollgate's quotas stop at one
    // request per nanosecond.
    let max = parse(&rpu("4294967295").replace("second", "minute"));
    assert_eq!(
        limit_in(&max, "d", &[("k", "v")]),
        (u64::from(u32::MAX), Unit::Minute)
    );
    let cases = [
        (
            rpu("4294967296"),
            6,
            "descriptors[0].rate_limit.requests_per_unit",
            "between 0 and 4294967295",
        ),
        (
            rpu("-1"),
            6,
            "descriptors[0].rate_limit.requests_per_unit",
            "between 0 and 4294967295",
        ),
        (
            rpu("1.5"),
            6,
            "descriptors[0].rate_limit.requests_per_unit",
            "error checking config: 1.5",
        ),
        (
            rpu("18446744073709551615"),
            6,
            "descriptors[0].rate_limit.requests_per_unit",
            "error checking config",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: 2.5\n".to_owned(),
            4,
            "descriptors[0].value",
            "error checking config: 2.5",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n"
                .to_owned(),
            5,
            "descriptors[0].share_threshold",
            "share_threshold can only be used with wildcard values",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n".to_owned(),
            4,
            "yaml",
            "",
        ),
        (
            "domain: d\nrules_of_thumb: 1\ndescriptors:\n".to_owned(),
            2,
            "rules_of_thumb",
            "unknown key 'rules_of_thumb'",
        ),
    ];
    for (text, line, field, reason) in cases {
        let (got_line, got_field, got_reason) = parse_error(&text);
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

fn limit_in(policy: &Policy, domain: &str, entries: &[(&str, &str)]) -> (u64, Unit) {
    let got = policy
        .resolve(&Request {
            domain,
            descriptors: &[descriptor(entries)],
            hits_addend: 1,
        })
        .expect("a valid request")
        .remove(0);
    match got {
        Resolved::Limit(a) => a.envoy_limit,
        other => panic!("{other:?}"),
    }
}

/// Tollgate's extensions to a `rate_limit` (keys envoyproxy/ratelimit
/// refuses): another algorithm, and a window of several units.
#[test]
fn a_rate_limit_may_name_an_algorithm_and_a_unit_multiplier() {
    let p = parse(
        "domain: test-domain
descriptors:
  - key: sliding
    rate_limit: { unit: minute, requests_per_unit: 10, algorithm: sliding-log }
  - key: half
    rate_limit: { unit: second, requests_per_unit: 10, unit_multiplier: 30 }
  - key: plain
    rate_limit: { unit: minute, requests_per_unit: 10, algorithm: fixed-window }
",
    );
    let applied = |key: &str| match one(&p, &[(key, "x")]) {
        Resolved::Limit(a) => a,
        other => panic!("{key}: {other:?}"),
    };
    let sliding = applied("sliding");
    assert_eq!(sliding.algorithm, tollgate_core::Algorithm::SlidingLog);
    assert_eq!(sliding.envoy_limit, (10, Unit::Minute));
    assert_eq!(sliding.rule.envoy_window(), None, "its own exact reset");
    assert!(sliding.rule.is_envoy());
    let half = applied("half");
    assert_eq!(half.algorithm, tollgate_core::Algorithm::FixedWindow);
    assert_eq!(half.quota.period(), std::time::Duration::from_secs(30));
    assert_eq!(half.quota.limit(), 10);
    // Envoy's answer names the smallest unit at least as long: 20 a minute.
    assert_eq!(half.envoy_limit, (20, Unit::Minute));
    assert_eq!(half.rule.envoy_window(), None);
    let plain = applied("plain");
    assert_eq!(plain.rule.envoy_window(), Some(Unit::Minute));
}

#[test]
fn extension_keys_are_checked_where_they_are_written() {
    for (text, line, field, reason) in [
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: concurrency\n",
            7,
            "descriptors[0].rate_limit.algorithm",
            "concurrency is not for envoyproxy/ratelimit's format",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky\n",
            7,
            "descriptors[0].rate_limit.algorithm",
            "unknown algorithm \"leaky\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      unit_multiplier: 0\n",
            7,
            "descriptors[0].rate_limit.unit_multiplier",
            "unit_multiplier must be a whole number from 1",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    algorithm: gcra\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
            4,
            "descriptors[0].algorithm",
            "algorithm belongs in rate_limit",
        ),
    ] {
        let e = Policy::parse("inline.yaml", text).expect_err(text);
        assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
        assert!(e.reason.contains(reason), "{e}");
    }
}
