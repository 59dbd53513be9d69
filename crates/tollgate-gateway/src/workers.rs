//! The gateway's worker threads: one per CPU, each with a single-threaded
//! runtime and a listener of its own on the shared address (`SO_REUSEPORT`:
//! the kernel spreads new connections over them), as NGINX runs one worker
//! process per CPU. A connection never leaves the thread that accepted it, so
//! no task or wake-up crosses threads on the way through a proxied request;
//! on a small machine, those hand-offs cost more than the rate limit check
//! itself. (The HTTP API, whose requests are much shorter, measured no
//! better this way: see the server's `serve.rs`.)

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinHandle;

use crate::Error;

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
/// Connections a listener could not accept, by listener.
pub(crate) const ACCEPT_ERRORS: &str = "tollgate_accept_errors_total";
/// Connections closed at once because the listener held its maximum.
pub(crate) const REFUSED_CONNECTIONS: &str = "tollgate_refused_connections_total";

/// One listening socket per worker, all on one address; or one socket
/// served on the caller's runtime.
#[derive(Debug)]
pub(crate) struct Listeners {
    listeners: Vec<std::net::TcpListener>,
    addr: SocketAddr,
    on_caller_runtime: bool,
}

/// Resolves `addr` and binds it once per worker (port 0 picks a free port,
/// the same for every worker), or once to be served on the caller's runtime.
pub(crate) async fn bind(addr: &str, on_caller_runtime: bool) -> Result<Listeners, Error> {
    bind_all(addr, on_caller_runtime)
        .await
        .map_err(|source| Error::Listen {
            addr: addr.to_owned(),
            source,
        })
}

async fn bind_all(addr: &str, on_caller_runtime: bool) -> io::Result<Listeners> {
    let resolved = tokio::net::lookup_host(addr)
        .await?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the name has no address"))?;
    let first = listen(resolved)?;
    let bound = first.local_addr()?;
    let mut listeners = vec![first];
    let workers = if on_caller_runtime { 1 } else { workers() };
    for _ in 1..workers {
        listeners.push(listen(bound)?);
    }
    Ok(Listeners {
        listeners,
        addr: bound,
        on_caller_runtime,
    })
}

/// How many workers serve each listener: one per CPU. Without
/// `SO_REUSEPORT` (outside Unix), one.
fn workers() -> usize {
    if cfg!(unix) {
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    } else {
        1
    }
}

/// A listening socket on `addr`, shareable with the other workers'.
fn listen(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
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

impl Listeners {
    /// The address every worker listens on.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves HTTP/1.1 on every worker until `stopped` changes, then lets
    /// the open connections finish their requests in flight (the caller
    /// bounds how long). `make` builds each worker's request handler, called
    /// on that worker's thread: `handler(peer, request)`. The task ends when
    /// every worker has finished. On the caller's runtime, the task itself
    /// serves the one listener.
    pub(crate) fn serve<M, H, F, B>(
        self,
        stopped: watch::Receiver<()>,
        max_connections: usize,
        make: M,
    ) -> JoinHandle<Result<(), Error>>
    where
        M: Fn() -> H + Clone + Send + 'static,
        H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + 'static,
        F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // One cap over every worker: a tokio semaphore works across runtimes.
        let connections = Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS)));
        if self.on_caller_runtime {
            // `bind` binds one listener in this mode.
            let listener = self.listeners.into_iter().next();
            return tokio::spawn(async move {
                if let Some(listener) = listener {
                    let listener = tokio_listener(listener).map_err(Error::Worker)?;
                    accept(listener, stopped, connections, make()).await;
                }
                Ok(())
            });
        }
        let mut finished = Vec::with_capacity(self.listeners.len());
        for (index, listener) in self.listeners.into_iter().enumerate() {
            let (done, result) = oneshot::channel();
            let (stopped, make) = (stopped.clone(), make.clone());
            let connections = Arc::clone(&connections);
            let started = std::thread::Builder::new()
                .name(format!("tollgate-gateway-{index}"))
                .spawn(move || {
                    let _ = done.send(worker(listener, stopped, connections, make));
                });
            if let Err(error) = started {
                // The workers already started stop with the shutdown signal.
                return tokio::spawn(async move { Err(Error::Worker(error)) });
            }
            finished.push(result);
        }
        tokio::spawn(async move {
            for result in finished {
                // The sender is dropped unsent only by a panic.
                result.await.map_err(|_| Error::WorkerPanicked)??;
            }
            Ok(())
        })
    }
}

/// One worker thread: a single-threaded runtime serving `listener`.
fn worker<M, H, F, B>(
    listener: std::net::TcpListener,
    stopped: watch::Receiver<()>,
    connections: Arc<Semaphore>,
    make: M,
) -> Result<(), Error>
where
    M: Fn() -> H,
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Worker)?;
    runtime.block_on(async move {
        let listener = tokio_listener(listener).map_err(Error::Worker)?;
        accept(listener, stopped, connections, make()).await;
        Ok(())
    })
}

/// `listener` registered with the current runtime.
fn tokio_listener(listener: std::net::TcpListener) -> io::Result<TcpListener> {
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// Accepts connections until `stopped` changes, closing at once those past
/// the cap, then waits for the open ones to finish their requests in flight.
async fn accept<H, F, B>(
    listener: TcpListener,
    mut stopped: watch::Receiver<()>,
    connections: Arc<Semaphore>,
    handler: H,
) where
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
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
                    // Out of file descriptors, most often: said loudly, and
                    // counted, since every listener of the process suffers.
                    tracing::warn!(%error, "cannot accept a gateway connection");
                    metrics::counter!(ACCEPT_ERRORS, "listener" => "gateway").increment(1);
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = stopped.changed() => break,
        };
        // Past the cap, a connection is closed at once, as NGINX does past
        // `worker_connections`, so its descriptor comes straight back. (It
        // cannot wait in the backlog instead: the workers' listeners share
        // one cap but not one backlog, so a worker holding a free permit
        // could wait on an empty backlog while the connection sat in
        // another's.)
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            metrics::counter!(REFUSED_CONNECTIONS, "listener" => "gateway").increment(1);
            tracing::debug!(%peer, "connection closed: the gateway holds its maximum");
            drop(stream);
            continue;
        };
        let handler = handler.clone();
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| handler(peer, request)),
        );
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
