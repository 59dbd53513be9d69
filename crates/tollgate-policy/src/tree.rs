//! The matching tree both config formats compile to.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::{Entry, Rule};

/// The tree's maps, looked up on every check by the request's keys and
/// values. Hashed with foldhash rather than SipHash: their contents are the
/// config's, fixed at load, so a client's lookups cannot make them collide
/// into long probes, and foldhash is seeded per process all the same.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Per entry of a descriptor, whether its value is left out of the storage
/// key ([`Node::find`]); inline up to eight entries, which descriptors rarely
/// pass, so a check allocates nothing for it.
pub(crate) type Shared = SmallVec<[bool; 8]>;

/// How one level of a rule matches a descriptor entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// Exactly this value.
    Exact(String),
    /// Any value starting with this (the native format's `prefix*`); the
    /// longest prefix is tried first.
    Prefix(String),
    /// envoyproxy/ratelimit's wildcard: a `*` anywhere matches any run of
    /// characters; wildcards are tried in file order.
    Glob(Glob),
    /// Any value; each distinct value has its own budget.
    Any,
}

impl Pattern {
    /// Reads a native config value: absent is any, a trailing `*` is a prefix.
    pub(crate) fn parse(value: Option<&str>) -> Self {
        match value {
            None | Some("") => Pattern::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => Pattern::Prefix(prefix.to_owned()),
                None => Pattern::Exact(v.to_owned()),
            },
        }
    }

    /// Reads an envoyproxy/ratelimit value: empty is any, a value with a `*`
    /// is a wildcard whose matches share one budget when `share` is set.
    pub(crate) fn envoy(value: &str, share: bool) -> Self {
        if value.is_empty() {
            Pattern::Any
        } else if value.contains('*') {
            Pattern::Glob(Glob {
                parts: value.split('*').map(str::to_owned).collect(),
                share,
            })
        } else {
            Pattern::Exact(value.to_owned())
        }
    }
}

/// A value pattern split on its `*`s, as envoyproxy/ratelimit splits it at load
/// time (its `wildcardMatch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Glob {
    /// At least two parts: the pattern has at least one `*`.
    parts: Vec<String>,
    /// `share_threshold`: every matching value spends the same budget.
    share: bool,
}

impl Glob {
    /// Whether every matching value spends one budget (`share_threshold`).
    pub(crate) fn shares(&self) -> bool {
        self.share
    }

    /// Whether `value` starts with the first part, ends with the last and holds
    /// the middle ones in order, each `*` standing for zero or more characters.
    fn matches(&self, value: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        let fixed: usize = self.parts.iter().map(String::len).sum();
        // The length check keeps the first and last parts from overlapping, so
        // the slice below is in bounds; both ends are char boundaries because
        // the value starts and ends with those parts.
        if value.len() < fixed
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

impl fmt::Display for Glob {
    /// The pattern as written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.parts.join("*"))
    }
}

#[derive(Debug, Default)]
pub(crate) struct Node {
    exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, prefix, node)`, longest prefix first so the most specific wins.
    prefix: Vec<(String, String, Node)>,
    /// `(key, glob, node)` in file order: envoyproxy/ratelimit takes the first
    /// wildcard that matches, not the most specific.
    glob: Vec<(String, Glob, Node)>,
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
        let node = self.node(path);
        match &node.rule {
            Some(existing) => Err(Arc::clone(existing)),
            None => {
                node.rule = Some(rule);
                Ok(())
            }
        }
    }

    /// Adds `other`'s branches to this node's, where a branch of the same key
    /// and pattern is merged in turn; `other`'s wildcards go after this one's.
    /// The caller has made sure no rule meets another.
    pub(crate) fn graft(&mut self, other: Node) {
        for (key, values) in other.exact {
            let mine = self.exact.entry(key).or_default();
            for (value, node) in values {
                mine.entry(value).or_default().graft(node);
            }
        }
        for (key, node) in other.any {
            self.any.entry(key).or_default().graft(node);
        }
        for (key, prefix, node) in other.prefix {
            self.node(&[(key, Pattern::Prefix(prefix))]).graft(node);
        }
        for (key, glob, node) in other.glob {
            self.node(&[(key, Pattern::Glob(glob))]).graft(node);
        }
        if self.rule.is_none() {
            self.rule = other.rule;
        }
    }

    /// The node at the end of `path`, created if need be. A node without a
    /// rule still matches, and so stops a less specific pattern from matching:
    /// that is how envoyproxy/ratelimit exempts a value listed without a limit.
    pub(crate) fn node(&mut self, path: &[(String, Pattern)]) -> &mut Node {
        let Some(((key, pattern), rest)) = path.split_first() else {
            return self;
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
            Pattern::Glob(g) => {
                let at = match self.glob.iter().position(|(k, h, _)| k == key && h == g) {
                    Some(at) => at,
                    None => {
                        self.glob.push((key.clone(), g.clone(), Node::default()));
                        self.glob.len() - 1
                    }
                };
                &mut self.glob[at].2
            }
        };
        child.node(rest)
    }

    /// The rule for `entries`, and for each entry whether its value is left out
    /// of the storage key: matched exactly (the rule names it already) or by a
    /// wildcard with `share_threshold` (all its values share one budget).
    pub(crate) fn find(&self, entries: &[Entry]) -> Option<(&Arc<Rule>, Shared)> {
        let mut node = self;
        let mut shared = Shared::with_capacity(entries.len());
        for entry in entries {
            let (next, is_shared) = node.step(entry)?;
            shared.push(is_shared);
            node = next;
        }
        node.rule.as_ref().map(|rule| (rule, shared))
    }

    /// One level down, greedily as envoyproxy/ratelimit walks: an exact value,
    /// else a prefix or wildcard, else the key alone; no backtracking.
    fn step(&self, entry: &Entry) -> Option<(&Node, bool)> {
        if let Some(node) = self.exact.get(&entry.key).and_then(|m| m.get(&entry.value)) {
            return Some((node, true));
        }
        self.prefix
            .iter()
            .find(|(k, p, _)| *k == entry.key && entry.value.starts_with(p.as_str()))
            .map(|(_, _, node)| (node, false))
            .or_else(|| {
                self.glob
                    .iter()
                    .find(|(k, g, _)| *k == entry.key && g.matches(&entry.value))
                    .map(|(_, g, node)| (node, g.share))
            })
            .or_else(|| self.any.get(&entry.key).map(|node| (node, false)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(pattern: &str) -> Glob {
        match Pattern::envoy(pattern, false) {
            Pattern::Glob(g) => g,
            other => panic!("{pattern} is not a wildcard: {other:?}"),
        }
    }

    #[test]
    fn wildcards_match_as_envoyproxy_ratelimit_documents() {
        for (pattern, value, expected) in [
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("*", "", true),
            ("bar*b", "barb", true),
            ("bar*b", "bar123b", true),
            ("bar*b", "bara", false),
            ("bar*b", "xbarb", false),
            ("ab*ba", "aba", false),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo123bar456baz", true),
            ("foo*bar*baz", "foo123baz", false),
            ("foo*bar*baz", "bar456baz", false),
            ("/api/*/action", "/api/123/action", true),
            ("/api/*/action", "/api/123/other", false),
            ("é*é", "éxé", true),
            ("é*é", "é", false),
        ] {
            assert_eq!(
                glob(pattern).matches(value),
                expected,
                "{pattern} ~ {value}"
            );
        }
    }
}
