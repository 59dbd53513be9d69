//! The one place that decides: descriptors in, a [`Verdict`] out.
//!
//! Every door (Envoy's gRPC API, `POST /json`, `POST /v1/check`, the gateway
//! and the tower layer) hands its request to [`Enforcer::enforce`] and only
//! translates the [`Verdict`] to its wire format. Nothing else resolves rules,
//! applies shadow, blocked, kill-switch and failure-policy rules, or asks the
//! store, so the same request gets the same answer through every door. What
//! watches decisions (metrics, logs) attaches as an [`Observer`], which the
//! enforcer calls once per decision, so every door counts alike.
//!
//! The semantics every door shares (DESIGN §3):
//!
//! - **Counting** ([`Counting`]). In Tollgate's own format layers are
//!   all-or-nothing: every enforcing limit of a request is checked in one
//!   store call, and a deny by one consumes nothing from the others. A domain
//!   in envoyproxy/ratelimit's format is counted as it counts by default:
//!   each descriptor on its own, charged whether the request is admitted or
//!   not, and a denied hit still counted in its window
//!   ([`Algorithm::HitCounter`]); [`Enforcer::with_envoy_counting`] gives such
//!   domains all-or-nothing counting instead.
//! - **Quota mode** (envoyproxy/ratelimit's `quota_mode`, and `QUOTA_MODE`
//!   for every rule): a request over a quota-mode limit is denied only when
//!   every quota-mode limit of the request is over (or a rate limit denies).
//!   Quota-mode limits are checked each on its own.
//! - **Shadow limits see every request.** They are checked in a second store
//!   call after the enforcing ones, whether those admitted the request or not
//!   (envoyproxy/ratelimit charges every descriptor of a request), so a shadow
//!   rule counts the traffic it would count if it were enforcing, and never
//!   denies. A global shadow mode ([`Enforcer::with_shadow_mode`],
//!   envoyproxy/ratelimit's `SHADOW_MODE`) makes every rule a shadow rule.
//! - **A blocked rule** (a limit of zero) denies without asking the store; a
//!   blocked shadow rule is a would-be denial on every request.
//! - **Kill switch**: a switched-off rule or domain is reported as `disabled`
//!   and neither counted nor enforced.
//! - **A store that cannot answer** leaves each enforcing limit to its
//!   [`FailurePolicy`]: `fail_closed` denies the request (an over-limit answer
//!   at every door, since Envoy's protocol has no other), `fail_open` and
//!   `local` admit it. Stores with a local fallback apply `local` themselves
//!   and do not err for an unreachable backend.

mod observer;
mod permit;
mod plan;
mod reports;
mod request;
mod verdict;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{
    Algorithm, Clock, Decision, IntoNanos, Limit, MonotonicClock, Nanos, Outcome, Quota, Store,
    StoreError, SystemClock, Utilization,
};

pub use observer::{Decided, NoObserver, Observer};
pub use permit::Permit;
use plan::{Call, Mode, Plan, Settings, Step};
pub use request::{AdHoc, Check, Prepared, RequestLimits};
pub use verdict::{DescriptorVerdict, Pressure, Shed, State, Verdict};

pub use reports::UtilizationReport;
use reports::{MAX_INSTANCES, Reports};

use crate::{
    Applied, Descriptor, KillSwitch, Policy, PolicyHandle, ReportError, Request, RequestError,
    ResetError, Resolved, Rule, Shedding, Unit, Unsupported,
};

/// How the limits of a request in envoyproxy/ratelimit's format are charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Counting {
    /// envoyproxy/ratelimit's default: every descriptor is checked on its own
    /// and charged its hits whether the request is admitted or not, and a
    /// window that denied keeps counting ([`Algorithm::HitCounter`]).
    #[default]
    EachHit,
    /// Tollgate's: a request is charged to every limit or, when one denies,
    /// to none (nearest to envoyproxy/ratelimit's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`).
    AllOrNothing,
}

impl Counting {
    /// The setting's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Counting::EachHit => "each-hit",
            Counting::AllOrNothing => "all-or-nothing",
        }
    }
}

impl FromStr for Counting {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "each-hit" => Ok(Counting::EachHit),
            "all-or-nothing" => Ok(Counting::AllOrNothing),
            _ => Err(format!(
                "unknown counting {s:?}; expected each-hit or all-or-nothing"
            )),
        }
    }
}

/// Why a store does not support a limit: the text of its
/// [`StoreError::Invalid`].
fn reason(error: StoreError) -> String {
    match error {
        StoreError::Invalid(reason) => reason,
        other => other.to_string(),
    }
}

/// The key readiness probes read (at cost 0, so it stores nothing).
const PROBE_KEY: &str = "probe:readyz";

/// A request's limits of one kind (enforcing, checked alone, shadow), each
/// with its descriptor's index; and the store limits made of them. Inline for
/// the few limits most requests have, so a check allocates for neither.
type Batched<'a> = SmallVec<[(usize, &'a Applied); 2]>;
type Limits<'a> = SmallVec<[Limit<'a>; 2]>;

/// The one evaluator: owns the policy handle, the kill switch and the store,
/// and turns every door's requests into [`Verdict`]s. See the module docs.
pub struct Enforcer<S> {
    policy: PolicyHandle,
    kill_switch: Arc<KillSwitch>,
    store: S,
    observer: Arc<dyn Observer>,
    clock: Arc<dyn Clock>,
    /// The monotonic clock store calls are timed by.
    timer: Arc<dyn Clock>,
    limits: RequestLimits,
    /// Every rule acts as a shadow rule.
    shadow_mode: bool,
    /// Every rule is in quota mode.
    quota_mode: bool,
    /// How envoyproxy-format domains are counted.
    envoy_counting: Counting,
    /// The utilization the services of shedding domains report.
    reports: Reports,
}

impl<S> fmt::Debug for Enforcer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Enforcer")
            .field("kill_switch", &self.kill_switch)
            .field("shadow_mode", &self.shadow_mode)
            .field("quota_mode", &self.quota_mode)
            .field("envoy_counting", &self.envoy_counting)
            .finish_non_exhaustive()
    }
}

/// The store calls a request's plan makes ([`Enforcer::calls`]).
struct Calls<'r> {
    /// Each descriptor's verdict before the calls.
    descriptors: Vec<DescriptorVerdict>,
    /// Enforcing limits checked together: all-or-nothing.
    enforce: Batched<'r>,
    /// Enforcing limits checked each in a call of its own.
    alone: Batched<'r>,
    /// Shadow limits checked together.
    shadow: Batched<'r>,
    /// Shadow limits checked each in a call of its own.
    shadow_alone: Batched<'r>,
    /// `enforce` is only read at cost 0: a blocked rule denied the request.
    peek: bool,
}

/// Which store call a batch of limits goes in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Batch {
    Enforce,
    Shadow,
}

impl<S: Store> Enforcer<S> {
    /// An enforcer of `policy` (a [`Policy`], or a [`PolicyHandle`] that a
    /// reloader swaps) with state in `store`, observed by nobody, reading the
    /// wall clock for the verdicts' `started_at` and the operating system's
    /// monotonic clock to time store calls.
    pub fn new(policy: impl Into<PolicyHandle>, store: S) -> Self {
        Self {
            policy: policy.into(),
            kill_switch: Arc::new(KillSwitch::default()),
            store,
            observer: Arc::new(NoObserver),
            clock: Arc::new(SystemClock),
            timer: Arc::new(MonotonicClock::default()),
            limits: RequestLimits::default(),
            shadow_mode: false,
            quota_mode: false,
            envoy_counting: Counting::default(),
            reports: Reports::default(),
        }
    }

    /// The same enforcer, with every rule in quota mode or not
    /// (envoyproxy/ratelimit's `QUOTA_MODE`): see the module docs.
    #[must_use]
    pub fn with_quota_mode(self, quota_mode: bool) -> Self {
        Self { quota_mode, ..self }
    }

    /// How envoyproxy-format domains are counted
    /// ([`Enforcer::with_envoy_counting`]).
    pub fn envoy_counting(&self) -> Counting {
        self.envoy_counting
    }

    /// Whether every rule is in quota mode ([`Enforcer::with_quota_mode`]).
    pub fn quota_mode(&self) -> bool {
        self.quota_mode
    }

    /// The same enforcer, counting the requests of envoyproxy-format domains
    /// as `counting` says (by default, as envoyproxy/ratelimit does). Domains
    /// in Tollgate's format are always all-or-nothing.
    #[must_use]
    pub fn with_envoy_counting(self, envoy_counting: Counting) -> Self {
        Self {
            envoy_counting,
            ..self
        }
    }

    /// The same enforcer, in global shadow mode or not: in it, every rule of
    /// the policy (and every limit override of a request) is a shadow rule,
    /// counted and reported on every request and never denying
    /// (envoyproxy/ratelimit's `SHADOW_MODE`). Ad-hoc limits, which the
    /// caller names itself, are still enforced.
    #[must_use]
    pub fn with_shadow_mode(self, shadow_mode: bool) -> Self {
        Self {
            shadow_mode,
            ..self
        }
    }

    /// The same enforcer, taking requests up to `limits`.
    #[must_use]
    pub fn with_request_limits(self, limits: RequestLimits) -> Self {
        Self { limits, ..self }
    }

    /// The same enforcer, reporting every decision to `observer`.
    #[must_use]
    pub fn with_observer(self, observer: Arc<dyn Observer>) -> Self {
        Self { observer, ..self }
    }

    /// The same enforcer, obeying `kill_switch` (shared with an admin API).
    #[must_use]
    pub fn with_kill_switch(self, kill_switch: Arc<KillSwitch>) -> Self {
        Self {
            kill_switch,
            ..self
        }
    }

    /// The same enforcer, reading `started_at` (epoch nanoseconds) from
    /// `clock`, which also times how fresh utilization reports are.
    #[must_use]
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    /// The same enforcer, timing its store calls (for
    /// [`Observer::store_call`]) by `timer`, a monotonic clock: one cheaper
    /// to read than the operating system's, such as a time stamp counter,
    /// takes two readings a check off the hot path.
    #[must_use]
    pub fn with_timer(self, timer: Arc<dyn Clock>) -> Self {
        Self { timer, ..self }
    }

    /// The handle the policy lives in: store a new policy there to reload.
    pub fn policy_handle(&self) -> &PolicyHandle {
        &self.policy
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load()
    }

    /// The run-time switch that turns enforcement off and on.
    pub fn kill_switch(&self) -> &Arc<KillSwitch> {
        &self.kill_switch
    }

    /// The wall clock the verdicts' `started_at` is read from.
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    /// The store the limits live in.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Whether this enforcer's decisions ([`Enforcer::enforce`],
    /// [`Enforcer::enforce_prepared`]) and releases complete at their first
    /// poll: they await nothing but their store's calls, and its store
    /// decides at once ([`Store::decides_at_once`]). A caller may then poll
    /// one where it stands rather than box it.
    pub fn decides_at_once(&self) -> bool {
        self.store.decides_at_once()
    }

    /// The first rule of `policy` whose limit this enforcer's store cannot
    /// enforce exactly ([`Store::supports`]): to refuse such a config when
    /// it loads (at start-up, and on reload through
    /// [`Reloader::with_check`](crate::Reloader::with_check)) rather than fail
    /// every check of the rule by its failure policy.
    ///
    /// # Errors
    ///
    /// The rule, where it is defined, and why.
    pub fn unsupported(&self, policy: &Policy) -> Result<(), Unsupported> {
        for domain in policy.domains() {
            for rule in policy.rules(domain) {
                let (Some(algorithm), Some(quota)) = (rule.algorithm(), rule.quota()) else {
                    continue;
                };
                self.store
                    .supports(algorithm, &quota)
                    .map_err(|e| Unsupported {
                        location: rule.source().to_owned(),
                        domain: domain.to_owned(),
                        rule: rule.id().to_owned(),
                        reason: reason(e),
                    })?;
            }
        }
        Ok(())
    }

    /// Decides `check`: the entry of every evaluation, at every door. A
    /// request the policy cannot take, or whose own limit (ad hoc, or an
    /// override) the store cannot enforce exactly, is an error (a bad
    /// request).
    pub fn enforce<'a>(
        &'a self,
        check: Check<'a>,
    ) -> impl Future<Output = Result<Verdict, RequestError>> + Send + 'a
    where
        S: Sync,
    {
        // Not an `async fn` around the other: that would nest one future in
        // another, and the tower layer's check future must stay small.
        self.enforce_with_utilization(check, None)
    }

    /// Decides `check` as [`Enforcer::enforce`] does, with the utilization
    /// its sender reports of itself, if any, in place of the one its
    /// domain's service reported ([`Enforcer::report_utilization`]): a
    /// service that asks before each request it handles knows its own load.
    /// It is not kept for other checks. An ad-hoc check is never shed.
    pub async fn enforce_with_utilization(
        &self,
        check: Check<'_>,
        utilization: Option<Utilization>,
    ) -> Result<Verdict, RequestError> {
        match check {
            Check::Policy(request) => self.enforce_policy(&request, utilization).await,
            Check::AdHoc(adhoc) => {
                self.limits.check_adhoc(adhoc)?;
                self.store
                    .supports(adhoc.algorithm, &adhoc.quota)
                    .map_err(|e| RequestError::UnsupportedLimit {
                        descriptor: None,
                        reason: reason(e),
                    })?;
                Ok(self.enforce_adhoc(adhoc).await)
            }
        }
    }

    /// Resolves a request once, to decide it again and again with
    /// [`Enforcer::enforce_prepared`]: a connection whose every request has
    /// the same descriptors (the gateway's, keyed by its client's address)
    /// is resolved when it begins rather than on each request.
    ///
    /// # Errors
    ///
    /// A request the policy in force cannot take, as [`Enforcer::enforce`]
    /// refuses it.
    pub fn prepare(
        &self,
        domain: &str,
        descriptors: Arc<[Descriptor]>,
        hits_addend: u64,
    ) -> Result<Prepared, RequestError> {
        let policy = self.policy.load();
        let request = Request {
            domain,
            descriptors: &descriptors,
            hits_addend,
        };
        let (resolved, each) = self.resolve(&policy, &request)?;
        Ok(Prepared {
            domain: domain.to_owned(),
            descriptors,
            hits_addend,
            policy,
            resolved,
            each,
        })
    }

    /// Decides a prepared request as [`Enforcer::enforce`] decides it, with
    /// the resolution made when it was prepared while that policy is still
    /// in force, and a new one once another is.
    ///
    /// # Errors
    ///
    /// As [`Enforcer::enforce`], for a policy put in force since.
    pub async fn enforce_prepared(&self, prepared: &Prepared) -> Result<Verdict, RequestError> {
        let request = prepared.request();
        if Arc::ptr_eq(&self.policy.guard(), &prepared.policy) {
            let shed = self.shed_now(&request, prepared.policy.shedding(&prepared.domain), None);
            self.decide_resolved(&request, &prepared.resolved, prepared.each, shed)
                .await
        } else {
            self.enforce_policy(&request, None).await
        }
    }

    /// Decides `request` as [`Enforcer::enforce`] would, if that needs no
    /// store call, or only calls the store answers from what it knows
    /// ([`Store::known`]: a deny cache that knows every limit is over);
    /// `None` otherwise, having asked nothing and charged nothing. The
    /// answer is the one [`Enforcer::enforce`] gives, observed alike: a
    /// door that cannot wait for the store (past its bound on calls in
    /// flight) answers these first and sheds the rest.
    pub fn enforce_known(&self, request: &Request<'_>) -> Option<Result<Verdict, RequestError>> {
        let policy = self.policy.guard();
        let (resolved, each) = match self.resolve(&policy, request) {
            Ok(resolved) => resolved,
            Err(error) => return Some(Err(error)),
        };
        let shed = self.shed_now(request, policy.shedding(request.domain), None);
        self.decide_known(request, &resolved, each, shed)
    }

    async fn enforce_policy(
        &self,
        request: &Request<'_>,
        utilization: Option<Utilization>,
    ) -> Result<Verdict, RequestError> {
        let policy = self.policy.guard();
        let (resolved, each) = self.resolve(&policy, request)?;
        let shed = self.shed_now(request, policy.shedding(request.domain), utilization);
        self.decide_resolved(request, &resolved, each, shed).await
    }

    /// Keeps `utilization` as what `instance` of the service behind `domain`
    /// reports of its load (`POST /v1/utilization`). Until the domain's
    /// `shed.report_ttl` passes, its requests that carry no utilization of
    /// their own are shed by tier against the mean of its instances' fresh
    /// reports; a service that stops reporting stops being shed for.
    ///
    /// # Errors
    ///
    /// A domain that does not shed, an instance name past the request
    /// limits' value length, or one instance too many.
    pub fn report_utilization(
        &self,
        domain: &str,
        instance: &str,
        utilization: Utilization,
    ) -> Result<(), ReportError> {
        let policy = self.policy.guard();
        let shedding = policy
            .shedding(domain)
            .ok_or_else(|| ReportError::NoShedding(domain.to_owned()))?;
        if instance.len() > self.limits.value_bytes {
            return Err(ReportError::InstanceTooLong(self.limits.value_bytes));
        }
        self.reports
            .report(
                domain,
                instance,
                utilization,
                self.clock.now(),
                shedding.report_ttl(),
            )
            .map_err(|_| ReportError::TooManyInstances {
                domain: domain.to_owned(),
                max: MAX_INSTANCES,
            })
    }

    /// The fresh reports of `domain`'s service this enforcer knows of, each
    /// instance's latest: what a replica shares with the others through
    /// the store. Empty when the domain does not shed.
    pub fn utilization_reports(&self, domain: &str) -> Vec<UtilizationReport> {
        let policy = self.policy.guard();
        let Some(shedding) = policy.shedding(domain) else {
            return Vec::new();
        };
        self.reports
            .fresh(domain, self.clock.now(), shedding.report_ttl())
    }

    /// Takes the reports another replica shares through the store (its
    /// [`Enforcer::utilization_reports`]) into what `domain`'s checks are
    /// shed by: each instance's later report wins, stale ones are dropped.
    /// Nothing happens for a domain that does not shed.
    pub fn merge_utilization_reports(
        &self,
        domain: &str,
        reports: impl IntoIterator<Item = UtilizationReport>,
    ) {
        let policy = self.policy.guard();
        if let Some(shedding) = policy.shedding(domain) {
            self.reports
                .merge(domain, reports, self.clock.now(), shedding.report_ttl());
        }
    }

    /// The utilization `domain`'s service reports now: the mean of its
    /// instances' fresh reports, and how many there are. `None` when the
    /// domain does not shed or has no fresh report.
    pub fn reported_utilization(&self, domain: &str) -> Option<(Utilization, usize)> {
        let policy = self.policy.guard();
        let ttl = policy.shedding(domain)?.report_ttl();
        self.reports.current(domain, self.clock.now(), ttl)
    }

    /// [`Enforcer::shed`] now, where the domain sheds (`shedding`) and global
    /// shadow mode (which denies nothing, so sheds nothing) is off. Decided
    /// before the store calls' future is made, so that only a pointer of it
    /// is kept there.
    fn shed_now(
        &self,
        request: &Request<'_>,
        shedding: Option<&Arc<Shedding>>,
        own: Option<Utilization>,
    ) -> Option<Box<Shed>> {
        let shedding = shedding.filter(|_| !self.shadow_mode)?;
        self.shed(request, shedding, own, self.clock.now())
            .map(Box::new)
    }

    /// Whether `request` is shed at `now`: the utilization it carries, or
    /// else its domain's reported one, is past its tier's threshold.
    fn shed(
        &self,
        request: &Request<'_>,
        shedding: &Shedding,
        own: Option<Utilization>,
        now: Nanos,
    ) -> Option<Shed> {
        let utilization = match own {
            Some(own) => own,
            None => {
                self.reports
                    .current(request.domain, now, shedding.report_ttl())?
                    .0
            }
        };
        let tier = shedding.tier(request.descriptors);
        (!shedding.thresholds().admits(tier, utilization.percent())).then(|| Shed {
            tier,
            pressure: Pressure::Reported(utilization),
            retry_after: shedding.retry_after(),
        })
    }

    /// The shed of a denied request that only its domain's shared budgets
    /// (rules with `shed: true`) denied, each past the share of a tier below
    /// critical: the budget has room, the tier's share of it does not, so
    /// the request is shed (503) rather than limited (429). Critical, whose
    /// share is the whole budget, is limited when the budget is spent.
    fn budget_shed(request: &Request<'_>, verdict: &Verdict) -> Option<Shed> {
        let mut shed: Option<Shed> = None;
        for (d, descriptor) in verdict.descriptors.iter().zip(request.descriptors) {
            if d.allowed() {
                continue;
            }
            if d.state != State::Limited {
                return None;
            }
            let (tier, share, shedding) = d.rule.as_ref()?.budget_share(descriptor)?;
            if share >= 100 {
                return None;
            }
            let retry_after = d
                .decision
                .and_then(|d| d.retry_after())
                .unwrap_or(shedding.retry_after());
            shed = Some(Shed {
                tier,
                pressure: Pressure::Budget(share),
                retry_after: shed.map_or(retry_after, |s| s.retry_after.max(retry_after)),
            });
        }
        shed
    }

    /// The limits of `request` under `policy`, and whether its descriptors
    /// are charged each on its own (envoyproxy/ratelimit's counting, where a
    /// fixed window keeps counting the hits it denies).
    fn resolve(
        &self,
        policy: &Policy,
        request: &Request<'_>,
    ) -> Result<(Vec<Resolved>, bool), RequestError> {
        self.limits.check(request)?;
        let mut resolved = policy.resolve(request)?;
        let each = self.envoy_counting == Counting::EachHit && policy.is_envoy(request.domain);
        if each {
            for r in &mut resolved {
                if let Resolved::Limit(a) = r
                    && a.algorithm == Algorithm::FixedWindow
                    && a.rule.is_envoy()
                {
                    a.algorithm = Algorithm::HitCounter;
                }
            }
        }
        Ok((resolved, each))
    }

    /// The store calls `request`'s plan makes: each descriptor's verdict
    /// before them, and the limits of each call. Made and spent in a
    /// function of its own, so that the plan's steps are not kept in the
    /// future across the store calls.
    fn calls<'r>(
        &self,
        request: &Request<'_>,
        resolved: &'r [Resolved],
        each: bool,
        started_at: Nanos,
    ) -> Calls<'r> {
        let settings = Settings {
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            each,
        };
        let mut calls = Calls {
            descriptors: Vec::with_capacity(resolved.len()),
            enforce: Batched::new(),
            alone: Batched::new(),
            shadow: Batched::new(),
            shadow_alone: Batched::new(),
            peek: false,
        };
        let plan = Plan::new(resolved, settings, |rule| {
            self.kill_switch.enforced(request.domain, rule.id())
        });
        for (index, (resolved, step)) in resolved.iter().zip(plan.0).enumerate() {
            calls.descriptors.push(step.verdict(resolved, started_at));
            let (Resolved::Limit(applied), Step::Check { call, mode, .. }) = (resolved, step)
            else {
                continue;
            };
            let batch = match (mode, call) {
                (Mode::Enforce, Call::Together) => &mut calls.enforce,
                (Mode::Enforce, Call::Peek) => {
                    calls.peek = true;
                    &mut calls.enforce
                }
                (Mode::Enforce, Call::Alone) => &mut calls.alone,
                (_, Call::Alone) => &mut calls.shadow_alone,
                (_, Call::Together | Call::Peek) => &mut calls.shadow,
            };
            batch.push((index, applied));
        }
        calls
    }

    /// Whether the store enforces every limit of `calls` exactly. Config
    /// rules were checked when their config loaded (see
    /// `Enforcer::unsupported`); a request's own override was not.
    fn supported(&self, batches: [&Batched<'_>; 4]) -> Result<(), RequestError> {
        for (index, applied) in batches.into_iter().flatten() {
            self.store
                .supports(applied.algorithm, &applied.quota)
                .map_err(|e| RequestError::UnsupportedLimit {
                    descriptor: Some(*index),
                    reason: reason(e),
                })?;
        }
        Ok(())
    }

    /// The verdict on a shed request, observed: shed before any store
    /// call, so it is charged nothing.
    fn shed_verdict(
        &self,
        request: &Request<'_>,
        descriptors: Vec<DescriptorVerdict>,
        started_at: Nanos,
        shed: Box<Shed>,
    ) -> Verdict {
        let verdict = Verdict {
            descriptors,
            started_at,
            permit: Permit::default(),
            shed: Some(shed),
        };
        self.observed(request, verdict)
    }

    /// Decides `request`, whose limits are `resolved` ([`Enforcer::resolve`]):
    /// plans each descriptor's step ([`Plan`]), then makes the plan's store
    /// calls.
    /// `shed` says why the request is shed, when it is.
    async fn decide_resolved(
        &self,
        request: &Request<'_>,
        resolved: &[Resolved],
        each: bool,
        shed: Option<Box<Shed>>,
    ) -> Result<Verdict, RequestError> {
        let started_at = self.clock.now();
        // Taken apart at once: the future keeps only the parts.
        let Calls {
            mut descriptors,
            enforce,
            alone,
            shadow,
            shadow_alone,
            peek,
        } = self.calls(request, resolved, each, started_at);
        if let Some(shed) = shed {
            return Ok(self.shed_verdict(request, descriptors, started_at, shed));
        }
        self.supported([&enforce, &alone, &shadow, &shadow_alone])?;

        // Each batch's future is made only when it has limits: most
        // requests have one batch.
        let mut permit = Permit::default();
        if peek {
            self.peek(&mut descriptors, &enforce).await;
        } else if !enforce.is_empty() {
            permit = self
                .decide(&mut descriptors, &enforce, Batch::Enforce)
                .await;
        }
        if !alone.is_empty() {
            permit.extend(
                self.decide_each(&mut descriptors, &alone, Batch::Enforce)
                    .await,
            );
        }
        if !shadow.is_empty() {
            permit.extend(self.decide(&mut descriptors, &shadow, Batch::Shadow).await);
        }
        if !shadow_alone.is_empty() {
            permit.extend(
                self.decide_each(&mut descriptors, &shadow_alone, Batch::Shadow)
                    .await,
            );
        }
        let mut verdict = Verdict {
            descriptors,
            started_at,
            permit,
            shed: None,
        };
        if !verdict.allowed() {
            verdict.shed = Self::budget_shed(request, &verdict).map(Box::new);
        }
        // Limits checked on their own may have admitted a request that
        // another denied: it holds no concurrency then.
        if !verdict.allowed() && !verdict.permit.is_empty() {
            let permit = std::mem::take(&mut verdict.permit);
            self.release(permit).await;
        }
        Ok(self.observed(request, verdict))
    }

    /// Decides `request` as [`Enforcer::decide_resolved`] does when every
    /// store call its plan makes is answered by what the store knows
    /// ([`Store::known`]), with no call; `None` when one is not.
    fn decide_known(
        &self,
        request: &Request<'_>,
        resolved: &[Resolved],
        each: bool,
        shed: Option<Box<Shed>>,
    ) -> Option<Result<Verdict, RequestError>> {
        let started_at = self.clock.now();
        let calls = self.calls(request, resolved, each, started_at);
        if let Some(shed) = shed {
            return Some(Ok(self.shed_verdict(
                request,
                calls.descriptors,
                started_at,
                shed,
            )));
        }
        if let Err(error) = self.supported([
            &calls.enforce,
            &calls.alone,
            &calls.shadow,
            &calls.shadow_alone,
        ]) {
            return Some(Err(error));
        }
        // A peek reads at cost 0, which no deny answers.
        if calls.peek {
            return None;
        }
        let known = |batch: &[(usize, &Applied)]| {
            let limits: Limits<'_> = batch.iter().map(|(_, a)| a.limit()).collect();
            self.store.known(&limits)
        };
        let each_known = |batch: &Batched<'_>| -> Option<SmallVec<[Outcome; 2]>> {
            batch
                .iter()
                .map(|one| known(std::slice::from_ref(one)))
                .collect()
        };
        // Every call is asked before any is recorded: a request is answered
        // whole from what is known, or not at all.
        let enforce = match calls.enforce.is_empty() {
            true => None,
            false => Some(known(&calls.enforce)?),
        };
        let alone = each_known(&calls.alone)?;
        let shadow = match calls.shadow.is_empty() {
            true => None,
            false => Some(known(&calls.shadow)?),
        };
        let shadow_alone = each_known(&calls.shadow_alone)?;

        let mut descriptors = calls.descriptors;
        // What is known is a deny, which takes no lease: the permit stays
        // empty.
        let mut permit = Permit::default();
        if let Some(outcome) = enforce {
            permit = self.record(
                &mut descriptors,
                &calls.enforce,
                Ok(outcome),
                Batch::Enforce,
            );
        }
        for (one, outcome) in calls.alone.iter().zip(alone) {
            let one = std::slice::from_ref(one);
            permit.extend(self.record(&mut descriptors, one, Ok(outcome), Batch::Enforce));
        }
        if let Some(outcome) = shadow {
            permit.extend(self.record(&mut descriptors, &calls.shadow, Ok(outcome), Batch::Shadow));
        }
        for (one, outcome) in calls.shadow_alone.iter().zip(shadow_alone) {
            let one = std::slice::from_ref(one);
            permit.extend(self.record(&mut descriptors, one, Ok(outcome), Batch::Shadow));
        }
        let verdict = Verdict {
            descriptors,
            started_at,
            permit,
            shed: None,
        };
        Some(Ok(self.observed(request, verdict)))
    }

    /// `verdict`, once the observer has seen it decided for `request`.
    fn observed(&self, request: &Request<'_>, verdict: Verdict) -> Verdict {
        self.observer.decided(&Decided {
            domain: Some(request.domain),
            descriptors: request.descriptors,
            verdict: &verdict,
            hits_addend: request.hits_addend,
            adhoc_key: None,
        });
        verdict
    }

    async fn enforce_adhoc(&self, adhoc: &AdHoc) -> Verdict {
        let started_at = self.clock.now();
        let key = adhoc.store_key();
        let limit = Limit::new(&key, adhoc.quota, adhoc.algorithm).with_cost(adhoc.cost);
        let mut descriptor = DescriptorVerdict {
            applied: Some((adhoc.quota, adhoc.algorithm)),
            ..DescriptorVerdict::new(State::Limited, None)
        };
        let mut permit = Permit::default();
        match self.timed_check(&[limit]).await {
            Ok(outcome) => {
                descriptor.decision = outcome.decisions.first().copied();
                permit = Permit::from(outcome.leases);
            }
            Err(error) => {
                self.observer.store_failed(&error, false);
                descriptor.state = State::StoreFailed(limit.failure);
                descriptor.decision = fail(&limit);
            }
        }
        let verdict = Verdict {
            descriptors: vec![descriptor],
            started_at,
            permit,
            shed: None,
        };
        self.observer.decided(&Decided {
            domain: None,
            descriptors: &[],
            verdict: &verdict,
            hits_addend: 0,
            adhoc_key: Some(&adhoc.key),
        });
        verdict
    }

    /// Checks the limits of `batch` (not empty) in one store call, writes
    /// the decisions into their descriptors, and returns the permits an
    /// admitting check took.
    async fn decide(
        &self,
        descriptors: &mut [DescriptorVerdict],
        batch: &[(usize, &Applied)],
        kind: Batch,
    ) -> Permit {
        let limits: Limits<'_> = batch.iter().map(|(_, a)| a.limit()).collect();
        let result = self.timed_check(&limits).await;
        self.record(descriptors, batch, result, kind)
    }

    /// Checks each limit of `batch` on its own ([`Store::check_each`]: one
    /// store call for all), so that each is charged whatever the others
    /// decide.
    async fn decide_each(
        &self,
        descriptors: &mut [DescriptorVerdict],
        batch: &[(usize, &Applied)],
        kind: Batch,
    ) -> Permit {
        let limits: Limits<'_> = batch.iter().map(|(_, a)| a.limit()).collect();
        let started = self.timer.now();
        let results = self.store.check_each(&limits).await;
        let elapsed = Duration::from_nanos(self.timer.now().saturating_sub(started));
        self.observer
            .store_call(elapsed, results.iter().all(Result::is_ok));
        let mut permit = Permit::default();
        for (one, result) in batch.iter().zip(results) {
            permit.extend(self.record(descriptors, std::slice::from_ref(one), result, kind));
        }
        permit
    }

    /// Writes what the store answered for `batch` into its descriptors, and
    /// returns the permits an admitting check took.
    fn record(
        &self,
        descriptors: &mut [DescriptorVerdict],
        batch: &[(usize, &Applied)],
        result: Result<Outcome, StoreError>,
        kind: Batch,
    ) -> Permit {
        match result {
            Ok(outcome) => {
                let denied = !outcome.allowed();
                for ((index, applied), mut decision) in batch.iter().zip(outcome.decisions) {
                    // All-or-nothing: a limit that would have admitted a
                    // denied request was not charged, so what it has left is
                    // what it had (as envoyproxy/ratelimit reports a count it
                    // did not increment).
                    if denied && decision.allowed() {
                        decision = decision.with_remaining(
                            decision
                                .remaining()
                                .saturating_add(applied.cost)
                                .min(decision.limit()),
                        );
                    }
                    descriptors[*index].decision = Some(decision);
                }
                Permit::from(outcome.leases)
            }
            Err(error) => {
                self.observer.store_failed(&error, kind == Batch::Shadow);
                // A shadow limit never denies, so a failure leaves it undecided.
                if kind == Batch::Enforce {
                    for (index, applied) in batch {
                        let descriptor = &mut descriptors[*index];
                        descriptor.state = State::StoreFailed(applied.failure);
                        descriptor.decision = fail(&applied.limit());
                    }
                }
                Permit::default()
            }
        }
    }

    /// Reads the limits of `batch` at cost 0: what each has left, for the
    /// answer of a request that a blocked rule denied.
    async fn peek(&self, descriptors: &mut [DescriptorVerdict], batch: &[(usize, &Applied)]) {
        let limits: Limits<'_> = batch.iter().map(|(_, a)| a.limit().with_cost(0)).collect();
        if let Ok(outcome) = self.timed_check(&limits).await {
            for ((index, _), decision) in batch.iter().zip(outcome.decisions) {
                descriptors[*index].decision = Some(decision);
                descriptors[*index].peeked = true;
            }
        }
    }

    /// Gives back exactly the leases `permit` holds (consuming it). A
    /// release the store cannot make is reported to the observer; those
    /// leases then lapse after their period. Returns how many leases were
    /// handed to the store (one already released or lapsed counts, and gives
    /// nothing back).
    pub async fn release(&self, permit: Permit) -> usize {
        if permit.is_empty() {
            return 0;
        }
        match self.store.release(&permit.leases).await {
            Ok(()) => permit.leases.len(),
            Err(error) => {
                self.observer.release_failed(&error);
                0
            }
        }
    }

    /// Forgets the state the limits of `request`'s descriptors keep, so each
    /// starts again with its whole quota (an operator's reset, through the
    /// admin API). Returns, per descriptor, the rule whose state was reset:
    /// `None` where no limit keeps state (no rule, an unlimited, blocked or
    /// replaced one). A fixed window of envoyproxy/ratelimit's is reset
    /// under either counting.
    ///
    /// # Errors
    ///
    /// A request the policy cannot take, or a store that did not reset.
    pub async fn reset(&self, request: &Request<'_>) -> Result<Vec<Option<Arc<Rule>>>, ResetError> {
        self.limits.check(request)?;
        let resolved = self.policy.guard().resolve(request)?;
        let mut limits: Vec<Limit<'_>> = Vec::new();
        let mut rules = Vec::with_capacity(resolved.len());
        for r in &resolved {
            let Resolved::Limit(applied) = r else {
                rules.push(None);
                continue;
            };
            limits.push(applied.limit());
            if applied.algorithm == Algorithm::FixedWindow && applied.rule.is_envoy() {
                limits.push(Limit {
                    algorithm: Algorithm::HitCounter,
                    ..applied.limit()
                });
            }
            rules.push(Some(Arc::clone(&applied.rule)));
        }
        if !limits.is_empty() {
            self.store.reset(&limits).await?;
        }
        Ok(rules)
    }

    /// Reads the state of the store key `key` under `quota` and `algorithm`
    /// without consuming anything (a check at cost 0).
    pub async fn read(
        &self,
        key: &str,
        quota: Quota,
        algorithm: Algorithm,
    ) -> Result<Option<Decision>, StoreError> {
        let limit = Limit::new(key, quota, algorithm).with_cost(0);
        let outcome = self.timed_check(&[limit]).await?;
        Ok(outcome.decisions.first().copied())
    }

    /// Whether the store reaches its state (e.g. Redis answers) and answers a
    /// check (of a probe key, at cost 0): for readiness probes.
    pub async fn ready(&self) -> bool {
        let quota = Quota::per_second(1).expect("1 per second is a valid quota");
        self.store.ready().await && self.read(PROBE_KEY, quota, Algorithm::Gcra).await.is_ok()
    }

    async fn timed_check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        let started = self.timer.now();
        let result = self.store.check(limits).await;
        let elapsed = Duration::from_nanos(self.timer.now().saturating_sub(started));
        self.observer.store_call(elapsed, result.is_ok());
        result
    }
}

/// The decision of a rule that refuses everything: nothing left until the
/// current `unit` window (aligned to the epoch) ends, and no retry helps.
pub(crate) fn blocked(unit: Unit, now: Nanos) -> Decision {
    let unit_ns = unit.duration().into_nanos();
    Decision::deny(0, 0, Duration::from_nanos(unit_ns - now % unit_ns), None)
}

/// What a limit's failure policy decides when its store returns an error
/// (a store with a fallback of its own, such as the Redis stack, does not
/// err for an unreachable backend). Only a refusal is kept: `fail_open`
/// counted nothing and `local` has no local state here, so they leave the
/// limit undecided (admitted, reported by no header). No retry time is
/// known.
fn fail(limit: &Limit<'_>) -> Option<Decision> {
    limit.failure.decide(limit, None).filter(|d| !d.allowed())
}
