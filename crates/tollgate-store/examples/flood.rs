//! A flood of unique keys against a capped memory store: memory stays at what
//! the cap's worth of keys takes, however many keys go by.
//!
//! Floods a store capped at `CAP` keys with `FLOOD` unique keys and prints the
//! keys held at the end, the new keys refused and the entries evicted to make
//! room, the resident set before the flood and at its peak (`VmHWM` from
//! `/proc/self/status`), and the heap bytes counted by the allocator. The first
//! nine tenths of the flood are back to full (at rest) a microsecond after
//! their check, so the store churns, evicting them to make room; the last
//! tenth stay limiting for longer than a run takes (100 per hour), so they
//! take the room of the keys at rest and then, with none left, are refused. For comparison it runs itself
//! again, in a fresh process, to measure what `CAP` keys take alone: a store
//! with room to spare, given exactly `CAP` keys.
//!
//! ```text
//! cargo run --release -p tollgate-store --example flood -- [CAP] [FLOOD]
//! ```
//! (defaults: 100000 and 10000000).

use std::alloc::System;
use std::fmt::Write as _;
use std::process::Command;
use std::time::Instant;

use cap::Cap;
use tollgate_core::{Algorithm, FailurePolicy, Limit, Quota};
use tollgate_store::{MemoryConfig, MemoryStore};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// The flag of the child process that measures `CAP` keys alone.
const ALONE: &str = "--alone";

/// A field of `/proc/self/status` in kB (`VmRSS`, `VmHWM`).
fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

fn mib_kb(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A quota whose used keys stay limiting for longer than a run takes (36 s),
/// or, if not `limiting`, are back to full a microsecond after their check.
fn quota(limiting: bool) -> Quota {
    if limiting {
        Quota::per_hour(100).expect("a valid quota")
    } else {
        Quota::per_second(1_000_000).expect("a valid quota")
    }
}

fn store(max_keys: usize) -> MemoryStore {
    MemoryStore::new(MemoryConfig {
        max_keys,
        ..MemoryConfig::default()
    })
}

/// Checks `n` unique keys with the given prefix against `store`, the first
/// `brief` of them on a quota that is at rest at once; returns how many were
/// admitted.
fn flood(
    store: &MemoryStore,
    prefix: &str,
    n: usize,
    brief: usize,
    mut progress: impl FnMut(usize),
) -> usize {
    let mut admitted = 0;
    let mut key = String::with_capacity(32);
    for i in 0..n {
        key.clear();
        write!(key, "{prefix}:{i}").expect("writing to a String");
        let limit = Limit {
            key: &key,
            quota: quota(i >= brief),
            algorithm: Algorithm::Gcra,
            cost: 1,
            failure: FailurePolicy::Local,
        };
        admitted += usize::from(store.check_now(&[limit]).allowed());
        progress(i + 1);
    }
    admitted
}

/// What `cap` keys take alone, measured in this (fresh) process and printed as
/// `rss_before_kb peak_kb heap_bytes keys_held`.
fn alone(cap: usize) {
    let (rss_before, heap_before) = (status_kb("VmRSS"), ALLOCATOR.allocated());
    let store = store(2 * cap);
    let admitted = flood(&store, "alone", cap, 0, |_| {});
    assert_eq!(admitted, cap, "a store with room admits every new key");
    println!(
        "{rss_before} {} {} {}",
        status_kb("VmHWM"),
        ALLOCATOR.allocated() - heap_before,
        store.len()
    );
}

/// Runs this program again with [`ALONE`]; returns what it printed.
fn measure_alone(cap: usize) -> (u64, u64, usize, usize) {
    let exe = std::env::current_exe().expect("the path of this program");
    let output = Command::new(exe)
        .args([ALONE, &cap.to_string()])
        .output()
        .expect("running the reference process");
    assert!(output.status.success(), "the reference process failed");
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    let fields: Vec<u64> = text
        .split_whitespace()
        .map(|f| f.parse().expect("a number"))
        .collect();
    let [rss_before, peak, heap, held] = fields[..] else {
        panic!("unexpected reference output {text:?}");
    };
    (rss_before, peak, heap as usize, held as usize)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(ALONE) {
        alone(args[1].parse().expect("CAP"));
        return;
    }
    let cap: usize = args
        .first()
        .map_or(100_000, |a| a.parse().expect("CAP: a number of keys"));
    let total: usize = args
        .get(1)
        .map_or(10_000_000, |a| a.parse().expect("FLOOD: a number of keys"));

    let rss_before = status_kb("VmRSS");
    let heap_before = ALLOCATOR.allocated();
    let store = store(cap);
    let start = Instant::now();
    let mut peak_heap = 0;
    let step = (total / 10).max(1);
    println!("flooding a store capped at {cap} keys with {total} unique keys:");
    let admitted = flood(&store, "flood", total, total / 10 * 9, |done| {
        if done % step == 0 || done == total {
            let heap = ALLOCATOR.allocated() - heap_before;
            peak_heap = peak_heap.max(heap);
            let stats = store.stats();
            println!(
                "  {done:>10} keys checked: {:>7} held, {:>9} evicted at rest, {:>9} refused, \
                 VmRSS {}, store heap {}",
                stats.keys,
                stats.evictions,
                stats.refusals,
                mib_kb(status_kb("VmRSS")),
                mib(heap),
            );
        }
    });
    let elapsed = start.elapsed();
    let stats = store.stats();
    let held = stats.keys;
    let (rss_after, peak) = (status_kb("VmRSS"), status_kb("VmHWM"));
    let heap = ALLOCATOR.allocated() - heap_before;
    drop(store);

    let (alone_before, alone_peak, alone_heap, alone_held) = measure_alone(cap);
    let flood_growth = peak.saturating_sub(rss_before);
    let alone_growth = alone_peak.saturating_sub(alone_before);

    println!();
    println!(
        "| | flood: {total} unique keys, cap {cap} | {alone_held} keys alone (cap {}) |",
        2 * cap
    );
    println!("| --- | ---: | ---: |");
    println!("| keys held at the end | {held} | {alone_held} |");
    println!("| new keys admitted | {admitted} | {alone_held} |");
    println!("| entries evicted at rest | {} | 0 |", stats.evictions);
    println!("| new keys refused | {} | 0 |", stats.refusals);
    println!(
        "| RSS before the keys | {} | {} |",
        mib_kb(rss_before),
        mib_kb(alone_before)
    );
    println!(
        "| peak RSS (VmHWM) | {} | {} |",
        mib_kb(peak),
        mib_kb(alone_peak)
    );
    println!(
        "| peak RSS minus RSS before | {} | {} |",
        mib_kb(flood_growth),
        mib_kb(alone_growth)
    );
    println!(
        "| store heap at the end (allocator) | {} | {} |",
        mib(heap),
        mib(alone_heap)
    );
    println!();
    println!(
        "flood: {:.1} s ({:.0} ns per new key); RSS after it {}; largest store heap seen {}",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / total as f64,
        mib_kb(rss_after),
        mib(peak_heap),
    );
    let bounded = held <= cap && heap <= alone_heap + alone_heap / 10;
    println!(
        "verdict: {} ({held} of {cap} keys held after {total} unique keys; store heap {:.2}×, \
         peak RSS growth {:.2}× what {alone_held} keys alone take)",
        if bounded {
            "bounded by the cap"
        } else {
            "NOT bounded by the cap"
        },
        heap as f64 / alone_heap.max(1) as f64,
        flood_growth as f64 / alone_growth.max(1) as f64,
    );
}
