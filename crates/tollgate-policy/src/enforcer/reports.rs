//! The utilization reports of the services behind the domains that shed
//! ([`Reports`]): each instance's latest, counted while fresh. This is the
//! view every check reads; replicas that share a store merge each other's
//! reports into it ([`Reports::merge`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tollgate_core::{IntoNanos, Nanos, Utilization};

/// Instances a domain keeps reports of: a bound on what reporters can make
/// the enforcer hold. A fleet larger than this reports through fewer
/// reporters (a sidecar per host, or an aggregator).
pub(crate) const MAX_INSTANCES: usize = 1024;

/// Each instance's latest report and when it was made.
type Instances = HashMap<String, (Utilization, Nanos)>;

/// The latest report of each instance of each domain's service.
#[derive(Debug, Default)]
pub(crate) struct Reports {
    domains: Mutex<HashMap<String, Instances>>,
}

/// One instance's latest utilization report, as replicas share them
/// through the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UtilizationReport {
    /// The reporting instance (empty for an unnamed one).
    pub instance: String,
    /// What it reported.
    pub utilization: Utilization,
    /// When, in the enforcer clock's nanoseconds (the Unix epoch's with
    /// the wall clock every replica reads).
    pub at: Nanos,
}

/// Why a report was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Full;

impl Reports {
    /// Keeps `utilization` as `instance`'s report for `domain`, made at
    /// `now`, forgetting the domain's reports older than `ttl`.
    pub(crate) fn report(
        &self,
        domain: &str,
        instance: &str,
        utilization: Utilization,
        now: Nanos,
        ttl: Duration,
    ) -> Result<(), Full> {
        let mut domains = self.lock();
        let instances = domains.entry(domain.to_owned()).or_default();
        instances.retain(|_, (_, at)| fresh(*at, now, ttl));
        if instances.len() >= MAX_INSTANCES && !instances.contains_key(instance) {
            return Err(Full);
        }
        instances.insert(instance.to_owned(), (utilization, now));
        Ok(())
    }

    /// Takes `reports` (another replica's view of `domain`) into this one:
    /// each instance's later report wins, and reports older than `ttl` at
    /// `now` are dropped, as are any past [`MAX_INSTANCES`].
    pub(crate) fn merge(
        &self,
        domain: &str,
        reports: impl IntoIterator<Item = UtilizationReport>,
        now: Nanos,
        ttl: Duration,
    ) {
        let mut domains = self.lock();
        let instances = domains.entry(domain.to_owned()).or_default();
        instances.retain(|_, (_, at)| fresh(*at, now, ttl));
        for report in reports.into_iter().filter(|r| fresh(r.at, now, ttl)) {
            let full = instances.len() >= MAX_INSTANCES;
            match instances.get_mut(&report.instance) {
                Some(kept) if kept.1 >= report.at => {}
                Some(kept) => *kept = (report.utilization, report.at),
                None if full => {}
                None => {
                    instances.insert(report.instance, (report.utilization, report.at));
                }
            }
        }
    }

    /// `domain`'s reports made within `ttl` of `now`, each instance's latest.
    pub(crate) fn fresh(&self, domain: &str, now: Nanos, ttl: Duration) -> Vec<UtilizationReport> {
        let domains = self.lock();
        domains.get(domain).map_or_else(Vec::new, |instances| {
            instances
                .iter()
                .filter(|(_, (_, at))| fresh(*at, now, ttl))
                .map(|(instance, &(utilization, at))| UtilizationReport {
                    instance: instance.clone(),
                    utilization,
                    at,
                })
                .collect()
        })
    }

    /// The mean of `domain`'s reports made within `ttl` of `now` (the
    /// fleet's utilization, as each instance sees its own), and how many
    /// there are; `None` when there are none.
    pub(crate) fn current(
        &self,
        domain: &str,
        now: Nanos,
        ttl: Duration,
    ) -> Option<(Utilization, usize)> {
        let domains = self.lock();
        let (sum, count) = domains
            .get(domain)?
            .values()
            .filter(|(_, at)| fresh(*at, now, ttl))
            .fold((0u64, 0usize), |(sum, count), (u, _)| {
                (sum + u64::from(u.percent()), count + 1)
            });
        let mean = sum / u64::try_from(count).ok().filter(|&n| n > 0)?;
        Some((
            Utilization::from_percent(u32::try_from(mean).unwrap_or(u32::MAX)),
            count,
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instances>> {
        self.domains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A report made at `at` still counts at `now`: no older than `ttl`.
fn fresh(at: Nanos, now: Nanos, ttl: Duration) -> bool {
    now.saturating_sub(at) <= ttl.into_nanos()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);
    const SECOND: Nanos = 1_000_000_000;

    fn percent(p: u32) -> Utilization {
        Utilization::from_percent(p)
    }

    #[test]
    fn the_fleet_is_the_mean_of_its_fresh_reports() {
        let reports = Reports::default();
        assert_eq!(reports.current("api", 0, TTL), None);
        reports.report("api", "a", percent(90), 0, TTL).unwrap();
        reports
            .report("api", "b", percent(40), 5 * SECOND, TTL)
            .unwrap();
        assert_eq!(
            reports.current("api", 5 * SECOND, TTL),
            Some((percent(65), 2))
        );
        reports
            .report("api", "a", percent(60), 6 * SECOND, TTL)
            .unwrap();
        assert_eq!(
            reports.current("api", 6 * SECOND, TTL),
            Some((percent(50), 2)),
            "an instance's latest replaces its last"
        );
        assert_eq!(reports.current("other", 6 * SECOND, TTL), None);
    }

    #[test]
    fn a_stale_report_stops_counting() {
        let reports = Reports::default();
        reports.report("api", "a", percent(95), 0, TTL).unwrap();
        reports
            .report("api", "b", percent(20), 8 * SECOND, TTL)
            .unwrap();
        assert_eq!(
            reports.current("api", 10 * SECOND, TTL),
            Some((percent(57), 2))
        );
        assert_eq!(
            reports.current("api", 11 * SECOND, TTL),
            Some((percent(20), 1))
        );
        assert_eq!(
            reports.current("api", 19 * SECOND, TTL),
            None,
            "no fresh report sheds nothing"
        );
    }

    #[test]
    fn merged_reports_keep_each_instances_latest_while_fresh() {
        let reports = Reports::default();
        reports
            .report("api", "a", percent(90), 5 * SECOND, TTL)
            .unwrap();
        let shared = |instance: &str, p, at| UtilizationReport {
            instance: instance.to_owned(),
            utilization: percent(p),
            at,
        };
        reports.merge(
            "api",
            [
                shared("a", 10, 4 * SECOND),
                shared("b", 30, 6 * SECOND),
                shared("stale", 99, 0),
            ],
            11 * SECOND,
            TTL,
        );
        assert_eq!(
            reports.current("api", 11 * SECOND, TTL),
            Some((percent(60), 2)),
            "a's own later report wins; a stale one is dropped"
        );
        let mut fresh = reports.fresh("api", 11 * SECOND, TTL);
        fresh.sort_by(|x, y| x.instance.cmp(&y.instance));
        assert_eq!(
            fresh,
            [shared("a", 90, 5 * SECOND), shared("b", 30, 6 * SECOND)]
        );
        reports.merge("api", [shared("a", 20, 7 * SECOND)], 11 * SECOND, TTL);
        assert_eq!(
            reports.current("api", 11 * SECOND, TTL),
            Some((percent(25), 2))
        );
    }

    #[test]
    fn a_domain_keeps_a_bounded_number_of_instances() {
        let reports = Reports::default();
        for i in 0..MAX_INSTANCES {
            reports
                .report("api", &i.to_string(), percent(10), 0, TTL)
                .unwrap();
        }
        assert_eq!(
            reports.report("api", "one more", percent(10), 0, TTL),
            Err(Full)
        );
        reports.report("api", "0", percent(20), 0, TTL).unwrap();
        reports
            .report("api", "one more", percent(10), 11 * SECOND, TTL)
            .expect("stale reports make room");
    }
}
