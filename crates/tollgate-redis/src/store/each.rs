//! Counting limits (fixed windows and hit counters) checked with native
//! commands (native.rs): a check of one limit, and a request whose limits
//! are each checked on its own ([`LeaseStore::check_each_stamped`]:
//! envoyproxy/ratelimit's format charges each descriptor whatever the others
//! decide, so a request of three descriptors is three checks of one limit).
//!
//! Both are one mechanism: a request's counting limits (a check of one
//! limit: that limit alone) go in rounds, each one pipeline holding every
//! limit's next step:
//!
//! 1. its count: `SET key c NX PX ttl` on a sparse key's first check of a
//!    window, which makes the count with its TTL; else `INCRBY key c`, with
//!    `PEXPIRE key ttl NX` where this store has not given the window its
//!    TTL; or `GET key` for a read;
//! 2. where the `SET` found the count made already (another instance made
//!    it: it wrote nothing), `INCRBY` + `PEXPIRE … NX`;
//! 3. the follow-up a few need: the TTL of a key an `INCRBY` made anew, a
//!    denied fixed window's units given back (`DECRBY`, the TTL beside).
//!
//! On a cluster, one pipeline per slot, all sent at once (on the client's
//! one connection to each node): the client resends a whole pipeline that a
//! node refused a command of as served elsewhere (`MOVED`, `ASK`), which is
//! right only when the refusal was the whole pipeline's, as a `MOVED` is for
//! one slot's; with several slots, what the node did serve would be counted
//! again. A command the node refuses fails only its own limit. Every other
//! limit of a request is checked alone, concurrently with the pipelines:
//! concurrent script calls to a node share a call anyway (batch.rs).

use futures_util::future::{join, join_all};
use redis::Value;
use smallvec::{SmallVec, smallvec};
use tollgate_core::{Algorithm, LeaseStore, Limit, Outcome, Stamped, StoreError};

use super::{RedisStore, ScriptLimit};
use crate::native::{Plan, Window};
use crate::script::parse_check;
use crate::stats::bump;

/// What a counted limit sends in its next round.
#[derive(Clone, Copy)]
enum Step {
    /// `SET key c NX PX ttl`: a sparse key's first count, with its TTL.
    Make,
    /// `GET key`.
    Read,
    /// `INCRBY key c`, and `PEXPIRE key ttl NX` unless the key had its TTL.
    Count { expiring: bool },
    /// After the decision: `DECRBY key refund` when there is one, and the
    /// key's TTL.
    Follow { refund: u64 },
}

/// One counting limit of a check, planned.
struct Counted {
    /// Its place among the request's limits.
    index: usize,
    window: Window,
    capacity: u64,
    cost: u64,
    /// What it sends next; `None` once it has nothing more to send.
    step: Option<Step>,
    /// Where its step's replies start among the round's.
    reply: usize,
    /// `None` until decided.
    answer: Option<Result<Stamped, StoreError>>,
}

/// The counting limits of one pipeline a round.
struct Group {
    /// Their slot on a cluster (on a single server, any).
    slot: u16,
    counted: SmallVec<[Counted; 4]>,
}

impl RedisStore {
    /// A fixed window or hit counter checked alone: the one-limit case of
    /// the rounds above.
    pub(super) async fn check_counted(
        &self,
        limit: &Limit<'_>,
        prepared: &ScriptLimit,
        hit_counter: bool,
    ) -> Result<Stamped, StoreError> {
        let now_us = self.known_now_us()?;
        let mut group = Group {
            slot: prepared.slot,
            counted: smallvec![self.plan(0, limit, prepared, hit_counter, now_us)],
        };
        self.count_group(&mut group).await;
        group.counted[0]
            .answer
            .take()
            .expect("a limit checked alone is answered")
    }

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
            let (hit_counter, now_us) = match (limit.algorithm, now_us) {
                (Algorithm::FixedWindow, Some(now_us)) => (false, now_us),
                (Algorithm::HitCounter, Some(now_us)) => (true, now_us),
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
            let counted = self.plan(i, limit, p, hit_counter, now_us);
            let cluster = self.conn.is_cluster();
            match groups.iter_mut().find(|g| !cluster || g.slot == p.slot) {
                Some(group) => group.counted.push(counted),
                None => groups.push(Group {
                    slot: p.slot,
                    counted: smallvec![counted],
                }),
            }
        }
        let rounds = join_all(groups.iter_mut().map(|group| self.count_group(group)));
        let alone_checks = join_all(
            alone
                .iter()
                .map(|&i| self.check_stamped(std::slice::from_ref(&limits[i]))),
        );
        let (_, checked) = join(rounds, alone_checks).await;
        for (&i, answer) in alone.iter().zip(checked) {
            answers[i] = Some(answer);
        }
        for c in groups.iter_mut().flat_map(|g| g.counted.iter_mut()) {
            answers[c.index] = c.answer.take();
        }
        answers
            .into_iter()
            .map(|answer| answer.expect("every limit answered"))
            .collect()
    }

    /// What `limit` (the request's `index`th) sends first, in the window of
    /// `now_us`.
    fn plan(
        &self,
        index: usize,
        limit: &Limit<'_>,
        prepared: &ScriptLimit,
        hit_counter: bool,
        now_us: u64,
    ) -> Counted {
        let p = prepared;
        let window = Window::new(&p.key, p.params, hit_counter, now_us, self.extra_ms());
        let step = match window.plan {
            Plan::Read => Step::Read,
            Plan::Count { .. } if self.expiring.has(&window.key) => Step::Count { expiring: true },
            // This store did not count the key's previous window either: a
            // sparse key, whose check is most likely its window's first
            // anywhere, where one `SET` does the work of two commands.
            Plan::Count { .. } if !self.expiring.has(&window.previous_key()) => Step::Make,
            Plan::Count { .. } => Step::Count { expiring: false },
        };
        Counted {
            index,
            window,
            capacity: limit.capacity(),
            cost: p.params.cost,
            step: Some(step),
            reply: 0,
            answer: None,
        }
    }

    /// Steps `group`'s limits to their decisions and follow-ups, one
    /// pipeline to their node a round.
    async fn count_group(&self, group: &mut Group) {
        loop {
            let mut pipe = redis::pipe();
            for c in group.counted.iter_mut() {
                if let Some(step) = c.step {
                    c.reply = pipe.len();
                    self.push(&mut pipe, c, step);
                }
            }
            if pipe.is_empty() {
                return;
            }
            let sent = self.send(&pipe, group.slot).await;
            let mut follow_ups_failed = false;
            for c in group.counted.iter_mut() {
                let Some(step) = c.step.take() else {
                    continue;
                };
                match &sent {
                    Ok(replies) => self.advance(c, step, &replies[c.reply..]),
                    Err(e) => {
                        // The count may still land, on a key made anew: the
                        // window's next check sends the TTL again.
                        self.expiring.forget(&c.window.key);
                        match step {
                            Step::Follow { .. } => follow_ups_failed = true,
                            _ => c.answer = Some(Err(copy(e))),
                        }
                    }
                }
            }
            if let (true, Err(e)) = (follow_ups_failed, &sent) {
                follow_up_failed(e);
            }
        }
    }

    /// Adds `c`'s `step` to `pipe`.
    fn push(&self, pipe: &mut redis::Pipeline, c: &Counted, step: Step) {
        let key = &c.window.key;
        let ttl_ms = match c.window.plan {
            Plan::Count { ttl_ms } => ttl_ms,
            Plan::Read => 0,
        };
        match step {
            Step::Make => {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(c.cost)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms);
            }
            Step::Read => {
                pipe.cmd("GET").arg(key);
            }
            Step::Count { expiring } => {
                // An increment past i64::MAX (a hit counter hit over 2^11
                // times at the largest cost in one window) is refused by
                // Redis: an error for that limit, never a wrapped count.
                pipe.cmd("INCRBY").arg(key).arg(c.cost);
                if !expiring {
                    self.expire_once(pipe, key, ttl_ms);
                }
            }
            Step::Follow { refund } => {
                if refund > 0 {
                    pipe.cmd("DECRBY").arg(key).arg(refund);
                }
                // Also after a DECRBY, in case the key expired in between:
                // a count made anew by it must not outlive its window.
                self.expire_once(pipe, key, ttl_ms);
            }
        }
    }

    /// Sets `key`'s TTL in `pipe` unless it has one (on Redis before 7.0,
    /// whatever it has: the TTL ends at the window's end, so setting one
    /// again moves nothing).
    fn expire_once(&self, pipe: &mut redis::Pipeline, key: &str, ttl_ms: u64) {
        pipe.cmd("PEXPIRE").arg(key).arg(ttl_ms);
        if self.pexpire_nx {
            pipe.arg("NX");
        }
    }

    /// Sends `pipe` to the node serving `slot`, answering each command's
    /// reply, a refusal of one ([`Value::ServerError`]) beside the others'
    /// answers.
    async fn send(&self, pipe: &redis::Pipeline, slot: u16) -> Result<Vec<Value>, StoreError> {
        let replies = self.timed(self.conn.pipeline_at(pipe, slot)).await?;
        if replies.len() != pipe.len() {
            return Err(StoreError::Backend {
                source: format!(
                    "{} replies to a pipeline of {} commands",
                    replies.len(),
                    pipe.len()
                )
                .into(),
                retryable: false,
            });
        }
        Ok(replies)
    }

    /// Takes `c` past the `step` whose replies start `replies`: its
    /// decision, and the next step when it needs one.
    fn advance(&self, c: &mut Counted, step: Step, replies: &[Value]) {
        if let Step::Follow { refund } = step {
            let sent = if refund > 0 { 2 } else { 1 };
            if let Some(Value::ServerError(e)) = replies[..sent]
                .iter()
                .find(|r| matches!(r, Value::ServerError(_)))
            {
                follow_up_failed(&redis::RedisError::from(e.clone()));
                self.expiring.forget(&c.window.key);
            }
            return;
        }
        let count = match (step, &replies[0]) {
            (_, Value::ServerError(e)) => {
                c.answer = Some(Err(self.refused(c, e.clone().into())));
                return;
            }
            (Step::Make, Value::Nil) => {
                // Another instance made the window's count: counted on.
                c.step = Some(Step::Count { expiring: false });
                return;
            }
            (Step::Make, _) => Some(i64::try_from(c.cost).unwrap_or(i64::MAX)),
            (_, reply) => match redis::from_redis_value_ref::<Option<i64>>(reply) {
                Ok(count) => count,
                Err(e) => {
                    c.answer = Some(Err(self.refused(c, e.into())));
                    return;
                }
            },
        };
        let reply = c.window.decide(count);
        c.answer = Some(self.decided(&reply, c.capacity));
        let expiring = match step {
            Step::Count { expiring } => expiring,
            // Made with its TTL.
            Step::Make => false,
            Step::Read | Step::Follow { .. } => return,
        };
        self.expiring.insert(&c.window.key);
        // Made anew since its TTL was set: it gets its own now.
        let created = expiring && count.is_some_and(|n| c.window.created(n));
        let refund = c.window.refund(reply[2] == 1);
        if created || refund > 0 {
            c.step = Some(Step::Follow { refund });
        }
    }

    /// The error of `c`'s command that Redis refused, or whose answer is
    /// not a count.
    fn refused(&self, c: &Counted, e: redis::RedisError) -> StoreError {
        // An INCRBY may still land, on a key made anew: the window's next
        // check sends the TTL again.
        self.expiring.forget(&c.window.key);
        bump(&self.counters.errors);
        let retryable = e.is_io_error() || e.is_timeout();
        StoreError::Backend {
            source: Box::new(e),
            retryable,
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
}

/// A follow-up that did not land: the counts stand, each window's next
/// check sends its TTL again, and units not given back stay taken until the
/// window ends (stricter, never looser).
fn follow_up_failed(error: &dyn std::fmt::Display) {
    tracing::warn!(error = %error, "a counted window's follow-up failed");
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
