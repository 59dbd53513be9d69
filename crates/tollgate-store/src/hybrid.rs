//! Hybrid mode: a [`Store`] over another (Redis, typically) that leases slices
//! of hot keys' budgets from it and spends them locally.
//!
//! When a check needs the inner store anyway (no lease, or not enough left),
//! the wrapper asks for the request's cost **plus a lease** in the same atomic
//! check; the extra units are consumed from the global state at once and kept
//! locally. Later checks of the key spend them without calling the inner
//! store, all-or-nothing across the request's limits. If the global state
//! cannot give the extra, the check is repeated for the cost alone, so a nearly
//! spent budget still admits exactly what the inner store would.
//!
//! Leases adapt to the key's traffic: a lease spent before it expires doubles
//! the next one, up to `max_lease` (a fraction of the key's capacity); a lease
//! that expires is returned and the key starts again at one unit. An instance
//! never holds more than `max_lease` unspent units of a key. Unspent units go
//! back ([`LeaseStore::give_back`]: exact for buckets; for a fixed window, only in
//! the window they were taken in) when the lease expires (`lease_ttl`, or the
//! end of the fixed window it was taken in), by [`Hybrid::return_expired`],
//! which a background task calls, or all at once by [`Hybrid::flush`].
//!
//! Leases need the inner store's time of decision ([`LeaseStore::check_stamped`]):
//! units that come back without one (the inner store was down and a fallback
//! under this wrapper decided) are not kept.
//!
//! **A crash or a timeout strands nothing for long.** Leases are taken
//! with [`LeaseStore::check_leasing`], which a store that keeps the budget
//! elsewhere (Redis) uses to record what this instance holds, with a
//! deadline twice `lease_ttl` past the check. The record is a sum: each
//! leasing call adds its extra units and takes off what the instance says
//! it spent since it last told (the background task tells each live
//! lease's spending too), and a give back takes off the rest. If the
//! instance dies, a later leasing check of the key by another credits its
//! units back once the deadline passes: those it held at its last report,
//! so a crash adds at most what it spent since (at most `max_lease` a key).
//! A leasing call that fails (a round trip past the store's timeout) may
//! still have taken its units into the record: the instance then takes a
//! new record id for its next leases, gives back the leases of the old one
//! as they come up for renewal, and so never refreshes the old record
//! again; what is left in it is credited back at its deadline.
//!
//! **Worst-case overshoot.** Leased units are taken from the global state when
//! leased, so the global accounting never admits more than the limit; what
//! moves is *when* they are spent. Units leased before an interval and spent in
//! it are at most what the N instances hold, each at most `max_lease` per key.
//! So for the bucket algorithms, over any interval of length T, a key admits at
//! most
//!
//! ```text
//!     burst + rate × T + N × max_lease,   max_lease = max(1, ⌊capacity × max_lease_fraction⌋)
//! ```
//!
//! (the exact bound plus `N × max_lease`); for a fixed window, leased units
//! expire with the window they were taken in, so a window still admits at most
//! its limit: no overshoot. The price is the reverse: units held unspent by one
//! instance are unavailable to the others until spent or returned (a false deny
//! elsewhere, bounded by the same `N × max_lease`).
//!
//! Algorithms leased: token bucket, GCRA, policing leaky bucket and fixed
//! window. The others (shaping, whose delay depends on the queue; the sliding
//! log and counter, whose units leave at their admission times; concurrency)
//! go to the inner store on every check, as does any request containing one.
//!
//! A decision made locally reports `remaining` as what the inner store said
//! was left when the lease was taken plus the units this instance still
//! holds (so a fallback over this wrapper starts from what the inner store
//! last said), and `reset_after` as the inner store gave it then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::task::JoinHandle;
use tollgate_core::IntoNanos;
use tollgate_core::{
    Algorithm, Clock, Decision, FailurePolicy, Holder, LeaseStore, Leased, Limit, Nanos, Outcome,
    Quota, Stamped, Store, StoreError,
};

use crate::FastClock;
use crate::decision::{budget, outcomes, unanswered};

/// How the hybrid wrapper leases.
#[derive(Debug, Clone)]
pub struct HybridConfig {
    /// The most units one instance holds unspent for one key, as a fraction of
    /// the key's capacity (burst for buckets, limit for a fixed window); at
    /// least one unit. Default 0.05: with N instances, at most `N × 5%` of the
    /// capacity is in flight.
    pub max_lease_fraction: f64,
    /// How long leased units may stay unspent before they go back. Default 1 s.
    pub lease_ttl: Duration,
}

impl Default for HybridConfig {
    fn default() -> Self {
        Self {
            max_lease_fraction: 0.05,
            lease_ttl: Duration::from_secs(1),
        }
    }
}

/// The hybrid wrapper's counters, monotonic since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HybridStats {
    /// Checks decided from local leases, without the inner store.
    pub local_decisions: u64,
    /// Checks sent to the inner store (including repeats without a lease).
    pub inner_checks: u64,
    /// Units leased from the inner store.
    pub units_leased: u64,
    /// Unspent units given back to the inner store.
    pub units_returned: u64,
    /// Calls that gave units back.
    pub returns: u64,
}

/// Units of one key held by this instance.
#[derive(Debug)]
struct Lease {
    key: String,
    quota: Quota,
    algorithm: Algorithm,
    units: u64,
    /// The next lease's size.
    size: u64,
    /// Local time when the units must go back.
    expires: Nanos,
    /// The inner store's time when they were taken (µs).
    taken_at: u64,
    /// The id of the inner store's record of this lease
    /// ([`LeaseStore::check_leasing`]).
    holder: u64,
    /// The units that record holds of the calls this instance sent, once
    /// they apply: what it was told this lease holds.
    recorded: u64,
    last: Decision,
}

#[derive(Debug, Default)]
struct Counters {
    local_decisions: AtomicU64,
    inner_checks: AtomicU64,
    units_leased: AtomicU64,
    units_returned: AtomicU64,
    returns: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What an instance holds and is asking for, by budget ([`budget`]).
#[derive(Debug, Default)]
struct Book {
    held: HashMap<String, Lease>,
    /// Extra units asked of the inner store by checks still awaiting it.
    /// They count against `max_lease` with those held: sized under the lock
    /// but kept after the await, k concurrent misses of one key otherwise
    /// each sized their extra against the same holding, and held k ×
    /// `max_lease` (issue 39: 245–326 units held under a cap of 50).
    asked: HashMap<String, u64>,
}

impl Book {
    fn unask(&mut self, id: &str, units: u64) {
        if let Some(asked) = self.asked.get_mut(id) {
            *asked = asked.saturating_sub(units);
            if *asked == 0 {
                self.asked.remove(id);
            }
        }
    }
}

/// The extras a check asked for, counted in [`Book::asked`] until it keeps
/// them ([`Shared::keep`]) or ends otherwise (denied or failed).
struct Asked<S> {
    shared: Arc<Shared<S>>,
    /// The record the extras go to.
    holder: u64,
    ids: SmallVec<[String; 4]>,
    extras: SmallVec<[u64; 4]>,
    /// Per limit, how the call changes the inner store's record (`None`:
    /// no extra asked).
    leased: SmallVec<[Option<Leased>; 4]>,
}

impl<S> Drop for Asked<S> {
    fn drop(&mut self) {
        if self.extras.iter().all(|&e| e == 0) {
            return;
        }
        let mut book = self.shared.leases.lock();
        for (id, &extra) in self.ids.iter().zip(&self.extras) {
            book.unask(id, extra);
        }
    }
}

struct Shared<S> {
    inner: S,
    /// The id of the inner store's record that new leases go to. A new
    /// one after a leasing call failed: that call may still have taken
    /// its units into the record, which this instance then never refreshes
    /// again, so that they are credited back at its deadline.
    holder: AtomicU64,
    /// Where new ids come from: random per instance (a restarted instance
    /// is another holder), then a sequence.
    ids: std::hash::RandomState,
    next_id: AtomicU64,
    config: HybridConfig,
    clock: Arc<dyn Clock>,
    leases: Mutex<Book>,
    counters: Counters,
}

/// A [`Store`] over `S` that leases slices of hot keys' budgets and spends
/// them locally; see the module documentation for the overshoot bound.
pub struct Hybrid<S> {
    shared: Arc<Shared<S>>,
    returner: JoinHandle<()>,
}

impl<S> std::fmt::Debug for Hybrid<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hybrid")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl<S> Drop for Hybrid<S> {
    fn drop(&mut self) {
        self.returner.abort();
    }
}

/// Whether [`Hybrid`] leases units of this algorithm (the others always go to
/// the inner store).
pub fn hybrid_leases(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket | Algorithm::FixedWindow
    )
}

impl<S: LeaseStore + 'static> Hybrid<S> {
    /// Wraps `inner`, with leases timed on a monotonic clock. Starts a task on
    /// the current tokio runtime that returns expired leases every
    /// `lease_ttl / 2`; it stops when this is dropped.
    pub fn new(inner: S, config: HybridConfig) -> Self {
        Self::with_clock(inner, config, Arc::new(FastClock::new()))
    }

    /// [`Hybrid::new`] with leases timed on `clock` (for tests and
    /// simulations, the clock the inner store was given).
    pub fn with_clock(inner: S, config: HybridConfig, clock: Arc<dyn Clock>) -> Self {
        let shared = Arc::new(Shared {
            inner,
            holder: AtomicU64::new(0),
            ids: std::hash::RandomState::new(),
            next_id: AtomicU64::new(0),
            config,
            clock,
            leases: Mutex::new(Book::default()),
            counters: Counters::default(),
        });
        shared.holder.store(shared.new_id(), Ordering::Relaxed);
        let weak: Weak<Shared<S>> = Arc::downgrade(&shared);
        let every = (shared.config.lease_ttl / 2).max(Duration::from_millis(10));
        let returner = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                shared.return_expired().await;
            }
        });
        Self { shared, returner }
    }
}

impl<S: LeaseStore + 'static> Hybrid<S> {
    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.shared.inner
    }

    /// The counters.
    pub fn stats(&self) -> HybridStats {
        let c = &self.shared.counters;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HybridStats {
            local_decisions: get(&c.local_decisions),
            inner_checks: get(&c.inner_checks),
            units_leased: get(&c.units_leased),
            units_returned: get(&c.units_returned),
            returns: get(&c.returns),
        }
    }

    /// Units this instance holds unspent, over all keys.
    pub fn held_units(&self) -> u64 {
        self.shared
            .leases
            .lock()
            .held
            .values()
            .map(|l| l.units)
            .sum()
    }

    /// Gives back the unspent units of every expired lease (and forgets the
    /// leases). The background task calls it; tests on an injected clock call
    /// it after moving the clock.
    pub async fn return_expired(&self) {
        self.shared.return_expired().await;
    }

    /// Gives back every lease's unspent units now (e.g. at shutdown).
    pub async fn flush(&self) {
        self.shared.give_back(|_, _| true).await;
    }

    /// Checks `limits`: locally from leases when possible, else through the
    /// inner store, taking a lease on the way; see [`LeaseStore::check_stamped`].
    pub async fn check_limits(&self, limits: &[Limit<'_>]) -> Result<Stamped, StoreError> {
        self.shared.check(limits).await
    }
}

/// A request's limits, owned: for a task that outlives the check that
/// made it.
struct Owned {
    keys: SmallVec<[String; 4]>,
    /// The limits, their keys left out.
    limits: SmallVec<[Limit<'static>; 4]>,
}

impl Owned {
    fn of(limits: &[Limit<'_>]) -> Self {
        Self {
            keys: limits.iter().map(|l| l.key.to_owned()).collect(),
            limits: limits.iter().map(|l| Limit { key: "", ..*l }).collect(),
        }
    }

    fn limits(&self) -> SmallVec<[Limit<'_>; 4]> {
        self.limits
            .iter()
            .zip(&self.keys)
            .map(|(l, key)| Limit { key, ..*l })
            .collect()
    }
}

impl<S: LeaseStore + 'static> Shared<S> {
    /// A record id of its own: below 2^52, as the store requires.
    fn new_id(&self) -> u64 {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        std::hash::BuildHasher::hash_one(&self.ids, n) >> 12
    }

    fn max_lease(&self, limit: &Limit<'_>) -> u64 {
        let part = limit.capacity() as f64 * self.config.max_lease_fraction;
        (part as u64).max(1)
    }

    /// All-or-nothing from local leases, if every limit has enough.
    fn try_local(&self, limits: &[Limit<'_>], now: Nanos) -> Option<Outcome> {
        if limits.is_empty() || !limits.iter().all(|l| hybrid_leases(l.algorithm)) {
            return None;
        }
        let ids: SmallVec<[String; 4]> = limits.iter().map(budget).collect();
        let leases = &mut self.leases.lock().held;
        // What the request takes from each key (a key may appear twice).
        let mut need: SmallVec<[(usize, u64); 4]> = SmallVec::new();
        for (i, limit) in limits.iter().enumerate() {
            match need.iter_mut().find(|(j, _)| ids[*j] == ids[i]) {
                Some((_, n)) => *n = n.checked_add(limit.cost)?,
                None => need.push((i, limit.cost)),
            }
        }
        for &(i, n) in &need {
            let lease = leases.get(&ids[i])?;
            if lease.expires <= now || lease.units < n || lease.quota != limits[i].quota {
                return None;
            }
        }
        for &(i, n) in &need {
            if let Some(lease) = leases.get_mut(&ids[i]) {
                lease.units -= n;
            }
        }
        let decisions = limits
            .iter()
            .zip(&ids)
            .map(|(limit, id)| {
                let lease = &leases[id];
                // What the inner store last said is left besides, as when
                // the lease was taken: a fallback over this starts from it.
                let remaining = lease
                    .last
                    .remaining()
                    .saturating_add(lease.units)
                    .min(limit.capacity());
                Decision::allow(limit.capacity(), remaining, lease.last.reset_after())
                    .with_delay(lease.last.delay())
            })
            .collect();
        Some(Outcome::new(decisions))
    }

    async fn check(self: &Arc<Self>, limits: &[Limit<'_>]) -> Result<Stamped, StoreError> {
        let now = self.clock.now();
        if let Some(outcome) = self.try_local(limits, now) {
            bump(&self.counters.local_decisions);
            return Ok(Stamped {
                outcome,
                decided_at: None,
            });
        }
        // Leases of these keys that expired (or hold another quota's units,
        // or are recorded where new leases no longer go) go back first, so
        // an instance never holds more than `max_lease`, and a record that
        // may hold units of a call never answered is not kept alive.
        let stale: Vec<String> = {
            let holder = self.holder.load(Ordering::Relaxed);
            let leases = &self.leases.lock().held;
            limits
                .iter()
                .filter_map(|l| {
                    let id = budget(l);
                    leases
                        .get(&id)
                        .filter(|x| x.expires <= now || x.quota != l.quota || x.holder != holder)
                        .map(|_| id)
                })
                .collect()
        };
        if !stale.is_empty() {
            self.give_back(|id, _| stale.iter().any(|s| s == id)).await;
        }
        // Ask for a lease on every leased limit, sized by its key's history,
        // topping up to at most `max_lease` held or asked for.
        let ask = self.ask(limits);
        if ask.extras.iter().any(|&e| e > 0) {
            let leased = if self.inner.decides_at_once() {
                // Ready at its first poll: never left mid-call.
                self.lease(limits, ask, now).await?
            } else {
                // To completion in a task of its own: the inner store takes
                // the units whether or not this check is still awaited (a
                // fallback's timeout drops it), and they are best kept as
                // a lease (else they wait for the record's deadline).
                let owned = Owned::of(limits);
                let shared = Arc::clone(self);
                let task =
                    tokio::spawn(async move { shared.lease(&owned.limits(), ask, now).await });
                match task.await {
                    Ok(leased) => leased?,
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(e) => {
                        return Err(StoreError::Backend {
                            source: e.into(),
                            retryable: false,
                        });
                    }
                }
            };
            if let Some(stamped) = leased {
                return Ok(stamped);
            }
        } else {
            drop(ask);
        }
        bump(&self.counters.inner_checks);
        self.inner.check_stamped(limits).await
    }

    /// Checks each of `limits` on its own, as [`Shared::check`] of it alone
    /// would: a limit of an algorithm this wrapper leases goes that way,
    /// and the others, which a check alone sends straight to the inner
    /// store, go to it in one call.
    async fn check_each(
        self: &Arc<Self>,
        limits: &[Limit<'_>],
    ) -> Vec<Result<Stamped, StoreError>> {
        let (leasing, direct): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) =
            (0..limits.len()).partition(|&i| hybrid_leases(limits[i].algorithm));
        let direct_limits: SmallVec<[Limit<'_>; 4]> = direct.iter().map(|&i| limits[i]).collect();
        let ask_direct = async {
            if direct_limits.is_empty() {
                return Vec::new();
            }
            self.counters
                .inner_checks
                .fetch_add(direct_limits.len() as u64, Ordering::Relaxed);
            self.inner.check_each_stamped(&direct_limits).await
        };
        let ask_leasing = futures_util::future::join_all(
            leasing
                .iter()
                .map(|&i| self.check(std::slice::from_ref(&limits[i]))),
        );
        let (direct_answers, leasing_answers) =
            futures_util::future::join(ask_direct, ask_leasing).await;
        let mut answers: Vec<Option<Result<Stamped, StoreError>>> =
            (0..limits.len()).map(|_| None).collect();
        for (i, answer) in leasing.iter().zip(leasing_answers) {
            answers[*i] = Some(answer);
        }
        let mut direct_answers = direct_answers.into_iter();
        for &i in &direct {
            answers[i] = Some(direct_answers.next().unwrap_or_else(|| Err(unanswered())));
        }
        answers
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Err(unanswered())))
            .collect()
    }

    /// Checks `limits` with the extra units `ask` sized, and keeps them as
    /// leases if the inner store admits: `None` when it denies (the caller
    /// then checks the cost alone).
    async fn lease(
        &self,
        limits: &[Limit<'_>],
        ask: Asked<S>,
        now: Nanos,
    ) -> Result<Option<Stamped>, StoreError> {
        let asked: SmallVec<[Limit<'_>; 4]> = limits
            .iter()
            .zip(&ask.extras)
            .map(|(l, &e)| Limit {
                cost: l.cost.saturating_add(e),
                ..*l
            })
            .collect();
        bump(&self.counters.inner_checks);
        let holder = Holder {
            id: ask.holder,
            ttl: 2 * self.config.lease_ttl,
        };
        let mut stamped = match self.inner.check_leasing(&asked, holder, &ask.leased).await {
            Ok(stamped) => stamped,
            Err(e) => {
                // The store may have taken the units and recorded them
                // (a round trip past the store's timeout): that record
                // gets no new lease, so they are credited back at its
                // deadline (issue 39: once overwritten, and lost).
                let fresh = self.new_id();
                let _ = self.holder.compare_exchange(
                    ask.holder,
                    fresh,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                return Err(e);
            }
        };
        if !stamped.outcome.allowed() {
            return Ok(None);
        }
        if let Some(times) = &stamped.decided_at {
            let strays = self.keep(limits, ask, times, &mut stamped.outcome, now);
            for (i, extra, taken_at) in strays {
                let limit = Limit {
                    cost: extra,
                    ..limits[i]
                };
                let change = Leased {
                    released: extra,
                    leased: 0,
                };
                let holder = Holder {
                    id: holder.id,
                    ttl: self.config.lease_ttl,
                };
                if let Err(e) = self
                    .inner
                    .give_back(&limit, taken_at, Some((holder, change)))
                    .await
                {
                    tracing::debug!(error = %e, "leased units not kept nor given back; their record's deadline credits them");
                }
            }
        }
        Ok(Some(stamped))
    }

    /// The extra units to ask for with `limits`, each sized by its key's
    /// history and topped up to at most `max_lease` held or asked for,
    /// counted as asked for until the check ends.
    fn ask(self: &Arc<Self>, limits: &[Limit<'_>]) -> Asked<S> {
        let ids: SmallVec<[String; 4]> = limits.iter().map(budget).collect();
        let holder = self.holder.load(Ordering::Relaxed);
        let mut book = self.leases.lock();
        let mut leased = SmallVec::new();
        let extras = limits
            .iter()
            .zip(&ids)
            .map(|(l, id)| {
                leased.push(None);
                if !hybrid_leases(l.algorithm) || l.cost == 0 {
                    return 0;
                }
                let (size, held) = book
                    .held
                    .get(id)
                    .map_or((1, 0), |lease| (lease.size, lease.units));
                let taken = held.saturating_add(book.asked.get(id).copied().unwrap_or(0));
                let extra = size
                    .min(self.max_lease(l).saturating_sub(taken))
                    .min(l.capacity().saturating_sub(l.cost));
                if extra > 0 {
                    *book.asked.entry(id.clone()).or_default() += extra;
                    // What was spent since the record was last told goes
                    // with this call, counted as told at once: a call sent
                    // meanwhile must not tell it again.
                    let released = match book.held.get_mut(id) {
                        Some(lease) if lease.holder == holder => {
                            let spent = lease.recorded.saturating_sub(lease.units);
                            lease.recorded = lease.units;
                            spent
                        }
                        _ => 0,
                    };
                    *leased.last_mut().expect("pushed") = Some(Leased {
                        released,
                        leased: extra,
                    });
                }
                extra
            })
            .collect();
        Asked {
            shared: Arc::clone(self),
            holder,
            ids,
            extras,
            leased,
        }
    }

    /// Keeps the extras of an admitted check as leases. Returns those it
    /// cannot keep, to give back (limit index, units, time taken): a lease
    /// of the key recorded elsewhere was taken meanwhile.
    fn keep(
        &self,
        limits: &[Limit<'_>],
        mut asked: Asked<S>,
        times: &[u64],
        outcome: &mut Outcome,
        now: Nanos,
    ) -> SmallVec<[(usize, u64, u64); 1]> {
        let ttl = self.config.lease_ttl.into_nanos();
        let mut strays = SmallVec::new();
        let mut book = self.leases.lock();
        let extras = std::mem::take(&mut asked.extras);
        for (i, (((limit, &extra), &taken_at), decision)) in limits
            .iter()
            .zip(&extras)
            .zip(times)
            .zip(outcome.decisions.iter_mut())
            .enumerate()
        {
            if extra == 0 {
                continue;
            }
            let id = budget(limit);
            book.unask(&id, extra);
            let leases = &mut book.held;
            if leases.get(&id).is_some_and(|l| l.holder != asked.holder) {
                strays.push((i, extra, taken_at));
                continue;
            }
            self.counters
                .units_leased
                .fetch_add(extra, Ordering::Relaxed);
            // A fixed window's units are void once its window ends.
            let mut life = ttl;
            if limit.algorithm == Algorithm::FixedWindow {
                let period_us = limit.quota.period_ns().div_ceil(1000).max(1);
                let left_us = period_us - taken_at % period_us;
                life = life.min(left_us.saturating_mul(1000));
            }
            let max = self.max_lease(limit);
            let lease = leases.entry(id).or_insert_with(|| Lease {
                key: limit.key.to_owned(),
                quota: limit.quota,
                algorithm: limit.algorithm,
                units: 0,
                size: 1,
                expires: 0,
                taken_at,
                holder: asked.holder,
                recorded: 0,
                last: *decision,
            });
            // A live lease that ran short: the key is hot, grow the next one.
            lease.size = if lease.expires > now {
                lease.size.saturating_mul(2).min(max)
            } else {
                lease.size.clamp(1, max)
            };
            lease.units = lease.units.saturating_add(extra);
            lease.recorded = lease.recorded.saturating_add(extra);
            lease.expires = now.saturating_add(life);
            lease.taken_at = taken_at;
            lease.quota = limit.quota;
            lease.last = *decision;
            // The instance's view: what it holds counts as available to it.
            *decision = decision.with_remaining(decision.remaining().saturating_add(lease.units));
        }
        strays
    }

    async fn return_expired(&self) {
        let now = self.clock.now();
        self.give_back(|_, lease| lease.expires <= now).await;
        self.report(now).await;
    }

    /// Tells the inner store's records what this instance spent of each
    /// live lease since it last told, so that if it crashes, what comes
    /// back is what it held then, not what it held when leasing.
    async fn report(&self, now: Nanos) {
        let due: Vec<(Lease, u64)> = self
            .leases
            .lock()
            .held
            .values_mut()
            .filter(|l| l.expires > now && l.units < l.recorded)
            .map(|l| {
                // Counted as told at once: a call sent meanwhile must not
                // tell it again. Told and lost, the record holds these
                // spent units until its deadline, then credits them back:
                // generous by at most a lease, never short.
                let spent = l.recorded - l.units;
                l.recorded = l.units;
                let copy = Lease {
                    key: l.key.clone(),
                    ..*l
                };
                (copy, spent)
            })
            .collect();
        for (lease, spent) in due {
            let limit = Limit {
                key: &lease.key,
                quota: lease.quota,
                algorithm: lease.algorithm,
                cost: 0,
                failure: FailurePolicy::Local,
            };
            let change = Leased {
                released: spent,
                leased: 0,
            };
            // The record lasts as the lease does, plus the time a live
            // instance takes to give it back.
            let holder = Holder {
                id: lease.holder,
                ttl: Duration::from_nanos(lease.expires - now) + self.config.lease_ttl,
            };
            if let Err(e) = self
                .inner
                .check_leasing(&[limit], holder, &[Some(change)])
                .await
            {
                tracing::debug!(error = %e, "leased units spent not reported");
            }
        }
    }

    async fn give_back(&self, due: impl Fn(&str, &Lease) -> bool) {
        let taken: Vec<Lease> = {
            let leases = &mut self.leases.lock().held;
            let ids: Vec<String> = leases
                .iter()
                .filter(|(id, l)| due(id, l))
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter()
                .filter_map(|id| leases.remove(&id))
                .collect()
        };
        for lease in taken {
            // The record loses what was spent since it was told too, else
            // those units would be credited back.
            if lease.units == 0 && lease.recorded == 0 {
                continue;
            }
            let limit = Limit {
                key: &lease.key,
                quota: lease.quota,
                algorithm: lease.algorithm,
                cost: lease.units,
                failure: FailurePolicy::Local,
            };
            let holder = Holder {
                id: lease.holder,
                ttl: self.config.lease_ttl,
            };
            let change = Leased {
                released: lease.recorded,
                leased: 0,
            };
            match self
                .inner
                .give_back(&limit, lease.taken_at, Some((holder, change)))
                .await
            {
                Ok(()) => {
                    bump(&self.counters.returns);
                    self.counters
                        .units_returned
                        .fetch_add(lease.units, Ordering::Relaxed);
                }
                // Not given back now, the units stay in the record, which
                // credits them back at its deadline.
                Err(e) => tracing::debug!(error = %e, "unspent leased units not given back"),
            }
        }
    }
}

impl<S: LeaseStore + 'static> Store for Hybrid<S> {
    fn supports(&self, algorithm: Algorithm, quota: &Quota) -> Result<(), StoreError> {
        self.inner().supports(algorithm, quota)
    }

    async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        Ok(self.shared.check(limits).await?.outcome)
    }

    async fn check_each(&self, limits: &[Limit<'_>]) -> Vec<Result<Outcome, StoreError>> {
        outcomes(self.shared.check_each(limits).await)
    }

    fn release(
        &self,
        leases: &[tollgate_core::Lease],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        // Concurrency is never leased here: every lease is the inner store's.
        self.shared.inner.release(leases)
    }

    fn ready(&self) -> impl Future<Output = bool> + Send {
        self.shared.inner.ready()
    }

    fn domain(&self, key: &str) -> Option<std::sync::Arc<str>> {
        self.shared.inner.domain(key)
    }

    fn domain_ready(&self, domain: &str) -> impl Future<Output = bool> + Send {
        self.shared.inner.domain_ready(domain)
    }

    /// Drops the leases of these limits unspent (they were taken from the
    /// state being forgotten) and resets the inner store.
    fn reset(&self, limits: &[Limit<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        {
            let leases = &mut self.shared.leases.lock().held;
            for limit in limits {
                leases.remove(&budget(limit));
            }
        }
        self.shared.inner.reset(limits)
    }
}

impl<S: LeaseStore + 'static> LeaseStore for Hybrid<S> {
    fn check_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Stamped, StoreError>> + Send {
        self.shared.check(limits)
    }

    /// The unspent units of this instance's live lease of `limit`'s key.
    fn leased(&self, limit: &Limit<'_>) -> u64 {
        let now = self.shared.clock.now();
        self.shared
            .leases
            .lock()
            .held
            .get(&budget(limit))
            .filter(|l| l.expires > now && l.quota == limit.quota)
            .map_or(0, |l| l.units)
    }

    fn check_each_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Vec<Result<Stamped, StoreError>>> + Send {
        self.shared.check_each(limits)
    }

    fn give_back(
        &self,
        limit: &Limit<'_>,
        taken_at: u64,
        holder: Option<(Holder, Leased)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.shared.inner.give_back(limit, taken_at, holder)
    }
}
