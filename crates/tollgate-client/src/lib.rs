//! A client for rate-limited HTTP APIs.
//!
//! [`Client`] wraps a `reqwest::Client` and does what a well-behaved client
//! of a rate-limited API does:
//!
//! - on `429 Too Many Requests` or `503 Service Unavailable`, waits at least
//!   `Retry-After` (delta-seconds or an HTTP-date) before sending again, or,
//!   without it, until the reset the headers announce, or else for a capped
//!   exponential backoff with full jitter;
//! - gives up after [`RetryConfig::max_retries`] retries with a typed
//!   [`Error`];
//! - slows down before the limit is exhausted: from `RateLimit`
//!   (draft-ietf-httpapi-ratelimit-headers-10) or `X-RateLimit-Remaining` and
//!   the reset, it spreads the remaining requests over the time to the reset,
//!   and with none left waits for it;
//! - tracks Discord-style shared buckets (`X-RateLimit-Bucket`): once a
//!   route is known to spend a bucket, its requests wait when that bucket is
//!   exhausted through any route.
//!
//! Time and randomness are injected ([`Clock`], any [`rand::Rng`]), so the
//! schedule is tested with a [`ManualClock`] and a seeded RNG.
//!
//! ```no_run
//! # async fn run() -> Result<(), tollgate_client::Error> {
//! let client = tollgate_client::Client::new(reqwest::Client::new());
//! let response = client.send(client.http().get("http://localhost:3000/hello")).await?;
//! println!("{}", response.status());
//! # Ok(())
//! # }
//! ```
//!
//! The crate enables no TLS backend of `reqwest`: an application that calls
//! `https://` APIs enables one (e.g. `reqwest/rustls`) in its own manifest.

mod client;
mod clock;
mod error;
mod info;
mod schedule;

pub use client::Client;
pub use clock::{Clock, ManualClock, TokioClock};
pub use error::Error;
pub use info::{RateLimitInfo, parse_retry_after};
pub use schedule::{Next, Pacer, RetryConfig};
