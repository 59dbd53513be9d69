//! gRPC over TLS: the real binary as envoyproxy/ratelimit's `ratelimit`
//! with `GRPC_SERVER_USE_TLS` and mutual TLS (`GRPC_CLIENT_TLS_CACERT`,
//! `GRPC_CLIENT_TLS_SAN`), as Envoy Gateway runs it, and `tollgate serve
//! --grpc-tls-cert`; certificates made by the test's own CAs.

use crate::common;

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::pki::{Ca, Issued, Role};
use common::{Redis, Server, ratelimit, rls_request, tollgate};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The client certificate's name, as Envoy Gateway's would carry it.
const CLIENT_SAN: &str = "envoy-gateway.example";

/// How long a refused connection may take to be closed.
const WITHIN: Duration = Duration::from_secs(30);

const CONFIG: &str = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n";

/// `ratelimit` serving gRPC over TLS with the certificates of `dir`, on
/// `redis`, with the variables `more` and the flags `flags`.
fn start(redis: &Redis, dir: &Path, more: &[(&str, &Path)], flags: &[&str]) -> Server {
    let config = dir.join("runtime").join("config");
    std::fs::create_dir_all(&config).expect("writable");
    std::fs::write(config.join("config.yaml"), CONFIG).expect("writable");
    let redis_url = redis.url();
    let mut command = ratelimit(dir);
    command.envs([
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_PORT", "0"),
        ("RUNTIME_ROOT", dir.join("runtime").to_str().expect("UTF-8")),
        ("RUNTIME_SUBDIRECTORY", ""),
        ("REDIS_SOCKET_TYPE", "tcp"),
        (
            "REDIS_URL",
            redis_url.strip_prefix("redis://").expect("a redis:// URL"),
        ),
        ("REDIS_TIMEOUT", "10s"),
        // The refused handshakes are logged at DEBUG.
        ("LOG_LEVEL", "debug"),
        ("GRPC_SERVER_USE_TLS", "true"),
    ]);
    command.envs(more.iter().map(|(k, v)| (*k, v.as_os_str())));
    Server::spawn(command, flags, None)
}

/// A TLS client of `server`'s gRPC trusting `ca`, with `identity`.
async fn client(
    server: SocketAddr,
    ca: &Ca,
    identity: Option<&Issued>,
) -> Result<RateLimitServiceClient<tonic::transport::Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    if let Some(identity) = identity {
        let (cert, key) = identity.pem();
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Endpoint::from_shared(format!("https://{server}"))
        .expect("an address")
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(RateLimitServiceClient::new(channel))
}

/// `ShouldRateLimit` for user `ann` over TLS, or why it failed.
async fn check(
    server: SocketAddr,
    ca: &Ca,
    identity: Option<&Issued>,
) -> Result<RateLimitResponse, String> {
    let mut client = client(server, ca, identity)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    client
        .should_rate_limit(rls_request("shop", &[&[("user", "ann")]]))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("{status:?}"))
}

/// `tollgate_tls_handshake_errors_total` of the gRPC listener.
async fn handshake_errors(server: &Server) -> u64 {
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    metrics
        .lines()
        .find(|line| line.starts_with(r#"tollgate_tls_handshake_errors_total{listener="grpc"}"#))
        .and_then(|line| line.rsplit(' ').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

/// Waits (bounded) for the peer to close `stream` without a byte from it.
async fn closed_by_peer(mut stream: std::net::TcpStream) -> bool {
    tokio::task::spawn_blocking(move || {
        stream.set_read_timeout(Some(WITHIN)).expect("a timeout");
        let mut buf = [0; 64];
        matches!(stream.read(&mut buf), Ok(0))
    })
    .await
    .expect("the read does not panic")
}

#[tokio::test]
async fn mutual_tls_answers_verified_clients_only() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = Ca::new("clients and server CA");
    let server_cert = ca.issue(
        dir.path(),
        "server",
        &["localhost", "127.0.0.1"],
        Role::Server,
    );
    let envoy = ca.issue(dir.path(), "envoy", &[CLIENT_SAN], Role::Client);
    let other_name = ca.issue(
        dir.path(),
        "other-name",
        &["intruder.example"],
        Role::Client,
    );
    let stranger_ca = Ca::new("another CA");
    let stranger = stranger_ca.issue(dir.path(), "stranger", &[CLIENT_SAN], Role::Client);
    let ca_file = ca.write(dir.path(), "ca.pem");
    let server = start(
        &redis,
        dir.path(),
        &[
            ("GRPC_SERVER_TLS_CERT", &server_cert.cert),
            ("GRPC_SERVER_TLS_KEY", &server_cert.key),
            ("GRPC_CLIENT_TLS_CACERT", &ca_file),
            ("GRPC_CLIENT_TLS_SAN", Path::new(CLIENT_SAN)),
        ],
        &[],
    );

    let answer = check(server.grpc, &ca, Some(&envoy))
        .await
        .expect("a verified client is answered");
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    assert_eq!(handshake_errors(&server).await, 0);

    // A refused client may be tried more than once by tonic's channel:
    // each refusal is waited for by its reason.
    let refused = [
        ("no client certificate", None, "peer sent no certificates"),
        (
            "a certificate of another CA",
            Some(&stranger),
            "invalid peer certificate: UnknownIssuer",
        ),
        (
            "a certificate without GRPC_CLIENT_TLS_SAN",
            Some(&other_name),
            "certificate not valid for name \"envoy-gateway.example\"",
        ),
    ];
    for (what, identity, reason) in refused {
        let refused = check(server.grpc, &ca, identity).await;
        assert!(refused.is_err(), "{what}: answered {refused:?}");
        let logged = server
            .wait_for_log(&["TLS handshake failed", reason], WITHIN)
            .await;
        assert!(logged, "{what}: {reason}\n{}", server.log());
    }

    let plain = RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await;
    let answered = match plain {
        Ok(mut plain) => plain
            .should_rate_limit(rls_request("shop", &[&[("user", "ann")]]))
            .await
            .is_ok(),
        Err(_) => false,
    };
    assert!(!answered, "plain-text gRPC is refused");
    let logged = server
        .wait_for_log(&["TLS handshake failed", "InvalidContentType"], WITHIN)
        .await;
    assert!(logged, "plain text\n{}", server.log());
    let failures = server.log().matches("TLS handshake failed").count();
    assert!(failures >= 4, "{failures}");
    assert_eq!(
        handshake_errors(&server).await,
        failures as u64,
        "each counted"
    );

    let again = check(server.grpc, &ca, Some(&envoy))
        .await
        .expect("answered");
    assert_eq!(again.statuses[0].limit_remaining, 3, "counted once each");
}

#[tokio::test]
async fn a_stalled_handshake_gives_its_slot_back() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = Ca::new("server CA");
    let server_cert = ca.issue(dir.path(), "server", &["localhost"], Role::Server);
    let server = start(
        &redis,
        dir.path(),
        &[
            ("GRPC_SERVER_TLS_CERT", &server_cert.cert),
            ("GRPC_SERVER_TLS_KEY", &server_cert.key),
        ],
        &["--max-connections", "1", "--header-read-timeout", "200ms"],
    );
    // The only slot, held by a connection that never says hello.
    let stalled = std::net::TcpStream::connect(server.grpc).expect("accepted");
    assert!(
        closed_by_peer(stalled).await,
        "closed at the header-read timeout"
    );
    assert_eq!(handshake_errors(&server).await, 1);
    let answer = check(server.grpc, &ca, None)
        .await
        .expect("the slot is free again; no client certificate is asked for");
    assert_eq!(answer.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn serve_takes_the_tls_flags() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = Ca::new("CA");
    let server_cert = ca.issue(dir.path(), "server", &["localhost"], Role::Server);
    let client_cert = ca.issue(dir.path(), "client", &["client.example"], Role::Client);
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).expect("writable");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let path = |p: &Path| p.to_str().expect("UTF-8").to_owned();
    let (cert, key, ca_path, config) = (
        path(&server_cert.cert),
        path(&server_cert.key),
        path(&ca_file),
        path(&config),
    );
    let server = Server::spawn(
        tollgate(),
        &[
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--config",
            &config,
            "--grpc-tls-cert",
            &cert,
            "--grpc-tls-key",
            &key,
            "--grpc-client-ca",
            &ca_path,
        ],
        None,
    );
    let answer = check(server.grpc, &ca, Some(&client_cert))
        .await
        .expect("answered");
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    assert!(check(server.grpc, &ca, None).await.is_err(), "mutual TLS");
}
