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

use parking_lot::Mutex;
use tollgate_core::{Nanos, StoreError};
use tollgate_redis::Cells;

use super::fleet::{Answer, BucketStats, Rule, Shared, StreamId, Usage};

/// Writes that lose to another replica's are tried again this many times:
/// reports of one bucket come a few a second at most, so losing this often
/// means Redis answers wrong, not contention.
const ATTEMPTS: usize = 16;

/// The share-out of every bucket, in Redis.
pub(crate) struct Replicated {
    cells: Cells,
    /// Each bucket's state as this replica last wrote it with a report:
    /// what its metrics show.
    seen: Mutex<HashMap<String, Shared>>,
}

impl Replicated {
    pub(crate) fn new(cells: Cells) -> Self {
        Self {
            cells,
            seen: Mutex::new(HashMap::new()),
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
        self.seen.lock().insert(key.to_owned(), shared);
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
        seen.retain(|_, shared| {
            shared.prune(now);
            shared.has_members()
        });
        seen.values().map(Shared::stats).collect()
    }

    /// Applies `change` to the bucket `key`'s state (`None` if it has
    /// none) and writes it back, unless `change` answers `None`.
    async fn update<T>(
        &self,
        key: &str,
        now: Nanos,
        mut change: impl FnMut(&mut Option<Shared>) -> Option<T>,
    ) -> Result<Option<(T, Shared)>, StoreError> {
        for _ in 0..ATTEMPTS {
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
