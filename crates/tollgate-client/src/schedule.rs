//! The schedule: when to retry, when to send. Pure functions of the
//! responses seen, the time and a random number generator.

use std::collections::HashMap;
use std::time::Duration;

use http::StatusCode;
use rand::Rng;

use crate::{Error, RateLimitInfo};

/// How the client retries and paces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    /// Retries after the first attempt; after the last, [`Error::RetriesExhausted`].
    pub max_retries: u32,
    /// The first backoff's upper bound; each retry doubles it.
    pub base_delay: Duration,
    /// The largest backoff bound, however many retries.
    pub max_delay: Duration,
    /// The longest the client waits at once (for `Retry-After`, a reset, or a
    /// paced slot); a server asking for more gets [`Error::WaitTooLong`].
    pub max_wait: Duration,
    /// Whether to slow down before the limit is exhausted, from the
    /// responses' rate limit headers.
    pub pace: bool,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
            max_wait: Duration::from_secs(60),
            pace: true,
        }
    }
}

/// What to do after a response.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Hand the response to the caller.
    Done,
    /// Send the request again after this long.
    Retry(Duration),
}

impl RetryConfig {
    /// The upper bound of the backoff before retry number `retry` (0 for the
    /// first retry): `base_delay · 2^retry`, capped at `max_delay`.
    pub fn backoff_bound(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry).unwrap_or(u32::MAX);
        self.base_delay
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max_delay)
    }

    /// Full jitter: uniform in `[0, backoff_bound(retry)]`.
    pub fn backoff<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        jitter(self.backoff_bound(retry), rng)
    }

    /// Decides after a response with `status` and `info`, when `retries`
    /// retries were already made.
    ///
    /// Only `429 Too Many Requests` and `503 Service Unavailable` are retried.
    /// With `Retry-After`, the wait is that plus a jitter of up to
    /// `base_delay` (never earlier, and clients told the same second do not
    /// all come back at once); without it, a 429 that says the limit is
    /// exhausted waits for its reset (or the backoff, if longer: a reset of
    /// zero must not make a tight loop), and anything else backs off
    /// exponentially with full jitter.
    pub fn next<R: Rng + ?Sized>(
        &self,
        status: StatusCode,
        info: &RateLimitInfo,
        retries: u32,
        rng: &mut R,
    ) -> Result<Next, Error> {
        if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
            return Ok(Next::Done);
        }
        if retries >= self.max_retries {
            return Err(Error::RetriesExhausted {
                attempts: retries.saturating_add(1),
                status,
                retry_after: info.retry_after,
            });
        }
        let wait = match (info.retry_after, info.remaining, info.reset_after) {
            (Some(retry_after), ..) => retry_after.saturating_add(jitter(self.base_delay, rng)),
            (None, Some(0), Some(reset)) if status == StatusCode::TOO_MANY_REQUESTS => {
                reset.max(self.backoff(retries, rng))
            }
            _ => self.backoff(retries, rng),
        };
        if wait > self.max_wait {
            return Err(Error::WaitTooLong {
                wait,
                max: self.max_wait,
            });
        }
        Ok(Next::Retry(wait))
    }
}

fn jitter<R: Rng + ?Sized>(bound: Duration, rng: &mut R) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(0..=nanos))
}

/// What the client knows of one bucket (a shared bucket, or a route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    /// Requests it may still send before `reset_at`, counting reservations.
    remaining: u64,
    /// The earliest time the next request may go.
    next_at: Duration,
    /// The spacing that spreads `remaining` over the time to reset.
    interval: Duration,
    /// When the server said the limit is available again; past it, the
    /// bucket is unknown until the next response.
    reset_at: Duration,
}

/// Slows requests down before the limit is exhausted, per bucket.
///
/// A response that says `r` requests remain for `t` spreads them: the next
/// request of that bucket waits `t / r`, the one after another `t / r`, and
/// so on; with none left, requests wait for the reset. Routes are mapped to
/// buckets by `X-RateLimit-Bucket`, so every route of a shared bucket waits
/// once the bucket is exhausted through any of them.
#[derive(Debug, Default)]
pub struct Pacer {
    buckets: HashMap<String, Bucket>,
    routes: HashMap<String, String>,
}

impl Pacer {
    /// A pacer that knows nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn bucket_of<'a>(&'a self, route: &'a str) -> &'a str {
        self.routes.get(route).map_or(route, String::as_str)
    }

    /// Reserves the next slot for a request on `route` at `now`: how long to
    /// wait before sending it.
    pub fn acquire(&mut self, route: &str, now: Duration) -> Duration {
        let id = self.bucket_of(route).to_owned();
        let Some(bucket) = self.buckets.get_mut(&id) else {
            return Duration::ZERO;
        };
        if now >= bucket.reset_at {
            self.buckets.remove(&id);
            return Duration::ZERO;
        }
        if bucket.remaining == 0 {
            return bucket.reset_at - now;
        }
        let slot = bucket.next_at.max(now);
        bucket.remaining -= 1;
        bucket.next_at = slot.saturating_add(bucket.interval);
        slot - now
    }

    /// Learns from a response to a request on `route`, received at `now`.
    pub fn observe(&mut self, route: &str, info: &RateLimitInfo, now: Duration) {
        if let Some(bucket) = &info.bucket {
            self.routes.insert(route.to_owned(), bucket.clone());
        }
        let id = self.bucket_of(route).to_owned();
        // `Retry-After` says when this request could pass: the bucket is
        // closed until then, and unknown after.
        if let Some(retry_after) = info.retry_after {
            let reset_at = now.saturating_add(retry_after);
            self.buckets.insert(
                id,
                Bucket {
                    remaining: 0,
                    next_at: reset_at,
                    interval: Duration::ZERO,
                    reset_at,
                },
            );
            return;
        }
        let (Some(remaining), Some(reset_after)) = (info.remaining, info.reset_after) else {
            return;
        };
        let interval = match remaining {
            0 => reset_after,
            r => reset_after / u32::try_from(r).unwrap_or(u32::MAX),
        };
        self.buckets.insert(
            id,
            Bucket {
                remaining,
                next_at: now.saturating_add(interval),
                interval,
                reset_at: now.saturating_add(reset_after),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    fn limited(remaining: u64, reset_ms: u64) -> RateLimitInfo {
        RateLimitInfo {
            remaining: Some(remaining),
            reset_after: Some(MS * u32::try_from(reset_ms).unwrap()),
            ..RateLimitInfo::default()
        }
    }

    #[test]
    fn backoff_doubles_within_its_bound_up_to_the_cap() {
        let config = RetryConfig::default();
        let mut rng = rng();
        for retry in 0..40 {
            let bound = config.backoff_bound(retry);
            assert_eq!(
                bound,
                (config.base_delay * 2u32.saturating_pow(retry)).min(config.max_delay)
            );
            let samples: Vec<Duration> =
                (0..500).map(|_| config.backoff(retry, &mut rng)).collect();
            assert!(samples.iter().all(|d| *d <= bound), "retry {retry}");
            // Full jitter spreads over the whole range.
            let max = samples.iter().max().unwrap();
            let min = samples.iter().min().unwrap();
            assert!(*max > bound * 9 / 10 && *min < bound / 10, "retry {retry}");
        }
        assert_eq!(config.backoff_bound(0), Duration::from_millis(100));
        assert_eq!(config.backoff_bound(3), Duration::from_millis(800));
        assert_eq!(config.backoff_bound(200), config.max_delay);
    }

    #[test]
    fn never_retries_before_retry_after() {
        let config = RetryConfig::default();
        let info = RateLimitInfo {
            retry_after: Some(Duration::from_secs(5)),
            ..limited(0, 1_000)
        };
        let mut rng = rng();
        for _ in 0..1000 {
            let Ok(Next::Retry(wait)) =
                config.next(StatusCode::TOO_MANY_REQUESTS, &info, 0, &mut rng)
            else {
                panic!("a 429 is retried");
            };
            assert!(wait >= Duration::from_secs(5));
            assert!(wait <= Duration::from_secs(5) + config.base_delay);
        }
    }

    #[test]
    fn without_retry_after_a_429_waits_for_the_reset_or_backs_off() {
        let config = RetryConfig::default();
        let mut rng = rng();
        assert_eq!(
            config
                .next(
                    StatusCode::TOO_MANY_REQUESTS,
                    &limited(0, 1_500),
                    0,
                    &mut rng
                )
                .ok(),
            Some(Next::Retry(MS * 1_500))
        );
        for retries in 0..3 {
            let Ok(Next::Retry(wait)) = config.next(
                StatusCode::SERVICE_UNAVAILABLE,
                &RateLimitInfo::default(),
                retries,
                &mut rng,
            ) else {
                panic!("a 503 is retried");
            };
            assert!(wait <= config.backoff_bound(retries));
        }
        assert_eq!(
            config
                .next(StatusCode::OK, &limited(0, 1_500), 0, &mut rng)
                .ok(),
            Some(Next::Done)
        );
        assert_eq!(
            config
                .next(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &RateLimitInfo::default(),
                    0,
                    &mut rng
                )
                .ok(),
            Some(Next::Done),
            "only 429 and 503 are retried"
        );
    }

    #[test]
    fn retries_are_bounded_and_end_in_a_typed_error() {
        let config = RetryConfig {
            max_retries: 2,
            ..RetryConfig::default()
        };
        let info = RateLimitInfo {
            retry_after: Some(Duration::from_secs(1)),
            ..RateLimitInfo::default()
        };
        let mut rng = rng();
        assert!(matches!(
            config.next(StatusCode::TOO_MANY_REQUESTS, &info, 1, &mut rng),
            Ok(Next::Retry(_))
        ));
        match config.next(StatusCode::TOO_MANY_REQUESTS, &info, 2, &mut rng) {
            Err(Error::RetriesExhausted {
                attempts,
                status,
                retry_after,
            }) => {
                assert_eq!(attempts, 3);
                assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(retry_after, Some(Duration::from_secs(1)));
            }
            other => panic!("{other:?}"),
        }
        let too_long = RateLimitInfo {
            retry_after: Some(Duration::from_secs(3600)),
            ..RateLimitInfo::default()
        };
        assert!(matches!(
            config.next(StatusCode::TOO_MANY_REQUESTS, &too_long, 0, &mut rng),
            Err(Error::WaitTooLong { .. })
        ));
    }

    #[test]
    fn pacing_spreads_what_remains_and_waits_for_the_reset_at_zero() {
        let mut pacer = Pacer::new();
        let t0 = Duration::from_secs(100);
        assert_eq!(
            pacer.acquire("GET /a", t0),
            Duration::ZERO,
            "nothing known yet"
        );
        // 4 left for 2 s: one every 500 ms.
        pacer.observe("GET /a", &limited(4, 2_000), t0);
        let waits: Vec<Duration> = (0..5).map(|_| pacer.acquire("GET /a", t0)).collect();
        assert_eq!(
            waits,
            [MS * 500, MS * 1000, MS * 1500, MS * 2000, MS * 2000]
        );
        // Past the reset the bucket is unknown again.
        assert_eq!(pacer.acquire("GET /a", t0 + MS * 2000), Duration::ZERO);
        // None left: wait for the reset.
        pacer.observe("GET /a", &limited(0, 750), t0);
        assert_eq!(pacer.acquire("GET /a", t0 + MS * 250), MS * 500);
        // Retry-After closes the bucket until then.
        let retry = RateLimitInfo {
            retry_after: Some(Duration::from_secs(3)),
            ..limited(0, 60_000)
        };
        pacer.observe("GET /a", &retry, t0);
        assert_eq!(pacer.acquire("GET /a", t0), Duration::from_secs(3));
        assert_eq!(
            pacer.acquire("GET /a", t0 + Duration::from_secs(3)),
            Duration::ZERO
        );
    }

    #[test]
    fn routes_of_a_shared_bucket_wait_together() {
        let mut pacer = Pacer::new();
        let t0 = Duration::from_secs(1);
        let shared = |remaining| RateLimitInfo {
            bucket: Some("expensive".into()),
            ..limited(remaining, 10_000)
        };
        pacer.observe("GET /search", &shared(3), t0);
        pacer.observe("POST /export", &shared(0), t0 + MS);
        // The search route learned the bucket earlier; it waits for its reset too.
        assert_eq!(pacer.acquire("GET /search", t0 + MS), MS * 10_000);
        assert_eq!(pacer.acquire("POST /export", t0 + MS * 5_001), MS * 5_000);
        assert_eq!(
            pacer.acquire("GET /other", t0),
            Duration::ZERO,
            "another bucket"
        );
    }
}
