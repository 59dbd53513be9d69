//! What an observer keeps per rule, in a slice indexed by the rule's
//! [`RuleIndex`]: a decision finds its rule's series with a bounds check
//! rather than by domain, rule and result in maps, which cost the gateway
//! about 900 instructions per request. Each observer keeps its own
//! [`PerRule`].
//!
//! A table serves one policy, the newest its observer has seen: a rule of a
//! newer policy (after a reload) brings a new, empty table. What a slot
//! holds is found again by the rule's labels (domain and rule id), so a rule
//! counts in the same series whatever its index in the new policy. A rule
//! of an older policy (a request in flight across a reload) or one without
//! an index (made from a request's limit override) gets no slot, and its
//! decision is counted the slower way, by the same labels.

use std::sync::{Arc, OnceLock};

use arc_swap::{ArcSwap, Guard};
use tollgate_policy::{Rule, RuleIndex};

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

/// One `T` per rule of the newest policy seen.
pub(crate) struct PerRule<T>(ArcSwap<Table<T>>);

/// The slots of one policy's rules.
pub(crate) struct Table<T> {
    /// `None` before the first numbered rule.
    policy: Option<u64>,
    slots: Box<[T]>,
}

impl<T: Default> Default for PerRule<T> {
    fn default() -> Self {
        Self(ArcSwap::from_pointee(Table {
            policy: None,
            slots: Box::default(),
        }))
    }
}

impl<T: Default> PerRule<T> {
    /// The table as it stands, to find the slots of one decision's rules.
    pub(crate) fn slots(&self) -> Slots<'_, T> {
        Slots {
            per_rule: self,
            table: self.0.load(),
        }
    }
}

/// The slots of the newest policy, held for one decision.
pub(crate) struct Slots<'a, T> {
    per_rule: &'a PerRule<T>,
    table: Guard<Arc<Table<T>>>,
}

impl<T: Default> Slots<'_, T> {
    /// `rule`'s slot: `None` for a rule without an index, or of a policy
    /// older than the newest seen.
    pub(crate) fn get(&mut self, rule: &Rule) -> Option<&T> {
        let at = rule.index()?;
        if self.table.policy != Some(at.policy()) {
            self.newer(at);
        }
        if self.table.policy != Some(at.policy()) {
            return None;
        }
        self.table.slots.get(at.index())
    }

    /// Puts in a table for `at`'s policy if it is newer than the one there
    /// (another decision may have put it, or a newer one, in first).
    #[cold]
    fn newer(&mut self, at: RuleIndex) {
        let mut made = None;
        self.per_rule.0.rcu(|current| {
            if current.policy >= Some(at.policy()) {
                return Arc::clone(current);
            }
            Arc::clone(made.get_or_insert_with(|| {
                Arc::new(Table {
                    policy: Some(at.policy()),
                    slots: std::iter::repeat_with(T::default)
                        .take(at.rules())
                        .collect(),
                })
            }))
        });
        self.table = self.per_rule.0.load();
    }
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tollgate_core::Decision;
    use tollgate_policy::{DescriptorVerdict, FailurePolicy, Policy, State};

    use super::*;

    const TWO: &str = "domain: d\nrules:\n  - name: a\n    match: [{ key: a }]\n    limit: { requests: 1, per: 1s }\n  - name: b\n    match: [{ key: b }]\n    limit: { requests: 1, per: 1s }\n";
    const SWAPPED: &str = "domain: d\nrules:\n  - name: b\n    match: [{ key: b }]\n    limit: { requests: 1, per: 1s }\n  - name: a\n    match: [{ key: a }]\n    limit: { requests: 1, per: 1s }\n";

    /// A slot records the rule id it was made for.
    type Made = OnceLock<String>;

    fn slot(per_rule: &PerRule<Made>, rule: &Rule) -> Option<String> {
        let mut slots = per_rule.slots();
        let made = slots.get(rule)?;
        Some(made.get_or_init(|| rule.id().to_owned()).clone())
    }

    #[test]
    fn each_rule_has_its_slot_and_a_newer_policy_a_new_table() {
        let old = Policy::parse("d.yaml", TWO).expect("valid");
        let new = Policy::parse("d.yaml", SWAPPED).expect("valid");
        let per_rule = PerRule::<Made>::default();
        for rule in old.rules("d") {
            assert_eq!(slot(&per_rule, rule).as_deref(), Some(rule.id()));
        }
        // The new policy numbers `b` where the old had `a`: its table is
        // another, so neither rule finds the other's slot.
        for rule in new.rules("d") {
            assert_eq!(slot(&per_rule, rule).as_deref(), Some(rule.id()));
        }
        // A decision of the old policy, in flight across the reload, gets
        // no slot (it is counted by its labels), and leaves the new table.
        assert_eq!(slot(&per_rule, &old.rules("d")[0]), None);
        for rule in new.rules("d") {
            assert_eq!(slot(&per_rule, rule).as_deref(), Some(rule.id()));
        }
    }

    #[test]
    fn a_slot_is_made_once() {
        let policy = Policy::parse("d.yaml", TWO).expect("valid");
        let per_rule = PerRule::<PerResult<u32>>::default();
        let made = AtomicUsize::new(0);
        let make = || made.fetch_add(1, Ordering::Relaxed) as u32;
        let rule = &policy.rules("d")[1];
        for _ in 0..3 {
            let mut slots = per_rule.slots();
            let slot = slots.get(rule).expect("a slot");
            assert_eq!(slot.get("ok", make), Some(&0));
        }
        assert_eq!(made.load(Ordering::Relaxed), 1);
        let mut slots = per_rule.slots();
        let other = slots.get(&policy.rules("d")[0]).expect("a slot");
        assert_eq!(other.get("ok", make), Some(&1));
    }

    #[test]
    fn every_result_a_rule_can_carry_has_a_place() {
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
                    "{state:?} with {decision:?} is counted as {result:?}, which has no place"
                );
            }
        }
        assert!(kept.get("no_rule", || ()).is_none());
    }
}
