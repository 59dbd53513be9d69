//! Everything that speaks Envoy.
//!
//! Today: the Rate Limit Quota Service ([`rlqs`]), which Envoy's
//! `envoy.filters.http.rate_limit_quota` filter streams its buckets' usage
//! to, and which answers with the share of each bucket's global quota that
//! Envoy enforces on its own (`docs/envoy.md`, *Rate Limit Quota Service*).

pub mod rlqs;
