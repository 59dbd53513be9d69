//! `tollgate simulate`, run as the real binary; its preview also on what a
//! real `tollgate serve --record` recorded.

use crate::common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const FIELDS: [&str; 7] = [
    "algorithm",
    "requests",
    "admitted",
    "denied",
    "false_admits",
    "false_denies",
    "max_in_period",
];

const ALGORITHMS: [&str; 7] = [
    "token-bucket",
    "gcra",
    "leaky-bucket",
    "leaky-bucket-shaping",
    "fixed-window",
    "sliding-log",
    "sliding-counter",
];

/// Two keys, limit 2 per second: `a` crosses a window edge, `b` stays under.
const TRACE: &str = "\
# limit 2 per second
900000000 a
900000000 a
1000000000 a
1000000001 a

1200000000 b 1
1500000000 b
";

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

/// A file in the test's scratch directory holding `text`.
fn file(name: &str, text: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("simulate-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = tollgate()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The process may exit before reading everything (on a bad line).
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

/// The error output of a run that must have failed.
fn failed(output: &Output) -> String {
    assert!(!output.status.success());
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// Parses JSON lines, checking each has exactly the agreed fields in order.
fn json_lines(text: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    text.lines()
        .map(|line| {
            let object: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(line).unwrap();
            let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
            keys.sort_unstable();
            let mut want = FIELDS.to_vec();
            want.sort_unstable();
            assert_eq!(keys, want, "{line}");
            let positions: Vec<usize> = FIELDS
                .iter()
                .map(|f| line.find(&format!("\"{f}\":")).unwrap())
                .collect();
            assert!(positions.is_sorted(), "fields out of order: {line}");
            assert!(object["algorithm"].is_string());
            for field in &FIELDS[1..] {
                assert!(object[*field].is_u64(), "{field} in {line}");
            }
            object
        })
        .collect()
}

fn number(object: &serde_json::Map<String, serde_json::Value>, field: &str) -> u64 {
    object[field].as_u64().unwrap()
}

#[test]
fn json_lines_have_exactly_the_agreed_fields() {
    let path = file("trace", TRACE);
    let output = tollgate()
        .args(["simulate", "--trace"])
        .arg(&path)
        .args([
            "--algorithm",
            "all",
            "--limit",
            "2",
            "--period",
            "1s",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let lines = json_lines(&stdout(&output));
    let names: Vec<&str> = lines
        .iter()
        .map(|o| o["algorithm"].as_str().unwrap())
        .collect();
    assert_eq!(names, ALGORITHMS);
    for line in &lines {
        assert_eq!(number(line, "requests"), 6);
        assert_eq!(
            number(line, "admitted") + number(line, "denied"),
            6,
            "{line:?}"
        );
    }
    let by_name = |name: &str| lines.iter().find(|o| o["algorithm"] == name).unwrap();
    let log = by_name("sliding-log");
    assert_eq!(number(log, "false_admits") + number(log, "false_denies"), 0);
    assert_eq!(number(log, "admitted"), 4);
    assert_eq!(number(log, "max_in_period"), 2);
    let fixed = by_name("fixed-window");
    assert_eq!(number(fixed, "false_admits"), 2);
    assert_eq!(number(fixed, "max_in_period"), 4);
}

#[test]
fn dash_reads_the_trace_from_stdin() {
    let args = [
        "simulate",
        "--algorithm",
        "fixed-window",
        "--limit",
        "2",
        "--period",
        "1s",
        "--format",
        "json",
        "--trace",
    ];
    let path = file("stdin-trace", TRACE);
    let from_file = stdout(&tollgate().args(args).arg(&path).output().unwrap());
    let from_stdin = stdout(&run(&[&args[..], &["-"]].concat(), TRACE));
    assert_eq!(from_stdin, from_file);
    assert_eq!(json_lines(&from_stdin).len(), 1);
}

#[test]
fn a_bad_line_fails_with_its_number() {
    let trace = "1 a\n2 b\n\n3 c 1 extra\n";
    let output = run(
        &[
            "simulate",
            "--trace",
            "-",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--period",
            "1s",
        ],
        trace,
    );
    let stderr = failed(&output);
    assert!(stderr.contains("line 4"), "{stderr}");
    assert!(stderr.contains("3 c 1 extra"), "{stderr}");
    assert!(output.stdout.is_empty());

    let path = file("unsorted", "5 a\n4 a\n");
    let output = tollgate()
        .args([
            "simulate",
            "--algorithm",
            "all",
            "--limit",
            "1",
            "--period",
            "1s",
            "--trace",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = failed(&output);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(stderr.contains("sorted"), "{stderr}");
}

#[test]
fn bad_quotas_and_durations_are_explained() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--limit", "0", "--period", "1s"],
            "limit must be at least 1",
        ),
        (
            &["--limit", "1", "--period", "0s"],
            "period must be longer than zero",
        ),
        (
            &["--limit", "1", "--period", "1s", "--burst", "0"],
            "burst must be at least 1",
        ),
        (&["--limit", "1", "--period", "1x"], "unknown unit"),
    ];
    for (quota, message) in cases {
        let output = run(
            &[&["simulate", "--trace", "-", "--algorithm", "gcra"], quota].concat(),
            "",
        );
        assert!(!output.status.success(), "{quota:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains(message), "{quota:?}: {stderr}");
    }
}

#[test]
fn an_empty_trace_is_zero_requests() {
    let output = run(
        &[
            "simulate",
            "--trace",
            "-",
            "--algorithm",
            "all",
            "--limit",
            "1",
            "--period",
            "1s",
            "--format",
            "json",
        ],
        "# nothing\n",
    );
    for line in json_lines(&stdout(&output)) {
        assert_eq!(number(&line, "requests"), 0);
    }
}

#[test]
fn generated_boundary_attack_doubles_the_fixed_window() {
    let generated = stdout(
        &tollgate()
            .args([
                "simulate",
                "--generate",
                "boundary-attack",
                "--duration",
                "10s",
                "--seed",
                "7",
            ])
            .output()
            .unwrap(),
    );
    assert!(generated.starts_with("# tollgate simulate --generate boundary-attack"));
    let again = stdout(
        &tollgate()
            .args([
                "simulate",
                "--generate",
                "boundary-attack",
                "--duration",
                "10s",
                "--seed",
                "7",
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(generated, again, "the same seed gives the same trace");

    let chart = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("simulate-{}-attack.svg", std::process::id()));
    let output = run(
        &[
            "simulate",
            "--trace",
            "-",
            "--algorithm",
            "all",
            "--limit",
            "100",
            "--period",
            "1s",
            "--format",
            "json",
            "--chart",
            chart.to_str().unwrap(),
        ],
        &generated,
    );
    let lines = json_lines(&stdout(&output));
    let max = |name: &str| {
        number(
            lines.iter().find(|o| o["algorithm"] == name).unwrap(),
            "max_in_period",
        )
    };
    assert_eq!(max("fixed-window"), 200);
    assert_eq!(max("sliding-log"), 100);
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.contains("<svg") && svg.contains("admitted: fixed-window"));
}

#[test]
fn the_table_is_the_default() {
    let output = run(
        &[
            "simulate",
            "--trace",
            "-",
            "--algorithm",
            "gcra",
            "--limit",
            "2",
            "--period",
            "1s",
        ],
        TRACE,
    );
    let text = stdout(&output);
    assert!(text.contains("algorithm"), "{text}");
    assert!(text.contains("false admits"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("gcra ")), "{text}");
}

/// `api`'s per-user limit before the change: 3 a minute.
const OLD: &str = "
domain: api
rules:
  - name: per-user
    match: [{ key: user }]
    algorithm: fixed-window
    limit: { requests: 3, per: 1m }
";

/// After: 2 a minute.
const NEW: &str = "
domain: api
rules:
  - name: per-user
    match: [{ key: user }]
    algorithm: fixed-window
    limit: { requests: 2, per: 1m }
";

/// One request of user `user` at `time` (RFC 3339) in `/v1/check`'s shape.
fn request_line(time: &str, user: &str) -> String {
    format!(
        r#"{{"time":"{time}","domain":"api","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    ) + "\n"
}

/// Five requests within one minute: user 1 sends four, user 2 one. The old
/// limit admits user 1's first three, the new one its first two: one
/// request, user 1's third, is newly denied.
fn five_requests() -> String {
    [
        request_line("2026-11-24T10:00:00.100Z", "1"),
        request_line("2026-11-24T10:00:01Z", "2"),
        request_line("2026-11-24T10:00:02Z", "1"),
        request_line("2026-11-24T10:00:03.5Z", "1"),
        request_line("2026-11-24T10:00:59.999Z", "1"),
    ]
    .concat()
}

fn preview(args: &[&str], files: &[&PathBuf]) -> Output {
    let mut command = tollgate();
    command.arg("simulate");
    let mut files = files.iter();
    for arg in args {
        match *arg {
            "{}" => command.arg(files.next().unwrap()),
            arg => command.arg(arg),
        };
    }
    command.output().unwrap()
}

#[test]
fn a_preview_counts_per_rule_what_the_change_would_deny() {
    let old = file("old.yaml", OLD);
    let new = file("new.yaml", NEW);
    let requests = file("five.ndjson", &five_requests());
    let output = preview(
        &["--policy", "{}", "--baseline", "{}", "--requests", "{}"],
        &[&new, &old, &requests],
    );
    let table = stdout(&output);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("5 requests; admitted: 4 under ")
            && lines[0].ends_with("newly denied 1, newly admitted 0"),
        "{table}"
    );
    let header: Vec<&str> = lines[1].split("  ").filter(|c| !c.is_empty()).collect();
    assert_eq!(
        header,
        [
            "DOMAIN",
            "RULE",
            "REQUESTS",
            "ADMITTED BEFORE",
            "ADMITTED AFTER",
            "NEWLY DENIED",
            "NEWLY ADMITTED"
        ]
    );
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(row, ["api", "per-user", "5", "4", "3", "1", "0"], "{table}");
    assert!(
        table.ends_with(
            "\nTop keys of api per-user:\n  KEY     NEWLY DENIED  NEWLY ADMITTED\n  user=1             1               0\n"
        ),
        "{table}"
    );
}

#[test]
fn a_preview_in_json_is_one_document() {
    let old = file("old-json.yaml", OLD);
    let new = file("new-json.yaml", NEW);
    let requests = file("five-json.ndjson", &five_requests());
    // Swapped: going from 2 to 3 a minute newly admits user 1's third.
    let output = preview(
        &[
            "--policy",
            "{}",
            "--baseline",
            "{}",
            "--requests",
            "{}",
            "--format",
            "json",
        ],
        &[&old, &new, &requests],
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["policy"], old.display().to_string());
    assert_eq!(report["baseline"], new.display().to_string());
    assert_eq!(
        [
            "requests",
            "skipped",
            "admitted_baseline",
            "admitted_new",
            "newly_denied",
            "newly_admitted"
        ]
        .map(|f| report[f].as_u64().unwrap()),
        [5, 0, 3, 4, 0, 1]
    );
    assert_eq!(
        report["rules"],
        serde_json::json!([{
            "domain": "api",
            "rule": "per-user",
            "requests": 5,
            "admitted_baseline": 3,
            "admitted_new": 4,
            "newly_denied": 0,
            "newly_admitted": 1,
            "top_keys": [{"key": "user=1", "newly_denied": 0, "newly_admitted": 1}]
        }])
    );
}

/// envoyproxy/ratelimit's format: 2 a minute per client address.
const EDGE: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 2
";

/// Envoy's default access log format, one line.
fn access_line(time: &str, forwarded_for: &str) -> String {
    format!(
        "[{time}] \"GET /items HTTP/1.1\" 200 - 0 17 3 2 \"{forwarded_for}\" \"curl/8.5.0\" \"7d1c5e0a-3b5f\" \"api.example.com\" \"10.1.2.3:8080\"\n"
    )
}

#[test]
fn access_logs_preview_with_the_descriptor_they_are_told_to_make() {
    let policy = file("edge.yaml", EDGE);
    let log = [
        access_line("2026-11-24T10:00:00.001Z", "198.51.100.7, 203.0.113.9"),
        access_line("2026-11-24T10:00:00.002Z", "-"),
        access_line("2026-11-24T10:00:00.003Z", "203.0.113.9"),
        access_line("2026-11-24T10:00:00.004Z", "198.51.100.7, 203.0.113.9"),
        access_line("2026-11-24T10:00:00.005Z", "198.51.100.7"),
    ]
    .concat();
    let log = file("access.log", &log);
    let output = preview(
        &[
            "--policy",
            "{}",
            "--requests",
            "{}",
            "--access-log-domain",
            "edge",
            "--access-log-entry",
            "remote_address=client",
            "--format",
            "json",
        ],
        &[&policy, &log],
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    // No baseline: every request admitted before. 203.0.113.9 (the last
    // address) sends three, its third denied; the line with no address
    // makes no request.
    assert_eq!(report["baseline"], serde_json::Value::Null);
    assert_eq!(
        [
            "requests",
            "skipped",
            "admitted_baseline",
            "admitted_new",
            "newly_denied"
        ]
        .map(|f| report[f].as_u64().unwrap()),
        [4, 1, 4, 3, 1]
    );
    assert_eq!(report["rules"][0]["rule"], "remote_address");
    assert_eq!(
        report["rules"][0]["top_keys"],
        serde_json::json!([{"key": "remote_address=203.0.113.9", "newly_denied": 1, "newly_admitted": 0}])
    );
}

#[test]
fn a_bad_request_line_fails_with_its_file_and_line() {
    let policy = file("new-bad.yaml", NEW);
    let requests = file(
        "bad.ndjson",
        &(request_line("2026-11-24T10:00:00Z", "1")
            + "# a comment\n"
            + r#"{"ts_ns":5,"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}],"hits":2}]}"#
            + "\n"),
    );
    let output = preview(
        &["--policy", "{}", "--requests", "{}"],
        &[&policy, &requests],
    );
    let stderr = failed(&output);
    assert!(
        stderr.contains(&format!("{}:3: unknown field `hits`", requests.display())),
        "{stderr}"
    );

    let log = file(
        "bad.log",
        &(access_line("2026-11-24T10:00:00Z", "203.0.113.9") + "GET /\n"),
    );
    let output = preview(
        &[
            "--policy",
            "{}",
            "--requests",
            "{}",
            "--access-log-domain",
            "api",
            "--access-log-entry",
            "user=header:x-request-id",
        ],
        &[&policy, &log],
    );
    let stderr = failed(&output);
    assert!(
        stderr.contains(&format!(
            "{}:2: expected Envoy's default access log format",
            log.display()
        )),
        "{stderr}"
    );
}

/// Per day, so that no window ends while a test runs: `api` in Tollgate's
/// format, 3 per user; `edge` in envoyproxy/ratelimit's, 2 per address and 1
/// per path, counted each hit as that service counts.
const DAILY_API: &str = "
domain: api
rules:
  - name: per-user
    match: [{ key: user }]
    algorithm: fixed-window
    limit: { requests: 3, per: 1d }
";

const DAILY_EDGE: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: day
      requests_per_unit: 2
  - key: path
    rate_limit:
      unit: day
      requests_per_unit: 1
";

/// The lines of `path` once it has `count` of them, waiting (bounded) for
/// the recorder to write them.
async fn recorded_lines(path: &std::path::Path, count: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + common::STARTUP;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= count || std::time::Instant::now() > deadline {
            return text.lines().map(str::to_owned).collect();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_recording_previews_to_what_the_service_answered() {
    let recording = tempfile::tempdir().unwrap();
    let path = recording.path().join("requests.ndjson");
    let server = common::Server::with_config(
        &[("api.yaml", DAILY_API), ("edge.yaml", DAILY_EDGE)],
        &["--record", path.to_str().unwrap()],
    );
    let api = |user: &str| serde_json::json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": user}]}]});
    let edge = |ip: &str, path: &str| {
        serde_json::json!({"domain": "edge", "descriptors": [
            {"entries": [{"key": "remote_address", "value": ip}]},
            {"entries": [{"key": "path", "value": path}]}
        ]})
    };
    // envoyproxy/ratelimit's domain through its door, `/json`.
    let bodies = [
        ("/v1/check", api("a")),
        ("/v1/check", api("a")),
        ("/v1/check", api("b")),
        ("/v1/check", api("a")),
        ("/v1/check", api("a")),
        ("/v1/check", api("b")),
        ("/v1/check", api("a")),
        ("/json", edge("10.0.0.1", "/a")),
        ("/json", edge("10.0.0.1", "/a")),
        ("/json", edge("10.0.0.1", "/b")),
        ("/json", edge("10.0.0.1", "/c")),
    ];
    let client = reqwest::Client::new();
    // An ad-hoc check has no domain: not recorded. Recorded, it would be
    // the first line, before the policy checks' (one queue, in order).
    let adhoc = client
        .post(server.url("/v1/check"))
        .body(r#"{"key":"k","limit":1,"period":"1s"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(adhoc.status(), 200);
    let mut admitted = 0;
    for (door, body) in &bodies {
        let status = client
            .post(server.url(door))
            .body(body.to_string())
            .send()
            .await
            .unwrap()
            .status();
        assert!(status == 200 || status == 429, "{status}");
        admitted += u64::from(status == 200);
    }
    // a: 3 of 5, b: 2; edge: the first only, since each hit counts (the
    // second is denied by /a and still spends the address's second).
    assert_eq!(admitted, 6);
    let lines = recorded_lines(&path, bodies.len()).await;
    assert_eq!(lines.len(), bodies.len(), "{}", server.log());

    let config = server.config.as_ref().unwrap().path().to_path_buf();
    let output = preview(
        &["--policy", "{}", "--requests", "{}", "--format", "json"],
        &[&config, &path],
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(report["requests"], 11);
    assert_eq!(report["admitted_new"], admitted);
    assert_eq!(report["newly_denied"], 11 - admitted);
    let rules: Vec<(&str, &str, u64, u64)> = report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["domain"].as_str().unwrap(),
                r["rule"].as_str().unwrap(),
                r["requests"].as_u64().unwrap(),
                r["admitted_new"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rules,
        [
            ("api", "per-user", 7, 5),
            ("edge", "path", 4, 1),
            ("edge", "remote_address", 4, 1)
        ]
    );
}

#[tokio::test]
async fn a_recording_stops_at_its_bound_and_counts_the_rest() {
    let recording = tempfile::tempdir().unwrap();
    let path = recording.path().join("requests.ndjson");
    let server = common::Server::with_config(
        &[("api.yaml", DAILY_API)],
        &[
            "--record",
            path.to_str().unwrap(),
            "--record-max-bytes",
            "300",
        ],
    );
    let client = reqwest::Client::new();
    for user in 0..10 {
        let body = format!(
            r#"{{"domain":"api","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
        );
        let response = client
            .post(server.url("/v1/check"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert!(
        server
            .wait_for_log(
                &["recording stopped", "--record-max-bytes"],
                common::STARTUP
            )
            .await,
        "{}",
        server.log()
    );
    // Every check is written or counted as dropped.
    let deadline = std::time::Instant::now() + common::STARTUP;
    let (written, dropped) = loop {
        let metrics = client
            .get(server.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let value = |name: &str| -> u64 {
            metrics
                .lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or(0)
        };
        let counts = (
            value("tollgate_record_lines_total"),
            value("tollgate_record_dropped_total{reason=\"full\"}"),
        );
        if counts.0 + counts.1 == 10 || std::time::Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.len() <= 300, "{}", text.len());
    assert_eq!(text.lines().count() as u64, written);
    assert!(written >= 2, "{written}");
    assert_eq!(written + dropped, 10);
}

#[test]
fn a_request_a_policy_refuses_and_a_bad_policy_are_named() {
    let policy = file("new-refuses.yaml", NEW);
    let descriptors = vec![r#"{"entries":[{"key":"user","value":"1"}]}"#; 129].join(",");
    let requests = file(
        "too-many.ndjson",
        &(request_line("2026-11-24T10:00:00Z", "1")
            + &format!(r#"{{"ts_ns":1,"domain":"api","descriptors":[{descriptors}]}}"#)
            + "\n"),
    );
    let output = preview(
        &["--policy", "{}", "--requests", "{}"],
        &[&policy, &requests],
    );
    let stderr = failed(&output);
    assert!(
        stderr.contains(&format!(
            "{}:2: {} refuses the request: the request has 129 descriptors; at most 128 are taken",
            requests.display(),
            policy.display()
        )),
        "{stderr}"
    );

    let bad = file("bad-policy.yaml", &NEW.replace("per: 1m", "per: 1 minute"));
    let output = preview(
        &["--policy", "{}", "--baseline", "{}", "--requests", "{}"],
        &[&policy, &bad, &requests],
    );
    let stderr = failed(&output);
    assert!(
        stderr.contains(&format!("policy {}", bad.display()))
            && stderr.contains("rules[0].limit.per"),
        "{stderr}"
    );
}
