use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

/// Enforcement that can be turned off at run time, for a whole domain or for
/// one rule of a domain, without a restart. Reads are lock-free: the hot path
/// loads a snapshot; the rare switch copies it.
#[derive(Debug, Default)]
pub struct KillSwitch {
    disabled: ArcSwap<HashSet<(String, Option<String>)>>,
}

impl KillSwitch {
    /// Turns enforcement of `domain` (or of one `rule` in it) off or back on.
    pub fn set(&self, domain: &str, rule: Option<&str>, enforce: bool) {
        let key = (domain.to_owned(), rule.map(str::to_owned));
        self.disabled.rcu(|current| {
            let mut next = HashSet::clone(current);
            if enforce {
                next.remove(&key);
            } else {
                next.insert(key.clone());
            }
            Arc::new(next)
        });
    }

    /// Whether `rule` of `domain` is enforced now.
    pub fn enforced(&self, domain: &str, rule: &str) -> bool {
        let disabled = self.disabled.load();
        if disabled.is_empty() {
            return true;
        }
        !disabled
            .iter()
            .any(|(d, r)| d == domain && r.as_deref().is_none_or(|r| r == rule))
    }

    /// What is switched off: `(domain, rule)` pairs, `None` for a whole domain.
    pub fn disabled(&self) -> Vec<(String, Option<String>)> {
        let mut list: Vec<_> = self.disabled.load().iter().cloned().collect();
        list.sort();
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_domains_and_rules() {
        let k = KillSwitch::default();
        assert!(k.enforced("api", "per-ip"));
        k.set("api", Some("per-ip"), false);
        assert!(!k.enforced("api", "per-ip"));
        assert!(k.enforced("api", "per-user"));
        k.set("api", None, false);
        assert!(!k.enforced("api", "per-user"));
        k.set("api", None, true);
        k.set("api", Some("per-ip"), true);
        assert!(k.enforced("api", "per-ip"));
        assert!(k.disabled().is_empty());
    }
}
