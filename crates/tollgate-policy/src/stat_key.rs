//! The key envoyproxy/ratelimit names a rule's stats by, so that a metrics
//! layer can emit its series (`ratelimit.service.rate_limit.<domain>.<key>.total_hits`).

use std::borrow::Cow;

use crate::tree::Pattern;
use crate::{Descriptor, Rule};

impl Rule {
    /// The stats key envoyproxy/ratelimit gives this rule's counters for
    /// `descriptor` (which the rule matched), after `<domain>.` and before
    /// its stats manager replaces `:`, `|` and the dots of IPv4 addresses.
    /// Built as its `GetLimit` builds it (`src/config/config_impl.go`):
    ///
    /// - the rule's descriptor path, `key_value.key` (the rule's id);
    /// - with `detailed_metric`, every entry as the request sent it,
    ///   `key_value` (`key_` for an empty value), except that a
    ///   `share_threshold` wildcard level keeps its pattern;
    /// - else with `value_to_metric`, the request's value at each level
    ///   that sets it and has no exact value: a level with no value gains
    ///   it, a wildcard level (without `share_threshold`) shows it instead
    ///   of the pattern;
    /// - for a request's limit override, the descriptor's entries
    ///   (`key_value`, or `key` for an empty value).
    ///
    /// `None` for native rules: envoyproxy/ratelimit has no stats for them.
    pub fn envoy_stat_key(&self, descriptor: &Descriptor) -> Option<Cow<'_, str>> {
        let entries = &descriptor.entries;
        if self.id.starts_with("override:") {
            let parts: Vec<String> = entries.iter().map(|e| joined(&e.key, &e.value)).collect();
            return Some(Cow::Owned(parts.join(".")));
        }
        if !self.envoy_format {
            return None;
        }
        let varies = self.detailed_metric || self.value_to_metric.contains(&true);
        if !varies || entries.len() != self.path.len() {
            return Some(Cow::Borrowed(&self.id));
        }
        let levels = self.path.iter().zip(&self.value_to_metric);
        let parts: Vec<String> = levels
            .zip(entries)
            .map(|(((key, pattern), &to_metric), entry)| {
                let value = &entry.value;
                match pattern {
                    Pattern::Glob(g) if g.shares() => format!("{key}_{g}"),
                    _ if self.detailed_metric && self.has_shared_level() => joined(key, value),
                    _ if self.detailed_metric => format!("{key}_{value}"),
                    Pattern::Exact(v) => format!("{key}_{v}"),
                    Pattern::Prefix(p) => format!("{key}_{p}*"),
                    Pattern::Glob(_) | Pattern::Any if to_metric => joined(key, value),
                    Pattern::Glob(g) => format!("{key}_{g}"),
                    Pattern::Any => key.clone(),
                }
            })
            .collect();
        Some(Cow::Owned(parts.join(".")))
    }

    /// Whether a level is a `share_threshold` wildcard.
    fn has_shared_level(&self) -> bool {
        self.path
            .iter()
            .any(|(_, p)| matches!(p, Pattern::Glob(g) if g.shares()))
    }
}

/// `key_value`, or `key` alone when the value is empty.
fn joined(key: &str, value: &str) -> String {
    if value.is_empty() {
        key.to_owned()
    } else {
        format!("{key}_{value}")
    }
}

#[cfg(test)]
mod tests {
    use crate::{Descriptor, Entry, LimitOverride, Policy, Request, Resolved, Unit};

    /// The stats key of the rule that `entries` match in `yaml`'s domain `d`.
    fn key(yaml: &str, entries: &[(&str, &str)], limit: Option<LimitOverride>) -> Option<String> {
        let policy = Policy::parse("d.yaml", yaml).expect("a valid config");
        let descriptor = Descriptor {
            entries: entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
            limit,
            hits_addend: None,
        };
        let request = Request {
            domain: "d",
            descriptors: std::slice::from_ref(&descriptor),
            hits_addend: 1,
        };
        let resolved = policy.resolve(&request).expect("a valid request");
        let Some(Resolved::Limit(applied)) = resolved.into_iter().next() else {
            panic!("no limit for {entries:?}");
        };
        applied
            .rule
            .envoy_stat_key(&descriptor)
            .map(|k| k.into_owned())
    }

    const LIMIT: &str = "rate_limit: {unit: minute, requests_per_unit: 60}";

    /// envoyproxy/ratelimit's README (examples 8 and 10) and its
    /// `test/config/config_test.go` (`TestValueToMetric_*`, `TestShareThreshold`).
    #[test]
    fn keys_are_envoyproxy_ratelimits() {
        let plain = format!(
            "domain: d\ndescriptors:\n  - key: k1\n    value: A\n    descriptors:\n      - key: k2\n        {LIMIT}\n"
        );
        assert_eq!(
            key(&plain, &[("k1", "A"), ("k2", "x")], None).as_deref(),
            Some("k1_A.k2")
        );

        let detailed = format!(
            "domain: d\ndescriptors:\n  - key: key1\n    detailed_metric: true\n    {LIMIT}\n"
        );
        let got = key(&detailed, &[("key1", "unspecified_value")], None);
        assert_eq!(got.as_deref(), Some("key1_unspecified_value"));

        // value_to_metric above, detailed_metric at the leaf: detailed wins.
        let both = format!(
            "domain: d\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            detailed_metric: true\n            {LIMIT}\n"
        );
        let entries = [
            ("route", "draw"),
            ("http_method", "GET"),
            ("subject_id", "123"),
        ];
        let got = key(&both, &entries, None);
        assert_eq!(
            got.as_deref(),
            Some("route_draw.http_method_GET.subject_id_123")
        );

        let wildcard = format!(
            "domain: d\ndescriptors:\n  - key: user\n    value_to_metric: true\n    descriptors:\n      - key: action\n        value: read*\n        value_to_metric: true\n        descriptors:\n          - key: resource\n            {LIMIT}\n"
        );
        let entries = [
            ("user", "alice"),
            ("action", "readfile"),
            ("resource", "documents"),
        ];
        let got = key(&wildcard, &entries, None);
        assert_eq!(got.as_deref(), Some("user_alice.action_readfile.resource"));

        let shared = format!(
            "domain: d\ndescriptors:\n  - key: route\n    value: api/*\n    share_threshold: true\n    value_to_metric: true\n    descriptors:\n      - key: method\n        {LIMIT}\n  - key: service\n    value: svc/*\n    share_threshold: true\n    descriptors:\n      - key: endpoint\n        detailed_metric: true\n        {LIMIT}\n"
        );
        let got = key(&shared, &[("route", "api/v1"), ("method", "GET")], None);
        assert_eq!(got.as_deref(), Some("route_api/*.method"));
        let got = key(
            &shared,
            &[("service", "svc/user"), ("endpoint", "get")],
            None,
        );
        assert_eq!(got.as_deref(), Some("service_svc/*.endpoint_get"));
    }

    /// A request's own limit is named by its entries (`descriptorKey`), and a
    /// native rule has no envoyproxy/ratelimit stats.
    #[test]
    fn overrides_and_native_rules() {
        let plain = format!("domain: d\ndescriptors:\n  - key: k\n    {LIMIT}\n");
        let limit = Some(LimitOverride {
            requests_per_unit: 5,
            unit: Unit::Second,
        });
        let got = key(&plain, &[("k", "v"), ("e", "")], limit);
        assert_eq!(got.as_deref(), Some("k_v.e"));
        let native = "domain: d\nrules:\n  - name: per_user\n    match: [{ key: user }]\n    limit: { requests: 5, per: 1s }\n";
        assert_eq!(key(native, &[("user", "a")], None), None);
    }
}
