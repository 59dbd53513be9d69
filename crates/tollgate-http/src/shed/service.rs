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
/// body (`{"error": "overloaded", …}`), or a gRPC call with `UNAVAILABLE`,
/// and never reaches the inner service.
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
            Err(_) => ResponseFuture::shed(self.shedder.response(request.headers())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::StatusCode;
    use http::header::RETRY_AFTER;
    use tokio::sync::Notify;
    use tower::ServiceExt;
    use tower_layer::Layer;

    use super::*;
    use crate::{ShedConfig, ShedLayer};

    #[tokio::test]
    async fn a_shed_request_never_reaches_the_inner_service() {
        // Probing, the limit is the floor: 2 (a critical request may fill
        // both slots, a low one only half of them).
        let mut config = ShedConfig::default();
        config.limit.floor = 2;
        let shedder = Arc::new(Shedder::new(config).unwrap());
        let calls = Arc::new(AtomicUsize::new(0));
        let answer = Arc::new(Notify::new());
        let inner = {
            let (calls, answer) = (Arc::clone(&calls), Arc::clone(&answer));
            tower::service_fn(move |_: Request<()>| {
                let (calls, answer) = (Arc::clone(&calls), Arc::clone(&answer));
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    answer.notified().await;
                    Ok::<_, Infallible>(Response::new("ok"))
                }
            })
        };
        let service = ShedLayer::new(Arc::clone(&shedder)).layer(inner);
        let request = |tier: &'static str| {
            Request::builder()
                .header("x-priority", tier)
                .body(())
                .unwrap()
        };

        let low = tokio::spawn(service.clone().oneshot(request("low")));
        let critical = tokio::spawn(service.clone().oneshot(request("critical")));
        while calls.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        for tier in ["critical", "low", "anything"] {
            let shed = service.clone().oneshot(request(tier)).await.unwrap();
            assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE, "{tier}");
            assert_eq!(shed.headers()[RETRY_AFTER], "1");
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "no shed request was called"
        );
        assert_eq!(shedder.snapshot().in_flight, 2);

        answer.notify_waiters();
        for admitted in [low, critical] {
            let response = admitted.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            assert!(response.body().is_inner());
        }
        assert_eq!(shedder.snapshot().in_flight, 0);

        // A tier in the extensions outranks the header.
        let low = tokio::spawn(service.clone().oneshot(request("low")));
        let mut raised = request("low");
        raised.extensions_mut().insert(Tier::Critical);
        let raised = tokio::spawn(service.clone().oneshot(raised));
        while calls.load(Ordering::SeqCst) < 4 {
            tokio::task::yield_now().await;
        }
        answer.notify_waiters();
        for admitted in [low, raised] {
            assert_eq!(admitted.await.unwrap().unwrap().status(), StatusCode::OK);
        }
    }
}
