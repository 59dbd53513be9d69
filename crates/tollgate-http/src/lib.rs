//! Tollgate over HTTP: rate limit headers, the client address behind trusted
//! proxies, and a tower layer that puts a Tollgate policy in front of any
//! axum, hyper or tonic service.
//!
//! - [`headers`]: the one place that turns decisions into response headers:
//!   `X-RateLimit-Limit`/`-Remaining`/`-Reset` (the reset a stable epoch
//!   second), Discord's `X-RateLimit-Reset-After` and `X-RateLimit-Bucket`, the
//!   IETF draft's `RateLimit-Policy` and `RateLimit` ([`headers::DRAFT`]), and
//!   `Retry-After` on every deny; [`HeaderStyle`] picks the families.
//! - [`ClientIpConfig`]: `X-Forwarded-For` or `Forwarded` are believed only
//!   from trusted proxies, right-most untrusted hop first; IPv6 clients are
//!   keyed by their /64.
//! - [`RateLimitLayer`]: descriptors from the request ([`DescriptorSource`]:
//!   client IP, a header or pseudo-header, a header match, method and
//!   route, fixed values, composites: Envoy's rate limit actions),
//!   resolved by a [`tollgate_policy::Policy`], checked in one store call,
//!   with an optional local pre-check in front; 429 with a JSON body when
//!   denied (RFC 9457 problem details for clients that ask, [`problem`]),
//!   headers on every response.
//! - [`ShedLayer`]: load shedding by priority tier (`x-priority`) on an
//!   adaptive concurrency limit learned from the wrapped service's latency;
//!   503 with `Retry-After` for a shed request.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use tollgate_http::RateLimitLayer;
//! use tollgate_policy::Policy;
//! use tollgate_store::MemoryStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::parse("inline", "
//! domain: api
//! rules:
//!   - name: per-ip
//!     match: [{ key: remote_address }]
//!     limit: { requests: 100, per: 1m }
//! ")?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::builder("api", policy, MemoryStore::default()).build());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```

mod client_ip;
mod grpc;
pub mod headers;
mod layer;
pub mod problem;
pub mod shed;

pub use client_ip::{ClientIpConfig, ForwardedHeader, IpText};
pub use headers::{HeaderStyle, LimitReport};
pub use layer::{
    Builder, ClientIpKey, Composite, DescriptorSource, FixedKey, HeaderKey, HeaderMatch,
    HeaderMatcher, InvalidField, PolicyHandle, RateLimit, RateLimitLayer, RequestField,
    ResponseBody, RouteKey, RouteTemplate, ValueTest, future,
};
pub use shed::{
    InFlight, Overloaded, Shed, ShedConfig, ShedConfigError, ShedLayer, Shedder, Snapshot,
    Thresholds, Tier,
};
