//! Hybrid leases' records, as the Lua code keeps them (`change`,
//! `credit_expired`, `leases_of`, `check_leasing` and `refund` with leases
//! in tollgate.lua): `TOLLGATE.CHECK`'s op `h`, a check leasing units to a
//! hybrid instance, and op `r` with a leases argument, a give back with a
//! holder, on the same hashes, fields and values, so that instances calling
//! the code and the module agree on a record.
//!
//! A record is a field of a hash at the limit's auxiliary key, named by its
//! holder's id in decimal, valued three little-endian doubles: the units the
//! holder holds (a sum: each leasing call adds what it leased and takes off
//! what the holder released), the deadline (µs) past which any leasing check
//! credits them back, and the time (µs) of its latest lease. The arithmetic
//! is the code's, in doubles, so that both write the same bytes.
//!
//! The leases argument is little-endian doubles: the holder's id (below
//! 2^52), the records' ttl (µs), then per limit of the request the units the
//! holder released and those the call leases (-1: no record). The records'
//! keys follow the request's, in the order of the limits that have one.

use crate::request::{Db, MAX_COUNT, Request, check, double, give, number, refund, refund_time};
use crate::step::{END_US, Limit};

/// A hash's fields and their values.
pub(crate) type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// A hash of records, named by its key's position among the call's keys.
pub(crate) trait Records: Db {
    /// The record of `holder` (`HGET`).
    fn record(&mut self, r: usize, holder: &[u8]) -> Result<Option<Vec<u8>>, String>;
    /// Every record (`HGETALL`), in any order.
    fn records(&mut self, r: usize) -> Result<Fields, String>;
    /// Sets the record of `holder` (`HSET`).
    fn set_record(&mut self, r: usize, holder: &[u8], value: &[u8]) -> Result<(), String>;
    /// Removes the record of `holder`, which is there (`HDEL`); an emptied
    /// hash goes.
    fn drop_record(&mut self, r: usize, holder: &[u8]) -> Result<(), String>;
}

/// One limit's record in a call: the limit, where its state and its record
/// are among the call's keys, and what the call changes.
#[derive(Debug, Clone, Copy)]
struct Record {
    index: usize,
    limit: Limit,
    key: usize,
    rkey: usize,
    released: f64,
    leased: f64,
}

/// A request's leases argument, decoded against the request.
#[derive(Debug)]
pub(crate) struct Leases {
    holder: Vec<u8>,
    ttl_us: f64,
    records: Vec<Record>,
}

impl Leases {
    /// Decodes `blob` for `request`: an error for a holder, ttl or count
    /// out of the code's range, or a record for a limit kept in a sorted
    /// set (the code keeps records only beside a string state).
    pub(crate) fn parse(request: &Request<'_>, blob: &[u8]) -> Result<Self, String> {
        let wanted = 16 + 16 * request.len();
        if blob.len() < wanted {
            return Err(format!(
                "ERR the leases of a request of {} limits are at least {wanted} bytes, got {}",
                request.len(),
                blob.len()
            ));
        }
        let holder = number(&blob[..8], "holder", (1 << 52) - 1)?;
        let ttl_us = number(&blob[8..16], "records' ttl", END_US)? as f64;
        let mut records = Vec::new();
        let mut k = 0;
        let keys = request.keys();
        for i in 0..request.len() {
            let limit = request.limit(i);
            let at = 16 + 16 * i;
            let leased = double(&blob[at + 8..at + 16]);
            if leased >= 0.0 {
                if !limit.in_string() {
                    return Err(format!(
                        "ERR limit {} keeps its state in a sorted set: it has no lease record",
                        i + 1
                    ));
                }
                records.push(Record {
                    index: i,
                    limit,
                    key: k,
                    rkey: keys + records.len(),
                    released: number(&blob[at..at + 8], "units released", MAX_COUNT)? as f64,
                    leased: number(&blob[at + 8..at + 16], "units leased", MAX_COUNT)? as f64,
                });
            }
            k += 1 + usize::from(!limit.in_string());
        }
        let holder = itoa::Buffer::new().format(holder).as_bytes().to_vec();
        Ok(Self {
            holder,
            ttl_us,
            records,
        })
    }

    /// The number of records' keys, after the request's.
    pub(crate) fn keys(&self) -> usize {
        self.records.len()
    }
}

/// A record's (units, deadline, time of its latest lease).
fn unpack(v: &[u8]) -> Result<[f64; 3], String> {
    if v.len() != 24 {
        return Err("ERR a lease record is not three doubles".to_owned());
    }
    Ok([double(&v[..8]), double(&v[8..16]), double(&v[16..])])
}

fn pack(values: [f64; 3]) -> [u8; 24] {
    let mut out = [0; 24];
    for (chunk, v) in out.chunks_exact_mut(8).zip(values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// A whole number of units or µs the code holds in a double, as the steps
/// take it (saturating: past every capacity, as the code's doubles are).
fn whole(v: f64) -> u64 {
    v as u64
}

/// How long a record outlives its deadline: as long as the state it
/// credits can still hold the units (a bucket's time to refill, a window's
/// period).
fn keep(limit: &Limit) -> u64 {
    if limit.windowed() {
        limit.period
    } else {
        limit.burst.saturating_mul(limit.emission)
    }
}

/// The code's `change`: takes `released` units off `holder`'s record and
/// adds `leased`; a record left empty goes, and one that is gone (credited
/// back) is not made again by a change that leases nothing. With `lasting`
/// (the records' ttl and the limit), the record lasts that long from `now`
/// and its hash at least that long past it; without, its deadline stays.
/// Answers whether the record lived.
fn change<D: Records>(
    db: &mut D,
    rkey: usize,
    holder: &[u8],
    released: f64,
    leased: f64,
    now: f64,
    lasting: Option<(f64, &Limit)>,
) -> Result<bool, String> {
    let cur = db.record(rkey, holder)?;
    if cur.is_none() && leased == 0.0 {
        return Ok(false);
    }
    let [mut units, mut deadline, mut at] = match &cur {
        Some(v) => unpack(v)?,
        None => [0.0, 0.0, now],
    };
    units = (units - released).max(0.0) + leased;
    if units <= 0.0 {
        db.drop_record(rkey, holder)?;
        return Ok(cur.is_some());
    }
    if let Some((ttl, _)) = lasting {
        deadline = now + ttl;
        if leased > 0.0 {
            at = now;
        }
    }
    db.set_record(rkey, holder, &pack([units, deadline, at]))?;
    if let Some((ttl, limit)) = lasting {
        // After the write: a hash that did not exist gets its TTL too.
        db.expire(rkey, false, whole(ttl).saturating_add(keep(limit)), true)?;
    }
    Ok(cur.is_some())
}

/// The code's `credit_expired`: gives back the units of every record of
/// `record`'s hash past its deadline at `now`, and forgets those records.
fn credit_expired<D: Records, K: AsRef<[u8]>>(
    db: &mut D,
    keys: &[K],
    record: &Record,
    now: f64,
) -> Result<(), String> {
    for (holder, value) in db.records(record.rkey)? {
        let [units, deadline, at] = unpack(&value)?;
        if deadline <= now {
            give(
                db,
                &record.limit,
                keys[record.key].as_ref(),
                whole(units),
                whole(at),
            )?;
            db.drop_record(record.rkey, &holder)?;
        }
    }
    Ok(())
}

/// Op `h`: checks `request` at `now_us` for a hybrid holder leasing part of
/// its limits' costs: first credits back every expired record of those
/// limits, then checks as op `c` does, then changes the holder's records:
/// what it released goes whatever the check decides, what it leases is
/// added when admitted. `keys` are the request's, then the records'.
/// Appends the reply to `reply`; returns the string states to write
/// ([`check`]).
pub(crate) fn check_leasing<K: AsRef<[u8]>, D: Records>(
    request: &Request<'_>,
    keys: &[K],
    leases: &Leases,
    now_us: u64,
    db: &mut D,
    reply: &mut Vec<u8>,
) -> Result<crate::request::Writes, String> {
    let now = now_us as f64;
    for r in &leases.records {
        credit_expired(db, keys, r, now)?;
    }
    let start = reply.len();
    let own = &keys[..keys.len() - leases.keys()];
    let writes = check(request, own, now_us, true, db, reply)?;
    let admitted = double(&reply[start + 8..start + 16]) == 1.0;
    for r in &leases.records {
        let leased = if admitted { r.leased } else { 0.0 };
        let lasting = Some((leases.ttl_us, &r.limit));
        change(db, r.rkey, &leases.holder, r.released, leased, now, lasting)?;
    }
    Ok(writes)
}

/// Op `r` with leases: gives back what a committed check of `request` took
/// ([`refund`]), a limit with a record only while its holder's record lives
/// (no leasing check credited it), taking its units `leased` off the record
/// (a give back sends there what it releases), its deadline left as it is.
pub(crate) fn refund_leased<K: AsRef<[u8]>, D: Records>(
    request: &Request<'_>,
    keys: &[K],
    leases: &Leases,
    db: &mut D,
) -> Result<u64, String> {
    let now = refund_time(request)? as f64;
    let mut given = vec![true; request.len()];
    for r in &leases.records {
        given[r.index] = change(db, r.rkey, &leases.holder, r.leased, 0.0, now, None)?;
    }
    let own = &keys[..keys.len() - leases.keys()];
    refund(request, own, db, &|i| given[i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::Mem;
    use crate::step::{FIXED_WINDOW, GCRA, SLIDING_LOG};

    fn doubles(values: &[f64]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A request of one limit at `now`.
    fn request(now: u64, limit: [u64; 7]) -> Vec<u8> {
        let mut values = vec![now as f64, 1.0];
        values.extend(limit.map(|v| v as f64));
        doubles(&values)
    }

    fn record(db: &Mem, holder: &str) -> Option<[f64; 3]> {
        let hash = db.hashes.get(&b"k.r"[..])?;
        hash.get(holder.as_bytes()).map(|v| unpack(v).unwrap())
    }

    /// A leasing check of `limit` on `keys` at `now` for `grant` (holder,
    /// records' TTL, released, leased), its writes applied: its reply.
    fn leasing(
        db: &mut Mem,
        keys: [&str; 2],
        limit: [u64; 7],
        now: u64,
        grant: [f64; 4],
    ) -> Vec<f64> {
        let blob = request(now, limit);
        let request = Request::parse(&blob).unwrap();
        let leases = Leases::parse(&request, &doubles(&grant)).unwrap();
        let mut reply = Vec::new();
        let writes = check_leasing(
            &request,
            &keys,
            &leases,
            now,
            db.with_keys(&keys),
            &mut reply,
        )
        .unwrap();
        db.apply(writes);
        reply.chunks_exact(8).map(double).collect()
    }

    /// Leases on one GCRA key (10 per second, burst 10: 100,000 µs a unit).
    fn lease(db: &mut Mem, now: u64, holder: u64, released: u64, leased: u64) -> Vec<f64> {
        let gcra = [u64::from(GCRA), 10, 1_000_000, 10, 100_000, leased, 0];
        let grant = [holder as f64, 500_000.0, released as f64, leased as f64];
        leasing(db, ["k", "k.r"], gcra, now, grant)
    }

    #[test]
    fn records_add_up_and_come_back_once_past_their_deadline() {
        let mut db = Mem::default();
        lease(&mut db, 1_000_000, 7, 0, 4);
        assert_eq!(record(&db, "7"), Some([4.0, 1_500_000.0, 1_000_000.0]));
        assert_eq!(db.ttls[&b"k.r"[..]], 1500, "the ttl and a burst's refill");
        // Sums: 3 released, 2 more leased; the deadline moves on.
        lease(&mut db, 1_100_000, 7, 3, 2);
        assert_eq!(record(&db, "7"), Some([3.0, 1_600_000.0, 1_100_000.0]));
        assert_eq!(db.strings[&b"k"[..]], b"1600000");
        // A deny releases but leases nothing.
        let r = lease(&mut db, 1_100_000, 8, 0, 9);
        assert_eq!(r[1], 0.0);
        assert_eq!(record(&db, "8"), None, "no record made by a deny");
        lease(&mut db, 1_100_000, 8, 0, 5);
        assert_eq!(db.strings[&b"k"[..]], b"2100000");
        // At both records' deadline, another holder's check credits their
        // eight units back before deciding: the TAT is then in the past.
        lease(&mut db, 1_600_000, 9, 0, 1);
        assert_eq!((record(&db, "7"), record(&db, "8")), (None, None));
        assert_eq!(record(&db, "9"), Some([1.0, 2_100_000.0, 1_600_000.0]));
        assert_eq!(db.strings[&b"k"[..]], b"1700000");
        // A give back of a holder whose record was credited gives nothing;
        // a live one's unit goes back, and its emptied record with it.
        let give_back = |db: &mut Mem, holder: f64, units: u64| {
            let blob = request(
                1_600_000,
                [u64::from(GCRA), 10, 1_000_000, 10, 100_000, units, 0],
            );
            let request = Request::parse(&blob).unwrap();
            let back = doubles(&[holder, 0.0, 0.0, units as f64]);
            let leases = Leases::parse(&request, &back).unwrap();
            let keys = ["k", "k.r"];
            refund_leased(&request, &keys, &leases, db.with_keys(&keys)).unwrap();
        };
        give_back(&mut db, 7.0, 2);
        assert_eq!(db.strings[&b"k"[..]], b"1700000");
        give_back(&mut db, 9.0, 1);
        assert_eq!(db.strings[&b"k"[..]], b"1600000");
        assert!(!db.hashes.contains_key(&b"k.r"[..]), "an emptied hash goes");
    }

    #[test]
    fn a_window_credits_the_window_its_units_were_leased_in() {
        let mut db = Mem::default();
        let window = |cost| [u64::from(FIXED_WINDOW), 10, 1_000_000, 10, 100_000, cost, 0];
        let run = |db: &mut Mem, now: u64, holder: f64, cost| {
            let grant = [holder, 100_000.0, 0.0, cost as f64];
            leasing(db, ["w", "k.r"], window(cost), now, grant);
        };
        run(&mut db, 1_950_000, 1.0, 5);
        run(&mut db, 2_100_000, 2.0, 2);
        // Holder 1's five units were window 1's: its count is given them.
        assert_eq!(db.strings[&b"w:1"[..]], b"0");
        assert_eq!(db.strings[&b"w:2"[..]], b"2");
    }

    #[test]
    fn bad_leases_are_refused_with_why() {
        let blob = request(1, [u64::from(GCRA), 10, 1_000_000, 10, 100_000, 1, 0]);
        let request = Request::parse(&blob).unwrap();
        let short = doubles(&[1.0, 1.0, 0.0]);
        let e = Leases::parse(&request, &short).unwrap_err();
        assert!(e.contains("at least 32 bytes"), "{e}");
        let holder = doubles(&[4_503_599_627_370_496.0, 1.0, 0.0, 1.0]);
        let e = Leases::parse(&request, &holder).unwrap_err();
        assert!(e.contains("holder"), "{e}");
        let half = doubles(&[1.0, 1.0, 0.5, 1.0]);
        let e = Leases::parse(&request, &half).unwrap_err();
        assert!(e.contains("units released"), "{e}");
        let none = doubles(&[1.0, 1.0, -1.0, -1.0]);
        assert_eq!(Leases::parse(&request, &none).unwrap().keys(), 0);
        let log = self::request(
            1,
            [u64::from(SLIDING_LOG), 10, 1_000_000, 10, 100_000, 1, 0],
        );
        let log = Request::parse(&log).unwrap();
        let e = Leases::parse(&log, &doubles(&[1.0, 1.0, 0.0, 1.0])).unwrap_err();
        assert!(e.contains("sorted set"), "{e}");
    }
}
