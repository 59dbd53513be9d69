//! The service's own listeners (the HTTP API, gRPC, and the admin listener
//! when asked for): their flags, and caps that fit the process's file
//! descriptors.
//!
//! Each listener is served by [`tollgate_listen`]'s `Acceptor`: a
//! cap on open connections, an idle timeout, an HTTP/1 header-read timeout
//! and accept errors logged at WARN and counted. The caps are what keeps a
//! flood on one port from starving the others, so at start-up the soft
//! limit on open files is raised to the hard limit and the caps are fitted
//! under it: caps left at their default are lowered until every listener's
//! cap, plus [`RESERVED_FILES`], fits (a gateway connection counts twice: its
//! client and its upstream); caps given explicitly that do not fit refuse to
//! start.

use std::time::Duration;

use anyhow::bail;
use tollgate_listen::ConnectionLimits;

/// Open connections per listener when neither the flag nor the file limit
/// says otherwise.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Files kept for everything but the listeners' connections: the listening
/// sockets, Redis connections, the config files, the log.
pub(crate) const RESERVED_FILES: u64 = 256;

/// How the service's own listeners treat connections; each also comes from
/// its `TOLLGATE_*` variable.
#[derive(Debug, clap::Args)]
#[group(id = "listeners")]
pub(crate) struct Args {
    /// Serve the admin API (`/admin/...`), `/metrics` and the live page (`/`,
    /// `/live.json`) on this address instead of the HTTP API's, which then
    /// answers none of them (`/healthz` and `/readyz` are on both).
    #[arg(long, env = "TOLLGATE_ADMIN_LISTEN", value_name = "ADDR")]
    pub(crate) admin_listen: Option<String>,

    /// The most connections each of the HTTP API, gRPC and admin listeners
    /// holds open; past it a new connection is closed at once [default:
    /// 10000, lowered to fit the process's open-file limit].
    #[arg(
        long,
        env = "TOLLGATE_MAX_CONNECTIONS",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) max_connections: Option<u32>,

    /// How long a connection to the HTTP API, gRPC or admin listener may
    /// stay open with no request in flight before it is closed (HTTP/2:
    /// `GOAWAY`).
    #[arg(
        long,
        env = "TOLLGATE_IDLE_TIMEOUT",
        value_name = "DURATION",
        default_value = "60s",
        value_parser = positive_duration
    )]
    pub(crate) idle_timeout: Duration,

    /// How long an HTTP/1 request's head may take to arrive at the HTTP API
    /// or admin listener before the connection is closed; also how long a
    /// kept-alive HTTP/1 connection waits for its next request.
    #[arg(
        long,
        env = "TOLLGATE_HEADER_READ_TIMEOUT",
        value_name = "DURATION",
        default_value = "30s",
        value_parser = positive_duration
    )]
    pub(crate) header_read_timeout: Duration,
}

pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    let duration = tollgate_policy::parse_duration(s).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(duration)
}

/// The caps the listeners run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Each of the HTTP API's, gRPC's and the admin listener's.
    pub(crate) api: usize,
    /// The gateway's, when there is one.
    pub(crate) gateway: Option<usize>,
}

/// One listener kind's cap: how many listeners share its value, what one of
/// its connections costs in files, and the value when it was given.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Demand {
    pub(crate) listeners: u64,
    pub(crate) files_per_connection: u64,
    pub(crate) given: Option<usize>,
}

impl Demand {
    fn files(&self, cap: usize) -> u64 {
        self.listeners * self.files_per_connection * cap as u64
    }
}

/// Raises the soft limit on open files to the hard limit (as Go's runtime
/// does at start-up) and says what it is; `None` when there is no limit
/// (or none to read).
pub(crate) fn raise_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let mut limit = getrlimit(Resource::Nofile);
        // `None` is no limit.
        if limit.current != limit.maximum {
            limit.current = limit.maximum;
            if let Err(error) = setrlimit(Resource::Nofile, limit) {
                tracing::warn!(%error, "cannot raise the open-file limit");
            }
        }
        getrlimit(Resource::Nofile).current
    }
    #[cfg(not(unix))]
    None
}

/// The caps of `api` (the HTTP API, gRPC and admin listeners) and of the
/// `gateway`'s listener, fitted under `file_limit` open files (see the
/// module's doc).
///
/// # Errors
///
/// When the caps given explicitly do not fit on their own.
pub(crate) fn fit(
    file_limit: Option<u64>,
    api: Demand,
    gateway: Option<Demand>,
) -> anyhow::Result<Caps> {
    let demands: Vec<Demand> = std::iter::once(api).chain(gateway).collect();
    let mut caps: Vec<usize> = demands
        .iter()
        .map(|d| d.given.unwrap_or(DEFAULT_MAX_CONNECTIONS))
        .collect();
    if let Some(limit) = file_limit {
        let available = limit.saturating_sub(RESERVED_FILES);
        let given: u64 = demands
            .iter()
            .filter_map(|d| d.given.map(|cap| d.files(cap)))
            .sum();
        let defaulted: u64 = demands
            .iter()
            .filter(|d| d.given.is_none())
            .map(|d| d.files(DEFAULT_MAX_CONNECTIONS))
            .sum();
        if given > available {
            bail!(
                "the connection caps given (--max-connections, --proxy-max-connections) need \
                 {given} open files, but the process may open {limit} ({RESERVED_FILES} of them \
                 kept for the rest): lower the caps or raise the limit (ulimit -n)"
            );
        }
        let room = available - given;
        if defaulted > room {
            for (cap, demand) in caps.iter_mut().zip(&demands) {
                if demand.given.is_none() {
                    // The same share of the room for every defaulted cap.
                    let scaled = (*cap as u64).saturating_mul(room) / defaulted;
                    *cap = usize::try_from(scaled).unwrap_or(usize::MAX).max(1);
                }
            }
            tracing::info!(
                file_limit = limit,
                "connection caps lowered to fit the open-file limit"
            );
        }
    }
    Ok(Caps {
        api: caps[0],
        gateway: gateway.map(|_| caps[1]),
    })
}

impl Args {
    /// The limits of the service's own listeners, with cap `max_connections`.
    pub(crate) fn limits(&self, max_connections: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(given: Option<usize>) -> Demand {
        Demand {
            listeners: 2,
            files_per_connection: 1,
            given,
        }
    }

    fn gateway(given: Option<usize>) -> Option<Demand> {
        Some(Demand {
            listeners: 1,
            files_per_connection: 2,
            given,
        })
    }

    #[test]
    fn defaults_stand_when_the_limit_is_high_enough() {
        let caps = fit(Some(1 << 20), api(None), gateway(None)).unwrap();
        assert_eq!(caps.api, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(caps.gateway, Some(DEFAULT_MAX_CONNECTIONS));
        assert_eq!(
            fit(None, api(None), None).unwrap().api,
            DEFAULT_MAX_CONNECTIONS
        );
    }

    #[test]
    fn defaults_shrink_to_fit_and_always_fit() {
        for limit in [300, 1024, 4096, 20_000, 40_000] {
            let caps = fit(Some(limit), api(None), gateway(None)).unwrap();
            let files =
                api(None).files(caps.api) + gateway(None).unwrap().files(caps.gateway.unwrap());
            assert!(files + RESERVED_FILES <= limit, "{limit}: {caps:?}");
            assert_eq!(caps.api, caps.gateway.unwrap(), "the same share each");
        }
    }

    #[test]
    fn given_caps_are_kept_and_defaults_take_the_rest() {
        let caps = fit(Some(10_256), api(Some(1000)), gateway(None)).unwrap();
        assert_eq!(caps.api, 1000);
        assert_eq!(caps.gateway, Some(4000));
    }

    #[test]
    fn given_caps_that_cannot_fit_refuse_to_start() {
        let error = fit(Some(1024), api(Some(1000)), gateway(None)).unwrap_err();
        assert!(
            error.to_string().contains("need 2000 open files"),
            "{error}"
        );
    }
}
