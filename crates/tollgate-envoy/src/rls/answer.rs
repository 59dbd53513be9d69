//! envoyproxy/ratelimit's answer to a verdict, shared by its two doors: gRPC
//! `ShouldRateLimit` and `POST /json` each parse their wire format straight
//! into the enforcer's [`Request`](tollgate_policy::Request) and encode this
//! [`Answer`] back, so the two answer exactly alike (as in envoyproxy/ratelimit)
//! with no detour through the other's format.

use std::fmt;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use hyper::header::HeaderValue;
use tollgate_core::{Nanos, Store};
use tollgate_http::headers::{draft_every_limit, envoy_headers, reports};
use tollgate_policy::{
    Descriptor, DescriptorVerdict, Enforcer, Entry, LimitOverride, Metadata, MetadataValue,
    Request, RequestError, Rule, State, Unit, Verdict,
};

/// A verdict as envoyproxy/ratelimit reports it.
pub(crate) struct Answer<'a> {
    /// `overall_code`: `OK` unless a descriptor is over its limit.
    pub(crate) ok: bool,
    /// One per descriptor, in request order.
    pub(crate) statuses: Vec<Status<'a>>,
    /// `response_headers_to_add`, names as given (Envoy keeps their case).
    pub(crate) headers: Vec<(&'a str, HeaderText)>,
    /// `dynamic_metadata`, with `RESPONSE_DYNAMIC_METADATA`.
    pub(crate) dynamic_metadata: Option<Metadata>,
}

/// A header value of an [`Answer`], kept as it comes so that neither door
/// allocates a string for it: each writes it out as its format needs.
pub(crate) enum HeaderText {
    /// The `ratelimit` and `x-ratelimit` families' values.
    Number(u64),
    /// A draft field, as its serializer wrote it.
    Field(HeaderValue),
}

impl HeaderText {
    /// The value as text; a number is written into `buf`.
    pub(crate) fn as_str<'b>(&'b self, buf: &'b mut itoa::Buffer) -> &'b str {
        match self {
            HeaderText::Number(n) => buf.format(*n),
            // Printable ASCII, as the draft's serializer writes it.
            HeaderText::Field(value) => value.to_str().unwrap_or_default(),
        }
    }
}

/// One descriptor's `DescriptorStatus`.
pub(crate) struct Status<'a> {
    /// `code`: `OK` or `OVER_LIMIT`.
    pub(crate) ok: bool,
    /// `current_limit`: only where a limit was checked.
    pub(crate) current_limit: Option<CurrentLimit<'a>>,
    /// `limit_remaining` (unlimited descriptors report `u32::MAX`).
    pub(crate) limit_remaining: u32,
    /// `duration_until_reset`, where a limit was checked: whole seconds to
    /// the end of an envoyproxy/ratelimit window (see [`until_window_end`]),
    /// a native rule's exact time until it is fully available again.
    pub(crate) duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
pub(crate) struct CurrentLimit<'a> {
    /// The rule's name (envoyproxy/ratelimit's `rate_limit.name`, a native
    /// rule's `name`); empty when it has none, as for a limit override.
    pub(crate) name: &'a str,
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: Unit,
}

/// A family of rate limit headers the Envoy doors can add
/// (`--envoy-headers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum HeaderFamily {
    /// `x-ratelimit` for domains in Tollgate's format, none for
    /// envoyproxy/ratelimit's; in its mode, its `LIMIT_RESPONSE_HEADERS_ENABLED`.
    Auto,
    /// No headers.
    None,
    /// envoyproxy/ratelimit's `RateLimit-Limit`, `RateLimit-Remaining` and
    /// `RateLimit-Reset` (`LIMIT_*_HEADER` in its mode) of the descriptor
    /// its service picks.
    Ratelimit,
    /// Tollgate's `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` of the most restrictive limit.
    XRatelimit,
    /// `RateLimit-Policy` and `RateLimit` (the IETF draft's) listing every
    /// limit.
    Draft,
}

/// The header families an answer carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Families {
    ratelimit: bool,
    x_ratelimit: bool,
    draft: bool,
}

impl Families {
    /// What `auto` means for a domain outside envoyproxy/ratelimit's mode:
    /// its answers for its format (no headers by default), Tollgate's
    /// `X-RateLimit-*` for Tollgate's.
    fn auto(envoy_format: bool) -> Self {
        Self {
            x_ratelimit: !envoy_format,
            ..Self::default()
        }
    }
}

/// How the Envoy doors answer, beyond the verdict: which headers and
/// whether dynamic metadata.
#[derive(Debug, Clone)]
pub struct Reply {
    /// `None`: `auto`, chosen per domain.
    families: Option<Families>,
    /// The `ratelimit` family's names: limit, remaining, reset.
    names: [String; 3],
    /// envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`.
    dynamic_metadata: bool,
}

/// Why a [`Reply`] cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    /// `auto` or `none` in a list of families.
    #[error("--envoy-headers: auto and none stand alone, not in a list")]
    NotAlone,
}

/// How an Envoy door answered a request, as its [`Answered`] hook is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed (`OK`).
    Ok,
    /// Denied (`OVER_LIMIT`).
    OverLimit,
    /// Refused as malformed.
    Invalid,
}

/// What a door calls with each answer and the time it took to make (the
/// server counts it in its metrics).
pub type Answered = fn(Outcome, Duration);

/// envoyproxy/ratelimit's default header names (`LIMIT_LIMIT_HEADER`,
/// `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
pub const DEFAULT_NAMES: [&str; 3] = ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];

impl Default for Reply {
    fn default() -> Self {
        Self {
            families: None,
            names: DEFAULT_NAMES.map(String::from),
            dynamic_metadata: false,
        }
    }
}

impl Reply {
    /// The reply `--envoy-headers` asks for, with the `ratelimit` family
    /// named `names`.
    ///
    /// # Errors
    ///
    /// `auto` or `none` beside another family.
    pub fn new(
        families: &[HeaderFamily],
        names: [String; 3],
        dynamic_metadata: bool,
    ) -> Result<Self, ReplyError> {
        let alone = |f: &HeaderFamily| matches!(f, HeaderFamily::Auto | HeaderFamily::None);
        if families.len() > 1 && families.iter().any(alone) {
            return Err(ReplyError::NotAlone);
        }
        let families = match families {
            [] | [HeaderFamily::Auto] => None,
            list => Some(Families {
                ratelimit: list.contains(&HeaderFamily::Ratelimit),
                x_ratelimit: list.contains(&HeaderFamily::XRatelimit),
                draft: list.contains(&HeaderFamily::Draft),
            }),
        };
        Ok(Self {
            families,
            names,
            dynamic_metadata,
        })
    }

    /// The families for an answer in `domain`.
    pub(crate) fn families<S: Store>(&self, enforcer: &Enforcer<S>, domain: &str) -> Families {
        self.families
            .unwrap_or_else(|| Families::auto(enforcer.policy_handle().guard().is_envoy(domain)))
    }
}

/// The answer to `verdict`, the verdict on `request`, with the headers of
/// `families` and what `reply` asks for.
pub(crate) fn answer<'a>(
    request: &Request<'_>,
    verdict: &'a Verdict,
    reply: &'a Reply,
    families: Families,
) -> Answer<'a> {
    let statuses: Vec<Status<'a>> = verdict
        .descriptors
        .iter()
        .map(|d| status(d, verdict.started_at))
        .collect();
    let mut headers = Vec::new();
    if families.ratelimit
        && let Some(values) = chosen(verdict, &statuses).and_then(|i| header_values(&statuses[i]))
    {
        let [limit, remaining, reset] = &reply.names;
        let [l, r, t] = values;
        add_numbers(&mut headers, [(limit, l), (remaining, r), (reset, t)]);
    }
    if families.x_ratelimit || families.draft {
        let limits = reports(verdict);
        if families.x_ratelimit
            && let Some(pairs) = envoy_headers(&limits)
        {
            add_numbers(&mut headers, pairs);
        }
        if families.draft
            && let Some(fields) = draft_every_limit(&limits)
        {
            for (name, value) in fields {
                headers.push((name, HeaderText::Field(value)));
            }
        }
    }
    if let Some(shed) = &verdict.shed {
        // Envoy's protocol has no "overloaded": a shed is OVER_LIMIT, and
        // Envoy adds these headers to the 429 it answers (a 503 with its
        // filter's `rate_limited_status`), so the client still learns when
        // to come back.
        let retry = shed.retry_after;
        let seconds = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
        headers.push(("retry-after", HeaderText::Number(seconds.max(1))));
    }
    let dynamic_metadata = reply
        .dynamic_metadata
        .then(|| dynamic_metadata(request, verdict, &statuses));
    Answer {
        ok: verdict.allowed(),
        statuses,
        headers,
        dynamic_metadata,
    }
}

/// Adds headers whose values are numbers: the `ratelimit` and
/// `x-ratelimit` families, which differ in names and in the limit they
/// describe, not in how they are written.
fn add_numbers<'a>(headers: &mut Vec<(&'a str, HeaderText)>, pairs: [(&'a str, u64); 3]) {
    for (name, value) in pairs {
        headers.push((name, HeaderText::Number(value)));
    }
}

/// The descriptor whose status envoyproxy/ratelimit's headers describe, as
/// `shouldRateLimitWorker` picks it: in request order, a status with a
/// `current_limit` and fewer `limit_remaining` than any before it; but an
/// over-limit descriptor that is not in quota mode takes the place whatever
/// came before, and from then on only a later such one does (its remaining
/// becomes the minimum, 0).
fn chosen(verdict: &Verdict, statuses: &[Status<'_>]) -> Option<usize> {
    let mut least = u32::MAX;
    let mut chosen = None;
    for (i, (d, status)) in verdict.descriptors.iter().zip(statuses).enumerate() {
        if status.current_limit.is_some() && status.limit_remaining < least {
            chosen = Some(i);
            least = status.limit_remaining;
        }
        // `quota`: the rule's `quota_mode` or the global `QUOTA_MODE`.
        if d.state != State::Unlimited && !status.ok && !d.quota {
            chosen = Some(i);
            least = 0;
        }
    }
    chosen
}

/// `rateLimitLimitHeader`, `rateLimitRemainingHeader` and
/// `rateLimitResetHeader`: the status's `requests_per_unit`, its
/// `limit_remaining`, and the seconds until its window ends
/// (`CalculateReset`, its `duration_until_reset`; a native rule's exact time
/// rounded up). `None` without a `current_limit`.
fn header_values(status: &Status<'_>) -> Option<[u64; 3]> {
    let limit = status.current_limit.as_ref()?;
    let reset = status.duration_until_reset.unwrap_or_default();
    let seconds = reset.as_secs() + u64::from(reset.subsec_nanos() > 0);
    Some([
        u64::from(limit.requests_per_unit),
        u64::from(status.limit_remaining),
        seconds,
    ])
}

/// envoyproxy/ratelimit's `ratelimitToMetadata`: the request's domain, its
/// descriptors (`descriptorToStruct`), its `hits_addend` when not 0, and
/// the `metadata` of the rules of the descriptors that passed (neither
/// unlimited nor over the limit), merged in request order (`mergeMetadata`).
fn dynamic_metadata(request: &Request<'_>, verdict: &Verdict, statuses: &[Status<'_>]) -> Metadata {
    let mut fields = Metadata::new();
    fields.insert(
        "domain".into(),
        MetadataValue::String(request.domain.to_owned()),
    );
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| MetadataValue::Struct(descriptor_struct(d)))
        .collect();
    fields.insert("descriptors".into(), MetadataValue::List(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".into(), number(request.hits_addend));
    }
    let mut passed = Metadata::new();
    for (d, status) in verdict.descriptors.iter().zip(statuses) {
        if d.state == State::Unlimited || d.state == State::Replaced || !status.ok {
            continue;
        }
        if let Some(metadata) = d.rule.as_deref().and_then(Rule::metadata) {
            merge(&mut passed, metadata);
        }
    }
    if !passed.is_empty() {
        fields.insert("metadata".into(), MetadataValue::Struct(passed));
    }
    fields
}

/// `descriptorToStruct`: `entries` as `key=value` strings, the `limit`
/// override as Go's protobuf text (`requests_per_unit:10 unit:MINUTE`, fields
/// at their default left out), and `hitsAddend` when the descriptor sets it.
fn descriptor_struct(d: &Descriptor) -> Metadata {
    let mut fields = Metadata::new();
    let entries = d
        .entries
        .iter()
        .map(|e| MetadataValue::String(format!("{}={}", e.key, e.value)))
        .collect();
    fields.insert("entries".into(), MetadataValue::List(entries));
    if let Some(limit) = &d.limit {
        let mut text = Vec::new();
        if limit.requests_per_unit != 0 {
            text.push(format!("requests_per_unit:{}", limit.requests_per_unit));
        }
        text.push(format!("unit:{}", proto_unit(limit.unit).as_str_name()));
        fields.insert("limit".into(), MetadataValue::String(text.join(" ")));
    }
    if let Some(hits) = d.hits_addend {
        fields.insert("hitsAddend".into(), number(hits));
    }
    fields
}

#[expect(
    clippy::cast_precision_loss,
    reason = "a float64, as structpb makes it"
)]
fn number(n: u64) -> MetadataValue {
    MetadataValue::Number(n as f64)
}

/// `mergeMetadata`: `src`'s fields that `dest` lacks are added; where both
/// have a Struct, they merge; otherwise `dest` keeps its value.
fn merge(dest: &mut Metadata, src: &Metadata) {
    for (key, value) in src {
        match (dest.get_mut(key), value) {
            (Some(MetadataValue::Struct(d)), MetadataValue::Struct(s)) => merge(d, s),
            (Some(_), _) => {}
            (None, _) => {
                dest.insert(key.clone(), value.clone());
            }
        }
    }
}

fn status(d: &DescriptorVerdict, started_at: Nanos) -> Status<'_> {
    let rule = d.rule.as_deref();
    let current_limit = d
        .decision
        .and(d.envoy_limit)
        .map(|(requests_per_unit, unit)| CurrentLimit {
            name: rule.and_then(Rule::name).unwrap_or_default(),
            requests_per_unit: saturate(requests_per_unit),
            unit,
        });
    let duration_until_reset = d.decision.map(|decision| {
        rule.and_then(Rule::envoy_window)
            .map_or(decision.reset_after(), |unit| {
                until_window_end(unit, started_at)
            })
    });
    let limit_remaining = match (d.state, d.decision) {
        (State::Unlimited, _) => u32::MAX,
        // Over the limit, nothing is left for this request, whatever smaller
        // one might fit (`GetResponseDescriptorStatus`).
        (_, Some(decision)) if !decision.allowed() => 0,
        (_, Some(decision)) => saturate(decision.remaining()),
        (_, None) => 0,
    };
    Status {
        // Global shadow mode keeps the descriptor's own code; only the
        // request is let through (`shouldRateLimitWorker`).
        ok: d.allowed() && !(d.global_shadow && d.shadow_denied()),
        current_limit,
        limit_remaining,
        duration_until_reset,
    }
}

/// The time from `now` (epoch nanoseconds) to the end of its `unit` window,
/// as envoyproxy/ratelimit computes it (`utils.CalculateReset`): from the
/// current whole second, so 1 to `unit` whole seconds.
fn until_window_end(unit: Unit, now: Nanos) -> Duration {
    let unit = unit.duration().as_secs();
    let second = now / 1_000_000_000;
    Duration::from_secs(unit - second % unit)
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The unit a request's limit override names by number (the response's unit
/// enum, which also names `WEEK`, added to the request's in newer protos);
/// `None` for `UNKNOWN` or a number no unit has.
fn unit(number: i32) -> Option<Unit> {
    Some(match ProtoUnit::try_from(number).ok()? {
        ProtoUnit::Second => Unit::Second,
        ProtoUnit::Minute => Unit::Minute,
        ProtoUnit::Hour => Unit::Hour,
        ProtoUnit::Day => Unit::Day,
        ProtoUnit::Week => Unit::Week,
        ProtoUnit::Month => Unit::Month,
        ProtoUnit::Year => Unit::Year,
        ProtoUnit::Unknown => return None,
    })
}

/// `unit` as the response's unit enum.
pub(crate) fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

/// One `RateLimitDescriptor` as it arrives at either door, its strings
/// already owned: turned into the enforcer's [`Descriptor`] by
/// [`descriptors`], the one place both doors check it.
pub(crate) struct RequestDescriptor {
    pub(crate) entries: Vec<Entry>,
    /// `limit`: requests per unit and the unit's number.
    pub(crate) limit: Option<(u32, i32)>,
    pub(crate) hits_addend: Option<u64>,
    pub(crate) is_negative_hits: bool,
}

/// Why an Envoy door does not answer a request.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// One of envoyproxy/ratelimit's own refusals (an empty domain, no
    /// descriptors), with its words. It returns them as plain Go errors, so
    /// gRPC clients see `UNKNOWN`.
    Service(RequestError),
    /// What Tollgate refuses beyond it (`INVALID_ARGUMENT`): negative hits,
    /// an override's unit it cannot name or a quota it cannot keep, a
    /// request larger than the enforcer takes.
    Invalid(String),
}

impl From<RequestError> for Refusal {
    fn from(error: RequestError) -> Self {
        match error {
            RequestError::EmptyDomain | RequestError::NoDescriptors => Refusal::Service(error),
            other => Refusal::Invalid(other.to_string()),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Service(error) => error.fmt(f),
            Refusal::Invalid(reason) => f.write_str(reason),
        }
    }
}

/// The descriptors of a request to `domain`, as the enforcer takes them.
///
/// # Errors
///
/// An empty domain first, as envoyproxy/ratelimit checks it before it reads
/// anything else; then the first descriptor asking to subtract hits, or
/// whose override names no unit.
pub(crate) fn descriptors(
    domain: &str,
    descriptors: impl IntoIterator<Item = RequestDescriptor>,
) -> Result<Vec<Descriptor>, Refusal> {
    if domain.is_empty() {
        return Err(RequestError::EmptyDomain.into());
    }
    descriptors
        .into_iter()
        .enumerate()
        .map(|(index, d)| d.into_descriptor(index).map_err(Refusal::Invalid))
        .collect()
}

impl RequestDescriptor {
    /// The descriptor, or why descriptor `index` cannot be checked: negative
    /// hits, or an override whose unit has no name.
    fn into_descriptor(self, index: usize) -> Result<Descriptor, String> {
        if self.is_negative_hits {
            return Err(format!(
                "descriptor {index}: negative hits are not supported"
            ));
        }
        let limit = self
            .limit
            .map(|(requests_per_unit, number)| {
                let unit = unit(number).ok_or_else(|| {
                    format!(
                        "descriptor {index} has an invalid limit override: unknown unit {number}"
                    )
                })?;
                Ok::<_, String>(LimitOverride {
                    requests_per_unit: u64::from(requests_per_unit),
                    unit,
                })
            })
            .transpose()?;
        Ok(Descriptor {
            entries: self.entries,
            limit,
            hits_addend: self.hits_addend,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_and_none_stand_alone() {
        let names = || DEFAULT_NAMES.map(String::from);
        let reply = |families: &[HeaderFamily]| Reply::new(families, names(), false);
        use HeaderFamily::{Auto, Draft, None, Ratelimit, XRatelimit};
        assert_eq!(reply(&[Auto]).expect("valid").families, Option::None);
        assert_eq!(
            reply(&[None]).expect("valid").families,
            Some(Families::default())
        );
        assert_eq!(
            reply(&[XRatelimit, Draft]).expect("valid").families,
            Some(Families {
                ratelimit: false,
                x_ratelimit: true,
                draft: true
            })
        );
        assert!(reply(&[Auto, Ratelimit]).is_err());
        assert!(reply(&[Draft, None]).is_err());
    }

    /// `utils.CalculateReset` as envoyproxy/ratelimit's
    /// `test/service/ratelimit_test.go` runs it (its clock at 2222 s: a
    /// minute's reset header says 58), and at window edges.
    #[test]
    fn window_ends_are_whole_seconds_from_the_current_second() {
        let at = |seconds: u64, nanos: u64| seconds * 1_000_000_000 + nanos;
        for (unit, now, seconds) in [
            (Unit::Minute, at(2222, 0), 58),
            (Unit::Minute, at(2222, 999_999_999), 58),
            (Unit::Second, at(2222, 0), 1),
            (Unit::Second, at(2222, 500_000_000), 1),
            (Unit::Minute, at(2220, 0), 60),
            (Unit::Minute, at(2279, 999_999_999), 1),
            (Unit::Hour, at(3600 * 5 + 1, 0), 3599),
            (Unit::Day, at(86_400 + 7, 0), 86_393),
            // Weeks, months and years are aligned to the epoch too.
            (Unit::Week, at(604_800 * 3 + 100, 0), 604_700),
            (Unit::Month, at(2_592_000 + 1, 0), 2_591_999),
            (Unit::Year, at(0, 0), 31_536_000),
        ] {
            assert_eq!(
                until_window_end(unit, now),
                Duration::from_secs(seconds),
                "{unit} at {now}"
            );
        }
    }
}
