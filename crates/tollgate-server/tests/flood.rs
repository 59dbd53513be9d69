//! A flood of new keys through the real service cannot evict a limited
//! victim (regression: eviction once dropped the entry closest to expiry, so
//! long-period flood keys flushed victims' per-second and per-minute state,
//! and an unevictable lease flood passed the key cap). The store-level flood
//! of every table kind is `tollgate-store`'s `tests/flood.rs`; this one drives
//! the doors an attacker reaches: ad-hoc checks of every algorithm and
//! concurrency leases through `/v1/check`, attacker-chosen values of an
//! envoyproxy/ratelimit-format per-day rule and per-day overrides through
//! `/json`, with `--max-keys` small enough that the flood overflows it.

mod common;

use common::Server;
use serde_json::{Value, json};

/// envoyproxy/ratelimit's format, unchanged: one budget per `user` value.
const POLICY: &str = "
domain: flood
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 1000 }
  - key: victim
    rate_limit: { unit: minute, requests_per_unit: 3 }
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
    json!({"key": format!("victim-{algorithm}"), "limit": 2, "period": "1h", "algorithm": algorithm})
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
