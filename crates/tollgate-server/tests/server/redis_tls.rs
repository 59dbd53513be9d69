//! TLS to Redis: the real binary as envoyproxy/ratelimit's `ratelimit` with
//! `REDIS_TLS=true` and its `REDIS_TLS_*` files, and `tollgate serve --redis
//! rediss://...`, against a real `redis-server` that serves TLS (and requires
//! client certificates) on its TLS port; certificates made by the test's CAs.

use crate::common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::pki::{Ca, Issued, Role};
use common::{Redis, Server, exit_of, free_port, ratelimit, rls_request, tollgate};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const CONFIG: &str = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n";

/// A Redis serving TLS on `tls_port` (its plain port is for the test's own
/// look at the keys), its CA, and a client certificate it accepts.
struct TlsRedis {
    redis: Redis,
    tls_port: u16,
    ca: PathBuf,
    client: Issued,
    dir: tempfile::TempDir,
}

impl TlsRedis {
    fn start() -> TlsRedis {
        let dir = tempfile::tempdir().expect("a temp dir");
        let ca = Ca::new("Redis CA");
        let server = ca.issue(dir.path(), "redis", &["127.0.0.1"], Role::Server);
        let client = ca.issue(dir.path(), "client", &[], Role::Client);
        let ca_file = ca.write(dir.path(), "ca.pem");
        let tls_port = free_port();
        let path = |p: &Path| p.to_str().expect("UTF-8").to_owned();
        let redis = Redis::start_with(&[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &path(&server.cert),
            "--tls-key-file",
            &path(&server.key),
            "--tls-ca-cert-file",
            &path(&ca_file),
            "--tls-auth-clients",
            "yes",
        ]);
        TlsRedis {
            redis,
            tls_port,
            ca: ca_file,
            client,
            dir,
        }
    }

    /// How many keys the server holds, asked on its plain port.
    fn dbsize(&self) -> u64 {
        let port = self
            .redis
            .url()
            .rsplit(':')
            .next()
            .expect("a port")
            .to_owned();
        let mut stream = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("plain");
        stream.write_all(b"DBSIZE\r\n").expect("written");
        let mut reply = [0; 64];
        let n = stream.read(&mut reply).expect("a reply");
        let text = String::from_utf8_lossy(&reply[..n]);
        text.trim()
            .trim_start_matches(':')
            .parse()
            .expect("an integer reply")
    }
}

/// `ratelimit` with envoyproxy/ratelimit's Redis TLS variables `tls`.
fn ratelimit_on(redis: &TlsRedis, tls: &[(&str, &PathBuf)]) -> Command {
    let config = redis.dir.path().join("runtime").join("config");
    std::fs::create_dir_all(&config).expect("writable");
    std::fs::write(config.join("config.yaml"), CONFIG).expect("writable");
    let mut command = ratelimit(redis.dir.path());
    command.envs([
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_PORT", "0"),
        (
            "RUNTIME_ROOT",
            redis.dir.path().join("runtime").to_str().expect("UTF-8"),
        ),
        ("RUNTIME_SUBDIRECTORY", ""),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &format!("127.0.0.1:{}", redis.tls_port)),
        ("REDIS_TIMEOUT", "10s"),
        ("REDIS_TLS", "true"),
        // The listeners' lines, which the test waits for, are INFO.
        ("LOG_LEVEL", "info"),
    ]);
    command.envs(tls.iter().map(|(k, v)| (*k, v.as_os_str())));
    command
}

#[tokio::test]
async fn redis_tls_with_the_cert_variables_counts_in_redis() {
    let redis = TlsRedis::start();
    let command = ratelimit_on(
        &redis,
        &[
            ("REDIS_TLS_CACERT", &redis.ca),
            ("REDIS_TLS_CLIENT_CERT", &redis.client.cert),
            ("REDIS_TLS_CLIENT_KEY", &redis.client.key),
        ],
    );
    let server = Server::spawn(command, &[], None);
    assert_eq!(redis.dbsize(), 0);
    let mut client = server.grpc_client().await;
    for remaining in [4, 3] {
        let answer = client
            .should_rate_limit(rls_request("shop", &[&[("user", "ann")]]))
            .await
            .expect("ShouldRateLimit answers")
            .into_inner();
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
    }
    assert_eq!(redis.dbsize(), 1, "counted in Redis, over TLS");
}

#[tokio::test]
async fn tollgate_serve_speaks_tls_to_a_rediss_url() {
    let redis = TlsRedis::start();
    let path = |p: &Path| p.to_str().expect("UTF-8").to_owned();
    let url = format!("rediss://127.0.0.1:{}", redis.tls_port);
    let (ca, cert, key) = (
        path(&redis.ca),
        path(&redis.client.cert),
        path(&redis.client.key),
    );
    let server = Server::with_config(
        &[("shop.yaml", CONFIG)],
        &[
            "--redis",
            &url,
            "--redis-timeout",
            "10s",
            "--redis-tls-ca",
            &ca,
            "--redis-tls-cert",
            &cert,
            "--redis-tls-key",
            &key,
        ],
    );
    let answer = server
        .grpc_client()
        .await
        .should_rate_limit(rls_request("shop", &[&[("user", "bo")]]))
        .await
        .expect("ShouldRateLimit answers")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(redis.dbsize(), 1, "counted in Redis, over TLS");
}

#[test]
fn a_redis_signed_by_another_ca_or_a_bad_file_stops_the_start() {
    let redis = TlsRedis::start();
    let other = Ca::new("another CA").write(redis.dir.path(), "other-ca.pem");
    let missing = redis.dir.path().join("missing.pem");
    let not_pem = redis.dir.path().join("notes.txt");
    std::fs::write(&not_pem, "not a certificate").expect("writable");
    let cert = redis.client.cert.clone();
    let key = redis.client.key.clone();
    for (vars, needles) in [
        (
            vec![
                ("REDIS_TLS_CACERT", &other),
                ("REDIS_TLS_CLIENT_CERT", &cert),
                ("REDIS_TLS_CLIENT_KEY", &key),
            ],
            vec![
                "cannot connect to Redis".to_owned(),
                "certificate".to_owned(),
            ],
        ),
        (
            vec![("REDIS_TLS_CACERT", &missing)],
            vec![format!(
                "REDIS_TLS_CACERT: cannot read {}",
                missing.display()
            )],
        ),
        (
            vec![
                ("REDIS_TLS_CACERT", &redis.ca),
                ("REDIS_TLS_CLIENT_CERT", &cert),
                ("REDIS_TLS_CLIENT_KEY", &not_pem),
            ],
            vec![format!(
                "REDIS_TLS_CLIENT_KEY: {}: no PEM private key",
                not_pem.display()
            )],
        ),
        (
            vec![
                ("REDIS_TLS_CACERT", &redis.ca),
                ("REDIS_TLS_CLIENT_CERT", &cert),
            ],
            vec!["REDIS_TLS_CLIENT_CERT: a client certificate to Redis needs both".to_owned()],
        ),
    ] {
        let (status, stderr) = exit_of(ratelimit_on(&redis, &vars));
        assert!(!status.success(), "{vars:?} started");
        for needle in needles {
            assert!(stderr.contains(&needle), "{needle}: {stderr}");
        }
    }
    // tollgate serve names its flag.
    let mut command = tollgate();
    command.args([
        "serve",
        "--redis",
        &format!("rediss://127.0.0.1:{}", redis.tls_port),
        "--redis-tls-ca",
        missing.to_str().expect("UTF-8"),
    ]);
    let (status, stderr) = exit_of(command);
    assert!(!status.success());
    assert!(stderr.contains("--redis-tls-ca: cannot read"), "{stderr}");
}
