//! The gateway's inner service: forwards a request to the upstream over a
//! pooled HTTP/1.1 connection ([`Pool`]) and streams the response back.
//!
//! - Bodies stream both ways: the request body is the client connection's
//!   body as it arrives, the response body the upstream's.
//! - Hop-by-hop headers (`Connection` and those it names, `Keep-Alive`,
//!   `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
//!   `Proxy-Authorization`, `Proxy-Authenticate`) are dropped both ways, and
//!   `Expect`, which this hop has already answered.
//! - `X-Forwarded-For` and `Forwarded` get the socket peer appended;
//!   `X-Forwarded-Proto` is set to `http` unless a trusted proxy set it.
//! - The `Host` header is passed through (as Envoy does), so the upstream
//!   sees the name the client used.
//! - The request goes out in origin form (`/path?query`), with the client's
//!   `Host`, or the upstream's when the client sent none (HTTP/1.0).
//! - The upstream unreachable or failing: `502`; no response head within
//!   [`UPSTREAM_TIMEOUT`](pool::UPSTREAM_TIMEOUT): `504`. Either way the rate limit decision was
//!   already made and counted.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{
    CONNECTION, CONTENT_TYPE, EXPECT, Entry, FORWARDED, HOST, PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use http::uri::{Authority, PathAndQuery};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use hyper::body::Incoming;
use tollgate_http::{ClientIpConfig, IpText, ResponseBody};
use tower_service::Service;

use futures_util::FutureExt;

use crate::pool::{self, Pool, PooledBody};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// How many names [`HOP_BY_HOP`] holds.
const HOPS: usize = 10;
/// Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1,
/// and the non-standard `Keep-Alive` and `Proxy-Connection`).
const HOP_BY_HOP: [HeaderName; HOPS] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    TE,
    TRAILER,
    TRANSFER_ENCODING,
    UPGRADE,
    PROXY_AUTHORIZATION,
    PROXY_AUTHENTICATE,
    EXPECT,
];

/// Where the gateway forwards to: `http://host:port` with an optional base
/// path that every request path is appended to.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct Upstream {
    authority: Authority,
    /// Empty, or a path that starts with `/` and does not end with one.
    base: String,
}

/// An upstream URL Tollgate cannot forward to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// Not a URL.
    #[error("not a URL: {0}")]
    Invalid(String),
    /// Not `http://` (the gateway speaks plain HTTP/1.1 to its upstream).
    #[error(
        "the upstream must be an http:// URL (TLS to the upstream is not supported), not {0:?}"
    )]
    Scheme(String),
    /// No host.
    #[error("the upstream URL names no host")]
    NoHost,
    /// A query, which no request path could be appended to.
    #[error("the upstream URL cannot have a query")]
    Query,
}

impl FromStr for Upstream {
    type Err = UpstreamError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let uri: Uri = s
            .parse()
            .map_err(|e: http::uri::InvalidUri| UpstreamError::Invalid(e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => return Err(UpstreamError::Scheme(other.to_owned())),
            None => return Err(UpstreamError::Scheme(String::new())),
        }
        let authority = uri.authority().cloned().ok_or(UpstreamError::NoHost)?;
        if authority.host().is_empty() {
            return Err(UpstreamError::NoHost);
        }
        if uri.query().is_some() {
            return Err(UpstreamError::Query);
        }
        Ok(Self {
            authority,
            base: uri.path().trim_end_matches('/').to_owned(),
        })
    }
}

impl TryFrom<String> for Upstream {
    type Error = UpstreamError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.base)
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Upstream({self})")
    }
}

impl Upstream {
    /// The origin-form URI (`/base/path?query`) of a request for `path`.
    fn uri(&self, path: Option<&PathAndQuery>) -> Result<Uri, http::Error> {
        let path = match (path, self.base.is_empty()) {
            (Some(path), true) => path.clone(),
            (None, true) => PathAndQuery::from_static("/"),
            (path, false) => {
                let rest = path.map_or("/", PathAndQuery::as_str);
                PathAndQuery::try_from(format!("{}{rest}", self.base))?
            }
        };
        Ok(Uri::from(path))
    }

    /// A pool of connections to this upstream.
    fn pool(&self) -> Arc<Pool> {
        let port = self.authority.port_u16().unwrap_or(80);
        Pool::new(self.authority.host(), port)
    }
}

/// The proxy service: cheap to clone (one shared pool). Make one per worker
/// thread, so that each keeps its own connections.
#[derive(Clone)]
pub(crate) struct Proxy {
    inner: Arc<Inner>,
    /// What the forwarding headers of the requests this clone is called
    /// with say about their socket peer.
    forwarding: Option<Arc<Forwarding>>,
}

/// The forwarding headers' part for one socket peer, made once per
/// connection: a request that arrives without forwarding headers of its own
/// (most do) gets these values as they are.
struct Forwarding {
    /// `X-Forwarded-For`'s: the peer.
    x_forwarded_for: HeaderValue,
    /// `Forwarded`'s: `for=<peer>;proto=http`.
    forwarded: HeaderValue,
    /// Whether the peer is a trusted proxy, whose `X-Forwarded-Proto` is kept.
    trusted: bool,
}

impl Forwarding {
    fn new(peer: IpAddr, trusted: bool) -> Self {
        let ip = IpText::new(peer);
        let ip = ip.as_str();
        let forwarded = match peer {
            IpAddr::V4(_) => format!("for={ip};proto=http"),
            IpAddr::V6(_) => format!("for=\"[{ip}]\";proto=http"),
        };
        Self {
            x_forwarded_for: HeaderValue::from_str(ip).expect("an address is a valid header value"),
            forwarded: HeaderValue::try_from(forwarded)
                .expect("an address is a valid header value"),
            trusted,
        }
    }
}

struct Inner {
    pool: Arc<Pool>,
    upstream: Upstream,
    host: HeaderValue,
    client_ip: ClientIpConfig,
}

impl Proxy {
    /// A proxy to `upstream`; `client_ip` says which peers are trusted proxies
    /// (whose `X-Forwarded-Proto` is kept).
    pub(crate) fn new(upstream: Upstream, client_ip: ClientIpConfig) -> Self {
        let host = HeaderValue::from_str(upstream.authority.as_str())
            .expect("an authority is a valid header value");
        Self {
            inner: Arc::new(Inner {
                pool: upstream.pool(),
                upstream,
                host,
                client_ip,
            }),
            forwarding: None,
        }
    }

    /// Sets the socket peer of the requests this clone is called with: the
    /// worker knows it per connection, and a field costs nothing where the
    /// request's extensions allocate a map and a box for it.
    pub(crate) fn set_peer(&mut self, peer: IpAddr) {
        let trusted = self.inner.client_ip.is_trusted(peer);
        self.forwarding = Some(Arc::new(Forwarding::new(peer, trusted)));
    }
}

/// The proxy's response body: the upstream's, or the proxy's own error JSON.
pub(crate) type ProxyBody = ResponseBody<PooledBody>;

type ProxyFuture = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

impl Service<Request<Incoming>> for Proxy {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The client queues for a pooled connection itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> ProxyFuture {
        let request = match self.inner.prepare(request, self.forwarding.as_deref()) {
            Ok(request) => request,
            Err(refused) => return Box::pin(std::future::ready(Ok(*refused))),
        };
        Box::pin(forward(Arc::clone(&self.inner.pool), request))
    }
}

/// Sends `request` on `pool` and answers with what came back in time.
///
/// Built and mapped rather than awaited in an `async` block, which would
/// keep the request beside the send future that holds it: so the boxed
/// future stays small enough for glibc's per-thread cache (tcache, up to
/// 1,032 bytes). A larger one takes malloc's slow path, a few hundred
/// instructions more per request (1,100 of the floor's 29,000).
fn forward(
    pool: Arc<Pool>,
    request: Request<Incoming>,
) -> impl Future<Output = Result<Response<ProxyBody>, Infallible>> + Send {
    pool.send(request).map(|sent| Ok(answer(sent)))
}

impl Inner {
    /// The request to send upstream, or the answer to a request that cannot
    /// be forwarded.
    fn prepare(
        &self,
        request: Request<Incoming>,
        forwarding: Option<&Forwarding>,
    ) -> Result<Request<Incoming>, Box<Response<ProxyBody>>> {
        if request.method() == Method::CONNECT {
            return Err(error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "the gateway does not tunnel CONNECT",
            )
            .into());
        }
        let (mut parts, body) = request.into_parts();
        parts.uri = self.upstream.uri(parts.uri.path_and_query()).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("the request path cannot be forwarded: {e}"),
            )
        })?;
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        if !parts.headers.contains_key(HOST) {
            parts.headers.insert(HOST, self.host.clone());
        }
        if let Some(forwarding) = forwarding {
            add_forwarded(&mut parts.headers, forwarding);
        }
        Ok(Request::from_parts(parts, body))
    }
}

/// The client's answer from what the upstream sent.
fn answer(sent: Result<Response<PooledBody>, pool::UpstreamError>) -> Response<ProxyBody> {
    match sent {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            // This hop speaks HTTP/1.1 to its client, whatever the upstream spoke.
            parts.version = Version::HTTP_11;
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, ResponseBody::inner(body))
        }
        Err(e @ pool::UpstreamError::Timeout) => error(
            StatusCode::GATEWAY_TIMEOUT,
            "gateway_timeout",
            &e.to_string(),
        ),
        Err(e) => {
            // Warned, not debugged: a refused or exhausted upstream
            // connection (EMFILE) is what an operator must see.
            tracing::warn!(error = %chain(&e), "upstream request failed");
            error(StatusCode::BAD_GATEWAY, "bad_gateway", &chain(&e))
        }
    }
}

/// Drops hop-by-hop headers: the fixed set and whatever `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the message's few names finds which of the set it
    // carries (most carry none, or only `Connection`): cheaper than hashing
    // every name of the set to remove it.
    let mut present = [false; HOPS];
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            present[i] = true;
        }
    }
    // `Connection` (the first of the set) usually says only `keep-alive` or
    // `close`: told apart before any list is parsed (the iterator chain
    // below costs about 400 instructions even when it yields nothing).
    let lists = present[0]
        && headers
            .get_all(CONNECTION)
            .iter()
            .any(|value| !names_no_header(value.as_bytes()));
    let named: Vec<HeaderName> = if lists {
        headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .filter(|option| !names_no_header(option.as_bytes()))
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .collect()
    } else {
        Vec::new()
    };
    for name in &named {
        headers.remove(name);
    }
    for (name, _) in HOP_BY_HOP
        .iter()
        .zip(present)
        .filter(|(_, present)| *present)
    {
        headers.remove(name);
    }
}

/// Whether a `Connection` option is one that names no header.
fn names_no_header(option: &[u8]) -> bool {
    option.eq_ignore_ascii_case(b"keep-alive") || option.eq_ignore_ascii_case(b"close")
}

/// Appends the peer to `X-Forwarded-For` and `Forwarded` (as one line each,
/// so that readers of only the first line see the whole chain), and sets
/// `X-Forwarded-Proto: http` unless a trusted proxy already set it.
fn add_forwarded(headers: &mut HeaderMap, forwarding: &Forwarding) {
    append(headers, X_FORWARDED_FOR, &forwarding.x_forwarded_for);
    append(headers, FORWARDED, &forwarding.forwarded);
    if !forwarding.trusted || !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
}

/// Sets `name` to its lines so far, each followed by `, `, then `value`.
/// A line that is not visible ASCII is dropped rather than forwarded.
fn append(headers: &mut HeaderMap, name: HeaderName, value: &HeaderValue) {
    match headers.entry(name) {
        Entry::Vacant(entry) => {
            entry.insert(value.clone());
        }
        Entry::Occupied(mut entry) => {
            let mut text = BytesMut::new();
            for line in entry.iter().filter_map(|line| line.to_str().ok()) {
                text.extend_from_slice(line.as_bytes());
                text.extend_from_slice(b", ");
            }
            text.extend_from_slice(value.as_bytes());
            if let Ok(joined) = HeaderValue::from_maybe_shared(text.freeze()) {
                entry.insert(joined);
            }
        }
    }
}

/// An error's message with its sources', innermost last.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// The proxy's own answer: `status` with `{"error": code, "message": message}`.
fn error(status: StatusCode, code: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({ "error": code, "message": message });
    let mut response = Response::new(ResponseBody::full(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_are_checked() {
        let plain: Upstream = "http://127.0.0.1:9000".parse().unwrap();
        assert_eq!(plain.to_string(), "http://127.0.0.1:9000");
        let pq = PathAndQuery::from_static("/a/b?c=1");
        assert_eq!(plain.uri(Some(&pq)).unwrap().to_string(), "/a/b?c=1");
        let based: Upstream = "http://backend:80/api/".parse().unwrap();
        assert_eq!(based.to_string(), "http://backend:80/api");
        assert_eq!(based.uri(Some(&pq)).unwrap().to_string(), "/api/a/b?c=1");
        assert_eq!(
            "https://h".parse::<Upstream>(),
            Err(UpstreamError::Scheme("https".into()))
        );
        assert_eq!(
            "h:80".parse::<Upstream>(),
            Err(UpstreamError::Scheme(String::new()))
        );
        assert_eq!("http://h/?q".parse::<Upstream>(), Err(UpstreamError::Query));
        assert!(matches!(
            "http://".parse::<Upstream>(),
            Err(UpstreamError::Invalid(_) | UpstreamError::NoHost)
        ));
    }

    #[test]
    fn a_forwarded_request_is_a_small_allocation() {
        /// The largest allocation glibc serves from its per-thread cache.
        const SMALL_ALLOCATION: usize = 1032;
        fn boxed_size<F: Future>(_: &impl Fn(Request<Incoming>) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let pool = Pool::new("127.0.0.1", 9);
        let size = boxed_size(&|request| forward(Arc::clone(&pool), request));
        assert!(
            size <= SMALL_ALLOCATION,
            "the forwarding future takes {size} bytes"
        );
    }

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "trailers"),
            ("content-length", "3"),
            ("x-kept", "yes"),
        ] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "x-kept"]);

        // `keep-alive` and `close` name no header, in any case.
        for connection in ["Keep-Alive", "close"] {
            let mut headers = HeaderMap::new();
            headers.insert(CONNECTION, HeaderValue::from_static(connection));
            headers.insert(
                HeaderName::from_static("x-kept"),
                HeaderValue::from_static("yes"),
            );
            strip_hop_by_hop(&mut headers);
            let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
            assert_eq!(left, ["x-kept"], "Connection: {connection}");
        }
    }

    #[test]
    fn forwarding_headers_get_the_peer_appended() {
        let mut headers = HeaderMap::new();
        headers.append(X_FORWARDED_FOR, HeaderValue::from_static("1.1.1.1"));
        headers.append(X_FORWARDED_FOR, HeaderValue::from_static("2.2.2.2"));
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        add_forwarded(
            &mut headers,
            &Forwarding::new("10.0.0.9".parse().unwrap(), false),
        );
        assert_eq!(headers[X_FORWARDED_FOR], "1.1.1.1, 2.2.2.2, 10.0.0.9");
        assert_eq!(headers[FORWARDED], "for=10.0.0.9;proto=http");
        assert_eq!(
            headers[X_FORWARDED_PROTO], "http",
            "an untrusted peer cannot claim https"
        );

        let mut headers = HeaderMap::new();
        headers.insert(FORWARDED, HeaderValue::from_static("for=192.0.2.1"));
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        add_forwarded(
            &mut headers,
            &Forwarding::new("2001:db8::1".parse().unwrap(), true),
        );
        assert_eq!(headers[X_FORWARDED_FOR], "2001:db8::1");
        assert_eq!(
            headers[FORWARDED],
            "for=192.0.2.1, for=\"[2001:db8::1]\";proto=http"
        );
        assert_eq!(headers[X_FORWARDED_PROTO], "https");
    }
}
