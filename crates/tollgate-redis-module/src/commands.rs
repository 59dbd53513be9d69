//! The commands as Redis runs them: read the key and the clock, decide with
//! the pure code of `cell` and `gcra`, write the key and reply.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

/// The time now in nanoseconds since 1970: the clock Redis's `TIME` reads.
fn clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The decimal integer a key holds, `None` when it is absent; WRONGTYPE for
/// a key of another type and an error for a string that is not a number,
/// so that a clash of names is reported rather than taken as no state.
fn stored_int(key: &RedisKeyWritable, name: &RedisString) -> Result<Option<u64>, RedisError> {
    match key.key_type() {
        KeyType::Empty => Ok(None),
        KeyType::String => {
            let dma = key.as_string_dma()?;
            std::str::from_utf8(&dma)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(|| {
                    RedisError::String(format!(
                        "ERR key {name} does not hold a rate limit's state (a decimal integer)"
                    ))
                })
        }
        _ => Err(RedisError::WrongType),
    }
}

/// Writes `value` with a TTL of `ttl` (whole milliseconds, rounded up, at
/// least one: never shorter than the state matters) and replicates the write
/// itself, with its absolute expiry, rather than the command: a replica's
/// clock would decide the command again differently.
///
/// The digits go into the string in place (`StringDMA`): a key this module
/// wrote is a raw string of as many digits, rewritten without an allocation
/// and read without the copy Redis makes to read a shared or embedded one.
fn write_int(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    value: u64,
    ttl: Duration,
    now_ns: u64,
) -> RedisResult {
    let ttl_ms = ttl.as_nanos().div_ceil(1_000_000).max(1);
    let ttl_ms = u64::try_from(ttl_ms).unwrap_or(u64::MAX);
    let mut digits = itoa::Buffer::new();
    let value = digits.format(value).as_bytes();
    key.as_string_dma()?.write(value)?;
    key.set_expire(Duration::from_millis(ttl_ms))?;
    let mut at = itoa::Buffer::new();
    let expire_at = at.format((now_ns / 1_000_000).saturating_add(ttl_ms));
    ctx.replicate(
        "SET",
        &[name.as_slice(), value, b"PXAT", expire_at.as_bytes()][..],
    );
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// The arguments after the key, as byte strings, on the stack: no command
/// takes more than `N`, and more are a usage error.
fn arg_slices<const N: usize>(args: &[RedisString]) -> Option<([&[u8]; N], usize)> {
    let rest = args.get(2..)?;
    if rest.len() > N {
        return None;
    }
    let mut out = [&[][..]; N];
    for (slot, arg) in out.iter_mut().zip(rest) {
        *slot = arg.as_slice();
    }
    Some((out, rest.len()))
}

fn cl_throttle(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let Some(name) = args.get(1) else {
        return Err(RedisError::Str(crate::cell::USAGE));
    };
    let (rest, n) = arg_slices::<4>(&args).ok_or(RedisError::Str(crate::cell::USAGE))?;
    let throttle = crate::cell::parse(&rest[..n]).map_err(RedisError::String)?;
    let key = ctx.open_key_writable(name);
    let now = clock_ns();
    let (answer, write) = throttle.decide(stored_int(&key, name)?, now);
    if let Some(w) = write {
        write_int(ctx, &key, name, w.tat_ns, w.ttl, now)?;
    }
    Ok(RedisValue::Array(
        answer
            .to_array()
            .into_iter()
            .map(RedisValue::Integer)
            .collect(),
    ))
}

fn tollgate_gcra(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let Some(name) = args.get(1) else {
        return Err(RedisError::Str(crate::gcra::USAGE));
    };
    let (rest, n) = arg_slices::<6>(&args).ok_or(RedisError::Str(crate::gcra::USAGE))?;
    let step = crate::gcra::parse(&rest[..n]).map_err(RedisError::String)?;
    let key = ctx.open_key_writable(name);
    let clock = clock_ns();
    let now_us = step.at(clock / 1000);
    let (answer, write) = step.decide(stored_int(&key, name)?, now_us);
    if let Some(w) = write {
        write_int(ctx, &key, name, w.tat_us, w.ttl, clock)?;
    }
    Ok(RedisValue::Array(
        answer.into_iter().map(RedisValue::Integer).collect(),
    ))
}

mod entry {
    // The binding's macros declare the module's `RedisModule_OnLoad` and each
    // command's handler, unmangled `extern "C"` functions, and the
    // allocator: unsafe by nature.
    #![allow(unsafe_code, missing_docs)]
    use std::ffi::{CString, c_int};

    use redis_module::{Context, RedisString, Status, raw};

    use super::{cl_throttle, tollgate_gcra};

    /// The argument that leaves `CL.THROTTLE` out, for a server that loads
    /// redis-cell too (two modules cannot register one command).
    const WITHOUT_CL_THROTTLE: &[u8] = b"without-cl-throttle";

    fn init(ctx: &Context, args: &[RedisString]) -> Status {
        for arg in args {
            if !arg.as_slice().eq_ignore_ascii_case(WITHOUT_CL_THROTTLE) {
                ctx.log_warning(&format!(
                    "tollgate: unknown module argument {arg} (the one argument taken is without-cl-throttle)"
                ));
                return Status::Err;
            }
        }
        if args.is_empty() && register_cl_throttle(ctx.get_raw()) != Status::Ok as c_int {
            return Status::Err;
        }
        Status::Ok
    }

    fn register_cl_throttle(ctx: *mut raw::RedisModuleCtx) -> c_int {
        redis_module::redis_command!(
            ctx,
            "cl.throttle",
            cl_throttle,
            "write deny-oom fast",
            1,
            1,
            1
        );
        Status::Ok as c_int
    }

    redis_module::redis_module! {
        name: "tollgate",
        version: 1,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [],
        init: init,
        commands: [
            ["tollgate.gcra", tollgate_gcra, "write deny-oom fast", 1, 1, 1],
        ],
    }
}
