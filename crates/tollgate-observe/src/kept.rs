//! What the service's observers keep with each rule ([`Rule::memo`]): the
//! series its decisions are counted in, found the first time a decision of
//! that result needs them. Every later decision counts with one atomic add
//! rather than finding its series by domain, rule and result in maps, which
//! cost the gateway about 900 instructions per request.
//!
//! A rule's label set never changes (a `detailed_metric` rule's labels do,
//! and those are not kept here), so nothing kept can go stale; the next
//! policy's rules start empty. A rule made from a request's limit override
//! keeps nothing: it lives as long as that request.

use std::sync::{Arc, OnceLock};

use tollgate_policy::Rule;

use crate::live::series::Series;
use crate::metrics::envoy_stats::series::Series as EnvoyStats;

/// Every `result` label a descriptor with a rule can carry
/// ([`tollgate_policy::DescriptorVerdict::result`]); a label not listed is
/// counted the slower way.
const RESULTS: [&str; 9] = [
    "ok",
    "over_limit",
    "shadow_over_limit",
    "unlimited",
    "replaced",
    "disabled",
    "blocked",
    "shadow",
    "store_error",
];

/// What one rule keeps.
#[derive(Default)]
pub(crate) struct Kept {
    /// `tollgate_decisions_total`'s counters, by result.
    pub(crate) decisions: PerResult<metrics::Counter>,
    /// `tollgate_shadow_denials_total`'s counter.
    pub(crate) shadow_denials: OnceLock<metrics::Counter>,
    /// envoyproxy/ratelimit's series of a rule of its format, when its stats
    /// key is the rule's own (it carries no request values).
    pub(crate) envoy_stats: OnceLock<EnvoyStats>,
    /// The live page's series, by result, with the id of the page that made
    /// them: a rule observed by another page (two services sharing a
    /// policy) counts the slower way.
    pub(crate) live: PerResult<(u64, Arc<Series>)>,
}

/// What `rule` keeps: `None` for a rule made for one request (or if
/// something else claimed its memo), whose decisions take the lookups.
pub(crate) fn kept(rule: &Rule) -> Option<&Kept> {
    rule.memo(Kept::default)
}

/// One value per result label.
pub(crate) struct PerResult<T>([OnceLock<T>; RESULTS.len()]);

impl<T> Default for PerResult<T> {
    fn default() -> Self {
        Self(std::array::from_fn(|_| OnceLock::new()))
    }
}

impl<T> PerResult<T> {
    /// The value kept for `result`, made by `make` the first time; `None`
    /// for a label not in [`RESULTS`].
    pub(crate) fn get(&self, result: &str, make: impl FnOnce() -> T) -> Option<&T> {
        let slot = RESULTS.iter().position(|r| *r == result)?;
        Some(self.0[slot].get_or_init(make))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::Decision;
    use tollgate_policy::{DescriptorVerdict, FailurePolicy, State};

    use super::*;

    #[test]
    fn every_result_a_rule_can_carry_is_kept() {
        let states = [
            State::Unlimited,
            State::Replaced,
            State::Disabled,
            State::Blocked,
            State::Limited,
            State::Shadow,
            State::StoreFailed(FailurePolicy::FailOpen),
        ];
        let decisions = [
            None,
            Some(Decision::allow(1, 0, Duration::ZERO)),
            Some(Decision::deny(1, 0, Duration::from_secs(1), None)),
        ];
        let kept = PerResult::<()>::default();
        for state in states {
            for decision in decisions {
                let verdict = DescriptorVerdict {
                    state,
                    rule: None,
                    envoy_limit: None,
                    applied: None,
                    decision,
                    peeked: false,
                    quota: false,
                    global_shadow: false,
                };
                let result = verdict.result();
                assert!(
                    kept.get(result, || ()).is_some(),
                    "{state:?} with {decision:?} is counted as {result:?}, which is not kept"
                );
            }
        }
        assert!(kept.get("no_rule", || ()).is_none());
    }
}
