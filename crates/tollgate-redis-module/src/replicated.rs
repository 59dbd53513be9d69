//! The module's writes as replicas and the AOF receive them: the commands
//! that make them, not the module's command (a replica deciding again on
//! its own clock could decide otherwise), so that replicas need no module.

// The binding's replicate takes its arguments as module strings it makes
// and frees one by one; a single `SET` goes through the module API's own
// call with plain buffers instead, a quarter of the command's work less.
#![allow(unsafe_code)]

use std::ffi::c_char;

use redis_module::{Context, raw};
use smallvec::SmallVec;

/// Replicates a call's string writes: `SET key value PXAT at` for one, else
/// one `EVAL` of those `SET`s in order, a plain command any replica applies
/// (with or without this module). Each replicated command costs the
/// primary a command lookup and an argument vector, about what deciding a
/// check costs: a batch of checks pays them once.
const SET_EACH: &[u8] =
    b"for i, k in ipairs(KEYS) do redis.call('SET', k, ARGV[2 * i - 1], 'PXAT', ARGV[2 * i]) end";

/// The string states a call wrote and has not replicated yet, in order
/// (`SET_EACH`): names, values and expiry times end to end in one buffer.
/// Replicated when dropped, so that a call that fails after writing still
/// replicates what it wrote, and before any other write is replicated, so
/// that a replica applies the writes in the order they were made.
pub(crate) struct Written<'c> {
    ctx: &'c Context,
    /// Room for a lone check's write without an allocation.
    bytes: SmallVec<[u8; 128]>,
    /// Where each write's name, value and expiry time end in `bytes`.
    ends: SmallVec<[[usize; 3]; 2]>,
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
            bytes: SmallVec::new(),
            ends: SmallVec::new(),
        }
    }

    pub(crate) fn add(&mut self, name: &[u8], value: &[u8], expire_at_ms: u64) {
        let mut at = itoa::Buffer::new();
        let mut ends = [0; 3];
        for (end, part) in ends
            .iter_mut()
            .zip([name, value, at.format(expire_at_ms).as_bytes()])
        {
            self.bytes.extend_from_slice(part);
            *end = self.bytes.len();
        }
        self.ends.push(ends);
    }

    /// Each write's name, value and expiry time.
    fn each(&self) -> impl Iterator<Item = [&[u8]; 3]> {
        let mut from = 0;
        self.ends.iter().map(move |&[name, value, at]| {
            let parts = [
                &self.bytes[from..name],
                &self.bytes[name..value],
                &self.bytes[value..at],
            ];
            from = at;
            parts
        })
    }

    /// Replicates the writes noted so far.
    pub(crate) fn replicate(&mut self) {
        let ctx = self.ctx;
        match self.ends.len() {
            0 => {}
            1 => {
                let [name, value, at] = self.each().next().expect("one write");
                set(ctx, name, value, at);
            }
            n => {
                let mut count = itoa::Buffer::new();
                let mut args: Vec<&[u8]> = Vec::with_capacity(2 + 3 * n);
                args.push(SET_EACH);
                args.push(count.format(n).as_bytes());
                args.extend(self.each().map(|[name, _, _]| name));
                for [_, value, at] in self.each() {
                    args.push(value);
                    args.push(at);
                }
                ctx.replicate("EVAL", &args[..]);
            }
        }
        self.bytes.clear();
        self.ends.clear();
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
