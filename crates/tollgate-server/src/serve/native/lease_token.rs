//! The `lease` token: a [`Permit`] as `POST /v1/check` hands it out and
//! `POST /v1/release` takes it back, on any instance that shares the store.
//!
//! `cost:hex(key):id` per lease, joined by `.`: the cost in decimal, the
//! key's bytes in lowercase hex, the store's lease id (letters, digits, `-`,
//! `_`). Only those characters, `:` and `.`, so it needs no escaping in
//! JSON, a header or a URL.

use std::fmt::{self, Write};

use tollgate_core::{Lease, LeaseId};
use tollgate_policy::Permit;

/// A token that is not one [`Permit`]'s text; says which part is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidToken(&'static str);

impl fmt::Display for InvalidToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid lease token: bad {}", self.0)
    }
}

impl std::error::Error for InvalidToken {}

/// `permit`'s token.
pub(crate) fn token(permit: &Permit) -> String {
    let mut token = String::new();
    for (i, lease) in permit.leases().iter().enumerate() {
        if i > 0 {
            token.push('.');
        }
        // Writing to a String cannot fail.
        let _ = write!(token, "{}:", lease.cost);
        for byte in lease.key.bytes() {
            let _ = write!(token, "{byte:02x}");
        }
        let _ = write!(token, ":{}", lease.id);
    }
    token
}

/// The permit of exactly what [`token`] writes: one spelling per permit (no
/// sign, leading zero or upper-case hex), so a token is either a permit's
/// or refused.
pub(crate) fn permit(token: &str) -> Result<Permit, InvalidToken> {
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
    Ok(Permit::from(leases))
}

#[cfg(test)]
mod tests {
    use tollgate_core::ManualClock;
    use tollgate_policy::{Check, Descriptor, Enforcer, Entry, Policy, Request, Verdict};
    use tollgate_store::{MemoryConfig, MemoryStore};

    use super::*;

    /// Two requests in flight at once.
    const POLICY: &str = "domain: api
rules: [{ name: pool, match: [{ key: pool }], algorithm: concurrency, limit: { requests: 2, per: 1h } }]
";

    async fn run(enforcer: &Enforcer<MemoryStore<ManualClock>>) -> Verdict {
        let descriptors = [Descriptor {
            entries: vec![Entry::new("pool", "gpu")],
            ..Descriptor::default()
        }];
        enforcer
            .enforce(Check::Policy(Request {
                domain: "api",
                descriptors: &descriptors,
                hits_addend: 1,
            }))
            .await
            .expect("a valid request")
    }

    #[tokio::test]
    async fn a_token_releases_its_own_lease_once_and_no_other() {
        let clock = ManualClock::new(1_000_000_000);
        let enforcer = Enforcer::new(
            Policy::parse("api.yaml", POLICY).expect("a valid policy"),
            MemoryStore::with_clock(MemoryConfig::default(), clock),
        );
        let mut a = run(&enforcer).await;
        let mut b = run(&enforcer).await;
        assert!(a.allowed() && b.allowed());
        let a = std::mem::take(&mut a.permit);
        let b = token(&std::mem::take(&mut b.permit));
        assert_ne!(token(&a), b);
        // B's token, twice: the second gives back nothing of A's.
        assert_eq!(enforcer.release(permit(&b).unwrap()).await, 1);
        assert_eq!(enforcer.release(permit(&b).unwrap()).await, 1);
        assert!(run(&enforcer).await.allowed());
        assert!(!run(&enforcer).await.allowed(), "A still holds");
        assert_eq!(enforcer.release(a).await, 1);
        assert!(run(&enforcer).await.allowed());
    }

    #[test]
    fn permit_tokens_round_trip_and_refuse_what_they_did_not_write() {
        let token_text = "2:6b2f31:0123abcdef456789.1:ff00:l0a_1-b";
        assert!(permit(token_text).is_err(), "ff00 is no UTF-8 key");
        let token_text = "2:6b2f31:0123abcdef456789.1:6a:l0a_1-b";
        let parsed = permit(token_text).expect("a well-formed token");
        assert_eq!(parsed.leases().len(), 2);
        assert_eq!(
            (parsed.leases()[0].key.as_str(), parsed.leases()[0].cost),
            ("k/1", 2)
        );
        assert_eq!(parsed.leases()[1].id.as_str(), "l0a_1-b");
        assert_eq!(token(&parsed), token_text);
        for bad in [
            "x",
            "1:6b",
            "1:6b:id:more",
            "0:6b:id",
            "+1:6b:id",
            "01:6b:id",
            "1:6:id",
            "1:6B:id",
            "1::id",
            "1:6b:",
            "1:6b:i.d",
            "1:6b:i%20d",
            "1:6b:id.",
            "1:1:3:l:6b",
        ] {
            assert!(permit(bad).is_err(), "{bad:?} parsed");
        }
        assert!(permit("").expect("empty").is_empty());
        assert_eq!(
            permit("0:6b:id").unwrap_err().to_string(),
            "invalid lease token: bad cost"
        );
    }
}
