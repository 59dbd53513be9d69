//! A flood of new keys through the real service cannot evict a limited
//! victim (regression: eviction once dropped the entry closest to expiry, so
//! long-period flood keys flushed victims' per-second and per-minute state,
//! and an unevictable lease flood passed the key cap). The store-level flood
//! of every table kind is `tollgate-store`'s `tests/flood.rs`; this one drives
//! the doors an attacker reaches: ad-hoc checks of every algorithm and
//! concurrency leases through `/v1/check`, attacker-chosen values of an
//! envoyproxy/ratelimit-format per-day rule and per-day overrides through
//! `/json`, with `--max-keys` small enough that the flood overflows it.

use crate::common;

use common::{Server, logged_number};
use serde_json::{Value, json};

/// envoyproxy/ratelimit's format, unchanged: one budget per `user` value.
/// Windows are days (aligned to UTC midnight), so a run does not cross one
/// and see a victim's budget come back: a minute window did about once in
/// fifty runs.
const POLICY: &str = "
domain: flood
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 1000 }
  - key: victim
    rate_limit: { unit: day, requests_per_unit: 3 }
";

const ALGORITHMS: [&str; 8] = [
    "gcra",
    "token-bucket",
    "leaky-bucket",
    "leaky-bucket-shaping",
    "fixed-window",
    "sliding-log",
    "sliding-counter",
    "concurrency",
];

async fn post(http: &reqwest::Client, server: &Server, path: &str, body: &Value) -> u16 {
    http.post(server.url(path))
        .json(body)
        .send()
        .await
        .expect("an answer")
        .status()
        .as_u16()
}

fn victim(i: usize) -> Value {
    json!({"domain": "flood", "descriptors": [{"entries": [{"key": "victim", "value": format!("v{i}")}]}]})
}

fn adhoc_victim(algorithm: &str) -> Value {
    json!({"key": format!("victim-{algorithm}"), "limit": 2, "period": "1d", "algorithm": algorithm})
}

async fn metric(server: &Server, name: &str) -> f64 {
    let text = reqwest::get(server.url("/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{name} is on /metrics:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_keys_through_every_door_keeps_victims_limited() {
    let max_keys = 256;
    let server = Server::with_config(
        &[("flood.yaml", POLICY)],
        &["--max-keys", &max_keys.to_string()],
    );
    let http = reqwest::Client::new();

    // Victims spend their whole budget first.
    for i in 0..4 {
        for _ in 0..3 {
            assert_eq!(post(&http, &server, "/json", &victim(i)).await, 200);
        }
        assert_eq!(post(&http, &server, "/json", &victim(i)).await, 429);
    }
    for algorithm in ALGORITHMS {
        let body = adhoc_victim(algorithm);
        for _ in 0..2 {
            assert_eq!(
                post(&http, &server, "/v1/check", &body).await,
                200,
                "{algorithm}"
            );
        }
        assert_eq!(
            post(&http, &server, "/v1/check", &body).await,
            429,
            "{algorithm}"
        );
    }

    // The flood: four times the cap in new keys, long-lived ones included.
    for n in 0..4 * max_keys {
        let body = match n % 3 {
            0 => {
                json!({"domain": "flood", "descriptors": [{"entries": [{"key": "user", "value": format!("u{n}")}]}]})
            }
            1 => {
                json!({"domain": "flood", "descriptors": [{"entries": [{"key": "attacker", "value": format!("a{n}")}],
                        "limit": {"requests_per_unit": 100, "unit": "DAY"}}]})
            }
            _ => json!({"key": format!("flood-{n}"), "limit": 100, "period": "1d",
                        "algorithm": ALGORITHMS[n % ALGORITHMS.len()]}),
        };
        let status = post(
            &http,
            &server,
            if n % 3 == 2 { "/v1/check" } else { "/json" },
            &body,
        )
        .await;
        assert!(status == 200 || status == 429, "{status}: {body}");

        // Every victim stays limited, during the flood as after it.
        if n % 64 == 0 {
            for i in 0..4 {
                assert_eq!(
                    post(&http, &server, "/json", &victim(i)).await,
                    429,
                    "victim {i} at {n}"
                );
            }
            for algorithm in ALGORITHMS {
                let status = post(&http, &server, "/v1/check", &adhoc_victim(algorithm)).await;
                assert_eq!(status, 429, "{algorithm} victim at {n}");
            }
        }
    }

    let keys = metric(&server, "tollgate_memory_keys").await;
    assert!(keys <= max_keys as f64, "{keys} keys held past the cap");
    assert!(metric(&server, "tollgate_memory_refusals_total").await > 0.0);
}

/// Regression: exhausting file descriptors through one port stopped the
/// gateway, the HTTP API and gRPC together. Under a 512-file limit, the caps
/// are fitted to it, so a connection flood on the HTTP port takes only the
/// HTTP listener's share and every other listener keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_on_one_port_leaves_the_other_listeners_serving() {
    let server = Server::with_config_by(
        common::tollgate_with_file_limit(512),
        &[("flood.yaml", POLICY)],
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--proxy-listen",
            "127.0.0.1:0",
            // Nothing listens there: the gateway answers 502, which is an
            // answer.
            "--upstream",
            "http://127.0.0.1:1",
        ],
    );
    let log = server.log();
    let cap = logged_number(&log, "max_connections=");
    assert!(cap < 256, "the caps were fitted to the limit: {cap}");

    let http = server.http;
    let flood: Vec<std::net::TcpStream> = tokio::task::spawn_blocking(move || {
        (0..600)
            .map(|_| std::net::TcpStream::connect(http).expect("the backlog takes it"))
            .collect()
    })
    .await
    .unwrap();

    let mut grpc = server.grpc_client().await;
    let answer = grpc
        .should_rate_limit(common::rls_request("flood", &[&[("victim", "v")]]))
        .await
        .expect("gRPC answers during the flood")
        .into_inner();
    assert_eq!(answer.overall_code, 1, "OK");
    let gateway = reqwest::get(format!("http://{}/", server.gateway()))
        .await
        .expect("the gateway answers during the flood");
    assert_eq!(gateway.status(), 502);
    // The listener refuses what the backlog still holds as it accepts it.
    let everything = 600 - cap;
    let mut refused = 0;
    for _ in 0..100 {
        let metrics = reqwest::get(format!("http://{}/metrics", server.admin()))
            .await
            .expect("the admin listener answers during the flood")
            .text()
            .await
            .unwrap();
        refused = metrics
            .lines()
            .find_map(|l| l.strip_prefix(r#"tollgate_refused_connections_total{listener="http"} "#))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        if refused >= everything {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(refused >= everything, "{refused} refused, cap {cap}");

    drop(flood);
    let healthz = reqwest::get(server.url("/healthz"))
        .await
        .expect("the HTTP API answers once the flood ends");
    assert_eq!(healthz.status(), 200);
}
