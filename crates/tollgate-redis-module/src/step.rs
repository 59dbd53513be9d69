//! One limit's step on a state kept in one string, as tollgate-redis's Lua
//! code (`step` in tollgate.lua) takes it: the same arguments in whole
//! microseconds, the same stored bytes, the same answers, so instances
//! calling the code and the module on one key agree.
//!
//! The states are the code's: GCRA's and shaping's theoretical arrival time
//! (µs), a decimal integer; a fixed window's or hit counter's count, a
//! decimal integer at a key per window (`<key>:<window>`); the token
//! bucket's (last refill, tokens) and the policing leaky bucket's (last leak,
//! level), µs, packed little-endian in 12 bytes (7 + 5) while the amount is
//! below 2^40, else two doubles; the sliding counter's (last, previous,
//! current), three doubles.
//!
//! The arithmetic is tollgate-core's steps. They count nanoseconds; the code
//! counts microseconds, so a step runs with one microsecond as one
//! "nanosecond" wherever the quota can be built that way (every bucket, and a
//! window whose limit is at most its period in µs), which makes every
//! division round as the code's does; else (a window of more units than
//! microseconds) in nanoseconds, where a window's arithmetic is exact alike.

use tollgate_core::{
    FixedWindow, Gcra, HitCounter, LeakyBucket, LeakyBucketShaping, Level, Quota, SlidingCounter,
    StateMachine, Tat, TokenBucket, Tokens, WindowCount, WindowPair,
};

// Algorithm codes, as `Algorithm::index` numbers them (a unit test holds
// them together).
pub(crate) const TOKEN_BUCKET: u8 = 0;
pub(crate) const GCRA: u8 = 1;
pub(crate) const LEAKY: u8 = 2;
pub(crate) const SHAPING: u8 = 3;
pub(crate) const FIXED_WINDOW: u8 = 4;
pub(crate) const SLIDING_LOG: u8 = 5;
pub(crate) const SLIDING_COUNTER: u8 = 6;
pub(crate) const CONCURRENCY: u8 = 7;
pub(crate) const HIT_COUNTER: u8 = 8;

/// The Lua's end of time: 2^53 µs (the year 2255).
pub(crate) const END_US: u64 = 1 << 53;

/// One limit as the code takes it: counts, and durations in µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    pub(crate) alg: u8,
    pub(crate) limit: u64,
    pub(crate) period: u64,
    pub(crate) burst: u64,
    pub(crate) emission: u64,
    pub(crate) cost: u64,
    pub(crate) delay_after: u64,
}

/// A state as the code writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// A decimal integer (a TAT in µs, a window's count).
    Int(u64),
    /// Packed bytes: the first `len` of them.
    Packed { bytes: [u8; 24], len: usize },
}

/// The amounts the 12-byte pair holds: below 2^40.
const COMPACT: u64 = 1 << 40;

impl State {
    /// A (time, amount) pair, as the code's `pack_pair`.
    pub(crate) fn pair(time: u64, amount: u64) -> Self {
        let mut bytes = [0; 24];
        if amount < COMPACT {
            bytes[..7].copy_from_slice(&time.to_le_bytes()[..7]);
            bytes[7..12].copy_from_slice(&amount.to_le_bytes()[..5]);
            State::Packed { bytes, len: 12 }
        } else {
            // Both below 2^53: exact as doubles.
            bytes[..8].copy_from_slice(&(time as f64).to_le_bytes());
            bytes[8..16].copy_from_slice(&(amount as f64).to_le_bytes());
            State::Packed { bytes, len: 16 }
        }
    }

    pub(crate) fn doubles(values: [u64; 3]) -> Self {
        let mut bytes = [0; 24];
        for (chunk, v) in bytes.chunks_exact_mut(8).zip(values) {
            chunk.copy_from_slice(&(v as f64).to_le_bytes());
        }
        State::Packed { bytes, len: 24 }
    }
}

/// A double the code wrote: a whole number from 0 to 2^53.
fn whole(b: &[u8]) -> Option<u64> {
    let d = f64::from_le_bytes(b.try_into().ok()?);
    (d >= 0.0 && d <= END_US as f64 && d.fract() == 0.0).then_some(d as u64)
}

/// A (time, amount) pair as the code packs it; `None` for anything else.
pub(crate) fn unpack_pair(v: &[u8]) -> Option<(u64, u64)> {
    let le = |b: &[u8]| {
        let mut x = [0; 8];
        x[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(x)
    };
    match v.len() {
        12 => Some((le(&v[..7]), le(&v[7..]))),
        16 => Some((whole(&v[..8])?, whole(&v[8..])?)),
        _ => None,
    }
}

fn unpack3(v: &[u8]) -> Option<[u64; 3]> {
    if v.len() != 24 {
        return None;
    }
    Some([whole(&v[..8])?, whole(&v[8..16])?, whole(&v[16..])?])
}

/// A decimal integer; `None` for anything else.
pub(crate) fn decimal(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// A window's count: a decimal integer, below zero read as zero (native
/// counting's compensation that found its window gone leaves a negative
/// count for a moment).
fn count(v: &[u8]) -> Option<u64> {
    let n: i64 = std::str::from_utf8(v).ok()?.parse().ok()?;
    Some(n.max(0) as u64)
}

/// A decision as the code answers it: allowed, remaining, reset after (µs),
/// retry after (µs, `None`: never), delay (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) reset: u64,
    pub(crate) retry: Option<u64>,
    pub(crate) delay: u64,
}

/// What a step leaves: its verdict and, when it writes, the new state and
/// the TTL (µs) it is to be written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stepped {
    pub(crate) verdict: Verdict,
    pub(crate) write: Option<(State, u64)>,
}

impl Limit {
    /// Whether the code keeps this limit's state in one string (every
    /// algorithm but the sliding log and concurrency).
    pub(crate) fn in_string(&self) -> bool {
        !matches!(self.alg, SLIDING_LOG | CONCURRENCY)
    }

    /// Whether its state is a count per window, at `<key>:<window>`.
    pub(crate) fn windowed(&self) -> bool {
        matches!(self.alg, FIXED_WINDOW | HIT_COUNTER)
    }

    /// The number of the window holding `now_us` (a windowed limit's key is
    /// its limit's key, ':' and this number).
    pub(crate) fn window(&self, now_us: u64) -> u64 {
        now_us / self.period.max(1)
    }

    /// Steps the limit at `now_us` on its stored value (`None`: no key).
    /// `write` is false for a peek (a dry run, or a limit after one that
    /// denied): then nothing is to be written, and a hit counter decides as
    /// the fixed window it otherwise is. An error for a value that is not
    /// this algorithm's state, or an algorithm not kept in one string.
    pub(crate) fn step(
        &self,
        stored: Option<&[u8]>,
        now_us: u64,
        write: bool,
    ) -> Result<Stepped, String> {
        let not_state = || "ERR a key does not hold its limit's state".to_owned();
        let bucket = || {
            Quota::new(1, std::time::Duration::from_nanos(self.emission))
                .and_then(|q| q.with_burst(self.burst))
                .map_err(|e| format!("ERR {e}"))
        };
        // One µs as one ns where the quota allows it; else ns.
        let windows = |_: ()| {
            let scale = if self.limit <= self.period { 1 } else { 1000 };
            let period = self.period.checked_mul(scale).ok_or_else(not_state)?;
            Quota::new(self.limit, std::time::Duration::from_nanos(period))
                .map(|q| (q, scale))
                .map_err(|e| format!("ERR {e}"))
        };
        let cost = self.cost;
        let (d, state, scale) = match self.alg {
            GCRA | SHAPING => {
                let q = bucket()?;
                let tat = stored
                    .map(|v| decimal(v).ok_or_else(not_state))
                    .transpose()?;
                let mut tat = Tat(tat.unwrap_or(0));
                let d = if self.alg == GCRA {
                    Gcra.step(&q, &mut tat, now_us, cost)
                } else {
                    let delay_after = self.delay_after;
                    LeakyBucketShaping { delay_after }.step(&q, &mut tat, now_us, cost)
                };
                (d, State::Int(tat.0), 1)
            }
            TOKEN_BUCKET => {
                let q = bucket()?;
                let mut tokens = match stored {
                    Some(v) => {
                        let (last, tokens) = unpack_pair(v).ok_or_else(not_state)?;
                        Tokens { tokens, last }
                    }
                    None => Tokens::default(),
                };
                let d = TokenBucket.step(&q, &mut tokens, now_us, cost);
                (d, State::pair(tokens.last, tokens.tokens), 1)
            }
            LEAKY => {
                let q = bucket()?;
                let mut level = match stored {
                    Some(v) => {
                        let (last, level) = unpack_pair(v).ok_or_else(not_state)?;
                        Level { level, last }
                    }
                    None => Level::default(),
                };
                let d = LeakyBucket.step(&q, &mut level, now_us, cost);
                (d, State::pair(level.last, level.level), 1)
            }
            FIXED_WINDOW | HIT_COUNTER => {
                let (q, scale) = windows(())?;
                let count = stored.map(|v| count(v).ok_or_else(not_state)).transpose()?;
                // The key is the window's: its count is this window's.
                let now = now_us * scale;
                let mut w = WindowCount {
                    last: now,
                    count: count.unwrap_or(0),
                };
                let d = if self.alg == HIT_COUNTER && write {
                    HitCounter.step(&q, &mut w, now, cost)
                } else {
                    FixedWindow.step(&q, &mut w, now, cost)
                };
                (d, State::Int(w.count), scale)
            }
            SLIDING_COUNTER => {
                let (q, scale) = windows(())?;
                let mut w = match stored {
                    Some(v) => {
                        let [last, previous, current] = unpack3(v).ok_or_else(not_state)?;
                        WindowPair {
                            last: last * scale,
                            previous,
                            current,
                        }
                    }
                    None => WindowPair::default(),
                };
                let d = SlidingCounter.step(&q, &mut w, now_us * scale, cost);
                let state = State::doubles([w.last / scale, w.previous, w.current]);
                (d, state, scale)
            }
            other => return Err(format!("ERR algorithm {other} is not kept in one string")),
        };
        // Back to µs: every result is whole µs but a sliding counter's retry,
        // which the code computes in whole µs, rounding up.
        let us = |d: std::time::Duration| {
            u64::try_from(d.as_nanos().div_ceil(u128::from(scale))).unwrap_or(u64::MAX)
        };
        let verdict = Verdict {
            allowed: d.allowed(),
            remaining: d.remaining(),
            reset: us(d.reset_after()),
            retry: d.retry_after().map(us),
            delay: us(d.delay()),
        };
        let counted_deny = self.alg == HIT_COUNTER && !d.allowed();
        let write = (write && cost > 0 && (d.allowed() || counted_deny)).then(|| {
            // A window's count lives until its window ends.
            let ttl = if self.windowed() {
                self.period - now_us % self.period
            } else {
                verdict.reset
            };
            (state, ttl)
        });
        Ok(Stepped { verdict, write })
    }
}

impl Limit {
    /// What giving `cost` units back (the code's `give`, a refund of a
    /// check at `at_us`) makes of the stored string `stored`: its new value,
    /// its TTL kept; `None` when nothing changes. A window's `stored` is the
    /// count of the window of `at_us` ([`Limit::window`]). The sliding log
    /// and concurrency give back on their sorted sets (`sets`).
    pub(crate) fn give(&self, stored: &[u8], cost: u64, at_us: u64) -> Result<State, String> {
        let not_state = || "ERR a key does not hold its limit's state".to_owned();
        // Units of refill or drain: past every capacity when huge, as the
        // code's doubles are.
        let drained = cost.saturating_mul(self.emission);
        Ok(match self.alg {
            FIXED_WINDOW | HIT_COUNTER => {
                State::Int(count(stored).ok_or_else(not_state)?.saturating_sub(cost))
            }
            TOKEN_BUCKET => {
                let (last, tokens) = unpack_pair(stored).ok_or_else(not_state)?;
                let capacity = self.burst.saturating_mul(self.emission);
                State::pair(last, tokens.saturating_add(drained).min(capacity))
            }
            GCRA | SHAPING => State::Int(
                decimal(stored)
                    .ok_or_else(not_state)?
                    .saturating_sub(drained),
            ),
            LEAKY => {
                let (last, level) = unpack_pair(stored).ok_or_else(not_state)?;
                State::pair(last, level.saturating_sub(drained))
            }
            SLIDING_COUNTER => {
                let [last, mut previous, mut current] = unpack3(stored).ok_or_else(not_state)?;
                let p = self.period.max(1);
                // The window the units were taken in, seen from the last
                // admission's.
                match (last / p).checked_sub(at_us / p) {
                    Some(0) => current = current.saturating_sub(cost),
                    Some(1) => previous = previous.saturating_sub(cost),
                    _ => {}
                }
                State::doubles([last, previous, current])
            }
            other => return Err(format!("ERR algorithm {other} is not kept in one string")),
        })
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::Algorithm;

    use super::*;

    fn limit(alg: u8, limit: u64, period: u64, burst: u64, cost: u64) -> Limit {
        Limit {
            alg,
            limit,
            period,
            burst,
            emission: period.div_ceil(limit),
            cost,
            delay_after: 0,
        }
    }

    #[test]
    fn codes_are_the_cores() {
        let named = [
            (TOKEN_BUCKET, Algorithm::TokenBucket),
            (GCRA, Algorithm::Gcra),
            (LEAKY, Algorithm::LeakyBucket),
            (SHAPING, Algorithm::LeakyBucketShaping { delay_after: 0 }),
            (FIXED_WINDOW, Algorithm::FixedWindow),
            (SLIDING_LOG, Algorithm::SlidingLog),
            (SLIDING_COUNTER, Algorithm::SlidingCounter),
            (CONCURRENCY, Algorithm::Concurrency),
            (HIT_COUNTER, Algorithm::HitCounter),
        ];
        for (code, algorithm) in named {
            assert_eq!(code, algorithm.index(), "{algorithm:?}");
        }
        assert_eq!(named.len(), Algorithm::COUNT);
    }

    #[test]
    fn pairs_are_packed_as_the_code_packs_them() {
        for (time, amount, len) in [(1_795_839_000_000_000, 999_999, 12), (5, COMPACT, 16)] {
            let State::Packed { bytes, len: l } = State::pair(time, amount) else {
                panic!("a pair is packed");
            };
            assert_eq!(l, len);
            assert_eq!(unpack_pair(&bytes[..l]), Some((time, amount)));
        }
        // struct.pack('<I7I5', 1, 2) in Redis's Lua.
        assert_eq!(
            unpack_pair(&[1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0]),
            Some((1, 2))
        );
        assert_eq!(unpack_pair(b"123"), None);
    }

    #[test]
    fn a_window_counts_in_its_own_key_until_it_ends() {
        let w = limit(FIXED_WINDOW, 2, 1_000_000, 2, 2);
        assert_eq!(w.window(2_250_000), 2);
        let s = w.step(None, 2_250_000, true).unwrap();
        assert!(s.verdict.allowed);
        assert_eq!((s.verdict.remaining, s.verdict.reset), (0, 750_000));
        assert_eq!(s.write, Some((State::Int(2), 750_000)));
        let s = w.step(Some(b"2"), 2_500_000, true).unwrap();
        assert!(!s.verdict.allowed);
        assert_eq!(s.verdict.retry, Some(500_000));
        assert_eq!(s.write, None, "a fixed window's deny writes nothing");
        // Native counting's negative count reads as none.
        assert!(
            w.step(Some(b"-1"), 2_500_000, true)
                .unwrap()
                .verdict
                .allowed
        );
        assert!(w.step(Some(b"x"), 2_500_000, true).is_err());
    }

    #[test]
    fn a_hit_counter_counts_its_denies_unless_it_peeks() {
        let h = limit(HIT_COUNTER, 10, 1_000_000, 10, 5);
        let s = h.step(Some(b"9"), 200, true).unwrap();
        assert!(!s.verdict.allowed);
        assert_eq!(
            s.write,
            Some((State::Int(11), 999_800)),
            "one past the limit"
        );
        let peek = h.step(Some(b"0"), 200, false).unwrap();
        assert_eq!(peek.write, None);
        // A cost above the limit on an empty window: counted, the window
        // is used until it ends; peeked, as the fixed window, it is not.
        let over = limit(HIT_COUNTER, 10, 1_000_000, 10, 11);
        let s = over.step(None, 200, true).unwrap();
        assert_eq!(s.write, Some((State::Int(11), 999_800)));
        assert_eq!(s.verdict.reset, 999_800);
        assert_eq!(over.step(None, 200, false).unwrap().verdict.reset, 0);
    }

    #[test]
    fn a_sliding_counter_rounds_its_retry_up_to_whole_microseconds() {
        // 3 per 10 µs (more units than µs would not be: 3 ≤ 10).
        let c = limit(SLIDING_COUNTER, 3, 10, 3, 1);
        let full = State::doubles([5, 0, 3]);
        let State::Packed { bytes, len } = full else {
            panic!("three doubles");
        };
        // At 13 µs, 3 × 7/10 of the previous window's 3 count: 2.1 + 1 > 3.
        let s = c.step(Some(&bytes[..len]), 13, true).unwrap();
        assert!(!s.verdict.allowed);
        // Fits once 3 × (10 - e)/10 ≤ 2, e ≥ 3.34: at 14 µs, 1 from now.
        assert_eq!(s.verdict.retry, Some(1));
        // More units than µs: the same answers in ns.
        let many = limit(SLIDING_COUNTER, 100, 10, 100, 100);
        let s = many.step(None, 13, true).unwrap();
        assert!(s.verdict.allowed);
        assert_eq!(s.write, Some((State::doubles([13, 0, 100]), 17)));
    }

    #[test]
    fn buckets_answer_in_whole_microseconds() {
        // 3 per second: a unit every 333,334 µs, as the store sends it.
        let g = limit(GCRA, 3, 1_000_000, 1, 1);
        let s = g.step(None, 10_000_000, true).unwrap();
        assert_eq!(s.verdict.reset, 333_334);
        assert_eq!(s.write, Some((State::Int(10_333_334), 333_334)));
        let s = g.step(Some(b"10333334"), 10_000_001, true).unwrap();
        assert_eq!(s.verdict.retry, Some(333_333));
        assert_eq!(s.write, None);
        assert!(g.step(Some(b"x"), 0, true).is_err());
        let mut shaping = limit(SHAPING, 10, 1_000_000, 3, 1);
        shaping.delay_after = 1;
        let s = shaping.step(Some(b"1200000"), 1_000_000, true).unwrap();
        assert!(s.verdict.allowed);
        assert_eq!(s.verdict.delay, 100_000, "200 ms queued, 100 ms free");
        let tb = limit(TOKEN_BUCKET, 2, 1_000_000, 2, 1);
        let s = tb.step(None, 1_000_000, true).unwrap();
        assert_eq!(s.write, Some((State::pair(1_000_000, 500_000), 500_000)));
        let lb = limit(LEAKY, 2, 1_000_000, 2, 1);
        let s = lb.step(None, 1_000_000, true).unwrap();
        assert_eq!(s.write, Some((State::pair(1_000_000, 500_000), 500_000)));
        let log = limit(SLIDING_LOG, 2, 1_000_000, 2, 1);
        assert!(!log.in_string());
        assert!(log.step(None, 0, true).is_err());
    }
}
