//! What a run reads besides its own counters: Redis's CPU time and command
//! statistics (summed over the masters), this process's CPU time, latency
//! histograms and medians.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;

/// `used_cpu_user + used_cpu_sys` summed over the masters, in seconds.
pub(crate) async fn redis_cpu(admin: &mut [MultiplexedConnection]) -> f64 {
    let mut total = 0.0;
    for conn in admin {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(conn)
            .await
            .unwrap();
        total += info
            .lines()
            .filter_map(|l| {
                l.strip_prefix("used_cpu_sys:")
                    .or_else(|| l.strip_prefix("used_cpu_user:"))
            })
            .map(|v| v.trim().parse::<f64>().unwrap())
            .sum::<f64>();
    }
    total
}

/// Reads of client sockets (`total_reads_processed` of `INFO stats`)
/// summed over the masters: what arrives together is read, parsed and
/// answered in one go, so fewer reads per decision cost Redis less.
pub(crate) async fn redis_reads(admin: &mut [MultiplexedConnection]) -> u64 {
    let mut total = 0;
    for conn in admin {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(conn)
            .await
            .unwrap();
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap());
    }
    total
}

/// This process's CPU time (user + system) so far, in seconds, from
/// `/proc/self/stat` (Linux, like `redis-server` here).
pub(crate) fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) closed by ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a stat line") + 2..]
        .split(' ')
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // USER_HZ is 100 on every Linux platform Redis runs on.
    ticks / 100.0
}

/// Calls and microseconds per command, as `INFO commandstats` counts them
/// (commands a script or a module calls included), summed over the masters and
/// over runs; the harness's own `INFO` and `CONFIG RESETSTAT` left out.
#[derive(Default)]
pub(crate) struct CommandStats(BTreeMap<String, (u64, u64)>);

impl CommandStats {
    /// `CONFIG RESETSTAT` on every master.
    pub(crate) async fn reset(admin: &mut [MultiplexedConnection]) {
        for conn in admin {
            let () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(conn)
                .await
                .unwrap();
        }
    }

    /// Adds the masters' counts since the last reset.
    pub(crate) async fn add(&mut self, admin: &mut [MultiplexedConnection]) {
        for conn in admin {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(conn)
                .await
                .unwrap();
            for line in info.lines() {
                let Some((name, rest)) = line
                    .strip_prefix("cmdstat_")
                    .and_then(|l| l.split_once(':'))
                else {
                    continue;
                };
                if name == "info" || name.starts_with("config") {
                    continue;
                }
                let field = |f: &str| -> u64 {
                    rest.split(',')
                        .find_map(|kv| kv.strip_prefix(f))
                        .map_or(0, |v| v.parse().unwrap())
                };
                let entry = self.0.entry(name.to_owned()).or_default();
                entry.0 += field("calls=");
                entry.1 += field("usec=");
            }
        }
    }

    /// Calls that ran a script or a function, however invoked.
    pub(crate) fn script_calls(&self) -> u64 {
        [
            "eval",
            "evalsha",
            "eval_ro",
            "evalsha_ro",
            "fcall",
            "fcall_ro",
        ]
        .iter()
        .filter_map(|name| self.0.get(*name))
        .map(|(calls, _)| calls)
        .sum()
    }

    /// One line: each command's µs per call, calls and calls per decision, the
    /// busiest first.
    pub(crate) fn summary(&self, decisions: u64) -> String {
        let mut by_time: Vec<_> = self.0.iter().filter(|(_, (calls, _))| *calls > 0).collect();
        by_time.sort_by_key(|(_, (_, usec))| std::cmp::Reverse(*usec));
        by_time
            .iter()
            .map(|(name, (calls, usec))| {
                format!(
                    "{name} {:.2} µs/call, {calls} calls ({:.3}/decision)",
                    *usec as f64 / *calls as f64,
                    *calls as f64 / decisions.max(1) as f64
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A histogram of check latencies in nanoseconds, up to a minute, two
/// significant digits.
pub(crate) fn latencies() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 2).unwrap()
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
