//! The Redis servers a run measures: one `redis-server`, or a Redis Cluster of
//! three masters (no replicas), on free loopback ports in temporary
//! directories, killed when dropped. The same approach as the tests'
//! (`tests/redis/support.rs`), plus the module to load.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

const INSTALL: &str =
    "redis-server and redis-cli on the PATH (apt-get install redis-server redis-tools)";

/// A free loopback port whose cluster bus port (+10000) is free too.
fn free_port() -> u16 {
    for _ in 0..100 {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = l.local_addr().unwrap().port();
        if port < 55_000 && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair found");
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("redis-cli: {e}; {INSTALL}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `redis-server` process.
struct Node {
    port: u16,
    child: Child,
}

impl Node {
    fn start(dir: &Path, cluster: bool, module: Option<&Path>) -> Self {
        let port = free_port();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            // `DEBUG POPULATE` fills the large cells' keyspaces (main.rs).
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"]);
        }
        if let Some(module) = module {
            cmd.arg("--loadmodule").arg(module);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server: {e}; {INSTALL}"));
        let mut node = Self { port, child };
        wait_until("redis-server to answer PING", || {
            assert!(
                node.child.try_wait().unwrap().is_none(),
                "redis-server exited at start (a module that does not load?)"
            );
            cli(port, &["PING"]).trim() == "PONG"
        });
        node
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One server or a 3-master cluster, with a direct connection to each master
/// for `INFO`, `CONFIG RESETSTAT` and `MEMORY USAGE`.
pub(crate) struct Deployment {
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl Deployment {
    /// One `redis-server`.
    pub(crate) fn single(module: Option<&Path>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(dir.path(), false, module);
        Self {
            nodes: vec![node],
            _dir: dir,
        }
    }

    /// Three masters with every slot assigned, once each says the cluster is ok.
    pub(crate) fn cluster(module: Option<&Path>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<Node> = (0..3)
            .map(|i| {
                let d: PathBuf = dir.path().join(format!("node{i}"));
                std::fs::create_dir_all(&d).unwrap();
                Node::start(&d, true, module)
            })
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("redis-cli --cluster create: {e}; {INSTALL}"));
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        wait_until("the cluster to be ok on every node", || {
            nodes.iter().all(|n| {
                let info = cli(n.port, &["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            })
        });
        Self { nodes, _dir: dir }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.nodes.len() > 1
    }

    pub(crate) fn masters(&self) -> usize {
        self.nodes.len()
    }

    /// The URL `RedisStore::connect` takes.
    pub(crate) fn store_url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        if self.is_cluster() {
            format!("redis+cluster://{}", hosts.join(","))
        } else {
            format!("redis://{}/0", hosts[0])
        }
    }

    /// Each master's own URL.
    pub(crate) fn node_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// A direct connection to each master.
    pub(crate) async fn admin(&self) -> Vec<MultiplexedConnection> {
        let mut conns = Vec::new();
        for url in self.node_urls() {
            let client = redis::Client::open(url).unwrap();
            // No response timeout: filling a large cell's keyspace
            // (`DEBUG POPULATE`) takes seconds.
            let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
            conns.push(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .unwrap(),
            );
        }
        conns
    }
}
