//! `tollgate simulate`: replays a trace through the algorithms, generates one,
//! or previews a config change on recorded requests ([`preview`]).

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use tollgate_core::{Algorithm, Quota, parse_duration};
use tollgate_policy::Counting;
use tollgate_sim::{
    FleetReport, Generator, Mode, Replay, Simulation, Split, Timing, Trace, Workload, draw_chart,
    format_fleet_table, format_table, outage, simulate_fleet,
};

mod access_log;
mod preview;

use access_log::{AccessLog, EntrySpec};

const AFTER_HELP: &str = "\
Replaying a trace:
  A trace has one request per line, `<timestamp_ns> <key> [cost]`, separated by
  whitespace and sorted by time; the cost defaults to 1. Blank lines and lines
  starting with # are skipped. Every key has its own limiter, starting full.

  Each algorithm is compared, request by request, with the exact sliding window
  log (sliding-log) run on its own on the same trace with the same limit and
  period: a false admit is a request the algorithm admitted and the log denied,
  a false deny the reverse. max_in_period is the largest cost admitted for one
  key within any sliding window of one period, (t - period, t]. The shaping
  leaky bucket's delayed admissions count as admitted.

  --format json prints one line per algorithm:
  {\"algorithm\": NAME, \"requests\": N, \"admitted\": N, \"denied\": N, \"false_admits\": N, \"false_denies\": N, \"max_in_period\": N}

Durations:
  An integer and a unit: ns, us, ms, s, m, h or d (250ms, 1s, 1m, 1h).

One quota across instances (--instances 1,2,4,8, one --algorithm):
  The trace's requests are spread over N instances (--split even: any
  instance with equal odds; skewed: three in four to the first, the rest
  evenly over the others; drawn from --split-seed) that enforce one global
  quota of --limit per --period together, each --mode in turn, on a
  simulated clock:
  exact         every instance asks one shared store (the Rate Limit Service
                on Redis): the reference;
  rlqs          each instance is an Envoy enforcing what the Rate Limit Quota
                Service assigns it (the service's own share-out), reporting
                every --report-interval, each assignment arriving
                --assignment-delay after the report;
  hybrid        each instance leases slices of the shared store's budget
                (--hybrid, default settings);
  fallback-1    the shared store is down through the middle third of the
  fallback-1/n  trace and each instance falls back to its local store with
                --fallback-share 1 or 1/N;
  deny-cache    each instance denies what the shared store just denied;
  local         each instance has the whole quota of its own.
  Reported per mode: the cost admitted, against the exact mode's; the most
  admitted for one key in one aligned window of --period, against the limit;
  the windows above the limit; and (rlqs) the requests Envoys admitted before
  their first assignment arrived.

Generating a trace (written to stdout):
  poisson          Poisson arrivals at --rate (exponential gaps), each to one
                   of --keys keys picked uniformly.
  bursty           On/off: on phases (1 s on average) at 4 x --rate, then
                   silence (3 s on average); the long-run rate is --rate.
  boundary-attack  At every other edge of windows of --period (1, 3, 5, ...
                   periods), each key sends --limit requests in the last 1/100
                   of a period before the edge and --limit more in the first
                   1/100 after it: each aligned window holds --limit, so the
                   fixed window admits 2 x --limit within a few milliseconds,
                   while the exact log admits --limit. --rate is not used.
  many-keys        Poisson arrivals at --rate over --keys keys; the key of rank r
                   (k0 is rank 1) gets a share proportional to 1/r (Zipf).
  Defaults: --rate 100, --duration 60s, --keys 1, --seed 1, --limit 100,
  --period 1s; many-keys: --rate 10000 --keys 10000. The same options and seed
  give the same trace.

Previewing a config change (--policy NEW --requests FILE [--baseline OLD]):
  Replays the requests through NEW and OLD (without --baseline, no limits:
  every request admitted), each with its own in-memory store and a clock set
  to each request's time, deciding as `tollgate serve` with the in-memory
  store would. Requests are sorted by time first. Reports per rule (domain
  and rule id) the requests that matched it under either policy and how
  many each admitted (a request counts in every rule it matched); the ones
  it newly denies (admitted by OLD, denied by NEW with this rule among the
  denying ones) and newly admits (denied by OLD with this rule among the
  denying ones, admitted by NEW); and the --top keys (default 10) with the
  most newly denied requests. Concurrency permits are given back at once (a
  request file has no request lengths).

  FILE has one JSON object per line, as `tollgate serve --record` writes:
  {\"ts_ns\": 1795514400123000000, \"domain\": \"api\", \"descriptors\":
   [{\"entries\": [{\"key\": \"user\", \"value\": \"42\"}]}], \"hits_addend\": 1}
  (or \"time\": \"2026-11-24T10:00:00.123Z\" for ts_ns); the rest is the body of
  POST /v1/check. With --access-log-domain it is Envoy's access log in its
  default format instead, each line one request in that domain with one
  descriptor made of the --access-log-entry KEY=SOURCE given, in order.
  SOURCE is client (the last X-Forwarded-For address), path, method, or
  header:NAME for a logged header (x-forwarded-for, user-agent,
  x-request-id, :authority). A line with no value (-) for an entry is
  skipped, as Envoy sends no descriptor then. A bad line is an error naming
  FILE:LINE.

  --format json prints one JSON document:
  {\"policy\", \"baseline\", \"requests\", \"skipped\", \"admitted_baseline\",
   \"admitted_new\", \"newly_denied\", \"newly_admitted\", \"rules\": [{\"domain\",
   \"rule\", \"requests\", \"admitted_baseline\", \"admitted_new\",
   \"newly_denied\", \"newly_admitted\", \"top_keys\": [{\"key\",
   \"newly_denied\", \"newly_admitted\"}]}]}

Examples:
  tollgate simulate --generate bursty --seed 1 > bursty.trace
  tollgate simulate --trace bursty.trace --algorithm all --limit 100 --period 1s
  tollgate simulate --generate boundary-attack | tollgate simulate --trace - \\
      --algorithm all --limit 100 --period 1s --format json --chart attack.svg
  tollgate simulate --trace bursty.trace --algorithm fixed-window --limit 1000 \\
      --period 1m --instances 1,2,4,8 --mode exact,rlqs,local --split even
  tollgate simulate --policy new.yaml --baseline old.yaml --requests recorded.ndjson
  tollgate simulate --policy edge.yaml --requests access.log \\
      --access-log-domain edge --access-log-entry remote_address=client";

/// Algorithms to replay, as chosen on the command line.
#[derive(Debug, Clone)]
pub(crate) struct Selection(Vec<Algorithm>);

impl Selection {
    /// `all`: the seven classic algorithms. The hit counter
    /// (envoyproxy/ratelimit's fixed window) is replayed when named.
    fn all() -> Vec<Algorithm> {
        Algorithm::RATE
            .into_iter()
            .filter(|a| *a != Algorithm::HitCounter)
            .collect()
    }

    fn from_name(name: String) -> Self {
        Selection(if name == "all" {
            Self::all()
        } else {
            Algorithm::RATE
                .into_iter()
                .filter(|a| a.name() == name)
                .collect()
        })
    }
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// An aligned table with percentages.
    Table,
    /// One JSON object per algorithm, one per line; a preview's report as
    /// one JSON document.
    Json,
}

/// Replay a request trace through the rate limiting algorithms and compare them
/// with the exact sliding window log, generate a trace, or preview a config
/// change on recorded requests.
#[derive(Debug, clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub(crate) struct Args {
    /// Trace to replay, one `<timestamp_ns> <key> [cost]` per line; `-` reads stdin.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present_any = ["generate", "policy"],
        conflicts_with_all = ["generate", "policy"]
    )]
    trace: Option<PathBuf>,

    /// Algorithm to replay, or `all` for each but hit-counter in turn.
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present_any = ["generate", "policy"],
        conflicts_with_all = ["generate", "policy"],
        value_parser = PossibleValuesParser::new(
            Algorithm::RATE.iter().map(|a| a.name()).chain(["all"])
        ).map(Selection::from_name),
    )]
    algorithm: Option<Selection>,

    /// Units each key may have admitted per period. With --generate, the limit
    /// a boundary attack aims at [default: 100].
    #[arg(
        long,
        value_name = "N",
        required_unless_present_any = ["generate", "policy"],
        conflicts_with = "policy"
    )]
    limit: Option<u64>,

    /// The period of the limit, e.g. 250ms, 1s, 1m. With --generate, the window
    /// a boundary attack aims at [default: 1s].
    #[arg(
        long,
        value_name = "DURATION",
        required_unless_present_any = ["generate", "policy"],
        conflicts_with = "policy",
        value_parser = parse_duration
    )]
    period: Option<Duration>,

    /// Capacity of the bucket algorithms [default: the limit].
    #[arg(
        long,
        value_name = "N",
        requires = "trace",
        conflicts_with = "generate"
    )]
    burst: Option<u64>,

    /// How to print the results [default: table].
    #[arg(long, value_enum, conflicts_with = "generate")]
    format: Option<Format>,

    /// Also draw the admitted rate over time per algorithm as an SVG chart.
    #[arg(
        long,
        value_name = "FILE.svg",
        requires = "trace",
        conflicts_with_all = ["generate", "instances"]
    )]
    chart: Option<PathBuf>,

    /// Replay the trace over these numbers of instances enforcing one global
    /// quota (comma-separated, e.g. 1,2,4,8), in each --mode, instead of
    /// comparing algorithms; needs one --algorithm.
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        requires = "trace",
        conflicts_with_all = ["generate", "policy"],
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    instances: Vec<u16>,

    /// How requests are spread over the instances: even, skewed (three in
    /// four to one instance), or both [default: even,skewed].
    #[arg(
        long,
        value_name = "SPLIT,...",
        value_delimiter = ',',
        requires = "instances"
    )]
    split: Vec<Split>,

    /// How the instances enforce the quota: exact, rlqs, hybrid,
    /// fallback-1, fallback-1/n, deny-cache, local [default: all].
    #[arg(
        long,
        value_name = "MODE,...",
        value_delimiter = ',',
        requires = "instances"
    )]
    mode: Vec<Mode>,

    /// How often each Envoy reports usage in rlqs mode [default: 5s, as
    /// Envoy 1.40 does].
    #[arg(long, value_name = "DURATION", requires = "instances", value_parser = parse_duration)]
    report_interval: Option<Duration>,

    /// How long after a report its assignment reaches the Envoy in rlqs mode
    /// [default: 100ms].
    #[arg(long, value_name = "DURATION", requires = "instances", value_parser = parse_duration)]
    assignment_delay: Option<Duration>,

    /// Seed of the random split of requests over instances [default: 1].
    #[arg(long, value_name = "S", requires = "instances")]
    split_seed: Option<u64>,

    /// Write a synthetic trace to stdout instead of replaying one.
    #[arg(
        long,
        value_name = "WORKLOAD",
        value_parser = PossibleValuesParser::new(Workload::ALL.map(|w| w.name()))
            .try_map(|name| name.parse::<Workload>()),
    )]
    generate: Option<Workload>,

    /// Mean requests per second over all keys [default: 100; many-keys: 10000].
    #[arg(
        long,
        value_name = "R",
        requires = "generate",
        conflicts_with = "trace"
    )]
    rate: Option<f64>,

    /// How long the generated trace lasts [default: 60s].
    #[arg(
        long,
        value_name = "DURATION",
        requires = "generate",
        conflicts_with = "trace",
        value_parser = parse_duration
    )]
    duration: Option<Duration>,

    /// How many keys the generated requests go to [default: 1; many-keys: 10000].
    #[arg(
        long,
        value_name = "K",
        requires = "generate",
        conflicts_with = "trace"
    )]
    keys: Option<u32>,

    /// Seed of the generator's random numbers [default: 1].
    #[arg(
        long,
        value_name = "S",
        requires = "generate",
        conflicts_with = "trace"
    )]
    seed: Option<u64>,

    /// Preview this config (a file or directory, loaded as `serve --config`
    /// loads it) on the requests of --requests.
    #[arg(
        long,
        value_name = "PATH",
        requires = "requests",
        conflicts_with = "generate"
    )]
    policy: Option<PathBuf>,

    /// The config --policy is compared with [default: none, every request
    /// admitted].
    #[arg(long, value_name = "PATH", requires = "policy")]
    baseline: Option<PathBuf>,

    /// The requests to replay through --policy and --baseline: JSON lines as
    /// `serve --record` writes them, or an Envoy access log with
    /// --access-log-domain.
    #[arg(long, value_name = "FILE", requires = "policy")]
    requests: Option<PathBuf>,

    /// Read --requests as Envoy's access log (default format), each line a
    /// request in this domain.
    #[arg(
        long,
        value_name = "DOMAIN",
        requires_all = ["requests", "access_log_entry"]
    )]
    access_log_domain: Option<String>,

    /// An entry of the access log requests' descriptor: its key and where
    /// its value is (client, path, method, header:NAME); repeat for more
    /// entries, in order.
    #[arg(long, value_name = "KEY=SOURCE", requires = "access_log_domain")]
    access_log_entry: Vec<EntrySpec>,

    /// How many keys of each rule to report [default: 10].
    #[arg(long, value_name = "N", requires = "policy")]
    top: Option<usize>,

    /// How envoyproxy-format domains are counted, as `serve
    /// --envoy-counting` [default: each-hit].
    #[arg(long, value_name = "COUNTING", requires = "policy")]
    envoy_counting: Option<Counting>,
}

/// `n` and `noun`, in the plural unless `n` is 1.
fn counted(n: usize, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// Runs `tollgate simulate`.
pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    match (args.generate, &args.policy) {
        (Some(workload), _) => generate(workload, &args),
        (None, Some(policy)) => preview(policy, &args),
        (None, None) => replay(&args),
    }
}

fn preview(policy: &std::path::Path, args: &Args) -> anyhow::Result<()> {
    let requests = args
        .requests
        .as_deref()
        .ok_or_else(|| anyhow!("--requests is required with --policy"))?;
    let report = preview::run(&preview::Preview {
        policy,
        baseline: args.baseline.as_deref(),
        requests,
        access_log: args.access_log_domain.as_ref().map(|domain| AccessLog {
            domain: domain.clone(),
            entries: args.access_log_entry.clone(),
        }),
        envoy_counting: args.envoy_counting.unwrap_or_default(),
        top: args.top.unwrap_or(10),
    })?;
    let mut out = BufWriter::new(io::stdout().lock());
    match args.format.unwrap_or(Format::Table) {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?,
        Format::Table => write!(out, "{}", report.table())?,
    }
    out.flush()?;
    Ok(())
}

fn generate(workload: Workload, args: &Args) -> anyhow::Result<()> {
    let mut generator = Generator::new(workload);
    if let Some(rate) = args.rate {
        generator.rate = rate;
    }
    if let Some(duration) = args.duration {
        generator.duration = duration;
    }
    if let Some(keys) = args.keys {
        generator.keys = keys;
    }
    if let Some(seed) = args.seed {
        generator.seed = seed;
    }
    if args.limit.is_some() || args.period.is_some() {
        generator.quota = Quota::new(
            args.limit.unwrap_or(generator.quota.limit()),
            args.period.unwrap_or(generator.quota.period()),
        )
        .context("invalid --limit or --period")?;
    }
    let trace = generator.generate()?;
    let mut out = BufWriter::new(io::stdout().lock());
    writeln!(out, "# tollgate simulate {generator}")?;
    writeln!(
        out,
        "# {}, {}; <timestamp_ns> <key> [cost]",
        counted(trace.len(), "request"),
        counted(trace.key_count(), "key")
    )?;
    trace.write(&mut out)?;
    Ok(())
}

fn replay(args: &Args) -> anyhow::Result<()> {
    let missing = |option| anyhow!("{option} is required with --trace");
    let path = args.trace.as_ref().ok_or_else(|| missing("--trace"))?;
    let Selection(algorithms) = args
        .algorithm
        .clone()
        .ok_or_else(|| missing("--algorithm"))?;
    let limit = args.limit.ok_or_else(|| missing("--limit"))?;
    let period = args.period.ok_or_else(|| missing("--period"))?;
    let burst = args.burst.unwrap_or(limit);
    let quota = Quota::new(limit, period)
        .and_then(|q| q.with_burst(burst))
        .context("invalid --limit, --period or --burst")?;

    let trace = if path.as_os_str() == "-" {
        Trace::parse(io::stdin().lock()).context("trace on stdin")?
    } else {
        let file =
            File::open(path).with_context(|| format!("cannot open trace {}", path.display()))?;
        Trace::parse(BufReader::with_capacity(1 << 16, file))
            .with_context(|| format!("trace {}", path.display()))?
    };

    if !args.instances.is_empty() {
        let [algorithm] = algorithms[..] else {
            return Err(anyhow!(
                "--instances replays one --algorithm, not {}",
                algorithms.len()
            ));
        };
        return fleet(args, &trace, quota, algorithm);
    }

    let simulation = Simulation::new(&trace, quota);
    let replays: Vec<Replay> = algorithms.iter().map(|&a| simulation.run(a)).collect();
    let mut out = BufWriter::new(io::stdout().lock());
    match args.format.unwrap_or(Format::Table) {
        Format::Json => {
            for replay in &replays {
                writeln!(out, "{}", replay.report.to_json_line())?;
            }
        }
        Format::Table => {
            writeln!(
                out,
                "{}, {}; limit {limit} per {period:?}, burst {burst}; false admits and denies against sliding-log",
                counted(trace.len(), "request"),
                counted(trace.key_count(), "key"),
            )?;
            let reports: Vec<_> = replays.iter().map(|r| r.report.clone()).collect();
            write!(out, "{}", format_table(&reports))?;
        }
    }
    out.flush()?;

    if let Some(chart) = &args.chart {
        let title = format!(
            "Admitted rate per algorithm: limit {limit} per {period:?}, burst {burst}, {} requests",
            trace.len()
        );
        let svg = draw_chart(&title, &simulation.offered(), &replays)?;
        std::fs::write(chart, svg)
            .with_context(|| format!("cannot write chart {}", chart.display()))?;
    }
    Ok(())
}

/// `--instances`: every mode, split and number of instances in turn.
fn fleet(args: &Args, trace: &Trace, quota: Quota, algorithm: Algorithm) -> anyhow::Result<()> {
    let splits = if args.split.is_empty() {
        Split::ALL.to_vec()
    } else {
        args.split.clone()
    };
    let modes = if args.mode.is_empty() {
        Mode::ALL.to_vec()
    } else {
        args.mode.clone()
    };
    let defaults = Timing::default();
    let mut timing = Timing::default();
    timing.report_interval = args.report_interval.unwrap_or(defaults.report_interval);
    timing.assignment_delay = args.assignment_delay.unwrap_or(defaults.assignment_delay);
    timing.seed = args.split_seed.unwrap_or(defaults.seed);
    let mut reports: Vec<FleetReport> = Vec::new();
    for &split in &splits {
        for &mode in &modes {
            for &n in &args.instances {
                reports.push(
                    simulate_fleet(trace, quota, algorithm, mode, split, n.into(), &timing)
                        .with_context(|| format!("{mode} over {n} instances, {split}"))?,
                );
            }
        }
    }
    let mut out = BufWriter::new(io::stdout().lock());
    match args.format.unwrap_or(Format::Table) {
        Format::Json => {
            for report in &reports {
                writeln!(out, "{}", serde_json::to_string(report)?)?;
            }
        }
        Format::Table => {
            let down = outage(trace);
            let start = trace.requests().first().map_or(0, |r| r.time);
            writeln!(
                out,
                "{}, {}; {} limit {} per {:?}, burst {}; admitted per key and aligned window against the limit",
                counted(trace.len(), "request"),
                counted(trace.key_count(), "key"),
                algorithm.name(),
                quota.limit(),
                quota.period(),
                quota.burst(),
            )?;
            writeln!(
                out,
                "rlqs: reports every {:?}, assignments {:?} later; fallback: store down from {:?} to {:?}; split seed {}",
                timing.report_interval,
                timing.assignment_delay,
                Duration::from_nanos(down.start - start),
                Duration::from_nanos(down.end - start),
                timing.seed,
            )?;
            write!(out, "{}", format_fleet_table(&reports, quota.limit()))?;
        }
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(line: &str) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("simulate").chain(line.split_whitespace()))
            .map(|cli| cli.args)
    }

    #[test]
    fn all_means_the_seven_rate_algorithms_in_order() {
        let a = args("--trace x --algorithm all --limit 1 --period 1s").unwrap();
        assert_eq!(a.algorithm.unwrap().0, Selection::all());
        let a = args("--trace x --algorithm leaky-bucket-shaping --limit 1 --period 1s").unwrap();
        assert_eq!(
            a.algorithm.unwrap().0,
            vec![Algorithm::LeakyBucketShaping { delay_after: 0 }]
        );
        assert!(args("--trace x --algorithm concurrency --limit 1 --period 1s").is_err());
    }

    #[test]
    fn replay_and_generate_options_do_not_mix() {
        assert!(args("--generate poisson").is_ok());
        assert!(args("--generate boundary-attack --limit 5 --period 250ms").is_ok());
        assert!(args("--trace x --generate poisson").is_err());
        assert!(args("--generate poisson --algorithm gcra").is_err());
        assert!(args("--generate poisson --format json").is_err());
        assert!(args("--trace x --algorithm gcra --limit 1 --period 1s --seed 3").is_err());
        assert!(args("--trace x --algorithm gcra --limit 1").is_err());
        assert!(args("--trace x --algorithm gcra --limit 1 --period 1").is_err());
        assert!(args("--generate poison").is_err());
    }

    #[test]
    fn instances_take_their_own_options_and_a_trace() {
        let a = args(
            "--trace x --algorithm fixed-window --limit 1 --period 1m --instances 1,2,4,8 \
             --split skewed --mode rlqs,fallback-1/n --report-interval 1s",
        )
        .unwrap();
        assert_eq!(a.instances, [1, 2, 4, 8]);
        assert_eq!(a.split, [Split::Skewed]);
        assert_eq!(a.mode, [Mode::Rlqs, Mode::FallbackShare]);
        assert!(args("--trace x --algorithm gcra --limit 1 --period 1s --instances 0").is_err());
        assert!(args("--trace x --algorithm gcra --limit 1 --period 1s --mode rlqs").is_err());
        assert!(
            args("--trace x --algorithm gcra --limit 1 --period 1s --instances 2 --mode up")
                .is_err()
        );
        assert!(
            args("--trace x --algorithm gcra --limit 1 --period 1s --instances 2 --chart c.svg")
                .is_err()
        );
        assert!(args("--generate poisson --instances 2").is_err());
    }

    #[test]
    fn preview_options_do_not_mix_with_the_others() {
        assert!(args("--policy n.yaml --requests r").is_ok());
        assert!(
            args("--policy n.yaml --baseline o.yaml --requests r --top 3 --format json").is_ok()
        );
        assert!(
            args(
                "--policy n.yaml --requests r --access-log-domain edge --access-log-entry ip=client"
            )
            .is_ok()
        );
        assert!(args("--policy n.yaml").is_err());
        assert!(args("--requests r").is_err());
        assert!(
            args("--baseline o.yaml --trace x --algorithm gcra --limit 1 --period 1s").is_err()
        );
        assert!(args("--policy n.yaml --requests r --trace x").is_err());
        assert!(args("--policy n.yaml --requests r --generate poisson").is_err());
        assert!(args("--policy n.yaml --requests r --limit 5").is_err());
        assert!(args("--policy n.yaml --requests r --access-log-domain edge").is_err());
        assert!(args("--policy n.yaml --requests r --access-log-entry ip=client").is_err());
        assert!(
            args("--policy n.yaml --requests r --access-log-domain e --access-log-entry ip")
                .is_err()
        );
        assert!(args("--trace x --algorithm gcra --limit 1 --period 1s --top 3").is_err());
    }
}
