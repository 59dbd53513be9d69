use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tollgate_core::Quota;

use crate::RequestError;

/// One `(key, value)` pair of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// What the value is, e.g. `remote_address`.
    pub key: String,
    /// The value, e.g. `10.0.0.1`.
    pub value: String,
}

impl Entry {
    /// An entry from anything string-like.
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A limit given by the caller instead of the config (Envoy's `limit` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u64,
    /// The unit.
    pub unit: Unit,
}

/// One descriptor: the entries that identify whose budget a request spends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// The entries, in order.
    pub entries: Vec<Entry>,
    /// A limit that replaces the configured one for this descriptor.
    pub limit: Option<LimitOverride>,
    /// What this descriptor costs; overrides the request's `hits_addend`.
    pub hits_addend: Option<u64>,
}

/// A rate limit request: a domain and its descriptors.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The domain whose rules apply.
    pub domain: &'a str,
    /// One descriptor per layer.
    pub descriptors: &'a [Descriptor],
    /// What each descriptor costs unless it says otherwise (Envoy treats 0 as 1).
    pub hits_addend: u64,
}

impl Request<'_> {
    /// Whether Tollgate's own API takes this request, which is stricter than
    /// envoyproxy/ratelimit's protocol. Both refuse an empty domain and an
    /// empty descriptor list. Tollgate's API also refuses a descriptor
    /// without entries and an entry with an empty key, which the Envoy doors
    /// answer as matching no rule, and a limit override that is no quota,
    /// where the Envoy doors block a `requests_per_unit` of 0.
    ///
    /// # Errors
    ///
    /// The first problem found, in that order.
    pub fn well_formed(&self) -> Result<(), RequestError> {
        if self.domain.is_empty() {
            return Err(RequestError::EmptyDomain);
        }
        if self.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        for (index, descriptor) in self.descriptors.iter().enumerate() {
            if descriptor.entries.is_empty() {
                return Err(RequestError::EmptyDescriptor { index });
            }
            if descriptor.entries.iter().any(|e| e.key.is_empty()) {
                return Err(RequestError::EmptyKey { index });
            }
            if let Some(o) = descriptor.limit {
                Quota::new(o.requests_per_unit, o.unit.duration()).map_err(|e| {
                    RequestError::InvalidOverride {
                        index,
                        reason: e.to_string(),
                    }
                })?;
            }
        }
        Ok(())
    }
}

/// Envoy's time units, with the lengths envoyproxy/ratelimit gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length.
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// The unit's name in lower case, as configs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Unit {
    type Err = String;

    /// Case-insensitive, as envoyproxy/ratelimit reads it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("invalid rate limit unit {s:?}; expected second, minute, hour, day, week, month or year")
            })
    }
}
