//! Concurrency permits as a value: the leases a check took ([`Permit`]).

use tollgate_core::Lease;

/// The concurrency leases one admitted request holds: a value, given back by
/// handing it to [`Enforcer::release`](crate::Enforcer::release) (which consumes it). It names the
/// exact leases the store granted, so a release gives back those and no
/// other holder's, and a reload of the policy in between changes nothing. A
/// permit never given back lapses after its rule's period.
///
/// A door that hands it out (the service's `POST /v1/check`, as a `lease`
/// token that `POST /v1/release` takes back) makes it again from the leases
/// ([`Permit::from`]).
#[derive(Debug, Default, PartialEq, Eq)]
#[must_use = "a permit holds concurrency until it is released"]
pub struct Permit {
    pub(super) leases: Vec<Lease>,
}

impl Permit {
    /// Whether the permit holds nothing (no concurrency limit admitted).
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The leases it holds.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    pub(super) fn extend(&mut self, other: Permit) {
        self.leases.extend(other.leases);
    }
}

impl From<Vec<Lease>> for Permit {
    fn from(leases: Vec<Lease>) -> Self {
        Self { leases }
    }
}
