//! [`Shed`], the service.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::{Shedder, Tier};
use crate::ResponseBody;

/// Sheds requests by priority tier before they reach an inner service, as
/// the service fills.
///
/// A request's tier is the [`Tier`] in its extensions, else the one its
/// priority header names (`x-priority: critical | high | low`; anything else
/// is low). It is let through while the requests in flight, over the
/// [`Shedder`]'s learned limit, are under its tier's threshold; otherwise it
/// is answered here with `503 Service Unavailable`, `Retry-After` and a JSON
/// body (`{"error": "overloaded", …}`) and never reaches the inner service.
/// The time from the call to the inner service's response is a latency
/// sample that moves the limit.
#[derive(Debug, Clone)]
pub struct Shed<S> {
    inner: S,
    shedder: Arc<Shedder>,
}

impl<S> Shed<S> {
    /// `inner`, shed by `shedder` (shared with every other service it
    /// protects: they share the learned limit).
    pub fn new(inner: S, shedder: Arc<Shedder>) -> Self {
        Self { inner, shedder }
    }

    /// The shedder.
    pub fn shedder(&self) -> &Arc<Shedder> {
        &self.shedder
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Shed<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let tier = match request.extensions().get::<Tier>() {
            Some(tier) => *tier,
            None => self.shedder.tier_of(request.headers()),
        };
        match self.shedder.admit(tier) {
            Ok(in_flight) => ResponseFuture::called(self.inner.call(request), in_flight),
            Err(_) => ResponseFuture::shed(self.shedder.response()),
        }
    }
}
