//! [`RateLimit`], the service.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::check::{Checked, Descriptors, DynLimiter, PeerCheck};
use super::descriptors::peer_addr;
use super::future::ResponseFuture;

/// Rate limits the requests to an inner service.
///
/// For each request it makes the descriptors, runs the optional local
/// pre-check, then asks the enforcer ([`tollgate_policy::Enforcer`], the one
/// evaluator every Tollgate door shares), which checks every enforcing limit in
/// one store call (all-or-nothing) and shadow limits in a second call that
/// never denies. A denied request is answered here: `429 Too Many Requests`
/// with a JSON body (`{"error": "rate_limit_exceeded", "message": …,
/// "retry_after": seconds}`; RFC 9457 problem details of type
/// `quota-exceeded` to a client whose `Accept` asks for
/// `application/problem+json`, see [`crate::problem`]), or
/// `RESOURCE_EXHAUSTED` to a gRPC client. Every
/// response, allowed or denied, carries the rate limit headers. Concurrency
/// permits are a value the verdict carries, given back when the inner
/// service's response is ready, or when the request is abandoned.
///
/// On stores that decide at once ([`tollgate_core::Store::decides_at_once`]:
/// the memory store) the check runs within [`Service::call`], and the
/// returned future only forwards or answers, so a request is counted once
/// it is called; on others the check runs when the future is first polled.
///
/// When the store fails, the rules' failure policies decide: `fail_closed`
/// denies like an exceeded limit (429, as through every door); `fail_open`
/// lets the request through, and so does `local` for a store with no local
/// fallback of its own.
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<dyn DynLimiter>,
    peer: Option<IpAddr>,
    /// The check of every request from `peer` that names no peer itself,
    /// when the sources make its descriptors from the peer alone.
    peer_check: Option<Arc<PeerCheck>>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, limiter: Arc<dyn DynLimiter>) -> Self {
        Self {
            inner,
            limiter,
            peer: None,
            peer_check: None,
        }
    }

    /// Tells the service the socket peer of the connection it answers, for
    /// the sources that key on it ([`ClientIpKey`](crate::ClientIpKey))
    /// when a request's extensions name no peer: a server that makes (or
    /// clones) a service per connection, as Tollgate's gateway does, says it
    /// once here rather than putting the address in every request's
    /// extensions (a map and a box of its own, allocated per request).
    /// Clones keep it. When every source makes its descriptor from the peer
    /// alone ([`DescriptorSource::descriptor_of_peer`]), the descriptors are
    /// made and resolved against the policy here, once, for every request
    /// that names no peer itself (a request after a policy reload is
    /// resolved again, against the policy in force).
    ///
    /// [`DescriptorSource::descriptor_of_peer`]: crate::DescriptorSource::descriptor_of_peer
    pub fn set_peer(&mut self, peer: IpAddr) {
        self.peer = Some(peer);
        self.peer_check = self.limiter.peer_check(peer);
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for RateLimit<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
            peer: self.peer,
            peer_check: self.peer_check.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was made ready goes with this request; a clone
        // takes its place for the next `poll_ready`.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        self.checked(inner, request)
    }
}

impl<S> RateLimit<S> {
    /// [`Service::call`] through a shared reference, for a server that
    /// hands every request of a connection the same service (an `Fn`
    /// handler, like hyper's `service_fn`): it calls a clone of the inner
    /// service rather than a clone of this whole one. Only for an inner
    /// service that is always ready, as it is not polled ready first.
    pub fn call_ready<ReqBody, ResBody>(
        &self,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    {
        self.checked(self.inner.clone(), request)
    }

    /// `request` checked, then (if it passes) sent to `inner`.
    fn checked<ReqBody>(
        &self,
        mut inner: S,
        mut request: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        let descriptors = match &self.peer_check {
            Some(peer) if peer_addr(request.extensions()).is_none() => {
                Descriptors::Peer(Arc::clone(peer))
            }
            _ => {
                let (parts, body) = request.into_parts();
                let made = self.limiter.descriptors(&parts, self.peer);
                request = Request::from_parts(parts, body);
                Descriptors::Made(made)
            }
        };
        if descriptors.is_empty() {
            return ResponseFuture::unlimited(inner.call(request));
        }
        let checked = match self.limiter.check_now(&descriptors) {
            Some(checked) => checked,
            None => Checked::Later(Arc::clone(&self.limiter).check(descriptors)),
        };
        ResponseFuture::checked(checked, inner, request)
    }
}
