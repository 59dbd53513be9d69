//! Everything of Tollgate that speaks Envoy: the Rate Limit Service
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC,
//! and envoyproxy/ratelimit's `/json`) answering from the shared
//! [`Enforcer`](tollgate_policy::Enforcer); the Rate Limit Quota Service
//! ([`rlqs`]), which Envoy's `envoy.filters.http.rate_limit_quota` filter
//! streams its buckets' usage to, and which answers with the share of each
//! bucket's global quota that Envoy enforces on its own (`docs/envoy.md`,
//! *Rate Limit Quota Service*); health as Envoy's probes see it (the gRPC
//! health service and `/healthcheck`); envoyproxy/ratelimit's settings
//! ([`settings`]), read into a value the server applies, with the TLS they
//! configure; and its xDS client.
//!
//! The server wires these to its listeners; what it records of each answer
//! it gives as a hook ([`Answered`]).

mod error;
mod health;
pub mod rlqs;
mod rls;
pub mod settings;
mod tls;
mod xds;

pub use error::SettingsError;
pub use health::Health;
pub use rls::{
    Admits, Answered, DEFAULT_NAMES, GrpcService, HeaderFamily, Outcome, Overload, OverloadAnswer,
    RateLimitGrpc, Reply, ReplyError, json,
};
pub use tls::{GrpcTlsFlags, Named, RedisFiles, RedisTlsFlags, ServerFiles};
pub use xds::{Settings as XdsSettings, follow as follow_xds};
