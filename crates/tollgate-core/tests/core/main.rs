//! tollgate-core's integration tests: properties every algorithm is held to,
//! and hand-written scenarios over a manual clock.

mod proptests;
mod scenarios;
