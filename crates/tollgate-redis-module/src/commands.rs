//! The commands as Redis runs them: read the key and the clock, decide with
//! the pure code of `cell` and `bucket`, write the key and reply.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

use crate::bucket::{Kind, State, decimal, parse};

/// The time now in nanoseconds since 1970: the clock Redis's `TIME` reads.
fn clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The string the key `name` holds (`None` when there is none) to `decide`
/// on; WRONGTYPE for a key of another type. Read in place (`StringDMA`),
/// not copied: Redis turns a string kept in a compact form (an integer, or
/// bytes embedded in its object) into a separate buffer to do so, which
/// the write after an admit makes compact again ([`write_state`]).
fn with_stored<T>(
    ctx: &Context,
    name: &RedisString,
    decide: impl FnOnce(Option<&[u8]>) -> Result<T, String>,
) -> Result<T, RedisError> {
    let key = ctx.open_key_writable(name);
    match key.key_type() {
        KeyType::Empty => decide(None),
        KeyType::String => decide(Some(&key.as_string_dma()?)),
        _ => return Err(RedisError::WrongType),
    }
    .map_err(RedisError::String)
}

/// Writes `state` with a TTL of `ttl` (whole milliseconds, rounded up, at
/// least one: never shorter than the state matters), as compactly as the
/// store's Lua code does, and replicates that write, with its absolute
/// expiry, rather than the command: a replica's clock would decide the
/// command again differently.
///
/// A decimal state (GCRA's TAT) goes through `SET` ([`entry::set`]), which
/// keeps it as an integer (16 bytes; 48 as a string in place); packed
/// bytes, as big in place as embedded, are written in place, without the
/// call.
fn write_state(
    ctx: &Context,
    name: &RedisString,
    state: State,
    ttl: Duration,
    now_ns: u64,
) -> Result<(), RedisError> {
    let ttl_ms = ttl.as_nanos().div_ceil(1_000_000).max(1);
    let ttl_ms = u64::try_from(ttl_ms).unwrap_or(u64::MAX);
    let mut digits = itoa::Buffer::new();
    let mut at = itoa::Buffer::new();
    let expire_at = at.format((now_ns / 1_000_000).saturating_add(ttl_ms));
    let value = match &state {
        State::Int(v) => {
            let value = digits.format(*v).as_bytes();
            entry::set(ctx, name, value, expire_at).map_err(RedisError::String)?;
            value
        }
        State::Packed { bytes, len } => {
            let value = &bytes[..*len];
            let key = ctx.open_key_writable(name);
            key.as_string_dma()?.write(value)?;
            key.set_expire(Duration::from_millis(ttl_ms))?;
            value
        }
    };
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
    let now = clock_ns();
    let (answer, write) = with_stored(ctx, name, |v| {
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
        write_state(ctx, name, State::Int(w.tat_ns), w.ttl, now)?;
    }
    reply(answer.to_array())
}

fn bucket(kind: Kind, ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let usage = || RedisError::Str(kind.usage());
    let name = args.get(1).ok_or_else(usage)?;
    let (rest, n) = arg_slices::<8>(&args).ok_or_else(usage)?;
    let step = parse(kind, &rest[..n]).map_err(RedisError::String)?;
    let clock = clock_ns();
    let now_us = step.at(clock / 1000);
    let (answer, write) = with_stored(ctx, name, |v| step.decide(v, now_us))?;
    if let Some(w) = write {
        write_state(ctx, name, w.state, w.ttl, clock)?;
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

    /// `SET <name> <value> PXAT <at>`, `at` in decimal digits. The value goes
    /// as a buffer (`b`), which Redis makes a string of its own (one
    /// reference), so `SET` stores it in its compact encoding; the binding's
    /// calls pass strings the module holds too, which `SET` keeps as they
    /// are.
    pub(super) fn set(
        ctx: &Context,
        name: &RedisString,
        value: &[u8],
        at: &str,
    ) -> Result<(), String> {
        let at = CString::new(at).map_err(|e| e.to_string())?;
        // SAFETY: the API's function pointers, set when the module loaded.
        let (call, kind, free) = unsafe {
            (
                raw::RedisModule_Call.ok_or("no RedisModule_Call")?,
                raw::RedisModule_CallReplyType.ok_or("no RedisModule_CallReplyType")?,
                raw::RedisModule_FreeCallReply.ok_or("no RedisModule_FreeCallReply")?,
            )
        };
        // SAFETY: the format's four arguments are given in its order and
        // types: a module string, a pointer and its length, two C strings;
        // each outlives the call, and the reply is freed once.
        let reply = unsafe {
            call(
                ctx.ctx,
                c"SET".as_ptr(),
                c"sbcc".as_ptr(),
                name.inner,
                value.as_ptr(),
                value.len(),
                c"PXAT".as_ptr(),
                at.as_ptr(),
            )
        };
        if reply.is_null() {
            return Err("ERR SET of the state failed".into());
        }
        // SAFETY: a reply RedisModule_Call returned, freed after its type is read.
        let failed = unsafe {
            let failed = kind(reply) == raw::REDISMODULE_REPLY_ERROR as c_int;
            free(reply);
            failed
        };
        if failed {
            return Err("ERR SET of the state answered an error".into());
        }
        Ok(())
    }

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
