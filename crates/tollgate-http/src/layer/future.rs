//! [`ResponseFuture`], what [`RateLimit`](super::RateLimit) returns.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::check::{Admission, BoxFuture, Checked, Denied, Permits, Reported, refusal};
use super::denial::Answer;

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
        // The service and request are boxed, for this state is rare (a
        // store that waits, a request shaping holds) and the others small:
        // a future of their size is copied a few times a request.
        Checking {
            check: BoxFuture<Admission>,
            held: Option<Box<(S, Request<B>)>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            reported: Option<Reported>,
            permits: Option<Permits>,
        },
        Answered {
            denied: Option<(Denied, Answer)>,
        },
        Refused {
            reason: Option<String>,
        },
        Done,
    }
}

impl<S: Service<Request<B>>, B> State<S, B> {
    /// What follows `verdict` on `request`: the inner service's call, or
    /// the layer's own answer.
    fn after(verdict: Admission, mut service: S, request: Request<B>) -> Self {
        match verdict {
            Admission::Pass { reported, permits } => State::Calling {
                future: service.call(request),
                reported,
                permits: Some(permits),
            },
            Admission::Deny(denied) => State::Answered {
                denied: Some((denied, Answer::of(request.headers()))),
            },
            Admission::Refuse(reason) => State::Refused {
                reason: Some(reason),
            },
        }
    }
}

impl<S: Service<Request<B>>, B> ResponseFuture<S, B> {
    /// A request being checked, or checked already, to be sent to `service`
    /// if it passes.
    pub(crate) fn checked(checked: Checked, service: S, request: Request<B>) -> Self {
        let state = match checked {
            Checked::Now(verdict) => State::after(verdict, service, request),
            Checked::Later(check) => State::Checking {
                check,
                held: Some(Box::new((service, request))),
            },
        };
        Self { state }
    }

    /// A request no limit applies to: straight to the inner service.
    pub(crate) fn unlimited(future: S::Future) -> Self {
        Self {
            state: State::Calling {
                future,
                reported: None,
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
                StateProj::Checking { check, held } => {
                    let verdict = ready!(check.as_mut().poll(cx));
                    let (service, request) = *held.take().expect("the request is sent once");
                    this.state.set(State::after(verdict, service, request));
                }
                StateProj::Calling {
                    future,
                    reported,
                    permits,
                } => {
                    let result = ready!(future.poll(cx));
                    let reported = reported.take();
                    // The response is ready: the request no longer holds its
                    // concurrency permits. (Dropping the future before this
                    // point releases them too.)
                    drop(permits.take());
                    this.state.set(State::Done);
                    return Poll::Ready(result.map(|mut response| {
                        if let Some(reported) = reported {
                            reported.set_on(response.headers_mut());
                        }
                        response.map(ResponseBody::inner)
                    }));
                }
                StateProj::Answered { denied } => {
                    let (denied, answer) = denied.take().expect("the answer is given once");
                    let response = denied.response(answer);
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                }
                StateProj::Refused { reason } => {
                    let reason = reason.take().expect("the answer is given once");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(refusal(&reason).map(ResponseBody::full)));
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
