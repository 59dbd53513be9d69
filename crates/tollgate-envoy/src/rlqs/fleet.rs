//! One global quota per bucket, shared by the Envoys that report for it.
//!
//! Pure logic over injected time: [`Fleet::report`] takes one Envoy's usage
//! report for one bucket at `now` and gives back what that Envoy is to
//! enforce. It is written against how Envoy 1.40's quota filter applies an
//! assignment (`source/extensions/filters/http/rate_limit_quota/`,
//! `global_client_impl.cc`):
//!
//! - a token bucket equal to the one in force (same `max_tokens`,
//!   `tokens_per_fill` and `fill_interval` nanoseconds) keeps its tokens and
//!   only has its time to live extended; any other token bucket replaces it
//!   with one as full, in proportion, as the one it replaces (an empty
//!   bucket's successor starts empty); a token bucket that follows no token
//!   bucket starts full. A response's actions are applied in order, in one
//!   step, so `DENY_ALL` then a token bucket starts that bucket full without
//!   a request ever seeing the `DENY_ALL`: that is how the service sends a
//!   [`Answer::fresh`] grant;
//! - Envoy reports every 5 s, whatever the bucket's `reporting_interval`
//!   says (`filter_persistence.cc`), and at once when it meets a new bucket;
//! - the fill rate is `tokens_per_fill` over the fill interval's whole
//!   seconds, and the time to live counts whole seconds only;
//! - an assignment that is not refreshed within its time to live expires,
//!   and Envoy falls back to `expired_assignment_behavior`.
//!
//! So a new lease (windowed quotas) is sent to start full, and the fleet
//! counts it as tokens given out; a rate's new share is sent to carry the
//! old one's fill. The bound this keeps
//! is stated in `docs/envoy.md` (*The bound*) and checked by the tests
//! below.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_core::{Algorithm, Nanos, Quota};

/// One Envoy's stream, as the service numbers them.
pub type StreamId = u64;

const SECOND: Nanos = 1_000_000_000;

/// The fill interval of a windowed lease: so long that refill adds less than
/// a token per Envoy per window; the lease is what the window has left.
const LEASE_FILL_SECS: u64 = 365 * 24 * 3600;

/// A rate bucket is rebalanced for moved demand at most this often (or once
/// per period, if longer): each rebalance hands out full buckets.
const REBALANCE_EVERY: Nanos = 10 * SECOND;

/// A quota as the fleet splits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Plan {
    /// `limit` per aligned window of `period` nanoseconds: fixed window, hit
    /// counter, sliding log and sliding counter.
    Window {
        /// Admissions per window.
        limit: u64,
        /// The window's length in nanoseconds.
        period: Nanos,
    },
    /// `limit` per `period` nanoseconds refilled continuously, up to
    /// `burst`: token bucket, GCRA, leaky bucket.
    Rate {
        /// Tokens per period.
        limit: u64,
        /// The period in nanoseconds.
        period: Nanos,
        /// The bucket's capacity.
        burst: u64,
    },
}

impl Plan {
    /// How a rule of `algorithm` at `quota` is split. Envoy can neither hold
    /// a request back nor release a permit: the shaping leaky bucket and
    /// concurrency are refused in Envoy's format, and a native rule of them
    /// is split as a count per window, as are the windowed algorithms.
    pub fn of(algorithm: Algorithm, quota: &Quota) -> Self {
        let (limit, period) = (quota.limit(), quota.period_ns());
        match algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => Plan::Rate {
                limit,
                period,
                burst: quota.burst(),
            },
            Algorithm::LeakyBucketShaping { .. }
            | Algorithm::Concurrency
            | Algorithm::FixedWindow
            | Algorithm::HitCounter
            | Algorithm::SlidingLog
            | Algorithm::SlidingCounter => Plan::Window { limit, period },
        }
    }

    fn period(self) -> Nanos {
        match self {
            Plan::Window { period, .. } | Plan::Rate { period, .. } => period.max(1),
        }
    }
}

/// A token bucket as Envoy's `envoy.type.v3.TokenBucket` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBucket {
    /// The capacity, and the tokens a new bucket starts with.
    pub max_tokens: u32,
    /// Tokens added per fill interval.
    pub tokens_per_fill: u32,
    /// The fill interval's whole seconds.
    pub fill_secs: u64,
    /// The fill interval's nanoseconds, which Envoy leaves out of the rate:
    /// a number of the Envoy's grants, so that no grant meant to start a
    /// new bucket equals the one in force.
    pub generation: u32,
}

/// What one Envoy is told to enforce for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Grant {
    /// Admit what the token bucket admits.
    Tokens(TokenBucket),
    /// Deny everything: the window's quota is spent.
    DenyAll,
}

impl Grant {
    /// The tokens a new bucket of this grant starts with.
    fn tokens(self) -> u64 {
        match self {
            Grant::Tokens(t) => u64::from(t.max_tokens),
            Grant::DenyAll => 0,
        }
    }

    /// Its refill in tokens a second, as Envoy computes it.
    fn rate(self) -> f64 {
        match self {
            Grant::Tokens(t) => f64::from(t.tokens_per_fill) / t.fill_secs.max(1) as f64,
            Grant::DenyAll => 0.0,
        }
    }
}

/// What one Envoy is to be sent for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// What it enforces.
    pub grant: Grant,
    /// For how long, unless refreshed: whole seconds, as Envoy reads them.
    pub ttl: Duration,
    /// A token bucket that is to start full rather than carry the fill of
    /// the one in force (see the module's documentation): a new lease.
    pub fresh: bool,
}

/// One usage report for one bucket: requests since the previous report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Requests the Envoy admitted.
    pub allowed: u64,
    /// Requests it denied.
    pub denied: u64,
}

/// The rule a bucket's budget belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The policy's domain.
    pub domain: Arc<str>,
    /// A name for stats: a rule's, never a bucket's values, so that series
    /// stay as few as the policy's rules.
    pub name: Arc<str>,
    /// How its quota is split.
    pub plan: Plan,
}

/// A bucket's state, for metrics and the live page.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketStats {
    /// The rule's domain.
    pub domain: Arc<str>,
    /// The rule's name.
    pub rule: Arc<str>,
    /// Envoys holding a share.
    pub envoys: usize,
    /// Admissions reported in the current window (windowed quotas) or
    /// since the bucket was first reported (rates).
    pub allowed: u64,
    /// Denials reported, likewise.
    pub denied: u64,
    /// The tokens of the grants in force, summed over the Envoys.
    pub assigned: u64,
    /// The refill of the grants in force, tokens a second, summed over the
    /// Envoys (rates only; a lease refills nothing to speak of).
    pub assigned_rate: f64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Member {
    /// Allowed + denied in the latest report, at least 1: its weight.
    demand: u64,
    last_report: Option<Nanos>,
    grant: Option<Grant>,
    /// When the grant in force expires at the Envoy if not refreshed.
    expires: Nanos,
    /// The grant's time to live, sent with every answer.
    ttl: Duration,
    /// Windowed: an upper bound on what the Envoy's buckets may still admit
    /// of tokens given out.
    held: u64,
    /// A new bucket was sent since the last report: the next report may
    /// count the old bucket's admissions as well as the new one's.
    unconfirmed: bool,
    /// That bucket is its first: the next report's admissions may be ones
    /// Envoy let through before any grant, not spent from the lease.
    first: bool,
    /// The window (windowed) or rebalance epoch (rates) of its grant.
    window: u64,
    epoch: u64,
    /// The share of the last rebalance, `(demand, total demand)`, to tell
    /// moved demand, and the bucket it makes.
    share: (u64, u64),
    target: TokenBucket,
    generation: u32,
    /// Its stream has ended: it keeps its share until the grant expires.
    gone: bool,
}

/// One bucket's share-out: what replicas sharing a fleet through Redis
/// keep there, whole, per bucket.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Shared {
    /// The rule's domain and name, as [`BucketStats`] gives them: set by
    /// every report, so not kept.
    #[serde(skip)]
    rule: (Arc<str>, Arc<str>),
    plan: Plan,
    members: HashMap<StreamId, Member>,
    /// Windowed: the window's index and what has been reported admitted in
    /// it (or lost with an Envoy that left).
    window: u64,
    spent: u64,
    /// Reported totals, for [`BucketStats`].
    allowed: u64,
    denied: u64,
    /// Bumped when every member must get a new grant: the plan changed, or
    /// (rates) the members or their demand moved.
    epoch: u64,
    rebalanced: Nanos,
    /// The epoch whose rate shares the members' targets are.
    planned: Option<u64>,
}

/// Every bucket's share-out. See the module's documentation.
#[derive(Debug, Default)]
pub struct Fleet {
    buckets: HashMap<String, Shared>,
}

impl Fleet {
    /// An empty fleet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes `stream`'s report of `usage` for the bucket whose budget is
    /// `key` under `rule`, at `now`; gives back what the stream's Envoy is
    /// to enforce and for how long.
    pub fn report(
        &mut self,
        stream: StreamId,
        key: &str,
        rule: &Rule,
        usage: Usage,
        now: Nanos,
    ) -> Answer {
        let shared = match self.buckets.get_mut(key) {
            Some(shared) => shared,
            None => self
                .buckets
                .entry(key.to_owned())
                .or_insert(Shared::new(rule, now)),
        };
        shared.report(stream, rule, usage, now)
    }

    /// `stream` has ended: its Envoys keep enforcing their grants until
    /// they expire, and their shares stay held until then.
    pub fn leave(&mut self, stream: StreamId) {
        for shared in self.buckets.values_mut() {
            shared.leave(stream);
        }
    }

    /// Drops every member whose grant has expired at `now`, and every bucket
    /// left without members.
    pub fn prune(&mut self, now: Nanos) {
        self.buckets.retain(|_, shared| {
            shared.prune(now);
            shared.has_members()
        });
    }

    /// The state of the bucket `key`, if any Envoy reports for it.
    pub fn stats(&self, key: &str) -> Option<BucketStats> {
        self.buckets.get(key).map(Shared::stats)
    }

    /// Every bucket's key and state.
    pub fn all_stats(&self) -> impl Iterator<Item = (&str, BucketStats)> {
        self.buckets.iter().map(|(k, s)| (k.as_str(), s.stats()))
    }
}

impl Shared {
    /// A bucket nobody has reported for yet.
    pub(crate) fn new(rule: &Rule, now: Nanos) -> Self {
        Self {
            rule: (Arc::clone(&rule.domain), Arc::clone(&rule.name)),
            plan: rule.plan,
            members: HashMap::new(),
            window: now / rule.plan.period(),
            spent: 0,
            allowed: 0,
            denied: 0,
            epoch: 0,
            rebalanced: now,
            planned: None,
        }
    }

    /// See [`Fleet::leave`]; whether `stream` was a member.
    pub(crate) fn leave(&mut self, stream: StreamId) -> bool {
        let member = self.members.get_mut(&stream);
        let found = member.is_some();
        if let Some(member) = member {
            member.gone = true;
        }
        found
    }

    /// How long after `now` the bucket's state still matters: until its
    /// last grant expires and, for a windowed quota, until its window ends
    /// (what the window has spent outlives the Envoys that spent it).
    pub(crate) fn keep(&self, now: Nanos) -> Duration {
        let expires = self
            .members
            .values()
            .map(|m| m.expires)
            .max()
            .unwrap_or(now);
        let until = match self.plan {
            Plan::Window { period, .. } => {
                expires.max(self.window.saturating_add(1).saturating_mul(period.max(1)))
            }
            Plan::Rate { .. } => expires,
        };
        Duration::from_nanos(until.saturating_sub(now)).max(Duration::from_secs(1))
    }

    /// Whether any Envoy holds a share.
    pub(crate) fn has_members(&self) -> bool {
        !self.members.is_empty()
    }

    pub(crate) fn stats(&self) -> BucketStats {
        let grants = || self.members.values().filter_map(|m| m.grant);
        BucketStats {
            domain: Arc::clone(&self.rule.0),
            rule: Arc::clone(&self.rule.1),
            envoys: self.members.len(),
            allowed: self.allowed,
            denied: self.denied,
            assigned: grants().map(Grant::tokens).sum(),
            assigned_rate: match self.plan {
                Plan::Rate { .. } => grants().map(Grant::rate).sum(),
                Plan::Window { .. } => 0.0,
            },
        }
    }

    pub(crate) fn prune(&mut self, now: Nanos) {
        let before = self.members.len();
        let mut lost = 0u64;
        self.members.retain(|_, m| {
            let keep = now < m.expires;
            if !keep {
                // Whatever it admitted and never reported counts as spent.
                lost = lost.saturating_add(m.held);
            }
            keep
        });
        self.spent = self.spent.saturating_add(lost);
        // A rate's shares move to the others; a window's leases stay as given.
        if self.members.len() != before && matches!(self.plan, Plan::Rate { .. }) {
            self.bump(now);
        }
    }

    /// Every member gets a new grant at its next report.
    fn bump(&mut self, now: Nanos) {
        self.epoch += 1;
        self.rebalanced = now;
    }

    /// See [`Fleet::report`].
    pub(crate) fn report(
        &mut self,
        stream: StreamId,
        rule: &Rule,
        usage: Usage,
        now: Nanos,
    ) -> Answer {
        self.prune(now);
        if *self.rule.0 != *rule.domain || *self.rule.1 != *rule.name {
            self.rule = (Arc::clone(&rule.domain), Arc::clone(&rule.name));
        }
        let plan = rule.plan;
        if plan != self.plan {
            self.plan = plan;
            self.bump(now);
        }
        // Never back: replicas sharing the state through Redis stamp
        // reports with their own clocks, and one a little behind must not
        // start a window that has ended over again.
        let window = (now / plan.period()).max(self.window);
        if window != self.window {
            self.window = window;
            self.spent = 0;
        }
        self.allowed = self.allowed.saturating_add(usage.allowed);
        self.denied = self.denied.saturating_add(usage.denied);
        self.spent = self.spent.saturating_add(usage.allowed);
        if let std::collections::hash_map::Entry::Vacant(e) = self.members.entry(stream) {
            e.insert(Member::new(now));
            if matches!(plan, Plan::Rate { .. }) {
                self.bump(now);
            }
        }
        let member = self.members.get_mut(&stream).expect("inserted above");
        member.record(usage, now);

        let grant = match plan {
            Plan::Window { limit, .. } => self.lease(stream, limit),
            Plan::Rate {
                limit,
                period,
                burst,
            } => self.rate(stream, limit, period, burst, now),
        };
        let member = self.members.get_mut(&stream).expect("inserted above");
        let changed = member.grant != Some(grant);
        if changed {
            member.first = member.grant.is_none();
            member.grant = Some(grant);
            member.generation = next_generation(member.generation);
            member.unconfirmed = true;
        }
        member.expires = now.saturating_add(nanos(member.ttl));
        Answer {
            grant,
            ttl: member.ttl,
            // A lease is a count of tokens, so it starts full. A rate's
            // new share carries the fill of the old one: a rebalance of
            // Envoys that have run dry gives them nothing.
            fresh: changed && matches!(plan, Plan::Window { .. }),
        }
    }

    /// Windowed quotas: a lease of what the window has left, shared by
    /// demand; deny-all once nothing is left and the lease is spent.
    fn lease(&mut self, stream: StreamId, limit: u64) -> Grant {
        let held: u64 = self.members.values().map(|m| m.held).sum();
        let avail = limit.saturating_sub(self.spent.saturating_add(held));
        let total: u64 = self
            .members
            .values()
            .filter(|m| !m.gone)
            .map(|m| m.demand)
            .sum();
        let (window, epoch) = (self.window, self.epoch);
        let member = self.members.get_mut(&stream).expect("a member");
        let stale = member.grant.is_none() || member.window != window || member.epoch != epoch;
        let spent_half = member.held.saturating_mul(2) <= member.grant.map_or(0, Grant::tokens);
        if !(stale || spent_half) {
            return member.grant.expect("not stale");
        }
        member.window = window;
        member.epoch = epoch;
        if avail == 0 {
            if stale || member.held == 0 {
                return Grant::DenyAll;
            }
            return member.grant.expect("not stale");
        }
        // Two reports' worth of its demand: enough to reach the next
        // answer, while the rest stays for the other Envoys.
        let share = mul_div(avail, member.demand, total.max(member.demand)).max(1);
        let tokens = share
            .min(member.demand.saturating_mul(2).saturating_add(1))
            .min(avail)
            .min(u64::from(u32::MAX));
        member.held = member.held.saturating_add(tokens);
        Grant::Tokens(TokenBucket {
            max_tokens: tokens as u32,
            tokens_per_fill: 1,
            fill_secs: LEASE_FILL_SECS,
            generation: next_generation(member.generation),
        })
    }

    /// Rates: a share of the rate and of the burst, by demand, changed only
    /// when the members change or demand has moved by a quarter. The shares
    /// are taken all at once, so that they add up to the rate.
    fn rate(
        &mut self,
        stream: StreamId,
        limit: u64,
        period: Nanos,
        burst: u64,
        now: Nanos,
    ) -> Grant {
        let total: u64 = self.members.values().map(|m| m.demand).sum::<u64>().max(1);
        let moved = self.members.values().any(|m| {
            let (d, t) = m.share;
            // |demand/total − d/t| > 1/4, cross-multiplied.
            let now_share = u128::from(m.demand) * u128::from(t.max(1));
            let then_share = u128::from(d) * u128::from(total);
            now_share.abs_diff(then_share) * 4 > u128::from(total) * u128::from(t.max(1))
        });
        if moved && now.saturating_sub(self.rebalanced) >= REBALANCE_EVERY.max(period) {
            self.bump(now);
        }
        if self.planned != Some(self.epoch) {
            self.planned = Some(self.epoch);
            for m in self.members.values_mut() {
                m.share = (m.demand, total);
                let max_tokens = mul_div(burst, m.demand, total).clamp(1, u64::from(u32::MAX));
                let (tokens_per_fill, fill_secs) = fill(limit, period, m.demand, total);
                m.target = TokenBucket {
                    max_tokens: max_tokens as u32,
                    tokens_per_fill,
                    fill_secs,
                    generation: 0,
                };
            }
        }
        let epoch = self.epoch;
        let member = self.members.get_mut(&stream).expect("a member");
        if member.epoch == epoch
            && let Some(grant) = member.grant
        {
            return grant;
        }
        member.epoch = epoch;
        Grant::Tokens(TokenBucket {
            generation: next_generation(member.generation),
            ..member.target
        })
    }
}

impl Member {
    fn new(now: Nanos) -> Self {
        Self {
            demand: 1,
            last_report: None,
            grant: None,
            expires: now,
            ttl: MIN_TTL,
            held: 0,
            unconfirmed: false,
            first: false,
            window: 0,
            epoch: 0,
            share: (0, 0),
            target: TokenBucket {
                max_tokens: 1,
                tokens_per_fill: 1,
                fill_secs: LEASE_FILL_SECS,
                generation: 0,
            },
            generation: 0,
            gone: false,
        }
    }

    fn record(&mut self, usage: Usage, now: Nanos) {
        self.demand = usage.allowed.saturating_add(usage.denied).max(1);
        if !(self.unconfirmed && self.first) {
            self.held = self.held.saturating_sub(usage.allowed);
        }
        if usage.denied > 0 && !self.unconfirmed {
            // Its bucket ran dry since the last answer, and only refill
            // (less than a token) has come since.
            self.held = 0;
        }
        if self.unconfirmed {
            // The bucket in force has replaced the earlier ones, whose
            // admissions this report has counted; it holds no more than
            // it started with.
            self.held = self.held.min(self.grant.map_or(0, Grant::tokens));
            self.unconfirmed = false;
        }
        if let Some(last) = self.last_report {
            self.ttl = ttl(now.saturating_sub(last));
        }
        self.last_report = Some(now);
        self.gone = false;
    }
}

/// The shortest time to live, and the first: two of Envoy 1.40's report
/// intervals and a second. That Envoy reports every 5 s whatever the
/// bucket's `reporting_interval` says (`filter_persistence.cc`), so a grant
/// must outlive a missed report of those.
const MIN_TTL: Duration = Duration::from_secs(11);

/// A grant's time to live for an Envoy reporting every `interval`: two
/// intervals and a second, in whole seconds (Envoy reads only those), so
/// one lost report does not expire it.
fn ttl(interval: Nanos) -> Duration {
    let secs = interval
        .saturating_mul(2)
        .saturating_add(SECOND)
        .div_ceil(SECOND);
    Duration::from_secs(secs).clamp(MIN_TTL, Duration::from_secs(300))
}

fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn next_generation(g: u32) -> u32 {
    (g + 1) % 1_000_000_000
}

fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    u64::try_from(u128::from(a) * u128::from(b) / u128::from(c.max(1))).unwrap_or(u64::MAX)
}

/// `limit × share / total` per `period` as whole tokens per whole seconds,
/// rounded down so that the shares never add up to more than the rate: the
/// period's seconds (at least one), lengthened until a fill is a token.
fn fill(limit: u64, period: Nanos, share: u64, total: u64) -> (u32, u64) {
    let rate = |secs: u64| {
        u128::from(limit) * u128::from(share) * u128::from(secs) * u128::from(SECOND)
            / (u128::from(total) * u128::from(period.max(1)))
    };
    let mut secs = period.div_ceil(SECOND).max(1);
    let mut tokens = rate(secs);
    if tokens == 0 {
        // One token per this many seconds, rounded up.
        let per_token = u128::from(total) * u128::from(period.max(1))
            / (u128::from(limit.max(1)) * u128::from(share) * u128::from(SECOND));
        secs = u64::try_from(per_token + 1).unwrap_or(u64::MAX);
        tokens = rate(secs).max(1);
    }
    (u32::try_from(tokens).unwrap_or(u32::MAX), secs)
}

#[cfg(test)]
mod tests;
