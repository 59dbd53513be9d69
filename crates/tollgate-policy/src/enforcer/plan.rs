//! What the enforcer does with each descriptor of a request ([`Plan`]),
//! decided from the policy's resolution and the enforcer's settings alone:
//! the store is asked only when the plan is carried out
//! ([`Enforcer`](super::Enforcer)'s `decide_resolved`).

use smallvec::SmallVec;
use tollgate_core::Nanos;

use crate::{Resolved, Rule};

use super::blocked;
use super::verdict::{DescriptorVerdict, State};

/// One descriptor's step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// No rule matched: not limited.
    NoRule,
    /// The rule counts nothing.
    Unlimited,
    /// Another rule of the request replaces this one.
    Replaced,
    /// The kill switch turned the rule (or its domain) off.
    Disabled,
    /// The rule refuses everything: a denial without a store call, or a
    /// would-be one when shadowed.
    Blocked { mode: Mode, quota: bool },
    /// A limit the store checks, in `call`.
    Check { call: Call, mode: Mode, quota: bool },
}

/// Whether a limit may deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// It enforces.
    Enforce,
    /// Its rule's own shadow mode: reported, never denying.
    Shadow,
    /// Only the enforcer's global shadow mode makes it a shadow limit
    /// (envoyproxy/ratelimit then keeps the descriptor's own over-limit
    /// code and lets only the request through).
    GlobalShadow,
}

/// The store call a checked limit goes in. Enforcing limits are checked
/// first, then shadow ones in calls of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// With the other limits of its kind in one call: all-or-nothing.
    Together,
    /// In a call of its own, charged whatever the others decide: a
    /// quota-mode limit, or envoyproxy/ratelimit's each-hit counting.
    Alone,
    /// Read at cost 0 in place of [`Call::Together`]: a blocked rule has
    /// denied the request, so its all-or-nothing limits are not charged.
    Peek,
}

/// What the enforcer's settings make of a rule.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    /// Every rule is a shadow rule.
    pub(super) shadow_mode: bool,
    /// Every rule is in quota mode.
    pub(super) quota_mode: bool,
    /// The request's descriptors are charged each on its own.
    pub(super) each: bool,
}

/// One step per descriptor of a request, in its order. Inline for the few
/// descriptors most requests have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan(pub(super) SmallVec<[Step; 4]>);

impl Plan {
    /// The plan for the descriptors `resolved` to, under `settings`, where
    /// `enforced` says whether the kill switch leaves a rule on.
    pub(super) fn new(
        resolved: &[Resolved],
        settings: Settings,
        enforced: impl Fn(&Rule) -> bool,
    ) -> Self {
        let mode = |shadow: bool| match (shadow, settings.shadow_mode) {
            (true, _) => Mode::Shadow,
            (false, true) => Mode::GlobalShadow,
            (false, false) => Mode::Enforce,
        };
        let quota = |rule: &Rule| settings.quota_mode || rule.quota_mode();
        let mut steps: SmallVec<[Step; 4]> = resolved
            .iter()
            .map(|r| match r {
                Resolved::NoRule => Step::NoRule,
                Resolved::Unlimited(_) => Step::Unlimited,
                Resolved::Replaced(_) => Step::Replaced,
                Resolved::Blocked(rule, _) | Resolved::Limit(crate::Applied { rule, .. })
                    if !enforced(rule) =>
                {
                    Step::Disabled
                }
                Resolved::Blocked(rule, _) => Step::Blocked {
                    mode: mode(rule.shadow()),
                    quota: quota(rule),
                },
                Resolved::Limit(applied) => {
                    let mode = mode(applied.shadow);
                    let quota = quota(&applied.rule);
                    let alone = settings.each || (quota && mode == Mode::Enforce);
                    Step::Check {
                        call: if alone { Call::Alone } else { Call::Together },
                        mode,
                        quota,
                    }
                }
            })
            .collect();
        // A blocked rule denies all-or-nothing without a store call, so the
        // limits beside it are only read.
        let denied = steps.iter().any(|s| {
            matches!(
                s,
                Step::Blocked {
                    mode: Mode::Enforce,
                    quota: false
                }
            )
        });
        if denied {
            for step in &mut steps {
                if let Step::Check {
                    call: call @ Call::Together,
                    mode: Mode::Enforce,
                    ..
                } = step
                {
                    *call = Call::Peek;
                }
            }
        }
        Self(steps)
    }
}

impl Step {
    /// The descriptor's answer before the store is asked: final for a step
    /// without a store call; a checked limit's decision is written in when
    /// its call answers.
    pub(super) fn verdict(self, resolved: &Resolved, now: Nanos) -> DescriptorVerdict {
        let state = |mode: Mode, enforcing: State| match mode {
            Mode::Enforce => enforcing,
            Mode::Shadow | Mode::GlobalShadow => State::Shadow,
        };
        // A rule with a limit is planned as one, or switched off.
        match (resolved, self) {
            (Resolved::NoRule, _) => DescriptorVerdict::new(State::NoRule, None),
            (Resolved::Unlimited(rule), _) => DescriptorVerdict::new(State::Unlimited, Some(rule)),
            (Resolved::Replaced(rule), _) => DescriptorVerdict::new(State::Replaced, Some(rule)),
            (Resolved::Blocked(rule, unit), Step::Blocked { mode, quota }) => DescriptorVerdict {
                envoy_limit: Some((0, *unit)),
                decision: Some(blocked(*unit, now)),
                quota,
                global_shadow: mode == Mode::GlobalShadow,
                ..DescriptorVerdict::new(state(mode, State::Blocked), Some(rule))
            },
            (Resolved::Limit(applied), Step::Check { mode, quota, .. }) => DescriptorVerdict {
                envoy_limit: Some(applied.envoy_limit),
                applied: Some((applied.quota, applied.algorithm)),
                quota,
                global_shadow: mode == Mode::GlobalShadow,
                ..DescriptorVerdict::new(state(mode, State::Limited), Some(&applied.rule))
            },
            (Resolved::Blocked(rule, _) | Resolved::Limit(crate::Applied { rule, .. }), _) => {
                DescriptorVerdict::new(State::Disabled, Some(rule))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Call::{Alone, Peek, Together};
    use super::Mode::{Enforce, GlobalShadow, Shadow};
    use super::*;
    use crate::{Descriptor, Entry, Policy, Request};

    /// One descriptor a line: blocked, shadow and quota-mode rules beside
    /// plain ones.
    const POLICY: &str = "
domain: d
descriptors:
  - { key: banned, rate_limit: { unit: minute, requests_per_unit: 0 } }
  - { key: dark_banned, shadow_mode: true, rate_limit: { unit: minute, requests_per_unit: 0 } }
  - { key: user, rate_limit: { unit: hour, requests_per_unit: 10 } }
  - { key: team, rate_limit: { unit: hour, requests_per_unit: 10 } }
  - { key: dark, shadow_mode: true, rate_limit: { unit: hour, requests_per_unit: 10 } }
  - { key: quota, quota_mode: true, rate_limit: { unit: hour, requests_per_unit: 10 } }
  - { key: open, rate_limit: { unlimited: true } }
";

    const ENFORCE: Settings = Settings {
        shadow_mode: false,
        quota_mode: false,
        each: false,
    };

    /// The plan for a request of one descriptor per key.
    fn plan(keys: &[&str], settings: Settings, off: &[&str]) -> Vec<Step> {
        let policy = Policy::parse("d.yaml", POLICY).expect("a valid policy");
        let descriptors: Vec<_> = keys
            .iter()
            .map(|key| Descriptor {
                entries: vec![Entry::new(*key, "v")],
                ..Descriptor::default()
            })
            .collect();
        let request = Request {
            domain: "d",
            descriptors: &descriptors,
            hits_addend: 1,
        };
        let resolved = policy.resolve(&request).expect("resolves");
        Plan::new(&resolved, settings, |rule| !off.contains(&rule.id()))
            .0
            .into_vec()
    }

    const fn check(call: Call, mode: Mode, quota: bool) -> Step {
        Step::Check { call, mode, quota }
    }

    const fn blocked(mode: Mode, quota: bool) -> Step {
        Step::Blocked { mode, quota }
    }

    #[test]
    fn enforcing_limits_are_checked_together_and_shadow_ones_after() {
        assert_eq!(
            plan(&["user", "team", "dark", "nothing", "open"], ENFORCE, &[]),
            [
                check(Together, Enforce, false),
                check(Together, Enforce, false),
                check(Together, Shadow, false),
                Step::NoRule,
                Step::Unlimited,
            ]
        );
    }

    #[test]
    fn a_blocked_rule_leaves_the_limits_beside_it_read() {
        assert_eq!(
            plan(&["banned", "user", "quota", "dark"], ENFORCE, &[]),
            [
                blocked(Enforce, false),
                check(Peek, Enforce, false),
                check(Alone, Enforce, true),
                check(Together, Shadow, false),
            ]
        );
        // A shadowed or switched-off blocked rule denies nothing.
        let steps = plan(&["dark_banned", "user"], ENFORCE, &[]);
        assert_eq!(steps[1], check(Together, Enforce, false));
        let steps = plan(&["banned", "user"], ENFORCE, &["banned"]);
        assert_eq!(steps, [Step::Disabled, check(Together, Enforce, false)]);
    }

    /// The enforcer's global settings, each on its own, for a blocked, an
    /// enforcing and a shadow rule.
    #[test]
    fn global_settings_change_each_step() {
        let set = |quota_mode, shadow_mode, each| Settings {
            shadow_mode,
            quota_mode,
            each,
        };
        let cases = [
            // Quota mode: every enforcing limit alone, and a blocked rule's
            // deny no longer denies the others.
            (
                set(true, false, false),
                [
                    blocked(Enforce, true),
                    check(Alone, Enforce, true),
                    check(Together, Shadow, true),
                ],
            ),
            // Global shadow mode: every rule a shadow one, the rules' own
            // shadow told apart.
            (
                set(false, true, false),
                [
                    blocked(GlobalShadow, false),
                    check(Together, GlobalShadow, false),
                    check(Together, Shadow, false),
                ],
            ),
            // envoyproxy/ratelimit's each-hit counting: every limit alone.
            (
                set(false, false, true),
                [
                    blocked(Enforce, false),
                    check(Alone, Enforce, false),
                    check(Alone, Shadow, false),
                ],
            ),
        ];
        for (settings, steps) in cases {
            let keys = ["banned", "user", "dark"];
            assert_eq!(plan(&keys, settings, &[]), steps, "{settings:?}");
        }
    }
}
