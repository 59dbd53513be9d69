//! The parts of a request head that descriptor sources read and match:
//! headers, and the pseudo-headers Envoy's rate limit actions name.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use http::HeaderName;
use http::header::HOST;
use http::request::Parts;

/// A part of the request head, named as Envoy names it: a header, or one of
/// the HTTP/2 pseudo-headers `:method`, `:path` (path and query, as sent),
/// `:authority` (the URI's authority, else `Host`) and `:scheme`.
///
/// Parsed from its name: `":method".parse()`, `"x-api-key".parse()`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestField {
    /// A header. Several lines of it read as their values joined by `,`.
    Header(HeaderName),
    /// `:method`.
    Method,
    /// `:path`: the path and the query.
    Path,
    /// `:authority`: the URI's authority, else the `Host` header.
    Authority,
    /// `:scheme`: the URI's scheme, else `http`.
    Scheme,
}

impl RequestField {
    /// The field's value in `request`, or `None` when it is absent or a
    /// header value is not visible ASCII.
    pub fn value<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        match self {
            RequestField::Header(name) => header(request, name),
            RequestField::Method => Some(Cow::Borrowed(request.method.as_str())),
            RequestField::Path => Some(Cow::Borrowed(
                request.uri.path_and_query().map_or("/", |p| p.as_str()),
            )),
            RequestField::Authority => match request.uri.authority() {
                Some(authority) => Some(Cow::Borrowed(authority.as_str())),
                None => header(request, &HOST),
            },
            RequestField::Scheme => Some(Cow::Borrowed(request.uri.scheme_str().unwrap_or("http"))),
        }
    }
}

/// Every line of header `name`, joined by `,` when there are several.
fn header<'a>(request: &'a Parts, name: &HeaderName) -> Option<Cow<'a, str>> {
    let mut values = request.headers.get_all(name).iter();
    let first = values.next()?.to_str().ok()?;
    let mut joined: Option<String> = None;
    for more in values {
        let text = joined.get_or_insert_with(|| first.to_owned());
        text.push(',');
        text.push_str(more.to_str().ok()?);
    }
    Some(joined.map_or(Cow::Borrowed(first), Cow::Owned))
}

impl From<HeaderName> for RequestField {
    fn from(name: HeaderName) -> Self {
        RequestField::Header(name)
    }
}

/// A name that is neither a pseudo-header Tollgate knows nor a valid header name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a header name, nor one of :method, :path, :authority, :scheme")]
pub struct InvalidField(String);

impl FromStr for RequestField {
    type Err = InvalidField;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            ":method" => Ok(RequestField::Method),
            ":path" => Ok(RequestField::Path),
            ":authority" => Ok(RequestField::Authority),
            ":scheme" => Ok(RequestField::Scheme),
            _ => HeaderName::from_str(name)
                .map(RequestField::Header)
                .map_err(|_| InvalidField(name.to_owned())),
        }
    }
}

impl fmt::Display for RequestField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RequestField::Header(name) => name.as_str(),
            RequestField::Method => ":method",
            RequestField::Path => ":path",
            RequestField::Authority => ":authority",
            RequestField::Scheme => ":scheme",
        })
    }
}

/// What a [`HeaderMatcher`] asks of a field's value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueTest {
    /// The value is exactly this.
    Exact(String),
    /// The value starts with this.
    Prefix(String),
    /// The value ends with this.
    Suffix(String),
    /// The value contains this.
    Contains(String),
    /// The field is present (`true`) or absent (`false`), whatever its value.
    Present(bool),
}

/// One test on one field, Envoy's `HeaderMatcher`: a value test, optionally
/// case-insensitive and optionally inverted.
///
/// A value test never matches an absent field, inverted or not (only
/// `Present(false)` matches absence); inverting applies to the value test of
/// a present field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderMatcher {
    field: RequestField,
    test: ValueTest,
    ignore_case: bool,
    invert: bool,
}

impl HeaderMatcher {
    /// `test` on `field`.
    pub fn new(field: impl Into<RequestField>, test: ValueTest) -> Self {
        Self {
            field: field.into(),
            test,
            ignore_case: false,
            invert: false,
        }
    }

    /// Compares values ASCII-case-insensitively.
    pub fn ignore_case(mut self) -> Self {
        self.ignore_case = true;
        self
    }

    /// Matches when the value test fails (on a present field).
    pub fn invert(mut self) -> Self {
        self.invert = true;
        self
    }

    /// Whether `request` passes this test.
    pub fn matches(&self, request: &Parts) -> bool {
        let value = self.field.value(request);
        let wanted = match &self.test {
            ValueTest::Present(present) => return value.is_some() == *present,
            ValueTest::Exact(s)
            | ValueTest::Prefix(s)
            | ValueTest::Suffix(s)
            | ValueTest::Contains(s) => s,
        };
        let Some(value) = value else {
            return false;
        };
        let (value, wanted) = if self.ignore_case {
            (
                Cow::Owned(value.to_ascii_lowercase()),
                Cow::Owned(wanted.to_ascii_lowercase()),
            )
        } else {
            (value, Cow::Borrowed(wanted.as_str()))
        };
        let passed = match &self.test {
            ValueTest::Exact(_) => value == wanted,
            ValueTest::Prefix(_) => value.starts_with(wanted.as_ref()),
            ValueTest::Suffix(_) => value.ends_with(wanted.as_ref()),
            ValueTest::Contains(_) => value.contains(wanted.as_ref()),
            ValueTest::Present(_) => unreachable!("answered above"),
        };
        passed != self.invert
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderValue, Request};

    use super::*;

    fn head() -> Parts {
        let mut request = Request::post("http://api.example/v1/items?page=2")
            .body(())
            .unwrap();
        let headers = request.headers_mut();
        headers.insert("x-api-key", HeaderValue::from_static("Key-1"));
        headers.append("x-tag", HeaderValue::from_static("a"));
        headers.append("x-tag", HeaderValue::from_static("b"));
        request.into_parts().0
    }

    fn field(name: &str) -> RequestField {
        name.parse().expect(name)
    }

    #[test]
    fn fields_read_headers_and_pseudo_headers() {
        let head = head();
        let value = |name: &str| field(name).value(&head).map(Cow::into_owned);
        assert_eq!(value(":method").as_deref(), Some("POST"));
        assert_eq!(value(":path").as_deref(), Some("/v1/items?page=2"));
        assert_eq!(value(":authority").as_deref(), Some("api.example"));
        assert_eq!(value(":scheme").as_deref(), Some("http"));
        assert_eq!(value("x-api-key").as_deref(), Some("Key-1"));
        assert_eq!(value("x-tag").as_deref(), Some("a,b"));
        assert_eq!(value("x-none"), None);
        assert!(":nope".parse::<RequestField>().is_err());
        assert!("bad header".parse::<RequestField>().is_err());
        assert_eq!(field(":method").to_string(), ":method");

        let mut relative = Request::get("/").body(()).unwrap();
        relative
            .headers_mut()
            .insert(HOST, HeaderValue::from_static("h.example:81"));
        let relative = relative.into_parts().0;
        assert_eq!(
            field(":authority").value(&relative).as_deref(),
            Some("h.example:81")
        );
    }

    #[test]
    fn matchers_follow_envoy() {
        let head = head();
        let test = |name: &str, test: ValueTest| HeaderMatcher::new(field(name), test);
        assert!(test(":method", ValueTest::Exact("POST".into())).matches(&head));
        assert!(!test(":method", ValueTest::Exact("post".into())).matches(&head));
        assert!(
            test(":method", ValueTest::Exact("post".into()))
                .ignore_case()
                .matches(&head)
        );
        assert!(test(":path", ValueTest::Prefix("/v1/".into())).matches(&head));
        assert!(test(":path", ValueTest::Suffix("page=2".into())).matches(&head));
        assert!(test("x-api-key", ValueTest::Contains("y-".into())).matches(&head));
        assert!(test("x-api-key", ValueTest::Present(true)).matches(&head));
        assert!(test("x-none", ValueTest::Present(false)).matches(&head));
        assert!(!test("x-none", ValueTest::Present(true)).matches(&head));
        assert!(
            test(":method", ValueTest::Exact("GET".into()))
                .invert()
                .matches(&head)
        );
        assert!(
            !test("x-none", ValueTest::Exact("x".into()))
                .invert()
                .matches(&head),
            "an absent field fails a value test, inverted or not"
        );
    }
}
