//! [`Client`]: a `reqwest` client that follows the rate limit headers.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Request, RequestBuilder, Response};

use crate::schedule::{Next, Pacer};
use crate::{Clock, Error, RateLimitInfo, RetryConfig, TokioClock};

/// A `reqwest` client that honours `Retry-After` and the rate limit headers.
///
/// Each request goes through the same steps: wait for its bucket's slot (if
/// pacing), send, read the rate limit headers, and on `429` or `503` wait and
/// send again, up to [`RetryConfig::max_retries`] times. Clones share the
/// pacing state, so concurrent tasks calling one API slow down together.
///
/// A request whose body cannot be cloned (a stream) is sent once and its
/// response returned as it is, whatever the status.
pub struct Client<C = TokioClock, R = StdRng> {
    inner: Arc<Inner<C, R>>,
}

struct Inner<C, R> {
    http: reqwest::Client,
    config: RetryConfig,
    clock: C,
    rng: Mutex<R>,
    pacer: Mutex<Pacer>,
}

impl<C, R> Clone for Client<C, R> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C, R> std::fmt::Debug for Client<C, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Wraps `http` with the default [`RetryConfig`], real time and an RNG
    /// seeded from the operating system.
    pub fn new(http: reqwest::Client) -> Self {
        Self::with(
            http,
            RetryConfig::default(),
            TokioClock::default(),
            StdRng::from_os_rng(),
        )
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl<C: Clock, R: Rng + Send + 'static> Client<C, R> {
    /// Wraps `http` with `config`, time from `clock` and jitter from `rng`
    /// (tests pass a manual clock and a seeded RNG).
    pub fn with(http: reqwest::Client, config: RetryConfig, clock: C, rng: R) -> Self {
        Self {
            inner: Arc::new(Inner {
                http,
                config,
                clock,
                rng: Mutex::new(rng),
                pacer: Mutex::new(Pacer::new()),
            }),
        }
    }

    /// The wrapped client, to build requests with.
    pub fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    /// The clock the client waits on.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// Builds and sends `request`; see [`Client::execute`].
    pub async fn send(&self, request: RequestBuilder) -> Result<Response, Error> {
        self.execute(request.build()?).await
    }

    /// Sends `request`, paced and retried by its route, `METHOD host[:port]/path`.
    pub async fn execute(&self, request: Request) -> Result<Response, Error> {
        let url = request.url();
        let host = url.host_str().unwrap_or_default();
        let route = match url.port() {
            Some(port) => format!("{} {host}:{port}{}", request.method(), url.path()),
            None => format!("{} {host}{}", request.method(), url.path()),
        };
        self.execute_on(&route, request).await
    }

    /// Sends `request` as part of `route`, a name the caller chooses (e.g.
    /// `GET /channels/{id}/messages`) so that requests to one endpoint share
    /// their pacing however their paths differ. Routes the server reports in
    /// one `X-RateLimit-Bucket` share it too.
    pub async fn execute_on(&self, route: &str, request: Request) -> Result<Response, Error> {
        let inner = &*self.inner;
        let config = &inner.config;
        let mut retries = 0;
        loop {
            if config.pace {
                let wait = lock(&inner.pacer).acquire(route, inner.clock.now());
                self.wait(wait).await?;
            }
            let Some(attempt) = request.try_clone() else {
                // A streaming body can be sent only once.
                return Ok(inner.http.execute(request).await?);
            };
            let response = inner.http.execute(attempt).await?;
            let info = RateLimitInfo::from_headers(response.headers(), inner.clock.wall());
            if config.pace {
                lock(&inner.pacer).observe(route, &info, inner.clock.now());
            }
            let next = config.next(response.status(), &info, retries, &mut *lock(&inner.rng))?;
            match next {
                Next::Done => return Ok(response),
                Next::Retry(wait) => {
                    drop(response);
                    inner.clock.sleep(wait).await;
                    retries += 1;
                }
            }
        }
    }

    async fn wait(&self, wait: Duration) -> Result<(), Error> {
        let max = self.inner.config.max_wait;
        if wait > max {
            return Err(Error::WaitTooLong { wait, max });
        }
        if !wait.is_zero() {
            self.inner.clock.sleep(wait).await;
        }
        Ok(())
    }
}
