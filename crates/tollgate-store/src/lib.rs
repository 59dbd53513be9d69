//! Where Tollgate's limits keep their state.
//!
//! Every backend implements [`tollgate_core::Store`]: one asynchronous call
//! checks all the limits of one request, all-or-nothing, with the algorithm's
//! parameters carried as data in each [`tollgate_core::Limit`].
//!
//! This crate holds the in-process backend, [`MemoryStore`]: a sharded map with
//! one small table per kind of algorithm state, entries that expire once their
//! state is back to full, and a hard cap on the number of keys, so a flood of
//! unique keys cannot exhaust memory.

mod clock;
mod memory;
mod shard;

pub use clock::FastClock;
pub use memory::MemoryStats;
pub use memory::{MemoryConfig, MemoryStore};
