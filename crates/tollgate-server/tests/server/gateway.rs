//! The gateway over real HTTP: a real upstream (an axum server on
//! 127.0.0.1:0 in this process), the real `tollgate serve --proxy-listen
//! 127.0.0.1:0 --upstream ...`, and a reqwest client (or raw TCP for what a
//! client library will not send).
//!
//! Quotas are per hour, so no test depends on how fast this machine is.
//! Shaping, whose delays take the service's time, is tested in process
//! under paused time (tests/in_process.rs).

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use common::{Server, config_dir};
use http_body::Frame;
use reqwest::Client;
use serde_json::Value;
use tokio::sync::{Notify, mpsc};

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
struct Arrival {
    /// The upstream connection it came on (the gateway's end of it).
    connection: SocketAddr,
    path: String,
    headers: HeaderMap,
}

/// The test's upstream: records every request it gets.
struct Upstream {
    addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    /// Lets `/stream` send its second chunk.
    release: Arc<Notify>,
}

#[derive(Clone)]
struct UpstreamState {
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    release: Arc<Notify>,
}

impl Upstream {
    async fn start() -> Upstream {
        let state = UpstreamState {
            arrivals: Arc::default(),
            release: Arc::default(),
        };
        let app = Router::new().fallback(answer).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("a bound address");
        tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
        });
        Upstream {
            addr,
            arrivals: state.arrivals,
            release: state.release,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().expect("arrivals lock").clone()
    }
}

/// `/echo`: a fixed body and header; `/upload`: the request body back;
/// `/status/418`: that status; `/stream`: one chunk, then another once the
/// test releases it.
async fn answer(
    State(state): State<UpstreamState>,
    ConnectInfo(connection): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    state.arrivals.lock().expect("arrivals lock").push(Arrival {
        connection,
        path: path.clone(),
        headers: request.headers().clone(),
    });
    match path.as_str() {
        "/upload" => Response::new(request.into_body()),
        "/status/418" => Response::builder()
            .status(StatusCode::IM_A_TEAPOT)
            .body(Body::from("teapot"))
            .expect("a valid response"),
        "/stream" => {
            let (chunks, body) = mpsc::channel(2);
            let release = Arc::clone(&state.release);
            tokio::spawn(async move {
                let _ = chunks.send(Bytes::from_static(b"first;")).await;
                release.notified().await;
                let _ = chunks.send(Bytes::from_static(b"second")).await;
            });
            Response::new(Body::new(Chunks(body)))
        }
        _ => Response::builder()
            .header("x-upstream", "yes")
            .body(Body::from("hello from upstream"))
            .expect("a valid response"),
    }
}

/// A body whose chunks arrive over a channel.
struct Chunks(mpsc::Receiver<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// `tollgate serve` with the gateway in front of `upstream`, the policy
/// `files` and the extra `args`.
fn gateway(upstream: &str, files: &[(&str, &str)], args: &[&str]) -> (Server, String) {
    let mut all = vec!["--proxy-listen", "127.0.0.1:0", "--upstream", upstream];
    all.extend_from_slice(args);
    let server = Server::with_config(files, &all);
    let base = format!("http://{}", server.gateway());
    (server, base)
}

fn client() -> Client {
    Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client")
}

fn number(headers: &reqwest::header::HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

/// `per` requests an hour per client address in the gateway's domain.
fn per_ip(requests: u32) -> String {
    format!(
        "
domain: gateway
rules:
  - name: per-ip
    match: [{{ key: remote_address }}]
    limit: {{ requests: {requests}, per: 1h }}
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_requests_stream_through_and_the_next_gets_429() {
    let upstream = Upstream::start().await;
    let policy = per_ip(5);
    let (server, base) = gateway(&upstream.url(), &[("gateway.yaml", &policy)], &[]);
    let http = client();

    let echo = http.get(format!("{base}/echo")).send().await.unwrap();
    assert_eq!(echo.status(), 200);
    assert_eq!(echo.headers()["x-upstream"], "yes");
    assert_eq!(number(echo.headers(), "x-ratelimit-limit"), Some(5));
    assert_eq!(number(echo.headers(), "x-ratelimit-remaining"), Some(4));
    assert!(echo.headers().contains_key("ratelimit-policy"));
    assert_eq!(echo.text().await.unwrap(), "hello from upstream");

    let upload: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let echoed = http
        .post(format!("{base}/upload"))
        .body(upload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.status(), 200);
    assert_eq!(number(echoed.headers(), "x-ratelimit-remaining"), Some(3));
    assert_eq!(echoed.bytes().await.unwrap().as_ref(), upload.as_slice());

    let teapot = http.get(format!("{base}/status/418")).send().await.unwrap();
    assert_eq!(
        teapot.status(),
        418,
        "the upstream's status comes back as is"
    );
    assert_eq!(number(teapot.headers(), "x-ratelimit-remaining"), Some(2));

    // The response streams: its first chunk arrives while the upstream
    // still holds the second back.
    let mut streamed = http.get(format!("{base}/stream")).send().await.unwrap();
    assert_eq!(streamed.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(30), streamed.chunk())
        .await
        .expect("the first chunk arrives before the upstream finishes")
        .unwrap();
    assert_eq!(first.as_deref(), Some(b"first;".as_slice()));
    upstream.release.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = streamed.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"second");

    let last = http.get(format!("{base}/echo")).send().await.unwrap();
    assert_eq!(last.status(), 200);
    assert_eq!(number(last.headers(), "x-ratelimit-remaining"), Some(0));

    let denied = http.get(format!("{base}/echo")).send().await.unwrap();
    assert_eq!(denied.status(), 429);
    let retry_after = number(denied.headers(), "retry-after").expect("Retry-After on a 429");
    assert!(retry_after > 0 && retry_after <= 3600, "{retry_after}");
    assert_eq!(number(denied.headers(), "x-ratelimit-remaining"), Some(0));
    assert_eq!(denied.headers()["content-type"], "application/json");
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["error"], "rate_limit_exceeded");
    assert_eq!(body["retry_after"], retry_after);
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("per-ip"))
    );

    let arrivals = upstream.arrivals();
    assert_eq!(
        arrivals.iter().map(|a| a.path.as_str()).collect::<Vec<_>>(),
        ["/echo", "/upload", "/status/418", "/stream", "/echo"],
        "the denied request never reached the upstream"
    );
    // Each gateway worker (one per CPU, each with its own listener) keeps its
    // own upstream pool, so a client connection that lands on another worker
    // may open one more upstream connection; never one per request.
    let upstream_connections: std::collections::HashSet<_> =
        arrivals.iter().map(|a| a.connection).collect();
    let workers = std::thread::available_parallelism().map_or(1, usize::from);
    assert!(
        upstream_connections.len() <= workers && upstream_connections.len() < arrivals.len(),
        "the requests reuse pooled upstream connections: {arrivals:?}"
    );
    let first = &arrivals[0].headers;
    assert_eq!(first["x-forwarded-for"], "127.0.0.1");
    assert_eq!(first["forwarded"], "for=127.0.0.1;proto=http");
    assert_eq!(first["x-forwarded-proto"], "http");

    let metrics = http
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"tollgate_checks_total{api="gateway",result="ok"} 5"#,
        r#"tollgate_checks_total{api="gateway",result="over_limit"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_x_forwarded_for_from_an_untrusted_peer_does_not_change_the_key() {
    let upstream = Upstream::start().await;
    let policy = per_ip(2);
    let (_server, base) = gateway(&upstream.url(), &[("gateway.yaml", &policy)], &[]);
    let http = client();
    let mut statuses = Vec::new();
    for spoofed in ["198.51.100.1", "198.51.100.2", "198.51.100.3"] {
        let response = http
            .get(format!("{base}/echo"))
            .header("x-forwarded-for", spoofed)
            .header("forwarded", format!("for={spoofed}"))
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200, 429],
        "three spoofed addresses share the peer's one budget"
    );
    let arrivals = upstream.arrivals();
    assert_eq!(
        arrivals[0].headers["x-forwarded-for"], "198.51.100.1, 127.0.0.1",
        "the gateway appends the peer it saw"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_forwarded_client_is_the_key() {
    let upstream = Upstream::start().await;
    let policy = per_ip(1);
    let (_server, base) = gateway(
        &upstream.url(),
        &[("gateway.yaml", &policy)],
        &["--trusted-proxy", "127.0.0.1/32"],
    );
    let http = client();
    let from = |client: &'static str| {
        http.get(format!("{base}/echo"))
            // The client wrote the left entry; the trusted proxy appended the right one.
            .header("x-forwarded-for", format!("203.0.113.250, {client}"))
            .send()
    };
    assert_eq!(from("198.51.100.1").await.unwrap().status(), 200);
    assert_eq!(from("198.51.100.1").await.unwrap().status(), 429);
    assert_eq!(
        from("198.51.100.2").await.unwrap().status(),
        200,
        "another client behind the same proxy has its own budget"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_actions_key_separately_under_an_envoy_format_policy() {
    let upstream = Upstream::start().await;
    // envoyproxy/ratelimit's format, read unchanged.
    let policy = "
domain: gateway
descriptors:
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: generic_key
    value: writes
    descriptors:
      - key: header_match
        value: post
        rate_limit:
          unit: hour
          requests_per_unit: 1
";
    let actions = config_dir(&[(
        "actions.yaml",
        r#"
rate_limits:
  - actions:
      - request_headers: { header_name: x-api-key, descriptor_key: api_key }
  - actions:
      - generic_key: { descriptor_value: writes }
      - header_value_match:
          descriptor_value: post
          headers: [{ name: ":method", exact_match: POST }]
"#,
    )]);
    let file = actions.path().join("actions.yaml");
    let (_server, base) = gateway(
        &upstream.url(),
        &[("gateway.yaml", policy)],
        &["--gateway-config", file.to_str().unwrap()],
    );
    let http = client();
    let get = |key: &'static str| {
        http.get(format!("{base}/echo"))
            .header("x-api-key", key)
            .send()
    };
    assert_eq!(get("key-a").await.unwrap().status(), 200);
    let second = get("key-a").await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(number(second.headers(), "x-ratelimit-remaining"), Some(0));
    assert_eq!(get("key-a").await.unwrap().status(), 429);
    assert_eq!(
        get("key-b").await.unwrap().status(),
        200,
        "another API key is another budget"
    );

    // No API key: that descriptor is left out and nothing else applies.
    for _ in 0..3 {
        let anonymous = http.get(format!("{base}/echo")).send().await.unwrap();
        assert_eq!(anonymous.status(), 200);
        assert!(!anonymous.headers().contains_key("x-ratelimit-limit"));
    }

    // A composite descriptor: generic_key=writes + header_match=post.
    let post = || http.post(format!("{base}/upload")).body("x").send();
    assert_eq!(post().await.unwrap().status(), 200);
    assert_eq!(post().await.unwrap().status(), 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problem_details_on_request_and_every_limit_in_ratelimit_by_flag() {
    let upstream = Upstream::start().await;
    let policy = "
domain: gateway
rules:
  - name: per-ip
    match: [{ key: remote_address }]
    limit: { requests: 1, per: 1h }
  - name: per-key
    match: [{ key: api_key }]
    limit: { requests: 5, per: 1h }
";
    let actions = config_dir(&[(
        "actions.yaml",
        "
rate_limits:
  - actions: [{ remote_address: {} }]
  - actions: [{ request_headers: { header_name: x-api-key, descriptor_key: api_key } }]
",
    )]);
    let file = actions.path().join("actions.yaml");
    let (_server, base) = gateway(
        &upstream.url(),
        &[("gateway.yaml", policy)],
        &[
            "--gateway-config",
            file.to_str().unwrap(),
            "--proxy-headers",
            "draft-every-limit",
        ],
    );
    let http = client();
    let get = |accept: &'static str| {
        http.get(format!("{base}/echo"))
            .header("x-api-key", "k")
            .header("accept", accept)
            .send()
    };
    let admitted = get("application/json").await.unwrap();
    assert_eq!(admitted.status(), 200);
    let every = admitted.headers()["ratelimit"].to_str().unwrap();
    assert!(
        every.starts_with(r#""per-ip";r=0;t="#) && every.contains(r#", "per-key";r=4;t="#),
        "{every}"
    );
    assert!(
        !admitted.headers().contains_key("x-ratelimit-limit"),
        "the style has no X-RateLimit-*"
    );

    let denied = get("application/problem+json").await.unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["content-type"], "application/problem+json");
    let retry_after = number(denied.headers(), "retry-after").expect("Retry-After");
    let problem: Value = denied.json().await.unwrap();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"], serde_json::json!(["per-ip"]));
    assert_eq!(problem["retry_after"], retry_after);

    let json = get("application/json").await.unwrap();
    assert_eq!(json.status(), 429);
    assert_eq!(json.headers()["content-type"], "application/json");
    assert_eq!(upstream.arrivals().len(), 1, "denials never reach it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_down_gets_502_after_the_decision_is_counted() {
    // A port bound and held but never listened on: connections to it are
    // refused, and no other test's server can take it meanwhile (a port
    // merely free a moment ago once went to a server that answered 429).
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = held.local_addr().unwrap();
    let policy = per_ip(10);
    let (_server, base) = gateway(
        &format!("http://{closed}"),
        &[("gateway.yaml", &policy)],
        &[],
    );
    let http = client();
    for remaining in [9, 8] {
        let response = http.get(format!("{base}/anything")).send().await.unwrap();
        assert_eq!(response.status(), 502);
        assert_eq!(
            number(response.headers(), "x-ratelimit-remaining"),
            Some(remaining),
            "the admission was counted before the upstream failed"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"], "bad_gateway");
    }
}

/// Writes `request` on a new connection to `addr` and reads everything the
/// gateway answers until it closes the connection (on a blocking thread, so
/// that the upstream keeps the runtime's workers).
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let request = request.to_vec();
    tokio::task::spawn_blocking(move || raw_blocking(addr, &request))
        .await
        .expect("the raw client does not panic")
}

fn raw_blocking(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // The gateway may answer and close before it has read everything.
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// The status codes of the responses in `answer`, in order.
fn statuses(answer: &str) -> Vec<u16> {
    answer
        .match_indices("HTTP/1.1 ")
        .filter_map(|(at, _)| answer.get(at + 9..at + 12)?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_and_oversized_headers_are_refused_before_the_upstream() {
    let upstream = Upstream::start().await;
    let policy = per_ip(100);
    let (server, _base) = gateway(&upstream.url(), &[("gateway.yaml", &policy)], &[]);
    let addr = server.gateway();

    // Content-Length and Transfer-Encoding both: hyper reads the chunked
    // body (RFC 9112 §6.3), drops Content-Length and closes the connection
    // after answering, so the request hidden behind the body is never read.
    let smuggled = b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /status/418 HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(statuses(&raw(addr, smuggled).await), [200]);
    let arrivals = upstream.arrivals();
    assert_eq!(
        arrivals.iter().map(|a| a.path.as_str()).collect::<Vec<_>>(),
        ["/upload"],
        "the smuggled request never reached the upstream"
    );
    assert!(!arrivals[0].headers.contains_key("content-length"));

    // A transfer coding other than chunked last: refused outright.
    let gzip = b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n";
    assert_eq!(statuses(&raw(addr, gzip).await), [400]);

    let huge = format!(
        "GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40 * 1024)
    );
    assert_eq!(statuses(&raw(addr, huge.as_bytes()).await), [431]);

    let mut many = String::from("GET /echo HTTP/1.1\r\nHost: x\r\n");
    for i in 0..120 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    assert_eq!(statuses(&raw(addr, many.as_bytes()).await), [431]);

    let fine = b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_eq!(statuses(&raw(addr, fine).await), [200]);
    assert_eq!(
        upstream.arrivals().len(),
        2,
        "only the well-formed requests were forwarded"
    );
}
