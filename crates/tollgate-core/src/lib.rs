//! Tollgate's core: every rate limiting algorithm as a pure state machine.
//!
//! A step is a function of `(quota, previous state, now, cost)` that returns a
//! [`Decision`] and updates the state in place only when the request is admitted,
//! so a deny consumes nothing (save envoyproxy/ratelimit's [`HitCounter`], which
//! counts every hit). Algorithms never read a clock: `now` is an integer
//! count of nanoseconds handed in by the caller, usually from a [`Clock`]. All
//! arithmetic is on integers and saturates or is checked; there is no floating
//! point in any state, so long-running keys do not drift.
//!
//! [`Algorithm`] names an algorithm as plain data, so the same check can cross a
//! network (the Redis store runs the same steps as Lua scripts). The [`Store`]
//! trait is the interface every backend (memory, Redis, hybrid) implements: one
//! asynchronous call checks all the limits of one request, all-or-nothing.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Gcra, Quota, StateMachine};
//!
//! let quota = Quota::per_second(10)?.with_burst(2)?;
//! let mut tat = Default::default();
//! assert!(Gcra.step(&quota, &mut tat, 0, 1).allowed());
//! assert!(Gcra.step(&quota, &mut tat, 0, 1).allowed());
//! let denied = Gcra.step(&quota, &mut tat, 0, 1);
//! assert!(!denied.allowed());
//! assert_eq!(denied.retry_after(), Some(Duration::from_millis(100)));
//! # Ok::<(), tollgate_core::QuotaError>(())
//! ```

mod adaptive;
mod algorithm;
mod clock;
mod concurrency;
mod decision;
mod duration;
mod fixed_window;
mod gcra;
mod leaky_bucket;
mod meter;
mod quota;
mod shed;
mod sliding_counter;
mod sliding_log;
mod store;
mod token_bucket;

pub use adaptive::{Gradient, GradientConfig, GradientError};
pub use algorithm::{Algorithm, ParseAlgorithmError, StateMachine, Visitor};
pub use clock::{Clock, IntoNanos, ManualClock, MonotonicClock, Nanos, SystemClock};
pub use concurrency::{Concurrency, Leases};
pub use decision::{Decision, most_restrictive};
pub use duration::{ParseDurationError, format_duration, parse_duration};
pub use fixed_window::{FixedWindow, HitCounter, WindowCount};
pub use gcra::{Gcra, Tat};
pub use leaky_bucket::{LeakyBucket, LeakyBucketShaping, Level};
pub use quota::{Quota, QuotaError};
pub use shed::{Thresholds, ThresholdsError, Tier, Utilization, UtilizationError};
pub use sliding_counter::{SlidingCounter, WindowPair};
pub use sliding_log::{Log, SlidingLog};
pub use store::{
    FailurePolicy, Holder, InvalidLeaseId, Lease, LeaseId, LeaseStore, Leased, Limit, Outcome,
    Stamped, Store, StoreError, at_first_poll,
};
pub use token_bucket::{TokenBucket, Tokens};
