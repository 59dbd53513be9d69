//! The commands as Redis runs them: read the keys and the clock, decide with
//! the pure code of `cell`, `bucket` and `request`, write the keys and reply.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_module::key::RedisKeyWritable;
use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue, raw};

use crate::bucket::{Kind, parse};
use crate::leases::{Fields, Leases, Records, check_leasing, refund_leased};
use crate::raw_key::RawKey;
use crate::replicated::Written;
use crate::request::{Db, Decide, Request, Writes, check, refund};
use crate::sets::{Sets, Visit, release};
use crate::step::{State, Stepped, decimal};

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

/// Writes `state` with a TTL of `ttl` (whole milliseconds, rounded up, at
/// least one: never shorter than the state matters) and notes the write in
/// `written`, to be replicated itself, with its absolute expiry, rather than
/// the command: a replica's clock would decide the command again
/// differently.
///
/// The bytes go into the string in place (`StringDMA`): a key this module
/// wrote is a raw string of as many bytes, rewritten without an allocation
/// and read without the copy Redis makes to read a shared or embedded one.
fn write_state(
    key: &RedisKeyWritable,
    name: &RedisString,
    state: State,
    ttl: Duration,
    now_ns: u64,
    written: &mut Written<'_>,
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
    written.add(name, value, (now_ns / 1_000_000).saturating_add(ttl_ms));
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

/// Replies the five integers of a bucket's answer, written straight to the
/// reply (`RedisValue::Array` would allocate a vector for them).
fn reply(ctx: &Context, answer: [i64; 5]) -> RedisResult {
    raw::reply_with_array(ctx.get_raw(), 5);
    for n in answer {
        raw::reply_with_long_long(ctx.get_raw(), n);
    }
    Ok(RedisValue::NoReply)
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
        let mut written = Written::new(ctx);
        write_state(&key, name, State::Int(w.tat_ns), w.ttl, now, &mut written)?;
    }
    reply(ctx, answer.to_array())
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
        let mut written = Written::new(ctx);
        write_state(&key, name, w.state, w.ttl, clock, &mut written)?;
    }
    reply(ctx, answer)
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

/// The key `name`: `sent`, the limit's key as the caller sent it, else (a
/// window's key) made into `made`.
fn key_name<'a>(
    ctx: &Context,
    sent: &'a RedisString,
    name: &[u8],
    made: &'a mut Option<RedisString>,
) -> &'a RedisString {
    if sent.as_slice() == name {
        return sent;
    }
    made.insert(RedisString::create_from_slice(ctx.get_raw(), name))
}

const CHECK_USAGE: &str = "ERR usage: TOLLGATE.CHECK <numkeys> <key> ... c|d|h|r|l <extra ttl ms> <request or lease> ... [<leases>]";

/// A call's keys in Redis, by position, as `check` and `release` read and
/// write them (those of one request at a time). Each write is replicated
/// as the command that makes it, not the call: a replica deciding again on
/// its own clock could decide otherwise.
struct Keys<'c> {
    ctx: &'c Context,
    own: &'c [RedisString],
    /// Each string state as `check` read it (a window's name made), kept
    /// open to write it: one lookup per key, not two.
    opened: Vec<Option<(Option<RedisString>, RedisKeyWritable)>>,
    written: Written<'c>,
    extra_ms: u64,
    clock_ns: u64,
}

impl<'c> Keys<'c> {
    fn new(ctx: &'c Context, own: &'c [RedisString], extra_ms: u64) -> Self {
        Self {
            ctx,
            own,
            opened: own.iter().map(|_| None).collect(),
            written: Written::new(ctx),
            extra_ms,
            clock_ns: clock_ns(),
        }
    }

    /// The keys of the call's next request.
    fn request(&mut self, own: &'c [RedisString]) {
        self.own = own;
        self.opened.clear();
        self.opened.resize_with(own.len(), || None);
    }
}

fn message(e: RedisError) -> String {
    match e {
        RedisError::String(s) => s,
        other => other.to_string(),
    }
}

impl Db for Keys<'_> {
    fn string(
        &mut self,
        k: usize,
        name: &[u8],
        decide: &mut Decide<'_>,
    ) -> Result<Stepped, String> {
        let mut made = None;
        let key = self
            .ctx
            .open_key_writable(key_name(self.ctx, &self.own[k], name, &mut made));
        let stepped = with_stored(&key, decide).map_err(message);
        self.opened[k] = Some((made, key));
        stepped
    }

    fn get(&mut self, name: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let name = RedisString::create_from_slice(self.ctx.get_raw(), name);
        let key = self.ctx.open_key_writable(&name);
        with_stored(&key, |v| Ok(v.map(<[u8]>::to_vec))).map_err(message)
    }

    fn put(&mut self, name: &[u8], value: &[u8]) -> Result<(), String> {
        let name = RedisString::create_from_slice(self.ctx.get_raw(), name);
        let key = self.ctx.open_key_writable(&name);
        // In place: the TTL stays.
        key.as_string_dma()
            .and_then(|mut dma| dma.write(value).map(drop))
            .map_err(message)?;
        self.written
            .then("SET", &[name.as_slice(), value, b"KEEPTTL"][..]);
        Ok(())
    }
}

impl Sets for Keys<'_> {
    fn total(&mut self, k: usize) -> Result<i64, String> {
        let key = self.ctx.open_key_writable(&self.own[k + 1]);
        with_stored(&key, |v| {
            v.map_or(Ok(0), |v| {
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| "ERR a key does not hold its limit's state".to_owned())
            })
        })
        .map_err(message)
    }

    fn last(&mut self, k: usize) -> Result<Option<u64>, String> {
        RawKey::sorted(self.ctx, &self.own[k])?.last()
    }

    fn each(
        &mut self,
        k: usize,
        above: Option<u64>,
        upto: u64,
        f: &mut Visit<'_>,
    ) -> Result<(), String> {
        RawKey::sorted(self.ctx, &self.own[k])?.each(above, upto, f)
    }

    fn remove(&mut self, k: usize, member: &[u8]) -> Result<bool, String> {
        let removed = RawKey::sorted(self.ctx, &self.own[k])?.remove(member)?;
        if removed {
            self.written
                .then("ZREM", &[self.own[k].as_slice(), member][..]);
        }
        Ok(removed)
    }

    fn add(&mut self, k: usize, score: u64, member: &[u8]) -> Result<(), String> {
        RawKey::sorted(self.ctx, &self.own[k])?.add(score, member)?;
        let mut digits = itoa::Buffer::new();
        let score = digits.format(score).as_bytes();
        self.written
            .then("ZADD", &[self.own[k].as_slice(), score, member][..]);
        Ok(())
    }

    fn set_total(&mut self, k: usize, total: i64, keep_ttl: bool) -> Result<(), String> {
        let name = &self.own[k + 1];
        let mut digits = itoa::Buffer::new();
        let value = digits.format(total).as_bytes();
        {
            let key = self.ctx.open_key_writable(name);
            with_stored(&key, |_| Ok(())).map_err(message)?;
            key.as_string_dma()
                .and_then(|mut dma| dma.write(value).map(drop))
                .map_err(message)?;
        }
        if keep_ttl {
            self.written
                .then("SET", &[name.as_slice(), value, b"KEEPTTL"][..]);
        } else {
            // `SET`, which the code calls, drops the TTL.
            RawKey::open(self.ctx, name).set_ttl_ms(None)?;
            self.written.then("SET", &[name.as_slice(), value][..]);
        }
        Ok(())
    }

    fn expire(&mut self, k: usize, aux: bool, ttl_us: u64, at_least: bool) -> Result<(), String> {
        let name = &self.own[k + usize::from(aux)];
        let ms = ttl_us.div_ceil(1000).max(1).saturating_add(self.extra_ms);
        let key = RawKey::open(self.ctx, name);
        if at_least
            && key
                .ttl_ms()
                .is_some_and(|t| t >= i64::try_from(ms).unwrap_or(i64::MAX))
        {
            return Ok(());
        }
        key.set_ttl_ms(Some(ms))?;
        let mut at = itoa::Buffer::new();
        let expire_at = at.format((self.clock_ns / 1_000_000).saturating_add(ms));
        self.written
            .then("PEXPIREAT", &[name.as_slice(), expire_at.as_bytes()][..]);
        Ok(())
    }
}

/// A hash of records at `name`, opened to read and write: WRONGTYPE when it
/// holds anything else.
fn hash(ctx: &Context, name: &RedisString) -> Result<RedisKeyWritable, String> {
    let key = ctx.open_key_writable(name);
    match key.key_type() {
        KeyType::Empty | KeyType::Hash => Ok(key),
        _ => Err(RedisError::WrongType.to_string()),
    }
}

/// A holder's id: its decimal digits (`Leases` made them).
fn field(holder: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(holder).map_err(|_| "ERR a holder is not decimal digits".to_owned())
}

impl Records for Keys<'_> {
    fn record(&mut self, r: usize, holder: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let key = hash(self.ctx, &self.own[r])?;
        if key.is_empty() {
            return Ok(None);
        }
        let value = key.hash_get(field(holder)?).map_err(message)?;
        Ok(value.map(|v| v.as_slice().to_vec()))
    }

    fn records(&mut self, r: usize) -> Result<Fields, String> {
        hash(self.ctx, &self.own[r])?;
        RawKey::open(self.ctx, &self.own[r]).fields()
    }

    fn set_record(&mut self, r: usize, holder: &[u8], value: &[u8]) -> Result<(), String> {
        let name = &self.own[r];
        let key = hash(self.ctx, name)?;
        // The binding reads the count of fields written as a status: not
        // an error, whatever it says (the key was checked a hash above).
        let _ = key.hash_set(
            field(holder)?,
            RedisString::create_from_slice(self.ctx.get_raw(), value),
        );
        self.written
            .then("HSET", &[name.as_slice(), holder, value][..]);
        Ok(())
    }

    fn drop_record(&mut self, r: usize, holder: &[u8]) -> Result<(), String> {
        let name = &self.own[r];
        let key = hash(self.ctx, name)?;
        let _ = key.hash_del(field(holder)?);
        self.written.then("HDEL", &[name.as_slice(), holder][..]);
        Ok(())
    }
}

/// `TOLLGATE.CHECK`: the store's Lua code's entry point (`run`), natively:
/// the same keys, the same arguments, the same reply, for the ops `c`
/// (check), `d` (dry run), `h` (a check leasing units to a hybrid holder),
/// `r` (refund, with or without hybrid leases' records) and `l` (release
/// leases). Every request is decoded before any is checked, so a bad one
/// fails the call with nothing written.
fn tollgate_check(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let usage = || RedisError::Str(CHECK_USAGE);
    let numkeys = args
        .get(1)
        .and_then(|n| decimal(n.as_slice()))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(usage)?;
    let keys = args.get(2..2 + numkeys).ok_or_else(usage)?;
    if ctx.is_keys_position_request() {
        // Redis asks where the keys are (a cluster routes by them).
        for pos in 2..2 + numkeys {
            ctx.key_at_pos(i32::try_from(pos).unwrap_or(i32::MAX));
        }
        return Ok(RedisValue::NoReply);
    }
    let [op, extra, blobs @ ..] = &args[2 + numkeys..] else {
        return Err(usage());
    };
    let extra_ms = decimal(extra.as_slice()).ok_or_else(usage)?;
    let commit = match op.as_slice() {
        b"c" => true,
        b"d" => false,
        b"h" => return leasing(ctx, keys, blobs, extra_ms),
        b"l" => return release_leases(ctx, keys, blobs),
        b"r" => return refund_check(ctx, keys, blobs, extra_ms),
        other => {
            return Err(RedisError::String(format!(
                "ERR TOLLGATE.CHECK takes the ops c (check), d (dry run), h (hybrid leasing), r (refund) and l (release), got {}",
                other.escape_ascii()
            )));
        }
    };
    let mut requests = Vec::with_capacity(blobs.len());
    let mut taken = 0;
    for blob in blobs {
        let request = Request::parse(blob.as_slice()).map_err(RedisError::String)?;
        let n = request.keys();
        taken += n;
        requests.push((request, n));
    }
    takes(taken, numkeys)?;
    let mut reply = Vec::with_capacity(taken * 40 + requests.len() * 16);
    let mut from = 0;
    // Its string writes are replicated together, once it is done.
    let mut db = Keys::new(ctx, &[], extra_ms);
    let clock = db.clock_ns;
    let mut slices: Vec<&[u8]> = Vec::new();
    for (request, n) in &requests {
        let own = &keys[from..from + n];
        from += n;
        let now_us = request.time.unwrap_or(clock / 1000);
        slices.clear();
        slices.extend(own.iter().map(RedisString::as_slice));
        db.request(own);
        let writes = check(request, &slices, now_us, commit, &mut db, &mut reply)
            .map_err(RedisError::String)?;
        write_all(&mut db, writes)?;
    }
    Ok(RedisValue::StringBuffer(reply))
}

/// Whether the requests (and records) take the call's keys.
fn takes(taken: usize, numkeys: usize) -> Result<(), RedisError> {
    if taken == numkeys {
        Ok(())
    } else {
        Err(RedisError::String(format!(
            "ERR the requests take {taken} keys, got {numkeys}"
        )))
    }
}

/// Writes the string states a check staged, each to the key its limit read
/// (`check`'s `Write`).
fn write_all(db: &mut Keys<'_>, writes: Writes) -> Result<(), RedisError> {
    for w in writes {
        let (made, key) = db.opened[w.at]
            .as_ref()
            .ok_or(RedisError::Str("ERR a write for a key not read"))?;
        let name = made.as_ref().unwrap_or(&db.own[w.at]);
        let ttl_ms = w.ttl_us.div_ceil(1000).max(1).saturating_add(db.extra_ms);
        write_state(
            key,
            name,
            w.state,
            Duration::from_millis(ttl_ms),
            db.clock_ns,
            &mut db.written,
        )?;
    }
    Ok(())
}

/// A request and its leases (`<request> <leases>`), and the call's keys
/// checked against them: the request's, then its records'.
fn leased<'a>(
    keys: &[RedisString],
    blobs: &'a [RedisString],
) -> Result<(Request<'a>, Leases), RedisError> {
    let [blob, leases] = blobs else {
        return Err(RedisError::Str(
            "ERR TOLLGATE.CHECK h takes one request and its leases",
        ));
    };
    let request = Request::parse(blob.as_slice()).map_err(RedisError::String)?;
    let leases = Leases::parse(&request, leases.as_slice()).map_err(RedisError::String)?;
    let n = request.keys();
    takes(n + leases.keys(), keys.len())?;
    Ok((request, leases))
}

/// Op `h`: checks one request for a hybrid holder leasing part of its
/// limits' costs, and changes the holder's records, as the code's op `h`.
fn leasing(
    ctx: &Context,
    keys: &[RedisString],
    blobs: &[RedisString],
    extra_ms: u64,
) -> RedisResult {
    let (request, leases) = leased(keys, blobs)?;
    let mut db = Keys::new(ctx, keys, extra_ms);
    let now_us = request.time.unwrap_or(db.clock_ns / 1000);
    let slices: Vec<&[u8]> = keys.iter().map(RedisString::as_slice).collect();
    let mut reply = Vec::with_capacity(16 + 40 * request.len());
    let writes = check_leasing(&request, &slices, &leases, now_us, &mut db, &mut reply)
        .map_err(RedisError::String)?;
    write_all(&mut db, writes)?;
    Ok(RedisValue::StringBuffer(reply))
}

/// Op `r`: gives back what a committed check of one request took, as the
/// code's op `r`; with a leases argument, through the holder's records.
/// Answers the request's time in an array, as the code does.
fn refund_check(
    ctx: &Context,
    keys: &[RedisString],
    blobs: &[RedisString],
    extra_ms: u64,
) -> RedisResult {
    let slices: Vec<&[u8]> = keys.iter().map(RedisString::as_slice).collect();
    let mut db = Keys::new(ctx, keys, extra_ms);
    let at = match blobs {
        [blob] => {
            let request = Request::parse(blob.as_slice()).map_err(RedisError::String)?;
            refund(&request, &slices, &mut db, &|_| true)
        }
        [_, _] => {
            let (request, leases) = leased(keys, blobs)?;
            refund_leased(&request, &slices, &leases, &mut db)
        }
        _ => {
            return Err(RedisError::Str(
                "ERR TOLLGATE.CHECK r takes one request, and its leases when it has any",
            ));
        }
    }
    .map_err(RedisError::String)?;
    Ok(RedisValue::Array(vec![RedisValue::Integer(
        i64::try_from(at).unwrap_or(i64::MAX),
    )]))
}

/// Op `l`: releases each lease (`<cost>|<id>`) from its set, the keys two
/// per lease (the set, its count), as the code's op `l`. Answers an empty
/// array, as the code does.
fn release_leases(ctx: &Context, keys: &[RedisString], members: &[RedisString]) -> RedisResult {
    if keys.len() != 2 * members.len() {
        return Err(RedisError::String(format!(
            "ERR {} leases take {} keys, got {}",
            members.len(),
            2 * members.len(),
            keys.len()
        )));
    }
    let mut db = Keys::new(ctx, keys, 0);
    let members: Vec<&[u8]> = members.iter().map(RedisString::as_slice).collect();
    release(&mut db, &members).map_err(RedisError::String)?;
    Ok(RedisValue::Array(Vec::new()))
}

mod entry {
    // The binding's macros declare the module's `RedisModule_OnLoad` and each
    // command's handler, unmangled `extern "C"` functions, and the
    // allocator: unsafe by nature.
    #![allow(unsafe_code, missing_docs)]
    use std::ffi::{CString, c_int};

    use redis_module::{Context, RedisString, Status, raw};

    use redis_module::commands::{
        BeginSearch, FindKeys, KeySpec, KeySpecFlags, get_redis_key_spec,
    };

    use super::{
        cl_throttle, tollgate_check, tollgate_gcra, tollgate_leaky_bucket, tollgate_token_bucket,
    };

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
        if register_check(ctx.get_raw()) != Status::Ok as c_int {
            return Status::Err;
        }
        Status::Ok
    }

    /// `TOLLGATE.CHECK`, its keys declared as `FCALL`'s are (a count, then
    /// that many), so that a cluster routes it by them and refuses keys of
    /// several slots (`CROSSSLOT`) or of a slot served elsewhere (`MOVED`):
    /// told by the command itself when asked (`getkeys-api`), since Redis
    /// 7.0's cluster reads a module command's keys that way or from its
    /// first-last-step range, which cannot say "a count, then the keys";
    /// and by a key spec, for `COMMAND GETKEYS`, `COMMAND INFO` and ACLs.
    fn register_check(ctx: *mut raw::RedisModuleCtx) -> c_int {
        redis_module::redis_command!(
            ctx,
            "tollgate.check",
            tollgate_check,
            "write deny-oom getkeys-api",
            0,
            0,
            0
        );
        let name = CString::new("tollgate.check").expect("no NUL");
        let spec = KeySpec::new(
            None,
            KeySpecFlags::READ_WRITE | KeySpecFlags::ACCESS | KeySpecFlags::UPDATE,
            BeginSearch::new_index(1),
            FindKeys::new_keys_num(0, 1, 1),
        );
        let specs = get_redis_key_spec(vec![spec]);
        let version = raw::RedisModuleCommandInfoVersion {
            version: 1,
            sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
            sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
            sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
        };
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: std::ptr::null(),
            complexity: std::ptr::null(),
            since: std::ptr::null(),
            history: std::ptr::null_mut(),
            tips: std::ptr::null(),
            // The name, the count, an op and the extra TTL at least.
            arity: -4,
            key_specs: specs.as_ptr().cast_mut(),
            args: std::ptr::null_mut(),
        };
        // SAFETY: the command was just created by this module; `info` and
        // what it points to outlive the call, which copies them.
        let status = unsafe {
            let command = raw::RedisModule_GetCommand.expect("Redis 7")(ctx, name.as_ptr());
            if command.is_null() {
                return Status::Err as c_int;
            }
            raw::RedisModule_SetCommandInfo.expect("Redis 7")(command, &info)
        };
        if status == Status::Ok as c_int {
            Status::Ok as c_int
        } else {
            Status::Err as c_int
        }
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
