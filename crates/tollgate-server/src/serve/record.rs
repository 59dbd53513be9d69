//! Request files: what `tollgate serve --record FILE` writes and `tollgate
//! simulate --requests FILE` replays.
//!
//! One policy check per line, as JSON (NDJSON): `/v1/check`'s policy body
//! with the time it was decided,
//!
//! ```json
//! {"ts_ns":1795514400123000000,"domain":"api","descriptors":[{"entries":[{"key":"user","value":"42"}]}],"hits_addend":1}
//! ```
//!
//! `ts_ns` is nanoseconds since the Unix epoch; a line written by hand may
//! give `"time": "2026-11-24T10:00:00.123Z"` (RFC 3339) instead. The rest is
//! read exactly as `POST /v1/check` reads it, with the same errors.
//!
//! The recorder ([`Recording`]) is an [`Observer`] wrapped around the
//! service's own: it hands each decided policy check to a writer thread over
//! a bounded channel and never waits, so a slow disk cannot slow a request;
//! a check that finds the channel full is dropped and counted. The file is
//! appended to, and recording stops for good once it would pass its size
//! bound (what the file already held counts).
//!
//! The Rate Limit Quota Service's reports are recorded too: Envoy decides
//! those requests itself and reports, per bucket, how many it admitted and
//! denied since its last report (every 5 s). Each report of a bucket is one
//! line, its descriptor with `hits_addend` the requests Envoy saw, at the
//! report's time ([`Recorder::quota_usage`]).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use metrics::counter;
use serde::Serialize;
use tollgate_core::{Nanos, StoreError};
use tollgate_envoy::rlqs::{Reported, UsageSink};
use tollgate_policy::{Decided, Descriptor, Observer, Request};

use super::native::{NativeDescriptor, policy_request_of};

/// Lines written to the recording.
const RECORDED: &str = "tollgate_record_lines_total";
/// Checks not recorded, by reason: `overflow` (the writer was behind),
/// `full` (the file reached `--record-max-bytes`) or `error` (a write
/// failed; recording stopped).
const DROPPED: &str = "tollgate_record_dropped_total";

/// Checks waiting for the writer at most; past it, checks are dropped.
const QUEUE: usize = 16_384;

/// Options of `tollgate serve` for recording its requests.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "recording")]
pub(crate) struct Args {
    /// Append every policy check decided (any door) to FILE, one JSON line
    /// each, as `tollgate simulate --requests` reads them (docs/service.md,
    /// "Recording and previewing"). Off by default.
    #[arg(long, env = "TOLLGATE_RECORD", value_name = "FILE")]
    record: Option<PathBuf>,

    /// Stop recording once the file would pass this many bytes.
    #[arg(
        long,
        env = "TOLLGATE_RECORD_MAX_BYTES",
        value_name = "BYTES",
        default_value_t = 100_000_000,
        requires = "record"
    )]
    record_max_bytes: u64,
}

/// One policy check of a request file, owning what [`Request`] borrows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// When it was decided, in nanoseconds since the Unix epoch.
    pub at: Nanos,
    /// The request's domain.
    pub domain: String,
    /// Its descriptors.
    pub descriptors: Vec<Descriptor>,
    /// What each descriptor costs unless it says otherwise (0 counts as 1).
    pub hits_addend: u64,
}

/// A line as written: `ts_ns` first, then `/v1/check`'s fields.
#[derive(Serialize)]
struct Line<'a> {
    ts_ns: Nanos,
    domain: &'a str,
    descriptors: Vec<NativeDescriptor>,
    hits_addend: u64,
}

impl RecordedRequest {
    /// The request, as the enforcer takes it.
    pub fn request(&self) -> Request<'_> {
        Request {
            domain: &self.domain,
            descriptors: &self.descriptors,
            hits_addend: self.hits_addend,
        }
    }

    /// Reads one line of a request file.
    ///
    /// # Errors
    ///
    /// What is wrong with it: not JSON, no time or two, a bad time, or what
    /// `POST /v1/check` would answer 400 with.
    pub fn parse(line: &str) -> Result<Self, String> {
        let mut value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
        let object = value
            .as_object_mut()
            .ok_or("expected a JSON object".to_owned())?;
        let at = match (object.remove("ts_ns"), object.remove("time")) {
            (Some(ts), None) => ts
                .as_u64()
                .ok_or("ts_ns: expected nanoseconds since the Unix epoch, an integer")?,
            (None, Some(time)) => parse_time(
                time.as_str()
                    .ok_or("time: expected an RFC 3339 string, e.g. 2026-11-24T10:00:00.123Z")?,
            )
            .map_err(|e| format!("time: {e}"))?,
            (Some(_), Some(_)) => return Err("give `ts_ns` or `time`, not both".to_owned()),
            (None, None) => return Err("missing `ts_ns` (or `time`)".to_owned()),
        };
        let request = policy_request_of(value)?;
        Ok(Self {
            at,
            domain: request.domain,
            descriptors: request.descriptors,
            hits_addend: request.hits_addend,
        })
    }

    /// The line [`RecordedRequest::parse`] reads back as `self`, with its newline.
    pub fn to_line(&self) -> String {
        let line = Line {
            ts_ns: self.at,
            domain: &self.domain,
            descriptors: self.descriptors.iter().map(NativeDescriptor::of).collect(),
            hits_addend: self.hits_addend,
        };
        // Strings and integers only: serializing cannot fail.
        let mut text = serde_json::to_string(&line).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// An RFC 3339 time, `2026-11-24T10:00:00.123Z` or with an offset
/// (`+01:00`), as nanoseconds since the Unix epoch. Envoy's access logs
/// write `%START_TIME%` this way.
///
/// # Errors
///
/// Which part is wrong, or that the time is before 1970.
pub fn parse_time(text: &str) -> Result<Nanos, String> {
    let bad = |part: &str| format!("{text:?} is not an RFC 3339 time ({part})");
    let b = text.as_bytes();
    let digits = |from: usize, len: usize| -> Option<i64> {
        let field = b.get(from..from + len)?;
        field
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| field.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if separators.iter().any(|&(i, c)| b.get(i) != Some(&c))
        || !matches!(b.get(10), Some(b'T' | b't' | b' '))
    {
        return Err(bad("expected YYYY-MM-DDTHH:MM:SS"));
    }
    let field = |from, len, name: &str, range: std::ops::RangeInclusive<i64>| {
        digits(from, len)
            .filter(|n| range.contains(n))
            .ok_or_else(|| bad(name))
    };
    let year = field(0, 4, "year", 1970..=9999)?;
    let month = field(5, 2, "month", 1..=12)?;
    let day = field(8, 2, "day", 1..=days_in_month(year, month))?;
    let hour = field(11, 2, "hour", 0..=23)?;
    let minute = field(14, 2, "minute", 0..=59)?;
    let second = field(17, 2, "second", 0..=60)?;
    let mut at = 19;
    let mut nanos = 0i64;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start || at - start > 9 {
            return Err(bad("1 to 9 digits of fraction"));
        }
        let fraction = digits(start, at - start).ok_or_else(|| bad("fraction"))?;
        nanos = fraction * 10i64.pow(u32::try_from(9 - (at - start)).unwrap_or(0));
    }
    let offset = match b.get(at..) {
        Some(b"Z" | b"z") => 0,
        Some([sign @ (b'+' | b'-'), _, _, b':', _, _]) => {
            let minutes =
                field(at + 1, 2, "offset", 0..=23)? * 60 + field(at + 4, 2, "offset", 0..=59)?;
            if *sign == b'+' { minutes } else { -minutes }
        }
        _ => return Err(bad("expected Z or an offset such as +01:00 at the end")),
    };
    let seconds = days_since_epoch(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second
        - offset * 60;
    u64::try_from(seconds)
        .ok()
        .and_then(|s| s.checked_mul(1_000_000_000))
        .and_then(|ns| ns.checked_add(u64::try_from(nanos).ok()?))
        .ok_or_else(|| bad("before 1970"))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`).
fn days_since_epoch(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The service's observer, also recording each decided policy check.
pub(crate) struct Recording<O> {
    inner: O,
    recorder: Recorder,
}

/// Hands lines to the writer thread; cheap to clone.
#[derive(Clone)]
pub(crate) struct Recorder {
    queue: SyncSender<RecordedRequest>,
    /// Why the writer stopped, once it has: checks are then not even copied.
    stopped: Arc<OnceLock<&'static str>>,
}

impl Recorder {
    /// Whether lines are still taken; counts one dropped if not.
    fn taking(&self) -> bool {
        match self.stopped.get() {
            Some(&reason) => {
                counter!(DROPPED, "reason" => reason).increment(1);
                false
            }
            None => true,
        }
    }

    /// Queues `request` for the writer, never waiting.
    fn record(&self, request: RecordedRequest) {
        match self.queue.try_send(request) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => counter!(DROPPED, "reason" => "overflow").increment(1),
            // Only if the writer thread died.
            Err(TrySendError::Disconnected(_)) => {
                counter!(DROPPED, "reason" => "error").increment(1)
            }
        }
    }

    /// A bucket's usage as Envoy's quota filter reported it: one line of
    /// the bucket's descriptor with `hits_addend` the requests Envoy saw
    /// (admitted and denied), at the report's time.
    pub(crate) fn quota_usage(&self) -> UsageSink {
        let recorder = self.clone();
        Arc::new(move |reported: &Reported<'_>| {
            if !recorder.taking() {
                return;
            }
            recorder.record(RecordedRequest {
                at: reported.at,
                domain: reported.domain.to_owned(),
                descriptors: vec![reported.descriptor.clone()],
                hits_addend: reported.usage.allowed.saturating_add(reported.usage.denied),
            });
        })
    }
}

/// `inner`, recording to `args.record` if it names a file; the recorder,
/// for what else is to be recorded.
///
/// # Errors
///
/// The file cannot be opened for appending.
pub(crate) fn observer<O: Observer>(
    inner: O,
    args: &Args,
) -> anyhow::Result<(Arc<dyn Observer>, Option<Recorder>)> {
    let Some(path) = &args.record else {
        return Ok((Arc::new(inner), None));
    };
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("--record {}: cannot open for appending", path.display()))?;
    let written = file.metadata().map_or(0, |m| m.len());
    let (queue, received) = sync_channel(QUEUE);
    let stopped = Arc::new(OnceLock::new());
    let writer = Writer {
        path: path.clone(),
        out: BufWriter::new(file),
        written,
        max: args.record_max_bytes,
        stopped: Arc::clone(&stopped),
    };
    std::thread::Builder::new()
        .name("tollgate-record".into())
        .spawn(move || writer.run(&received))
        .context("cannot start the recording thread")?;
    tracing::info!(path = %path.display(), max_bytes = args.record_max_bytes, "recording requests");
    let recorder = Recorder { queue, stopped };
    Ok((
        Arc::new(Recording {
            inner,
            recorder: recorder.clone(),
        }),
        Some(recorder),
    ))
}

impl<O: Observer> Observer for Recording<O> {
    fn decided(&self, decided: &Decided<'_>) {
        self.inner.decided(decided);
        // Ad-hoc checks name their own limits: no policy to preview.
        let Some(domain) = decided.domain else {
            return;
        };
        if !self.recorder.taking() {
            return;
        }
        self.recorder.record(RecordedRequest {
            at: decided.verdict.started_at,
            domain: domain.to_owned(),
            descriptors: decided.descriptors.to_vec(),
            hits_addend: decided.hits_addend,
        });
    }

    fn store_failed(&self, error: &StoreError, shadow: bool) {
        self.inner.store_failed(error, shadow);
    }

    fn store_call(&self, elapsed: Duration, ok: bool) {
        self.inner.store_call(elapsed, ok);
    }

    fn release_failed(&self, error: &StoreError) {
        self.inner.release_failed(error);
    }
}

/// The writer thread's state.
struct Writer {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
    max: u64,
    stopped: Arc<OnceLock<&'static str>>,
}

impl Writer {
    /// Writes lines as they come, flushing whenever the queue is empty, so a
    /// reader of the file sees every check decided while the service idles.
    /// Once stopped, it goes on counting what was queued as dropped, so that
    /// every check is either written or counted.
    fn run(mut self, received: &Receiver<RecordedRequest>) {
        while let Ok(first) = received.recv() {
            let mut next = Some(first);
            while let Some(request) = next {
                self.write(&request);
                next = received.try_recv().ok();
            }
            if self.stopped.get().is_none()
                && let Err(error) = self.out.flush()
            {
                self.stop("error", &error.to_string());
            }
        }
    }

    fn write(&mut self, request: &RecordedRequest) {
        if let Some(&reason) = self.stopped.get() {
            counter!(DROPPED, "reason" => reason).increment(1);
            return;
        }
        let line = request.to_line();
        let len = line.len() as u64;
        if self.written.saturating_add(len) > self.max {
            counter!(DROPPED, "reason" => "full").increment(1);
            match self.out.flush() {
                Ok(()) => self.stop("full", "the recording reached --record-max-bytes"),
                Err(error) => self.stop("error", &error.to_string()),
            }
            return;
        }
        if let Err(error) = self.out.write_all(line.as_bytes()) {
            counter!(DROPPED, "reason" => "error").increment(1);
            self.stop("error", &error.to_string());
            return;
        }
        self.written += len;
        counter!(RECORDED).increment(1);
    }

    /// Stops recording for good, saying why once.
    fn stop(&self, reason: &'static str, why: &str) {
        if self.stopped.set(reason).is_ok() {
            tracing::warn!(path = %self.path.display(), bytes = self.written, "{why}; recording stopped");
        }
    }
}

/// Describes the recorder's metrics.
pub(crate) fn describe() {
    metrics::describe_counter!(RECORDED, "Checks written to the --record file.");
    metrics::describe_counter!(
        DROPPED,
        "Checks not recorded, by reason: overflow (the writer was behind), full (--record-max-bytes) or error (a write failed)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use tollgate_policy::{Entry, LimitOverride, Unit};

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn times_read_as_rfc_3339() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_time("2026-11-24T10:00:00.123Z"),
            Ok(1_795_514_400_123_000_000)
        );
        assert_eq!(
            parse_time("2026-11-24T11:00:00.123+01:00"),
            parse_time("2026-11-24T10:00:00.123Z")
        );
        assert_eq!(
            parse_time("2024-02-29T00:00:00.000000001Z"),
            Ok(1_709_164_800_000_000_001)
        );
        for bad in [
            "2026-11-24",
            "2026-11-24T10:00:00",
            "2026-02-29T00:00:00Z",
            "2026-11-24T24:00:00Z",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00+01:00",
            "2026-11-24T10:00:00.Z",
            "2026-11-24T10:00:00.1234567890Z",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_line_reads_back_as_written() {
        let request = RecordedRequest {
            at: 42,
            domain: "api".into(),
            descriptors: vec![
                Descriptor {
                    entries: vec![Entry::new("user", "4\"2")],
                    limit: Some(LimitOverride {
                        requests_per_unit: 5,
                        unit: Unit::Minute,
                    }),
                    hits_addend: Some(3),
                },
                Descriptor {
                    entries: vec![Entry::new("path", "/x"), Entry::new("method", "GET")],
                    ..Descriptor::default()
                },
            ],
            hits_addend: 0,
        };
        let line = request.to_line();
        assert_eq!(line.lines().count(), 1);
        assert_eq!(RecordedRequest::parse(&line), Ok(request));
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        let d = r#""domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}]"#;
        let error = |line: &str| RecordedRequest::parse(line).unwrap_err();
        assert!(error("{").contains("invalid JSON"));
        assert!(error(&format!("{{{d}}}")).contains("missing `ts_ns`"));
        assert!(
            error(&format!(
                r#"{{"ts_ns":1,"time":"1970-01-01T00:00:00Z",{d}}}"#
            ))
            .contains("not both")
        );
        assert!(error(&format!(r#"{{"ts_ns":-1,{d}}}"#)).contains("ts_ns"));
        assert!(error(&format!(r#"{{"time":"yesterday",{d}}}"#)).starts_with("time:"));
        assert!(
            error(r#"{"ts_ns":1,"domain":"api","descriptors":[]}"#).contains("must not be empty")
        );
        assert!(error(&format!(r#"{{"ts_ns":1,"colour":"red",{d}}}"#)).contains("unknown field"));
        assert_eq!(
            RecordedRequest::parse(&format!(r#"{{"time":"1970-01-01T00:00:01Z",{d}}}"#))
                .map(|r| r.at),
            Ok(1_000_000_000)
        );
    }

    #[test]
    fn the_writer_stops_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.ndjson");
        let request = |at| RecordedRequest {
            at,
            domain: "api".into(),
            descriptors: vec![Descriptor {
                entries: vec![Entry::new("user", "1")],
                ..Descriptor::default()
            }],
            hits_addend: 1,
        };
        let one = request(10).to_line().len() as u64;
        let stopped = Arc::new(OnceLock::new());
        let writer = Writer {
            path: path.clone(),
            out: BufWriter::new(File::create(&path).unwrap()),
            written: 0,
            max: 2 * one + 1,
            stopped: Arc::clone(&stopped),
        };
        let (queue, received) = sync_channel(8);
        for at in [10, 11, 12, 13] {
            queue.send(request(at)).unwrap();
        }
        drop(queue);
        writer.run(&received);
        assert_eq!(stopped.get(), Some(&"full"));
        let lines = lines(&path);
        assert_eq!(lines.len(), 2);
        assert_eq!(RecordedRequest::parse(&lines[1]), Ok(request(11)));
    }
}
