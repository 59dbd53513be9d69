//! Route templates: the gateway's stand-in for a router, so that the `path`
//! and `route` actions can key by `/users/{id}` rather than by every id.
//!
//! A template is a path of `/`-separated segments: a literal segment matches
//! itself, `{name}` matches any one non-empty segment, and `{*name}` (last
//! only) matches the rest of the path, one segment or more. The first
//! template that matches a request's path is put in the request as a
//! [`RouteTemplate`], which `tollgate_http`'s `RouteKey` reads.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use tollgate_http::RouteTemplate;

/// One route template, checked when read.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(crate) struct Template {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    One,
    Rest,
}

impl TryFrom<String> for Template {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!("route template {text:?} does not start with /"));
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let mut segments = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let segment = match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                Some(name) if name.starts_with('*') && i + 1 == parts.len() => Segment::Rest,
                Some(name) if name.starts_with('*') => {
                    return Err(format!(
                        "route template {text:?}: {{{name}}} must be the last segment"
                    ));
                }
                Some(_) => Segment::One,
                None if part.contains(['{', '}']) => {
                    return Err(format!(
                        "route template {text:?}: a parameter must be a whole segment, like {{id}}"
                    ));
                }
                None => Segment::Literal((*part).to_owned()),
            };
            segments.push(segment);
        }
        Ok(Self { text, segments })
    }
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Template({:?})", self.text)
    }
}

impl Template {
    fn matches(&self, path: &str) -> bool {
        let Some(path) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = path.split('/');
        for segment in &self.segments {
            match (segment, parts.next()) {
                (Segment::Rest, Some(part)) => return !part.is_empty() || parts.next().is_some(),
                (Segment::One, Some(part)) if !part.is_empty() => {}
                (Segment::Literal(literal), Some(part)) if literal == part => {}
                _ => return false,
            }
        }
        parts.next().is_none()
    }
}

/// The configured templates, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Routes(pub(crate) Vec<Template>);

impl Routes {
    /// The first template `path` matches, as the extension `RouteKey` reads.
    pub(crate) fn template(&self, path: &str) -> Option<RouteTemplate> {
        self.0
            .iter()
            .find(|t| t.matches(path))
            .map(|t| RouteTemplate(Cow::Owned(t.text.clone())))
    }

    /// Whether no template is configured.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(templates: &[&str]) -> Routes {
        Routes(
            templates
                .iter()
                .map(|t| Template::try_from((*t).to_owned()).expect(t))
                .collect(),
        )
    }

    fn matched(routes: &Routes, path: &str) -> Option<String> {
        routes.template(path).map(|t| t.0.into_owned())
    }

    #[test]
    fn the_first_matching_template_wins() {
        let r = routes(&[
            "/users/me",
            "/users/{id}",
            "/users/{id}/posts/{post}",
            "/files/{*path}",
            "/",
        ]);
        assert_eq!(matched(&r, "/users/me").as_deref(), Some("/users/me"));
        assert_eq!(matched(&r, "/users/42").as_deref(), Some("/users/{id}"));
        assert_eq!(
            matched(&r, "/users/42/posts/7").as_deref(),
            Some("/users/{id}/posts/{post}")
        );
        assert_eq!(
            matched(&r, "/files/a/b/c.txt").as_deref(),
            Some("/files/{*path}")
        );
        assert_eq!(matched(&r, "/").as_deref(), Some("/"));
        for unmatched in ["/users", "/users/", "/users/42/", "/files/", "/other", ""] {
            assert_eq!(matched(&r, unmatched), None, "{unmatched:?}");
        }
    }

    #[test]
    fn malformed_templates_are_refused() {
        for bad in ["users/{id}", "/files/{*rest}/more", "/a{id}", "/{id"] {
            assert!(Template::try_from(bad.to_owned()).is_err(), "{bad}");
        }
    }
}
