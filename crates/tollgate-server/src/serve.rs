//! `tollgate serve`: the rate limit service.
//!
//! One process serves Envoy's Rate Limit Service over gRPC (with the standard
//! gRPC health service) and the HTTP API (`/json`, `/v1/check`, `/metrics`,
//! `/healthz`, `/readyz`, `/admin/...`), over one shared check path and one
//! store. A policy comes from `--config` (a file or a directory, watched and
//! hot-reloaded) or, without it, the built-in default. SIGTERM or SIGINT stops
//! both listeners at once; requests in flight finish, within [`GRACE`].
//!
//! See `docs/service.md` for the endpoints, JSON shapes and metrics.

use std::fmt;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate_policy::{Policy, PolicyHandle};
use tracing_subscriber::EnvFilter;

mod admin;
mod backend;
mod envoy;
mod envoy_json;
mod grpc;
mod http;
mod metrics;
mod native;
mod reload;

use backend::Backend;
use grpc::{RateLimitGrpc, RateLimitServiceServer};
use http::AppState;
use tollgate_gateway::Gateway;
use tollgate_policy::Enforcer;

/// How long requests in flight may take to finish once a shutdown starts.
const GRACE: Duration = Duration::from_secs(10);

/// How often histograms are folded for `/metrics`.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// The gRPC rate limit service over [`Backend`].
type RlsServer = RateLimitServiceServer<RateLimitGrpc<Backend>>;

/// Options of `tollgate serve`; each can also come from its `TOLLGATE_*`
/// environment variable.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The policy: a YAML file, or a directory of `.yaml`/`.yml` files, in
    /// Tollgate's native format or envoyproxy/ratelimit's. Watched and
    /// reloaded on change. Without it, the built-in default policy.
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,

    /// Where the HTTP API listens (port 0 picks a free port; the log says which).
    #[arg(
        long,
        env = "TOLLGATE_HTTP",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    http: String,

    /// Where the gRPC Rate Limit Service listens (port 0 picks a free port).
    #[arg(
        long,
        env = "TOLLGATE_GRPC",
        value_name = "ADDR",
        default_value = "127.0.0.1:8081"
    )]
    grpc: String,

    /// A Redis store: `redis://host:port` for one server,
    /// `redis+cluster://host:port,host:port` for a cluster. Without it (and
    /// without `redis` in the config's `store:` section), the in-memory store.
    #[arg(long, env = "TOLLGATE_REDIS", value_name = "URL")]
    redis: Option<RedisUrl>,

    /// How long one round trip to Redis may take before each rule's failure
    /// policy decides the check (`fail_open`, `fail_closed`, or `local`, the
    /// default) [default: 10ms].
    #[arg(
        long,
        env = "TOLLGATE_REDIS_TIMEOUT",
        value_name = "DURATION",
        value_parser = redis_timeout
    )]
    redis_timeout: Option<Duration>,

    /// The bearer token of the admin API (`/admin/...`). Without it, the admin
    /// API is off.
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    admin_token: Option<admin::AdminToken>,

    #[command(flatten, next_help_heading = "Store")]
    store: backend::StoreArgs,

    #[command(flatten, next_help_heading = "Reload")]
    reload: reload::Args,

    #[command(flatten, next_help_heading = "Gateway")]
    gateway: tollgate_gateway::Options,
}

/// A Redis timeout: a duration such as `10ms`, above zero and at most a minute.
fn redis_timeout(s: &str) -> Result<Duration, String> {
    backend::check_redis_timeout(tollgate_policy::parse_duration(s).map_err(|e| e.to_string())?)
}

/// A Redis URL whose scheme has been checked. Its `Debug` shows no password.
#[derive(Clone)]
struct RedisUrl(String);

impl FromStr for RedisUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("redis://")
            .or_else(|| s.strip_prefix("redis+cluster://"))
            .ok_or("expected redis://host:port or redis+cluster://host:port,host:port")?;
        // Whatever precedes the host (user:password@) is not checked here.
        let hosts = rest.rsplit('@').next().unwrap_or(rest);
        let hosts = hosts.split('/').next().unwrap_or(hosts);
        if hosts.is_empty() || hosts.split(',').any(str::is_empty) {
            return Err("the URL names no host".into());
        }
        Ok(Self(s.to_owned()))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = self.0.split("://").next().unwrap_or_default();
        write!(f, "RedisUrl({scheme}://<redacted>)")
    }
}

/// Runs the service until SIGTERM or SIGINT.
pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let mut signals = Signals::install()?;
    let reloader = match &args.config {
        Some(path) => Some(reload::load(path, &args.reload)?),
        None => None,
    };
    let handle = reloader.as_ref().map_or_else(
        || PolicyHandle::new(Policy::builtin()),
        |r| r.handle().clone(),
    );
    let policy = handle.load();
    let domains: Vec<&str> = policy.domains().collect();
    tracing::info!(?domains, source = %source(&args.config), "policy loaded");

    let gateway = match tollgate_gateway::Settings::resolve(args.gateway)? {
        Some(settings) => Some(Gateway::bind(settings, &policy).await?),
        None => None,
    };
    let http_listener = bind("HTTP", &args.http).await?;
    let grpc_listener = bind("gRPC", &args.grpc).await?;
    for (what, listener) in [("HTTP", &http_listener), ("gRPC", &grpc_listener)] {
        let bound = listener
            .local_addr()
            .with_context(|| format!("cannot read the {what} listener's address"))?;
        tracing::info!("listening for {what} on {bound}");
    }

    let recorder = metrics::recorder().context("cannot set up metrics")?;
    let metrics_handle =
        metrics::install(recorder).map_err(|e| anyhow::anyhow!("cannot set up metrics: {e}"))?;
    let store = Backend::open(
        args.redis.as_ref().map(|url| url.0.as_str()),
        args.redis_timeout,
        &args.store,
        policy.store(),
    )
    .await?;
    // The handle holds what is in force; this start-up snapshot would
    // otherwise stay in memory past every reload.
    drop(policy);
    tracing::info!(store = store.describe(), "store ready");
    let enforcer: Arc<Enforcer<Backend>> =
        Arc::new(Enforcer::new(handle, store).with_observer(Arc::new(metrics::Observe)));
    let (stop, stopped) = watch::channel(());

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RlsServer>().await;
    let grpc_server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(RlsServer::new(RateLimitGrpc::new(Arc::clone(&enforcer))))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(grpc_listener),
            signalled(stopped.clone()),
        );
    let mut grpc_task: JoinHandle<anyhow::Result<()>> =
        tokio::spawn(async move { grpc_server.await.context("the gRPC server failed") });

    let store_metrics: Option<Box<dyn Fn() + Send + Sync>> = {
        let enforcer = Arc::clone(&enforcer);
        Some(Box::new(move || enforcer.store().record_metrics()))
    };
    let state = Arc::new(AppState {
        enforcer: Arc::clone(&enforcer),
        metrics: metrics_handle.clone(),
        store_metrics,
        admin_token: args.admin_token,
        reloader: reloader.clone(),
    });
    // On the shared multi-threaded runtime, not the gateway's per-CPU
    // workers: measured both ways (`scripts/bench-http`), per-CPU workers
    // gave the same throughput and a worse p99, since a check is too short
    // to amortize connections unevenly spread over the workers.
    let http_server = axum::serve(
        http_listener,
        axum::ServiceExt::<axum::extract::Request>::into_make_service(http::service(state)),
    )
    .with_graceful_shutdown(signalled(stopped.clone()));
    let mut http_task: JoinHandle<anyhow::Result<()>> =
        tokio::spawn(async move { http_server.await.context("the HTTP server failed") });
    let mut gateway_task = gateway.map(|g| g.spawn(&enforcer, stopped.clone(), metrics::gateway));

    if let Some(reloader) = reloader {
        tokio::spawn(reloader.watch(reload::POLL, signalled(stopped.clone())));
    }
    tokio::spawn(upkeep(metrics_handle, stopped));

    let early = tokio::select! {
        signal = signals.recv() => {
            tracing::info!("{signal}: shutting down");
            None
        }
        result = &mut grpc_task => Some(("gRPC", result)),
        result = &mut http_task => Some(("HTTP", result)),
        result = finished(&mut gateway_task) => Some(("gateway", result)),
    };
    health.set_not_serving::<RlsServer>().await;
    // One signal stops every listener and background task.
    let _ = stop.send(());
    if let Some((which, result)) = early {
        result.with_context(|| format!("the {which} server panicked"))??;
        bail!("the {which} server stopped unexpectedly");
    }
    let finished = tokio::time::timeout(GRACE, async {
        let gateway = async {
            match gateway_task {
                Some(task) => task.await,
                None => Ok(Ok(())),
            }
        };
        let (grpc, http, gateway) = tokio::join!(grpc_task, http_task, gateway);
        grpc.context("the gRPC server panicked")??;
        http.context("the HTTP server panicked")??;
        gateway.context("the gateway panicked")??;
        anyhow::Ok(())
    })
    .await;
    match finished {
        Ok(result) => {
            result?;
            tracing::info!("stopped");
            Ok(())
        }
        Err(_) => {
            // The connections left are dropped with the runtime.
            tracing::warn!("connections still open after {GRACE:?}, closing them");
            Ok(())
        }
    }
}

fn source(config: &Option<PathBuf>) -> String {
    config.as_ref().map_or_else(
        || "built-in default".to_owned(),
        |p| p.display().to_string(),
    )
}

/// Binds `addr` (port 0 picks a free port).
async fn bind(what: &str, addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for {what} on {addr}"))
}

/// The result of an optional task; never resolves when there is no task.
async fn finished<T, E: Into<anyhow::Error>>(
    task: &mut Option<JoinHandle<Result<T, E>>>,
) -> Result<anyhow::Result<T>, tokio::task::JoinError> {
    match task {
        Some(task) => task.await.map(|result| result.map_err(Into::into)),
        None => std::future::pending().await,
    }
}

/// Resolves once the shutdown signal is sent (or its sender is gone).
async fn signalled(mut stopped: watch::Receiver<()>) {
    let _ = stopped.changed().await;
}

/// SIGTERM and SIGINT, listened for from the start so that a signal that
/// arrives while the service starts is not missed.
struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
                interrupt: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Waits for the first signal and names it.
    async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => "SIGTERM",
                _ = self.interrupt.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            // Without a handler, Ctrl-C ends the process anyway.
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

/// Folds histogram samples for `/metrics` until the shutdown signal.
async fn upkeep(
    handle: metrics_exporter_prometheus::PrometheusHandle,
    mut stopped: watch::Receiver<()>,
) {
    let mut ticks = tokio::time::interval(METRICS_UPKEEP);
    loop {
        tokio::select! {
            _ = ticks.tick() => handle.run_upkeep(),
            _ = stopped.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_urls_are_checked_and_redacted() {
        for good in [
            "redis://localhost:6379",
            "redis://:pw@h:1/0",
            "redis+cluster://a:1,b:2",
        ] {
            let url: RedisUrl = good.parse().expect(good);
            assert!(!format!("{url:?}").contains("pw"));
        }
        for bad in [
            "localhost:6379",
            "http://h:1",
            "redis://",
            "redis+cluster://a:1,,b:2",
        ] {
            assert!(bad.parse::<RedisUrl>().is_err(), "{bad}");
        }
    }
}
