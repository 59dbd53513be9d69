//! The gateway's load shedder at three times an upstream's capacity, for
//! `scripts/bench-shedder`: goodput and critical latency with the shedder
//! and without it, in the same run.
//!
//! ```text
//! shedder --tollgate target/release/tollgate --config examples/stripe.yaml \
//!         [--duration-secs 10] [--rounds 2]
//! ```
//!
//! The upstream runs in this process on loopback and saturates: up to
//! `CAPACITY` requests in flight each takes `BASE`; past it, every request
//! takes proportionally longer (latency = BASE × in flight / CAPACITY), as a
//! queue would make it, so its throughput never exceeds CAPACITY / BASE.
//! Each side is `tollgate serve --config FILE --proxy-listen 127.0.0.1:0
//! --upstream URL`: with the config as given (the shedder on) and with its
//! gateway's `shed:` section cut out (off), one after the other in each
//! round, the first side alternating. After a warm-up of light critical
//! traffic (the shedder's first probe), the load is open-loop, as a fleet's
//! clients are: three times the upstream's capacity, one request in twelve
//! critical (a quarter of the capacity), the rest low priority, each with
//! a `TIMEOUT`. It prints one markdown table: requests offered a second,
//! goodput (200s within the clients' `SLO`, a second of load), critical
//! successes (200s) and p99 (a failure counts as the timeout), low answers
//! by status.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use hdrhistogram::Histogram;
use tokio::sync::mpsc;

/// Requests the upstream serves at its base latency at once.
const CAPACITY: u32 = 8;
/// Its latency with at most `CAPACITY` in flight.
const BASE: Duration = Duration::from_millis(100);
/// How long a client waits for an answer.
const TIMEOUT: Duration = Duration::from_secs(5);
/// An answer is good if it is a 200 within this time (the clients' SLO).
const SLO: Duration = Duration::from_secs(1);
/// One request in this many is critical.
const CRITICAL_EVERY: u32 = 12;
/// How many API keys the requests are spread over (so that no per-key
/// limit of the example is what refuses them).
const KEYS: u32 = 200;

async fn saturating(State(in_flight): State<Arc<AtomicU32>>) -> &'static str {
    let n = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
    tokio::time::sleep(BASE * n.max(CAPACITY) / CAPACITY).await;
    in_flight.fetch_sub(1, Ordering::AcqRel);
    "ok"
}

/// A fresh saturating upstream: each side gets its own, so that what an
/// earlier side left waiting there (up to many seconds without the
/// shedder) does not slow the next.
async fn upstream() -> SocketAddr {
    let in_flight = Arc::new(AtomicU32::new(0));
    let app = Router::new().fallback(saturating).with_state(in_flight);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// What one side's run gave.
#[derive(Default)]
struct Side {
    sent: u64,
    /// 200s within the SLO.
    ok: u64,
    critical_sent: u64,
    critical_ok: u64,
    /// Critical latencies in microseconds (a failure counts as `TIMEOUT`).
    critical: Option<Histogram<u64>>,
    low_ok: u64,
    low_shed: u64,
    low_limited: u64,
    low_failed: u64,
    seconds: f64,
}

/// One answered (or failed) request.
struct Answer {
    critical: bool,
    status: Option<u16>,
    took: Duration,
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `tollgate serve` with `config` in front of `upstream`; returns it
/// and the gateway's address.
fn serve(tollgate: &str, config: &str, upstream: SocketAddr) -> (Server, SocketAddr) {
    let mut child = Command::new(tollgate)
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(["--config", config, "--proxy-listen", "127.0.0.1:0"])
        .args(["--upstream", &format!("http://{upstream}")])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tollgate starts");
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    const MARK: &str = "listening for the gateway on ";
    let addr = loop {
        let line = lines
            .next()
            .expect("tollgate logs its gateway address")
            .expect("a log line");
        if let Some(rest) = line.split(MARK).nth(1) {
            let addr = rest.split_whitespace().next().expect("an address");
            break addr.parse().expect("a socket address");
        }
    };
    // Keep reading, so that the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (Server(child), addr)
}

async fn send(client: &reqwest::Client, url: &str, key: u32, critical: bool) -> Answer {
    let started = Instant::now();
    let tier = if critical { "critical" } else { "low" };
    let status = client
        .get(url)
        .header("x-api-key", format!("sk_{key}"))
        .header("x-priority", tier)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16());
    Answer {
        critical,
        status,
        took: started.elapsed(),
    }
}

async fn run(gateway: SocketAddr, duration: Duration) -> Side {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(TIMEOUT)
        .pool_max_idle_per_host(4_096)
        .build()
        .expect("a client");
    let url = format!("http://{gateway}/v1/charges");
    // Warm-up: light critical traffic, three at a time (the probe's limit).
    let warm_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < warm_until {
        let batch: Vec<_> = (0..3)
            .map(|i| {
                let (client, url) = (client.clone(), url.clone());
                tokio::spawn(async move { send(&client, &url, i, true).await })
            })
            .collect();
        for request in batch {
            let _ = request.await;
        }
    }
    // Open loop: a tick's requests go out whatever became of the earlier ones.
    let rate = 3 * CAPACITY * 1_000 / u32::try_from(BASE.as_millis()).expect("small");
    let per_tick = CRITICAL_EVERY;
    let tick = Duration::from_secs(1) * per_tick / rate;
    let (answers, mut received) = mpsc::unbounded_channel();
    let started = Instant::now();
    let mut pace = tokio::time::interval(tick);
    let mut n: u32 = 0;
    while started.elapsed() < duration {
        pace.tick().await;
        for i in 0..per_tick {
            n = n.wrapping_add(1);
            let (client, url, answers) = (client.clone(), url.clone(), answers.clone());
            tokio::spawn(async move {
                let answer = send(&client, &url, n % KEYS, i == 0).await;
                let _ = answers.send(answer);
            });
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    drop(answers);
    let mut side = Side {
        critical: Some(
            Histogram::new_with_bounds(1, u64::try_from(TIMEOUT.as_micros()).expect("small"), 3)
                .expect("a histogram"),
        ),
        seconds,
        ..Side::default()
    };
    while let Some(answer) = received.recv().await {
        side.sent += 1;
        let ok = answer.status == Some(200);
        side.ok += u64::from(ok && answer.took <= SLO);
        if answer.critical {
            side.critical_sent += 1;
            side.critical_ok += u64::from(ok);
            let took = if ok { answer.took } else { TIMEOUT };
            let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            if let Some(histogram) = &mut side.critical {
                histogram.saturating_record(micros);
            }
        } else {
            match answer.status {
                Some(200) => side.low_ok += 1,
                Some(503) => side.low_shed += 1,
                Some(429) => side.low_limited += 1,
                _ => side.low_failed += 1,
            }
        }
    }
    side
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// `config`'s text without its gateway's `shed:` section.
fn without_shed(config: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in config.lines() {
        let indent = line.len() - line.trim_start().len();
        if line.trim_start().starts_with("shed:") && indent == 2 {
            skipping = true;
            continue;
        }
        if skipping && (line.trim().is_empty() || indent > 2) {
            continue;
        }
        skipping = false;
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tollgate = arg(&args, "--tollgate").expect("--tollgate PATH");
    let config = arg(&args, "--config").expect("--config PATH");
    let duration = Duration::from_secs(
        arg(&args, "--duration-secs").map_or(10, |s| s.parse().expect("a number of seconds")),
    );
    let rounds: u32 = arg(&args, "--rounds").map_or(2, |s| s.parse().expect("a number"));

    let text = std::fs::read_to_string(&config).expect("the config reads");
    let off = without_shed(&text);
    assert_ne!(off, text, "{config} has no gateway shed: section");
    let dir = std::env::temp_dir().join(format!("bench-shedder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let off_path = dir.join("no-shed.yaml");
    std::fs::write(&off_path, off).expect("a writable temp dir");
    let off_path = off_path.to_str().expect("a UTF-8 path").to_owned();

    let mut results: Vec<(&str, Side)> = Vec::new();
    for round in 0..rounds {
        let mut sides = [("on", config.as_str()), ("off", off_path.as_str())];
        if round % 2 == 1 {
            sides.reverse();
        }
        for (name, file) in sides {
            let upstream = upstream().await;
            let (server, gateway) = serve(&tollgate, file, upstream);
            let side = run(gateway, duration).await;
            drop(server);
            eprintln!(
                "round {round} shedder {name}: {:.0} good/s, critical {}/{}",
                side.ok as f64 / side.seconds,
                side.critical_ok,
                side.critical_sent
            );
            results.push((name, side));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "upstream: {CAPACITY} in flight at {} ms each, slower in proportion past it; \
         load: 3x its capacity, open loop, 1 in {CRITICAL_EVERY} critical; timeout {} s; \
         goodput: 200s within {} s",
        BASE.as_millis(),
        TIMEOUT.as_secs(),
        SLO.as_secs()
    );
    println!();
    println!(
        "| round | shedder | offered/s | goodput/s | critical 200 | critical p99 | low 200 / 503 / 429 / failed |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (i, (name, side)) in results.iter().enumerate() {
        let p99 = side
            .critical
            .as_ref()
            .map_or(0, |h| h.value_at_quantile(0.99))
            / 1_000;
        println!(
            "| {} | {name} | {:.0} | {:.0} | {:.1}% | {p99} ms | {} / {} / {} / {} |",
            i / 2,
            side.sent as f64 / side.seconds,
            side.ok as f64 / side.seconds,
            100.0 * side.critical_ok as f64 / side.critical_sent.max(1) as f64,
            side.low_ok,
            side.low_shed,
            side.low_limited,
            side.low_failed,
        );
    }
}
