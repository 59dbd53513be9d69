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

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use smallvec::SmallVec;
use tollgate_core::{
    Algorithm, Clock, Decision, IntoNanos, Lease, LeaseId, Limit, MonotonicClock, Nanos, Outcome,
    Quota, Store, StoreError, SystemClock,
};

use crate::{
    Applied, Descriptor, FailurePolicy, KillSwitch, Policy, PolicyHandle, Request, RequestError,
    ResetError, Resolved, Rule, Unit, Unsupported,
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

/// Ad-hoc keys live under this prefix. Policy storage keys start with a
/// length and a colon (`7:default|…`), so the two namespaces cannot meet.
const ADHOC_PREFIX: &str = "adhoc:";

/// The key readiness probes read (at cost 0, so it stores nothing).
const PROBE_KEY: &str = "probe:readyz";

/// What to check: a request against the policy, or a limit the caller names.
#[derive(Debug, Clone, Copy)]
pub enum Check<'a> {
    /// Descriptors resolved against the policy in force.
    Policy(Request<'a>),
    /// A limit given in the request itself rather than by a policy.
    AdHoc(&'a AdHoc),
}

/// A limit given in the request itself rather than by a policy (Tollgate's
/// `POST /v1/check` with `key`). Its key is namespaced apart from every
/// policy's and by its own quota and algorithm, and it has the default
/// failure policy, `local`.
#[derive(Debug, Clone)]
pub struct AdHoc {
    /// The caller's key, before namespacing.
    pub key: String,
    /// How much may pass.
    pub quota: Quota,
    /// How it is counted.
    pub algorithm: Algorithm,
    /// What this request costs; 0 only reads.
    pub cost: u64,
}

impl AdHoc {
    /// The store key of this ad-hoc limit:
    /// `adhoc:<algorithm>:<limit>:<period ns>:<burst>:<key>` (a shaping
    /// limit's `delay_after` follows its algorithm's name). The quota is part
    /// of the key, so naming the same key with another quota spends another
    /// budget: a client cannot lock a key's owner out by checking it with a
    /// stricter or longer quota.
    pub fn store_key(&self) -> String {
        // Not `format!`: this runs on every ad-hoc check.
        let mut numbers = itoa::Buffer::new();
        let mut key = String::with_capacity(ADHOC_PREFIX.len() + 64 + self.key.len());
        key.push_str(ADHOC_PREFIX);
        key.push_str(self.algorithm.name());
        if let Algorithm::LeakyBucketShaping { delay_after } = self.algorithm {
            key.push('+');
            key.push_str(numbers.format(delay_after));
        }
        for n in [
            self.quota.limit(),
            self.quota.period_ns(),
            self.quota.burst(),
        ] {
            key.push(':');
            key.push_str(numbers.format(n));
        }
        key.push(':');
        key.push_str(&self.key);
        key
    }
}

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
    /// ([`Enforcer::with_shadow_mode`]): envoyproxy/ratelimit then keeps the
    /// descriptor's own over-limit code and lets only the request through.
    pub global_shadow: bool,
}

impl DescriptorVerdict {
    fn new(state: State, rule: Option<&Arc<Rule>>) -> Self {
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
    /// [`Enforcer::release`] when it ends. Empty unless a concurrency limit
    /// admitted it.
    pub permit: Permit,
}

impl Verdict {
    /// Whether the request may pass: no rate limit denies it, and if it has
    /// quota-mode limits, at least one of them admits it.
    pub fn allowed(&self) -> bool {
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

/// The concurrency leases one admitted request holds: a value, given back by
/// handing it to [`Enforcer::release`] (which consumes it). It names the
/// exact leases the store granted, so a release gives back those and no
/// other holder's, and a reload of the policy in between changes nothing. A
/// permit never given back lapses after its rule's period.
///
/// Over HTTP it travels as an opaque token ([`fmt::Display`] and
/// [`FromStr`]) that `POST /v1/release` takes back, on any instance that
/// shares the store.
#[derive(Debug, Default, PartialEq, Eq)]
#[must_use = "a permit holds concurrency until it is released"]
pub struct Permit {
    leases: Vec<Lease>,
}

impl Permit {
    /// Whether the permit holds nothing (no concurrency limit admitted).
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The leases it holds.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    fn extend(&mut self, other: Permit) {
        self.leases.extend(other.leases);
    }
}

impl From<Vec<Lease>> for Permit {
    fn from(leases: Vec<Lease>) -> Self {
        Self { leases }
    }
}

/// A token that is not one [`Permit`]'s text; says which part is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid lease token: bad {0}")]
pub struct InvalidToken(&'static str);

/// `cost:hex(key):id` per lease, joined by `.`: the cost in decimal, the key's
/// bytes in lowercase hex, the store's lease id (letters, digits, `-`, `_`).
/// Only those characters, `:` and `.`, so it needs no escaping in JSON, a
/// header or a URL.
impl fmt::Display for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, lease) in self.leases.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{}:", lease.cost)?;
            for byte in lease.key.bytes() {
                write!(f, "{byte:02x}")?;
            }
            write!(f, ":{}", lease.id)?;
        }
        Ok(())
    }
}

/// Parses exactly what [`fmt::Display`] writes: one spelling per permit
/// (no sign, leading zero or upper-case hex), so a token is either a
/// permit's or refused.
impl FromStr for Permit {
    type Err = InvalidToken;

    fn from_str(token: &str) -> Result<Self, Self::Err> {
        if token.is_empty() {
            return Ok(Permit::default());
        }
        let leases = token
            .split('.')
            .map(|part| {
                let mut fields = part.split(':');
                let (Some(cost), Some(hex), Some(id), None) =
                    (fields.next(), fields.next(), fields.next(), fields.next())
                else {
                    return Err(InvalidToken("lease (want cost:key:id)"));
                };
                let cost = cost
                    .parse::<u64>()
                    .ok()
                    .filter(|&c| c > 0 && c.to_string() == cost)
                    .ok_or(InvalidToken("cost"))?;
                let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
                if hex.is_empty() || hex.len() % 2 != 0 || !hex.bytes().all(lower_hex) {
                    return Err(InvalidToken("key"));
                }
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| InvalidToken("key"))?;
                let key = String::from_utf8(bytes).map_err(|_| InvalidToken("key"))?;
                let id = id
                    .parse::<LeaseId>()
                    .map_err(|_| InvalidToken("lease id"))?;
                Ok(Lease { key, cost, id })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Permit { leases })
    }
}

/// A policy request resolved once ([`Enforcer::prepare`]), to be decided
/// many times ([`Enforcer::enforce_prepared`]). It keeps the policy it was
/// resolved under, so that a reload in between is noticed (and that policy
/// is not freed while the request is kept).
#[derive(Debug)]
pub struct Prepared {
    domain: String,
    descriptors: Arc<[Descriptor]>,
    hits_addend: u64,
    policy: Arc<Policy>,
    resolved: Vec<Resolved>,
    each: bool,
}

impl Prepared {
    /// The request it stands for.
    pub fn request(&self) -> Request<'_> {
        Request {
            domain: &self.domain,
            descriptors: &self.descriptors,
            hits_addend: self.hits_addend,
        }
    }
}

/// One decision, as observers see it.
#[derive(Debug, Clone, Copy)]
pub struct Decided<'a> {
    /// The request's domain (`None` for an ad-hoc check).
    pub domain: Option<&'a str>,
    /// The request's descriptors, in the order of the verdict's (empty for an
    /// ad-hoc check).
    pub descriptors: &'a [Descriptor],
    /// What was decided.
    pub verdict: &'a Verdict,
    /// The request's `hits_addend` (0 for an ad-hoc check); see
    /// [`Decided::cost`].
    pub hits_addend: u64,
    /// An ad-hoc check's key, as the caller named it (before namespacing);
    /// `None` for a policy request.
    pub adhoc_key: Option<&'a str>,
}

impl Decided<'_> {
    /// What the descriptor at `index` cost: its own `hits_addend`, else the
    /// request's (Envoy reads 0 as 1).
    pub fn cost(&self, index: usize) -> u64 {
        self.descriptors
            .get(index)
            .and_then(|d| d.hits_addend)
            .unwrap_or(self.hits_addend.max(1))
    }
}

/// Watches every decision the enforcer makes, whatever the door: metrics,
/// logs, live pages. Called on the request's task, after the decision and
/// before the door answers, so it must be quick.
pub trait Observer: Send + Sync + 'static {
    /// One request was decided.
    fn decided(&self, decided: &Decided<'_>);

    /// The store could not check a request's limits (enforcing ones, or only
    /// `shadow` ones); the failure policies decided.
    fn store_failed(&self, error: &StoreError, shadow: bool) {
        let _ = (error, shadow);
    }

    /// A store check took `elapsed` (`ok`: it answered).
    fn store_call(&self, elapsed: Duration, ok: bool) {
        let _ = (elapsed, ok);
    }

    /// A permit could not be given back; it lapses after its period.
    fn release_failed(&self, error: &StoreError) {
        let _ = error;
    }
}

/// An observer that watches nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl Observer for NoObserver {
    fn decided(&self, _: &Decided<'_>) {}
}

/// Two observers watching the same decisions, `A` first: how a service
/// attaches both its metrics and a live view to its one enforcer.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn decided(&self, decided: &Decided<'_>) {
        self.0.decided(decided);
        self.1.decided(decided);
    }

    fn store_failed(&self, error: &StoreError, shadow: bool) {
        self.0.store_failed(error, shadow);
        self.1.store_failed(error, shadow);
    }

    fn store_call(&self, elapsed: Duration, ok: bool) {
        self.0.store_call(elapsed, ok);
        self.1.store_call(elapsed, ok);
    }

    fn release_failed(&self, error: &StoreError) {
        self.0.release_failed(error);
        self.1.release_failed(error);
    }
}

/// How large a request the enforcer takes. A request is resolved and checked
/// in one piece, so without a bound one client's request of 100,000
/// descriptors would hold a worker (and the store) while every other check
/// waits; and a string's bytes end up in store keys, so without a bound a
/// client's 1 MiB value became a 1 MiB Redis key (issue 39). A request past
/// these is refused as a bad request, at every door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Descriptors per request (default 128; Envoy's rate limit actions make
    /// a handful).
    pub descriptors: usize,
    /// Entries per descriptor (default 32).
    pub entries: usize,
    /// Bytes of the domain (default 256: a domain is a name an operator
    /// chose).
    pub domain_bytes: usize,
    /// Bytes of an entry's key (default 256: a key names what the value is,
    /// e.g. `remote_address`).
    pub key_bytes: usize,
    /// Bytes of an entry's value, and of an ad-hoc check's key (default
    /// 4,096: a value is often a client's header or path, which proxies
    /// commonly bound at 4–8 KiB a line).
    pub value_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            descriptors: 128,
            entries: 32,
            domain_bytes: 256,
            key_bytes: 256,
            value_bytes: 4096,
        }
    }
}

impl RequestLimits {
    fn check(&self, request: &Request<'_>) -> Result<(), RequestError> {
        let too_long = |what, len, max| RequestError::TooLong { what, len, max };
        if request.domain.len() > self.domain_bytes {
            return Err(too_long(
                "the domain".into(),
                request.domain.len(),
                self.domain_bytes,
            ));
        }
        let count = request.descriptors.len();
        if count > self.descriptors {
            return Err(RequestError::TooManyDescriptors {
                count,
                max: self.descriptors,
            });
        }
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let count = descriptor.entries.len();
            if count > self.entries {
                return Err(RequestError::TooManyEntries {
                    index,
                    count,
                    max: self.entries,
                });
            }
            for entry in &descriptor.entries {
                if entry.key.len() > self.key_bytes {
                    let what = format!("descriptor {index}: an entry's key");
                    return Err(too_long(what, entry.key.len(), self.key_bytes));
                }
                if entry.value.len() > self.value_bytes {
                    let what = format!("descriptor {index}: the value of {:?}", entry.key);
                    return Err(too_long(what, entry.value.len(), self.value_bytes));
                }
            }
        }
        Ok(())
    }

    /// An ad-hoc check's key is held to the value's bound.
    fn check_adhoc(&self, adhoc: &AdHoc) -> Result<(), RequestError> {
        if adhoc.key.len() > self.value_bytes {
            return Err(RequestError::TooLong {
                what: "the key".into(),
                len: adhoc.key.len(),
                max: self.value_bytes,
            });
        }
        Ok(())
    }
}

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

    /// The same enforcer, reading `started_at` (epoch nanoseconds) from `clock`.
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
    pub async fn enforce(&self, check: Check<'_>) -> Result<Verdict, RequestError> {
        match check {
            Check::Policy(request) => self.enforce_policy(&request).await,
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
            self.decide_resolved(&request, &prepared.resolved, prepared.each)
                .await
        } else {
            self.enforce_policy(&request).await
        }
    }

    async fn enforce_policy(&self, request: &Request<'_>) -> Result<Verdict, RequestError> {
        let policy = self.policy.guard();
        let (resolved, each) = self.resolve(&policy, request)?;
        self.decide_resolved(request, &resolved, each).await
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

    /// Decides `request`, whose limits are `resolved` ([`Enforcer::resolve`]).
    async fn decide_resolved(
        &self,
        request: &Request<'_>,
        resolved: &[Resolved],
        each: bool,
    ) -> Result<Verdict, RequestError> {
        let started_at = self.clock.now();
        let domain = request.domain;
        let quota_mode = |rule: &Rule| self.quota_mode || rule.quota_mode();
        let mut enforce = Batched::new();
        let mut alone = Batched::new();
        let mut shadow = Batched::new();
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
                    let state = if rule.shadow() || self.shadow_mode {
                        State::Shadow
                    } else {
                        State::Blocked
                    };
                    DescriptorVerdict {
                        envoy_limit: Some((0, *unit)),
                        decision: Some(blocked(*unit, started_at)),
                        quota: quota_mode(rule),
                        global_shadow: self.shadow_mode && !rule.shadow(),
                        ..DescriptorVerdict::new(state, Some(rule))
                    }
                }
                Resolved::Limit(applied) => {
                    let quota = quota_mode(&applied.rule);
                    let state = if applied.shadow || self.shadow_mode {
                        shadow.push((index, applied));
                        State::Shadow
                    } else {
                        if quota || each {
                            alone.push((index, applied));
                        } else {
                            enforce.push((index, applied));
                        }
                        State::Limited
                    };
                    DescriptorVerdict {
                        envoy_limit: Some(applied.envoy_limit),
                        applied: Some((applied.quota, applied.algorithm)),
                        quota,
                        global_shadow: self.shadow_mode && !applied.shadow,
                        ..DescriptorVerdict::new(state, Some(&applied.rule))
                    }
                }
            };
            descriptors.push(verdict);
        }

        // Config rules were checked when their config loaded (see
        // `Enforcer::unsupported`); a request's own override was not.
        for (index, applied) in enforce.iter().chain(&alone).chain(&shadow) {
            self.store
                .supports(applied.algorithm, &applied.quota)
                .map_err(|e| RequestError::UnsupportedLimit {
                    descriptor: Some(*index),
                    reason: reason(e),
                })?;
        }

        // A blocked rule denies without a store call, so the all-or-nothing
        // limits beside it are not charged.
        let blocked = descriptors
            .iter()
            .any(|d| d.state == State::Blocked && !d.quota && !d.allowed());
        // Each batch's future is made only when it has limits: most
        // requests have one batch.
        let mut permit = Permit::default();
        if blocked {
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
            permit.extend(if each {
                self.decide_each(&mut descriptors, &shadow, Batch::Shadow)
                    .await
            } else {
                self.decide(&mut descriptors, &shadow, Batch::Shadow).await
            });
        }
        let mut verdict = Verdict {
            descriptors,
            started_at,
            permit,
        };
        // Limits checked on their own may have admitted a request that
        // another denied: it holds no concurrency then.
        if !verdict.allowed() && !verdict.permit.is_empty() {
            let permit = std::mem::take(&mut verdict.permit);
            self.release(permit).await;
        }
        self.observer.decided(&Decided {
            domain: Some(domain),
            descriptors: request.descriptors,
            verdict: &verdict,
            hits_addend: request.hits_addend,
            adhoc_key: None,
        });
        Ok(verdict)
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

    /// Checks each limit of `batch` in a store call of its own (concurrently),
    /// so that each is charged whatever the others decide.
    async fn decide_each(
        &self,
        descriptors: &mut [DescriptorVerdict],
        batch: &[(usize, &Applied)],
        kind: Batch,
    ) -> Permit {
        let limits: Limits<'_> = batch.iter().map(|(_, a)| a.limit()).collect();
        let results = join_all(
            limits
                .iter()
                .map(|limit| self.timed_check(std::slice::from_ref(limit))),
        )
        .await;
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
        if batch.is_empty() {
            return;
        }
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
