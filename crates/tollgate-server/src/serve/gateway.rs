//! The gateway: `tollgate serve --proxy-listen ADDR --upstream URL`.
//!
//! A reverse proxy in front of one upstream, made of `tollgate_http`'s
//! [`RateLimitLayer`] around a [`Proxy`]: each request's descriptors come
//! from the configured actions (Envoy's `rate_limits`; without any, one
//! descriptor `remote_address=<client IP>`), the layer checks them against
//! the service's policy, kill switch and store (shared with the gRPC and HTTP
//! APIs, so reloads and budgets are one), answers a deny with `429` and a
//! JSON body, holds a shaped request for its delay, and puts the rate limit
//! headers on every response; the proxy forwards what is admitted and streams
//! the answer back.
//!
//! The client side is hyper's HTTP/1.1 server with its limits set
//! explicitly (see the constants). A request with both `Content-Length` and
//! `Transfer-Encoding` is read by its chunked coding, without the length, and
//! its connection closed after the answer (RFC 9112 §6.3, hyper's parser), so
//! nothing smuggled after the body is read as a request. It runs on one
//! worker thread per CPU ([`workers`]). See `docs/gateway.md`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tollgate_core::Store;
use tollgate_http::{
    ClientIpConfig, ClientIpKey, PolicyHandle, RateLimit, RateLimitLayer, ResponseBody,
};
use tollgate_policy::{ConfigError, Policy};
use tower_layer::Layer;
use tower_service::Service;

mod actions;
mod config;
mod pool;
mod proxy;
mod routes;

use super::metrics::{self, Api, CheckResult};
use super::service::{RateLimiter, Shared};
use actions::RateLimitSpec;
use config::{Cidr, GatewayFile};
use proxy::{Proxy, ProxyBody, Upstream};
use routes::Routes;

/// The most bytes a request's start line and headers may take (`431` beyond).
pub(crate) const MAX_HEADER_SIZE: usize = 32 * 1024;
/// The largest read buffer of a connection.
pub(crate) const MAX_BUF_SIZE: usize = 64 * 1024;
/// How long a client may take to send a request's headers, and so how long
/// an idle keep-alive connection stays open (hyper starts the timer when it
/// waits for the next request's head).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections waiting to be accepted, per worker.
const LISTEN_BACKLOG: u32 = 1024;
/// How long to wait before accepting again after `accept` failed (e.g. out
/// of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// The domain the gateway checks requests in unless told otherwise.
const DEFAULT_DOMAIN: &str = "gateway";
/// IPv6 clients are keyed by their network of this many bits unless told otherwise.
const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Options of the gateway, part of `tollgate serve`'s. A flag (or its
/// environment variable) overrides the `--gateway-config` file's field.
#[derive(Debug, clap::Args)]
#[group(id = "gateway")]
pub(crate) struct Args {
    /// Runs the gateway: a reverse proxy listening on ADDR that checks every
    /// request against the policy and forwards admitted ones to --upstream
    /// (port 0 picks a free port; the log says which).
    #[arg(long, env = "TOLLGATE_PROXY_LISTEN", value_name = "ADDR")]
    proxy_listen: Option<String>,

    /// The gateway's upstream: http://host:port, optionally with a base path.
    #[arg(long, env = "TOLLGATE_UPSTREAM", value_name = "URL")]
    upstream: Option<Upstream>,

    /// The policy domain the gateway checks requests in [default: gateway].
    #[arg(long, env = "TOLLGATE_PROXY_DOMAIN", value_name = "DOMAIN")]
    proxy_domain: Option<String>,

    /// A proxy in front of the gateway (an address or a CIDR network) whose
    /// X-Forwarded-For is believed; repeat for several (the environment
    /// variable takes a comma-separated list).
    #[arg(
        long = "trusted-proxy",
        env = "TOLLGATE_TRUSTED_PROXIES",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    trusted_proxies: Vec<Cidr>,

    /// Keys IPv6 clients by their network of this many bits [default: 64].
    #[arg(
        long,
        env = "TOLLGATE_IPV6_PREFIX",
        value_name = "BITS",
        value_parser = clap::value_parser!(u8).range(0..=128)
    )]
    ipv6_prefix: Option<u8>,

    /// The gateway's YAML config: the `rate_limits` actions that make each
    /// request's descriptors (Envoy's), route templates, and any of the
    /// options above. Read once at start.
    #[arg(long, env = "TOLLGATE_GATEWAY_CONFIG", value_name = "PATH")]
    gateway_config: Option<PathBuf>,
}

/// Why the gateway's options do not make a gateway.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SettingsError {
    /// The config file cannot be used.
    #[error("gateway config does not validate: {0}")]
    Config(#[from] ConfigError),
    /// An upstream or a config file, but nowhere to listen.
    #[error(
        "the gateway has no address: give --proxy-listen (or `listen` in the gateway config) with --upstream"
    )]
    NoListen,
    /// An address, but nowhere to forward.
    #[error("the gateway has no upstream: give --upstream (or `upstream` in the gateway config)")]
    NoUpstream,
    /// An empty domain, which no rule can be in.
    #[error("the gateway's domain cannot be empty")]
    EmptyDomain,
}

/// The gateway's settings: the flags over the config file over the defaults.
#[derive(Debug)]
struct Settings {
    listen: String,
    upstream: Upstream,
    domain: String,
    client_ip: ClientIpConfig,
    routes: Arc<Routes>,
    rate_limits: Vec<RateLimitSpec>,
}

impl Settings {
    /// The settings, or `None` when the gateway is not asked for.
    fn resolve(args: Args) -> Result<Option<Self>, SettingsError> {
        let file = match &args.gateway_config {
            Some(path) => GatewayFile::load(path)?,
            None => GatewayFile::default(),
        };
        let upstream = args.upstream.or(file.upstream);
        let Some(listen) = args.proxy_listen.or(file.listen) else {
            if upstream.is_some() || args.gateway_config.is_some() {
                return Err(SettingsError::NoListen);
            }
            return Ok(None);
        };
        let upstream = upstream.ok_or(SettingsError::NoUpstream)?;
        let domain = args
            .proxy_domain
            .or(file.domain)
            .unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
        if domain.is_empty() {
            return Err(SettingsError::EmptyDomain);
        }
        let trusted = if args.trusted_proxies.is_empty() {
            file.trusted_proxies.unwrap_or_default()
        } else {
            args.trusted_proxies
        };
        let ipv6_prefix = args
            .ipv6_prefix
            .or(file.ipv6_prefix.map(|p| p.0))
            .unwrap_or(DEFAULT_IPV6_PREFIX);
        let mut client_ip = ClientIpConfig::new()
            .trust(trusted.into_iter().map(|c| c.0))
            .ipv6_prefix(ipv6_prefix);
        if let Some(header) = file.forwarded_header {
            client_ip = client_ip.header(header.into());
        }
        Ok(Some(Self {
            listen,
            upstream,
            domain,
            client_ip,
            routes: Arc::new(Routes(file.routes)),
            rate_limits: file.rate_limits,
        }))
    }
}

/// A gateway whose listeners are bound, ready to serve.
pub(crate) struct Gateway {
    settings: Settings,
    /// One per worker, all on the same address (`SO_REUSEPORT`: the kernel
    /// spreads new connections over them).
    listeners: Vec<std::net::TcpListener>,
}

/// Reads the gateway's options and binds its listeners; `None` when no
/// gateway is asked for. `policy` is only looked at, to warn when it has no
/// rules for the gateway's domain.
pub(crate) async fn bind(args: Args, policy: &Policy) -> anyhow::Result<Option<Gateway>> {
    let Some(settings) = Settings::resolve(args)? else {
        return Ok(None);
    };
    let cannot = || format!("cannot listen for the gateway on {}", settings.listen);
    let addr = tokio::net::lookup_host(&settings.listen)
        .await
        .with_context(cannot)?
        .next()
        .with_context(|| format!("{}: the name has no address", cannot()))?;
    let first = listen(addr).with_context(cannot)?;
    let bound = first
        .local_addr()
        .context("cannot read the gateway listener's address")?;
    let mut listeners = vec![first];
    for _ in 1..workers() {
        listeners.push(listen(bound).with_context(cannot)?);
    }
    tracing::info!(
        "listening for the gateway on {bound} with upstream {}",
        settings.upstream
    );
    if policy.rules(&settings.domain).is_empty() {
        tracing::warn!(
            domain = settings.domain,
            "the policy has no rules for the gateway's domain: every request is forwarded unlimited"
        );
    }
    Ok(Some(Gateway {
        settings,
        listeners,
    }))
}

/// How many threads serve the gateway: one per CPU, each with a runtime of
/// its own, its listener and its pool of upstream connections, as NGINX runs
/// one worker process per CPU. A request never leaves the thread that read
/// it, so no task is handed between threads on the way through.
fn workers() -> usize {
    if cfg!(unix) {
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    } else {
        // One listener per address without SO_REUSEPORT.
        1
    }
}

/// A listening socket on `addr`, shareable with the other workers'.
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)?.into_std()
}

/// The layer around the proxy: what every gateway request goes through.
type GatewayService = RateLimit<Proxy>;

/// What the gateway answers with: the upstream's body or the proxy's error
/// JSON, or the layer's 429 JSON.
type GatewayBody = ResponseBody<ProxyBody>;

impl Gateway {
    /// Serves, on the worker threads, until `stopped` changes, checking
    /// requests with `limiter`'s policy, kill switch and store. The task
    /// ends when every worker has finished its requests in flight.
    pub(crate) fn spawn<S: Store + 'static>(
        self,
        limiter: &Arc<RateLimiter<S>>,
        stopped: watch::Receiver<()>,
    ) -> JoinHandle<anyhow::Result<()>> {
        let layer = layer(&self.settings, limiter);
        let mut finished = Vec::with_capacity(self.listeners.len());
        for (index, listener) in self.listeners.into_iter().enumerate() {
            let (done, result) = oneshot::channel();
            let service = layer.layer(Proxy::new(
                self.settings.upstream.clone(),
                self.settings.client_ip.clone(),
            ));
            let routes = Arc::clone(&self.settings.routes);
            let stopped = stopped.clone();
            let started = std::thread::Builder::new()
                .name(format!("tollgate-gateway-{index}"))
                .spawn(move || {
                    let _ = done.send(worker(listener, service, routes, stopped));
                });
            if let Err(error) = started {
                // The workers already started stop with the shutdown signal.
                return tokio::spawn(async move {
                    Err(error).context("cannot start a gateway worker thread")
                });
            }
            finished.push(result);
        }
        tokio::spawn(async move {
            for result in finished {
                result.await.context("a gateway worker panicked")??;
            }
            Ok(())
        })
    }
}

/// The layer with the service's policy, kill switch and store.
fn layer<S: Store + 'static>(settings: &Settings, limiter: &Arc<RateLimiter<S>>) -> RateLimitLayer {
    let mut builder = RateLimitLayer::builder(
        settings.domain.clone(),
        PolicyHandle::from(limiter.policy_cell()),
        Shared(Arc::clone(limiter)),
    )
    .kill_switch(Arc::clone(limiter.kill_switch()));
    if settings.rate_limits.is_empty() {
        builder = builder.descriptor(ClientIpKey::new(settings.client_ip.clone()));
    }
    for spec in &settings.rate_limits {
        builder = builder.descriptor(spec.source(&settings.client_ip));
    }
    builder.build()
}

/// One worker thread: a single-threaded runtime serving `listener`.
fn worker(
    listener: std::net::TcpListener,
    service: GatewayService,
    routes: Arc<Routes>,
    stopped: watch::Receiver<()>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a gateway worker's runtime")?;
    runtime.block_on(async move {
        listener
            .set_nonblocking(true)
            .context("cannot set up the gateway listener")?;
        let listener =
            TcpListener::from_std(listener).context("cannot set up the gateway listener")?;
        serve_connections(listener, service, routes, stopped).await;
        Ok(())
    })
}

/// Accepts connections until `stopped` changes, then lets the open ones
/// finish their requests in flight (the caller bounds how long).
async fn serve_connections(
    listener: TcpListener,
    service: GatewayService,
    routes: Arc<Routes>,
    mut stopped: watch::Receiver<()>,
) {
    let mut http = http1::Builder::new();
    // At most 100 header fields (`431` beyond): hyper's default, left
    // unset because setting it moves the parser's array to the heap.
    http.timer(TokioTimer::new())
        .keep_alive(true)
        .half_close(false)
        .max_header_size(MAX_HEADER_SIZE)
        .max_buf_size(MAX_BUF_SIZE)
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "the gateway cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = stopped.changed() => break,
        };
        let (service, routes) = (service.clone(), Arc::clone(&routes));
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| handle(&service, &routes, peer, request)),
        );
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "gateway connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// One request of a connection from `peer`: the peer address (which
/// `ClientIpKey` and the proxy read) and the route template go into the
/// request; the answer is counted in `tollgate_checks_total{api="gateway"}`:
/// `ok` when it went through to the proxy, `over_limit` when the layer
/// answered it.
fn handle(
    service: &GatewayService,
    routes: &Routes,
    peer: SocketAddr,
    mut request: Request<Incoming>,
) -> impl Future<Output = Result<Response<GatewayBody>, Infallible>> + Send + use<> {
    let started = Instant::now();
    request.extensions_mut().insert(peer);
    if !routes.is_empty()
        && let Some(template) = routes.template(request.uri().path())
    {
        request.extensions_mut().insert(template);
    }
    // The proxy is always ready (its pool makes a connection when none is
    // idle), so the layer is too: there is no `poll_ready` to wait for.
    let response = service.clone().call(request);
    async move {
        let response = response.await?;
        let result = if response.body().is_inner() {
            CheckResult::Ok
        } else {
            CheckResult::OverLimit
        };
        metrics::check(Api::Gateway, result, started.elapsed());
        Ok(response)
    }
}
