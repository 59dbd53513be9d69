use std::time::Duration;

/// The answer to "should this request proceed?", the same for every algorithm.
///
/// A deny is a value, not an error: it carries the numbers a caller needs to tell
/// the client when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// The most units one key can be admitted at once: the burst for bucket
    /// algorithms, the limit for window algorithms and the concurrency limiter.
    pub limit: u64,
    /// Units that could still be admitted right now, after this decision.
    pub remaining: u64,
    /// Time until the limit is fully available again (zero when it already is).
    pub reset_after: Duration,
    /// On a deny, the earliest time after which the same request would be
    /// admitted if nothing else happened; `None` when it never can be (the cost
    /// exceeds the capacity) or, for the concurrency limiter, when it depends on
    /// other requests finishing. Always `None` on an allow.
    pub retry_after: Option<Duration>,
    /// For the shaping leaky bucket: how long to hold the request before
    /// forwarding it. Zero for every other algorithm.
    pub delay: Duration,
}

impl Decision {
    pub(crate) fn allow(limit: u64, remaining: u64, reset_after_ns: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            reset_after: Duration::from_nanos(reset_after_ns),
            retry_after: None,
            delay: Duration::ZERO,
        }
    }

    pub(crate) fn deny(
        limit: u64,
        remaining: u64,
        reset_after_ns: u64,
        retry_after_ns: Option<u64>,
    ) -> Self {
        Self {
            allowed: false,
            limit,
            remaining,
            reset_after: Duration::from_nanos(reset_after_ns),
            retry_after: retry_after_ns.map(Duration::from_nanos),
            delay: Duration::ZERO,
        }
    }
}
