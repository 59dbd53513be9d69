//! The Rate Limit Quota Service:
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`.
//!
//! A bucket id is mapped onto the policy as a descriptor ([`bucket`]); each
//! rule's quota is split among the Envoys that report for the bucket
//! ([`fleet`], pure logic over injected time); [`service`] serves the
//! streams.

mod bucket;
mod fleet;
mod replicas;
mod service;

pub use bucket::{Target, matched, target};
pub use fleet::{BucketStats, Fleet, Grant, Plan, StreamId, TokenBucket, Usage};
pub use service::{QuotaService, Reported, RuleQuota, UsageSink};
