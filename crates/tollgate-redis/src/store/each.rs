//! Limits checked each on its own in one round trip
//! ([`LeaseStore::check_each_stamped`]): envoyproxy/ratelimit's format
//! charges each descriptor whatever the others decide, so a request of
//! three descriptors is three checks of one limit.
//!
//! The counting ones (fixed windows and hit counters, native commands:
//! native.rs) go in one pipeline per node, as envoyproxy/ratelimit sends
//! them, each with what a check of it alone sends; the follow-ups a few
//! need (the TTL of a key made anew, a denied fixed window's units given
//! back) go in one more pipeline to that node. A command the node refuses
//! fails only its own limit; one refused because the key is served
//! elsewhere (the slot moved: nothing was written) is checked again alone.
//! Every other limit is checked alone, concurrently with the pipelines:
//! concurrent script calls to a node share a call anyway (batch.rs).

use std::sync::Arc;

use futures_util::future::{join, join_all};
use redis::Value;
use smallvec::{SmallVec, smallvec};
use tollgate_core::{Algorithm, LeaseStore, Limit, Outcome, Stamped, StoreError};

use super::RedisStore;
use crate::native::{Plan, Window};
use crate::script::parse_check;
use crate::stats::bump;

/// One counting limit of the request, planned.
struct Counted {
    /// Its place among the request's limits.
    index: usize,
    window: Window,
    capacity: u64,
    cost: u64,
    /// Whether its window's key had its TTL when the pipeline was made.
    expiring: bool,
    /// Its answer's place among the pipeline's replies.
    reply: usize,
}

/// The counting limits bound for one node.
struct Group {
    node: Option<Arc<str>>,
    /// The slot the pipeline is routed by (any of the node's).
    slot: u16,
    counted: SmallVec<[Counted; 4]>,
}

/// What one counted limit came to; `None` when a node that does not serve
/// its key refused it (it is then checked again alone).
type Answer = Option<Result<Stamped, StoreError>>;

impl RedisStore {
    /// [`LeaseStore::check_each_stamped`]; see the module documentation.
    pub(super) async fn check_each_at_once(
        &self,
        limits: &[Limit<'_>],
    ) -> Vec<Result<Stamped, StoreError>> {
        let mut answers: Vec<Option<Result<Stamped, StoreError>>> =
            (0..limits.len()).map(|_| None).collect();
        let mut groups: SmallVec<[Group; 2]> = SmallVec::new();
        let mut alone: SmallVec<[usize; 4]> = SmallVec::new();
        // Without a time (past the end of time), each goes alone and says so.
        let now_us = self.known_now_us().ok();
        for (i, limit) in limits.iter().enumerate() {
            let hit_counter = match (limit.algorithm, now_us) {
                (Algorithm::FixedWindow, Some(_)) => false,
                (Algorithm::HitCounter, Some(_)) => true,
                _ => {
                    alone.push(i);
                    continue;
                }
            };
            let prepared = match self.prepare(std::slice::from_ref(limit)) {
                Ok(prepared) => prepared,
                Err(e) => {
                    answers[i] = Some(Err(e));
                    continue;
                }
            };
            let p = &prepared[0];
            let node = match &self.nodes {
                None => None,
                Some(nodes) => match nodes.node(p.slot) {
                    Some(node) => Some(node),
                    None => {
                        alone.push(i);
                        continue;
                    }
                },
            };
            let counted = Counted {
                index: i,
                window: Window::new(
                    &p.key,
                    p.params,
                    hit_counter,
                    now_us.unwrap_or_default(),
                    self.extra_ms(),
                ),
                capacity: limit.capacity(),
                cost: p.params.cost,
                expiring: false,
                reply: 0,
            };
            match groups.iter_mut().find(|g| g.node == node) {
                Some(group) => group.counted.push(counted),
                None => groups.push(Group {
                    node,
                    slot: p.slot,
                    counted: smallvec![counted],
                }),
            }
        }
        let pipelines = join_all(groups.iter_mut().map(|group| self.count_group(group)));
        let alone_checks = join_all(
            alone
                .iter()
                .map(|&i| self.check_stamped(std::slice::from_ref(&limits[i]))),
        );
        let (counted, checked) = join(pipelines, alone_checks).await;
        for (&i, answer) in alone.iter().zip(checked) {
            answers[i] = Some(answer);
        }
        let mut moved: SmallVec<[usize; 4]> = SmallVec::new();
        for (group, group_answers) in groups.iter().zip(counted) {
            for (c, answer) in group.counted.iter().zip(group_answers) {
                match answer {
                    Some(answer) => answers[c.index] = Some(answer),
                    None => moved.push(c.index),
                }
            }
        }
        if !moved.is_empty() {
            if let Some(nodes) = &self.nodes {
                bump(&self.counters.moved);
                nodes.refresh();
            }
            let again = join_all(
                moved
                    .iter()
                    .map(|&i| self.check_stamped(std::slice::from_ref(&limits[i]))),
            )
            .await;
            for (&i, answer) in moved.iter().zip(again) {
                answers[i] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.expect("every limit answered"))
            .collect()
    }

    /// Counts `group`'s limits in one pipeline to their node, then sends
    /// the follow-ups some need in one more; answers in the group's order.
    async fn count_group(&self, group: &mut Group) -> SmallVec<[Answer; 4]> {
        let mut pipe = redis::pipe();
        for c in group.counted.iter_mut() {
            c.reply = pipe.len();
            match c.window.plan {
                Plan::Read => {
                    pipe.cmd("GET").arg(&c.window.key);
                }
                Plan::Count { ttl_ms } => {
                    // An increment past i64::MAX is refused by Redis: an
                    // error for that limit, never a wrapped count.
                    pipe.cmd("INCRBY").arg(&c.window.key).arg(c.cost);
                    c.expiring = self.expiring.has(&c.window.key);
                    if !c.expiring {
                        self.expire_once(&mut pipe, &c.window.key, ttl_ms);
                    }
                }
            }
        }
        let replies = match self.timed(self.conn.pipeline_at(&pipe, group.slot)).await {
            Ok(replies) if replies.len() == pipe.len() => replies,
            Ok(replies) => {
                let e = StoreError::Backend {
                    source: format!(
                        "{} replies to a pipeline of {} commands",
                        replies.len(),
                        pipe.len()
                    )
                    .into(),
                    retryable: false,
                };
                return self.failed(group, &e);
            }
            Err(e) => return self.failed(group, &e),
        };
        let mut follow = redis::pipe();
        let mut followed: SmallVec<[&str; 4]> = SmallVec::new();
        let mut answers: SmallVec<[Answer; 4]> = SmallVec::new();
        for c in &group.counted {
            let answer = match self.answer(c, &replies[c.reply]) {
                Ok(answer) => answer,
                Err(None) => {
                    answers.push(None);
                    continue;
                }
                Err(Some(e)) => {
                    answers.push(Some(Err(e)));
                    continue;
                }
            };
            if let Plan::Count { ttl_ms } = c.window.plan {
                self.expiring.insert(&c.window.key);
                let created = c.expiring && answer.is_some_and(|n| c.window.created(n));
                let reply = c.window.decide(answer);
                let refund = c.window.refund(reply[2] == 1);
                if refund > 0 {
                    // The TTL again, in case the key expired in between: a
                    // count made anew by DECRBY must not outlive its window.
                    follow.cmd("DECRBY").arg(&c.window.key).arg(refund);
                }
                if created || refund > 0 {
                    // Made anew since its TTL was set: it gets its own now.
                    self.expire_once(&mut follow, &c.window.key, ttl_ms);
                    followed.push(&c.window.key);
                }
                answers.push(Some(self.decided(&reply, c.capacity)));
            } else {
                let reply = c.window.decide(answer);
                answers.push(Some(self.decided(&reply, c.capacity)));
            }
        }
        if !follow.is_empty() {
            let sent = self.timed(self.conn.pipeline_at(&follow, group.slot)).await;
            if let Err(e) = sent {
                // The counts stand; each window's next check sends its TTL
                // again, and units not given back stay taken until the
                // window ends: stricter, never looser.
                tracing::warn!(error = %e, "a counted window's follow-up failed");
                for key in followed {
                    self.expiring.forget(key);
                }
            }
        }
        answers
    }

    /// The count Redis answered for `c`: `Err(None)` when its node does
    /// not serve its key (nothing was written), `Err(Some(_))` when Redis
    /// refused it or answered what is not a count.
    fn answer(&self, c: &Counted, reply: &Value) -> Result<Option<i64>, Option<StoreError>> {
        let refused = |e: redis::RedisError| {
            if matches!(c.window.plan, Plan::Count { .. }) {
                // The INCRBY may still land, on a key made anew: the
                // window's next check sends the TTL again.
                self.expiring.forget(&c.window.key);
            }
            bump(&self.counters.errors);
            let retryable = e.is_io_error() || e.is_timeout();
            Some(StoreError::Backend {
                source: Box::new(e),
                retryable,
            })
        };
        match reply {
            Value::ServerError(e) => {
                let e = redis::RedisError::from(e.clone());
                if self.nodes.is_some() && e.is_cluster_error() {
                    return Err(None);
                }
                Err(refused(e))
            }
            reply => redis::from_redis_value_ref::<Option<i64>>(reply)
                .map_err(|e| refused(redis::RedisError::from(e))),
        }
    }

    /// The outcome of one limit from the script-shaped `reply` native.rs
    /// gives.
    fn decided(&self, reply: &[i64; 7], capacity: u64) -> Result<Stamped, StoreError> {
        let (now_us, _, decisions) = parse_check(reply, &[capacity])?;
        bump(&self.counters.redis_checks);
        Ok(Stamped {
            outcome: Outcome::new(decisions.into()),
            decided_at: Some(smallvec![now_us]),
        })
    }

    /// What `group`'s limits come to when its pipeline failed as a whole
    /// with `error`: each that error, and every key it counted may lack
    /// its TTL.
    fn failed(&self, group: &Group, error: &StoreError) -> SmallVec<[Answer; 4]> {
        group
            .counted
            .iter()
            .map(|c| {
                if matches!(c.window.plan, Plan::Count { .. }) {
                    self.expiring.forget(&c.window.key);
                }
                Some(Err(copy(error)))
            })
            .collect()
    }
}

/// The same error again, for each limit a failed call held.
fn copy(error: &StoreError) -> StoreError {
    match error {
        StoreError::Timeout(after) => StoreError::Timeout(*after),
        StoreError::Backend { source, retryable } => StoreError::Backend {
            source: source.to_string().into(),
            retryable: *retryable,
        },
        StoreError::Invalid(why) => StoreError::Invalid(why.clone()),
        StoreError::Unsupported(what) => StoreError::Unsupported(what),
        other => StoreError::Backend {
            source: other.to_string().into(),
            retryable: other.is_retryable(),
        },
    }
}
