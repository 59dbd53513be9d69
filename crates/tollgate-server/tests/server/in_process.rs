//! The service started in process by `tollgate_server::serve::start`, the
//! function `tollgate serve` runs, on listeners bound to 127.0.0.1:0 and a
//! `TokioClock`, under tokio's paused time: what takes seconds of the
//! service's time (a shaped request's turn, the reload watcher's polls)
//! passes at once, in virtual time that the algorithms, the enforcer and
//! tokio's timers share.
//!
//! No test here has a wall-clock timeout: paused time advances on its own
//! whenever every task waits, and would fire one early. Bounds are on
//! virtual time instead, which only passes when the test (or a timer the
//! service set) makes it pass.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use common::{config_dir, rls_request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use reqwest::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tollgate_server::TokioClock;
use tollgate_server::serve::{self, Args, Listeners, RELOAD_POLL, Running};
use tonic::transport::Channel;

/// 2026-01-01T00:00:00Z: where the service's clock starts, so that day
/// windows begin at a known instant.
const EPOCH: u64 = 1_767_225_600_000_000_000;

/// How far virtual time moves between two looks at the service.
const STEP: Duration = Duration::from_millis(10);

/// The most virtual time a test lets pass waiting for the watcher.
const WITHIN: Duration = Duration::from_secs(60);

const ADMIN_TOKEN: &str = "reload-token";

/// The service on `files` (a config directory) with the `flags` of
/// `tollgate serve`, started in process; the directory lives as long as the
/// test keeps it.
pub(crate) async fn start(files: &[(&str, &str)], flags: &[&str]) -> (Running, tempfile::TempDir) {
    let dir = config_dir(files);
    let mut all = vec!["--config", dir.path().to_str().expect("a UTF-8 temp path")];
    all.extend_from_slice(flags);
    let args = Args::parse_from(all.iter().copied())
        .expect("valid flags")
        .gateway_on_caller_runtime();
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.expect("a free port"),
        grpc: TcpListener::bind("127.0.0.1:0").await.expect("a free port"),
    };
    let running = serve::start(args, listeners, Arc::new(TokioClock::new(EPOCH)))
        .await
        .expect("the service starts");
    (running, dir)
}

pub(crate) fn client() -> Client {
    Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client")
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).expect("a writable config");
}

/// What the service logged, captured once per test process.
fn log() -> String {
    LOG.get_or_init(common::capture_log).text()
}

static LOG: OnceLock<Arc<common::Log>> = OnceLock::new();

// ---- the gateway's shaping ----

/// What the test's upstream saw: each request's path and the (virtual)
/// instant it arrived.
pub(crate) type Arrivals = Arc<Mutex<Vec<(String, Instant)>>>;

/// An upstream on 127.0.0.1:0 in this runtime, recording every request.
pub(crate) async fn upstream() -> (String, Arrivals) {
    async fn record(State(arrivals): State<Arrivals>, request: Request) -> &'static str {
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
        arrivals
            .lock()
            .expect("arrivals lock")
            .push((path.to_owned(), Instant::now()));
        "hello from upstream"
    }
    let arrivals = Arrivals::default();
    let app = Router::new()
        .fallback(record)
        .with_state(Arc::clone(&arrivals));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), arrivals)
}

/// A gateway in front of a recording [`upstream`], the policy `file` (named
/// `name`) read both as the service's config and, for its `gateway:`
/// section, as the gateway's: the service, what reached the upstream, and
/// the two directories, which live as long as the test keeps them.
pub(crate) async fn gateway_of(
    name: &str,
    file: &str,
) -> (Running, Arrivals, [tempfile::TempDir; 2]) {
    let (upstream, arrivals) = upstream().await;
    let gateway = config_dir(&[("gateway.yaml", file)]);
    let gateway_config = gateway.path().join("gateway.yaml");
    let (running, dir) = start(
        &[(name, file)],
        &[
            "--proxy-listen",
            "127.0.0.1:0",
            "--upstream",
            &upstream,
            "--gateway-config",
            gateway_config.to_str().expect("a UTF-8 temp path"),
        ],
    )
    .await;
    (running, arrivals, [gateway, dir])
}

/// The paths that reached the upstream, in order.
pub(crate) fn arrived(arrivals: &Arrivals) -> Vec<String> {
    arrivals
        .lock()
        .expect("arrivals lock")
        .iter()
        .map(|(path, _)| path.clone())
        .collect()
}

/// The service's `/live.json`.
pub(crate) async fn live_json(running: &Running) -> serde_json::Value {
    client()
        .get(format!("http://{}/live.json", running.http_addr()))
        .send()
        .await
        .expect("the HTTP API answers")
        .json()
        .await
        .expect("a JSON body")
}

/// The service's `/metrics` text.
pub(crate) async fn metrics(running: &Running) -> String {
    client()
        .get(format!("http://{}/metrics", running.http_addr()))
        .send()
        .await
        .expect("the HTTP API answers")
        .text()
        .await
        .expect("a text body")
}

/// The instant `path` reached the upstream, if it did.
fn arrival(arrivals: &Arrivals, path: &str) -> Option<Instant> {
    arrivals
        .lock()
        .expect("arrivals lock")
        .iter()
        .find_map(|(p, at)| (p == path).then_some(*at))
}

/// One request every 5 s per client, a queue of one beyond the request
/// being served: NGINX's `limit_req rate=12r/m burst=1` without `nodelay`.
const SHAPED: &str = "
domain: gateway
rules:
  - name: shaped
    match: [{ key: remote_address }]
    algorithm: leaky-bucket-shaping
    limit: { requests: 12, per: 1m, burst: 2 }
";

/// The shaped rule's emission interval: a request's turn.
const TURN: Duration = Duration::from_secs(5);

#[tokio::test(start_paused = true)]
async fn shaping_holds_an_admitted_request_for_its_turn_and_a_full_queue_gets_429() {
    let (upstream, arrivals) = upstream().await;
    let (running, _dir) = start(
        &[("gateway.yaml", SHAPED)],
        &["--proxy-listen", "127.0.0.1:0", "--upstream", &upstream],
    )
    .await;
    let base = format!("http://{}", running.gateway_addr().expect("a gateway"));
    let http = client();
    let started = Instant::now();

    let first = http.get(format!("{base}/echo?n=0")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let forwarded = arrival(&arrivals, "/echo?n=0").expect("the first reached the upstream");
    assert!(
        forwarded - started < TURN,
        "an empty queue forwards at once, not after a turn"
    );

    // Two more at once: one takes the queue's last place and is held for its
    // turn; the other finds the queue full. Which is which is up to the race.
    let send = |n: u32| {
        let request = http.get(format!("{base}/echo?n={n}")).send();
        async move {
            let response = request.await.unwrap();
            (n, response.status().as_u16(), Instant::now())
        }
    };
    let (a, b) = tokio::join!(send(1), send(2));
    let mut outcomes = [a, b];
    outcomes.sort_by_key(|(_, status, _)| *status);
    let [(held, 200, _), (refused, 429, refused_at)] = outcomes else {
        panic!("expected one 200 and one 429, got {outcomes:?}");
    };
    assert!(
        refused_at - started < TURN,
        "the full queue is refused at once, not after a turn"
    );
    assert_eq!(
        arrival(&arrivals, &format!("/echo?n={refused}")),
        None,
        "the refused request never reached the upstream"
    );
    let held_at = arrival(&arrivals, &format!("/echo?n={held}"))
        .expect("the held request reached the upstream");
    let waited = held_at - started;
    assert!(
        waited >= TURN && waited < TURN + Duration::from_secs(1),
        "the admitted request was held for its turn and no longer: {waited:?}"
    );
    running.shutdown().await.expect("a clean shutdown");
}

// ---- hot reload ----

fn config(requests_per_unit: u32) -> String {
    config_of("reload", requests_per_unit)
}

fn config_of(domain: &str, requests_per_unit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      requests_per_unit: {requests_per_unit}\n"
    )
}

/// Line 6 names a unit that does not exist.
const BROKEN: &str = "domain: reload\ndescriptors:\n  - key: user\n    rate_limit:\n      requests_per_unit: 5\n      unit: fortnight\n";

/// Lets `duration` of virtual time pass. Paused time moves on only while
/// no task can run and no blocking task is out, so each watcher poll
/// (file reads on tokio's blocking pool) finishes before the next instant;
/// `tokio::time::advance` would move on regardless of them.
async fn pass(duration: Duration) {
    tokio::time::sleep(duration).await;
}

/// A gRPC client of the service.
async fn grpc_client(running: &Running) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr()))
        .await
        .expect("the gRPC listener accepts")
}

/// The `requests_per_unit` that `domain` applies to `user` now.
async fn limit_in(grpc: &mut RateLimitServiceClient<Channel>, domain: &str) -> Option<u32> {
    let response = grpc
        .should_rate_limit(rls_request(domain, &[&[("user", "u")]]))
        .await
        .expect("ShouldRateLimit answers")
        .into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

/// Lets virtual time pass in steps until `domain`'s limit is `limit`
/// (bounded by [`WITHIN`]); how much passed.
async fn wait_for_limit(
    grpc: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    limit: Option<u32>,
) -> Duration {
    let started = Instant::now();
    while limit_in(grpc, domain).await != limit {
        assert!(
            started.elapsed() < WITHIN,
            "{domain}'s limit did not become {limit:?} within {WITHIN:?}\n{}",
            log()
        );
        pass(STEP).await;
    }
    started.elapsed()
}

/// `GET path` on the HTTP API: status and body.
async fn get(running: &Running, path: &str) -> (u16, String) {
    let response = client()
        .get(format!("http://{}{path}", running.http_addr()))
        .send()
        .await
        .expect("the HTTP API answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a text body"))
}

/// Lets virtual time pass in steps until `/readyz`'s body contains every
/// `needle` (bounded by [`WITHIN`]); the body.
async fn wait_for_readyz(running: &Running, needles: &[&str]) -> String {
    let started = Instant::now();
    loop {
        let (status, body) = get(running, "/readyz").await;
        assert_eq!(status, 200, "the last good config is in force: {body}");
        if needles.iter().all(|n| body.contains(n)) {
            return body;
        }
        assert!(
            started.elapsed() < WITHIN,
            "/readyz did not say {needles:?} within {WITHIN:?}: {body}\n{}",
            log()
        );
        pass(STEP).await;
    }
}

/// The value of the counter line that starts with `series` (0 when absent).
pub(crate) fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn a_changed_file_is_picked_up_after_the_watch_interval() {
    // Capture the log from start-up on.
    log();
    let (running, dir) = start(&[("a.yaml", &config(1))], &[]).await;
    let mut grpc = grpc_client(&running).await;
    assert_eq!(limit_in(&mut grpc, "reload").await, Some(1));

    write(&dir.path().join("a.yaml"), &config(5));
    assert_eq!(
        limit_in(&mut grpc, "reload").await,
        Some(1),
        "nothing is reloaded before the watcher looks"
    );
    let took = wait_for_limit(&mut grpc, "reload", Some(5)).await;
    // One poll sees the change, the next finds it held still and loads it:
    // one interval after the write, or two when the first poll to see it
    // comes after the write (the start-up poll races the write, as its
    // file reads run on tokio's blocking pool in real time).
    assert!(
        took >= RELOAD_POLL && took <= 2 * RELOAD_POLL + STEP,
        "picked up after {took:?}"
    );
    let (_, metrics) = get(&running, "/metrics").await;
    assert!(
        counter(
            &metrics,
            r#"tollgate_config_reloads_total{result="ok",trigger="watch"}"#
        ) >= 1,
        "{metrics}"
    );
    assert!(log().contains("config reloaded"), "{}", log());
    running.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(start_paused = true)]
async fn a_file_renamed_over_the_old_one_is_picked_up_and_a_new_file_read() {
    let (running, dir) = start(&[("a.yaml", &config(1))], &[]).await;
    let mut grpc = grpc_client(&running).await;
    // What many editors do: write a new file, then rename it over the old.
    write(&dir.path().join(".a.yaml.swp"), &config(7));
    std::fs::rename(dir.path().join(".a.yaml.swp"), dir.path().join("a.yaml")).expect("rename");
    wait_for_limit(&mut grpc, "reload", Some(7)).await;

    assert_eq!(limit_in(&mut grpc, "other").await, None);
    write(&dir.path().join("b.yml"), &config_of("other", 2));
    wait_for_limit(&mut grpc, "other", Some(2)).await;
    running.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(start_paused = true)]
async fn a_broken_file_is_reported_and_the_last_good_config_stays() {
    // Capture the log from start-up on.
    log();
    let (running, dir) = start(&[("a.yaml", &config(3))], &[]).await;
    let mut grpc = grpc_client(&running).await;
    let file = dir.path().join("a.yaml");
    write(&file, BROKEN);

    let at = format!("{}:", file.display());
    let body = wait_for_readyz(&running, &["last config reload failed", &at]).await;
    let line: u64 = body
        .split(&at)
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(line >= 4, "a line number is given: {body}");
    assert!(body.contains("fortnight"), "the reason is given: {body}");
    let logged = log();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("config reload failed") && l.contains(&at)),
        "{logged}"
    );
    assert_eq!(
        limit_in(&mut grpc, "reload").await,
        Some(3),
        "the last good config stays in force"
    );
    let (_, metrics) = get(&running, "/metrics").await;
    assert!(
        counter(
            &metrics,
            r#"tollgate_config_reloads_total{result="error",trigger="watch"}"#
        ) >= 1,
        "{metrics}"
    );

    // Fixed again: reloaded, and readiness no longer complains.
    write(&file, &config(4));
    wait_for_limit(&mut grpc, "reload", Some(4)).await;
    assert_eq!(get(&running, "/readyz").await, (200, "ready\n".to_owned()));
    running.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(start_paused = true)]
async fn an_emptied_directory_is_refused_and_keeps_the_old_limits() {
    // Capture the log from start-up on.
    log();
    let (running, dir) = start(&[("a.yaml", &config(3))], &[]).await;
    let mut grpc = grpc_client(&running).await;
    // A ConfigMap whose keys were removed, or the `rm` of an `rm; cp` deploy.
    std::fs::remove_file(dir.path().join("a.yaml")).expect("removable");
    wait_for_readyz(
        &running,
        &["last config reload refused", "defines no rules"],
    )
    .await;
    assert_eq!(
        limit_in(&mut grpc, "reload").await,
        Some(3),
        "still enforced"
    );
    // More polls of the same files are not more attempts.
    pass(4 * RELOAD_POLL).await;
    assert_eq!(get(&running, "/readyz").await.0, 200);
    let logged = log();
    let refusals: Vec<&str> = logged
        .lines()
        .filter(|l| {
            l.contains("config reload refused") && l.contains(&*dir.path().to_string_lossy())
        })
        .collect();
    assert_eq!(refusals.len(), 1, "refused once: {logged}");
    assert!(
        refusals[0].contains("ERROR") && refusals[0].contains("--allow-empty-config"),
        "the log says which flag allows it: {}",
        refusals[0]
    );

    // The deploy's copy lands: reloaded, and readiness no longer complains.
    write(&dir.path().join("a.yaml"), &config(6));
    wait_for_limit(&mut grpc, "reload", Some(6)).await;
    assert_eq!(get(&running, "/readyz").await, (200, "ready\n".to_owned()));
    running.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(start_paused = true)]
async fn removing_one_of_two_domains_is_refused_unless_allowed() {
    let files = [("a.yaml", config(3)), ("b.yaml", config_of("other", 2))];
    let files: Vec<(&str, &str)> = files.iter().map(|(n, c)| (*n, c.as_str())).collect();

    let (running, dir) = start(&files, &["--admin-token", ADMIN_TOKEN]).await;
    let mut grpc = grpc_client(&running).await;
    std::fs::remove_file(dir.path().join("b.yaml")).expect("removable");
    wait_for_readyz(
        &running,
        &[
            "last config reload refused",
            "drops domains in force: other",
        ],
    )
    .await;
    assert_eq!(
        limit_in(&mut grpc, "other").await,
        Some(2),
        "still enforced"
    );
    // On demand too: 409, with the domains it would drop.
    let response = client()
        .post(format!("http://{}/admin/reload", running.http_addr()))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("the admin API answers");
    assert_eq!(response.status(), 409);
    let body: serde_json::Value = response.json().await.expect("JSON");
    assert_eq!(body["refused"], true, "{body}");
    assert_eq!(body["removed_domains"], serde_json::json!(["other"]));
    let (_, metrics) = get(&running, "/metrics").await;
    assert!(
        counter(
            &metrics,
            r#"tollgate_config_reloads_total{result="refused",trigger="admin"}"#
        ) >= 1,
        "{metrics}"
    );
    assert_eq!(limit_in(&mut grpc, "other").await, Some(2));
    running.shutdown().await.expect("a clean shutdown");

    let (running, dir) = start(&files, &["--allow-domain-removal", "--allow-empty-config"]).await;
    let mut grpc = grpc_client(&running).await;
    std::fs::remove_file(dir.path().join("b.yaml")).expect("removable");
    wait_for_limit(&mut grpc, "other", None).await;
    assert_eq!(limit_in(&mut grpc, "reload").await, Some(3));
    std::fs::remove_file(dir.path().join("a.yaml")).expect("removable");
    wait_for_limit(&mut grpc, "reload", None).await;
    assert_eq!(get(&running, "/readyz").await, (200, "ready\n".to_owned()));
    running.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(start_paused = true)]
async fn an_empty_directory_allowed_at_start_up_loads_a_config_that_arrives_later() {
    // Capture the log from start-up on.
    log();
    let (running, dir) = start(&[], &["--allow-empty-config"]).await;
    let logged = log();
    assert!(
        logged.lines().any(|l| l.contains("WARN")
            && l.contains("the config has no rules")
            && l.contains(&*dir.path().to_string_lossy())),
        "{logged}"
    );
    let mut grpc = grpc_client(&running).await;
    assert_eq!(limit_in(&mut grpc, "reload").await, None);
    write(&dir.path().join("a.yaml"), &config(2));
    wait_for_limit(&mut grpc, "reload", Some(2)).await;
    running.shutdown().await.expect("a clean shutdown");
}

/// The addresses the handle gives are the listeners the test bound.
#[tokio::test(start_paused = true)]
async fn the_handle_reports_the_listeners_it_was_given() {
    let http = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let bound: (SocketAddr, SocketAddr) = (http.local_addr().unwrap(), grpc.local_addr().unwrap());
    let args = Args::parse_from(["--http", "127.0.0.1:1", "--grpc", "127.0.0.1:1"]).unwrap();
    let running = serve::start(
        args,
        Listeners { http, grpc },
        Arc::new(TokioClock::new(EPOCH)),
    )
    .await
    .expect("the service starts");
    assert_eq!((running.http_addr(), running.grpc_addr()), bound);
    assert_eq!(running.gateway_addr(), None, "no gateway asked for");
    assert_eq!(get(&running, "/healthz").await.0, 200);
    running.shutdown().await.expect("a clean shutdown");
}

// ---- listeners ----

/// Reads `stream` until the service closes it: what it sent, and the
/// virtual time that passed since `since`.
async fn until_closed(mut stream: TcpStream, since: Instant) -> (Vec<u8>, Duration) {
    let mut sent = Vec::new();
    // A reset is a close too.
    let _ = stream.read_to_end(&mut sent).await;
    (sent, since.elapsed())
}

/// HTTP/2's connection preface and an empty SETTINGS frame: a client that
/// then says nothing.
const H2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[tokio::test(start_paused = true)]
async fn silent_slow_and_idle_connections_are_closed_on_time() {
    let (running, _dir) = start(
        &[("a.yaml", &config(5))],
        &["--idle-timeout", "5s", "--header-read-timeout", "2s"],
    )
    .await;
    let started = Instant::now();
    let silent = TcpStream::connect(running.http_addr()).await.unwrap();
    let mut slow = TcpStream::connect(running.http_addr()).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut h2 = TcpStream::connect(running.grpc_addr()).await.unwrap();
    h2.write_all(H2_HELLO).await.unwrap();
    // A gRPC client that made one call and then went quiet.
    let mut grpc = grpc_client(&running).await;
    assert_eq!(limit_in(&mut grpc, "reload").await, Some(5));
    let used_at = Instant::now();

    let ((silent_sent, silent), (_, slow), (h2_sent, h2)) = tokio::join!(
        until_closed(silent, started),
        until_closed(slow, started),
        until_closed(h2, started),
    );
    let (idle, head) = (Duration::from_secs(5), Duration::from_secs(2));
    // No head began in time: closed as an unfinished one is.
    assert!(silent_sent.is_empty(), "closed without a word");
    assert!(silent >= head && silent < head + STEP, "{silent:?}");
    assert!(
        slow >= head && slow < head + STEP,
        "an unfinished head: {slow:?}"
    );
    // Asked to go away when idle; dropped 10 s later, since this client
    // never answers the PING that ends a graceful HTTP/2 close.
    let grace = Duration::from_secs(10);
    assert!(h2 >= idle + grace && h2 < idle + grace + STEP, "{h2:?}");
    // A GOAWAY frame (type 7) after the server's SETTINGS.
    assert!(
        h2_sent.windows(4).any(|w| w[3] == 7 && w[..3] == [0, 0, 8]),
        "{h2_sent:?}"
    );
    // The client that went quiet was closed too; its next call reconnects.
    assert!(used_at.elapsed() >= idle);
    assert_eq!(limit_in(&mut grpc, "reload").await, Some(5));
    running.shutdown().await.expect("a clean shutdown");
}

/// One request per client a minute, and room for one more in the queue.
const SLOW_TURN: &str = "
domain: gateway
rules:
  - name: shaped
    match: [{ key: remote_address }]
    algorithm: leaky-bucket-shaping
    limit: { requests: 1, per: 1m, burst: 2 }
";

/// A request held longer than the idle timeout is in flight, not idle: it
/// is answered, not cut.
#[tokio::test(start_paused = true)]
async fn a_request_held_past_the_idle_timeout_is_answered() {
    let (upstream, arrivals) = upstream().await;
    let (running, _dir) = start(
        &[("gateway.yaml", SLOW_TURN)],
        &["--proxy-listen", "127.0.0.1:0", "--upstream", &upstream],
    )
    .await;
    let base = format!("http://{}", running.gateway_addr().expect("a gateway"));
    let started = Instant::now();
    let http = client();
    let (first, second) = tokio::join!(
        http.get(format!("{base}/a")).send(),
        http.get(format!("{base}/b")).send()
    );
    assert_eq!(first.unwrap().status(), 200);
    assert_eq!(second.unwrap().status(), 200);
    let last = ["/a", "/b"]
        .iter()
        .filter_map(|path| arrival(&arrivals, path))
        .max()
        .expect("both reached the upstream");
    assert!(
        last - started >= Duration::from_secs(60),
        "held for its turn, a minute, twice the gateway's idle timeout"
    );
    running.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(start_paused = true)]
async fn a_full_listener_closes_new_connections_at_once_and_the_others_serve() {
    let (running, _dir) = start(&[("a.yaml", &config(5))], &["--max-connections", "2"]).await;
    let held = [
        TcpStream::connect(running.http_addr()).await.unwrap(),
        TcpStream::connect(running.http_addr()).await.unwrap(),
    ];
    let started = Instant::now();
    let third = TcpStream::connect(running.http_addr()).await.unwrap();
    let (sent, after) = until_closed(third, started).await;
    assert!(sent.is_empty());
    assert!(after < STEP, "closed at once, not when idle: {after:?}");
    // gRPC has a cap of its own.
    let mut grpc = grpc_client(&running).await;
    assert_eq!(limit_in(&mut grpc, "reload").await, Some(5));
    drop(held);
    let (status, metrics) = get(&running, "/metrics").await;
    assert_eq!(status, 200, "a place came free");
    assert_eq!(
        counter(
            &metrics,
            r#"tollgate_refused_connections_total{listener="http"}"#
        ),
        1,
        "{metrics}"
    );
    assert!(
        counter(&metrics, r#"tollgate_open_connections{listener="http"}"#) >= 1,
        "this request's own connection at least: {metrics}"
    );
    running.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(start_paused = true)]
async fn the_admin_listener_takes_the_admin_api_and_metrics_off_the_public_one() {
    let (running, _dir) = start(
        &[("a.yaml", &config(5))],
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--admin-token",
            ADMIN_TOKEN,
        ],
    )
    .await;
    let admin = running.admin_addr().expect("an admin listener");
    let public = running.http_addr();
    let http = client();
    let status = |address: SocketAddr, method: &'static str, path: &'static str| {
        let request = match method {
            "GET" => http.get(format!("http://{address}{path}")),
            _ => http
                .post(format!("http://{address}{path}"))
                .json(&serde_json::json!({"key": "k", "limit": 1, "period": "1s"})),
        };
        async move {
            request
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .expect("an answer")
                .status()
                .as_u16()
        }
    };
    for (address, expected) in [(public, 404), (admin, 200)] {
        assert_eq!(status(address, "GET", "/metrics").await, expected);
        assert_eq!(status(address, "GET", "/admin/kill-switch").await, expected);
    }
    for (address, expected) in [(public, 200), (admin, 404)] {
        assert_eq!(status(address, "POST", "/v1/check").await, expected);
    }
    for address in [public, admin] {
        assert_eq!(status(address, "GET", "/healthz").await, 200);
        assert_eq!(status(address, "GET", "/readyz").await, 200);
    }
    running.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(start_paused = true)]
async fn with_api_tokens_every_check_api_needs_one_of_them() {
    let (running, _dir) = start(
        &[("a.yaml", &config(5))],
        &["--api-token", "old", "--api-token", "new"],
    )
    .await;
    let http = client();
    let base = format!("http://{}", running.http_addr());
    let calls = [
        (
            "/v1/check",
            serde_json::json!({"key": "k", "limit": 1, "period": "1s"}),
        ),
        (
            "/json",
            serde_json::json!({"domain": "reload", "descriptors": [{"entries": [{"key": "user", "value": "u"}]}]}),
        ),
        ("/v1/release", serde_json::json!({"lease": "1:00:00"})),
    ];
    for (path, body) in &calls {
        for token in [None, Some("wrong")] {
            let mut request = http.post(format!("{base}{path}")).json(body);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 401, "{path} with {token:?}");
            assert_eq!(response.headers()["www-authenticate"], "Bearer");
        }
        for token in ["old", "new"] {
            let response = http
                .post(format!("{base}{path}"))
                .bearer_auth(token)
                .json(body)
                .send()
                .await
                .unwrap();
            assert_ne!(response.status(), 401, "{path} with {token}");
        }
    }
    assert_eq!(get(&running, "/healthz").await.0, 200, "probes stay open");

    let mut grpc = grpc_client(&running).await;
    let refused = grpc
        .should_rate_limit(rls_request("reload", &[&[("user", "u")]]))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut request = tonic::Request::new(rls_request("reload", &[&[("user", "u")]]));
    request
        .metadata_mut()
        .insert("authorization", "Bearer new".parse().unwrap());
    let answer = grpc.should_rate_limit(request).await.expect("with a token");
    assert_eq!(answer.into_inner().overall_code, 1);
    running.shutdown().await.expect("a clean shutdown");
}
