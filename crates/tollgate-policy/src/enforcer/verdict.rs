//! What the enforcer answers: each descriptor's [`DescriptorVerdict`] and
//! the request's [`Verdict`], which every door translates to its wire.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, Decision, Nanos, Quota, Tier, Utilization};

use crate::{FailurePolicy, Rule, Unit};

use super::permit::Permit;

/// What happened to one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
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
    /// Checked against the store (or blocked), reported, never denied.
    Shadow,
    /// The store failed; the rule's failure policy decided.
    StoreFailed(FailurePolicy),
}

impl State {
    /// The name the native API and the metrics use.
    pub fn name(self) -> &'static str {
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

/// The answer for one descriptor.
#[derive(Debug, Clone)]
pub struct DescriptorVerdict {
    /// What happened.
    pub state: State,
    /// The rule that matched, if any (none for ad-hoc limits).
    pub rule: Option<Arc<Rule>>,
    /// The limit as Envoy names it, when a rule's limit applies.
    pub envoy_limit: Option<(u64, Unit)>,
    /// The quota and algorithm checked (after tiers and priority reserves).
    pub applied: Option<(Quota, Algorithm)>,
    /// The store's decision (or a synthesized one for blocked and fail-closed
    /// descriptors). `None` when nothing was checked.
    pub decision: Option<Decision>,
    /// The decision is a read that charged nothing: a blocked rule had denied
    /// the request, all-or-nothing, before the store was asked.
    pub peeked: bool,
    /// A quota-mode limit: its deny denies the request only when every
    /// quota-mode limit of the request denies (see [`Verdict::allowed`]).
    pub quota: bool,
    /// A shadow limit only because the enforcer is in global shadow mode
    /// ([`Enforcer::with_shadow_mode`](crate::Enforcer::with_shadow_mode)): envoyproxy/ratelimit then keeps the
    /// descriptor's own over-limit code and lets only the request through.
    pub global_shadow: bool,
}

impl DescriptorVerdict {
    pub(super) fn new(state: State, rule: Option<&Arc<Rule>>) -> Self {
        Self {
            state,
            rule: rule.cloned(),
            envoy_limit: None,
            applied: None,
            decision: None,
            peeked: false,
            quota: false,
            global_shadow: false,
        }
    }

    /// Whether this descriptor's answer can deny the request.
    pub fn enforcing(&self) -> bool {
        matches!(
            self.state,
            State::Limited | State::Blocked | State::StoreFailed(_)
        )
    }

    /// Whether this descriptor lets the request through (shadow limits always do).
    pub fn allowed(&self) -> bool {
        !self.enforcing() || self.decision.is_none_or(|d| d.allowed())
    }

    /// Whether a shadow limit would have denied the request.
    pub fn shadow_denied(&self) -> bool {
        self.state == State::Shadow && self.decision.is_some_and(|d| !d.allowed())
    }

    /// The `result` label of the decision metrics: `ok`, `over_limit`,
    /// `shadow_over_limit`, or the state's name when nothing was enforced.
    pub fn result(&self) -> &'static str {
        match self.state {
            State::Shadow if self.shadow_denied() => "shadow_over_limit",
            State::Limited | State::Blocked | State::Shadow if self.allowed() => "ok",
            State::Limited | State::Blocked => "over_limit",
            State::StoreFailed(_) if !self.allowed() => "over_limit",
            other => other.name(),
        }
    }
}

/// The answer for one request.
#[derive(Debug)]
#[must_use = "an admitted request's permit must be released (or dropped into a guard)"]
pub struct Verdict {
    /// One per descriptor, in request order.
    pub descriptors: Vec<DescriptorVerdict>,
    /// When the check started, in nanoseconds since the Unix epoch (read before
    /// the store, so `started_at + reset_after` never passes the true reset).
    pub started_at: Nanos,
    /// The concurrency permits the request took; give them back with
    /// [`Enforcer::release`](crate::Enforcer::release) when it ends. Empty unless a concurrency limit
    /// admitted it.
    pub permit: Permit,
    /// The request was shed: its domain's service reports a utilization
    /// past its tier's threshold (decided before any limit was checked), or
    /// its domain's shared budget is past its tier's share (decided by the
    /// store, all-or-nothing). Nothing was charged. Boxed: most verdicts
    /// have none, and a verdict lives in every door's check future, which
    /// must stay small.
    pub shed: Option<Box<Shed>>,
}

/// Why a request was shed, for its answer (`503` with `Retry-After` through
/// the HTTP API, `OVER_LIMIT` through Envoy's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    /// The request's tier.
    pub tier: Tier,
    /// The pressure that shed it.
    pub pressure: Pressure,
    /// When to try again: for a report, the domain's `shed.retry_after`;
    /// for the budget, when the store says the tier's share has room again.
    pub retry_after: Duration,
}

/// The pressure a request was shed on: whichever passed its tier's
/// threshold first (a request is shed when the larger of the two does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// The utilization its domain's service reported (or the check carried).
    Reported(Utilization),
    /// Its domain's shared budget (a rule with `shed: true`): charging the
    /// request would take the budget's spent fraction past this share (the
    /// tier's threshold, in percent). The store answers only that, not by
    /// how much.
    Budget(u32),
}

impl Verdict {
    /// Whether the request may pass: no rate limit denies it, and if it has
    /// quota-mode limits, at least one of them admits it.
    pub fn allowed(&self) -> bool {
        if self.shed.is_some() {
            return false;
        }
        let (mut quotas, mut quotas_over) = (0, 0);
        for d in &self.descriptors {
            if d.quota && d.enforcing() {
                quotas += 1;
                quotas_over += usize::from(!d.allowed());
            } else if !d.allowed() {
                return false;
            }
        }
        quotas == 0 || quotas_over < quotas
    }

    /// The descriptor that headers report: on a deny, the denying one that asks
    /// the client to wait longest; on an allow, the one with the fewest units
    /// left. Only enforcing descriptors with a decision take part.
    pub fn most_restrictive(&self) -> Option<&DescriptorVerdict> {
        let decided = self
            .descriptors
            .iter()
            .filter(|d| d.enforcing())
            .filter_map(|d| Some((d, d.decision.as_ref()?)));
        tollgate_core::most_restrictive(decided, |(_, decision)| decision).map(|(d, _)| d)
    }

    /// How long to hold an admitted request before forwarding it (a shaping
    /// rule's delay); zero for a denied one.
    pub fn delay(&self) -> Duration {
        if !self.allowed() {
            return Duration::ZERO;
        }
        self.descriptors
            .iter()
            .filter(|d| d.state == State::Limited)
            .filter_map(|d| d.decision.map(|decision| decision.delay()))
            .max()
            .unwrap_or_default()
    }
}
