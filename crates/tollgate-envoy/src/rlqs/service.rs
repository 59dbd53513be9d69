//! The stream service: each Envoy's reports in, its buckets' actions out,
//! one answer per report.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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
use tollgate_core::{Clock, Nanos};
use tollgate_policy::{Descriptor, PolicyHandle};
use tollgate_redis::Cells;
use tonic::{Request, Response, Status, Streaming};

use super::bucket::{Target, matched};
use super::fleet::{Answer, BucketStats, Fleet, Grant, Rule, StreamId, Usage};
use super::replicas::Replicated;

/// `StreamRateLimitQuotas` over a policy and one [`Fleet`]: add
/// [`QuotaService::server`] to a gRPC listener's routes.
#[derive(Clone)]
pub struct QuotaService {
    inner: Arc<Inner>,
}

struct Inner {
    policy: PolicyHandle,
    shares: Shares,
    clock: Arc<dyn Clock>,
    /// Numbers the streams.
    streams: AtomicU64,
    /// Streams open now.
    open: AtomicI64,
    /// When the fleet was last pruned.
    pruned: AtomicU64,
    /// The rules whose gauges were set, to zero those no bucket has now.
    gauged: Mutex<HashSet<RuleLabels>>,
    /// Where reported usage goes besides the fleet: the recording.
    sink: OnceLock<UsageSink>,
}

/// One bucket's usage as an Envoy reported it: real traffic, counted by
/// Envoy since its previous report.
#[derive(Debug)]
pub struct Reported<'a> {
    /// When the report came, on the service's clock.
    pub at: Nanos,
    /// The policy's domain.
    pub domain: &'a str,
    /// The bucket as a descriptor of the policy.
    pub descriptor: &'a Descriptor,
    /// What Envoy admitted and denied.
    pub usage: Usage,
}

/// Takes each non-empty [`Reported`] usage; called on the stream's task,
/// so it must not block.
pub type UsageSink = Arc<dyn Fn(&Reported<'_>) + Send + Sync>;

/// A rule's quota as the Envoys hold it, summed over its buckets: what
/// `/metrics` and the live page show.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleQuota {
    /// The policy's domain.
    pub domain: Arc<str>,
    /// The rule's id.
    pub rule: Arc<str>,
    /// Buckets some Envoy holds a share of.
    pub buckets: usize,
    /// Envoys holding a share, summed over the buckets.
    pub envoys: usize,
    /// Requests reported admitted: in the current window (windowed
    /// quotas) or since each bucket was first reported (rates).
    pub allowed: u64,
    /// Requests reported denied, likewise.
    pub denied: u64,
    /// Tokens of the assignments in force.
    pub assigned: u64,
    /// A rate rule's assigned refill, tokens a second.
    pub assigned_rate: f64,
}

/// Where the buckets' share-out is kept.
enum Shares {
    /// In this process: one Tollgate serves the fleet.
    Memory(Mutex<Fleet>),
    /// In Redis, shared by every replica.
    Redis(Replicated),
}

/// One Envoy's stream as the service follows it.
struct Subscriber {
    id: StreamId,
    /// Named by its first report.
    domain: Option<String>,
    /// The budgets it reported for: where it leaves when it ends.
    buckets: HashSet<String>,
}

/// A rule's `domain` and `rule` labels.
type RuleLabels = (Arc<str>, Arc<str>);

const REPORTED: &str = "tollgate_rlqs_reported_requests_total";
const STREAMS: &str = "tollgate_rlqs_streams";
const SUBSCRIPTIONS: &str = "tollgate_rlqs_subscriptions";
const ASSIGNED: &str = "tollgate_rlqs_assigned_tokens";
const ASSIGNED_RATE: &str = "tollgate_rlqs_assigned_tokens_per_second";
const STORE_ERRORS: &str = "tollgate_rlqs_store_errors_total";

/// Counts a report's requests in the rule's series.
fn count(domain: &str, rule: &str, used: Usage) {
    for (result, n) in [("allowed", used.allowed), ("denied", used.denied)] {
        counter!(REPORTED, "domain" => domain.to_owned(), "rule" => rule.to_owned(), "result" => result)
            .increment(n);
    }
}

impl QuotaService {
    /// Serves `policy`'s quotas to the Envoys that stream to this process,
    /// reading the time from `clock` (windows are aligned to its epoch).
    pub fn new(policy: PolicyHandle, clock: Arc<dyn Clock>) -> Self {
        Self::build(policy, clock, Shares::Memory(Mutex::new(Fleet::new())))
    }

    /// As [`QuotaService::new`], with the buckets' share-out kept in
    /// `cells` so that every replica given the same cells serves one
    /// quota to all their Envoys. The replicas' clocks should agree to
    /// well within a second: each stamps reports with its own.
    pub fn replicated(policy: PolicyHandle, clock: Arc<dyn Clock>, cells: Cells) -> Self {
        Self::build(policy, clock, Shares::Redis(Replicated::new(cells)))
    }

    fn build(policy: PolicyHandle, clock: Arc<dyn Clock>, shares: Shares) -> Self {
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
        describe_counter!(
            STORE_ERRORS,
            "Bucket reports left unanswered because Redis, which keeps the replicas' shared quota state, failed."
        );
        Self {
            inner: Arc::new(Inner {
                policy,
                shares,
                clock,
                // A random start, so that replicas sharing buckets number
                // their streams apart.
                streams: AtomicU64::new(RandomState::new().hash_one(0u8)),
                open: AtomicI64::new(0),
                pruned: AtomicU64::new(0),
                gauged: Mutex::new(HashSet::new()),
                sink: OnceLock::new(),
            }),
        }
    }

    /// Hands every bucket's reported usage to `sink` too (once: a later
    /// sink is ignored).
    pub fn record_usage(&self, sink: UsageSink) {
        let _ = self.inner.sink.set(sink);
    }

    /// Each rule's quota as the Envoys hold it now, by domain and rule.
    pub fn rules(&self) -> Vec<RuleQuota> {
        let mut rules: HashMap<RuleLabels, RuleQuota> = HashMap::new();
        for stats in self.inner.shares.stats(self.inner.clock.now()) {
            let sum = rules
                .entry((Arc::clone(&stats.domain), Arc::clone(&stats.rule)))
                .or_insert_with(|| RuleQuota {
                    domain: stats.domain,
                    rule: stats.rule,
                    buckets: 0,
                    envoys: 0,
                    allowed: 0,
                    denied: 0,
                    assigned: 0,
                    assigned_rate: 0.0,
                });
            sum.buckets += 1;
            sum.envoys += stats.envoys;
            sum.allowed = sum.allowed.saturating_add(stats.allowed);
            sum.denied = sum.denied.saturating_add(stats.denied);
            sum.assigned = sum.assigned.saturating_add(stats.assigned);
            sum.assigned_rate += stats.assigned_rate;
        }
        let mut rules: Vec<RuleQuota> = rules.into_values().collect();
        rules.sort_by(|a, b| (&a.domain, &a.rule).cmp(&(&b.domain, &b.rule)));
        rules
    }

    /// Sets the gauges from the buckets' state, per rule: for a scrape.
    pub fn record_metrics(&self) {
        let rules = self.rules();
        gauge!(STREAMS).set(self.inner.open.load(Ordering::Relaxed) as f64);
        let mut gauged = self.inner.gauged.lock();
        let now: HashSet<RuleLabels> = rules
            .iter()
            .map(|r| (Arc::clone(&r.domain), Arc::clone(&r.rule)))
            .collect();
        for (domain, rule) in gauged.iter().filter(|k| !now.contains(*k)) {
            set_rule(domain, rule, (0, 0, 0.0));
        }
        for r in &rules {
            set_rule(&r.domain, &r.rule, (r.envoys, r.assigned, r.assigned_rate));
        }
        *gauged = now;
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
    async fn answer(
        &self,
        stream: &mut Subscriber,
        report: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
        let domain = &mut stream.domain;
        if domain.is_none() {
            if report.domain.is_empty() {
                return Err(Status::invalid_argument(
                    "the first usage report of a stream must name its domain",
                ));
            }
            *domain = Some(report.domain);
        }
        let domain = stream.domain.clone().expect("set above");
        let domain = domain.as_str();
        for (i, usage) in report.bucket_quota_usages.iter().enumerate() {
            if usage.bucket_id.as_ref().is_none_or(|b| b.bucket.is_empty()) {
                return Err(Status::invalid_argument(format!(
                    "bucket_quota_usages[{i}] has no bucket_id"
                )));
            }
        }
        let policy = self.inner.policy.load();
        let now = self.inner.clock.now();
        let mut bucket_action = Vec::with_capacity(report.bucket_quota_usages.len());
        for usage in report.bucket_quota_usages {
            let id = usage.bucket_id.expect("checked above");
            let used = Usage {
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
            };
            let (target, descriptor) = match matched(&policy, domain, &id.bucket) {
                Some((target, descriptor)) => (target, Some(descriptor)),
                None => (Target::NoRule, None),
            };
            if let (Some(sink), Some(descriptor)) = (self.inner.sink.get(), &descriptor)
                && used.allowed.saturating_add(used.denied) > 0
            {
                sink(&Reported {
                    at: now,
                    domain,
                    descriptor,
                    usage: used,
                });
            }
            let action = match target {
                Target::Quota { key, plan, rule } => {
                    count(domain, &rule, used);
                    let rule = Rule {
                        domain: Arc::from(domain),
                        name: Arc::from(rule),
                        plan,
                    };
                    let answer = match self.report(stream.id, &key, &rule, used, now).await {
                        Ok(answer) => answer,
                        Err(error) => {
                            // Envoy keeps the assignment in force until its
                            // time to live ends: better than one made
                            // without the other replicas' reports.
                            tracing::warn!(%error, rule = &*rule.name, "quota state unavailable");
                            counter!(STORE_ERRORS).increment(1);
                            continue;
                        }
                    };
                    stream.buckets.insert(key);
                    tracing::debug!(stream = stream.id, ?used, ?answer, "quota report");
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

impl QuotaService {
    async fn report(
        &self,
        stream: StreamId,
        key: &str,
        rule: &Rule,
        used: Usage,
        now: u64,
    ) -> Result<Answer, tollgate_core::StoreError> {
        match &self.inner.shares {
            Shares::Memory(fleet) => {
                let mut fleet = fleet.lock();
                // Buckets nobody reports for any more go once their grants
                // expire; looked for at most once a second, since it visits
                // every bucket.
                if now.saturating_sub(self.inner.pruned.load(Ordering::Relaxed)) >= 1_000_000_000 {
                    self.inner.pruned.store(now, Ordering::Relaxed);
                    fleet.prune(now);
                }
                Ok(fleet.report(stream, key, rule, used, now))
            }
            Shares::Redis(replicated) => replicated.report(stream, key, rule, used, now).await,
        }
    }

    /// `stream` has ended; see [`Fleet::leave`].
    async fn leave(&self, stream: Subscriber) {
        match &self.inner.shares {
            Shares::Memory(fleet) => fleet.lock().leave(stream.id),
            Shares::Redis(replicated) => {
                let now = self.inner.clock.now();
                if let Err(error) = replicated.leave(stream.id, stream.buckets, now).await {
                    // Its shares are then held until their grants expire.
                    tracing::warn!(%error, "quota state unavailable");
                    counter!(STORE_ERRORS).increment(1);
                }
            }
        }
    }
}

impl Shares {
    fn stats(&self, now: u64) -> Vec<BucketStats> {
        match self {
            Shares::Memory(fleet) => {
                let mut fleet = fleet.lock();
                fleet.prune(now);
                fleet.all_stats().map(|(_, stats)| stats).collect()
            }
            Shares::Redis(replicated) => replicated.stats(now),
        }
    }
}

fn set_rule(domain: &str, rule: &str, (envoys, assigned, rate): (usize, u64, f64)) {
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
            let mut subscriber = Subscriber {
                id: stream,
                domain: None,
                buckets: HashSet::new(),
            };
            loop {
                let report = match reports.message().await {
                    Ok(Some(report)) => report,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(stream, %status, "quota stream ended");
                        break;
                    }
                };
                let answer = service.answer(&mut subscriber, report).await;
                let failed = answer.is_err();
                if answers.send(answer).await.is_err() || failed {
                    break;
                }
            }
            service.leave(subscriber).await;
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

    fn subscriber() -> Subscriber {
        Subscriber {
            id: 0,
            domain: None,
            buckets: HashSet::new(),
        }
    }

    #[tokio::test]
    async fn a_malformed_report_is_an_invalid_argument() {
        let service = service();
        let no_domain = service
            .answer(
                &mut subscriber(),
                report("", vec![Some(id(&[("user", "a")]))]),
            )
            .await;
        assert_eq!(no_domain.unwrap_err().code(), tonic::Code::InvalidArgument);
        let mut stream = subscriber();
        for ids in [vec![None], vec![Some(id(&[]))]] {
            let error = service
                .answer(&mut stream, report("edge", ids))
                .await
                .unwrap_err();
            assert_eq!(error.code(), tonic::Code::InvalidArgument);
            assert!(
                error.message().contains("bucket_quota_usages[0]"),
                "{error:?}"
            );
        }
    }

    #[tokio::test]
    async fn buckets_get_an_assignment_or_are_abandoned() {
        let service = service();
        let answer = service
            .answer(
                &mut subscriber(),
                report(
                    "edge",
                    vec![Some(id(&[("user", "alice")])), Some(id(&[("team", "x")]))],
                ),
            )
            .await
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
