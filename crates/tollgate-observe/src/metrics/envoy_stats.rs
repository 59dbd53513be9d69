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

use tollgate_policy::{Decided, DescriptorVerdict, Rule, State};

use super::bounded::bounded;

pub(crate) mod series;

use series::Counts;
pub(crate) use series::NAMES;
pub(crate) use series::Series;

/// Their help texts, as envoyproxy/ratelimit's README describes the stats.
pub(crate) const HELP: [&str; 5] = [
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
pub fn set_near_limit_ratio(ratio: f32) {
    NEAR_LIMIT_RATIO.store(ratio.to_bits(), Ordering::Relaxed);
}

fn near_limit_ratio() -> f32 {
    f32::from_bits(NEAR_LIMIT_RATIO.load(Ordering::Relaxed))
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
/// `domain`, in envoyproxy/ratelimit's series; `kept` is where the rule's
/// own series is kept, when its observer has a slot for the rule.
pub(crate) fn record(
    decided: &Decided<'_>,
    index: usize,
    domain: &str,
    rule: &Rule,
    kept: Option<&OnceLock<Series>>,
) {
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
        // The rule's own key: its series is kept in the rule's slot.
        Cow::Borrowed(key) => {
            if let Some(kept) = kept {
                kept.get_or_init(|| Series::new(domain, key)).add(counts);
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

/// Counter handles by domain and stats key (a registry lookup allocates the
/// labels and costs more than the check it counts).
type SeriesByKey = HashMap<String, HashMap<String, Series>>;

thread_local! {
    static SERIES: RefCell<SeriesByKey> = RefCell::new(HashMap::new());
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
}
