//! [`ResponseFuture`], what [`RateLimit`](super::RateLimit) returns.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::ResponseBody;
use super::check::{Answer, BoxFuture, Permits, Verdict};
use crate::headers::HeaderList;

pin_project! {
    /// The response of a rate limited service: the check, then (if it passes)
    /// the inner service's response with the rate limit headers added.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Checking {
            check: BoxFuture<Verdict>,
            service: Option<S>,
            request: Option<Request<B>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            headers: HeaderList,
            permits: Option<Permits>,
        },
        Done,
    }
}

impl<S: Service<Request<B>>, B> ResponseFuture<S, B> {
    pub(crate) fn checking(check: BoxFuture<Verdict>, service: S, request: Request<B>) -> Self {
        Self {
            state: State::Checking {
                check,
                service: Some(service),
                request: Some(request),
            },
        }
    }

    /// A request no limit applies to: straight to the inner service.
    pub(crate) fn unlimited(future: S::Future) -> Self {
        Self {
            state: State::Calling {
                future,
                headers: HeaderList::default(),
                permits: None,
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    service,
                    request,
                } => match ready!(check.as_mut().poll(cx)) {
                    Verdict::Pass { headers, permits } => {
                        let mut service = service.take().expect("the service is called once");
                        let request = request.take().expect("the request is sent once");
                        let future = service.call(request);
                        this.state.set(State::Calling {
                            future,
                            headers,
                            permits: Some(permits),
                        });
                    }
                    Verdict::Deny(denied) => {
                        let request = request.take().expect("the request is answered once");
                        let response = denied.response(Answer::of(request.headers()));
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(response.map(ResponseBody::full)));
                    }
                },
                StateProj::Calling {
                    future,
                    headers,
                    permits,
                } => {
                    let result = ready!(future.poll(cx));
                    let headers = std::mem::take(headers);
                    // The response is ready: the request no longer holds its
                    // concurrency permits. (Dropping the future before this
                    // point releases them too.)
                    drop(permits.take());
                    this.state.set(State::Done);
                    return Poll::Ready(result.map(|mut response| {
                        headers.set_on(response.headers_mut());
                        response.map(ResponseBody::inner)
                    }));
                }
                StateProj::Done => panic!("ResponseFuture polled after it completed"),
            }
        }
    }
}

impl<S: Service<Request<B>>, B> std::fmt::Debug for ResponseFuture<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
