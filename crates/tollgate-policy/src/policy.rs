use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::{Algorithm, Limit, Quota, QuotaError};

use crate::config::ConfigErrors;
use crate::domain::Domain;
use crate::rule::{Action, Limited, Numbered, RuleIndex, envoy_limit};
use crate::{
    ConfigError, Descriptor, Entry, FailurePolicy, Request, RequestError, Rule, Shedding,
    StoreSettings,
};

/// A limit to check for one descriptor: everything a store needs, plus the
/// rule it came from.
#[derive(Debug, Clone)]
pub struct Applied {
    /// The rule that matched.
    pub rule: Arc<Rule>,
    /// The storage key: domain, rule (or shared bucket) and the values that
    /// tell budgets apart.
    pub key: String,
    /// The quota, after tiers and priority reserves.
    pub quota: Quota,
    /// How it is counted.
    pub algorithm: Algorithm,
    /// What this request costs.
    pub cost: u64,
    /// Report, never deny.
    pub shadow: bool,
    /// What to do when the store cannot answer.
    pub failure: FailurePolicy,
    /// The limit as Envoy names it: `(requests_per_unit, unit)`.
    pub envoy_limit: (u64, crate::Unit),
}

impl Applied {
    /// The limit to hand to a store.
    pub fn limit(&self) -> Limit<'_> {
        Limit {
            key: &self.key,
            quota: self.quota,
            algorithm: self.algorithm,
            cost: self.cost,
            failure: self.failure,
        }
    }
}

/// What a policy says of one descriptor.
#[derive(Debug, Clone)]
pub enum Resolved {
    /// No rule matches: the descriptor is not limited (as in envoyproxy/ratelimit).
    NoRule,
    /// The matched rule is unlimited.
    Unlimited(Arc<Rule>),
    /// The matched rule refuses every request (a limit of zero per `Unit`).
    Blocked(Arc<Rule>, crate::Unit),
    /// The matched rule is replaced by another rule matched in the same request.
    Replaced(Arc<Rule>),
    /// A limit to check.
    Limit(Applied),
}

/// The number the next policy read whole takes ([`RuleIndex::policy`]).
static POLICIES: AtomicU64 = AtomicU64::new(0);

/// A validated, immutable set of domains and their rules.
#[derive(Debug, Default)]
pub struct Policy {
    pub(crate) domains: BTreeMap<String, Domain>,
    /// The `store:` section and the file that holds it.
    pub(crate) store: Option<(PathBuf, StoreSettings)>,
}

/// The policy `tollgate serve` runs without `--config`: the service's domain
/// `default` and the gateway's domain `gateway`, one file each.
const BUILTIN: [(&str, &str); 2] = [
    ("<built-in default.yaml>", include_str!("../default.yaml")),
    ("<built-in gateway.yaml>", include_str!("../gateway.yaml")),
];

impl Policy {
    /// The built-in default policy (see `default.yaml` and `gateway.yaml` in
    /// this crate): domains `default` and `gateway`.
    pub fn builtin() -> Self {
        let mut policy = Policy::default();
        for (name, text) in BUILTIN {
            policy
                .add_file(Path::new(name), text, false)
                .expect("the built-in policy is valid");
        }
        policy.numbered()
    }

    /// Reads a config file, or every `.yaml`/`.yml` file of a directory (in
    /// name order). A domain defined twice is an error.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_files(path, ConfigFiles::default())
    }

    /// [`Policy::load`], reading the files of a directory that `files` picks.
    pub fn load_files(path: &Path, files: ConfigFiles) -> Result<Self, ConfigError> {
        let io_error = |path: &Path, e: std::io::Error| ConfigError {
            path: path.to_owned(),
            line: 0,
            column: 0,
            field: "file".into(),
            reason: e.to_string(),
        };
        let merge = files.merge_domains;
        let files = config_files(path, files).map_err(|e| io_error(path, e))?;
        let mut policy = Policy::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| io_error(&file, e))?;
            policy.add_file(&file, &text, merge).map_err(|e| e.first)?;
        }
        Ok(policy.numbered())
    }

    /// Every error [`Policy::load_files`] can find in `path`, rather than
    /// only the first: every error of each file, each file read on its own,
    /// then what the files that read well refuse together (a domain defined
    /// twice, a merged descriptor repeated, a second `store` section), files
    /// in name order. A file's errors are in the order the loader meets
    /// them, so its first is the one [`Policy::load_files`] reports. The
    /// loader goes on past a bad rule or descriptor, leaving it out (with
    /// its nested descriptors) of what follows, so one mistake gives one
    /// error; a YAML syntax error, a value of the wrong type, a native
    /// file's unknown field or an envoyproxy/ratelimit file's bad key stops
    /// its file's checks there (every bad key is listed). Empty exactly when
    /// [`Policy::load_files`] loads the path. For `tollgate check-config`.
    pub fn load_errors(path: &Path, files: ConfigFiles) -> Vec<ConfigError> {
        let io_error = |path: &Path, e: std::io::Error| ConfigError {
            path: path.to_owned(),
            line: 0,
            column: 0,
            field: "file".into(),
            reason: e.to_string(),
        };
        let merge = files.merge_domains;
        let list = match config_files(path, files) {
            Ok(list) => list,
            Err(e) => return vec![io_error(path, e)],
        };
        let mut errors = Vec::new();
        let mut good = Vec::new();
        for file in list {
            let text = match std::fs::read_to_string(&file) {
                Ok(text) => text,
                Err(e) => {
                    errors.push(io_error(&file, e));
                    continue;
                }
            };
            match Policy::default().add_file(&file, &text, merge) {
                Ok(()) => good.push((file, text)),
                Err(e) => errors.extend(e.into_vec()),
            }
        }
        // A refused file leaves the policy as it was, so every later
        // clash is still found.
        let mut together = Policy::default();
        for (file, text) in good {
            if let Err(e) = together.add_file(&file, &text, merge) {
                errors.extend(e.into_vec());
            }
        }
        errors
    }

    /// Reads one config file's text; `name` is how errors name the file.
    pub fn parse(name: impl AsRef<Path>, text: &str) -> Result<Self, ConfigError> {
        let mut policy = Policy::default();
        policy
            .add_file(name.as_ref(), text, false)
            .map_err(|e| e.first)?;
        Ok(policy.numbered())
    }

    /// Reads several config files' texts, each with its name, as the files
    /// of one directory are read: a domain defined twice is an error.
    pub fn parse_all<N: AsRef<Path>, T: AsRef<str>>(
        configs: impl IntoIterator<Item = (N, T)>,
    ) -> Result<Self, ConfigError> {
        let mut policy = Policy::default();
        for (name, text) in configs {
            policy
                .add_file(name.as_ref(), text.as_ref(), false)
                .map_err(|e| e.first)?;
        }
        Ok(policy.numbered())
    }

    /// The policy read whole, its rules numbered 0 to n under a number of
    /// its own (see [`RuleIndex`]).
    fn numbered(self) -> Self {
        let policy = POLICIES.fetch_add(1, Ordering::Relaxed);
        let rules = self.domains.values().map(|d| d.rules.len()).sum();
        let all = self.domains.values().flat_map(|d| &d.rules);
        for (index, rule) in all.enumerate() {
            rule.index.set(RuleIndex {
                policy,
                index,
                rules,
            });
        }
        self
    }

    /// Adds one file's domain; with `merge`, a domain in envoyproxy/ratelimit's
    /// format that an earlier file defined takes this file's descriptors too
    /// (its `MERGE_DOMAIN_CONFIG`).
    pub(crate) fn add_file(
        &mut self,
        path: &Path,
        text: &str,
        merge: bool,
    ) -> Result<(), ConfigErrors> {
        let read = crate::read::read_any(path, text)?;
        if let Some(store) = read.store {
            if let Some((first, _)) = &self.store {
                return Err(ConfigErrors::from(ConfigError {
                    path: path.to_owned(),
                    line: 1,
                    column: 1,
                    field: "store".into(),
                    reason: format!(
                        "a second `store` section; the first is in {}",
                        first.display()
                    ),
                }));
            }
            self.store = Some((path.to_owned(), store));
        }
        let Some((name, domain)) = read.domain else {
            return Ok(());
        };
        if let Some(existing) = self.domains.get_mut(&name)
            && merge
            && existing.envoy
            && domain.envoy
        {
            return Ok(existing.merge(domain)?);
        }
        if let Some(existing) = self.domains.get(&name) {
            return Err(ConfigErrors::from(ConfigError {
                path: path.to_owned(),
                line: 1,
                column: 1,
                field: "domain".into(),
                reason: format!(
                    "duplicate domain {name:?}, already defined in {}",
                    existing.source
                ),
            }));
        }
        self.domains.insert(name, domain);
        Ok(())
    }

    /// The config's `store:` section, if one of its files has it, with that
    /// file (for errors). See [`StoreSettings`].
    pub fn store(&self) -> Option<(&Path, &StoreSettings)> {
        self.store
            .as_ref()
            .map(|(path, store)| (path.as_path(), store))
    }

    /// Whether no domain has a rule: a policy that limits nothing.
    pub fn is_empty(&self) -> bool {
        self.domains.values().all(|d| d.rules.is_empty())
    }

    /// The domains, in name order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Whether `domain` is written in envoyproxy/ratelimit's format, whose
    /// requests are counted as it counts them by default
    /// ([`Counting`](crate::Counting)).
    pub fn is_envoy(&self, domain: &str) -> bool {
        self.domains.get(domain).is_some_and(|d| d.envoy)
    }

    /// How `domain` sheds on the utilization its service reports (its
    /// `shed:` section); `None` when it does not, or is not defined.
    pub fn shedding(&self, domain: &str) -> Option<&Arc<Shedding>> {
        self.domains.get(domain)?.shedding.as_ref()
    }

    /// The file that defined `domain` (the first of them, when files were
    /// merged into it).
    pub fn domain_file(&self, domain: &str) -> Option<&str> {
        self.domains.get(domain).map(|d| d.source.as_str())
    }

    /// The rules of `domain`, in the order they were defined.
    pub fn rules(&self, domain: &str) -> &[Arc<Rule>] {
        self.domains.get(domain).map_or(&[], |d| &d.rules)
    }

    /// What applies to each descriptor of `request`, in order.
    pub fn resolve(&self, request: &Request<'_>) -> Result<Vec<Resolved>, RequestError> {
        if request.domain.is_empty() {
            return Err(RequestError::EmptyDomain);
        }
        if request.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        let domain = self.domains.get(request.domain);
        let mut resolved = request
            .descriptors
            .iter()
            .enumerate()
            .map(|(index, descriptor)| {
                // A descriptor without entries, or with an empty key, matches
                // no rule, as in envoyproxy/ratelimit; Tollgate's own API
                // refuses them first (`Request::well_formed`).
                let cost = descriptor.hits_addend.unwrap_or(request.hits_addend.max(1));
                let Some(domain) = domain else {
                    return Ok(Resolved::NoRule);
                };
                match descriptor.limit {
                    Some(o) => override_limit(request.domain, index, descriptor, o, cost),
                    None => Ok(match_rule(request.domain, domain, descriptor, cost)),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        apply_replaces(&mut resolved);
        Ok(resolved)
    }
}

/// How a config directory is read: which files (every `.yaml`/`.yml` file
/// directly in it, and by default those whose names start with a dot too),
/// and whether two files may define one domain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigFiles {
    /// Skip files whose names start with a dot (envoyproxy/ratelimit's
    /// `RUNTIME_IGNOREDOTFILES`).
    pub ignore_dot_files: bool,
    /// Merge files that define one domain in envoyproxy/ratelimit's format,
    /// rather than refuse the second (its `MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
}

impl ConfigFiles {
    /// Skips (or reads) files whose names start with a dot.
    #[must_use]
    pub fn ignore_dot_files(mut self, ignore: bool) -> Self {
        self.ignore_dot_files = ignore;
        self
    }

    /// Merges (or refuses) a domain that two files define.
    #[must_use]
    pub fn merge_domains(mut self, merge: bool) -> Self {
        self.merge_domains = merge;
        self
    }

    fn picks(self, file: &Path) -> bool {
        let dotted = file
            .file_name()
            .is_some_and(|name| name.as_encoded_bytes().starts_with(b"."));
        file.extension().is_some_and(|x| x == "yaml" || x == "yml")
            && !(self.ignore_dot_files && dotted)
    }
}

/// The files a config path stands for: the path itself, or the directory's
/// files that `files` picks, in name order. [`Policy::load_files`] reads them
/// and the reloader's fingerprint hashes them, so both see the same files.
pub(crate) fn config_files(path: &Path, files: ConfigFiles) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files: Vec<_> = std::fs::read_dir(path)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| files.picks(p))
        .collect();
    files.sort();
    Ok(files)
}

fn match_rule(domain_name: &str, domain: &Domain, descriptor: &Descriptor, cost: u64) -> Resolved {
    let Some((rule, shared)) = domain.tree.find(&descriptor.entries) else {
        return Resolved::NoRule;
    };
    let limited = match &rule.action {
        Action::Unlimited => return Resolved::Unlimited(Arc::clone(rule)),
        Action::Block(unit) => return Resolved::Blocked(Arc::clone(rule), *unit),
        Action::Limit(limited) => limited,
    };
    let value_of = |key: &str| {
        descriptor
            .entries
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    };
    let mut quota = limited.quota;
    let mut skip: Vec<&str> = Vec::new();
    if let Some(tiers) = &limited.tiers {
        let tier = value_of(&tiers.by).filter(|t| tiers.quotas.contains_key(*t));
        quota = tiers.quotas[tier.unwrap_or(&tiers.default)];
        skip.push(&tiers.by);
    }
    if let Some(priority) = &limited.priority {
        quota = reserve(
            quota,
            limited.algorithm,
            priority.share(value_of(&priority.by)),
        );
        skip.push(&priority.by);
    }
    if let Some(unit) = rule.envoy_window {
        return Resolved::Limit(Applied {
            rule: Arc::clone(rule),
            key: envoy_key(domain_name, unit, &rule.id, &descriptor.entries, &shared),
            quota,
            algorithm: limited.algorithm,
            cost,
            shadow: rule.shadow,
            failure: limited.failure,
            envoy_limit: limited.envoy,
        });
    }
    let id = limited.bucket.as_deref().unwrap_or(&rule.id);
    let distinguishing = descriptor
        .entries
        .iter()
        .zip(&shared)
        .filter(|(e, shared)| !**shared && !skip.contains(&e.key.as_str()))
        .map(|(e, _)| e);
    Resolved::Limit(Applied {
        rule: Arc::clone(rule),
        key: storage_key(domain_name, id, distinguishing),
        quota,
        algorithm: limited.algorithm,
        cost,
        shadow: rule.shadow,
        failure: limited.failure,
        envoy_limit: limited.envoy,
    })
}

/// The quota a priority class sees: the same budget, of which it may fill only
/// `share` percent. Admissions of every class spend the one shared state.
pub(crate) fn reserve(quota: Quota, algorithm: Algorithm, share: u64) -> Quota {
    if share >= 100 {
        return quota;
    }
    let part = |n: u64| (u128::from(n) * u128::from(share) / 100).max(1) as u64;
    match algorithm {
        Algorithm::FixedWindow
        | Algorithm::HitCounter
        | Algorithm::SlidingLog
        | Algorithm::SlidingCounter
        | Algorithm::Concurrency => {
            // Same period, smaller count: the state (counts) is shared as is.
            Quota::new(part(quota.limit()), quota.period())
                .and_then(|q| q.with_burst(part(quota.burst())))
                .unwrap_or(quota)
        }
        // Same rate, smaller tolerance: the state (a level or a TAT) is shared as is.
        _ => quota.with_burst(part(quota.burst())).unwrap_or(quota),
    }
}

fn override_limit(
    domain: &str,
    index: usize,
    descriptor: &Descriptor,
    o: crate::LimitOverride,
    cost: u64,
) -> Result<Resolved, RequestError> {
    let quota = match Quota::new(o.requests_per_unit, o.unit.duration()) {
        Ok(quota) => Some(quota),
        // As a config's `requests_per_unit: 0`: envoyproxy/ratelimit counts
        // the hit and answers it over the limit.
        Err(QuotaError::ZeroLimit) => None,
        Err(e) => {
            return Err(RequestError::InvalidOverride {
                index,
                reason: e.to_string(),
            });
        }
    };
    let id: String = descriptor
        .entries
        .iter()
        .map(|e| format!("{}_{}", e.key, e.value))
        .collect::<Vec<_>>()
        .join(".");
    let rule = |action| {
        Arc::new(Rule {
            id: Arc::from(format!("override:{id}")),
            name: None,
            replaces: Vec::new(),
            shadow: false,
            detailed_metric: false,
            value_to_metric: Vec::new(),
            path: Vec::new(),
            envoy_format: false,
            quota_mode: false,
            metadata: None,
            action,
            envoy_window: Some(o.unit),
            source: "request".into(),
            index: Numbered::default(),
        })
    };
    let Some(quota) = quota else {
        return Ok(Resolved::Blocked(rule(Action::Block(o.unit)), o.unit));
    };
    let rule = rule(Action::Limit(Limited {
        algorithm: Algorithm::FixedWindow,
        quota,
        tiers: None,
        priority: None,
        bucket: None,
        failure: FailurePolicy::default(),
        envoy: envoy_limit(&quota),
    }));
    let key = envoy_key(domain, o.unit, "", &descriptor.entries, &[]);
    Ok(Resolved::Limit(Applied {
        rule,
        key,
        quota,
        algorithm: Algorithm::FixedWindow,
        cost,
        shadow: false,
        failure: FailurePolicy::default(),
        envoy_limit: (o.requests_per_unit, o.unit),
    }))
}

/// Length-prefixed parts, so no value can forge another key by containing a
/// separator. Written into one buffer: this runs for every limited descriptor.
fn storage_key<'a>(domain: &str, id: &str, entries: impl Iterator<Item = &'a Entry>) -> String {
    // Pushed piece by piece rather than with `write!`, whose formatting
    // machinery costs more than the rest of the check.
    let mut key = String::with_capacity(64);
    let part = |key: &mut String, text: &str| {
        push_decimal(key, text.len());
        key.push(':');
        key.push_str(text);
    };
    for text in [domain, id] {
        part(&mut key, text);
        key.push('|');
    }
    for e in entries {
        part(&mut key, &e.key);
        key.push('=');
        part(&mut key, &e.value);
        key.push('|');
    }
    key
}

/// The key of a count in envoyproxy/ratelimit's windows, which is its cache
/// key's (`GenerateCacheKey`): the domain, the window's unit and the
/// request's entries, whatever rule or override counts them. So a request's
/// `limit` override of one unit shares the count of the rule of that unit, and
/// the count survives a reload that changes the limit. An entry a
/// `share_threshold` wildcard matched (`shared`) counts under its pattern:
/// under the rule's id, which names it, and without its value.
fn envoy_key(
    domain: &str,
    unit: crate::Unit,
    rule: &str,
    entries: &[Entry],
    shared: &[bool],
) -> String {
    let mut key = String::with_capacity(64);
    let part = |key: &mut String, text: &str| {
        push_decimal(key, text.len());
        key.push(':');
        key.push_str(text);
    };
    part(&mut key, domain);
    key.push('@');
    key.push_str(unit.name());
    key.push('|');
    if shared.contains(&true) {
        part(&mut key, rule);
        key.push('|');
    }
    for (i, e) in entries.iter().enumerate() {
        part(&mut key, &e.key);
        if shared.get(i).copied().unwrap_or(false) {
            key.push('*');
        } else {
            key.push('=');
            part(&mut key, &e.value);
        }
        key.push('|');
    }
    key
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[start..] {
        out.push(char::from(d));
    }
}

/// envoyproxy/ratelimit's `replaces`: a matched rule named in another matched
/// rule's `replaces` list does not apply to this request. As there, every
/// matched rule's list counts, an unlimited one's too, and an unlimited rule
/// is never replaced (it counts nothing to begin with).
fn apply_replaces(resolved: &mut [Resolved]) {
    let replaced: HashSet<String> = resolved
        .iter()
        .filter_map(|r| match r {
            Resolved::Limit(Applied { rule, .. })
            | Resolved::Unlimited(rule)
            | Resolved::Blocked(rule, _) => Some(&rule.replaces),
            Resolved::NoRule | Resolved::Replaced(_) => None,
        })
        .flatten()
        .cloned()
        .collect();
    if replaced.is_empty() {
        return;
    }
    for r in resolved.iter_mut() {
        let rule = match r {
            Resolved::Limit(Applied { rule, .. }) | Resolved::Blocked(rule, _) => rule,
            Resolved::NoRule | Resolved::Unlimited(_) | Resolved::Replaced(_) => continue,
        };
        if rule.name.as_ref().is_some_and(|n| replaced.contains(n)) {
            *r = Resolved::Replaced(Arc::clone(rule));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_keys_are_length_prefixed_parts() {
        let entries = [Entry::new("remote_address", "10.0.0.1"), Entry::new("", "")];
        assert_eq!(
            storage_key("default", "per-ip", entries.iter()),
            "7:default|6:per-ip|14:remote_address=8:10.0.0.1|0:=0:|"
        );
        let long = "x".repeat(1234);
        assert!(storage_key(&long, "", std::iter::empty()).starts_with("1234:xxx"));
        let mut s = String::new();
        push_decimal(&mut s, usize::MAX);
        assert_eq!(s, usize::MAX.to_string());
    }
}
