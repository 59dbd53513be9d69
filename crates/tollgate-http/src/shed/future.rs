//! [`ResponseFuture`], what [`Shed`](super::Shed) returns.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

use super::InFlight;
use crate::ResponseBody;

pin_project! {
    /// The inner service's response, or the shedder's 503.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called {
            #[pin]
            future: F,
            in_flight: Option<InFlight>,
        },
        Shed {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(future: F, in_flight: InFlight) -> Self {
        Self {
            state: State::Called {
                future,
                in_flight: Some(in_flight),
            },
        }
    }

    pub(crate) fn shed(response: Response<Bytes>) -> Self {
        Self {
            state: State::Shed {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future, in_flight } => {
                let result = ready!(future.poll(cx));
                // Answered or failed, the request is no longer in flight and
                // its time is a sample: a failing service is a slow one too.
                if let Some(in_flight) = in_flight.take() {
                    in_flight.complete();
                }
                Poll::Ready(result.map(|response| response.map(ResponseBody::inner)))
            }
            StateProj::Shed { response } => {
                let response = response.take().expect("polled after it completed");
                Poll::Ready(Ok(response.map(ResponseBody::full)))
            }
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
