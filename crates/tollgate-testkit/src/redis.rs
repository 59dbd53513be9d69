use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::net::{free_port, wait_until};

const INSTALL: &str = "redis-server and redis-cli are needed: \
     install them with `apt-get install redis-server redis-tools` (./scripts/test does)";

/// How long a server may take to start on a busy two-core machine.
const START: Duration = Duration::from_secs(30);

/// `redis-cli -p port args...`, its output.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("redis-cli: {e}. {INSTALL}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One `redis-server` on a free loopback port, without persistence, in a
/// directory of its own; killed when dropped.
pub struct RedisServer {
    /// The port it listens on.
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A standalone server with `args` added to its command line
    /// (`["--requirepass", "secret"]`, `["--loadmodule", path]`).
    pub fn start_with(args: &[&str]) -> Self {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let dir = tmp.path().to_path_buf();
        Self::start_in(dir, Some(tmp), args)
    }

    fn start_in(dir: PathBuf, tmp: Option<tempfile::TempDir>, args: &[&str]) -> Self {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let password = args
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| args.get(i + 1).cloned());
        let mut server = Self {
            port: 0,
            dir,
            args,
            child: None,
            _tmp: tmp,
        };
        loop {
            server.port = free_port();
            server.spawn();
            // Between `free_port` and the bind, a test running beside this
            // one may take the port: this server then exits, and the one
            // that answers is the other's. Another port, then.
            let pid = server.child.as_ref().map_or(0, Child::id);
            if answers_as(server.port, pid, password.as_deref()) {
                return server;
            }
            server.kill();
        }
    }

    /// Starts the process on `self.port` and waits until it accepts
    /// connections or has exited.
    fn spawn(&mut self) {
        let mut child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server: {e}. {INSTALL}"));
        let deadline = Instant::now() + START;
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            // It could not bind (the port was taken and let go since).
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server at once (SIGKILL): its data is gone, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again, empty, on the same port, directory and command line
    /// (a cluster node comes back with its `nodes.conf`), as a restarted
    /// Redis without persistence comes back.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Whether it runs (it has not been killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `redis-cli` against this server, its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// The calls of `command` (in lower case) since the server's stats were
    /// last reset (`INFO commandstats`).
    pub fn command_calls(&self, command: &str) -> u64 {
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether the Redis server on `port` is process `pid` (its `INFO server`
/// says `process_id:<pid>`), logging in with `password` if it has one.
fn answers_as(port: u16, pid: u32, password: Option<&str>) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    // Pipelined: AUTH's reply comes first and has no `process_id`.
    let auth = password.map_or(String::new(), |p| format!("AUTH {p}\r\n"));
    if stream
        .write_all(format!("{auth}INFO server\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut reply = Vec::new();
    let mut chunk = [0; 4096];
    let wanted = format!("process_id:{pid}\r\n");
    loop {
        let text = String::from_utf8_lossy(&reply);
        if let Some(at) = text.find("process_id:")
            && text[at..].contains("\r\n")
        {
            return text[at..].starts_with(&wanted);
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A Redis Cluster of three masters on loopback, with or without a replica
/// each; its nodes killed when dropped.
pub struct RedisCluster {
    /// The nodes: the three masters first, then their replicas, if any.
    pub nodes: Vec<RedisServer>,
    _tmp: tempfile::TempDir,
}

impl RedisCluster {
    /// Three masters sharing the 16,384 slots, ready.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`RedisCluster::start`] with `args` added to each node's command line.
    pub fn start_with(args: &[&str]) -> Self {
        Self::create(args, 0)
    }

    /// Three masters and a replica of each (`nodes[3..]`), with `args`
    /// added to each node's command line, ready: a master killed is replaced
    /// by its replica within a few seconds (the cluster's node timeout is 2 s).
    pub fn with_replicas(args: &[&str]) -> Self {
        Self::create(args, 1)
    }

    fn create(args: &[&str], replicas: usize) -> Self {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let mut node_args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "2000",
            "--cluster-config-file",
            "nodes.conf",
        ];
        node_args.extend_from_slice(args);
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|i| {
                let dir = tmp.path().join(format!("node{i}"));
                std::fs::create_dir_all(&dir).expect("a writable temp dir");
                RedisServer::start_in(dir, None, &node_args)
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("redis-cli --cluster create: {e}. {INSTALL}"));
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes, _tmp: tmp };
        cluster.wait_ok(START);
        if replicas > 0 {
            wait_until("every replica to be in sync", START, || {
                cluster.nodes[3..].iter().all(|n| {
                    n.cli(&["INFO", "replication"])
                        .contains("master_link_status:up")
                })
            });
        }
        cluster
    }

    /// Waits until every running node says the cluster is ok and knows all
    /// nodes.
    pub fn wait_ok(&self, limit: Duration) {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        wait_until("the cluster to be ok on every node", limit, || {
            self.nodes.iter().filter(|n| n.is_running()).all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
                    && info.contains(&known)
                    && info.contains("cluster_slots_ok:16384")
            })
        });
    }

    /// The slots `node` serves as a master now, as `(first, last)` ranges
    /// (none for a replica), as the running nodes' `CLUSTER NODES` say.
    pub fn slots_of(&self, node: usize) -> Vec<(u16, u16)> {
        let port = format!("127.0.0.1:{}@", self.nodes[node].port);
        let Some(asker) = self.nodes.iter().find(|n| n.is_running()) else {
            return Vec::new();
        };
        let listing = asker.cli(&["CLUSTER", "NODES"]);
        let Some(line) = listing.lines().find(|l| l.contains(&port)) else {
            return Vec::new();
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields.get(2).is_some_and(|flags| flags.contains("master")) {
            return Vec::new();
        }
        fields
            .iter()
            .skip(8)
            .filter_map(|range| {
                let (first, last) = range.split_once('-').unwrap_or((range, range));
                Some((first.parse().ok()?, last.parse().ok()?))
            })
            .collect()
    }

    /// Gives `slot`, which must hold no key, to node `to`, telling every
    /// node at once (`CLUSTER SETSLOT <slot> NODE <id>`): clients that read
    /// the slot map before find it moved.
    pub fn move_slot(&self, slot: u16, to: usize) {
        let id = self.nodes[to].cli(&["CLUSTER", "MYID"]).trim().to_owned();
        for node in self.nodes.iter().rev() {
            let answer = node.cli(&["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &id]);
            assert_eq!(answer.trim(), "OK", "{answer}");
        }
    }

    /// The slot of a key (`CLUSTER KEYSLOT`, asked of a running node).
    pub fn keyslot(&self, key: &str) -> u16 {
        let asker = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node");
        let slot = asker.cli(&["CLUSTER", "KEYSLOT", key]);
        slot.trim()
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key}: {slot:?}"))
    }

    /// `redis+cluster://` with every node's address.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}
