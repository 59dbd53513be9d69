//! The Redis servers a run measures: one `redis-server`, or a Redis Cluster of
//! three masters (no replicas), from `tollgate-testkit` as the tests' are,
//! with the modules to load when they are measured.

use std::path::{Path, PathBuf};

use redis::aio::MultiplexedConnection;
use tollgate_testkit::{RedisCluster, RedisServer};

/// One server or a 3-master cluster, with a direct connection to each master
/// for `INFO`, `CONFIG RESETSTAT` and `MEMORY USAGE`.
pub(crate) enum Deployment {
    Single(RedisServer),
    Cluster(RedisCluster),
}

/// The modules measured: redis-cell's and Tollgate's, each when built.
#[derive(Default)]
pub(crate) struct Modules {
    pub(crate) cell: Option<PathBuf>,
    pub(crate) tollgate: Option<PathBuf>,
}

/// Each node's command line: `DEBUG POPULATE` fills the large cells'
/// keyspaces (main.rs); the modules measured are loaded, Tollgate's without
/// its `CL.THROTTLE` when redis-cell's is there (one name, one module).
fn args(modules: &Modules) -> Vec<&str> {
    fn path(p: &Path) -> &str {
        p.to_str().expect("a UTF-8 module path")
    }
    let mut args = vec!["--enable-debug-command", "local"];
    if let Some(cell) = &modules.cell {
        args.extend(["--loadmodule", path(cell)]);
    }
    if let Some(tollgate) = &modules.tollgate {
        args.extend(["--loadmodule", path(tollgate)]);
        if modules.cell.is_some() {
            args.push("without-cl-throttle");
        }
    }
    args
}

impl Deployment {
    /// One `redis-server`.
    pub(crate) fn single(modules: &Modules) -> Self {
        Self::Single(RedisServer::start_with(&args(modules)))
    }

    /// Three masters with every slot assigned, once each says the cluster is ok.
    pub(crate) fn cluster(modules: &Modules) -> Self {
        Self::Cluster(RedisCluster::start_with(&args(modules)))
    }

    fn nodes(&self) -> &[RedisServer] {
        match self {
            Self::Single(server) => std::slice::from_ref(server),
            Self::Cluster(cluster) => &cluster.nodes,
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    pub(crate) fn masters(&self) -> usize {
        self.nodes().len()
    }

    /// The URL `RedisStore::connect` takes.
    pub(crate) fn store_url(&self) -> String {
        match self {
            Self::Single(server) => server.url(),
            Self::Cluster(cluster) => cluster.url(),
        }
    }

    /// Each master's own URL.
    pub(crate) fn node_urls(&self) -> Vec<String> {
        self.nodes().iter().map(RedisServer::url).collect()
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
