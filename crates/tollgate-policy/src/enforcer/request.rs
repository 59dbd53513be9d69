//! What a door asks the enforcer: a policy request or an ad-hoc limit
//! ([`Check`], [`AdHoc`]), a request resolved once to be decided many times
//! ([`Prepared`]), and the bounds every request is held to ([`RequestLimits`]).

use std::sync::Arc;

use tollgate_core::{Algorithm, Quota};

use crate::{Descriptor, Policy, Request, RequestError, Resolved};

/// Ad-hoc keys live under this prefix. Policy storage keys start with a
/// length and a colon (`7:default|…`), so the two namespaces cannot meet.
pub(super) const ADHOC_PREFIX: &str = "adhoc:";

/// What to check: a request against the policy, or a limit the caller names.
#[derive(Debug, Clone, Copy)]
pub enum Check<'a> {
    /// Descriptors resolved against the policy in force.
    Policy(Request<'a>),
    /// A limit given in the request itself rather than by a policy.
    AdHoc(&'a AdHoc),
}

/// A limit given in the request itself rather than by a policy (Tollgate's
/// `POST /v1/check` with `key`). Its key is namespaced apart from every
/// policy's and by its own quota and algorithm, and it has the default
/// failure policy, `local`.
#[derive(Debug, Clone)]
pub struct AdHoc {
    /// The caller's key, before namespacing.
    pub key: String,
    /// How much may pass.
    pub quota: Quota,
    /// How it is counted.
    pub algorithm: Algorithm,
    /// What this request costs; 0 only reads.
    pub cost: u64,
}

impl AdHoc {
    /// The store key of this ad-hoc limit:
    /// `adhoc:<algorithm>:<limit>:<period ns>:<burst>:<key>` (a shaping
    /// limit's `delay_after` follows its algorithm's name). The quota is part
    /// of the key, so naming the same key with another quota spends another
    /// budget: a client cannot lock a key's owner out by checking it with a
    /// stricter or longer quota.
    pub fn store_key(&self) -> String {
        // Not `format!`: this runs on every ad-hoc check.
        let mut numbers = itoa::Buffer::new();
        let mut key = String::with_capacity(ADHOC_PREFIX.len() + 64 + self.key.len());
        key.push_str(ADHOC_PREFIX);
        key.push_str(self.algorithm.name());
        if let Algorithm::LeakyBucketShaping { delay_after } = self.algorithm {
            key.push('+');
            key.push_str(numbers.format(delay_after));
        }
        for n in [
            self.quota.limit(),
            self.quota.period_ns(),
            self.quota.burst(),
        ] {
            key.push(':');
            key.push_str(numbers.format(n));
        }
        key.push(':');
        key.push_str(&self.key);
        key
    }
}

/// A policy request resolved once ([`Enforcer::prepare`](crate::Enforcer::prepare)), to be decided
/// many times ([`Enforcer::enforce_prepared`](crate::Enforcer::enforce_prepared)). It keeps the policy it was
/// resolved under, so that a reload in between is noticed (and that policy
/// is not freed while the request is kept).
#[derive(Debug)]
pub struct Prepared {
    pub(super) domain: String,
    pub(super) descriptors: Arc<[Descriptor]>,
    pub(super) hits_addend: u64,
    pub(super) policy: Arc<Policy>,
    pub(super) resolved: Vec<Resolved>,
    pub(super) each: bool,
}

impl Prepared {
    /// The request it stands for.
    pub fn request(&self) -> Request<'_> {
        Request {
            domain: &self.domain,
            descriptors: &self.descriptors,
            hits_addend: self.hits_addend,
        }
    }
}

/// How large a request the enforcer takes. A request is resolved and checked
/// in one piece, so without a bound one client's request of 100,000
/// descriptors would hold a worker (and the store) while every other check
/// waits; and a string's bytes end up in store keys, so without a bound a
/// client's 1 MiB value became a 1 MiB Redis key (issue 39). A request past
/// these is refused as a bad request, at every door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Descriptors per request (default 128; Envoy's rate limit actions make
    /// a handful).
    pub descriptors: usize,
    /// Entries per descriptor (default 32).
    pub entries: usize,
    /// Bytes of the domain (default 256: a domain is a name an operator
    /// chose).
    pub domain_bytes: usize,
    /// Bytes of an entry's key (default 256: a key names what the value is,
    /// e.g. `remote_address`).
    pub key_bytes: usize,
    /// Bytes of an entry's value, and of an ad-hoc check's key (default
    /// 4,096: a value is often a client's header or path, which proxies
    /// commonly bound at 4–8 KiB a line).
    pub value_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            descriptors: 128,
            entries: 32,
            domain_bytes: 256,
            key_bytes: 256,
            value_bytes: 4096,
        }
    }
}

impl RequestLimits {
    pub(super) fn check(&self, request: &Request<'_>) -> Result<(), RequestError> {
        let too_long = |what, len, max| RequestError::TooLong { what, len, max };
        if request.domain.len() > self.domain_bytes {
            return Err(too_long(
                "the domain".into(),
                request.domain.len(),
                self.domain_bytes,
            ));
        }
        let count = request.descriptors.len();
        if count > self.descriptors {
            return Err(RequestError::TooManyDescriptors {
                count,
                max: self.descriptors,
            });
        }
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let count = descriptor.entries.len();
            if count > self.entries {
                return Err(RequestError::TooManyEntries {
                    index,
                    count,
                    max: self.entries,
                });
            }
            for entry in &descriptor.entries {
                if entry.key.len() > self.key_bytes {
                    let what = format!("descriptor {index}: an entry's key");
                    return Err(too_long(what, entry.key.len(), self.key_bytes));
                }
                if entry.value.len() > self.value_bytes {
                    let what = format!("descriptor {index}: the value of {:?}", entry.key);
                    return Err(too_long(what, entry.value.len(), self.value_bytes));
                }
            }
        }
        Ok(())
    }

    /// An ad-hoc check's key is held to the value's bound.
    pub(super) fn check_adhoc(&self, adhoc: &AdHoc) -> Result<(), RequestError> {
        if adhoc.key.len() > self.value_bytes {
            return Err(RequestError::TooLong {
                what: "the key".into(),
                len: adhoc.key.len(),
                max: self.value_bytes,
            });
        }
        Ok(())
    }
}
