//! `tollgate simulate`, run as the real binary.

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
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
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
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
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
