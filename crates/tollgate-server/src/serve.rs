//! `tollgate serve`: the rate limit service, assembled by [`start`] (which
//! tests call in process) and run by [`run`] (the binary's `serve`).
//!
//! One process serves Envoy's Rate Limit Service over gRPC (with the standard
//! gRPC health service) and the HTTP API (`/json`, `/v1/check`, `/metrics`,
//! `/healthz`, `/readyz`, `/admin/...`, and the live page at `/`), over one
//! shared check path and one store. A policy comes from `--config` (a file or
//! a directory, watched and hot-reloaded) or, without it, the built-in
//! default. SIGTERM or SIGINT stops both listeners at once; requests in
//! flight finish, within [`GRACE`].
//!
//! See `docs/service.md` for the endpoints, JSON shapes and metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate_core::{Clock, SystemClock};
use tollgate_policy::{Policy, PolicyHandle, Reloader, StoreSettings};

mod admin;
mod answered;
mod args;
mod auth;
mod backend;
mod bodies;
mod envoy_mode;
mod http;
mod listeners;
mod native;
pub mod record;
mod reload;
mod state;
mod utilization;

pub use args::Args;
pub use envoy_mode::{invoked_as_ratelimit, ratelimit_command};
pub use reload::POLL as RELOAD_POLL;
pub use tollgate_envoy::settings::ENVOY_VARIABLES;

use backend::Backend;
use hyper_util::service::TowerToHyperService;
use state::AppState;
use tollgate_envoy::rlqs::QuotaService;
use tollgate_envoy::{GrpcService, Health, RateLimitGrpc};
use tollgate_gateway::Gateway;
use tollgate_listen::{Acceptor, Protocol};
use tollgate_observe::metrics::Api;
use tollgate_observe::{live, metrics, store_health};
use tollgate_policy::Enforcer;
use tollgate_store::FastClock;

/// How long requests in flight may take to finish once a shutdown starts.
pub const GRACE: Duration = Duration::from_secs(10);

/// How long one Redis round trip of the quota service, or of shared
/// utilization reports, may take: neither is a request's check.
const RLQS_REDIS_TIMEOUT: Duration = Duration::from_secs(1);

/// How often histograms are folded for `/metrics`.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// The listeners [`start`] serves on, already bound (port 0 is fine: the
/// [`Running`] handle says which port each got).
#[derive(Debug)]
pub struct Listeners {
    /// The HTTP API's.
    pub http: TcpListener,
    /// The gRPC Rate Limit Service's.
    pub grpc: TcpListener,
}

/// Starts the service on `listeners`: the policy from `args.config` (watched
/// and reloaded) or the built-in one, the gateway if `args` ask for one
/// (bound here from its own settings: it makes its listeners itself, one per
/// worker), the store stack, the enforcer with the metrics observer, the
/// gRPC Rate Limit Service with gRPC health, the HTTP API, and the
/// background tasks (reload watch, metrics upkeep), all on the current tokio
/// runtime. `args.http` and `args.grpc` are not read: `listeners` are those.
///
/// Everything that reads time is given `clock` (epoch nanoseconds): the
/// memory store and the enforcer's `started_at`; the reload watch and a
/// shaped request's delay run on tokio's timers. `tollgate serve` passes
/// [`SystemClock`]; tests pass a [`TokioClock`](crate::TokioClock) under
/// paused time, with [`Args::gateway_on_caller_runtime`].
///
/// The process's Prometheus recorder is installed by the first start and
/// shared by any later one in the same process.
///
/// # Errors
///
/// When the config does not load or is refused, the gateway's settings do
/// not resolve or its address cannot be bound, metrics cannot be set up, or
/// Redis cannot be reached. The error says which, for a person to read.
pub async fn start(
    args: Args,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<Running> {
    launch(prepare(args).await?, listeners, clock).await
}

/// What start-up has made before the HTTP and gRPC listeners are needed.
struct StartUp {
    args: Args,
    reloader: Option<Reloader>,
    handle: PolicyHandle,
    gateway: Option<Gateway>,
    /// The admin listener, when `--admin-listen` asks for one.
    admin: Option<TcpListener>,
    /// The cap of each of the HTTP API's, gRPC's and admin's listeners.
    max_connections: usize,
    /// The config's `store:` section and its file.
    store: Option<(PathBuf, StoreSettings)>,
    /// envoyproxy/ratelimit's debug listener, in its mode.
    debug: Option<TcpListener>,
    /// The gRPC listener's TLS, when asked for.
    grpc_tls: Option<rustls::ServerConfig>,
    /// Where the policy comes from, for the log and the live page.
    source: String,
}

/// Loads the policy and binds the gateway: what `tollgate serve` does before
/// it binds its own listeners, so that a bad config is reported as such
/// whatever the addresses.
async fn prepare(args: Args) -> anyhow::Result<StartUp> {
    let xds = args.envoy.as_ref().and_then(|e| e.xds.as_ref());
    let reloader = match (&args.config, xds) {
        (Some(path), _) => Some(reload::load(path, &args.reload)?),
        (None, Some(xds)) => Some(reload::pushed(xds.source())),
        (None, None) => None,
    };
    let handle = reloader.as_ref().map_or_else(
        || PolicyHandle::new(Policy::builtin()),
        |r| r.handle().clone(),
    );
    let policy = handle.load();
    let domains: Vec<&str> = policy.domains().collect();
    let source = match (&args.config, xds) {
        (Some(path), _) => path.display().to_string(),
        (None, Some(xds)) => xds.source(),
        (None, None) => "built-in default".to_owned(),
    };
    tracing::info!(?domains, %source, "policy loaded");
    let grpc_tls = match args.envoy.as_ref().and_then(|e| e.grpc_tls.clone()) {
        Some(files) => Some(files),
        None => tollgate_envoy::ServerFiles::from_flags(&args.grpc_tls)?,
    };
    let grpc_tls = grpc_tls.map(|files| files.config()).transpose()?;

    let gateway = tollgate_gateway::Settings::resolve_with_policy(
        args.gateway.clone(),
        args.config.as_deref(),
    )?;
    let caps = listeners::fit(
        listeners::raise_file_limit(),
        listeners::Demand {
            listeners: 2
                + u64::from(args.listen.admin_listen.is_some())
                + u64::from(args.envoy.is_some()),
            files_per_connection: 1,
            given: args.listen.max_connections.map(|n| n as usize),
        },
        gateway.as_ref().map(|_| listeners::Demand {
            listeners: 1,
            // The client's connection and the upstream one.
            files_per_connection: 2,
            given: args.gateway.proxy_max_connections.map(|n| n as usize),
        }),
    )?;
    let gateway = match gateway {
        Some(settings) => {
            let mut settings = settings.with_max_connections(caps.gateway.unwrap_or(1));
            if args.gateway_on_caller_runtime {
                settings = settings.on_caller_runtime();
            }
            Some(Gateway::bind(settings, &policy).await?)
        }
        None => None,
    };
    let admin = match &args.listen.admin_listen {
        Some(addr) => Some(bind("admin", addr).await?),
        None => None,
    };
    let debug = match &args.envoy {
        // As envoyproxy/ratelimit, which only logs it, a debug port that
        // cannot be bound does not stop the service.
        Some(envoy) => match bind("debug", &envoy.debug).await {
            Ok(debug) => Some(debug),
            Err(error) => {
                tracing::error!("{error:#}");
                None
            }
        },
        None => None,
    };
    // The store is built from the section at start-up only.
    let store = policy
        .store()
        .map(|(path, store)| (path.to_owned(), store.clone()));
    // The handle holds what is in force; this start-up snapshot would
    // otherwise stay in memory past every reload.
    drop(policy);
    Ok(StartUp {
        args,
        reloader,
        handle,
        gateway,
        admin,
        max_connections: caps.api,
        store,
        debug,
        grpc_tls,
        source,
    })
}

/// The rest of [`start`], once the listeners are bound.
async fn launch(
    prepared: StartUp,
    listeners: Listeners,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<Running> {
    let StartUp {
        args,
        reloader,
        handle,
        gateway,
        admin,
        max_connections,
        store,
        debug,
        grpc_tls,
        source,
    } = prepared;
    let http_addr = local_addr("HTTP", &listeners.http)?;
    let grpc_addr = local_addr("gRPC", &listeners.grpc)?;
    let admin_addr = admin
        .as_ref()
        .map(|admin| local_addr("admin", admin))
        .transpose()?;
    // The admin line first: tests wait for the HTTP and gRPC lines.
    let bound = [
        ("admin", admin_addr),
        ("HTTP", Some(http_addr)),
        ("gRPC", Some(grpc_addr)),
    ];
    // The runtime's worker count (one per CPU unless `TOKIO_WORKER_THREADS`
    // says otherwise): what an operator sizing the service needs to see.
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    for (what, bound) in bound {
        if let Some(bound) = bound {
            tracing::info!(max_connections, workers, "listening for {what} on {bound}");
        }
    }
    let limits = args.listen.limits(max_connections);

    let metrics_handle = metrics_handle()?;
    let envoy = args.envoy.as_deref();
    if let Some(envoy) = envoy {
        metrics::set_near_limit_ratio(envoy.near_limit_ratio);
    }
    let reply = Arc::new(tollgate_envoy::Reply::new(
        &args.envoy_headers,
        envoy.map_or(tollgate_envoy::DEFAULT_NAMES.map(String::from), |e| {
            e.header_names.clone()
        }),
        envoy.is_some_and(|e| e.dynamic_metadata),
    )?);
    let metrics_path = envoy
        .and_then(|e| e.metrics_path.clone())
        .unwrap_or_else(|| "/metrics".into());
    let store = Backend::open(
        args.redis.as_ref().map(|url| url.0.as_str()),
        args.redis_timeout,
        &args.store,
        store.as_ref().map(|(path, store)| (path.as_path(), store)),
        Arc::clone(&clock),
    )
    .await?;
    tracing::info!(
        store = store.describe(),
        redis_code = store.redis_code(),
        redis_module = store.redis_module(),
        "store ready"
    );
    let live = Arc::new(live::Live::new(Arc::clone(&clock), source));
    let (observer, recorder) = record::observer(
        (
            metrics::Observe::default(),
            live::Observe(Arc::clone(&live)),
        ),
        &args.record,
    )?;
    let enforcer: Arc<Enforcer<Backend>> = Arc::new(
        Enforcer::new(handle.clone(), store)
            .with_shadow_mode(args.envoy.as_ref().is_some_and(|e| e.shadow_mode))
            .with_quota_mode(args.envoy.as_ref().is_some_and(|e| e.quota_mode))
            .with_envoy_counting(args.envoy_counting)
            .with_request_limits(args.requests.request_limits())
            .with_clock(Arc::clone(&clock))
            .with_timer(Arc::new(FastClock::new()))
            .with_observer(observer),
    );
    // Only now is the store known: a rule it cannot enforce exactly would
    // otherwise fail every check, by its failure policy.
    enforcer
        .unsupported(&enforcer.policy())
        .map_err(|e| anyhow::anyhow!("config does not validate: {e}"))?;
    let reloader = reloader.map(|reloader| {
        let enforcer = Arc::clone(&enforcer);
        let live = Arc::clone(&live);
        reloader
            .with_check(move |policy| enforcer.unsupported(policy))
            .with_observer(move |attempt| {
                // The live page first: once the log says so, it shows it.
                live.reloaded(attempt);
                reload::observe(attempt);
            })
    });
    let (stop, stopped) = watch::channel(());

    let (health, health_service) = Health::start().await;
    let xds = args.envoy.as_ref().and_then(|e| e.xds.clone());
    if let Some(xds) = &xds {
        // Before the listeners serve: a probe never sees a healthy start
        // that the health rules would not allow.
        health.config(xds.healthy_at_start()).await;
    }
    let bodies = Arc::new(args.requests.bodies());
    let quota = match enforcer.store().redis() {
        // Replicas behind one Service keep one quota: an RLQS report is no
        // request, so it needs no more than a second, whatever
        // `--redis-timeout` allows a check.
        Some(redis) => QuotaService::replicated(
            handle.clone(),
            Arc::clone(&clock),
            redis.cells("rlqs", RLQS_REDIS_TIMEOUT),
        ),
        None => QuotaService::new(handle.clone(), Arc::clone(&clock)),
    };
    if let Some(recorder) = &recorder {
        quota.record_usage(recorder.quota_usage());
    }
    let grpc_service = GrpcService::new(
        RateLimitGrpc::new(
            Arc::clone(&enforcer),
            auth::admits_any(&args.api_token),
            Arc::clone(&reply),
            |outcome, elapsed| metrics::check(Api::Grpc, answered::envoy(outcome), elapsed),
            Arc::clone(&bodies),
            Arc::new(args.requests.overload()),
        ),
        // Envoy's quota filter streams to the same port as its RLS filter.
        tonic::service::Routes::new(health_service)
            .add_service(quota.server())
            .prepare(),
    );
    let mut grpc_acceptor = Acceptor::new("grpc", limits, Protocol::Http2);
    if let Some(config) = grpc_tls {
        grpc_acceptor = grpc_acceptor.with_tls(config);
    }
    let grpc_task = serve_on(grpc_acceptor, listeners.grpc, stopped.clone(), move |_| {
        grpc_service.clone()
    });

    let quotas: Option<Box<dyn Fn() -> Vec<live::QuotaView> + Send + Sync>> = {
        let quota = quota.clone();
        Some(Box::new(move || {
            quota
                .rules()
                .into_iter()
                .map(|r| live::QuotaView {
                    domain: r.domain.to_string(),
                    rule: r.rule.to_string(),
                    buckets: r.buckets,
                    envoys: r.envoys,
                    allowed: r.allowed,
                    denied: r.denied,
                    assigned: r.assigned,
                    assigned_per_second: r.assigned_rate,
                })
                .collect()
        }))
    };
    let store_metrics: Option<Box<dyn Fn() + Send + Sync>> = {
        let enforcer = Arc::clone(&enforcer);
        let shedder = gateway.as_ref().and_then(Gateway::shedder).cloned();
        Some(Box::new(move || {
            enforcer.store().record_metrics();
            quota.record_metrics();
            if let Some(shedder) = &shedder {
                metrics::shed(&shedder.snapshot());
            }
        }))
    };
    let store_health: Option<Box<dyn Fn() -> store_health::StoreHealth + Send + Sync>> = {
        let enforcer = Arc::clone(&enforcer);
        Some(Box::new(move || enforcer.store().health()))
    };
    let shared_reports = enforcer.store().redis().map(|redis| {
        Arc::new(utilization::Shared::new(
            redis.cells("utilization", RLQS_REDIS_TIMEOUT),
        ))
    });
    if let Some(shared) = &shared_reports {
        tokio::spawn(utilization::follow(
            Arc::clone(shared),
            Arc::clone(&enforcer),
            stopped.clone(),
        ));
    }
    let state = Arc::new(AppState {
        enforcer: Arc::clone(&enforcer),
        shared_reports,
        metrics: metrics_handle.clone(),
        store_metrics,
        store_health,
        quotas,
        gateway_shedder: gateway.as_ref().and_then(Gateway::shedder).cloned(),
        live: Arc::clone(&live),
        admin_token: args.admin_token,
        api_tokens: args.api_token.clone(),
        reloader: reloader.clone(),
        health: Arc::clone(&health),
        reply,
        metrics_path,
        v1_headers: args.v1_headers,
        bodies,
    });
    // On the shared multi-threaded runtime, not the gateway's per-CPU
    // workers: measured both ways (`scripts/bench-http`), per-CPU workers
    // gave the same throughput and a worse p99, since a check is too short
    // to amortize connections unevenly spread over the workers.
    let http_surface = if admin.is_some() {
        http::Surface::Public
    } else {
        http::Surface::Everything
    };
    let http_task = serve_http(
        Acceptor::new("http", limits, Protocol::Any),
        listeners.http,
        stopped.clone(),
        http::service(Arc::clone(&state), http_surface),
    );
    let admin_task = admin.map(|admin| {
        serve_http(
            Acceptor::new("admin", limits, Protocol::Any),
            admin,
            stopped.clone(),
            http::service(state, http::Surface::Operator),
        )
    });
    if let Some(listener) = debug {
        tracing::info!("listening for debug on {}", local_addr("debug", &listener)?);
        let router = tollgate_envoy::settings::debug_router(handle);
        let acceptor = Acceptor::new("debug", limits, Protocol::Any);
        serve_on(acceptor, listener, stopped.clone(), move |_| {
            TowerToHyperService::new(router.clone())
        });
    }
    let gateway_addr = gateway.as_ref().map(Gateway::local_addr);
    let gateway_task = gateway.map(|g| g.spawn(&enforcer, stopped.clone(), answered::gateway));

    match (reloader, xds) {
        (Some(reloader), Some(xds)) => {
            let health = Arc::clone(&health);
            tokio::spawn(tollgate_envoy::follow_xds(
                xds,
                reloader,
                health,
                stopped.clone(),
            ));
        }
        (Some(reloader), None) => {
            tokio::spawn(reloader.watch(reload::POLL, signalled(stopped.clone())));
        }
        (None, _) => {}
    }
    tokio::spawn(Arc::clone(&health).follow(Arc::clone(&enforcer), stopped.clone()));
    tokio::spawn(live::sample(live, stopped.clone()));
    tokio::spawn(upkeep(metrics_handle, stopped));

    Ok(Running {
        http: http_addr,
        grpc: grpc_addr,
        admin: admin_addr,
        gateway: gateway_addr,
        health,
        stop,
        grpc_task: Some(grpc_task),
        http_task: Some(http_task),
        admin_task,
        gateway_task,
    })
}

/// A started service. Dropping it stops every listener and background task
/// at once, without waiting; [`Running::shutdown`] lets requests in flight
/// finish.
#[derive(Debug)]
pub struct Running {
    http: SocketAddr,
    grpc: SocketAddr,
    admin: Option<SocketAddr>,
    gateway: Option<SocketAddr>,
    health: Arc<Health>,
    /// Sending on it (or dropping it) is the one signal that stops
    /// everything.
    stop: watch::Sender<()>,
    /// Each server's task; taken once it has ended.
    grpc_task: Option<JoinHandle<anyhow::Result<()>>>,
    http_task: Option<JoinHandle<anyhow::Result<()>>>,
    admin_task: Option<JoinHandle<anyhow::Result<()>>>,
    gateway_task: Option<JoinHandle<Result<(), tollgate_gateway::Error>>>,
}

impl Running {
    /// Where the HTTP API listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// Where the gRPC Rate Limit Service listens.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// Where the admin API listens, when it has a listener of its own.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// Where the gateway listens, when there is one.
    pub fn gateway_addr(&self) -> Option<SocketAddr> {
        self.gateway
    }

    /// Waits until one of the servers stops on its own (it failed, panicked
    /// or ended), then stops the others and says why. Never resolves while
    /// they all serve.
    pub async fn failure(&mut self) -> anyhow::Error {
        let (which, result) = tokio::select! {
            result = finished(&mut self.grpc_task) => ("gRPC", result),
            result = finished(&mut self.http_task) => ("HTTP", result),
            result = finished(&mut self.admin_task) => ("admin", result),
            result = finished(&mut self.gateway_task) => ("gateway", result),
        };
        self.signal_stop().await;
        match result {
            Err(join) => anyhow::Error::new(join).context(format!("the {which} server panicked")),
            Ok(Err(error)) => error,
            Ok(Ok(())) => anyhow::anyhow!("the {which} server stopped unexpectedly"),
        }
    }

    /// Stops every listener and lets requests in flight finish, within
    /// [`GRACE`]; past it, what is still open is left to be dropped with the
    /// runtime.
    ///
    /// # Errors
    ///
    /// When a server failed or panicked.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.signal_stop().await;
        let (grpc, http, admin, gateway) = (
            self.grpc_task.take(),
            self.http_task.take(),
            self.admin_task.take(),
            self.gateway_task.take(),
        );
        let finished = tokio::time::timeout(GRACE, async {
            let (grpc, http, admin, gateway) =
                tokio::join!(ended(grpc), ended(http), ended(admin), ended(gateway));
            grpc.context("the gRPC server panicked")??;
            http.context("the HTTP server panicked")??;
            admin.context("the admin server panicked")??;
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

    /// Turns every health probe unhealthy first, then sends the one signal
    /// that stops every listener and background task.
    async fn signal_stop(&self) {
        self.health.stop().await;
        let _ = self.stop.send(());
    }
}

/// The process's Prometheus handle, installing the recorder on first use:
/// `metrics` has one global recorder, which every service in the process
/// (tests may start several) then shares.
fn metrics_handle() -> anyhow::Result<PrometheusHandle> {
    static INSTALLED: Mutex<Option<PrometheusHandle>> = Mutex::new(None);
    let mut installed = INSTALLED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(handle) = installed.as_ref() {
        return Ok(handle.clone());
    }
    let recorder = metrics::recorder().context("cannot set up metrics")?;
    let handle =
        metrics::install(recorder).map_err(|e| anyhow::anyhow!("cannot set up metrics: {e}"))?;
    record::describe();
    *installed = Some(handle.clone());
    Ok(handle)
}

/// Runs the service until SIGTERM or SIGINT.
pub fn run(args: Args) -> anyhow::Result<()> {
    envoy_mode::init_logging(args.envoy.as_deref())?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let mut signals = Signals::install()?;
    let prepared = prepare(args).await?;
    let listeners = Listeners {
        http: bind("HTTP", &prepared.args.http).await?,
        grpc: bind("gRPC", &prepared.args.grpc).await?,
    };
    let mut running = launch(prepared, listeners, Arc::new(SystemClock)).await?;
    let early = tokio::select! {
        signal = signals.recv() => {
            tracing::info!("{signal}: shutting down");
            None
        }
        error = running.failure() => Some(error),
    };
    match early {
        Some(error) => Err(error),
        None => running.shutdown().await,
    }
}

/// Binds `addr` (port 0 picks a free port).
async fn bind(what: &str, addr: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for {what} on {addr}"))
}

/// The result of an optional task, which is then taken; never resolves when
/// there is no task.
async fn finished<T, E: Into<anyhow::Error>>(
    task: &mut Option<JoinHandle<Result<T, E>>>,
) -> Result<anyhow::Result<T>, tokio::task::JoinError> {
    let Some(running) = task else {
        return std::future::pending().await;
    };
    let result = running.await.map(|result| result.map_err(Into::into));
    *task = None;
    result
}

/// The result of an optional task that is to end now; `Ok` when there is no
/// task.
async fn ended<T: Default, E: Into<anyhow::Error>>(
    task: Option<JoinHandle<Result<T, E>>>,
) -> Result<anyhow::Result<T>, tokio::task::JoinError> {
    match task {
        Some(task) => task.await.map(|result| result.map_err(Into::into)),
        None => Ok(Ok(T::default())),
    }
}

/// Serves `listener` with `acceptor`'s limits on a task of its own until
/// `stopped` changes, each connection with `make(peer)`'s service.
fn serve_on<M, S, B>(
    acceptor: Acceptor,
    listener: TcpListener,
    stopped: watch::Receiver<()>,
    make: M,
) -> JoinHandle<anyhow::Result<()>>
where
    M: Fn(SocketAddr) -> S + Send + 'static,
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<B>,
        > + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        acceptor.serve(listener, stopped, make).await;
        Ok(())
    })
}

/// [`serve_on`] with one of the HTTP API's services.
fn serve_http<S: tollgate_core::Store + 'static>(
    acceptor: Acceptor,
    listener: TcpListener,
    stopped: watch::Receiver<()>,
    service: http::HttpService<S>,
) -> JoinHandle<anyhow::Result<()>> {
    serve_on(acceptor, listener, stopped, move |_| {
        let service = service.clone();
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            // The service is always ready (see `http::service`).
            tower_service::Service::call(&mut service.clone(), request.map(axum::body::Body::new))
        })
    })
}

/// The address `listener` is bound to.
fn local_addr(what: &str, listener: &TcpListener) -> anyhow::Result<SocketAddr> {
    listener
        .local_addr()
        .with_context(|| format!("cannot read the {what} listener's address"))
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
