//! The rate limit response headers, made in one place.
//!
//! Every response the layer (and, later, the gateway) sends carries them,
//! allowed or denied. [`HeaderStyle`] says which families to emit:
//!
//! | family | headers | value |
//! | --- | --- | --- |
//! | `x_ratelimit` | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` | the most restrictive limit's capacity, what it has left, and when it is full again as epoch seconds |
//! | `reset_after` | `X-RateLimit-Reset-After` | seconds until it is full again, with three decimals (Discord) |
//! | `bucket` | `X-RateLimit-Bucket` | the shared bucket that limit spends, when it has one (Discord) |
//! | `ietf` | `RateLimit-Policy`, `RateLimit` | [`DRAFT`]'s structured fields: every limit's policy, and the most restrictive one's service limit (every limit's, with `every_limit`) |
//! | `envoy` | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` | envoyproxy/ratelimit's: the most restrictive limit's quota, what it has left, and the seconds until it is full again (a delta, not an epoch); what `tollgate serve`'s Envoy answers put in `response_headers_to_add` as its `x-ratelimit` family |
//! | `retry_after` | `Retry-After` | on a deny: delta-seconds, rounded up, at least 1 |
//!
//! **The reset is stable.** `X-RateLimit-Reset` is
//! `ceil((now + reset_after) / 1 s)`, where `now` is the wall-clock time in
//! nanoseconds since the Unix epoch that the caller read (before asking the
//! store) and `reset_after` is the store's exact integer answer. While nothing
//! is admitted the state's reset instant does not move, so two reads at
//! different times give the same second (GitHub's "wobble" bug cannot happen).
//! Rounding up means a client that waits for the announced second never comes
//! back early.

use std::borrow::Cow;
use std::cell::RefCell;
use std::time::Duration;

use bytes::BytesMut;
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;
use tollgate_core::{Algorithm, Decision, Nanos, Quota};
use tollgate_policy::Verdict;

/// The version of the IETF draft whose `RateLimit-Policy` and `RateLimit`
/// these headers follow: -11 (May 2026), with -10's wire syntax, `r` the
/// available quota and `t` the effective window.
pub const DRAFT: &str = "draft-ietf-httpapi-ratelimit-headers-11";

/// `X-RateLimit-Limit`: the capacity of the most restrictive limit.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: what it has left after this request.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: when it is full again, in seconds since the Unix epoch.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `X-RateLimit-Reset-After`: seconds until it is full again, e.g. `1.250`.
pub const X_RATELIMIT_RESET_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-reset-after");
/// `X-RateLimit-Bucket`: the shared bucket it spends.
pub const X_RATELIMIT_BUCKET: HeaderName = HeaderName::from_static("x-ratelimit-bucket");
/// `RateLimit-Policy`: every limit that applied, as [`DRAFT`] quota policy items.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: the most restrictive limit, as a [`DRAFT`] service limit item.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Which header families to emit.
///
/// The default is the widely read pair, `X-RateLimit-*` and the IETF fields,
/// and `Retry-After` on a deny. [`HeaderStyle::ENVOY`] is what Envoy's Rate
/// Limit Service answers carry (`tollgate serve`'s gRPC API and `POST /json`).
/// [`HeaderStyle::ALL`] adds Discord's `X-RateLimit-Reset-After` and
/// `X-RateLimit-Bucket`, which `tollgate-client` uses when present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderStyle {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`
    /// (GitHub, Stripe).
    pub x_ratelimit: bool,
    /// `X-RateLimit-Reset-After` (Discord).
    pub reset_after: bool,
    /// `X-RateLimit-Bucket` (Discord), when the reported limit is a shared bucket.
    pub bucket: bool,
    /// `RateLimit-Policy` and `RateLimit` ([`DRAFT`]).
    pub ietf: bool,
    /// `RateLimit` lists every limit that applied, each with its own `r` and
    /// `t`, rather than the most restrictive alone (as `RateLimit-Policy`
    /// always does); with `ietf`.
    pub every_limit: bool,
    /// envoyproxy/ratelimit's `X-RateLimit-*`: the reset in seconds from now.
    /// Replaces `x_ratelimit`'s values when both are set.
    pub envoy: bool,
    /// `Retry-After` on a deny.
    pub retry_after: bool,
}

impl Default for HeaderStyle {
    fn default() -> Self {
        Self {
            x_ratelimit: true,
            reset_after: false,
            bucket: false,
            ietf: true,
            every_limit: false,
            envoy: false,
            retry_after: true,
        }
    }
}

/// One limit that applied to a request, as the headers describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitReport<'a> {
    /// The policy's name in `RateLimit-Policy` and `RateLimit`: the rule's
    /// name, or its shared bucket's.
    pub name: &'a str,
    /// The quota the policy allocates per `window` (the draft's `q`).
    pub quota: u64,
    /// The window the quota is counted over; `None` for a concurrency limit.
    pub window: Option<Duration>,
    /// Whether the quota counts requests in flight rather than requests.
    pub concurrency: bool,
    /// The shared bucket the limit spends, if any.
    pub bucket: Option<&'a str>,
    /// What the store decided.
    pub decision: Decision,
}

impl<'a> LimitReport<'a> {
    /// The report of a limit of `quota` counted by `algorithm`.
    pub fn new(name: &'a str, quota: &Quota, algorithm: Algorithm, decision: Decision) -> Self {
        let concurrency = algorithm == Algorithm::Concurrency;
        Self {
            name,
            quota: quota.limit(),
            window: (!concurrency).then(|| quota.period()),
            concurrency,
            bucket: None,
            decision,
        }
    }

    /// The same report, naming the shared bucket the limit spends.
    pub fn with_bucket(self, bucket: Option<&'a str>) -> Self {
        Self { bucket, ..self }
    }
}

impl HeaderStyle {
    /// Every family.
    pub const ALL: Self = Self {
        x_ratelimit: true,
        reset_after: true,
        bucket: true,
        ietf: true,
        every_limit: false,
        envoy: false,
        retry_after: true,
    };

    /// No family: only `Retry-After` on a deny.
    pub const NONE: Self = Self {
        x_ratelimit: false,
        reset_after: false,
        bucket: false,
        ietf: false,
        every_limit: false,
        envoy: false,
        retry_after: true,
    };

    /// envoyproxy/ratelimit's headers, without `Retry-After` (Envoy's rate
    /// limit filter answers the client itself).
    pub const ENVOY: Self = Self {
        x_ratelimit: false,
        reset_after: false,
        bucket: false,
        ietf: false,
        every_limit: false,
        envoy: true,
        retry_after: false,
    };

    /// The most headers [`HeaderStyle::write`] sets for one request,
    /// admitted or not: room to reserve in a response's map, which takes a
    /// large allocation if it has to grow.
    pub fn most_headers(&self, allowed: bool) -> usize {
        3 * usize::from(self.x_ratelimit || self.envoy)
            + usize::from(self.reset_after)
            + usize::from(self.bucket)
            + 2 * usize::from(self.ietf)
            + usize::from(self.retry_after && !allowed)
    }

    /// Writes the headers for the limits that applied to one request into
    /// `headers`, replacing any of the same name. `now` is the wall-clock time
    /// in nanoseconds since the Unix epoch, read before the store was asked.
    ///
    /// The `X-RateLimit-*` headers and `RateLimit` describe the most
    /// restrictive limit ([`most_restrictive`]); `RateLimit-Policy` lists every
    /// limit once. Nothing is written when no limit applied.
    pub fn write(&self, limits: &[LimitReport<'_>], now: Nanos, headers: &mut HeaderMap) {
        let Some(reported) = most_restrictive(limits) else {
            return;
        };
        let d = &reported.decision;
        // Every value is written into this thread's buffer and split off
        // it (see `Values::with`).
        Values::with(|values| {
            // The envoy family's values replace these.
            if self.x_ratelimit && !self.envoy {
                headers.insert(X_RATELIMIT_LIMIT, repeated(Repeated::Limit, d.limit()));
                headers.insert(X_RATELIMIT_REMAINING, values.number(d.remaining()));
                headers.insert(
                    X_RATELIMIT_RESET,
                    repeated(Repeated::Reset, reset_epoch_secs(now, d.reset_after())),
                );
            }
            if self.reset_after {
                headers.insert(X_RATELIMIT_RESET_AFTER, seconds_millis(d.reset_after()));
            }
            if self.bucket
                && let Some(bucket) = reported.bucket.and_then(|b| HeaderValue::from_str(b).ok())
            {
                headers.insert(X_RATELIMIT_BUCKET, bucket);
            }
            if self.ietf {
                if let Some(policy) = policy_field(limits, values) {
                    headers.insert(RATELIMIT_POLICY, policy);
                }
                let limit = if self.every_limit {
                    service_limit_field(limits, values)
                } else {
                    service_limit_field([reported], values)
                };
                if let Some(limit) = limit {
                    headers.insert(RATELIMIT, limit);
                }
            }
            if self.envoy {
                for (name, value) in [X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET]
                    .into_iter()
                    .zip(envoy_values(reported))
                {
                    headers.insert(name, values.number(value));
                }
            }
            if self.retry_after && !d.allowed() {
                headers.insert(RETRY_AFTER, values.number(retry_after_secs(d)));
            }
        });
    }
}

/// A header family name that [`HeaderStyle`]'s parser does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown rate limit header family {0:?}; expected a comma-separated list of x-ratelimit, reset-after, bucket, draft, draft-every-limit, envoy, or one of default, all, none"
)]
pub struct UnknownFamily(pub String);

impl std::str::FromStr for HeaderStyle {
    type Err = UnknownFamily;

    /// A comma-separated list of families: `x-ratelimit`, `reset-after`,
    /// `bucket`, `draft` (`RateLimit-Policy` and the most restrictive
    /// limit's `RateLimit`), `draft-every-limit` (`RateLimit` listing every
    /// limit), `envoy`; or `default`, `all`, `none` alone. `Retry-After` is
    /// sent on a deny in every style but `envoy` alone.
    fn from_str(list: &str) -> Result<Self, Self::Err> {
        match list.trim() {
            "default" => return Ok(Self::default()),
            "all" => return Ok(Self::ALL),
            "none" => return Ok(Self::NONE),
            "envoy" => return Ok(Self::ENVOY),
            _ => {}
        }
        let mut style = Self::NONE;
        for family in list.split(',').map(str::trim) {
            match family {
                "x-ratelimit" => style.x_ratelimit = true,
                "reset-after" => style.reset_after = true,
                "bucket" => style.bucket = true,
                "draft" => style.ietf = true,
                "draft-every-limit" => {
                    style.ietf = true;
                    style.every_limit = true;
                }
                "envoy" => style.envoy = true,
                other => return Err(UnknownFamily(other.to_owned())),
            }
        }
        Ok(style)
    }
}

/// Room for the values of one response's headers, most of the time.
const VALUES_CAPACITY: usize = 128;

/// What a thread's values buffer takes when it runs out: room for the
/// values of a few dozen responses.
const VALUES_BLOCK: usize = 4096;

thread_local! {
    /// The buffer each thread writes header values into.
    static VALUES: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// Header values written one after the other into one buffer.
struct Values(BytesMut);

impl Values {
    /// Runs `write` with this thread's values buffer, with room for one
    /// response's values. Each value is split off the buffer and shares its
    /// block, so a response's values take no allocation of their own; a
    /// block is reused from its start once every value made from it has
    /// been dropped, or left to the values still holding it.
    fn with<R>(write: impl FnOnce(&mut Values) -> R) -> R {
        VALUES.with_borrow_mut(|buffer| {
            if buffer.capacity() < VALUES_CAPACITY {
                buffer.reserve(VALUES_BLOCK);
            }
            let mut values = Values(std::mem::take(buffer));
            let written = write(&mut values);
            *buffer = values.0;
            written
        })
    }

    /// A decimal number.
    fn number(&mut self, n: u64) -> HeaderValue {
        self.0
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.take()
    }

    /// Whatever was written since the last value.
    fn take(&mut self) -> HeaderValue {
        HeaderValue::from_maybe_shared(self.0.split().freeze())
            .expect("digits and printable ASCII are a valid header value")
    }
}

/// The limit the headers report: on a deny, the denying limit that asks the
/// client to wait longest; on an allow, the one with the fewest units left
/// (then the latest reset): [`tollgate_core::most_restrictive`].
pub fn most_restrictive<'r, 'a>(limits: &'r [LimitReport<'a>]) -> Option<&'r LimitReport<'a>> {
    tollgate_core::most_restrictive(limits, |limit| &limit.decision)
}

/// How a limit checked without a rule (an ad-hoc limit) is named in
/// `RateLimit-Policy`: its key is the caller's and may be anything.
pub const ADHOC_NAME: &str = "adhoc";

/// What the headers of an answer to `verdict` describe: every enforcing limit
/// that was decided, named by its shared bucket, else its rule. The same for
/// every door that answers with these headers.
pub fn reports(verdict: &Verdict) -> SmallVec<[LimitReport<'_>; 4]> {
    verdict
        .descriptors
        .iter()
        .filter(|d| d.enforcing())
        .filter_map(|d| {
            let decision = d.decision?;
            let rule = d.rule.as_deref();
            let bucket = rule.and_then(|r| r.bucket());
            let name = bucket.or(rule.map(|r| r.id())).unwrap_or(ADHOC_NAME);
            let report = match (d.applied, d.envoy_limit) {
                (Some((quota, algorithm)), _) => {
                    LimitReport::new(name, &quota, algorithm, decision)
                }
                // A rule that blocks everything: a quota of zero per unit.
                (None, Some((_, unit))) => LimitReport {
                    name,
                    quota: 0,
                    window: Some(unit.duration()),
                    concurrency: false,
                    bucket: None,
                    decision,
                },
                (None, None) => return None,
            };
            Some(report.with_bucket(bucket))
        })
        .collect()
}

/// `Retry-After` for a denied decision, in whole seconds: its `retry_after`
/// rounded up, or, when no wait is known (a concurrency limit, a cost that can
/// never pass, a rule that blocks everything), its `reset_after` rounded up;
/// never less than 1, so a client always backs off.
pub fn retry_after_secs(decision: &Decision) -> u64 {
    ceil_secs(decision.retry_after().unwrap_or(decision.reset_after())).max(1)
}

/// `X-RateLimit-Reset`: `ceil((now + reset_after) / 1 s)`, with `now` in
/// nanoseconds since the Unix epoch.
pub fn reset_epoch_secs(now: Nanos, reset_after: Duration) -> u64 {
    let at = u128::from(now).saturating_add(reset_after.as_nanos());
    u64::try_from(at.div_ceil(NANOS_PER_SEC)).unwrap_or(u64::MAX)
}

/// The [`HeaderStyle::envoy`] family as envoyproxy/ratelimit spells it in
/// `response_headers_to_add` (where the case is kept), with its values: the
/// most restrictive limit's quota, what it has left, and the seconds until
/// it is full again. `None` when no limit applied. For services that answer
/// in name/value pairs rather than a `HeaderMap` (Envoy's Rate Limit
/// Service); [`HeaderStyle::write`] writes the same values.
pub fn envoy_headers(limits: &[LimitReport<'_>]) -> Option<[(&'static str, u64); 3]> {
    let reported = most_restrictive(limits)?;
    let [limit, remaining, reset] = envoy_values(reported);
    Some([
        ("X-RateLimit-Limit", limit),
        ("X-RateLimit-Remaining", remaining),
        ("X-RateLimit-Reset", reset),
    ])
}

/// The envoy family's values for `reported`: quota, remaining, reset seconds.
fn envoy_values(reported: &LimitReport<'_>) -> [u64; 3] {
    let d = &reported.decision;
    [reported.quota, d.remaining(), ceil_secs(d.reset_after())]
}

/// Whole milliseconds, rounded up, so a wait that is not over never reads
/// as zero.
pub fn ceil_millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Seconds with three decimals, rounded up to the millisecond: `1.250`.
fn seconds_millis(d: Duration) -> HeaderValue {
    let millis = d.as_nanos().div_ceil(1_000_000);
    let text = format!("{}.{:03}", millis / 1000, millis % 1000);
    HeaderValue::from_str(&text).expect("digits and a dot are a valid header value")
}

/// The draft's `q` and `w` for a quota: whole-second windows as they are;
/// other windows stretched to the next whole second (at least one) with the
/// quota scaled down to match, so the advertised rate is never above the
/// enforced one: 10 per 500 ms is `q=20;w=1`, 3 per 1.5 s is `q=4;w=2`.
fn draft_window(quota: u64, window: Duration) -> (u64, u64) {
    let period = window.as_nanos().max(1);
    if period.is_multiple_of(NANOS_PER_SEC) {
        let w = u64::try_from(period / NANOS_PER_SEC).unwrap_or(u64::MAX);
        return (quota, w);
    }
    let w = period.div_ceil(NANOS_PER_SEC);
    let q = u128::from(quota) * w * NANOS_PER_SEC / period;
    (
        u64::try_from(q).unwrap_or(u64::MAX),
        u64::try_from(w).unwrap_or(u64::MAX),
    )
}

/// The largest structured-field Integer: they stop at 15 digits.
const INTEGER_MAX: u64 = 999_999_999_999_999;

/// A name as a structured-field String: printable ASCII only (the serializer
/// escapes `"` and `\`); anything else becomes `?`.
fn sf_string(name: &str) -> Cow<'_, str> {
    if name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(
            name.chars()
                .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
                .collect(),
        )
    }
}

/// A structured-field List of Strings with parameters (RFC 8941 §4.1), the
/// only shape these headers use, written straight into the response's
/// [`Values`]: every response carries two of them, and a general serializer
/// costs more than the rate limit check they describe. The tests parse the
/// output with the `sfv` crate.
struct List<'v> {
    values: &'v mut Values,
    empty: bool,
}

impl<'v> List<'v> {
    fn new(values: &'v mut Values) -> Self {
        Self {
            values,
            empty: true,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.values.0.extend_from_slice(bytes);
    }

    /// Starts a member: `name` as a String (sanitized by [`sf_string`]).
    fn member(&mut self, name: &str) -> &mut Self {
        if !self.empty {
            self.push(b", ");
        }
        self.empty = false;
        self.push(b"\"");
        // Names are pushed in runs between the bytes to escape, most of
        // them whole.
        let name = sf_string(name);
        let mut rest = name.as_bytes();
        while let Some(at) = rest.iter().position(|&b| b == b'"' || b == b'\\') {
            self.push(&rest[..at]);
            self.push(b"\\");
            self.push(&rest[at..=at]);
            rest = &rest[at + 1..];
        }
        self.push(rest);
        self.push(b"\"");
        self
    }

    /// `;key=n`, an Integer parameter (clamped to [`INTEGER_MAX`]).
    fn integer(&mut self, key: &str, n: u64) -> &mut Self {
        self.push(b";");
        self.push(key.as_bytes());
        self.push(b"=");
        self.push(itoa::Buffer::new().format(n.min(INTEGER_MAX)).as_bytes());
        self
    }

    /// `;key="value"`, a String parameter (`value` needs no escaping).
    fn string(&mut self, key: &str, value: &str) -> &mut Self {
        self.push(b";");
        self.push(key.as_bytes());
        self.push(b"=\"");
        self.push(value.as_bytes());
        self.push(b"\"");
        self
    }

    /// The header value; `None` for an empty list.
    fn finish(self) -> Option<HeaderValue> {
        if self.empty {
            return None;
        }
        // Printable ASCII only, by construction.
        Some(self.values.take())
    }
}

thread_local! {
    /// The last `RateLimit-Policy` made on this thread, with what it was
    /// made of. The field is the same for every request of the same rules
    /// (their names and quotas), so a request like the previous one reuses
    /// it rather than formatting it again; keyed by value, so a rule changed
    /// by a reload makes it anew.
    static LAST_POLICY: RefCell<Option<(Vec<PolicyItem>, HeaderValue)>> =
        const { RefCell::new(None) };

    /// The last value of each [`Repeated`] number made on this thread, with
    /// the number it spells.
    static LAST_NUMBERS: RefCell<[Option<(u64, HeaderValue)>; 2]> =
        const { RefCell::new([None, None]) };
}

/// Header numbers that most responses repeat from the one before: a
/// limit's capacity, and the second it is full again (the same for every
/// request within a second while it is not exhausted).
#[derive(Debug, Clone, Copy)]
enum Repeated {
    /// `X-RateLimit-Limit`.
    Limit,
    /// `X-RateLimit-Reset`.
    Reset,
}

/// `n` as a header value: the one this thread made last for `which`, when
/// it spells the same number, else a new one (of its own, so that the memo
/// does not hold on to a response's buffer).
fn repeated(which: Repeated, n: u64) -> HeaderValue {
    LAST_NUMBERS.with_borrow_mut(|last| {
        let slot = &mut last[which as usize];
        match slot {
            Some((made, value)) if *made == n => value.clone(),
            _ => {
                let value = HeaderValue::from(n);
                *slot = Some((n, value.clone()));
                value
            }
        }
    })
}

/// What one limit puts in `RateLimit-Policy`.
#[derive(Debug, PartialEq, Eq)]
struct PolicyItem {
    name: Box<str>,
    quota: u64,
    window: Option<Duration>,
    concurrency: bool,
}

impl PolicyItem {
    fn of(limit: &LimitReport<'_>) -> Self {
        Self {
            name: limit.name.into(),
            quota: limit.quota,
            window: limit.window,
            concurrency: limit.concurrency,
        }
    }

    fn describes(&self, limit: &LimitReport<'_>) -> bool {
        *self.name == *limit.name
            && self.quota == limit.quota
            && self.window == limit.window
            && self.concurrency == limit.concurrency
    }
}

/// `RateLimit-Policy`: one quota policy item per distinct name, in order;
/// the last one made on this thread when `limits` are the same
/// ([`LAST_POLICY`]).
fn policy_field(limits: &[LimitReport<'_>], values: &mut Values) -> Option<HeaderValue> {
    LAST_POLICY.with_borrow_mut(|last| {
        if let Some((items, value)) = last.as_ref()
            && items.len() == limits.len()
            && items
                .iter()
                .zip(limits)
                .all(|(item, limit)| item.describes(limit))
        {
            return Some(value.clone());
        }
        let made = make_policy_field(limits, values)?;
        // A copy of its own, so that the memo does not hold on to the
        // response's buffer.
        let value = HeaderValue::from_bytes(made.as_bytes()).unwrap_or(made);
        *last = Some((limits.iter().map(PolicyItem::of).collect(), value.clone()));
        Some(value)
    })
}

/// `RateLimit-Policy`, formatted.
fn make_policy_field(limits: &[LimitReport<'_>], values: &mut Values) -> Option<HeaderValue> {
    let mut list = List::new(values);
    for (i, limit) in limits.iter().enumerate() {
        if limits[..i].iter().any(|l| l.name == limit.name) {
            continue;
        }
        let item = list.member(limit.name);
        match (limit.concurrency, limit.window) {
            (true, _) | (false, None) => item
                .integer("q", limit.quota)
                .string("qu", "concurrent-requests"),
            (false, Some(window)) => {
                let (q, w) = draft_window(limit.quota, window);
                item.integer("q", q).integer("w", w)
            }
        };
    }
    list.finish()
}

/// `RateLimit`: each of `reported`'s remaining units and, as `t`, seconds
/// until it is full again (on an allow) or the `Retry-After` value (on a deny,
/// so that `Retry-After` is never earlier than `t`, as the draft asks). A
/// concurrency limit has no `t` on an allow: time does not refill it. `None`
/// when `reported` is empty.
fn service_limit_field<'r, 'a: 'r>(
    reported: impl IntoIterator<Item = &'r LimitReport<'a>>,
    values: &mut Values,
) -> Option<HeaderValue> {
    let mut list = List::new(values);
    for reported in reported {
        let d = &reported.decision;
        let item = list.member(reported.name).integer("r", d.remaining());
        let t = if !d.allowed() {
            Some(retry_after_secs(d))
        } else if reported.concurrency {
            None
        } else {
            Some(ceil_secs(d.reset_after()))
        };
        if let Some(t) = t {
            item.integer("t", t);
        }
    }
    list.finish()
}

/// [`DRAFT`]'s `RateLimit-Policy` and `RateLimit` as name/value pairs, with
/// `RateLimit` listing every limit of `limits`, in order, rather than the
/// most restrictive alone: for services that answer in pairs (Envoy's Rate
/// Limit Service), whose clients may want every descriptor's state. `None`
/// when no limit applied.
pub fn draft_every_limit(limits: &[LimitReport<'_>]) -> Option<[(&'static str, HeaderValue); 2]> {
    Values::with(|values| {
        let policy = policy_field(limits, values)?;
        let limit = service_limit_field(limits, values)?;
        Some([("RateLimit-Policy", policy), ("RateLimit", limit)])
    })
}

#[cfg(test)]
mod tests {
    use tollgate_core::{FixedWindow, Gcra, StateMachine};

    use super::*;

    /// 2023-11-14T22:13:20.25Z, in nanoseconds since the epoch.
    const EPOCH: Nanos = 1_700_000_000_250_000_000;
    const SEC: Nanos = 1_000_000_000;

    fn header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
        headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn written(style: HeaderStyle, limits: &[LimitReport<'_>], now: Nanos) -> HeaderMap {
        let mut headers = HeaderMap::new();
        style.write(limits, now, &mut headers);
        headers
    }

    #[test]
    fn reset_is_stable_across_reads_with_no_admission_between() {
        // GCRA, 10 a minute: each admission moves the reset by 6 s, and reads
        // (cost 0) at different times must all announce the same second.
        let quota = Quota::per_minute(10).unwrap();
        let mut tat = Default::default();
        for _ in 0..3 {
            assert!(Gcra.step(&quota, &mut tat, EPOCH, 1).allowed());
        }
        let mut resets = Vec::new();
        for later in [0, 1, SEC - 1, 1_700 * SEC / 1000, 17 * SEC + 3] {
            let now = EPOCH + later;
            let read = Gcra.step(&quota, &mut tat, now, 0);
            let limits = [LimitReport::new("per-user", &quota, Algorithm::Gcra, read)];
            let headers = written(HeaderStyle::default(), &limits, now);
            resets.push(header(&headers, &X_RATELIMIT_RESET).unwrap().to_owned());
        }
        // Full again 18 s after EPOCH (…00.25 + 18 = …18.25), rounded up.
        assert!(resets.iter().all(|r| r == "1700000019"), "{resets:?}");

        // And a deny does not move it either.
        let mut state = Default::default();
        let window = Quota::new(2, Duration::from_secs(10)).unwrap();
        let first = (0..3)
            .map(|i| FixedWindow.step(&window, &mut state, EPOCH + i * SEC, 1))
            .last()
            .unwrap();
        let second = FixedWindow.step(&window, &mut state, EPOCH + 5 * SEC, 1);
        assert!(!first.allowed() && !second.allowed());
        let reset = |d: Decision, now| {
            let limits = [LimitReport::new("w", &window, Algorithm::FixedWindow, d)];
            header(
                &written(HeaderStyle::default(), &limits, now),
                &X_RATELIMIT_RESET,
            )
            .unwrap()
            .to_owned()
        };
        assert_eq!(
            reset(first, EPOCH + 2 * SEC),
            reset(second, EPOCH + 5 * SEC)
        );
    }

    #[test]
    fn reports_the_most_restrictive_and_lists_every_policy() {
        let per_ip = Quota::per_minute(60).unwrap();
        let global = Quota::per_second(1000).unwrap();
        let ip = Decision::allow(60, 3, Duration::from_millis(57_000));
        let all = Decision::allow(1000, 990, Duration::from_millis(10));
        let limits = [
            LimitReport::new("global", &global, Algorithm::SlidingCounter, all),
            LimitReport::new("per-ip", &per_ip, Algorithm::Gcra, ip),
        ];
        let headers = written(HeaderStyle::ALL, &limits, EPOCH);
        assert_eq!(header(&headers, &X_RATELIMIT_LIMIT), Some("60"));
        assert_eq!(header(&headers, &X_RATELIMIT_REMAINING), Some("3"));
        assert_eq!(header(&headers, &X_RATELIMIT_RESET), Some("1700000058"));
        assert_eq!(header(&headers, &X_RATELIMIT_RESET_AFTER), Some("57.000"));
        assert_eq!(
            header(&headers, &RATELIMIT_POLICY),
            Some(r#""global";q=1000;w=1, "per-ip";q=60;w=60"#)
        );
        assert_eq!(header(&headers, &RATELIMIT), Some(r#""per-ip";r=3;t=57"#));
        assert!(headers.get(RETRY_AFTER).is_none(), "only on a deny");
        assert!(
            headers.get(X_RATELIMIT_BUCKET).is_none(),
            "no bucket applied"
        );
    }

    /// 1000 a second (global) and 60 a minute (per-ip).
    fn global_and_per_ip_quotas() -> [Quota; 2] {
        [
            Quota::per_second(1000).unwrap(),
            Quota::per_minute(60).unwrap(),
        ]
    }

    /// The global limit admits with 990 left; per-ip denies, retry in 1.5 s.
    fn global_admits_per_ip_denies(quotas: &[Quota; 2]) -> [LimitReport<'_>; 2] {
        let ip = Decision::deny(
            60,
            0,
            Duration::from_millis(57_000),
            Some(Duration::from_millis(1_500)),
        );
        let all = Decision::allow(1000, 990, Duration::from_millis(10));
        [
            LimitReport::new("global", &quotas[0], Algorithm::SlidingCounter, all),
            LimitReport::new("per-ip", &quotas[1], Algorithm::Gcra, ip),
        ]
    }

    #[test]
    fn the_draft_pairs_list_every_limit() {
        let quotas = global_and_per_ip_quotas();
        let limits = global_admits_per_ip_denies(&quotas);
        let [(policy, policy_value), (limit, limit_value)] =
            draft_every_limit(&limits).expect("two limits");
        assert_eq!(policy, "RateLimit-Policy");
        assert_eq!(policy_value, r#""global";q=1000;w=1, "per-ip";q=60;w=60"#);
        assert_eq!(limit, "RateLimit");
        // Each limit's own state, the denying one's `t` its Retry-After.
        assert_eq!(limit_value, r#""global";r=990;t=1, "per-ip";r=0;t=2"#);
        let parsed: sfv::List = sfv::Parser::new(limit_value.to_str().unwrap())
            .parse()
            .unwrap();
        assert_eq!(parsed.len(), 2);
        assert!(draft_every_limit(&[]).is_none());
    }

    #[test]
    fn every_limit_lists_each_limit_in_ratelimit_and_styles_parse() {
        let quotas = global_and_per_ip_quotas();
        let limits = global_admits_per_ip_denies(&quotas);
        let style: HeaderStyle = "x-ratelimit, draft-every-limit".parse().unwrap();
        assert!(style.x_ratelimit && style.ietf && style.every_limit && style.retry_after);
        let headers = written(style, &limits, EPOCH);
        assert_eq!(
            header(&headers, &RATELIMIT),
            Some(r#""global";r=990;t=1, "per-ip";r=0;t=2"#)
        );
        assert_eq!(header(&headers, &RETRY_AFTER), Some("2"));
        // The same fields as the name/value pairs of the Envoy doors.
        let [(_, policy), (_, limit)] = draft_every_limit(&limits).unwrap();
        assert_eq!(header(&headers, &RATELIMIT_POLICY), policy.to_str().ok());
        assert_eq!(header(&headers, &RATELIMIT), limit.to_str().ok());
        let most = written("draft".parse().unwrap(), &limits, EPOCH);
        assert_eq!(header(&most, &RATELIMIT), Some(r#""per-ip";r=0;t=2"#));
        assert!(most.get(X_RATELIMIT_LIMIT).is_none());

        assert_eq!("default".parse(), Ok(HeaderStyle::default()));
        assert_eq!("all".parse(), Ok(HeaderStyle::ALL));
        assert_eq!("none".parse(), Ok(HeaderStyle::NONE));
        assert_eq!("envoy".parse(), Ok(HeaderStyle::ENVOY));
        assert_eq!(
            "x-ratelimit,draft".parse(),
            Ok(HeaderStyle::default()),
            "the default's families, spelled out"
        );
        assert_eq!(
            "x-ratelimit,github".parse::<HeaderStyle>(),
            Err(UnknownFamily("github".into()))
        );
    }

    #[test]
    fn the_values_of_successive_responses_share_a_block() {
        let quota = Quota::per_second(10).unwrap();
        let decision = Decision::allow(10, 7, Duration::from_millis(300));
        let limits = [LimitReport::new("api", &quota, Algorithm::Gcra, decision)];
        let first = written(HeaderStyle::default(), &limits, EPOCH);
        let second = written(HeaderStyle::default(), &limits, EPOCH);
        // The first response's values are held while the second's are
        // made: with a buffer per response, these would be two allocations.
        let at = |headers: &HeaderMap| headers[&X_RATELIMIT_REMAINING].as_bytes().as_ptr() as usize;
        let apart = at(&second).wrapping_sub(at(&first));
        assert!(apart < VALUES_CAPACITY, "{apart} bytes apart");
    }

    #[test]
    fn a_repeated_number_is_reused_and_a_changed_one_made_anew() {
        let at = |limit: u64, reset_after: Duration| {
            let decision = Decision::allow(limit, 1, reset_after);
            let limits = [LimitReport::new(
                "api",
                &Quota::per_second(limit).unwrap(),
                Algorithm::Gcra,
                decision,
            )];
            let headers = written(HeaderStyle::default(), &limits, EPOCH);
            (
                header(&headers, &X_RATELIMIT_LIMIT).unwrap().to_owned(),
                header(&headers, &X_RATELIMIT_RESET).unwrap().to_owned(),
            )
        };
        // 0.25 s past a second: 100 ms on ends in the next second, 1.9 s
        // in the one after that.
        let second = |s: u64| (EPOCH / SEC + s).to_string();
        let ms = Duration::from_millis;
        assert_eq!(at(10, ms(100)), ("10".to_owned(), second(1)));
        // The same number again, from the memo.
        assert_eq!(at(10, ms(100)), ("10".to_owned(), second(1)));
        // Each changed number is made anew, the other kept.
        assert_eq!(at(20, ms(100)), ("20".to_owned(), second(1)));
        assert_eq!(at(20, ms(1_900)), ("20".to_owned(), second(3)));
        assert_eq!(at(10, ms(1_900)), ("10".to_owned(), second(3)));
    }

    #[test]
    fn a_policy_like_the_last_is_reused_and_a_changed_one_made_anew() {
        let decision = Decision::allow(10, 9, Duration::from_secs(1));
        let policy = |name: &str, quota: &Quota, algorithm| {
            let limits = [LimitReport::new(name, quota, algorithm, decision)];
            let headers = written(HeaderStyle::default(), &limits, EPOCH);
            header(&headers, &RATELIMIT_POLICY).unwrap().to_owned()
        };
        let ten = Quota::per_second(10).unwrap();
        let twenty = Quota::per_second(20).unwrap();
        let per_minute = Quota::per_minute(10).unwrap();
        assert_eq!(policy("api", &ten, Algorithm::Gcra), r#""api";q=10;w=1"#);
        assert_eq!(policy("api", &ten, Algorithm::Gcra), r#""api";q=10;w=1"#);
        // Every part of an item counts: a reload that changes any of them
        // is seen at once.
        assert_eq!(policy("api", &twenty, Algorithm::Gcra), r#""api";q=20;w=1"#);
        assert_eq!(policy("apj", &twenty, Algorithm::Gcra), r#""apj";q=20;w=1"#);
        assert_eq!(
            policy("apj", &per_minute, Algorithm::Gcra),
            r#""apj";q=10;w=60"#
        );
        assert_eq!(
            policy("apj", &per_minute, Algorithm::Concurrency),
            r#""apj";q=10;qu="concurrent-requests""#
        );
        // And so does the number of limits.
        let two = [
            LimitReport::new("apj", &per_minute, Algorithm::Gcra, decision),
            LimitReport::new("all", &ten, Algorithm::Gcra, decision),
        ];
        let headers = written(HeaderStyle::default(), &two, EPOCH);
        assert_eq!(
            header(&headers, &RATELIMIT_POLICY),
            Some(r#""apj";q=10;w=60, "all";q=10;w=1"#)
        );
        assert_eq!(
            policy("apj", &per_minute, Algorithm::Gcra),
            r#""apj";q=10;w=60"#
        );
    }

    #[test]
    fn most_headers_is_what_every_style_writes_at_most() {
        let quotas = global_and_per_ip_quotas();
        let denied = global_admits_per_ip_denies(&quotas);
        let admitted = [denied[0]];
        for family in [
            "x-ratelimit",
            "reset-after",
            "bucket",
            "draft",
            "draft-every-limit",
            "envoy",
        ] {
            for other in ["", ",x-ratelimit", ",envoy", ",bucket,draft"] {
                let style: HeaderStyle = format!("{family}{other}").parse().unwrap();
                for (limits, allowed) in [(&denied[..], false), (&admitted[..], true)] {
                    let written = written(style, limits, EPOCH);
                    assert!(
                        written.len() <= style.most_headers(allowed),
                        "{family}{other}, allowed {allowed}: {written:?}"
                    );
                }
            }
        }
        let default = HeaderStyle::default();
        assert_eq!(
            written(default, &admitted, EPOCH).len(),
            default.most_headers(true)
        );
        assert_eq!(
            written(default, &denied, EPOCH).len(),
            default.most_headers(false)
        );
    }

    #[test]
    fn headers_of_the_same_name_on_the_response_are_replaced() {
        let quotas = global_and_per_ip_quotas();
        let limits = global_admits_per_ip_denies(&quotas);
        // The envoy family replaces x-ratelimit's values in either.
        for style in [HeaderStyle::ALL, "x-ratelimit,envoy,draft".parse().unwrap()] {
            let fresh = written(style, &limits, EPOCH);
            let mut upstreams = HeaderMap::new();
            upstreams.insert(X_RATELIMIT_LIMIT, HeaderValue::from_static("upstream's"));
            upstreams.append(X_RATELIMIT_LIMIT, HeaderValue::from_static("another"));
            upstreams.insert(RATELIMIT, HeaderValue::from_static("upstream's"));
            style.write(&limits, EPOCH, &mut upstreams);
            assert_eq!(upstreams, fresh);
        }
    }

    #[test]
    fn a_deny_carries_retry_after_rounded_up_and_matching_t() {
        let quota = Quota::per_second(5).unwrap();
        let denied = Decision::deny(
            5,
            0,
            Duration::from_millis(900),
            Some(Duration::from_millis(200)),
        );
        let limits = [LimitReport::new("search", &quota, Algorithm::Gcra, denied)
            .with_bucket(Some("expensive"))];
        let headers = written(HeaderStyle::ALL, &limits, EPOCH);
        assert_eq!(header(&headers, &RETRY_AFTER), Some("1"));
        assert_eq!(header(&headers, &RATELIMIT), Some(r#""search";r=0;t=1"#));
        assert_eq!(header(&headers, &X_RATELIMIT_BUCKET), Some("expensive"));
        assert_eq!(header(&headers, &X_RATELIMIT_RESET_AFTER), Some("0.900"));

        // No retry time known: the reset decides, and never less than one second.
        let never = denied
            .with_reset_after(Duration::from_millis(2_500))
            .with_retry_after(None);
        assert_eq!(retry_after_secs(&never), 3);
        let concurrency = denied
            .with_reset_after(Duration::ZERO)
            .with_retry_after(None);
        assert_eq!(retry_after_secs(&concurrency), 1);
        assert_eq!(
            retry_after_secs(&denied.with_retry_after(Some(Duration::from_secs(7)))),
            7
        );

        // With every family off, a deny still says when to come back.
        let bare = written(HeaderStyle::NONE, &limits, EPOCH);
        assert_eq!(bare.len(), 1);
        assert_eq!(header(&bare, &RETRY_AFTER), Some("1"));
    }

    #[test]
    fn a_denying_layer_outranks_a_tighter_allowing_one() {
        let q = Quota::per_second(10).unwrap();
        let allow = Decision::allow(10, 0, Duration::from_secs(1));
        let deny = Decision::deny(10, 4, Duration::from_secs(1), Some(Duration::from_secs(3)));
        let limits = [
            LimitReport::new("a", &q, Algorithm::Gcra, allow),
            LimitReport::new("b", &q, Algorithm::Gcra, deny),
        ];
        assert_eq!(most_restrictive(&limits).map(|l| l.name), Some("b"));
        assert_eq!(most_restrictive(&[]), None);
        assert!(written(HeaderStyle::ALL, &[], EPOCH).is_empty());
    }

    #[test]
    fn policy_names_are_quoted_and_escaped_and_windows_whole_seconds() {
        let decision = Decision::allow(1, 1, Duration::ZERO);
        let half = Quota::new(10, Duration::from_millis(500)).unwrap();
        let odd = Quota::new(3, Duration::from_millis(1_500)).unwrap();
        let limits = [
            LimitReport::new(r#"say "hi" \o/"#, &half, Algorithm::Gcra, decision),
            LimitReport::new("caf\u{e9}", &odd, Algorithm::FixedWindow, decision),
            LimitReport::new("in-flight", &odd, Algorithm::Concurrency, decision),
            LimitReport::new("in-flight", &odd, Algorithm::Concurrency, decision),
        ];
        let headers = written(HeaderStyle::default(), &limits, EPOCH);
        assert_eq!(
            header(&headers, &RATELIMIT_POLICY),
            Some(
                r#""say \"hi\" \\o/";q=20;w=1, "caf?";q=4;w=2, "in-flight";q=3;qu="concurrent-requests""#
            )
        );
        // Reads back as the draft's syntax.
        let parsed: sfv::List = sfv::Parser::new(header(&headers, &RATELIMIT_POLICY).unwrap())
            .parse()
            .unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(draft_window(7, Duration::from_secs(3600)), (7, 3600));
        assert_eq!(draft_window(1, Duration::from_nanos(1)), (1_000_000_000, 1));
    }

    #[test]
    fn concurrency_has_no_t_while_allowed_and_times_round_up() {
        let q = Quota::per_second(3).unwrap();
        let d = Decision::allow(3, 2, Duration::ZERO);
        let limits = [LimitReport::new("jobs", &q, Algorithm::Concurrency, d)];
        let headers = written(HeaderStyle::ALL, &limits, EPOCH);
        assert_eq!(header(&headers, &RATELIMIT), Some(r#""jobs";r=2"#));
        assert_eq!(header(&headers, &X_RATELIMIT_RESET_AFTER), Some("0.000"));
        assert_eq!(
            seconds_millis(Duration::from_nanos(1)).to_str().unwrap(),
            "0.001"
        );
        assert_eq!(reset_epoch_secs(3 * SEC, Duration::ZERO), 3);
        assert_eq!(reset_epoch_secs(3 * SEC, Duration::from_nanos(1)), 4);
        assert_eq!(reset_epoch_secs(u64::MAX, Duration::MAX), u64::MAX);
        assert_eq!(i64::from(sfv::Integer::MAX), INTEGER_MAX as i64);
    }

    #[test]
    fn integers_clamp_to_what_a_structured_field_holds() {
        let q = Quota::per_second(3).unwrap();
        let d = Decision::deny(3, u64::MAX, Duration::MAX, None);
        let limits = [LimitReport::new("k", &q, Algorithm::Gcra, d)];
        let headers = written(HeaderStyle::ALL, &limits, EPOCH);
        let field = header(&headers, &RATELIMIT).unwrap();
        // A decision holds times to the nanosecond in 64 bits: `Duration::MAX`
        // saturates at u64::MAX ns, 18446744074 s rounded up, which fits.
        assert_eq!(field, r#""k";r=999999999999999;t=18446744074"#);
        let parsed: sfv::List = sfv::Parser::new(field).parse().unwrap();
        assert_eq!(parsed.len(), 1);
    }
}
