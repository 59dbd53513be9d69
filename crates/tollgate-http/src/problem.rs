//! The body of a `429 Too Many Requests`: Tollgate's JSON
//! (`{"error": "rate_limit_exceeded", ...}`), or, for a client whose `Accept`
//! asks for `application/problem+json`, RFC 9457 problem details of the type
//! the IETF draft ([`crate::headers::DRAFT`]) registers, `quota-exceeded`,
//! naming the policies the request broke in `violated-policies`.
//!
//! ```json
//! {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//!  "title":"Request cannot be satisfied as assigned quota has been exceeded",
//!  "status":429,"detail":"rate limit \"per-ip\" exceeded; retry in 2 s",
//!  "violated-policies":["per-ip"],"retry_after":2}
//! ```
//!
//! The names in `violated-policies` are those of `RateLimit-Policy`: every
//! denying limit, once each. Every door that answers 429 over HTTP (the tower
//! layer, and the gateway, which is the layer in front of a proxy) calls
//! [`body`].

use http::HeaderMap;
use http::header::ACCEPT;

use crate::headers::LimitReport;

/// RFC 9457's media type.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The draft's problem type for a request refused because a quota is spent.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The problem type's title, as the draft registers it.
pub const QUOTA_EXCEEDED_TITLE: &str =
    "Request cannot be satisfied as assigned quota has been exceeded";

/// How a 429 body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json`: `{"error": "rate_limit_exceeded", "message",
    /// "retry_after"}`, what clients get unless they ask otherwise.
    Json,
    /// `application/problem+json` of type [`QUOTA_EXCEEDED`].
    Problem,
}

impl Format {
    /// The format `headers` (a request's) ask for: [`Format::Problem`] when
    /// `Accept` names `application/problem+json` with a weight above zero and
    /// at least that of `application/json`; else [`Format::Json`]. Wildcards
    /// (`*/*`, `application/*`) keep the JSON that clients have always got.
    pub fn negotiate(headers: &HeaderMap) -> Self {
        let (mut problem, mut json) = (0.0_f32, 0.0_f32);
        let ranges = headers
            .get_all(ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','));
        for range in ranges {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim();
            let weight = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, q)| q.trim().parse::<f32>().ok())
                .filter(|q| (0.0..=1.0).contains(q))
                .unwrap_or(0.0);
            if media.eq_ignore_ascii_case(PROBLEM_JSON) {
                problem = problem.max(weight);
            } else if media.eq_ignore_ascii_case("application/json") {
                json = json.max(weight);
            }
        }
        if problem > 0.0 && problem >= json {
            Format::Problem
        } else {
            Format::Json
        }
    }

    /// The `Content-Type` of a body in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Problem => PROBLEM_JSON,
        }
    }
}

/// What a 429 says about the most restrictive limit, `name`, and its
/// `Retry-After` of `retry_after` seconds: the JSON body's `message`, the
/// problem's `detail` and a gRPC answer's `grpc-message`.
pub fn message(name: &str, retry_after: u64) -> String {
    format!("rate limit \"{name}\" exceeded; retry in {retry_after} s")
}

/// The body of a 429 for a request denied by `limits` (those that applied;
/// the denying ones are named), saying `message`, whose `Retry-After` is
/// `retry_after` seconds, in `format`.
pub fn body(format: Format, limits: &[LimitReport<'_>], message: &str, retry_after: u64) -> String {
    // Rule names are quoted in the message and may hold anything: written as
    // JSON strings. Written straight into one string rather than built as a
    // `serde_json::Value` map: denials come in floods.
    let message = serde_json::Value::from(message);
    match format {
        Format::Json => format!(
            r#"{{"error":"rate_limit_exceeded","message":{message},"retry_after":{retry_after}}}"#
        ),
        Format::Problem => {
            let mut violated: Vec<&str> = Vec::new();
            for limit in limits.iter().filter(|l| !l.decision.allowed()) {
                if !violated.contains(&limit.name) {
                    violated.push(limit.name);
                }
            }
            let violated = serde_json::Value::from(violated);
            format!(
                r#"{{"type":"{QUOTA_EXCEEDED}","title":"{QUOTA_EXCEEDED_TITLE}","status":429,"detail":{message},"violated-policies":{violated},"retry_after":{retry_after}}}"#
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderValue;
    use tollgate_core::{Algorithm, Decision, Quota};

    use super::*;

    fn accept(values: &[&str]) -> Format {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(ACCEPT, HeaderValue::from_str(value).unwrap());
        }
        Format::negotiate(&headers)
    }

    #[test]
    fn only_a_client_that_names_problem_json_gets_it() {
        assert_eq!(accept(&[]), Format::Json);
        assert_eq!(accept(&["*/*"]), Format::Json);
        assert_eq!(accept(&["application/*"]), Format::Json);
        assert_eq!(accept(&["application/json"]), Format::Json);
        assert_eq!(accept(&["application/problem+json"]), Format::Problem);
        assert_eq!(accept(&["Application/Problem+JSON"]), Format::Problem);
        assert_eq!(
            accept(&["application/json", "application/problem+json"]),
            Format::Problem,
            "equal weights: the more specific answer"
        );
        assert_eq!(
            accept(&["text/html, application/problem+json;q=0.9, */*;q=0.1"]),
            Format::Problem
        );
        assert_eq!(
            accept(&["application/json, application/problem+json;q=0.5"]),
            Format::Json,
            "JSON preferred"
        );
        assert_eq!(accept(&["application/problem+json;q=0"]), Format::Json);
        assert_eq!(accept(&["application/problem+json;q=x"]), Format::Json);
        assert_eq!(accept(&["application/problem+json;q=2"]), Format::Json);
    }

    fn report(name: &str, allowed: bool) -> LimitReport<'_> {
        let two = Duration::from_secs(2);
        let decision = if allowed {
            Decision::allow(5, 0, two)
        } else {
            Decision::deny(5, 0, two, Some(two))
        };
        LimitReport::new(
            name,
            &Quota::per_second(5).unwrap(),
            Algorithm::Gcra,
            decision,
        )
    }

    #[test]
    fn a_problem_names_every_violated_policy_once() {
        let limits = [
            report("global", true),
            report("per-ip", false),
            report("say \"hi\"", false),
            report("per-ip", false),
        ];
        let text = body(Format::Problem, &limits, &message("per-ip", 2), 2);
        let problem: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            problem,
            serde_json::json!({
                "type": QUOTA_EXCEEDED,
                "title": QUOTA_EXCEEDED_TITLE,
                "status": 429,
                "detail": "rate limit \"per-ip\" exceeded; retry in 2 s",
                "violated-policies": ["per-ip", "say \"hi\""],
                "retry_after": 2,
            })
        );
        let json: serde_json::Value =
            serde_json::from_str(&body(Format::Json, &limits, &message("per-ip", 2), 2)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "error": "rate_limit_exceeded",
                "message": "rate limit \"per-ip\" exceeded; retry in 2 s",
                "retry_after": 2,
            })
        );
    }
}
