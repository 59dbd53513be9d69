//! envoyproxy/ratelimit's Rate Limit Service: its two doors (gRPC
//! `ShouldRateLimit` and `/json`) and the answer model they share.

mod answer;
mod encode;
mod json;
mod overload;
mod service;

pub use answer::{Answered, DEFAULT_NAMES, HeaderFamily, Outcome, Reply, ReplyError};
pub use json::json;
pub use overload::{Overload, OverloadAnswer};
pub use service::{Admits, GrpcService, RateLimitGrpc};
