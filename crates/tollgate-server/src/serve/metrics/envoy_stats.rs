//! envoyproxy/ratelimit's per-rule stats, under the names and labels its
//! Prometheus sink gives them, so that its dashboards and alerts keep working.
//!
//! Its stats manager (`src/stats/manager_impl.go`) counts each rule in
//! `ratelimit.service.rate_limit.<key>.<stat>`, the key being the domain and
//! the rule's stats key ([`Rule::envoy_stat_key`]) after `SanitizeStatName`
//! (`src/utils/utilities.go`). Its Prometheus sink maps those names with
//! `src/stats/prom/default_mapper.yaml`: a key of two dot-separated parts
//! becomes `{domain, key1}`, a longer one `{domain, key1, key2}` (the parts
//! past the third are dropped, so such keys add up in one series). The
//! counts follow `src/limiter/base_limiter.go`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use metrics::{Counter, counter};
use tollgate_policy::{Decided, DescriptorVerdict, Rule, State};

use super::bounded;
use crate::serve::kept::kept;

/// The series, one per stat, in the order of [`Counts`]' fields.
pub(super) const NAMES: [&str; 5] = [
    "ratelimit_service_rate_limit_total_hits",
    "ratelimit_service_rate_limit_over_limit",
    "ratelimit_service_rate_limit_near_limit",
    "ratelimit_service_rate_limit_within_limit",
    "ratelimit_service_rate_limit_shadow_mode",
];
/// Their help texts, as envoyproxy/ratelimit's README describes the stats.
pub(super) const HELP: [&str; 5] = [
    "Hits of an envoyproxy/ratelimit rule (its hits_addend each).",
    "Hits over the rule's limit.",
    "Hits over NEAR_LIMIT_RATIO (80% by default) of the rule's limit but within it.",
    "Hits within the rule's limit.",
    "Hits over the limit of a shadow_mode rule, let through.",
];

/// The family under which [`bounded`] keeps these series' request-made keys.
const FAMILY: &str = "ratelimit_service_rate_limit";

/// envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`, a `float32` there, as its
/// bits: 0.8, its default, until [`set_near_limit_ratio`].
static NEAR_LIMIT_RATIO: AtomicU32 = AtomicU32::new(0x3f4c_cccd);

/// Sets `NEAR_LIMIT_RATIO` for the process (its stats are global too).
pub(crate) fn set_near_limit_ratio(ratio: f32) {
    NEAR_LIMIT_RATIO.store(ratio.to_bits(), Ordering::Relaxed);
}

fn near_limit_ratio() -> f32 {
    f32::from_bits(NEAR_LIMIT_RATIO.load(Ordering::Relaxed))
}

/// What one descriptor adds to each stat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    total_hits: u64,
    over_limit: u64,
    near_limit: u64,
    within_limit: u64,
    shadow_mode: u64,
}

impl Counts {
    fn as_array(self) -> [u64; 5] {
        [
            self.total_hits,
            self.over_limit,
            self.near_limit,
            self.within_limit,
            self.shadow_mode,
        ]
    }
}

/// `GetResponseDescriptorStatus` and its helpers: `cost` hits took the
/// window's count from `before` to `after` against `limit`.
fn counts(limit: u64, before: u64, after: u64, cost: u64, shadow: bool) -> Counts {
    counts_at(near_limit_ratio(), limit, before, after, cost, shadow)
}

/// [`counts`] with a `NEAR_LIMIT_RATIO` of `ratio`.
fn counts_at(ratio: f32, limit: u64, before: u64, after: u64, cost: u64, shadow: bool) -> Counts {
    // `math.Floor(float64(float32(limit) * nearLimitRatio))`, in float32 as
    // there. Where Go's conversion to uint64 is undefined (a negative or NaN
    // ratio), Rust's saturates: 0.
    let near = (limit as f32 * ratio).floor() as u64;
    let mut c = Counts {
        total_hits: cost,
        ..Counts::default()
    };
    if after > limit {
        if before >= limit {
            c.over_limit = cost;
        } else {
            c.over_limit = after - limit;
            // A ratio above 1 puts `near` past the limit: none near (Go's
            // uint64 subtraction wraps around there).
            c.near_limit = limit.saturating_sub(near.max(before));
        }
        if shadow {
            c.shadow_mode = c.over_limit;
        }
    } else {
        if after > near {
            c.near_limit = if before >= near { cost } else { after - near };
        }
        c.within_limit = cost;
    }
    c
}

/// What `descriptor` adds: nothing unless an envoyproxy/ratelimit rule was
/// counted, `total_hits` alone when the store could not say.
fn descriptor_counts(verdict: &DescriptorVerdict, rule: &Rule, cost: u64) -> Option<Counts> {
    let decision = match verdict.state {
        State::Limited | State::Blocked | State::Shadow => verdict.decision,
        State::StoreFailed(_) => None,
        State::NoRule | State::Unlimited | State::Replaced | State::Disabled => return None,
    };
    let Some(d) = decision else {
        return Some(Counts {
            total_hits: cost,
            ..Counts::default()
        });
    };
    // A store's decision counts `remaining` after the hits when it admits
    // (beside a denying limit too: each decision is the limit's alone), and
    // before them when it denies or was only read (a blocked rule denied the
    // request first).
    let used = d.limit().saturating_sub(d.remaining());
    let (before, after) = if d.allowed() && !verdict.peeked {
        (used.saturating_sub(cost), used)
    } else {
        (used, used.saturating_add(cost))
    };
    Some(counts(d.limit(), before, after, cost, rule.shadow()))
}

/// Counts the descriptor at `index` of `decided`, matched by `rule` of
/// `domain`, in envoyproxy/ratelimit's series.
pub(super) fn record(decided: &Decided<'_>, index: usize, domain: &str, rule: &Rule) {
    let (Some(verdict), Some(descriptor)) = (
        decided.verdict.descriptors.get(index),
        decided.descriptors.get(index),
    ) else {
        return;
    };
    // The key first: a native rule has none, and is done at once.
    let Some(key) = rule.envoy_stat_key(descriptor) else {
        return;
    };
    let Some(counts) = descriptor_counts(verdict, rule, decided.cost(index)) else {
        return;
    };
    let key = match key {
        // Keys that carry the request's values are bounded per rule, as the
        // detailed `tollgate_decisions_total` labels are.
        Cow::Owned(key) => Cow::Owned(bounded(FAMILY, domain, rule.id(), key)),
        // The rule's own key: its series is kept with it.
        Cow::Borrowed(key) => {
            if let Some(kept) = kept(rule) {
                kept.envoy_stats
                    .get_or_init(|| Series::new(domain, key))
                    .add(counts);
                return;
            }
            Cow::Borrowed(key)
        }
    };
    SERIES.with_borrow_mut(|by_domain| {
        let by_key = match by_domain.get_mut(domain) {
            Some(by_key) => by_key,
            None => by_domain.entry(domain.to_owned()).or_default(),
        };
        let series = match by_key.get_mut(key.as_ref()) {
            Some(series) => series,
            None => by_key
                .entry(key.clone().into_owned())
                .or_insert_with(|| Series::new(domain, &key)),
        };
        series.add(counts);
    });
}

/// One key's counters, registered at their first hit: envoyproxy/ratelimit's
/// stats store flushes only counters that moved, so a series appears once it
/// counts something.
pub(in crate::serve) struct Series {
    labels: Vec<(&'static str, String)>,
    counters: [OnceLock<Counter>; 5],
}

impl Series {
    fn new(domain: &str, key: &str) -> Self {
        let name = format!("{domain}.{key}");
        Self {
            labels: labels(&sanitize(&name)),
            counters: Default::default(),
        }
    }

    fn add(&self, counts: Counts) {
        for ((slot, name), n) in self.counters.iter().zip(NAMES).zip(counts.as_array()) {
            if n == 0 {
                continue;
            }
            slot.get_or_init(|| counter!(name, &self.labels))
                .increment(n);
        }
    }
}

/// Counter handles by domain and stats key (a registry lookup allocates the
/// labels and costs more than the check it counts).
type SeriesByKey = HashMap<String, HashMap<String, Series>>;

thread_local! {
    static SERIES: RefCell<SeriesByKey> = RefCell::new(HashMap::new());
}

/// The labels `default_mapper.yaml` gives `ratelimit.service.rate_limit.<name>.<stat>`:
/// its glob mappings (`*` is one dot-separated part) for two parts, its
/// regex mappings (the first three parts) for more.
fn labels(name: &str) -> Vec<(&'static str, String)> {
    let mut parts = name.split('.');
    let mut labels = Vec::with_capacity(3);
    for label in ["domain", "key1", "key2"] {
        match parts.next() {
            Some(part) => labels.push((label, part.to_owned())),
            None => break,
        }
    }
    labels
}

/// envoyproxy/ratelimit's `SanitizeStatName`: `:` and `|` become `_`, and
/// so do the dots of every IPv4-like run (`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`,
/// leftmost first, without overlap).
fn sanitize(name: &str) -> Cow<'_, str> {
    let mut bytes: Option<Vec<u8>> = None;
    let original = name.as_bytes();
    let mut i = 0;
    while i < original.len() {
        match original[i] {
            b':' | b'|' => bytes.get_or_insert_with(|| original.to_vec())[i] = b'_',
            b'0'..=b'9' => {
                if let Some((end, dots)) = ipv4_at(original, i) {
                    let out = bytes.get_or_insert_with(|| original.to_vec());
                    for dot in dots {
                        out[dot] = b'_';
                    }
                    i = end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    match bytes {
        // Only ASCII bytes were replaced by ASCII bytes.
        Some(bytes) => Cow::Owned(String::from_utf8(bytes).expect("still UTF-8")),
        None => Cow::Borrowed(name),
    }
}

/// The end of the IPv4-like run starting at `start`, and its three dots.
fn ipv4_at(s: &[u8], start: usize) -> Option<(usize, [usize; 3])> {
    let digits = |from: usize| {
        s[from..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut dots = [0; 3];
    let mut at = start;
    for dot in &mut dots {
        // `\d{1,3}\.`: the digits must run right up to the dot, since the
        // regexp can back off from three digits only onto a digit.
        let n = digits(at);
        if n == 0 || s.get(at + n) != Some(&b'.') {
            return None;
        }
        *dot = at + n;
        at += n + 1;
    }
    let n = digits(at);
    (n > 0).then_some((at + n, dots))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(total: u64, over: u64, near: u64, within: u64, shadow: u64) -> Counts {
        Counts {
            total_hits: total,
            over_limit: over,
            near_limit: near,
            within_limit: within,
            shadow_mode: shadow,
        }
    }

    /// Every case of envoyproxy/ratelimit's `TestNearLimit`
    /// (`test/redis/fixed_cache_impl_test.go`): the count Redis returned after
    /// the increment is `after`.
    #[test]
    fn counts_follow_base_limiter() {
        // Limit 15 (near 12): under, at and past the near threshold, then over.
        assert_eq!(counts(15, 10, 11, 1, false), c(1, 0, 0, 1, 0));
        assert_eq!(counts(15, 12, 13, 1, false), c(1, 0, 1, 1, 0));
        assert_eq!(counts(15, 15, 16, 1, false), c(1, 1, 0, 0, 0));
        // hits_addend above 1: under near; partly near; all near.
        assert_eq!(counts(20, 2, 5, 3, false), c(3, 0, 0, 3, 0));
        assert_eq!(counts(8, 5, 7, 2, false), c(2, 0, 1, 2, 0));
        assert_eq!(counts(20, 16, 19, 3, false), c(3, 0, 3, 3, 0));
        // Partly over; in all three ranges; all over.
        assert_eq!(counts(20, 19, 22, 3, false), c(3, 2, 1, 0, 0));
        assert_eq!(counts(20, 15, 22, 7, false), c(7, 2, 4, 0, 0));
        assert_eq!(counts(10, 27, 30, 3, false), c(3, 3, 0, 0, 0));
    }

    /// `increaseShadowModeStats`: a shadow rule's over-limit hits, counted in
    /// `over_limit` too; and a limit of 0, whose every hit is over.
    #[test]
    fn shadow_and_blocked_hits_are_over() {
        assert_eq!(counts(20, 15, 22, 7, true), c(7, 2, 4, 0, 2));
        assert_eq!(counts(0, 0, 2, 2, false), c(2, 2, 0, 0, 0));
    }

    /// `NEAR_LIMIT_RATIO` moves the threshold: `TestNearLimit`'s limit of 15
    /// at 0.5 is near past 7; above 1 nothing is near.
    #[test]
    fn near_threshold_follows_the_ratio() {
        assert_eq!(counts_at(0.5, 15, 7, 8, 1, false), c(1, 0, 1, 1, 0));
        assert_eq!(counts_at(0.5, 15, 6, 7, 1, false), c(1, 0, 0, 1, 0));
        assert_eq!(counts_at(2.0, 15, 14, 16, 2, false), c(2, 1, 0, 0, 0));
        assert_eq!(counts_at(-1.0, 10, 0, 1, 1, false), c(1, 0, 1, 1, 0));
    }

    #[test]
    fn near_threshold_is_computed_in_float32() {
        // float32(10) * float32(0.8) rounds to 8 exactly: 9 is near, 8 not.
        assert_eq!(counts(10, 7, 8, 1, false).near_limit, 0);
        assert_eq!(counts(10, 8, 9, 1, false).near_limit, 1);
    }

    /// `SanitizeStatName`'s replacements, and its regexp's leftmost-first,
    /// non-overlapping matches.
    #[test]
    fn sanitize_is_envoyproxy_ratelimits() {
        assert_eq!(sanitize("domain.key_value"), "domain.key_value");
        assert_eq!(sanitize("a:b|c"), "a_b_c");
        assert_eq!(
            sanitize("d.remote_address_10.0.0.1.x"),
            "d.remote_address_10_0_0_1.x"
        );
        assert_eq!(sanitize("1234.5.6.7"), "1234_5_6_7");
        assert_eq!(sanitize("1.2.3.4567"), "1_2_3_4567");
        assert_eq!(sanitize("1.2.3"), "1.2.3");
        assert_eq!(sanitize("1.2.3.4.5.6.7.8"), "1_2_3_4.5_6_7_8");
    }

    /// `src/stats/prom/prometheus_sink_test.go`'s
    /// `TestFlushCounterWithDifferentLabels`.
    #[test]
    fn labels_follow_default_mapper() {
        let l = |name| labels(name);
        assert_eq!(
            l("domain1.key1_val1"),
            [("domain", "domain1".into()), ("key1", "key1_val1".into())]
        );
        let three = [
            ("domain", "domain1".into()),
            ("key1", "key3_val3".into()),
            ("key2", "key4_val4".into()),
        ];
        assert_eq!(l("domain1.key3_val3.key4_val4"), three);
        assert_eq!(l("domain1.key3_val3.key4_val4.key5_val5"), three);
    }
}
