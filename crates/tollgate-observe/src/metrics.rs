//! The service's Prometheus metrics: their names, help texts and the few
//! functions that record them.
//!
//! Labels are kept to bounded sets: domains and rules come from the config
//! (a descriptor that matches no rule is not labelled by its domain, so a
//! client cannot grow the label set by inventing domains), and limits given in
//! the request itself are labelled `override`. envoyproxy/ratelimit's per-rule
//! series ([`envoy_stats`]) carry request values only where its config asks
//! for them (`detailed_metric`, `value_to_metric`, overrides), within the
//! same per-rule bound as `detailed_metric` labels.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tollgate_core::{StoreError, Utilization};
use tollgate_policy::{
    Decided, Descriptor, FailurePolicy, Observer, Reload, ReloadError, Rule, State, Trigger,
};
use tollgate_redis::RedisStats;
use tollgate_store::{BreakerState, DenyCacheStats, FallbackStats, HybridStats, MemoryStats};

use crate::per_rule::{PerResult, PerRule};

mod bounded;
pub(crate) mod envoy_stats;

use bounded::bounded;

pub use envoy_stats::set_near_limit_ratio;
mod hot;

/// The gateway's load shedder (`shed:` in its config): the learned limit,
/// requests in flight, utilization, whether it is probing, and sheds by tier.
const SHED_LIMIT: &str = "tollgate_shed_limit";
const SHED_IN_FLIGHT: &str = "tollgate_shed_in_flight";
const SHED_UTILIZATION: &str = "tollgate_shed_utilization";
const SHED_PROBING: &str = "tollgate_shed_probing";
const SHED_TOTAL: &str = "tollgate_shed_total";
/// Shedding on reported utilization (a domain's `shed:` section): what the
/// domain's service reports, how many instances' reports are fresh, and the
/// requests the enforcer shed, by domain and tier, at every door.
const REPORTED_UTILIZATION: &str = "tollgate_reported_utilization";
const REPORTED_INSTANCES: &str = "tollgate_reported_instances";
const ENFORCER_SHED_TOTAL: &str = "tollgate_enforcer_shed_total";
/// Requests answered, by API (`grpc`, `json`, `v1`, `gateway`) and result
/// (`ok`, `over_limit`, `invalid`, `shed`).
const CHECKS: &str = "tollgate_checks_total";
/// Time to answer a request, by API.
const CHECK_DURATION: &str = "tollgate_check_duration_seconds";
/// Per-descriptor decisions by domain, rule and result.
const DECISIONS: &str = "tollgate_decisions_total";
/// Shadow-mode limits that would have denied, by domain and rule.
const SHADOW_DENIALS: &str = "tollgate_shadow_denials_total";
/// Store calls that failed.
const STORE_ERRORS: &str = "tollgate_store_errors_total";
/// Limits decided by a failure policy instead of the store, by policy.
const STORE_FALLBACKS: &str = "tollgate_store_fallbacks_total";
/// Time a store call takes.
const STORE_DURATION: &str = "tollgate_store_duration_seconds";
/// The help texts of the metrics kept in [`hot`].
const CHECKS_HELP: &str = "Requests answered, by API and result.";
const CHECK_DURATION_HELP: &str = "Time to answer a request, by API.";
const STORE_DURATION_HELP: &str = "Time a store call takes.";
/// The Redis stack's counters (with `--redis`), copied from its parts' at each
/// scrape: checks Redis decided and cross-slot refunds (the Redis store),
/// deny-cache answers (the deny cache), checks that erred or timed out, breaker
/// openings and the breaker's state (the fallback).
const REDIS_CHECKS: &str = "tollgate_redis_checks_total";
const REDIS_DENY_CACHE_HITS: &str = "tollgate_redis_deny_cache_hits_total";
const REDIS_ERRORS: &str = "tollgate_redis_errors_total";
const REDIS_TIMEOUTS: &str = "tollgate_redis_timeouts_total";
const REDIS_REFUNDS: &str = "tollgate_redis_refunds_total";
const REDIS_BREAKER_OPENS: &str = "tollgate_redis_breaker_opens_total";
/// Limits decided without Redis, by failure policy.
const REDIS_FALLBACKS: &str = "tollgate_redis_fallbacks_total";
/// 0 closed (checks go to Redis), 1 half-open (the background probe is out),
/// 2 open.
const REDIS_BREAKER: &str = "tollgate_redis_breaker_state";
/// On a Redis Cluster, the breaker of each range of slots (label `slots`,
/// `<first>-<last>`: a primary's range, so as few as the cluster's
/// primaries), same values; `tollgate_redis_breaker_state` is the worst.
const REDIS_SLOTS_BREAKER: &str = "tollgate_redis_slots_breaker_state";
/// Hybrid mode's counters (with `--hybrid`): checks decided from local
/// leases, checks sent on to Redis, units leased and units given back.
const HYBRID_LOCAL: &str = "tollgate_hybrid_local_decisions_total";
const HYBRID_REMOTE: &str = "tollgate_hybrid_redis_checks_total";
const HYBRID_LEASED: &str = "tollgate_hybrid_units_leased_total";
const HYBRID_RETURNED: &str = "tollgate_hybrid_units_returned_total";
/// The in-process store's keys now, and the keys it evicted (at rest) or
/// refused (nothing at rest to evict) to stay within `--max-keys`.
const MEMORY_KEYS: &str = "tollgate_memory_keys";
const MEMORY_EVICTIONS: &str = "tollgate_memory_evictions_total";
const MEMORY_REFUSALS: &str = "tollgate_memory_refusals_total";
/// Config reloads by result (`ok`, `error`, `refused`) and trigger (`watch`,
/// `admin`).
const CONFIG_RELOADS: &str = "tollgate_config_reloads_total";

/// Histogram buckets for every `*_duration_seconds` metric: 10 µs to 1 s.
const BUCKETS: [f64; 12] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.1,
    1.0,
];

/// The rule label of limits given in the request (Envoy's per-descriptor
/// `limit`): their rule ids carry descriptor values, an unbounded set.
const OVERRIDE_LABEL: &str = "override";

/// Which API answered a request.
#[derive(Debug, Clone, Copy)]
pub enum Api {
    /// gRPC `ShouldRateLimit`.
    Grpc,
    /// `POST /json`.
    Json,
    /// `POST /v1/check`.
    V1,
    /// A request through the gateway (`--proxy-listen`).
    Gateway,
}

impl Api {
    fn label(self) -> &'static str {
        match self {
            Api::Grpc => "grpc",
            Api::Json => "json",
            Api::V1 => "v1",
            Api::Gateway => "gateway",
        }
    }
}

/// How a request was answered.
#[derive(Debug, Clone, Copy)]
pub enum CheckResult {
    /// Allowed.
    Ok,
    /// Denied.
    OverLimit,
    /// Refused as malformed.
    Invalid,
    /// Admitted by its limits, then shed by the gateway's load shedder.
    Shed,
}

/// A Prometheus recorder (not installed) with this service's buckets and help
/// texts; the caller installs it or keeps it local (tests).
pub fn recorder() -> Result<metrics_exporter_prometheus::PrometheusRecorder, BuildError> {
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_duration_seconds".into()), &BUCKETS)?
        .build_recorder())
}

/// Installs `recorder` as the process's recorder and describes every metric.
pub fn install(
    recorder: metrics_exporter_prometheus::PrometheusRecorder,
) -> Result<
    PrometheusHandle,
    metrics::SetRecorderError<metrics_exporter_prometheus::PrometheusRecorder>,
> {
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    // `CHECKS`, `CHECK_DURATION` and `STORE_DURATION` are kept and described
    // by `hot`, and rendered by `render`.
    describe_counter!(
        DECISIONS,
        "Per-descriptor decisions by domain, rule and result."
    );
    describe_counter!(
        SHADOW_DENIALS,
        "Shadow-mode limits that would have denied, by domain and rule."
    );
    for (name, help) in envoy_stats::NAMES.into_iter().zip(envoy_stats::HELP) {
        describe_counter!(name, help);
    }
    describe_counter!(STORE_ERRORS, "Store calls that failed.");
    describe_counter!(
        STORE_FALLBACKS,
        "Limits decided by their failure policy because the store failed."
    );
    describe_counter!(CONFIG_RELOADS, "Config reloads by result and trigger.");
    describe_counter!(REDIS_CHECKS, "Checks decided by Redis.");
    describe_counter!(
        REDIS_DENY_CACHE_HITS,
        "Checks answered by the local deny cache without a Redis call."
    );
    describe_counter!(REDIS_ERRORS, "Checks whose Redis calls failed.");
    describe_counter!(REDIS_TIMEOUTS, "Checks whose Redis calls timed out.");
    describe_counter!(
        REDIS_REFUNDS,
        "Cross-slot checks refunded after a later slot denied."
    );
    describe_counter!(
        REDIS_BREAKER_OPENS,
        "Times the Redis circuit breaker opened."
    );
    describe_counter!(
        REDIS_FALLBACKS,
        "Limits decided without Redis, by their failure policy."
    );
    describe_gauge!(
        REDIS_BREAKER,
        "The Redis circuit breaker: 0 closed, 1 half-open (a probe is out), 2 open."
    );
    describe_gauge!(
        REDIS_SLOTS_BREAKER,
        "On a Redis Cluster, the circuit breaker of each range of slots: 0 closed, 1 half-open, 2 open."
    );
    describe_counter!(HYBRID_LOCAL, "Checks decided from local leases.");
    describe_counter!(HYBRID_REMOTE, "Checks hybrid mode sent to Redis.");
    describe_counter!(HYBRID_LEASED, "Units leased from Redis.");
    describe_counter!(HYBRID_RETURNED, "Unspent leased units given back to Redis.");
    describe_gauge!(
        SHED_LIMIT,
        "The gateway's learned concurrency limit for its upstream."
    );
    describe_gauge!(
        SHED_IN_FLIGHT,
        "Requests the gateway has forwarded and not yet had answered."
    );
    describe_gauge!(
        SHED_UTILIZATION,
        "Requests in flight over the learned limit (1 is full)."
    );
    describe_gauge!(
        SHED_PROBING,
        "1 while the limit is pinned to its floor to measure the upstream's latency with nothing queued."
    );
    describe_counter!(
        SHED_TOTAL,
        "Requests the gateway shed (503) by priority tier."
    );
    describe_gauge!(
        REPORTED_UTILIZATION,
        "The utilization a shedding domain's service reports: the mean of its instances' fresh reports (1 is full; 0 with no fresh report)."
    );
    describe_gauge!(
        REPORTED_INSTANCES,
        "Instances of a shedding domain's service whose utilization report is fresh."
    );
    describe_counter!(
        ENFORCER_SHED_TOTAL,
        "Checks the enforcer shed on reported utilization, by domain and priority tier (503 through the HTTP API, OVER_LIMIT through Envoy's)."
    );
    describe_gauge!(MEMORY_KEYS, "Keys the in-process store holds.");
    describe_counter!(
        MEMORY_EVICTIONS,
        "Keys at rest the in-process store evicted to stay within --max-keys."
    );
    describe_counter!(
        MEMORY_REFUSALS,
        "New keys the in-process store refused (denied) because nothing at rest could be evicted."
    );
    Ok(handle)
}

/// The label a rule's metrics (and the live page) carry.
pub fn rule_label(rule: &Rule) -> &str {
    // Rules made from a request's limit override are named `override:<values>`.
    if rule.id().starts_with("override:") {
        OVERRIDE_LABEL
    } else {
        rule.id()
    }
}

/// Records one answered request.
pub fn check(api: Api, result: CheckResult, elapsed: Duration) {
    let (column, result) = match result {
        CheckResult::Ok => (0, "ok"),
        CheckResult::OverLimit => (1, "over_limit"),
        CheckResult::Invalid => (2, "invalid"),
        CheckResult::Shed => (3, "shed"),
    };
    if !hot::check(api as usize, api.label(), column, elapsed) {
        // Only if the enum outgrows the table: correct, just slower.
        counter!(CHECKS, "api" => api.label(), "result" => result).increment(1);
        histogram!(CHECK_DURATION, "api" => api.label()).record(elapsed.as_secs_f64());
    }
}

/// `/metrics`: the exporter's text and the metrics kept in [`hot`].
pub fn render(handle: &PrometheusHandle) -> String {
    let mut text = handle.render();
    hot::render(
        &mut text,
        &hot::Help {
            checks: (CHECKS, CHECKS_HELP),
            check_duration: (CHECK_DURATION, CHECK_DURATION_HELP),
            store_duration: (STORE_DURATION, STORE_DURATION_HELP),
        },
    );
    text
}

/// The service's [`Observer`]: every decision of the enforcer, whatever the
/// door (gRPC, `/json`, `/v1/check`, the gateway), counted the same way, and
/// store failures logged.
#[derive(Default)]
pub struct Observe {
    /// Each rule's series, once a decision has needed them.
    rules: PerRule<RuleSeries>,
}

/// The series of one rule's own label set (a `detailed_metric` rule's
/// labels carry the request's values, and are not kept here).
#[derive(Default)]
struct RuleSeries {
    /// `tollgate_decisions_total`'s counters, by result.
    decisions: PerResult<metrics::Counter>,
    /// `tollgate_shadow_denials_total`'s counter.
    shadow_denials: OnceLock<metrics::Counter>,
    /// envoyproxy/ratelimit's series of a rule of its format, when its stats
    /// key is the rule's own (it carries no request values).
    envoy_stats: OnceLock<envoy_stats::Series>,
}

impl Observer for Observe {
    /// Counts each matched descriptor's decision (unmatched ones carry no
    /// config-bounded labels). A rule with envoyproxy/ratelimit's
    /// `detailed_metric: true` is labelled by the request's descriptor, entry
    /// by entry (`key_value.key2_value2`, as that service names its stats), so
    /// each value gets its own series: the rule's author opted into that
    /// label set. Rules of envoyproxy/ratelimit's format are counted in its
    /// series too ([`envoy_stats`]).
    fn decided(&self, decided: &Decided<'_>) {
        let mut slots = None;
        if let (Some(shed), Some(domain)) = (&decided.verdict.shed, decided.domain) {
            // Only a domain of the config sheds, so its label is bounded.
            counter!(ENFORCER_SHED_TOTAL, "domain" => domain.to_owned(), "tier" => shed.tier.name())
                .increment(1);
        }
        for (index, descriptor) in decided.verdict.descriptors.iter().enumerate() {
            if let State::StoreFailed(failure) = descriptor.state {
                store_fallback(failure);
            }
            let (Some(domain), Some(rule)) = (decided.domain, &descriptor.rule) else {
                continue;
            };
            let kept = slots.get_or_insert_with(|| self.rules.slots()).get(rule);
            let detailed = rule
                .detailed_metric()
                .then(|| decided.descriptors.get(index).map(detailed_label))
                .flatten()
                .map(|label| bounded(DECISIONS, domain, rule.id(), label));
            envoy_stats::record(decided, index, domain, rule, kept.map(|k| &k.envoy_stats));
            let result = descriptor.result();
            let shadow_denied = descriptor.shadow_denied();
            // A rule's own label set: its counters are kept in its slot.
            if detailed.is_none()
                && let Some(kept) = kept
                && let Some(counter) = kept.decisions.get(result, || {
                    decision_counter(domain, rule_label(rule), result)
                })
            {
                counter.increment(1);
                if shadow_denied {
                    kept.shadow_denials
                        .get_or_init(|| shadow_denial_counter(domain, rule_label(rule)))
                        .increment(1);
                }
                continue;
            }
            let rule = detailed.as_deref().unwrap_or_else(|| rule_label(rule));
            decision(domain, rule, result);
            if shadow_denied {
                shadow_denial_counter(domain, rule).increment(1);
            }
        }
    }

    fn store_failed(&self, error: &StoreError, shadow: bool) {
        if shadow {
            tracing::warn!(%error, "store check of shadow limits failed");
        } else {
            tracing::warn!(%error, "store check failed; the rules' failure policies decide");
        }
    }

    fn store_call(&self, elapsed: Duration, ok: bool) {
        store_call(elapsed, ok);
    }

    fn release_failed(&self, error: &StoreError) {
        tracing::warn!(%error, "release failed; the permits lapse after their period");
    }
}

/// A descriptor as envoyproxy/ratelimit's detailed stats name it.
fn detailed_label(descriptor: &Descriptor) -> String {
    let mut label = String::new();
    for (i, entry) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            label.push('.');
        }
        label.push_str(&entry.key);
        label.push('_');
        label.push_str(&entry.value);
    }
    label
}

/// Records one descriptor's decision.
fn decision(domain: &str, rule: &str, result: &'static str) {
    // The handle of each label set is looked up once per thread: a registry
    // lookup allocates the labels and costs more than the check it counts.
    DECISION_COUNTERS.with_borrow_mut(|by_domain| {
        let by_rule = match by_domain.get_mut(domain) {
            Some(by_rule) => by_rule,
            None => by_domain.entry(domain.to_owned()).or_default(),
        };
        let by_result = match by_rule.get_mut(rule) {
            Some(by_result) => by_result,
            None => by_rule.entry(rule.to_owned()).or_default(),
        };
        match by_result.iter().find(|(r, _)| *r == result) {
            Some((_, counter)) => counter.increment(1),
            None => {
                let counter = decision_counter(domain, rule, result);
                counter.increment(1);
                by_result.push((result, counter));
            }
        }
    });
}

/// The `tollgate_decisions_total` counter of one label set, from the registry.
fn decision_counter(domain: &str, rule: &str, result: &'static str) -> metrics::Counter {
    counter!(DECISIONS, "domain" => domain.to_owned(), "rule" => rule.to_owned(), "result" => result)
}

/// Decision counter handles by domain, rule and result label (all bounded by
/// the config; see the module's documentation). Hashed with foldhash, not
/// SipHash: two lookups on every decision, by keys from the config, which a
/// client cannot choose to collide.
type DecisionCounters = HashMap<String, Rules, FastHash>;
type Rules = HashMap<String, Vec<(&'static str, metrics::Counter)>, FastHash>;
type FastHash = foldhash::fast::RandomState;

thread_local! {
    static DECISION_COUNTERS: RefCell<DecisionCounters> = RefCell::new(HashMap::default());
}

/// The counter of shadow limits that would have denied, for one rule label.
fn shadow_denial_counter(domain: &str, rule: &str) -> metrics::Counter {
    counter!(SHADOW_DENIALS, "domain" => domain.to_owned(), "rule" => rule.to_owned())
}

/// Records one store call.
fn store_call(elapsed: Duration, ok: bool) {
    hot::store_call(elapsed);
    if !ok {
        counter!(STORE_ERRORS).increment(1);
    }
}

/// Records a limit decided by its failure policy.
fn store_fallback(failure: FailurePolicy) {
    counter!(STORE_FALLBACKS, "failure" => failure.name()).increment(1);
}

/// Records a config reload attempt: `result` is `ok`, `error` (invalid) or
/// `refused` (valid, but the safeguards kept the last good config).
pub fn config_reload(trigger: Trigger, result: &'static str) {
    counter!(CONFIG_RELOADS, "result" => result, "trigger" => trigger_label(trigger)).increment(1);
}

/// How a reload attempt ended: `ok`, `refused` (valid, but the safeguards
/// kept the last good config) or `error`.
pub fn result_label(reload: &Reload) -> &'static str {
    match &reload.outcome {
        Ok(_) => "ok",
        Err(ReloadError::Refused { .. }) => "refused",
        Err(_) => "error",
    }
}

/// The `trigger` label of a reload: `watch`, `xds` or `admin`.
pub fn trigger_label(trigger: Trigger) -> &'static str {
    // Only `POST /admin/reload` reloads on demand.
    match trigger {
        Trigger::Watch => "watch",
        Trigger::Push => "xds",
        _ => "admin",
    }
}

/// Copies the gateway's load shedder's state into the registry: the
/// learned limit, the requests in flight, the utilization and the sheds by
/// tier.
pub fn shed(snapshot: &tollgate_http::Snapshot) {
    gauge!(SHED_LIMIT).set(f64::from(snapshot.limit));
    gauge!(SHED_IN_FLIGHT).set(f64::from(snapshot.in_flight));
    gauge!(SHED_UTILIZATION).set(f64::from(snapshot.utilization_percent()) / 100.0);
    gauge!(SHED_PROBING).set(f64::from(u8::from(snapshot.probing)));
    for tier in tollgate_http::Tier::ALL {
        counter!(SHED_TOTAL, "tier" => tier.name()).absolute(snapshot.shed(tier));
    }
}

/// Copies what `domain`'s service reports of its utilization into the
/// registry: the mean of its fresh reports, and how many there are (none is
/// 0 and 0).
pub fn reported(domain: &str, reported: Option<(Utilization, usize)>) {
    let (utilization, instances) = reported.map_or((0.0, 0.0), |(u, n)| {
        (f64::from(u.percent()) / 100.0, n as f64)
    });
    gauge!(REPORTED_UTILIZATION, "domain" => domain.to_owned()).set(utilization);
    gauge!(REPORTED_INSTANCES, "domain" => domain.to_owned()).set(instances);
}

/// Copies the memory store's counters into the registry.
pub fn memory(stats: &MemoryStats) {
    gauge!(MEMORY_KEYS).set(stats.keys as f64);
    counter!(MEMORY_EVICTIONS).absolute(stats.evictions);
    counter!(MEMORY_REFUSALS).absolute(stats.refusals);
}

/// The counters of every part of the Redis stack, for metrics.
#[derive(Debug, Clone)]
pub struct StackStats {
    /// The Redis store's.
    pub redis: RedisStats,
    /// The deny cache's.
    pub deny_cache: DenyCacheStats,
    /// The fallback's and its breaker's.
    pub fallback: FallbackStats,
    /// On a cluster, each range of slots' breaker (`Fallback::parts`).
    pub slots: Vec<(std::sync::Arc<str>, BreakerState)>,
    /// With `--hybrid` only.
    pub hybrid: Option<HybridStats>,
}

/// Copies the Redis stack's counters into the registry (they are monotonic
/// in the parts, so each scrape sets them to its latest totals).
pub fn redis(stats: &StackStats) {
    let StackStats {
        redis,
        deny_cache,
        fallback,
        slots,
        hybrid,
    } = stats;
    counter!(REDIS_CHECKS).absolute(redis.redis_checks);
    counter!(REDIS_DENY_CACHE_HITS).absolute(deny_cache.hits);
    counter!(REDIS_ERRORS).absolute(fallback.errors);
    counter!(REDIS_TIMEOUTS).absolute(fallback.timeouts);
    counter!(REDIS_REFUNDS).absolute(redis.refunds);
    counter!(REDIS_BREAKER_OPENS).absolute(fallback.breaker_opens);
    for (policy, n) in [
        (FailurePolicy::FailOpen, fallback.fallback_fail_open),
        (FailurePolicy::FailClosed, fallback.fallback_fail_closed),
        (FailurePolicy::Local, fallback.fallback_local),
    ] {
        counter!(REDIS_FALLBACKS, "failure" => policy.name()).absolute(n);
    }
    let state = |breaker: &BreakerState| match breaker {
        BreakerState::Closed => 0.0,
        BreakerState::HalfOpen => 1.0,
        BreakerState::Open => 2.0,
    };
    gauge!(REDIS_BREAKER).set(state(&fallback.breaker));
    for (range, breaker) in slots {
        gauge!(REDIS_SLOTS_BREAKER, "slots" => range.to_string()).set(state(breaker));
    }
    if let Some(hybrid) = hybrid {
        counter!(HYBRID_LOCAL).absolute(hybrid.local_decisions);
        counter!(HYBRID_REMOTE).absolute(hybrid.inner_checks);
        counter!(HYBRID_LEASED).absolute(hybrid.units_leased);
        counter!(HYBRID_RETURNED).absolute(hybrid.units_returned);
    }
}
