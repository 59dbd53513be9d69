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
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::Error;
use tollgate_listen::Acceptor;

/// How long a client may take to send a request's headers, and so how long
/// an idle keep-alive connection stays open (hyper starts the timer when it
/// waits for the next request's head).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections waiting to be accepted, per worker.
const LISTEN_BACKLOG: u32 = 1024;

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

    /// Serves HTTP/1.1 on every worker with `acceptor`'s limits (one cap
    /// over every worker) until `stopped` changes, then lets the open
    /// connections finish their requests in flight (the caller bounds how
    /// long). `make` builds each worker's connection handler, called on that
    /// worker's thread: `connect(peer)` for each connection it accepts makes
    /// that connection's request handler, `handler(request)` (what is the
    /// same for every request of a connection is worked out once). The task
    /// ends when every worker has finished. On the caller's runtime, the task
    /// itself serves the one listener.
    pub(crate) fn serve<M, C, H, F, B>(
        self,
        stopped: watch::Receiver<()>,
        acceptor: Acceptor,
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
        if self.on_caller_runtime {
            // `bind` binds one listener in this mode.
            let listener = self.listeners.into_iter().next();
            return tokio::spawn(async move {
                if let Some(listener) = listener {
                    let listener = tokio_listener(listener).map_err(Error::Worker)?;
                    accept(&acceptor, listener, stopped, make()).await;
                }
                Ok(())
            });
        }
        let mut finished = Vec::with_capacity(self.listeners.len());
        for (index, listener) in self.listeners.into_iter().enumerate() {
            let (done, result) = oneshot::channel();
            let (stopped, make) = (stopped.clone(), make.clone());
            // Clones share the cap: a tokio semaphore works across runtimes.
            let acceptor = acceptor.clone();
            let started = std::thread::Builder::new()
                .name(format!("tollgate-gateway-{index}"))
                .spawn(move || {
                    let _ = done.send(worker(listener, stopped, &acceptor, make));
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
fn worker<M, C, H, F, B>(
    listener: std::net::TcpListener,
    stopped: watch::Receiver<()>,
    acceptor: &Acceptor,
    make: M,
) -> Result<(), Error>
where
    M: Fn() -> C,
    C: Fn(SocketAddr) -> H + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Send + 'static,
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
        accept(acceptor, listener, stopped, make()).await;
        Ok(())
    })
}

/// `listener` registered with the current runtime.
fn tokio_listener(listener: std::net::TcpListener) -> io::Result<TcpListener> {
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// Serves `listener` until `stopped` changes, each connection with the
/// handler `connect(peer)` makes.
async fn accept<C, H, F, B>(
    acceptor: &Acceptor,
    listener: TcpListener,
    stopped: watch::Receiver<()>,
    connect: C,
) where
    C: Fn(SocketAddr) -> H + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Send + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    acceptor
        .serve(listener, stopped, move |peer| service_fn(connect(peer)))
        .await;
}
