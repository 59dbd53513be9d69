//! Counting without a script: a fixed window or a hit counter is checked
//! with native commands, pipelined as envoyproxy/ratelimit counts (sent by
//! store/each.rs, alone or beside a request's other counting limits).
//!
//! Each window's count is a decimal integer at `<key>:<window>`
//! ([`window_key`]), the encoding the Lua code steps too, so a limit counted
//! natively and in a script call (beside other limits, all-or-nothing) is
//! one count. A check of cost `c > 0` sends `INCRBY key c` and `PEXPIRE key
//! ttl NX` (plain `PEXPIRE` before Redis 7.0: the TTL always ends at the
//! window's end, so setting it again moves nothing) and decides from the
//! count the `INCRBY` answers, minus `c`, exactly as the script decides
//! from the count it reads:
//!
//! - a hit counter keeps every hit, denied or not (envoyproxy/ratelimit's
//!   `INCRBY`); its count is not capped at one past the limit as the
//!   script's is, which no decision can tell apart;
//! - a fixed window must not count a deny: it gives its units back with
//!   `DECRBY` (one more round trip, on denies only). Until that lands, other
//!   checks of the window see them taken: a brief false deny is possible,
//!   never a false admit;
//! - a read (cost 0), and a fixed window's cost above its limit (which never
//!   fits), only `GET` the count.
//!
//! A window's first check from a store that did not count the key's
//! previous window either (a sparse key) sends `SET key c NX PX ttl`
//! instead: one command that makes the count with its TTL. Where the count
//! exists already (another instance made it), it writes nothing and the
//! check goes on with `INCRBY` + `PEXPIRE … NX`.
//!
//! The window is the request's time divided by the period, so the store
//! needs the time before it sends: the injected clock's, or Redis's `TIME`
//! as [`RedisClock`] follows it.
//!
//! The TTL goes once per window and key, not once per check: a window's key
//! this store already gave a TTL ([`Expiring`]) gets the `INCRBY` alone, one
//! command where envoyproxy/ratelimit sends two. Whatever made the key anew
//! in between (a reset, an eviction, its expiry on a clock a little apart)
//! shows in the answer: an `INCRBY` answering exactly its cost made the key,
//! and the TTL follows at once ([`Window::created`]). So every key an
//! `INCRBY` makes gets its TTL from the check that made it, in the same
//! pipeline or right after; only a follow-up that never lands (the process
//! stops, or Redis goes away, between the two) leaves a key without one, and
//! that key is the count of the window in its name, which no later window
//! reads: a stale key, never a limit held shut.

use std::hash::BuildHasher;
use std::hash::RandomState;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::RedisResult;

use crate::conn::Conn;
use crate::script::{MAX_MICROS, Params};

use crate::keys::window_key;

/// How often [`RedisClock`] reads Redis's `TIME` again.
const RESYNC: Duration = Duration::from_secs(10);

/// Redis's clock as this process follows it: `TIME` read at connect and
/// every [`RESYNC`], advanced in between by the local monotonic clock.
/// Between two reads it is off by at most half a round trip plus the two
/// clocks' drift (microseconds); it never goes back.
pub(crate) struct RedisClock {
    /// A local instant and Redis's time at it (µs).
    synced: Mutex<(Instant, u64)>,
    /// The latest time answered, so a read after a resync never goes back.
    latest: AtomicU64,
}

impl RedisClock {
    /// Reads Redis's time, and keeps reading it every [`RESYNC`] while the
    /// clock lives.
    pub(crate) async fn start(conn: &Conn) -> RedisResult<Arc<Self>> {
        let clock = Arc::new(Self {
            synced: Mutex::new(sample(conn).await?),
            latest: AtomicU64::new(0),
        });
        let (weak, conn) = (Arc::downgrade(&clock), conn.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RESYNC).await;
                let Some(clock) = weak.upgrade() else {
                    return;
                };
                // A failed read keeps the last one: the store's own calls
                // report Redis's trouble.
                if let Ok(synced) = sample(&conn).await {
                    *clock.synced.lock() = synced;
                }
            }
        });
        Ok(clock)
    }

    /// Redis's time now, in µs.
    pub(crate) fn now_us(&self) -> u64 {
        let (at, us) = *self.synced.lock();
        let elapsed = u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX);
        let now = us.saturating_add(elapsed);
        self.latest.fetch_max(now, Ordering::Relaxed).max(now)
    }
}

/// Redis's `TIME` (µs), taken as the time halfway through the round trip.
async fn sample(conn: &Conn) -> RedisResult<(Instant, u64)> {
    let sent = Instant::now();
    let (secs, micros): (u64, u64) = conn.query(&redis::cmd("TIME")).await?;
    let rtt = sent.elapsed();
    Ok((sent + rtt / 2, secs.saturating_mul(1_000_000) + micros))
}

/// Window keys this store has given a TTL, as hashes in a fixed table: a
/// key whose slot another key took since is sent its TTL again (harmless:
/// `NX`), and a key removed since is told by its `INCRBY`'s answer.
pub(crate) struct Expiring {
    slots: Box<[AtomicU64]>,
    hasher: RandomState,
}

/// Slots of [`Expiring`] (8 bytes each, 128 KiB): about this many busy
/// windows at once are sent `INCRBY` alone.
const EXPIRING_SLOTS: usize = 1 << 14;

impl Expiring {
    pub(crate) fn new() -> Self {
        Self {
            slots: (0..EXPIRING_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: RandomState::new(),
        }
    }

    /// The key's hash (never 0, the empty slot's) and its slot.
    fn locate(&self, key: &str) -> (u64, &AtomicU64) {
        let hash = self.hasher.hash_one(key) | 1;
        // The table's size is a power of two: the low bits pick the slot.
        let slot = &self.slots[(hash >> 1) as usize & (EXPIRING_SLOTS - 1)];
        (hash, slot)
    }

    /// Whether this store gave `key` its TTL (a false "no" costs one
    /// `PEXPIRE … NX`, and a false "yes" is caught by [`Window::created`]).
    pub(crate) fn has(&self, key: &str) -> bool {
        let (hash, slot) = self.locate(key);
        slot.load(Ordering::Relaxed) == hash
    }

    /// Notes that `key` has its TTL.
    pub(crate) fn insert(&self, key: &str) {
        let (hash, slot) = self.locate(key);
        slot.store(hash, Ordering::Relaxed);
    }

    /// Notes that `key` may lack its TTL: its next check sends one.
    pub(crate) fn forget(&self, key: &str) {
        let (hash, slot) = self.locate(key);
        let _ = slot.compare_exchange(hash, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// What a native check of one window sends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// `GET` the count: a read, or a cost that never fits a fixed window.
    Read,
    /// `INCRBY` the cost and set the TTL (ms) if the key has none.
    Count { ttl_ms: u64 },
}

/// One native check of a fixed window (`hit_counter` false) or a hit counter
/// at `now_us`: its window's key, what to send, and how to decide.
#[derive(Debug)]
pub(crate) struct Window {
    pub(crate) key: String,
    pub(crate) plan: Plan,
    params: Params,
    hit_counter: bool,
    now_us: u64,
    until_end: u64,
    /// The window's number.
    window: u64,
}

impl Window {
    /// `key` is the limit's Redis key; `extra_ms` pads the TTL.
    pub(crate) fn new(
        key: &str,
        params: Params,
        hit_counter: bool,
        now_us: u64,
        extra_ms: u64,
    ) -> Self {
        let period = params.period_us;
        let until_end = period - now_us % period;
        let counts = params.cost > 0 && (hit_counter || params.cost <= params.limit);
        let plan = if counts {
            Plan::Count {
                ttl_ms: ttl_ms(until_end, extra_ms),
            }
        } else {
            Plan::Read
        };
        let window = now_us / period;
        Self {
            key: window_key(key, window),
            plan,
            params,
            hit_counter,
            now_us,
            until_end,
            window,
        }
    }

    /// The key of the same limit's previous window.
    pub(crate) fn previous_key(&self) -> String {
        let limit = self.key.rsplit_once(':').map_or("", |(limit, _)| limit);
        window_key(limit, self.window.saturating_sub(1))
    }

    /// Whether an `INCRBY` answering `answer` made the window's key (the
    /// count before it was 0: absent, or given back to 0, which has its
    /// TTL already; a second `PEXPIRE … NX` moves nothing).
    pub(crate) fn created(&self, answer: i64) -> bool {
        matches!(self.plan, Plan::Count { .. }) && answer == self.cost_i64()
    }

    /// The cost given back with `DECRBY` after [`Window::decide`] denied a
    /// fixed window's counted check; 0 when there is nothing to give back.
    pub(crate) fn refund(&self, allowed: bool) -> u64 {
        match self.plan {
            Plan::Count { .. } if !allowed && !self.hit_counter => self.params.cost,
            _ => 0,
        }
    }

    /// The decision as the script's reply gives it (`[now, all allowed,
    /// allowed, remaining, reset_after, retry_after (-1: never), delay]`),
    /// from what Redis answered: the count (`GET`) or the count after the
    /// increment (`INCRBY`); `None` for a key without a count.
    pub(crate) fn decide(&self, answer: Option<i64>) -> [i64; 7] {
        let answer = answer.unwrap_or(0);
        let count = match self.plan {
            Plan::Read => answer,
            Plan::Count { .. } => answer.saturating_sub(self.cost_i64()),
        };
        // Never below zero: a compensation that found its window gone
        // leaves a negative count for a millisecond.
        let count = u64::try_from(count).unwrap_or(0);
        let (l, cost) = (self.params.limit, self.params.cost);
        let until_end = self.until_end;
        let reset = |c: u64| if c == 0 { 0 } else { until_end };
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let (allowed, remaining, reset_after, retry) = match count.checked_add(cost) {
            Some(after) if after <= l => (true, l - after, reset(after), -1),
            _ => {
                // The end of time is 2^53 µs, as in the script.
                let retry = if cost <= l && self.now_us + until_end <= 2 * MAX_MICROS {
                    i(until_end)
                } else {
                    -1
                };
                let written = self.hit_counter && cost > 0;
                let reset_after = if written { until_end } else { reset(count) };
                (false, l.saturating_sub(count), reset_after, retry)
            }
        };
        let allowed = i64::from(allowed);
        [
            i(self.now_us),
            allowed,
            allowed,
            i(remaining),
            i(reset_after),
            retry,
            0,
        ]
    }

    fn cost_i64(&self) -> i64 {
        i64::try_from(self.params.cost).unwrap_or(i64::MAX)
    }
}

/// A TTL of `us` as the script sets it: whole milliseconds rounded up, at
/// least 1, plus the padding.
fn ttl_ms(us: u64, extra_ms: u64) -> u64 {
    us.div_ceil(1000).max(1).saturating_add(extra_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{Algorithm, FailurePolicy, FixedWindow, HitCounter, Limit, Quota};
    use tollgate_core::{StateMachine, WindowCount};

    fn params(limit: u64, cost: u64) -> Params {
        let l = Limit {
            key: "k",
            quota: Quota::per_second(limit).unwrap(),
            algorithm: Algorithm::FixedWindow,
            cost,
            failure: FailurePolicy::Local,
        };
        Params::new(&l, true).unwrap()
    }

    /// Every count before a check, every cost and both algorithms: the
    /// native decision is the core's step on a state of that count.
    #[test]
    fn native_decisions_are_the_state_machines() {
        let now_us = 1_700_000_000_250_000;
        for hit_counter in [false, true] {
            for count in 0..8u64 {
                for cost in 0..8u64 {
                    let p = params(5, cost);
                    let w = Window::new("k", p, hit_counter, now_us, 0);
                    let answer = match w.plan {
                        Plan::Read => count,
                        Plan::Count { ttl_ms } => {
                            assert_eq!(ttl_ms, 750);
                            count + cost
                        }
                    };
                    let got = w.decide(Some(answer as i64));
                    let quota = Quota::per_second(5).unwrap();
                    let mut state = WindowCount {
                        last: now_us * 1000,
                        count,
                    };
                    let want = if hit_counter {
                        HitCounter.step(&quota, &mut state, now_us * 1000, cost)
                    } else {
                        FixedWindow.step(&quota, &mut state, now_us * 1000, cost)
                    };
                    let case = format!("hit counter {hit_counter}, count {count}, cost {cost}");
                    assert_eq!(got[2] == 1, want.allowed(), "{case}");
                    assert_eq!(got[3] as u64, want.remaining(), "{case}");
                    assert_eq!(
                        Duration::from_micros(got[4] as u64),
                        want.reset_after(),
                        "{case}"
                    );
                    let retry = (got[5] >= 0).then(|| Duration::from_micros(got[5] as u64));
                    assert_eq!(retry, want.retry_after(), "{case}");
                    let refund = w.refund(want.allowed());
                    let counted = matches!(w.plan, Plan::Count { .. });
                    assert_eq!(
                        refund > 0,
                        counted && !want.allowed() && !hit_counter,
                        "{case}"
                    );
                }
            }
        }
    }

    #[test]
    fn window_keys_and_ttls_follow_the_window() {
        let w = Window::new("tg:fw3:{a}", params(5, 1), false, 2_999_999, 7);
        assert_eq!(w.key, "tg:fw3:{a}:2");
        assert_eq!(w.previous_key(), "tg:fw3:{a}:1");
        assert_eq!(w.plan, Plan::Count { ttl_ms: 1 + 7 });
        let read = Window::new("tg:fw3:{a}", params(5, 6), false, 3_000_000, 0);
        assert_eq!(
            (read.key.as_str(), &read.plan),
            ("tg:fw3:{a}:3", &Plan::Read)
        );
        let counted = Window::new("tg:hc3:{a}", params(5, 6), true, 3_000_000, 0);
        assert_eq!(counted.plan, Plan::Count { ttl_ms: 1000 });
    }
}
