use std::fmt::Write as _;
use std::io;
use std::time::Duration;

use serde::{Serialize, Serializer};
use tollgate_core::Algorithm;

/// What one algorithm did with a trace, compared with the exact sliding log.
///
/// Its JSON form ([`Report::to_json_line`]) has exactly the fields `algorithm`,
/// `requests`, `admitted`, `denied`, `false_admits`, `false_denies` and
/// `max_in_period`, in that order; the other fields appear in the table only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// The algorithm replayed, written by its command-line name.
    #[serde(serialize_with = "algorithm_name")]
    pub algorithm: Algorithm,
    /// Requests in the trace.
    pub requests: u64,
    /// Requests the algorithm admitted (the shaping leaky bucket's delayed
    /// admissions included).
    pub admitted: u64,
    /// Requests the algorithm denied.
    pub denied: u64,
    /// Requests the algorithm admitted and the sliding log denied.
    pub false_admits: u64,
    /// Requests the algorithm denied and the sliding log admitted.
    pub false_denies: u64,
    /// The largest cost admitted for one key within any sliding window of one
    /// period: the maximum over keys and over `t` of the admitted cost in
    /// `(t − period, t]`.
    pub max_in_period: u64,
    /// The longest delay the algorithm asked an admitted request to wait
    /// (only the shaping leaky bucket delays).
    #[serde(skip)]
    pub max_delay: Duration,
    /// Bytes of state one key needs: the state's size, plus, for the sliding
    /// log, 16 bytes per logged admission at the busiest key's busiest moment.
    #[serde(skip)]
    pub state_bytes: u64,
}

fn algorithm_name<S: Serializer>(algorithm: &Algorithm, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(algorithm.name())
}

/// serde_json's compact output with a space after each `:` and `,`.
struct SpacedFormatter;

impl serde_json::ser::Formatter for SpacedFormatter {
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

impl Report {
    /// Requests decided differently from the sliding log.
    pub fn wrong(&self) -> u64 {
        self.false_admits.saturating_add(self.false_denies)
    }

    /// The report as one line of JSON (without the newline), e.g.
    /// `{"algorithm": "gcra", "requests": 3, "admitted": 2, "denied": 1,
    /// "false_admits": 0, "false_denies": 0, "max_in_period": 2}` on one line.
    pub fn to_json_line(&self) -> String {
        let mut out = Vec::new();
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, SpacedFormatter);
        self.serialize(&mut serializer)
            .expect("a report of integers and a name always serializes");
        String::from_utf8(out).expect("serde_json writes UTF-8")
    }
}

/// `part` as a percentage of `whole`, with three decimals.
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_owned();
    }
    // Precision loss above 2^53 requests does not show in three decimals.
    format!("{:.3}%", part as f64 * 100.0 / whole as f64)
}

/// Lays reports out as an aligned text table, one row per report, with the
/// JSON columns, their percentages of the requests, the wrong decisions in
/// total, the state bytes per key and the longest shaping delay.
pub fn format_table(reports: &[Report]) -> String {
    const HEADER: [&str; 10] = [
        "algorithm",
        "requests",
        "admitted",
        "denied",
        "false admits",
        "false denies",
        "wrong",
        "max in period",
        "state B/key",
        "max delay",
    ];
    let count = |n: u64, of: u64| format!("{n} ({})", percent(n, of));
    let rows: Vec<[String; 10]> = reports
        .iter()
        .map(|r| {
            [
                r.algorithm.name().to_owned(),
                r.requests.to_string(),
                count(r.admitted, r.requests),
                count(r.denied, r.requests),
                count(r.false_admits, r.requests),
                count(r.false_denies, r.requests),
                count(r.wrong(), r.requests),
                r.max_in_period.to_string(),
                r.state_bytes.to_string(),
                format!("{:?}", r.max_delay),
            ]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = HEADER.map(str::to_owned);
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, &width)) in row.iter().zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(line, "{cell:<width$}");
            } else {
                let _ = write!(line, "  {cell:>width$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            algorithm: Algorithm::LeakyBucketShaping { delay_after: 0 },
            requests: 3,
            admitted: 2,
            denied: 1,
            false_admits: 1,
            false_denies: 0,
            max_in_period: 2,
            max_delay: Duration::from_millis(990),
            state_bytes: 8,
        }
    }

    #[test]
    fn json_line_has_exactly_the_agreed_fields_in_order() {
        assert_eq!(
            report().to_json_line(),
            r#"{"algorithm": "leaky-bucket-shaping", "requests": 3, "admitted": 2, "denied": 1, "false_admits": 1, "false_denies": 0, "max_in_period": 2}"#
        );
    }

    #[test]
    fn table_is_aligned_with_percentages() {
        let table = format_table(&[report()]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("algorithm "), "{table}");
        assert!(lines[1].starts_with("leaky-bucket-shaping "), "{table}");
        assert!(lines[1].contains("2 (66.667%)"), "{table}");
        assert!(lines[1].contains("1 (33.333%)"), "{table}");
        assert!(lines[1].ends_with("990ms"), "{table}");
        // Right-aligned columns end at the same place in every row.
        let end = |line: &str, needle: &str| line.find(needle).unwrap() + needle.len();
        assert_eq!(end(lines[0], "requests"), end(lines[1], " 3"));
    }

    #[test]
    fn empty_trace_has_no_percentages() {
        let empty = Report {
            requests: 0,
            admitted: 0,
            denied: 0,
            false_admits: 0,
            false_denies: 0,
            max_in_period: 0,
            ..report()
        };
        assert!(format_table(&[empty]).contains("0 (-)"));
    }
}
