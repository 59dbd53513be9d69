//! tollgate-policy's integration tests: config files in both formats, the
//! enforcer's semantics, and envoyproxy/ratelimit's own config fixtures.

mod config;
mod enforcer;
mod envoy;
mod shed;
