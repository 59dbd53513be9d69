//! The flags of what the check APIs take of a request: the body policy
//! they set is [`tollgate_listen::bodies`]'s (both the HTTP API and
//! tollgate-envoy's gRPC door read bodies by it), the string caps the
//! enforcer's ([`tollgate_policy::RequestLimits`]), the same at every door.

use std::time::Duration;

use tollgate_envoy::{Overload, OverloadAnswer};
use tollgate_listen::bodies::Bodies;
use tollgate_policy::RequestLimits;

/// The flags of what the check APIs take of a request; each also comes from
/// its `TOLLGATE_*` variable.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "requests")]
pub(crate) struct Args {
    /// The largest gRPC message and HTTP request body the check APIs take,
    /// in bytes (`RESOURCE_EXHAUSTED`, 413 beyond); a rate limit request
    /// takes a few hundred.
    #[arg(
        long,
        env = "TOLLGATE_MAX_REQUEST_BYTES",
        value_name = "BYTES",
        default_value_t = 64 * 1024,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_request_bytes: u32,

    /// How long a check API request's body may take to arrive, from its
    /// head; a gRPC call is answered within it too (`DEADLINE_EXCEEDED`, 408
    /// beyond).
    #[arg(
        long,
        env = "TOLLGATE_BODY_READ_TIMEOUT",
        value_name = "DURATION",
        default_value = "10s",
        value_parser = super::listeners::positive_duration
    )]
    pub(crate) body_read_timeout: Duration,

    /// The most bytes of check API request bodies being read at once, over
    /// every listener; a body counts its declared length, or
    /// `--max-request-bytes` when it declares none. Past it, a request is
    /// refused at once (`RESOURCE_EXHAUSTED`, 503).
    #[arg(
        long,
        env = "TOLLGATE_REQUEST_BODY_BUDGET",
        value_name = "BYTES",
        default_value_t = 64 * 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) request_body_budget: u64,

    /// The longest domain a check may name, in bytes (`INVALID_ARGUMENT`,
    /// 400 beyond).
    #[arg(
        long,
        env = "TOLLGATE_MAX_DOMAIN_BYTES",
        value_name = "BYTES",
        default_value_t = RequestLimits::default().domain_bytes
    )]
    pub(crate) max_domain_bytes: usize,

    /// The longest descriptor entry key, in bytes.
    #[arg(
        long,
        env = "TOLLGATE_MAX_KEY_BYTES",
        value_name = "BYTES",
        default_value_t = RequestLimits::default().key_bytes
    )]
    pub(crate) max_key_bytes: usize,

    /// The longest descriptor entry value, and `/v1/check`'s ad-hoc `key`,
    /// in bytes.
    #[arg(
        long,
        env = "TOLLGATE_MAX_VALUE_BYTES",
        value_name = "BYTES",
        default_value_t = RequestLimits::default().value_bytes
    )]
    pub(crate) max_value_bytes: usize,

    /// The most gRPC checks in flight at once, over every connection; past
    /// it, a call is read but not checked: answered what is known without
    /// the store (a key the deny cache knows is over), else
    /// `--overload-answer`.
    #[arg(
        long,
        env = "TOLLGATE_MAX_CHECKS_IN_FLIGHT",
        value_name = "N",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_checks_in_flight: u32,

    /// What the gRPC door answers a call it cannot check in time (past
    /// `--max-checks-in-flight`, or reached past three quarters of its
    /// deadline): `over_limit` (Envoy denies: limits hold at the peak) or
    /// `unavailable` (Envoy decides by its `failure_mode_deny`).
    #[arg(
        long,
        env = "TOLLGATE_OVERLOAD_ANSWER",
        value_name = "ANSWER",
        default_value = "over_limit"
    )]
    pub(crate) overload_answer: OverloadAnswer,
}

impl Args {
    /// The enforcer's limits on a request's strings.
    pub(crate) fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            domain_bytes: self.max_domain_bytes,
            key_bytes: self.max_key_bytes,
            value_bytes: self.max_value_bytes,
            ..RequestLimits::default()
        }
    }

    /// The gRPC door's bound on checks in flight and its overload answer.
    pub(crate) fn overload(&self) -> Overload {
        Overload::new(self.overload_answer, self.max_checks_in_flight as usize)
    }

    /// The body policy these flags set.
    pub(crate) fn bodies(&self) -> Bodies {
        Bodies::new(
            self.max_request_bytes,
            self.body_read_timeout,
            self.request_body_budget,
        )
    }
}
