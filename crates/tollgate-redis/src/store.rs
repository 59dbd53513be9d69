use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use smallvec::{SmallVec, smallvec};
use tollgate_core::IntoNanos;
use tollgate_core::{
    Algorithm, Clock, Decision, Holder, Lease, LeaseId, LeaseStore, Leased, Limit, Nanos, Outcome,
    Quota, Stamped, Store, StoreError,
};

mod each;

use crate::Cells;
use crate::batch::{BatchError, Batcher, Job};
use crate::code::{Code, Kind};
use crate::conn::{Conn, ConnectError, connect};
use crate::keys::{redis_keys, slot, window_key};
use crate::lone::{self, Lone};
use crate::native::{Expiring, RedisClock};
use crate::nodes::{NodeBatchers, domain_slots};
use crate::script::{self, MAX_COUNT, MAX_MICROS, Params, decode, micros_up, parse_check};
use crate::stats::{Counters, bump};
use crate::{RedisConfig, RedisStats, TimeSource};

/// One limit, ready for the script.
struct ScriptLimit {
    key: String,
    aux: String,
    params: Params,
    slot: u16,
}

/// The Redis and Redis Cluster store; see the crate documentation.
pub struct RedisStore {
    conn: Conn,
    code: Arc<Code>,
    batching: Batching,
    /// A cluster's slot map (and its nodes' batchers, when batching).
    nodes: Option<Arc<NodeBatchers>>,
    config: RedisConfig,
    /// Where checks' time comes from.
    time: Time,
    /// Whether the server takes `PEXPIRE … NX` (Redis ≥ 7.0).
    pexpire_nx: bool,
    /// Native counting's window keys that have their TTL.
    expiring: Expiring,
    /// Whether checks the module takes go to its `TOLLGATE.CHECK`.
    module: bool,
    counters: Counters,
    /// Lease ids: a counter, and a keyed hash (SipHash, a pseudo-random
    /// function) of it under this key, random per store, so that no id can
    /// be guessed from others.
    lease_secret: RandomState,
    next_lease: AtomicU64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("cluster", &self.conn.is_cluster())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Where checks' time comes from.
enum Time {
    /// An injected clock, passed to the script with each request.
    Injected(Arc<dyn Clock>),
    /// Redis's: the script reads `TIME`; native counting, which needs the
    /// time before it sends, reads Redis's clock as followed here.
    Redis(Arc<RedisClock>),
}

/// Where concurrent checks share calls.
enum Batching {
    /// Every check goes alone (`max_batch` 1, or a cluster without functions).
    Off,
    /// One server: one batcher.
    Server(Batcher),
    /// A cluster: a batcher per primary.
    Cluster(Arc<NodeBatchers>),
}

/// Which script operation to run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Check and write when every limit admits.
    Check,
    /// Check, never write.
    Dry,
    /// Give back what a committed check took.
    Refund,
    /// Check, leasing units to a hybrid holder, and record them.
    Lease,
}

/// What a check leases to a hybrid holder ([`LeaseStore::check_leasing`]),
/// per limit of the whole request.
#[derive(Clone, Copy)]
struct Grant<'a> {
    holder: Holder,
    leased: &'a [Option<Leased>],
}

impl Grant<'_> {
    /// Whether any of `members` has a record.
    fn records(&self, members: &[usize]) -> bool {
        members.iter().any(|&i| self.leased[i].is_some())
    }

    /// The script's leases argument for `members`: the holder, the records'
    /// ttl (µs), then each member's units released and leased (-1: none).
    fn argument(&self, members: &[usize]) -> Vec<u8> {
        let ttl_us = micros_up(self.holder.ttl.into_nanos()).min(MAX_MICROS);
        let mut out = Vec::with_capacity(16 + 16 * members.len());
        for v in [self.holder.id as f64, ttl_us as f64] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for &i in members {
            let (released, leased) = self.leased[i].map_or((-1.0, -1.0), |l| {
                (
                    l.released.min(MAX_COUNT) as f64,
                    l.leased.min(MAX_COUNT) as f64,
                )
            });
            out.extend_from_slice(&released.to_le_bytes());
            out.extend_from_slice(&leased.to_le_bytes());
        }
        out
    }
}

/// What one group (one slot) of a check answered.
struct GroupReply {
    now_us: u64,
    allowed: bool,
    decisions: Vec<Decision>,
}

impl RedisStore {
    /// Connects to `redis://host:port/db` (one server) or
    /// `redis+cluster://host:port,host:port` (a cluster, from any of its nodes);
    /// `rediss://` and `rediss+cluster://` do the same over TLS, with
    /// [`RedisConfig::tls`].
    pub async fn connect(url: &str, config: RedisConfig) -> Result<Self, ConnectError> {
        if config.prefix.contains(['{', '}']) {
            return Err(ConnectError::Config(format!(
                "key prefix {:?} must not contain braces",
                config.prefix
            )));
        }
        let conn = connect(url, &config.tls).await?;
        let code = Arc::new(Code::detect(&conn, config.functions).await?);
        let time = match &config.time {
            TimeSource::Redis => Time::Redis(RedisClock::start(&conn).await?),
            TimeSource::Clock(clock) => Time::Injected(Arc::clone(clock)),
        };
        // A key no check uses: the answer is 0 where NX is understood.
        let mut probe = redis::cmd("PEXPIRE");
        probe
            .arg(format!("{}:probe", config.prefix))
            .arg(1)
            .arg("NX");
        let pexpire_nx = conn.query::<i64>(&probe).await.is_ok();
        let module = config.module && has_module(&conn).await;
        let extra_ms = u64::try_from(config.extra_ttl.as_millis()).unwrap_or(u64::MAX);
        let (max, timeout) = (config.max_batch, config.timeout);
        let start = {
            let (conn, code) = (conn.clone(), Arc::clone(&code));
            move || {
                let cluster = conn.is_cluster();
                Batcher::start(
                    conn.clone(),
                    Arc::clone(&code),
                    max,
                    timeout,
                    extra_ms,
                    cluster,
                    module,
                )
            }
        };
        // Checks on several slots of a node share a call only as a function
        // (`allow-cross-slot-keys`, Redis 7); scripts on a cluster go alone.
        let nodes = if conn.is_cluster() {
            Some(Arc::new(
                NodeBatchers::new(conn.clone(), start.clone()).await?,
            ))
        } else {
            None
        };
        let batching = match &nodes {
            _ if max <= 1 => Batching::Off,
            None => Batching::Server(start()),
            Some(nodes) if code.kind() == Kind::Function => Batching::Cluster(Arc::clone(nodes)),
            Some(_) => Batching::Off,
        };
        Ok(Self {
            conn,
            code,
            batching,
            nodes,
            counters: Counters::default(),
            time,
            pexpire_nx,
            expiring: Expiring::new(),
            module,
            lease_secret: RandomState::new(),
            next_lease: AtomicU64::new(0),
            config,
        })
    }

    /// Compare-and-set cells in the namespace `namespace` under the store's
    /// key prefix, on its connection; each round trip waits at most
    /// `timeout`.
    pub fn cells(&self, namespace: &str, timeout: Duration) -> Cells {
        Cells::new(
            self.conn.clone(),
            format!("{}:{namespace}", self.config.prefix),
            timeout,
        )
    }

    /// The store's counters, for metrics.
    pub fn stats(&self) -> RedisStats {
        self.counters.snapshot()
    }

    /// Whether the store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// Whether the store's code runs as a Redis Function (`FCALL`), else as
    /// a script (`EVALSHA`); see [`RedisConfig::functions`].
    pub fn uses_functions(&self) -> bool {
        self.code.kind() == Kind::Function
    }

    fn prepare(&self, limits: &[Limit<'_>]) -> Result<SmallVec<[ScriptLimit; 4]>, StoreError> {
        limits
            .iter()
            .map(|limit| {
                let (key, aux) = redis_keys(&self.config.prefix, limit.algorithm, limit.key);
                Ok(ScriptLimit {
                    slot: slot(&key),
                    key,
                    aux,
                    params: Params::new(limit, limits.len() == 1)?,
                })
            })
            .collect()
    }

    /// The requests' time: `None` for Redis's `TIME`, else the injected
    /// clock in µs.
    fn now_us(&self) -> Result<Option<u64>, StoreError> {
        let Time::Injected(clock) = &self.time else {
            return Ok(None);
        };
        let now: Nanos = clock.now();
        let us = now / 1000;
        if us >= 2 * MAX_MICROS {
            return Err(StoreError::Invalid(format!(
                "time {us} µs is past the Redis store's end of time (2^53 µs)"
            )));
        }
        Ok(Some(us))
    }

    /// The time of a check that must know it before it sends (native
    /// counting), in µs: the injected clock's, else Redis's as followed here.
    fn known_now_us(&self) -> Result<u64, StoreError> {
        match &self.time {
            Time::Injected(_) => Ok(self.now_us()?.unwrap_or_default()),
            Time::Redis(clock) => Ok(clock.now_us()),
        }
    }

    fn extra_ms(&self) -> u64 {
        u64::try_from(self.config.extra_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether checks go to the Tollgate module's `TOLLGATE.CHECK` where it
    /// takes them ([`RedisConfig::module`]).
    pub fn uses_module(&self) -> bool {
        self.module
    }

    /// The keys of `members` in the script's order: each limit's state key,
    /// and its auxiliary key when it keeps one.
    fn keys_of<'p>(
        members: &'p [usize],
        prepared: &'p [ScriptLimit],
    ) -> impl Iterator<Item = &'p str> + 'p {
        members.iter().flat_map(move |&i| {
            let p = &prepared[i];
            std::iter::once(p.key.as_str()).chain(p.params.has_aux().then_some(p.aux.as_str()))
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        op: Op,
        now_us: Option<u64>,
        lease: &str,
        members: &[usize],
        prepared: &[ScriptLimit],
        grant: Option<Grant<'_>>,
    ) -> Result<Vec<i64>, StoreError> {
        let grant = grant.filter(|g| op != Op::Dry && g.records(members));
        let mut keys: SmallVec<[&str; 8]> = Self::keys_of(members, prepared).collect();
        if let Some(grant) = grant {
            // The records' keys: each leased limit's auxiliary key.
            keys.extend(
                members
                    .iter()
                    .filter(|&&i| grant.leased[i].is_some())
                    .map(|&i| prepared[i].aux.as_str()),
            );
        }
        // The module takes every op of the code, hybrid leases' records
        // (`h`, a refund with a grant) too.
        let native = self.module;
        if let Some(call) = self.lone_call(native, op, now_us, members, prepared) {
            let slot = prepared[members[0]].slot;
            let answer = self.timed(self.conn.query_at(&call, slot)).await?;
            return Ok(lone::reply(answer));
        }
        let mut call = if native {
            Code::native_call(keys.len())
        } else {
            self.code.call(keys.len())
        };
        for key in keys {
            call.arg(key);
        }
        let extra_ms = self.extra_ms();
        let op = match (op, grant.is_some()) {
            (Op::Check | Op::Lease, true) => "h",
            (Op::Check | Op::Lease, false) => "c",
            (Op::Dry, _) => "d",
            (Op::Refund, _) => "r",
        };
        call.arg(op).arg(extra_ms).arg(script::request(
            now_us,
            lease,
            members.iter().map(|&i| &prepared[i].params),
        ));
        if let Some(grant) = grant {
            call.arg(grant.argument(members));
        }
        let slot = prepared[members[0]].slot;
        if op == "r" {
            if native {
                return self.timed(self.conn.query_at(&call, slot)).await;
            }
            return self.run::<Vec<i64>>(&call).await;
        }
        if native {
            let reply: Vec<u8> = self.timed(self.conn.query_at(&call, slot)).await?;
            return Ok(decode(&reply));
        }
        Ok(decode(&self.run::<Vec<u8>>(&call).await?))
    }

    /// For a check the module takes (`native`) of one bucket limit, that
    /// bucket's own module command, which costs Redis less than
    /// `TOLLGATE.CHECK` (lone.rs).
    fn lone_call(
        &self,
        native: bool,
        op: Op,
        now_us: Option<u64>,
        members: &[usize],
        prepared: &[ScriptLimit],
    ) -> Option<redis::Cmd> {
        if !native || op != Op::Check {
            return None;
        }
        let lone = Lone::of(now_us, members.iter().map(|&i| &prepared[i].params))?;
        Some(lone.command(&prepared[*members.first()?].key, self.extra_ms()))
    }

    async fn run<T: redis::FromRedisValue>(&self, call: &redis::Cmd) -> Result<T, StoreError> {
        self.timed(self.code.run(&self.conn, call)).await
    }

    /// Waits for `call` at most the timeout, counting what goes wrong.
    async fn timed<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.config.timeout, call).await {
            Err(_) => {
                bump(&self.counters.timeouts);
                Err(StoreError::Timeout(self.config.timeout))
            }
            Ok(Err(e)) => {
                bump(&self.counters.errors);
                let retryable = e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_cluster_error();
                Err(StoreError::Backend {
                    source: Box::new(e),
                    retryable,
                })
            }
            Ok(Ok(reply)) => Ok(reply),
        }
    }

    /// Sends one check through a batcher and waits for its part of the
    /// reply: `None` when the batch went to a node that does not serve the
    /// check's slot (nothing was written).
    async fn batched(
        &self,
        batcher: &Batcher,
        now_us: Option<u64>,
        lease: &str,
        members: &[usize],
        prepared: &[ScriptLimit],
    ) -> Result<Option<Vec<i64>>, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job = Job {
            keys: Self::keys_of(members, prepared)
                .map(str::to_owned)
                .collect(),
            slot: prepared[members[0]].slot,
            request: script::request(now_us, lease, members.iter().map(|&i| &prepared[i].params)),
            limits: members.len(),
            lone: Lone::of(now_us, members.iter().map(|&i| &prepared[i].params)),
            reply: tx,
        };
        let gone = || StoreError::Backend {
            source: "the batch dispatcher stopped".into(),
            retryable: false,
        };
        if !batcher.submit(job).await {
            bump(&self.counters.errors);
            return Err(gone());
        }
        match tokio::time::timeout(self.config.timeout, rx).await {
            Ok(Ok(Ok(reply))) => Ok(Some(reply)),
            Ok(Ok(Err(BatchError::NotLocal))) => Ok(None),
            Err(_) | Ok(Ok(Err(BatchError::Timeout))) => {
                bump(&self.counters.timeouts);
                Err(StoreError::Timeout(self.config.timeout))
            }
            Ok(Ok(Err(BatchError::Backend { message, retryable }))) => {
                bump(&self.counters.errors);
                Err(StoreError::Backend {
                    source: message.into(),
                    retryable,
                })
            }
            Ok(Err(_)) => {
                bump(&self.counters.errors);
                Err(gone())
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn check_group(
        &self,
        op: Op,
        now_us: Option<u64>,
        lease: &str,
        members: &[usize],
        limits: &[Limit<'_>],
        prepared: &[ScriptLimit],
        grant: Option<Grant<'_>>,
    ) -> Result<GroupReply, StoreError> {
        let batcher = match &self.batching {
            _ if op != Op::Check => None,
            Batching::Off => None,
            Batching::Server(batcher) => Some(batcher.clone()),
            Batching::Cluster(nodes) => nodes.for_slot(prepared[members[0]].slot),
        };
        let batched = match &batcher {
            Some(batcher) => {
                self.batched(batcher, now_us, lease, members, prepared)
                    .await?
            }
            None => None,
        };
        let reply = match batched {
            Some(reply) => reply,
            None => {
                if let (Some(_), Batching::Cluster(nodes)) = (&batcher, &self.batching) {
                    // The slot moved: the map is read again, and this check
                    // goes alone, declaring its keys (Redis redirects it).
                    bump(&self.counters.moved);
                    nodes.refresh();
                }
                self.call(op, now_us, lease, members, prepared, grant)
                    .await?
            }
        };
        let capacities: SmallVec<[u64; 4]> =
            members.iter().map(|&i| limits[i].capacity()).collect();
        let (now_us, allowed, decisions) = parse_check(&reply, &capacities)?;
        Ok(GroupReply {
            now_us,
            allowed,
            decisions,
        })
    }

    /// The limits grouped by slot (one group on a single server), the narrowest
    /// group (smallest capacity among its limits) first.
    fn groups(&self, limits: &[Limit<'_>], prepared: &[ScriptLimit]) -> Vec<SmallVec<[usize; 4]>> {
        if !self.conn.is_cluster() {
            return vec![(0..limits.len()).collect()];
        }
        let mut groups: Vec<SmallVec<[usize; 4]>> = Vec::new();
        for (i, p) in prepared.iter().enumerate() {
            match groups.iter_mut().find(|g| prepared[g[0]].slot == p.slot) {
                Some(g) => g.push(i),
                None => groups.push(smallvec![i]),
            }
        }
        groups.sort_by_key(|g| {
            (
                g.iter().map(|&i| limits[i].capacity()).min().unwrap_or(0),
                g[0],
            )
        });
        groups
    }

    async fn check_redis(
        &self,
        limits: &[Limit<'_>],
        prepared: &[ScriptLimit],
        grant: Option<Grant<'_>>,
    ) -> Result<Stamped, StoreError> {
        let now_us = self.now_us()?;
        // The base of the lease members this check adds: unique per store,
        // and per store secret.
        let count = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let lease = format!("{count:x}-{:016x}", self.lease_secret.hash_one(count));
        let groups = self.groups(limits, prepared);
        let mut decisions: SmallVec<[Option<Decision>; 4]> = smallvec![None; limits.len()];
        let mut times: SmallVec<[u64; 4]> = smallvec![0; limits.len()];
        let mut committed: Vec<(usize, u64)> = Vec::new();
        let mut denied = false;
        for (g, members) in groups.iter().enumerate() {
            // A group leasing goes alone: batches carry no leases.
            let op = match grant {
                _ if denied => Op::Dry,
                Some(g) if g.records(members) => Op::Lease,
                _ => Op::Check,
            };
            let reply = match self
                .check_group(op, now_us, &lease, members, limits, prepared, grant)
                .await
            {
                Ok(reply) => reply,
                Err(e) => {
                    // Best effort: what earlier groups took goes back.
                    self.refund(&committed, &groups, &lease, prepared, grant)
                        .await;
                    return Err(e);
                }
            };
            for (d, &i) in reply.decisions.iter().zip(members.iter()) {
                decisions[i] = Some(*d);
                times[i] = reply.now_us;
            }
            if op != Op::Dry {
                if reply.allowed {
                    committed.push((g, reply.now_us));
                } else {
                    denied = true;
                }
            }
        }
        if denied && !committed.is_empty() {
            bump(&self.counters.refunds);
            self.refund(&committed, &groups, &lease, prepared, grant)
                .await;
            committed.clear();
        }
        bump(&self.counters.redis_checks);
        let mut outcome = Outcome::new(
            decisions
                .into_iter()
                .map(|d| d.expect("every group answered"))
                .collect(),
        );
        if outcome.allowed() {
            for (limit, index) in limits.iter().zip(groups_index(&groups, limits.len())) {
                if limit.algorithm == Algorithm::Concurrency && limit.cost > 0 {
                    // The script's member is "<cost>|<base>_<index>": its id
                    // is all after the cost.
                    let id = LeaseId::new(format!("{lease}_{}", index + 1))
                        .expect("hex digits, '-' and '_' make a lease id");
                    outcome.leases.push(Lease {
                        key: limit.key.to_owned(),
                        cost: limit.cost,
                        id,
                    });
                }
            }
        }
        Ok(Stamped {
            outcome,
            decided_at: Some(times),
        })
    }

    async fn refund(
        &self,
        committed: &[(usize, u64)],
        groups: &[SmallVec<[usize; 4]>],
        lease: &str,
        prepared: &[ScriptLimit],
        grant: Option<Grant<'_>>,
    ) {
        for &(g, now_us) in committed {
            let members = &groups[g];
            if let Err(e) = self
                .call(Op::Refund, Some(now_us), lease, members, prepared, grant)
                .await
            {
                tracing::warn!(error = %e, "refund of a cross-slot check failed");
            }
        }
    }
}

/// Whether the script holds `holder`'s id exactly.
fn check_holder(holder: Holder) -> Result<(), StoreError> {
    if holder.id >= MAX_COUNT {
        return Err(StoreError::Invalid(format!(
            "lease holder id {} is not below 2^52",
            holder.id
        )));
    }
    Ok(())
}

/// For each limit, its index within its group (the script's `i - 1`).
fn groups_index(groups: &[SmallVec<[usize; 4]>], n: usize) -> Vec<usize> {
    let mut index = vec![0; n];
    for g in groups {
        for (j, &i) in g.iter().enumerate() {
            index[i] = j;
        }
    }
    index
}

impl RedisStore {
    /// A key (never written) whose slot is in `first..=last`. Every slot is
    /// some short tag's: a one-slot range takes about 16,384 tries.
    fn key_in(&self, (first, last): (u16, u16)) -> Option<String> {
        (0..1_u32 << 20)
            .map(|n| format!("{}:probe:{{{n}}}", self.config.prefix))
            .find(|key| (first..=last).contains(&slot(key)))
    }

    /// What [`Store::supports`] answers, without a store: whether the Redis
    /// store holds `quota` exactly (its numbers within 2^52), whatever the
    /// algorithm. `tollgate check-config` checks a config against it without
    /// connecting.
    ///
    /// # Errors
    ///
    /// [`StoreError::Invalid`], saying which number is beyond the bound.
    pub fn holds(quota: &Quota) -> Result<(), StoreError> {
        script::check(quota).map_err(StoreError::Invalid)
    }
}

impl Store for RedisStore {
    fn supports(&self, _: Algorithm, quota: &Quota) -> Result<(), StoreError> {
        Self::holds(quota)
    }

    /// Checks `limits` in Redis. Errs when Redis does
    /// not answer within the timeout ([`StoreError::Timeout`]) or fails
    /// ([`StoreError::Backend`], saying whether a retry could help): deciding
    /// without Redis is the job of the `Fallback` wrapper of tollgate-store.
    async fn check(&self, limits: &[Limit<'_>]) -> Result<Outcome, StoreError> {
        Ok(self.check_stamped(limits).await?.outcome)
    }

    /// Checks each limit on its own, the counting ones in one pipeline
    /// (one per slot on a cluster; store/each.rs).
    async fn check_each(&self, limits: &[Limit<'_>]) -> Vec<Result<Outcome, StoreError>> {
        let answers = self.check_each_at_once(limits).await;
        answers.into_iter().map(|a| a.map(|s| s.outcome)).collect()
    }

    /// Deletes the state of each limit's key (and its auxiliary key).
    /// One `DEL` per limit: its two keys share a slot.
    async fn reset(&self, limits: &[Limit<'_>]) -> Result<(), StoreError> {
        for limit in limits {
            let (key, aux) = redis_keys(&self.config.prefix, limit.algorithm, limit.key);
            let mut del = redis::cmd("DEL");
            del.arg(&key).arg(&aux);
            if matches!(
                limit.algorithm,
                Algorithm::FixedWindow | Algorithm::HitCounter
            ) {
                // A count per window: the current one, and those beside it
                // that a clock a little apart from this one counts in.
                let period = crate::script::micros_up(limit.quota.period_ns());
                let window = self.known_now_us()? / period;
                for w in window.saturating_sub(1)..=window.saturating_add(1) {
                    del.arg(window_key(&key, w));
                }
            }
            self.timed(self.conn.query::<i64>(&del)).await?;
        }
        Ok(())
    }

    /// Gives back exactly these leases, whichever store of the service took
    /// them: each is the member `<cost>|<id>` of its key's sorted set. A lease that cannot be released (Redis down: the
    /// first error is returned) expires after its quota's period.
    async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        let mut first_error = None;
        // One call per lease: leases of one request may sit on several slots.
        for lease in leases {
            let (key, aux) = redis_keys(&self.config.prefix, Algorithm::Concurrency, &lease.key);
            let member = format!("{}|{}", lease.cost, lease.id);
            let mut call = if self.module {
                Code::native_call(2)
            } else {
                self.code.call(2)
            };
            call.arg(&key).arg(&aux).arg("l").arg(0).arg(&member);
            let released = if self.module {
                self.timed(self.conn.query_at::<Vec<i64>>(&call, slot(&key)))
                    .await
            } else {
                self.run::<Vec<i64>>(&call).await
            };
            if let Err(e) = released {
                tracing::debug!(error = %e, "lease release failed; it expires after its period");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// On a cluster, the range of slots holding `key` (`<first>-<last>`,
    /// from the slot map): a failing primary sends only its own ranges'
    /// keys to the fallback.
    fn domain(&self, key: &str) -> Option<Arc<str>> {
        let nodes = self.nodes.as_ref()?;
        let (redis_key, _) = redis_keys(&self.config.prefix, Algorithm::Gcra, key);
        nodes.domain(slot(&redis_key))
    }

    /// Whether a key of the range `domain` names is served now: a `PTTL` of
    /// a key in it, which the cluster client routes to whichever primary
    /// serves the range (a promoted replica, after a failover).
    async fn domain_ready(&self, domain: &str) -> bool {
        let Some(key) = domain_slots(domain).and_then(|range| self.key_in(range)) else {
            return self.ready().await;
        };
        let mut pttl = redis::cmd("PTTL");
        pttl.arg(&key);
        let wait = self.config.timeout.max(Duration::from_millis(250));
        // Twice, as `ready`: the first call on a dead connection only starts
        // its reconnection.
        let ask = async {
            self.conn.query::<i64>(&pttl).await.is_ok()
                || self.conn.query::<i64>(&pttl).await.is_ok()
        };
        tokio::time::timeout(wait, ask).await.unwrap_or(false)
    }

    /// Whether Redis answers a `PING` now (within the check timeout, but at
    /// least 250 ms: a readiness probe should not flap on a busy host).
    async fn ready(&self) -> bool {
        let wait = self.config.timeout.max(Duration::from_millis(250));
        // A connection that died answers its next command with the error that
        // starts its reconnection: only a second try tells whether Redis is
        // back, and without it a probe right after a restart would fail.
        let ping = async { self.conn.ping().await.is_ok() || self.conn.ping().await.is_ok() };
        tokio::time::timeout(wait, ping).await.unwrap_or(false)
    }
}

impl LeaseStore for RedisStore {
    /// [`Store::check`] with the script's time per limit (µs).
    async fn check_stamped(&self, limits: &[Limit<'_>]) -> Result<Stamped, StoreError> {
        if limits.is_empty() {
            return Ok(Stamped {
                outcome: Outcome::default(),
                decided_at: Some(SmallVec::new()),
            });
        }
        let prepared = self.prepare(limits)?;
        // All-or-nothing across limits needs the script or the module (a
        // check, then a write only if every limit admits); one counting
        // limit does not.
        if let ([limit], [p]) = (limits, prepared.as_slice()) {
            match limit.algorithm {
                Algorithm::FixedWindow => return self.check_counted(limit, p, false).await,
                Algorithm::HitCounter => return self.check_counted(limit, p, true).await,
                _ => {}
            }
        }
        self.check_redis(limits, &prepared, None).await
    }

    fn check_each_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Vec<Result<Stamped, StoreError>>> + Send {
        self.check_each_at_once(limits)
    }

    /// [`LeaseStore::check_stamped`], recording in Redis what `holder`
    /// holds of each leased limit, in the script call that takes the units
    /// (at each limit's auxiliary key, docs/redis.md).
    async fn check_leasing(
        &self,
        limits: &[Limit<'_>],
        holder: Holder,
        leased: &[Option<Leased>],
    ) -> Result<Stamped, StoreError> {
        if leased.len() != limits.len() {
            return Err(StoreError::Invalid(format!(
                "{} leases for {} limits",
                leased.len(),
                limits.len()
            )));
        }
        if leased.iter().all(Option::is_none) {
            return self.check_stamped(limits).await;
        }
        check_holder(holder)?;
        let prepared = self.prepare(limits)?;
        let grant = Grant { holder, leased };
        self.check_redis(limits, &prepared, Some(grant)).await
    }

    /// Gives `limit.cost` units back to `limit`'s state in Redis, as taken by a
    /// check at `taken_at` (µs, the script's time): the script's refund,
    /// which with a holder takes what it released off its record.
    async fn give_back(
        &self,
        limit: &Limit<'_>,
        taken_at: u64,
        holder: Option<(Holder, Leased)>,
    ) -> Result<(), StoreError> {
        let prepared = self.prepare(std::slice::from_ref(limit))?;
        // The refund undoes a check's lease: it takes the units `leased`
        // off the record. Giving back, those are the units released.
        let leased = [holder.map(|(_, change)| Leased {
            released: 0,
            leased: change.released,
        })];
        let grant = match holder {
            Some((holder, _)) => {
                check_holder(holder)?;
                Some(Grant {
                    holder,
                    leased: &leased,
                })
            }
            None => None,
        };
        self.call(Op::Refund, Some(taken_at), "", &[0], &prepared, grant)
            .await?;
        Ok(())
    }
}

/// Whether the server has the Tollgate module's `TOLLGATE.CHECK` with every
/// op the store sends it, hybrid leasing's `h` included (an older module,
/// without it, is not used: the code takes every call); on a cluster, the
/// node asked: load the module on every node.
async fn has_module(conn: &Conn) -> bool {
    // A leasing call without its request: refused, for that, by a module
    // that takes the op; an older one refuses the op, a server without
    // the module the command.
    let mut probe = redis::cmd("TOLLGATE.CHECK");
    probe.arg(0).arg("h").arg(0);
    match conn.query::<redis::Value>(&probe).await {
        Err(e) => e.to_string().contains("h takes one request"),
        Ok(_) => false,
    }
}
