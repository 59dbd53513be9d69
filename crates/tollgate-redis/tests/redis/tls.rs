//! TLS to a real `redis-server` started with `--tls-port` (Debian's is built
//! with TLS): the store decides over `rediss://` with a test CA and a client
//! certificate, and refuses a server its CA did not sign.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tollgate_core::Store;
use tollgate_redis::{ClientIdentity, ConnectError, RedisConfig, RedisStore, RedisTls};
use tollgate_store::conformance;
use tollgate_testkit::pki::{Ca, Role};

use crate::support::{free_port, manual_store_with, wait_until};

/// A `redis-server` that speaks TLS only and requires client certificates
/// signed by its CA.
struct TlsRedis {
    port: u16,
    ca: Ca,
    client: ClientIdentity,
    dir: tempfile::TempDir,
    child: Child,
}

impl TlsRedis {
    /// Starts one whose certificate names `server_names`.
    fn start(server_names: &[&str]) -> TlsRedis {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::new("redis test CA");
        let (cert, key) = ca.issue_pem("server", server_names, Role::Server);
        let (client_cert, client_key) = ca.issue_pem("client", &[], Role::Client);
        let write = |name: &str, pem: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).expect("a writable temp dir");
            path
        };
        let files = [
            write("ca.pem", ca.pem()),
            write("server.pem", &cert),
            write("server.key", &key),
            write("client.pem", &client_cert),
            write("client.key", &client_key),
        ];
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-ca-cert-file")
            .arg(&files[0])
            .arg("--tls-cert-file")
            .arg(&files[1])
            .arg("--tls-key-file")
            .arg(&files[2])
            .args(["--tls-auth-clients", "yes"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        let server = TlsRedis {
            port,
            ca,
            client: ClientIdentity {
                cert: client_cert.into_bytes(),
                key: client_key.into_bytes(),
            },
            dir,
            child,
        };
        wait_until(
            "the TLS redis-server to answer PING",
            Duration::from_secs(10),
            || server.cli(&["PING"]).trim() == "PONG",
        );
        server
    }

    /// `redis-cli` over TLS with the client certificate.
    fn cli(&self, args: &[&str]) -> String {
        tls_cli(self.dir.path(), self.port, args)
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/0", self.port)
    }

    /// Its CA and the client certificate.
    fn tls(&self) -> RedisTls {
        RedisTls {
            ca: Some(self.ca.pem().as_bytes().to_vec()),
            client_identity: Some(self.client.clone()),
            skip_hostname_verification: false,
        }
    }
}

/// `redis-cli` to the TLS server on `port`, with the CA and the client
/// certificate that `dir` holds (`ca.pem`, `client.pem`, `client.key`).
fn tls_cli(dir: &std::path::Path, port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--tls"])
        .arg("--cacert")
        .arg(dir.join("ca.pem"))
        .arg("--cert")
        .arg(dir.join("client.pem"))
        .arg("--key")
        .arg(dir.join("client.key"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli (apt-get install redis-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn connect(url: &str, tls: RedisTls) -> Result<RedisStore, ConnectError> {
    RedisStore::connect(
        url,
        RedisConfig {
            timeout: Duration::from_secs(5),
            tls,
            ..RedisConfig::default()
        },
    )
    .await
}

#[tokio::test]
async fn the_store_decides_over_tls_with_a_client_certificate() {
    let server = TlsRedis::start(&["127.0.0.1"]);
    let clock = conformance::clock();
    let tls = server.tls();
    let redis = manual_store_with(&server.url(), &clock, |c| c.tls = tls).await;
    conformance::assert_reset_forgets(&redis, "single over TLS").await;
    // The decisions were this server's: the keys beside the reset ones are in it.
    let keys = server.cli(&["KEYS", "*kept-*"]);
    assert!(keys.contains("kept-"), "keys: {keys:?}");
    assert_eq!(redis.stats().errors, 0);
}

#[tokio::test]
async fn a_server_signed_by_another_ca_is_refused_at_connect() {
    let server = TlsRedis::start(&["127.0.0.1"]);
    let other = Ca::new("another CA");
    let tls = RedisTls {
        ca: Some(other.pem().as_bytes().to_vec()),
        ..server.tls()
    };
    let Err(err) = connect(&server.url(), tls).await else {
        panic!("refused");
    };
    assert!(matches!(err, ConnectError::Redis(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("cannot connect to Redis"), "{text}");
    assert!(text.to_ascii_lowercase().contains("certificate"), "{text}");
}

#[tokio::test]
async fn a_certificate_for_another_host_needs_the_hostname_check_skipped() {
    let server = TlsRedis::start(&["redis.example"]);
    let Err(err) = connect(&server.url(), server.tls()).await else {
        panic!("refused");
    };
    let text = err.to_string();
    assert!(text.to_ascii_lowercase().contains("certificate"), "{text}");
    let tls = RedisTls {
        skip_hostname_verification: true,
        ..server.tls()
    };
    let store = connect(&server.url(), tls)
        .await
        .expect("the chain is valid");
    assert!(store.ready().await);
}

#[tokio::test]
async fn a_server_that_requires_a_client_certificate_refuses_none() {
    let server = TlsRedis::start(&["127.0.0.1"]);
    let tls = RedisTls {
        client_identity: None,
        ..server.tls()
    };
    // The handshake may complete before the server checks the certificate,
    // so the refusal shows at connect or on the first command.
    match connect(&server.url(), tls).await {
        Err(err) => assert!(matches!(err, ConnectError::Redis(_)), "{err:?}"),
        Ok(store) => assert!(!store.ready().await),
    }
}

#[tokio::test]
async fn tls_settings_with_a_plain_url_are_refused() {
    let tls = RedisTls {
        ca: Some(b"unused".to_vec()),
        ..RedisTls::default()
    };
    let Err(err) = connect("redis://127.0.0.1:1/0", tls).await else {
        panic!("refused");
    };
    assert!(matches!(err, ConnectError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("rediss://"), "{err}");
}

#[tokio::test]
async fn an_unreadable_ca_is_a_connect_error() {
    let tls = RedisTls {
        ca: Some(b"not a certificate".to_vec()),
        ..RedisTls::default()
    };
    let Err(err) = connect("rediss://127.0.0.1:1/0", tls).await else {
        panic!("refused");
    };
    assert!(matches!(err, ConnectError::Redis(_)), "{err:?}");
}

/// A 3-master Redis Cluster speaking TLS only, clients and cluster bus alike,
/// requiring client certificates signed by its CA.
struct TlsCluster {
    ports: Vec<u16>,
    ca: Ca,
    client: ClientIdentity,
    dir: tempfile::TempDir,
    children: Vec<Child>,
}

impl TlsCluster {
    fn start() -> TlsCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::new("redis cluster test CA");
        // The node's certificate is also its client certificate on the
        // cluster bus: without ClientAuth, the peers refuse it and the
        // cluster never forms.
        let (cert, key) = ca.issue_pem("node", &["127.0.0.1"], Role::Peer);
        let (client_cert, client_key) = ca.issue_pem("client", &[], Role::Client);
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("node.pem", &cert),
            ("node.key", &key),
            ("client.pem", &client_cert),
            ("client.key", &client_key),
        ] {
            std::fs::write(dir.path().join(name), pem).expect("a writable temp dir");
        }
        let file = |name: &str| dir.path().join(name);
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let children = ports
            .iter()
            .map(|port| {
                let node = dir.path().join(port.to_string());
                std::fs::create_dir_all(&node).expect("a node dir");
                Command::new("redis-server")
                    .args(["--bind", "127.0.0.1", "--port", "0"])
                    .args(["--tls-port", &port.to_string()])
                    .arg("--tls-ca-cert-file")
                    .arg(file("ca.pem"))
                    .arg("--tls-cert-file")
                    .arg(file("node.pem"))
                    .arg("--tls-key-file")
                    .arg(file("node.key"))
                    .args(["--tls-auth-clients", "yes", "--tls-cluster", "yes"])
                    .args(["--cluster-enabled", "yes"])
                    .args(["--save", "", "--appendonly", "no"])
                    .arg("--dir")
                    .arg(&node)
                    .args(["--protected-mode", "no", "--loglevel", "warning"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server (apt-get install redis-server)")
            })
            .collect();
        let cluster = TlsCluster {
            ports,
            ca,
            client: ClientIdentity {
                cert: client_cert.into_bytes(),
                key: client_key.into_bytes(),
            },
            dir,
            children,
        };
        for port in &cluster.ports {
            wait_until(
                "a TLS cluster node to answer PING",
                Duration::from_secs(10),
                || cluster.cli(*port, &["PING"]).trim() == "PONG",
            );
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut create = vec!["--cluster", "create"];
        create.extend(nodes.iter().map(String::as_str));
        create.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        cluster.cli(cluster.ports[0], &create);
        wait_until(
            "the TLS cluster to be ok on every node",
            Duration::from_secs(20),
            || {
                cluster.ports.iter().all(|p| {
                    let info = cluster.cli(*p, &["CLUSTER", "INFO"]);
                    info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
                })
            },
        );
        cluster
    }

    /// `redis-cli` over TLS with the client certificate, to the node on `port`.
    fn cli(&self, port: u16, args: &[&str]) -> String {
        tls_cli(self.dir.path(), port, args)
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test]
async fn the_store_decides_over_a_tls_cluster() {
    let cluster = TlsCluster::start();
    let nodes: Vec<String> = cluster
        .ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!("rediss+cluster://{}", nodes.join(","));
    let tls = RedisTls {
        ca: Some(cluster.ca.pem().as_bytes().to_vec()),
        client_identity: Some(cluster.client.clone()),
        skip_hostname_verification: false,
    };
    let clock = conformance::clock();
    let redis = manual_store_with(&url, &clock, |c| c.tls = tls).await;
    assert!(redis.is_cluster());
    conformance::assert_reset_forgets(&redis, "cluster over TLS").await;
    let keys: usize = cluster
        .ports
        .iter()
        .map(|p| {
            cluster
                .cli(*p, &["DBSIZE"])
                .trim()
                .parse::<usize>()
                .unwrap_or(0)
        })
        .sum();
    assert!(keys > 0, "the decisions were the cluster's");
    assert_eq!(redis.stats().errors, 0);
}
