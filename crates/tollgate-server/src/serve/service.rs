//! The check path that the gRPC and HTTP APIs share.
//!
//! A request is resolved against the current policy (swapped atomically on
//! reload); descriptors whose rule or domain is kill-switched are reported but
//! not counted; every enforcing limit is checked in **one** store call, so the
//! request is admitted only if all of them admit it and a deny by one consumes
//! nothing from the others; shadow limits are checked in a second call whose
//! denials are only counted. What comes back is a [`Verdict`]: one
//! [`DescriptorVerdict`] per descriptor, in request order.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tollgate_core::{
    Algorithm, Clock, Decision, Limit, Nanos, Outcome, Quota, Store, StoreError, SystemClock,
};
use tollgate_policy::{
    Applied, Descriptor, FailurePolicy, KillSwitch, Policy, Request, RequestError, Resolved, Rule,
    Unit,
};

use super::metrics;

/// Ad-hoc keys (`POST /v1/check` with `key`) live under this prefix. Policy
/// storage keys start with a length and a colon (`7:default|…`), so the two
/// namespaces cannot meet.
const ADHOC_PREFIX: &str = "adhoc:";

/// The key `/readyz` reads (at cost 0, so it stores nothing).
const PROBE_KEY: &str = "probe:readyz";

/// The shared check path: the current policy, the kill switch and the store.
///
/// The gateway's layer shares all three (see [`RateLimiter::policy_cell`],
/// [`RateLimiter::kill_switch`] and [`Shared`]), so a reload, a kill switch
/// or a key's state is one thing for every API.
pub(crate) struct RateLimiter<S> {
    policy: Arc<ArcSwap<Policy>>,
    kill_switch: Arc<KillSwitch>,
    store: S,
}

/// An ad-hoc limit given in the request itself rather than by a policy.
#[derive(Debug, Clone)]
pub(crate) struct AdHoc {
    /// The caller's key, before namespacing.
    pub(crate) key: String,
    /// How much may pass.
    pub(crate) quota: Quota,
    /// How it is counted.
    pub(crate) algorithm: Algorithm,
    /// What this request costs; 0 only reads.
    pub(crate) cost: u64,
}

impl AdHoc {
    /// The limit to check, under its namespaced store key `key` (see
    /// [`adhoc_key`]), with the default failure policy, `local`.
    fn limit<'a>(&self, key: &'a str) -> Limit<'a> {
        Limit::new(key, self.quota, self.algorithm).with_cost(self.cost)
    }
}

/// What happened to one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// No rule matched: not limited.
    NoRule,
    /// The matched rule is unlimited.
    Unlimited,
    /// The matched rule was replaced by another rule of the same request.
    Replaced,
    /// The rule or its domain is switched off by the kill switch.
    Disabled,
    /// The rule refuses everything (a limit of zero).
    Blocked,
    /// Checked against the store and enforced.
    Limited,
    /// Checked against the store, reported, never denied.
    Shadow,
    /// The store failed; the rule's failure policy decided.
    StoreFailed(FailurePolicy),
}

impl State {
    /// The name the native API and the metrics use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            State::NoRule => "no_rule",
            State::Unlimited => "unlimited",
            State::Replaced => "replaced",
            State::Disabled => "disabled",
            State::Blocked => "blocked",
            State::Limited => "limited",
            State::Shadow => "shadow",
            State::StoreFailed(_) => "store_error",
        }
    }
}

/// The service's answer for one descriptor.
#[derive(Debug, Clone)]
pub(crate) struct DescriptorVerdict {
    /// What happened.
    pub(crate) state: State,
    /// The rule that matched, if any (none for ad-hoc limits).
    pub(crate) rule: Option<Arc<Rule>>,
    /// The limit as Envoy names it, when a limit applies.
    pub(crate) envoy_limit: Option<(u64, Unit)>,
    /// The quota and algorithm checked (after tiers and priority reserves).
    pub(crate) applied: Option<(Quota, Algorithm)>,
    /// The store's decision (or a synthesized one for blocked and fail-closed
    /// descriptors). `None` when nothing was checked.
    pub(crate) decision: Option<Decision>,
}

impl DescriptorVerdict {
    fn new(state: State, rule: Option<&Arc<Rule>>) -> Self {
        Self {
            state,
            rule: rule.cloned(),
            envoy_limit: None,
            applied: None,
            decision: None,
        }
    }

    /// Whether this descriptor's answer can deny the request.
    pub(crate) fn enforcing(&self) -> bool {
        matches!(
            self.state,
            State::Limited | State::Blocked | State::StoreFailed(_)
        )
    }

    /// Whether this descriptor lets the request through (shadow limits always do).
    pub(crate) fn allowed(&self) -> bool {
        !self.enforcing() || self.decision.is_none_or(|d| d.allowed)
    }

    /// Whether a shadow limit would have denied the request.
    pub(crate) fn shadow_denied(&self) -> bool {
        self.state == State::Shadow && self.decision.is_some_and(|d| !d.allowed)
    }

    /// The `result` label of `tollgate_decisions_total`.
    fn result(&self) -> &'static str {
        match self.state {
            State::Shadow if self.shadow_denied() => "shadow_over_limit",
            State::Limited | State::Blocked | State::Shadow if self.allowed() => "ok",
            State::Limited | State::Blocked => "over_limit",
            other => other.name(),
        }
    }
}

/// The service's answer for one request.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    /// One per descriptor, in request order.
    pub(crate) descriptors: Vec<DescriptorVerdict>,
    /// When the check started, in nanoseconds since the Unix epoch (read before
    /// the store, so `started_at + reset_after` never passes the true reset).
    pub(crate) started_at: Nanos,
}

impl Verdict {
    /// Whether every descriptor lets the request through.
    pub(crate) fn allowed(&self) -> bool {
        self.descriptors.iter().all(DescriptorVerdict::allowed)
    }

    /// The descriptor that headers report: on a deny, the denying one that asks
    /// the client to wait longest; on an allow, the one with the fewest units
    /// left. Only enforcing descriptors with a decision take part.
    pub(crate) fn most_restrictive(&self) -> Option<&DescriptorVerdict> {
        let candidates: Vec<&DescriptorVerdict> = self
            .descriptors
            .iter()
            .filter(|d| d.enforcing() && d.decision.is_some())
            .collect();
        let outcome = Outcome {
            decisions: candidates.iter().filter_map(|d| d.decision).collect(),
        };
        let chosen = outcome.most_restrictive()?;
        let index = outcome
            .decisions
            .iter()
            .position(|d| std::ptr::eq(d, chosen))?;
        candidates.get(index).copied()
    }
}

impl<S: Store> RateLimiter<S> {
    /// A limiter enforcing `policy` with state in `store`.
    pub(crate) fn new(policy: Policy, store: S) -> Self {
        Self {
            policy: Arc::new(ArcSwap::from_pointee(policy)),
            kill_switch: Arc::new(KillSwitch::default()),
            store,
        }
    }

    /// The cell the policy lives in, for others that follow its reloads.
    pub(crate) fn policy_cell(&self) -> Arc<ArcSwap<Policy>> {
        Arc::clone(&self.policy)
    }

    /// The policy in force now.
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Puts `policy` in force for every request that starts from now on.
    pub(crate) fn set_policy(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
    }

    /// The run-time switch that turns enforcement off and on.
    pub(crate) fn kill_switch(&self) -> &Arc<KillSwitch> {
        &self.kill_switch
    }

    /// Checks `request` against the current policy.
    pub(crate) async fn check(&self, request: &Request<'_>) -> Result<Verdict, RequestError> {
        let resolved = self.policy.load().resolve(request)?;
        let started_at = SystemClock.now();
        let domain = request.domain;
        let mut enforce: Vec<(usize, &Applied)> = Vec::new();
        let mut shadow: Vec<(usize, &Applied)> = Vec::new();
        let mut descriptors: Vec<DescriptorVerdict> = Vec::with_capacity(resolved.len());
        for (index, resolved) in resolved.iter().enumerate() {
            let verdict = match resolved {
                Resolved::NoRule => DescriptorVerdict::new(State::NoRule, None),
                Resolved::Unlimited(rule) => DescriptorVerdict::new(State::Unlimited, Some(rule)),
                Resolved::Replaced(rule) => DescriptorVerdict::new(State::Replaced, Some(rule)),
                Resolved::Blocked(rule, _) | Resolved::Limit(Applied { rule, .. })
                    if !self.kill_switch.enforced(domain, rule.id()) =>
                {
                    DescriptorVerdict::new(State::Disabled, Some(rule))
                }
                Resolved::Blocked(rule, unit) => {
                    let state = if rule.shadow() {
                        State::Shadow
                    } else {
                        State::Blocked
                    };
                    DescriptorVerdict {
                        envoy_limit: Some((0, *unit)),
                        decision: Some(blocked(*unit, started_at)),
                        ..DescriptorVerdict::new(state, Some(rule))
                    }
                }
                Resolved::Limit(applied) => {
                    let state = if applied.shadow {
                        shadow.push((index, applied));
                        State::Shadow
                    } else {
                        enforce.push((index, applied));
                        State::Limited
                    };
                    DescriptorVerdict {
                        envoy_limit: Some(applied.envoy_limit),
                        applied: Some((applied.quota, applied.algorithm)),
                        ..DescriptorVerdict::new(state, Some(&applied.rule))
                    }
                }
            };
            descriptors.push(verdict);
        }

        self.decide(&mut descriptors, &enforce, false).await;
        self.decide(&mut descriptors, &shadow, true).await;
        record(request, &descriptors);
        Ok(Verdict {
            descriptors,
            started_at,
        })
    }

    /// Checks the limits of `batch` (enforcing or `shadow`) in one store call
    /// and writes the decisions into their descriptors.
    async fn decide(
        &self,
        descriptors: &mut [DescriptorVerdict],
        batch: &[(usize, &Applied)],
        shadow: bool,
    ) {
        if batch.is_empty() {
            return;
        }
        let limits: Vec<Limit<'_>> = batch.iter().map(|(_, a)| a.limit()).collect();
        match self.timed_check(&limits).await {
            Ok(outcome) => {
                for ((index, _), decision) in batch.iter().zip(outcome.decisions) {
                    descriptors[*index].decision = Some(decision);
                }
            }
            // A shadow limit never denies, so a failure leaves it undecided.
            Err(error) if shadow => tracing::warn!(%error, "store check of shadow limits failed"),
            Err(error) => {
                tracing::warn!(%error, "store check failed; the rules' failure policies decide");
                for (index, applied) in batch {
                    let descriptor = &mut descriptors[*index];
                    descriptor.state = State::StoreFailed(applied.failure);
                    descriptor.decision = fail(applied.failure, applied.quota);
                    metrics::store_fallback(applied.failure);
                }
            }
        }
    }

    /// Checks an ad-hoc limit. Its key is namespaced so that it cannot touch a
    /// policy's state. It has the default failure policy, `local`.
    pub(crate) async fn check_adhoc(&self, adhoc: &AdHoc) -> Verdict {
        let started_at = SystemClock.now();
        let key = adhoc_key(&adhoc.key);
        let limit = adhoc.limit(&key);
        let mut verdict = DescriptorVerdict {
            applied: Some((adhoc.quota, adhoc.algorithm)),
            ..DescriptorVerdict::new(State::Limited, None)
        };
        match self.timed_check(&[limit]).await {
            Ok(outcome) => verdict.decision = outcome.decisions.first().copied(),
            Err(error) => {
                tracing::warn!(%error, "store check of an ad-hoc limit failed");
                let failure = FailurePolicy::default();
                verdict.state = State::StoreFailed(failure);
                verdict.decision = fail(failure, adhoc.quota);
                metrics::store_fallback(failure);
            }
        }
        Verdict {
            descriptors: vec![verdict],
            started_at,
        }
    }

    /// Gives back the concurrency permits that `request`, admitted earlier,
    /// holds: the limits of its enforced (or shadow) concurrency rules.
    /// Returns how many limits were released. A release the store cannot
    /// make is logged; the lease then lapses after its period.
    pub(crate) async fn release(&self, request: &Request<'_>) -> Result<usize, RequestError> {
        let resolved = self.policy.load().resolve(request)?;
        let limits: Vec<Limit<'_>> = resolved
            .iter()
            .filter_map(|r| match r {
                Resolved::Limit(applied)
                    if applied.algorithm == Algorithm::Concurrency
                        && self.kill_switch.enforced(request.domain, applied.rule.id()) =>
                {
                    Some(applied.limit())
                }
                _ => None,
            })
            .collect();
        self.give_back(&limits).await;
        Ok(limits.len())
    }

    /// [`RateLimiter::release`] for an ad-hoc limit.
    pub(crate) async fn release_adhoc(&self, adhoc: &AdHoc) -> usize {
        if adhoc.algorithm != Algorithm::Concurrency {
            return 0;
        }
        let key = adhoc_key(&adhoc.key);
        let limit = adhoc.limit(&key);
        self.give_back(&[limit]).await;
        1
    }

    async fn give_back(&self, limits: &[Limit<'_>]) {
        if limits.is_empty() {
            return;
        }
        if let Err(error) = self.store.release(limits).await {
            tracing::warn!(%error, "release failed; the permits lapse after their period");
        }
    }

    /// Reads the state of the store key `key` under `quota` and `algorithm`
    /// without consuming anything (a check at cost 0).
    pub(crate) async fn read(
        &self,
        key: &str,
        quota: Quota,
        algorithm: Algorithm,
    ) -> Result<Option<Decision>, StoreError> {
        let limit = Limit {
            key,
            quota,
            algorithm,
            cost: 0,
            failure: FailurePolicy::Local,
        };
        let outcome = self.timed_check(&[limit]).await?;
        Ok(outcome.decisions.first().copied())
    }

    /// Whether the store reaches its state (Redis answers) and answers a
    /// check (of a probe key, at cost 0).
    pub(crate) async fn ready(&self) -> bool {
        let quota = Quota::per_second(1).expect("1 per second is a valid quota");
        self.store.ready().await && self.read(PROBE_KEY, quota, Algorithm::Gcra).await.is_ok()
    }

    /// The store the limits live in.
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    async fn timed_check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        let started = Instant::now();
        let result = self.store.check(limits).await;
        metrics::store_call(started.elapsed(), result.is_ok());
        result
    }
}

/// The limiter's store as a [`Store`] of its own, for the gateway's layer:
/// its checks reach the same state as the APIs' and are timed in the same
/// store metrics.
pub(crate) struct Shared<S>(pub(crate) Arc<RateLimiter<S>>);

impl<S: Store> Store for Shared<S> {
    fn check(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        self.0.timed_check(limits)
    }

    fn release(&self, limits: &[Limit<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.store.release(limits)
    }

    fn ready(&self) -> impl Future<Output = bool> + Send {
        self.0.store.ready()
    }
}

/// Counts each matched descriptor's decision (unmatched ones carry no
/// config-bounded labels). A rule with envoyproxy/ratelimit's
/// `detailed_metric: true` is labelled by the request's descriptor, entry by
/// entry (`key_value.key2_value2`, as that service names its stats), so each
/// value gets its own series: the rule's author opted into that label set.
fn record(request: &Request<'_>, descriptors: &[DescriptorVerdict]) {
    for (index, descriptor) in descriptors.iter().enumerate() {
        if let Some(rule) = &descriptor.rule {
            let detailed = rule
                .detailed_metric()
                .then(|| request.descriptors.get(index).map(detailed_label))
                .flatten();
            let rule = detailed
                .as_deref()
                .unwrap_or_else(|| metrics::rule_label(rule));
            metrics::decision(request.domain, rule, descriptor.result());
            if descriptor.shadow_denied() {
                metrics::shadow_denial(request.domain, rule);
            }
        }
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

/// The store key of an ad-hoc limit named `key` by the caller.
pub(crate) fn adhoc_key(key: &str) -> String {
    // Not `format!`: this runs on every ad-hoc check.
    let mut namespaced = String::with_capacity(ADHOC_PREFIX.len() + key.len());
    namespaced.push_str(ADHOC_PREFIX);
    namespaced.push_str(key);
    namespaced
}

/// The decision of a rule that refuses everything: nothing left until the
/// current `unit` window (aligned to the epoch) ends, and no retry helps.
fn blocked(unit: Unit, now: Nanos) -> Decision {
    let unit_ns = u64::try_from(unit.duration().as_nanos()).unwrap_or(u64::MAX);
    Decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        reset_after: Duration::from_nanos(unit_ns - now % unit_ns),
        retry_after: None,
        delay: Duration::ZERO,
    }
}

/// What a failure policy decides when the store returns an error. The stores
/// `serve` runs on do not for an unreachable Redis (the Redis store applies each
/// limit's policy itself, `local` included); this covers any other error:
/// `fail_closed` denies (with no retry time, since none is known), `fail_open`
/// and `local` (which has no local state to decide from here) let it through.
fn fail(failure: FailurePolicy, quota: Quota) -> Option<Decision> {
    match failure {
        FailurePolicy::FailClosed => Some(Decision {
            allowed: false,
            limit: quota.burst(),
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: None,
            delay: Duration::ZERO,
        }),
        FailurePolicy::FailOpen | FailurePolicy::Local => None,
    }
}

#[cfg(test)]
mod tests {
    use std::future::{Future, ready};

    use tollgate_core::{StoreError, SystemClock};
    use tollgate_policy::{Descriptor, Entry};
    use tollgate_store::{MemoryConfig, MemoryStore};

    use super::*;

    /// A store that is always down.
    struct DownStore;

    impl Store for DownStore {
        fn check(
            &self,
            _: &[Limit<'_>],
        ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
            ready(Err(StoreError::Timeout(Duration::from_millis(5))))
        }

        fn release(&self, _: &[Limit<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
            ready(Err(StoreError::Timeout(Duration::from_millis(5))))
        }
    }

    const POLICY: &str = "
domain: api
rules:
  - name: open
    match: [{ key: open }]
    limit: { requests: 1, per: 1h }
    failure: fail_open
  - name: closed
    match: [{ key: closed }]
    limit: { requests: 1, per: 1h }
    failure: fail_closed
  - name: user
    match: [{ key: user }]
    limit: { requests: 2, per: 1h }
  - name: global
    match: [{ key: global }]
    limit: { requests: 100, per: 1h }
  - name: dark
    match: [{ key: dark }]
    limit: { requests: 1, per: 1h }
    shadow: true
";

    fn descriptor(key: &str, value: &str) -> Descriptor {
        Descriptor {
            entries: vec![Entry::new(key, value)],
            ..Descriptor::default()
        }
    }

    fn request<'a>(descriptors: &'a [Descriptor]) -> Request<'a> {
        Request {
            domain: "api",
            descriptors,
            hits_addend: 1,
        }
    }

    fn memory() -> RateLimiter<MemoryStore<SystemClock>> {
        let policy = Policy::parse("test.yaml", POLICY).expect("valid test policy");
        RateLimiter::new(
            policy,
            MemoryStore::with_clock(MemoryConfig::default(), SystemClock),
        )
    }

    async fn run<S: Store>(limiter: &RateLimiter<S>, descriptors: &[Descriptor]) -> Verdict {
        limiter
            .check(&request(descriptors))
            .await
            .expect("valid request")
    }

    #[tokio::test]
    async fn failure_policies_decide_when_the_store_is_down() {
        let policy = Policy::parse("test.yaml", POLICY).expect("valid test policy");
        let limiter = RateLimiter::new(policy, DownStore);
        let open = run(&limiter, &[descriptor("open", "a")]).await;
        assert!(open.allowed());
        assert_eq!(
            open.descriptors[0].state,
            State::StoreFailed(FailurePolicy::FailOpen)
        );
        let closed = run(
            &limiter,
            &[descriptor("open", "a"), descriptor("closed", "a")],
        )
        .await;
        assert!(!closed.allowed());
        assert_eq!(
            closed.descriptors[1].state,
            State::StoreFailed(FailurePolicy::FailClosed)
        );
        let local = run(&limiter, &[descriptor("user", "a")]).await;
        assert!(
            local.allowed(),
            "local falls back to allowing until the Redis store lands"
        );
        assert!(!limiter.ready().await);
    }

    #[tokio::test]
    async fn a_deny_by_one_layer_consumes_nothing_from_the_others() {
        let limiter = memory();
        let layers = [descriptor("user", "alice"), descriptor("global", "all")];
        for _ in 0..2 {
            assert!(run(&limiter, &layers).await.allowed());
        }
        let denied = run(&limiter, &layers).await;
        assert!(!denied.allowed());
        let reported = denied.most_restrictive().expect("a limit applied");
        assert!(reported.rule.as_ref().is_some_and(|r| r.id() == "user"));
        let global = run(&limiter, &[descriptor("global", "all")]).await;
        let remaining = global.descriptors[0].decision.map(|d| d.remaining);
        assert_eq!(
            remaining,
            Some(97),
            "two admitted + this one; the deny took nothing"
        );
    }

    #[tokio::test]
    async fn shadow_limits_never_deny_and_kill_switch_disables() {
        let limiter = memory();
        let dark = [descriptor("dark", "x")];
        assert!(run(&limiter, &dark).await.allowed());
        let second = run(&limiter, &dark).await;
        assert!(second.allowed());
        assert!(second.descriptors[0].shadow_denied());

        let user = [descriptor("user", "bob")];
        for _ in 0..2 {
            run(&limiter, &user).await;
        }
        assert!(!run(&limiter, &user).await.allowed());
        limiter.kill_switch().set("api", Some("user"), false);
        let off = run(&limiter, &user).await;
        assert!(off.allowed());
        assert_eq!(off.descriptors[0].state, State::Disabled);
        limiter.kill_switch().set("api", Some("user"), true);
        assert!(!run(&limiter, &user).await.allowed());
    }

    #[tokio::test]
    async fn adhoc_keys_are_namespaced_and_reads_consume_nothing() {
        let limiter = memory();
        let adhoc = AdHoc {
            key: "k".into(),
            quota: Quota::per_hour(2).expect("valid"),
            algorithm: Algorithm::Gcra,
            cost: 1,
        };
        assert!(limiter.check_adhoc(&adhoc).await.allowed());
        let read = limiter
            .read(&adhoc_key("k"), adhoc.quota, adhoc.algorithm)
            .await
            .expect("memory store answers")
            .expect("one decision");
        assert_eq!(read.remaining, 1);
        let again = limiter
            .read(&adhoc_key("k"), adhoc.quota, adhoc.algorithm)
            .await;
        assert_eq!(again.ok().flatten().map(|d| d.remaining), Some(1));
        let raw = limiter.read("k", adhoc.quota, adhoc.algorithm).await;
        assert_eq!(
            raw.ok().flatten().map(|d| d.remaining),
            Some(2),
            "the raw key is another budget"
        );
    }

    #[test]
    fn blocked_resets_at_the_unit_boundary() {
        let d = blocked(Unit::Minute, 61_500_000_000);
        assert!(!d.allowed);
        assert_eq!(d.reset_after, Duration::from_millis(58_500));
        assert_eq!(d.retry_after, None);
    }
}
