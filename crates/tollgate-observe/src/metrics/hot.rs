//! The metrics every request records, `tollgate_checks_total`,
//! `tollgate_check_duration_seconds` and `tollgate_store_duration_seconds`,
//! kept in per-thread stripes of plain atomics and rendered as Prometheus
//! text after the exporter's.
//!
//! The `metrics` Prometheus recorder makes each update several atomic
//! operations on cache lines that every worker thread shares (a registry
//! generation, a lock-free bucket of samples with epoch-based reclamation);
//! with two or more threads serving, those lines move between cores on every
//! request, which costs more than the rate limit check itself. Here a thread
//! adds to its own stripe (a cache line no other thread writes, unless more
//! threads than stripes record), and only `/metrics` sums the stripes.
//!
//! The text is what the exporter wrote for these metrics before: the same
//! names, labels, buckets and help texts; a series appears once it has a
//! sample.

use std::fmt::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use tollgate_core::IntoNanos;

/// Stripes per metric; threads beyond share them round-robin.
const STRIPES: usize = 8;

/// Rows of the per-API tables: room for this many APIs.
pub(super) const APIS: usize = 8;

/// Results of a check (`ok`, `over_limit`, `invalid`, `shed`).
pub(super) const RESULTS: usize = 4;

/// The bucket upper bounds, in nanoseconds: 10 µs to 1 s, as
/// [`super::BUCKETS`] gives them in seconds.
const BOUNDS: [u64; 12] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
];

/// The `le` labels of [`BOUNDS`], as the exporter writes them, then `+Inf`.
const LE: [&str; 13] = [
    "0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005",
    "0.01", "0.1", "1", "+Inf",
];

/// A value alone on its cache line.
#[repr(align(64))]
struct Padded<T>(T);

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Relaxed) % STRIPES;
}

/// This thread's stripe.
fn stripe() -> usize {
    STRIPE.with(|s| *s)
}

/// A counter.
pub(super) struct Counter {
    stripes: [Padded<AtomicU64>; STRIPES],
}

impl Counter {
    const fn new() -> Self {
        Self {
            stripes: [const { Padded(AtomicU64::new(0)) }; STRIPES],
        }
    }

    fn increment(&self) {
        self.stripes[stripe()].0.fetch_add(1, Relaxed);
    }

    fn get(&self) -> u64 {
        self.stripes.iter().map(|s| s.0.load(Relaxed)).sum()
    }
}

/// One stripe of a histogram: a count per bucket (not cumulative; the last
/// is above every bound) and the sum of the samples in nanoseconds.
struct Cells {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

/// A histogram of durations over [`BOUNDS`].
pub(super) struct Histogram {
    stripes: [Padded<Cells>; STRIPES],
}

impl Histogram {
    const fn new() -> Self {
        Self {
            stripes: [const {
                Padded(Cells {
                    buckets: [const { AtomicU64::new(0) }; BOUNDS.len() + 1],
                    sum_nanos: AtomicU64::new(0),
                })
            }; STRIPES],
        }
    }

    fn record(&self, elapsed: Duration) {
        let nanos = elapsed.into_nanos();
        let bucket = BOUNDS.partition_point(|&bound| bound < nanos);
        let cells = &self.stripes[stripe()].0;
        cells.buckets[bucket].fetch_add(1, Relaxed);
        cells.sum_nanos.fetch_add(nanos, Relaxed);
    }

    /// The counts per bucket (not cumulative) and the sum in nanoseconds.
    fn read(&self) -> ([u64; BOUNDS.len() + 1], u128) {
        let mut counts = [0; BOUNDS.len() + 1];
        let mut sum = 0u128;
        for cells in &self.stripes {
            for (count, cell) in counts.iter_mut().zip(&cells.0.buckets) {
                *count += cell.load(Relaxed);
            }
            sum += u128::from(cells.0.sum_nanos.load(Relaxed));
        }
        (counts, sum)
    }
}

/// `tollgate_checks_total` by API and result.
static CHECKS: [[Counter; RESULTS]; APIS] = [const { [const { Counter::new() }; RESULTS] }; APIS];
/// `tollgate_check_duration_seconds` by API.
static CHECK_DURATIONS: [Histogram; APIS] = [const { Histogram::new() }; APIS];
/// `tollgate_store_duration_seconds`.
static STORE_DURATION: Histogram = Histogram::new();
/// The `api` label of each row, set when the row first records.
static API_LABELS: [OnceLock<&'static str>; APIS] = [const { OnceLock::new() }; APIS];
/// The `result` labels, by column.
const RESULT_LABELS: [&str; RESULTS] = ["ok", "over_limit", "invalid", "shed"];

/// Records one answered request of API row `api` (labelled `label`) with
/// result column `result`. False when the row or column is out of range, for
/// the caller to record another way.
pub(super) fn check(api: usize, label: &'static str, result: usize, elapsed: Duration) -> bool {
    let (Some(counters), Some(durations), Some(labels)) = (
        CHECKS.get(api),
        CHECK_DURATIONS.get(api),
        API_LABELS.get(api),
    ) else {
        return false;
    };
    let Some(counter) = counters.get(result) else {
        return false;
    };
    labels.get_or_init(|| label);
    counter.increment();
    durations.record(elapsed);
    true
}

/// Records one store call's duration.
pub(super) fn store_call(elapsed: Duration) {
    STORE_DURATION.record(elapsed);
}

/// Appends these metrics to `text`, the exporter's rendering.
pub(super) fn render(text: &mut String, help: &Help) {
    let checks: Vec<String> = API_LABELS
        .iter()
        .zip(&CHECKS)
        .filter_map(|(label, row)| Some((label.get()?, row)))
        .flat_map(|(api, row)| {
            RESULT_LABELS
                .iter()
                .zip(row)
                .filter(|(_, counter)| counter.get() > 0)
                .map(move |(result, counter)| {
                    format!(
                        "{}{{api=\"{api}\",result=\"{result}\"}} {}\n",
                        help.checks.0,
                        counter.get()
                    )
                })
        })
        .collect();
    if !checks.is_empty() {
        family(text, help.checks, "counter");
        checks.iter().for_each(|line| text.push_str(line));
        text.push('\n');
    }

    let durations: Vec<(&str, &Histogram)> = API_LABELS
        .iter()
        .zip(&CHECK_DURATIONS)
        .filter_map(|(label, histogram)| Some((*label.get()?, histogram)))
        .filter(|(_, histogram)| histogram.read().0.iter().sum::<u64>() > 0)
        .collect();
    if !durations.is_empty() {
        family(text, help.check_duration, "histogram");
        for (api, histogram) in durations {
            series(
                text,
                help.check_duration.0,
                &format!("api=\"{api}\""),
                histogram,
            );
        }
        text.push('\n');
    }

    if STORE_DURATION.read().0.iter().sum::<u64>() > 0 {
        family(text, help.store_duration, "histogram");
        series(text, help.store_duration.0, "", &STORE_DURATION);
        text.push('\n');
    }
}

/// The names and help texts of the metrics kept here.
pub(super) struct Help {
    pub(super) checks: (&'static str, &'static str),
    pub(super) check_duration: (&'static str, &'static str),
    pub(super) store_duration: (&'static str, &'static str),
}

fn family(text: &mut String, (name, help): (&str, &str), kind: &str) {
    let _ = writeln!(text, "# HELP {name} {help}");
    let _ = writeln!(text, "# TYPE {name} {kind}");
}

/// One histogram series: cumulative buckets, sum (seconds) and count.
fn series(text: &mut String, name: &str, labels: &str, histogram: &Histogram) {
    let (counts, sum_nanos) = histogram.read();
    let comma = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0;
    for (le, count) in LE.iter().zip(counts) {
        cumulative += count;
        let _ = writeln!(
            text,
            "{name}_bucket{{{labels}{comma}le=\"{le}\"}} {cumulative}"
        );
    }
    let braces = |labels: &str| {
        if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        }
    };
    // Seconds, as a float, like the exporter's sum.
    let sum = sum_nanos as f64 / 1e9;
    let _ = writeln!(text, "{name}_sum{} {sum}", braces(labels));
    let _ = writeln!(text, "{name}_count{} {cumulative}", braces(labels));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_the_exporter_configuration() {
        for (nanos, seconds) in BOUNDS.iter().zip(super::super::BUCKETS) {
            assert_eq!(*nanos as f64 / 1e9, seconds);
        }
        for (le, seconds) in LE.iter().zip(super::super::BUCKETS) {
            assert_eq!(le.parse::<f64>().ok(), Some(seconds));
        }
    }

    #[test]
    fn a_histogram_counts_each_sample_once_at_or_below_its_bound() {
        let histogram = Histogram::new();
        histogram.record(Duration::from_micros(10)); // exactly the first bound
        histogram.record(Duration::from_micros(11));
        histogram.record(Duration::from_secs(5));
        let (counts, sum) = histogram.read();
        assert_eq!(counts[0], 1);
        assert_eq!(counts[1], 1);
        assert_eq!(counts[BOUNDS.len()], 1);
        assert_eq!(sum, 5_000_021_000);
        let mut text = String::new();
        series(&mut text, "t_seconds", "api=\"v1\"", &histogram);
        assert!(text.contains("t_seconds_bucket{api=\"v1\",le=\"0.00001\"} 1\n"));
        assert!(text.contains("t_seconds_bucket{api=\"v1\",le=\"1\"} 2\n"));
        assert!(text.contains("t_seconds_bucket{api=\"v1\",le=\"+Inf\"} 3\n"));
        assert!(text.contains("t_seconds_count{api=\"v1\"} 3\n"));
        assert!(text.contains("t_seconds_sum{api=\"v1\"} 5.000021\n"));
        let mut text = String::new();
        series(&mut text, "s_seconds", "", &histogram);
        assert!(text.contains("s_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("s_seconds_count 3\n"));
    }

    #[test]
    fn counters_sum_their_stripes() {
        let counter = Counter::new();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| (0..1000).for_each(|_| counter.increment()));
            }
        });
        assert_eq!(counter.get(), 4000);
    }
}
