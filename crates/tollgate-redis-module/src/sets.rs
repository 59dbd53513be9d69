//! The limits the Lua code keeps in a sorted set beside a count (`load_log`,
//! `load_leases`, the `log` and `lease` branches of `step` and `write`, and
//! op `l` in tollgate.lua), stepped as the code steps them, on the same
//! members, scores, counts and TTLs, through [`Sets`], so that this is
//! tested without Redis:
//!
//! - the sliding log: members `<time>:<cost>` scored by their time (µs), one
//!   per time (a second admission at one time adds to its member), and the
//!   total of their costs at the aux key; entries leave on the next
//!   admission;
//! - concurrency: leases `<cost>|<id>` scored by their expiry (µs), and the
//!   in-flight total at the aux key; a crashed holder's lease expires.
//!
//! Times are whole µs below 2^53, so the code's doubles and these integers
//! agree; a count is signed, as the code's is, so that a count another
//! client set oddly gives the code's answer, not a panic.

use crate::step::{END_US, Limit, Verdict};

/// Visits a member of a sorted set (its score, its bytes): answers whether
/// to go on.
pub(crate) type Visit<'a> = dyn FnMut(u64, &[u8]) -> Result<bool, String> + 'a;

/// A limit's sorted set and its aux count, named by the position `k` of the
/// set's key among the request's keys (the aux key follows it).
pub(crate) trait Sets {
    /// The aux count (`GET`; 0 when there is none).
    fn total(&mut self, k: usize) -> Result<i64, String>;
    /// The highest score (`ZRANGE key -1 -1 WITHSCORES`).
    fn last(&mut self, k: usize) -> Result<Option<u64>, String>;
    /// Calls `f` on each member scored above `above` (every member for
    /// `None`) and at most `upto`, ascending, while `f` answers true.
    fn each(
        &mut self,
        k: usize,
        above: Option<u64>,
        upto: u64,
        f: &mut Visit<'_>,
    ) -> Result<(), String>;
    /// Removes `member` (`ZREM`): whether it was there.
    fn remove(&mut self, k: usize, member: &[u8]) -> Result<bool, String>;
    /// Adds `member` at `score` (`ZADD`).
    fn add(&mut self, k: usize, score: u64, member: &[u8]) -> Result<(), String>;
    /// Sets the aux count (`SET`, which drops its TTL, or with `keep_ttl`
    /// `SET … KEEPTTL`).
    fn set_total(&mut self, k: usize, total: i64, keep_ttl: bool) -> Result<(), String>;
    /// Gives the set (or, with `aux`, its count) a TTL of `ttl_us` as the
    /// code's `ttl_ms` makes it (whole ms rounded up, at least 1, plus the
    /// call's padding); with `at_least`, only when its TTL is shorter (a key
    /// without one has none: it gets it).
    fn expire(&mut self, k: usize, aux: bool, ttl_us: u64, at_least: bool) -> Result<(), String>;
}

fn not_state() -> String {
    "ERR a key does not hold its limit's state".to_owned()
}

fn digits(b: &[u8]) -> Option<i64> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// A log entry's cost: the digits after its last ':' (`':(%d+)$'`).
fn logged(member: &[u8]) -> Result<i64, String> {
    let at = member
        .iter()
        .rposition(|&b| b == b':')
        .ok_or_else(not_state)?;
    digits(&member[at + 1..]).ok_or_else(not_state)
}

/// A lease's cost: its leading digits (`'^(%d+)'`).
fn leased(member: &[u8]) -> Result<i64, String> {
    let end = member
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(member.len());
    digits(&member[..end]).ok_or_else(not_state)
}

fn verdict(allowed: bool, remaining: i64, reset: i64, retry: Option<i64>) -> Verdict {
    let whole = |n: i64| u64::try_from(n).unwrap_or(0);
    Verdict {
        allowed,
        remaining: whole(remaining),
        reset: whole(reset),
        retry: retry.map(whole),
        delay: 0,
    }
}

/// The sum of the costs of the log's entries scored at most `upto` (none
/// below 0), and, with `gather`, those entries.
fn log_sum(
    db: &mut dyn Sets,
    k: usize,
    upto: i64,
    mut gather: Option<&mut Vec<Vec<u8>>>,
) -> Result<i64, String> {
    let mut sum = 0;
    if let Ok(upto) = u64::try_from(upto) {
        db.each(k, None, upto, &mut |_, m| {
            sum += logged(m)?;
            if let Some(g) = gather.as_deref_mut() {
                g.push(m.to_vec());
            }
            Ok(true)
        })?;
    }
    Ok(sum)
}

/// A sorted set's state while a request is checked: what it holds, and what
/// the request's limits on it have taken so far (two limits of a request on
/// one key see each other's tentative admission, as in the memory store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SetState {
    Log {
        total: i64,
        newest: Option<i64>,
        /// Entries at or below this time are gone (-1: none drained).
        drained: i64,
        /// This request's admissions, all at `at`.
        pending: i64,
        at: i64,
        dirty: bool,
    },
    Leases {
        count: i64,
        /// This request's new leases: member and expiry.
        added: Vec<(Vec<u8>, u64)>,
        dirty: bool,
    },
}

impl SetState {
    /// Loads the state of `limit`'s set (a sliding log's or a concurrency
    /// limit's) at `now_us`.
    pub(crate) fn load(
        db: &mut dyn Sets,
        k: usize,
        limit: &Limit,
        now_us: u64,
    ) -> Result<Self, String> {
        let total = db.total(k)?;
        if limit.alg == crate::step::SLIDING_LOG {
            let newest = db.last(k)?.map(|t| t as i64);
            return Ok(Self::Log {
                total,
                newest,
                drained: -1,
                pending: 0,
                at: 0,
                dirty: false,
            });
        }
        let mut expired = 0;
        db.each(k, None, now_us, &mut |_, m| {
            expired += leased(m)?;
            Ok(true)
        })?;
        Ok(Self::Leases {
            count: (total - expired).max(0),
            added: Vec::new(),
            dirty: false,
        })
    }

    /// Steps `limit` (the `index`th of its request, from 1) on this state
    /// at `now_us`; `write` false for a peek. A concurrency limit's lease
    /// is `<cost>|<lease><_index>`. Returns the verdict and, when it took
    /// something, the TTL (µs) to write the set with.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn step(
        &mut self,
        db: &mut dyn Sets,
        k: usize,
        limit: &Limit,
        now_us: u64,
        write: bool,
        lease: &[u8],
        index: usize,
    ) -> Result<(Verdict, Option<u64>), String> {
        let (l, cost, p) = (limit.limit as i64, limit.cost as i64, limit.period as i64);
        match self {
            Self::Log {
                total: stored,
                newest,
                drained,
                pending,
                at,
                dirty,
            } => {
                let n = (now_us as i64).max(newest.unwrap_or(0));
                let threshold = n - p;
                // Live total: what is stored, less what has left the window
                // (or was drained by an earlier limit of this request), plus
                // this request's own tentative admissions (at `n`, live).
                let total = *stored - log_sum(db, k, threshold.max(*drained), None)? + *pending;
                let newest_live = if *pending > 0 {
                    Some(n)
                } else {
                    newest.filter(|&t| n - t < p && t > *drained)
                };
                let reset = |t: Option<i64>| t.map_or(0, |t| p - (n - t));
                if total + cost <= l {
                    let reset_after = if cost > 0 { p } else { reset(newest_live) };
                    let v = verdict(true, l - (total + cost), reset_after, None);
                    if cost > 0 && write {
                        *drained = (*drained).max(threshold);
                        *pending += cost;
                        *at = n;
                        *dirty = true;
                        return Ok((v, Some(limit.period)));
                    }
                    return Ok((v, None));
                }
                let mut retry = None;
                if cost <= l {
                    let from = threshold.max(*drained);
                    let (mut left, mut found, mut last) = (total, false, None);
                    let own = *pending;
                    db.each(k, u64::try_from(from).ok(), u64::MAX, &mut |t, m| {
                        let t = t as i64;
                        let mut c = logged(m)?;
                        if own > 0 && t == n {
                            c += own;
                        }
                        left -= c;
                        last = Some(t);
                        if cost <= l - left {
                            if t + p <= END_US as i64 {
                                retry = Some(t + p - n);
                            }
                            found = true;
                        }
                        Ok(!found)
                    })?;
                    // The request's own tentative entry is the last to leave.
                    if !found && own > 0 && last != Some(n) && n + p <= END_US as i64 {
                        retry = Some(p);
                    }
                }
                Ok((
                    verdict(false, (l - total).max(0), reset(newest_live), retry),
                    None,
                ))
            }
            Self::Leases {
                count,
                added,
                dirty,
            } => {
                if *count + cost <= l {
                    let after = *count + cost;
                    let v = verdict(true, l - after, 0, None);
                    if cost > 0 && write {
                        *count = after;
                        *dirty = true;
                        let mut member = Vec::with_capacity(24 + lease.len());
                        member.extend_from_slice(itoa::Buffer::new().format(cost).as_bytes());
                        member.push(b'|');
                        member.extend_from_slice(lease);
                        member.push(b'_');
                        member.extend_from_slice(itoa::Buffer::new().format(index).as_bytes());
                        added.push((member, now_us + limit.period));
                        return Ok((v, Some(limit.period)));
                    }
                    return Ok((v, None));
                }
                Ok((verdict(false, (l - *count).max(0), 0, None), None))
            }
        }
    }

    /// Writes what this request took (when it took anything), the TTL
    /// `ttl_us`, as the code's `write` does at `now_us`.
    pub(crate) fn write(
        &self,
        db: &mut dyn Sets,
        k: usize,
        ttl_us: u64,
        now_us: u64,
    ) -> Result<(), String> {
        match self {
            Self::Log {
                total,
                drained,
                pending,
                at,
                dirty: true,
                ..
            } => {
                let mut gone_members = Vec::new();
                let gone = log_sum(db, k, *drained, Some(&mut gone_members))?;
                for m in &gone_members {
                    db.remove(k, m)?;
                }
                let at = *at as u64;
                let mut add = *pending;
                let mut merged = None;
                db.each(k, at.checked_sub(1), at, &mut |_, m| {
                    merged = Some(m.to_vec());
                    Ok(false)
                })?;
                if let Some(m) = merged {
                    add += logged(&m)?;
                    db.remove(k, &m)?;
                }
                let mut member = Vec::with_capacity(40);
                member.extend_from_slice(itoa::Buffer::new().format(at).as_bytes());
                member.push(b':');
                member.extend_from_slice(itoa::Buffer::new().format(add).as_bytes());
                db.add(k, at, &member)?;
                db.set_total(k, total - gone + pending, false)?;
                db.expire(k, false, ttl_us, false)?;
                db.expire(k, true, ttl_us, false)
            }
            Self::Leases {
                count,
                added,
                dirty: true,
            } => {
                let mut expired = Vec::new();
                db.each(k, None, now_us, &mut |_, m| {
                    expired.push(m.to_vec());
                    Ok(true)
                })?;
                for m in &expired {
                    db.remove(k, m)?;
                }
                for (member, expiry) in added {
                    db.add(k, *expiry, member)?;
                }
                db.set_total(k, *count, false)?;
                db.expire(k, false, ttl_us, true)?;
                db.expire(k, true, ttl_us, true)
            }
            _ => Ok(()),
        }
    }
}

/// Releases leases (op `l`): the `j`th member's set is at key `2j`, its
/// count at `2j + 1`. A released lease's cost leaves the in-flight count,
/// whose TTL stays. Every member is read before any is released: one
/// without a cost fails the call with nothing written.
pub(crate) fn release<M: AsRef<[u8]>>(db: &mut dyn Sets, members: &[M]) -> Result<(), String> {
    let costs = members
        .iter()
        .map(|m| {
            leased(m.as_ref()).map_err(|_| {
                format!(
                    "ERR a lease is <cost>|<id>, got {}",
                    m.as_ref().escape_ascii()
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (j, (member, cost)) in members.iter().zip(costs).enumerate() {
        if db.remove(2 * j, member.as_ref())? {
            let count = db.total(2 * j)?;
            db.set_total(2 * j, (count - cost).max(0), true)?;
        }
    }
    Ok(())
}

/// Gives back what a check at `at_us` took from the set at `k` (the code's
/// refund): a sliding log's `cost` off its entry at `at_us`, if it lives; a
/// concurrency limit's lease `member`. The count loses what left, its TTL
/// kept.
pub(crate) fn give_back(
    db: &mut dyn Sets,
    k: usize,
    limit: &Limit,
    at_us: u64,
    member: &[u8],
) -> Result<(), String> {
    let cost = limit.cost as i64;
    if limit.alg == crate::step::CONCURRENCY {
        if db.remove(k, member)? {
            let count = db.total(k)?;
            db.set_total(k, (count - cost).max(0), true)?;
        }
        return Ok(());
    }
    let mut entry = None;
    db.each(k, at_us.checked_sub(1), at_us, &mut |_, m| {
        entry = Some(m.to_vec());
        Ok(false)
    })?;
    let Some(entry) = entry else {
        return Ok(());
    };
    let held = logged(&entry)?;
    db.remove(k, &entry)?;
    let taken = held.min(cost);
    if held > taken {
        let mut rest = Vec::with_capacity(40);
        rest.extend_from_slice(itoa::Buffer::new().format(at_us).as_bytes());
        rest.push(b':');
        rest.extend_from_slice(itoa::Buffer::new().format(held - taken).as_bytes());
        db.add(k, at_us, &rest)?;
    }
    let total = db.total(k)?;
    db.set_total(k, (total - taken).max(0), true)
}
