//! Concurrency permits as a value: the leases a check took ([`Permit`]),
//! and their text form, the `lease` token a door hands out and takes back.

use std::fmt;
use std::str::FromStr;

use tollgate_core::{Lease, LeaseId};

/// The concurrency leases one admitted request holds: a value, given back by
/// handing it to [`Enforcer::release`](crate::Enforcer::release) (which consumes it). It names the
/// exact leases the store granted, so a release gives back those and no
/// other holder's, and a reload of the policy in between changes nothing. A
/// permit never given back lapses after its rule's period.
///
/// Over HTTP it travels as an opaque token ([`fmt::Display`] and
/// [`FromStr`]) that `POST /v1/release` takes back, on any instance that
/// shares the store.
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

/// A token that is not one [`Permit`]'s text; says which part is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid lease token: bad {0}")]
pub struct InvalidToken(&'static str);

/// `cost:hex(key):id` per lease, joined by `.`: the cost in decimal, the key's
/// bytes in lowercase hex, the store's lease id (letters, digits, `-`, `_`).
/// Only those characters, `:` and `.`, so it needs no escaping in JSON, a
/// header or a URL.
impl fmt::Display for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, lease) in self.leases.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{}:", lease.cost)?;
            for byte in lease.key.bytes() {
                write!(f, "{byte:02x}")?;
            }
            write!(f, ":{}", lease.id)?;
        }
        Ok(())
    }
}

/// Parses exactly what [`fmt::Display`] writes: one spelling per permit
/// (no sign, leading zero or upper-case hex), so a token is either a
/// permit's or refused.
impl FromStr for Permit {
    type Err = InvalidToken;

    fn from_str(token: &str) -> Result<Self, Self::Err> {
        if token.is_empty() {
            return Ok(Permit::default());
        }
        let leases = token
            .split('.')
            .map(|part| {
                let mut fields = part.split(':');
                let (Some(cost), Some(hex), Some(id), None) =
                    (fields.next(), fields.next(), fields.next(), fields.next())
                else {
                    return Err(InvalidToken("lease (want cost:key:id)"));
                };
                let cost = cost
                    .parse::<u64>()
                    .ok()
                    .filter(|&c| c > 0 && c.to_string() == cost)
                    .ok_or(InvalidToken("cost"))?;
                let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
                if hex.is_empty() || hex.len() % 2 != 0 || !hex.bytes().all(lower_hex) {
                    return Err(InvalidToken("key"));
                }
                let bytes = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| InvalidToken("key"))?;
                let key = String::from_utf8(bytes).map_err(|_| InvalidToken("key"))?;
                let id = id
                    .parse::<LeaseId>()
                    .map_err(|_| InvalidToken("lease id"))?;
                Ok(Lease { key, cost, id })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Permit { leases })
    }
}
