//! The Rate Limit Quota Service:
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.
//!
//! A bucket id is mapped onto the policy as a descriptor ([`bucket`]); each
//! rule's quota is split among the Envoys that report for the bucket
//! ([`fleet`], pure logic over injected time); [`service`] serves the
//! streams. [`EnvoyBucket`] is the other end, a bucket as Envoy applies its
//! grants, for tests and the simulator.

mod bucket;
mod envoy;
mod fleet;
mod replicas;
mod service;

pub use bucket::{Target, matched, target};
pub use envoy::{Admission, EnvoyBucket};
pub use fleet::{Answer, BucketStats, Fleet, Grant, Plan, Rule, StreamId, TokenBucket, Usage};
pub use service::{QuotaService, Reported, RuleQuota, UsageSink};
