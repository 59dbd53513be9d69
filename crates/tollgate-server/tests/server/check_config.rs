//! `tollgate check-config`, run as the real binary: what it accepts and
//! lists, what it refuses and how it reports every error, its JSON shape
//! and its exit status (0 valid, 1 invalid, 2 usage).

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{config_dir, tollgate};
use serde_json::Value;
use tollgate_policy::{ConfigFiles, Policy};

/// envoyproxy/ratelimit's config fixtures, as the policy crate's tests hold them.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tollgate-policy/tests/envoy")
        .join(name)
}

fn check(args: &[&str]) -> Output {
    tollgate()
        .arg("check-config")
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn json(args: &[&str]) -> (Option<i32>, Value) {
    let mut args = args.to_vec();
    args.extend(["--format", "json"]);
    let out = check(&args);
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    (out.status.code(), report)
}

/// `(file name, line, field, reason)` of each error of a JSON report.
fn errors(report: &Value) -> Vec<(String, u64, String, String)> {
    report["errors"]
        .as_array()
        .expect("errors is a list")
        .iter()
        .map(|e| {
            let file = Path::new(e["file"].as_str().unwrap());
            (
                file.file_name().unwrap().to_string_lossy().into_owned(),
                e["line"].as_u64().unwrap(),
                e["field"].as_str().unwrap().to_owned(),
                e["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

const NATIVE: &str = "\
domain: api
rules:
  - name: per-user
    match: [{ key: user }]
    algorithm: token-bucket
    limit: { requests: 100, per: 1m, burst: 20 }
  - name: login
    match: [{ key: path, value: /login }, { key: ip }]
    limit: { requests: 5, per: 10s }
    shadow: true
    failure: fail_closed
  - name: health
    match: [{ key: path, value: /healthz }]
    unlimited: true
";

const ENVOY: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: remote_address
    value: 10.0.0.1
    rate_limit:
      unit: minute
      requests_per_unit: 0
  - key: header_match
    value: bots
    detailed_metric: true
    rate_limit:
      name: bots
      replaces: [{ name: other }]
      unit: hour
      requests_per_unit: 7
";

/// `(domain, rule id)` of every rule the loader finds in `path`.
fn rules_of(path: &Path) -> BTreeSet<(String, String)> {
    let policy = Policy::load_files(path, ConfigFiles::default()).expect("a valid config");
    policy
        .domains()
        .flat_map(|d| {
            policy
                .rules(d)
                .iter()
                .map(move |r| (d.to_owned(), r.id().to_owned()))
        })
        .collect()
}

#[test]
fn a_valid_directory_of_both_formats_lists_every_rule_in_an_aligned_table() {
    let dir = config_dir(&[("api.yaml", NATIVE), ("edge.yaml", ENVOY)]);
    let path = dir.path().to_str().unwrap();
    let out = check(&[path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    let expected = rules_of(dir.path());
    assert_eq!(expected.len(), 6);
    assert_eq!(
        lines.len(),
        expected.len() + 1,
        "a header and a row per rule"
    );
    let header = lines[0];
    let listed: BTreeSet<(String, String)> = lines[1..]
        .iter()
        .map(|l| {
            let mut cells = l.split_whitespace();
            let domain = cells.next().unwrap().to_owned();
            (domain, cells.next().unwrap().to_owned())
        })
        .collect();
    assert_eq!(listed, expected);
    // Aligned: each column's cells start where its heading does.
    for heading in ["RULE", "PATH", "ALGORITHM", "LIMIT", "SOURCE"] {
        let at = header.find(heading).unwrap();
        for line in &lines[1..] {
            let before = line.chars().take(at).collect::<String>();
            assert!(
                before.ends_with("  ") && !line[before.len()..].starts_with(' '),
                "{heading} at column {at}:\n{text}"
            );
        }
    }
    let row = |rule: &str| {
        *lines
            .iter()
            .find(|l| l.split_whitespace().nth(1) == Some(rule))
            .unwrap()
    };
    let cells = |rule: &str| row(rule).split_whitespace().collect::<Vec<_>>();
    assert_eq!(
        cells("per-user")[2..8],
        ["user", "token-bucket", "100", "1m", "20", "local"]
    );
    assert!(row("login").contains("path=/login, ip"), "{text}");
    assert!(row("login").contains("shadow"), "{text}");
    assert!(row("login").contains("fail_closed"), "{text}");
    assert!(row("health").contains("unlimited"), "{text}");
    assert!(row("remote_address_10.0.0.1").contains("blocked"), "{text}");
    let bots = row("header_match_bots");
    for flag in ["detailed_metric", "replaces:other"] {
        assert!(bots.contains(flag), "{flag}: {text}");
    }
    assert!(
        stderr(&out).contains("valid, 6 rules in 2 domains"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn json_has_the_documented_shape_and_every_rule() {
    let dir = config_dir(&[("api.yaml", NATIVE), ("edge.yaml", ENVOY)]);
    let (code, report) = json(&[dir.path().to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert_eq!(report["valid"], true);
    assert_eq!(report["errors"], serde_json::json!([]));
    let rules = report["rules"].as_array().unwrap();
    let listed: BTreeSet<(String, String)> = rules
        .iter()
        .map(|r| {
            (
                r["domain"].as_str().unwrap().to_owned(),
                r["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(listed, rules_of(dir.path()));
    let keys: BTreeSet<&str> = [
        "domain",
        "rule",
        "name",
        "format",
        "path",
        "algorithm",
        "limit",
        "period",
        "burst",
        "failure",
        "flags",
        "source",
    ]
    .into();
    for rule in rules {
        let has: BTreeSet<&str> = rule
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(has, keys, "{rule}");
    }
    let find = |id: &str| rules.iter().find(|r| r["rule"] == id).unwrap();
    let per_user = find("per-user");
    assert_eq!(per_user["format"], "native");
    assert_eq!(per_user["algorithm"], "token-bucket");
    assert_eq!(
        (&per_user["limit"], &per_user["period"], &per_user["burst"]),
        (
            &serde_json::json!(100),
            &serde_json::json!("1m"),
            &serde_json::json!(20)
        )
    );
    assert_eq!(
        find("login")["path"],
        serde_json::json!([{"key": "path", "value": "/login"}, {"key": "ip", "value": null}])
    );
    assert_eq!(find("login")["flags"], serde_json::json!(["shadow"]));
    let source = find("login")["source"].as_str().unwrap();
    assert!(source.ends_with("api.yaml:7"), "{source}");
    let blocked = find("remote_address_10.0.0.1");
    assert_eq!(blocked["format"], "envoy");
    assert_eq!(
        (&blocked["limit"], &blocked["period"]),
        (&serde_json::json!(0), &serde_json::json!("1m"))
    );
    assert_eq!(blocked["algorithm"], Value::Null);
    let bots = find("header_match_bots");
    assert_eq!(bots["name"], "bots");
    assert_eq!(bots["algorithm"], "fixed-window");
    assert_eq!(bots["period"], "1h");
    assert_eq!(
        bots["flags"],
        serde_json::json!(["detailed_metric", "replaces:other"])
    );
}

#[test]
fn two_bad_files_report_both_errors_with_line_and_field() {
    let bad_native = NATIVE.replace("per: 10s", "per: 10 parsecs");
    let bad_envoy = ENVOY.replace("unit: hour", "unit: fortnight");
    let dir = config_dir(&[
        ("a.yaml", &bad_native),
        ("b.yaml", &bad_envoy),
        (
            "c.yaml",
            "domain: fine\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 1, per: 1s }\n",
        ),
    ]);
    let path = dir.path().to_str().unwrap();
    let (code, report) = json(&[path]);
    assert_eq!(code, Some(1));
    assert_eq!(report["valid"], false);
    assert_eq!(
        report["rules"],
        serde_json::json!([]),
        "an invalid config runs no rules"
    );
    // Each as the loader reports it when the file is alone.
    let expected: Vec<_> = ["a.yaml", "b.yaml"]
        .iter()
        .map(|f| {
            let e = Policy::load(&dir.path().join(f)).expect_err("refused");
            ((*f).to_owned(), e.line, e.field, e.reason)
        })
        .collect();
    assert_eq!(errors(&report), expected);
    assert_eq!(
        expected
            .iter()
            .map(|e| (e.1, e.2.as_str()))
            .collect::<Vec<_>>(),
        [
            (9, "rules[1].limit.per"),
            (18, "descriptors[2].rate_limit.unit")
        ]
    );

    let out = check(&[path]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.starts_with("FILE"), "{text}");
    for (file, line, field, reason) in &expected {
        let row = text
            .lines()
            .find(|l| l.contains(file.as_str()))
            .unwrap_or_else(|| panic!("{file}: {text}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1], line.to_string(), "{row}");
        assert_eq!(cells[3], field, "{row}");
        assert!(row.ends_with(reason.as_str()), "{row}");
    }
    assert!(
        stderr(&out).contains("invalid, 2 errors in 2 files"),
        "{}",
        stderr(&out)
    );
}

/// A native file with two independent errors.
const NATIVE_ERRORS: &str = "\
domain: api
rules:
  - name: per-user
    match: [{ key: user }]
    limit: { requests: 100, per: 10 parsecs }
  - name: login
    match: [{ key: path, value: /login }]
    limit: { requests: 5, per: 10s }
  - name: search
    match: [{ key: path, value: /search }]
    algorithm: quantum
    limit: { requests: 5, per: 10s }
";

/// An envoyproxy/ratelimit file with three independent errors, and a bad
/// unit nested under the first (left out with the refused descriptor).
const ENVOY_ERRORS: &str = "\
domain: edge
descriptors:
  - key: a
    rate_limit:
      unit: fortnight
      requests_per_unit: 10
    descriptors:
      - key: inner
        rate_limit: { unit: eon, requests_per_unit: 1 }
  - key: b
    rate_limit:
      unit: second
      requests_per_unit: -1
  - key: c
    rate_limit:
      unit: minute
      requests_per_unit: 5
      algorithm: concurrency
  - key: d
    rate_limit: { unit: second, requests_per_unit: 1 }
";

/// Every error of a file is reported, not only its first, in the table and
/// in JSON, each with its line and field; the first of each file is the
/// error serve reports for it. A refused descriptor is left out with its
/// nested descriptors, so nothing is reported twice or as a consequence.
#[test]
fn every_error_of_each_file_is_reported_not_only_the_first() {
    let dir = config_dir(&[("api.yaml", NATIVE_ERRORS), ("edge.yaml", ENVOY_ERRORS)]);
    let path = dir.path().to_str().unwrap();
    let expected = [
        ("api.yaml", 5, "rules[0].limit.per", "10 parsecs"),
        ("api.yaml", 11, "rules[2].algorithm", "quantum"),
        (
            "edge.yaml",
            5,
            "descriptors[0].rate_limit.unit",
            "invalid rate limit unit \"fortnight\"",
        ),
        (
            "edge.yaml",
            13,
            "descriptors[1].rate_limit.requests_per_unit",
            "not -1",
        ),
        (
            "edge.yaml",
            18,
            "descriptors[2].rate_limit.algorithm",
            "concurrency is not for envoyproxy/ratelimit's format",
        ),
    ];

    let (code, report) = json(&[path]);
    assert_eq!(code, Some(1));
    assert_eq!(report["valid"], false);
    assert_eq!(report["rules"], serde_json::json!([]));
    let got = errors(&report);
    assert_eq!(got.len(), expected.len(), "{got:#?}");
    for (error, (file, line, field, says)) in got.iter().zip(expected) {
        assert_eq!(
            (error.0.as_str(), error.1, error.2.as_str()),
            (file, line, field),
            "{got:#?}"
        );
        assert!(error.3.contains(says), "{:?} should say {says:?}", error.3);
    }
    for name in ["api.yaml", "edge.yaml"] {
        let served = Policy::load(&dir.path().join(name)).expect_err("refused");
        let first = got.iter().find(|e| e.0 == name).unwrap();
        assert_eq!(
            (served.line, &served.field, &served.reason),
            (first.1, &first.2, &first.3),
            "{name}: the load path reports the first"
        );
    }

    let out = check(&[path]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("FILE"), "{text}");
    assert_eq!(lines.len(), 1 + expected.len(), "{text}");
    for (row, (file, line, field, says)) in lines[1..].iter().zip(expected) {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert!(cells[0].ends_with(file), "{row}");
        assert_eq!(cells[1], line.to_string(), "{row}");
        assert_eq!(cells[3], field, "{row}");
        assert!(row.contains(says), "{row}");
    }
    assert!(
        stderr(&out).contains("invalid, 5 errors in 2 files"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_domain_defined_twice_names_both_files() {
    let other = NATIVE.replace("name: per-user", "name: someone");
    let dir = config_dir(&[("a.yaml", NATIVE), ("b.yaml", &other)]);
    let (code, report) = json(&[dir.path().to_str().unwrap()]);
    assert_eq!(code, Some(1));
    let errors = errors(&report);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let (file, line, field, reason) = &errors[0];
    assert_eq!(
        (file.as_str(), *line, field.as_str()),
        ("b.yaml", 1, "domain")
    );
    assert!(reason.contains("duplicate domain \"api\""), "{reason}");
    assert!(reason.contains("a.yaml"), "{reason}");
}

#[test]
fn paths_given_together_must_not_share_a_domain() {
    // Both fixtures are envoyproxy/ratelimit's domain `test-domain`; each
    // loads alone (TestBasicConfig, TestShadowModeConfig).
    let basic = fixture("basic_config.yaml");
    let shadow = fixture("shadowmode_config.yaml");
    for path in [&basic, &shadow] {
        assert_eq!(check(&[path.to_str().unwrap()]).status.code(), Some(0));
    }
    let (code, report) = json(&[basic.to_str().unwrap(), shadow.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    let errors = errors(&report);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let (file, _, field, reason) = &errors[0];
    assert_eq!(
        (file.as_str(), field.as_str()),
        ("shadowmode_config.yaml", "domain")
    );
    assert!(reason.contains("basic_config.yaml"), "{reason}");
}

/// envoyproxy/ratelimit's refused fixtures in one directory: every one is
/// reported, each first at the line and field, and for the reason, that its
/// `test/config/config_test.go` expects (as `tollgate-policy`'s
/// `tests/envoy.rs` asserts them), and the duplicate domain across files too.
#[test]
fn every_refused_envoy_fixture_is_reported_at_once() {
    let refused = [
        // TestEmptyDomain
        (
            "empty_domain.yaml",
            0,
            "domain",
            "config file cannot have empty domain",
        ),
        // TestEmptyKey
        (
            "empty_key.yaml",
            3,
            "descriptors[0].key",
            "descriptor has empty key",
        ),
        // TestDuplicateKey
        (
            "duplicate_key.yaml",
            6,
            "descriptors[1].key",
            "duplicate descriptor composite key \"key1_value1\"",
        ),
        // TestBadLimitUnit
        (
            "bad_limit_unit.yaml",
            6,
            "descriptors[0].rate_limit.unit",
            "invalid rate limit unit \"foo\"",
        ),
        // TestReplacesSelf
        (
            "replaces_self.yaml",
            8,
            "descriptors[0].descriptors[0].rate_limit.replaces",
            "replaces should not contain name of same descriptor",
        ),
        // TestReplacesEmpty
        (
            "replaces_empty.yaml",
            8,
            "descriptors[0].descriptors[0].rate_limit.replaces",
            "should not have an empty replaces entry",
        ),
        // TestMisspelledKey
        (
            "misspelled_key.yaml",
            5,
            "descriptors[0].ratelimit",
            "unknown key 'ratelimit'",
        ),
        (
            "misspelled_key2.yaml",
            7,
            "descriptors[0].rate_limit.requestsperunit",
            "unknown key 'requestsperunit'",
        ),
        // TestNonStringKey
        (
            "non_string_key.yaml",
            1,
            "0.25",
            "key is not of type string: 0.25",
        ),
        // TestNonMapList
        (
            "non_map_list.yaml",
            3,
            "descriptors[0]",
            "list of type other than map: a",
        ),
        // TestUnlimitedWithRateLimitUnit
        (
            "unlimited_with_unit.yaml",
            6,
            "descriptors[0].rate_limit.unit",
            "should not specify rate limit unit when unlimited",
        ),
    ];
    let mut files: Vec<(&str, String)> = refused
        .iter()
        .map(|(name, ..)| (*name, std::fs::read_to_string(fixture(name)).unwrap()))
        .collect();
    // TestBadYaml: refused as YAML, at a line in the file.
    files.push((
        "bad_yaml.yaml",
        std::fs::read_to_string(fixture("bad_yaml.yaml")).unwrap(),
    ));
    // TestDuplicateDomain: each loads alone; together, the second is refused.
    for name in ["basic_config.yaml", "duplicate_domain.yaml"] {
        files.push((name, std::fs::read_to_string(fixture(name)).unwrap()));
    }
    let borrowed: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let dir = config_dir(&borrowed);
    let (code, report) = json(&[dir.path().to_str().unwrap()]);
    assert_eq!(code, Some(1));
    let got = errors(&report);
    // Every error of a file: non_map_list.yaml's three elements are each
    // refused (its loader stops at the first, which comes first).
    let non_map: Vec<_> = got
        .iter()
        .filter(|e| e.0 == "non_map_list.yaml")
        .map(|e| (e.1, e.2.as_str(), e.3.rsplit(": ").next().unwrap()))
        .collect();
    assert_eq!(
        non_map,
        [
            (3, "descriptors[0]", "a"),
            (4, "descriptors[1]", "b"),
            (5, "descriptors[2]", "c")
        ]
    );
    assert_eq!(got.len(), refused.len() + 2 + 2, "{got:#?}");
    for (name, line, field, reason) in refused {
        let (_, got_line, got_field, got_reason) = got
            .iter()
            .find(|e| e.0 == name)
            .unwrap_or_else(|| panic!("{name} is reported: {got:#?}"));
        assert_eq!(
            (*got_line, got_field.as_str()),
            (line, field),
            "{name}: {got_reason}"
        );
        assert!(
            got_reason.contains(reason),
            "{name}: {got_reason:?} should say {reason:?}"
        );
    }
    let bad_yaml = got.iter().find(|e| e.0 == "bad_yaml.yaml").unwrap();
    assert!(bad_yaml.1 >= 1 && bad_yaml.2 == "yaml", "{bad_yaml:?}");
    // Reported last: what the files that loaded refuse together.
    let (file, line, field, reason) = got.last().unwrap();
    assert_eq!(
        (file.as_str(), *line, field.as_str()),
        ("duplicate_domain.yaml", 1, "domain")
    );
    assert!(
        reason.contains("duplicate domain \"test-domain\""),
        "{reason}"
    );
}

// TestDomainMerge: with MERGE_DOMAIN_CONFIG (serve's --merge-domains), the
// two files make one domain; without it, the second is refused.
#[test]
fn merge_domains_merges_as_serve_does() {
    let files: Vec<(&str, String)> = ["merge_domain_key1.yaml", "merge_domain_key2.yaml"]
        .iter()
        .map(|n| (*n, std::fs::read_to_string(fixture(n)).unwrap()))
        .collect();
    let borrowed: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let dir = config_dir(&borrowed);
    let path = dir.path().to_str().unwrap();
    let (code, report) = json(&[path]);
    assert_eq!(code, Some(1));
    let got = errors(&report);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0.as_str(), got[0].1, got[0].2.as_str()),
        ("merge_domain_key2.yaml", 1, "domain")
    );

    let (code, report) = json(&[path, "--merge-domains"]);
    assert_eq!(code, Some(0), "{report}");
    let merged =
        Policy::load_files(dir.path(), ConfigFiles::default().merge_domains(true)).unwrap();
    let ids: Vec<&str> = report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rule"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = merged.rules("test-domain").iter().map(|r| r.id()).collect();
    assert_eq!(ids, expected);
    assert_eq!(ids.len(), 2);
}

#[test]
fn ignore_dot_files_skips_what_envoyproxy_ratelimit_skips() {
    let dir = config_dir(&[("api.yaml", NATIVE), (".draft.yaml", "domain: [")]);
    let path = dir.path().to_str().unwrap();
    let (code, report) = json(&[path]);
    assert_eq!(code, Some(1));
    assert_eq!(errors(&report)[0].0, ".draft.yaml");
    let (code, report) = json(&[path, "--ignore-dot-files"]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["rules"].as_array().unwrap().len(), 3);
}

#[test]
fn a_config_without_rules_is_refused_unless_allowed_as_serve_does() {
    let dir = config_dir(&[]);
    let path = dir.path().to_str().unwrap();
    let (code, report) = json(&[path]);
    assert_eq!(code, Some(1));
    let got = errors(&report);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].1, got[0].2.as_str()), (0, "rules"));
    assert!(got[0].3.contains("no rules"), "{got:?}");
    let (code, report) = json(&[path, "--allow-empty-config"]);
    assert_eq!(code, Some(0), "{report}");
}

/// A quota the memory store holds but the Redis store cannot (a limit past
/// 2^52): refused with `--store redis`, or when the config's `store:` section
/// names Redis, without connecting to it.
#[test]
fn limits_are_checked_against_the_store_serve_would_use() {
    let huge = 5_000_000_000_000_000_u64;
    let rule = format!(
        "domain: big\nrules:\n  - name: small\n    match: [{{ key: a }}]\n    limit: {{ requests: 1, per: 1s }}\n  - name: huge\n    match: [{{ key: b }}]\n    limit: {{ requests: {huge}, per: 2400h }}\n"
    );
    let dir = config_dir(&[("big.yaml", &rule)]);
    let path = dir.path().to_str().unwrap();
    let (code, report) = json(&[path]);
    assert_eq!(code, Some(0), "the memory store holds it: {report}");
    let (code, report) = json(&[path, "--store", "redis"]);
    assert_eq!(code, Some(1));
    let got = errors(&report);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].0.as_str(), got[0].1, got[0].2.as_str()),
        ("big.yaml", 6, "rules[1].limit")
    );
    assert!(
        got[0].3.contains("\"huge\"") && got[0].3.contains("Redis"),
        "{got:?}"
    );

    // Nothing listens on port 1: the check never connects.
    let with_store = format!("store: {{ redis: \"redis://127.0.0.1:1\" }}\n{rule}");
    std::fs::write(dir.path().join("big.yaml"), with_store).unwrap();
    let (code, report) = json(&[path]);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!(errors(&report)[0].1, 7);
    let (code, _) = json(&[path, "--store", "memory"]);
    assert_eq!(code, Some(0));
}

#[test]
fn a_missing_path_is_an_error_and_no_path_a_usage_error() {
    let dir = config_dir(&[]);
    let missing = dir.path().join("nope.yaml");
    let (code, report) = json(&[missing.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    let got = errors(&report);
    assert_eq!(
        (got[0].0.as_str(), got[0].2.as_str()),
        ("nope.yaml", "file")
    );
    let out = check(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
}

// TestMetadataConfig's fixture: the rules with `metadata` carry the flag.
#[test]
fn metadata_is_a_flag() {
    let path = fixture("metadata.yaml");
    let (code, report) = json(&[path.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{report}");
    let policy = Policy::load(&path).unwrap();
    let expected: BTreeSet<String> = policy
        .rules("test-domain")
        .iter()
        .filter(|r| r.metadata().is_some())
        .map(|r| r.id().to_owned())
        .collect();
    assert!(!expected.is_empty());
    let flagged: BTreeSet<String> = report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["flags"]
                .as_array()
                .unwrap()
                .contains(&Value::from("metadata"))
        })
        .map(|r| r["rule"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(flagged, expected);
}
