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
//! worker thread per CPU (`workers`). See `docs/gateway.md`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate_core::Store;
use tollgate_http::{ClientIpConfig, ClientIpKey, RateLimit, RateLimitLayer, ResponseBody};
use tollgate_policy::{ConfigError, Enforcer, Policy};
use tower_layer::Layer;
use tower_service::Service;

mod actions;
mod config;
mod pool;
mod proxy;
mod routes;
mod workers;

use super::metrics::{self, Api, CheckResult};
use actions::RateLimitSpec;
use config::{Cidr, GatewayFile};
use proxy::{Proxy, ProxyBody, Upstream};
use routes::Routes;
use workers::Listeners;

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
    listeners: Listeners,
}

/// Reads the gateway's options and binds its listeners (one per worker, see
/// `workers`); `None` when no gateway is asked for. `policy` is only looked
/// at, to warn when it has no rules for the gateway's domain.
pub(crate) async fn bind(args: Args, policy: &Policy) -> anyhow::Result<Option<Gateway>> {
    let Some(settings) = Settings::resolve(args)? else {
        return Ok(None);
    };
    let listeners = workers::bind("the gateway", &settings.listen).await?;
    tracing::info!(
        "listening for the gateway on {} with upstream {}",
        listeners.local_addr(),
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

/// The layer around the proxy: what every gateway request goes through.
type GatewayService = RateLimit<Proxy>;

/// What the gateway answers with: the upstream's body or the proxy's error
/// JSON, or the layer's 429 JSON.
type GatewayBody = ResponseBody<ProxyBody>;

impl Gateway {
    /// Serves, on the worker threads, until `stopped` changes, checking
    /// requests with `enforcer`'s policy, kill switch and store. The task
    /// ends when every worker has finished its requests in flight.
    pub(crate) fn spawn<S: Store + 'static>(
        self,
        enforcer: &Arc<Enforcer<S>>,
        stopped: watch::Receiver<()>,
    ) -> JoinHandle<anyhow::Result<()>> {
        let layer = layer(&self.settings, enforcer);
        let (upstream, client_ip) = (self.settings.upstream, self.settings.client_ip);
        let routes = self.settings.routes;
        // Each worker gets a proxy, and so a pool of upstream connections, of
        // its own.
        self.listeners.serve("gateway", stopped, move || {
            let service = layer.layer(Proxy::new(upstream.clone(), client_ip.clone()));
            let routes = Arc::clone(&routes);
            move |peer, request| handle(&service, &routes, peer, request)
        })
    }
}

/// The layer, deciding with the service's enforcer (its policy, kill
/// switch, store and metrics).
fn layer<S: Store + 'static>(settings: &Settings, enforcer: &Arc<Enforcer<S>>) -> RateLimitLayer {
    let mut builder = RateLimitLayer::shared(settings.domain.clone(), Arc::clone(enforcer));
    if settings.rate_limits.is_empty() {
        builder = builder.descriptor(ClientIpKey::new(settings.client_ip.clone()));
    }
    for spec in &settings.rate_limits {
        builder = builder.descriptor(spec.source(&settings.client_ip));
    }
    builder.build()
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
