//! The body of a response that went through the layer.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The inner service's body, or the layer's own (a 429's JSON).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// Whether this is the inner service's body: for a response from a
    /// [`RateLimit`](crate::RateLimit), whether the request went through to
    /// the inner service rather than being answered by the layer (a 429, or a
    /// 503 when the store failed closed).
    pub fn is_inner(&self) -> bool {
        matches!(self.kind, Kind::Inner { .. })
    }

    /// The inner service's body, when it is that.
    pub fn get_ref(&self) -> Option<&B> {
        match &self.kind {
            Kind::Inner { body } => Some(body),
            Kind::Full { .. } => None,
        }
    }

    /// A complete body of `data`.
    pub fn full(data: Bytes) -> Self {
        let data = (!data.is_empty()).then_some(data);
        Self {
            kind: Kind::Full { data },
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f
                .debug_tuple("ResponseBody::Full")
                .field(&data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_the_inner_body_from_the_layers_own() {
        let own: ResponseBody<ResponseBody<()>> = ResponseBody::full(Bytes::from_static(b"{}"));
        assert!(!own.is_inner());
        assert!(ResponseBody::inner(ResponseBody::<()>::full(Bytes::new())).is_inner());
    }
}
