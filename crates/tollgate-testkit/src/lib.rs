//! The real parts Tollgate's tests and benchmarks run against, in one place:
//! `redis-server` processes and 3-master Redis Clusters on free loopback
//! ports ([`RedisServer`], [`RedisCluster`]), test certificate authorities
//! ([`pki`]), and the small waits and ports they need ([`free_port`],
//! [`wait_until`]).
//!
//! A dev-dependency only: nothing here is part of a product crate. No mocks:
//! a missing `redis-server` fails the test with a message saying how to
//! install it (`./scripts/test` does).

mod net;
pub mod pki;
mod redis;

pub use net::{free_port, wait_until};
pub use redis::{RedisCluster, RedisServer, cli};
