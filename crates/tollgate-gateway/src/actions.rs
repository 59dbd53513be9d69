//! The gateway's `rate_limits`: Envoy's route-level rate limit actions, read
//! from YAML and turned into `tollgate_http` descriptor sources.
//!
//! Each `rate_limits` entry makes one descriptor whose entries come from its
//! actions, in order, as Envoy makes them: when an action cannot give its
//! entry (a missing header, a failed match), the entry's descriptor is left
//! out of this request, unless the action is a `request_headers` with
//! `skip_if_absent: true`, which then only drops its own entry.
//!
//! | action | entry |
//! | --- | --- |
//! | `remote_address: {}` | `remote_address=<client IP>` (IPv6 by prefix) |
//! | `masked_remote_address: {v4_prefix_mask_len, v6_prefix_mask_len}` | `masked_remote_address=<client network>` |
//! | `request_headers: {header_name, descriptor_key, skip_if_absent}` | `<descriptor_key>=<header value>`; `:method`, `:path`, `:authority`, `:scheme` too |
//! | `generic_key: {descriptor_value, descriptor_key}` | `generic_key=<descriptor_value>` (or the key given) |
//! | `header_value_match: {descriptor_value, descriptor_key, expect_match, headers}` | `header_match=<descriptor_value>` when the headers match (or, with `expect_match: false`, when they do not) |
//! | `request_method: {descriptor_key}` | `method=GET` (Tollgate) |
//! | `path: {descriptor_key, templates_only}` | `path=/users/{id}`: the route template, else the raw path (Tollgate) |
//! | `route: {descriptor_key, templates_only}` | `route=GET /users/{id}` (Tollgate) |

use std::fmt;

use serde::Deserialize;
use tollgate_http::{
    ClientIpConfig, ClientIpKey, Composite, FixedKey, HeaderKey, HeaderMatch, HeaderMatcher,
    RequestField, RouteKey, ValueTest,
};

/// One `rate_limits` entry: the actions that make one descriptor.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitSpec {
    /// The actions, in entry order; at least one.
    actions: Actions,
}

/// A non-empty list of actions.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Vec<Action>")]
struct Actions(Vec<Action>);

impl TryFrom<Vec<Action>> for Actions {
    type Error = &'static str;

    fn try_from(actions: Vec<Action>) -> Result<Self, Self::Error> {
        if actions.is_empty() {
            return Err("a rate_limits entry needs at least one action");
        }
        Ok(Self(actions))
    }
}

/// One action, Envoy's names (and three of Tollgate's own).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Action {
    RemoteAddress(Empty),
    MaskedRemoteAddress(Masked),
    RequestHeaders(RequestHeaders),
    GenericKey(GenericKey),
    HeaderValueMatch(HeaderValueMatch),
    RequestMethod(KeyOnly),
    Path(Templated),
    Route(Templated),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Masked {
    #[serde(default = "Masked::v4")]
    v4_prefix_mask_len: Prefix<32>,
    #[serde(default = "Masked::v6")]
    v6_prefix_mask_len: Prefix<128>,
}

impl Masked {
    fn v4() -> Prefix<32> {
        Prefix(32)
    }
    fn v6() -> Prefix<128> {
        Prefix(128)
    }
}

/// A prefix length of at most `MAX` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u8")]
pub(crate) struct Prefix<const MAX: u8>(pub(crate) u8);

impl<const MAX: u8> TryFrom<u8> for Prefix<MAX> {
    type Error = String;

    fn try_from(bits: u8) -> Result<Self, String> {
        if bits > MAX {
            return Err(format!("a prefix length of {bits} bits; at most {MAX}"));
        }
        Ok(Self(bits))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestHeaders {
    header_name: Field,
    descriptor_key: Key,
    #[serde(default)]
    skip_if_absent: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct GenericKey {
    descriptor_value: Key,
    descriptor_key: Option<Key>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderValueMatch {
    descriptor_value: Key,
    descriptor_key: Option<Key>,
    #[serde(default = "yes")]
    expect_match: bool,
    headers: Matchers,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyOnly {
    descriptor_key: Option<Key>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Templated {
    descriptor_key: Option<Key>,
    /// Leave requests that match no route template out, rather than keying
    /// them by their raw path.
    #[serde(default)]
    templates_only: bool,
}

/// A descriptor key or value: not empty.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
struct Key(String);

impl TryFrom<String> for Key {
    type Error = &'static str;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        if s.is_empty() {
            return Err("descriptor keys and values cannot be empty");
        }
        Ok(Self(s))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A header name or one of Envoy's pseudo-headers.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "String")]
struct Field(RequestField);

impl TryFrom<String> for Field {
    type Error = tollgate_http::InvalidField;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.to_ascii_lowercase().parse().map(Field)
    }
}

/// A non-empty list of header matchers.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Vec<Matcher>")]
struct Matchers(Vec<HeaderMatcher>);

impl TryFrom<Vec<Matcher>> for Matchers {
    type Error = &'static str;

    fn try_from(matchers: Vec<Matcher>) -> Result<Self, Self::Error> {
        if matchers.is_empty() {
            return Err("header_value_match needs at least one entry in `headers`");
        }
        Ok(Self(matchers.into_iter().map(|m| m.0).collect()))
    }
}

/// Envoy's `HeaderMatcher`: a name and exactly one test, in its v3 form
/// (`string_match`) or the older one (`exact_match`, `prefix_match`, …).
#[derive(Deserialize)]
#[serde(try_from = "RawMatcher")]
struct Matcher(HeaderMatcher);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatcher {
    name: Field,
    exact_match: Option<String>,
    prefix_match: Option<String>,
    suffix_match: Option<String>,
    contains_match: Option<String>,
    present_match: Option<bool>,
    string_match: Option<StringMatch>,
    #[serde(default)]
    invert_match: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StringMatch {
    exact: Option<String>,
    prefix: Option<String>,
    suffix: Option<String>,
    contains: Option<String>,
    #[serde(default)]
    ignore_case: bool,
}

/// The one test among `tests`, or why there is not exactly one.
fn one_test(tests: [Option<ValueTest>; 4], what: &str) -> Result<ValueTest, String> {
    let mut given = tests.into_iter().flatten();
    match (given.next(), given.next()) {
        (Some(test), None) => Ok(test),
        _ => Err(format!("a header matcher needs exactly one of {what}")),
    }
}

impl TryFrom<RawMatcher> for Matcher {
    type Error = String;

    fn try_from(raw: RawMatcher) -> Result<Self, String> {
        const LEGACY: &str =
            "exact_match, prefix_match, suffix_match, contains_match, present_match, string_match";
        let legacy = [
            raw.exact_match.map(ValueTest::Exact),
            raw.prefix_match.map(ValueTest::Prefix),
            raw.suffix_match.map(ValueTest::Suffix),
            raw.contains_match.map(ValueTest::Contains),
        ];
        let mut ignore_case = false;
        let test = match (raw.string_match, raw.present_match) {
            (Some(s), None) if legacy.iter().all(Option::is_none) => {
                ignore_case = s.ignore_case;
                one_test(
                    [
                        s.exact.map(ValueTest::Exact),
                        s.prefix.map(ValueTest::Prefix),
                        s.suffix.map(ValueTest::Suffix),
                        s.contains.map(ValueTest::Contains),
                    ],
                    "string_match's exact, prefix, suffix, contains",
                )?
            }
            (None, Some(present)) if legacy.iter().all(Option::is_none) => {
                ValueTest::Present(present)
            }
            (None, None) => one_test(legacy, LEGACY)?,
            _ => return Err(format!("a header matcher needs exactly one of {LEGACY}")),
        };
        let mut matcher = HeaderMatcher::new(raw.name.0, test);
        if ignore_case {
            matcher = matcher.ignore_case();
        }
        if raw.invert_match {
            matcher = matcher.invert();
        }
        Ok(Self(matcher))
    }
}

impl RateLimitSpec {
    /// The descriptor source of this entry: one composite of its actions.
    pub(crate) fn source(&self, client_ip: &ClientIpConfig) -> Composite {
        let key = |given: &Option<Key>, default: &str| {
            given.as_ref().map_or(default, |k| k.0.as_str()).to_owned()
        };
        let mut composite = Composite::new();
        for action in &self.actions.0 {
            composite = match action {
                Action::RemoteAddress(Empty {}) => {
                    composite.with(ClientIpKey::new(client_ip.clone()))
                }
                Action::MaskedRemoteAddress(m) => composite.with(
                    ClientIpKey::new(
                        client_ip
                            .clone()
                            .ipv4_prefix(m.v4_prefix_mask_len.0)
                            .ipv6_prefix(m.v6_prefix_mask_len.0),
                    )
                    .descriptor_key("masked_remote_address"),
                ),
                Action::RequestHeaders(h) => {
                    let source =
                        HeaderKey::new(h.header_name.0.clone(), h.descriptor_key.0.clone());
                    if h.skip_if_absent {
                        composite.with_optional(source)
                    } else {
                        composite.with(source)
                    }
                }
                Action::GenericKey(g) => composite.with(
                    FixedKey::new(g.descriptor_value.0.clone())
                        .descriptor_key(key(&g.descriptor_key, "generic_key")),
                ),
                Action::HeaderValueMatch(m) => {
                    let mut source = HeaderMatch::new(m.descriptor_value.0.clone())
                        .descriptor_key(key(&m.descriptor_key, "header_match"))
                        .expect_match(m.expect_match);
                    for matcher in &m.headers.0 {
                        source = source.header(matcher.clone());
                    }
                    composite.with(source)
                }
                Action::RequestMethod(k) => composite.with(HeaderKey::new(
                    RequestField::Method,
                    key(&k.descriptor_key, "method"),
                )),
                Action::Path(t) => composite.with(templated(
                    RouteKey::path().descriptor_key(key(&t.descriptor_key, "path")),
                    t,
                )),
                Action::Route(t) => composite.with(templated(
                    RouteKey::new().descriptor_key(key(&t.descriptor_key, "route")),
                    t,
                )),
            };
        }
        composite
    }
}

fn templated(key: RouteKey, spec: &Templated) -> RouteKey {
    if spec.templates_only {
        key.templates_only()
    } else {
        key
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use http::Request;
    use http::request::Parts;
    use tollgate_http::{DescriptorSource, RouteTemplate};
    use tollgate_policy::parse_yaml;

    use super::*;

    fn specs(yaml: &str) -> Vec<RateLimitSpec> {
        parse_yaml("gateway.yaml", yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    fn refused(yaml: &str) -> String {
        match parse_yaml::<Vec<RateLimitSpec>>("gateway.yaml", yaml) {
            Ok(_) => panic!("accepted: {yaml}"),
            Err(e) => e.to_string(),
        }
    }

    fn head(method: &str, path: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut parts = request.body(()).unwrap().into_parts().0;
        parts
            .extensions
            .insert("203.0.113.9:5000".parse::<SocketAddr>().unwrap());
        parts
    }

    fn entries(spec: &RateLimitSpec, parts: &Parts) -> Option<Vec<(String, String)>> {
        let source = spec.source(&ClientIpConfig::default());
        source
            .descriptor(parts)
            .map(|d| d.entries.into_iter().map(|e| (e.key, e.value)).collect())
    }

    fn pairs(list: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
        Some(
            list.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn actions_make_envoy_descriptors() {
        let specs = specs(
            r#"
- actions:
    - remote_address: {}
- actions:
    - request_headers: { header_name: X-Api-Key, descriptor_key: api_key }
    - request_headers: { header_name: x-user, descriptor_key: user, skip_if_absent: true }
- actions:
    - generic_key: { descriptor_value: writes }
    - header_value_match:
        descriptor_value: post
        headers:
          - name: ":method"
            exact_match: POST
- actions:
    - header_value_match:
        descriptor_value: not-internal
        descriptor_key: origin
        expect_match: false
        headers:
          - { name: x-internal, present_match: true }
- actions:
    - request_method: {}
    - path: {}
- actions:
    - route: { templates_only: true }
- actions:
    - masked_remote_address: { v4_prefix_mask_len: 24 }
- actions:
    - request_headers: { header_name: ":path", descriptor_key: full_path }
"#,
        );
        let post = head("POST", "/items/7?x=1", &[("x-api-key", "k1")]);
        let got: Vec<_> = specs.iter().map(|s| entries(s, &post)).collect();
        assert_eq!(got[0], pairs(&[("remote_address", "203.0.113.9")]));
        assert_eq!(got[1], pairs(&[("api_key", "k1")]), "x-user skipped");
        assert_eq!(
            got[2],
            pairs(&[("generic_key", "writes"), ("header_match", "post")])
        );
        assert_eq!(got[3], pairs(&[("origin", "not-internal")]));
        assert_eq!(got[4], pairs(&[("method", "POST"), ("path", "/items/7")]));
        assert_eq!(got[5], None, "no template matched");
        assert_eq!(
            got[6],
            pairs(&[("masked_remote_address", "203.0.113.0/24")])
        );
        assert_eq!(got[7], pairs(&[("full_path", "/items/7?x=1")]));

        let mut get = head("GET", "/items/7", &[("x-internal", "1"), ("x-user", "u")]);
        get.extensions.insert(RouteTemplate("/items/{id}".into()));
        let got: Vec<_> = specs.iter().map(|s| entries(s, &get)).collect();
        assert_eq!(got[1], None, "no API key: the whole descriptor is left out");
        assert_eq!(got[2], None, "not a POST");
        assert_eq!(got[3], None, "internal");
        assert_eq!(got[4], pairs(&[("method", "GET"), ("path", "/items/{id}")]));
        assert_eq!(got[5], pairs(&[("route", "GET /items/{id}")]));
    }

    #[test]
    fn string_match_and_invert() {
        let specs = specs(
            r#"
- actions:
    - header_value_match:
        descriptor_value: not-json
        headers:
          - name: content-type
            string_match: { prefix: APPLICATION/JSON, ignore_case: true }
            invert_match: true
"#,
        );
        let json = head("POST", "/", &[("content-type", "application/json")]);
        let form = head("POST", "/", &[("content-type", "text/plain")]);
        assert_eq!(entries(&specs[0], &json), None);
        assert_eq!(
            entries(&specs[0], &form),
            pairs(&[("header_match", "not-json")])
        );
    }

    #[test]
    fn bad_actions_are_refused_with_their_line() {
        let unknown = refused("- actions:\n    - remote_adress: {}\n");
        assert!(
            unknown.contains(":2:") && unknown.contains("remote_adress"),
            "{unknown}"
        );
        let empty = refused("- actions: []\n");
        assert!(empty.contains("at least one action"), "{empty}");
        let two = refused(
            "- actions:\n    - header_value_match:\n        descriptor_value: x\n        headers: [{ name: a, exact_match: b, prefix_match: c }]\n",
        );
        assert!(two.contains("exactly one"), "{two}");
        let none =
            refused("- actions:\n    - header_value_match: { descriptor_value: x, headers: [] }\n");
        assert!(none.contains("at least one entry"), "{none}");
        let bad_header = refused(
            "- actions:\n    - request_headers: { header_name: \"bad header\", descriptor_key: k }\n",
        );
        assert!(bad_header.contains("not a header name"), "{bad_header}");
        let empty_key = refused("- actions:\n    - generic_key: { descriptor_value: \"\" }\n");
        assert!(empty_key.contains("cannot be empty"), "{empty_key}");
        let mask = refused("- actions:\n    - masked_remote_address: { v4_prefix_mask_len: 33 }\n");
        assert!(mask.contains("at most 32"), "{mask}");
    }
}
