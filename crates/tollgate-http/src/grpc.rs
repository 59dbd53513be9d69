//! The gRPC side of an answer made in place of the inner service: whether a
//! client speaks gRPC, and a trailers-only response with its status, so a
//! gRPC client reads a status rather than an HTTP body it cannot parse.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Response};

/// gRPC's `RESOURCE_EXHAUSTED`: a limit of the client's own.
pub(crate) const RESOURCE_EXHAUSTED: u16 = 8;
/// gRPC's `UNAVAILABLE`: the service cannot take the call now, and a retry
/// (after a pause) may succeed: a shed call, as an HTTP client gets `503`.
pub(crate) const UNAVAILABLE: u16 = 14;

/// Whether `headers` are a gRPC request's (`application/grpc`,
/// `application/grpc+proto`, …).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// A gRPC trailers-only response: HTTP 200, `headers` and the status in
/// the headers, no body.
pub(crate) fn trailers_only(headers: HeaderMap, code: u16, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    *response.headers_mut() = headers;
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from(code),
    );
    // Printable ASCII without `%` needs no percent-encoding.
    if let Ok(message) = HeaderValue::from_str(message) {
        h.insert(HeaderName::from_static("grpc-message"), message);
    }
    response
}
