//! The bound on the labels a request's values make: per metric family,
//! domain and rule, at most [`DETAILED_VALUES`] of them, the rest sharing
//! one. Below the metrics and envoyproxy/ratelimit's stats, which both
//! label by request values where a rule asks for it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

/// How many distinct `detailed_metric` labels one rule gets; the values past
/// it share [`DETAILED_OVERFLOW`]. Descriptor values are the client's, so
/// without a bound a client could grow `/metrics` (and memory) without limit.
const DETAILED_VALUES: usize = 1_000;
/// The `rule` label of a detailed rule's decisions past [`DETAILED_VALUES`].
const DETAILED_OVERFLOW: &str = "detailed_metric_overflow";

/// `label` if the rule `rule` of `domain` has room for it (or has it
/// already) in the metric `family`, else [`DETAILED_OVERFLOW`].
pub(super) fn bounded(family: &'static str, domain: &str, rule: &str, label: String) -> String {
    /// Labels seen, by metric family, domain and rule.
    type Seen = BTreeMap<&'static str, BTreeMap<String, BTreeMap<String, HashSet<String>>>>;
    static SEEN: Mutex<Seen> = Mutex::new(BTreeMap::new());
    let mut guard = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let seen = guard.entry(family).or_default();
    // Looked up by `&str` first: the keys are allocated once per rule, not
    // once per decision.
    if !seen.contains_key(domain) {
        seen.insert(domain.to_owned(), BTreeMap::new());
    }
    let rules = seen.get_mut(domain).expect("inserted above");
    if !rules.contains_key(rule) {
        rules.insert(rule.to_owned(), HashSet::new());
    }
    let labels = rules.get_mut(rule).expect("inserted above");
    if labels.contains(&label) {
        label
    } else if labels.len() < DETAILED_VALUES {
        labels.insert(label.clone());
        label
    } else {
        DETAILED_OVERFLOW.to_owned()
    }
}
