//! Tollgate's native config format: a domain and a list of named rules.
//!
//! ```yaml
//! domain: api
//! defaults: { algorithm: gcra, failure: local }
//! rules:
//!   - name: per-user
//!     match: [{ key: user }]           # no value: one budget per user
//!     limit: { requests: 100, per: 1m, burst: 20 }
//! ```
//!
//! See `examples/` at the repository root for every option, commented.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;
use tollgate_core::{Algorithm, Quota};

use crate::config::File;
use crate::policy::Domain;
use crate::rule::{Action, Limited, Priority, Tiers, envoy_limit};
use crate::tree::Pattern;
use crate::{ConfigError, FailurePolicy, Rule, parse_duration};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NativeFile {
    domain: Spanned<String>,
    /// Read by `config::read_any`, not here.
    #[serde(default, rename = "store")]
    _store: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    defaults: Defaults,
    rules: Vec<Spanned<NativeRule>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Defaults {
    algorithm: Option<Spanned<String>>,
    failure: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeRule {
    #[serde(default)]
    name: String,
    #[serde(rename = "match", default)]
    matches: Vec<Spanned<MatchEntry>>,
    limit: Option<Spanned<LimitSpec>>,
    algorithm: Option<Spanned<String>>,
    failure: Option<Spanned<String>>,
    #[serde(default)]
    shadow: bool,
    #[serde(default)]
    unlimited: bool,
    bucket: Option<Spanned<String>>,
    tiers: Option<Spanned<TiersSpec>>,
    priority: Option<Spanned<PrioritySpec>>,
    delay_after: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MatchEntry {
    #[serde(default)]
    key: String,
    value: Option<String>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct LimitSpec {
    requests: Spanned<u64>,
    per: Option<Spanned<String>>,
    burst: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TiersSpec {
    by: Spanned<String>,
    default: Spanned<String>,
    limits: BTreeMap<String, Spanned<LimitSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrioritySpec {
    by: Spanned<String>,
    default: Spanned<String>,
    shares: BTreeMap<String, Spanned<u64>>,
}

/// How long a concurrency permit is leased when the rule names no period.
const DEFAULT_LEASE: &str = "1m";

pub(crate) fn compile(file: File<'_>, root: NativeFile) -> Result<(String, Domain), ConfigError> {
    if root.domain.value.is_empty() {
        return Err(file.at(
            &root.domain,
            "domain",
            "config file cannot have an empty domain",
        ));
    }
    let default_algorithm = match &root.defaults.algorithm {
        Some(a) => a
            .value
            .parse()
            .map_err(|e: tollgate_core::ParseAlgorithmError| {
                file.at(a, "defaults.algorithm", e.to_string())
            })?,
        None => Algorithm::Gcra,
    };
    let default_failure = match &root.defaults.failure {
        Some(f) => f
            .value
            .parse()
            .map_err(|e: String| file.at(f, "defaults.failure", e))?,
        None => FailurePolicy::Local,
    };
    let mut domain = Domain {
        source: file.path.display().to_string(),
        ..Domain::default()
    };
    let mut names: HashMap<String, String> = HashMap::new();
    let mut buckets: HashMap<Arc<str>, Arc<Rule>> = HashMap::new();
    for (i, spanned) in root.rules.iter().enumerate() {
        let field = format!("rules[{i}]");
        let r = &spanned.value;
        let rule = rule(file, &field, spanned, default_algorithm, default_failure)?;
        if let Some(first) = names.insert(r.name.clone(), rule.source.clone()) {
            return Err(file.at(
                spanned,
                format!("{field}.name"),
                format!("duplicate rule name {:?}, first defined at {first}", r.name),
            ));
        }
        if let (Some(spanned_bucket), Some(limited)) = (&r.bucket, rule.limited()) {
            let bucket: Arc<str> = Arc::from(spanned_bucket.value.as_str());
            match buckets
                .get(&bucket)
                .and_then(|b| b.limited().map(|l| (b, l)))
            {
                Some((first, l))
                    if l.algorithm != limited.algorithm
                        || l.quota != limited.quota
                        || l.tiers.is_some() != limited.tiers.is_some() =>
                {
                    return Err(file.at(spanned_bucket, format!("{field}.bucket"), format!(
                        "rules sharing bucket {bucket:?} must have the same algorithm and limit as {} ({})",
                        first.id, first.source
                    )));
                }
                _ => {
                    buckets.entry(bucket).or_insert_with(|| Arc::clone(&rule));
                }
            }
        }
        if let Err(existing) = domain.tree.insert(&rule.path, Arc::clone(&rule)) {
            return Err(file.at(
                spanned,
                format!("{field}.match"),
                format!(
                    "matches the same descriptors as rule {:?} ({})",
                    existing.id, existing.source
                ),
            ));
        }
        domain.rules.push(rule);
    }
    Ok((root.domain.value, domain))
}

fn rule(
    file: File<'_>,
    field: &str,
    spanned: &Spanned<NativeRule>,
    default_algorithm: Algorithm,
    default_failure: FailurePolicy,
) -> Result<Arc<Rule>, ConfigError> {
    let r = &spanned.value;
    let err = |sub: &str, reason: String| file.at(spanned, format!("{field}.{sub}"), reason);
    if r.name.is_empty() {
        return Err(err(
            "name",
            "every rule needs a name (metrics and the kill switch use it)".into(),
        ));
    }
    if r.matches.is_empty() {
        return Err(err(
            "match",
            "a rule must match at least one descriptor entry".into(),
        ));
    }
    for (j, m) in r.matches.iter().enumerate() {
        if m.value.key.is_empty() {
            return Err(file.at(
                m,
                format!("{field}.match[{j}].key"),
                "match entry has an empty key",
            ));
        }
    }
    let given = [r.unlimited, r.limit.is_some(), r.tiers.is_some()];
    if given.iter().filter(|&&g| g).count() != 1 {
        return Err(err(
            "limit",
            "a rule has exactly one of `limit`, `tiers` or `unlimited: true`".into(),
        ));
    }
    let mut algorithm = match &r.algorithm {
        Some(a) => a
            .value
            .parse()
            .map_err(|e: tollgate_core::ParseAlgorithmError| {
                file.at(a, format!("{field}.algorithm"), e.to_string())
            })?,
        None => default_algorithm,
    };
    if let Some(delay_after) = &r.delay_after {
        if !matches!(algorithm, Algorithm::LeakyBucketShaping { .. }) {
            return Err(file.at(
                delay_after,
                format!("{field}.delay_after"),
                "delay_after applies only to leaky-bucket-shaping",
            ));
        }
        algorithm = Algorithm::LeakyBucketShaping {
            delay_after: delay_after.value,
        };
    }
    let failure = match &r.failure {
        Some(f) => f
            .value
            .parse()
            .map_err(|e: String| file.at(f, format!("{field}.failure"), e))?,
        None => default_failure,
    };
    let match_keys: Vec<&str> = r.matches.iter().map(|m| m.value.key.as_str()).collect();
    let quota_of = |spec: &Spanned<LimitSpec>, sub: &str| {
        quota(file, &format!("{field}.{sub}"), spec, algorithm)
    };
    let (quota, tiers) = match (&r.limit, &r.tiers) {
        (Some(limit), _) => (Some(quota_of(limit, "limit")?), None),
        (None, Some(t)) => {
            let tf = format!("{field}.tiers");
            if !match_keys.contains(&t.value.by.value.as_str()) {
                return Err(file.at(
                    &t.value.by,
                    format!("{tf}.by"),
                    format!(
                        "{:?} is not one of the rule's match keys {match_keys:?}",
                        t.value.by.value
                    ),
                ));
            }
            let mut quotas = HashMap::new();
            for (name, spec) in &t.value.limits {
                quotas.insert(
                    name.clone(),
                    quota_of(spec, &format!("tiers.limits.{name}"))?,
                );
            }
            let Some(&default) = quotas.get(&t.value.default.value) else {
                return Err(file.at(
                    &t.value.default,
                    format!("{tf}.default"),
                    format!(
                        "default tier {:?} is not among the tiers' limits",
                        t.value.default.value
                    ),
                ));
            };
            let tiers = Tiers {
                by: t.value.by.value.clone(),
                default: t.value.default.value.clone(),
                quotas,
            };
            (Some(default), Some(tiers))
        }
        (None, None) => (None, None),
    };
    let priority = match &r.priority {
        None => None,
        Some(p) => {
            let pf = format!("{field}.priority");
            if !match_keys.contains(&p.value.by.value.as_str()) {
                return Err(file.at(
                    &p.value.by,
                    format!("{pf}.by"),
                    format!(
                        "{:?} is not one of the rule's match keys {match_keys:?}",
                        p.value.by.value
                    ),
                ));
            }
            if algorithm == Algorithm::TokenBucket {
                return Err(file.at(p, pf, "a priority reserve needs gcra, a leaky bucket, a window or concurrency: a token bucket clamps its stored tokens to the capacity it is checked with"));
            }
            if let Some((class, share)) = p
                .value
                .shares
                .iter()
                .find(|(_, s)| !(1..=100).contains(&s.value))
            {
                return Err(file.at(
                    share,
                    format!("{pf}.shares.{class}"),
                    format!("share {} is not a percentage from 1 to 100", share.value),
                ));
            }
            if !p.value.shares.contains_key(&p.value.default.value) {
                return Err(file.at(
                    &p.value.default,
                    format!("{pf}.default"),
                    format!("default class {:?} has no share", p.value.default.value),
                ));
            }
            Some(Priority {
                by: p.value.by.value.clone(),
                default: p.value.default.value.clone(),
                shares: p
                    .value
                    .shares
                    .iter()
                    .map(|(k, v)| (k.clone(), v.value))
                    .collect(),
            })
        }
    };
    let action = quota.map_or(Action::Unlimited, |quota| {
        Action::Limit(Limited {
            algorithm,
            quota,
            tiers,
            priority,
            bucket: r.bucket.as_ref().map(|b| Arc::from(b.value.as_str())),
            failure,
            envoy: envoy_limit(&quota),
        })
    });
    Ok(Arc::new(Rule {
        id: Arc::from(r.name.as_str()),
        name: Some(r.name.clone()),
        replaces: Vec::new(),
        shadow: r.shadow,
        detailed_metric: false,
        value_to_metric: Vec::new(),
        path: r
            .matches
            .iter()
            .map(|m| {
                (
                    m.value.key.clone(),
                    Pattern::parse(m.value.value.as_deref()),
                )
            })
            .collect(),
        envoy_format: false,
        quota_mode: false,
        metadata: None,
        action,
        envoy_window: None,
        source: file.source(spanned.referenced),
    }))
}

fn quota(
    file: File<'_>,
    field: &str,
    spec: &Spanned<LimitSpec>,
    algorithm: Algorithm,
) -> Result<Quota, ConfigError> {
    let s = &spec.value;
    let period = match (&s.per, algorithm) {
        (Some(per), _) => parse_duration(&per.value)
            .map_err(|e| file.at(per, format!("{field}.per"), e.to_string()))?,
        (None, Algorithm::Concurrency) => parse_duration(DEFAULT_LEASE).expect("a valid default"),
        (None, _) => {
            return Err(file.at(
                spec,
                format!("{field}.per"),
                "missing `per`: the period the requests are counted over, e.g. 1s or 1m",
            ));
        }
    };
    let quota = Quota::new(s.requests.value, period)
        .map_err(|e| file.at(&s.requests, format!("{field}.requests"), e.to_string()))?;
    match &s.burst {
        Some(burst) => quota
            .with_burst(burst.value)
            .map_err(|e| file.at(burst, format!("{field}.burst"), e.to_string())),
        None => Ok(quota),
    }
}
