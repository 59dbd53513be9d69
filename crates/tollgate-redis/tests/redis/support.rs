//! Real Redis servers for the tests: a single `redis-server` or a 3-master
//! Redis Cluster on free loopback ports, in temporary directories, killed when
//! their guard drops. No mocks: a missing `redis-server` fails the test with a
//! message saying how to install it (`./scripts/test` does).

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{Algorithm, ManualClock};
use tollgate_redis::{RedisConfig, RedisStore, TimeSource};
use tollgate_store::conformance::{Scenario, scenarios};

const INSTALL: &str = "redis-server and redis-cli are needed by the Redis tests: \
     install them with `apt-get install redis-server redis-tools` (./scripts/test does)";

fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "{binary} not found. {INSTALL}");
}

/// A free loopback port whose cluster bus port (+10000) is free too.
pub(crate) fn free_port() -> u16 {
    for _ in 0..100 {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = l.local_addr().unwrap().port();
        if port < 55_000 && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair found");
}

/// Polls `f` every 20 ms until it holds, for at most `limit`.
pub(crate) fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis-cli -p port args...`, its output.
pub(crate) fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("redis-cli: {e}. {INSTALL}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One `redis-server` process.
pub(crate) struct RedisServer {
    pub(crate) port: u16,
    dir: PathBuf,
    cluster: bool,
    child: Option<Child>,
    _tmp: Option<tempfile::TempDir>,
}

impl RedisServer {
    /// Starts a standalone server.
    pub(crate) fn start() -> Self {
        Self::start_in(None, free_port(), false)
    }

    fn start_in(dir: Option<&Path>, port: u16, cluster: bool) -> Self {
        require("redis-server");
        require("redis-cli");
        let (tmp, dir) = match dir {
            Some(d) => (None, d.to_path_buf()),
            None => {
                let t = tempfile::tempdir().expect("temp dir");
                let d = t.path().to_path_buf();
                (Some(t), d)
            }
        };
        let mut server = Self {
            port,
            dir,
            cluster,
            child: None,
            _tmp: tmp,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--cluster-config-file", "nodes.conf"]);
        }
        self.child = Some(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("redis-server: {e}. {INSTALL}")),
        );
        let port = self.port;
        wait_until(
            "redis-server to answer PING",
            Duration::from_secs(10),
            || cli(port, &["PING"]).trim() == "PONG",
        );
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Kills the server at once (SIGKILL): its data is gone, as in a crash.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory.
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub(crate) fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of three masters (no replicas) on loopback.
pub(crate) struct RedisCluster {
    pub(crate) nodes: Vec<RedisServer>,
    _tmp: tempfile::TempDir,
}

impl RedisCluster {
    pub(crate) fn start() -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let nodes: Vec<RedisServer> = (0..3)
            .map(|i| {
                let dir = tmp.path().join(format!("node{i}"));
                std::fs::create_dir_all(&dir).unwrap();
                RedisServer::start_in(Some(&dir), free_port(), true)
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
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
        cluster.wait_ok(Duration::from_secs(20));
        cluster
    }

    /// Waits until every live node says the cluster is ok and knows all masters.
    pub(crate) fn wait_ok(&self, limit: Duration) {
        wait_until("the cluster to be ok on every node", limit, || {
            self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
                    && info.contains("cluster_known_nodes:3")
                    && info.contains("cluster_slots_ok:16384")
            })
        });
    }

    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}

/// The conformance scenarios as the Redis store is held to them. In Redis a
/// fixed window's or hit counter's state is a count per window, which a
/// check alone updates with a blind `INCRBY` (no script), so a request
/// counts in the window of its own time; the memory store stays in the
/// window of the latest time it saw. The two agree while the clock never
/// goes back, so scenarios with those algorithms run on such a clock
/// (their setting back is pinned by `native.rs`); every other scenario runs
/// as it is.
pub(crate) fn redis_scenarios() -> Vec<Scenario> {
    scenarios()
        .into_iter()
        .map(|scenario| {
            let counted = scenario.limits.iter().any(|(_, _, algorithm)| {
                matches!(algorithm, Algorithm::FixedWindow | Algorithm::HitCounter)
            });
            if counted {
                scenario.monotonic()
            } else {
                scenario
            }
        })
        .collect()
}

/// A store on `url` with an injected manual clock, a timeout long enough that a
/// busy test machine never times out, and TTLs padded so keys never expire in
/// real time under the manual clock.
pub(crate) async fn manual_store(url: &str, clock: &Arc<ManualClock>) -> RedisStore {
    manual_store_with(url, clock, |_| {}).await
}

pub(crate) async fn manual_store_with(
    url: &str,
    clock: &Arc<ManualClock>,
    tweak: impl FnOnce(&mut RedisConfig),
) -> RedisStore {
    let mut config = RedisConfig {
        time: TimeSource::Clock(Arc::clone(clock) as _),
        timeout: Duration::from_secs(5),
        extra_ttl: Duration::from_secs(600),
        ..RedisConfig::default()
    };
    tweak(&mut config);
    RedisStore::connect(url, config)
        .await
        .expect("connect to the test Redis")
}

/// The `FCALL`s a server ran since its stats were last reset.
pub(crate) fn fcalls(server: &RedisServer) -> usize {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Concurrent checks share calls (batches; on a cluster, across the slots
/// of a node), with every algorithm in one call: string states read before
/// anything is checked, beside sliding logs' and concurrency limiters' two
/// keys, several requests on one key, leases with their own ids. On a frozen
/// clock, each key admits exactly its capacity however its checks were
/// batched, as the memory store does; every lease taken is released, after
/// which the limiters admit their capacity again. `calls` counts the calls
/// Redis ran (since its stats were reset): fewer than the checks.
pub(crate) async fn batched_checks_decide_as_alone(url: &str, calls: impl Fn() -> usize) {
    use std::collections::{BTreeMap, HashSet};
    use tollgate_core::{Algorithm, FailurePolicy, Lease, Limit, Quota};

    let clock = tollgate_store::conformance::clock();
    let store = Arc::new(manual_store(url, &clock).await);
    let quota = Quota::per_hour(6).unwrap();
    let limit = |key: &str, algorithm, cost| Limit {
        key: key.to_owned().leak(),
        quota,
        algorithm,
        cost,
        failure: FailurePolicy::Local,
    };
    let algorithms: Vec<Algorithm> = Algorithm::RATE
        .into_iter()
        .chain([Algorithm::Concurrency])
        .collect();
    const KEYS: usize = 4;
    const TRIES: usize = 10;
    let tasks: Vec<_> = (0..TRIES)
        .flat_map(|_| algorithms.iter().copied())
        .flat_map(|algorithm| (0..KEYS).map(move |k| (algorithm, k)))
        .map(|(algorithm, k)| {
            let store = Arc::clone(&store);
            let limit = limit(&format!("batched-{algorithm}-{k}"), algorithm, 1);
            tokio::spawn(async move { (algorithm, k, store.check_limits(&[limit]).await) })
        })
        .collect();
    let mut admitted = BTreeMap::new();
    let mut leases: Vec<Lease> = Vec::new();
    for task in tasks {
        let (algorithm, k, outcome) = task.await.unwrap();
        let outcome = outcome.unwrap_or_else(|e| panic!("{algorithm} key {k}: {e}"));
        *admitted.entry((algorithm.to_string(), k)).or_insert(0) += usize::from(outcome.allowed());
        leases.extend(outcome.leases);
    }
    for ((algorithm, k), n) in &admitted {
        assert_eq!(*n, 6, "{algorithm} key {k} admitted {n}");
    }
    let checks = TRIES * algorithms.len() * KEYS;
    let calls = calls();
    assert!(
        calls < checks,
        "{calls} calls for {checks} checks: no batch"
    );
    assert_eq!(leases.len(), 6 * KEYS, "one lease per admitted permit");
    let ids: HashSet<_> = leases.iter().map(|l| l.id.to_string()).collect();
    assert_eq!(ids.len(), leases.len(), "lease ids are distinct");
    store.release_leases(&leases).await.unwrap();
    for k in 0..KEYS {
        let slots = limit(
            &format!("batched-{}-{k}", Algorithm::Concurrency),
            Algorithm::Concurrency,
            0,
        );
        let read = store.check_limits(&[slots]).await.unwrap();
        assert_eq!(
            read.decisions[0].remaining(),
            6,
            "key {k}: every lease came back"
        );
    }
    let stats = store.stats();
    assert_eq!((stats.errors, stats.timeouts), (0, 0), "{stats:?}");
}
