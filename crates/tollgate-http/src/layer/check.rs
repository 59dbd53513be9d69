//! The check every request goes through: descriptors, the optional local
//! pre-check, the enforcer, headers. Deciding is the enforcer's
//! ([`tollgate_policy::Enforcer`], the one every Tollgate door calls); this
//! module only turns its verdict into a pass with headers or an answer.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Response};
use tollgate_core::{Store, at_first_poll};
use tollgate_policy::{
    Check as PolicyCheck, Descriptor, Enforcer, Permit, Prepared, Request, RequestError,
};

use super::denial::{self, Answer};
use crate::headers::reports;
use crate::shed;
use crate::{DescriptorSource, HeaderStyle};

/// A future the layer boxes: the check, a permit release.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The limiter behind a layer, with its store types erased so that the
/// layer's types name only the inner service.
pub(crate) trait DynLimiter: Send + Sync + 'static {
    /// The descriptors the configured sources make of `request`, from the
    /// socket peer `peer` when the service was told it.
    fn descriptors(&self, request: &Parts, peer: Option<IpAddr>) -> Vec<Descriptor>;

    /// The check of every request over a connection from `peer` that names
    /// no peer itself, when every source makes its descriptor from the peer
    /// alone ([`DescriptorSource::descriptor_of_peer`]).
    fn peer_check(&self, peer: IpAddr) -> Option<Arc<PeerCheck>>;

    /// Decides a request with these descriptors where it is asked, when
    /// every store the check asks decides at once (the memory store);
    /// `None`, having done nothing, when one waits.
    fn check_now(&self, descriptors: &Descriptors) -> Option<Checked>;

    /// Decides a request with these descriptors in a future to poll.
    fn check(self: Arc<Self>, descriptors: Descriptors) -> BoxFuture<Admission>;
}

/// A check, decided or on its way.
pub(crate) enum Checked {
    /// Decided where it was asked: nothing to box, no request to hold.
    Now(Admission),
    /// To be polled: a store that waits, or a request shaping holds.
    Later(BoxFuture<Admission>),
}

/// A request's descriptors: made from it, or its connection's, made once.
pub(crate) enum Descriptors {
    /// Made from the request.
    Made(Vec<Descriptor>),
    /// The connection's ([`DynLimiter::peer_check`]).
    Peer(Arc<PeerCheck>),
}

impl std::ops::Deref for Descriptors {
    type Target = [Descriptor];

    fn deref(&self) -> &[Descriptor] {
        match self {
            Descriptors::Made(made) => made,
            Descriptors::Peer(peer) => &peer.descriptors,
        }
    }
}

/// What every request of a connection shares when its descriptors depend on
/// its peer alone: the descriptors, and their resolution against the policy
/// in force when the connection began ([`Enforcer::prepare`]).
pub(crate) struct PeerCheck {
    descriptors: Arc<[Descriptor]>,
    /// `None` for no descriptors, or ones the policy cannot take (which
    /// each request's check then finds as it would without this).
    prepared: Option<Prepared>,
}

/// What the check decided.
pub(crate) enum Admission {
    /// Forward the request; add the headers of `reported` to the response;
    /// drop `permits` when the response is ready (or the request is
    /// abandoned).
    Pass {
        reported: Option<Reported>,
        permits: Permits,
    },
    /// Answer instead of the inner service, with what [`Denied::response`]
    /// makes.
    Deny(Denied),
    /// Answer 400: the request carries a string past the enforcer's caps
    /// ([`tollgate_policy::RequestLimits`]), which it says.
    Refuse(String),
}

/// The answer to a request whose descriptors carry a string past its cap:
/// 400, in the shape of the gateway's own errors.
pub(crate) fn refusal(reason: &str) -> Response<Bytes> {
    let body = serde_json::json!({"error": "bad_request", "message": reason});
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = http::StatusCode::BAD_REQUEST;
    response.headers_mut().insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A denied request's verdict, kept until the answer is made from it.
pub(crate) struct Denied(Reported);

impl Denied {
    /// The answer to the denied request, in the shape `answer` says
    /// ([`denial::too_many`]).
    pub(crate) fn response(&self, answer: Answer) -> Response<Bytes> {
        let Reported { verdict, style } = &self.0;
        if let Some(shed) = &verdict.shed {
            // Shed on the utilization the service reports or its shared
            // budget: the same 503 (UNAVAILABLE to gRPC) as the shedder in
            // front of an upstream answers, not a 429 (the client is not
            // over a limit of its own).
            if answer == Answer::Grpc {
                return shed::overloaded_grpc(shed.retry_after);
            }
            let (seconds, body) = shed::overloaded_body(shed.retry_after);
            return shed::overloaded(body, HeaderValue::from(seconds));
        }
        denial::too_many(*style, answer, &reports(verdict), verdict.started_at)
    }
}

/// The verdict whose limits a response's headers describe, kept until the
/// response exists: its headers are then written straight into the
/// response's map, where a list of them made at the check would take an
/// allocation and a copy of each.
pub(crate) struct Reported {
    verdict: tollgate_policy::Verdict,
    style: HeaderStyle,
}

impl Reported {
    /// Sets the headers on `headers`, replacing any of the same name.
    pub(crate) fn set_on(&self, headers: &mut HeaderMap) {
        let verdict = &self.verdict;
        self.style
            .write(&reports(verdict), verdict.started_at, headers);
    }
}

/// Concurrency permits an admitted request holds, given back when dropped.
///
/// Each release is polled once at once (the memory store's is ready then);
/// one that is still pending is spawned on the current tokio runtime. Outside
/// a runtime it is dropped, and a remote store's lease expiry reclaims it.
#[derive(Default)]
pub(crate) struct Permits {
    releases: Vec<BoxFuture<()>>,
}

impl Permits {
    fn add(&mut self, release: Option<BoxFuture<()>>) {
        self.releases.extend(release);
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        for mut release in self.releases.drain(..) {
            if release.as_mut().poll(&mut cx).is_pending()
                && let Ok(runtime) = tokio::runtime::Handle::try_current()
            {
                runtime.spawn(release);
            }
        }
    }
}

/// Everything a layer's check needs: the enforcer that decides (the
/// service's own when the layer shares it), an optional pre-check enforcer on
/// a store in this process, and how to make descriptors and headers.
pub(crate) struct Limiter<St, L> {
    pub(crate) domain: String,
    pub(crate) enforcer: Arc<Enforcer<St>>,
    pub(crate) precheck: Option<Arc<Enforcer<L>>>,
    pub(crate) sources: Vec<Box<dyn DescriptorSource>>,
    pub(crate) style: HeaderStyle,
}

impl<St: Store + 'static, L: Store + 'static> DynLimiter for Limiter<St, L> {
    fn descriptors(&self, request: &Parts, peer: Option<IpAddr>) -> Vec<Descriptor> {
        // A descriptor with no entries (a custom source's) limits nothing.
        self.sources
            .iter()
            .filter_map(|source| source.descriptor_from(request, peer))
            .filter(|descriptor| !descriptor.entries.is_empty())
            .collect()
    }

    fn peer_check(&self, peer: IpAddr) -> Option<Arc<PeerCheck>> {
        let mut made = Vec::with_capacity(self.sources.len());
        for source in &self.sources {
            // As `descriptors` leaves them out.
            if let Some(descriptor) = source.descriptor_of_peer(peer)?
                && !descriptor.entries.is_empty()
            {
                made.push(descriptor);
            }
        }
        let descriptors: Arc<[Descriptor]> = made.into();
        let prepared = (!descriptors.is_empty())
            .then(|| {
                self.enforcer
                    .prepare(&self.domain, Arc::clone(&descriptors), 1)
                    .ok()
            })
            .flatten();
        Some(Arc::new(PeerCheck {
            descriptors,
            prepared,
        }))
    }

    fn check_now(&self, descriptors: &Descriptors) -> Option<Checked> {
        if !self.decides_at_once() {
            return None;
        }
        let (verdict, delay) = at_first_poll(self.decide(descriptors));
        Some(if delay.is_zero() {
            Checked::Now(verdict)
        } else {
            Checked::Later(Box::pin(held(delay, verdict)))
        })
    }

    fn check(self: Arc<Self>, descriptors: Descriptors) -> BoxFuture<Admission> {
        Box::pin(async move {
            let (verdict, delay) = self.decide(&descriptors).await;
            held(delay, verdict).await
        })
    }
}

impl<St: Store + 'static, L: Store + 'static> Limiter<St, L> {
    /// Whether every store this check asks decides at once
    /// ([`Enforcer::decides_at_once`]).
    fn decides_at_once(&self) -> bool {
        self.enforcer.decides_at_once()
            && self
                .precheck
                .as_ref()
                .is_none_or(|precheck| precheck.decides_at_once())
    }

    /// The verdict, and how long shaping holds an admitted request first.
    async fn decide(&self, descriptors: &Descriptors) -> (Admission, Duration) {
        let mut permits = Permits::default();
        if descriptors.is_empty() {
            return (pass(permits), Duration::ZERO);
        }
        // The local pre-check: obviously-over-limit traffic stops here. A
        // request the policy cannot take (e.g. more descriptors than the
        // enforcer takes, which only many custom sources can make) is not
        // limited.
        let mut prechecked = None;
        if let Some(precheck) = &self.precheck
            && let Ok(mut verdict) = precheck.enforce(self.request(descriptors)).await
        {
            if !verdict.allowed() {
                return (self.deny(verdict), Duration::ZERO);
            }
            permits.add(release(precheck, std::mem::take(&mut verdict.permit)));
            prechecked = Some(verdict);
        }

        let enforced = match descriptors {
            Descriptors::Peer(peer) if let Some(prepared) = &peer.prepared => {
                self.enforcer.enforce_prepared(prepared).await
            }
            _ => self.enforcer.enforce(self.request(descriptors)).await,
        };
        let mut verdict = match enforced {
            Ok(verdict) => verdict,
            // A string past its cap comes from the client (a header, a
            // path): passed, as other refusals are, it would let any client
            // skip every limit by sending one.
            Err(error @ RequestError::TooLong { .. }) => {
                return (Admission::Refuse(error.to_string()), Duration::ZERO);
            }
            Err(_) => return (pass(permits), Duration::ZERO),
        };
        if !verdict.allowed() {
            // Dropping `permits` gives back what the pre-check took.
            return (self.deny(verdict), Duration::ZERO);
        }
        permits.add(release(&self.enforcer, std::mem::take(&mut verdict.permit)));

        // A shaping rule admits with a delay.
        let delay = verdict.delay();
        // Headers describe the store of record's limits, or the pre-check's
        // when no limit of record applied.
        let verdict = match prechecked {
            Some(prechecked) if reports(&verdict).is_empty() => prechecked,
            _ => verdict,
        };
        let reported = Some(Reported {
            verdict,
            style: self.style,
        });
        (Admission::Pass { reported, permits }, delay)
    }

    /// The enforcer's request for `descriptors`. Made where each enforcer
    /// takes it rather than kept in a local: one held across the awaits
    /// would add its bytes to every check's future, and with them the
    /// future outgrows the allocator's per-thread cache (see the test
    /// `a_check_is_a_small_allocation`).
    fn request<'a>(&'a self, descriptors: &'a [Descriptor]) -> PolicyCheck<'a> {
        PolicyCheck::Policy(Request {
            domain: &self.domain,
            descriptors,
            hits_addend: 1,
        })
    }

    fn deny(&self, verdict: tollgate_policy::Verdict) -> Admission {
        Admission::Deny(Denied(Reported {
            verdict,
            style: self.style,
        }))
    }
}

/// `verdict` once `delay` has passed: a shaping rule holds the request it
/// admits that long.
async fn held(delay: Duration, verdict: Admission) -> Admission {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    verdict
}

/// A pass with no headers.
fn pass(permits: Permits) -> Admission {
    Admission::Pass {
        reported: None,
        permits,
    }
}

/// The future that gives `permit` back to `enforcer`, if it holds anything.
fn release<S: Store + 'static>(
    enforcer: &Arc<Enforcer<S>>,
    permit: Permit,
) -> Option<BoxFuture<()>> {
    if permit.is_empty() {
        return None;
    }
    let enforcer = Arc::clone(enforcer);
    Some(Box::pin(async move {
        enforcer.release(permit).await;
    }))
}

#[cfg(test)]
mod tests {
    use tollgate_core::{Clock, SystemClock};
    use tollgate_policy::{Policy, PolicyHandle};
    use tollgate_store::{MemoryConfig, MemoryStore};

    use super::*;

    #[test]
    fn a_check_is_a_small_allocation() {
        /// The largest allocation glibc serves from its per-thread cache;
        /// a larger one takes malloc's slow path (about 380 instructions
        /// against 41, measured in the gateway).
        const SMALL_ALLOCATION: usize = 1032;
        /// Room for a store that dispatches to others: `tollgate serve`'s,
        /// over memory or Redis, makes the enforcer's future 16 bytes
        /// larger than the memory store's alone.
        const DISPATCH: usize = 32;
        let policy = Policy::parse(
            "size.yaml",
            "domain: d\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 1, per: 1s }\n",
        )
        .expect("a valid policy");
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let store = MemoryStore::with_clock(MemoryConfig::default(), clock);
        let limiter: Arc<Limiter<_, MemoryStore>> = Arc::new(Limiter {
            domain: "d".to_owned(),
            enforcer: Arc::new(Enforcer::new(PolicyHandle::new(policy), store)),
            precheck: None,
            sources: Vec::new(),
            style: HeaderStyle::default(),
        });
        let check = limiter.check(Descriptors::Made(Vec::new()));
        let size = std::mem::size_of_val(&*check);
        assert!(
            size + DISPATCH <= SMALL_ALLOCATION,
            "the check future takes {size} bytes"
        );
    }

    /// Regression: a request whose descriptor value was past the enforcer's
    /// cap was passed unchecked, as every refusal is, so a client keyed by
    /// a header could skip its limit by sending a long one. It is refused.
    #[tokio::test]
    async fn a_value_past_its_cap_is_refused_not_passed() {
        let policy = Policy::parse(
            "cap.yaml",
            "domain: d\nrules:\n  - name: r\n    match: [{ key: k }]\n    limit: { requests: 1, per: 1h }\n",
        )
        .expect("a valid policy");
        let limiter = Limiter::<_, MemoryStore> {
            domain: "d".to_owned(),
            enforcer: Arc::new(Enforcer::new(
                PolicyHandle::new(policy),
                MemoryStore::default(),
            )),
            precheck: None,
            sources: Vec::new(),
            style: HeaderStyle::default(),
        };
        let made = |value: &str| {
            Descriptors::Made(vec![Descriptor {
                entries: vec![tollgate_policy::Entry::new("k", value)],
                ..Descriptor::default()
            }])
        };
        let at_cap = "v".repeat(4096);
        let (first, _) = limiter.decide(&made(&at_cap)).await;
        assert!(
            matches!(first, Admission::Pass { .. }),
            "the first at the cap"
        );
        let (second, _) = limiter.decide(&made(&at_cap)).await;
        assert!(matches!(second, Admission::Deny(_)), "limited");
        let (past, _) = limiter.decide(&made(&"v".repeat(4097))).await;
        let Admission::Refuse(reason) = past else {
            panic!("a value past the cap is refused");
        };
        assert!(reason.contains("at most 4096"), "{reason}");
        let response = refusal(&reason);
        assert_eq!(response.status(), http::StatusCode::BAD_REQUEST);
        let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(body["error"], "bad_request");
    }
}
