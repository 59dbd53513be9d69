//! The stream service: each Envoy's reports in, its buckets' actions out,
//! one answer per report.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket as TokenBucketProto};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as DurationProto, UInt32Value};
use metrics::{counter, describe_counter, describe_gauge, gauge};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_core::Clock;
use tollgate_policy::PolicyHandle;
use tonic::{Request, Response, Status, Streaming};

use super::bucket::{Target, target};
use super::fleet::{Fleet, Grant, Rule, Usage};

/// `StreamRateLimitQuotas` over a policy and one [`Fleet`]: add
/// [`QuotaService::server`] to a gRPC listener's routes.
#[derive(Clone)]
pub struct QuotaService {
    inner: Arc<Inner>,
}

struct Inner {
    policy: PolicyHandle,
    fleet: Mutex<Fleet>,
    clock: Arc<dyn Clock>,
    /// Numbers the streams.
    streams: AtomicU64,
    /// Streams open now.
    open: AtomicI64,
    /// When the fleet was last pruned.
    pruned: AtomicU64,
    /// The rules whose gauges were set, to zero those no bucket has now.
    gauged: Mutex<HashSet<RuleLabels>>,
}

/// A rule's `domain` and `rule` labels.
type RuleLabels = (Arc<str>, Arc<str>);

/// A rule's subscriptions, assigned tokens and assigned rate.
type RuleSums = (usize, u64, f64);

const REPORTED: &str = "tollgate_rlqs_reported_requests_total";
const STREAMS: &str = "tollgate_rlqs_streams";
const SUBSCRIPTIONS: &str = "tollgate_rlqs_subscriptions";
const ASSIGNED: &str = "tollgate_rlqs_assigned_tokens";
const ASSIGNED_RATE: &str = "tollgate_rlqs_assigned_tokens_per_second";

/// Counts a report's requests in the rule's series.
fn count(domain: &str, rule: &str, used: Usage) {
    for (result, n) in [("allowed", used.allowed), ("denied", used.denied)] {
        counter!(REPORTED, "domain" => domain.to_owned(), "rule" => rule.to_owned(), "result" => result)
            .increment(n);
    }
}

impl QuotaService {
    /// Serves `policy`'s quotas, reading the time from `clock` (windows are
    /// aligned to its epoch).
    pub fn new(policy: PolicyHandle, clock: Arc<dyn Clock>) -> Self {
        describe_counter!(
            REPORTED,
            "Requests Envoys reported through the quota service, by rule and whether Envoy admitted them."
        );
        describe_gauge!(STREAMS, "Envoys streaming to the quota service.");
        describe_gauge!(
            SUBSCRIPTIONS,
            "Envoys holding a share of a rule's quota, summed over its buckets."
        );
        describe_gauge!(
            ASSIGNED,
            "Tokens of the assignments in force, summed over a rule's buckets and Envoys."
        );
        describe_gauge!(
            ASSIGNED_RATE,
            "Refill of a rate rule's assignments in force, tokens a second, summed over its buckets and Envoys."
        );
        Self {
            inner: Arc::new(Inner {
                policy,
                fleet: Mutex::new(Fleet::new()),
                clock,
                streams: AtomicU64::new(0),
                open: AtomicI64::new(0),
                pruned: AtomicU64::new(0),
                gauged: Mutex::new(HashSet::new()),
            }),
        }
    }

    /// Sets the gauges from the buckets' state, per rule: for a scrape.
    pub fn record_metrics(&self) {
        let mut rules: HashMap<RuleLabels, RuleSums> = HashMap::new();
        {
            let mut fleet = self.inner.fleet.lock();
            fleet.prune(self.inner.clock.now());
            for (_, stats) in fleet.all_stats() {
                let sum = rules.entry((stats.domain, stats.rule)).or_default();
                sum.0 += stats.envoys;
                sum.1 = sum.1.saturating_add(stats.assigned);
                sum.2 += stats.assigned_rate;
            }
        }
        gauge!(STREAMS).set(self.inner.open.load(Ordering::Relaxed) as f64);
        let mut gauged = self.inner.gauged.lock();
        for gone in gauged.iter().filter(|k| !rules.contains_key(*k)) {
            set_rule(gone, (0, 0, 0.0));
        }
        for (key, sum) in &rules {
            set_rule(key, *sum);
        }
        *gauged = rules.into_keys().collect();
    }

    /// The tonic service to route to.
    pub fn server(&self) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(self.clone())
    }

    /// The answer to one report: an action per bucket it names.
    ///
    /// # Errors
    ///
    /// `INVALID_ARGUMENT` for a report without a domain or with a bucket
    /// without an id; nothing of it is taken then.
    fn answer(
        &self,
        stream: u64,
        domain: &mut Option<String>,
        report: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
        if domain.is_none() {
            if report.domain.is_empty() {
                return Err(Status::invalid_argument(
                    "the first usage report of a stream must name its domain",
                ));
            }
            *domain = Some(report.domain);
        }
        let domain = domain.as_deref().expect("set above");
        for (i, usage) in report.bucket_quota_usages.iter().enumerate() {
            if usage.bucket_id.as_ref().is_none_or(|b| b.bucket.is_empty()) {
                return Err(Status::invalid_argument(format!(
                    "bucket_quota_usages[{i}] has no bucket_id"
                )));
            }
        }
        let policy = self.inner.policy.load();
        let now = self.inner.clock.now();
        let mut fleet = self.inner.fleet.lock();
        // Buckets nobody reports for any more go once their grants expire;
        // looked for at most once a second, since it visits every bucket.
        if now.saturating_sub(self.inner.pruned.load(Ordering::Relaxed)) >= 1_000_000_000 {
            self.inner.pruned.store(now, Ordering::Relaxed);
            fleet.prune(now);
        }
        let mut bucket_action = Vec::with_capacity(report.bucket_quota_usages.len());
        for usage in report.bucket_quota_usages {
            let id = usage.bucket_id.expect("checked above");
            let used = Usage {
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
            };
            let action = match target(&policy, domain, &id.bucket) {
                Target::Quota { key, plan, rule } => {
                    count(domain, &rule, used);
                    let rule = Rule {
                        domain: Arc::from(domain),
                        name: Arc::from(rule),
                        plan,
                    };
                    let answer = fleet.report(stream, &key, &rule, used, now);
                    tracing::debug!(stream, ?used, ?answer, "quota report");
                    if answer.fresh && matches!(answer.grant, Grant::Tokens(_)) {
                        // Envoy starts a token bucket that follows a blanket
                        // rule full, and applies both in one step.
                        bucket_action.push(BucketAction {
                            bucket_id: Some(id.clone()),
                            bucket_action: Some(assign(Some(Grant::DenyAll), answer.ttl)),
                        });
                    }
                    assign(Some(answer.grant), answer.ttl)
                }
                Target::AllowAll { rule } => {
                    count(domain, &rule, used);
                    assign(None, BLANKET_TTL)
                }
                Target::DenyAll { rule } => {
                    count(domain, &rule, used);
                    assign(Some(Grant::DenyAll), BLANKET_TTL)
                }
                Target::NoRule => Action::AbandonAction(AbandonAction {}),
            };
            bucket_action.push(BucketAction {
                bucket_id: Some(id),
                bucket_action: Some(action),
            });
        }
        Ok(RateLimitQuotaResponse { bucket_action })
    }
}

fn set_rule((domain, rule): &RuleLabels, (envoys, assigned, rate): RuleSums) {
    let labels = [("domain", domain.to_string()), ("rule", rule.to_string())];
    gauge!(SUBSCRIPTIONS, &labels).set(envoys as f64);
    gauge!(ASSIGNED, &labels).set(assigned as f64);
    gauge!(ASSIGNED_RATE, &labels).set(rate);
}

/// The time to live of an allow-all or deny-all rule's answer: it changes
/// only with the policy, and every report refreshes it.
const BLANKET_TTL: Duration = Duration::from_secs(60);

/// A grant as Envoy's action; `None` admits everything.
fn assign(grant: Option<Grant>, ttl: Duration) -> Action {
    let strategy = match grant {
        None => Strategy::BlanketRule(BlanketRule::AllowAll.into()),
        Some(Grant::DenyAll) => Strategy::BlanketRule(BlanketRule::DenyAll.into()),
        Some(Grant::Tokens(t)) => Strategy::TokenBucket(TokenBucketProto {
            max_tokens: t.max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: t.tokens_per_fill,
            }),
            fill_interval: Some(DurationProto {
                seconds: i64::try_from(t.fill_secs).unwrap_or(i64::MAX),
                nanos: i32::try_from(t.generation).unwrap_or(0),
            }),
        }),
    };
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: Some(DurationProto {
            seconds: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    })
}

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let mut reports = request.into_inner();
        let stream = self.inner.streams.fetch_add(1, Ordering::Relaxed);
        self.inner.open.fetch_add(1, Ordering::Relaxed);
        let (answers, out) = mpsc::channel(4);
        let service = self.clone();
        tokio::spawn(async move {
            let mut domain = None;
            loop {
                let report = match reports.message().await {
                    Ok(Some(report)) => report,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(stream, %status, "quota stream ended");
                        break;
                    }
                };
                let answer = service.answer(stream, &mut domain, report);
                let failed = answer.is_err();
                if answers.send(answer).await.is_err() || failed {
                    break;
                }
            }
            service.inner.fleet.lock().leave(stream);
            service.inner.open.fetch_sub(1, Ordering::Relaxed);
        });
        Ok(Response::new(ReceiverStream::new(out)))
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use tollgate_core::ManualClock;
    use tollgate_policy::Policy;

    use super::*;

    fn id(entries: &[(&str, &str)]) -> BucketId {
        BucketId {
            bucket: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
        }
    }

    fn service() -> QuotaService {
        let policy = Policy::parse(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
        )
        .expect("valid");
        QuotaService::new(PolicyHandle::new(policy), Arc::new(ManualClock::new(0)))
    }

    fn report(domain: &str, ids: Vec<Option<BucketId>>) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: ids
                .into_iter()
                .map(|bucket_id| BucketQuotaUsage {
                    bucket_id,
                    time_elapsed: None,
                    num_requests_allowed: 1,
                    num_requests_denied: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn a_malformed_report_is_an_invalid_argument() {
        let service = service();
        let mut domain = None;
        let no_domain =
            service.answer(0, &mut domain, report("", vec![Some(id(&[("user", "a")]))]));
        assert_eq!(no_domain.unwrap_err().code(), tonic::Code::InvalidArgument);
        let mut domain = None;
        for ids in [vec![None], vec![Some(id(&[]))]] {
            let error = service
                .answer(0, &mut domain, report("edge", ids))
                .unwrap_err();
            assert_eq!(error.code(), tonic::Code::InvalidArgument);
            assert!(
                error.message().contains("bucket_quota_usages[0]"),
                "{error:?}"
            );
        }
    }

    #[test]
    fn buckets_get_an_assignment_or_are_abandoned() {
        let service = service();
        let mut domain = None;
        let answer = service
            .answer(
                0,
                &mut domain,
                report(
                    "edge",
                    vec![Some(id(&[("user", "alice")])), Some(id(&[("team", "x")]))],
                ),
            )
            .expect("well formed");
        let actions: Vec<_> = answer
            .bucket_action
            .iter()
            .map(|a| a.bucket_action.expect("an action"))
            .collect();
        let Action::QuotaAssignmentAction(reset) = &actions[0] else {
            panic!("{actions:?}");
        };
        assert_eq!(
            reset.rate_limit_strategy.and_then(|s| s.strategy),
            Some(Strategy::BlanketRule(BlanketRule::DenyAll.into())),
            "a new bucket is preceded by a blanket rule, so that it starts full"
        );
        let Action::QuotaAssignmentAction(assigned) = &actions[1] else {
            panic!("{actions:?}");
        };
        assert!(
            matches!(
                assigned
                    .rate_limit_strategy
                    .as_ref()
                    .and_then(|s| s.strategy),
                Some(Strategy::TokenBucket(TokenBucketProto {
                    max_tokens: 2,
                    ..
                }))
            ),
            "{assigned:?}"
        );
        assert!(
            assigned
                .assignment_time_to_live
                .is_some_and(|t| t.seconds >= 1)
        );
        assert_eq!(actions[2], Action::AbandonAction(AbandonAction {}));
    }
}
