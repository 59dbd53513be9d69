//! A domain: the rules of one `domain:` and the tree that matches a request's
//! descriptors to them, as one file (or several merged) defines it.

use std::sync::Arc;

use crate::tree::Node;
use crate::{ConfigError, Rule, Shedding};

#[derive(Debug, Default)]
pub(crate) struct Domain {
    pub(crate) tree: Node,
    pub(crate) rules: Vec<Arc<Rule>>,
    /// The file that defined the domain, to report a duplicate.
    pub(crate) source: String,
    /// Written in envoyproxy/ratelimit's format (see [`Policy::is_envoy`](crate::Policy::is_envoy)).
    pub(crate) envoy: bool,
    /// envoyproxy/ratelimit's composite keys (`key_value`) of the top-level
    /// descriptors, each with the error to give when a merged file repeats it.
    pub(crate) top: Vec<(String, ConfigError)>,
    /// Load shedding on reported utilization (a native file's `shed:`).
    pub(crate) shedding: Option<Arc<Shedding>>,
}

impl Domain {
    /// Takes `other`'s descriptors as envoyproxy/ratelimit's loader patches a
    /// domain: a top-level descriptor may not repeat one already there; its
    /// wildcards are tried after the ones already there.
    pub(crate) fn merge(&mut self, other: Domain) -> Result<(), ConfigError> {
        for (composite, error) in &other.top {
            if self.top.iter().any(|(c, _)| c == composite) {
                let mut error = error.clone();
                error.reason = format!(
                    "duplicate descriptor composite key {composite:?}: domain merged with {}",
                    self.source
                );
                return Err(error);
            }
        }
        self.tree.graft(other.tree);
        self.rules.extend(other.rules);
        self.top.extend(other.top);
        Ok(())
    }
}
