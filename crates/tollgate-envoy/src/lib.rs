//! Everything of Tollgate that speaks Envoy: the Rate Limit Service
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC,
//! and envoyproxy/ratelimit's `/json`) answering from the shared
//! [`Enforcer`](tollgate_policy::Enforcer), and health as Envoy's probes see
//! it (the gRPC health service and `/healthcheck`).
//!
//! The server wires these to its listeners; what it records of each answer
//! it gives as a hook ([`Answered`]).

mod health;
mod rls;

pub use health::Health;
pub use rls::{
    Admits, Answered, DEFAULT_NAMES, GrpcService, HeaderFamily, Outcome, RateLimitGrpc, Reply,
    ReplyError, json,
};
