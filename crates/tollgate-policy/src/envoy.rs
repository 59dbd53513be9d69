//! envoyproxy/ratelimit's config format, read unchanged.
//!
//! Its limits are fixed windows aligned to the unit, as that service counts
//! them, so the same config gives the same decisions. What it accepts and
//! refuses follows its loader (`src/config/config_impl.go`): every key of its
//! schema is known, an unknown key anywhere is refused, and a known key in a
//! place where it means nothing is ignored there, as its YAML decoder ignores it.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, Spanned};
use tollgate_core::{Algorithm, Quota, QuotaError};

use crate::config::{ConfigErrors, File, Found};
use crate::domain::Domain;
use crate::metadata::MetadataField;
use crate::rule::{Action, Limited, Numbered, envoy_limit};
use crate::tree::Pattern;
use crate::{ConfigError, FailurePolicy, Rule, Unit};

/// Every key its loader knows (its `validKeys`), at whatever level.
const KNOWN_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// Tollgate's additions to a `rate_limit` (see `docs/envoy.md`, Tollgate's
/// extensions): keys envoyproxy/ratelimit refuses, so a file that uses them
/// is one for Tollgate only.
const EXTENSION_KEYS: [&str; 2] = ["algorithm", "unit_multiplier"];

#[derive(Deserialize)]
struct EnvoyFile {
    #[serde(default)]
    domain: Option<Spanned<Text>>,
    #[serde(default)]
    descriptors: List<Spanned<EnvoyDescriptor>>,
    /// An extension key out of its place, read only to refuse it.
    #[serde(default)]
    algorithm: Option<Spanned<IgnoredAny>>,
    /// As `algorithm`.
    #[serde(default)]
    unit_multiplier: Option<Spanned<IgnoredAny>>,
}

#[derive(Deserialize)]
struct EnvoyDescriptor {
    #[serde(default)]
    key: Text,
    #[serde(default)]
    value: Text,
    #[serde(default)]
    rate_limit: Option<Spanned<EnvoyRateLimit>>,
    #[serde(default)]
    descriptors: List<Spanned<EnvoyDescriptor>>,
    #[serde(default)]
    shadow_mode: Option<bool>,
    #[serde(default)]
    quota_mode: Option<bool>,
    #[serde(default)]
    detailed_metric: Option<bool>,
    #[serde(default)]
    value_to_metric: Option<bool>,
    #[serde(default)]
    share_threshold: Option<Spanned<Option<bool>>>,
    /// Returned in the response's dynamic metadata (with
    /// `RESPONSE_DYNAMIC_METADATA`); anything but a mapping is refused, as
    /// that loader refuses it.
    #[serde(default)]
    metadata: Option<MetadataField>,
    /// An extension key out of its place, read only to refuse it.
    #[serde(default)]
    algorithm: Option<Spanned<IgnoredAny>>,
    /// As `algorithm`.
    #[serde(default)]
    unit_multiplier: Option<Spanned<IgnoredAny>>,
}

#[derive(Deserialize)]
struct EnvoyRateLimit {
    /// Signed so that a negative count gets a clear reason rather than a
    /// parse error; the key check refuses integers beyond `i64`.
    #[serde(default)]
    requests_per_unit: Option<Spanned<i64>>,
    #[serde(default)]
    unit: Option<Spanned<Text>>,
    #[serde(default)]
    unlimited: Option<bool>,
    #[serde(default)]
    name: Text,
    #[serde(default)]
    replaces: List<Replaces>,
    /// Extension: the algorithm, by its native name (default `fixed-window`).
    #[serde(default)]
    algorithm: Option<Spanned<Text>>,
    /// Extension: the window is this many units (default 1).
    #[serde(default)]
    unit_multiplier: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
struct Replaces {
    #[serde(default)]
    name: Text,
}

/// A string field: any scalar reads as its text and null as empty, as Go's
/// YAML decoder fills a string.
#[derive(Default)]
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<String>::deserialize(d).map(|s| Text(s.unwrap_or_default()))
    }
}

/// A list field: null reads as empty, as Go's YAML decoder fills a slice.
struct List<T>(Vec<T>);

impl<T> Default for List<T> {
    fn default() -> Self {
        List(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Option::<Vec<T>>::deserialize(d).map(|v| List(v.unwrap_or_default()))
    }
}

/// What the key check makes of one YAML node (its `validateYamlKeys`).
struct Checked {
    kind: Kind,
    /// The problems in document order (its loader stops at the first):
    /// where, the field, and why.
    problems: Vec<Problem>,
}

type Problem = (Location, String, String);

enum Kind {
    Map,
    Seq,
    /// A string, as written.
    Str(String),
    /// An integer, boolean or null, as text.
    Plain(String),
    /// A float, or an integer beyond `i64`: types its check refuses.
    Refused(String),
}

impl Kind {
    fn text(&self) -> &str {
        match self {
            Kind::Map => "a mapping",
            Kind::Seq => "a list",
            Kind::Str(s) | Kind::Plain(s) | Kind::Refused(s) => s,
        }
    }
}

impl Checked {
    fn leaf(kind: Kind) -> Self {
        Checked {
            kind,
            problems: Vec::new(),
        }
    }
}

/// `child`'s field under `parent`: `a.b`, or `a[0]` for a list element.
fn join(parent: &str, child: &str) -> String {
    match child {
        "" => parent.to_owned(),
        c if c.starts_with('[') => format!("{parent}{c}"),
        c => format!("{parent}.{c}"),
    }
}

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckVisitor)
    }
}

struct CheckVisitor;

impl<'de> Visitor<'de> for CheckVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Checked, E> {
        Ok(Checked::leaf(Kind::Str(v.to_owned())))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Checked, E> {
        Ok(Checked::leaf(Kind::Plain(v.to_string())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Checked, E> {
        Ok(Checked::leaf(Kind::Plain(v.to_string())))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Checked, E> {
        // Go decodes an integer beyond int64 as uint64, a type its check refuses.
        Ok(Checked::leaf(if i64::try_from(v).is_ok() {
            Kind::Plain(v.to_string())
        } else {
            Kind::Refused(v.to_string())
        }))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Checked, E> {
        Ok(Checked::leaf(Kind::Refused(v.to_string())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked::leaf(Kind::Plain("null".into())))
    }
    fn visit_none<E: de::Error>(self) -> Result<Checked, E> {
        self.visit_unit()
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        let mut problems = Vec::new();
        // Every entry is read, even after a problem, so the parser reaches the
        // end of the mapping.
        while let Some(key) = map.next_key::<Spanned<Checked>>()? {
            let name = match &key.value.kind {
                Kind::Str(name) => name.clone(),
                other => {
                    let text = other.text().to_owned();
                    map.next_value::<IgnoredAny>()?;
                    problems.push((
                        key.referenced,
                        text.clone(),
                        format!("config error, key is not of type string: {text}"),
                    ));
                    continue;
                }
            };
            if !KNOWN_KEYS.contains(&name.as_str()) && !EXTENSION_KEYS.contains(&name.as_str()) {
                map.next_value::<IgnoredAny>()?;
                problems.push((
                    key.referenced,
                    name.clone(),
                    format!(
                        "config error, unknown key '{name}' (envoyproxy/ratelimit knows {})",
                        KNOWN_KEYS.join(", ")
                    ),
                ));
                continue;
            }
            if name == "metadata" {
                // Free-form: its keys are the user's, not the schema's.
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value = map.next_value::<Spanned<Checked>>()?;
            if let Kind::Refused(text) = &value.value.kind {
                problems.push((
                    value.referenced,
                    name.clone(),
                    format!(
                        "error checking config: {text} is neither a string, an integer up to 2^63-1 nor a boolean (quote it to make it a string)"
                    ),
                ));
            }
            problems.extend(
                (value.value.problems.into_iter())
                    .map(|(at, field, reason)| (at, join(&name, &field), reason)),
            );
        }
        Ok(Checked {
            kind: Kind::Map,
            problems,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        let mut problems = Vec::new();
        let mut index = 0;
        while let Some(element) = seq.next_element::<Spanned<Checked>>()? {
            if matches!(element.value.kind, Kind::Map) {
                problems.extend(
                    (element.value.problems.into_iter()).map(|(at, field, reason)| {
                        (at, join(&format!("[{index}]"), &field), reason)
                    }),
                );
            } else {
                // What it holds is not the schema's, so it is not looked into.
                problems.push((
                    element.referenced,
                    format!("[{index}]"),
                    format!(
                        "config error, yaml file contains list of type other than map: {}",
                        element.value.kind.text()
                    ),
                ));
            }
            index += 1;
        }
        Ok(Checked {
            kind: Kind::Seq,
            problems,
        })
    }
}

/// Reads and validates one file in envoyproxy/ratelimit's format, checking its
/// keys first as that loader does. A file with a key problem is read no
/// further: a misspelt key would be reported again as the field it meant
/// being missing.
pub(crate) fn read(file: File<'_>, text: &str) -> Result<(String, Domain), ConfigErrors> {
    let checked: Checked = file.parse(text)?;
    let mut found = Found::default();
    for (at, field, reason) in checked.problems {
        found.push(file.error(at, field, reason));
    }
    found.finish()?;
    compile(file, file.parse(text)?)
}

fn compile(file: File<'_>, root: EnvoyFile) -> Result<(String, Domain), ConfigErrors> {
    let mut found = Found::default();
    for (name, misplaced) in [
        ("algorithm", &root.algorithm),
        ("unit_multiplier", &root.unit_multiplier),
    ] {
        if let Some(at) = misplaced {
            found.push(file.at(
                at,
                name,
                format!("{name} belongs in rate_limit (a Tollgate extension)"),
            ));
        }
    }
    let domain_name = match &root.domain {
        Some(d) if !d.value.0.is_empty() => d.value.0.clone(),
        present => {
            let at = present.as_ref().map(|d| d.referenced);
            found.push(ConfigError {
                path: file.path.to_owned(),
                line: at.map_or(0, |at| at.line()),
                column: at.map_or(0, |at| at.column()),
                field: "domain".into(),
                reason: "config file cannot have empty domain".into(),
            });
            // Never used: the error just found refuses the file.
            String::new()
        }
    };
    let mut domain = Domain {
        source: file.path.display().to_string(),
        envoy: true,
        ..Domain::default()
    };
    let mut path = Vec::new();
    let mut metric = Vec::new();
    load(
        file,
        &mut domain,
        &mut Level {
            path: &mut path,
            value_to_metric: &mut metric,
        },
        "descriptors",
        &root.descriptors.0,
        &mut found,
    );
    found.finish()?;
    Ok((domain_name, domain))
}

/// Where the loader is in the descriptor tree.
struct Level<'a> {
    path: &'a mut Vec<(String, Pattern)>,
    /// `value_to_metric` of each level of `path`.
    value_to_metric: &'a mut Vec<bool>,
}

/// Loads `descriptors` into `domain`. A descriptor with an error is left out
/// with the descriptors nested in it, which could only repeat its error or
/// follow from it.
fn load(
    file: File<'_>,
    domain: &mut Domain,
    level: &mut Level<'_>,
    field: &str,
    descriptors: &[Spanned<EnvoyDescriptor>],
    found: &mut Found,
) {
    let mut seen = HashSet::new();
    for (i, spanned) in descriptors.iter().enumerate() {
        let d = &spanned.value;
        let field = format!("{field}[{i}]");
        let (key, value) = (&d.key.0, &d.value.0);
        let pattern = found.scope(|found| {
            if key.is_empty() {
                found.push(file.at(spanned, format!("{field}.key"), "descriptor has empty key"));
                return None;
            }
            let composite = if value.is_empty() {
                key.clone()
            } else {
                format!("{key}_{value}")
            };
            if level.path.is_empty() {
                domain.top.push((
                    composite.clone(),
                    file.at(
                        spanned,
                        format!("{field}.key"),
                        format!("duplicate descriptor composite key {composite:?}"),
                    ),
                ));
            }
            if !seen.insert(composite.clone()) {
                // Points at the second descriptor's first line.
                found.push(file.at(
                    spanned,
                    format!("{field}.key"),
                    format!("duplicate descriptor composite key {composite:?}"),
                ));
                return None;
            }
            for (name, misplaced) in [
                ("algorithm", &d.algorithm),
                ("unit_multiplier", &d.unit_multiplier),
            ] {
                if let Some(at) = misplaced {
                    found.push(file.at(
                        at,
                        format!("{field}.{name}"),
                        format!("{name} belongs in rate_limit (a Tollgate extension)"),
                    ));
                }
            }
            let share = d.share_threshold.as_ref().filter(|s| s.value == Some(true));
            if let Some(share) = share
                && !composite.contains('*')
            {
                found.push(file.at(
                    share,
                    format!("{field}.share_threshold"),
                    format!("share_threshold can only be used with wildcard values (containing '*'), but found key {composite:?}"),
                ));
            }
            Some(Pattern::envoy(value, share.is_some()))
        });
        let Some(pattern) = pattern else {
            continue;
        };
        level.path.push((key.clone(), pattern));
        level.value_to_metric.push(d.value_to_metric == Some(true));
        // Created even without a limit: a listed value exempts itself from
        // its key's catch-all rule.
        domain.tree.node(level.path);
        let limited = found.scope(|found| {
            if let Some(rate_limit) = &d.rate_limit {
                let field = format!("{field}.rate_limit");
                let rule = found.scope(|found| rule(file, &field, rate_limit, d, level, found))?;
                if let Err(existing) = domain.tree.insert(level.path, Arc::clone(&rule)) {
                    found.push(file.at(
                        spanned,
                        &field,
                        format!("matches the same descriptors as {}", existing.source),
                    ));
                    return None;
                }
                domain.rules.push(rule);
            }
            Some(())
        });
        if limited.is_some() {
            load(
                file,
                domain,
                level,
                &format!("{field}.descriptors"),
                &d.descriptors.0,
                found,
            );
        }
        level.path.pop();
        level.value_to_metric.pop();
    }
}

/// A `rate_limit`'s extension keys: its algorithm and how many units its
/// window is. Envoy's API can neither release a concurrency permit nor hold a
/// request back, so those two algorithms are refused.
fn extension(
    file: File<'_>,
    field: &str,
    r: &EnvoyRateLimit,
    found: &mut Found,
) -> Option<(Algorithm, u32)> {
    let algorithm = match &r.algorithm {
        None => Some(Algorithm::FixedWindow),
        Some(a) => {
            let field = format!("{field}.algorithm");
            let algorithm = a
                .value
                .0
                .parse()
                .map_err(|e: tollgate_core::ParseAlgorithmError| file.at(a, &field, e.to_string()))
                .and_then(|algorithm| {
                    if matches!(
                        algorithm,
                        Algorithm::Concurrency | Algorithm::LeakyBucketShaping { .. }
                    ) {
                        return Err(file.at(
                            a,
                            &field,
                            format!(
                                "{algorithm} is not for envoyproxy/ratelimit's format: Envoy's API can neither release a permit nor hold a request (use the native format)"
                            ),
                        ));
                    }
                    Ok(algorithm)
                });
            found.keep(algorithm)
        }
    };
    let multiplier =
        match &r.unit_multiplier {
            None => Some(1),
            Some(n) => found.keep(u32::try_from(n.value).ok().filter(|&n| n >= 1).ok_or_else(
                || {
                    file.at(
                        n,
                        format!("{field}.unit_multiplier"),
                        format!(
                            "unit_multiplier must be a whole number from 1 to {}, not {}",
                            u32::MAX,
                            n.value
                        ),
                    )
                },
            )),
        };
    Some((algorithm?, multiplier?))
}

/// A descriptor's rule. Its fields are checked each on its own, so each bad
/// one is reported; a field that another needs stops it.
fn rule(
    file: File<'_>,
    field: &str,
    spanned: &Spanned<EnvoyRateLimit>,
    d: &EnvoyDescriptor,
    level: &Level<'_>,
    found: &mut Found,
) -> Option<Arc<Rule>> {
    let r = &spanned.value;
    let name = &r.name.0;
    // The first bad entry, as its loader reports it.
    let bad_replaces = r.replaces.0.iter().find_map(|replaces| {
        if replaces.name.0.is_empty() {
            Some("should not have an empty replaces entry")
        } else if replaces.name.0 == *name {
            Some("replaces should not contain name of same descriptor")
        } else {
            None
        }
    });
    if let Some(reason) = bad_replaces {
        found.push(file.at(spanned, format!("{field}.replaces"), reason));
    }
    let unit_text = r.unit.as_ref().map_or("", |u| u.value.0.as_str());
    let unit = unit_text.parse::<Unit>();
    let action = if r.unlimited == Some(true) {
        // Only a unit it can read is refused; anything else is ignored there.
        if let (Ok(_), Some(at)) = (&unit, &r.unit) {
            found.push(file.at(
                at,
                format!("{field}.unit"),
                "should not specify rate limit unit when unlimited",
            ));
        }
        Action::Unlimited
    } else {
        let unit = found.keep(unit.map_err(|reason| {
            let reason = if unit_text.is_empty() {
                "missing rate limit unit".to_owned()
            } else {
                reason
            };
            match &r.unit {
                Some(u) => file.at(u, format!("{field}.unit"), reason),
                None => file.at(spanned, format!("{field}.unit"), reason),
            }
        }));
        let requests = match &r.requests_per_unit {
            None => Some(0),
            Some(n) => found.keep(u32::try_from(n.value).map_err(|_| {
                file.at(
                    n,
                    format!("{field}.requests_per_unit"),
                    format!(
                        "requests_per_unit must be between 0 and {} (an unsigned 32-bit integer, as envoyproxy/ratelimit reads it), not {}",
                        u32::MAX,
                        n.value
                    ),
                )
            })),
        };
        let extension = extension(file, field, r, found);
        let (unit, requests, (algorithm, multiplier)) = (unit?, u64::from(requests?), extension?);
        let period = unit.duration().saturating_mul(multiplier);
        match Quota::new(requests, period) {
            // envoyproxy/ratelimit's way to block a value outright.
            Err(QuotaError::ZeroLimit) => Action::Block(unit),
            Err(e) => {
                let at = r
                    .requests_per_unit
                    .as_ref()
                    .map_or(spanned.referenced, |n| n.referenced);
                found.push(file.error(at, format!("{field}.requests_per_unit"), e.to_string()));
                return None;
            }
            Ok(quota) => Action::Limit(Limited {
                algorithm,
                quota,
                tiers: None,
                priority: None,
                bucket: None,
                failure: FailurePolicy::default(),
                envoy: if multiplier == 1 {
                    (requests, unit)
                } else {
                    envoy_limit(&quota)
                },
            }),
        }
    };
    let id: Vec<String> = level
        .path
        .iter()
        .map(|(k, p)| match p {
            Pattern::Any => k.clone(),
            Pattern::Exact(v) => format!("{k}_{v}"),
            Pattern::Prefix(v) => format!("{k}_{v}*"),
            Pattern::Glob(g) => format!("{k}_{g}"),
        })
        .collect();
    Some(Arc::new(Rule {
        id: Arc::from(id.join(".")),
        name: Some(name.clone()).filter(|n| !n.is_empty()),
        replaces: r.replaces.0.iter().map(|x| x.name.0.clone()).collect(),
        shadow: d.shadow_mode == Some(true),
        detailed_metric: d.detailed_metric == Some(true),
        value_to_metric: level.value_to_metric.clone(),
        path: level.path.clone(),
        envoy_format: true,
        quota_mode: d.quota_mode == Some(true),
        metadata: d.metadata.as_ref().and_then(|m| m.0.clone()).map(Arc::new),
        // Only envoyproxy/ratelimit's own windows report its whole seconds
        // to the unit's end; an extension reports its algorithm's exact time.
        envoy_window: match action {
            Action::Unlimited => None,
            Action::Block(unit) => Some(unit),
            Action::Limit(ref limited) => (limited.algorithm == Algorithm::FixedWindow
                && limited.quota.period() == limited.envoy.1.duration())
            .then_some(limited.envoy.1),
        },
        action,
        source: file.source(spanned.referenced),
        index: Numbered::default(),
    }))
}
