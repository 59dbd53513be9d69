//! A bucket id onto the policy: the domain is the policy's domain, and the
//! bucket id's entries are the descriptor, ordered as the rule that matches
//! nests them (`{name: per-user, user: alice}` is `[(name, per-user),
//! (user, alice)]` for a rule `key: name, value: per-user` with `key: user`
//! nested under it).

use std::collections::{HashMap, HashSet};

use tollgate_policy::{Descriptor, Entry, Policy, Request, Resolved};

use super::fleet::Plan;

/// What a bucket is under the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A quota shared by the fleet: `key` is its budget (the storage key the
    /// Rate Limit Service counts it under), `rule` the rule's id.
    Quota {
        /// The budget's key.
        key: String,
        /// The rule's id, a bounded label.
        rule: String,
        /// How the quota is split.
        plan: Plan,
    },
    /// Admit everything: an unlimited rule, or a shadow rule (counted,
    /// never denying).
    AllowAll {
        /// The rule's id.
        rule: String,
    },
    /// Deny everything: a rule of zero requests.
    DenyAll {
        /// The rule's id.
        rule: String,
    },
    /// No rule of the domain matches: Envoy is to abandon the bucket.
    NoRule,
}

/// The bucket `bucket` of `domain` under `policy`.
///
/// Rules are tried in the order they were defined; a rule is a candidate
/// when it names exactly the bucket's keys, and the bucket then matches as
/// the descriptor in that rule's order would (exact values before
/// wildcards before any value, as every door matches).
pub fn target(policy: &Policy, domain: &str, bucket: &HashMap<String, String>) -> Target {
    matched(policy, domain, bucket).map_or(Target::NoRule, |(target, _)| target)
}

/// As [`target`], with the descriptor the bucket is: `None` when no rule
/// matches.
pub fn matched(
    policy: &Policy,
    domain: &str,
    bucket: &HashMap<String, String>,
) -> Option<(Target, Descriptor)> {
    let mut tried: HashSet<Vec<&str>> = HashSet::new();
    for rule in policy.rules(domain) {
        let order: Vec<&str> = rule.matches().map(|(key, _)| key).collect();
        if order.len() != bucket.len()
            || !order.iter().all(|k| bucket.contains_key(*k))
            || !tried.insert(order.clone())
        {
            continue;
        }
        let descriptor = Descriptor {
            entries: order
                .iter()
                .map(|k| Entry::new(*k, bucket[*k].as_str()))
                .collect(),
            limit: None,
            hits_addend: None,
        };
        let request = Request {
            domain,
            descriptors: std::slice::from_ref(&descriptor),
            hits_addend: 1,
        };
        let Ok(mut resolved) = policy.resolve(&request) else {
            continue;
        };
        let target = match resolved.pop() {
            Some(Resolved::Limit(applied)) if applied.shadow => Target::AllowAll {
                rule: applied.rule.id().to_owned(),
            },
            Some(Resolved::Limit(applied)) => {
                let plan = Plan::of(applied.algorithm, &applied.quota);
                Target::Quota {
                    key: applied.key,
                    rule: applied.rule.id().to_owned(),
                    plan,
                }
            }
            Some(Resolved::Unlimited(rule)) | Some(Resolved::Replaced(rule)) => Target::AllowAll {
                rule: rule.id().to_owned(),
            },
            Some(Resolved::Blocked(rule, _)) => Target::DenyAll {
                rule: rule.id().to_owned(),
            },
            Some(Resolved::NoRule) | None => continue,
        };
        return Some((target, descriptor));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const ENVOY: &str = r#"
domain: edge
descriptors:
  - key: name
    value: per-user
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    value: vip
    rate_limit: {unlimited: true}
  - key: user
    value: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
"#;

    fn policy() -> Policy {
        Policy::parse("edge.yaml", ENVOY).expect("valid")
    }

    #[test]
    fn a_bucket_is_the_descriptor_in_the_matching_rules_order() {
        let policy = policy();
        let alice = target(
            &policy,
            "edge",
            &bucket(&[("user", "alice"), ("name", "per-user")]),
        );
        let Target::Quota { key, plan, rule } = alice else {
            panic!("{alice:?}");
        };
        assert_eq!(rule, "name_per-user.user");
        assert_eq!(
            plan,
            Plan::Window {
                limit: 3,
                period: 60_000_000_000
            }
        );
        let Target::Quota { key: bob, .. } = target(
            &policy,
            "edge",
            &bucket(&[("name", "per-user"), ("user", "bob")]),
        ) else {
            panic!("bob has a quota");
        };
        assert_ne!(key, bob, "each user has a budget of their own");
    }

    #[test]
    fn one_entry_buckets_take_exact_values_before_any_value() {
        let policy = policy();
        assert!(matches!(
            target(&policy, "edge", &bucket(&[("user", "vip")])),
            Target::AllowAll { .. }
        ));
        assert!(matches!(
            target(&policy, "edge", &bucket(&[("user", "banned")])),
            Target::DenyAll { .. }
        ));
        assert!(matches!(
            target(&policy, "edge", &bucket(&[("user", "carol")])),
            Target::Quota {
                plan: Plan::Window { limit: 10, .. },
                ..
            }
        ));
        assert!(
            matches!(
                target(&policy, "edge", &bucket(&[("path", "/a")])),
                Target::AllowAll { .. }
            ),
            "a shadow rule never denies"
        );
    }

    #[test]
    fn buckets_no_rule_names_are_abandoned() {
        let policy = policy();
        for b in [
            bucket(&[("name", "other"), ("user", "alice")]),
            bucket(&[("name", "per-user")]),
            bucket(&[("name", "per-user"), ("user", "a"), ("x", "y")]),
            bucket(&[]),
        ] {
            assert_eq!(target(&policy, "edge", &b), Target::NoRule, "{b:?}");
        }
        assert_eq!(
            target(&policy, "nowhere", &bucket(&[("user", "alice")])),
            Target::NoRule
        );
    }

    #[test]
    fn rate_algorithms_are_split_as_rates() {
        let policy = Policy::parse(
            "native.yaml",
            "domain: api\nrules:\n  - name: per-tenant\n    match: [{key: tenant}]\n    algorithm: gcra\n    limit: { requests: 100, per: 1s, burst: 20 }\n",
        )
        .expect("valid");
        assert!(matches!(
            target(&policy, "api", &bucket(&[("tenant", "t1")])),
            Target::Quota {
                plan: Plan::Rate {
                    limit: 100,
                    burst: 20,
                    ..
                },
                ..
            }
        ));
    }
}
