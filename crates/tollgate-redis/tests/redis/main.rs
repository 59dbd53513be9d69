//! The Redis store against real servers: a `redis-server` and a 3-master Redis
//! Cluster that the tests start on loopback ports (see `support`). Redis must be
//! installed (`./scripts/test` installs it); a missing one fails, never skips.

mod cancelled_leases;
mod cells;
mod cluster;
mod counting;
mod crashed_leases;
mod each;
mod faults;
mod hybrid;
mod native;
mod node_failover;
mod reliability;
mod single;
mod slow_leases;
mod sparse;
mod stack;
mod support;
mod tls;
mod ttl_once;
