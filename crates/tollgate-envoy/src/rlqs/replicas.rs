//! One fleet across Tollgate replicas: each bucket's [`Shared`] share-out
//! kept whole in a Redis cell, read, changed by the report and written back
//! by compare-and-set, so that every replica's Envoys report into one
//! state. Two round trips per bucket per report (Envoy reports every 5 s),
//! never per request.
//!
//! A member is a stream, numbered from a random start per replica so that
//! two replicas' numbers do not meet. A replica that dies leaves its
//! members behind; they expire with their grants, as any silent Envoy's
//! do, and what they held counts as spent ([`Shared::prune`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use parking_lot::Mutex;
use tollgate_core::{Nanos, StoreError};
use tollgate_redis::Cells;

use super::fleet::{Answer, BucketStats, Rule, Shared, StreamId, Usage};

/// Writes that lose to another replica's are tried again this many times,
/// each after a random pause of up to twice the one before (from
/// [`FIRST_PAUSE`] to [`LONGEST_PAUSE`]), so that writers that collided
/// spread out: at most about 2 s in all, and a report is no request.
const ATTEMPTS: u32 = 24;
const FIRST_PAUSE: Duration = Duration::from_micros(200);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// The share-out of every bucket, in Redis.
pub(crate) struct Replicated {
    cells: Cells,
    /// Each bucket's state as this replica last wrote it with a report:
    /// what its metrics show.
    seen: Mutex<Seen>,
}

struct Seen {
    buckets: HashMap<String, Shared>,
    /// When buckets nobody holds a share of were last dropped.
    pruned: Nanos,
}

impl Seen {
    /// Drops the grants expired at `now`, and the buckets left without any.
    fn prune(&mut self, now: Nanos) {
        self.pruned = now;
        self.buckets.retain(|_, shared| {
            shared.prune(now);
            shared.has_members()
        });
    }
}

impl Replicated {
    pub(crate) fn new(cells: Cells) -> Self {
        Self {
            cells,
            seen: Mutex::new(Seen {
                buckets: HashMap::new(),
                pruned: 0,
            }),
        }
    }

    /// See [`super::Fleet::report`].
    pub(crate) async fn report(
        &self,
        stream: StreamId,
        key: &str,
        rule: &Rule,
        usage: Usage,
        now: Nanos,
    ) -> Result<Answer, StoreError> {
        let (answer, shared) = self
            .update(key, now, |shared| {
                Some(
                    shared
                        .get_or_insert_with(|| Shared::new(rule, now))
                        .report(stream, rule, usage, now),
                )
            })
            .await?
            .expect("a report always writes");
        let mut seen = self.seen.lock();
        seen.buckets.insert(key.to_owned(), shared);
        // Without scrapes, buckets nobody reports for any more would stay;
        // looked for at most once a second, since it visits every bucket.
        if now.saturating_sub(seen.pruned) >= 1_000_000_000 {
            seen.prune(now);
        }
        Ok(answer)
    }

    /// See [`super::Fleet::leave`], for the buckets `stream` reported.
    pub(crate) async fn leave(
        &self,
        stream: StreamId,
        keys: impl IntoIterator<Item = String>,
        now: Nanos,
    ) -> Result<(), StoreError> {
        for key in keys {
            self.update(&key, now, |shared| {
                shared
                    .as_mut()
                    .is_some_and(|s| s.leave(stream))
                    .then_some(())
            })
            .await?;
        }
        Ok(())
    }

    /// The buckets this replica's Envoys report for, as last seen, with
    /// the grants expired at `now` left out.
    pub(crate) fn stats(&self, now: Nanos) -> Vec<BucketStats> {
        let mut seen = self.seen.lock();
        seen.prune(now);
        seen.buckets.values().map(Shared::stats).collect()
    }

    /// Applies `change` to the bucket `key`'s state (`None` if it has
    /// none) and writes it back, unless `change` answers `None`.
    async fn update<T>(
        &self,
        key: &str,
        now: Nanos,
        mut change: impl FnMut(&mut Option<Shared>) -> Option<T>,
    ) -> Result<Option<(T, Shared)>, StoreError> {
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(pause(attempt)).await;
            }
            let cell = self.cells.get(key).await?;
            let mut shared = match &cell {
                Some(cell) => Some(serde_json::from_slice(&cell.value).map_err(|e| {
                    StoreError::Invalid(format!(
                        "the quota state of bucket {key:?} in Redis is not Tollgate's: {e}"
                    ))
                })?),
                None => None,
            };
            let Some(out) = change(&mut shared) else {
                return Ok(None);
            };
            let shared = shared.expect("changed into a state");
            let value = serde_json::to_vec(&shared).expect("plain data serializes");
            let read = cell.map(|c| c.version);
            if self.cells.put(key, read, &value, shared.keep(now)).await? {
                return Ok(Some((out, shared)));
            }
        }
        Err(StoreError::Backend {
            source: format!("bucket {key:?}: {ATTEMPTS} writes in a row lost to other replicas")
                .into(),
            retryable: true,
        })
    }
}

/// A random pause before the `attempt`th try (from 1).
fn pause(attempt: u32) -> Duration {
    let most = FIRST_PAUSE
        .saturating_mul(1 << attempt.min(16))
        .min(LONGEST_PAUSE);
    let most_us = u64::try_from(most.as_micros()).unwrap_or(u64::MAX).max(1);
    // A fresh `RandomState` has fresh keys: a random number, no crate needed.
    Duration::from_micros(RandomState::new().hash_one(attempt) % most_us)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tollgate_redis::{RedisConfig, RedisStore};
    use tollgate_testkit::RedisServer;

    use super::*;
    use crate::rlqs::Plan;

    async fn replica(url: &str) -> Arc<Replicated> {
        let store = RedisStore::connect(url, RedisConfig::default())
            .await
            .expect("the test Redis");
        Arc::new(Replicated::new(store.cells("rlqs", Duration::from_secs(5))))
    }

    /// Reports racing on one bucket from two replicas, each a read and a
    /// compare-and-set: every one of them lands in the shared state.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_reports_from_two_replicas_are_all_counted() {
        let redis = RedisServer::start();
        let replicas = [replica(&redis.url()).await, replica(&redis.url()).await];
        let rule = Arc::new(Rule {
            domain: Arc::from("edge"),
            name: Arc::from("user"),
            plan: Plan::Window {
                limit: 1_000_000,
                period: 3_600_000_000_000,
            },
        });
        let mut tasks = Vec::new();
        for stream in 0..8u64 {
            let replica = Arc::clone(&replicas[(stream % 2) as usize]);
            let rule = Arc::clone(&rule);
            tasks.push(tokio::spawn(async move {
                for i in 0..25 {
                    let usage = Usage {
                        allowed: 1,
                        denied: 2,
                    };
                    replica
                        .report(stream, "k", &rule, usage, i)
                        .await
                        .expect("Redis answers");
                }
            }));
        }
        for task in tasks {
            task.await.expect("no panic");
        }
        replicas[0]
            .report(8, "k", &rule, Usage::default(), 100)
            .await
            .expect("Redis answers");
        let stats = replicas[0].stats(100);
        assert_eq!(stats.len(), 1);
        let s = &stats[0];
        assert_eq!((s.allowed, s.denied, s.envoys), (8 * 25, 8 * 25 * 2, 9));
    }
}
