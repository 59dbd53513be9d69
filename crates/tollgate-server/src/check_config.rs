//! `tollgate check-config`: checks config paths as `tollgate serve` would
//! load them, for CI pipelines and pre-commit hooks, without a network or a
//! listener.
//!
//! Each PATH is loaded as one `serve --config PATH` (the same loader, with
//! the same file options), refused as serve refuses it at start-up (no rules,
//! a limit the store cannot hold), and the domains of all PATHs must not
//! clash. A valid config prints its rules; an invalid one prints every error
//! found: every error of each file (`Policy::load_errors`; the first of each
//! is the one serve reports), then what the files refuse together. Exit
//! status: 0 valid, 1 invalid, 2 a usage error (clap's).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;
use tollgate_core::{Algorithm, IntoNanos, ManualClock, Quota, StoreError, format_duration};
use tollgate_policy::{ConfigError, ConfigFiles, Policy, Rule, Safeguards};
use tollgate_redis::RedisStore;
use tollgate_store::{MemoryConfig, MemoryStore};

/// Options of `tollgate check-config`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Config files or directories (both formats), each loaded as
    /// `tollgate serve --config PATH` loads it; the domains of all of them
    /// must not clash.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,

    /// Merge files that define one domain in envoyproxy/ratelimit's format,
    /// as `serve --merge-domains` does (its `MERGE_DOMAIN_CONFIG`).
    #[arg(long, env = "TOLLGATE_MERGE_DOMAINS")]
    merge_domains: bool,

    /// Skip files of a directory whose names start with a dot
    /// (envoyproxy/ratelimit's `RUNTIME_IGNOREDOTFILES`).
    #[arg(long)]
    ignore_dot_files: bool,

    /// Accept a config with no rules, as `serve --allow-empty-config` does.
    #[arg(long, env = "TOLLGATE_ALLOW_EMPTY_CONFIG")]
    allow_empty_config: bool,

    /// The store whose bounds every limit must fit, as serve checks them at
    /// start-up: `memory` or `redis` (never connected to). Without it, `redis`
    /// when the config's `store:` section names Redis, else `memory`.
    #[arg(long, value_name = "STORE")]
    store: Option<StoreKind>,

    /// `table` (aligned columns) or `json` (see docs/service.md).
    #[arg(long, value_name = "FORMAT", default_value = "table")]
    format: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Table,
    Json,
}

/// What `--format json` prints: one object, whatever the outcome.
#[derive(Debug, Serialize)]
struct Report {
    valid: bool,
    errors: Vec<ErrorRow>,
    /// The rules in force were the config served; empty when it is invalid.
    rules: Vec<RuleRow>,
}

#[derive(Debug, Serialize)]
struct ErrorRow {
    file: String,
    /// 0 when the problem is the file (or path) as a whole.
    line: u64,
    column: u64,
    field: String,
    reason: String,
}

#[derive(Debug, Serialize)]
struct RuleRow {
    domain: String,
    /// The rule's id: a native rule's name, or envoyproxy/ratelimit's
    /// descriptor path (`key_value.key`).
    rule: String,
    /// `rate_limit.name` or the native name.
    name: Option<String>,
    /// `envoy` or `native`.
    format: &'static str,
    path: Vec<Level>,
    /// `None` when the rule counts nothing (unlimited, blocked).
    algorithm: Option<String>,
    /// Requests per period; 0 for a rule that blocks everything.
    limit: Option<u64>,
    /// As configs write durations (`1s`, `1m`, `250ms`).
    period: Option<String>,
    burst: Option<u64>,
    failure: Option<String>,
    flags: Vec<String>,
    /// `file:line`.
    source: String,
}

#[derive(Debug, Serialize)]
struct Level {
    key: String,
    /// `None`: any value, one budget per distinct value.
    value: Option<String>,
}

/// Runs `tollgate check-config`.
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let report = check(args);
    let text = match args.format {
        Format::Json => serde_json::to_string_pretty(&report)? + "\n",
        Format::Table if report.valid => rules_table(&report.rules),
        Format::Table => errors_table(&report.errors),
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // A reader that stopped early (`| head`) changes no verdict.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        written => written?,
    }
    let paths: Vec<String> = args.paths.iter().map(|p| p.display().to_string()).collect();
    let paths = paths.join(" ");
    if report.valid {
        let domains: std::collections::BTreeSet<&str> =
            report.rules.iter().map(|r| r.domain.as_str()).collect();
        eprintln!(
            "check-config: {paths}: valid, {} rules in {} domains",
            report.rules.len(),
            domains.len()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        let files: std::collections::BTreeSet<&str> =
            report.errors.iter().map(|e| e.file.as_str()).collect();
        eprintln!(
            "check-config: {paths}: invalid, {} errors in {} files",
            report.errors.len(),
            files.len()
        );
        Ok(ExitCode::FAILURE)
    }
}

/// Loads every path and gathers what serve would refuse.
fn check(args: &Args) -> Report {
    let files = ConfigFiles::default()
        .merge_domains(args.merge_domains)
        .ignore_dot_files(args.ignore_dot_files);
    let safeguards = Safeguards::default().allow_empty(args.allow_empty_config);
    let mut errors = Vec::new();
    let mut loaded = Vec::new();
    for path in &args.paths {
        match Policy::load_files(path, files) {
            Ok(policy) => {
                if let Err(refusal) = safeguards.check_initial(&policy) {
                    errors.push(ConfigError {
                        path: path.clone(),
                        line: 0,
                        column: 0,
                        field: "rules".into(),
                        reason: format!("{refusal} (--allow-empty-config allows it)"),
                    });
                }
                errors.extend(unsupported(&policy, Bounds::of(args.store, &policy)));
                loaded.push(policy);
            }
            Err(first) => {
                let all = Policy::load_errors(path, files);
                // Empty only if the files changed between the two reads.
                errors.extend(if all.is_empty() { vec![first] } else { all });
            }
        }
    }
    errors.extend(clashes(&loaded));
    let valid = errors.is_empty();
    let rules = if valid {
        loaded.iter().flat_map(rows).collect()
    } else {
        Vec::new()
    };
    Report {
        valid,
        errors: errors.into_iter().map(error_row).collect(),
        rules,
    }
}

/// The store a path's limits must fit, as serve's store is chosen: the
/// flag, else the config's `store:` section.
enum Bounds {
    /// The store serve runs without Redis; asked as serve asks it.
    Memory(Box<MemoryStore<ManualClock>>),
    /// The Redis store's bounds, which need no connection.
    Redis,
}

impl Bounds {
    fn of(flag: Option<StoreKind>, policy: &Policy) -> Self {
        let configured = policy.store().is_some_and(|(_, s)| s.redis.is_some());
        match flag {
            Some(StoreKind::Redis) => Bounds::Redis,
            None if configured => Bounds::Redis,
            _ => Bounds::Memory(Box::new(MemoryStore::with_clock(
                MemoryConfig {
                    max_keys: 1,
                    ..MemoryConfig::default()
                },
                ManualClock::new(0),
            ))),
        }
    }

    fn supports(&self, algorithm: Algorithm, quota: &Quota) -> Result<(), StoreError> {
        use tollgate_core::Store;
        match self {
            Bounds::Memory(store) => store.supports(algorithm, quota),
            Bounds::Redis => RedisStore::holds(quota),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Bounds::Memory(_) => "memory",
            Bounds::Redis => "Redis",
        }
    }
}

/// Every rule the store cannot enforce exactly: what serve's start-up check
/// (`Enforcer::unsupported`) refuses, all of them rather than the first.
fn unsupported(policy: &Policy, bounds: Bounds) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for domain in policy.domains() {
        for (index, rule) in policy.rules(domain).iter().enumerate() {
            let (Some(algorithm), Some(quota)) = (rule.algorithm(), rule.quota()) else {
                continue;
            };
            let Err(e) = bounds.supports(algorithm, &quota) else {
                continue;
            };
            let reason = match e {
                StoreError::Invalid(reason) => reason,
                other => other.to_string(),
            };
            let (file, line) = source(rule);
            errors.push(ConfigError {
                path: file,
                line,
                column: 0,
                // A native domain is one file, its rules in file order; an
                // envoyproxy/ratelimit rule is named by its path instead.
                field: if rule.is_envoy() {
                    "rate_limit".into()
                } else {
                    format!("rules[{index}].limit")
                },
                reason: format!(
                    "rule {:?} of domain {domain:?}: the {} store cannot enforce this limit exactly: {reason}",
                    rule.id(),
                    bounds.name()
                ),
            });
        }
    }
    errors
}

/// A rule's `file:line`, split.
fn source(rule: &Rule) -> (PathBuf, u64) {
    let split = rule.source().rsplit_once(':');
    match split.and_then(|(file, line)| Some((file, line.parse().ok()?))) {
        Some((file, line)) => (PathBuf::from(file), line),
        None => (PathBuf::from(rule.source()), 0),
    }
}

/// A domain that two of the given paths define: two services that would
/// answer for one domain.
fn clashes(loaded: &[Policy]) -> Vec<ConfigError> {
    let mut first: BTreeMap<&str, &str> = BTreeMap::new();
    let mut errors = Vec::new();
    for policy in loaded {
        for domain in policy.domains() {
            let file = policy.domain_file(domain).unwrap_or_default();
            match first.get(domain) {
                Some(earlier) => errors.push(ConfigError {
                    path: Path::new(file).to_owned(),
                    line: 1,
                    column: 1,
                    field: "domain".into(),
                    reason: format!(
                        "duplicate domain {domain:?}, already defined in {earlier} (another PATH given)"
                    ),
                }),
                None => {
                    first.insert(domain, file);
                }
            }
        }
    }
    errors
}

fn error_row(e: ConfigError) -> ErrorRow {
    ErrorRow {
        file: e.path.display().to_string(),
        line: e.line,
        column: e.column,
        field: e.field,
        reason: e.reason,
    }
}

/// The rules of a policy, domain by domain in name order, each domain's in
/// the order they were defined.
fn rows(policy: &Policy) -> Vec<RuleRow> {
    policy
        .domains()
        .flat_map(|domain| policy.rules(domain).iter().map(move |r| row(domain, r)))
        .collect()
}

fn row(domain: &str, rule: &Rule) -> RuleRow {
    let (limit, period, burst) = match (rule.quota(), rule.envoy_window()) {
        (Some(q), _) => (
            Some(q.limit()),
            Some(format_duration(q.period_ns())),
            Some(q.burst()),
        ),
        // A rule that blocks everything: zero per its unit.
        (None, Some(unit)) if rule.blocks() => (
            Some(0),
            Some(format_duration(unit.duration().into_nanos())),
            None,
        ),
        _ => (None, None, None),
    };
    let mut flags = Vec::new();
    let named = [
        (rule.unlimited(), "unlimited"),
        (rule.blocks(), "blocked"),
        (rule.shadow(), "shadow"),
        (rule.quota_mode(), "quota_mode"),
        (rule.detailed_metric(), "detailed_metric"),
        (rule.value_to_metric().contains(&true), "value_to_metric"),
        (rule.metadata().is_some(), "metadata"),
    ];
    flags.extend(
        named
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, f)| (*f).to_owned()),
    );
    flags.extend(rule.replaces().iter().map(|r| format!("replaces:{r}")));
    flags.extend(rule.bucket().map(|b| format!("bucket:{b}")));
    flags.extend(rule.tiered_by().map(|k| format!("tiers:{k}")));
    flags.extend(rule.priority_by().map(|k| {
        let kind = if rule.sheds_by_tier() {
            "shed"
        } else {
            "priority"
        };
        format!("{kind}:{k}")
    }));
    RuleRow {
        domain: domain.to_owned(),
        rule: rule.id().to_owned(),
        name: rule.name().map(str::to_owned),
        format: if rule.is_envoy() { "envoy" } else { "native" },
        path: rule
            .matches()
            .map(|(key, value)| Level {
                key: key.to_owned(),
                value,
            })
            .collect(),
        algorithm: rule.algorithm().map(|a| a.to_string()),
        limit,
        period,
        burst,
        failure: rule.failure().map(|f| f.to_string()),
        flags,
        source: rule.source().to_owned(),
    }
}

fn rules_table(rules: &[RuleRow]) -> String {
    let dash = || "-".to_owned();
    let header = [
        "DOMAIN",
        "RULE",
        "PATH",
        "ALGORITHM",
        "LIMIT",
        "PER",
        "BURST",
        "FAILURE",
        "FLAGS",
        "SOURCE",
    ];
    let rows = rules.iter().map(|r| {
        let path: Vec<String> = r
            .path
            .iter()
            .map(|l| match &l.value {
                Some(v) => format!("{}={v}", l.key),
                None => l.key.clone(),
            })
            .collect();
        vec![
            r.domain.clone(),
            r.rule.clone(),
            path.join(", "),
            r.algorithm.clone().unwrap_or_else(dash),
            r.limit.map_or_else(dash, |n| n.to_string()),
            r.period.clone().unwrap_or_else(dash),
            r.burst.map_or_else(dash, |n| n.to_string()),
            r.failure.clone().unwrap_or_else(dash),
            if r.flags.is_empty() {
                dash()
            } else {
                r.flags.join(",")
            },
            r.source.clone(),
        ]
    });
    table(&header, rows)
}

fn errors_table(errors: &[ErrorRow]) -> String {
    let header = ["FILE", "LINE", "COLUMN", "FIELD", "REASON"];
    let rows = errors.iter().map(|e| {
        vec![
            e.file.clone(),
            e.line.to_string(),
            e.column.to_string(),
            e.field.clone(),
            e.reason.clone(),
        ]
    });
    table(&header, rows)
}

/// Columns padded to their widest cell (in characters), two spaces apart;
/// the last column is not padded.
fn table(header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    lines.extend(rows);
    let mut widths = vec![0; header.len()];
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for line in lines {
        let last = line.len() - 1;
        for (i, cell) in line.iter().enumerate() {
            text.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 2;
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        text.push('\n');
    }
    text
}
