//! Where Tollgate's limits keep their state, and the parts a store is built
//! of.
//!
//! Every backend implements [`tollgate_core::Store`]: one asynchronous call
//! checks all the limits of one request, all-or-nothing, with the algorithm's
//! parameters carried as data in each [`tollgate_core::Limit`].
//!
//! This crate holds the in-process backend, [`MemoryStore`]: a sharded map with
//! one small table per kind of algorithm state, entries that expire once their
//! state is back to full, and a hard cap on the number of keys, so a flood of
//! unique keys cannot exhaust memory. It needs no async runtime. A few GCRA
//! and shaping keys per shard sit in hot slots that a check of that one limit
//! updates with a single compare-and-swap, without the shard's lock, so that
//! threads checking one hot key do not queue on it.
//!
//! And the wrappers, each a `Store` over any `Store`, composed as a stack:
//!
//! ```text
//! DenyCache → Fallback (timeout, breaker, failure policies, local store) → Hybrid → backend
//! ```
//!
//! - [`DenyCache`] answers keys the store below just denied, until their
//!   `retry_after` passes, without asking it.
//! - [`Fallback`] decides by each limit's failure policy when the store below
//!   errs or is slow, and a circuit breaker probing in the background keeps
//!   checks away from it while it is down.
//! - [`Hybrid`] leases slices of hot keys' budgets from the store below and
//!   spends them locally, with a documented worst-case overshoot.
//!
//! The `conformance` feature adds the `conformance` module: the scenarios
//! every store and wrapper must pass.

mod breaker;
mod clock;
mod decision;
mod deny_cache;
mod fallback;
mod hot;
mod hybrid;
mod memory;
mod shard;
mod table;

pub use breaker::BreakerState;
pub use clock::FastClock;
pub use deny_cache::{DenyCache, DenyCacheStats};
pub use fallback::{Fallback, FallbackConfig, FallbackStats};
pub use hybrid::{Hybrid, HybridConfig, HybridStats, hybrid_leases};
pub use memory::MemoryStats;
pub use memory::{MemoryConfig, MemoryStore};

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
