//! Tollgate's simulator: replays request traces through every rate limiting
//! algorithm and measures how far each one strays from the exact sliding log.
//!
//! A [`Trace`] is a time-ordered list of requests, each a timestamp in
//! nanoseconds, a key and a cost. It is read from text (one request per line,
//! `<timestamp_ns> <key> [cost]`) with [`Trace::parse`], or made by a
//! [`Generator`] (Poisson, bursty on/off, a boundary attack on fixed windows, or
//! many keys with a heavy-tailed popularity).
//!
//! A [`Simulation`] replays the trace with a simulated clock: every key has its
//! own state, and each request is stepped through the algorithm at its own
//! timestamp. The exact sliding window log ([`Algorithm::SlidingLog`]) is run on
//! the same trace, on its own, as the reference; every other algorithm's
//! decisions are compared with it request by request, which gives the false
//! admits and false denies of a [`Report`]. [`draw_chart`] draws the admitted
//! rate over time of several replays as an SVG.
//!
//! [`simulate_fleet`] replays a trace over N instances that enforce one
//! global quota together, in each [`Mode`] (one shared store, the Rate Limit
//! Quota Service, hybrid leases, the fallback, the deny cache, local
//! limits), with the library's own parts on the simulated clock.
//!
//! ```
//! use std::time::Duration;
//! use tollgate_core::{Algorithm, Quota};
//! use tollgate_sim::{Simulation, Trace};
//!
//! let text = "0 alice\n1 alice\n2 alice\n1000000000 alice\n";
//! let trace = Trace::parse(text.as_bytes())?;
//! let quota = Quota::new(2, Duration::from_secs(1))?;
//! let sim = Simulation::new(&trace, quota);
//! let report = sim.run(Algorithm::FixedWindow).report;
//! assert_eq!((report.admitted, report.denied), (3, 1));
//! assert_eq!(report.false_admits + report.false_denies, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Algorithm::SlidingLog`]: tollgate_core::Algorithm::SlidingLog

mod chart;
mod fleet;
mod generate;
mod replay;
mod report;
mod trace;

pub use chart::{ChartError, draw_chart};
pub use fleet::{
    FleetError, FleetReport, Mode, ParseNameError, Split, Timing, format_fleet_table, outage,
    simulate_fleet,
};
pub use generate::{GenerateError, Generator, ParseWorkloadError, Workload};
pub use replay::{Replay, Simulation, Timeline};
pub use report::{Report, format_table};
pub use trace::{KeyId, PushError, Request, Trace, TraceError};
