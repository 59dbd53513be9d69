//! Connections: one multiplexed connection to a server (redis-rs's
//! `ConnectionManager`, which reconnects by itself) or a cluster connection
//! (`cluster_async`, which follows MOVED/ASK and topology changes). Both
//! pipeline every concurrent call over a few sockets; they are cheap handles
//! that each check clones.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ClientTlsConfig, FromRedisValue, RedisResult, TlsCertificates};

use crate::config::RedisTls;

/// Why the store could not connect.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL is not one of `redis://host:port/db` or
    /// `redis+cluster://host:port,host:port` (or their `rediss` forms).
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

    /// Runs one command on the primary serving `slot` (on a cluster: for a
    /// command whose keys the client cannot find, such as the module's
    /// `TOLLGATE.CHECK`, which routes by its argument 1, the key count).
    pub(crate) async fn query_at<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        slot: u16,
    ) -> RedisResult<T> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let value = c
                    .clone()
                    .route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                    .await?;
                Ok(T::from_redis_value(value)?)
            }
        }
    }

    /// Runs a script (`EVALSHA`, loading it when Redis misses it), routed
    /// by its first key on a cluster.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        call: &redis::ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self {
            Conn::Single(c) => call.invoke_async(&mut c.clone()).await,
            Conn::Cluster(c) => call.invoke_async(&mut c.clone()).await,
        }
    }

    /// Runs a pipeline on the primary serving `slot`, answering each
    /// command's reply as Redis gave it, a refusal of one command
    /// ([`redis::Value::ServerError`]) beside the others' answers. On a
    /// cluster, its commands must all be on `slot`: the client sends the
    /// whole pipeline again where a refusal (`MOVED`, `ASK`) points, which
    /// would run again what the node did serve of other slots.
    pub(crate) async fn pipeline_at(
        &self,
        pipe: &redis::Pipeline,
        slot: u16,
    ) -> RedisResult<Vec<redis::Value>> {
        use redis::aio::ConnectionLike;
        use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Conn::Single(c) => c.clone().req_packed_commands(pipe, 0, pipe.len()).await,
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                c.clone()
                    .route_pipeline(pipe.clone(), 0, pipe.len(), route)
                    .await
            }
        }
    }
}

/// Connects to `redis://host:port/db` (one server) or
/// `redis+cluster://host:port,host:port,...` (a cluster, from any of its
/// nodes, optionally `redis+cluster://user:password@host:port,...`);
/// `rediss://` and `rediss+cluster://` are the same over TLS with `tls`.
pub(crate) async fn connect(url: &str, tls: &RedisTls) -> Result<Conn, ConnectError> {
    let invalid = |reason: &str| ConnectError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let cluster = [
        ("redis+cluster://", "redis"),
        ("rediss+cluster://", "rediss"),
    ]
    .into_iter()
    .find_map(|(prefix, node)| url.strip_prefix(prefix).map(|rest| (rest, node)));
    let secure = url.starts_with("rediss://") || url.starts_with("rediss+cluster://");
    if tls.is_set() && !secure {
        return Err(ConnectError::Config(
            "TLS settings are given but the URL is not rediss:// or rediss+cluster://".into(),
        ));
    }
    if let Some((rest, scheme)) = cluster {
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (Some(auth), hosts),
            None => (None, rest),
        };
        let hosts = hosts.trim_end_matches('/');
        let nodes: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| match auth {
                Some(auth) => format!("{scheme}://{auth}@{h}"),
                None => format!("{scheme}://{h}"),
            })
            .collect();
        if nodes.is_empty() {
            return Err(invalid("no cluster node given"));
        }
        // No response timeout: the client retries a call that timed out,
        // and a check that Redis ran once would run again (charged twice);
        // the store bounds its own wait instead. Retries stay for what Redis
        // refused without running (MOVED, ASK, TRYAGAIN, CLUSTERDOWN).
        let mut builder = ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(1))
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if secure {
            builder = builder
                .certs(certificates(tls))
                .danger_accept_invalid_hostnames(tls.skip_hostname_verification);
        }
        let client = builder.build()?;
        return Ok(Conn::Cluster(client.get_async_connection().await?));
    }
    if !url.starts_with("redis://") && !url.starts_with("unix://") && !secure {
        return Err(invalid(
            "expected redis://host:port/db, rediss://host:port/db, \
             redis+cluster://host:port,host:port or rediss+cluster://host:port,host:port",
        ));
    }
    let client = if secure {
        // `build_with_tls` sets the address's TLS parameters afresh, so the
        // hostname check is turned off on the address it returns.
        let client = redis::Client::build_with_tls(url, certificates(tls))?;
        let info = client.get_connection_info().clone();
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(tls.skip_hostname_verification);
        redis::Client::open(info.set_addr(addr))?
    } else {
        redis::Client::open(url)?
    };
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

/// The redis crate's form of `tls`'s PEM files.
fn certificates(tls: &RedisTls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls.client_identity.as_ref().map(|id| ClientTlsConfig {
            client_cert: id.cert.clone(),
            client_key: id.key.clone(),
        }),
        root_cert: tls.ca.clone(),
    }
}
