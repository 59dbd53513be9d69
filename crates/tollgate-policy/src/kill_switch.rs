use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

/// Enforcement that can be turned off at run time, for a whole domain or for
/// one rule of a domain, without a restart. Reads are lock-free: the hot path
/// loads one flag while nothing is switched off, and a snapshot when
/// something is; the rare switch copies it.
#[derive(Debug, Default)]
pub struct KillSwitch {
    disabled: ArcSwap<HashSet<(String, Option<String>)>>,
    /// Whether `disabled` holds anything: one load where the snapshot's
    /// takes about 85 instructions, on every check.
    any: AtomicBool,
    /// Held while switching, so that `any` follows the last set stored.
    switching: Mutex<()>,
}

impl KillSwitch {
    /// Turns enforcement of `domain` (or of one `rule` in it) off or back on.
    pub fn set(&self, domain: &str, rule: Option<&str>, enforce: bool) {
        let _switching = self
            .switching
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (domain.to_owned(), rule.map(str::to_owned));
        let mut next = HashSet::clone(&self.disabled.load());
        if enforce {
            next.remove(&key);
        } else {
            next.insert(key);
        }
        let any = !next.is_empty();
        // Stored before the flag is raised, so a check that sees the flag
        // sees the set.
        self.disabled.store(Arc::new(next));
        self.any.store(any, Ordering::Release);
    }

    /// Whether `rule` of `domain` is enforced now.
    pub fn enforced(&self, domain: &str, rule: &str) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return true;
        }
        let disabled = self.disabled.load();
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
