//! One rule's envoyproxy/ratelimit stats series ([`Series`]) under the
//! names and labels its Prometheus sink gives them: below the stats
//! (`envoy_stats`) and the per-rule hub (`kept`) that keeps a rule's series.

use std::borrow::Cow;
use std::sync::OnceLock;

use metrics::{Counter, counter};

/// The series, one per stat, in the order of [`Counts`]' fields.
pub(crate) const NAMES: [&str; 5] = [
    "ratelimit_service_rate_limit_total_hits",
    "ratelimit_service_rate_limit_over_limit",
    "ratelimit_service_rate_limit_near_limit",
    "ratelimit_service_rate_limit_within_limit",
    "ratelimit_service_rate_limit_shadow_mode",
];
/// What one descriptor adds to each stat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) total_hits: u64,
    pub(super) over_limit: u64,
    pub(super) near_limit: u64,
    pub(super) within_limit: u64,
    pub(super) shadow_mode: u64,
}

impl Counts {
    pub(super) fn as_array(self) -> [u64; 5] {
        [
            self.total_hits,
            self.over_limit,
            self.near_limit,
            self.within_limit,
            self.shadow_mode,
        ]
    }
}

/// One key's counters, registered at their first hit: envoyproxy/ratelimit's
/// stats store flushes only counters that moved, so a series appears once it
/// counts something.
pub(crate) struct Series {
    labels: Vec<(&'static str, String)>,
    counters: [OnceLock<Counter>; 5],
}

impl Series {
    pub(super) fn new(domain: &str, key: &str) -> Self {
        let name = format!("{domain}.{key}");
        Self {
            labels: labels(&sanitize(&name)),
            counters: Default::default(),
        }
    }

    pub(super) fn add(&self, counts: Counts) {
        for ((slot, name), n) in self.counters.iter().zip(NAMES).zip(counts.as_array()) {
            if n == 0 {
                continue;
            }
            slot.get_or_init(|| counter!(name, &self.labels))
                .increment(n);
        }
    }
}

/// The labels `default_mapper.yaml` gives `ratelimit.service.rate_limit.<name>.<stat>`:
/// its glob mappings (`*` is one dot-separated part) for two parts, its
/// regex mappings (the first three parts) for more.
fn labels(name: &str) -> Vec<(&'static str, String)> {
    let mut parts = name.split('.');
    let mut labels = Vec::with_capacity(3);
    for label in ["domain", "key1", "key2"] {
        match parts.next() {
            Some(part) => labels.push((label, part.to_owned())),
            None => break,
        }
    }
    labels
}

/// envoyproxy/ratelimit's `SanitizeStatName`: `:` and `|` become `_`, and
/// so do the dots of every IPv4-like run (`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`,
/// leftmost first, without overlap).
fn sanitize(name: &str) -> Cow<'_, str> {
    let mut bytes: Option<Vec<u8>> = None;
    let original = name.as_bytes();
    let mut i = 0;
    while i < original.len() {
        match original[i] {
            b':' | b'|' => bytes.get_or_insert_with(|| original.to_vec())[i] = b'_',
            b'0'..=b'9' => {
                if let Some((end, dots)) = ipv4_at(original, i) {
                    let out = bytes.get_or_insert_with(|| original.to_vec());
                    for dot in dots {
                        out[dot] = b'_';
                    }
                    i = end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    match bytes {
        // Only ASCII bytes were replaced by ASCII bytes.
        Some(bytes) => Cow::Owned(String::from_utf8(bytes).expect("still UTF-8")),
        None => Cow::Borrowed(name),
    }
}

/// The end of the IPv4-like run starting at `start`, and its three dots.
fn ipv4_at(s: &[u8], start: usize) -> Option<(usize, [usize; 3])> {
    let digits = |from: usize| {
        s[from..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut dots = [0; 3];
    let mut at = start;
    for dot in &mut dots {
        // `\d{1,3}\.`: the digits must run right up to the dot, since the
        // regexp can back off from three digits only onto a digit.
        let n = digits(at);
        if n == 0 || s.get(at + n) != Some(&b'.') {
            return None;
        }
        *dot = at + n;
        at += n + 1;
    }
    let n = digits(at);
    (n > 0).then_some((at + n, dots))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SanitizeStatName`'s replacements, and its regexp's leftmost-first,
    /// non-overlapping matches.
    #[test]
    fn sanitize_is_envoyproxy_ratelimits() {
        assert_eq!(sanitize("domain.key_value"), "domain.key_value");
        assert_eq!(sanitize("a:b|c"), "a_b_c");
        assert_eq!(
            sanitize("d.remote_address_10.0.0.1.x"),
            "d.remote_address_10_0_0_1.x"
        );
        assert_eq!(sanitize("1234.5.6.7"), "1234_5_6_7");
        assert_eq!(sanitize("1.2.3.4567"), "1_2_3_4567");
        assert_eq!(sanitize("1.2.3"), "1.2.3");
        assert_eq!(sanitize("1.2.3.4.5.6.7.8"), "1_2_3_4.5_6_7_8");
    }

    /// `src/stats/prom/prometheus_sink_test.go`'s
    /// `TestFlushCounterWithDifferentLabels`.
    #[test]
    fn labels_follow_default_mapper() {
        let l = |name| labels(name);
        assert_eq!(
            l("domain1.key1_val1"),
            [("domain", "domain1".into()), ("key1", "key1_val1".into())]
        );
        let three = [
            ("domain", "domain1".into()),
            ("key1", "key3_val3".into()),
            ("key2", "key4_val4".into()),
        ];
        assert_eq!(l("domain1.key3_val3.key4_val4"), three);
        assert_eq!(l("domain1.key3_val3.key4_val4.key5_val5"), three);
    }
}
