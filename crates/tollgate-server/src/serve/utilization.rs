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
//!
//! Reports live in the store: in memory, the receiving instance's; with
//! `--redis`, in Redis too ([`Shared`]), so a report posted to one replica
//! sheds at every replica alike.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::watch;
use tollgate_core::{Store, StoreError, Utilization};
use tollgate_policy::{Enforcer, UtilizationReport};
use tollgate_redis::Cells;

use super::state::{ApiError, AppState};

/// How often a replica reads the reports the others shared: a report
/// posted to one replica sheds at the others within this.
pub(crate) const SYNC: Duration = Duration::from_secs(1);

/// A write that lost to another replica's is tried again this many times.
const ATTEMPTS: u32 = 8;

/// The utilization reports of every shedding domain, shared by the replicas
/// of one Redis: each domain's fresh reports (each instance's latest) in one
/// compare-and-set cell, `utilization:<domain>`, which lapses one
/// `shed.report_ttl` after its last write, so a fleet that stops reporting
/// leaves nothing behind.
pub(crate) struct Shared {
    cells: Cells,
}

/// A report as the cell keeps it: instance, percent, epoch nanoseconds.
type Wire = (String, u32, u64);

impl Shared {
    pub(crate) fn new(cells: Cells) -> Self {
        Self { cells }
    }

    /// Takes the shared reports of `domain` into `enforcer`'s, then writes
    /// back the union (this replica's own included), pruned of stale ones.
    pub(crate) async fn publish<S: Store>(
        &self,
        enforcer: &Enforcer<S>,
        domain: &str,
    ) -> Result<(), StoreError> {
        let Some(ttl) = enforcer.policy().shedding(domain).map(|s| s.report_ttl()) else {
            return Ok(());
        };
        for _ in 0..ATTEMPTS {
            let version = self.pull(enforcer, domain).await?;
            let reports: Vec<Wire> = enforcer
                .utilization_reports(domain)
                .into_iter()
                .map(|r| (r.instance, r.utilization.percent(), r.at))
                .collect();
            let value = serde_json::to_vec(&reports).expect("reports serialize");
            if self.cells.put(&key(domain), version, &value, ttl).await? {
                return Ok(());
            }
        }
        Err(StoreError::Backend {
            retryable: true,
            source: format!("the reports of {domain:?} kept changing under {ATTEMPTS} writes")
                .into(),
        })
    }

    /// Takes the shared reports of `domain` into `enforcer`'s; returns the
    /// cell's version (`None`: no cell).
    async fn pull<S: Store>(
        &self,
        enforcer: &Enforcer<S>,
        domain: &str,
    ) -> Result<Option<u64>, StoreError> {
        let Some(cell) = self.cells.get(&key(domain)).await? else {
            return Ok(None);
        };
        // A cell this build cannot read is written over by the next report.
        let reports: Vec<Wire> = serde_json::from_slice(&cell.value).unwrap_or_default();
        enforcer.merge_utilization_reports(
            domain,
            reports
                .into_iter()
                .map(|(instance, percent, at)| UtilizationReport {
                    instance,
                    utilization: Utilization::from_percent(percent),
                    at,
                }),
        );
        Ok(Some(cell.version))
    }
}

fn key(domain: &str) -> String {
    format!("utilization:{domain}")
}

/// Every [`SYNC`], takes what the other replicas shared of every shedding
/// domain into `enforcer`, until `stopped`.
pub(crate) async fn follow<S: Store>(
    shared: Arc<Shared>,
    enforcer: Arc<Enforcer<S>>,
    mut stopped: watch::Receiver<()>,
) {
    let mut ticks = tokio::time::interval(SYNC);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped.changed() => return,
        }
        let policy = enforcer.policy();
        for domain in policy.domains().filter(|d| policy.shedding(d).is_some()) {
            if let Err(e) = shared.pull(&enforcer, domain).await {
                tracing::debug!("cannot read the utilization reports of {domain:?}: {e}");
            }
        }
    }
}

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
    if let (Ok(domain), Some(shared)) = (&answer, &state.shared_reports)
        && let Err(e) = shared.publish(&state.enforcer, domain).await
    {
        // Kept here all the same, and offered again with the next report.
        tracing::warn!("cannot share the utilization report of {domain:?} through Redis: {e}");
    }
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
