use std::path::PathBuf;

/// A config that cannot be used: where, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{column}: {field}: {reason}", path.display())]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line; 0 when the problem is the file as a whole.
    pub line: u64,
    /// 1-based column; 0 when unknown.
    pub column: u64,
    /// The field at fault, as a path such as `rules[2].limit.per`.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// A rule whose limit the store in use cannot enforce exactly (a quota past
/// what its numbers hold), found when a config loads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: rule `{rule}` of domain `{domain}`: {reason}")]
pub struct Unsupported {
    /// Where the rule is defined, as `file:line`.
    pub location: String,
    /// The rule's domain.
    pub domain: String,
    /// The rule's id.
    pub rule: String,
    /// Why the store cannot enforce it.
    pub reason: String,
}

/// Why [`Enforcer::reset`](crate::Enforcer::reset) reset nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResetError {
    /// The request cannot be resolved as it stands.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The store could not forget the state.
    #[error("the store did not reset: {0}")]
    Store(#[from] tollgate_core::StoreError),
}

/// A request that cannot be checked as it stands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The domain is empty.
    #[error("rate limit domain must not be empty")]
    EmptyDomain,
    /// There are no descriptors.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
    /// A descriptor has no entries ([`crate::Request::well_formed`] only).
    #[error("descriptor {index} has no entries")]
    EmptyDescriptor {
        /// Which descriptor.
        index: usize,
    },
    /// An entry has an empty key ([`crate::Request::well_formed`] only).
    #[error("descriptor {index} has an entry with an empty key")]
    EmptyKey {
        /// Which descriptor.
        index: usize,
    },
    /// The request has more descriptors than the enforcer takes.
    #[error("the request has {count} descriptors; at most {max} are taken")]
    TooManyDescriptors {
        /// How many it has.
        count: usize,
        /// The most the enforcer takes ([`crate::RequestLimits`]).
        max: usize,
    },
    /// A descriptor has more entries than the enforcer takes.
    #[error("descriptor {index} has {count} entries; at most {max} are taken")]
    TooManyEntries {
        /// Which descriptor.
        index: usize,
        /// How many entries it has.
        count: usize,
        /// The most the enforcer takes ([`crate::RequestLimits`]).
        max: usize,
    },
    /// A string of the request is longer than the enforcer takes.
    #[error("{what} has {len} bytes; at most {max} are taken")]
    TooLong {
        /// Which string.
        what: String,
        /// Its length in bytes.
        len: usize,
        /// The most the enforcer takes ([`crate::RequestLimits`]).
        max: usize,
    },
    /// The request's own limit (an ad-hoc limit, or descriptor `index`'s
    /// override) is one the store cannot enforce exactly.
    #[error("{}the store cannot enforce this limit exactly: {reason}", descriptor.map(|i| format!("descriptor {i}: ")).unwrap_or_default())]
    UnsupportedLimit {
        /// Which descriptor; `None` for an ad-hoc limit.
        descriptor: Option<usize>,
        /// Why.
        reason: String,
    },
    /// A limit override is not a usable quota.
    #[error("descriptor {index} has an invalid limit override: {reason}")]
    InvalidOverride {
        /// Which descriptor.
        index: usize,
        /// Why.
        reason: String,
    },
}

/// A utilization report refused (`POST /v1/utilization`): the service can
/// fix it and report again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// The domain is not defined, or has no `shed:` section.
    #[error("domain {0:?} does not shed: give it a `shed:` section to report its utilization")]
    NoShedding(String),
    /// The instance's name is longer than an entry's value may be.
    #[error("instance must be at most {0} bytes")]
    InstanceTooLong(usize),
    /// The domain holds reports of as many instances as it keeps.
    #[error(
        "domain {domain:?} already holds fresh reports of {max} instances; report through fewer"
    )]
    TooManyInstances {
        /// The domain.
        domain: String,
        /// How many instances a domain keeps reports of.
        max: usize,
    },
}
