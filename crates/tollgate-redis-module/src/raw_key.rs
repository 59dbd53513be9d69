//! A key through the module API's raw bindings, for what the binding has
//! no safe API for: a sorted set's reads by score, adds and removals, a
//! hash's fields, and reading or removing a key's TTL.

// The binding has no safe API for sorted sets or a hash's scan; each call
// below is the module API's, on a key opened here and closed on drop.
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_void};

use redis_module::{Context, RedisError, RedisString, raw};

use crate::leases::Fields;
use crate::sets::Visit;

/// A key opened to read and write.
pub(crate) struct RawKey {
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleKey,
}

fn not_state() -> String {
    "ERR a key does not hold its limit's state".to_owned()
}

/// A score the code wrote: a whole number of µs below 2^53.
fn whole(score: f64) -> Result<u64, String> {
    if score >= 0.0 && score <= (1u64 << 53) as f64 && score.fract() == 0.0 {
        Ok(score as u64)
    } else {
        Err(not_state())
    }
}

impl RawKey {
    /// Opens `name`, whatever it holds.
    pub(crate) fn open(ctx: &Context, name: &RedisString) -> Self {
        let key = raw::open_key(
            ctx.get_raw(),
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        );
        Self {
            ctx: ctx.get_raw(),
            key,
        }
    }

    /// Opens `name` as a sorted set (the sorted-set methods take no other):
    /// WRONGTYPE when it holds anything else.
    pub(crate) fn sorted(ctx: &Context, name: &RedisString) -> Result<Self, String> {
        let key = Self::open(ctx, name);
        // SAFETY: the key is open until drop.
        let kind = unsafe { raw::RedisModule_KeyType.expect("Redis 7")(key.key) };
        match kind as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY | raw::REDISMODULE_KEYTYPE_ZSET => Ok(key),
            _ => Err(RedisError::WrongType.to_string()),
        }
    }

    fn member(&self, bytes: &[u8]) -> RedisString {
        RedisString::create_from_slice(self.ctx, bytes)
    }

    /// The highest score; `None` when the set is empty.
    pub(crate) fn last(&self) -> Result<Option<u64>, String> {
        let mut last = None;
        self.walk(
            f64::NEG_INFINITY,
            false,
            f64::INFINITY,
            true,
            &mut |s, _| {
                last = Some(s);
                Ok(false)
            },
        )?;
        Ok(last)
    }

    /// Calls `f` on each member scored above `above` (every one for
    /// `None`) and at most `upto`, ascending, while it answers true.
    pub(crate) fn each(
        &self,
        above: Option<u64>,
        upto: u64,
        f: &mut Visit<'_>,
    ) -> Result<(), String> {
        let (min, minex) = above.map_or((f64::NEG_INFINITY, false), |a| (a as f64, true));
        let max = if upto == u64::MAX {
            f64::INFINITY
        } else {
            upto as f64
        };
        self.walk(min, minex, max, false, f)
    }

    /// Walks `min..=max` (`min` excluded with `minex`), from its first
    /// member up, or with `back` from its last one down.
    fn walk(
        &self,
        min: f64,
        minex: bool,
        max: f64,
        back: bool,
        f: &mut Visit<'_>,
    ) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        // SAFETY: the key is open and a sorted set (checked at open); the
        // range is stopped before returning, and each element the API hands
        // out is owned here (freed by `RedisString`'s drop).
        unsafe {
            let start = if back {
                raw::RedisModule_ZsetLastInScoreRange.expect("Redis 7")
            } else {
                raw::RedisModule_ZsetFirstInScoreRange.expect("Redis 7")
            };
            if start(self.key, min, max, c_int::from(minex), 0) != raw::REDISMODULE_OK as c_int {
                return Err(not_state());
            }
            let mut result = Ok(());
            while raw::RedisModule_ZsetRangeEndReached.expect("Redis 7")(self.key) == 0 {
                let mut score = 0.0;
                let element = raw::RedisModule_ZsetRangeCurrentElement.expect("Redis 7")(
                    self.key, &mut score,
                );
                if element.is_null() {
                    break;
                }
                let element = RedisString::from_redis_module_string(self.ctx, element);
                match whole(score).and_then(|s| f(s, element.as_slice())) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
                let next = if back {
                    raw::RedisModule_ZsetRangePrev.expect("Redis 7")
                } else {
                    raw::RedisModule_ZsetRangeNext.expect("Redis 7")
                };
                if next(self.key) == 0 {
                    break;
                }
            }
            raw::RedisModule_ZsetRangeStop.expect("Redis 7")(self.key);
            result
        }
    }

    fn is_empty(&self) -> bool {
        // SAFETY: the key is open.
        unsafe {
            raw::RedisModule_KeyType.expect("Redis 7")(self.key) as isize
                == raw::REDISMODULE_KEYTYPE_EMPTY
        }
    }

    /// Removes `member`: whether it was there. An emptied set is deleted.
    pub(crate) fn remove(&self, member: &[u8]) -> Result<bool, String> {
        if self.is_empty() {
            return Ok(false);
        }
        let member = self.member(member);
        let mut deleted: c_int = 0;
        // SAFETY: the key is open for writing and a sorted set.
        let status = unsafe {
            raw::RedisModule_ZsetRem.expect("Redis 7")(self.key, member.inner, &mut deleted)
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(not_state());
        }
        Ok(deleted == 1)
    }

    /// Adds (or moves) `member` at `score`.
    pub(crate) fn add(&self, score: u64, member: &[u8]) -> Result<(), String> {
        let member = self.member(member);
        let mut flags: c_int = 0;
        // SAFETY: the key is open for writing, empty or a sorted set.
        let status = unsafe {
            raw::RedisModule_ZsetAdd.expect("Redis 7")(
                self.key,
                score as f64,
                member.inner,
                &mut flags,
            )
        };
        if status == raw::REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err(not_state())
        }
    }

    /// Every field of a hash and its value (`HGETALL`), in the order a scan
    /// meets them; none when there is no key. The key is a hash or empty.
    pub(crate) fn fields(&self) -> Result<Fields, String> {
        let mut out: Fields = Vec::new();
        if self.is_empty() {
            return Ok(out);
        }
        // SAFETY: the key is open and a hash; `collect` gets `out` back as
        // its private data and copies each field and value while the scan
        // holds them; the cursor is destroyed after the scan.
        unsafe {
            let cursor = raw::RedisModule_ScanCursorCreate.expect("Redis 7")();
            let scan = raw::RedisModule_ScanKey.expect("Redis 7");
            let data: *mut Fields = &mut out;
            while scan(self.key, cursor, Some(collect), data.cast::<c_void>()) != 0 {}
            raw::RedisModule_ScanCursorDestroy.expect("Redis 7")(cursor);
        }
        Ok(out)
    }

    /// Its TTL in ms; `None` without one.
    pub(crate) fn ttl_ms(&self) -> Option<i64> {
        // SAFETY: the key is open.
        let ttl = unsafe { raw::RedisModule_GetExpire.expect("Redis 7")(self.key) };
        (ttl >= 0).then_some(ttl)
    }

    /// Sets its TTL (`None`: removes it). The key exists.
    pub(crate) fn set_ttl_ms(&self, ms: Option<u64>) -> Result<(), String> {
        let ms = ms.map_or(i64::from(raw::REDISMODULE_NO_EXPIRE), |ms| {
            i64::try_from(ms).unwrap_or(i64::MAX)
        });
        match raw::set_expire(self.key, ms) {
            raw::Status::Ok => Ok(()),
            raw::Status::Err => Err("ERR could not set a TTL".to_owned()),
        }
    }
}

/// A string the module API hands out, copied.
///
/// # Safety
/// `s` is a valid module string.
unsafe fn bytes(s: *mut raw::RedisModuleString) -> Vec<u8> {
    let mut len = 0;
    // SAFETY: `s` is valid (the caller's promise); the pointer and length
    // the API answers describe its bytes.
    unsafe {
        let ptr = raw::RedisModule_StringPtrLen.expect("Redis 7")(s, &mut len);
        std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec()
    }
}

/// `ScanKey`'s callback: pushes the field and its value onto the vector
/// `data` points to.
unsafe extern "C" fn collect(
    _key: *mut raw::RedisModuleKey,
    field: *mut raw::RedisModuleString,
    value: *mut raw::RedisModuleString,
    data: *mut c_void,
) {
    // SAFETY: `data` is the vector `fields` passed, alive for the scan; the
    // field and value are valid during the callback.
    unsafe {
        let out = &mut *data.cast::<Fields>();
        out.push((bytes(field), bytes(value)));
    }
}

impl Drop for RawKey {
    fn drop(&mut self) {
        raw::close_key(self.key);
    }
}
