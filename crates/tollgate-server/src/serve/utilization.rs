//! `POST /v1/utilization`: the service behind a domain reports its load,
//! which Tollgate does not see (it stands beside the service, answering
//! checks, rather than in front of it as the gateway does). While a report
//! is fresh (the domain's `shed.report_ttl`), the domain's checks are shed
//! by priority tier at every door: see `tollgate_policy::Shedding`.
//!
//! `{"domain": "api", "instance": "pod-7", "utilization": 0.82}`, or the
//! same with `"in_flight": 41, "limit": 50` in place of `utilization`.
//! `instance` (optional) names the reporter: the domain's utilization is the
//! mean of its instances' fresh reports, each instance's latest replacing
//! its last. Answers `{"domain": "api", "utilization": 0.61, "instances":
//! 3}`, what the domain's checks are shed at now.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tollgate_core::{Store, Utilization};

use super::state::{ApiError, AppState};

/// The body of `POST /v1/utilization`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Report {
    domain: String,
    #[serde(default)]
    instance: String,
    utilization: Option<f64>,
    in_flight: Option<u64>,
    limit: Option<u64>,
}

impl Report {
    fn utilization(&self) -> Result<Utilization, ApiError> {
        let utilization = match (self.utilization, self.in_flight, self.limit) {
            (Some(fraction), None, None) => Utilization::from_fraction(fraction),
            (None, Some(in_flight), Some(limit)) => Utilization::from_in_flight(in_flight, limit),
            _ => {
                return Err(ApiError::bad_request(
                    "expected `utilization` (0.8 is 80 %) or both `in_flight` and `limit`",
                ));
            }
        };
        utilization.map_err(|e| ApiError::bad_request(e.to_string()))
    }
}

pub(crate) async fn report<S: Store + 'static>(
    State(state): State<Arc<AppState<S>>>,
    body: Bytes,
) -> Response {
    let answer = Json::<Report>::from_bytes(&body)
        .map_err(|r| ApiError::bad_request(r.body_text()))
        .and_then(|Json(report)| {
            let utilization = report.utilization()?;
            state
                .enforcer
                .report_utilization(&report.domain, &report.instance, utilization)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok(report.domain)
        });
    match answer {
        Ok(domain) => {
            // Read back rather than echoed: what checks are shed at is the
            // mean over the domain's instances.
            let (utilization, instances) = state
                .enforcer
                .reported_utilization(&domain)
                .map_or((None, 0), |(u, n)| {
                    (Some(f64::from(u.percent()) / 100.0), n)
                });
            Json(serde_json::json!({
                "domain": domain,
                "utilization": utilization,
                "instances": instances,
            }))
            .into_response()
        }
        Err(error) => error.into_response(),
    }
}
