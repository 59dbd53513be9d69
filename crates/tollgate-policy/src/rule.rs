use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use tollgate_core::{Algorithm, FailurePolicy, Quota, Tier};

use crate::metadata::Metadata;
use crate::tree::Pattern;
use crate::{Descriptor, Shedding, Unit};

/// A quota per tier: the value of the descriptor entry `by` picks it.
#[derive(Debug, Clone)]
pub(crate) struct Tiers {
    pub(crate) by: String,
    pub(crate) default: String,
    pub(crate) quotas: HashMap<String, Quota>,
}

/// A priority reserve: a class may fill only its share of the budget, so
/// higher classes keep the rest (Stripe's load shedder).
#[derive(Debug, Clone)]
pub(crate) struct Priority {
    pub(crate) by: String,
    pub(crate) shares: Shares,
}

/// How much of a reserved budget each class may fill.
#[derive(Debug, Clone)]
pub(crate) enum Shares {
    /// A rule's `priority:` section: classes named freely, each with its
    /// percent (1 to 100); a request past its class's share is limited (429).
    Classes {
        default: String,
        percent: HashMap<String, u64>,
    },
    /// A rule's `shed: true`: the budget is its domain's shared one, each
    /// priority tier may fill the domain's `shed` threshold of it, and a
    /// request past its tier's share is shed (503), not limited.
    Tiers(Arc<Shedding>),
}

impl Priority {
    /// The share (percent) of the budget a request whose `by` entry is
    /// `value` may fill.
    pub(crate) fn share(&self, value: Option<&str>) -> u64 {
        match &self.shares {
            Shares::Classes { default, percent } => {
                let class = value.filter(|c| percent.contains_key(*c));
                percent[class.unwrap_or(default)]
            }
            Shares::Tiers(shedding) => {
                let tier = value.map_or(Tier::Low, |v| Tier::from_header(v.as_bytes()));
                u64::from(shedding.thresholds().of(tier))
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Limited {
    pub(crate) algorithm: Algorithm,
    pub(crate) quota: Quota,
    pub(crate) tiers: Option<Tiers>,
    pub(crate) priority: Option<Priority>,
    pub(crate) bucket: Option<Arc<str>>,
    pub(crate) failure: FailurePolicy,
    /// How Envoy's response names the limit.
    pub(crate) envoy: (u64, Unit),
}

/// What a matched rule does.
#[derive(Debug, Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per rule, built once at load"
)]
pub(crate) enum Action {
    /// Admit without counting.
    Unlimited,
    /// Refuse everything: envoyproxy/ratelimit's `requests_per_unit: 0`.
    Block(Unit),
    /// Count against a quota.
    Limit(Limited),
}

/// One rule: what it matches is its place in the policy's tree; this is what it
/// says once matched.
#[derive(Debug, Clone)]
pub struct Rule {
    pub(crate) id: Arc<str>,
    pub(crate) name: Option<String>,
    pub(crate) replaces: Vec<String>,
    pub(crate) shadow: bool,
    pub(crate) detailed_metric: bool,
    pub(crate) value_to_metric: Vec<bool>,
    /// What the rule matches, level by level (the native `match` list, or
    /// envoyproxy/ratelimit's descriptor path, by which
    /// [`Rule::envoy_stat_key`] names the stats). Empty for overrides.
    pub(crate) path: Vec<(String, Pattern)>,
    /// Written in envoyproxy/ratelimit's format.
    pub(crate) envoy_format: bool,
    pub(crate) quota_mode: bool,
    /// envoyproxy/ratelimit's descriptor `metadata`, when not empty.
    pub(crate) metadata: Option<Arc<Metadata>>,
    pub(crate) action: Action,
    /// See [`Rule::envoy_window`].
    pub(crate) envoy_window: Option<Unit>,
    pub(crate) source: String,
    /// See [`Rule::index`].
    pub(crate) index: Numbered,
}

/// Where a rule stands in the policy that loaded it: rule
/// [`index`](RuleIndex::index) of the [`rules`](RuleIndex::rules) its policy
/// numbers densely from 0, in the policy numbered
/// [`policy`](RuleIndex::policy). An observer keeps its state per rule in a
/// slice of `rules()` entries, one slice per policy: a reload loads a new
/// policy, numbered anew, where the same rule may stand elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleIndex {
    pub(crate) policy: u64,
    pub(crate) index: usize,
    pub(crate) rules: usize,
}

impl RuleIndex {
    /// The policy's number: unique in the process, and larger for a policy
    /// loaded later.
    pub fn policy(self) -> u64 {
        self.policy
    }

    /// The rule's place in its policy, below [`RuleIndex::rules`].
    pub fn index(self) -> usize {
        self.index
    }

    /// How many rules the policy numbers.
    pub fn rules(self) -> usize {
        self.rules
    }
}

/// A rule's [`RuleIndex`], set once its policy is read whole. A clone is
/// another rule, outside any policy's numbering.
#[derive(Default)]
pub(crate) struct Numbered(OnceLock<RuleIndex>);

impl Numbered {
    pub(crate) fn set(&self, index: RuleIndex) {
        // A rule belongs to one policy: numbered once, when it is read.
        let _ = self.0.set(index);
    }
}

impl Clone for Numbered {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl fmt::Debug for Numbered {
    /// The rule's place alone: the same rules read twice print alike,
    /// whatever number each policy took.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.get() {
            Some(at) => write!(f, "Numbered({} of {})", at.index, at.rules),
            None => f.write_str("Numbered(none)"),
        }
    }
}

impl Rule {
    /// Where the rule stands in the policy that loaded it, for an observer
    /// to find its own state for the rule with a bounds check rather than a
    /// lookup by domain and rule name. `None` for a rule made from a
    /// request's limit override, which lives as long as that request.
    pub fn index(&self) -> Option<RuleIndex> {
        self.index.0.get().copied()
    }

    /// The rule's identity within its domain: the native rule's name, or the
    /// envoyproxy/ratelimit descriptor path (`key_value.key`). Metrics label by it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The rule's name, if it has one: envoyproxy/ratelimit's
    /// `rate_limit.name` (what `replaces` names), or a native rule's `name`
    /// (which is also its id). Envoy's answers report it as
    /// `current_limit.name`, as envoyproxy/ratelimit does.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether the rule is envoyproxy/ratelimit's: a rule of its format (with
    /// Tollgate's extensions or not) or a request's limit override. Its fixed
    /// windows count denied hits under its counting (see
    /// [`Counting`](crate::Counting)).
    pub fn is_envoy(&self) -> bool {
        self.envoy_format || self.envoy_window.is_some()
    }

    /// The window of one `unit`, aligned to the Unix epoch, that the rule
    /// counts in when it has envoyproxy/ratelimit's semantics (a rule of its
    /// format, or a request's limit override). Envoy's answers then report
    /// `duration_until_reset` as envoyproxy/ratelimit computes it: the whole
    /// seconds to the window's end. `None` for native rules, whose answers
    /// keep their algorithm's exact time, and for unlimited ones.
    pub fn envoy_window(&self) -> Option<Unit> {
        self.envoy_window
    }

    /// Whether this rule only reports (dark launch) and never denies.
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// Whether this rule admits everything without counting.
    pub fn unlimited(&self) -> bool {
        matches!(self.action, Action::Unlimited)
    }

    /// Whether this rule refuses everything (a limit of zero).
    pub fn blocks(&self) -> bool {
        matches!(self.action, Action::Block(_))
    }

    pub(crate) fn limited(&self) -> Option<&Limited> {
        match &self.action {
            Action::Limit(l) => Some(l),
            _ => None,
        }
    }

    /// Whether metrics should carry the descriptor's value (envoyproxy/ratelimit's `detailed_metric`).
    pub fn detailed_metric(&self) -> bool {
        self.detailed_metric
    }

    /// envoyproxy/ratelimit's `value_to_metric`, one flag per level of the
    /// rule's descriptor path (the entries a matching descriptor has, in order):
    /// whether the metric name should carry the request's value at that level
    /// even though the config names no value there. Empty for native rules.
    /// Tollgate only keeps it; naming metrics by it is the metrics layer's job.
    pub fn value_to_metric(&self) -> &[bool] {
        &self.value_to_metric
    }

    /// envoyproxy/ratelimit's `quota_mode`: an over-limit answer from this rule
    /// should deny only when every quota-mode descriptor of the request is over
    /// its limit. Kept as read; Tollgate does not act on it yet, so such a rule
    /// limits as an ordinary one.
    pub fn quota_mode(&self) -> bool {
        self.quota_mode
    }

    /// envoyproxy/ratelimit's descriptor `metadata`, when the rule has a
    /// non-empty one: what its answers return in their dynamic metadata.
    pub fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_deref()
    }

    /// Where the rule was defined, as `file:line`.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The rule's algorithm, unless it is unlimited.
    pub fn algorithm(&self) -> Option<Algorithm> {
        self.limited().map(|l| l.algorithm)
    }

    /// The rule's base quota, unless it is unlimited.
    pub fn quota(&self) -> Option<Quota> {
        self.limited().map(|l| l.quota)
    }

    /// The name of the shared bucket this rule spends, if any.
    pub fn bucket(&self) -> Option<&str> {
        self.limited().and_then(|l| l.bucket.as_deref())
    }

    /// What the rule matches, level by level: each level's key and its value
    /// as written, `None` for any value (one budget per distinct value); a
    /// value with a `*` is a wildcard. Empty for a request's limit override.
    pub fn matches(&self) -> impl Iterator<Item = (&str, Option<String>)> {
        self.path.iter().map(|(key, pattern)| {
            let value = match pattern {
                Pattern::Exact(v) => Some(v.clone()),
                Pattern::Prefix(p) => Some(format!("{p}*")),
                Pattern::Glob(g) => Some(g.to_string()),
                Pattern::Any => None,
            };
            (key.as_str(), value)
        })
    }

    /// The names of the rules this one replaces when both match a request
    /// (envoyproxy/ratelimit's `replaces`).
    pub fn replaces(&self) -> &[String] {
        &self.replaces
    }

    /// What decides a check of this rule when the store cannot answer,
    /// unless the rule counts nothing (unlimited, or blocking everything).
    pub fn failure(&self) -> Option<FailurePolicy> {
        self.limited().map(|l| l.failure)
    }

    /// The descriptor key whose value picks the quota, when the rule has
    /// tiers; [`Rule::quota`] is then the default tier's.
    pub fn tiered_by(&self) -> Option<&str> {
        self.limited()
            .and_then(|l| l.tiers.as_ref())
            .map(|t| t.by.as_str())
    }

    /// The descriptor key whose value picks the priority class, when the rule
    /// has priority reserves.
    pub fn priority_by(&self) -> Option<&str> {
        self.limited()
            .and_then(|l| l.priority.as_ref())
            .map(|p| p.by.as_str())
    }

    /// Whether the rule is its domain's shared budget, shedding by tier as
    /// it fills (`shed: true`).
    pub fn sheds_by_tier(&self) -> bool {
        self.shedding().is_some()
    }

    /// For its domain's shared budget (`shed: true`): the tier of
    /// `descriptor` (one this rule matched), its share of the budget in
    /// percent, and the domain's shedding.
    pub(crate) fn budget_share<'a>(
        &'a self,
        descriptor: &Descriptor,
    ) -> Option<(Tier, u32, &'a Shedding)> {
        let shedding = self.shedding()?;
        let tier = descriptor
            .entries
            .iter()
            .find(|e| e.key == shedding.priority_key())
            .map_or(Tier::Low, |e| Tier::from_header(e.value.as_bytes()));
        Some((tier, shedding.thresholds().of(tier), shedding))
    }

    fn shedding(&self) -> Option<&Shedding> {
        match &self.limited()?.priority.as_ref()?.shares {
            Shares::Tiers(shedding) => Some(shedding),
            Shares::Classes { .. } => None,
        }
    }
}

/// The closest Envoy unit for a quota's period: the unit itself when the
/// period is one, otherwise the limit scaled to the smallest unit at least as
/// long as the period (Envoy can only name whole units).
pub(crate) fn envoy_limit(quota: &Quota) -> (u64, Unit) {
    let period = quota.period();
    let unit = Unit::ALL
        .into_iter()
        .find(|u| u.duration() >= period)
        .unwrap_or(Unit::Year);
    let scaled = u128::from(quota.limit()) * unit.duration().as_nanos() / period.as_nanos().max(1);
    (u64::try_from(scaled).unwrap_or(u64::MAX), unit)
}

#[cfg(test)]
mod tests {
    use crate::{Descriptor, Entry, LimitOverride, Policy, Request, Resolved, Unit};

    const NATIVE: &str = "domain: d\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 1, per: 1s }\n  - name: s\n    match: [{ key: l }]\n    limit: { requests: 2, per: 1s }\n";
    const ENVOY: &str = "domain: e\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1 }\n    descriptors:\n      - key: b\n        rate_limit: { unit: minute, requests_per_unit: 2 }\n";

    #[test]
    fn a_policy_numbers_its_rules_densely_and_a_reload_anew() {
        let load =
            || Policy::parse_all([("d.yaml", NATIVE), ("e.yaml", ENVOY)]).expect("a valid policy");
        let policy = load();
        let rules: Vec<_> = ["d", "e"]
            .into_iter()
            .flat_map(|domain| policy.rules(domain))
            .collect();
        assert_eq!(rules.len(), 4);
        let indexes: Vec<_> = rules
            .iter()
            .map(|rule| rule.index().expect("a policy's rule is numbered"))
            .collect();
        let mut places: Vec<_> = indexes.iter().map(|i| i.index()).collect();
        places.sort_unstable();
        assert_eq!(places, [0, 1, 2, 3]);
        assert!(indexes.iter().all(|i| i.rules() == 4));
        assert!(indexes.iter().all(|i| i.policy() == indexes[0].policy()));
        // The same files loaded again are another policy, numbered later.
        let again = load();
        let later = again.rules("d")[0].index().expect("numbered");
        assert!(later.policy() > indexes[0].policy());
        // A copy of a rule is another rule, in no policy.
        assert_eq!((**rules[0]).clone().index(), None);
    }

    #[test]
    fn a_rule_made_for_one_request_has_no_index() {
        let policy = Policy::parse("d.yaml", NATIVE).expect("a valid policy");
        let descriptors = [Descriptor {
            entries: vec![Entry::new("k", "v")],
            limit: Some(LimitOverride {
                requests_per_unit: 5,
                unit: Unit::Minute,
            }),
            hits_addend: None,
        }];
        let request = Request {
            domain: "d",
            descriptors: &descriptors,
            hits_addend: 1,
        };
        let resolved = policy.resolve(&request).expect("resolves");
        let Some(Resolved::Limit(applied)) = resolved.first() else {
            panic!("the override applies: {resolved:?}");
        };
        assert!(applied.rule.id().starts_with("override:"));
        assert_eq!(applied.rule.index(), None);
    }
}
