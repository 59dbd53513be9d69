//! `TOLLGATE.CHECK`'s requests: the argument tollgate-redis sends its Lua
//! code (`check_request` in tollgate.lua), decoded and checked all or
//! nothing, with the keys read and written through the caller, so that this
//! is tested without Redis.
//!
//! A request is one argument of little-endian doubles: its time in µs (-1:
//! the server's clock) and its number of limits, then seven per limit
//! (algorithm, limit, period, burst, emission interval, cost, delay_after);
//! then, as text, the base of the lease ids its concurrency limits add. Its
//! keys are one per limit, two for a sliding log or a concurrency limit
//! (state, aux). Its reply is its time, whether every limit admitted, then
//! five per limit (allowed, remaining, reset after, retry after or -1,
//! delay), little-endian doubles.

use smallvec::SmallVec;

use crate::sets::{SetState, Sets};
use crate::step::{END_US, HIT_COUNTER, Limit, State, Stepped};

/// The bytes of a request's head and of each of its limits.
const HEAD: usize = 16;
const LIMIT: usize = 56;
/// The largest count the code takes (2^52 + 1 for a clamped cost).
pub(crate) const MAX_COUNT: u64 = (1 << 52) + 1;

/// A decoded request.
#[derive(Debug, Clone)]
pub(crate) struct Request<'a> {
    /// Its time in µs; `None`: the server's.
    pub(crate) time: Option<u64>,
    /// Its limits, decoded once.
    limits: SmallVec<[Limit; 2]>,
    /// Its number of keys.
    keys: usize,
    blob: &'a [u8],
}

pub(crate) fn double(b: &[u8]) -> f64 {
    f64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// A whole number in `0..=max` the code sends as a double.
pub(crate) fn number(b: &[u8], what: &str, max: u64) -> Result<u64, String> {
    let d = double(b);
    // In range, `d as u64` is exact for a whole `d` only (every bound is at
    // most 2^53): cheaper than `fract`, a call into libm on x86-64.
    if d >= 0.0 && d <= max as f64 && (d as u64) as f64 == d {
        Ok(d as u64)
    } else {
        Err(format!(
            "ERR a request's {what} must be a whole number from 0 to {max}, got {d}"
        ))
    }
}

impl<'a> Request<'a> {
    /// Decodes and validates a request: every number whole and in the
    /// code's range, every algorithm known.
    pub(crate) fn parse(blob: &'a [u8]) -> Result<Self, String> {
        if blob.len() < HEAD {
            return Err(format!(
                "ERR a request is at least {HEAD} bytes, got {}",
                blob.len()
            ));
        }
        let t = double(&blob[..8]);
        let time = if t < 0.0 {
            None
        } else {
            Some(number(&blob[..8], "time", END_US - 1)?)
        };
        let count = number(&blob[8..16], "number of limits", 1 << 16)? as usize;
        if blob.len() < HEAD + LIMIT * count {
            return Err(format!(
                "ERR a request of {count} limits is at least {} bytes, got {}",
                HEAD + LIMIT * count,
                blob.len()
            ));
        }
        let limits = (0..count)
            .map(|i| decode(&blob[HEAD + LIMIT * i..HEAD + LIMIT * (i + 1)]))
            .collect::<Result<SmallVec<[Limit; 2]>, _>>()?;
        let keys = limits.iter().map(|l| 1 + usize::from(!l.in_string())).sum();
        Ok(Self {
            time,
            limits,
            keys,
            blob,
        })
    }

    /// Its number of limits.
    pub(crate) fn len(&self) -> usize {
        self.limits.len()
    }

    /// Its `i`th limit.
    pub(crate) fn limit(&self, i: usize) -> Limit {
        self.limits[i]
    }

    /// Its number of keys: one per limit, two for a limit kept in a sorted
    /// set (the set and its count).
    pub(crate) fn keys(&self) -> usize {
        self.keys
    }

    /// Whether `got` keys are the keys the request takes ([`Request::keys`]).
    fn takes(&self, got: usize) -> Result<(), String> {
        if got == self.keys {
            Ok(())
        } else {
            Err(format!(
                "ERR a request of {} limits takes {} keys, got {got}",
                self.len(),
                self.keys
            ))
        }
    }

    /// The base of the lease ids its concurrency limits add: the text after
    /// its limits.
    fn lease(&self) -> &'a [u8] {
        &self.blob[HEAD + LIMIT * self.len()..]
    }
}

/// A limit's seven numbers, each whole and in the code's range, its
/// algorithm known.
fn decode(b: &[u8]) -> Result<Limit, String> {
    let n = |j: usize, what: &str, max: u64| number(&b[8 * j..8 * j + 8], what, max);
    let alg = n(0, "algorithm", 255)? as u8;
    if alg > HIT_COUNTER {
        return Err(format!("ERR unknown algorithm {alg}"));
    }
    Ok(Limit {
        alg,
        limit: n(1, "limit", MAX_COUNT)?,
        period: n(2, "period", END_US)?.max(1),
        burst: n(3, "burst", MAX_COUNT)?,
        emission: n(4, "emission interval", END_US)?.max(1),
        cost: n(5, "cost", MAX_COUNT)?,
        delay_after: n(6, "delay_after", MAX_COUNT)?,
    })
}

/// A step on a stored value (`None`: no key).
pub(crate) type Decide<'a> = dyn FnMut(Option<&[u8]>) -> Result<Stepped, String> + 'a;

/// The keys a request's check reads and writes: its string states, read
/// here, written by the caller ([`Write`]), and its sorted sets ([`Sets`]),
/// read and written here. A key is named by its position among the
/// request's keys.
pub(crate) trait Db: Sets {
    /// Hands `decide` the stored value of `name`: the string state of the
    /// limit whose key is at `k`, or its window's (made from it).
    fn string(&mut self, k: usize, name: &[u8], decide: &mut Decide<'_>)
    -> Result<Stepped, String>;
    /// The string at `name` (`GET`), for a refund.
    fn get(&mut self, name: &[u8]) -> Result<Option<Vec<u8>>, String>;
    /// Sets the string at `name`, keeping its TTL (`SET … KEEPTTL`), for a
    /// refund.
    fn put(&mut self, name: &[u8], value: &[u8]) -> Result<(), String>;
}

/// A key's name, made without an allocation when short, as keys are.
pub(crate) type Name = SmallVec<[u8; 96]>;

/// The string states a request's check writes.
pub(crate) type Writes = SmallVec<[Write; 2]>;

/// A new value to write: the key's name, the position of the key it is (or
/// whose window's it is), the state and its TTL (µs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) key: Name,
    pub(crate) at: usize,
    pub(crate) state: State,
    pub(crate) ttl_us: u64,
}

/// Checks `request` at `now_us` on `keys` (its own, in order: one per
/// limit, two for a sliding log or a concurrency limit), as the code's
/// `check_request`. Limits on one key see each other's tentative admission.
/// Appends the reply's numbers to `reply`. Writes its sorted sets through
/// `db`, and returns the string states to write: nothing unless `commit`
/// and every limit admitted (or the request's one limit is a hit counter,
/// whose denies count).
pub(crate) fn check<K: AsRef<[u8]>, D: Db>(
    request: &Request<'_>,
    keys: &[K],
    now_us: u64,
    commit: bool,
    db: &mut D,
    reply: &mut Vec<u8>,
) -> Result<Writes, String> {
    request.takes(keys.len())?;
    let start = reply.len();
    for v in [now_us as f64, 1.0] {
        reply.extend_from_slice(&v.to_le_bytes());
    }
    let mut staged = Writes::new();
    // Each sorted set's state, by the position of its key's first use, and
    // the TTL (µs) it is to be written with.
    let mut sets: Vec<(usize, SetState, Option<u64>)> = Vec::new();
    let mut all = true;
    let mut name = Name::new();
    let mut k = 0;
    for i in 0..request.len() {
        let limit = request.limit(i);
        let key = keys[k].as_ref();
        let write = all && commit;
        let v = if limit.in_string() {
            let stepped = step_string(&limit, key, k, now_us, write, db, &mut staged, &mut name)?;
            k += 1;
            stepped
        } else {
            let s = match sets.iter().position(|(at, ..)| keys[*at].as_ref() == key) {
                Some(s) => s,
                None => {
                    sets.push((k, SetState::load(db, k, &limit, now_us)?, None));
                    sets.len() - 1
                }
            };
            let (at, state, ttl) = &mut sets[s];
            let (v, took) = state.step(db, *at, &limit, now_us, write, request.lease(), i + 1)?;
            if took.is_some() {
                *ttl = took;
            }
            k += 2;
            v
        };
        all &= v.allowed;
        let retry = v.retry.map_or(-1.0, |r| r as f64);
        for n in [
            f64::from(u8::from(v.allowed)),
            v.remaining as f64,
            v.reset as f64,
            retry,
            v.delay as f64,
        ] {
            reply.extend_from_slice(&n.to_le_bytes());
        }
    }
    if !all {
        reply[start + 8..start + 16].copy_from_slice(&0.0f64.to_le_bytes());
    }
    let keep = commit && (all || request.len() == 1);
    if !keep {
        staged.clear();
        return Ok(staged);
    }
    for (at, state, ttl) in &sets {
        state.write(db, *at, ttl.unwrap_or(0), now_us)?;
    }
    Ok(staged)
}

/// The time of the check a refund gives back for: the request's own.
pub(crate) fn refund_time(request: &Request<'_>) -> Result<u64, String> {
    request
        .time
        .ok_or_else(|| "ERR a refund takes the time of the check it refunds".to_owned())
}

/// Gives back what a committed check of `request` took, at its time, on
/// `keys` (the code's op `r`): each limit's cost, to a string state that
/// still lives, or off a sliding log's entry at that time, or a concurrency
/// limit's lease; only for the limits `given` names (a hybrid lease's
/// record already credited makes its limit's units back). TTLs are kept.
/// Answers the request's time.
pub(crate) fn refund<K: AsRef<[u8]>, D: Db>(
    request: &Request<'_>,
    keys: &[K],
    db: &mut D,
    given: &dyn Fn(usize) -> bool,
) -> Result<u64, String> {
    let at = refund_time(request)?;
    request.takes(keys.len())?;
    let mut k = 0;
    for i in 0..request.len() {
        let limit = request.limit(i);
        let key = keys[k].as_ref();
        if limit.in_string() {
            k += 1;
            if given(i) {
                give(db, &limit, key, limit.cost, at)?;
            }
            continue;
        }
        if !given(i) {
            k += 2;
            continue;
        }
        let mut member = Vec::new();
        member.extend_from_slice(itoa::Buffer::new().format(limit.cost).as_bytes());
        member.push(b'|');
        member.extend_from_slice(request.lease());
        member.push(b'_');
        member.extend_from_slice(itoa::Buffer::new().format(i + 1).as_bytes());
        crate::sets::give_back(db, k, &limit, at, &member)?;
        k += 2;
    }
    Ok(at)
}

/// Gives `cost` units back to the string state of `limit` at `key`, as
/// taken by a check at `at_us` (the code's `give`): a window's count only in
/// the window of `at_us`, and only a state that still lives.
pub(crate) fn give<D: Db>(
    db: &mut D,
    limit: &Limit,
    key: &[u8],
    cost: u64,
    at_us: u64,
) -> Result<(), String> {
    let mut name = key.to_vec();
    if limit.windowed() {
        name.push(b':');
        name.extend_from_slice(itoa::Buffer::new().format(limit.window(at_us)).as_bytes());
    }
    if let Some(stored) = db.get(&name)? {
        let state = limit.give(&stored, cost, at_us)?;
        let mut digits = itoa::Buffer::new();
        db.put(&name, value(&state, &mut digits))?;
    }
    Ok(())
}

/// Steps a limit kept in one string (its key at `k`), staging what it
/// writes in `staged`, where a later limit on the same key reads it.
#[allow(clippy::too_many_arguments)]
fn step_string<D: Db>(
    limit: &Limit,
    key: &[u8],
    k: usize,
    now_us: u64,
    write: bool,
    db: &mut D,
    staged: &mut Writes,
    name: &mut Name,
) -> Result<crate::step::Verdict, String> {
    name.clear();
    name.extend_from_slice(key);
    if limit.windowed() {
        name.push(b':');
        name.extend_from_slice(itoa::Buffer::new().format(limit.window(now_us)).as_bytes());
    }
    let stepped = match staged.iter().find(|w| w.key == *name) {
        Some(w) => {
            let mut digits = itoa::Buffer::new();
            limit.step(Some(value(&w.state, &mut digits)), now_us, write)?
        }
        None => db.string(k, name, &mut |v| limit.step(v, now_us, write))?,
    };
    if let Some((state, ttl_us)) = stepped.write {
        match staged.iter_mut().find(|w| w.key == *name) {
            Some(w) => (w.state, w.ttl_us) = (state, ttl_us),
            None => staged.push(Write {
                key: name.clone(),
                at: k,
                state,
                ttl_us,
            }),
        }
    }
    Ok(stepped.verdict)
}

/// The bytes a state is written as.
pub(crate) fn value<'b>(state: &'b State, digits: &'b mut itoa::Buffer) -> &'b [u8] {
    match state {
        State::Int(v) => digits.format(*v).as_bytes(),
        State::Packed { bytes, len } => &bytes[..*len],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Mem;
    use crate::step::{CONCURRENCY, FIXED_WINDOW, GCRA, SLIDING_LOG};

    fn blob(time: f64, limits: &[[u64; 7]]) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [time, limits.len() as f64] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for l in limits {
            for v in l {
                out.extend_from_slice(&(*v as f64).to_le_bytes());
            }
        }
        out
    }

    fn decode(b: &[u8]) -> Vec<i64> {
        b.chunks_exact(8).map(|c| double(c) as i64).collect()
    }

    /// Checks on a map of keys, writing what is to be written.
    fn run(db: &mut Mem, blob: &[u8], keys: &[&str], commit: bool) -> Vec<i64> {
        let request = Request::parse(blob).unwrap();
        let now = request.time.unwrap();
        let mut reply = Vec::new();
        let writes = check(&request, keys, now, commit, db.with_keys(keys), &mut reply).unwrap();
        db.apply(writes);
        decode(&reply)
    }

    #[test]
    fn all_or_nothing_and_limits_on_one_key_see_each_other() {
        let mut db = Mem::default();
        let gcra = [u64::from(GCRA), 2, 1_000_000, 2, 500_000, 1, 0];
        let narrow = [u64::from(FIXED_WINDOW), 1, 1_000_000, 1, 1_000_000, 1, 0];
        // Twice the same GCRA key at cost 1 each: both fit a burst of 2.
        let twice = blob(5_000_000.0, &[gcra, gcra]);
        let r = run(&mut db, &twice, &["g", "g"], true);
        assert_eq!(
            r,
            [5_000_000, 1, 1, 1, 500_000, -1, 0, 1, 0, 1_000_000, -1, 0]
        );
        assert_eq!(db.strings[&b"g"[..]], b"6000000");
        // A window that admits beside a GCRA that denies: nothing written.
        let both = blob(5_000_000.0, &[narrow, gcra]);
        let r = run(&mut db, &both, &["w", "g"], true);
        assert_eq!(r[1], 0);
        assert_eq!(&r[2..4], [1, 0]);
        assert!(
            !db.strings.contains_key(&b"w:5"[..]),
            "the window's admission was not kept"
        );
        // A dry run writes nothing.
        db = Mem::default();
        let r = run(&mut db, &blob(5_000_000.0, &[narrow]), &["w"], false);
        assert_eq!(r[1], 1);
        assert!(db.strings.is_empty());
        run(&mut db, &blob(5_000_000.0, &[narrow]), &["w"], true);
        assert_eq!(db.strings[&b"w:5"[..]], b"1");
    }

    #[test]
    fn bad_requests_are_refused_with_why() {
        assert!(
            Request::parse(b"short")
                .unwrap_err()
                .contains("at least 16")
        );
        let one = blob(1.0, &[[9, 1, 1, 1, 1, 1, 0]]);
        assert!(
            Request::parse(&one)
                .unwrap_err()
                .contains("unknown algorithm 9")
        );
        let mut cut = blob(1.0, &[[1, 1, 1, 1, 1, 1, 0]]);
        cut.truncate(40);
        assert!(Request::parse(&cut).unwrap_err().contains("at least 72"));
        let half = blob(1.5, &[]);
        assert!(Request::parse(&half).unwrap_err().contains("time"));
        let now = blob(-1.0, &[]);
        assert_eq!(Request::parse(&now).unwrap().time, None);
        let log = blob(
            1.0,
            &[
                [u64::from(SLIDING_LOG), 1, 1, 1, 1, 1, 0],
                [1, 1, 1, 1, 1, 1, 0],
            ],
        );
        let log = Request::parse(&log).unwrap();
        assert_eq!(log.keys(), 3, "a sorted set and its count, a string");
        let mut reply = Vec::new();
        let mut db = Mem::default();
        let e = check(&log, &["a"], 1, true, db.with_keys(&["a"]), &mut reply).unwrap_err();
        assert!(e.contains("takes 3 keys, got 1"), "{e}");
    }

    fn members(db: &Mem, key: &str) -> Vec<(u64, String)> {
        db.sets.get(key.as_bytes()).map_or(Vec::new(), |s| {
            s.iter()
                .map(|(t, m)| (*t, String::from_utf8(m.clone()).unwrap()))
                .collect()
        })
    }

    #[test]
    fn a_sliding_log_keeps_one_member_per_time_and_its_total() {
        let mut db = Mem::default();
        let log = |cost| [u64::from(SLIDING_LOG), 3, 1_000_000, 3, 333_334, cost, 0];
        let keys = ["l", "l.n"];
        let at = |t: u64, cost| blob(t as f64, &[log(cost)]);
        // allowed, remaining, reset after, retry after.
        let r = run(&mut db, &at(10_000_000, 2), &keys, true);
        assert_eq!(&r[2..6], [1, 1, 1_000_000, -1]);
        assert_eq!(members(&db, "l"), [(10_000_000, "10000000:2".to_owned())]);
        assert_eq!(db.strings[&b"l.n"[..]], b"2");
        assert_eq!((db.ttls[&b"l"[..]], db.ttls[&b"l.n"[..]]), (1000, 1000));
        run(&mut db, &at(10_500_000, 1), &keys, true);
        // Full: the first entry's two units leave at 11 s, enough for one.
        let r = run(&mut db, &at(10_600_000, 1), &keys, true);
        assert_eq!(&r[1..6], [0, 0, 0, 900_000, 400_000]);
        assert_eq!(db.strings[&b"l.n"[..]], b"3", "a deny writes nothing");
        // At 11 s the first entry has left: trimmed by the admission.
        let r = run(&mut db, &at(11_000_000, 1), &keys, true);
        assert_eq!(&r[2..6], [1, 1, 1_000_000, -1]);
        assert_eq!(
            members(&db, "l"),
            [
                (10_500_000, "10500000:1".to_owned()),
                (11_000_000, "11000000:1".to_owned())
            ]
        );
        assert_eq!(db.strings[&b"l.n"[..]], b"2");
        // Two limits of one request on the log see each other, and their
        // admissions at one time make one member; a dry run writes nothing.
        let two = blob(11_000_000.0, &[log(1), log(0)]);
        let r = run(&mut db, &two, &["l", "l.n", "l", "l.n"], false);
        assert_eq!((r[3], r[8]), (0, 1), "a dry run stages nothing");
        assert_eq!(db.strings[&b"l.n"[..]], b"2");
        let r = run(&mut db, &two, &["l", "l.n", "l", "l.n"], true);
        assert_eq!((r[3], r[8]), (0, 0));
        assert_eq!(members(&db, "l")[1], (11_000_000, "11000000:2".to_owned()));
        assert_eq!(db.strings[&b"l.n"[..]], b"3");
    }

    #[test]
    fn concurrency_adds_leases_named_from_the_request_until_they_expire() {
        let mut db = Mem::default();
        let slots = [u64::from(CONCURRENCY), 2, 1_000_000, 2, 500_000, 1, 0];
        let gcra = [u64::from(GCRA), 1, 1_000_000, 1, 1_000_000, 0, 0];
        let keys = ["g", "c", "c.n"];
        let at = |t: f64, lease: &str| {
            let mut b = blob(t, &[gcra, slots]);
            b.extend_from_slice(lease.as_bytes());
            b
        };
        let r = run(&mut db, &at(5_000_000.0, "ab-1"), &keys, true);
        assert_eq!(&r[7..12], [1, 1, 0, -1, 0]);
        assert_eq!(members(&db, "c"), [(6_000_000, "1|ab-1_2".to_owned())]);
        run(&mut db, &at(5_500_000.0, "ab-2"), &keys, true);
        let r = run(&mut db, &at(5_600_000.0, "ab-3"), &keys, true);
        assert_eq!(&r[7..12], [0, 0, 0, -1, 0]);
        assert_eq!(db.strings[&b"c.n"[..]], b"2");
        assert_eq!(db.ttls[&b"c"[..]], 1000);
        // The first lease has expired at 6 s: the admission drops it.
        let r = run(&mut db, &at(6_000_000.0, "ab-4"), &keys, true);
        assert_eq!(&r[7..9], [1, 0]);
        assert_eq!(
            members(&db, "c"),
            [
                (6_500_000, "1|ab-2_2".to_owned()),
                (7_000_000, "1|ab-4_2".to_owned())
            ]
        );
        assert_eq!(db.strings[&b"c.n"[..]], b"2");
        // Released: its cost leaves the count, whose TTL stays.
        db.with_keys(&["c", "c.n"]);
        db.ttls.insert(b"c.n".to_vec(), 777);
        crate::sets::release(&mut db, &[b"1|ab-2_2"]).unwrap();
        crate::sets::release(&mut db, &[b"1|gone_2"]).unwrap();
        assert_eq!(db.strings[&b"c.n"[..]], b"1");
        assert_eq!(db.ttls[&b"c.n"[..]], 777);
        assert_eq!(members(&db, "c").len(), 1);
        let e = crate::sets::release(&mut db, &[&b"1|ab-4_2"[..], b"x|y"]).unwrap_err();
        assert!(e.contains("<cost>|<id>"), "{e}");
        assert_eq!(members(&db, "c").len(), 1, "a bad lease releases nothing");
    }

    #[test]
    fn a_refund_right_after_a_check_gives_every_algorithm_its_units_back() {
        use crate::step::{HIT_COUNTER, LEAKY, SHAPING, SLIDING_COUNTER, TOKEN_BUCKET};
        for alg in [
            TOKEN_BUCKET,
            GCRA,
            LEAKY,
            SHAPING,
            FIXED_WINDOW,
            SLIDING_LOG,
            SLIDING_COUNTER,
            CONCURRENCY,
            HIT_COUNTER,
        ] {
            let limit = |cost| [u64::from(alg), 4, 1_000_000, 4, 250_000, cost, 0];
            let keys: &[&str] = if matches!(alg, SLIDING_LOG | CONCURRENCY) {
                &["k", "k.n"]
            } else {
                &["k"]
            };
            let at = |t: f64, cost| {
                let mut b = blob(t, &[limit(cost)]);
                b.extend_from_slice(b"ab");
                b
            };
            let mut db = Mem::default();
            run(&mut db, &at(7_000_000.0, 1), keys, true);
            let taken = at(7_100_000.0, 3);
            let r = run(&mut db, &taken, keys, true);
            assert_eq!(r[2], 1, "{alg}: admitted");
            let request = Request::parse(&taken).unwrap();
            assert_eq!(
                refund(&request, keys, db.with_keys(keys), &|_| true),
                Ok(7_100_000)
            );
            // Three units back: a check of three fits again, and nothing
            // more than the first check's one unit is held.
            let again = run(&mut db, &at(7_100_000.0, 3), keys, false);
            assert_eq!(again[2], 1, "{alg}: the units are back");
            let more = run(&mut db, &at(7_100_000.0, 4), keys, false);
            assert_eq!(more[2], 0, "{alg}: only those");
        }
        let mut db = Mem::default();
        let log = blob(-1.0, &[[u64::from(SLIDING_LOG), 1, 1, 1, 1, 1, 0]]);
        let e = refund(
            &Request::parse(&log).unwrap(),
            &["l", "l.n"],
            &mut db,
            &|_| true,
        )
        .unwrap_err();
        assert!(e.contains("the time of the check"), "{e}");
    }
}
