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

use std::collections::{BTreeMap, HashMap, hash_map};
use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;
use tollgate_core::{Algorithm, Quota};

use crate::config::{ConfigErrors, File, Found};
use crate::domain::Domain;
use crate::rule::{Action, Limited, Numbered, Priority, Shares, Tiers, envoy_limit};
use crate::shed::{ShedSpec, shedding};
use crate::tree::Pattern;
use crate::{FailurePolicy, Rule, Shedding, parse_duration};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NativeFile {
    domain: Spanned<String>,
    /// Read by `read::read_any`, not here.
    #[serde(default, rename = "store")]
    _store: Option<serde::de::IgnoredAny>,
    /// The gateway's settings, read by the gateway (`tollgate serve
    /// --proxy-listen`), so that one file can run a gateway.
    #[serde(default, rename = "gateway")]
    _gateway: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    defaults: Defaults,
    /// Load shedding on the utilization the protected service reports.
    shed: Option<Spanned<ShedSpec>>,
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
    /// The domain's shared budget: shed by tier as it fills.
    shed: Option<Spanned<bool>>,
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

pub(crate) fn compile(file: File<'_>, root: NativeFile) -> Result<(String, Domain), ConfigErrors> {
    let mut found = Found::default();
    if root.domain.value.is_empty() {
        found.push(file.at(
            &root.domain,
            "domain",
            "config file cannot have an empty domain",
        ));
    }
    // `None` when the default is refused: a rule that takes it skips what
    // depends on it rather than guess.
    let default_algorithm =
        match &root.defaults.algorithm {
            Some(a) => found.keep(a.value.parse().map_err(
                |e: tollgate_core::ParseAlgorithmError| {
                    file.at(a, "defaults.algorithm", e.to_string())
                },
            )),
            None => Some(Algorithm::Gcra),
        };
    let default_failure = match &root.defaults.failure {
        Some(f) => found.keep(
            f.value
                .parse()
                .map_err(|e: String| file.at(f, "defaults.failure", e)),
        ),
        None => Some(FailurePolicy::Local),
    };
    let shedding = root
        .shed
        .as_ref()
        .and_then(|spec| shedding(file, spec, &mut found).map(Arc::new));
    let mut domain = Domain {
        source: file.path.display().to_string(),
        shedding,
        ..Domain::default()
    };
    let mut names: HashMap<String, String> = HashMap::new();
    let mut buckets: HashMap<Arc<str>, Arc<Rule>> = HashMap::new();
    for (i, spanned) in root.rules.iter().enumerate() {
        let field = format!("rules[{i}]");
        let r = &spanned.value;
        // A refused rule is left out of the comparisons with the others.
        let Some(rule) = found.scope(|found| {
            rule(
                file,
                &field,
                spanned,
                default_algorithm,
                default_failure,
                domain.shedding.as_ref(),
                found,
            )
        }) else {
            continue;
        };
        match names.entry(r.name.clone()) {
            hash_map::Entry::Occupied(first) => {
                found.push(file.at(
                    spanned,
                    format!("{field}.name"),
                    format!(
                        "duplicate rule name {:?}, first defined at {}",
                        r.name,
                        first.get()
                    ),
                ));
                continue;
            }
            hash_map::Entry::Vacant(name) => {
                name.insert(rule.source.clone());
            }
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
                    found.push(file.at(spanned_bucket, format!("{field}.bucket"), format!(
                        "rules sharing bucket {bucket:?} must have the same algorithm and limit as {} ({})",
                        first.id, first.source
                    )));
                    continue;
                }
                _ => {
                    buckets.entry(bucket).or_insert_with(|| Arc::clone(&rule));
                }
            }
        }
        if let Err(existing) = domain.tree.insert(&rule.path, Arc::clone(&rule)) {
            found.push(file.at(
                spanned,
                format!("{field}.match"),
                format!(
                    "matches the same descriptors as rule {:?} ({})",
                    existing.id, existing.source
                ),
            ));
            continue;
        }
        domain.rules.push(rule);
    }
    found.finish()?;
    Ok((root.domain.value, domain))
}

/// One rule, its fields checked each on its own so that each bad one is
/// reported; a field that another needs (the algorithm, for the limit's
/// default period) stops that one. Built only when nothing was found
/// ([`Found::scope`]).
fn rule(
    file: File<'_>,
    field: &str,
    spanned: &Spanned<NativeRule>,
    default_algorithm: Option<Algorithm>,
    default_failure: Option<FailurePolicy>,
    shedding: Option<&Arc<Shedding>>,
    found: &mut Found,
) -> Option<Arc<Rule>> {
    let r = &spanned.value;
    let err = |sub: &str, reason: &str| file.at(spanned, format!("{field}.{sub}"), reason);
    if r.name.is_empty() {
        found.push(err(
            "name",
            "every rule needs a name (metrics and the kill switch use it)",
        ));
    }
    if r.matches.is_empty() {
        found.push(err(
            "match",
            "a rule must match at least one descriptor entry",
        ));
    }
    for (j, m) in r.matches.iter().enumerate() {
        if m.value.key.is_empty() {
            found.push(file.at(
                m,
                format!("{field}.match[{j}].key"),
                "match entry has an empty key",
            ));
        }
    }
    let given = [r.unlimited, r.limit.is_some(), r.tiers.is_some()];
    if given.iter().filter(|&&g| g).count() != 1 {
        found.push(err(
            "limit",
            "a rule has exactly one of `limit`, `tiers` or `unlimited: true`",
        ));
    }
    let algorithm =
        match &r.algorithm {
            Some(a) => found.keep(a.value.parse().map_err(
                |e: tollgate_core::ParseAlgorithmError| {
                    file.at(a, format!("{field}.algorithm"), e.to_string())
                },
            )),
            None => default_algorithm,
        };
    let algorithm = match (&r.delay_after, algorithm) {
        (Some(delay_after), Some(algorithm)) => {
            if matches!(algorithm, Algorithm::LeakyBucketShaping { .. }) {
                Some(Algorithm::LeakyBucketShaping {
                    delay_after: delay_after.value,
                })
            } else {
                found.push(file.at(
                    delay_after,
                    format!("{field}.delay_after"),
                    "delay_after applies only to leaky-bucket-shaping",
                ));
                Some(algorithm)
            }
        }
        (_, algorithm) => algorithm,
    };
    let failure = match &r.failure {
        Some(f) => found.keep(
            f.value
                .parse()
                .map_err(|e: String| file.at(f, format!("{field}.failure"), e)),
        ),
        None => default_failure,
    };
    let match_keys: Vec<&str> = r.matches.iter().map(|m| m.value.key.as_str()).collect();
    let limits = match (&r.limit, &r.tiers) {
        (Some(limit), _) => {
            quota(file, &format!("{field}.limit"), limit, algorithm, found).map(|q| (Some(q), None))
        }
        (None, Some(t)) => tiers(file, field, t, algorithm, &match_keys, found)
            .map(|(default, tiers)| (Some(default), Some(tiers))),
        (None, None) => Some((None, None)),
    };
    let priority = match (&r.priority, &r.shed) {
        (Some(_), Some(shed)) if shed.value => {
            found.push(file.at(
                shed,
                format!("{field}.shed"),
                "a rule has at most one of `priority` and `shed: true`: both reserve its budget by priority",
            ));
            None
        }
        (Some(p), _) => priority(file, field, p, algorithm, &match_keys, found).map(Some),
        (None, Some(shed)) if shed.value => {
            budget(file, field, shed, shedding, algorithm, &match_keys, found).map(Some)
        }
        (None, _) => Some(None),
    };
    let (algorithm, failure, (quota, tiers), priority) = (algorithm?, failure?, limits?, priority?);
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
    Some(Arc::new(Rule {
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
        index: Numbered::default(),
    }))
}

/// A `tiers` section: the default tier's quota and the tiers.
fn tiers(
    file: File<'_>,
    field: &str,
    spanned: &Spanned<TiersSpec>,
    algorithm: Option<Algorithm>,
    match_keys: &[&str],
    found: &mut Found,
) -> Option<(Quota, Tiers)> {
    let t = &spanned.value;
    let tf = format!("{field}.tiers");
    if !match_keys.contains(&t.by.value.as_str()) {
        found.push(file.at(
            &t.by,
            format!("{tf}.by"),
            format!(
                "{:?} is not one of the rule's match keys {match_keys:?}",
                t.by.value
            ),
        ));
    }
    let mut quotas = HashMap::new();
    for (name, spec) in &t.limits {
        if let Some(quota) = quota(file, &format!("{tf}.limits.{name}"), spec, algorithm, found) {
            quotas.insert(name.clone(), quota);
        }
    }
    // Against the names, not the quotas: a default whose limit is refused
    // is reported once, for its limit.
    if !t.limits.contains_key(&t.default.value) {
        found.push(file.at(
            &t.default,
            format!("{tf}.default"),
            format!(
                "default tier {:?} is not among the tiers' limits",
                t.default.value
            ),
        ));
        return None;
    }
    let default = *quotas.get(&t.default.value)?;
    Some((
        default,
        Tiers {
            by: t.by.value.clone(),
            default: t.default.value.clone(),
            quotas,
        },
    ))
}

/// A `priority` section.
fn priority(
    file: File<'_>,
    field: &str,
    spanned: &Spanned<PrioritySpec>,
    algorithm: Option<Algorithm>,
    match_keys: &[&str],
    found: &mut Found,
) -> Option<Priority> {
    let p = &spanned.value;
    let pf = format!("{field}.priority");
    if !match_keys.contains(&p.by.value.as_str()) {
        found.push(file.at(
            &p.by,
            format!("{pf}.by"),
            format!(
                "{:?} is not one of the rule's match keys {match_keys:?}",
                p.by.value
            ),
        ));
    }
    if algorithm == Some(Algorithm::TokenBucket) {
        found.push(file.at(spanned, &pf, "a priority reserve needs gcra, a leaky bucket, a window or concurrency: a token bucket clamps its stored tokens to the capacity it is checked with"));
    }
    for (class, share) in p
        .shares
        .iter()
        .filter(|(_, s)| !(1..=100).contains(&s.value))
    {
        found.push(file.at(
            share,
            format!("{pf}.shares.{class}"),
            format!("share {} is not a percentage from 1 to 100", share.value),
        ));
    }
    if !p.shares.contains_key(&p.default.value) {
        found.push(file.at(
            &p.default,
            format!("{pf}.default"),
            format!("default class {:?} has no share", p.default.value),
        ));
    }
    Some(Priority {
        by: p.by.value.clone(),
        shares: Shares::Classes {
            default: p.default.value.clone(),
            percent: p.shares.iter().map(|(k, v)| (k.clone(), v.value)).collect(),
        },
    })
}

/// A rule's `shed: true`: the domain's shared budget, each tier's share the
/// domain's `shed` threshold, so that its pressure sheds by tier.
fn budget(
    file: File<'_>,
    field: &str,
    spanned: &Spanned<bool>,
    shedding: Option<&Arc<Shedding>>,
    algorithm: Option<Algorithm>,
    match_keys: &[&str],
    found: &mut Found,
) -> Option<Priority> {
    let sf = format!("{field}.shed");
    let Some(shedding) = shedding else {
        found.push(file.at(
            spanned,
            sf,
            "`shed: true` needs the file's `shed:` section (its priority_key and thresholds)",
        ));
        return None;
    };
    if !match_keys.contains(&shedding.priority_key()) {
        found.push(file.at(
            spanned,
            &sf,
            format!(
                "the domain's shed.priority_key {:?} is not one of the rule's match keys {match_keys:?}",
                shedding.priority_key()
            ),
        ));
    }
    if algorithm == Some(Algorithm::TokenBucket) {
        found.push(file.at(spanned, &sf, "a budget shed by tier needs gcra, a leaky bucket, a window or concurrency: a token bucket clamps its stored tokens to the capacity it is checked with"));
    }
    Some(Priority {
        by: shedding.priority_key().to_owned(),
        shares: Shares::Tiers(Arc::clone(shedding)),
    })
}

/// A limit's quota; `None` once its error is in `found`, or when the
/// algorithm it depends on is refused already.
fn quota(
    file: File<'_>,
    field: &str,
    spec: &Spanned<LimitSpec>,
    algorithm: Option<Algorithm>,
    found: &mut Found,
) -> Option<Quota> {
    let s = &spec.value;
    let period = match (&s.per, algorithm) {
        (Some(per), _) => found.keep(
            parse_duration(&per.value)
                .map_err(|e| file.at(per, format!("{field}.per"), e.to_string())),
        )?,
        (None, Some(Algorithm::Concurrency)) => {
            parse_duration(DEFAULT_LEASE).expect("a valid default")
        }
        (None, Some(_)) => {
            found.push(file.at(
                spec,
                format!("{field}.per"),
                "missing `per`: the period the requests are counted over, e.g. 1s or 1m",
            ));
            return None;
        }
        // Whether it needs a period depends on the refused algorithm.
        (None, None) => return None,
    };
    let quota = found.keep(
        Quota::new(s.requests.value, period)
            .map_err(|e| file.at(&s.requests, format!("{field}.requests"), e.to_string())),
    )?;
    match &s.burst {
        Some(burst) => found.keep(
            quota
                .with_burst(burst.value)
                .map_err(|e| file.at(burst, format!("{field}.burst"), e.to_string())),
        ),
        None => Some(quota),
    }
}
