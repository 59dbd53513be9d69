//! Batching: concurrent checks to one server (or one cluster node) share one
//! call of the code.
//!
//! Checks queue on a channel; a dispatcher task sends whatever is queued as one
//! call, with at most `IN_FLIGHT` calls on the wire at once. Nothing waits for
//! a batch to fill: a check that finds the wire idle goes alone at once,
//! sent from its caller's task, and
//! checks that arrive while calls are in flight ride together in the next one.
//! Each request in a batch is still checked all-or-nothing on its own,
//! atomically (the whole call is).
//!
//! On a cluster, each primary has its batcher (see nodes.rs), and a batch
//! whose checks are on several of its slots declares only its first key: the
//! function's `allow-cross-slot-keys` flag lets it reach the others, which it
//! checks are all served there before writing anything.
//!
//! With the module loaded, a batch goes to its `TOLLGATE.CHECK` instead of
//! the code, the same keys and arguments; on a cluster, one command per
//! slot (a module command cannot reach keys of other slots), sent at once;
//! a batch of one check of one bucket limit goes to that bucket's own
//! command instead (lone.rs).
//!
//! This amortizes what a call costs beyond its work — the command's parsing and
//! dispatch in Redis, the socket writes and reads, the client's encoding — over
//! every check in it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::code::Code;
use crate::conn::Conn;
use crate::lone::{self, Lone};
use crate::script::decode;

/// Script calls of batches on the wire at once.
const IN_FLIGHT: usize = 4;

/// One request of a batch: its keys (all on one slot) and its argument.
pub(crate) struct Job {
    pub(crate) keys: Vec<String>,
    pub(crate) slot: u16,
    pub(crate) request: Vec<u8>,
    /// Its number of limits.
    pub(crate) limits: usize,
    /// Its own module command, when it is one check of one bucket limit.
    pub(crate) lone: Option<Lone>,
    pub(crate) reply: oneshot::Sender<Result<Vec<i64>, BatchError>>,
}

/// Why a batch failed (every job in it gets a copy).
#[derive(Debug, Clone)]
pub(crate) enum BatchError {
    Timeout,
    /// A key is not served by the node the batch went to (a stale slot
    /// map); nothing was written.
    NotLocal,
    Backend {
        message: String,
        retryable: bool,
    },
}

#[derive(Clone)]
pub(crate) struct Batcher {
    tx: mpsc::UnboundedSender<Job>,
    /// Calls on the wire: `IN_FLIGHT` permits.
    slots: Arc<Semaphore>,
    route: Arc<Route>,
}

/// Where the batcher's calls go, and how.
struct Route {
    conn: Conn,
    code: Arc<Code>,
    timeout: Duration,
    extra_ms: u64,
    cluster: bool,
    module: bool,
}

impl Route {
    async fn send(&self, jobs: Vec<Job>) {
        let to = Target {
            conn: &self.conn,
            code: &self.code,
            timeout: self.timeout,
            extra_ms: self.extra_ms,
        };
        send(to, jobs, self.cluster, self.module).await;
    }
}

impl Batcher {
    /// Starts the dispatcher on the current tokio runtime. It ends when the
    /// batcher (the store) is dropped.
    pub(crate) fn start(
        conn: Conn,
        code: Arc<Code>,
        max: usize,
        timeout: Duration,
        extra_ms: u64,
        cluster: bool,
        module: bool,
    ) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        let route = Arc::new(Route {
            conn,
            code,
            timeout,
            extra_ms,
            cluster,
            module,
        });
        let (dispatch_slots, dispatch_route) = (Arc::clone(&slots), Arc::clone(&route));
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let Ok(permit) = Arc::clone(&dispatch_slots).acquire_owned().await else {
                    return;
                };
                // Whatever queued while waiting for a slot goes in this call.
                let mut jobs = vec![first];
                while jobs.len() < max {
                    match rx.try_recv() {
                        Ok(job) => jobs.push(job),
                        Err(_) => break,
                    }
                }
                let route = Arc::clone(&dispatch_route);
                tokio::spawn(async move {
                    route.send(jobs).await;
                    drop(permit);
                });
            }
        });
        Self { tx, slots, route }
    }

    /// Sends a job, and returns once it is answered or queued; false if the
    /// dispatcher is gone. A job that finds no call on the wire would be
    /// a batch of its own: it is sent from the caller's task, not handed
    /// to the dispatcher and then to a task of its own, two wake-ups fewer
    /// before the command leaves (and as many fewer checks' worth of delay
    /// for Redis to idle through, which on a busy host costs its caches).
    pub(crate) async fn submit(&self, job: Job) -> bool {
        if self.slots.available_permits() == IN_FLIGHT
            && let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned()
        {
            self.route.send(vec![job]).await;
            drop(permit);
            return true;
        }
        self.tx.send(job).is_ok()
    }
}

/// Where a batch goes and how.
#[derive(Clone, Copy)]
struct Target<'a> {
    conn: &'a Conn,
    code: &'a Code,
    timeout: Duration,
    extra_ms: u64,
}

async fn send(to: Target<'_>, jobs: Vec<Job>, cluster: bool, module: bool) {
    let cross = cluster && jobs.iter().any(|job| job.slot != jobs[0].slot);
    if let ([job], true) = (&jobs[..], module)
        && let Some(lone) = job.lone
    {
        let call = lone.command(&job.keys[0], to.extra_ms);
        return answer(to, call, Command::Lone, jobs).await;
    }
    if module {
        if !cross {
            let call = one_slot(Code::native_call, &jobs, to.extra_ms);
            return answer(to, call, Command::Module, jobs).await;
        }
        let mut slots: Vec<Vec<Job>> = Vec::new();
        for job in jobs {
            match slots.iter_mut().find(|s| s[0].slot == job.slot) {
                Some(s) => s.push(job),
                None => slots.push(vec![job]),
            }
        }
        let calls = slots.into_iter().map(|jobs| {
            let call = one_slot(Code::native_call, &jobs, to.extra_ms);
            answer(to, call, Command::Module, jobs)
        });
        futures_util::future::join_all(calls).await;
        return;
    }
    let call = if cross {
        let mut keys = jobs.iter().flat_map(|job| &job.keys);
        let mut call = to.code.call(1);
        call.arg(keys.next())
            .arg("x")
            .arg(to.extra_ms)
            .arg(jobs.len());
        for job in &jobs {
            call.arg(&job.request);
        }
        for key in keys {
            call.arg(key);
        }
        call
    } else {
        one_slot(|n| to.code.call(n), &jobs, to.extra_ms)
    };
    answer(to, call, Command::Code, jobs).await
}

/// A check of `jobs`, all on one slot: their keys, then `c`, the extra TTL
/// and their requests.
fn one_slot(call: impl FnOnce(usize) -> redis::Cmd, jobs: &[Job], extra_ms: u64) -> redis::Cmd {
    let mut call = call(jobs.iter().map(|job| job.keys.len()).sum());
    for key in jobs.iter().flat_map(|job| &job.keys) {
        call.arg(key);
    }
    call.arg("c").arg(extra_ms);
    for job in jobs {
        call.arg(&job.request);
    }
    call
}

/// Which command a batch's call is.
#[derive(Clone, Copy)]
enum Command {
    /// The code's, packed reply.
    Code,
    /// The module's `TOLLGATE.CHECK`, packed reply.
    Module,
    /// A bucket's own module command, five integers.
    Lone,
}

/// Sends `call` (a module's command routed to the jobs' slot) and hands
/// each job its part of the reply.
async fn answer(to: Target<'_>, call: redis::Cmd, command: Command, jobs: Vec<Job>) {
    let slot = jobs[0].slot;
    let run = async {
        match command {
            Command::Code => to
                .code
                .run::<Vec<u8>>(to.conn, &call)
                .await
                .map(|r| decode(&r)),
            Command::Module => to
                .conn
                .query_at::<Vec<u8>>(&call, slot)
                .await
                .map(|r| decode(&r)),
            Command::Lone => to.conn.query_at(&call, slot).await.map(lone::reply),
        }
    };
    let result = tokio::time::timeout(to.timeout, run).await;
    let mut replies = match result {
        Err(_) => return fail(jobs, BatchError::Timeout),
        Ok(Err(e)) if e.code() == Some("TOLLGATE_NOT_LOCAL") => {
            return fail(jobs, BatchError::NotLocal);
        }
        Ok(Err(e)) => {
            let retryable = e.is_io_error()
                || e.is_timeout()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_cluster_error();
            return fail(
                jobs,
                BatchError::Backend {
                    message: e.to_string(),
                    retryable,
                },
            );
        }
        Ok(Ok(reply)) => reply.into_iter(),
    };
    for job in jobs {
        let take = 2 + 5 * job.limits;
        let reply: Vec<i64> = replies.by_ref().take(take).collect();
        let _ = job.reply.send(Ok(reply));
    }
}

fn fail(jobs: Vec<Job>, error: BatchError) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}
