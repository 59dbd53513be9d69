//! tollgate-store's integration tests: the memory store's behaviour, its key
//! cap under floods, and its hot slots against a model. Time comes from a
//! manual clock.

mod flood;
mod hot_model;
mod memory;
