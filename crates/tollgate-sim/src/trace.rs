use std::collections::HashMap;
use std::io::{self, BufRead, Write};

use tollgate_core::Nanos;

/// How many characters of an offending line an error message quotes.
const QUOTED_CHARS: usize = 80;

/// A key of a [`Trace`], interned: the index of its name in the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(u32);

impl KeyId {
    /// The key's position among the trace's keys, from 0, in order of first appearance.
    pub fn index(self) -> usize {
        // Lossless on every 32- and 64-bit target.
        self.0 as usize
    }
}

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// When the request arrives, in nanoseconds.
    pub time: Nanos,
    /// Whose limit it is checked against.
    pub key: KeyId,
    /// How many units it costs (1 unless the trace says otherwise).
    pub cost: u64,
}

/// A time-ordered list of requests, with their keys interned.
///
/// The text form has one request per line, `<timestamp_ns> <key> [cost]`,
/// fields separated by whitespace, the cost defaulting to 1; blank lines and
/// lines starting with `#` are skipped. Timestamps must not decrease. A request
/// takes 24 bytes and a key is stored once, so traces of millions of requests
/// fit in memory comfortably.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    requests: Vec<Request>,
    keys: Vec<Box<str>>,
    ids: HashMap<Box<str>, KeyId, foldhash::fast::FixedState>,
}

/// Why a request could not be added to a [`Trace`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PushError {
    /// The request is earlier than the one before it.
    #[error(
        "timestamp {time} is earlier than the previous request's {previous}; the trace must be sorted by time"
    )]
    Unsorted {
        /// The request's timestamp.
        time: Nanos,
        /// The previous request's timestamp.
        previous: Nanos,
    },
    /// The key is empty or contains whitespace, so it could not be written back.
    #[error("key {key:?} is empty or contains whitespace")]
    BadKey {
        /// The key that was given.
        key: String,
    },
    /// The trace already holds 2^32 distinct keys.
    #[error("more than {} distinct keys", u32::MAX)]
    TooManyKeys,
}

/// Why a trace could not be read. Every error names the line, counted from 1.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Reading the input failed.
    #[error("line {line}: cannot read the trace: {error}")]
    Read {
        /// The line being read.
        line: u64,
        /// What failed.
        error: io::Error,
    },
    /// The line is not valid UTF-8.
    #[error("line {line}: not valid UTF-8")]
    NotUtf8 {
        /// The offending line.
        line: u64,
    },
    /// The timestamp is not an integer number of nanoseconds that fits in 64 bits.
    #[error(
        "line {line}: timestamp {field:?} is not an integer number of nanoseconds from 0 to {max}: {text:?}",
        max = u64::MAX
    )]
    BadTimestamp {
        /// The offending line.
        line: u64,
        /// The timestamp field.
        field: String,
        /// The line (its first 80 characters).
        text: String,
    },
    /// The line has a timestamp but no key.
    #[error("line {line}: missing key, expected `<timestamp_ns> <key> [cost]`: {text:?}")]
    MissingKey {
        /// The offending line.
        line: u64,
        /// The line (its first 80 characters).
        text: String,
    },
    /// The cost is not an integer that fits in 64 bits.
    #[error("line {line}: cost {field:?} is not an integer from 0 to {max}: {text:?}", max = u64::MAX)]
    BadCost {
        /// The offending line.
        line: u64,
        /// The cost field.
        field: String,
        /// The line (its first 80 characters).
        text: String,
    },
    /// The line has more than three fields.
    #[error("line {line}: too many fields, expected `<timestamp_ns> <key> [cost]`: {text:?}")]
    TooManyFields {
        /// The offending line.
        line: u64,
        /// The line (its first 80 characters).
        text: String,
    },
    /// The request is well formed but cannot follow the ones before it.
    #[error("line {line}: {reason}: {text:?}")]
    Rejected {
        /// The offending line.
        line: u64,
        /// The line (its first 80 characters).
        text: String,
        /// Why the request was refused.
        reason: PushError,
    },
}

impl TraceError {
    /// The line, counted from 1, where the error was found.
    pub fn line(&self) -> u64 {
        match *self {
            TraceError::Read { line, .. }
            | TraceError::NotUtf8 { line }
            | TraceError::BadTimestamp { line, .. }
            | TraceError::MissingKey { line, .. }
            | TraceError::BadCost { line, .. }
            | TraceError::TooManyFields { line, .. }
            | TraceError::Rejected { line, .. } => line,
        }
    }
}

/// The first characters of `text`, for an error message.
fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a trace in the text form, stopping at the first bad line.
    pub fn parse<R: BufRead>(mut input: R) -> Result<Self, TraceError> {
        let mut trace = Trace::new();
        let mut buf = Vec::new();
        let mut line = 0u64;
        loop {
            line += 1;
            buf.clear();
            match input.read_until(b'\n', &mut buf) {
                Ok(0) => return Ok(trace),
                Ok(_) => {}
                Err(error) => return Err(TraceError::Read { line, error }),
            }
            let text = std::str::from_utf8(&buf).map_err(|_| TraceError::NotUtf8 { line })?;
            trace.parse_line(line, text)?;
        }
    }

    fn parse_line(&mut self, line: u64, text: &str) -> Result<(), TraceError> {
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            return Ok(());
        }
        let mut fields = text.split_whitespace();
        let time_field = fields.next().unwrap_or_default();
        let time = time_field
            .parse::<Nanos>()
            .map_err(|_| TraceError::BadTimestamp {
                line,
                field: quote(time_field),
                text: quote(text),
            })?;
        let key = fields.next().ok_or_else(|| TraceError::MissingKey {
            line,
            text: quote(text),
        })?;
        let cost = match fields.next() {
            None => 1,
            Some(field) => field.parse::<u64>().map_err(|_| TraceError::BadCost {
                line,
                field: quote(field),
                text: quote(text),
            })?,
        };
        if fields.next().is_some() {
            return Err(TraceError::TooManyFields {
                line,
                text: quote(text),
            });
        }
        self.push(time, key, cost)
            .map(drop)
            .map_err(|reason| TraceError::Rejected {
                line,
                text: quote(text),
                reason,
            })
    }

    /// Appends a request, interning its key. Requests must come in time order
    /// (equal timestamps are fine).
    pub fn push(&mut self, time: Nanos, key: &str, cost: u64) -> Result<KeyId, PushError> {
        if let Some(previous) = self.requests.last().map(|r| r.time)
            && time < previous
        {
            return Err(PushError::Unsorted { time, previous });
        }
        let key = self.intern(key)?;
        self.requests.push(Request { time, key, cost });
        Ok(key)
    }

    fn intern(&mut self, key: &str) -> Result<KeyId, PushError> {
        if let Some(&id) = self.ids.get(key) {
            return Ok(id);
        }
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(PushError::BadKey {
                key: key.to_owned(),
            });
        }
        let id = KeyId(u32::try_from(self.keys.len()).map_err(|_| PushError::TooManyKeys)?);
        self.keys.push(key.into());
        self.ids.insert(key.into(), id);
        Ok(id)
    }

    /// Writes the trace in the text form that [`Trace::parse`] reads, leaving
    /// out costs of 1.
    pub fn write<W: Write>(&self, mut out: W) -> io::Result<()> {
        for r in &self.requests {
            let key = self.key(r.key);
            if r.cost == 1 {
                writeln!(out, "{} {key}", r.time)?;
            } else {
                writeln!(out, "{} {key} {}", r.time, r.cost)?;
            }
        }
        out.flush()
    }

    /// The requests, in time order.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// The name of an interned key.
    ///
    /// # Panics
    ///
    /// If `id` does not come from this trace.
    pub fn key(&self, id: KeyId) -> &str {
        &self.keys[id.index()]
    }

    /// How many distinct keys the trace holds.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// How many requests the trace holds.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether the trace holds no request.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        Trace::parse(text.as_bytes())
    }

    #[test]
    fn reads_requests_comments_and_blank_lines() {
        let trace =
            parse("# a comment\n\n10 alice\n  20\tbob 3  \r\n20 alice 0\n   # indented\n").unwrap();
        assert_eq!(trace.len(), 3);
        assert_eq!(trace.key_count(), 2);
        let r = trace.requests();
        assert_eq!(
            (r[0].time, trace.key(r[0].key), r[0].cost),
            (10, "alice", 1)
        );
        assert_eq!((r[1].time, trace.key(r[1].key), r[1].cost), (20, "bob", 3));
        assert_eq!((r[2].time, r[2].key, r[2].cost), (20, r[0].key, 0));
    }

    #[test]
    fn empty_input_is_an_empty_trace() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("\n# nothing\n").unwrap().is_empty());
    }

    #[test]
    fn last_line_needs_no_newline() {
        assert_eq!(parse("1 a\n2 b").unwrap().len(), 2);
    }

    #[test]
    fn errors_name_the_line_and_quote_it() {
        let cases: [(&str, u64, &str); 8] = [
            ("1 a\nabc a\n", 2, "timestamp \"abc\""),
            ("1 a\n\n# x\n5\n", 4, "missing key"),
            ("1 a 1 2\n", 1, "too many fields"),
            ("1 a x\n", 1, "cost \"x\""),
            (
                "1 a 18446744073709551616\n",
                1,
                "cost \"18446744073709551616\"",
            ),
            ("18446744073709551616 a\n", 1, "timestamp"),
            ("-1 a\n", 1, "timestamp \"-1\""),
            (
                "5 a\n7 b\n6 a\n",
                3,
                "earlier than the previous request's 7",
            ),
        ];
        for (text, line, needle) in cases {
            let err = parse(text).unwrap_err();
            assert_eq!(err.line(), line, "{text:?}: {err}");
            let message = err.to_string();
            assert!(message.starts_with(&format!("line {line}: ")), "{message}");
            assert!(message.contains(needle), "{message}");
        }
        let err = parse("1 a\n2 \u{0}\u{1}x y z\n").unwrap_err();
        assert!(err.to_string().contains("\"2 \\0\\u{1}x y z\""), "{err}");
    }

    #[test]
    fn invalid_utf8_is_an_error_with_its_line() {
        let err = Trace::parse(&b"1 a\n2 \xff\n"[..]).unwrap_err();
        assert!(matches!(err, TraceError::NotUtf8 { line: 2 }), "{err}");
    }

    #[test]
    fn long_lines_are_quoted_short() {
        let line = format!("1 a 1 {}", "x".repeat(10_000));
        let message = parse(&line).unwrap_err().to_string();
        assert!(message.len() < 300, "{message}");
        assert!(message.ends_with("...\""), "{message}");
    }

    #[test]
    fn huge_values_are_fine() {
        let text = format!("{max} a {max}\n{max} a\n", max = u64::MAX);
        let trace = parse(&text).unwrap();
        assert_eq!(trace.requests()[0].cost, u64::MAX);
    }

    #[test]
    fn push_refuses_keys_that_cannot_round_trip() {
        let mut trace = Trace::new();
        assert!(matches!(
            trace.push(0, "a b", 1),
            Err(PushError::BadKey { .. })
        ));
        assert!(matches!(
            trace.push(0, "", 1),
            Err(PushError::BadKey { .. })
        ));
        assert!(trace.is_empty());
    }

    #[test]
    fn write_then_parse_round_trips() {
        let text = "0 a\n5 b 7\n5 a 0\n";
        let trace = parse(text).unwrap();
        let mut out = Vec::new();
        trace.write(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), text);
    }
}
