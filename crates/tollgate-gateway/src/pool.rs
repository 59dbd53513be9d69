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

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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
}

/// One worker's connections to one upstream.
pub(crate) struct Pool {
    host: String,
    port: u16,
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    sender: SendRequest<Incoming>,
    since: Instant,
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
    /// or on a new one.
    pub(crate) async fn send(
        self: Arc<Self>,
        mut request: Request<Incoming>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        loop {
            let (mut sender, fresh) = match self.take().await {
                Some(sender) => (sender, false),
                // Boxed: connecting is rare, and its future would more than
                // double this one's size, which every request allocates.
                None => (Box::pin(self.connect()).await?, true),
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    let body = PooledBody::new(body, sender, Arc::clone(&self));
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

    /// The most recently used idle connection that is still open and
    /// ready, dropping the stale ones on the way.
    async fn take(&self) -> Option<SendRequest<Incoming>> {
        loop {
            let Idle { mut sender, since } = self.lock().pop()?;
            if since.elapsed() > IDLE_TIMEOUT || sender.is_closed() {
                continue;
            }
            // Its last response has ended; this waits at most for the
            // connection's task to take note.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<Incoming>, UpstreamError> {
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
        Ok(sender)
    }

    /// Keeps `sender` for the next request, if it is still open and the
    /// pool has room.
    fn put(&self, sender: SendRequest<Incoming>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                sender,
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
    owner: Option<(SendRequest<Incoming>, Arc<Pool>)>,
}

impl PooledBody {
    fn new(body: Incoming, sender: SendRequest<Incoming>, pool: Arc<Pool>) -> Self {
        let mut pooled = Self {
            body,
            owner: Some((sender, pool)),
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
        if let Some((sender, pool)) = self.owner.take() {
            pool.put(sender);
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
