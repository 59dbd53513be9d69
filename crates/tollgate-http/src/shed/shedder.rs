//! [`Shedder`]: the learned limit, the requests in flight and the tiers'
//! thresholds, shared by every clone of a [`Shed`](super::Shed) service.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::grpc;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use tollgate_core::{
    Clock, Gradient, GradientConfig, GradientError, MonotonicClock, Nanos, Thresholds,
    ThresholdsError, Tier,
};

/// What a [`Shedder`] is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShedConfig {
    /// The adaptive limit's controller.
    pub limit: GradientConfig,
    /// The utilization at which each tier is shed.
    pub thresholds: Thresholds,
    /// The header that names a request's tier (`x-priority` by default).
    pub priority_header: HeaderName,
    /// The `Retry-After` of a shed request's 503 (whole seconds, rounded up;
    /// 1 s by default).
    pub retry_after: Duration,
}

impl Default for ShedConfig {
    fn default() -> Self {
        Self {
            limit: GradientConfig::default(),
            thresholds: Thresholds::default(),
            priority_header: HeaderName::from_static("x-priority"),
            retry_after: Duration::from_secs(1),
        }
    }
}

/// A config that makes no shedder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShedConfigError {
    /// The controller's parameters are refused.
    #[error(transparent)]
    Limit(#[from] GradientError),
    /// A threshold outside 1–100 %, or a tier shed before a lower one.
    #[error(transparent)]
    Thresholds(#[from] ThresholdsError),
}

/// The state a [`Shed`](super::Shed) service decides with: the learned
/// limit, the requests in flight, and the sheds by tier. Cheap to read from
/// another thread ([`Shedder::snapshot`]) for metrics.
pub struct Shedder {
    config: ShedConfig,
    clock: Arc<dyn Clock>,
    controller: Mutex<Gradient>,
    /// The controller's limit, mirrored so that admitting takes no lock.
    limit: AtomicU32,
    in_flight: AtomicU32,
    shed: [AtomicU64; 3],
    retry_after: HeaderValue,
    body: Bytes,
}

impl fmt::Debug for Shedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shedder")
            .field("snapshot", &self.snapshot())
            .finish_non_exhaustive()
    }
}

/// What a [`Shedder`] shows at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The learned limit.
    pub limit: u32,
    /// Requests forwarded and not yet answered.
    pub in_flight: u32,
    /// Whether the limit is pinned to its floor while `min_rtt` is measured.
    pub probing: bool,
    /// Requests shed since start, by tier (in [`Tier::ALL`]'s order).
    pub shed: [u64; 3],
}

impl Snapshot {
    /// Requests in flight over the learned limit, in percent.
    pub fn utilization_percent(&self) -> u32 {
        utilization(self.in_flight, self.limit)
    }

    /// Requests of `tier` shed since start.
    pub fn shed(&self, tier: Tier) -> u64 {
        self.shed[tier.index()]
    }
}

/// A request let through: counts as in flight until it is dropped, and
/// gives its latency to the controller when [`InFlight::complete`]d.
#[must_use = "dropping it at once ends the request's time in flight"]
pub struct InFlight {
    shedder: Arc<Shedder>,
    started: Nanos,
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}

impl InFlight {
    /// The request was answered: its latency (from admission until now)
    /// becomes a sample. A request dropped without completing (its client
    /// left) leaves the in-flight count but gives no sample.
    pub fn complete(self) {
        let now = self.shedder.clock.now();
        let rtt = Duration::from_nanos(now.saturating_sub(self.started));
        let mut controller = self
            .shedder
            .controller
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        controller.sample(rtt, now);
        self.shedder
            .limit
            .store(controller.limit(), Ordering::Relaxed);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shedder.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request shed: the service is too full for its tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overloaded {
    /// The request's tier.
    pub tier: Tier,
}

impl Shedder {
    /// A shedder on the real (monotonic) clock.
    ///
    /// # Errors
    ///
    /// When the config makes no shedder.
    pub fn new(config: ShedConfig) -> Result<Self, ShedConfigError> {
        Self::with_clock(config, Arc::new(MonotonicClock::new()))
    }

    /// A shedder that reads `clock` for each request's latency.
    ///
    /// # Errors
    ///
    /// When the config makes no shedder.
    pub fn with_clock(config: ShedConfig, clock: Arc<dyn Clock>) -> Result<Self, ShedConfigError> {
        config.thresholds.validate()?;
        let controller = Gradient::new(config.limit, clock.now())?;
        let (seconds, body) = overloaded_body(config.retry_after);
        Ok(Self {
            limit: AtomicU32::new(controller.limit()),
            controller: Mutex::new(controller),
            in_flight: AtomicU32::new(0),
            shed: Default::default(),
            retry_after: HeaderValue::from(seconds),
            body,
            config,
            clock,
        })
    }

    /// The config it was made with.
    pub fn config(&self) -> &ShedConfig {
        &self.config
    }

    /// The tier `headers` name (see [`Tier::from_header`]).
    pub fn tier_of(&self, headers: &HeaderMap) -> Tier {
        headers
            .get(&self.config.priority_header)
            .map_or(Tier::Low, |value| Tier::from_header(value.as_bytes()))
    }

    /// Lets a request of `tier` in if that keeps the utilization within its
    /// tier's threshold, counting it in flight until the returned value is
    /// dropped.
    ///
    /// # Errors
    ///
    /// [`Overloaded`] when the request is shed (counted by tier).
    pub fn admit(self: &Arc<Self>, tier: Tier) -> Result<InFlight, Overloaded> {
        let thresholds = self.config.thresholds;
        let limit = self.limit.load(Ordering::Relaxed);
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                // Admitted only if it leaves the utilization within its
                // tier's threshold: at a limit of 3, low (at 50 %) may hold
                // 1 request, leaving the rest to the tiers above.
                let after = n.saturating_add(1);
                thresholds
                    .admits(tier, utilization(after, limit))
                    .then_some(after)
            });
        match admitted {
            Ok(before) => {
                let started = self.clock.now();
                if let Ok(mut controller) = self.controller.try_lock() {
                    // Best effort: a sample taken meanwhile holds the lock,
                    // and the peak only caps how far the limit may rise.
                    controller.admitted(before + 1);
                }
                Ok(InFlight {
                    shedder: Arc::clone(self),
                    started,
                })
            }
            Err(_) => {
                self.shed[tier.index()].fetch_add(1, Ordering::Relaxed);
                Err(Overloaded { tier })
            }
        }
    }

    /// The limit, the requests in flight and the sheds so far.
    pub fn snapshot(&self) -> Snapshot {
        let probing = self
            .controller
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .probing();
        Snapshot {
            limit: self.limit.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            probing,
            shed: self.shed.each_ref().map(|n| n.load(Ordering::Relaxed)),
        }
    }

    /// A shed request's answer, to a client that sent `headers`: `503` with
    /// `Retry-After` and a JSON body (Stripe answers load shedding with
    /// 503, not 429: the client is not over its own limit, the service is
    /// full); to a gRPC client, its equivalent, `UNAVAILABLE`
    /// ([`overloaded_grpc`]).
    pub fn response(&self, headers: &HeaderMap) -> Response<Bytes> {
        if grpc::is_grpc(headers) {
            overloaded_grpc(self.config.retry_after)
        } else {
            overloaded(self.body.clone(), self.retry_after.clone())
        }
    }
}

/// The body of a shed request's answer, and its `Retry-After` in whole
/// seconds (rounded up, at least 1): the same for every shedder, the
/// gateway's and the enforcer's.
pub(crate) fn overloaded_body(retry_after: Duration) -> (u64, Bytes) {
    let seconds = (retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).max(1);
    let body = serde_json::json!({
        "error": "overloaded",
        "message": format!("the service is overloaded and sheds this request's priority tier; retry in {seconds} s"),
        "retry_after": seconds,
    });
    (seconds, Bytes::from(body.to_string()))
}

/// A shed request's answer: `503` with `Retry-After` and `body`.
pub(crate) fn overloaded(body: Bytes, retry_after: HeaderValue) -> Response<Bytes> {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, retry_after);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A shed call's answer to a gRPC client: `UNAVAILABLE` (retryable, where
/// `RESOURCE_EXHAUSTED` is a limit's) in a trailers-only response, with
/// `Retry-After` and gRPC's retry pushback (`grpc-retry-pushback-ms`) so
/// a client's retry policy waits as long.
pub(crate) fn overloaded_grpc(retry_after: Duration) -> Response<Bytes> {
    let seconds = (retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0)).max(1);
    let mut headers = HeaderMap::new();
    headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    headers.insert(
        HeaderName::from_static("grpc-retry-pushback-ms"),
        HeaderValue::from(seconds.saturating_mul(1000)),
    );
    let message = format!(
        "the service is overloaded and sheds this call's priority tier; retry in {seconds} s"
    );
    grpc::trailers_only(headers, grpc::UNAVAILABLE, &message)
}

/// `in_flight` over `limit`, in percent, saturating.
fn utilization(in_flight: u32, limit: u32) -> u32 {
    let percent = u64::from(in_flight) * 100 / u64::from(limit.max(1));
    u32::try_from(percent).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use tollgate_core::ManualClock;

    use super::*;

    fn shedder(clock: &Arc<ManualClock>) -> Arc<Shedder> {
        let config = ShedConfig {
            limit: GradientConfig {
                floor: 4,
                probe_samples: 4,
                ..GradientConfig::default()
            },
            ..ShedConfig::default()
        };
        Arc::new(Shedder::with_clock(config, Arc::clone(clock) as Arc<dyn Clock>).unwrap())
    }

    #[test]
    fn the_lowest_tier_is_shed_first_and_critical_last() {
        let clock = Arc::new(ManualClock::new(0));
        let shedder = shedder(&clock);
        // Probing: the limit is the floor, 4. Low may fill 50 % (2 in
        // flight), high 75 % (3), critical 100 % (4).
        let held: Vec<InFlight> = (0..2).map(|_| shedder.admit(Tier::Low).unwrap()).collect();
        assert_eq!(
            shedder.admit(Tier::Low).unwrap_err(),
            Overloaded { tier: Tier::Low }
        );
        let high = shedder.admit(Tier::High).unwrap();
        assert!(shedder.admit(Tier::High).is_err());
        let critical = shedder.admit(Tier::Critical).unwrap();
        assert!(shedder.admit(Tier::Critical).is_err());
        let snapshot = shedder.snapshot();
        assert_eq!((snapshot.limit, snapshot.in_flight), (4, 4));
        assert_eq!(snapshot.utilization_percent(), 100);
        assert_eq!(
            Tier::ALL.map(|t| snapshot.shed(t)),
            [1, 1, 1],
            "one shed per tier"
        );
        drop(critical);
        assert!(shedder.admit(Tier::Low).is_err(), "75 % in flight");
        let again = shedder.admit(Tier::Critical).unwrap();
        drop((high, again));
        let low = shedder.admit(Tier::High).unwrap();
        drop((low, held));
        assert_eq!(shedder.snapshot().in_flight, 0);
    }

    #[test]
    fn completed_requests_teach_the_limit() {
        let clock = Arc::new(ManualClock::new(0));
        let shedder = shedder(&clock);
        for _ in 0..4 {
            let request = shedder.admit(Tier::Critical).unwrap();
            clock.advance(Duration::from_millis(10));
            request.complete();
        }
        let snapshot = shedder.snapshot();
        assert!(!snapshot.probing);
        assert_eq!(
            snapshot.limit, 16,
            "the probe is over: four times the floor"
        );
        assert_eq!(snapshot.in_flight, 0);
    }

    #[test]
    fn tiers_come_from_the_header_and_anything_else_is_low() {
        let shedder = Shedder::new(ShedConfig::default()).unwrap();
        let mut headers = HeaderMap::new();
        assert_eq!(shedder.tier_of(&headers), Tier::Low);
        headers.insert("x-priority", HeaderValue::from_static("HIGH"));
        assert_eq!(shedder.tier_of(&headers), Tier::High);
    }

    #[test]
    fn a_shed_request_gets_503_with_retry_after() {
        let config = ShedConfig {
            retry_after: Duration::from_millis(1_500),
            ..ShedConfig::default()
        };
        let response = Shedder::new(config).unwrap().response(&HeaderMap::new());
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(body["error"], "overloaded");
        assert_eq!(body["retry_after"], 2);
    }

    #[test]
    fn a_shed_grpc_call_gets_unavailable_not_resource_exhausted() {
        let config = ShedConfig {
            retry_after: Duration::from_millis(1_500),
            ..ShedConfig::default()
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        let response = Shedder::new(config).unwrap().response(&headers);
        assert_eq!(response.status(), StatusCode::OK, "trailers-only");
        let h = response.headers();
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
        assert_eq!(h["grpc-status"], "14", "UNAVAILABLE");
        assert_eq!(h[RETRY_AFTER], "2");
        assert_eq!(h["grpc-retry-pushback-ms"], "2000");
        assert!(
            h["grpc-message"].to_str().unwrap().contains("retry in 2 s"),
            "{h:?}"
        );
        assert!(response.body().is_empty());
    }

    #[test]
    fn thresholds_out_of_order_are_refused() {
        let thresholds = Thresholds {
            critical: 90,
            high: 100,
            low: 50,
        };
        let config = ShedConfig {
            thresholds,
            ..ShedConfig::default()
        };
        assert_eq!(
            Shedder::new(config).unwrap_err(),
            ShedConfigError::Thresholds(ThresholdsError(thresholds))
        );
    }
}
