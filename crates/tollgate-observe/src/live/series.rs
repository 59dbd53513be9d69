//! One counter of the live page ([`Series`]): below the page (`live`) and
//! the per-rule hub (`kept`) that keeps a rule's series for it.

use std::sync::atomic::AtomicU64;

/// One (domain, rule, result) counter. Ad-hoc checks have neither domain nor
/// rule.
#[derive(Debug)]
pub(crate) struct Series {
    pub(super) domain: Option<Box<str>>,
    pub(super) rule: Option<Box<str>>,
    pub(super) result: &'static str,
    pub(super) count: AtomicU64,
}
