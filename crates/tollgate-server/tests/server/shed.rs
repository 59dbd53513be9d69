//! The gateway's load shedder over real HTTP: `tollgate serve --config
//! examples/stripe.yaml --proxy-listen 127.0.0.1:0 --upstream URL` (the
//! example as it ships), in front of a real upstream on loopback that
//! saturates: up to its capacity a request takes its base latency, past it
//! every request takes proportionally longer, as a queue would make it.
//!
//! Assertions are on counts and on what `/metrics` shows, never on how long
//! anything took; the load is bounded in requests, and every wait is a
//! bounded number of tries.

use crate::common::Server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use reqwest::{Client, StatusCode};

/// Requests the upstream serves at its base latency at once.
const CAPACITY: u32 = 8;
/// Its latency with at most `CAPACITY` requests in flight.
// Long beside the scheduling delays of a loaded two-CPU machine, which the
// gateway cannot tell from the upstream's own.
const BASE: Duration = Duration::from_millis(100);
/// Closed-loop critical clients: under the upstream's capacity on their own.
const CRITICAL_CLIENTS: usize = 4;
/// Low-priority clients: with the critical ones, three times the capacity.
const LOW_CLIENTS: usize = 20;
/// Requests each critical client sends during the overload.
const CRITICAL_REQUESTS: usize = 20;

/// The saturating upstream's counters.
#[derive(Default)]
struct Load {
    in_flight: AtomicU32,
    /// Requests that arrived, by whether they were critical.
    critical: AtomicU64,
    low: AtomicU64,
}

async fn saturating(State(load): State<Arc<Load>>, headers: HeaderMap) -> &'static str {
    let critical = headers
        .get("x-priority")
        .is_some_and(|v| v.as_bytes() == b"critical");
    let counter = if critical { &load.critical } else { &load.low };
    counter.fetch_add(1, Ordering::Relaxed);
    let n = load.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
    // Past its capacity the service slows in proportion to its load.
    let latency = BASE * n.max(CAPACITY) / CAPACITY;
    tokio::time::sleep(latency).await;
    load.in_flight.fetch_sub(1, Ordering::AcqRel);
    "ok"
}

async fn upstream() -> (SocketAddr, Arc<Load>) {
    let load = Arc::new(Load::default());
    let app = Router::new()
        .fallback(saturating)
        .with_state(Arc::clone(&load));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, load)
}

fn client() -> Client {
    Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client")
}

/// One request through the gateway as API key `key` with priority `tier`.
async fn send(client: &Client, gateway: &str, key: &str, tier: &str) -> StatusCode {
    client
        .get(format!("{gateway}/v1/charges"))
        .header("x-api-key", key)
        .header("x-priority", tier)
        .send()
        .await
        .expect("the gateway answers")
        .status()
}

/// The value of the series `name` (with its labels, as rendered) on
/// `/metrics`.
async fn metric(client: &Client, server: &Server, name: &str) -> Option<f64> {
    let text = client
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .expect("a text body");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_three_times_capacity_critical_requests_succeed_while_low_ones_are_shed() {
    let (addr, load) = upstream().await;
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/stripe.yaml");
    let upstream_url = format!("http://{addr}");
    let server = Server::start(&[
        "--config",
        example,
        "--proxy-listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream_url,
    ]);
    let gateway = format!("http://{}", server.gateway());
    let http = client();

    // The first probe measures the upstream's latency with little queued.
    // Three at a time: the probe's limit.
    let (mut probed, mut warm_up) = (false, 0);
    for _ in 0..100 {
        let batch: Vec<_> = (0..3)
            .map(|_| {
                let (http, gateway) = (http.clone(), gateway.clone());
                tokio::spawn(async move { send(&http, &gateway, "warm", "critical").await })
            })
            .collect();
        for request in batch {
            assert_eq!(request.await.expect("a request"), StatusCode::OK);
            warm_up += 1;
        }
        if metric(&http, &server, "tollgate_shed_probing").await == Some(0.0) {
            probed = true;
            break;
        }
    }
    assert!(probed, "the probe never ended\n{}", server.log());

    let low_running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let low_ok = Arc::new(AtomicU64::new(0));
    let low_shed = Arc::new(AtomicU64::new(0));
    let lows: Vec<_> = (0..LOW_CLIENTS)
        .map(|i| {
            let (http, gateway) = (http.clone(), gateway.clone());
            let (running, ok, shed) = (
                Arc::clone(&low_running),
                Arc::clone(&low_ok),
                Arc::clone(&low_shed),
            );
            tokio::spawn(async move {
                // Each low client offers one request per base latency, so
                // that a shed (answered at once) does not spin.
                let mut pace = tokio::time::interval(BASE);
                while running.load(Ordering::Relaxed) {
                    pace.tick().await;
                    match send(&http, &gateway, &format!("low-{i}"), "low").await {
                        StatusCode::OK => ok.fetch_add(1, Ordering::Relaxed),
                        StatusCode::SERVICE_UNAVAILABLE => shed.fetch_add(1, Ordering::Relaxed),
                        other => panic!("a low request answered {other}"),
                    };
                }
            })
        })
        .collect();
    let criticals: Vec<_> = (0..CRITICAL_CLIENTS)
        .map(|i| {
            let (http, gateway) = (http.clone(), gateway.clone());
            tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..CRITICAL_REQUESTS {
                    let status = send(&http, &gateway, &format!("critical-{i}"), "critical").await;
                    ok += usize::from(status == StatusCode::OK);
                }
                ok
            })
        })
        .collect();
    let mut critical_ok = 0;
    for critical in criticals {
        critical_ok += critical.await.expect("a critical client");
    }
    // Sampled while the low clients still press.
    let shed_low = metric(&http, &server, "tollgate_shed_total{tier=\"low\"}").await;
    let limit = metric(&http, &server, "tollgate_shed_limit").await;
    low_running.store(false, Ordering::Relaxed);
    for low in lows {
        low.await.expect("a low client");
    }

    let critical_sent = CRITICAL_CLIENTS * CRITICAL_REQUESTS;
    let (low_ok, low_shed) = (
        low_ok.load(Ordering::Relaxed),
        low_shed.load(Ordering::Relaxed),
    );
    assert!(
        critical_ok * 100 >= critical_sent * 95,
        "{critical_ok} of {critical_sent} critical requests succeeded"
    );
    assert!(
        low_shed > low_ok,
        "low requests: {low_ok} admitted, {low_shed} shed"
    );
    assert!(
        shed_low.is_some_and(|n| n > 0.0),
        "/metrics shows no low sheds"
    );
    assert!(
        limit.is_some_and(|n| n >= 3.0),
        "/metrics shows no learned limit"
    );
    // A shed request never reached the upstream.
    assert_eq!(
        load.critical.load(Ordering::Relaxed),
        warm_up + critical_ok as u64,
        "critical arrivals"
    );
    assert_eq!(load.low.load(Ordering::Relaxed), low_ok, "low arrivals");

    // The load has ended: low traffic is admitted again, several at once.
    let mut admitted = false;
    for _ in 0..100 {
        let batch: Vec<_> = (0..4)
            .map(|i| {
                let (http, gateway) = (http.clone(), gateway.clone());
                tokio::spawn(
                    async move { send(&http, &gateway, &format!("after-{i}"), "low").await },
                )
            })
            .collect();
        let mut all_ok = true;
        for request in batch {
            all_ok &= request.await.expect("a request") == StatusCode::OK;
        }
        if all_ok {
            admitted = true;
            break;
        }
    }
    assert!(admitted, "low traffic is still shed after the load ended");
    let in_flight = metric(&http, &server, "tollgate_shed_in_flight").await;
    assert_eq!(in_flight, Some(0.0), "nothing left in flight");
}
