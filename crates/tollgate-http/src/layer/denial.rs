//! The answer to a denied request, and the last one kept per thread.
//!
//! A flood of denials is mostly the same client over the same rule again and
//! again, and each answer then says the same thing byte for byte: the same
//! rate limit headers (until the reset's second turns), the same
//! `Retry-After`, the same body. Making one (the message and the body
//! formatted, a header map filled by hashing each name in) costs more than
//! the check that decided it, and ten allocations; a copy of the last one
//! costs the header map's two, and a reference to the same body.
//!
//! The last answer is reused only when everything it was made of is the
//! same: the header style, the format the client asked for, and every
//! limit's name, bucket, quota, window and decision, in the whole units the
//! answer shows them in (seconds for `Retry-After`, `X-RateLimit-Reset` and
//! `RateLimit`'s `t`; milliseconds for `X-RateLimit-Reset-After` when the
//! style writes it). A reload that changes a rule, a denial of another
//! client whose state differs, or the next second makes it anew.

use std::cell::RefCell;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, VARY};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use tollgate_core::Nanos;

use crate::headers::{
    LimitReport, ceil_millis, ceil_secs, most_restrictive, reset_epoch_secs, retry_after_secs,
};
use crate::problem::{self, Format};
use crate::{HeaderStyle, grpc};

/// How a denied request is answered, from what the request says of its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A gRPC client: `RESOURCE_EXHAUSTED` in a trailers-only response.
    Grpc,
    /// An HTTP client: 429 with a body in this format.
    Http(Format),
}

impl Answer {
    /// How the client that sent `headers` is answered: gRPC when the request
    /// is (`application/grpc`, `application/grpc+proto`, …), else HTTP in the
    /// format its `Accept` asks for. Worked out on a deny only: an admitted
    /// request never needs it, and a browser's `Accept` takes longer to read
    /// than the check.
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        if grpc::is_grpc(headers) {
            Self::Grpc
        } else {
            Self::Http(Format::negotiate(headers))
        }
    }
}

thread_local! {
    /// The last denial answered on this thread, with what it was made of.
    static LAST: RefCell<Option<Made>> = const { RefCell::new(None) };
}

/// An answer and what it was made of.
struct Made {
    style: HeaderStyle,
    answer: Answer,
    /// The index of the limit the answer reports, in `limits`.
    reported: usize,
    limits: Vec<Shown<Box<str>>>,
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// What a denial's answer shows of one limit: every input of the headers
/// and the body, times in the units they are written in.
#[derive(Debug, PartialEq, Eq)]
struct Shown<S> {
    name: S,
    bucket: Option<S>,
    quota: u64,
    window: Option<Duration>,
    concurrency: bool,
    allowed: bool,
    limit: u64,
    remaining: u64,
    /// Seconds until it is full again, rounded up (`RateLimit`'s `t` on an
    /// allow, the envoy family's reset).
    reset_secs: u64,
    /// `X-RateLimit-Reset`, in seconds since the Unix epoch.
    reset_at: u64,
    /// `Retry-After` (and `RateLimit`'s `t` on a deny).
    retry_after: u64,
    /// `X-RateLimit-Reset-After` in milliseconds, only when the style
    /// writes it: it changes with nearly every request.
    reset_millis: Option<u64>,
}

impl<'a> Shown<&'a str> {
    fn of(limit: &LimitReport<'a>, now: Nanos, style: HeaderStyle) -> Self {
        let d = &limit.decision;
        Self {
            name: limit.name,
            bucket: limit.bucket,
            quota: limit.quota,
            window: limit.window,
            concurrency: limit.concurrency,
            allowed: d.allowed(),
            limit: d.limit(),
            remaining: d.remaining(),
            reset_secs: ceil_secs(d.reset_after()),
            reset_at: reset_epoch_secs(now, d.reset_after()),
            retry_after: retry_after_secs(d),
            reset_millis: style.reset_after.then(|| ceil_millis(d.reset_after())),
        }
    }
}

impl<S> Shown<S> {
    /// The same, with each name made by `f`: owned to keep, or borrowed to
    /// compare.
    fn map<'a, T>(&'a self, f: impl Fn(&'a S) -> T) -> Shown<T> {
        Shown {
            name: f(&self.name),
            bucket: self.bucket.as_ref().map(&f),
            quota: self.quota,
            window: self.window,
            concurrency: self.concurrency,
            allowed: self.allowed,
            limit: self.limit,
            remaining: self.remaining,
            reset_secs: self.reset_secs,
            reset_at: self.reset_at,
            retry_after: self.retry_after,
            reset_millis: self.reset_millis,
        }
    }
}

impl Made {
    /// Whether this answer is the one `limits` (reporting the one at
    /// `reported`) would make now.
    fn fits(
        &self,
        style: HeaderStyle,
        answer: Answer,
        limits: &[LimitReport<'_>],
        reported: usize,
        now: Nanos,
    ) -> bool {
        self.style == style
            && self.answer == answer
            && self.reported == reported
            && self.limits.len() == limits.len()
            && self
                .limits
                .iter()
                .zip(limits)
                .all(|(shown, limit)| shown.map(|name| &**name) == Shown::of(limit, now, style))
    }

    fn response(&self) -> Response<Bytes> {
        let mut response = Response::new(self.body.clone());
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        response
    }
}

/// The answer to a request denied by `limits` (those that applied), as
/// `answer` says, with `style`'s headers; `now` is when the check started,
/// in nanoseconds since the Unix epoch. The last one made on this thread
/// when it would read the same ([`LAST`]).
///
/// # Panics
///
/// When no limit of `limits` denies: a deny has a denying limit.
pub(crate) fn too_many(
    style: HeaderStyle,
    answer: Answer,
    limits: &[LimitReport<'_>],
    now: Nanos,
) -> Response<Bytes> {
    let reported = most_restrictive(limits).expect("a deny has a denying limit");
    let index = limits
        .iter()
        .position(|limit| std::ptr::eq(limit, reported))
        .expect("the reported limit is one of them");
    let last = LAST.with_borrow(|last| {
        last.as_ref()
            .filter(|made| made.fits(style, answer, limits, index, now))
            .map(Made::response)
    });
    if let Some(response) = last {
        return response;
    }
    let response = make(style, answer, limits, reported, now);
    let made = Made {
        style,
        answer,
        reported: index,
        limits: limits
            .iter()
            .map(|limit| Shown::of(limit, now, style).map(|&name| Box::from(name)))
            .collect(),
        status: response.status(),
        headers: response.headers().clone(),
        body: response.body().clone(),
    };
    LAST.set(Some(made));
    response
}

/// 429 with the headers and a JSON body (problem details to a client that
/// asks for them, [`problem::Format::negotiate`]), or, to a gRPC client,
/// `RESOURCE_EXHAUSTED` in a trailers-only response, whichever rule denied:
/// a `fail_closed` rule whose store cannot answer denies the same way
/// (DESIGN §3).
fn make(
    style: HeaderStyle,
    answer: Answer,
    limits: &[LimitReport<'_>],
    reported: &LimitReport<'_>,
    now: Nanos,
) -> Response<Bytes> {
    let mut headers = HeaderMap::new();
    style.write(limits, now, &mut headers);
    let retry_after = retry_after_secs(&reported.decision);
    let message = problem::message(reported.name, retry_after);
    let format = match answer {
        Answer::Grpc => return grpc::trailers_only(headers, grpc::RESOURCE_EXHAUSTED, &message),
        Answer::Http(format) => format,
    };
    let body = problem::body(format, limits, &message, retry_after);
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    *response.headers_mut() = headers;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    // The body's format follows `Accept`: caches must know.
    headers.insert(VARY, HeaderValue::from_static("accept"));
    response
}

#[cfg(test)]
mod tests {
    use tollgate_core::{Algorithm, Decision, Quota};

    use super::*;
    use crate::problem::Format;

    /// 2023-11-14T22:13:20.25Z (1,700,000,000.25 s), in nanoseconds since the
    /// epoch.
    const EPOCH: Nanos = 1_700_000_000_250_000_000;
    const MS: Nanos = 1_000_000;

    /// Denied, full again in `reset_ms`, to be retried in `retry_ms`.
    fn denied_for(reset_ms: u64, retry_ms: u64) -> Decision {
        Decision::deny(
            5,
            0,
            Duration::from_millis(reset_ms),
            Some(Duration::from_millis(retry_ms)),
        )
    }

    fn denied(retry_ms: u64) -> Decision {
        denied_for(900, retry_ms)
    }

    /// The answer, and whether it is the one made before it (the same body
    /// buffer); each checked against one made afresh.
    fn answered(
        style: HeaderStyle,
        answer: Answer,
        limits: &[LimitReport<'_>],
        now: Nanos,
        before: &mut Option<Bytes>,
    ) -> (Response<Bytes>, bool) {
        let response = too_many(style, answer, limits, now);
        let fresh = make(
            style,
            answer,
            limits,
            most_restrictive(limits).unwrap(),
            now,
        );
        assert_eq!(response.status(), fresh.status());
        assert_eq!(response.headers(), fresh.headers());
        assert_eq!(response.body(), fresh.body());
        let reused = before
            .replace(response.body().clone())
            .is_some_and(|b| b.as_ptr() == response.body().as_ptr() && !b.is_empty());
        (response, reused)
    }

    #[test]
    fn a_denial_like_the_last_is_reused_and_a_changed_one_made_anew() {
        let json = Answer::Http(Format::Json);
        let style = HeaderStyle::default();
        let five = Quota::per_second(5).unwrap();
        let six = Quota::per_second(6).unwrap();
        let one = [LimitReport::new("api", &five, Algorithm::Gcra, denied(200))];
        let mut before = None;

        let (first, reused) = answered(style, json, &one, EPOCH, &mut before);
        assert!(!reused);
        assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(first.headers()["retry-after"], "1");
        // The same limit, state and second: the same answer.
        assert!(answered(style, json, &one, EPOCH + 300 * MS, &mut before).1);
        assert_eq!(first.headers()["x-ratelimit-reset"], "1700000002");
        // The reset's second turns (…00.25 + 0.9 + 0.9 s = …02.05).
        let (later, reused) = answered(style, json, &one, EPOCH + 900 * MS, &mut before);
        assert!(!reused);
        assert_eq!(later.headers()["x-ratelimit-reset"], "1700000003");

        // Every part of the answer counts: each change is made anew.
        let now = EPOCH + 900 * MS;
        let renamed = [LimitReport::new("apj", &five, Algorithm::Gcra, denied(200))];
        let (answer, reused) = answered(style, json, &renamed, now, &mut before);
        assert!(!reused);
        assert!(std::str::from_utf8(answer.body()).unwrap().contains("apj"));
        let requota = [LimitReport::new("apj", &six, Algorithm::Gcra, denied(200))];
        assert!(!answered(style, json, &requota, now, &mut before).1);
        let longer = [LimitReport::new(
            "apj",
            &six,
            Algorithm::Gcra,
            denied(1_200),
        )];
        let (answer, reused) = answered(style, json, &longer, now, &mut before);
        assert!(!reused);
        assert_eq!(answer.headers()["retry-after"], "2");
        let bucket = [
            LimitReport::new("apj", &six, Algorithm::Gcra, denied(1_200))
                .with_bucket(Some("shared")),
        ];
        assert!(!answered(HeaderStyle::ALL, json, &bucket, now, &mut before).1);
        assert!(answered(HeaderStyle::ALL, json, &bucket, now, &mut before).1);
        let unbucketed = [LimitReport::new(
            "apj",
            &six,
            Algorithm::Gcra,
            denied(1_200),
        )];
        assert!(!answered(HeaderStyle::ALL, json, &unbucketed, now, &mut before).1);
        // X-RateLimit-Reset-After, in milliseconds, when the style writes
        // it; the other styles show the same second.
        let a_ms_later = [LimitReport::new(
            "apj",
            &six,
            Algorithm::Gcra,
            denied_for(901, 1_200),
        )];
        assert!(!answered(HeaderStyle::ALL, json, &a_ms_later, now, &mut before).1);
        assert!(!answered(style, json, &longer, now, &mut before).1);
        assert!(answered(style, json, &a_ms_later, now, &mut before).1);

        // The client's format, and a gRPC client.
        let problem = Answer::Http(Format::Problem);
        let (answer, reused) = answered(style, problem, &longer, now, &mut before);
        assert!(!reused);
        assert_eq!(answer.headers()["content-type"], "application/problem+json");
        assert!(answered(style, problem, &longer, now, &mut before).1);
        let (grpc, _) = answered(style, Answer::Grpc, &longer, now, &mut before);
        assert_eq!(grpc.headers()["grpc-status"], "8");

        // Another limit beside it, and which one is reported.
        let allowed = Decision::allow(6, 3, Duration::from_millis(900));
        let two = [
            LimitReport::new("apj", &six, Algorithm::Gcra, denied(1_200)),
            LimitReport::new("all", &five, Algorithm::Gcra, allowed),
        ];
        assert!(!answered(style, json, &two, now, &mut before).1);
        assert!(answered(style, json, &two, now, &mut before).1);
        let both = [
            LimitReport::new("apj", &six, Algorithm::Gcra, denied(1_200)),
            LimitReport::new("all", &five, Algorithm::Gcra, denied(2_500)),
        ];
        let (answer, reused) = answered(style, json, &both, now, &mut before);
        assert!(!reused);
        assert_eq!(answer.headers()["ratelimit"], r#""all";r=0;t=3"#);
    }
}
