//! A [`Store`] over another that answers when the other cannot: a timeout,
//! a circuit breaker, and each limit's [`FailurePolicy`] with a local
//! in-memory store behind it.
//!
//! A check goes to the inner store while the breaker is closed. If the inner
//! store errs (anything but [`StoreError::Invalid`] and
//! [`StoreError::Unsupported`], which are the caller's to see) or does not
//! answer within the timeout, the check is decided by its limits' failure
//! policies, all-or-nothing as any check: a `fail_closed` limit refuses the
//! request before the local store is touched (the `local` limits beside it are
//! only peeked at, at cost 0), otherwise the `local` limits are checked
//! together on the local store, and `fail_open` limits admit without counting.
//!
//! After `breaker_failures` consecutive failures the breaker opens and checks
//! stop calling the inner store. A task owned by the wrapper then probes it in
//! the background ([`Store::ready`]) every `breaker_cool_down`, and closes the
//! breaker when it answers: decisions return to the inner store within one
//! cool-down plus one probe after it is back, with no request traffic needed,
//! and no request ever carries a probe, so a cancelled request cannot leave the
//! breaker half-open.
//!
//! **A breaker per part.** An inner store whose parts fail alone
//! ([`Store::domain`]: a Redis Cluster's slot ranges) gets a breaker per
//! part: a check goes to the inner store only while the breaker of every part
//! its limits are on is closed, and its failures count against those parts,
//! so a failing part sends only its own keys to the failure policies. Each
//! open part is probed on its own ([`Store::domain_ready`]).
//!
//! **A local decision starts where the inner store left off.** While the inner
//! store answers, the wrapper keeps what it last said of each `local` limit's
//! key (the units remaining, and until when that holds: the decision's
//! reset), for up to 65,536 keys. The first time a key is decided
//! locally after that, its local state is charged down to
//! `share × remaining` (`share` is [`FallbackConfig::local_share`]), and a
//! key with no report still in force starts at `share × capacity`; units
//! of the key the inner store holds leased ([`LeaseStore::leased`]: a
//! hybrid instance's lease, which its `remaining` counts) are this
//! instance's whole, not shared. So a
//! timeout on a busy but healthy store (a blip) cannot hand out a fresh full
//! budget. And what was admitted locally is **paid back**: before the inner
//! store next decides a check of the key, the wrapper charges it with those
//! units (at most what it says is left), so that it counts every admitted
//! request and one episode's overshoot does not carry into the next. One
//! instance stays within the limit, and `n` instances sharing a store
//! overshoot by at most `(n × share − 1) × remaining` per episode instead of
//! `n ×` the limit. Concurrency is charged the same way: the units charged
//! (locally, or as a payment) are a lease that lapses after the quota's
//! period, and the permits this instance holds on the inner store count in
//! the remaining it reported.
//!
//! Concurrency leases go back where they were taken: each lease id the
//! wrapper hands out carries a tag naming the store that granted it (`i`, the
//! inner store; `l`, the local one), and a release sends each lease to its
//! store with the tag taken off.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::task::JoinHandle;
use tollgate_core::IntoNanos;
use tollgate_core::{
    Algorithm, Clock, Decision, FailurePolicy, Holder, Lease, LeaseStore, Leased, Limit, Outcome,
    Quota, Stamped, Store, StoreError,
};

use parking_lot::Mutex;

use crate::breaker::{BreakerState, Breakers, Part};
use crate::decision::{outcomes, unanswered};
use crate::{FastClock, MemoryConfig, MemoryStore};

/// The tag of the leases the inner store granted.
const INNER: &str = "i";
/// The tag of the leases the local store granted.
const LOCAL: &str = "l";

/// `leases` with their ids behind `tag`. A lease whose id would grow too
/// long is left out: never released, it lapses after its period.
fn tag(leases: Vec<Lease>, tag: &str) -> Vec<Lease> {
    leases
        .into_iter()
        .filter_map(|lease| {
            let id = lease.id.tagged(tag)?;
            Some(Lease { id, ..lease })
        })
        .collect()
}

/// The leases among `leases` whose ids are behind `tag`, with it taken off.
fn untag(leases: &[Lease], tag: &str) -> Vec<Lease> {
    leases
        .iter()
        .filter_map(|lease| {
            Some(Lease {
                id: lease.id.untagged(tag)?,
                key: lease.key.clone(),
                cost: lease.cost,
            })
        })
        .collect()
}

/// How the fallback decides when to stop asking its inner store.
#[derive(Debug, Clone)]
pub struct FallbackConfig {
    /// How long a call to the inner store may take before the check is
    /// decided by the failure policies. Default 10 ms. A store with a timeout
    /// of its own (the Redis store) is best given a longer one here, as a
    /// bound on the whole call rather than on each round trip.
    pub timeout: Duration,
    /// Consecutive failures (errors or timeouts) that open the breaker.
    /// Default 5.
    pub breaker_failures: u32,
    /// How long the open breaker waits before each probe. Default 1 s.
    pub breaker_cool_down: Duration,
    /// The local store that limits with [`FailurePolicy::Local`] fall back to.
    pub local: MemoryConfig,
    /// The part of what the inner store last reported remaining (or of the
    /// capacity, for a key with no report in force) that one instance may
    /// spend locally (above 0, at most 1). Default 1: exact for one
    /// instance; `1/n` keeps `n` instances within the limit, at the price of
    /// denying sooner when only some of them fall back.
    pub local_share: f64,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(10),
            breaker_failures: 5,
            breaker_cool_down: Duration::from_secs(1),
            local: MemoryConfig {
                max_keys: 100_000,
                ..MemoryConfig::default()
            },
            local_share: 1.0,
        }
    }
}

/// The fallback's counters (monotonic since it was made) and breaker state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FallbackStats {
    /// Checks the inner store decided.
    pub checks: u64,
    /// Checks decided by their limits' failure policies (the inner store
    /// failed, timed out, or the breaker was open).
    pub fallbacks: u64,
    /// Limits decided by [`FailurePolicy::FailOpen`] in those checks.
    pub fallback_fail_open: u64,
    /// Limits decided by [`FailurePolicy::FailClosed`] in those checks.
    pub fallback_fail_closed: u64,
    /// Limits decided by [`FailurePolicy::Local`] in those checks.
    pub fallback_local: u64,
    /// Calls to the inner store that erred.
    pub errors: u64,
    /// Calls to the inner store that timed out (its own timeout or this one).
    pub timeouts: u64,
    /// Times the breaker opened.
    pub breaker_opens: u64,
    /// Probes the prober sent.
    pub probes: u64,
    /// The breaker's state now.
    pub breaker: BreakerState,
}

#[derive(Debug, Default)]
struct Counters {
    checks: AtomicU64,
    fallbacks: AtomicU64,
    /// Indexed by [`policy_index`].
    policies: [AtomicU64; 3],
    errors: AtomicU64,
    timeouts: AtomicU64,
    probes: AtomicU64,
}

fn policy_index(policy: FailurePolicy) -> usize {
    match policy {
        FailurePolicy::FailOpen => 0,
        FailurePolicy::FailClosed => 1,
        FailurePolicy::Local => 2,
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// How many times a payment is cut down to what the inner store says is
/// left before the rest is forgiven.
const PAYMENT_TRIES: usize = 3;

/// Keys the wrapper remembers the inner store's last report of.
const MAX_REPORTS: usize = 65_536;

/// What the inner store last said of one key.
#[derive(Debug, Clone, Copy)]
struct Report {
    remaining: u64,
    /// Until when (on the local clock) `remaining` holds at most: the
    /// decision's reset.
    until: u64,
    /// Whether the local state was charged down to it since.
    seeded: bool,
    /// Units admitted locally since, which the inner store has not counted.
    debt: u64,
}

struct Shared<S> {
    inner: S,
    config: FallbackConfig,
    local: MemoryStore<Arc<dyn Clock>>,
    clock: Arc<dyn Clock>,
    reports: Mutex<HashMap<Box<str>, Report>>,
    breakers: Breakers,
    counters: Counters,
}

/// A [`Store`] over `S` with a timeout, a circuit breaker probing in the
/// background, and per-limit failure policies; see the module documentation.
pub struct Fallback<S> {
    shared: Arc<Shared<S>>,
    prober: JoinHandle<()>,
}

impl<S> std::fmt::Debug for Fallback<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("config", &self.shared.config)
            .field("breaker", &self.shared.breakers.state())
            .finish_non_exhaustive()
    }
}

impl<S> Drop for Fallback<S> {
    fn drop(&mut self) {
        self.prober.abort();
    }
}

impl<S: LeaseStore + 'static> Fallback<S> {
    /// Wraps `inner`; the local store reads a monotonic clock. Starts the
    /// prober on the current tokio runtime (it stops when this is dropped).
    pub fn new(inner: S, config: FallbackConfig) -> Self {
        Self::with_clock(inner, config, Arc::new(FastClock::new()))
    }

    /// [`Fallback::new`] with the local store on `clock` (for tests and
    /// simulations, the clock the inner store was given).
    pub fn with_clock(inner: S, config: FallbackConfig, clock: Arc<dyn Clock>) -> Self {
        let shared = Arc::new(Shared {
            local: MemoryStore::with_clock(config.local.clone(), Arc::clone(&clock)),
            clock,
            reports: Mutex::new(HashMap::new()),
            breakers: Breakers::new(config.breaker_failures),
            counters: Counters::default(),
            inner,
            config,
        });
        let prober = tokio::spawn(probe(Arc::clone(&shared)));
        Self { shared, prober }
    }
}

/// Waits for a breaker to open, then every cool-down probes each part of the
/// inner store whose breaker is open (all at once), closing the breaker of
/// each that answers, until none is open.
async fn probe<S: LeaseStore + 'static>(shared: Arc<Shared<S>>) {
    let cool_down = shared.config.breaker_cool_down;
    // A readiness probe may take longer than one check (the Redis store's
    // waits at least 250 ms), but never longer than a cool-down.
    let patience = cool_down.max(shared.config.timeout);
    loop {
        shared.breakers.opened.notified().await;
        loop {
            tokio::time::sleep(cool_down).await;
            let open = shared.breakers.not_closed();
            if open.is_empty() {
                break;
            }
            let mut probes = tokio::task::JoinSet::new();
            for (domain, breaker) in open {
                breaker.probing();
                bump(&shared.counters.probes);
                let shared = Arc::clone(&shared);
                probes.spawn(async move {
                    let ready = async {
                        match &domain {
                            Some(name) => shared.inner.domain_ready(name).await,
                            None => shared.inner.ready().await,
                        }
                    };
                    let answered = matches!(tokio::time::timeout(patience, ready).await, Ok(true));
                    breaker.probed(answered);
                    if answered {
                        tracing::info!(
                            part = domain.as_deref().unwrap_or("all"),
                            "the inner store answers again: circuit breaker closed"
                        );
                    }
                });
            }
            while probes.join_next().await.is_some() {}
        }
    }
}

impl<S: LeaseStore + 'static> Fallback<S> {
    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.shared.inner
    }

    /// The counters and the breaker's state.
    pub fn stats(&self) -> FallbackStats {
        let c = &self.shared.counters;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FallbackStats {
            checks: get(&c.checks),
            fallbacks: get(&c.fallbacks),
            fallback_fail_open: get(&c.policies[0]),
            fallback_fail_closed: get(&c.policies[1]),
            fallback_local: get(&c.policies[2]),
            errors: get(&c.errors),
            timeouts: get(&c.timeouts),
            breaker_opens: self.shared.breakers.opens(),
            probes: get(&c.probes),
            breaker: self.shared.breakers.state(),
        }
    }

    /// The breaker of each part of the inner store that fails alone
    /// ([`Store::domain`]: a Redis Cluster's slot ranges, `<first>-<last>`),
    /// by name; empty for a store that fails as a whole, whose one breaker
    /// is [`FallbackStats::breaker`]. A part is listed once a check has
    /// reached it.
    pub fn parts(&self) -> Vec<(Arc<str>, BreakerState)> {
        self.shared.breakers.parts()
    }

    /// The breakers of the parts of the inner store holding `keys` (each
    /// once; the whole store's when it has no parts).
    fn breakers<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> SmallVec<[Part; 2]> {
        let shared = &self.shared;
        let mut parts: SmallVec<[Part; 2]> = SmallVec::new();
        for key in keys {
            let domain = shared.inner.domain(key);
            if !parts.iter().any(|(d, _)| *d == domain) {
                parts.push(shared.breakers.of(domain));
            }
        }
        if parts.is_empty() {
            parts.push(shared.breakers.of(None));
        }
        parts
    }

    /// Records a failed call to these parts; the caller then decides by the
    /// failure policies. A call that spans several parts cannot tell which
    /// one failed, and counts against each: a healthy part's next answer
    /// resets its count.
    fn failed(&self, parts: &[Part], error: Option<&StoreError>) {
        let c = &self.shared.counters;
        match error {
            None | Some(StoreError::Timeout(_)) => bump(&c.timeouts),
            Some(_) => bump(&c.errors),
        }
        for part in parts {
            if !self.shared.breakers.failure(part) {
                continue;
            }
            let name = part.0.as_deref().unwrap_or("all");
            match error {
                Some(e) => {
                    tracing::warn!(part = name, error = %e, "store failing: circuit breaker open")
                }
                None => tracing::warn!(part = name, "store timing out: circuit breaker open"),
            }
        }
    }

    /// Checks `limits`; see [`LeaseStore::check_stamped`]. Errs only with what the
    /// caller must see ([`StoreError::Invalid`], [`StoreError::Unsupported`]),
    /// never because the inner store is down.
    pub async fn check_limits(&self, limits: &[Limit<'_>]) -> Result<Stamped, StoreError> {
        self.check_through(limits, || self.shared.inner.check_stamped(limits))
            .await
    }

    /// Checks `limits` by `ask`ing the inner store, or by the failure
    /// policies when it cannot answer.
    async fn check_through<F>(
        &self,
        limits: &[Limit<'_>],
        ask: impl FnOnce() -> F,
    ) -> Result<Stamped, StoreError>
    where
        F: Future<Output = Result<Stamped, StoreError>>,
    {
        let shared = &self.shared;
        let parts = self.breakers(limits.iter().map(|l| l.key));
        if !parts.iter().all(|(_, b)| b.admit()) {
            return Ok(self.fallback(limits));
        }
        // Paid only to a store that answered its last call: one that is
        // failing would be sent twice the calls.
        if parts.iter().all(|(_, b)| b.answering()) {
            let debts = self.debts(limits);
            if !debts.is_empty() {
                self.pay(&debts).await;
            }
        }
        match tokio::time::timeout(shared.config.timeout, ask()).await {
            Ok(answer) => self.answered(limits, &parts, answer),
            Err(_) => {
                self.failed(&parts, None);
                Ok(self.fallback(limits))
            }
        }
    }

    /// What a check of `limits` on `parts` gives once the inner store
    /// answered it in time.
    fn answered(
        &self,
        limits: &[Limit<'_>],
        parts: &[Part],
        answer: Result<Stamped, StoreError>,
    ) -> Result<Stamped, StoreError> {
        match answer {
            Ok(mut stamped) => {
                for (_, breaker) in parts {
                    breaker.success();
                }
                bump(&self.shared.counters.checks);
                self.remember(limits, &stamped.outcome.decisions);
                let leases = std::mem::take(&mut stamped.outcome.leases);
                stamped.outcome.leases = tag(leases, INNER);
                Ok(stamped)
            }
            Err(e @ (StoreError::Invalid(_) | StoreError::Unsupported(_))) => Err(e),
            Err(e) => {
                self.failed(parts, Some(&e));
                Ok(self.fallback(limits))
            }
        }
    }

    /// Checks each of `limits` on its own; see
    /// [`LeaseStore::check_each_stamped`]. Each is decided as a check of it
    /// alone would be (its part's breaker, its debts, its failure policy);
    /// those the inner store may decide go to it in one call, within one
    /// timeout, and one that fails only fails its own limit.
    pub async fn check_each_limits(
        &self,
        limits: &[Limit<'_>],
    ) -> Vec<Result<Stamped, StoreError>> {
        let shared = &self.shared;
        let mut answers: Vec<Option<Result<Stamped, StoreError>>> =
            Vec::with_capacity(limits.len());
        let mut sent: SmallVec<[(usize, SmallVec<[Part; 2]>); 4]> = SmallVec::new();
        for (i, limit) in limits.iter().enumerate() {
            let parts = self.breakers([limit.key]);
            if parts.iter().all(|(_, b)| b.admit()) {
                sent.push((i, parts));
                answers.push(None);
            } else {
                answers.push(Some(Ok(self.fallback(std::slice::from_ref(limit)))));
            }
        }
        if sent.is_empty() {
            return answers.into_iter().flatten().collect();
        }
        let debts: SmallVec<[Limit<'_>; 4]> = sent
            .iter()
            .filter(|(_, parts)| parts.iter().all(|(_, b)| b.answering()))
            .flat_map(|&(i, _)| self.debts(std::slice::from_ref(&limits[i])))
            .collect();
        if !debts.is_empty() {
            self.pay(&debts).await;
        }
        let asked: SmallVec<[Limit<'_>; 4]> = sent.iter().map(|&(i, _)| limits[i]).collect();
        let inner = shared.inner.check_each_stamped(&asked);
        match tokio::time::timeout(shared.config.timeout, inner).await {
            Ok(got) => {
                let mut got = got.into_iter();
                for (i, parts) in &sent {
                    let one = std::slice::from_ref(&limits[*i]);
                    let answer = got.next().unwrap_or_else(|| Err(unanswered()));
                    answers[*i] = Some(self.answered(one, parts, answer));
                }
            }
            Err(_) => {
                for (i, parts) in &sent {
                    self.failed(parts, None);
                    answers[*i] = Some(Ok(self.fallback(std::slice::from_ref(&limits[*i]))));
                }
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Err(unanswered())))
            .collect()
    }

    /// Keeps what the inner store said of each `local` limit's key (and
    /// what it is still owed).
    fn remember(&self, limits: &[Limit<'_>], decisions: &[Decision]) {
        let now = self.shared.clock.now();
        let mut reports = self.shared.reports.lock();
        for (limit, decision) in limits.iter().zip(decisions) {
            if limit.failure != FailurePolicy::Local {
                continue;
            }
            let debt = reports.get(limit.key).map_or(0, |known| known.debt);
            // Permits in flight stay taken up to the period, whatever the
            // decision's reset says.
            let holds = if limit.algorithm == Algorithm::Concurrency {
                limit.quota.period()
            } else {
                decision.reset_after()
            };
            let report = Report {
                remaining: decision.remaining(),
                until: now.saturating_add(holds.into_nanos()),
                seeded: false,
                debt,
            };
            if let Some(known) = reports.get_mut(limit.key) {
                *known = report;
                continue;
            }
            if reports.len() >= MAX_REPORTS {
                // Any one: a key forgotten starts at its share of the
                // capacity, which is still bounded.
                let Some(old) = reports.keys().next().cloned() else {
                    break;
                };
                reports.remove(&old);
            }
            reports.insert(limit.key.into(), report);
        }
    }

    /// Takes what the inner store is owed for `limits`' keys: each limit,
    /// charged with the units admitted locally since (see [`Fallback::pay`]).
    fn debts<'a>(&self, limits: &[Limit<'a>]) -> SmallVec<[Limit<'a>; 4]> {
        let mut reports = self.shared.reports.lock();
        limits
            .iter()
            .filter_map(|limit| {
                let report = reports.get_mut(limit.key)?;
                let cost = std::mem::take(&mut report.debt);
                (cost > 0).then_some(Limit { cost, ..*limit })
            })
            .collect()
    }

    /// Charges the inner store with what was admitted locally, before the
    /// next check of those keys it decides, so that it counts every admitted
    /// request and an episode's overshoot does not carry into the next
    /// (paid after that check, the checks in flight meanwhile would spend
    /// it again). A concurrency charge is a lease that lapses after the
    /// period. What a payment that fails or times out owed is owed again (a
    /// timed-out one may have been made: then it is paid twice, which errs
    /// on the strict side).
    async fn pay(&self, debts: &[Limit<'_>]) {
        let shared = &self.shared;
        for debt in debts {
            let mut limit = *debt;
            // A charge above what is left is refused whole, and what is left
            // may be less than owed: each refusal says what is left now,
            // which is then paid (a few tries); past what is left, nothing
            // more can be spent anyway.
            for _ in 0..PAYMENT_TRIES {
                let paid =
                    tokio::time::timeout(shared.config.timeout, shared.inner.check(&[limit])).await;
                let Ok(Ok(outcome)) = paid else {
                    let mut reports = shared.reports.lock();
                    if let Some(report) = reports.get_mut(limit.key) {
                        report.debt = report.debt.saturating_add(limit.cost);
                    }
                    break;
                };
                let left = outcome.decisions.first().map_or(0, |d| d.remaining());
                if outcome.allowed() || left == 0 {
                    break;
                }
                limit.cost = limit.cost.min(left);
            }
        }
    }

    /// Charges the local state of each of `limits` down to its share of what
    /// the inner store last reported (or of its capacity), the first time it
    /// is decided locally since that report; see the module documentation.
    fn seed(&self, limits: &[Limit<'_>]) {
        let shared = &self.shared;
        let now = shared.clock.now();
        for limit in limits {
            // A window's fresh report lapses at the local window's edge:
            // lapsing drops what is owed, which must then be the past
            // window's only (a period from now, the admissions of the next
            // window before it lapsed were dropped too: 1,003 of 1,000
            // after an outage, found by `tollgate simulate --instances`).
            let period = limit.quota.period_ns();
            let until = match limit.algorithm {
                Algorithm::FixedWindow | Algorithm::HitCounter => {
                    (now / period).saturating_add(1).saturating_mul(period)
                }
                _ => now.saturating_add(period),
            };
            let base = {
                let mut reports = shared.reports.lock();
                let fresh = Report {
                    remaining: limit.capacity(),
                    until,
                    seeded: true,
                    debt: 0,
                };
                match reports.get_mut(limit.key) {
                    Some(report) if report.seeded && now < report.until => continue,
                    Some(report) if now < report.until => {
                        report.seeded = true;
                        report.remaining
                    }
                    Some(report) => {
                        *report = fresh;
                        fresh.remaining
                    }
                    None => {
                        if reports.len() < MAX_REPORTS {
                            reports.insert(limit.key.into(), fresh);
                        }
                        fresh.remaining
                    }
                }
            };
            // A lease the store below holds of the key (hybrid mode) is
            // this instance's own, not a part to share: `base` counts it,
            // Redis's remaining does not. Rounded down: never more than
            // the share.
            let held = shared.inner.leased(limit).min(base);
            let share = ((base - held) as f64 * shared.config.local_share) as u64;
            let target = share.saturating_add(held);
            let peek = Limit { cost: 0, ..*limit };
            let left = shared.local.check_now(&[peek]).decisions[0].remaining();
            let charge = left.saturating_sub(target);
            if charge > 0 {
                // A concurrency charge is a lease that lapses after the
                // period, never released.
                shared.local.check_now(&[Limit {
                    cost: charge,
                    ..*limit
                }]);
            }
        }
    }

    /// What the limits' failure policies decide.
    fn fallback(&self, limits: &[Limit<'_>]) -> Stamped {
        let shared = &self.shared;
        bump(&shared.counters.fallbacks);
        for limit in limits {
            bump(&shared.counters.policies[policy_index(limit.failure)]);
        }
        let closed = limits
            .iter()
            .any(|l| l.failure == FailurePolicy::FailClosed);
        let local: SmallVec<[Limit<'_>; 4]> = limits
            .iter()
            .filter(|l| l.failure == FailurePolicy::Local)
            .map(|l| Limit {
                // Only a peek when another limit refuses anyway.
                cost: if closed { 0 } else { l.cost },
                ..*l
            })
            .collect();
        if !closed {
            self.seed(&local);
        }
        // The local check is the whole verdict unless a `fail_closed` limit
        // refused, in which case it was at cost 0 and took no lease: its
        // leases are the request's.
        let local_outcome = shared.local.check_now(&local);
        if local_outcome.allowed() {
            let mut reports = shared.reports.lock();
            for limit in &local {
                if let Some(report) = reports.get_mut(limit.key) {
                    report.debt = report.debt.saturating_add(limit.cost);
                }
            }
        }
        let leases = tag(local_outcome.leases, LOCAL);
        let mut local_decisions = local_outcome.decisions.into_iter();
        let retry = shared.config.breaker_cool_down.max(shared.config.timeout);
        let decisions: SmallVec<[Decision; 4]> = limits
            .iter()
            .map(|l| {
                l.failure.decide(l, Some(retry)).unwrap_or_else(|| {
                    local_decisions
                        .next()
                        .expect("one local decision per local limit")
                })
            })
            .collect();
        let outcome = Outcome { decisions, leases };
        Stamped {
            outcome,
            decided_at: None,
        }
    }

    /// Gives back each lease to the store that granted it; see
    /// [`Store::release`]. A lease of the inner store that cannot be released
    /// now (breaker open, an error) lapses after its quota's period; one
    /// whose id carries neither tag was not granted here and is left alone.
    pub async fn release_leases(&self, leases: &[Lease]) -> Result<(), StoreError> {
        let shared = &self.shared;
        let local = untag(leases, LOCAL);
        shared.local.release_now(&local);
        if !local.is_empty() {
            // A permit given back before it was paid for is owed no more.
            let mut reports = shared.reports.lock();
            for lease in &local {
                if let Some(report) = reports.get_mut(lease.key.as_str()) {
                    report.debt = report.debt.saturating_sub(lease.cost);
                }
            }
        }
        let inner = untag(leases, INNER);
        if inner.is_empty() {
            return Ok(());
        }
        let parts = self.breakers(inner.iter().map(|l| l.key.as_str()));
        if !parts.iter().all(|(_, b)| b.admit()) {
            return Ok(());
        }
        match tokio::time::timeout(shared.config.timeout, shared.inner.release(&inner)).await {
            Ok(Ok(())) => {
                for (_, breaker) in &parts {
                    breaker.success();
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "a release failed; the permit lapses after its period");
                self.failed(&parts, Some(&e));
            }
            Err(_) => self.failed(&parts, None),
        }
        Ok(())
    }

    /// Gives units back to the inner store when it is reachable; see
    /// [`LeaseStore::give_back`].
    pub async fn give_back_units(
        &self,
        limit: &Limit<'_>,
        taken_at: u64,
        holder: Option<(Holder, Leased)>,
    ) -> Result<(), StoreError> {
        let shared = &self.shared;
        let parts = self.breakers([limit.key]);
        if !parts[0].1.admit() {
            return Err(StoreError::Backend {
                source: "the circuit breaker is open".into(),
                retryable: true,
            });
        }
        match tokio::time::timeout(
            shared.config.timeout,
            shared.inner.give_back(limit, taken_at, holder),
        )
        .await
        {
            Ok(Ok(())) => {
                parts[0].1.success();
                Ok(())
            }
            Ok(Err(e @ (StoreError::Invalid(_) | StoreError::Unsupported(_)))) => Err(e),
            Ok(Err(e)) => {
                self.failed(&parts, Some(&e));
                Err(e)
            }
            Err(_) => {
                self.failed(&parts, None);
                Err(StoreError::Timeout(shared.config.timeout))
            }
        }
    }
}

impl<S: LeaseStore + 'static> Store for Fallback<S> {
    fn supports(&self, algorithm: Algorithm, quota: &Quota) -> Result<(), StoreError> {
        self.inner().supports(algorithm, quota)
    }

    async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        Ok(self.check_limits(limits).await?.outcome)
    }

    async fn check_each(&self, limits: &[Limit<'_>]) -> Vec<Result<Outcome, StoreError>> {
        outcomes(self.check_each_limits(limits).await)
    }

    fn release(&self, leases: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.release_leases(leases)
    }

    fn ready(&self) -> impl Future<Output = bool> + Send {
        self.shared.inner.ready()
    }

    fn domain(&self, key: &str) -> Option<Arc<str>> {
        self.shared.inner.domain(key)
    }

    fn domain_ready(&self, domain: &str) -> impl Future<Output = bool> + Send {
        self.shared.inner.domain_ready(domain)
    }

    /// Resets the local state and what is known and owed of these keys at
    /// once, and the inner store within the timeout.
    async fn reset(&self, limits: &[Limit<'_>]) -> Result<(), StoreError> {
        let shared = &self.shared;
        shared.local.reset_now(limits);
        {
            let mut reports = shared.reports.lock();
            for limit in limits {
                reports.remove(limit.key);
            }
        }
        match tokio::time::timeout(shared.config.timeout, shared.inner.reset(limits)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(shared.config.timeout)),
        }
    }
}

impl<S: LeaseStore + 'static> LeaseStore for Fallback<S> {
    fn check_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Stamped, StoreError>> + Send {
        self.check_limits(limits)
    }

    fn check_each_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Vec<Result<Stamped, StoreError>>> + Send {
        self.check_each_limits(limits)
    }

    async fn check_leasing(
        &self,
        limits: &[Limit<'_>],
        holder: Holder,
        leased: &[Option<Leased>],
    ) -> Result<Stamped, StoreError> {
        self.check_through(limits, || {
            self.shared.inner.check_leasing(limits, holder, leased)
        })
        .await
    }

    fn leased(&self, limit: &Limit<'_>) -> u64 {
        self.shared.inner.leased(limit)
    }

    fn give_back(
        &self,
        limit: &Limit<'_>,
        taken_at: u64,
        holder: Option<(Holder, Leased)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.give_back_units(limit, taken_at, holder)
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;
    use std::sync::atomic::AtomicU8;

    use tollgate_core::{Algorithm, ManualClock, Quota};

    use super::*;

    const UP: u8 = 0;
    const ERRS: u8 = 1;
    const HANGS: u8 = 2;

    /// A memory store behind a switch: up, failing every call, or never
    /// answering (as a store behind a dead network). The switch is the fault;
    /// the state is a real memory store's.
    struct Switch {
        memory: MemoryStore<Arc<ManualClock>>,
        mode: AtomicU8,
        checks: AtomicU64,
    }

    impl Switch {
        fn new(clock: &Arc<ManualClock>) -> Self {
            Self {
                memory: MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(clock)),
                mode: AtomicU8::new(UP),
                checks: AtomicU64::new(0),
            }
        }

        fn set(&self, mode: u8) {
            self.mode.store(mode, Ordering::Relaxed);
        }

        async fn fault(&self) -> Result<(), StoreError> {
            match self.mode.load(Ordering::Relaxed) {
                UP => Ok(()),
                ERRS => Err(StoreError::Backend {
                    source: "switched off".into(),
                    retryable: true,
                }),
                _ => pending().await,
            }
        }
    }

    impl Store for Switch {
        async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
            self.checks.fetch_add(1, Ordering::Relaxed);
            self.fault().await?;
            Ok(self.memory.check_now(limits))
        }

        async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
            self.fault().await?;
            self.memory.release_now(leases);
            Ok(())
        }

        async fn ready(&self) -> bool {
            self.fault().await.is_ok()
        }
    }

    impl LeaseStore for Switch {}

    fn config() -> FallbackConfig {
        FallbackConfig {
            timeout: Duration::from_millis(10),
            breaker_failures: 3,
            breaker_cool_down: Duration::from_millis(100),
            ..FallbackConfig::default()
        }
    }

    fn store() -> (Fallback<Switch>, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let store = Fallback::with_clock(Switch::new(&clock), config(), Arc::clone(&clock) as _);
        (store, clock)
    }

    fn gcra(key: &str, failure: FailurePolicy) -> Limit<'_> {
        Limit::new(key, Quota::per_second(1).unwrap(), Algorithm::Gcra).with_failure(failure)
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_is_closed_by_a_background_probe_with_no_checks_sent() {
        let (store, _clock) = store();
        let l = gcra("k", FailurePolicy::Local);
        store.inner().set(ERRS);
        for _ in 0..3 {
            assert!(store.check(&[l]).await.is_ok(), "a check never errs");
        }
        let stats = store.stats();
        assert_eq!(
            (stats.breaker, stats.breaker_opens, stats.errors),
            (BreakerState::Open, 1, 3)
        );
        store.check(&[l]).await.unwrap();
        assert_eq!(
            store.inner().checks.load(Ordering::Relaxed),
            3,
            "open: not asked"
        );

        // A probe that fails keeps it open for another cool-down.
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            (store.stats().probes, store.stats().breaker),
            (1, BreakerState::Open)
        );
        store.inner().set(UP);
        // Within one cool-down plus one probe, with no check in between.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stats = store.stats();
        assert_eq!((stats.probes, stats.breaker), (2, BreakerState::Closed));
        assert_eq!(store.inner().checks.load(Ordering::Relaxed), 3);
        assert!(
            store
                .check(&[gcra("fresh", FailurePolicy::Local)])
                .await
                .unwrap()
                .allowed()
        );
        assert_eq!(store.stats().checks, 1);
    }

    /// Two switched stores as two parts of one (a cluster's two nodes):
    /// keys starting with `a` on one, the others on the other.
    struct TwoParts {
        a: Switch,
        b: Switch,
    }

    impl TwoParts {
        fn part(&self, key: &str) -> &Switch {
            if key.starts_with('a') {
                &self.a
            } else {
                &self.b
            }
        }
    }

    impl LeaseStore for TwoParts {}

    impl Store for TwoParts {
        /// Checks whose limits are on one part only (as these tests send).
        async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
            self.part(limits[0].key).check(limits).await
        }

        async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
            self.part(&leases[0].key).release(leases).await
        }

        fn domain(&self, key: &str) -> Option<Arc<str>> {
            Some(Arc::from(&key[..1]))
        }

        async fn domain_ready(&self, domain: &str) -> bool {
            self.part(domain).fault().await.is_ok()
        }
    }

    /// Limits checked each on its own go to the inner store in one call,
    /// and a failing part fails only its own limit, which its policy
    /// decides; once its breaker is open it is not asked at all.
    #[tokio::test(start_paused = true)]
    async fn limits_checked_each_fall_back_one_by_one() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let parts = TwoParts {
            a: Switch::new(&clock),
            b: Switch::new(&clock),
        };
        let store = Fallback::with_clock(parts, config(), Arc::clone(&clock) as _);
        let a = Limit::new("a1", Quota::per_second(10).unwrap(), Algorithm::Gcra)
            .with_failure(FailurePolicy::FailClosed);
        let b = Limit::new("b1", Quota::per_second(10).unwrap(), Algorithm::Gcra)
            .with_failure(FailurePolicy::FailClosed);
        store.inner().a.set(ERRS);
        for round in 0..4u64 {
            let answers = store.check_each(&[a, b]).await;
            let got: Vec<(bool, u64)> = answers
                .into_iter()
                .map(|answer| {
                    let d = answer.unwrap().decisions[0];
                    (d.allowed(), d.remaining())
                })
                .collect();
            assert_eq!(got, [(false, 0), (true, 9 - round)], "round {round}");
        }
        let stats = store.stats();
        assert_eq!((stats.checks, stats.fallbacks, stats.errors), (4, 4, 3));
        assert_eq!(store.inner().a.checks.load(Ordering::Relaxed), 3, "open");
        assert_eq!(store.inner().b.checks.load(Ordering::Relaxed), 4);
        let state = |name: &str| {
            store
                .parts()
                .into_iter()
                .find(|(part, _)| &**part == name)
                .map(|(_, state)| state)
        };
        assert_eq!(state("a"), Some(BreakerState::Open));
        assert_eq!(state("b"), Some(BreakerState::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_part_sends_only_its_own_keys_to_the_fallback() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let parts = TwoParts {
            a: Switch::new(&clock),
            b: Switch::new(&clock),
        };
        let store = Fallback::with_clock(parts, config(), Arc::clone(&clock) as _);
        let (a, b) = (
            gcra("a1", FailurePolicy::Local),
            gcra("b1", FailurePolicy::Local),
        );
        store.inner().a.set(ERRS);
        for _ in 0..3 {
            store.check(&[a]).await.unwrap();
        }
        let open = |name: &str, state| (Arc::from(name), state);
        assert_eq!(
            store.parts(),
            vec![open("a", BreakerState::Open)],
            "only the failing part's breaker, opened"
        );
        assert_eq!(store.stats().breaker, BreakerState::Open);
        // The other part's keys still go to it, and it decides them.
        let before = store.stats();
        assert!(store.check(&[b]).await.unwrap().allowed());
        assert!(!store.check(&[b]).await.unwrap().allowed(), "its own count");
        let after = store.stats();
        assert_eq!(
            (after.checks, after.fallbacks),
            (before.checks + 2, before.fallbacks)
        );
        assert_eq!(store.inner().b.checks.load(Ordering::Relaxed), 2);
        assert_eq!(store.parts()[1], open("b", BreakerState::Closed));
        // The failing part's are decided locally without asking it, and so is
        // a check with a limit on each part (all-or-nothing needs one place).
        store.check(&[a]).await.unwrap();
        store.check(&[b, a]).await.unwrap();
        assert_eq!(store.stats().fallbacks, after.fallbacks + 2);
        assert_eq!(store.inner().a.checks.load(Ordering::Relaxed), 3);
        assert_eq!(store.inner().b.checks.load(Ordering::Relaxed), 2);

        // Its probe closes its breaker when it answers again.
        store.inner().a.set(UP);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(store.parts()[0], open("a", BreakerState::Closed));
        assert_eq!(store.stats().breaker, BreakerState::Closed);
        store
            .check(&[gcra("a2", FailurePolicy::Local)])
            .await
            .unwrap();
        assert_eq!(store.inner().a.checks.load(Ordering::Relaxed), 4);
        assert_eq!(store.stats().probes, 1, "only the open part was probed");
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_checks_against_a_hung_store_never_leave_the_breaker_half_open() {
        let (store, _clock) = store();
        let l = gcra("k", FailurePolicy::Local);
        store.inner().set(HANGS);
        // Callers that give up before the timeout (a client hanging up) count
        // nothing; those that wait see the timeout.
        for _ in 0..5 {
            let gave_up = tokio::time::timeout(Duration::from_millis(1), store.check(&[l])).await;
            assert!(gave_up.is_err());
        }
        assert_eq!(store.stats().breaker, BreakerState::Closed);
        for _ in 0..3 {
            store.check(&[l]).await.unwrap();
        }
        assert_eq!(
            (store.stats().timeouts, store.stats().breaker),
            (3, BreakerState::Open)
        );
        // The probe hangs too: it is cut at the cool-down and the breaker
        // stays open, not half-open.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(store.stats().breaker, BreakerState::Open);
        store.inner().set(UP);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(store.stats().breaker, BreakerState::Closed);
    }

    const EVERY_ALGORITHM: [Algorithm; 8] = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::LeakyBucketShaping { delay_after: 10 },
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::Concurrency,
    ];

    /// 10 an hour, decided locally when the inner store fails.
    fn hourly(key: &str, algorithm: Algorithm) -> Limit<'_> {
        Limit::new(key, Quota::per_hour(10).unwrap(), algorithm)
    }

    /// How many single checks of `limit` in a row `store` admits.
    async fn admitted(store: &Fallback<Switch>, limit: Limit<'_>) -> u64 {
        let mut admitted = 0;
        while store.check(&[limit]).await.unwrap().allowed() {
            admitted += 1;
            assert!(admitted <= 10, "past the whole limit");
        }
        admitted
    }

    /// Regression: a check that timed out on a busy but healthy store was
    /// decided by a local limiter with a full budget (concurrency 119/100 on
    /// one instance). Now it starts from what the inner store last reported.
    #[tokio::test(start_paused = true)]
    async fn a_blip_spends_only_what_the_inner_store_last_left() {
        for algorithm in EVERY_ALGORITHM {
            let (store, _clock) = store();
            let limit = hourly("k", algorithm);
            store.inner().set(UP);
            for _ in 0..7 {
                assert!(store.check(&[limit]).await.unwrap().allowed());
            }
            store.inner().set(HANGS);
            assert_eq!(admitted(&store, limit).await, 3, "{algorithm:?}");
            // A key the inner store never reported on starts full.
            assert_eq!(
                admitted(&store, hourly("new", algorithm)).await,
                10,
                "{algorithm:?}"
            );
        }
    }

    /// What a blip admitted locally is charged to the inner store when it
    /// answers again, so that, over both, the limit holds exactly.
    #[tokio::test(start_paused = true)]
    async fn what_was_admitted_locally_is_paid_back_when_the_inner_store_answers() {
        for algorithm in EVERY_ALGORITHM {
            let (store, _clock) = store();
            let limit = hourly("k", algorithm);
            for _ in 0..4 {
                assert!(store.check(&[limit]).await.unwrap().allowed());
            }
            store.inner().set(ERRS);
            for _ in 0..2 {
                assert!(store.check(&[limit]).await.unwrap().allowed());
            }
            store.inner().set(UP);
            // The inner store is paid the 2, then decides this one.
            assert!(store.check(&[limit]).await.unwrap().allowed());
            assert_eq!(admitted(&store, limit).await, 3, "{algorithm:?}: 10 in all");
        }
    }

    /// Regression: a fresh report held for a period from the first local
    /// decision, so it lapsed after the next window's edge, and lapsing it
    /// dropped what was owed, some of it admitted in that window:
    /// `tollgate simulate --instances` found one instance admitting 1,003
    /// of a window of 1,000 after an outage.
    #[tokio::test(start_paused = true)]
    async fn what_was_admitted_stays_owed_when_a_report_lapses_mid_window() {
        const HOUR: u64 = 3_600_000_000_000;
        let (store, clock) = store();
        let limit = hourly("k", Algorithm::FixedWindow);
        let admit = |n: u64| {
            let store = &store;
            async move {
                for _ in 0..n {
                    assert!(store.check(&[limit]).await.unwrap().allowed());
                }
            }
        };
        admit(1).await;
        store.inner().set(ERRS);
        // Into the next window: the report has lapsed; a fresh one.
        clock.set(HOUR + 1_000_000_000);
        admit(2).await;
        // The window after: 3 admitted locally, a second later 1 more.
        clock.set(2 * HOUR + 500_000_000);
        admit(3).await;
        clock.set(2 * HOUR + 2_000_000_000);
        admit(1).await;
        store.inner().set(UP);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // 4 admitted in this window locally: the store is paid at least
        // those before it decides, so 6 more at most.
        let more = admitted(&store, limit).await;
        assert!(more <= 6, "{more} more after 4 admitted locally");
    }

    #[tokio::test(start_paused = true)]
    async fn a_share_below_one_keeps_that_part_for_each_instance() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let config = FallbackConfig {
            local_share: 0.5,
            ..config()
        };
        let store = Fallback::with_clock(Switch::new(&clock), config, Arc::clone(&clock) as _);
        for algorithm in EVERY_ALGORITHM {
            let (spent, fresh) = (
                format!("spent-{algorithm:?}"),
                format!("fresh-{algorithm:?}"),
            );
            store.inner().set(UP);
            // The background probe closes the breaker the last round opened.
            tokio::time::sleep(Duration::from_millis(300)).await;
            for _ in 0..4 {
                assert!(
                    store
                        .check(&[hourly(&spent, algorithm)])
                        .await
                        .unwrap()
                        .allowed()
                );
            }
            store.inner().set(ERRS);
            assert_eq!(
                admitted(&store, hourly(&spent, algorithm)).await,
                3,
                "{algorithm:?}: half of 6"
            );
            assert_eq!(
                admitted(&store, hourly(&fresh, algorithm)).await,
                5,
                "{algorithm:?}: half of 10"
            );
        }
    }

    /// A report is used once: the local state then counts on its own, what
    /// it admitted is paid back, and the next report (after the inner store
    /// answered again) is the next episode's start.
    #[tokio::test(start_paused = true)]
    async fn each_episode_starts_from_the_latest_report() {
        let (store, _clock) = store();
        let limit = hourly("k", Algorithm::FixedWindow);
        store.inner().set(UP);
        assert!(store.check(&[limit]).await.unwrap().allowed());
        store.inner().set(ERRS);
        assert!(store.check(&[limit]).await.unwrap().allowed());
        assert!(store.check(&[limit]).await.unwrap().allowed());
        store.inner().set(UP);
        tokio::time::sleep(Duration::from_secs(1)).await;
        for _ in 0..6 {
            assert!(store.check(&[limit]).await.unwrap().allowed());
        }
        store.inner().set(ERRS);
        // The inner store counted 7 of 10 and was paid the 2 admitted
        // locally: 1 is left, and the local state (7 left after the first
        // episode) is charged down to it.
        assert_eq!(admitted(&store, limit).await, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn each_limit_falls_back_by_its_own_policy_all_or_nothing() {
        let (store, _clock) = store();
        let open = gcra("open", FailurePolicy::FailOpen);
        let closed = gcra("closed", FailurePolicy::FailClosed);
        let local = gcra("local", FailurePolicy::Local);
        store.inner().set(ERRS);
        for _ in 0..3 {
            let o = store.check(&[open]).await.unwrap();
            assert!(o.allowed());
            assert_eq!(o.decisions[0].remaining(), 1, "nothing counted");
            let c = store.check(&[closed]).await.unwrap();
            assert!(!c.allowed());
            assert_eq!(
                c.decisions[0].retry_after(),
                Some(Duration::from_millis(100))
            );
        }
        assert!(store.check(&[local]).await.unwrap().allowed());
        assert!(!store.check(&[local]).await.unwrap().allowed());
        let fresh = gcra("fresh", FailurePolicy::Local);
        let mixed = store.check(&[fresh, closed, open]).await.unwrap();
        assert!(!mixed.allowed());
        assert!(mixed.decisions[0].allowed() && mixed.decisions[2].allowed());
        assert!(store.check(&[fresh, open]).await.unwrap().allowed());
        assert!(
            !store.check(&[fresh, open]).await.unwrap().allowed(),
            "the local limit counted only the admitted request"
        );
        let stats = store.stats();
        assert_eq!(stats.fallbacks, 11);
        assert_eq!(
            (
                stats.fallback_fail_open,
                stats.fallback_fail_closed,
                stats.fallback_local
            ),
            (6, 4, 5)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn leases_go_back_to_the_store_that_gave_them() {
        let (store, _clock) = store();
        let slots = Limit::new(
            "uploads",
            Quota::per_minute(2).unwrap(),
            Algorithm::Concurrency,
        );
        // Taken from the inner store while it was up...
        let inner = store.check(&[slots]).await.unwrap().leases;
        assert!(inner[0].id.as_str().starts_with(INNER));
        store.inner().set(ERRS);
        for _ in 0..3 {
            store
                .check(&[gcra("trip", FailurePolicy::FailOpen)])
                .await
                .unwrap();
        }
        // ...then one from the local store while it is down: the one the
        // inner store had left, never a second grant of the one it holds.
        let local = store.check(&[slots]).await.unwrap().leases;
        assert!(local[0].id.as_str().starts_with(LOCAL));
        assert!(!store.check(&[slots]).await.unwrap().allowed());
        // An id without a tag of this wrapper is no lease of it.
        let untagged = Lease {
            id: local[0].id.untagged(LOCAL).unwrap(),
            ..local[0].clone()
        };
        store.release(&[untagged]).await.unwrap();
        assert!(!store.check(&[slots]).await.unwrap().allowed());
        store.release(&local).await.unwrap();
        assert!(
            store.check(&[slots]).await.unwrap().allowed(),
            "the local lease came back"
        );
        store.inner().set(UP);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(store.stats().breaker, BreakerState::Closed);
        // The inner store is paid the local permit still held (the one the
        // last check took), and so is full.
        assert!(
            !store.check(&[slots]).await.unwrap().allowed(),
            "the inner one is still held"
        );
        store.release(&inner).await.unwrap();
        assert!(
            store.check(&[slots]).await.unwrap().allowed(),
            "the inner lease came back"
        );
    }
}
