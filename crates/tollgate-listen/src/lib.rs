//! How every listener of Tollgate takes connections: the gateway's, and the
//! HTTP API's, gRPC's and admin's in `tollgate serve`. One job: accept, cap,
//! time out, wrap in TLS, sniff the first bytes for HTTP/2's preface, and hand
//! each connection to hyper with the service the caller gives.
//!
//! A listener holds at most [`ConnectionLimits::max_connections`] open
//! connections; past that, a new one is closed at once (as NGINX does past
//! `worker_connections`) and counted in `tollgate_refused_connections_total`,
//! so its descriptor comes straight back and a flood on one listener cannot
//! take the descriptors the others need. A connection with no request in
//! flight for [`ConnectionLimits::idle_timeout`] is closed gracefully (HTTP/2:
//! `GOAWAY`; HTTP/1: closed between requests), and one that has not closed
//! [`CLOSE_GRACE`] later is dropped; whatever it trickles meanwhile does not
//! count as a request. `tollgate_open_connections` says how many each
//! listener holds. An HTTP/1 request's head must arrive within
//! [`ConnectionLimits::header_read_timeout`] of the connection's opening or
//! of its last answer: a connection that has not begun with HTTP/2's
//! preface and has no request in flight for that long is dropped at once,
//! whatever part of a head it has sent. The idle watch keeps that time with
//! the one timer it has anyway, where hyper's `header_read_timeout` would
//! box, arm and drop a timer for every request (about 1,300 instructions
//! of each). An `accept` that fails (most
//! often: out of file descriptors) is counted in
//! `tollgate_accept_errors_total`, logged at WARN (at most once a second)
//! and retried after a short pause, so the loop neither spins nor stops.
//!
//! A listener given a TLS config ([`Acceptor::with_tls`]) wraps each
//! accepted connection in TLS before HTTP: the handshake holds the
//! connection's slot under the cap and must end within
//! [`ConnectionLimits::header_read_timeout`] (so a slow or stalled handshake
//! frees its slot as a slow head does), its time counts towards the idle
//! timeout, and one that fails or takes too long closes the connection and
//! is counted in `tollgate_tls_handshake_errors_total`. ALPN offers what the
//! listener's [`Protocol`] speaks (`h2` only for gRPC).

pub mod bodies;

use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use futures_util::task::AtomicWaker;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// The most bytes an HTTP/1 request's start line and headers may take
/// (`431` beyond; see [`Builders`] for the HTTP API's), and an HTTP/2
/// request's header list.
const MAX_HEAD_SIZE: usize = 32 * 1024;
/// The largest HTTP/1 read buffer of a connection.
const MAX_BUF_SIZE: usize = 64 * 1024;
/// How long to wait before accepting again after `accept` failed.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// The least time between two warnings of failing `accept`s.
const WARN_EVERY: Duration = Duration::from_secs(1);
/// How long a connection asked to close gracefully (idle, or the service
/// stopping) has before it is dropped; the service's own shutdown may bound
/// it more tightly.
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);
/// Connections a listener could not accept, by listener.
pub const ACCEPT_ERRORS: &str = "tollgate_accept_errors_total";
/// Connections closed at once because their listener held its maximum, by
/// listener.
pub const REFUSED_CONNECTIONS: &str = "tollgate_refused_connections_total";
/// Connections open now, by listener.
pub const OPEN_CONNECTIONS: &str = "tollgate_open_connections";
/// TLS handshakes that failed or did not end in time, by listener.
pub const TLS_HANDSHAKE_ERRORS: &str = "tollgate_tls_handshake_errors_total";

/// What one listener allows its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// How long an HTTP/1 request's head may take to arrive (a kept-alive
    /// connection that has waited this long for its next request is closed
    /// too), and a TLS handshake to end.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
}

/// The HTTP versions a listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 only (the gateway: what NGINX speaks to its clients).
    Http1,
    /// HTTP/2 only, with prior knowledge (gRPC).
    Http2,
    /// Either, told apart by the connection's first bytes (the HTTP API).
    Any,
}

/// One listener's connection policy and its count of open connections.
/// Clones share the count, so that several listening sockets on one address
/// (the gateway's workers) share one cap.
#[derive(Clone, Debug)]
pub struct Acceptor {
    name: &'static str,
    limits: ConnectionLimits,
    protocol: Protocol,
    open: Arc<Semaphore>,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl Acceptor {
    /// The policy of the listener called `name` (the `listener` label of its
    /// metrics and the subject of its log lines).
    pub fn new(name: &'static str, limits: ConnectionLimits, protocol: Protocol) -> Self {
        let permits = limits.max_connections.min(max_permits());
        Self {
            name,
            limits,
            protocol,
            open: Arc::new(Semaphore::new(permits)),
            tls: None,
        }
    }

    /// The same policy, serving TLS with `config` on every connection (see
    /// the module's doc). Its ALPN protocols are replaced by what the
    /// listener's [`Protocol`] speaks.
    #[must_use]
    pub fn with_tls(mut self, mut config: rustls::ServerConfig) -> Self {
        config.alpn_protocols = match self.protocol {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::Http2 => vec![b"h2".to_vec()],
            Protocol::Any => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        self.tls = Some(Arc::new(config));
        self
    }

    /// Serves `listener` until `stopped` changes (or its sender is dropped),
    /// then asks every open connection to close gracefully and returns once
    /// all of this acceptor's connections (those of its clones included)
    /// have closed. Each accepted connection is served by
    /// `make(peer)`'s service on a task of its own.
    pub async fn serve<M, S, B>(
        &self,
        listener: TcpListener,
        mut stopped: watch::Receiver<()>,
        make: M,
    ) where
        M: Fn(SocketAddr) -> S,
        S: Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let builders = Arc::new(self.builders());
        let mut last_warned: Option<Instant> = None;
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors, most often: said loudly,
                        // and counted, since every listener of the process
                        // suffers; but said once a second at most, as it
                        // fails again at every retry.
                        metrics::counter!(ACCEPT_ERRORS, "listener" => self.name).increment(1);
                        if last_warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                            tracing::warn!(%error, listener = self.name, "cannot accept a connection");
                            last_warned = Some(Instant::now());
                        }
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
                _ = stopped.changed() => break,
            };
            // It cannot wait in the backlog instead: the gateway's workers
            // share one cap but not one backlog, so a worker holding a free
            // permit could wait on an empty backlog while the connection sat
            // in another's.
            let Ok(permit) = Arc::clone(&self.open).try_acquire_owned() else {
                metrics::counter!(REFUSED_CONNECTIONS, "listener" => self.name).increment(1);
                tracing::debug!(%peer, listener = self.name, "connection closed: the listener holds its maximum");
                continue;
            };
            // Answers are small and must not wait for Nagle's timer.
            let _ = stream.set_nodelay(true);
            let activity = Arc::new(Activity::new());
            let service = Tracked {
                inner: make(peer),
                activity: Arc::clone(&activity),
            };
            let builders = Arc::clone(&builders);
            let (stopped, idle_timeout) = (stopped.clone(), self.limits.idle_timeout);
            let (tls, handshake_timeout) = (self.tls.clone(), self.limits.header_read_timeout);
            let name = self.name;
            let open = metrics::gauge!(OPEN_CONNECTIONS, "listener" => name);
            open.increment(1);
            let mut slot = Some(Slot {
                _permit: permit,
                open,
            });
            // An HTTP/2-only listener reads no HTTP/1 heads; only one that
            // speaks both needs a connection's first bytes to tell.
            let heads =
                (self.protocol != Protocol::Http2).then_some(self.limits.header_read_timeout);
            let sniff = self.protocol == Protocol::Any;
            tokio::spawn(async move {
                let mut watch = Watch {
                    activity: &activity,
                    idle_timeout,
                    heads,
                    stopped,
                    peer,
                };
                match tls {
                    None => {
                        let io = TokioIo::new(Sniffed::new(stream, &activity, sniff));
                        builders.serve(io, service, watch).await;
                    }
                    Some(tls) => {
                        let tls = TlsAcceptor::from(tls);
                        let handshake =
                            handshake(&tls, stream, handshake_timeout, &mut watch, name, &mut slot);
                        if let Some(stream) = handshake.await {
                            let io = TokioIo::new(Sniffed::new(stream, &activity, sniff));
                            builders.serve(io, service, watch).await;
                        }
                    }
                }
                drop(slot);
            });
        }
        drop(listener);
        // Every permit back means every connection has closed.
        let all = u32::try_from(self.limits.max_connections.min(max_permits())).unwrap_or(u32::MAX);
        let _ = self.open.acquire_many(all).await;
    }

    /// hyper's connection builder, with every limit set explicitly.
    fn builders(&self) -> Builders {
        // At most 100 header fields (`431` beyond): hyper's default, left
        // unset because setting it moves the parser's array to the heap.
        // hyper's header-read timer is off here and below: the connection's
        // idle watch bounds a head's arrival (see the module's doc).
        let mut http1 = http1::Builder::new();
        // The answer's head and body copied into one buffer and written with
        // one `write`, rather than queued as slices for `writev`: the
        // gateway's answers are a head and a few hundred bytes at most (a
        // 429, a small upstream answer), where the queue costs more than the
        // copy (docs/benchmarks.md, "Gateway vs NGINX limit_req"); a large
        // upstream body pays one more copy in memory.
        http1
            .writev(false)
            .timer(TokioTimer::new())
            .keep_alive(true)
            .half_close(false)
            .max_header_size(MAX_HEAD_SIZE)
            .max_buf_size(MAX_BUF_SIZE)
            .header_read_timeout(None);
        match self.protocol {
            Protocol::Http1 => return Builders::Http1(http1),
            // Made for each connection, with the executor of its streams.
            Protocol::Http2 => return Builders::Http2,
            Protocol::Any => {}
        }
        // hyper-util's builder cannot set hyper's head limit, so an HTTP/1
        // head here is bounded by the read buffer only (which a head read in
        // one piece can pass): the gateway, facing any client, speaks through
        // hyper's own builder instead.
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(TokioTimer::new())
            .keep_alive(true)
            .half_close(false)
            .max_buf_size(MAX_BUF_SIZE)
            .header_read_timeout(None);
        auto.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(MAX_HEADER_LIST_SIZE);
        Builders::Auto(auto)
    }
}

/// An HTTP/2 request's header list, at most.
const MAX_HEADER_LIST_SIZE: u32 = MAX_HEAD_SIZE as u32;

/// The connection builder of each [`Protocol`].
enum Builders {
    /// hyper's own: it alone bounds an HTTP/1 head's size.
    Http1(http1::Builder),
    /// hyper's, for HTTP/2 only, made for each connection: its streams run
    /// on the connection's task ([`OnTask`]) and its writes are
    /// [`Coalesced`].
    Http2,
    /// hyper-util's, for either version.
    Auto(auto::Builder<TokioExecutor>),
}

impl Builders {
    /// Serves one connection over `io` with `service`, watched by `watch`.
    async fn serve<I, S, B>(&self, io: I, service: S, watch: Watch<'_>)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
        S: Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match self {
            Builders::Http1(http1) => {
                let connection = http1.serve_connection(io, service);
                watch.serve(connection, |c| c.graceful_shutdown()).await;
            }
            Builders::Http2 => {
                let io = Coalesced {
                    io,
                    deferred: false,
                };
                let streams = Streams::default();
                let mut http2 = http2::Builder::new(streams.clone());
                http2
                    .timer(TokioTimer::new())
                    .max_header_list_size(MAX_HEADER_LIST_SIZE);
                let connection = OnTask::new(http2.serve_connection(io, service), streams);
                watch
                    .serve(connection, |c| c.connection().graceful_shutdown())
                    .await;
            }
            Builders::Auto(auto) => {
                let connection = auto.serve_connection(io, service);
                watch.serve(connection, |c| c.graceful_shutdown()).await;
            }
        }
    }
}

/// The streams an HTTP/2 connection has begun and not yet polled: the
/// executor hyper hands each stream's future to (and, for `CONNECT`, the
/// upgraded stream's), so that it runs on the connection's own task
/// ([`OnTask`]).
///
/// Spawned as tasks of their own, as hyper-util's executor does, each
/// stream cost its task's allocation and registration, and its spawn woke
/// a parked worker to steal it: a futex or eventfd wake, a context switch,
/// and the stream's answer crossing back to the connection's worker, on
/// every call. Envoy keeps one connection per worker with every call in
/// flight on it, so this cost every call (`scripts/bench-rls-cpu`).
/// Connections still spread over the runtime's workers.
#[derive(Clone, Default)]
struct Streams(Arc<std::sync::Mutex<Vec<StreamFuture>>>);

type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Streams {
    /// The streams begun since the last call.
    fn take(&self) -> Vec<StreamFuture> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for Streams {
    fn execute(&self, stream: F) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::pin(stream));
    }
}

pin_project_lite::pin_project! {
    /// An HTTP/2 connection with its streams: each poll polls the
    /// connection, then the streams it began ([`Streams`]) and those woken
    /// since, and again while either woke the other meanwhile ([`Rewake`]).
    /// Streams left when the connection ends are dropped with it, as
    /// hyper's own tasks find their connection gone.
    struct OnTask<C> {
        #[pin]
        connection: C,
        streams: Streams,
        running: FuturesUnordered<StreamFuture>,
        rewake: Arc<Rewake>,
        waker: Waker,
    }
}

/// The most rounds of one [`OnTask`] poll: a connection that keeps waking
/// itself (its share of tokio's budget spent) then yields to the runtime.
const ROUNDS: usize = 4;

impl<C> OnTask<C> {
    fn new(connection: C, streams: Streams) -> Self {
        let rewake = Arc::new(Rewake::default());
        Self {
            connection,
            streams,
            running: FuturesUnordered::new(),
            waker: Waker::from(Arc::clone(&rewake)),
            rewake,
        }
    }

    fn connection(self: Pin<&mut Self>) -> Pin<&mut C> {
        self.project().connection
    }
}

impl<C: Future> Future for OnTask<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let mut this = self.project();
        let rewake = &**this.rewake;
        rewake.task.register(cx.waker());
        rewake.polling.store(true, Ordering::SeqCst);
        let mut inner = Context::from_waker(this.waker);
        let mut ended = Poll::Pending;
        for _ in 0..ROUNDS {
            rewake.woken.store(false, Ordering::SeqCst);
            ended = this.connection.as_mut().poll(&mut inner);
            loop {
                let begun = this.streams.take();
                let none_begun = begun.is_empty();
                this.running.extend(begun);
                // Polls the woken streams until none is ready (it yields, and
                // wakes this task, after a few dozen).
                while let Poll::Ready(Some(())) = this.running.poll_next_unpin(&mut inner) {}
                // A stream polled may have begun another (an upgrade's).
                if none_begun {
                    break;
                }
            }
            if ended.is_ready() || !rewake.woken.load(Ordering::SeqCst) {
                break;
            }
        }
        rewake.polling.store(false, Ordering::SeqCst);
        // A wake taken up by no round: the task runs again.
        if ended.is_pending() && rewake.woken.load(Ordering::SeqCst) {
            cx.waker().wake_by_ref();
        }
        ended
    }
}

/// The waker an [`OnTask`] polls its connection and streams with. A wake
/// while it polls them (a stream's answer queued for the connection to
/// write, a write waiting its [`Coalesced`] turn) is taken up by polling
/// again before the poll returns; any other wakes the task.
///
/// Woken through the task's own waker, the task was queued again as a
/// yield: tokio then wakes a parked worker to run it (a futex wake and a
/// context switch on another core, which mostly finds nothing to do), two
/// or three times for each batch of calls Envoy sends
/// (`scripts/bench-rls-cpu`).
#[derive(Default)]
struct Rewake {
    /// The [`OnTask`] is polling.
    polling: AtomicBool,
    /// Woken since the round began.
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Rewake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Sequentially consistent with the poll's own stores and loads, so
        // that a wake racing its end is seen by one of the two.
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// An HTTP/2 connection's socket, whose every write waits for one more
/// round of its [`OnTask`] first, so that answers finished meanwhile leave
/// with it.
///
/// The connection is polled before its streams: written at once, the
/// answers already queued left alone, and those the streams then finished
/// in a `writev` of their own (and on loopback, the peer's wake-up). Asked
/// again after the streams ([`Rewake`] takes up the wake), h2 writes every
/// answer ready by then in one go (docs/benchmarks.md, "HTTP and gRPC
/// checks vs throttlecrab-server").
struct Coalesced<I> {
    io: I,
    /// The next write has waited its turn.
    deferred: bool,
}

impl<I> Coalesced<I> {
    /// Ready when the write may go: the second time it is asked.
    fn turn(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if std::mem::take(&mut self.deferred) {
            return Poll::Ready(());
        }
        self.deferred = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<I: hyper::rt::Read + Unpin> hyper::rt::Read for Coalesced<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: hyper::rt::Write + Unpin> hyper::rt::Write for Coalesced<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::task::ready!(self.turn(cx));
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        std::task::ready!(self.turn(cx));
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The start of HTTP/2's connection preface (`PRI * HTTP/2.0`), which no
/// HTTP/1 request begins with.
const H2_PREFACE_START: &[u8] = b"PRI ";

/// A connection's stream, telling its [`Activity`] whether its first bytes
/// are HTTP/2's preface: the idle watch bounds how long an HTTP/1 head may
/// take, and an HTTP/2 connection reads none.
struct Sniffed<S> {
    stream: S,
    activity: Arc<Activity>,
    /// How many of the first bytes matched [`H2_PREFACE_START`], or
    /// `None` once that is settled.
    matched: Option<usize>,
}

impl<S> Sniffed<S> {
    /// `stream`, looked at when `sniff` (a listener that speaks HTTP/1 and
    /// HTTP/2); on any other, the listener's protocol is the connection's.
    fn new(stream: S, activity: &Arc<Activity>, sniff: bool) -> Self {
        Self {
            stream,
            activity: Arc::clone(activity),
            matched: sniff.then_some(0),
        }
    }

    /// Looks at `read`, the bytes read last, until the start is settled.
    fn look(&mut self, read: &[u8]) {
        let Some(matched) = self.matched else {
            return;
        };
        let rest = &H2_PREFACE_START[matched..];
        let n = rest.len().min(read.len());
        self.matched = if read[..n] != rest[..n] {
            None
        } else if n == rest.len() {
            self.activity.http2.store(true, Ordering::Relaxed);
            None
        } else {
            Some(matched + n)
        };
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sniffed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if self.matched.is_some() && read.is_ready() {
            self.look(&buf.filled()[before..]);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sniffed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A connection's place under its listener's cap, given back when dropped.
struct Slot {
    _permit: OwnedSemaphorePermit,
    open: metrics::Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.decrement(1);
    }
}

/// The TLS handshake of `stream`, within `timeout`; `None` (the connection
/// closed) when it fails, takes longer, or the service stops meanwhile. A
/// failed handshake gives its `slot` back before its connection closes, so
/// that a client seeing the close finds the slot free.
async fn handshake(
    tls: &TlsAcceptor,
    stream: TcpStream,
    timeout: Duration,
    watch: &mut Watch<'_>,
    listener: &'static str,
    slot: &mut Option<Slot>,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let peer = watch.peer;
    let mut failed = |error: &dyn std::fmt::Display| {
        metrics::counter!(TLS_HANDSHAKE_ERRORS, "listener" => listener).increment(1);
        // At DEBUG: a client with a wrong certificate, or a scanner, would
        // otherwise fill the log.
        tracing::debug!(%peer, listener, %error, "TLS handshake failed");
        drop(slot.take());
    };
    let mut accept = pin!(tls.accept(stream).into_fallible());
    tokio::select! {
        done = &mut accept => match done {
            Ok(stream) => Some(stream),
            Err((error, stream)) => {
                failed(&error);
                drop(stream);
                None
            }
        },
        () = tokio::time::sleep(timeout) => {
            failed(&"did not end within the header-read timeout");
            None
        }
        _ = watch.stopped.changed() => None,
    }
}

/// What serving one connection needs besides the connection.
struct Watch<'a> {
    activity: &'a Activity,
    idle_timeout: Duration,
    /// How long an HTTP/1 request's head may take to arrive: `None` on a
    /// listener that speaks HTTP/2 only.
    heads: Option<Duration>,
    stopped: watch::Receiver<()>,
    peer: SocketAddr,
}

/// Why a connection's watchers want it closed.
enum Close {
    /// No request in flight for the idle timeout: asked to close.
    Idle,
    /// No request head in time on a connection that does not speak HTTP/2:
    /// dropped at once. HTTP/1 has nothing in flight to lose then, and
    /// asked to close, hyper would wait for a head begun on a fresh
    /// connection.
    Head,
    /// The service stops: asked to close.
    Stopping,
}

impl Watch<'_> {
    /// How long the connection may go with no request in flight, and how it
    /// is closed then: unless it speaks HTTP/2, dropped at the header-read
    /// or the idle timeout, whichever is shorter.
    fn limit(&self) -> (Duration, Close) {
        match self.heads {
            Some(heads) if !self.activity.speaks_http2() => {
                (heads.min(self.idle_timeout), Close::Head)
            }
            _ => (self.idle_timeout, Close::Idle),
        }
    }

    /// Serves `connection` until it ends, asking it to close (`shut_down`)
    /// when it has been idle for the idle timeout or the service stops (or
    /// dropping it, when no request head came in time), and dropping it
    /// [`CLOSE_GRACE`] after asking.
    ///
    /// The watchers (the idle timer, the stop signal, then the grace timer)
    /// are polled only when one of them has woken the task ([`Woken`]), not
    /// on every wake the connection's own reads and writes cause: polled
    /// beside the connection each time, they cost about 800 instructions a
    /// request (`scripts/profile-gateway`).
    async fn serve<C, E>(mut self, connection: C, shut_down: impl Fn(Pin<&mut C>))
    where
        C: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let peer = self.peer;
        let mut connection = pin!(connection);
        let woken = Arc::new(Woken::default());
        let watchers_waker = Waker::from(Arc::clone(&woken));
        let mut asked = pin!(self.close_asked());
        // Set once the connection has been asked to close.
        let mut grace: Option<Pin<Box<tokio::time::Sleep>>> = None;
        poll_fn(|cx| {
            woken.task.register(cx.waker());
            loop {
                if let Poll::Ready(ended) = connection.as_mut().poll(cx) {
                    if let Err(error) = ended {
                        tracing::debug!(%error, %peer, "connection ended with an error");
                    }
                    return Poll::Ready(());
                }
                if !woken.take() {
                    return Poll::Pending;
                }
                let mut watchers = Context::from_waker(&watchers_waker);
                match &mut grace {
                    Some(grace) => return grace.as_mut().poll(&mut watchers),
                    None => {
                        match asked.as_mut().poll(&mut watchers) {
                            Poll::Pending => return Poll::Pending,
                            Poll::Ready(Close::Head) => {
                                tracing::debug!(%peer, "connection closed: no request head in time");
                                return Poll::Ready(());
                            }
                            Poll::Ready(Close::Idle | Close::Stopping) => {}
                        }
                        shut_down(connection.as_mut());
                        grace = Some(Box::pin(tokio::time::sleep(CLOSE_GRACE)));
                        // The connection may end at once: polled again,
                        // then (if it does not) the grace timer.
                        woken.woken.store(true, Ordering::Release);
                    }
                }
            }
        })
        .await;
    }

    /// Returns when the connection should be closed, and why: it has had no
    /// request in flight for its [`Watch::limit`], or the service stops.
    async fn close_asked(&mut self) -> Close {
        let mut check_at = Instant::now() + self.limit().0;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(check_at) => {
                    // Looked at anew each time: a connection found to speak
                    // HTTP/2 meanwhile has the idle timeout.
                    let (timeout, close) = self.limit();
                    match self.activity.idle_deadline(timeout) {
                        Some(deadline) if deadline <= Instant::now() => return close,
                        Some(deadline) => check_at = deadline,
                        // In flight: looked at again one timeout from now
                        // at the earliest.
                        None => check_at = Instant::now() + timeout,
                    }
                }
                _ = self.stopped.changed() => return Close::Stopping,
            }
        }
    }
}

/// Whether a connection's watchers have woken its task since they were
/// last polled, and the task to wake.
struct Woken {
    /// Set by the watchers' wakes; true at first, so that they are polled
    /// (and their wakers registered) on the first turn.
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Default for Woken {
    fn default() -> Self {
        Self {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        }
    }
}

impl Woken {
    /// Whether the watchers woke the task, clearing it.
    fn take(&self) -> bool {
        self.woken.load(Ordering::Acquire) && self.woken.swap(false, Ordering::AcqRel)
    }
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// The most permits a semaphore holds, and that `acquire_many` can take back.
fn max_permits() -> usize {
    Semaphore::MAX_PERMITS.min(u32::MAX as usize)
}

/// How a connection has been used: requests in flight, and when the last
/// one ended. Updated by [`Tracked`], read by the idle watch.
struct Activity {
    opened: Instant,
    in_flight: AtomicU64,
    /// Nanoseconds from `opened` to the end of the last request.
    last_end: AtomicU64,
    /// The connection began with HTTP/2's preface ([`Sniffed`]).
    http2: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            in_flight: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            http2: AtomicBool::new(false),
        }
    }

    fn speaks_http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// When the connection will have been idle for `timeout`, if nothing
    /// starts meanwhile: `None` while a request is in flight.
    fn idle_deadline(&self, timeout: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last_end = Duration::from_nanos(self.last_end.load(Ordering::Acquire));
        Some(self.opened + last_end + timeout)
    }

    fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn ended(&self) {
        let since_open = u64::try_from(self.opened.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_end.fetch_max(since_open, Ordering::AcqRel);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's service, telling [`Activity`] when each request starts
/// and when its answer's head is ready (the body of every answer this
/// service gives is small and already in memory, or streams from the
/// gateway's upstream, which has its own timeouts).
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, B> Service<Request<Incoming>> for Tracked<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = InFlight<S::Future>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        self.activity.started();
        InFlight {
            answer: self.inner.call(request),
            ends: Some(Ends(Arc::clone(&self.activity))),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer on its way. The request stays in flight until its
    /// answer's body has been sent (or the answer is dropped: cancelled with
    /// its connection), so a long download is never cut as idle.
    struct InFlight<F> {
        #[pin]
        answer: F,
        ends: Option<Ends>,
    }
}

impl<F, B, E> Future for InFlight<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.answer.poll(cx))?;
        let ends = this.ends.take();
        Poll::Ready(Ok(answer.map(|body| TrackedBody { body, _ends: ends })))
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, ending its request's time in flight when dropped.
    struct TrackedBody<B> {
        #[pin]
        body: B,
        _ends: Option<Ends>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Ends a request's time in flight when dropped.
struct Ends(Arc<Activity>);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.ended();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::{Wake, Waker};

    use tokio::io::{AsyncRead, ReadBuf};

    use super::*;

    /// Counts its wakes.
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// How long a head may take in a [`head_test_listener`].
    const HEAD: Duration = Duration::from_secs(2);
    /// How long a connection may idle in most [`head_test_listener`]s.
    const IDLE: Duration = Duration::from_secs(5);

    /// A listener speaking `protocol` with [`HEAD`] and `idle_timeout`,
    /// answering `ok` to every request; its address.
    async fn head_test_listener(protocol: Protocol, idle_timeout: Duration) -> SocketAddr {
        let limits = ConnectionLimits {
            max_connections: 8,
            header_read_timeout: HEAD,
            idle_timeout,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            // Never signalled: the listener serves until the test ends.
            let (_stop, stopped) = watch::channel(());
            let acceptor = Acceptor::new("test", limits, protocol);
            acceptor
                .serve(listener, stopped, |_peer| {
                    hyper::service::service_fn(|_request| async {
                        Ok::<_, std::convert::Infallible>(Response::new(String::from("ok")))
                    })
                })
                .await;
        });
        addr
    }

    /// How long after `since` `stream` is closed, and what it was sent.
    async fn closed_after(mut stream: TcpStream, since: Instant) -> (Duration, Vec<u8>) {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.expect("read");
        (since.elapsed(), got)
    }

    /// A request's head must arrive within the header-read timeout of the
    /// connection opening or of the last answer, on an HTTP/1 listener
    /// (with a longer idle timeout, and with the same one, as the gateway
    /// has) and on one that speaks either version: a connection that sends
    /// nothing, one that sends part of a head, and one kept alive after an
    /// answer are each closed that long after, and not before (on paused
    /// time).
    #[tokio::test(start_paused = true)]
    async fn an_http1_head_must_arrive_within_the_header_read_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        for (protocol, idle) in [
            (Protocol::Http1, IDLE),
            (Protocol::Http1, HEAD),
            (Protocol::Any, IDLE),
        ] {
            let addr = head_test_listener(protocol, idle).await;
            let silent = async {
                let stream = TcpStream::connect(addr).await.expect("connect");
                closed_after(stream, Instant::now()).await
            };
            let slow = async {
                let mut stream = TcpStream::connect(addr).await.expect("connect");
                let opened = Instant::now();
                stream
                    .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n")
                    .await
                    .expect("write");
                closed_after(stream, opened).await
            };
            let kept = async {
                let mut stream = TcpStream::connect(addr).await.expect("connect");
                stream
                    .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
                    .await
                    .expect("write");
                let mut answer = [0; 256];
                let mut read = 0;
                while !answer[..read].ends_with(b"ok") {
                    read += stream.read(&mut answer[read..]).await.expect("read");
                }
                closed_after(stream, Instant::now()).await
            };
            let (silent, slow, kept) = tokio::join!(silent, slow, kept);
            for (name, (after, _)) in [("silent", &silent), ("slow", &slow), ("kept", &kept)] {
                assert!(
                    (HEAD..HEAD + Duration::from_millis(100)).contains(after),
                    "{protocol:?}, idle {idle:?}: the {name} connection closed after {after:?}"
                );
            }
            assert!(
                silent.1.is_empty() && kept.1.is_empty(),
                "nothing more is sent"
            );
        }
    }

    /// On a listener that speaks either version, a connection that began
    /// with HTTP/2's preface reads no HTTP/1 head: it is asked to go away
    /// (`GOAWAY`) at the idle timeout, not dropped at the header-read one.
    #[tokio::test(start_paused = true)]
    async fn an_http2_connection_is_not_held_to_the_header_read_timeout() {
        use tokio::io::AsyncWriteExt;

        let addr = head_test_listener(Protocol::Any, IDLE).await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let opened = Instant::now();
        // The preface in two writes, as a client may send it, and an empty
        // SETTINGS frame.
        stream.write_all(b"PR").await.expect("write");
        tokio::task::yield_now().await;
        stream
            .write_all(b"I * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .expect("write");
        let (after, sent) = closed_after(stream, opened).await;
        // This client never answers the PING that ends a graceful close, so
        // it is dropped the grace after.
        assert!(
            (IDLE + CLOSE_GRACE..IDLE + CLOSE_GRACE + Duration::from_millis(100)).contains(&after),
            "closed after {after:?}"
        );
        // A GOAWAY frame (type 7) after the server's SETTINGS.
        assert!(
            sent.windows(4).any(|w| w[3] == 7 && w[..3] == [0, 0, 8]),
            "{sent:?}"
        );
    }

    /// Every stream of an HTTP/2 connection runs on the connection's task
    /// (no task of its own, see [`Streams`]), and connections on tasks of
    /// their own.
    #[tokio::test]
    async fn an_http2_connections_streams_run_on_its_task() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (_stop, stopped) = watch::channel(());
        tokio::spawn(async move {
            let limits = ConnectionLimits {
                max_connections: 8,
                header_read_timeout: HEAD,
                idle_timeout: IDLE,
            };
            Acceptor::new("test", limits, Protocol::Http2)
                .serve(listener, stopped, |_peer| {
                    hyper::service::service_fn(|_request| async {
                        // Where the answer's future is polled.
                        let task = tokio::task::id().to_string();
                        Ok::<_, std::convert::Infallible>(Response::new(task))
                    })
                })
                .await;
        });
        let tasks_of_one_connection = || async {
            let stream = TcpStream::connect(addr).await.expect("connect");
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .expect("handshake");
            tokio::spawn(connection);
            let ask = || {
                let mut sender = sender.clone();
                async move {
                    let request = Request::get(format!("http://{addr}/"))
                        .body(String::new())
                        .expect("request");
                    let answer = sender.send_request(request).await.expect("answer");
                    let body = http_body_util::BodyExt::collect(answer.into_body())
                        .await
                        .expect("body");
                    String::from_utf8(body.to_bytes().to_vec()).expect("text")
                }
            };
            let tasks = futures_util::future::join_all((0..4).map(|_| ask())).await;
            assert!(tasks.iter().all(|t| *t == tasks[0]), "{tasks:?}");
            tasks[0].clone()
        };
        let (one, other) = tokio::join!(tasks_of_one_connection(), tasks_of_one_connection());
        assert_ne!(one, other, "each connection has its task");
    }

    #[test]
    fn the_first_bytes_say_whether_a_connection_speaks_http2() {
        for (reads, http2) in [
            (&[&b"PRI * HTTP/2.0"[..]][..], true),
            (&[&b"P"[..], b"R", b"I ", b"* HTTP"][..], true),
            (&[&b"POST / HTTP/1.1"[..]][..], false),
            (&[&b"PR"[..], b"OPFIND"][..], false),
            (&[&b"PRI"[..]][..], false),
        ] {
            let activity = Arc::new(Activity::new());
            let mut sniffed = Sniffed::new((), &activity, true);
            for read in reads {
                sniffed.look(read);
            }
            assert_eq!(activity.speaks_http2(), http2, "{reads:?}");
        }
        // A listener of one protocol does not look.
        let activity = Arc::new(Activity::new());
        Sniffed::new((), &activity, false).look(b"PRI * HTTP/2.0");
        assert!(!activity.speaks_http2());
    }

    /// What one poll of [`OnTask`] over a connection that wakes itself on
    /// its first `self_wakes` polls came to: the connection's polls, the
    /// times the task was queued again, and the connection's last waker.
    struct Polled {
        polls: usize,
        wakes: Arc<Wakes>,
        kept: Option<Waker>,
    }

    fn poll_waking(self_wakes: usize) -> Polled {
        let polls = Arc::new(AtomicUsize::new(0));
        let kept = Arc::new(std::sync::Mutex::new(None));
        let connection = {
            let (polls, kept) = (Arc::clone(&polls), Arc::clone(&kept));
            std::future::poll_fn(move |cx| {
                if polls.fetch_add(1, Ordering::SeqCst) < self_wakes {
                    cx.waker().wake_by_ref();
                }
                *kept.lock().expect("waker") = Some(cx.waker().clone());
                Poll::<()>::Pending
            })
        };
        let mut on_task = pin!(OnTask::new(connection, Streams::default()));
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&wakes));
        assert!(
            on_task
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        let kept = kept.lock().expect("waker").take();
        Polled {
            polls: polls.load(Ordering::SeqCst),
            wakes,
            kept,
        }
    }

    #[test]
    fn a_connection_woken_while_polled_is_polled_again_not_requeued() {
        let polled = poll_waking(1);
        assert_eq!(polled.polls, 2, "polled again in the same poll");
        assert_eq!(
            polled.wakes.0.load(Ordering::SeqCst),
            0,
            "the task is not queued again"
        );

        // Woken once the poll is over (its socket readable): the task runs.
        polled.kept.expect("kept").wake();
        assert_eq!(polled.wakes.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_connection_that_keeps_waking_itself_yields_to_the_runtime() {
        let polled = poll_waking(usize::MAX);
        assert_eq!(polled.polls, ROUNDS);
        assert_eq!(
            polled.wakes.0.load(Ordering::SeqCst),
            1,
            "queued again, once"
        );
    }

    #[test]
    fn each_write_waits_one_turn_then_goes_whole() {
        let (client, mut peer) = tokio::io::duplex(64);
        let mut io = Coalesced {
            io: TokioIo::new(client),
            deferred: false,
        };
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut write =
            |io: &mut Coalesced<_>| hyper::rt::Write::poll_write(Pin::new(io), &mut cx, b"answer");

        assert!(write(&mut io).is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "asks to be polled again");
        assert!(matches!(write(&mut io), Poll::Ready(Ok(6))));
        assert!(write(&mut io).is_pending(), "the next write waits again");
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);

        let mut got = [0; 16];
        let mut buf = ReadBuf::new(&mut got);
        let read = Pin::new(&mut peer).poll_read(&mut Context::from_waker(Waker::noop()), &mut buf);
        assert!(matches!(read, Poll::Ready(Ok(()))));
        assert_eq!(buf.filled(), b"answer", "written once, whole");
    }
}
