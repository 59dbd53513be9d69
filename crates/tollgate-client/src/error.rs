//! What can go wrong.

use std::time::Duration;

use http::StatusCode;

/// Why a request did not get a response to hand back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server still refused after every retry.
    #[error("gave up after {attempts} attempts: the server still answered {status}")]
    RetriesExhausted {
        /// Requests sent, the first included.
        attempts: u32,
        /// The last response's status (429 or 503).
        status: StatusCode,
        /// The last response's `Retry-After`, if it had one.
        retry_after: Option<Duration>,
    },
    /// The server asked for a longer wait than the client may make.
    #[error("the server asks to wait {wait:?}, longer than the {max:?} allowed")]
    WaitTooLong {
        /// The wait asked for.
        wait: Duration,
        /// `RetryConfig::max_wait`.
        max: Duration,
    },
    /// The request could not be sent or its response not read.
    #[error("HTTP request failed: {0}")]
    Http(#[from] reqwest::Error),
}

impl Error {
    /// Whether the same request may succeed later (the limit will reset).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::RetriesExhausted { .. } | Error::WaitTooLong { .. } => true,
            Error::Http(e) => e.is_timeout() || e.is_connect(),
        }
    }
}
