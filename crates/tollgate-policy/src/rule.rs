use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use tollgate_core::{Algorithm, FailurePolicy, Quota};

use crate::Unit;
use crate::metadata::Metadata;
use crate::tree::Pattern;

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
    pub(crate) default: String,
    /// Percent of the budget each class may fill, 1 to 100.
    pub(crate) shares: HashMap<String, u64>,
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
    /// See [`Rule::memo`].
    pub(crate) memo: Memo,
}

/// What an observer keeps with a rule ([`Rule::memo`]): nothing for a rule
/// made for one request. A clone starts empty: what was kept belongs to the
/// rule it was made for.
pub(crate) struct Memo(Option<OnceLock<Box<dyn Any + Send + Sync>>>);

impl Memo {
    /// The memo of a rule that lives as long as its policy.
    pub(crate) fn kept() -> Self {
        Self(Some(OnceLock::new()))
    }

    /// The memo of a rule made for one request (a limit override), which
    /// keeps nothing: what it kept would serve that request alone.
    pub(crate) fn none() -> Self {
        Self(None)
    }
}

impl Clone for Memo {
    fn clone(&self) -> Self {
        match self.0 {
            Some(_) => Self::kept(),
            None => Self::none(),
        }
    }
}

impl fmt::Debug for Memo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match &self.0 {
            Some(kept) if kept.get().is_some() => "Memo(kept)",
            Some(_) => "Memo",
            None => "Memo(none)",
        })
    }
}

impl Rule {
    /// What an observer keeps with this rule, made by `make` the first time
    /// it is asked for: the series it counts the rule's decisions in, say,
    /// so that a decision finds them without a lookup by domain and rule
    /// name. It lives as long as the rule, i.e. until the policy the rule
    /// belongs to is replaced, and the next policy's rules start empty.
    ///
    /// A rule keeps one value: `None` when it already keeps one of another
    /// type than `T`, and for a rule made from a request's limit override,
    /// which lives as long as that request (a caller looks such a rule's
    /// series up as it would without a memo).
    pub fn memo<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<&T> {
        self.memo
            .0
            .as_ref()?
            .get_or_init(|| Box::new(make()))
            .downcast_ref::<T>()
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::{Descriptor, Entry, LimitOverride, Policy, Request, Resolved, Unit};

    #[test]
    fn a_rule_keeps_one_memo_made_once() {
        let policy = Policy::parse(
            "memo.yaml",
            "domain: d\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 1, per: 1s }\n",
        )
        .expect("a valid policy");
        let rule = &policy.rules("d")[0];
        let made = AtomicUsize::new(0);
        let make = || {
            made.fetch_add(1, Ordering::Relaxed);
            7_u32
        };
        assert_eq!(rule.memo(make), Some(&7));
        assert_eq!(rule.memo(make), Some(&7));
        assert_eq!(made.load(Ordering::Relaxed), 1);
        // Another type finds the memo taken.
        assert_eq!(rule.memo(|| "other"), None);
        // A copy of the rule is another rule: it keeps its own.
        let copy = (**rule).clone();
        assert_eq!(copy.memo(|| 8_u32), Some(&8));
        assert_eq!(rule.memo(|| 9_u32), Some(&7));
    }

    #[test]
    fn a_rule_made_for_one_request_keeps_nothing() {
        let policy = Policy::parse(
            "memo.yaml",
            "domain: d\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 1, per: 1s }\n",
        )
        .expect("a valid policy");
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
        assert_eq!(applied.rule.memo(|| 7_u32), None);
    }
}
