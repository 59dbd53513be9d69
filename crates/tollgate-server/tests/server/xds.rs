//! The config over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`): the real binary, run
//! as envoyproxy/ratelimit's `ratelimit` on a real Redis, against an
//! Aggregated Discovery Service run by the test that serves
//! `RateLimitConfig` snapshots and records every request the client sends.
//!
//! The configs and the expected answers are envoyproxy/ratelimit's
//! (`test/integration/xds_sotw_integration_test.go`, whose
//! `testXdsProviderBasicConfig` and `testXdsProviderBasicConfigReload` run
//! `testBasicBaseConfig` and `testConfigReload` of `integration_test.go`).

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::pki::{Ca, Issued, Role};
use common::{Redis, Server, ratelimit, rls_request};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::{Message, Name};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// How long the client may take to send what a test waits for.
const WITHIN: Duration = Duration::from_secs(30);

const NODE: &str = "init-test-node";

/// A snapshot: its version and resources.
#[derive(Clone)]
struct Snapshot {
    version: String,
    resources: Vec<Any>,
}

/// A request the server received, on the `stream`-th stream, and the
/// `x-team` header of that stream.
#[derive(Debug)]
struct Seen {
    stream: usize,
    request: DiscoveryRequest,
    team: Option<String>,
}

/// The management server's state, shared by its streams.
#[derive(Clone)]
struct Ads {
    snapshot: watch::Receiver<Option<Snapshot>>,
    /// Changed to end every open stream with UNAVAILABLE.
    close: watch::Receiver<()>,
    seen: mpsc::UnboundedSender<Seen>,
    streams: Arc<AtomicUsize>,
    nonces: Arc<AtomicUsize>,
}

impl Ads {
    fn response(&self, snapshot: &Snapshot) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: snapshot.version.clone(),
            resources: snapshot.resources.clone(),
            type_url: RateLimitConfig::type_url(),
            nonce: format!("n{}", self.nonces.fetch_add(1, Ordering::SeqCst) + 1),
            ..DiscoveryResponse::default()
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let team = request
            .metadata()
            .get("x-team")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut incoming = request.into_inner();
        let stream = self.streams.fetch_add(1, Ordering::SeqCst) + 1;
        let (responses, outgoing) = mpsc::channel(4);
        let ads = self.clone();
        tokio::spawn(async move {
            let mut snapshot = ads.snapshot.clone();
            let mut close = ads.close.clone();
            let mut opened = false;
            loop {
                let next = tokio::select! {
                    request = incoming.message() => {
                        let Ok(Some(request)) = request else { return };
                        let first = !opened;
                        opened = true;
                        let _ = ads.seen.send(Seen { stream, request, team: team.clone() });
                        // As a snapshot cache answers a stream's first request.
                        if !first {
                            continue;
                        }
                        snapshot.borrow_and_update().clone()
                    }
                    changed = snapshot.changed(), if opened => {
                        if changed.is_err() {
                            return;
                        }
                        snapshot.borrow_and_update().clone()
                    }
                    _ = close.changed() => {
                        let _ = responses.send(Err(Status::unavailable("the xDS server restarts"))).await;
                        return;
                    }
                };
                if let Some(next) = next
                    && responses.send(Ok(ads.response(&next))).await.is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(outgoing)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// The management server, on a loopback port, and what it was sent.
struct XdsServer {
    addr: SocketAddr,
    snapshot: watch::Sender<Option<Snapshot>>,
    close: watch::Sender<()>,
    seen: mpsc::UnboundedReceiver<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl XdsServer {
    /// Starts it on `addr` (port 0 for a free one) with `snapshot`, over
    /// `tls` when given.
    async fn start(
        addr: SocketAddr,
        snapshot: Option<Snapshot>,
        tls: Option<ServerTlsConfig>,
    ) -> XdsServer {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("bound");
        let (snapshot, receiver) = watch::channel(snapshot);
        let (close, closed) = watch::channel(());
        let (sender, seen) = mpsc::unbounded_channel();
        let ads = Ads {
            snapshot: receiver,
            close: closed,
            seen: sender,
            streams: Arc::default(),
            nonces: Arc::default(),
        };
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let task = tokio::spawn(async move {
            let mut builder = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                builder = builder.tls_config(tls).expect("a TLS config");
            }
            builder
                .add_service(AggregatedDiscoveryServiceServer::new(ads))
                .serve_with_incoming(incoming)
                .await
                .expect("the xDS server serves");
        });
        XdsServer {
            addr,
            snapshot,
            close,
            seen,
            task,
        }
    }

    /// Serves `snapshot` from now on; open streams get it at once.
    fn set(&self, version: &str, configs: &[RateLimitConfig]) {
        let resources = configs
            .iter()
            .map(|config| Any {
                type_url: RateLimitConfig::type_url(),
                value: config.encode_to_vec(),
            })
            .collect();
        self.snapshot.send_replace(Some(Snapshot {
            version: version.to_owned(),
            resources,
        }));
    }

    /// The next request the client sends (bounded).
    async fn next(&mut self) -> Seen {
        tokio::time::timeout(WITHIN, self.seen.recv())
            .await
            .expect("the client sends a request in time")
            .expect("the server runs")
    }

    /// Ends every stream and stops listening, as a restart does.
    async fn stop(self) -> SocketAddr {
        self.close.send_replace(());
        self.task.abort();
        let _ = self.task.await;
        self.addr
    }
}

fn per(key: &str, unit: RateLimitUnit, requests_per_unit: u32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.to_owned(),
        rate_limit: Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..RateLimitPolicy::default()
        }),
        ..RateLimitDescriptor::default()
    }
}

fn config(name: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: name.to_owned(),
        domain: name.to_owned(),
        descriptors,
    }
}

/// `initialXdsBasicConfig` of xds_sotw_integration_test.go.
fn initial() -> Vec<RateLimitConfig> {
    use RateLimitUnit::{Day, Hour, Minute, Second};
    vec![
        config(
            "basic",
            vec![
                per("key1", Second, 50),
                per("key1_local", Second, 50),
                per("one_per_minute", Minute, 1),
            ],
        ),
        config(
            "another",
            vec![
                per("key2", Minute, 20),
                per("key3", Hour, 10),
                per("key2_local", Minute, 20),
                per("key3_local", Hour, 10),
                per("key4", Day, 20),
                per("key4_local", Day, 20),
            ],
        ),
    ]
}

/// `newConfigWithXdsConfigProvider`: the initial config and domain `reload`.
fn with_reload() -> Vec<RateLimitConfig> {
    use RateLimitUnit::{Minute, Second};
    let mut configs = initial();
    configs.push(config(
        "reload",
        vec![
            per("key1", Second, 50),
            per("block", Second, 0),
            per("one_per_minute", Minute, 1),
        ],
    ));
    configs
}

/// `ratelimit` with `CONFIG_TYPE=GRPC_XDS_SOTW` against `xds`, on `redis`,
/// with the variables `more`.
fn start(redis: &Redis, xds: SocketAddr, bin: &std::path::Path, more: &[(&str, &str)]) -> Server {
    let redis_url = redis.url();
    let mut command = ratelimit(bin);
    command.envs([
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_PORT", "0"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        (
            "REDIS_URL",
            redis_url.strip_prefix("redis://").expect("a redis:// URL"),
        ),
        // Tollgate's own 10 ms would let a loaded machine's slow answer be
        // decided locally while Redis still counts it: one request counted
        // twice, which the exact counts below would see.
        ("REDIS_TIMEOUT", "10s"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_NODE_ID", NODE),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=test"),
        ("CONFIG_GRPC_XDS_SERVER_URL", &xds.to_string()),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-team:rl"),
        ("LOG_LEVEL", "info"),
    ]);
    command.envs(more.iter().copied());
    Server::spawn(command, &[], None)
}

/// `/healthcheck`'s status.
async fn healthcheck(server: &Server) -> u16 {
    reqwest::get(server.url("/healthcheck"))
        .await
        .expect("answers")
        .status()
        .as_u16()
}

async fn check(
    server: &Server,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> RateLimitResponse {
    server
        .grpc_client()
        .await
        .should_rate_limit(rls_request(domain, descriptors))
        .await
        .expect("ShouldRateLimit answers")
        .into_inner()
}

/// A status's code, limit and remaining count (the reset time is left out,
/// as envoyproxy/ratelimit's tests take it from the answer).
fn status(s: &DescriptorStatus) -> (Code, Option<(u32, Unit)>, u32) {
    let limit = s
        .current_limit
        .as_ref()
        .map(|l| (l.requests_per_unit, l.unit()));
    (s.code(), limit, s.limit_remaining)
}

/// The requests counted so far in a fixed window of one limit, to tell the
/// status each request should get. envoyproxy/ratelimit's windows are
/// aligned to the unit, so a run may cross into a new one: the answer's
/// reset time then jumps up, and the count starts over.
#[derive(Default)]
struct Window {
    used: u32,
    reset: Option<Duration>,
}

impl Window {
    /// Counts one more request, answered with `status`, against `limit`;
    /// the code, limit and remaining count it should have.
    fn charge(
        &mut self,
        answered: &DescriptorStatus,
        limit: (u32, Unit),
    ) -> (Code, Option<(u32, Unit)>, u32) {
        let reset = answered
            .duration_until_reset
            .map(|d| Duration::new(d.seconds as u64, d.nanos as u32))
            .expect("a limited status has a reset time");
        if self.reset.is_some_and(|before| reset > before) {
            self.used = 0;
        }
        self.reset = Some(reset);
        self.used += 1;
        match limit.0.checked_sub(self.used) {
            Some(remaining) => (Code::Ok, Some(limit), remaining),
            None => (Code::OverLimit, Some(limit), 0),
        }
    }
}

/// `OK` with no limit: what an unknown domain or key gets.
const NO_LIMIT: (Code, Option<(u32, Unit)>, u32) = (Code::Ok, None, 0);

/// Waits for the client's answer to the response of `version`: an ACK
/// (its version) or a NACK (the version before it and an error).
async fn answer(xds: &mut XdsServer) -> Seen {
    loop {
        let seen = xds.next().await;
        if !seen.request.response_nonce.is_empty() {
            return seen;
        }
    }
}

#[tokio::test]
async fn config_over_xds_is_followed_acked_and_nacked() {
    let redis = Redis::start();
    let bin = tempfile::tempdir().expect("a temp dir");
    let mut xds = XdsServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), None, None).await;
    let server = start(&redis, xds.addr, bin.path(), &[]);

    // Before any config: listening and nothing is limited, but unhealthy,
    // as envoyproxy/ratelimit without FORCE_START_WITHOUT_INITIAL_CONFIG
    // is not serving.
    let first = xds.next().await;
    assert_eq!(first.stream, 1);
    assert_eq!(first.team.as_deref(), Some("rl"));
    let request = &first.request;
    assert_eq!(
        request.type_url,
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );
    assert_eq!(
        (
            request.version_info.as_str(),
            request.response_nonce.as_str()
        ),
        ("", "")
    );
    let node = request.node.as_ref().expect("a node");
    assert_eq!(node.id, NODE);
    let zone = &node.metadata.as_ref().expect("metadata").fields["zone"];
    assert_eq!(
        zone.kind,
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
            "test".into()
        ))
    );
    assert_eq!(healthcheck(&server).await, 500);
    let answer_before = check(&server, "basic", &[&[("key1", "foo")]]).await;
    assert_eq!(answer_before.overall_code(), Code::Ok);
    assert_eq!(status(&answer_before.statuses[0]), NO_LIMIT);

    // testXdsProviderBasicConfig (testBasicBaseConfig).
    xds.set("1", &initial());
    let ack = answer(&mut xds).await;
    assert_eq!(ack.request.version_info, "1");
    assert_eq!(ack.request.response_nonce, "n1");
    assert_eq!(ack.request.error_detail, None);
    assert_eq!(healthcheck(&server).await, 200, "a config is loaded");

    let unknown = check(&server, "foo", &[&[("hello", "world")]]).await;
    assert_eq!(unknown.overall_code(), Code::Ok);
    assert_eq!(status(&unknown.statuses[0]), NO_LIMIT);

    let basic = check(&server, "basic", &[&[("key1", "foo")]]).await;
    assert_eq!(basic.overall_code(), Code::Ok);
    assert_eq!(
        status(&basic.statuses[0]),
        (Code::Ok, Some((50, Unit::Second)), 49)
    );

    let key2_limit = (20, Unit::Minute);
    let mut key2 = Window::default();
    for i in 0..25 {
        let answer = check(&server, "another", &[&[("key2", "8273")]]).await;
        let expected = key2.charge(&answer.statuses[0], key2_limit);
        assert_eq!(status(&answer.statuses[0]), expected, "request {i}");
        assert_eq!(answer.overall_code(), expected.0, "request {i}");
    }

    let (mut pair2, mut pair3) = (Window::default(), Window::default());
    for i in 0..15 {
        let answer = check(
            &server,
            "another",
            &[&[("key2", "5120")], &[("key3", "5120")]],
        )
        .await;
        let key3 = pair3.charge(&answer.statuses[1], (10, Unit::Hour));
        assert_eq!(status(&answer.statuses[1]), key3, "request {i}");
        assert_eq!(answer.overall_code(), key3.0, "request {i}");
        let key2 = status(&answer.statuses[0]);
        assert_eq!(
            (key2.0, key2.1),
            (Code::Ok, Some(key2_limit)),
            "request {i}"
        );
        // Past key3's limit, whether key2 is still charged is the counting
        // mode's business (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), not
        // the config's.
        if key3.0 == Code::Ok {
            assert_eq!(
                key2,
                pair2.charge(&answer.statuses[0], key2_limit),
                "request {i}"
            );
        }
    }

    // testXdsProviderBasicConfigReload (testConfigReload).
    let block = check(&server, "reload", &[&[("block", "foo")]]).await;
    assert_eq!(status(&block.statuses[0]), NO_LIMIT);
    xds.set("2", &with_reload());
    let ack = answer(&mut xds).await;
    assert_eq!(
        (
            ack.request.version_info.as_str(),
            ack.request.error_detail.is_none()
        ),
        ("2", true)
    );
    let reloaded = check(&server, "reload", &[&[("key1", "foo")]]).await;
    assert_eq!(
        status(&reloaded.statuses[0]),
        (Code::Ok, Some((50, Unit::Second)), 49)
    );
    let debug = server
        .log()
        .lines()
        .find_map(|line| common::address_after(line, "listening for debug on "))
        .expect("a debug listener");
    let dump = reqwest::get(format!("http://127.0.0.1:{}/rlconfig", debug.port()))
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    assert!(
        dump.contains("reload.block: unit=SECOND requests_per_unit=0, shadow_mode: false\n"),
        "/rlconfig shows the config in force: {dump}"
    );
    let blocked = check(&server, "reload", &[&[("block", "foo")]]).await;
    assert_eq!(blocked.overall_code(), Code::OverLimit);
    assert_eq!(
        status(&blocked.statuses[0]),
        (Code::OverLimit, Some((0, Unit::Second)), 0)
    );

    // restoreConfigWithXdsConfigProvider: the domain goes, as the
    // snapshot says, with no safeguard in the way.
    xds.set("3", &initial());
    let ack = answer(&mut xds).await;
    assert_eq!(
        (
            ack.request.version_info.as_str(),
            ack.request.error_detail.is_none()
        ),
        ("3", true)
    );
    let gone = check(&server, "reload", &[&[("key1", "foo")]]).await;
    assert_eq!(status(&gone.statuses[0]), NO_LIMIT);

    // A config envoyproxy/ratelimit's loader refuses (a rate limit without
    // a unit: `invalid rate limit unit`) is NACKed; the last good one stays.
    let mut bad = initial();
    bad[1].descriptors[0] = per("key2", RateLimitUnit::Unknown, 5);
    xds.set("4", &bad);
    let nack = answer(&mut xds).await;
    assert_eq!(nack.request.version_info, "3", "the version last accepted");
    assert_eq!(nack.request.response_nonce, "n4");
    let detail = nack.request.error_detail.expect("a NACK").message;
    assert!(detail.contains("xds:another"), "{detail}");
    assert!(
        detail.contains("descriptors[0].rate_limit.unit"),
        "{detail}"
    );
    assert!(
        detail.contains("invalid rate limit unit \"UNKNOWN\""),
        "{detail}"
    );
    let kept = check(&server, "another", &[&[("key2", "8273")]]).await;
    assert_eq!(
        status(&kept.statuses[0]),
        key2.charge(&kept.statuses[0], key2_limit),
        "the old limit and its count stay"
    );
    assert!(
        server
            .wait_for_log(&["config reload failed", "xds:another"], WITHIN)
            .await,
        "{}",
        server.log()
    );
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(r#"tollgate_config_reloads_total{result="error",trigger="xds"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_client_reconnects_after_the_server_restarts() {
    let redis = Redis::start();
    let bin = tempfile::tempdir().expect("a temp dir");
    let mut xds = XdsServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), None, None).await;
    xds.set("1", &initial());
    let server = start(&redis, xds.addr, bin.path(), &[]);
    let ack = answer(&mut xds).await;
    assert_eq!((ack.stream, ack.request.version_info.as_str()), (1, "1"));
    let one_per_minute = (1, Unit::Minute);
    let mut window = Window::default();
    let one = check(&server, "basic", &[&[("one_per_minute", "a")]]).await;
    assert_eq!(
        status(&one.statuses[0]),
        window.charge(&one.statuses[0], one_per_minute)
    );

    let addr = xds.stop().await;
    assert!(
        server
            .wait_for_log(&["xDS stream ended, reconnecting"], WITHIN)
            .await,
        "{}",
        server.log()
    );
    let still = check(&server, "basic", &[&[("one_per_minute", "a")]]).await;
    assert_eq!(
        status(&still.statuses[0]),
        window.charge(&still.statuses[0], one_per_minute),
        "the config stays in force"
    );

    let mut xds = XdsServer::start(addr, None, None).await;
    let reopened = xds.next().await;
    assert_eq!(reopened.stream, 1, "a new server's first stream");
    assert_eq!(
        reopened.request.version_info, "1",
        "the client says which version it holds"
    );
    let mut next = initial();
    next[0].descriptors[2] = per("one_per_minute", RateLimitUnit::Minute, 3);
    xds.set("2", &next);
    let ack = answer(&mut xds).await;
    assert_eq!(ack.request.version_info, "2");
    let three = check(&server, "basic", &[&[("one_per_minute", "b")]]).await;
    assert_eq!(
        status(&three.statuses[0]),
        (Code::Ok, Some((3, Unit::Minute)), 2)
    );
}

#[tokio::test]
async fn health_follows_force_start_and_healthy_with_a_config() {
    let redis = Redis::start();
    let bin = tempfile::tempdir().expect("a temp dir");
    let mut xds = XdsServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), None, None).await;

    // FORCE_START_WITHOUT_INITIAL_CONFIG: serving, healthy, before a config.
    let forced = [("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")];
    let server = start(&redis, xds.addr, bin.path(), &forced);
    assert_eq!(xds.next().await.request.version_info, "");
    assert_eq!(healthcheck(&server).await, 200);
    drop(server);

    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: healthy while the config in
    // force has a domain (envoyproxy/ratelimit's `SetConfig`).
    let with_config = [
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
    ];
    let server = start(&redis, xds.addr, bin.path(), &with_config);
    let opened = xds.next().await;
    assert_eq!(opened.stream, 2);
    assert_eq!(healthcheck(&server).await, 500, "no config yet");
    xds.set("1", &initial());
    let ack = answer(&mut xds).await;
    assert_eq!((ack.stream, ack.request.version_info.as_str()), (2, "1"));
    assert_eq!(healthcheck(&server).await, 200);
    xds.set("2", &[]);
    let ack = answer(&mut xds).await;
    assert_eq!(
        (ack.request.version_info.as_str(), ack.request.error_detail),
        ("2", None),
        "an empty snapshot is put in force"
    );
    assert_eq!(healthcheck(&server).await, 500, "no domain");
}

/// The xDS server's TLS: `identity`, and client certificates required and
/// verified against `clients`.
fn server_tls(identity: &Issued, clients: &Ca) -> ServerTlsConfig {
    let (cert, key) = identity.pem();
    ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .client_ca_root(Certificate::from_pem(clients.pem()))
}

/// The client's TLS variables: its certificate `client`, the server's CA
/// file `ca` and the name `xds.test`, which the server's certificate must
/// carry (the URL names 127.0.0.1).
fn client_tls<'a>(client: &'a Issued, ca: &'a std::path::Path) -> [(&'a str, &'a str); 5] {
    let path = |p: &'a std::path::Path| p.to_str().expect("UTF-8");
    [
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", path(&client.cert)),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", path(&client.key)),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", path(ca)),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.test"),
    ]
}

#[tokio::test]
async fn the_client_speaks_mutual_tls_to_the_server() {
    let redis = Redis::start();
    let bin = tempfile::tempdir().expect("a temp dir");
    let pki = tempfile::tempdir().expect("a temp dir");
    let ca = Ca::new("xDS CA");
    let server_cert = ca.issue(pki.path(), "xds", &["xds.test"], Role::Server);
    let client = ca.issue(pki.path(), "ratelimit", &["ratelimit.test"], Role::Client);
    let ca_file = ca.write(pki.path(), "ca.pem");
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut xds = XdsServer::start(addr, None, Some(server_tls(&server_cert, &ca))).await;
    xds.set("1", &initial());
    let server = start(&redis, xds.addr, bin.path(), &client_tls(&client, &ca_file));
    let ack = answer(&mut xds).await;
    assert_eq!(
        (ack.request.version_info.as_str(), ack.request.error_detail),
        ("1", None)
    );
    let answer = check(&server, "basic", &[&[("key1", "a")]]).await;
    assert_eq!(
        status(&answer.statuses[0]),
        (Code::Ok, Some((50, Unit::Second)), 49),
        "the config came over TLS"
    );
}

#[tokio::test]
async fn a_server_certificate_of_another_ca_is_refused_and_retried() {
    let redis = Redis::start();
    let bin = tempfile::tempdir().expect("a temp dir");
    let pki = tempfile::tempdir().expect("a temp dir");
    let ca = Ca::new("xDS CA");
    let client = ca.issue(pki.path(), "ratelimit", &["ratelimit.test"], Role::Client);
    let ca_file = ca.write(pki.path(), "ca.pem");
    let impostor_ca = Ca::new("another CA");
    let impostor = impostor_ca.issue(pki.path(), "impostor", &["xds.test"], Role::Server);
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut xds = XdsServer::start(addr, None, Some(server_tls(&impostor, &ca))).await;
    xds.set("1", &initial());
    let server = start(&redis, xds.addr, bin.path(), &client_tls(&client, &ca_file));
    let retried = server
        .wait_until(WITHIN, |log| {
            log.lines()
                .filter(|line| line.contains("xDS stream ended, reconnecting"))
                .filter(|line| line.contains("UnknownIssuer"))
                .count()
                >= 2
        })
        .await;
    assert!(retried, "{}", server.log());
    assert!(
        xds.seen.try_recv().is_err(),
        "the impostor heard no request"
    );
}
