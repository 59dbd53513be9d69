//! One global quota enforced by N instances: a trace's requests are spread
//! over the instances, and each [`Mode`] decides them as Tollgate's parts
//! would, on a simulated clock. The parts are the library's own: the memory
//! store, [`Hybrid`], [`Fallback`] and [`DenyCache`] from `tollgate-store`,
//! and the Rate Limit Quota Service's [`Fleet`] with Envoy's side
//! ([`EnvoyBucket`]) from `tollgate-envoy`. What the simulation adds is
//! the time between them: when Envoys report and answers arrive, when a
//! store is down.
//!
//! The measure is the one a quota is stated in: the cost admitted per key in
//! each aligned window of the quota's period, against the limit.

use std::collections::VecDeque;
use std::fmt;
use std::future::{Future, ready};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tollgate_core::{
    Algorithm, Clock, IntoNanos, Lease, LeaseStore, Limit, ManualClock, Nanos, Outcome, Quota,
    Stamped, Store, StoreError, at_first_poll,
};
use tollgate_envoy::rlqs::{Admission, Answer, EnvoyBucket, Fleet, Plan, Rule};
use tollgate_store::{
    BreakerState, DenyCache, Fallback, FallbackConfig, Hybrid, HybridConfig, MemoryConfig,
    MemoryStore,
};

use crate::{KeyId, Trace};

/// How requests are spread over the instances, each drawn from the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Split {
    /// Each request goes to any instance with equal odds.
    Even,
    /// Three requests in four go to the first instance, the rest evenly to
    /// the others: one instance takes most of the traffic.
    Skewed,
}

impl Split {
    /// Both splits, in the order tables give them.
    pub const ALL: [Split; 2] = [Split::Even, Split::Skewed];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Split::Even => "even",
            Split::Skewed => "skewed",
        }
    }

    fn pick(self, rng: &mut StdRng, instances: usize) -> usize {
        match self {
            Split::Skewed if instances > 1 && rng.random_ratio(1, 4) => {
                1 + rng.random_range(0..instances - 1)
            }
            Split::Skewed => 0,
            Split::Even => rng.random_range(0..instances),
        }
    }
}

/// How the instances enforce the quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every instance asks one shared store (the Rate Limit Service on
    /// Redis): one global limiter, the reference.
    Exact,
    /// Each instance is an Envoy enforcing its share of the quota
    /// (Rate Limit Quota Service), reporting every interval, its answers
    /// arriving after a delay.
    Rlqs,
    /// Each instance leases slices of the shared store's budget
    /// ([`Hybrid`], default settings).
    Hybrid,
    /// Each instance falls back to a local store with `--fallback-share 1`
    /// while the shared store is down.
    FallbackWhole,
    /// The same with `--fallback-share 1/N`.
    FallbackShare,
    /// Each instance denies what the shared store just denied, until its
    /// `retry_after` ([`DenyCache`]).
    DenyCache,
    /// Each instance has the whole quota of its own: per-instance local
    /// limits.
    Local,
}

impl Mode {
    /// Every mode, in the order tables give them.
    pub const ALL: [Mode; 7] = [
        Mode::Exact,
        Mode::Rlqs,
        Mode::Hybrid,
        Mode::FallbackWhole,
        Mode::FallbackShare,
        Mode::DenyCache,
        Mode::Local,
    ];

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Exact => "exact",
            Mode::Rlqs => "rlqs",
            Mode::Hybrid => "hybrid",
            Mode::FallbackWhole => "fallback-1",
            Mode::FallbackShare => "fallback-1/n",
            Mode::DenyCache => "deny-cache",
            Mode::Local => "local",
        }
    }
}

/// A name that is no [`Mode`] or [`Split`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?}; expected one of: {expected}")]
pub struct ParseNameError {
    what: &'static str,
    name: String,
    expected: String,
}

fn parse_named<T: Copy>(
    name: &str,
    what: &'static str,
    all: &[T],
    name_of: fn(T) -> &'static str,
) -> Result<T, ParseNameError> {
    all.iter()
        .copied()
        .find(|t| name_of(*t) == name)
        .ok_or_else(|| ParseNameError {
            what,
            name: name.to_owned(),
            expected: all
                .iter()
                .map(|t| name_of(*t))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

impl FromStr for Mode {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_named(s, "mode", &Mode::ALL, Mode::name)
    }
}

impl FromStr for Split {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_named(s, "split", &Split::ALL, Split::name)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The timing of the parts between instances.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Timing {
    /// How often each Envoy reports its buckets' usage (Envoy 1.40: 5 s).
    pub report_interval: Duration,
    /// How long after a report its answer reaches the Envoy.
    pub assignment_delay: Duration,
    /// The seed of the split.
    pub seed: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            report_interval: Duration::from_secs(5),
            assignment_delay: Duration::from_millis(100),
            seed: 1,
        }
    }
}

/// What one mode admitted on one split over some instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct FleetReport {
    /// How the quota was enforced.
    pub mode: Mode,
    /// How requests were spread.
    pub split: Split,
    /// Over how many instances.
    pub instances: usize,
    /// Requests in the trace.
    pub requests: u64,
    /// Cost admitted in all.
    pub admitted: u64,
    /// The most cost admitted for one key in one aligned window of the
    /// quota's period.
    pub max_in_window: u64,
    /// Aligned windows (of any key) that admitted more than the limit.
    pub windows_over: u64,
    /// Requests an Envoy admitted before its first assignment for the
    /// bucket arrived ([`Mode::Rlqs`]; 0 in the other modes): the `A` of
    /// the bound in `docs/envoy.md`.
    pub before_grant: u64,
}

/// Why a fleet could not be simulated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// No instances.
    #[error("the number of instances must be at least 1")]
    NoInstances,
    /// The Rate Limit Quota Service counts requests, not costs.
    #[error(
        "rlqs counts requests: the trace has a request of cost {0}, and Envoy's quota filter has no cost"
    )]
    CostInRlqs(u64),
    /// The runtime the store wrappers' background tasks need.
    #[error("cannot start the runtime of the store wrappers: {0}")]
    Runtime(#[source] std::io::Error),
    /// A store refused a limit.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The fallback's breaker stayed open after the store came back.
    #[error("the fallback's circuit breaker did not close after the outage")]
    BreakerStuck,
}

/// The store shared by the instances: a memory store on the simulated clock,
/// down while the clock is within `outage`.
#[derive(Clone)]
struct Shared(Arc<SharedInner>);

struct SharedInner {
    store: MemoryStore<Arc<ManualClock>>,
    clock: Arc<ManualClock>,
    outage: std::ops::Range<Nanos>,
}

impl Shared {
    fn new(clock: &Arc<ManualClock>, outage: std::ops::Range<Nanos>) -> Self {
        Self(Arc::new(SharedInner {
            store: MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(clock)),
            clock: Arc::clone(clock),
            outage,
        }))
    }

    fn down(&self) -> Option<StoreError> {
        self.0
            .outage
            .contains(&self.0.clock.now())
            .then(|| StoreError::Backend {
                source: "the shared store is down (simulated outage)".into(),
                retryable: true,
            })
    }
}

impl Store for Shared {
    fn check(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        ready(match self.down() {
            Some(e) => Err(e),
            None => Ok(self.0.store.check_now(limits)),
        })
    }

    fn release(&self, leases: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.store.release_now(leases);
        ready(Ok(()))
    }

    fn decides_at_once(&self) -> bool {
        true
    }

    fn ready(&self) -> impl Future<Output = bool> + Send {
        ready(self.down().is_none())
    }
}

impl LeaseStore for Shared {
    fn check_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Stamped, StoreError>> + Send {
        ready(match self.down() {
            Some(e) => Err(e),
            None => at_first_poll(self.0.store.check_stamped(limits)),
        })
    }
}

/// One instance's part.
enum Instance {
    Shared(Shared),
    Local(MemoryStore<Arc<ManualClock>>),
    Hybrid(Hybrid<Shared>),
    Fallback(Fallback<Shared>),
    DenyCache(DenyCache<Shared>),
}

impl Instance {
    fn admit(&self, limit: &Limit<'_>) -> Result<bool, StoreError> {
        let limits = std::slice::from_ref(limit);
        let outcome = match self {
            Instance::Shared(s) => at_first_poll(s.check(limits)),
            Instance::Local(s) => Ok(s.check_now(limits)),
            Instance::Hybrid(s) => at_first_poll(s.check(limits)),
            Instance::Fallback(s) => at_first_poll(s.check(limits)),
            Instance::DenyCache(s) => at_first_poll(s.check(limits)),
        }?;
        Ok(outcome.allowed())
    }
}

/// Envoys and the service's share-out, for [`Mode::Rlqs`].
struct Envoys<'t> {
    trace: &'t Trace,
    fleet: Fleet,
    rule: Rule,
    /// Each Envoy's buckets, by key index.
    buckets: Vec<HashMap<KeyId, EnvoyBucket>>,
    /// Each Envoy's keys in the order it met them, so reports go out in a
    /// deterministic order.
    keys: Vec<Vec<KeyId>>,
    next_report: Vec<Nanos>,
    /// Answers on their way: when they arrive, to which Envoy and bucket.
    pending: VecDeque<(Nanos, usize, KeyId, Answer)>,
    every: Nanos,
    delay: Nanos,
}

impl<'t> Envoys<'t> {
    fn new(trace: &'t Trace, plan: Plan, n: usize, start: Nanos, timing: &Timing) -> Self {
        let every = timing.report_interval.into_nanos().max(1);
        Self {
            trace,
            fleet: Fleet::new(),
            rule: Rule {
                domain: Arc::from("sim"),
                name: Arc::from("sim"),
                plan,
            },
            buckets: (0..n).map(|_| HashMap::new()).collect(),
            keys: vec![Vec::new(); n],
            // The Envoys' timers are staggered across the interval.
            next_report: (0..n)
                .map(|i| start + every / n as u64 * i as u64 + every)
                .collect(),
            pending: VecDeque::new(),
            every,
            delay: timing.assignment_delay.into_nanos(),
        }
    }

    fn report(&mut self, envoy: usize, key: KeyId, now: Nanos) {
        let bucket = self.buckets[envoy].get_mut(&key).expect("a bucket met");
        let usage = bucket.take_usage();
        let name = self.trace.key(key);
        let answer = self
            .fleet
            .report(envoy as u64, name, &self.rule, usage, now);
        self.pending
            .push_back((now.saturating_add(self.delay), envoy, key, answer));
    }

    /// Delivers the answers and makes the reports due up to `now`, in order
    /// of time.
    fn advance(&mut self, now: Nanos) {
        loop {
            let (envoy, tick) = self
                .next_report
                .iter()
                .copied()
                .enumerate()
                .min_by_key(|&(_, t)| t)
                .expect("at least one Envoy");
            let arrival = self.pending.front().map_or(Nanos::MAX, |p| p.0);
            if arrival.min(tick) > now {
                return;
            }
            if arrival <= tick {
                let (at, envoy, key, answer) = self.pending.pop_front().expect("an answer");
                if let Some(bucket) = self.buckets[envoy].get_mut(&key) {
                    bucket.apply(answer, at);
                }
            } else {
                for k in 0..self.keys[envoy].len() {
                    self.report(envoy, self.keys[envoy][k], tick);
                }
                self.next_report[envoy] = tick.saturating_add(self.every);
            }
        }
    }

    fn admit(&mut self, envoy: usize, key: KeyId, now: Nanos) -> Admission {
        self.advance(now);
        let mut met = false;
        let bucket = self.buckets[envoy].entry(key).or_insert_with(|| {
            met = true;
            EnvoyBucket::default()
        });
        let admission = bucket.admit(now);
        if met {
            // Envoy reports a bucket it meets at once.
            self.keys[envoy].push(key);
            self.report(envoy, key, now);
        }
        admission
    }
}

/// Counts admitted cost per key and aligned window.
struct Windows {
    period: Nanos,
    counts: HashMap<(usize, u64), u64>,
}

impl Windows {
    fn add(&mut self, key: usize, time: Nanos, cost: u64) {
        let c = self.counts.entry((key, time / self.period)).or_insert(0);
        *c = c.saturating_add(cost);
    }
}

/// Replays `trace` over `instances` instances split by `split`, each
/// enforcing `quota` by `algorithm` in `mode`. [`Mode::FallbackWhole`] and
/// [`Mode::FallbackShare`] have the shared store down through the middle
/// third of the trace ([`outage`]).
pub fn simulate_fleet(
    trace: &Trace,
    quota: Quota,
    algorithm: Algorithm,
    mode: Mode,
    split: Split,
    instances: usize,
    timing: &Timing,
) -> Result<FleetReport, FleetError> {
    if instances == 0 {
        return Err(FleetError::NoInstances);
    }
    let requests = trace.requests();
    if mode == Mode::Rlqs
        && let Some(r) = requests.iter().find(|r| r.cost != 1)
    {
        return Err(FleetError::CostInRlqs(r.cost));
    }
    let start = requests.first().map_or(0, |r| r.time);
    let clock = Arc::new(ManualClock::new(start));
    // The wrappers start background tasks (the hybrid lease returner, the
    // fallback's prober) on the current runtime. Checks are polled where
    // they stand (every store here decides at once), so those tasks run
    // only where the simulation drives them, at simulated times.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(FleetError::Runtime)?;
    let _entered = runtime.enter();
    let down = match mode {
        Mode::FallbackWhole | Mode::FallbackShare => outage(trace),
        _ => 0..0,
    };
    let shared = Shared::new(&clock, down.clone());
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let hybrid = HybridConfig::default();
    // The real returner runs every half time to live.
    let return_every = (hybrid.lease_ttl / 2)
        .max(Duration::from_millis(10))
        .into_nanos();
    let mut next_return = start.saturating_add(return_every);
    let fallback = |share: f64| FallbackConfig {
        // Probes are driven by the simulation, once the store is back (see
        // below), a cool-down after the outage as the real one would.
        breaker_cool_down: Duration::ZERO,
        local_share: share,
        ..FallbackConfig::default()
    };
    let cool_down = FallbackConfig::default().breaker_cool_down.into_nanos();
    let mut probed = false;
    let parts: Vec<Instance> = (0..instances)
        .map(|_| match mode {
            Mode::Exact | Mode::Rlqs => Instance::Shared(shared.clone()),
            Mode::Local => Instance::Local(MemoryStore::with_clock(
                MemoryConfig::default(),
                Arc::clone(&clock),
            )),
            Mode::Hybrid => Instance::Hybrid(Hybrid::with_clock(
                shared.clone(),
                hybrid.clone(),
                Arc::clone(&dyn_clock),
            )),
            Mode::FallbackWhole => Instance::Fallback(Fallback::with_clock(
                shared.clone(),
                fallback(1.0),
                Arc::clone(&dyn_clock),
            )),
            Mode::FallbackShare => Instance::Fallback(Fallback::with_clock(
                shared.clone(),
                fallback(1.0 / instances as f64),
                Arc::clone(&dyn_clock),
            )),
            Mode::DenyCache => Instance::DenyCache(DenyCache::with_clock(
                shared.clone(),
                DENY_CACHE_KEYS,
                Arc::clone(&dyn_clock),
            )),
        })
        .collect();
    let mut envoys = (mode == Mode::Rlqs)
        .then(|| Envoys::new(trace, Plan::of(algorithm, &quota), instances, start, timing));

    let mut rng = StdRng::seed_from_u64(timing.seed);
    let mut windows = Windows {
        period: quota.period_ns(),
        counts: HashMap::with_capacity(trace.key_count()),
    };
    let mut admitted_total = 0u64;
    let mut before_grant = 0u64;
    for request in requests {
        let now = request.time;
        clock.set(now);
        let at = split.pick(&mut rng, instances);
        if mode == Mode::Hybrid {
            while next_return <= now {
                clock.set(next_return);
                for part in &parts {
                    if let Instance::Hybrid(h) = part {
                        at_first_poll(h.return_expired());
                    }
                }
                next_return = next_return.saturating_add(return_every);
            }
            clock.set(now);
        }
        if !probed && !down.is_empty() && now >= down.end.saturating_add(cool_down) {
            probed = true;
            close_breakers(&runtime, &parts)?;
        }
        let admitted = match &mut envoys {
            Some(envoys) => {
                let admission = envoys.admit(at, request.key, now);
                before_grant += u64::from(admission.admitted && admission.before_grant);
                admission.admitted
            }
            None => {
                let limit =
                    Limit::new(trace.key(request.key), quota, algorithm).with_cost(request.cost);
                parts[at].admit(&limit)?
            }
        };
        if admitted {
            admitted_total = admitted_total.saturating_add(request.cost);
            windows.add(request.key.index(), now, request.cost);
        }
    }
    Ok(FleetReport {
        mode,
        split,
        instances,
        requests: requests.len() as u64,
        admitted: admitted_total,
        max_in_window: windows.counts.values().copied().max().unwrap_or(0),
        windows_over: windows
            .counts
            .values()
            .filter(|&&c| c > quota.limit())
            .count() as u64,
        before_grant,
    })
}

/// Keys the deny cache holds, as `tollgate serve` sizes it.
const DENY_CACHE_KEYS: usize = 65_536;

/// When the shared store is down in the fallback modes: the middle third of
/// the trace's span.
pub fn outage(trace: &Trace) -> std::ops::Range<Nanos> {
    let requests = trace.requests();
    let (Some(first), Some(last)) = (requests.first(), requests.last()) else {
        return 0..0;
    };
    let third = (last.time - first.time) / 3;
    first.time + third..first.time + 2 * third
}

/// Lets each fallback's prober find the store back and close its breaker.
fn close_breakers(runtime: &tokio::runtime::Runtime, parts: &[Instance]) -> Result<(), FleetError> {
    let open = || {
        parts.iter().any(|p| match p {
            Instance::Fallback(f) => f.stats().breaker != BreakerState::Closed,
            _ => false,
        })
    };
    // The probers sleep a cool-down of zero: a turn of the timer, well under
    // a second of real time, that moves no simulated time.
    runtime.block_on(async {
        for _ in 0..100_000 {
            if !open() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Err(FleetError::BreakerStuck)
    })
}

/// The reports as an aligned table, each admitted total also against
/// [`Mode::Exact`]'s (when among them), each window's maximum against
/// `limit`, and what Envoys admitted before their first assignment
/// ([`FleetReport::before_grant`]).
pub fn format_fleet_table(reports: &[FleetReport], limit: u64) -> String {
    let exact = reports
        .iter()
        .find(|r| r.mode == Mode::Exact)
        .map(|r| r.admitted);
    let header = [
        "mode",
        "split",
        "instances",
        "requests",
        "admitted",
        "vs exact",
        "max in window",
        "x limit",
        "windows over",
        "before grant",
    ];
    let rows: Vec<[String; 10]> = reports
        .iter()
        .map(|r| {
            [
                r.mode.name().to_owned(),
                r.split.name().to_owned(),
                r.instances.to_string(),
                r.requests.to_string(),
                r.admitted.to_string(),
                exact.filter(|&e| e > 0).map_or_else(
                    || "-".to_owned(),
                    |e| format!("{:.3}", r.admitted as f64 / e as f64),
                ),
                r.max_in_window.to_string(),
                format!("{:.2}", r.max_in_window as f64 / limit.max(1) as f64),
                r.windows_over.to_string(),
                r.before_grant.to_string(),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        for (i, cell) in cells.iter().enumerate() {
            if i < 2 {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            } else {
                out.push_str(&format!("{cell:>w$}  ", w = widths[i]));
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        line(&row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    out
}

#[cfg(test)]
mod tests;
