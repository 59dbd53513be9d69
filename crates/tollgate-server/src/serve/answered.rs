//! What the doors tell the check metrics: each door's own outcome as the
//! result the metrics count.

use std::time::Duration;

use tollgate_observe::metrics::{self, Api, CheckResult};

/// An Envoy door's answer as the check metrics count it.
pub(crate) fn envoy(outcome: tollgate_envoy::Outcome) -> CheckResult {
    match outcome {
        tollgate_envoy::Outcome::Ok => CheckResult::Ok,
        tollgate_envoy::Outcome::OverLimit => CheckResult::OverLimit,
        tollgate_envoy::Outcome::Invalid => CheckResult::Invalid,
    }
}

/// Records one request answered by the gateway: the hook it is spawned with.
pub(crate) fn gateway(outcome: tollgate_gateway::Outcome, elapsed: Duration) {
    let result = match outcome {
        tollgate_gateway::Outcome::Forwarded => CheckResult::Ok,
        tollgate_gateway::Outcome::Limited => CheckResult::OverLimit,
        tollgate_gateway::Outcome::Shed => CheckResult::Shed,
    };
    metrics::check(Api::Gateway, result, elapsed);
}
