//! envoyproxy/ratelimit's config format, read unchanged.
//!
//! Its limits are fixed windows aligned to the unit, as that service counts
//! them, so the same config gives the same decisions.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;
use tollgate_core::{Algorithm, Quota, QuotaError};

use crate::config::File;
use crate::policy::Domain;
use crate::rule::{Action, Limited};
use crate::tree::Pattern;
use crate::{ConfigError, FailurePolicy, Rule, Unit};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnvoyFile {
    domain: Spanned<String>,
    #[serde(default)]
    descriptors: Vec<Spanned<EnvoyDescriptor>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvoyDescriptor {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: Option<String>,
    rate_limit: Option<Spanned<EnvoyRateLimit>>,
    #[serde(default)]
    descriptors: Vec<Spanned<EnvoyDescriptor>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvoyRateLimit {
    requests_per_unit: Option<Spanned<u64>>,
    unit: Option<Spanned<String>>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaces>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Replaces {
    #[serde(default)]
    name: String,
}

pub(crate) fn compile(file: File<'_>, root: EnvoyFile) -> Result<(String, Domain), ConfigError> {
    if root.domain.value.is_empty() {
        return Err(file.at(
            &root.domain,
            "domain",
            "config file cannot have an empty domain",
        ));
    }
    let mut domain = Domain {
        source: file.path.display().to_string(),
        ..Domain::default()
    };
    let mut path = Vec::new();
    load(
        file,
        &mut domain,
        &mut path,
        "descriptors",
        &root.descriptors,
    )?;
    Ok((root.domain.value, domain))
}

fn load(
    file: File<'_>,
    domain: &mut Domain,
    path: &mut Vec<(String, Pattern)>,
    field: &str,
    descriptors: &[Spanned<EnvoyDescriptor>],
) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for (i, spanned) in descriptors.iter().enumerate() {
        let d = &spanned.value;
        let field = format!("{field}[{i}]");
        if d.key.is_empty() {
            return Err(file.at(
                spanned,
                format!("{field}.key"),
                "descriptor has an empty key",
            ));
        }
        let composite = match d.value.as_deref() {
            Some(v) if !v.is_empty() => format!("{}_{v}", d.key),
            _ => d.key.clone(),
        };
        if !seen.insert(composite.clone()) {
            // Points at the second descriptor's first line.
            return Err(file.at(
                spanned,
                format!("{field}.key"),
                format!("duplicate descriptor composite key {composite:?}"),
            ));
        }
        path.push((d.key.clone(), Pattern::parse(d.value.as_deref())));
        if let Some(rate_limit) = &d.rate_limit {
            let id: Vec<String> = path
                .iter()
                .map(|(k, p)| match p {
                    Pattern::Any => k.clone(),
                    Pattern::Exact(v) => format!("{k}_{v}"),
                    Pattern::Prefix(v) => format!("{k}_{v}*"),
                })
                .collect();
            let rule = rule(
                file,
                &format!("{field}.rate_limit"),
                rate_limit,
                d,
                id.join("."),
            )?;
            if let Err(existing) = domain.tree.insert(path, Arc::clone(&rule)) {
                return Err(file.at(
                    spanned,
                    field,
                    format!("matches the same descriptors as {}", existing.source),
                ));
            }
            domain.rules.push(rule);
        }
        load(
            file,
            domain,
            path,
            &format!("{field}.descriptors"),
            &d.descriptors,
        )?;
        path.pop();
    }
    Ok(())
}

fn rule(
    file: File<'_>,
    field: &str,
    spanned: &Spanned<EnvoyRateLimit>,
    d: &EnvoyDescriptor,
    id: String,
) -> Result<Arc<Rule>, ConfigError> {
    let r = &spanned.value;
    for replaces in &r.replaces {
        if replaces.name.is_empty() {
            return Err(file.at(
                spanned,
                format!("{field}.replaces"),
                "should not have an empty replaces entry",
            ));
        }
        if r.name.as_deref() == Some(replaces.name.as_str()) {
            return Err(file.at(
                spanned,
                format!("{field}.replaces"),
                "replaces should not contain the name of the same descriptor",
            ));
        }
    }
    let unit = r.unit.as_ref().filter(|u| !u.value.is_empty());
    let requests = r.requests_per_unit.as_ref().map_or(0, |n| n.value);
    let action = if r.unlimited {
        if let Some(unit) = unit {
            return Err(file.at(
                unit,
                format!("{field}.unit"),
                "should not specify rate limit unit when unlimited",
            ));
        }
        Action::Unlimited
    } else {
        let unit: Unit = match unit {
            None => {
                return Err(file.at(spanned, format!("{field}.unit"), "missing rate limit unit"));
            }
            Some(u) => u
                .value
                .parse()
                .map_err(|reason| file.at(u, format!("{field}.unit"), reason))?,
        };
        match Quota::new(requests, unit.duration()) {
            // envoyproxy/ratelimit's way to block a value outright.
            Err(QuotaError::ZeroLimit) => Action::Block(unit),
            Err(e) => {
                let at = r
                    .requests_per_unit
                    .as_ref()
                    .map_or(spanned.referenced, |n| n.referenced);
                return Err(file.error(at, format!("{field}.requests_per_unit"), e.to_string()));
            }
            Ok(quota) => Action::Limit(Limited {
                algorithm: Algorithm::FixedWindow,
                quota,
                tiers: None,
                priority: None,
                bucket: None,
                failure: FailurePolicy::default(),
                envoy: (requests, unit),
            }),
        }
    };
    Ok(Arc::new(Rule {
        id: Arc::from(id),
        name: r.name.clone().filter(|n| !n.is_empty()),
        replaces: r.replaces.iter().map(|x| x.name.clone()).collect(),
        shadow: d.shadow_mode,
        detailed_metric: d.detailed_metric,
        action,
        source: file.source(spanned.referenced),
    }))
}
