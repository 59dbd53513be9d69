//! The commands as Redis runs them: read the key and the clock, decide with
//! the pure code of `cell` and `bucket`, write the key and reply.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

use crate::bucket::{Kind, State, decimal, parse};

/// The time now in nanoseconds since 1970: the clock Redis's `TIME` reads.
fn clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The string a key holds (`None` when there is none) to `decide` on;
/// WRONGTYPE for a key of another type. Read in place (`StringDMA`), not
/// copied.
fn with_stored<T>(
    key: &RedisKeyWritable,
    decide: impl FnOnce(Option<&[u8]>) -> Result<T, String>,
) -> Result<T, RedisError> {
    match key.key_type() {
        KeyType::Empty => decide(None),
        KeyType::String => decide(Some(&key.as_string_dma()?)),
        _ => return Err(RedisError::WrongType),
    }
    .map_err(RedisError::String)
}

/// Writes `value` with a TTL of `ttl` (whole milliseconds, rounded up, at
/// least one: never shorter than the state matters) and replicates the write
/// itself, with its absolute expiry, rather than the command: a replica's
/// clock would decide the command again differently.
///
/// The bytes go into the string in place (`StringDMA`): a key this module
/// wrote is a raw string of as many bytes, rewritten without an allocation
/// and read without the copy Redis makes to read a shared or embedded one.
fn write_state(
    ctx: &Context,
    key: &RedisKeyWritable,
    name: &RedisString,
    state: State,
    ttl: Duration,
    now_ns: u64,
) -> Result<(), RedisError> {
    let ttl_ms = ttl.as_nanos().div_ceil(1_000_000).max(1);
    let ttl_ms = u64::try_from(ttl_ms).unwrap_or(u64::MAX);
    let mut digits = itoa::Buffer::new();
    let value = match &state {
        State::Int(v) => digits.format(*v).as_bytes(),
        State::Packed { bytes, len } => &bytes[..*len],
    };
    key.as_string_dma()?.write(value)?;
    key.set_expire(Duration::from_millis(ttl_ms))?;
    let mut at = itoa::Buffer::new();
    let expire_at = at.format((now_ns / 1_000_000).saturating_add(ttl_ms));
    ctx.replicate(
        "SET",
        &[name.as_slice(), value, b"PXAT", expire_at.as_bytes()][..],
    );
    Ok(())
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

fn reply(answer: [i64; 5]) -> RedisResult {
    Ok(RedisValue::Array(
        answer.into_iter().map(RedisValue::Integer).collect(),
    ))
}

fn cl_throttle(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let usage = || RedisError::Str(crate::cell::USAGE);
    let name = args.get(1).ok_or_else(usage)?;
    let (rest, n) = arg_slices::<4>(&args).ok_or_else(usage)?;
    let throttle = crate::cell::parse(&rest[..n]).map_err(RedisError::String)?;
    let key = ctx.open_key_writable(name);
    let now = clock_ns();
    let (answer, write) = with_stored(&key, |v| {
        let tat = v
            .map(|v| {
                decimal(v).ok_or_else(|| {
                    format!(
                        "Cell error: key {} does not hold a TAT (a decimal integer)",
                        name.as_slice().escape_ascii()
                    )
                })
            })
            .transpose()?;
        Ok(throttle.decide(tat, now))
    })?;
    if let Some(w) = write {
        write_state(ctx, &key, name, State::Int(w.tat_ns), w.ttl, now)?;
    }
    reply(answer.to_array())
}

fn bucket(kind: Kind, ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let usage = || RedisError::Str(kind.usage());
    let name = args.get(1).ok_or_else(usage)?;
    let (rest, n) = arg_slices::<8>(&args).ok_or_else(usage)?;
    let step = parse(kind, &rest[..n]).map_err(RedisError::String)?;
    let key = ctx.open_key_writable(name);
    let clock = clock_ns();
    let now_us = step.at(clock / 1000);
    let (answer, write) = with_stored(&key, |v| step.decide(v, now_us))?;
    if let Some(w) = write {
        write_state(ctx, &key, name, w.state, w.ttl, clock)?;
    }
    reply(answer)
}

fn tollgate_gcra(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    bucket(Kind::Gcra, ctx, args)
}

fn tollgate_token_bucket(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    bucket(Kind::TokenBucket, ctx, args)
}

fn tollgate_leaky_bucket(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    bucket(Kind::LeakyBucket, ctx, args)
}

mod entry {
    // The binding's macros declare the module's `RedisModule_OnLoad` and each
    // command's handler, unmangled `extern "C"` functions, and the
    // allocator: unsafe by nature.
    #![allow(unsafe_code, missing_docs)]
    use std::ffi::{CString, c_int};

    use redis_module::{Context, RedisString, Status, raw};

    use super::{cl_throttle, tollgate_gcra, tollgate_leaky_bucket, tollgate_token_bucket};

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
            ["tollgate.tokenbucket", tollgate_token_bucket, "write deny-oom fast", 1, 1, 1],
            ["tollgate.leakybucket", tollgate_leaky_bucket, "write deny-oom fast", 1, 1, 1],
        ],
    }
}
