//! A domain's load shedding ([`Shedding`], its native `shed:` section): the
//! protected service behind the domain reports its utilization (Tollgate
//! does not see it, as it does an upstream it proxies), and the enforcer
//! sheds requests by priority tier against the same thresholds as the
//! gateway's shedder.
//!
//! ```yaml
//! shed:
//!   priority_key: priority   # the descriptor entry that names the tier
//!   thresholds: { critical: 100, high: 75, low: 50 }
//!   report_ttl: 10s          # a report older than this sheds nothing
//!   retry_after: 1s          # a shed request's Retry-After
//! ```

use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;
use tollgate_core::{Thresholds, Tier};

use crate::config::{File, Found};
use crate::{Descriptor, parse_duration};

/// How a domain sheds on reported utilization. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shedding {
    priority_key: String,
    thresholds: Thresholds,
    report_ttl: Duration,
    retry_after: Duration,
}

impl Shedding {
    /// The descriptor entry whose value names a request's tier.
    pub fn priority_key(&self) -> &str {
        &self.priority_key
    }

    /// The utilization each tier may fill.
    pub fn thresholds(&self) -> Thresholds {
        self.thresholds
    }

    /// How long a utilization report counts: a service that stops reporting
    /// stops being shed for, rather than shed for ever on its last word.
    pub fn report_ttl(&self) -> Duration {
        self.report_ttl
    }

    /// A shed request's `Retry-After`.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// The tier of a request: the value of the first entry named
    /// [`Shedding::priority_key`] in its descriptors (as the gateway's
    /// `x-priority` header makes it); none, or a value that is not a tier,
    /// is low.
    pub fn tier(&self, descriptors: &[Descriptor]) -> Tier {
        descriptors
            .iter()
            .flat_map(|d| &d.entries)
            .find(|e| e.key == self.priority_key)
            .map_or(Tier::Low, |e| Tier::from_header(e.value.as_bytes()))
    }
}

/// The `shed:` section as written; every field has a default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShedSpec {
    priority_key: Option<Spanned<String>>,
    thresholds: Option<Spanned<ThresholdsSpec>>,
    report_ttl: Option<Spanned<String>>,
    retry_after: Option<Spanned<String>>,
}

/// `thresholds: {critical, high, low}` as a `shed` section writes them, the
/// policy's and the gateway's alike: each tier's percent, all three given.
/// Checked by [`Thresholds::validate`] once converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThresholdsSpec {
    /// The utilization critical requests may fill.
    pub critical: u32,
    /// The utilization high-priority requests may fill.
    pub high: u32,
    /// The utilization low-priority requests may fill.
    pub low: u32,
}

impl From<ThresholdsSpec> for Thresholds {
    fn from(
        ThresholdsSpec {
            critical,
            high,
            low,
        }: ThresholdsSpec,
    ) -> Self {
        Thresholds {
            critical,
            high,
            low,
        }
    }
}

impl From<Thresholds> for ThresholdsSpec {
    fn from(
        Thresholds {
            critical,
            high,
            low,
        }: Thresholds,
    ) -> Self {
        ThresholdsSpec {
            critical,
            high,
            low,
        }
    }
}

/// The section's [`Shedding`], each bad field reported at its line.
pub(crate) fn shedding(
    file: File<'_>,
    spanned: &Spanned<ShedSpec>,
    found: &mut Found,
) -> Option<Shedding> {
    let spec = &spanned.value;
    let priority_key = match &spec.priority_key {
        Some(key) if key.value.is_empty() => {
            found.push(file.at(key, "shed.priority_key", "must not be empty"));
            None
        }
        Some(key) => Some(key.value.clone()),
        None => Some("priority".to_owned()),
    };
    let thresholds = match &spec.thresholds {
        Some(t) => found.keep(
            Thresholds::from(t.value)
                .validate()
                .map_err(|e| file.at(t, "shed.thresholds", e.to_string())),
        ),
        None => Some(Thresholds::default()),
    };
    let mut duration = |value: &Option<Spanned<String>>, field: &str, default: Duration| {
        let Some(value) = value else {
            return Some(default);
        };
        let field = format!("shed.{field}");
        match parse_duration(&value.value) {
            Ok(d) if d.is_zero() => {
                found.push(file.at(value, field, "must be longer than 0"));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                found.push(file.at(value, field, e.to_string()));
                None
            }
        }
    };
    let report_ttl = duration(&spec.report_ttl, "report_ttl", Duration::from_secs(10));
    let retry_after = duration(&spec.retry_after, "retry_after", Duration::from_secs(1));
    Some(Shedding {
        priority_key: priority_key?,
        thresholds: thresholds?,
        report_ttl: report_ttl?,
        retry_after: retry_after?,
    })
}
