//! Where a request's descriptors come from: the layer's key extractors.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::Extensions;
use http::request::Parts;
use tollgate_policy::{Descriptor, Entry};

use super::fields::{HeaderMatcher, RequestField};
use crate::ClientIpConfig;

/// Makes one descriptor (one rate limit layer) from a request's head.
///
/// Each source added to a [`RateLimitLayer`](crate::RateLimitLayer) gives at
/// most one descriptor; the policy matches each against its rules, and the
/// request must pass every limit that applies. Returning `None` leaves the
/// layer out for this request (as Envoy does when an action cannot produce its
/// entry, e.g. a missing header).
///
/// Closures `Fn(&Parts) -> Option<Descriptor>` are sources too.
pub trait DescriptorSource: Send + Sync + 'static {
    /// The descriptor for `request`, or `None` when this source does not apply.
    fn descriptor(&self, request: &Parts) -> Option<Descriptor>;

    /// The descriptor for `request`, which came over a connection from the
    /// socket peer `peer` when the server told the service
    /// ([`RateLimit::set_peer`](crate::RateLimit::set_peer)). Sources that
    /// read the peer address ([`ClientIpKey`], and [`Composite`] for its
    /// parts) take it from here when the request's extensions name none;
    /// the others make what [`DescriptorSource::descriptor`] makes.
    fn descriptor_from(&self, request: &Parts, peer: Option<IpAddr>) -> Option<Descriptor> {
        let _ = peer;
        self.descriptor(request)
    }

    /// What [`DescriptorSource::descriptor_from`] gives every request that
    /// came over a connection from `peer` and names no peer in its
    /// extensions, when that depends on nothing else: `Some` of it, made
    /// once per connection ([`RateLimit::set_peer`](crate::RateLimit::set_peer))
    /// rather than per request. `None` (the default): it depends on the
    /// request. [`ClientIpKey`] for a peer that is not a trusted proxy,
    /// [`FixedKey`], and a [`Composite`] of such parts give one.
    fn descriptor_of_peer(&self, peer: IpAddr) -> Option<Option<Descriptor>> {
        let _ = peer;
        None
    }
}

impl<F> DescriptorSource for F
where
    F: Fn(&Parts) -> Option<Descriptor> + Send + Sync + 'static,
{
    fn descriptor(&self, request: &Parts) -> Option<Descriptor> {
        self(request)
    }
}

fn single(key: &str, value: impl Into<String>) -> Descriptor {
    Descriptor {
        entries: vec![Entry::new(key, value)],
        ..Descriptor::default()
    }
}

/// The socket peer's address, from the request extensions: axum's
/// `ConnectInfo<SocketAddr>` (with the `axum` feature), or a plain
/// `SocketAddr` or `IpAddr` that the server put there.
pub(crate) fn peer_addr(extensions: &Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    extensions
        .get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| extensions.get::<IpAddr>().copied())
}

/// The client address (IPv6 folded to its network) as `remote_address`,
/// Envoy's name for it; see [`ClientIpConfig`] for the trusted-proxy rules.
///
/// The peer comes from the request extensions: axum's
/// `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), or a `SocketAddr`
/// or `IpAddr` the server inserted (tonic keeps the peer in its own
/// `TcpConnectInfo`: copy its `remote_addr()` in a `map_request`); else from
/// the service, when the server that made it for a connection told it its
/// peer ([`RateLimit::set_peer`](crate::RateLimit::set_peer)). A request with no peer
/// address is keyed `unknown`, so all of them share one budget: a wiring
/// mistake shows as 429s, not as a silently unlimited service.
#[derive(Debug, Clone)]
pub struct ClientIpKey {
    config: ClientIpConfig,
    key: String,
}

impl Default for ClientIpKey {
    fn default() -> Self {
        Self::new(ClientIpConfig::default())
    }
}

impl ClientIpKey {
    /// The client address under `config`, as `remote_address`.
    pub fn new(config: ClientIpConfig) -> Self {
        Self {
            config,
            key: "remote_address".into(),
        }
    }

    /// Names the descriptor entry `key` instead of `remote_address`.
    pub fn descriptor_key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }
}

impl DescriptorSource for ClientIpKey {
    fn descriptor(&self, request: &Parts) -> Option<Descriptor> {
        self.descriptor_from(request, None)
    }

    fn descriptor_from(&self, request: &Parts, peer: Option<IpAddr>) -> Option<Descriptor> {
        let value = match peer_addr(&request.extensions).or(peer) {
            Some(peer) => self.config.client_key(peer, &request.headers),
            None => "unknown".into(),
        };
        Some(single(&self.key, value))
    }

    fn descriptor_of_peer(&self, peer: IpAddr) -> Option<Option<Descriptor>> {
        // A trusted proxy's requests are keyed by the client they name; any
        // other peer's by itself, whatever its headers say.
        (!self.config.is_trusted(peer)).then(|| {
            let value = self.config.client_key(peer, &http::HeaderMap::new());
            Some(single(&self.key, value))
        })
    }
}

/// A request header's value (an API key, an authenticated user id set by an
/// auth layer in front) as the descriptor entry `descriptor_key`, Envoy's
/// `request_headers` action; no descriptor when the header is missing or not
/// visible ASCII. Pseudo-headers (`:method`, `:path`, …) are read too: see
/// [`RequestField`].
#[derive(Debug, Clone)]
pub struct HeaderKey {
    field: RequestField,
    key: String,
}

impl HeaderKey {
    /// The value of `header` as the entry `descriptor_key`.
    pub fn new(header: impl Into<RequestField>, descriptor_key: impl Into<String>) -> Self {
        Self {
            field: header.into(),
            key: descriptor_key.into(),
        }
    }
}

impl DescriptorSource for HeaderKey {
    fn descriptor(&self, request: &Parts) -> Option<Descriptor> {
        let value = self.field.value(request)?;
        Some(single(&self.key, value))
    }
}

/// A fixed entry when the request passes tests on its headers, Envoy's
/// `header_value_match` action: `header_match=<descriptor_value>` when every
/// [`HeaderMatcher`] matches (or, with `expect_match(false)`, when not all
/// do); no descriptor otherwise.
#[derive(Debug, Clone)]
pub struct HeaderMatch {
    key: String,
    value: String,
    headers: Vec<HeaderMatcher>,
    expect_match: bool,
}

impl HeaderMatch {
    /// The entry `header_match=<descriptor_value>`, given when the tests
    /// added with [`HeaderMatch::header`] all pass.
    pub fn new(descriptor_value: impl Into<String>) -> Self {
        Self {
            key: "header_match".into(),
            value: descriptor_value.into(),
            headers: Vec::new(),
            expect_match: true,
        }
    }

    /// Names the descriptor entry `key` instead of `header_match`.
    pub fn descriptor_key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// Adds a test; the request must pass all of them.
    pub fn header(mut self, matcher: HeaderMatcher) -> Self {
        self.headers.push(matcher);
        self
    }

    /// With `false`, the entry is given when the tests do *not* all pass.
    pub fn expect_match(mut self, expect: bool) -> Self {
        self.expect_match = expect;
        self
    }
}

impl DescriptorSource for HeaderMatch {
    fn descriptor(&self, request: &Parts) -> Option<Descriptor> {
        let matched = self.headers.iter().all(|h| h.matches(request));
        (matched == self.expect_match).then(|| single(&self.key, self.value.as_str()))
    }
}

/// A route template a router (or a layer in front) put in the request
/// extensions, for [`RouteKey`] when axum's `MatchedPath` is not there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTemplate(pub Cow<'static, str>);

/// The method and the route as `route`, e.g. `GET /users/{id}`: the shape the
/// native config's shared buckets match (`examples/shared-bucket.yaml`).
///
/// The template is axum's `MatchedPath` (there when the layer is added to a
/// `Router` after its routes), else a [`RouteTemplate`] extension, else the
/// raw path, which gives every distinct path its own budget. Use
/// [`RouteKey::templates_only`] to skip requests with no template instead.
#[derive(Debug, Clone)]
pub struct RouteKey {
    key: String,
    raw_paths: bool,
    method: bool,
}

impl Default for RouteKey {
    fn default() -> Self {
        Self::new()
    }
}

impl RouteKey {
    /// Method and template as `route`, falling back to the raw path.
    pub fn new() -> Self {
        Self {
            key: "route".into(),
            raw_paths: true,
            method: true,
        }
    }

    /// The template alone, without the method, as `path` (e.g.
    /// `/users/{id}`), falling back to the raw path (without the query).
    pub fn path() -> Self {
        Self {
            key: "path".into(),
            raw_paths: true,
            method: false,
        }
    }

    /// No descriptor for requests whose route template is unknown.
    pub fn templates_only(mut self) -> Self {
        self.raw_paths = false;
        self
    }

    /// Names the descriptor entry `key` instead of `route`.
    pub fn descriptor_key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }
}

fn template(request: &Parts) -> Option<&str> {
    #[cfg(feature = "axum")]
    if let Some(matched) = request.extensions.get::<axum::extract::MatchedPath>() {
        return Some(matched.as_str());
    }
    request
        .extensions
        .get::<RouteTemplate>()
        .map(|t| t.0.as_ref())
}

impl DescriptorSource for RouteKey {
    fn descriptor(&self, request: &Parts) -> Option<Descriptor> {
        let path = match template(request) {
            Some(template) => template,
            None if self.raw_paths => request.uri.path(),
            None => return None,
        };
        if self.method {
            Some(single(&self.key, format!("{} {path}", request.method)))
        } else {
            Some(single(&self.key, path))
        }
    }
}

/// A fixed entry, `generic_key=<value>` by default: one budget for every
/// request that reaches the layer (a global limit), or a tag that combines
/// with others in a [`Composite`].
#[derive(Debug, Clone)]
pub struct FixedKey {
    key: String,
    value: String,
}

impl FixedKey {
    /// `generic_key=<value>`, Envoy's name.
    pub fn new(value: impl Into<String>) -> Self {
        Self {
            key: "generic_key".into(),
            value: value.into(),
        }
    }

    /// Names the descriptor entry `key` instead of `generic_key`.
    pub fn descriptor_key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }
}

impl DescriptorSource for FixedKey {
    fn descriptor(&self, _: &Parts) -> Option<Descriptor> {
        Some(single(&self.key, self.value.clone()))
    }

    fn descriptor_of_peer(&self, _: IpAddr) -> Option<Option<Descriptor>> {
        Some(Some(single(&self.key, self.value.clone())))
    }
}

/// One descriptor made of the entries of several sources, in order (e.g. user
/// and route for a per-user, per-route limit), as an Envoy `rate_limits` entry
/// with several actions makes one: none when any required part gives none,
/// or when no part gives any entry.
#[derive(Default)]
pub struct Composite {
    parts: Vec<(Box<dyn DescriptorSource>, bool)>,
}

impl Composite {
    /// An empty composite; add parts with [`Composite::with`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the entries of `part`'s descriptor; without them, the
    /// composite gives no descriptor.
    pub fn with(mut self, part: impl DescriptorSource) -> Self {
        self.parts.push((Box::new(part), true));
        self
    }

    /// Appends the entries of `part`'s descriptor when it gives one, and
    /// nothing otherwise (Envoy's `skip_if_absent`).
    pub fn with_optional(mut self, part: impl DescriptorSource) -> Self {
        self.parts.push((Box::new(part), false));
        self
    }
}

impl std::fmt::Debug for Composite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Composite")
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl DescriptorSource for Composite {
    fn descriptor(&self, request: &Parts) -> Option<Descriptor> {
        self.descriptor_from(request, None)
    }

    fn descriptor_from(&self, request: &Parts, peer: Option<IpAddr>) -> Option<Descriptor> {
        self.join(|part| Some(part.descriptor_from(request, peer)))?
    }

    fn descriptor_of_peer(&self, peer: IpAddr) -> Option<Option<Descriptor>> {
        self.join(|part| part.descriptor_of_peer(peer))
    }
}

impl Composite {
    /// The parts' descriptors as `make` gives them, joined; `None` when
    /// `make` gives `None` for a part.
    fn join(
        &self,
        mut make: impl FnMut(&dyn DescriptorSource) -> Option<Option<Descriptor>>,
    ) -> Option<Option<Descriptor>> {
        let mut entries = Vec::new();
        for (part, required) in &self.parts {
            match make(part.as_ref())? {
                Some(descriptor) => entries.extend(descriptor.entries),
                None if *required => return Some(None),
                None => {}
            }
        }
        Some((!entries.is_empty()).then(|| Descriptor {
            entries,
            ..Descriptor::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderName, HeaderValue, Request};

    use crate::ValueTest;

    use super::*;

    fn parts(request: Request<()>) -> Parts {
        request.into_parts().0
    }

    fn entries(d: Option<Descriptor>) -> Option<Vec<(String, String)>> {
        d.map(|d| d.entries.into_iter().map(|e| (e.key, e.value)).collect())
    }

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.into(), v.into())
    }

    #[test]
    fn a_peer_descriptor_is_what_each_of_its_requests_gets() {
        let trusted = ClientIpConfig::new().trust(["10.0.0.0/8".parse().unwrap()]);
        let request = || {
            parts(
                Request::get("/")
                    .header("x-forwarded-for", "192.0.2.1")
                    .header("x-user", "ann")
                    .body(())
                    .unwrap(),
            )
        };
        let sources: Vec<Box<dyn DescriptorSource>> = vec![
            Box::new(ClientIpKey::new(trusted.clone())),
            Box::new(FixedKey::new("v1")),
            Box::new(
                Composite::new()
                    .with(ClientIpKey::new(trusted.clone()))
                    .with(FixedKey::new("v1")),
            ),
            Box::new(Composite::new().with_optional(FixedKey::new("v1"))),
        ];
        for peer in ["203.0.113.7", "2001:db8::5", "::ffff:203.0.113.7"] {
            let peer: IpAddr = peer.parse().unwrap();
            for source in &sources {
                assert_eq!(
                    source.descriptor_of_peer(peer),
                    Some(source.descriptor_from(&request(), Some(peer))),
                    "from {peer}"
                );
            }
        }
        // Per request: a trusted proxy's (it names the client), a header's,
        // and a composite with either.
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(
            ClientIpKey::new(trusted.clone()).descriptor_of_peer(proxy),
            None
        );
        let peer: IpAddr = "203.0.113.7".parse().unwrap();
        assert_eq!(
            HeaderKey::new(HeaderName::from_static("x-user"), "user").descriptor_of_peer(peer),
            None
        );
        let with_header = Composite::new()
            .with(FixedKey::new("v1"))
            .with_optional(HeaderKey::new(HeaderName::from_static("x-user"), "user"));
        assert_eq!(with_header.descriptor_of_peer(peer), None);
        // A required part that gives nothing leaves the composite out.
        let never = Composite::new()
            .with(FixedKey::new("v1"))
            .with(Composite::new());
        assert_eq!(never.descriptor_of_peer(peer), Some(None));
    }

    #[test]
    fn client_ip_reads_the_peer_from_the_extensions() {
        let mut request = Request::get("/").body(()).unwrap();
        request
            .headers_mut()
            .insert("x-forwarded-for", HeaderValue::from_static("1.2.3.4"));
        request
            .extensions_mut()
            .insert("203.0.113.7:4000".parse::<SocketAddr>().unwrap());
        let key = ClientIpKey::default();
        assert_eq!(
            entries(key.descriptor(&parts(request))),
            Some(vec![pair("remote_address", "203.0.113.7")])
        );

        #[cfg(feature = "axum")]
        {
            let mut request = Request::get("/").body(()).unwrap();
            request.extensions_mut().insert(axum::extract::ConnectInfo(
                "[2001:db8::5]:80".parse::<SocketAddr>().unwrap(),
            ));
            assert_eq!(
                entries(key.descriptor(&parts(request))),
                Some(vec![pair("remote_address", "2001:db8::/64")])
            );
        }

        let nowhere = Request::get("/").body(()).unwrap();
        assert_eq!(
            entries(key.descriptor(&parts(nowhere))),
            Some(vec![pair("remote_address", "unknown")])
        );
    }

    #[test]
    fn client_ip_takes_the_peer_the_service_was_told_when_the_request_names_none() {
        let told = Some("198.51.100.4".parse::<IpAddr>().unwrap());
        let key = ClientIpKey::default();
        let plain = parts(Request::get("/").body(()).unwrap());
        assert_eq!(
            entries(key.descriptor_from(&plain, told)),
            Some(vec![pair("remote_address", "198.51.100.4")])
        );
        // Through a composite's parts too; a part that does not read the
        // peer is unchanged.
        let composite = Composite::new()
            .with(ClientIpKey::default())
            .with(FixedKey::new("v"));
        assert_eq!(
            entries(composite.descriptor_from(&plain, told)),
            Some(vec![
                pair("remote_address", "198.51.100.4"),
                pair("generic_key", "v")
            ])
        );
        assert_eq!(
            entries(composite.descriptor(&plain)),
            Some(vec![
                pair("remote_address", "unknown"),
                pair("generic_key", "v")
            ])
        );
        // A peer in the request's own extensions is the more specific.
        let mut request = Request::get("/").body(()).unwrap();
        request
            .extensions_mut()
            .insert("203.0.113.7:4000".parse::<SocketAddr>().unwrap());
        assert_eq!(
            entries(key.descriptor_from(&parts(request), told)),
            Some(vec![pair("remote_address", "203.0.113.7")])
        );
    }

    #[test]
    fn header_route_fixed_and_composite() {
        let mut request = Request::post("/v1/search?q=x").body(()).unwrap();
        request
            .headers_mut()
            .insert("x-api-key", HeaderValue::from_static("k-123"));
        let head = parts(request);
        let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"), "api_key");
        assert_eq!(
            entries(api_key.descriptor(&head)),
            Some(vec![pair("api_key", "k-123")])
        );
        let missing = HeaderKey::new(HeaderName::from_static("x-user"), "user");
        assert_eq!(entries(missing.descriptor(&head)), None);

        assert_eq!(
            entries(RouteKey::new().descriptor(&head)),
            Some(vec![pair("route", "POST /v1/search")])
        );
        assert_eq!(
            entries(RouteKey::new().templates_only().descriptor(&head)),
            None
        );
        let mut templated = Request::get("/users/42").body(()).unwrap();
        templated
            .extensions_mut()
            .insert(RouteTemplate("/users/{id}".into()));
        assert_eq!(
            entries(RouteKey::new().descriptor(&parts(templated))),
            Some(vec![pair("route", "GET /users/{id}")])
        );

        assert_eq!(
            entries(FixedKey::new("global").descriptor(&head)),
            Some(vec![pair("generic_key", "global")])
        );

        let both = Composite::new().with(api_key.clone()).with(RouteKey::new());
        assert_eq!(
            entries(both.descriptor(&head)),
            Some(vec![
                pair("api_key", "k-123"),
                pair("route", "POST /v1/search")
            ])
        );
        let broken = Composite::new().with(api_key).with(missing);
        assert_eq!(entries(broken.descriptor(&head)), None);
        assert_eq!(entries(Composite::new().descriptor(&head)), None);

        assert_eq!(
            entries(RouteKey::path().descriptor(&head)),
            Some(vec![pair("path", "/v1/search")])
        );
        let method = HeaderKey::new(RequestField::Method, "method");
        assert_eq!(
            entries(method.descriptor(&head)),
            Some(vec![pair("method", "POST")])
        );
        let skipping = Composite::new()
            .with(FixedKey::new("search"))
            .with_optional(HeaderKey::new(HeaderName::from_static("x-user"), "user"));
        assert_eq!(
            entries(skipping.descriptor(&head)),
            Some(vec![pair("generic_key", "search")]),
            "an optional part that gives nothing is skipped"
        );
        let nothing = Composite::new()
            .with_optional(HeaderKey::new(HeaderName::from_static("x-user"), "user"));
        assert_eq!(entries(nothing.descriptor(&head)), None);

        let closure = |p: &Parts| Some(single("method", p.method.as_str()));
        assert_eq!(
            entries(closure.descriptor(&head)),
            Some(vec![pair("method", "POST")])
        );
    }

    #[test]
    fn header_match_gives_its_value_when_the_tests_pass() {
        let mut request = Request::post("/v1/items").body(()).unwrap();
        request
            .headers_mut()
            .insert("x-tier", HeaderValue::from_static("free"));
        let head = parts(request);
        let post = HeaderMatcher::new(RequestField::Method, ValueTest::Exact("POST".into()));
        let free = HeaderMatcher::new(
            HeaderName::from_static("x-tier"),
            ValueTest::Prefix("fr".into()),
        );
        let writes = HeaderMatch::new("free-writes")
            .header(post.clone())
            .header(free);
        assert_eq!(
            entries(writes.descriptor(&head)),
            Some(vec![pair("header_match", "free-writes")])
        );
        let not_post = HeaderMatch::new("reads")
            .descriptor_key("kind")
            .header(post)
            .expect_match(false);
        assert_eq!(entries(not_post.descriptor(&head)), None);
        let get = Request::get("/").body(()).unwrap();
        assert_eq!(
            entries(not_post.descriptor(&parts(get))),
            Some(vec![pair("kind", "reads")])
        );
    }
}
