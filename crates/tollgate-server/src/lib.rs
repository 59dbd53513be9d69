//! The Tollgate service as a library: what `tollgate serve` runs, assembled
//! by one function that the binary and tests share.
//!
//! [`serve::start`] takes the service's options (the same flags and
//! `TOLLGATE_*` variables as `tollgate serve`, see [`serve::Args`]),
//! listeners that are already bound, and the clock that everything reading
//! time is given; it builds the enforcer and its metrics observer, the store
//! stack, the gRPC Rate Limit Service with its health service, the HTTP API,
//! the gateway and the config reloader, and returns a [`serve::Running`]
//! handle with the bound addresses and a graceful shutdown. The `tollgate`
//! binary is a thin edge over it: it parses the command line, binds the
//! addresses given, starts the service on the wall clock and stops it on
//! SIGTERM or SIGINT.
//!
//! Tests start the service in process with listeners on `127.0.0.1:0` and a
//! [`TokioClock`], under `#[tokio::test(start_paused = true)]`: a shaped
//! request's delay and the reload watcher's interval then pass in virtual
//! time, with no test waiting on the wall clock.

mod clock;
pub mod serve;

pub use clock::TokioClock;
