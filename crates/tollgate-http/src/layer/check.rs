//! The check every request goes through: descriptors, the optional local
//! pre-check, the enforcer, headers. Deciding is the enforcer's
//! ([`tollgate_policy::Enforcer`], the one every Tollgate door calls); this
//! module only turns its verdict into a pass with headers or an answer.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use tollgate_core::Store;
use tollgate_policy::{Check as PolicyCheck, Descriptor, Enforcer, Permit, Request};

use super::denial;
use crate::headers::{HeaderList, reports};
use crate::problem::Format;
use crate::{DescriptorSource, HeaderStyle};

/// A future the layer boxes: the check, a permit release.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The limiter behind a layer, with its store types erased so that the
/// layer's types name only the inner service.
pub(crate) trait Check: Send + Sync + 'static {
    /// The descriptors the configured sources make of `request`, from the
    /// socket peer `peer` when the service was told it.
    fn descriptors(&self, request: &Parts, peer: Option<IpAddr>) -> Vec<Descriptor>;

    /// Decides a request with these descriptors; a deny is answered as
    /// `answer` says.
    fn check(self: Arc<Self>, descriptors: Vec<Descriptor>, answer: Answer) -> BoxFuture<Verdict>;
}

/// How a denied request is answered, from what the request says of its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A gRPC client: `RESOURCE_EXHAUSTED` in a trailers-only response.
    Grpc,
    /// An HTTP client: 429 with a body in this format.
    Http(Format),
}

/// What the check decided.
pub(crate) enum Verdict {
    /// Forward the request; add `headers` to the response; drop `permits`
    /// when the response is ready (or the request is abandoned).
    Pass {
        headers: HeaderList,
        permits: Permits,
    },
    /// Answer with this response instead.
    Deny(Response<Bytes>),
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

impl<St: Store + 'static, L: Store + 'static> Check for Limiter<St, L> {
    fn descriptors(&self, request: &Parts, peer: Option<IpAddr>) -> Vec<Descriptor> {
        // A descriptor with no entries (a custom source's) limits nothing.
        self.sources
            .iter()
            .filter_map(|source| source.descriptor_from(request, peer))
            .filter(|descriptor| !descriptor.entries.is_empty())
            .collect()
    }

    fn check(self: Arc<Self>, descriptors: Vec<Descriptor>, answer: Answer) -> BoxFuture<Verdict> {
        Box::pin(async move { self.run(&descriptors, answer).await })
    }
}

impl<St: Store + 'static, L: Store + 'static> Limiter<St, L> {
    async fn run(&self, descriptors: &[Descriptor], answer: Answer) -> Verdict {
        let mut permits = Permits::default();
        if descriptors.is_empty() {
            return pass(permits);
        }
        let request = PolicyCheck::Policy(Request {
            domain: &self.domain,
            descriptors,
            hits_addend: 1,
        });

        // The local pre-check: obviously-over-limit traffic stops here. A
        // request the policy cannot take (e.g. more descriptors than the
        // enforcer takes, which only many custom sources can make) is not
        // limited.
        let mut prechecked = None;
        if let Some(precheck) = &self.precheck
            && let Ok(mut verdict) = precheck.enforce(request).await
        {
            if !verdict.allowed() {
                return Verdict::Deny(self.too_many(&verdict, answer));
            }
            permits.add(release(precheck, std::mem::take(&mut verdict.permit)));
            prechecked = Some(verdict);
        }

        let Ok(mut verdict) = self.enforcer.enforce(request).await else {
            return pass(permits);
        };
        if !verdict.allowed() {
            // Dropping `permits` gives back what the pre-check took.
            return Verdict::Deny(self.too_many(&verdict, answer));
        }
        permits.add(release(&self.enforcer, std::mem::take(&mut verdict.permit)));

        // Headers describe the store of record's limits, or the pre-check's
        // when no limit of record applied.
        let mut reported = reports(&verdict);
        let mut now = verdict.started_at;
        if reported.is_empty()
            && let Some(prechecked) = &prechecked
        {
            reported = reports(prechecked);
            now = prechecked.started_at;
        }
        let mut headers = HeaderList::default();
        self.style.write_into(&reported, now, &mut headers);
        // A shaping rule admits with a delay: hold the request that long.
        let delay = verdict.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Verdict::Pass { headers, permits }
    }

    /// The answer to a denied request ([`denial::too_many`]).
    fn too_many(&self, verdict: &tollgate_policy::Verdict, answer: Answer) -> Response<Bytes> {
        denial::too_many(self.style, answer, &reports(verdict), verdict.started_at)
    }
}

/// A pass with no headers.
fn pass(permits: Permits) -> Verdict {
    Verdict::Pass {
        headers: HeaderList::default(),
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
