//! The matching tree both config formats compile to.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{Entry, Rule};

/// How one level of a rule matches a descriptor entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// Exactly this value.
    Exact(String),
    /// Any value starting with this (written `prefix*`).
    Prefix(String),
    /// Any value; each distinct value has its own budget.
    Any,
}

impl Pattern {
    /// Reads a config value: absent is any, a trailing `*` is a prefix.
    pub(crate) fn parse(value: Option<&str>) -> Self {
        match value {
            None | Some("") => Pattern::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => Pattern::Prefix(prefix.to_owned()),
                None => Pattern::Exact(v.to_owned()),
            },
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Node {
    exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, prefix, node)`, longest prefix first so the most specific wins.
    prefix: Vec<(String, String, Node)>,
    any: HashMap<String, Node>,
    rule: Option<Arc<Rule>>,
}

impl Node {
    /// Adds `rule` at the end of `path`; gives back the rule already there, if any.
    pub(crate) fn insert(
        &mut self,
        path: &[(String, Pattern)],
        rule: Arc<Rule>,
    ) -> Result<(), Arc<Rule>> {
        let Some(((key, pattern), rest)) = path.split_first() else {
            return match self.rule.replace(Arc::clone(&rule)) {
                Some(existing) => {
                    self.rule = Some(Arc::clone(&existing));
                    Err(existing)
                }
                None => Ok(()),
            };
        };
        let child = match pattern {
            Pattern::Exact(v) => self
                .exact
                .entry(key.clone())
                .or_default()
                .entry(v.clone())
                .or_default(),
            Pattern::Any => self.any.entry(key.clone()).or_default(),
            Pattern::Prefix(p) => {
                let at = match self.prefix.iter().position(|(k, q, _)| k == key && q == p) {
                    Some(at) => at,
                    None => {
                        self.prefix.push((key.clone(), p.clone(), Node::default()));
                        self.prefix
                            .sort_by_key(|(_, p, _)| std::cmp::Reverse(p.len()));
                        self.prefix
                            .iter()
                            .position(|(k, q, _)| k == key && q == p)
                            .expect("just pushed")
                    }
                };
                &mut self.prefix[at].2
            }
        };
        child.insert(rest, rule)
    }

    /// The rule for `entries`, and for each entry whether its value was matched
    /// by an exact pattern (so it need not be part of the storage key).
    pub(crate) fn find(&self, entries: &[Entry]) -> Option<(&Arc<Rule>, Vec<bool>)> {
        let mut node = self;
        let mut exact = Vec::with_capacity(entries.len());
        for entry in entries {
            let (next, is_exact) = node.step(entry)?;
            exact.push(is_exact);
            node = next;
        }
        node.rule.as_ref().map(|rule| (rule, exact))
    }

    fn step(&self, entry: &Entry) -> Option<(&Node, bool)> {
        if let Some(node) = self.exact.get(&entry.key).and_then(|m| m.get(&entry.value)) {
            return Some((node, true));
        }
        self.prefix
            .iter()
            .find(|(k, p, _)| *k == entry.key && entry.value.starts_with(p.as_str()))
            .map(|(_, _, node)| (node, false))
            .or_else(|| self.any.get(&entry.key).map(|node| (node, false)))
    }
}
