//! A closed-loop load generator for `scripts/bench-http`, which drives Tollgate
//! and `throttlecrab-server` with the same requests, concurrency and duration.
//!
//! ```text
//! loadgen http --server tollgate|throttlecrab --addr 127.0.0.1:8080 --keys 100000
//! loadgen grpc --server tollgate|throttlecrab --addr 127.0.0.1:8081 --keys 1
//! loadgen from-oha --server tollgate --keys 1 < oha.json
//! loadgen report results.jsonl
//! ```
//!
//! `http` and `grpc` keep `--concurrency` requests in flight (each worker
//! sends its next request when the previous one is answered), for `--warmup`
//! and then `--duration`, and print one JSON line: requests per second over the
//! measured part, p50/p99/max latency, and how many were allowed and denied.
//! HTTP workers hold one keep-alive HTTP/1.1 connection each (like `oha` and
//! `wrk`); gRPC workers share `--connections` HTTP/2 connections. Workers
//! and connections are split over `--threads` threads (one per CPU by
//! default), each running its own event loop, as wrk's and h2load's threads
//! do (see [`Share`]). With `--keys N`, each request names one of N keys
//! drawn uniformly at random; the request bodies are made before the run, so
//! the generator formats nothing while it measures (gRPC requests are
//! encoded up front too). Of each answer the generator reads only the
//! verdict, as little of either server's answer as it can: the JSON answer's
//! leading `"allowed"`, the gRPC answer's field 1 (see [`Verdict`]). It
//! shares the CPUs with the server it measures, so what it spends per answer
//! is charged to that server.
//!
//! The quota is the same for both servers: `--limit` requests per
//! `--period-secs` seconds with bursts of `--burst`, GCRA. Tollgate's HTTP
//! requests are ad-hoc `POST /v1/check` checks; its gRPC requests are Envoy
//! `ShouldRateLimit` calls in domain `bench` with one descriptor `key=<key>`,
//! which the script's config limits with that quota. throttlecrab's are
//! `POST /throttle` and `throttlecrab.RateLimiter/Throttle`.
//!
//! `report` reads those lines (several runs of each case) and prints a
//! markdown table of medians with the ratios Tollgate/throttlecrab.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::BufMut;
use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderValue};
use hyper::http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

#[derive(Debug, Parser)]
#[command(name = "loadgen", about = "Load generator for scripts/bench-http")]
struct Cli {
    /// What to do; none (as under a bare `cargo bench`) does nothing.
    #[command(subcommand)]
    command: Option<Command>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, global = true, hide = true)]
    bench: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// HTTP/1.1 JSON checks.
    Http(Load),
    /// gRPC checks.
    Grpc(Load),
    /// Turns `oha --output-format json` (read on stdin) into a result line.
    FromOha {
        /// Which server oha drove.
        #[arg(long)]
        server: Server,
        /// How many keys its requests named.
        #[arg(long, default_value_t = 1)]
        keys: u64,
        /// Its concurrency.
        #[arg(long, default_value_t = 50)]
        concurrency: u64,
    },
    /// Writes the gRPC request for key `bench-key-0` as it goes on the wire
    /// (the 5-byte gRPC message prefix, then the protobuf) to stdout, for
    /// `h2load --data`.
    GrpcBody {
        /// Which server's request.
        #[arg(long)]
        server: Server,
        #[command(flatten)]
        quota: Quota,
    },
    /// Turns h2load's output (read on stdin) and its `--log-file` into a
    /// result line.
    FromH2load {
        /// Which server h2load drove.
        #[arg(long)]
        server: Server,
        /// Its streams in flight (clients × streams per client).
        #[arg(long)]
        concurrency: u64,
        /// Its `--log-file`: one request a line, the third column the
        /// microseconds it took.
        #[arg(long)]
        log: PathBuf,
    },
    /// Prints `count` free loopback ports, one a line.
    FreePorts {
        /// How many.
        count: usize,
    },
    /// Waits until every address accepts TCP connections.
    Wait {
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
        /// The addresses.
        addrs: Vec<SocketAddr>,
    },
    /// Prints the markdown table of medians and ratios of result lines.
    Report {
        /// Files of result lines (JSON, one a line).
        files: Vec<PathBuf>,
    },
}

/// The server under load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Server {
    Tollgate,
    Throttlecrab,
}

#[derive(Debug, Clone, clap::Args)]
struct Load {
    /// Which server's API to call.
    #[arg(long)]
    server: Server,
    /// Where it listens.
    #[arg(long)]
    addr: SocketAddr,
    /// Requests in flight.
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// HTTP/2 connections the gRPC workers share.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// How many distinct keys the requests name.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    #[command(flatten)]
    quota: Quota,
    /// Tollgate's algorithm for the HTTP checks (`scripts/bench-fallback`
    /// measures each); the burst is sent only to the bucket algorithms.
    #[arg(long, default_value = "gcra")]
    algorithm: String,
    /// The generator's threads, each its own event loop with its share of
    /// the workers and connections (default: one per CPU).
    #[arg(long)]
    threads: Option<usize>,
    /// Another HTTP path than the server's check endpoint (for experiments:
    /// answers other than 200 and 429 count as errors).
    #[arg(long)]
    path: Option<String>,
}

/// The quota both servers are given.
#[derive(Debug, Clone, Copy, clap::Args)]
struct Quota {
    /// Requests allowed per period.
    #[arg(long, default_value_t = 1000)]
    limit: u64,
    /// The period, in whole seconds.
    #[arg(long, default_value_t = 1)]
    period_secs: u64,
    /// The burst (capacity).
    #[arg(long, default_value_t = 1000)]
    burst: u64,
}

/// One measured case.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    api: String,
    generator: String,
    server: Server,
    keys: u64,
    concurrency: u64,
    seconds: f64,
    requests: u64,
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    allowed: u64,
    denied: u64,
    errors: u64,
    /// The server's CPU time (user and system) per answer, in µs, as
    /// `scripts/bench-http` adds it: read from `/proc/<pid>/stat` around the
    /// generator's whole run, warm-up included, over the answers that run
    /// would have made at its measured rate. Unlike requests/s, it does not
    /// depend on how the CPUs were shared with the generator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    server_cpu_us: Option<f64>,
}

/// What one worker counted.
struct Tally {
    latency: Histogram<u64>,
    allowed: u64,
    denied: u64,
    errors: u64,
}

impl Tally {
    fn new() -> Self {
        Self {
            // Nanoseconds, 3 significant digits, up to a minute.
            latency: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
            allowed: 0,
            denied: 0,
            errors: 0,
        }
    }

    fn record(&mut self, elapsed: Duration, allowed: bool) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.latency.saturating_record(nanos.max(1));
        if allowed {
            self.allowed += 1;
        } else {
            self.denied += 1;
        }
    }

    fn merge(&mut self, other: Tally) {
        self.latency
            .add(other.latency)
            .expect("histograms with the same bounds");
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.errors += other.errors;
    }
}

/// When measuring starts and ends.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

/// A small xorshift generator: which key each request names.
struct Keys {
    state: u64,
    count: u64,
}

impl Keys {
    fn new(seed: u64, count: u64) -> Self {
        Self {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            count: count.max(1),
        }
    }

    fn next(&mut self) -> usize {
        if self.count == 1 {
            return 0;
        }
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        usize::try_from(x % self.count).unwrap_or(0)
    }
}

fn key_name(index: u64) -> String {
    format!("bench-key-{index}")
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let Some(command) = cli.command else {
        // `cargo bench` runs every bench target; this one needs servers.
        eprintln!("loadgen: nothing to do; scripts/bench-http runs it (see --help)");
        return Ok(());
    };
    match command {
        Command::Http(load) => run_load("http", load),
        Command::Grpc(load) => run_load("grpc", load),
        Command::FromOha {
            server,
            keys,
            concurrency,
        } => from_oha(server, keys, concurrency),
        Command::GrpcBody { server, quota } => grpc_body(server, quota),
        Command::FromH2load {
            server,
            concurrency,
            log,
        } => from_h2load(server, concurrency, &log),
        Command::FreePorts { count } => free_ports(count),
        Command::Wait { timeout, addrs } => wait(&addrs, Duration::from_secs_f64(timeout)),
        Command::Report { files } => report(&files),
    }
}

fn free_ports(count: usize) -> anyhow::Result<()> {
    // Held together, so that they are distinct.
    let listeners = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    for listener in listeners {
        println!("{}", listener.local_addr()?.port());
    }
    Ok(())
}

fn wait(addrs: &[SocketAddr], timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    for addr in addrs {
        while std::net::TcpStream::connect_timeout(addr, Duration::from_secs(1)).is_err() {
            if Instant::now() >= deadline {
                bail!("nothing listens on {addr} after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

fn run_load(api: &str, load: Load) -> anyhow::Result<()> {
    if load.concurrency == 0 || load.connections == 0 {
        bail!("--concurrency and --connections must be at least 1");
    }
    let grpc = api == "grpc";
    let threads = load
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .min(load.concurrency)
        .min(if grpc { load.connections } else { usize::MAX })
        .max(1);
    let start = Start {
        ready: Barrier::new(threads),
        window: OnceLock::new(),
    };
    let shares = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..threads)
            .map(|index| {
                let share = Share {
                    index,
                    of: threads,
                    start: &start,
                };
                let load = &load;
                scope.spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    runtime.block_on(async {
                        if grpc {
                            grpc_load(load, share).await
                        } else {
                            http_load(load, share).await
                        }
                    })
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a generator thread panicked"))
            .collect::<Vec<_>>()
    });
    let mut tally = Tally::new();
    let mut seconds = 0f64;
    for share in shares {
        let (share, share_seconds) = share?;
        tally.merge(share);
        seconds = seconds.max(share_seconds);
    }
    let requests = tally.allowed + tally.denied;
    let us = |q: f64| tally.latency.value_at_quantile(q) as f64 / 1_000.0;
    let record = Record {
        api: api.to_owned(),
        generator: "loadgen".to_owned(),
        server: load.server,
        keys: load.keys,
        concurrency: load.concurrency as u64,
        seconds,
        requests,
        rps: requests as f64 / seconds,
        p50_us: us(0.5),
        p99_us: us(0.99),
        max_us: tally.latency.max() as f64 / 1_000.0,
        allowed: tally.allowed,
        denied: tally.denied,
        errors: tally.errors,
        server_cpu_us: None,
    };
    println!("{}", serde_json::to_string(&record)?);
    if requests == 0 {
        bail!("no request was answered ({} errors)", tally.errors);
    }
    Ok(())
}

/// One generator thread's part of a load: the workers (and gRPC
/// connections) whose index is `index` modulo `of`.
///
/// Each thread runs a current-thread runtime, as wrk's and h2load's threads
/// each run their own event loop. On one work-stealing runtime, a gRPC
/// worker's request woke its HTTP/2 connection's task into the waker's LIFO
/// slot, which ran it at once: each request went out in a write of its own
/// (1.09 `writev` a request), and the generator, not the server, set the
/// rate. Here the connection's task runs after the workers its answers
/// woke, and sends their requests together (0.17–0.20 `writev` a request).
#[derive(Clone, Copy)]
struct Share<'a> {
    index: usize,
    of: usize,
    start: &'a Start,
}

impl Share<'_> {
    /// The indices of this thread's items among `count` (workers,
    /// connections).
    fn of(&self, count: usize) -> impl Iterator<Item = usize> + use<> {
        (self.index..count).step_by(self.of)
    }

    /// What `connecting` made, and the measuring window: the same for every
    /// thread, set once every thread is done connecting. A thread that could
    /// not connect still meets the others first, so that none waits forever.
    async fn connected<T>(
        &self,
        load: &Load,
        connecting: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<(T, Window)> {
        let made = connecting.await;
        let window = self.window(load);
        Ok((made?, window))
    }

    fn window(&self, load: &Load) -> Window {
        if self.start.ready.wait().is_leader() {
            let start = Instant::now() + Duration::from_secs_f64(load.warmup);
            let _ = self.start.window.set(Window {
                start,
                end: start + Duration::from_secs_f64(load.duration),
            });
        }
        self.start.ready.wait();
        *self.start.window.get().expect("the leader set the window")
    }
}

/// Where the generator threads meet before the clock starts.
struct Start {
    ready: Barrier,
    window: OnceLock<Window>,
}

/// Runs `workers`, merges their tallies, and returns them with the measured
/// seconds.
async fn gather(
    workers: Vec<tokio::task::JoinHandle<anyhow::Result<Tally>>>,
    window: Window,
) -> anyhow::Result<(Tally, f64)> {
    let mut total = Tally::new();
    for worker in workers {
        total.merge(worker.await.context("a worker panicked")??);
    }
    // The last requests may finish a little after the end.
    let seconds = window.end.max(Instant::now()) - window.start;
    Ok((total, seconds.as_secs_f64()))
}

// ---------------------------------------------------------------- HTTP

fn http_bodies(load: &Load) -> Vec<Bytes> {
    (0..load.keys.max(1))
        .map(|i| {
            let key = key_name(i);
            let json = match load.server {
                Server::Tollgate => {
                    let burst = match load.algorithm.as_str() {
                        "gcra" | "token-bucket" | "leaky-bucket" => {
                            format!(r#","burst":{}"#, load.quota.burst)
                        }
                        _ => String::new(),
                    };
                    format!(
                        r#"{{"key":"{key}","limit":{},"period":"{}s"{burst},"algorithm":"{}","cost":1}}"#,
                        load.quota.limit, load.quota.period_secs, load.algorithm
                    )
                }
                Server::Throttlecrab => format!(
                    r#"{{"key":"{key}","max_burst":{},"count_per_period":{},"period":{},"quantity":1}}"#,
                    load.quota.burst, load.quota.limit, load.quota.period_secs
                ),
            };
            Bytes::from(json)
        })
        .collect()
}

async fn http_load(load: &Load, share: Share<'_>) -> anyhow::Result<(Tally, f64)> {
    let bodies = Arc::new(http_bodies(load));
    let path: &'static str = match (&load.path, load.server) {
        (Some(path), _) => path.clone().leak(),
        (None, Server::Tollgate) => "/v1/check",
        (None, Server::Throttlecrab) => "/throttle",
    };
    // Connect every worker before the clock starts.
    let (senders, window) = share
        .connected(load, async {
            let mut senders = Vec::new();
            for i in share.of(load.concurrency) {
                senders.push((i, http_connect(load.addr).await?));
            }
            anyhow::Ok(senders)
        })
        .await?;
    let workers = senders
        .into_iter()
        .map(|(i, sender)| {
            let bodies = Arc::clone(&bodies);
            let keys = Keys::new(i as u64 + 1, load.keys);
            tokio::spawn(http_worker(load.addr, sender, bodies, path, keys, window))
        })
        .collect();
    gather(workers, window).await
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn http_connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

async fn http_worker(
    addr: SocketAddr,
    mut sender: Sender,
    bodies: Arc<Vec<Bytes>>,
    path: &'static str,
    mut keys: Keys,
    window: Window,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    let host = HeaderValue::from_str(&addr.to_string())?;
    let json = HeaderValue::from_static("application/json");
    loop {
        if Instant::now() >= window.end {
            return Ok(tally);
        }
        let body = bodies[keys.next()].clone();
        let request = Request::post(path)
            .header(HOST, host.clone())
            .header(CONTENT_TYPE, json.clone())
            .header(CONTENT_LENGTH, body.len())
            .body(Full::new(body))?;
        let sent = Instant::now();
        let answer = async {
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        }
        .await;
        let elapsed = sent.elapsed();
        match answer {
            Ok((status, body)) if status.as_u16() == 200 || status.as_u16() == 429 => {
                if sent >= window.start {
                    tally.record(elapsed, says_allowed(&body));
                }
            }
            Ok(_) | Err(_) => {
                tally.errors += 1;
                if sender.is_closed() {
                    sender = http_connect(addr).await?;
                }
            }
        }
    }
}

/// Whether a JSON answer says `"allowed":true`. Both servers' answers start
/// with that field, so this reads as few bytes of each (a search through the
/// whole body would cost more for the longer answer).
fn says_allowed(body: &[u8]) -> bool {
    const ALLOWED: &[u8] = br#"{"allowed":true"#;
    const FIELD: &[u8] = br#"{"allowed":"#;
    if body.starts_with(FIELD) {
        return body.starts_with(ALLOWED);
    }
    let needle = &ALLOWED[1..];
    body.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------- gRPC

/// throttlecrab's `throttlecrab.RateLimiter/Throttle` request
/// (`proto/throttlecrab.proto` of throttlecrab-server).
#[derive(Clone, PartialEq, prost::Message)]
struct ThrottleRequest {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(int32, tag = "2")]
    max_burst: i32,
    #[prost(int32, tag = "3")]
    count_per_period: i32,
    #[prost(int32, tag = "4")]
    period: i32,
    #[prost(int32, tag = "5")]
    quantity: i32,
}

/// What the generator reads of either server's answer: field 1, Envoy's
/// `overall_code` (1 is `OK`) and throttlecrab's `allowed` (1 is true),
/// each a varint; prost skips the other fields. Decoding the whole answer
/// into owned messages cost the generator, which shares the CPUs with the
/// server it measures, more for Envoy's larger answer (a status per
/// descriptor, its limit's name) than for throttlecrab's five integers, and
/// that was charged to the server; h2load reads neither.
#[derive(Clone, PartialEq, prost::Message)]
struct Verdict {
    #[prost(int32, tag = "1")]
    code: i32,
}

/// A unary call's codec for the generator: each request sent as the bytes
/// it was encoded to up front (a reference count, not a message cloned and
/// encoded per call), each answer read as its [`Verdict`].
struct Slim;

impl tonic::codec::Codec for Slim {
    type Encode = Bytes;
    type Decode = Verdict;
    type Encoder = Encoded;
    type Decoder = tonic_prost::ProstDecoder<Verdict>;

    fn encoder(&mut self) -> Encoded {
        Encoded
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(tonic::codec::BufferSettings::default())
    }
}

/// Writes a request's bytes, encoded up front.
struct Encoded;

impl tonic::codec::Encoder for Encoded {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

/// The domain of Tollgate's gRPC requests (see `scripts/bench-http`'s config).
const DOMAIN: &str = "bench";
/// The descriptor key whose values are the bench keys.
const DESCRIPTOR_KEY: &str = "key";

/// One request per key, encoded.
fn grpc_requests(server: Server, keys: u64, quota: Quota) -> anyhow::Result<Vec<Bytes>> {
    let keys = 0..keys.max(1);
    Ok(match server {
        Server::Tollgate => keys
            .map(|i| RateLimitRequest {
                domain: DOMAIN.to_owned(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: DESCRIPTOR_KEY.to_owned(),
                        value: key_name(i),
                    }],
                    ..RateLimitDescriptor::default()
                }],
                hits_addend: 1,
            })
            .map(|m| m.encode_to_vec().into())
            .collect(),
        Server::Throttlecrab => {
            let int =
                |n: u64| i32::try_from(n).context("the quota does not fit throttlecrab's int32");
            let (max_burst, count_per_period, period) = (
                int(quota.burst)?,
                int(quota.limit)?,
                int(quota.period_secs)?,
            );
            keys.map(|i| ThrottleRequest {
                key: key_name(i),
                max_burst,
                count_per_period,
                period,
                quantity: 1,
            })
            .map(|m| m.encode_to_vec().into())
            .collect()
        }
    })
}

fn grpc_body(server: Server, quota: Quota) -> anyhow::Result<()> {
    let message = grpc_requests(server, 1, quota)?.swap_remove(0);
    let length = u32::try_from(message.len()).context("a request of 4 GiB")?;
    let mut framed = vec![0];
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(&message);
    std::io::stdout().lock().write_all(&framed)?;
    Ok(())
}

async fn grpc_load(load: &Load, share: Share<'_>) -> anyhow::Result<(Tally, f64)> {
    let requests: Arc<[Bytes]> = grpc_requests(load.server, load.keys, load.quota)?.into();
    let (path, allowed): (_, fn(i32) -> bool) = match load.server {
        Server::Tollgate => (
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            |code| code == Code::Ok as i32,
        ),
        Server::Throttlecrab => ("/throttlecrab.RateLimiter/Throttle", |code| code != 0),
    };
    let call = Call {
        path: PathAndQuery::from_static(path),
        allowed,
    };
    // Connect before the clock starts.
    let (channels, window) = share
        .connected(load, async {
            let mut channels = Vec::new();
            for _ in share.of(load.connections) {
                let channel = Endpoint::from_shared(format!("http://{}", load.addr))?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .with_context(|| format!("cannot connect to {}", load.addr))?;
                channels.push(channel);
            }
            anyhow::Ok(channels)
        })
        .await?;
    let workers = share
        .of(load.concurrency)
        .enumerate()
        .map(|(n, i)| {
            let channel = channels[n % channels.len()].clone();
            let requests = Arc::clone(&requests);
            let keys = Keys::new(i as u64 + 1, load.keys);
            tokio::spawn(grpc_worker(channel, requests, call.clone(), keys, window))
        })
        .collect();
    gather(workers, window).await
}

/// The method a load calls, and how its answer's [`Verdict`] reads.
#[derive(Clone)]
struct Call {
    path: PathAndQuery,
    allowed: fn(i32) -> bool,
}

async fn grpc_worker(
    channel: Channel,
    requests: Arc<[Bytes]>,
    call: Call,
    mut keys: Keys,
    window: Window,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    let mut client = tonic::client::Grpc::new(channel);
    loop {
        if Instant::now() >= window.end {
            return Ok(tally);
        }
        let request = tonic::Request::new(requests[keys.next()].clone());
        let sent = Instant::now();
        let answer = async {
            client
                .ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            client.unary(request, call.path.clone(), Slim).await
        }
        .await
        .map(|r| (call.allowed)(r.into_inner().code));
        let elapsed = sent.elapsed();
        match answer {
            Ok(allowed) if sent >= window.start => tally.record(elapsed, allowed),
            Ok(_) => {}
            Err(_) => tally.errors += 1,
        }
    }
}

// ---------------------------------------------------------------- oha and report

/// The part of `oha --output-format json` that is used.
#[derive(Deserialize)]
struct Oha {
    summary: OhaSummary,
    #[serde(rename = "latencyPercentiles")]
    latency_percentiles: BTreeMap<String, Option<f64>>,
    #[serde(rename = "statusCodeDistribution", default)]
    status_codes: BTreeMap<String, u64>,
    #[serde(rename = "errorDistribution", default)]
    errors: BTreeMap<String, u64>,
}

#[derive(Deserialize)]
struct OhaSummary {
    total: f64,
    #[serde(rename = "requestsPerSec")]
    requests_per_sec: f64,
    slowest: Option<f64>,
}

fn from_oha(server: Server, keys: u64, concurrency: u64) -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let oha: Oha = serde_json::from_str(&input).context("not oha's JSON output")?;
    let percentile = |name: &str| {
        oha.latency_percentiles
            .get(name)
            .copied()
            .flatten()
            .unwrap_or(f64::NAN)
            * 1e6
    };
    let answered = |code: &str| oha.status_codes.get(code).copied().unwrap_or(0);
    let record = Record {
        api: "http".to_owned(),
        generator: "oha".to_owned(),
        server,
        keys,
        concurrency,
        seconds: oha.summary.total,
        requests: answered("200") + answered("429"),
        rps: oha.summary.requests_per_sec,
        p50_us: percentile("p50"),
        p99_us: percentile("p99"),
        max_us: oha.summary.slowest.unwrap_or(f64::NAN) * 1e6,
        // oha does not read bodies; Tollgate's 429 is a deny, throttlecrab
        // answers 200 either way.
        allowed: answered("200"),
        denied: answered("429"),
        // oha counts the requests it cut off at the deadline as errors.
        errors: oha
            .errors
            .iter()
            .filter(|(what, _)| !what.contains("deadline"))
            .map(|(_, n)| n)
            .sum(),
        server_cpu_us: None,
    };
    println!("{}", serde_json::to_string(&record)?);
    Ok(())
}

fn from_h2load(server: Server, concurrency: u64, log: &std::path::Path) -> anyhow::Result<()> {
    let mut output = String::new();
    std::io::stdin().read_to_string(&mut output)?;
    // `finished in 6.00s, 51234.40 req/s, 4.56MB/s`: the time includes the
    // warm-up, the rate and the counts do not.
    let rps = output
        .lines()
        .find_map(|l| l.strip_prefix("finished in "))
        .context("not h2load's output: no `finished in` line")?
        .split(", ")
        .nth(1)
        .and_then(|s| s.strip_suffix(" req/s"))
        .and_then(|s| s.parse::<f64>().ok())
        .context("h2load's req/s")?;
    // `requests: 10 total, 10 started, 10 done, 10 succeeded, 0 failed, 0 errored, 0 timeout`
    let counts: BTreeMap<&str, u64> = output
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .context("not h2load's output: no `requests:` line")?
        .split(", ")
        .filter_map(|c| {
            let (n, what) = c.split_once(' ')?;
            Some((what, n.parse().ok()?))
        })
        .collect();
    let count = |what: &str| counts.get(what).copied().unwrap_or(0);
    let text =
        std::fs::read_to_string(log).with_context(|| format!("cannot read {}", log.display()))?;
    let mut micros = text
        .lines()
        .map(|l| {
            l.split('\t')
                .nth(2)
                .and_then(|m| m.trim().parse::<f64>().ok())
                .with_context(|| format!("{}: not h2load's log line: {l:?}", log.display()))
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    micros.sort_by(f64::total_cmp);
    let percentile = |p: f64| {
        if micros.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * micros.len() as f64).ceil() as usize;
        micros[rank.clamp(1, micros.len()) - 1]
    };
    let record = Record {
        api: "grpc".to_owned(),
        generator: "h2load".to_owned(),
        server,
        keys: 1,
        concurrency,
        seconds: count("succeeded") as f64 / rps,
        requests: count("succeeded"),
        rps,
        p50_us: percentile(50.0),
        p99_us: percentile(99.0),
        max_us: micros.last().copied().unwrap_or(f64::NAN),
        // Every gRPC answer is HTTP 200, its verdict inside: h2load reads
        // neither (0 / 0 is "n/a" in the report).
        allowed: 0,
        denied: 0,
        errors: count("failed") + count("errored") + count("timeout"),
        server_cpu_us: None,
    };
    println!("{}", serde_json::to_string(&record)?);
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Medians of one server's runs of one case.
struct Summary {
    runs: usize,
    rps: f64,
    p50: f64,
    p99: f64,
    allowed_share: f64,
    /// NaN when no run was given the server's CPU.
    server_cpu_us: f64,
    errors: u64,
}

fn summarize(records: &[&Record]) -> Option<Summary> {
    if records.is_empty() {
        return None;
    }
    let column =
        |f: fn(&Record) -> f64| median(&mut records.iter().map(|r| f(r)).collect::<Vec<_>>());
    Some(Summary {
        runs: records.len(),
        rps: column(|r| r.rps),
        p50: column(|r| r.p50_us),
        p99: column(|r| r.p99_us),
        // NaN when no run could tell allowed from denied.
        allowed_share: column(|r| r.allowed as f64 / (r.allowed + r.denied) as f64),
        server_cpu_us: column(|r| r.server_cpu_us.unwrap_or(f64::NAN)),
        errors: records.iter().map(|r| r.errors).sum(),
    })
}

fn report(files: &[PathBuf]) -> anyhow::Result<()> {
    let mut records = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for (number, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let record: Record = serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not a result line", file.display(), number + 1))?;
            records.push(record);
        }
    }
    let mut cases: Vec<(String, String, u64, u64)> = records
        .iter()
        .map(|r| (r.api.clone(), r.generator.clone(), r.keys, r.concurrency))
        .collect();
    // HTTP before gRPC, then by keys, each case's generators together, ours
    // first.
    let rank = |generator: &str| {
        ["loadgen", "wrk", "oha", "h2load"]
            .iter()
            .position(|g| *g == generator)
            .unwrap_or(usize::MAX)
    };
    cases.sort_by(|a, b| {
        (a.0 != "http", a.2, rank(&a.1), &a.1, a.3).cmp(&(
            b.0 != "http",
            b.2,
            rank(&b.1),
            &b.1,
            b.3,
        ))
    });
    cases.dedup();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| check | generator | keys | conc. | Tollgate req/s | throttlecrab req/s | **ratio** | Tollgate p50 / p99 (µs) | throttlecrab p50 / p99 (µs) | p99 ratio | server CPU µs per answer T / tc | CPU ratio | allowed T / tc | runs |"
    )?;
    writeln!(
        out,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    for (api, generator, keys, concurrency) in cases {
        let runs_of = |server: Server| -> Vec<&Record> {
            records
                .iter()
                .filter(|r| {
                    r.api == api
                        && r.generator == generator
                        && r.keys == keys
                        && r.concurrency == concurrency
                        && r.server == server
                })
                .collect()
        };
        let (tollgate_runs, crab_runs) = (runs_of(Server::Tollgate), runs_of(Server::Throttlecrab));
        let (tollgate, crab) = (summarize(&tollgate_runs), summarize(&crab_runs));
        // Each run measures both servers one after the other, so the n-th
        // record of each server in a case comes from the same run: ratios
        // are taken run by run, then their median, so that a run the whole
        // machine was slower in is not set against another run's peer.
        let paired = |f: fn(&Record) -> f64| {
            let mut ratios: Vec<f64> = tollgate_runs
                .iter()
                .zip(&crab_runs)
                .map(|(t, c)| f(t) / f(c))
                .filter(|ratio| !ratio.is_nan())
                .collect();
            median(&mut ratios)
        };
        let check = match api.as_str() {
            "http" => "HTTP JSON",
            _ => "gRPC",
        };
        let rps = |s: &Option<Summary>| {
            s.as_ref()
                .map_or("–".to_owned(), |s| format!("{:.0}", s.rps))
        };
        let lat = |s: &Option<Summary>| {
            s.as_ref()
                .map_or("–".to_owned(), |s| format!("{:.0} / {:.0}", s.p50, s.p99))
        };
        let share = |s: &Option<Summary>, server: Server| match s {
            // oha reads no bodies, and throttlecrab answers 200 either way.
            Some(_) if generator == "oha" && server == Server::Throttlecrab => "n/a".to_owned(),
            // A generator that could not tell (see `from_h2load`, wrk's script).
            Some(s) if s.allowed_share.is_nan() => "n/a".to_owned(),
            Some(s) => format!("{:.1}%", s.allowed_share * 100.0),
            None => "–".to_owned(),
        };
        let ratio = |f: fn(&Record) -> f64, bold: bool| match paired(f) {
            r if r.is_nan() => "–".to_owned(),
            r if bold => format!("**{r:.2}×**"),
            r => format!("{r:.2}×"),
        };
        let cpu = |s: &Option<Summary>| match s {
            Some(s) if !s.server_cpu_us.is_nan() => format!("{:.2}", s.server_cpu_us),
            _ => "–".to_owned(),
        };
        // Tollgate's over throttlecrab's: below 1, Tollgate spends less.
        let cpu_ratio = ratio(|r| r.server_cpu_us.unwrap_or(f64::NAN), false);
        let (ratio, p99_ratio) = (ratio(|r| r.rps, true), ratio(|r| r.p99_us, false));
        let runs = tollgate
            .as_ref()
            .map_or(0, |s| s.runs)
            .max(crab.as_ref().map_or(0, |s| s.runs));
        let errors =
            tollgate.as_ref().map_or(0, |s| s.errors) + crab.as_ref().map_or(0, |s| s.errors);
        let runs = if errors > 0 {
            format!("{runs} ({errors} errors)")
        } else {
            runs.to_string()
        };
        writeln!(
            out,
            "| {check} | {generator} | {keys} | {concurrency} | {} | {} | {ratio} | {} | {} | {p99_ratio} | {} / {} | {cpu_ratio} | {} / {} | {runs} |",
            rps(&tollgate),
            rps(&crab),
            lat(&tollgate),
            lat(&crab),
            cpu(&tollgate),
            cpu(&crab),
            share(&tollgate, Server::Tollgate),
            share(&crab, Server::Throttlecrab),
        )?;
    }
    Ok(())
}
