//! The module's writes as replicas and the AOF receive them: the commands
//! that make them, not the module's command (a replica deciding again on
//! its own clock could decide otherwise), so that replicas need no module.

// The binding's replicate takes its arguments as module strings it makes
// and frees one by one; a single `SET` goes through the module API's own
// call with plain buffers instead, a quarter of the command's work less.
#![allow(unsafe_code)]

use std::ffi::c_char;

use redis_module::{Context, RedisString, raw};
use smallvec::SmallVec;

/// Replicates a call's string writes: `SET key value PXAT at` for one, else
/// one `EVAL` of those `SET`s in order, a plain command any replica applies
/// (with or without this module). Each replicated command costs the
/// primary a command lookup and an argument vector, about what deciding a
/// check costs: a batch of checks pays them once. Its keys are the keys
/// written, its one argument each write's value and expiry time (ms, in
/// decimal), each after its length in a byte: one string made for the
/// batch, not two a write.
const SET_EACH: &str = "local s, p = ARGV[1], 1
local function take()
  local n = string.byte(s, p)
  p = p + 1 + n
  return string.sub(s, p - n, p - 1)
end
for _, k in ipairs(KEYS) do
  local v = take()
  redis.call('SET', k, v, 'PXAT', take())
end";

/// The string states a call wrote and has not replicated yet, in order
/// (`SET_EACH`). Replicated when dropped, so that a call that fails after
/// writing still replicates what it wrote, and before any other write is
/// replicated, so that a replica applies the writes in the order they
/// were made.
pub(crate) struct Written<'c> {
    ctx: &'c Context,
    /// The keys written (the caller's strings, held, not copied).
    names: SmallVec<[RedisString; 2]>,
    /// Each write's value and expiry time, each after its length.
    values: SmallVec<[u8; 64]>,
}

impl Drop for Written<'_> {
    fn drop(&mut self) {
        self.replicate();
    }
}

impl<'c> Written<'c> {
    pub(crate) fn new(ctx: &'c Context) -> Self {
        Self {
            ctx,
            names: SmallVec::new(),
            values: SmallVec::new(),
        }
    }

    /// Notes that `name` now holds `value` (at most 255 bytes), to expire
    /// at `expire_at_ms`.
    pub(crate) fn add(&mut self, name: &RedisString, value: &[u8], expire_at_ms: u64) {
        let mut at = itoa::Buffer::new();
        for part in [value, at.format(expire_at_ms).as_bytes()] {
            self.values
                .push(u8::try_from(part.len()).expect("a state of at most 255 bytes"));
            self.values.extend_from_slice(part);
        }
        self.names.push(name.safe_clone(self.ctx));
    }

    /// Replicates the writes noted so far.
    pub(crate) fn replicate(&mut self) {
        let ctx = self.ctx;
        match &self.names[..] {
            [] => {}
            [name] => {
                let values = &self.values[..];
                let (value, rest) = values[1..].split_at(usize::from(values[0]));
                set(ctx, name.as_slice(), value, &rest[1..]);
            }
            names => {
                let script = ctx.create_string(SET_EACH);
                let count = ctx.create_string(names.len().to_string());
                let values = RedisString::create_from_slice(ctx.get_raw(), &self.values);
                let mut args: SmallVec<[&RedisString; 16]> = SmallVec::new();
                args.push(&script);
                args.push(&count);
                args.extend(names.iter());
                args.push(&values);
                ctx.replicate("EVAL", &args[..]);
            }
        }
        self.names.clear();
        self.values.clear();
    }

    /// Replicates `command`, after the writes noted before it.
    pub(crate) fn then(&mut self, command: &str, args: &[&[u8]]) {
        self.replicate();
        self.ctx.replicate(command, args);
    }
}

/// Replicates `SET name value PXAT at`.
fn set(ctx: &Context, name: &[u8], value: &[u8], at: &[u8]) {
    let buffer = |b: &[u8]| b.as_ptr().cast::<c_char>();
    // SAFETY: the format's `b`s each take a pointer and a length, its `c` a
    // NUL-terminated string, all read during the call, which copies them.
    unsafe {
        raw::RedisModule_Replicate.expect("Redis 7")(
            ctx.get_raw(),
            c"SET".as_ptr(),
            c"bbcb".as_ptr(),
            buffer(name),
            name.len(),
            buffer(value),
            value.len(),
            c"PXAT".as_ptr(),
            buffer(at),
            at.len(),
        );
    }
}
