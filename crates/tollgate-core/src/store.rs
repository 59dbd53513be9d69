use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::{Algorithm, Decision, Quota};

/// One limit that a request must pass: whose budget (`key`), how much
/// (`quota`), how it is counted (`algorithm`), what this request costs, and
/// what to decide when the store holding it cannot answer (`failure`).
///
/// Everything is data, so the same limit can be checked in memory or sent to
/// Redis. Keys are the caller's namespace: two limits with the same key and
/// algorithm share one budget (a shared bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit<'a> {
    /// Whose budget this is, e.g. `"api:user:42"`.
    pub key: &'a str,
    /// How much may pass.
    pub quota: Quota,
    /// How it is counted.
    pub algorithm: Algorithm,
    /// What this request costs (Envoy's `hits_addend`); 0 only reads.
    pub cost: u64,
    /// What a networked store decides for this limit when it cannot reach its
    /// state (the memory store always can, and ignores it).
    pub failure: FailurePolicy,
}

impl<'a> Limit<'a> {
    /// A limit costing 1 per request, with the default failure policy
    /// ([`FailurePolicy::Local`]).
    pub const fn new(key: &'a str, quota: Quota, algorithm: Algorithm) -> Self {
        Self {
            key,
            quota,
            algorithm,
            cost: 1,
            failure: FailurePolicy::Local,
        }
    }

    /// The same limit at another cost.
    #[must_use]
    pub const fn with_cost(self, cost: u64) -> Self {
        Self { cost, ..self }
    }

    /// The same limit with another failure policy.
    #[must_use]
    pub const fn with_failure(self, failure: FailurePolicy) -> Self {
        Self { failure, ..self }
    }

    /// The `limit` its decisions report: the burst for the bucket
    /// algorithms, the limit for windows and concurrency (as the state
    /// machines report it).
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket
            | Algorithm::Gcra
            | Algorithm::LeakyBucket
            | Algorithm::LeakyBucketShaping { .. } => self.quota.burst(),
            _ => self.quota.limit(),
        }
    }

    /// The decision of this limit when it was not counted: allowed, its whole
    /// capacity left.
    pub fn untouched(&self) -> Decision {
        Decision::allow(self.capacity(), self.capacity(), Duration::ZERO)
    }
}

/// What a store decides for a limit when it cannot reach the limit's state
/// (Redis is down, slow, or its circuit breaker is open). Checks never return
/// an error for that: they return what this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailurePolicy {
    /// Admit, reporting the limit's full capacity as remaining (nothing was
    /// counted).
    FailOpen,
    /// Refuse.
    FailClosed,
    /// Decide from a local in-memory limiter with the same key, quota and
    /// algorithm: each instance then enforces the limit on its own traffic.
    #[default]
    Local,
}

impl FailurePolicy {
    /// What this policy decides for `limit` when its store cannot answer and
    /// no local state is at hand: `fail_closed` refuses (the same request may
    /// pass after `retry_after`, when known), `fail_open` admits without
    /// counting. `local` is `None`: the caller's local store decides (or,
    /// with none, nothing limits it). The one place a failure policy becomes
    /// a decision.
    pub fn decide(self, limit: &Limit<'_>, retry_after: Option<Duration>) -> Option<Decision> {
        match self {
            FailurePolicy::FailOpen => Some(limit.untouched()),
            FailurePolicy::FailClosed => Some(Decision::deny(
                limit.capacity(),
                0,
                Duration::ZERO,
                retry_after,
            )),
            FailurePolicy::Local => None,
        }
    }

    /// The name configs use: `fail_open`, `fail_closed` or `local`.
    pub fn name(self) -> &'static str {
        match self {
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::Local => "local",
        }
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FailurePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fail_open" => Ok(FailurePolicy::FailOpen),
            "fail_closed" => Ok(FailurePolicy::FailClosed),
            "local" => Ok(FailurePolicy::Local),
            _ => Err(format!(
                "unknown failure policy {s:?}; expected fail_open, fail_closed or local"
            )),
        }
    }
}

/// The name a store gave one concurrency lease it granted: opaque to
/// everyone else, and hard to guess (each store mixes a secret of its own
/// into it), so that only the holder of a lease can release it.
///
/// One to [`LeaseId::MAX_LEN`] ASCII letters, digits, `-` and `_`: it goes
/// into tokens, URLs and JSON as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(String);

/// A string that cannot be a [`LeaseId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid lease id: expected 1 to {max} ASCII letters, digits, '-' or '_'",
    max = LeaseId::MAX_LEN
)]
pub struct InvalidLeaseId;

impl LeaseId {
    /// The longest id: room for a store's own id and a few wrappers' tags.
    pub const MAX_LEN: usize = 128;

    /// `id`, if it is a valid lease id.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidLeaseId> {
        let id = id.into();
        let valid = (1..=Self::MAX_LEN).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if valid {
            Ok(Self(id))
        } else {
            Err(InvalidLeaseId)
        }
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// This id behind `tag`, for a wrapper to tell which of its stores
    /// granted a lease; `None` if that would be too long.
    pub fn tagged(&self, tag: &str) -> Option<LeaseId> {
        Self::new(format!("{tag}{}", self.0)).ok()
    }

    /// The id that [`LeaseId::tagged`] put behind `tag`, if this is one.
    pub fn untagged(&self, tag: &str) -> Option<LeaseId> {
        self.0.strip_prefix(tag).and_then(|id| Self::new(id).ok())
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for LeaseId {
    type Err = InvalidLeaseId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// One concurrency lease a check took: the budget (`key`), its units
/// (`cost`), and the id the store that granted it knows it by. Handing it to
/// [`Store::release`] gives back exactly this lease, from any process that
/// shares the store; a lease never released lapses after its quota's period.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The concurrency limit's key.
    pub key: String,
    /// The units it holds.
    pub cost: u64,
    /// The granting store's name for it.
    pub id: LeaseId,
}

/// The decisions for all the limits of one request, in the order they were
/// given, and the concurrency leases an admitted request took.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// One decision per limit. When any limit denies, nothing was consumed from
    /// any of them, and each decision says what that limit alone would have said.
    pub decisions: SmallVec<[Decision; 4]>,
    /// One lease per admitted concurrency limit of non-zero cost, in the
    /// order of the limits; empty when the request was denied.
    pub leases: Vec<Lease>,
}

impl Outcome {
    /// An outcome of these decisions that took no lease.
    pub fn new(decisions: SmallVec<[Decision; 4]>) -> Self {
        Self {
            decisions,
            leases: Vec::new(),
        }
    }

    /// Whether every limit admitted the request.
    #[inline]
    pub fn allowed(&self) -> bool {
        self.decisions.iter().all(|d| d.allowed())
    }

    /// The decision to report to the client: on a deny, the denying limit that
    /// asks the client to wait longest; on an allow, the one with the fewest
    /// units left (then the latest reset). `None` when there were no limits.
    pub fn most_restrictive(&self) -> Option<&Decision> {
        crate::most_restrictive(&self.decisions, |d| d)
    }
}

/// An [`Outcome`] and, when the backend that holds the state decided it, the
/// backend's time of the decision per limit, in microseconds on the backend's
/// own clock (Redis's `TIME` for the Redis store). A wrapper that answered
/// without the backend (a deny cache, a fallback) gives no time.
///
/// The time is what [`LeaseStore::give_back`] needs to return units to the state
/// they were taken from (a fixed window's units belong to the window of that
/// time), and lets a wrapper tell how long a window has left.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stamped {
    /// The decisions.
    pub outcome: Outcome,
    /// The backend's time per limit (µs), in the order of the limits; `None`
    /// when the backend did not decide.
    pub decided_at: Option<SmallVec<[u64; 4]>>,
}

/// Why a store could not decide. A store that can decide never errs: a deny is
/// an [`Outcome`], not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend did not answer in time.
    #[error("store timed out after {0:?}")]
    Timeout(Duration),
    /// The backend failed.
    #[error("store backend failed: {source}")]
    Backend {
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Whether the same call may succeed if tried again.
        retryable: bool,
    },
    /// The request itself cannot be checked (e.g. a key the backend cannot hold).
    #[error("invalid limit: {0}")]
    Invalid(String),
    /// The store does not implement this operation (e.g. giving units back).
    #[error("the store does not support {0}")]
    Unsupported(&'static str),
}

impl StoreError {
    /// Whether trying the same call again may help (a timeout or a passing fault).
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Timeout(_) => true,
            StoreError::Backend { retryable, .. } => *retryable,
            StoreError::Invalid(_) | StoreError::Unsupported(_) => false,
        }
    }
}

/// Where limits keep their state: in memory, in Redis, or both.
///
/// One call checks all the limits of one request atomically: the request is
/// admitted only if every limit admits it, and a deny by any limit consumes
/// nothing from the others.
pub trait Store: Send + Sync {
    /// Checks and, if every limit allows, consumes `limits`.
    fn check(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// Checks each of `limits` on its own, as [`Store::check`] of that limit
    /// alone would (each is charged whatever the others decide), and
    /// answers in their order. A store that can put them in fewer round
    /// trips does (the Redis store: one pipeline per node); a wrapper
    /// forwards them with what it does per check, so a failure of one part
    /// of a store fails only the limits it holds. The default checks them
    /// concurrently, one call each.
    fn check_each(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Vec<Result<Outcome, StoreError>>> + Send {
        futures_util::future::join_all(
            limits
                .iter()
                .map(|limit| self.check(std::slice::from_ref(limit))),
        )
    }

    /// Gives back exactly these leases, as [`Store::check`] returned them in
    /// [`Outcome::leases`]: call once when the request ends. A lease already
    /// released or lapsed, or one this store did not grant, is left alone.
    fn release(&self, leases: &[Lease]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether this store enforces `algorithm` at `quota` exactly; if not,
    /// [`StoreError::Invalid`] says why. Asked when a config loads and before
    /// a request's own quota (an ad-hoc limit, an override) is used, so that
    /// a limit the store cannot hold is refused up front instead of failing
    /// every check. The default holds every quota.
    fn supports(&self, algorithm: Algorithm, quota: &Quota) -> Result<(), StoreError> {
        let _ = (algorithm, quota);
        Ok(())
    }

    /// Whether every future this store returns (from [`Store::check`] and
    /// [`Store::release`]) is ready at its first poll: the store holds its
    /// state in this process and never waits. A caller may then poll such a
    /// call where it stands instead of boxing it to be polled again. A
    /// store that may wait for anything (a network round trip, an
    /// asynchronous lock) must answer `false`, the default.
    fn decides_at_once(&self) -> bool {
        false
    }

    /// The outcome [`Store::check`] would give `limits` now, where this
    /// store knows it without waiting for anything and without changing any
    /// state: a deny it remembers for every limit (the deny cache). Only a
    /// deny qualifies (an admit consumes), so the outcome holds no lease.
    /// `None`, the default, when only a check can tell. A caller that cannot
    /// afford to wait (a door past its bound on calls in flight) answers
    /// what this knows and sheds the rest.
    fn known(&self, limits: &[Limit<'_>]) -> Option<Outcome> {
        let _ = limits;
        None
    }

    /// Whether the store reaches its state now, for readiness probes. A
    /// networked store answers checks even when it does not (each limit's
    /// [`FailurePolicy`] decides), so only this tells. Stores that hold their
    /// state themselves, like the memory store, always do.
    fn ready(&self) -> impl Future<Output = bool> + Send {
        std::future::ready(true)
    }

    /// The part of the store that holds `key`'s state, where parts fail
    /// alone (a Redis Cluster's slot ranges, each served by one primary):
    /// a wrapper that stops asking a failing store (the fallback's circuit
    /// breaker) then stops asking only the failing part, and keys held
    /// elsewhere keep their store's decisions. `None`, the default: the
    /// store fails as a whole. Names are few (one per part) and stable while
    /// the part is, whichever server serves it.
    fn domain(&self, key: &str) -> Option<Arc<str>> {
        let _ = key;
        None
    }

    /// Whether the part named `domain` (from [`Store::domain`]) reaches its
    /// state now; the default asks the whole store ([`Store::ready`]).
    fn domain_ready(&self, domain: &str) -> impl Future<Output = bool> + Send {
        let _ = domain;
        self.ready()
    }

    /// Forgets the state of each limit's key under its algorithm, so the key
    /// starts afresh with its whole quota (an operator's reset). Concurrency
    /// leases held on it are forgotten too: releasing them later gives
    /// nothing back. The default cannot, and says so with
    /// [`StoreError::Unsupported`].
    fn reset(&self, limits: &[Limit<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = limits;
        std::future::ready(Err(StoreError::Unsupported("reset")))
    }
}

/// A hybrid instance holding leased units, as a [`LeaseStore`] records it
/// beside the budget the units came from, so that units it never gives
/// back (it crashed, or a call that leased them never answered) come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The record's id, unique among the instances sharing the store
    /// (random), below 2^52. An instance takes a new one for its next
    /// leases when a call may have changed its record without its
    /// knowing (the call failed), so that the old record, no longer
    /// refreshed, is credited back at its deadline.
    pub id: u64,
    /// How long after a call the holder's record lasts: a leasing check
    /// ([`LeaseStore::check_leasing`]) finding it past that credits its
    /// units back, as the holder would have given them back by then.
    pub ttl: Duration,
}

/// How a call changes what a [`Holder`]'s record says it holds of one
/// limit's budget. The record is a sum: what checks leased to the holder,
/// less what the holder said it no longer holds. So a call whose answer
/// the holder never saw (it timed out after the store took the units)
/// still counts in the record, and comes back with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leased {
    /// Units the holder no longer holds since it last told the store
    /// (spent, or given back): taken off the record, whatever the check
    /// decides.
    pub released: u64,
    /// Units the call leases to the holder (its extra cost): added to the
    /// record when the check admits.
    pub leased: u64,
}

/// A [`Store`] that can hold the leases of hybrid mode (tollgate-store's
/// `Hybrid`): it says when its backend decided ([`Stamped`]) and takes
/// leased units back. The stores that keep state implement it, and the
/// wrappers that forward it; a store that implements it with the defaults
/// takes part without giving units back.
pub trait LeaseStore: Store {
    /// [`Store::check`], also saying whether the backend decided and at what
    /// backend time ([`Stamped`]). Wrappers that lease units (hybrid mode)
    /// need it; the default says nothing about time, so units taken through it
    /// are never given back.
    fn check_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Result<Stamped, StoreError>> + Send {
        async move {
            Ok(Stamped {
                outcome: self.check(limits).await?,
                decided_at: None,
            })
        }
    }

    /// [`Store::check_each`], each answer stamped as
    /// [`LeaseStore::check_stamped`] stamps it. The default checks them
    /// concurrently, one call each.
    fn check_each_stamped(
        &self,
        limits: &[Limit<'_>],
    ) -> impl Future<Output = Vec<Result<Stamped, StoreError>>> + Send {
        futures_util::future::join_all(
            limits
                .iter()
                .map(|limit| self.check_stamped(std::slice::from_ref(limit))),
        )
    }

    /// [`LeaseStore::check_stamped`] for a check whose costs include units
    /// leased to `holder`: `leased` says, per limit, how the call changes
    /// the holder's record (`None`: no record). The store first credits
    /// back the units of every record of these limits past its time (a
    /// holder that crashed, or units leased by a call whose holder never
    /// saw its answer), then checks, then applies each change (the units
    /// leased only when admitted), the record to last `holder.ttl` past the
    /// store's time of decision. A limit of cost 0 is a report of what the
    /// holder spent: it never makes a record that is gone. The default
    /// records nothing: units held by an instance that crashed come back
    /// only as the state refills or its window ends.
    fn check_leasing(
        &self,
        limits: &[Limit<'_>],
        holder: Holder,
        leased: &[Option<Leased>],
    ) -> impl Future<Output = Result<Stamped, StoreError>> + Send {
        let _ = (holder, leased);
        self.check_stamped(limits)
    }

    /// Units of `limit`'s budget this store holds, taken from the backend
    /// and not spent (a hybrid instance's live lease of the key), which the
    /// `remaining` the backend reports leaves out. The default holds none.
    fn leased(&self, limit: &Limit<'_>) -> u64 {
        let _ = limit;
        0
    }

    /// Gives `limit.cost` units back to `limit`'s state, as taken by a check
    /// the backend decided at `taken_at` (µs, from [`Stamped::decided_at`]):
    /// exact for the buckets and GCRA, and for a fixed window only within the
    /// window of `taken_at`. Best effort, for units leased but never spent.
    /// With a `holder`, units leased by [`LeaseStore::check_leasing`]: they
    /// go back only if the holder's record lives (else a later check
    /// credited them already), and the record loses what [`Leased::released`]
    /// says (the units given back and those spent since the holder last
    /// told); it goes when nothing is left in it.
    ///
    /// The default cannot give back, and says so with
    /// [`StoreError::Unsupported`]: the units stay spent, which errs on the
    /// strict side.
    fn give_back(
        &self,
        limit: &Limit<'_>,
        taken_at: u64,
        holder: Option<(Holder, Leased)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (limit, taken_at, holder);
        std::future::ready(Err(StoreError::Unsupported("give_back")))
    }
}

/// The output of `future` at its first poll, for a future that awaits
/// nothing but calls to stores that decide at once
/// ([`Store::decides_at_once`]): polled where it stands, it needs no box
/// and no room in an enclosing future.
///
/// # Panics
///
/// If `future` is still pending at its first poll: a store that claimed to
/// decide at once did not.
pub fn at_first_poll<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => unreachable!(
            "a check on stores that decide at once (Store::decides_at_once) was left pending"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_short_url_safe_text_and_tags_come_off_exactly() {
        let id = LeaseId::new("0a-Z_9").unwrap();
        assert_eq!(id.as_str().parse::<LeaseId>(), Ok(id.clone()));
        for bad in [
            "",
            "a.b",
            "a b",
            "a/b",
            "é",
            &"x".repeat(LeaseId::MAX_LEN + 1),
        ] {
            assert_eq!(LeaseId::new(bad), Err(InvalidLeaseId), "{bad:?}");
        }
        assert!(LeaseId::new("x".repeat(LeaseId::MAX_LEN)).is_ok());
        let tagged = id.tagged("i").unwrap();
        assert_eq!(tagged.as_str(), "i0a-Z_9");
        assert_eq!(tagged.untagged("i"), Some(id.clone()));
        assert_eq!(tagged.untagged("l"), None);
        assert_eq!(
            LeaseId::new("i").unwrap().untagged("i"),
            None,
            "nothing left"
        );
        let longest = LeaseId::new("x".repeat(LeaseId::MAX_LEN)).unwrap();
        assert_eq!(longest.tagged("i"), None);
    }
}
