//! What Tollgate's service observes of each decision, depending on the
//! enforcer's [`Observer`](tollgate_policy::Observer) alone: the Prometheus
//! metrics ([`metrics`], with envoyproxy/ratelimit's per-rule stats) and the
//! live page with its data ([`live`], with what the store says of its health
//! in [`store_health`]).
//!
//! Each observer keeps a rule's series in a slot of its own, found by the
//! rule's index in its policy (`per_rule`), so a decision counts with one
//! atomic add once its series exist.

pub mod live;
pub mod metrics;
mod per_rule;
pub mod store_health;
