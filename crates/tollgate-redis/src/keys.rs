//! Redis key layout and hash tags.
//!
//! A limit's state lives at `<prefix>:<algorithm>:{<tag>}` when the caller's
//! key has no leading tag, and at `<prefix>:<algorithm>:{<tag>}:<rest>` when it
//! starts with one (`{tag}rest`). The tag is what Redis Cluster hashes, so:
//!
//! - by default the whole caller key is the tag: every key of the caller is its
//!   own slot, and no brace inside it can move it to another one;
//! - a caller that wants several keys on one slot (so their limits are checked in
//!   one atomic script) starts them with the same `{tag}`, e.g.
//!   `{user:42}api` and `{user:42}uploads`. Keys built from request data should
//!   never start with `{` (tollgate-policy's keys start with a length digit), so a
//!   client cannot pick a slot by sending braces.
//!
//! `{`, `}` and `%` inside the tag and the rest are percent-escaped, so the
//! Redis key has exactly one `{...}` pair and the mapping is injective: two
//! distinct caller keys never share a Redis key. An empty tag is written `%`
//! (never produced by escaping), so the hashed part is never empty.
//!
//! Algorithms whose state needs two keys (the sliding log's total, the
//! concurrency limiter's in-flight count) add an auxiliary key that differs in
//! the algorithm segment only, so it hashes to the same slot.

use tollgate_core::Algorithm;

/// The algorithm's segment in a key (and its auxiliary key's).
pub(crate) fn segment(algorithm: Algorithm) -> (&'static str, &'static str) {
    match algorithm {
        // `2`: the second encoding of these states (GCRA's and shaping's a
        // decimal integer, the others' 12 bytes); an older Tollgate kept
        // packed doubles at `tb`, `gcra`, ... Neither reads the other's keys.
        Algorithm::TokenBucket => ("tb2", "tb2.x"),
        Algorithm::Gcra => ("gcra2", "gcra2.x"),
        Algorithm::LeakyBucket => ("lb2", "lb2.x"),
        Algorithm::LeakyBucketShaping { .. } => ("lbs2", "lbs2.x"),
        // `3`: a count per window at `<key>:<window>` (window_key), which
        // native INCRBY updates; `fw2` and `hc2` held a packed (time, count).
        Algorithm::FixedWindow => ("fw3", "fw3.x"),
        Algorithm::HitCounter => ("hc3", "hc3.x"),
        Algorithm::SlidingLog => ("log", "log.n"),
        Algorithm::SlidingCounter => ("swc", "swc.x"),
        Algorithm::Concurrency => ("lease", "lease.n"),
    }
}

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// Splits a caller key into its hash tag and the rest (`None` when the whole
/// key is the tag).
pub(crate) fn split_tag(key: &str) -> (&str, Option<&str>) {
    if let Some(body) = key.strip_prefix('{')
        && let Some(end) = body.find('}')
    {
        return (&body[..end], Some(&body[end + 1..]));
    }
    (key, None)
}

/// The Redis keys (state, auxiliary) of a caller key under an algorithm.
pub(crate) fn redis_keys(prefix: &str, algorithm: Algorithm, key: &str) -> (String, String) {
    let (main, aux) = segment(algorithm);
    (
        redis_keys_in(prefix, main, key),
        redis_keys_in(prefix, aux, key),
    )
}

/// The Redis key of a caller key in the segment `segment`:
/// `<prefix>:<segment>:{<tag>}[:<rest>]`.
pub(crate) fn redis_keys_in(prefix: &str, segment: &str, key: &str) -> String {
    let (tag, rest) = split_tag(key);
    let mut out = String::with_capacity(prefix.len() + segment.len() + key.len() + 8);
    out.push_str(prefix);
    out.push(':');
    out.push_str(segment);
    out.push_str(":{");
    if tag.is_empty() {
        out.push('%');
    } else {
        escape_into(&mut out, tag);
    }
    out.push('}');
    if let Some(rest) = rest {
        out.push(':');
        escape_into(&mut out, rest);
    }
    out
}

/// The key of a fixed window's or hit counter's count for window `window`
/// (the time in µs divided by the period in µs), as the Lua code names it
/// (`window_key`): the limit's key, `:` and the window's number. Distinct
/// limit keys or windows never share one: the number after the last `:` is
/// the window, and what is before it the limit's key.
pub(crate) fn window_key(key: &str, window: u64) -> String {
    format!("{key}:{window}")
}

/// The Redis Cluster slot of a Redis key: CRC16 (XMODEM) of its hash tag, mod 16384.
pub(crate) fn slot(redis_key: &str) -> u16 {
    let bytes = redis_key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    crc16(hashed) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_cluster_spec() {
        // The reference value from the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn keys_are_tagged_escaped_and_distinct() {
        let k = |key| redis_keys("tg", Algorithm::Gcra, key).0;
        assert_eq!(k("user:1"), "tg:gcra2:{user:1}");
        assert_eq!(k("{u1}api"), "tg:gcra2:{u1}:api");
        assert_eq!(k("{u1}"), "tg:gcra2:{u1}:");
        assert_eq!(k("a}b{c"), "tg:gcra2:{a%7Db%7Bc}");
        assert_eq!(k(""), "tg:gcra2:{%}");
        assert_eq!(k("{}x"), "tg:gcra2:{%}:x");
        assert_eq!(k("{open"), "tg:gcra2:{%7Bopen}");
        let distinct = ["a", "{a}", "{a}b", "%7D", "}", "{}", "", "{a}:b", "{a:}b"];
        let mut seen: Vec<String> = distinct.iter().map(|d| k(d)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), distinct.len());
    }

    #[test]
    fn a_limits_two_keys_share_a_slot_and_tags_group_keys() {
        for key in ["user:1", "{t}x", "", "{}y", "a{b}c"] {
            let (main, aux) = redis_keys("tg", Algorithm::SlidingLog, key);
            assert_eq!(slot(&main), slot(&aux), "{key}");
        }
        let a = redis_keys("tg", Algorithm::Gcra, "{user:42}api").0;
        let b = redis_keys("tg", Algorithm::SlidingLog, "{user:42}uploads").0;
        assert_eq!(slot(&a), slot(&b));
        // A brace in the middle of a key does not choose the slot.
        let c = redis_keys("tg", Algorithm::Gcra, "x{user:42}").0;
        assert_eq!(slot(&c), crc16(b"x%7Buser:42%7D") % 16384);
    }
}
