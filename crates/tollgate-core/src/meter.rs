//! The mechanism shared by the token bucket, GCRA and both leaky buckets.
//!
//! Each of them reduces its state, at `now`, to `used`: how much of the capacity
//! is taken, measured as the nanoseconds it needs to drain (one unit drains in
//! one emission interval). They differ in what they store, not in how they decide.

use crate::{Decision, Nanos, Quota};

/// The outcome of metering: the decision and, on an admission with a cost, the
/// new `used` to store.
pub(crate) struct Metered {
    pub(crate) decision: Decision,
    pub(crate) used: Option<u64>,
}

/// Decides `cost` units at `now` against a bucket with `used` nanoseconds taken.
///
/// The bucket is whole again at `now + used`, and that instant must exist:
/// GCRA and the shaper store it as their state, and a TAT saturated at
/// `u64::MAX` would lose the excess, so that at `now = u64::MAX` every request
/// passed. So an admission is refused, with no retry (waiting does not help:
/// `now + used` only moves forward), when it would drain after `u64::MAX` ns.
/// The token bucket and the policing leaky bucket apply the same rule, so that
/// all four buckets still decide alike within `burst × T` of the end of time.
#[inline]
pub(crate) fn meter(quota: &Quota, now: Nanos, used: u64, cost: u64) -> Metered {
    let per_unit = quota.emission();
    let t = per_unit.get();
    let capacity = quota.capacity_ns();
    let limit = quota.burst();
    // The most `used` may reach: the capacity, and no further than the end of time.
    let top = capacity.min(u64::MAX - now);
    let deny = |retry_after| Metered {
        decision: Decision::metered(
            false,
            limit,
            top.saturating_sub(used),
            per_unit,
            used,
            retry_after,
        ),
        used: None,
    };
    // Fits: cost <= burst and burst * t was checked when the quota was built.
    let Some(need) = cost.checked_mul(t).filter(|_| cost <= limit) else {
        return deny(None);
    };
    if used
        .checked_add(need)
        .is_none_or(|after| after > u64::MAX - now)
    {
        return deny(None);
    }
    // The request fits while `used <= capacity - need`. Comparing that way, not
    // `used + need <= capacity` with a saturating add, stays exact when the
    // capacity is u64::MAX (a saturated sum equal to the capacity admitted a
    // full bucket's worth on top of a full bucket).
    let room = capacity - need;
    if used <= room {
        let after = used + need;
        Metered {
            decision: Decision::metered(true, limit, top - after, per_unit, after, None),
            used: (cost > 0).then_some(after),
        }
    } else {
        // `used` drains one nanosecond per nanosecond, so exactly `used - room`
        // from now the same request fits, and one nanosecond earlier it does not.
        deny(Some(used - room))
    }
}
