//! The mechanism shared by the token bucket, GCRA and both leaky buckets.
//!
//! Each of them reduces its state, at `now`, to `used`: how much of the capacity
//! is taken, measured as the nanoseconds it needs to drain (one unit drains in
//! one emission interval). They differ in what they store, not in how they decide.

use crate::{Decision, Quota};

/// The outcome of metering: the decision and, on an admission with a cost, the
/// new `used` to store.
pub(crate) struct Metered {
    pub(crate) decision: Decision,
    pub(crate) used: Option<u64>,
}

pub(crate) fn meter(quota: &Quota, used: u64, cost: u64) -> Metered {
    let t = quota.emission_ns();
    let capacity = quota.capacity_ns();
    let limit = quota.burst();
    // Fits: cost <= burst and burst * t was checked when the quota was built.
    let need = match cost.checked_mul(t).filter(|_| cost <= limit) {
        Some(need) => need,
        None => {
            let remaining = capacity.saturating_sub(used) / t;
            return Metered {
                decision: Decision::deny(limit, remaining, used, None),
                used: None,
            };
        }
    };
    let after = used.saturating_add(need);
    if after <= capacity {
        Metered {
            decision: Decision::allow(limit, (capacity - after) / t, after),
            used: (cost > 0).then_some(after),
        }
    } else {
        // `used` drains one nanosecond per nanosecond, so exactly `after - capacity`
        // from now the same request fits, and one nanosecond earlier it does not.
        let remaining = capacity.saturating_sub(used) / t;
        Metered {
            decision: Decision::deny(limit, remaining, used, Some(after - capacity)),
            used: None,
        }
    }
}
