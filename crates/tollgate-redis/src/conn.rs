//! Connections: one multiplexed connection to a server (redis-rs's
//! `ConnectionManager`, which reconnects by itself) or a cluster connection
//! (`cluster_async`, which follows MOVED/ASK and topology changes). Both
//! pipeline every concurrent call over a few sockets; they are cheap handles
//! that each check clones.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, RedisResult, ScriptInvocation};

/// Why the store could not connect.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL is not one of `redis://host:port/db` or `redis+cluster://host:port,host:port`.
    #[error("invalid Redis URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Redis refused or could not be reached.
    #[error("cannot connect to Redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A setting is invalid.
    #[error("invalid Redis store setting: {0}")]
    Config(String),
}

#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// Runs a script with EVALSHA, loading it on NOSCRIPT (a fresh server,
    /// a failover, `SCRIPT FLUSH`) and retrying once.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self {
            Conn::Single(c) => invocation.invoke_async(&mut c.clone()).await,
            Conn::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
    }
}

impl Conn {
    /// `PING`: whether the server (or, for a cluster, the node the client
    /// routes it to) answers.
    pub(crate) async fn ping(&self) -> RedisResult<()> {
        self.query(&redis::cmd("PING")).await
    }

    /// Runs one command (routed by its first key on a cluster).
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

/// Connects to `redis://host:port/db` (one server; `rediss` is not built in)
/// or `redis+cluster://host:port,host:port,...` (a cluster, from any of its
/// nodes, optionally `redis+cluster://user:password@host:port,...`).
pub(crate) async fn connect(url: &str) -> Result<Conn, ConnectError> {
    let invalid = |reason: &str| ConnectError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    if let Some(rest) = url.strip_prefix("redis+cluster://") {
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (Some(auth), hosts),
            None => (None, rest),
        };
        let hosts = hosts.trim_end_matches('/');
        let nodes: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| match auth {
                Some(auth) => format!("redis://{auth}@{h}"),
                None => format!("redis://{h}"),
            })
            .collect();
        if nodes.is_empty() {
            return Err(invalid("no cluster node given"));
        }
        let client = ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200)
            .build()?;
        return Ok(Conn::Cluster(client.get_async_connection().await?));
    }
    if !url.starts_with("redis://") && !url.starts_with("unix://") {
        return Err(invalid(
            "expected redis://host:port/db or redis+cluster://host:port,host:port",
        ));
    }
    let client = redis::Client::open(url)?;
    // Reconnects quickly and briefly: the store's own timeout and breaker
    // decide how long to wait for Redis, not the connection's retries.
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100))
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(None);
    Ok(Conn::Single(
        ConnectionManager::new_with_config(client, config).await?,
    ))
}
