//! `tollgate simulate --policy NEW [--baseline OLD] --requests FILE`: what a
//! config change would do to recorded traffic.
//!
//! Each policy gets its own [`Enforcer`] over a fresh in-memory store, both
//! reading a manual clock set to each request's time, so every request is
//! decided exactly as `tollgate serve` with the in-memory store would have
//! decided it at that time (counting, shadow, quota-mode and blocked rules
//! alike). Requests are replayed in time order (sorted, equal times keeping
//! their file order).
//!
//! The report is per rule (domain and rule id) of either policy: the requests
//! that matched it under either one and how many of those each policy
//! admitted (a request is admitted or denied as a whole, so one that matched
//! several rules counts in each of their rows), then the requests whose fate
//! the rule changed: newly denied, those the baseline admitted and the new
//! policy denied with this rule among the denying ones; newly admitted, those
//! the baseline denied with this rule among the denying ones and the new
//! policy admitted. A rule that only shares requests with the one that denies
//! them changes no fate.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use serde::Serialize;
use tollgate_core::ManualClock;
use tollgate_policy::{Check, ConfigFiles, Counting, Descriptor, Enforcer, Policy, State};
use tollgate_server::serve::record::RecordedRequest;
use tollgate_store::{MemoryConfig, MemoryStore};

use super::access_log::AccessLog;

/// What to preview.
pub(crate) struct Preview<'a> {
    pub(crate) policy: &'a Path,
    pub(crate) baseline: Option<&'a Path>,
    pub(crate) requests: &'a Path,
    pub(crate) access_log: Option<AccessLog>,
    pub(crate) envoy_counting: Counting,
    pub(crate) top: usize,
}

/// The report `--format json` prints.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) policy: String,
    /// `null`: no baseline, every request admitted.
    pub(crate) baseline: Option<String>,
    pub(crate) requests: u64,
    /// Access log lines that made no request (a value was missing).
    pub(crate) skipped: u64,
    pub(crate) admitted_baseline: u64,
    pub(crate) admitted_new: u64,
    pub(crate) newly_denied: u64,
    pub(crate) newly_admitted: u64,
    pub(crate) rules: Vec<RuleRow>,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct RuleRow {
    pub(crate) domain: String,
    pub(crate) rule: String,
    pub(crate) requests: u64,
    pub(crate) admitted_baseline: u64,
    pub(crate) admitted_new: u64,
    /// Admitted by the baseline, denied by the new policy with this rule
    /// among the denying ones.
    pub(crate) newly_denied: u64,
    /// Denied by the baseline with this rule among the denying ones,
    /// admitted by the new policy.
    pub(crate) newly_admitted: u64,
    /// The keys (a descriptor's entries, `key=value` joined by `, `) with the
    /// most newly denied requests, then newly admitted; only keys that
    /// changed.
    pub(crate) top_keys: Vec<KeyRow>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KeyRow {
    pub(crate) key: String,
    pub(crate) newly_denied: u64,
    pub(crate) newly_admitted: u64,
}

/// One policy's enforcer on its own store and clock.
struct Side<'a> {
    path: &'a Path,
    enforcer: Enforcer<MemoryStore<Arc<ManualClock>>>,
    clock: Arc<ManualClock>,
}

/// What one policy made of one request: admitted or not, and the rules its
/// descriptors matched.
struct Fate {
    admitted: bool,
    rules: Vec<Matched>,
}

/// A rule a request matched.
struct Matched {
    /// Domain and rule id.
    rule: (String, String),
    /// The first descriptor that matched it.
    index: usize,
    /// Whether it denied the request (by any descriptor).
    denied: bool,
}

impl<'a> Side<'a> {
    fn load(path: &'a Path, counting: Counting) -> anyhow::Result<Self> {
        let policy = Policy::load_files(path, ConfigFiles::default())
            .with_context(|| format!("policy {}", path.display()))?;
        let clock = Arc::new(ManualClock::new(0));
        // No key is ever refused for room: the preview must not deny what a
        // service with room would admit.
        let store = MemoryStore::with_clock(
            MemoryConfig {
                max_keys: usize::MAX >> 1,
                ..MemoryConfig::default()
            },
            Arc::clone(&clock),
        );
        let enforcer = Enforcer::new(policy, store)
            .with_envoy_counting(counting)
            .with_clock(Arc::clone(&clock) as Arc<dyn tollgate_core::Clock>);
        enforcer
            .unsupported(&enforcer.policy())
            .with_context(|| format!("policy {}", path.display()))?;
        Ok(Self {
            path,
            enforcer,
            clock,
        })
    }

    async fn decide(&self, request: &RecordedRequest) -> Result<Fate, String> {
        self.clock.set(request.at);
        let verdict = self
            .enforcer
            .enforce(Check::Policy(request.request()))
            .await
            .map_err(|e| e.to_string())?;
        let admitted = verdict.allowed();
        let mut rules: Vec<Matched> = Vec::new();
        for (index, d) in verdict.descriptors.iter().enumerate() {
            let Some(rule) = d.rule.as_ref().filter(|_| d.state != State::Replaced) else {
                continue;
            };
            let id = (request.domain.clone(), rule.id().to_owned());
            let denied = !admitted && !d.allowed();
            match rules.iter_mut().find(|m| m.rule == id) {
                Some(matched) => matched.denied |= denied,
                None => rules.push(Matched {
                    rule: id,
                    index,
                    denied,
                }),
            }
        }
        // A concurrency permit is given back at once: a replayed request
        // has no length.
        self.enforcer.release(verdict.permit).await;
        Ok(Fate { admitted, rules })
    }
}

/// A descriptor's entries as a report names its key.
fn key_of(descriptor: &Descriptor) -> String {
    let mut key = String::new();
    for (i, e) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            key.push_str(", ");
        }
        let _ = write!(key, "{}={}", e.key, e.value);
    }
    key
}

/// Reads the request file: NDJSON, or an access log when `access_log` says
/// how to make its descriptors. Returns the requests, each with its line
/// number, sorted by time, and the number of access log lines skipped.
fn read(
    path: &Path,
    access_log: Option<&AccessLog>,
) -> anyhow::Result<(Vec<(usize, RecordedRequest)>, u64)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read requests {}", path.display()))?;
    let mut requests = Vec::new();
    let mut skipped = 0;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let number = number + 1;
        let at = |reason: String| anyhow!("{}:{number}: {reason}", path.display());
        match access_log {
            Some(log) => match log.request(line).map_err(at)? {
                Some(request) => requests.push((number, request)),
                None => skipped += 1,
            },
            None => requests.push((number, RecordedRequest::parse(line).map_err(at)?)),
        }
    }
    requests.sort_by_key(|(_, r)| r.at);
    Ok((requests, skipped))
}

#[derive(Default)]
struct Tally {
    row: RuleRow,
    keys: HashMap<String, (u64, u64)>,
}

/// Runs the preview.
pub(crate) fn run(preview: &Preview<'_>) -> anyhow::Result<Report> {
    let new = Side::load(preview.policy, preview.envoy_counting)?;
    let baseline = preview
        .baseline
        .map(|path| Side::load(path, preview.envoy_counting))
        .transpose()?;
    let (requests, skipped) = read(preview.requests, preview.access_log.as_ref())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("cannot start the runtime")?;
    let mut tallies: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let mut report = Report {
        policy: preview.policy.display().to_string(),
        baseline: preview.baseline.map(|p| p.display().to_string()),
        requests: requests.len() as u64,
        skipped,
        admitted_baseline: 0,
        admitted_new: 0,
        newly_denied: 0,
        newly_admitted: 0,
        rules: Vec::new(),
    };
    runtime.block_on(async {
        for (number, request) in &requests {
            let decide = async |side: &Side<'_>| {
                side.decide(request).await.map_err(|e| {
                    anyhow!(
                        "{}:{number}: {} refuses the request: {e}",
                        preview.requests.display(),
                        side.path.display()
                    )
                })
            };
            let after = decide(&new).await?;
            let before = match &baseline {
                Some(side) => decide(side).await?,
                None => Fate {
                    admitted: true,
                    rules: Vec::new(),
                },
            };
            let newly_denied = before.admitted && !after.admitted;
            let newly_admitted = !before.admitted && after.admitted;
            report.admitted_baseline += u64::from(before.admitted);
            report.admitted_new += u64::from(after.admitted);
            report.newly_denied += u64::from(newly_denied);
            report.newly_admitted += u64::from(newly_admitted);
            let mut seen: Vec<&(String, String)> = Vec::new();
            for matched in after.rules.iter().chain(&before.rules) {
                if seen.contains(&&matched.rule) {
                    continue;
                }
                seen.push(&matched.rule);
                let denied_by = |fate: &Fate| {
                    fate.rules
                        .iter()
                        .any(|m| m.rule == matched.rule && m.denied)
                };
                let denied = newly_denied && denied_by(&after);
                let admitted = newly_admitted && denied_by(&before);
                let tally = tallies.entry(matched.rule.clone()).or_default();
                let row = &mut tally.row;
                row.requests += 1;
                row.admitted_baseline += u64::from(before.admitted);
                row.admitted_new += u64::from(after.admitted);
                row.newly_denied += u64::from(denied);
                row.newly_admitted += u64::from(admitted);
                if denied || admitted {
                    let key = key_of(&request.descriptors[matched.index]);
                    let counts = tally.keys.entry(key).or_default();
                    counts.0 += u64::from(denied);
                    counts.1 += u64::from(admitted);
                }
            }
        }
        anyhow::Ok(())
    })?;
    report.rules = tallies
        .into_iter()
        .map(|((domain, rule), tally)| {
            let mut keys: Vec<KeyRow> = tally
                .keys
                .into_iter()
                .map(|(key, (newly_denied, newly_admitted))| KeyRow {
                    key,
                    newly_denied,
                    newly_admitted,
                })
                .collect();
            keys.sort_by(|a, b| {
                (b.newly_denied, b.newly_admitted, &a.key).cmp(&(
                    a.newly_denied,
                    a.newly_admitted,
                    &b.key,
                ))
            });
            keys.truncate(preview.top);
            RuleRow {
                domain,
                rule,
                top_keys: keys,
                ..tally.row
            }
        })
        .collect();
    Ok(report)
}

impl Report {
    /// The table `--format table` prints: a summary line, a row per rule,
    /// then each rule's top keys.
    pub(crate) fn table(&self) -> String {
        let mut out = String::new();
        let baseline = self.baseline.as_deref().unwrap_or("no limits");
        let _ = writeln!(
            out,
            "{} requests{}; admitted: {} under {baseline}, {} under {}; newly denied {}, newly admitted {}",
            self.requests,
            if self.skipped > 0 {
                format!(
                    " ({} access log lines skipped: a value was missing)",
                    self.skipped
                )
            } else {
                String::new()
            },
            self.admitted_baseline,
            self.admitted_new,
            self.policy,
            self.newly_denied,
            self.newly_admitted,
        );
        let header = [
            "DOMAIN",
            "RULE",
            "REQUESTS",
            "ADMITTED BEFORE",
            "ADMITTED AFTER",
            "NEWLY DENIED",
            "NEWLY ADMITTED",
        ]
        .map(str::to_owned);
        let rows = self.rules.iter().map(|r| {
            [
                r.domain.clone(),
                r.rule.clone(),
                r.requests.to_string(),
                r.admitted_baseline.to_string(),
                r.admitted_new.to_string(),
                r.newly_denied.to_string(),
                r.newly_admitted.to_string(),
            ]
        });
        columns(&mut out, "", 2, std::iter::once(header).chain(rows));
        for rule in self.rules.iter().filter(|r| !r.top_keys.is_empty()) {
            let _ = writeln!(out, "\nTop keys of {} {}:", rule.domain, rule.rule);
            let header = ["KEY", "NEWLY DENIED", "NEWLY ADMITTED"].map(str::to_owned);
            let rows = rule.top_keys.iter().map(|k| {
                [
                    k.key.clone(),
                    k.newly_denied.to_string(),
                    k.newly_admitted.to_string(),
                ]
            });
            columns(&mut out, "  ", 1, std::iter::once(header).chain(rows));
        }
        out
    }
}

/// Writes `rows` as aligned columns, each line after `indent`: the first
/// `names` columns (names) to the left, the rest (numbers) to the right.
fn columns<const N: usize>(
    out: &mut String,
    indent: &str,
    names: usize,
    rows: impl Iterator<Item = [String; N]>,
) {
    let rows: Vec<[String; N]> = rows.collect();
    let widths: Vec<usize> = (0..N)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let mut line = indent.to_owned();
        for (c, cell) in row.iter().enumerate() {
            let width = widths[c];
            if c < names {
                let _ = write!(line, "{cell:<width$}  ");
            } else {
                let _ = write!(line, "{cell:>width$}  ");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    const ENVOY: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

    /// Two layers: where envoyproxy/ratelimit's each-hit counting and
    /// all-or-nothing differ (a request one layer denies is charged to the
    /// other layer or not).
    const TWO_LAYERS: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: path
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

    fn line(ts: u64, ip: &str, path: Option<&str>) -> String {
        let mut descriptors =
            format!(r#"{{"entries":[{{"key":"remote_address","value":"{ip}"}}]}}"#);
        if let Some(path) = path {
            let _ = write!(
                descriptors,
                r#",{{"entries":[{{"key":"path","value":"{path}"}}]}}"#
            );
        }
        format!(r#"{{"ts_ns":{ts},"domain":"edge","descriptors":[{descriptors}]}}"#) + "\n"
    }

    #[test]
    fn envoy_domains_are_counted_as_the_service_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let policy = write(dir.path(), "two.yaml", TWO_LAYERS);
        // Path /a is over after one request; each-hit still charges the
        // address for the denied ones, so the address runs out at its 2nd
        // request, and the request to /b is denied too. All-or-nothing
        // charges nothing for a denied request: /b is admitted.
        let requests = [
            line(1_000, "10.0.0.1", Some("/a")),
            line(2_000, "10.0.0.1", Some("/a")),
            line(3_000, "10.0.0.1", Some("/b")),
        ]
        .concat();
        let requests = write(dir.path(), "r.ndjson", &requests);
        let admitted = |counting| {
            run(&Preview {
                policy: &policy,
                baseline: None,
                requests: &requests,
                access_log: None,
                envoy_counting: counting,
                top: 10,
            })
            .unwrap()
            .admitted_new
        };
        assert_eq!(admitted(Counting::EachHit), 1);
        assert_eq!(admitted(Counting::AllOrNothing), 2);
    }

    #[test]
    fn a_fate_changes_only_in_the_rows_of_the_rules_that_denied() {
        let dir = tempfile::tempdir().unwrap();
        let policy = write(
            dir.path(),
            "layers.yaml",
            "
domain: api
rules:
  - name: global
    match: [{ key: generic_key, value: global }]
    limit: { requests: 1000, per: 1m }
  - name: per-user
    match: [{ key: user }]
    limit: { requests: 1, per: 1m }
",
        );
        let line = |ts: u64| {
            format!(
                r#"{{"ts_ns":{ts},"domain":"api","descriptors":[{{"entries":[{{"key":"generic_key","value":"global"}}]}},{{"entries":[{{"key":"user","value":"1"}}]}}]}}"#
            ) + "\n"
        };
        let requests = write(dir.path(), "r.ndjson", &(line(1) + &line(2)));
        let report = run(&Preview {
            policy: &policy,
            baseline: None,
            requests: &requests,
            access_log: None,
            envoy_counting: Counting::EachHit,
            top: 10,
        })
        .unwrap();
        let rows: Vec<(&str, u64, u64, u64)> = report
            .rules
            .iter()
            .map(|r| (r.rule.as_str(), r.requests, r.admitted_new, r.newly_denied))
            .collect();
        assert_eq!(rows, [("global", 2, 1, 0), ("per-user", 2, 1, 1)]);
        assert!(report.rules[0].top_keys.is_empty());
    }

    #[test]
    fn requests_replay_in_time_order_and_top_keys_rank_by_change() {
        let dir = tempfile::tempdir().unwrap();
        let policy = write(dir.path(), "one.yaml", ENVOY);
        // Written out of order: sorted, 10.0.0.2's two requests fall in one
        // minute and its second is denied; of 10.0.0.1's first three, two
        // are denied, and its fourth, a minute later, is admitted.
        let minute = 60_000_000_000;
        let requests = [
            line(minute + 1, "10.0.0.1", None),
            line(3, "10.0.0.1", None),
            line(1, "10.0.0.1", None),
            line(2, "10.0.0.2", None),
            line(4, "10.0.0.2", None),
            line(2, "10.0.0.1", None),
        ]
        .concat();
        let requests = write(dir.path(), "r.ndjson", &requests);
        let report = run(&Preview {
            policy: &policy,
            baseline: None,
            requests: &requests,
            access_log: None,
            envoy_counting: Counting::EachHit,
            top: 1,
        })
        .unwrap();
        assert_eq!(
            (
                report.requests,
                report.admitted_baseline,
                report.admitted_new
            ),
            (6, 6, 3)
        );
        assert_eq!(report.rules.len(), 1);
        let rule = &report.rules[0];
        assert_eq!(
            (rule.requests, rule.newly_denied, rule.newly_admitted),
            (6, 3, 0)
        );
        assert_eq!(
            rule.top_keys,
            [KeyRow {
                key: "remote_address=10.0.0.1".into(),
                newly_denied: 2,
                newly_admitted: 0,
            }]
        );
    }
}
