//! Reading what a response says about the rate limit.

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use http::header::RETRY_AFTER;

/// What a response's rate limit headers say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RateLimitInfo {
    /// Units left: `RateLimit`'s `r`, else `X-RateLimit-Remaining`.
    pub remaining: Option<u64>,
    /// Time until the limit is available again: `X-RateLimit-Reset-After`
    /// (to the millisecond), else `RateLimit`'s `t`, else `X-RateLimit-Reset`.
    pub reset_after: Option<Duration>,
    /// The shared bucket the request's route spends (`X-RateLimit-Bucket`).
    pub bucket: Option<String>,
    /// `Retry-After`, delta-seconds or HTTP-date.
    pub retry_after: Option<Duration>,
}

impl RateLimitInfo {
    /// Reads `headers`, with `wall` the current wall-clock time (for dates and
    /// epoch resets). Malformed values are ignored, as the draft requires.
    pub fn from_headers(headers: &HeaderMap, wall: SystemTime) -> Self {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let draft = headers
            .get_all("ratelimit")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(parse_ratelimit);
        let remaining = draft
            .map(|(r, _)| r)
            .or_else(|| text("x-ratelimit-remaining").and_then(|v| v.trim().parse().ok()));
        let reset_after = text("x-ratelimit-reset-after")
            .and_then(seconds)
            .or(draft.and_then(|(_, t)| t))
            .or_else(|| text("x-ratelimit-reset").and_then(|v| reset(v, wall)));
        Self {
            remaining,
            reset_after,
            bucket: text("x-ratelimit-bucket").map(str::to_owned),
            retry_after: headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, wall)),
        }
    }
}

/// `Retry-After`: delta-seconds (decimals accepted, rounded up to the
/// millisecond) or an HTTP-date, which counts from `wall` (a date in the past
/// is zero). `None` for anything else.
pub fn parse_retry_after(value: &str, wall: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Some(delay) = seconds(value) {
        return Some(delay);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(wall).unwrap_or(Duration::ZERO))
}

/// Non-negative seconds, possibly with decimals, rounded up to the millisecond.
fn seconds(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let value: f64 = text.parse().ok()?;
    // Beyond a year is as good as never; it also keeps the conversion exact.
    let millis = (value * 1000.0).ceil().min(365.0 * 86_400_000.0);
    Some(Duration::from_millis(millis as u64))
}

/// `X-RateLimit-Reset`: epoch seconds (GitHub, Stripe) when it looks like a
/// date (after 2001), else seconds from now (some APIs send that).
fn reset(text: &str, wall: SystemTime) -> Option<Duration> {
    let value: u64 = text.trim().parse().ok()?;
    if value < 1_000_000_000 {
        return Some(Duration::from_secs(value));
    }
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(value);
    Some(at.duration_since(wall).unwrap_or(Duration::ZERO))
}

/// The draft's `RateLimit` field: a list of `"policy";r=R;t=T` items. With
/// several, the one that allows the slowest pace: none left and the longest
/// wait first, else the longest time per remaining unit.
fn parse_ratelimit(value: &str) -> Option<(u64, Option<Duration>)> {
    let list: sfv::List = sfv::Parser::new(value).parse().ok()?;
    let mut best: Option<(u64, Option<Duration>)> = None;
    for entry in list {
        let sfv::ListEntry::Item(item) = entry else {
            continue;
        };
        let number = |key: &str| {
            item.params
                .get(key)
                .and_then(sfv::BareItem::as_integer)
                .and_then(|i| u64::try_from(i64::from(i)).ok())
        };
        let Some(r) = number("r") else {
            continue;
        };
        let t = number("t").map(Duration::from_secs);
        let pace = |(r, t): (u64, Option<Duration>)| {
            let t = t.unwrap_or_default().as_secs_f64();
            if r == 0 {
                f64::INFINITY + t
            } else {
                t / r as f64
            }
        };
        let candidate = (r, t);
        let slower = match best {
            None => true,
            Some(b) if r == 0 && b.0 == 0 => t > b.1,
            Some(b) => pace(candidate) > pace(b),
        };
        if slower {
            best = Some(candidate);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    const WALL: u64 = 1_700_000_000;

    fn wall() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(WALL)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn retry_after_in_both_forms() {
        assert_eq!(
            parse_retry_after("120", wall()),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", wall()), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("1.5", wall()),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after("0.0001", wall()),
            Some(Duration::from_millis(1))
        );
        let later = httpdate::fmt_http_date(wall() + Duration::from_secs(90));
        assert_eq!(
            parse_retry_after(&later, wall()),
            Some(Duration::from_secs(90))
        );
        let earlier = httpdate::fmt_http_date(wall() - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&earlier, wall()), Some(Duration::ZERO));
        for garbage in ["", "-1", "soon", "1e3", "12 s", "Fri, 99 Foo 2023"] {
            assert_eq!(parse_retry_after(garbage, wall()), None, "{garbage:?}");
        }
        assert_eq!(
            parse_retry_after("99999999999999999999", wall()),
            Some(Duration::from_secs(365 * 86_400))
        );
    }

    #[test]
    fn reads_the_draft_and_the_x_headers() {
        let draft = RateLimitInfo::from_headers(
            &headers(&[("ratelimit", r#""default";r=50;t=30"#)]),
            wall(),
        );
        assert_eq!(draft.remaining, Some(50));
        assert_eq!(draft.reset_after, Some(Duration::from_secs(30)));

        let github = RateLimitInfo::from_headers(
            &headers(&[
                ("x-ratelimit-remaining", "7"),
                ("x-ratelimit-reset", &(WALL + 42).to_string()),
            ]),
            wall(),
        );
        assert_eq!(github.remaining, Some(7));
        assert_eq!(github.reset_after, Some(Duration::from_secs(42)));

        let discord = RateLimitInfo::from_headers(
            &headers(&[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset-after", "64.57"),
                ("x-ratelimit-bucket", "abcd1234"),
                ("retry-after", "65"),
            ]),
            wall(),
        );
        assert_eq!(discord.remaining, Some(0));
        assert_eq!(discord.reset_after, Some(Duration::from_millis(64_570)));
        assert_eq!(discord.bucket.as_deref(), Some("abcd1234"));
        assert_eq!(discord.retry_after, Some(Duration::from_secs(65)));

        // Both: the draft's count, the finer reset.
        let both = RateLimitInfo::from_headers(
            &headers(&[
                ("ratelimit", r#""per-ip";r=3;t=2"#),
                ("x-ratelimit-remaining", "3"),
                ("x-ratelimit-reset-after", "1.250"),
            ]),
            wall(),
        );
        assert_eq!(both.remaining, Some(3));
        assert_eq!(both.reset_after, Some(Duration::from_millis(1250)));

        // Several policies: the slowest pace wins; malformed fields are ignored.
        let several = RateLimitInfo::from_headers(
            &headers(&[("ratelimit", r#""burst";r=90;t=10, "daily";r=5;t=3600"#)]),
            wall(),
        );
        assert_eq!(several.remaining, Some(5));
        let exhausted = RateLimitInfo::from_headers(
            &headers(&[("ratelimit", r#""a";r=0;t=3, "b";r=0;t=9, "c";r=1;t=1000"#)]),
            wall(),
        );
        assert_eq!(
            (exhausted.remaining, exhausted.reset_after),
            (Some(0), Some(Duration::from_secs(9)))
        );
        let malformed = RateLimitInfo::from_headers(
            &headers(&[("ratelimit", "r=5;;t="), ("x-ratelimit-remaining", "many")]),
            wall(),
        );
        assert_eq!(malformed, RateLimitInfo::default());
    }
}
