//! The gateway itself: [`RateLimitLayer`] around a [`Proxy`] on every worker,
//! and what each request goes through on its way.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate_core::Store;
use tollgate_http::{ClientIpKey, RateLimit, RateLimitLayer, ResponseBody, Shed, Shedder};
use tollgate_policy::{Enforcer, Policy};
use tower_layer::Layer;
use tower_service::Service;

use crate::proxy::{Proxy, ProxyBody};
use crate::routes::Routes;
use crate::settings::Settings;
use crate::workers::{self, HEADER_READ_TIMEOUT, Listeners};
use tollgate_listen::{Acceptor, ConnectionLimits, Protocol};

/// Why the gateway cannot listen or stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The address cannot be resolved or bound.
    #[error("cannot listen for the gateway on {addr}")]
    Listen {
        /// The address as given.
        addr: String,
        /// Why not.
        #[source]
        source: io::Error,
    },
    /// A worker thread, its runtime or its listener cannot be set up.
    #[error("cannot start a gateway worker")]
    Worker(#[source] io::Error),
    /// A worker thread panicked.
    #[error("a gateway worker panicked")]
    WorkerPanicked,
}

/// How the gateway answered a request, as told to the `observe` hook of
/// [`Gateway::spawn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and handed to the proxy (whatever the upstream then answered).
    Forwarded,
    /// Answered by the rate limit layer (`429`) without reaching the upstream.
    Limited,
    /// Admitted by the rate limit layer, then shed (`503`) because the
    /// upstream is too full for the request's priority tier; it never
    /// reached the upstream.
    Shed,
}

/// A gateway whose listeners are bound, ready to serve.
#[derive(Debug)]
pub struct Gateway {
    settings: Settings,
    listeners: Listeners,
}

impl Gateway {
    /// Binds the gateway's listeners (one per worker, see `workers`; one in
    /// all with [`Settings::on_caller_runtime`]).
    /// `policy` is only looked at, to warn when it has no rules for the
    /// gateway's domain.
    ///
    /// # Errors
    ///
    /// When the address cannot be resolved or bound.
    pub async fn bind(settings: Settings, policy: &Policy) -> Result<Self, Error> {
        let listeners = workers::bind(&settings.listen, settings.on_caller_runtime).await?;
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
        Ok(Self {
            settings,
            listeners,
        })
    }

    /// The load shedder in front of the upstream, when configured (see
    /// [`Settings::shedder`]).
    pub fn shedder(&self) -> Option<&Arc<Shedder>> {
        self.settings.shedder()
    }

    /// The address every worker listens on (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.listeners.local_addr()
    }

    /// Serves, on the worker threads (or the caller's runtime, see
    /// [`Settings::on_caller_runtime`]), until `stopped` changes, checking
    /// requests with `enforcer`'s policy, kill switch and store. Each answer
    /// is told to `observe` with the time it took until its response head
    /// (the caller's metrics; a function item costs nothing to carry). The
    /// task ends when every worker has finished its requests in flight.
    pub fn spawn<S, O>(
        self,
        enforcer: &Arc<Enforcer<S>>,
        stopped: watch::Receiver<()>,
        observe: O,
    ) -> JoinHandle<Result<(), Error>>
    where
        S: Store + 'static,
        O: Fn(Outcome, Duration) + Clone + Send + 'static,
    {
        match self.settings.shedder.clone() {
            Some(shedder) => self.spawn_around(enforcer, stopped, observe, move |proxy| {
                Shed::new(proxy, Arc::clone(&shedder))
            }),
            None => self.spawn_around(enforcer, stopped, observe, |proxy| proxy),
        }
    }

    /// [`Gateway::spawn`] with the rate limit layer around what `wrap` makes
    /// of each worker's proxy: the proxy itself, or the shedder around it.
    fn spawn_around<S, O, W, I>(
        self,
        enforcer: &Arc<Enforcer<S>>,
        stopped: watch::Receiver<()>,
        observe: O,
        wrap: W,
    ) -> JoinHandle<Result<(), Error>>
    where
        S: Store + 'static,
        O: Fn(Outcome, Duration) + Clone + Send + 'static,
        W: Fn(Proxy) -> I + Clone + Send + 'static,
        I: Inner,
    {
        let layer = layer(&self.settings, enforcer);
        let (upstream, client_ip) = (
            self.settings.upstream.clone(),
            self.settings.client_ip.clone(),
        );
        let routes = Arc::clone(&self.settings.routes);
        self.serve(stopped, move || {
            let proxy = Proxy::new(upstream.clone(), client_ip.clone());
            let service = layer.layer(wrap(proxy));
            let routes = Arc::clone(&routes);
            let observe = observe.clone();
            move |peer: SocketAddr| {
                // The peer goes to the layer (for `ClientIpKey`) and the
                // proxy (for the forwarding headers) once per connection,
                // as a field of the service that each request clones.
                let mut service = service.clone();
                service.set_peer(peer.ip());
                service.get_mut().proxy_mut().set_peer(peer.ip());
                let (routes, observe) = (Arc::clone(&routes), observe.clone());
                move |request| handle(&service, &routes, &observe, request)
            }
        })
    }

    /// Serves as a bare reverse proxy until `stopped` changes: the same
    /// listeners, workers, connection limits and upstream pools as
    /// [`Gateway::spawn`], with no rate limit step (no descriptors, check,
    /// headers or hook). It is the floor `scripts/bench-gateway` measures the
    /// gateway against, so that what the limiter costs shows apart from what
    /// the proxy costs (`examples/bare-proxy.rs`).
    pub fn spawn_bare(self, stopped: watch::Receiver<()>) -> JoinHandle<Result<(), Error>> {
        let (upstream, client_ip) = (
            self.settings.upstream.clone(),
            self.settings.client_ip.clone(),
        );
        self.serve(stopped, move || {
            let proxy = Proxy::new(upstream.clone(), client_ip.clone());
            move |peer: SocketAddr| {
                let mut proxy = proxy.clone();
                proxy.set_peer(peer.ip());
                move |request: Request<Incoming>| proxy.clone().call(request)
            }
        })
    }

    /// Serves every worker with the connection handler `make` builds on it
    /// (each worker gets a proxy, and so a pool of upstream connections, of
    /// its own) until `stopped` changes.
    fn serve<M, C, H, F, B>(
        self,
        stopped: watch::Receiver<()>,
        make: M,
    ) -> JoinHandle<Result<(), Error>>
    where
        M: Fn() -> C + Clone + Send + 'static,
        C: Fn(SocketAddr) -> H + Send + 'static,
        H: Fn(Request<Incoming>) -> F + Send + 'static,
        F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let limits = ConnectionLimits {
            max_connections: self.settings.max_connections,
            header_read_timeout: HEADER_READ_TIMEOUT,
            // hyper's header-read timer already closes a kept-alive HTTP/1
            // connection that waits this long for its next request.
            idle_timeout: HEADER_READ_TIMEOUT,
        };
        let acceptor = Acceptor::new("gateway", limits, Protocol::Http1);
        self.listeners.serve(stopped, acceptor, make)
    }
}

/// The layer, deciding with the service's enforcer (its policy, kill
/// switch, store and observer).
fn layer<S: Store + 'static>(settings: &Settings, enforcer: &Arc<Enforcer<S>>) -> RateLimitLayer {
    let mut builder = RateLimitLayer::shared(settings.domain.clone(), Arc::clone(enforcer))
        .headers(settings.headers);
    if settings.rate_limits.is_empty() {
        builder = builder.descriptor(ClientIpKey::new(settings.client_ip.clone()));
    }
    for spec in &settings.rate_limits {
        builder = builder.descriptor(spec.source(&settings.client_ip));
    }
    builder.build()
}

/// What the rate limit layer wraps on each worker: the proxy, or the
/// shedder around it. Its body tells how a request was answered.
pub(crate) trait Inner:
    Service<Request<Incoming>, Response = Response<Self::Body>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static
{
    /// The body of its answers.
    type Body: Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static;

    /// The proxy inside.
    fn proxy_mut(&mut self) -> &mut Proxy;

    /// How a request that went through the rate limit layer was answered.
    fn outcome(body: &Self::Body) -> Outcome;
}

impl Inner for Proxy {
    type Body = ProxyBody;

    fn proxy_mut(&mut self) -> &mut Proxy {
        self
    }

    fn outcome(_: &ProxyBody) -> Outcome {
        Outcome::Forwarded
    }
}

impl Inner for Shed<Proxy> {
    type Body = ResponseBody<ProxyBody>;

    fn proxy_mut(&mut self) -> &mut Proxy {
        self.get_mut()
    }

    fn outcome(body: &Self::Body) -> Outcome {
        if body.is_inner() {
            Outcome::Forwarded
        } else {
            Outcome::Shed
        }
    }
}

/// One request of a connection that `service` (set up with its peer)
/// answers: the route template goes into the request; the answer is told to
/// `observe`: [`Outcome::Forwarded`] when it went through to the proxy,
/// [`Outcome::Limited`] when the layer answered it, [`Outcome::Shed`] when
/// the shedder did, or the layer did for a shed verdict (503).
fn handle<I, O>(
    service: &RateLimit<I>,
    routes: &Routes,
    observe: &O,
    mut request: Request<Incoming>,
) -> impl Future<Output = Result<Response<ResponseBody<I::Body>>, Infallible>> + Send + use<I, O>
where
    I: Inner,
    O: Fn(Outcome, Duration) + Clone + Send + 'static,
{
    let started = Instant::now();
    if !routes.is_empty()
        && let Some(template) = routes.template(request.uri().path())
    {
        request.extensions_mut().insert(template);
    }
    // The proxy is always ready (its pool makes a connection when none is
    // idle), and so is the shedder (it answers at once when full), so the
    // layer is too: there is no `poll_ready` to wait for.
    let response = service.call_ready(request);
    let observe = observe.clone();
    async move {
        let response = response.await?;
        let outcome = match response.body().get_ref() {
            Some(inner) => I::outcome(inner),
            // The enforcer shed it on its domain's reported utilization.
            None if response.status() == http::StatusCode::SERVICE_UNAVAILABLE => Outcome::Shed,
            None => Outcome::Limited,
        };
        observe(outcome, started.elapsed());
        Ok(response)
    }
}
