//! The local deny cache (Cloudflare's "mitigation flag").
//!
//! When Redis denies a limit with `retry_after = d`, the limit's key is
//! remembered with the instant `sent + d`, where `sent` is the local time just
//! before the request was sent (the script ran after it, so this instant is
//! never later than the one Redis meant). Until then a request that contains a
//! limit with the **same key, algorithm and quota** and a **cost at least the
//! denied cost** is denied locally, without a Redis call: "the same request"
//! cannot pass before `retry_after`, and a dearer one cannot either, for every
//! algorithm whose `retry_after` is exact (all but the concurrency limiter, whose
//! permits return when other requests end; it is never cached). A deny with no
//! `retry_after` (a cost above the capacity) is not cached.
//!
//! What could make the cached answer wrong only ever makes it too strict, for
//! at most `d`: another instance's admissions only push the retry later, while a
//! cross-slot refund by another request could bring it earlier (refunds by this
//! store forget the keys they touch).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use parking_lot::Mutex;
use tollgate_core::{Algorithm, Decision, Limit, Nanos, Quota};

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

#[derive(Debug)]
pub(crate) struct DenyCache {
    shards: Vec<Mutex<HashMap<String, Denied>>>,
    per_shard: usize,
    hasher: RandomState,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Denied>> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    pub(crate) fn enabled(&self) -> bool {
        self.per_shard > 0
    }

    /// The cached deny of `limit` (stored under `key`) at `now`, if one holds.
    pub(crate) fn lookup(&self, key: &str, limit: &Limit<'_>, now: Nanos) -> Option<Decision> {
        if !self.enabled() {
            return None;
        }
        let mut shard = self.shard(key).lock();
        let entry = shard.get(key)?;
        if now >= entry.until {
            shard.remove(key);
            return None;
        }
        if entry.algorithm != limit.algorithm
            || entry.quota != limit.quota
            || limit.cost < entry.cost
        {
            return None;
        }
        let elapsed = Duration::from_nanos(now.saturating_sub(entry.at));
        Some(Decision {
            reset_after: entry.decision.reset_after.saturating_sub(elapsed),
            retry_after: Some(Duration::from_nanos(entry.until - now)),
            ..entry.decision
        })
    }

    /// Remembers a deny that Redis gave for a request sent at `sent`.
    pub(crate) fn insert(&self, key: &str, limit: &Limit<'_>, decision: &Decision, sent: Nanos) {
        let Some(retry) = decision.retry_after else {
            return;
        };
        if !self.enabled() || decision.allowed || limit.algorithm == Algorithm::Concurrency {
            return;
        }
        let until = sent.saturating_add(ns(retry));
        let mut shard = self.shard(key).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(key) {
            shard.retain(|_, e| e.until > sent);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        // Keep the stricter of two denies of the same key.
        if let Some(old) = shard.get(key)
            && old.until >= until
            && old.cost <= limit.cost
            && old.quota == limit.quota
        {
            return;
        }
        shard.insert(
            key.to_owned(),
            Denied {
                algorithm: limit.algorithm,
                quota: limit.quota,
                cost: limit.cost,
                at: sent,
                until,
                decision: *decision,
            },
        );
    }

    pub(crate) fn forget(&self, key: &str) {
        if self.enabled() {
            self.shard(key).lock().remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deny(retry_ms: Option<u64>) -> Decision {
        Decision {
            allowed: false,
            limit: 5,
            remaining: 0,
            reset_after: Duration::from_millis(500),
            retry_after: retry_ms.map(Duration::from_millis),
            delay: Duration::ZERO,
        }
    }

    fn limit(cost: u64) -> Limit<'static> {
        Limit {
            key: "k",
            quota: Quota::per_second(5).unwrap(),
            algorithm: Algorithm::Gcra,
            cost,
            failure: tollgate_core::FailurePolicy::Local,
        }
    }

    #[test]
    fn answers_only_the_same_limit_at_the_same_or_a_higher_cost_until_retry() {
        let cache = DenyCache::new(100);
        let ms = 1_000_000;
        cache.insert("k", &limit(2), &deny(Some(100)), 1000 * ms);
        let hit = cache.lookup("k", &limit(2), 1040 * ms).unwrap();
        assert_eq!(hit.retry_after, Some(Duration::from_millis(60)));
        assert_eq!(hit.reset_after, Duration::from_millis(460));
        assert!(cache.lookup("k", &limit(3), 1040 * ms).is_some());
        assert!(cache.lookup("k", &limit(1), 1040 * ms).is_none(), "cheaper");
        let other_quota = Limit {
            quota: Quota::per_second(6).unwrap(),
            ..limit(2)
        };
        assert!(cache.lookup("k", &other_quota, 1040 * ms).is_none());
        assert!(cache.lookup("k", &limit(2), 1100 * ms).is_none(), "expired");
        assert!(
            cache.lookup("k", &limit(2), 1050 * ms).is_none(),
            "and gone"
        );
    }

    #[test]
    fn never_caches_permanent_or_concurrency_denies_and_stays_bounded() {
        let cache = DenyCache::new(16);
        cache.insert("k", &limit(9), &deny(None), 0);
        assert!(cache.lookup("k", &limit(9), 1).is_none());
        let slots = Limit {
            algorithm: Algorithm::Concurrency,
            ..limit(1)
        };
        cache.insert("c", &slots, &deny(Some(100)), 0);
        assert!(cache.lookup("c", &slots, 1).is_none());
        for i in 0..1000 {
            cache.insert(&format!("k{i}"), &limit(1), &deny(Some(100)), 0);
        }
        let held: usize = cache.shards.iter().map(|s| s.lock().len()).sum();
        assert!(held <= 16, "{held}");
        assert!(!DenyCache::new(0).enabled());
    }
}
