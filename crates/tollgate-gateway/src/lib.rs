//! Tollgate's gateway: a rate limiting reverse proxy in front of one
//! upstream (`tollgate serve --proxy-listen ADDR --upstream URL`).
//!
//! It is made of `tollgate_http`'s [`RateLimitLayer`] around a proxy: each
//! request's descriptors come from the configured actions (Envoy's
//! route-level `rate_limits`; without any, one descriptor
//! `remote_address=<client IP>`), the layer checks them with the service's
//! [`Enforcer`] (its policy, kill switch and store, shared with the other
//! doors, so reloads and budgets are one), answers a deny with `429` and a
//! JSON body, holds a shaped request for its delay, and puts the rate limit
//! headers on every response; the proxy forwards what is admitted over a
//! pool of kept-alive upstream connections and streams the answer back.
//!
//! The client side is hyper's HTTP/1.1 server with its limits set
//! explicitly. A request with both `Content-Length` and `Transfer-Encoding`
//! is read by its chunked coding, without the length, and its connection
//! closed after the answer (RFC 9112 §6.3, hyper's parser), so nothing
//! smuggled after the body is read as a request. It runs on one worker
//! thread per CPU, each with its own listener on the shared address
//! (`SO_REUSEPORT`), runtime and upstream pool.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tollgate_gateway::{Gateway, Options, Settings};
//! use tollgate_policy::{Enforcer, Policy};
//! use tollgate_store::MemoryStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = Options {
//!     proxy_listen: Some("127.0.0.1:8000".into()),
//!     upstream: Some("http://127.0.0.1:9000".parse()?),
//!     ..Options::default()
//! };
//! let settings = Settings::resolve(options)?.expect("asked for a gateway");
//! let policy = Policy::builtin();
//! let gateway = Gateway::bind(settings, &policy).await?;
//! println!("listening on {}", gateway.local_addr());
//! let enforcer = Arc::new(Enforcer::new(policy, MemoryStore::default()));
//! let (_stop, stopped) = tokio::sync::watch::channel(());
//! gateway.spawn(&enforcer, stopped, |_outcome, _elapsed| {}).await??;
//! # Ok(())
//! # }
//! ```
//!
//! Its workers take connections as every listener of the service does,
//! through `tollgate_listen`.
//!
//! See `docs/gateway.md` for the flags, the config file and the actions.
//!
//! [`RateLimitLayer`]: tollgate_http::RateLimitLayer
//! [`Enforcer`]: tollgate_policy::Enforcer

mod actions;
mod config;
mod gateway;
mod pool;
mod proxy;
mod routes;
mod settings;
mod workers;

pub use config::Cidr;
pub use gateway::{Error, Gateway, Outcome};
pub use proxy::{Upstream, UpstreamError};
pub use settings::{Options, Settings, SettingsError};
