//! Tollgate's Redis module: rate limiting steps as native Redis commands.
//!
//! Load it with `redis-server --loadmodule libtollgate_redis_module.so` (or
//! `MODULE LOAD`). It adds:
//!
//! - `CL.THROTTLE`, redis-cell 0.5.0's command with its arguments, answers,
//!   errors and state, so that redis-cell's users swap modules and keep
//!   their code and their keys;
//! - `TOLLGATE.GCRA`, `TOLLGATE.TOKENBUCKET` and `TOLLGATE.LEAKYBUCKET`
//!   (policing), a step of a bucket on the state tollgate-redis's Lua code
//!   keeps, so that instances using the code and the module agree on a key;
//! - `TOLLGATE.CHECK`, the Lua code's entry point natively: the same keys,
//!   arguments and reply, for every algorithm (the sliding log's and
//!   concurrency's sorted sets too), the code's lease release, and hybrid
//!   instances' leasing checks and give backs on their lease records.
//!
//! Error messages are ASCII, arguments in them escaped (`\xc3\xa9`): the
//! binding sends an error's characters as single bytes, which mangles any
//! other character.
//!
//! Each command's arithmetic is a pure function over the stored values and
//! the time (`cell`, `bucket`, `step`, `sets`, `request`: tested without
//! Redis);
//! `commands` only reads and writes keys and reads the clock, Redis's own,
//! at the edge.

mod bucket;
mod cell;
mod leases;
#[cfg(test)]
mod mem;
#[cfg(not(test))]
mod raw_key;
#[cfg(not(test))]
mod replicated;
mod request;
mod sets;
mod step;
// Not in the unit tests' binary: it sets Redis's allocator as the global
// one, which exists only inside a server.
#[cfg(not(test))]
mod commands;
