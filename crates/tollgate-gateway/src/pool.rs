//! The upstream connections of one gateway worker: HTTP/1.1 connections
//! kept alive and reused, most recently used first.
//!
//! A connection goes back to the pool once the response it carried has been
//! read to its end (its body is a [`PooledBody`] that hands it back); one
//! whose response is abandoned halfway is closed, as HTTP/1.1 cannot reuse
//! it. A pooled connection the upstream has meanwhile closed is noticed
//! before use, or, when the close races the request, the request (not yet
//! written) is sent again on a new connection. Each worker thread has its own
//! pool, so a request never waits on another thread.
//!
//! A request's response head must arrive within [`UPSTREAM_TIMEOUT`] of its
//! start (connecting included). Each connection keeps one timer for the
//! deadline of the request it carries, moved on for each request: a timer
//! already in tokio's wheel whose deadline only moves later is a
//! compare-and-swap, where a timer per request is put into the wheel and
//! taken out again (about 730 instructions a request,
//! `scripts/profile-gateway`).

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// How long the upstream may take to send a response head, connecting
/// included.
pub(crate) const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting to the upstream may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an idle pooled upstream connection is kept.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The most idle connections a worker keeps.
pub(crate) const MAX_IDLE: usize = 1024;

/// Why the upstream gave no response.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum UpstreamError {
    /// No connection could be made.
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[source] io::Error),
    /// Connecting took longer than [`CONNECT_TIMEOUT`].
    #[error("cannot connect to the upstream within {CONNECT_TIMEOUT:?}")]
    ConnectTimeout,
    /// The HTTP exchange failed (the upstream closed the connection, sent
    /// something that is not HTTP, …).
    #[error("the upstream failed: {0}")]
    Http(#[source] hyper::Error),
    /// No response head within [`UPSTREAM_TIMEOUT`].
    #[error("the upstream sent no response within {UPSTREAM_TIMEOUT:?}")]
    Timeout,
}

/// One worker's connections to one upstream.
pub(crate) struct Pool {
    host: String,
    port: u16,
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    connection: Connection,
    since: Instant,
}

/// One upstream connection: what sends on it, and the timer of the
/// deadline of the request it carries.
struct Connection {
    sender: SendRequest<Incoming>,
    deadline: Pin<Box<Sleep>>,
}

pin_project_lite::pin_project! {
    /// `future`'s output, or [`UpstreamError::Timeout`] once `deadline` has
    /// passed.
    struct Before<'a, F> {
        #[pin]
        future: F,
        deadline: &'a mut Pin<Box<Sleep>>,
    }
}

impl<'a, F> Before<'a, F> {
    fn new(deadline: &'a mut Pin<Box<Sleep>>, future: F) -> Self {
        Self { future, deadline }
    }
}

impl<F: Future> Future for Before<'_, F> {
    type Output = Result<F::Output, UpstreamError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        this.deadline
            .as_mut()
            .poll(cx)
            .map(|()| Err(UpstreamError::Timeout))
    }
}

impl Pool {
    /// An empty pool of connections to `host:port`.
    pub(crate) fn new(host: &str, port: u16) -> Arc<Self> {
        // `[::1]` is how a URL writes an IPv6 host; the resolver wants `::1`.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Arc::new(Self {
            host: host.to_owned(),
            port,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Sends `request` (origin-form URI, `Host` set) on a pooled connection,
    /// or on a new one, and returns the response once its head has come, or
    /// [`UpstreamError::Timeout`] after [`UPSTREAM_TIMEOUT`].
    pub(crate) async fn send(
        self: Arc<Self>,
        mut request: Request<Incoming>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let now = Instant::now();
        let deadline = now + UPSTREAM_TIMEOUT;
        loop {
            let (mut connection, fresh) = match self.take(now) {
                Some(mut connection) => {
                    connection.deadline.as_mut().reset(deadline);
                    // Its last response has ended; this waits at most for
                    // the connection's task to take note.
                    let ready = poll_fn(|cx| connection.sender.poll_ready(cx));
                    if Before::new(&mut connection.deadline, ready).await?.is_err() {
                        continue;
                    }
                    (connection, false)
                }
                // Boxed: connecting is rare, and its future would more than
                // double this one's size, which every request allocates.
                None => (Box::pin(self.connect(deadline)).await?, true),
            };
            let sending = connection.sender.try_send_request(request);
            match Before::new(&mut connection.deadline, sending).await? {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    let body = PooledBody::new(body, connection, Arc::clone(&self));
                    return Ok(Response::from_parts(parts, body));
                }
                Err(mut failed) => match failed.take_message() {
                    // A pooled connection closed under the request before
                    // any of it was written: try the next connection.
                    Some(unsent) if !fresh => request = unsent,
                    _ => return Err(UpstreamError::Http(failed.into_error())),
                },
            }
        }
    }

    /// The most recently used idle connection that is still open, dropping
    /// the stale ones on the way.
    fn take(&self, now: Instant) -> Option<Connection> {
        let mut idle = self.lock();
        while let Some(Idle { connection, since }) = idle.pop() {
            if now.saturating_duration_since(since) <= IDLE_TIMEOUT
                && !connection.sender.is_closed()
            {
                return Some(connection);
            }
        }
        None
    }

    async fn connect(&self, deadline: Instant) -> Result<Connection, UpstreamError> {
        let connecting = TcpStream::connect((self.host.as_str(), self.port));
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| UpstreamError::ConnectTimeout)?
            .map_err(UpstreamError::Connect)?;
        // Small requests go out at once.
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(UpstreamError::Http)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "upstream connection ended with an error");
            }
        });
        Ok(Connection {
            sender,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
        })
    }

    /// Keeps `connection` for the next request, if it is still open and
    /// the pool has room.
    fn put(&self, connection: Connection) {
        if connection.sender.is_closed() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                connection,
                since: Instant::now(),
            });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list stays valid whatever panicked while it was held.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An upstream response body that gives its connection back to the pool
/// once it has been read to the end.
pub(crate) struct PooledBody {
    body: Incoming,
    owner: Option<(Connection, Arc<Pool>)>,
}

impl PooledBody {
    fn new(body: Incoming, connection: Connection, pool: Arc<Pool>) -> Self {
        let mut pooled = Self {
            body,
            owner: Some((connection, pool)),
        };
        pooled.give_back_if_ended();
        pooled
    }

    fn give_back_if_ended(&mut self) {
        if self.body.is_end_stream() {
            self.give_back();
        }
    }

    fn give_back(&mut self) {
        if let Some((connection, pool)) = self.owner.take() {
            pool.put(connection);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        match &frame {
            // The end (a chunked body does not say so before).
            Poll::Ready(None) => self.give_back(),
            // A frame after which the body says it has ended: a reader may
            // stop polling here.
            Poll::Ready(Some(Ok(_))) => self.give_back_if_ended(),
            // A broken body leaves its connection broken: drop it.
            Poll::Ready(Some(Err(_))) => self.owner = None,
            Poll::Pending => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // Read to the end by a reader that did not poll once more: reusable.
        // Otherwise dropping the sender closes the connection.
        self.give_back_if_ended();
    }
}
