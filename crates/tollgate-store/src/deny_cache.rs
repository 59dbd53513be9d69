//! The deny cache (Cloudflare's "mitigation flag"): a [`Store`] over another
//! that answers keys its inner store just denied, without asking it again.
//!
//! When the store that holds the state denies a limit with `retry_after = d`
//! (a decision stamped with its time, [`Stamped::decided_at`]; a fallback's
//! decisions are not), the limit's key is remembered with the instant `sent + d`, where `sent` is the local time
//! just before the request was sent (the inner store decided after it, so this
//! instant is never later than the one it meant). Until then a request that
//! contains a limit with the **same key, algorithm and quota** and a **cost at
//! least the denied cost** is denied locally: "the same request" cannot pass
//! before `retry_after`, and a dearer one cannot either, for every algorithm
//! whose `retry_after` is exact (all but the concurrency limiter, whose permits
//! return when other requests end; it is never cached). A deny with no
//! `retry_after` (a cost above the capacity) is not cached. The request's other
//! limits were not asked: they report their whole capacity, unconsumed.
//!
//! What could make the cached answer wrong only ever makes it too strict, for
//! at most `d`: another instance's admissions only push the retry later, while
//! a refund by another request could bring it earlier (units given back
//! through this wrapper forget their key).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;
use tollgate_core::IntoNanos;
use tollgate_core::{
    Algorithm, Clock, Decision, Holder, Lease, LeaseStore, Leased, Limit, Nanos, Outcome, Quota,
    Stamped, Store, StoreError,
};

use crate::FastClock;
use crate::decision::{budget, outcomes, unanswered};

const SHARDS: usize = 16;

#[derive(Debug, Clone)]
struct Denied {
    algorithm: Algorithm,
    quota: Quota,
    cost: u64,
    at: Nanos,
    until: Nanos,
    decision: Decision,
}

/// The bounded map of denied keys.
#[derive(Debug)]
struct Denials {
    shards: Vec<Mutex<HashMap<String, Denied>>>,
    per_shard: usize,
    hasher: RandomState,
}

impl Denials {
    fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Denied>> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    fn enabled(&self) -> bool {
        self.per_shard > 0
    }

    /// The cached deny of `limit` at `now`, if one holds, for a request that
    /// takes `cost` from its key in all.
    fn lookup(&self, limit: &Limit<'_>, cost: u64, now: Nanos) -> Option<Decision> {
        let key = budget(limit);
        let mut shard = self.shard(&key).lock();
        let entry = shard.get(&key)?;
        if now >= entry.until {
            shard.remove(&key);
            return None;
        }
        if entry.algorithm != limit.algorithm || entry.quota != limit.quota || cost < entry.cost {
            return None;
        }
        let elapsed = Duration::from_nanos(now.saturating_sub(entry.at));
        Some(
            entry
                .decision
                .with_reset_after(entry.decision.reset_after().saturating_sub(elapsed))
                .with_retry_after(Some(Duration::from_nanos(entry.until - now))),
        )
    }

    /// Remembers a deny that the inner store gave for a request sent at `sent`
    /// that took `cost` from the limit's key in all.
    fn insert(&self, limit: &Limit<'_>, cost: u64, decision: &Decision, sent: Nanos) {
        let Some(retry) = decision.retry_after() else {
            return;
        };
        if decision.allowed() || limit.algorithm == Algorithm::Concurrency {
            return;
        }
        let key = budget(limit);
        let until = sent.saturating_add(retry.into_nanos());
        let mut shard = self.shard(&key).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&key) {
            shard.retain(|_, e| e.until > sent);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        // Keep the stricter of two denies of the same key.
        if let Some(old) = shard.get(&key)
            && old.until >= until
            && old.cost <= cost
            && old.quota == limit.quota
        {
            return;
        }
        shard.insert(
            key,
            Denied {
                algorithm: limit.algorithm,
                quota: limit.quota,
                cost,
                at: sent,
                until,
                decision: *decision,
            },
        );
    }

    fn forget(&self, limit: &Limit<'_>) {
        let key = budget(limit);
        self.shard(&key).lock().remove(&key);
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

/// What the request takes from each limit's key in all: a key used twice in
/// one request is denied for the sum (the second use sees the first), so that
/// is the cost its deny is "the same request" at.
fn totals(limits: &[Limit<'_>]) -> SmallVec<[u64; 4]> {
    limits
        .iter()
        .map(|l| {
            limits
                .iter()
                .filter(|o| o.key == l.key && o.algorithm == l.algorithm)
                .fold(0u64, |sum, o| sum.saturating_add(o.cost))
        })
        .collect()
}

/// The indices of a request's limits the cache does not know.
type Unknown = SmallVec<[usize; 4]>;

/// The deny cache's counters, monotonic since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DenyCacheStats {
    /// Checks answered from the cache, without the inner store.
    pub hits: u64,
    /// Checks passed to the inner store.
    pub misses: u64,
}

/// A [`Store`] over `S` that denies locally, for `retry_after`, what `S` just
/// denied; see the module documentation.
pub struct DenyCache<S> {
    inner: S,
    denials: Denials,
    clock: Arc<dyn Clock>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<S> std::fmt::Debug for DenyCache<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyCache")
            .field("capacity", &(self.denials.per_shard * SHARDS))
            .finish_non_exhaustive()
    }
}

impl<S: LeaseStore> DenyCache<S> {
    /// Caches up to about `capacity` denied keys (0 turns the cache off: every
    /// check goes to `inner`), on a monotonic clock.
    pub fn new(inner: S, capacity: usize) -> Self {
        Self::with_clock(inner, capacity, Arc::new(FastClock::new()))
    }

    /// [`DenyCache::new`] on `clock`: the clock the inner store's `retry_after`
    /// runs on (for tests and simulations, the injected one).
    pub fn with_clock(inner: S, capacity: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner,
            denials: Denials::new(capacity),
            clock,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The counters.
    pub fn stats(&self) -> DenyCacheStats {
        DenyCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Keys cached now, including expired ones not yet dropped.
    pub fn len(&self) -> usize {
        self.denials.len()
    }

    /// Whether no key is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The limits a cached deny answered but did not know (`unknown`: it
    /// charged them nothing) are read from the inner store at cost 0, and
    /// reported as a store reports the admitting limits of a denied check
    /// (what each alone would have left after the request's cost, see
    /// [`Outcome`]) rather than whole; left whole if the read fails. A
    /// request of one limit, the common case, costs no call.
    async fn read_the_others(
        &self,
        limits: &[Limit<'_>],
        unknown: &[usize],
        outcome: &mut Outcome,
    ) {
        if unknown.is_empty() {
            return;
        }
        let reads: SmallVec<[Limit<'_>; 4]> =
            unknown.iter().map(|&i| limits[i].with_cost(0)).collect();
        if let Ok(read) = self.inner.check(&reads).await {
            for (&i, mut decision) in unknown.iter().zip(read.decisions) {
                if decision.allowed() {
                    decision = decision
                        .with_remaining(decision.remaining().saturating_sub(limits[i].cost));
                }
                outcome.decisions[i] = decision;
            }
        }
    }

    /// A deny from the cache when one of the limits is cached as denied,
    /// and the indices of the limits it does not know (reported whole).
    fn cached(&self, limits: &[Limit<'_>], now: Nanos) -> Option<(Outcome, Unknown)> {
        if !self.denials.enabled() || limits.is_empty() {
            return None;
        }
        let hits: SmallVec<[Option<Decision>; 4]> = limits
            .iter()
            .zip(totals(limits))
            .map(|(l, cost)| self.denials.lookup(l, cost, now))
            .collect();
        if hits.iter().all(Option::is_none) {
            return None;
        }
        let unknown = hits
            .iter()
            .enumerate()
            .filter(|(_, hit)| hit.is_none())
            .map(|(i, _)| i)
            .collect();
        let decisions = limits
            .iter()
            .zip(hits)
            .map(|(l, hit)| hit.unwrap_or_else(|| l.untouched()))
            .collect();
        Some((Outcome::new(decisions), unknown))
    }

    /// Checks `limits`; see [`LeaseStore::check_stamped`].
    pub async fn check_limits(&self, limits: &[Limit<'_>]) -> Result<Stamped, StoreError> {
        self.check_through(limits, || self.inner.check_stamped(limits))
            .await
    }

    /// Checks `limits` from the cache, else by `ask`ing the inner store.
    async fn check_through<F>(
        &self,
        limits: &[Limit<'_>],
        ask: impl FnOnce() -> F,
    ) -> Result<Stamped, StoreError>
    where
        F: Future<Output = Result<Stamped, StoreError>>,
    {
        let now = self.clock.now();
        if let Some((mut outcome, unknown)) = self.cached(limits, now) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            self.read_the_others(limits, &unknown, &mut outcome).await;
            return Ok(Stamped {
                outcome,
                decided_at: None,
            });
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let stamped = ask().await?;
        self.remember(limits, &stamped, now);
        Ok(stamped)
    }

    /// Caches the denies of what the inner store answered for `limits`,
    /// asked at `now`.
    fn remember(&self, limits: &[Limit<'_>], stamped: &Stamped, now: Nanos) {
        // Only the state's own denies are cached: a fallback's (`decided_at`
        // is `None`) says nothing about when the limit passes again.
        if self.denials.enabled() && !stamped.outcome.allowed() && stamped.decided_at.is_some() {
            for ((limit, decision), cost) in limits
                .iter()
                .zip(&stamped.outcome.decisions)
                .zip(totals(limits))
            {
                // A limit that counts denied hits closed its window only if
                // its deny was kept, that is when it was checked alone; a
                // cached deny would otherwise answer for hits that close it.
                if limits.len() > 1 && limit.algorithm.counts_denied() {
                    continue;
                }
                self.denials.insert(limit, cost, decision, now);
            }
        }
    }

    /// Checks each of `limits` on its own; see
    /// [`LeaseStore::check_each_stamped`]. Each is answered from the cache
    /// as a check of it alone would be; the others go to the inner store in
    /// one call.
    pub async fn check_each_limits(
        &self,
        limits: &[Limit<'_>],
    ) -> Vec<Result<Stamped, StoreError>> {
        let now = self.clock.now();
        let mut answers: Vec<Option<Result<Stamped, StoreError>>> = limits
            .iter()
            .map(|limit| {
                let (outcome, _) = self.cached(std::slice::from_ref(limit), now)?;
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(Ok(Stamped {
                    outcome,
                    decided_at: None,
                }))
            })
            .collect();
        let asked: SmallVec<[Limit<'_>; 4]> = limits
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(limit, _)| *limit)
            .collect();
        if !asked.is_empty() {
            self.misses.fetch_add(asked.len() as u64, Ordering::Relaxed);
            let mut inner = self.inner.check_each_stamped(&asked).await.into_iter();
            for (limit, answer) in limits.iter().zip(&mut answers) {
                if answer.is_some() {
                    continue;
                }
                let got = inner.next().unwrap_or_else(|| Err(unanswered()));
                if let Ok(stamped) = &got {
                    self.remember(std::slice::from_ref(limit), stamped, now);
                }
                *answer = Some(got);
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.unwrap_or_else(|| Err(unanswered())))
            .collect()
    }
}

impl<S: LeaseStore> Store for DenyCache<S> {
    fn supports(&self, algorithm: Algorithm, quota: &Quota) -> Result<(), StoreError> {
        self.inner.supports(algorithm, quota)
    }

    async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        Ok(self.check_limits(limits).await?.outcome)
    }

    async fn check_each(&self, limits: &[Limit<'_>]) -> Vec<Result<Outcome, StoreError>> {
        outcomes(self.check_each_limits(limits).await)
    }

    /// The cached deny, when the cache knows every limit of the request:
    /// the answer [`Store::check`] gives then, with no call (a limit it
    /// does not know would be read from the inner store).
    fn known(&self, limits: &[Limit<'_>]) -> Option<Outcome> {
        let (outcome, unknown) = self.cached(limits, self.clock.now())?;
        if !unknown.is_empty() {
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(outcome)
    }

    fn release(&self, leases: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.release(leases)
    }

    fn ready(&self) -> impl Future<Output = bool> + Send {
        self.inner.ready()
    }

    fn reset(&self, limits: &[Limit<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        if self.denials.enabled() {
            for limit in limits {
                self.denials.forget(limit);
            }
        }
        self.inner.reset(limits)
    }
}

impl<S: LeaseStore> LeaseStore for DenyCache<S> {
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
        self.check_through(limits, || self.inner.check_leasing(limits, holder, leased))
            .await
    }

    fn leased(&self, limit: &Limit<'_>) -> u64 {
        self.inner.leased(limit)
    }

    fn give_back(
        &self,
        limit: &Limit<'_>,
        taken_at: u64,
        holder: Option<(Holder, Leased)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        if self.denials.enabled() {
            self.denials.forget(limit);
        }
        self.inner.give_back(limit, taken_at, holder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryConfig, MemoryStore};
    use tollgate_core::{FailurePolicy, ManualClock};

    fn deny(retry_ms: Option<u64>) -> Decision {
        Decision::deny(
            5,
            0,
            Duration::from_millis(500),
            retry_ms.map(Duration::from_millis),
        )
    }

    fn limit(cost: u64) -> Limit<'static> {
        Limit {
            key: "k",
            quota: Quota::per_second(5).unwrap(),
            algorithm: Algorithm::Gcra,
            cost,
            failure: FailurePolicy::Local,
        }
    }

    #[test]
    fn answers_only_the_same_limit_at_the_same_or_a_higher_cost_until_retry() {
        let cache = Denials::new(100);
        let ms = 1_000_000;
        cache.insert(&limit(2), 2, &deny(Some(100)), 1000 * ms);
        let hit = cache.lookup(&limit(2), 2, 1040 * ms).unwrap();
        assert_eq!(hit.retry_after(), Some(Duration::from_millis(60)));
        assert_eq!(hit.reset_after(), Duration::from_millis(460));
        assert!(cache.lookup(&limit(3), 3, 1040 * ms).is_some());
        assert!(cache.lookup(&limit(1), 1, 1040 * ms).is_none(), "cheaper");
        let other_quota = Limit {
            quota: Quota::per_second(6).unwrap(),
            ..limit(2)
        };
        assert!(cache.lookup(&other_quota, 2, 1040 * ms).is_none());
        assert!(cache.lookup(&limit(2), 2, 1100 * ms).is_none(), "expired");
        assert!(cache.lookup(&limit(2), 2, 1050 * ms).is_none(), "and gone");
    }

    #[test]
    fn never_caches_permanent_or_concurrency_denies_and_stays_bounded() {
        let cache = Denials::new(16);
        cache.insert(&limit(9), 9, &deny(None), 0);
        assert!(cache.lookup(&limit(9), 9, 1).is_none());
        let slots = Limit {
            algorithm: Algorithm::Concurrency,
            ..limit(1)
        };
        cache.insert(&slots, 1, &deny(Some(100)), 0);
        assert!(cache.lookup(&slots, 1, 1).is_none());
        let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
        for key in &keys {
            cache.insert(&Limit { key, ..limit(1) }, 1, &deny(Some(100)), 0);
        }
        assert!(cache.len() <= 16, "{}", cache.len());
        assert!(!Denials::new(0).enabled());
    }

    /// Limits checked each on its own: the cache answers each as a check
    /// of it alone, and asks the inner store only about the others.
    #[tokio::test]
    async fn limits_checked_each_are_answered_from_the_cache_one_by_one() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let memory = MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(&clock));
        let store = DenyCache::with_clock(memory, 64, Arc::clone(&clock) as _);
        let q = Quota::per_second(10).unwrap().with_burst(1).unwrap();
        let hot = Limit::new("hot", q, Algorithm::Gcra);
        let wide = Limit::new("wide", Quota::per_second(100).unwrap(), Algorithm::Gcra);
        let allowed = |answers: Vec<Result<Outcome, StoreError>>| -> Vec<bool> {
            answers.into_iter().map(|a| a.unwrap().allowed()).collect()
        };
        assert_eq!(allowed(store.check_each(&[hot, wide]).await), [true, true]);
        let denied = store.check_each(&[hot, wide]).await;
        let deny = denied[0].as_ref().unwrap().decisions[0];
        assert_eq!(deny.retry_after(), Some(Duration::from_millis(100)));
        assert_eq!(allowed(denied), [false, true]);
        assert_eq!(store.stats(), DenyCacheStats { hits: 0, misses: 4 });
        let again = store.check_each(&[hot, wide]).await;
        assert_eq!(again[0].as_ref().unwrap().decisions[0], deny);
        assert_eq!(allowed(again), [false, true]);
        assert_eq!(store.stats(), DenyCacheStats { hits: 1, misses: 5 });
        // The inner store was asked about `wide` alone: three admits.
        let wide_left = store.inner().check_now(&[wide.with_cost(0)]).decisions[0];
        assert_eq!(wide_left.remaining(), 100 - 3);
    }

    #[tokio::test]
    async fn a_denied_key_is_answered_locally_until_its_retry_and_the_rest_read() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let memory = MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(&clock));
        let store = DenyCache::with_clock(memory, 64, Arc::clone(&clock) as _);
        let q = Quota::per_second(10).unwrap().with_burst(2).unwrap();
        let hot = Limit::new("hot", q, Algorithm::Gcra);
        let other = Limit::new(
            "other",
            Quota::per_second(100).unwrap(),
            Algorithm::FixedWindow,
        );
        assert!(store.check(&[hot, hot]).await.unwrap().allowed());
        let denied = store.check(&[hot, other]).await.unwrap();
        assert_eq!(
            denied.decisions[0].retry_after(),
            Some(Duration::from_millis(100))
        );
        clock.advance(Duration::from_millis(40));
        let cached = store.check(&[hot, other]).await.unwrap();
        assert!(!cached.allowed());
        assert_eq!(
            cached.decisions[0].retry_after(),
            Some(Duration::from_millis(60))
        );
        // `other` is read, charged nothing, and reported as a denied check's
        // admitting limit is (what it would have left after this request).
        assert_eq!(cached.decisions[1], other.untouched().with_remaining(99));
        assert_eq!(store.stats(), DenyCacheStats { hits: 1, misses: 2 });
        clock.advance(Duration::from_millis(60));
        assert!(store.check(&[hot]).await.unwrap().allowed());
        assert_eq!(store.stats().hits, 1);
        let peek = store.inner().check_now(&[other.with_cost(0)]);
        assert_eq!(
            peek.decisions[0].remaining(),
            100,
            "no deny consumed `other`"
        );
    }

    #[tokio::test]
    async fn what_is_known_is_a_deny_of_every_limit_answered_without_the_inner_store() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let memory = MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(&clock));
        let store = DenyCache::with_clock(memory, 64, Arc::clone(&clock) as _);
        let hot = Limit::new(
            "hot",
            Quota::per_second(10).unwrap().with_burst(1).unwrap(),
            Algorithm::Gcra,
        );
        let other = Limit::new("other", Quota::per_second(100).unwrap(), Algorithm::Gcra);
        assert_eq!(store.known(&[hot]), None, "nothing denied yet");
        assert!(store.check(&[hot]).await.unwrap().allowed());
        assert!(!store.check(&[hot]).await.unwrap().allowed());
        clock.advance(Duration::from_millis(40));
        let known = store.known(&[hot]).expect("a deny the cache holds");
        assert_eq!(
            known,
            store.check(&[hot]).await.unwrap(),
            "what a check answers"
        );
        assert_eq!(store.stats(), DenyCacheStats { hits: 2, misses: 2 });
        // A limit it does not know would be read from the inner store.
        assert_eq!(store.known(&[hot, other]), None);
        assert_eq!(store.known(&[hot.with_cost(0)]), None, "a read is no deny");
        clock.advance(Duration::from_millis(60));
        assert_eq!(store.known(&[hot]), None, "its retry has come");
    }

    #[tokio::test]
    async fn regression_a_key_denied_twice_in_one_request_is_cached_at_the_sum_of_its_costs() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let memory = MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(&clock));
        let store = DenyCache::with_clock(memory, 64, Arc::clone(&clock) as _);
        let one = Limit::new(
            "k",
            Quota::per_second(10).unwrap().with_burst(1).unwrap(),
            Algorithm::Gcra,
        );
        // The second use of the key is denied, with the wait of two units.
        assert!(!store.check(&[one, one]).await.unwrap().allowed());
        // One unit alone passes: a deny of two is not a deny of one.
        assert!(store.check(&[one]).await.unwrap().allowed());
        assert_eq!(store.stats().hits, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fallback_deny_is_not_cached() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let memory = MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(&clock));
        // A fallback over a store that can never be reached: every decision
        // is the failure policy's.
        let config = crate::FallbackConfig {
            breaker_failures: 1,
            ..crate::FallbackConfig::default()
        };
        let down = crate::Fallback::with_clock(Unreachable, config, Arc::clone(&clock) as _);
        let store = DenyCache::with_clock(down, 64, Arc::clone(&clock) as _);
        let closed = Limit::new("k", Quota::per_second(5).unwrap(), Algorithm::Gcra)
            .with_failure(FailurePolicy::FailClosed);
        for _ in 0..3 {
            assert!(!store.check(&[closed]).await.unwrap().allowed());
        }
        assert_eq!(store.stats().hits, 0);
        assert_eq!(store.inner().stats().fallback_fail_closed, 3);
        // The memory store's denies, stamped, are.
        let cached = DenyCache::with_clock(memory, 64, Arc::clone(&clock) as _);
        let one = Limit::new("k", Quota::per_second(1).unwrap(), Algorithm::Gcra);
        assert!(cached.check(&[one]).await.unwrap().allowed());
        assert!(!cached.check(&[one]).await.unwrap().allowed());
        assert!(!cached.check(&[one]).await.unwrap().allowed());
        assert_eq!(cached.stats().hits, 1);
    }

    /// A store with no state it can reach.
    struct Unreachable;

    impl Store for Unreachable {
        async fn check(&self, _: &[Limit<'_>]) -> Result<Outcome, StoreError> {
            Err(StoreError::Backend {
                source: "unreachable".into(),
                retryable: true,
            })
        }

        async fn release(&self, _: &[Lease]) -> Result<(), StoreError> {
            Ok(())
        }

        async fn ready(&self) -> bool {
            false
        }
    }

    impl LeaseStore for Unreachable {}
}
