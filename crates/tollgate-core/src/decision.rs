use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use crate::clock::IntoNanos;

/// The answer to "should this request proceed?", the same for every algorithm.
///
/// A deny is a value, not an error: it carries the numbers a caller needs to tell
/// the client when to come back.
///
/// Only [`allowed`](Self::allowed) is a plain read. The other details are kept
/// in the form the algorithm had them in and worked out when read (the units
/// left are a division by the emission interval for the bucket algorithms), so
/// that a caller that only asks "yes or no?" does not pay for them. Two
/// decisions are equal when every detail reads the same.
#[derive(Clone, Copy)]
pub struct Decision {
    allowed: bool,
    limit: u64,
    /// What is left, in units of `per_unit`: `remaining` is `room / per_unit`.
    room: u64,
    per_unit: NonZeroU64,
    reset_after_ns: u64,
    retry_after_ns: Option<u64>,
    delay_ns: u64,
}

impl Decision {
    /// An admission: `limit` units at most, `remaining` of them still free after
    /// this one, the limit whole again after `reset_after`.
    pub fn allow(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Self::allow_ns(limit, remaining, reset_after.into_nanos())
    }

    /// A denial: as [`allow`](Self::allow), and the earliest time after which
    /// the same request would be admitted, `None` when waiting cannot help.
    pub fn deny(
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        retry_after: Option<Duration>,
    ) -> Self {
        Self::deny_ns(
            limit,
            remaining,
            reset_after.into_nanos(),
            retry_after.map(IntoNanos::into_nanos),
        )
    }

    /// This decision with `remaining` units left.
    pub fn with_remaining(self, remaining: u64) -> Self {
        Self {
            room: remaining,
            per_unit: NonZeroU64::MIN,
            ..self
        }
    }

    /// This decision with the limit whole again after `reset_after`.
    pub fn with_reset_after(self, reset_after: Duration) -> Self {
        Self {
            reset_after_ns: reset_after.into_nanos(),
            ..self
        }
    }

    /// This decision with a retry after `retry_after` (meaningful on a deny).
    pub fn with_retry_after(self, retry_after: Option<Duration>) -> Self {
        Self {
            retry_after_ns: retry_after.map(IntoNanos::into_nanos),
            ..self
        }
    }

    /// This decision holding the request for `delay` before it is forwarded.
    pub fn with_delay(self, delay: Duration) -> Self {
        Self {
            delay_ns: delay.into_nanos(),
            ..self
        }
    }

    /// [`allow`](Self::allow) in nanoseconds.
    #[inline]
    pub(crate) fn allow_ns(limit: u64, remaining: u64, reset_after_ns: u64) -> Self {
        Self::metered(
            true,
            limit,
            remaining,
            NonZeroU64::MIN,
            reset_after_ns,
            None,
        )
    }

    /// [`deny`](Self::deny) in nanoseconds.
    #[inline]
    pub(crate) fn deny_ns(
        limit: u64,
        remaining: u64,
        reset_after_ns: u64,
        retry_after_ns: Option<u64>,
    ) -> Self {
        Self::metered(
            false,
            limit,
            remaining,
            NonZeroU64::MIN,
            reset_after_ns,
            retry_after_ns,
        )
    }

    /// A decision whose units left are `room / per_unit`, divided when read.
    #[inline]
    pub(crate) fn metered(
        allowed: bool,
        limit: u64,
        room: u64,
        per_unit: NonZeroU64,
        reset_after_ns: u64,
        retry_after_ns: Option<u64>,
    ) -> Self {
        Self {
            allowed,
            limit,
            room,
            per_unit,
            reset_after_ns,
            retry_after_ns,
            delay_ns: 0,
        }
    }

    /// This decision holding the request `delay_ns` nanoseconds.
    #[inline]
    pub(crate) fn delayed_ns(self, delay_ns: u64) -> Self {
        Self { delay_ns, ..self }
    }

    /// Whether the request may proceed.
    #[inline]
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The most units one key can be admitted at once: the burst for bucket
    /// algorithms, the limit for window algorithms and the concurrency limiter.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units that could still be admitted right now, after this decision.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.room / self.per_unit
    }

    /// Time until the limit is fully available again (zero when it already is).
    #[inline]
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }

    /// On a deny, the earliest time after which the same request would be
    /// admitted if nothing else happened; `None` when it never can be (the cost
    /// exceeds the capacity) or, for the concurrency limiter, when it depends on
    /// other requests finishing. Always `None` on an allow.
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ns.map(Duration::from_nanos)
    }

    /// For the shaping leaky bucket: how long to hold the request before
    /// forwarding it. Zero for every other algorithm.
    #[inline]
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns)
    }

    /// Every detail as read, for comparing and printing.
    fn details(&self) -> (bool, u64, u64, u64, Option<u64>, u64) {
        (
            self.allowed,
            self.limit,
            self.remaining(),
            self.reset_after_ns,
            self.retry_after_ns,
            self.delay_ns,
        )
    }
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.details() == other.details()
    }
}

impl Eq for Decision {}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining())
            .field("reset_after", &self.reset_after())
            .field("retry_after", &self.retry_after())
            .field("delay", &self.delay())
            .finish()
    }
}

/// Which of several limits' decisions a client is told about: on a deny,
/// the denying one that asks the client to wait longest (one that can never
/// pass outranks any finite wait); on an allow, the one with the fewest units
/// left, then the latest reset. `decision` reads each item's decision, so
/// that callers pick among their own records (descriptors, header reports)
/// without copying the decisions out. `None` when there are no items.
pub fn most_restrictive<I>(items: I, decision: impl Fn(&I::Item) -> &Decision) -> Option<I::Item>
where
    I: IntoIterator,
    I::IntoIter: Clone,
{
    let items = items.into_iter();
    if items.clone().all(|item| decision(&item).allowed()) {
        items.min_by_key(|item| {
            let d = decision(item);
            (d.remaining(), std::cmp::Reverse(d.reset_after()))
        })
    } else {
        items
            .filter(|item| !decision(item).allowed())
            .max_by_key(|item| {
                decision(item)
                    .retry_after()
                    .map_or((1, Duration::ZERO), |r| (0, r))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_left_are_divided_when_read_and_compare_as_read() {
        let per_unit = NonZeroU64::new(100).unwrap();
        let lazy = Decision::metered(true, 10, 799, per_unit, 50, None);
        assert_eq!(lazy.remaining(), 7);
        assert_eq!(lazy, Decision::allow(10, 7, Duration::from_nanos(50)));
        assert_ne!(lazy, Decision::allow(10, 8, Duration::from_nanos(50)));
        assert_eq!(lazy.with_remaining(3).remaining(), 3);
        assert!(format!("{lazy:?}").contains("remaining: 7"));
    }

    #[test]
    fn durations_past_u64_nanoseconds_saturate() {
        let d = Decision::deny(1, 0, Duration::MAX, Some(Duration::MAX));
        assert_eq!(d.reset_after(), Duration::from_nanos(u64::MAX));
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
    }
}
