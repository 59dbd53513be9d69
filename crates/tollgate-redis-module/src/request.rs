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

use crate::step::{END_US, HIT_COUNTER, Limit, State, Stepped};

/// The bytes of a request's head and of each of its limits.
const HEAD: usize = 16;
const LIMIT: usize = 56;
/// The largest count the code takes (2^52 + 1 for a clamped cost).
const MAX_COUNT: u64 = (1 << 52) + 1;

/// A decoded request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// Its time in µs; `None`: the server's.
    pub(crate) time: Option<u64>,
    count: usize,
    blob: &'a [u8],
}

fn double(b: &[u8]) -> f64 {
    f64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// A whole number in `0..=max` the code sends as a double.
fn number(b: &[u8], what: &str, max: u64) -> Result<u64, String> {
    let d = double(b);
    if d >= 0.0 && d <= max as f64 && d.fract() == 0.0 {
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
        let request = Self { time, count, blob };
        for i in 0..count {
            let l = request.limit(i)?;
            if l.alg > HIT_COUNTER {
                return Err(format!("ERR unknown algorithm {}", l.alg));
            }
        }
        Ok(request)
    }

    /// Its number of limits.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Its `i`th limit.
    pub(crate) fn limit(&self, i: usize) -> Result<Limit, String> {
        let at = HEAD + LIMIT * i;
        let n = |j: usize, what: &str, max: u64| {
            number(&self.blob[at + 8 * j..at + 8 * j + 8], what, max)
        };
        Ok(Limit {
            alg: n(0, "algorithm", 255)? as u8,
            limit: n(1, "limit", MAX_COUNT)?,
            period: n(2, "period", END_US)?.max(1),
            burst: n(3, "burst", MAX_COUNT)?,
            emission: n(4, "emission interval", END_US)?.max(1),
            cost: n(5, "cost", MAX_COUNT)?,
            delay_after: n(6, "delay_after", MAX_COUNT)?,
        })
    }

    /// Whether every limit's state is one string (what `check` takes).
    pub(crate) fn in_strings(&self) -> Result<bool, String> {
        (0..self.count).try_fold(true, |all, i| Ok(all && self.limit(i)?.in_string()))
    }
}

/// A step on a stored value (`None`: no key).
pub(crate) type Decide<'a> = dyn FnMut(Option<&[u8]>) -> Result<Stepped, String> + 'a;
/// Hands a `Decide` the value of a key: the index of the limit it is for,
/// and its name.
pub(crate) type Read<'a> = dyn FnMut(usize, &[u8], &mut Decide<'_>) -> Result<Stepped, String> + 'a;

/// A new value to write: the key's name, the limit whose key it is (or
/// whose window's), the state and its TTL (µs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Write {
    pub(crate) key: Vec<u8>,
    pub(crate) limit: usize,
    pub(crate) state: State,
    pub(crate) ttl_us: u64,
}

/// Checks `request` at `now_us` on `keys` (its own, in order), every limit's
/// state one string: `read(i, key, decide)` hands `decide` the stored value
/// of `key`, limit `i`'s key or its window's. Limits on one key see each other's tentative admission. Returns
/// the reply's numbers (appended to `reply`) and what to write: nothing
/// unless `commit` and every limit admitted (or the request's one limit is
/// a hit counter, whose denies count).
pub(crate) fn check<K: AsRef<[u8]>>(
    request: &Request<'_>,
    keys: &[K],
    now_us: u64,
    commit: bool,
    read: &mut Read<'_>,
    reply: &mut Vec<u8>,
) -> Result<Vec<Write>, String> {
    if keys.len() != request.len() {
        return Err(format!(
            "ERR a request of {} limits takes as many keys, got {}",
            request.len(),
            keys.len()
        ));
    }
    let start = reply.len();
    for v in [now_us as f64, 1.0] {
        reply.extend_from_slice(&v.to_le_bytes());
    }
    let mut staged: Vec<Write> = Vec::new();
    let mut all = true;
    let mut name = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let limit = request.limit(i)?;
        let key = key.as_ref();
        name.clear();
        name.extend_from_slice(key);
        if limit.windowed() {
            name.push(b':');
            name.extend_from_slice(itoa::Buffer::new().format(limit.window(now_us)).as_bytes());
        }
        let write = all && commit;
        let stepped = match staged.iter().find(|w| w.key == name) {
            Some(w) => {
                let mut digits = itoa::Buffer::new();
                limit.step(Some(value(&w.state, &mut digits)), now_us, write)?
            }
            None => read(i, &name, &mut |v| limit.step(v, now_us, write))?,
        };
        let v = stepped.verdict;
        all &= v.allowed;
        if let Some((state, ttl_us)) = stepped.write {
            match staged.iter_mut().find(|w| w.key == name) {
                Some(w) => (w.state, w.ttl_us) = (state, ttl_us),
                None => staged.push(Write {
                    key: name.clone(),
                    limit: i,
                    state,
                    ttl_us,
                }),
            }
        }
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
    }
    Ok(staged)
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
    use std::collections::HashMap;

    use super::*;
    use crate::step::{FIXED_WINDOW, GCRA, SLIDING_LOG};

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
    fn run(
        db: &mut HashMap<Vec<u8>, Vec<u8>>,
        blob: &[u8],
        keys: &[&str],
        commit: bool,
    ) -> Vec<i64> {
        let request = Request::parse(blob).unwrap();
        let now = request.time.unwrap();
        let mut reply = Vec::new();
        let writes = check(
            &request,
            keys,
            now,
            commit,
            &mut |_, k, decide| decide(db.get(k).map(Vec::as_slice)),
            &mut reply,
        )
        .unwrap();
        for w in writes {
            let mut digits = itoa::Buffer::new();
            db.insert(w.key, value(&w.state, &mut digits).to_vec());
        }
        decode(&reply)
    }

    #[test]
    fn all_or_nothing_and_limits_on_one_key_see_each_other() {
        let mut db = HashMap::new();
        let gcra = [u64::from(GCRA), 2, 1_000_000, 2, 500_000, 1, 0];
        let narrow = [u64::from(FIXED_WINDOW), 1, 1_000_000, 1, 1_000_000, 1, 0];
        // Twice the same GCRA key at cost 1 each: both fit a burst of 2.
        let twice = blob(5_000_000.0, &[gcra, gcra]);
        let r = run(&mut db, &twice, &["g", "g"], true);
        assert_eq!(
            r,
            [5_000_000, 1, 1, 1, 500_000, -1, 0, 1, 0, 1_000_000, -1, 0]
        );
        assert_eq!(db[&b"g"[..]], b"6000000");
        // A window that admits beside a GCRA that denies: nothing written.
        let both = blob(5_000_000.0, &[narrow, gcra]);
        let r = run(&mut db, &both, &["w", "g"], true);
        assert_eq!(r[1], 0);
        assert_eq!(&r[2..4], [1, 0]);
        assert!(
            !db.contains_key(&b"w:5"[..]),
            "the window's admission was not kept"
        );
        // A dry run writes nothing.
        db.clear();
        let r = run(&mut db, &blob(5_000_000.0, &[narrow]), &["w"], false);
        assert_eq!(r[1], 1);
        assert!(db.is_empty());
        run(&mut db, &blob(5_000_000.0, &[narrow]), &["w"], true);
        assert_eq!(db[&b"w:5"[..]], b"1");
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
        assert_eq!(log.in_strings(), Ok(false));
        let mut reply = Vec::new();
        let e = check(&log, &["a"], 1, true, &mut |_, _, d| d(None), &mut reply).unwrap_err();
        assert!(e.contains("takes as many keys"));
    }
}
