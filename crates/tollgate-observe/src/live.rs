//! The live page: `GET /` serves one self-contained HTML page (inline CSS and
//! JS, no other asset) that polls `GET /live.json` every second and shows
//! decisions per second by rule and result, the most denied keys, shadow
//! rules' would-be denials, the quotas Envoys enforce themselves (the Rate
//! Limit Quota Service's, per rule: [`QuotaView`]), the store's health, and
//! the config in force with its last reload error.
//!
//! [`Live`] gathers what the JSON reports. It watches the enforcer as an
//! [`Observer`] beside the metrics one: per decided descriptor, one atomic
//! add on the counter of its (domain, rule, result), which the rule keeps
//! (`kept`) once a map read without a lock ([`ArcSwap`]) has found
//! it; a denied (or shadow-denied) descriptor is also offered to a bounded
//! top-K ([`top_k`]) under a short lock. Rates come from [`sample`], which
//! copies the counters once a second with the service's clock, so the hot
//! path reads no clock.
//!
//! Both endpoints are served where `/metrics` is. With `--admin-token`,
//! `/live.json` needs `Authorization: Bearer <token>`; the page itself holds
//! no data, and asks for the token (kept in the tab's `sessionStorage`).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Json;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::watch;
use tollgate_core::{Clock, Nanos};
use tollgate_policy::{Decided, Observer, Policy, Reload};

use crate::metrics;
use crate::per_rule::{PerResult, PerRule};
use crate::store_health::StoreHealth;

pub(crate) mod series;
mod top_k;

pub(crate) use series::Series;
use top_k::SpaceSaving;

/// Where the page polls.
pub const JSON_PATH: &str = "/live.json";
/// Counters of each top-K: its memory bound, and what its error bound
/// divides the denials by.
pub const TOP_KEYS: usize = 64;
/// The longest key a top-K keeps, in bytes: descriptor values are the
/// client's, so they are cut (at a character boundary) to bound memory.
const KEY_BYTES: usize = 200;
/// How often the counters are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Samples kept: a minute of per-second history.
const SAMPLES: usize = 61;
/// The span the per-second rates are averaged over.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// The page: one file, everything inline.
const PAGE: &str = include_str!("live/page.html");
/// Inline style and script only, data from this origin only: the page loads
/// nothing else, and a key's text could not run even if it were not escaped.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
    style-src 'unsafe-inline'; connect-src 'self'; img-src data:; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One domain's counters: by rule, one series per result. Hashed with
/// foldhash, not SipHash: two lookups on every decision, by keys from the
/// config, which a client cannot choose to collide.
type Rules = HashMap<Box<str>, Vec<Arc<Series>>, FastHash>;
type FastHash = foldhash::fast::RandomState;

/// Every counter, found by domain, rule and result. Replaced whole (rarely:
/// once per new label set) and read without a lock.
#[derive(Debug, Default, Clone)]
struct Index {
    /// By domain.
    by_rule: HashMap<Box<str>, Rules, FastHash>,
    /// Ad-hoc checks', one per result.
    adhoc: Vec<Arc<Series>>,
    /// Every series in the order made; samples follow this order.
    all: Vec<Arc<Series>>,
}

impl Index {
    fn find(&self, domain: Option<&str>, rule: Option<&str>, result: &str) -> Option<&Arc<Series>> {
        let list = match (domain, rule) {
            (Some(domain), Some(rule)) => self.by_rule.get(domain)?.get(rule)?,
            _ => &self.adhoc,
        };
        list.iter().find(|s| s.result == result)
    }

    fn insert(&mut self, series: Arc<Series>) {
        let list = match (&series.domain, &series.rule) {
            (Some(domain), Some(rule)) => self
                .by_rule
                .entry(domain.clone())
                .or_default()
                .entry(rule.clone())
                .or_default(),
            _ => &mut self.adhoc,
        };
        list.push(Arc::clone(&series));
        self.all.push(series);
    }
}

/// A denied key as the top-K tells them apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Denied {
    domain: Option<Box<str>>,
    rule: Option<Box<str>>,
    /// The descriptor's entries (`key=value, ...`), or an ad-hoc key.
    key: Box<str>,
}

/// A [`Denied`] borrowed, as each denial offers it: a key already in the
/// top-K is counted without allocating. Its fields are [`Denied`]'s in the
/// same order, so the two hash alike (a `Box<str>` hashes as its `str`).
#[derive(Hash)]
struct DeniedRef<'a> {
    domain: Option<&'a str>,
    rule: Option<&'a str>,
    key: &'a str,
}

impl hashbrown::Equivalent<Denied> for DeniedRef<'_> {
    fn equivalent(&self, denied: &Denied) -> bool {
        self.key == &*denied.key
            && self.rule == denied.rule.as_deref()
            && self.domain == denied.domain.as_deref()
    }
}

impl DeniedRef<'_> {
    /// Its owned form, made when the top-K starts watching it.
    fn owned(&self) -> Denied {
        Denied {
            domain: self.domain.map(Into::into),
            rule: self.rule.map(Into::into),
            key: self.key.into(),
        }
    }
}

/// Every counter's total at one instant.
#[derive(Debug)]
struct Sample {
    at: Nanos,
    /// In [`Index::all`]'s order; series made since are missing (zero).
    totals: Vec<u64>,
}

/// The config in force, as reloads left it.
#[derive(Debug)]
struct ConfigState {
    source: String,
    version: u64,
    loaded_at: Nanos,
    last_reload: Option<ReloadSeen>,
    last_error: Option<ReloadSeen>,
}

/// One reload attempt, as `/live.json` shows it.
#[derive(Debug, Clone, Serialize)]
struct ReloadSeen {
    at_ms: u64,
    trigger: &'static str,
    result: &'static str,
    error: Option<String>,
}

/// What the live page shows, gathered as the service runs; see the module
/// docs.
pub struct Live {
    /// Each rule's series, by result, once a decision has needed them.
    rules: PerRule<PerResult<Arc<Series>>>,
    clock: Arc<dyn Clock>,
    index: ArcSwap<Index>,
    /// Held while a new series is added, so two adders do not lose one.
    grow: Mutex<()>,
    denied: Mutex<SpaceSaving<Denied>>,
    shadow_denied: Mutex<SpaceSaving<Denied>>,
    store_errors: AtomicU64,
    /// Requests the enforcer shed, by domain, then tier (critical, high,
    /// low): only domains of a config shed, so the map stays small.
    enforcer_shed: Mutex<HashMap<String, [u64; 3]>>,
    samples: Mutex<VecDeque<Sample>>,
    config: Mutex<ConfigState>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every state here is consistent between statements.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn millis(at: Nanos) -> u64 {
    at / 1_000_000
}

impl Live {
    /// Nothing seen yet; the config from `source` is version 1, loaded now.
    /// The first sample (every counter at zero) is taken now, before any
    /// decision, so that rates count every decision from the start.
    pub fn new(clock: Arc<dyn Clock>, source: String) -> Self {
        let loaded_at = clock.now();
        let mut samples = VecDeque::with_capacity(SAMPLES);
        samples.push_back(Sample {
            at: loaded_at,
            totals: Vec::new(),
        });
        Self {
            rules: PerRule::default(),
            clock,
            index: ArcSwap::default(),
            grow: Mutex::new(()),
            denied: Mutex::new(SpaceSaving::new(TOP_KEYS)),
            shadow_denied: Mutex::new(SpaceSaving::new(TOP_KEYS)),
            store_errors: AtomicU64::new(0),
            enforcer_shed: Mutex::default(),
            samples: Mutex::new(samples),
            config: Mutex::new(ConfigState {
                source,
                version: 1,
                loaded_at,
                last_reload: None,
                last_error: None,
            }),
        }
    }

    /// Counts one decision.
    fn count(&self, domain: Option<&str>, rule: Option<&str>, result: &'static str) {
        if let Some(series) = self.index.load().find(domain, rule, result) {
            series.count.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.series(domain, rule, result)
            .count
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The series of (`domain`, `rule`, `result`), added if new.
    fn series(
        &self,
        domain: Option<&str>,
        rule: Option<&str>,
        result: &'static str,
    ) -> Arc<Series> {
        let _grow = lock(&self.grow);
        let current = self.index.load_full();
        if let Some(series) = current.find(domain, rule, result) {
            return Arc::clone(series);
        }
        let series = Arc::new(Series {
            domain: domain.map(Into::into),
            rule: rule.map(Into::into),
            result,
            count: AtomicU64::new(0),
        });
        let mut next = (*current).clone();
        next.insert(Arc::clone(&series));
        self.index.store(Arc::new(next));
        series
    }

    /// The requests the enforcer shed in `domain` since start, by tier:
    /// critical, high, low.
    pub fn enforcer_shed(&self, domain: &str) -> [u64; 3] {
        lock(&self.enforcer_shed)
            .get(domain)
            .copied()
            .unwrap_or_default()
    }

    /// Copies every counter's total, at the service clock's now.
    fn sample(&self) {
        let at = self.clock.now();
        let totals = self
            .index
            .load()
            .all
            .iter()
            .map(|s| s.count.load(Ordering::Relaxed))
            .collect();
        let mut samples = lock(&self.samples);
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(Sample { at, totals });
    }

    /// Notes one reload attempt: a config put in force is the next version.
    pub fn reloaded(&self, attempt: &Reload) {
        let at = self.clock.now();
        let seen = ReloadSeen {
            at_ms: millis(at),
            trigger: metrics::trigger_label(attempt.trigger),
            result: metrics::result_label(attempt),
            error: attempt.outcome.as_ref().err().map(ToString::to_string),
        };
        let mut config = lock(&self.config);
        if attempt.outcome.is_ok() {
            config.version += 1;
            config.loaded_at = at;
        } else {
            config.last_error = Some(seen.clone());
        }
        config.last_reload = Some(seen);
    }

    /// What `/live.json` answers, with `policy` in force and the store's
    /// `health` (when the store reports one).
    fn snapshot(
        &self,
        policy: &Policy,
        disabled: Vec<Disabled>,
        store: Option<StoreHealth>,
        quotas: Vec<QuotaView>,
        shedding: Shedding,
    ) -> Snapshot {
        let now = self.clock.now();
        let index = self.index.load_full();
        let totals: Vec<u64> = index
            .all
            .iter()
            .map(|s| s.count.load(Ordering::Relaxed))
            .collect();
        let (rates, history) = {
            let samples = lock(&self.samples);
            (rates(&samples, now, &totals), history(&samples, &index.all))
        };
        let mut decisions: Vec<SeriesView> = index
            .all
            .iter()
            .zip(totals)
            .zip(rates)
            .map(|((series, total), per_second)| SeriesView {
                domain: series.domain.as_deref().map(str::to_owned),
                rule: series.rule.as_deref().map(str::to_owned),
                result: series.result,
                total,
                per_second,
            })
            .collect();
        decisions
            .sort_by(|a, b| (&a.domain, &a.rule, a.result).cmp(&(&b.domain, &b.rule, b.result)));
        let config = lock(&self.config);
        Snapshot {
            now_ms: millis(now),
            window_ms: RATE_WINDOW.as_millis() as u64,
            decisions,
            history,
            top_denied: TopView::of(&lock(&self.denied)),
            top_shadow_denied: TopView::of(&lock(&self.shadow_denied)),
            quotas,
            store: StoreView {
                errors: self.store_errors.load(Ordering::Relaxed),
                health: store,
            },
            shedding,
            config: ConfigView {
                source: config.source.clone(),
                version: config.version,
                loaded_at_ms: millis(config.loaded_at),
                domains: policy.domains().map(str::to_owned).collect(),
                rules: policy.domains().map(|d| policy.rules(d).len()).sum(),
                disabled,
                last_reload: config.last_reload.clone(),
                last_error: config.last_error.clone(),
            },
        }
    }
}

/// Each series' decisions per second over the last [`RATE_WINDOW`]: from
/// the oldest sample within it to `now` (0 with no such sample).
fn rates(samples: &VecDeque<Sample>, now: Nanos, totals: &[u64]) -> Vec<f64> {
    let window = RATE_WINDOW.as_nanos() as u64;
    let base = samples.iter().find(|s| s.at < now && now - s.at <= window);
    totals
        .iter()
        .enumerate()
        .map(|(i, &total)| match base {
            Some(base) => {
                let before = base.totals.get(i).copied().unwrap_or(0);
                per_second(total.saturating_sub(before), now - base.at)
            }
            None => 0.0,
        })
        .collect()
}

/// `count` over `elapsed` nanoseconds (above zero), per second, to a
/// thousandth.
fn per_second(count: u64, elapsed: Nanos) -> f64 {
    (count as f64 * 1e12 / elapsed as f64).round() / 1e3
}

/// Per-second decisions, denials and shadow denials between consecutive
/// samples, oldest first.
fn history(samples: &VecDeque<Sample>, all: &[Arc<Series>]) -> History {
    let mut history = History {
        interval_ms: SAMPLE_EVERY.as_millis() as u64,
        decisions_per_second: Vec::with_capacity(SAMPLES),
        denied_per_second: Vec::with_capacity(SAMPLES),
        shadow_denied_per_second: Vec::with_capacity(SAMPLES),
    };
    for (before, after) in samples.iter().zip(samples.iter().skip(1)) {
        if after.at <= before.at {
            continue;
        }
        let (mut decisions, mut denied, mut shadow) = (0, 0, 0);
        for (i, total) in after.totals.iter().enumerate() {
            let delta = total.saturating_sub(before.totals.get(i).copied().unwrap_or(0));
            decisions += delta;
            match all.get(i).map(|s| s.result) {
                Some(OVER_LIMIT) => denied += delta,
                Some(SHADOW_OVER_LIMIT) => shadow += delta,
                _ => {}
            }
        }
        let elapsed = after.at - before.at;
        history
            .decisions_per_second
            .push(per_second(decisions, elapsed));
        history.denied_per_second.push(per_second(denied, elapsed));
        history
            .shadow_denied_per_second
            .push(per_second(shadow, elapsed));
    }
    history
}

/// The result labels (`DescriptorVerdict::result`) of a denial and a shadow
/// rule's would-be denial.
const OVER_LIMIT: &str = "over_limit";
const SHADOW_OVER_LIMIT: &str = "shadow_over_limit";

/// Samples the counters every [`SAMPLE_EVERY`] until the shutdown signal.
pub async fn sample(live: Arc<Live>, mut stopped: watch::Receiver<()>) {
    // The first sample was taken when `live` was made.
    let first = tokio::time::Instant::now() + SAMPLE_EVERY;
    let mut ticks = tokio::time::interval_at(first, SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => live.sample(),
            _ = stopped.changed() => return,
        }
    }
}

/// The enforcer's observer that feeds a [`Live`].
pub struct Observe(pub Arc<Live>);

impl Observer for Observe {
    /// Counts each descriptor that matched a rule (and each ad-hoc check),
    /// labelled as the metrics label it; offers a denied one to the top-K.
    fn decided(&self, decided: &Decided<'_>) {
        let live = &self.0;
        if let (Some(shed), Some(domain)) = (&decided.verdict.shed, decided.domain) {
            let mut sheds = lock(&live.enforcer_shed);
            let by_tier = match sheds.get_mut(domain) {
                Some(by_tier) => by_tier,
                None => sheds.entry(domain.to_owned()).or_default(),
            };
            by_tier[shed.tier.index()] += 1;
        }
        let mut slots = None;
        for (index, verdict) in decided.verdict.descriptors.iter().enumerate() {
            let (rule, kept) = match (decided.domain, &verdict.rule) {
                (Some(_), Some(rule)) => (
                    Some(metrics::rule_label(rule)),
                    slots.get_or_insert_with(|| live.rules.slots()).get(rule),
                ),
                (Some(_), None) => continue,
                (None, _) => (None, None),
            };
            let result = verdict.result();
            let series = kept
                .and_then(|kept| kept.get(result, || live.series(decided.domain, rule, result)));
            match series {
                Some(series) => {
                    series.count.fetch_add(1, Ordering::Relaxed);
                }
                None => live.count(decided.domain, rule, result),
            }
            let top = match result {
                OVER_LIMIT => &live.denied,
                SHADOW_OVER_LIMIT => &live.shadow_denied,
                _ => continue,
            };
            with_key(decided, index, |key| {
                let denied = DeniedRef {
                    domain: decided.domain,
                    rule,
                    key,
                };
                lock(top).offer(&denied, DeniedRef::owned);
            });
        }
    }

    fn store_call(&self, _: Duration, ok: bool) {
        if !ok {
            self.0.store_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// Where [`with_key`] writes a descriptor's key: each denial would
    /// otherwise allocate one.
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Calls `f` with the key of the descriptor at `index` (see [`key_into`]):
/// an ad-hoc key as it is when short enough, else written into this
/// thread's buffer.
fn with_key<R>(decided: &Decided<'_>, index: usize, f: impl FnOnce(&str) -> R) -> R {
    if let Some(adhoc) = decided.adhoc_key
        && adhoc.len() <= KEY_BYTES
    {
        return f(adhoc);
    }
    KEY.with_borrow_mut(|key| {
        key.clear();
        key_into(key, decided, index);
        f(key)
    })
}

/// Writes into the empty `key` the key of the descriptor at `index`: its
/// entries as `key=value, ...`, or the ad-hoc key, cut to [`KEY_BYTES`].
fn key_into(key: &mut String, decided: &Decided<'_>, index: usize) {
    if let Some(adhoc) = decided.adhoc_key {
        key.push_str(adhoc);
    } else if let Some(descriptor) = decided.descriptors.get(index) {
        for (i, entry) in descriptor.entries.iter().enumerate() {
            if i > 0 {
                key.push_str(", ");
            }
            key.push_str(&entry.key);
            key.push('=');
            key.push_str(&entry.value);
            if key.len() > KEY_BYTES {
                break;
            }
        }
    }
    if key.len() > KEY_BYTES {
        let mut end = KEY_BYTES;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key.truncate(end);
        key.push('…');
    }
}

/// `/live.json`.
#[derive(Debug, Serialize)]
struct Snapshot {
    now_ms: u64,
    window_ms: u64,
    decisions: Vec<SeriesView>,
    history: History,
    top_denied: TopView,
    top_shadow_denied: TopView,
    quotas: Vec<QuotaView>,
    store: StoreView,
    shedding: Shedding,
    config: ConfigView,
}

/// One rule's quota as the Envoys of the Rate Limit Quota Service hold it,
/// summed over its buckets (the service makes it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuotaView {
    /// The policy's domain.
    pub domain: String,
    /// The rule's id.
    pub rule: String,
    /// Buckets some Envoy holds a share of.
    pub buckets: usize,
    /// Envoys holding a share, summed over the buckets.
    pub envoys: usize,
    /// Requests Envoys reported admitted: real traffic, in the current
    /// window (windowed quotas) or since each bucket was first reported
    /// (rates).
    pub allowed: u64,
    /// Requests Envoys reported denied, likewise.
    pub denied: u64,
    /// Tokens of the assignments in force.
    pub assigned: u64,
    /// A rate rule's assigned refill, tokens a second.
    pub assigned_per_second: f64,
}

/// What the live page shows of load shedding: the gateway's shedder in
/// front of its upstream, and the utilization each shedding domain's
/// service reports.
#[derive(Debug, Default, Serialize)]
pub struct Shedding {
    /// The gateway's shedder, when it has one.
    pub gateway: Option<GatewayShed>,
    /// Each domain with a `shed:` section, in name order.
    pub reported: Vec<Reported>,
}

/// The gateway's shedder at one moment.
#[derive(Debug, Serialize)]
pub struct GatewayShed {
    /// The learned limit.
    pub limit: u32,
    /// Requests forwarded and not yet answered.
    pub in_flight: u32,
    /// In flight over the limit (1 is full).
    pub utilization: f64,
    /// Whether the limit is pinned to its floor for a probe.
    pub probing: bool,
    /// Requests shed since start: critical, high, low.
    pub shed: [u64; 3],
}

impl From<&tollgate_http::Snapshot> for GatewayShed {
    fn from(snapshot: &tollgate_http::Snapshot) -> Self {
        Self {
            limit: snapshot.limit,
            in_flight: snapshot.in_flight,
            utilization: f64::from(snapshot.utilization_percent()) / 100.0,
            probing: snapshot.probing,
            shed: tollgate_http::Tier::ALL.map(|tier| snapshot.shed(tier)),
        }
    }
}

/// A shedding domain: what its service reports, and what the enforcer
/// shed in it (on those reports or on its shared budget).
#[derive(Debug, Serialize)]
pub struct Reported {
    /// The domain.
    pub domain: String,
    /// The mean of its fresh reports (1 is full); `None` with none.
    pub utilization: Option<f64>,
    /// Instances whose report is fresh.
    pub instances: usize,
    /// Requests the enforcer shed since start: critical, high, low
    /// ([`Live::enforcer_shed`]).
    pub shed: [u64; 3],
}

#[derive(Debug, Serialize)]
struct SeriesView {
    domain: Option<String>,
    rule: Option<String>,
    result: &'static str,
    total: u64,
    per_second: f64,
}

#[derive(Debug, Serialize)]
struct History {
    interval_ms: u64,
    decisions_per_second: Vec<f64>,
    denied_per_second: Vec<f64>,
    shadow_denied_per_second: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct TopView {
    capacity: usize,
    denials: u64,
    max_error: u64,
    keys: Vec<KeyView>,
}

impl TopView {
    fn of(top: &SpaceSaving<Denied>) -> Self {
        Self {
            capacity: top.capacity(),
            denials: top.offers(),
            max_error: top.max_error(),
            keys: top
                .top()
                .into_iter()
                .map(|c| KeyView {
                    domain: c.key.domain.as_deref().map(str::to_owned),
                    rule: c.key.rule.as_deref().map(str::to_owned),
                    key: c.key.key.to_string(),
                    count: c.count,
                    error: c.error,
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
struct KeyView {
    domain: Option<String>,
    rule: Option<String>,
    key: String,
    count: u64,
    error: u64,
}

#[derive(Debug, Serialize)]
struct StoreView {
    /// Store calls that failed.
    errors: u64,
    #[serde(flatten)]
    health: Option<StoreHealth>,
}

#[derive(Debug, Serialize)]
struct ConfigView {
    source: String,
    version: u64,
    loaded_at_ms: u64,
    domains: Vec<String>,
    rules: usize,
    disabled: Vec<Disabled>,
    last_reload: Option<ReloadSeen>,
    last_error: Option<ReloadSeen>,
}

/// A rule or domain the kill switch turned off.
#[derive(Debug, Serialize)]
struct Disabled {
    domain: String,
    rule: Option<String>,
}

/// `GET /`: the page. It holds no data, so it needs no token.
pub async fn page() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(PAGE_POLICY),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
        PAGE,
    )
        .into_response()
}

/// `GET /live.json`'s answer: what `live` shows of `policy`, with the rules
/// and domains the kill switch turned off, what the store says of itself,
/// the quotas Envoys hold and the state of load shedding.
pub fn json(
    live: &Live,
    policy: &Policy,
    disabled: impl IntoIterator<Item = (String, Option<String>)>,
    store: Option<StoreHealth>,
    quotas: Vec<QuotaView>,
    shedding: Shedding,
) -> Response {
    let disabled = disabled
        .into_iter()
        .map(|(domain, rule)| Disabled { domain, rule })
        .collect();
    let snapshot = live.snapshot(policy, disabled, store, quotas, shedding);
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        Json(snapshot),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use tollgate_policy::{Check, Enforcer, Request as CheckRequest};
    use tollgate_store::{MemoryConfig, MemoryStore};

    use super::*;

    /// `live`'s snapshot of `policy` as JSON, with nothing disabled, no
    /// store, no quotas and no shedding.
    fn bare_json(live: &Live, policy: &Policy) -> serde_json::Value {
        serde_json::to_value(live.snapshot(
            policy,
            Vec::new(),
            None,
            Vec::new(),
            Shedding::default(),
        ))
        .expect("serializable")
    }

    /// A clock the test moves.
    #[derive(Debug, Default)]
    struct Manual(AtomicU64);

    impl Clock for Manual {
        fn now(&self) -> Nanos {
            self.0.load(Ordering::Relaxed)
        }
    }

    const POLICY: &str = "
domain: api
rules:
  - name: per-user
    match: [{key: user}]
    algorithm: token-bucket
    limit: {requests: 2, per: 1h}
  - name: trial
    match: [{key: plan}]
    algorithm: token-bucket
    limit: {requests: 1, per: 1h}
    shadow: true
";

    fn descriptor(key: &str, value: &str) -> tollgate_policy::Descriptor {
        tollgate_policy::Descriptor {
            entries: vec![tollgate_policy::Entry::new(key, value)],
            ..tollgate_policy::Descriptor::default()
        }
    }

    /// Decides one request of domain `api`.
    async fn enforce(
        enforcer: &Enforcer<MemoryStore<Arc<dyn Clock>>>,
        descriptors: &[tollgate_policy::Descriptor],
    ) {
        let request = CheckRequest {
            domain: "api",
            descriptors,
            hits_addend: 1,
        };
        let _ = enforcer
            .enforce(Check::Policy(request))
            .await
            .expect("valid");
    }

    #[tokio::test]
    async fn counts_rates_and_denied_keys_follow_the_decisions() {
        let clock = Arc::new(Manual::default());
        clock.0.store(1_000_000_000_000, Ordering::Relaxed);
        let live = Arc::new(Live::new(clock.clone(), "test".into()));
        let policy = Policy::parse("api.yaml", POLICY).expect("a valid policy");
        let store =
            MemoryStore::with_clock(MemoryConfig::default(), clock.clone() as Arc<dyn Clock>);
        let enforcer = Enforcer::new(policy, store)
            .with_clock(clock.clone())
            .with_observer(Arc::new(Observe(Arc::clone(&live))));
        live.sample();
        clock.0.fetch_add(2_000_000_000, Ordering::Relaxed);
        for (user, times) in [("alice", 2), ("mallory", 6)] {
            for _ in 0..times {
                enforce(
                    &enforcer,
                    &[descriptor("user", user), descriptor("plan", "trial")],
                )
                .await;
            }
        }
        let json = bare_json(&live, &enforcer.policy());
        let series = |rule: &str, result: &str| {
            json["decisions"]
                .as_array()
                .expect("a list")
                .iter()
                .find(|s| s["rule"] == rule && s["result"] == result)
                .map(|s| {
                    (
                        s["total"].as_u64().unwrap(),
                        s["per_second"].as_f64().unwrap(),
                    )
                })
        };
        // alice 2 ok; mallory 2 ok, 4 over: 8 decisions over 2 seconds.
        assert_eq!(series("per-user", "ok"), Some((4, 2.0)));
        assert_eq!(series("per-user", "over_limit"), Some((4, 2.0)));
        assert_eq!(series("trial", "ok"), Some((1, 0.5)));
        assert_eq!(series("trial", "shadow_over_limit"), Some((7, 3.5)));
        let top = &json["top_denied"];
        assert_eq!(top["denials"], 4);
        assert_eq!(top["max_error"], 0);
        assert_eq!(top["keys"][0]["key"], "user=mallory");
        assert_eq!(top["keys"][0]["count"], 4);
        assert_eq!(json["top_shadow_denied"]["keys"][0]["key"], "plan=trial");
        assert_eq!(json["top_shadow_denied"]["keys"][0]["count"], 7);
        assert_eq!(json["config"]["version"], 1);
        assert_eq!(json["config"]["rules"], 2);
        // A second sample makes one point of history.
        live.sample();
        let json = bare_json(&live, &enforcer.policy());
        assert_eq!(
            json["history"]["decisions_per_second"],
            serde_json::json!([8.0])
        );
        assert_eq!(
            json["history"]["denied_per_second"],
            serde_json::json!([2.0])
        );
        assert_eq!(
            json["history"]["shadow_denied_per_second"],
            serde_json::json!([3.5])
        );
    }

    /// A rule keeps its series for the page that made them: a second page
    /// watching the same policy (another enforcer on the same handle) still
    /// counts only the decisions it saw.
    #[tokio::test]
    async fn pages_sharing_a_policy_count_their_own_decisions() {
        let clock: Arc<dyn Clock> = Arc::new(Manual::default());
        let handle = tollgate_policy::PolicyHandle::new(
            Policy::parse("api.yaml", POLICY).expect("a valid policy"),
        );
        let page = || Arc::new(Live::new(Arc::clone(&clock), "test".into()));
        let (first, second) = (page(), page());
        let enforcer = |live: &Arc<Live>| {
            let store = MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(&clock));
            Enforcer::new(handle.clone(), store).with_observer(Arc::new(Observe(Arc::clone(live))))
        };
        for (live, checks) in [(&first, 2), (&second, 1), (&first, 1)] {
            let enforcer = enforcer(live);
            for _ in 0..checks {
                enforce(&enforcer, &[descriptor("user", "alice")]).await;
            }
        }
        let ok = |live: &Live| {
            let json = bare_json(live, &handle.guard());
            json["decisions"]
                .as_array()
                .expect("a list")
                .iter()
                .find(|s| s["rule"] == "per-user" && s["result"] == "ok")
                .map(|s| s["total"].as_u64().unwrap())
        };
        assert_eq!(ok(&first), Some(3));
        assert_eq!(ok(&second), Some(1));
    }

    /// A reload numbers the rules anew (here in the other order): each rule
    /// still counts in its own series, as does a decision of the old policy
    /// made after the reload (a request in flight across it).
    #[tokio::test]
    async fn a_reload_keeps_each_rule_counting_in_its_own_series() {
        const REVERSED: &str = "
domain: api
rules:
  - name: trial
    match: [{key: plan}]
    algorithm: token-bucket
    limit: {requests: 1, per: 1h}
    shadow: true
  - name: per-user
    match: [{key: user}]
    algorithm: token-bucket
    limit: {requests: 2, per: 1h}
";
        let clock: Arc<dyn Clock> = Arc::new(Manual::default());
        let live = Arc::new(Live::new(Arc::clone(&clock), "test".into()));
        let parse = |text| Policy::parse("api.yaml", text).expect("a valid policy");
        let old = parse(POLICY);
        // Read before the reload's policy: what a request in flight holds.
        let in_flight = parse(POLICY);
        let new = parse(REVERSED);
        let index = |policy: &Policy, name: &str| {
            let rule = policy.rules("api").iter().find(|r| r.id() == name);
            rule.and_then(|r| r.index()).expect("numbered").index()
        };
        assert_ne!(index(&old, "per-user"), index(&new, "per-user"));
        let observed = |policy| {
            let store = MemoryStore::with_clock(MemoryConfig::default(), Arc::clone(&clock));
            Enforcer::new(policy, store).with_observer(Arc::new(Observe(Arc::clone(&live))))
        };
        let enforcer = observed(old);
        let both = [descriptor("user", "alice"), descriptor("plan", "trial")];
        enforce(&enforcer, &both).await;
        enforcer.policy_handle().store(new);
        enforce(&enforcer, &both).await;
        enforce(&observed(in_flight), &both).await;
        let json = bare_json(&live, &enforcer.policy());
        // Every series of the label set, so a rule counted in two shows.
        let totals = |rule: &str, result: &str| {
            let all = json["decisions"].as_array().expect("a list").iter();
            all.filter(|s| s["rule"] == rule && s["result"] == result)
                .map(|s| s["total"].as_u64().unwrap())
                .collect::<Vec<_>>()
        };
        // The in-flight request has a store of its own: admitted by both.
        assert_eq!(totals("per-user", "ok"), [3]);
        assert_eq!(totals("trial", "ok"), [2]);
        assert_eq!(totals("trial", "shadow_over_limit"), [1]);
        assert!(totals("per-user", "over_limit").is_empty());
    }

    #[test]
    fn long_keys_are_cut_at_a_character_boundary() {
        let descriptors = [descriptor("k", &"é".repeat(300))];
        let verdict = tollgate_policy::Verdict {
            descriptors: Vec::new(),
            started_at: 0,
            permit: tollgate_policy::Permit::default(),
            shed: None,
        };
        let decided = Decided {
            domain: Some("api"),
            descriptors: &descriptors,
            verdict: &verdict,
            hits_addend: 1,
            adhoc_key: None,
        };
        let key = with_key(&decided, 0, str::to_owned);
        assert!(key.len() <= KEY_BYTES + '…'.len_utf8(), "{}", key.len());
        assert!(key.starts_with("k=éé") && key.ends_with('…'));
        let long = "x".repeat(KEY_BYTES + 1);
        let adhoc = Decided {
            adhoc_key: Some(&long),
            ..decided
        };
        let key = with_key(&adhoc, 0, str::to_owned);
        assert!(key.len() <= KEY_BYTES + '…'.len_utf8() && key.ends_with('…'));
    }

    /// The top-K finds an owned key by its borrowed form: both hash alike
    /// and compare equal, and each field tells keys apart.
    #[test]
    fn a_borrowed_denied_key_finds_its_owned_form() {
        let mut top = SpaceSaving::new(4);
        let offer = |top: &mut SpaceSaving<Denied>, domain, rule, key| {
            let denied = DeniedRef { domain, rule, key };
            top.offer(&denied, DeniedRef::owned);
        };
        for _ in 0..3 {
            offer(&mut top, Some("api"), Some("per-ip"), "ip=1");
        }
        offer(&mut top, None, Some("per-ip"), "ip=1");
        offer(&mut top, Some("api"), None, "ip=1");
        offer(&mut top, Some("api"), Some("per-ip"), "ip=2");
        let counts: Vec<u64> = top.top().iter().map(|c| c.count).collect();
        assert_eq!(counts, [3, 1, 1, 1]);
        assert_eq!(top.max_error(), 1);
    }
}
