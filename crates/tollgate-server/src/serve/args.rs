//! `tollgate serve`'s options: the flags and their `TOLLGATE_*` variables,
//! below both the service's assembly (`serve`) and envoyproxy/ratelimit's
//! mode (`envoy_mode`), which fills them from its environment.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;

use super::{auth, backend, bodies, listeners, record, reload};

/// Options of `tollgate serve`; each can also come from its `TOLLGATE_*`
/// environment variable.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The policy: a YAML file, or a directory of `.yaml`/`.yml` files, in
    /// Tollgate's native format or envoyproxy/ratelimit's. Watched and
    /// reloaded on change. Without it, the built-in default policy.
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,

    /// Where the HTTP API listens (port 0 picks a free port; the log says which).
    #[arg(
        long,
        env = "TOLLGATE_HTTP",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub(crate) http: String,

    /// Where the gRPC Rate Limit Service listens (port 0 picks a free port).
    #[arg(
        long,
        env = "TOLLGATE_GRPC",
        value_name = "ADDR",
        default_value = "127.0.0.1:8081"
    )]
    pub(crate) grpc: String,

    /// A Redis store: `redis://host:port` for one server,
    /// `redis+cluster://host:port,host:port` for a cluster; `rediss://` and
    /// `rediss+cluster://` over TLS (see `--redis-tls-ca`). Without it (and
    /// without `redis` in the config's `store:` section), the in-memory store.
    #[arg(long, env = "TOLLGATE_REDIS", value_name = "URL")]
    pub(crate) redis: Option<RedisUrl>,

    /// How long one round trip to Redis may take before each rule's failure
    /// policy decides the check (`fail_open`, `fail_closed`, or `local`, the
    /// default) [default: 10ms].
    #[arg(
        long,
        env = "TOLLGATE_REDIS_TIMEOUT",
        value_name = "DURATION",
        value_parser = redis_timeout
    )]
    pub(crate) redis_timeout: Option<Duration>,

    /// The bearer token of the admin API (`/admin/...`) and of the live
    /// page's data (`/live.json`). Without it, the admin API is off and the
    /// live page's data is open, as `/metrics` is.
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub(crate) admin_token: Option<auth::Token>,

    /// Require `Authorization: Bearer <TOKEN>` on the check APIs (gRPC
    /// `ShouldRateLimit`, `/json`, `/v1/check`, `/v1/release`); give it more
    /// than once (or comma-separated in the variable) to accept several
    /// during a rotation. Without it, the check APIs are open to whoever
    /// reaches them.
    #[arg(
        long,
        env = "TOLLGATE_API_TOKEN",
        value_name = "TOKEN",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub(crate) api_token: Vec<auth::Token>,

    #[command(flatten, next_help_heading = "Listeners")]
    pub(crate) listen: listeners::Args,

    #[command(flatten, next_help_heading = "Requests")]
    pub(crate) requests: bodies::Args,

    #[command(flatten, next_help_heading = "gRPC TLS")]
    pub(crate) grpc_tls: tollgate_envoy::GrpcTlsFlags,

    #[command(flatten, next_help_heading = "Store")]
    pub(crate) store: backend::StoreArgs,

    #[command(flatten, next_help_heading = "Reload")]
    pub(crate) reload: reload::Args,

    #[command(flatten, next_help_heading = "Recording")]
    pub(crate) record: record::Args,

    #[command(flatten, next_help_heading = "Gateway")]
    pub(crate) gateway: tollgate_gateway::Options,

    /// Which rate limit headers the Envoy doors (gRPC `ShouldRateLimit`,
    /// `/json`) add to their answers, comma-separated: `ratelimit`
    /// (envoyproxy/ratelimit's `RateLimit-Limit`, `-Remaining`, `-Reset` of
    /// the descriptor it picks), `x-ratelimit` (Tollgate's `X-RateLimit-*` of
    /// the most restrictive limit), `draft` (`RateLimit-Policy` and
    /// `RateLimit` listing every limit); or `none`; or `auto`: `x-ratelimit`
    /// in domains of Tollgate's format, none in envoyproxy/ratelimit's (its
    /// default), and in its mode (`--envoy-env`) its
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` (see `docs/envoy.md`).
    #[arg(
        long,
        env = "TOLLGATE_ENVOY_HEADERS",
        value_name = "FAMILIES",
        value_delimiter = ',',
        default_value = "auto"
    )]
    pub(crate) envoy_headers: Vec<tollgate_envoy::HeaderFamily>,

    /// Which rate limit headers `POST /v1/check` answers carry,
    /// comma-separated: `x-ratelimit`, `reset-after`, `bucket`, `draft`
    /// (`RateLimit-Policy` and the most restrictive limit's `RateLimit`),
    /// `draft-every-limit` (`RateLimit` listing every limit), `envoy`; or
    /// `default` (`x-ratelimit,draft`), `all`, `none` (see
    /// `docs/headers.md`).
    #[arg(
        long,
        env = "TOLLGATE_V1_HEADERS",
        value_name = "FAMILIES",
        default_value = "default"
    )]
    pub(crate) v1_headers: tollgate_http::HeaderStyle,

    /// How requests to domains in envoyproxy/ratelimit's format are counted:
    /// `each-hit`, as envoyproxy/ratelimit does by default (every descriptor
    /// is charged its hits, admitted or not), or `all-or-nothing`, Tollgate's
    /// (a request denied by one descriptor spends nothing from the others;
    /// nearest to its `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`).
    /// Domains in Tollgate's format are always all-or-nothing.
    #[arg(
        long,
        env = "TOLLGATE_ENVOY_COUNTING",
        value_name = "COUNTING",
        default_value = "each-hit"
    )]
    pub(crate) envoy_counting: tollgate_policy::Counting,

    /// Read envoyproxy/ratelimit's environment (`HOST`, `PORT`,
    /// `RUNTIME_ROOT`, `REDIS_URL`, ...) with its defaults, under this
    /// command's flags and `TOLLGATE_*` variables; what the binary does
    /// when run as `ratelimit` (see `docs/envoy.md`, Settings).
    #[arg(long, env = "TOLLGATE_ENVOY_ENV")]
    pub(crate) envoy_env: bool,

    /// What envoyproxy/ratelimit's environment set beside the flags.
    #[arg(skip)]
    pub(crate) envoy: Option<Box<tollgate_envoy::settings::EnvoySettings>>,

    /// Whether the gateway serves on the runtime that calls
    /// [`start`](super::start); not a flag (see
    /// [`Args::gateway_on_caller_runtime`]).
    #[arg(skip)]
    pub(crate) gateway_on_caller_runtime: bool,
}

/// `tollgate serve`'s flags alone, for [`Args::parse_from`].
#[derive(Debug, Parser)]
#[command(name = "tollgate serve")]
pub(crate) struct ServeFlags {
    #[command(flatten)]
    pub(crate) args: Args,
}

impl Args {
    /// Parses `tollgate serve`'s flags (`flags` without the program and
    /// subcommand names), with their `TOLLGATE_*` variables and defaults, as
    /// the command line does.
    ///
    /// # Errors
    ///
    /// What `tollgate serve` would refuse, with clap's message.
    pub fn parse_from<I, T>(flags: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let program = std::iter::once(OsString::from("tollgate serve"));
        ServeFlags::try_parse_from(program.chain(flags.into_iter().map(Into::into)))
            .map(|flags| flags.args)
    }

    /// The same options with the gateway served on the tokio runtime that
    /// calls [`start`](super::start), with one listener, instead of one
    /// worker thread (and runtime) per CPU. Tokio's paused time is per runtime: for a shaped
    /// request's delay to pass in a test's paused time, the gateway has to
    /// run on the test's runtime.
    #[must_use]
    pub fn gateway_on_caller_runtime(mut self) -> Self {
        self.gateway_on_caller_runtime = true;
        self
    }
}

/// A Redis timeout: a duration such as `10ms`, above zero and at most a minute.
fn redis_timeout(s: &str) -> Result<Duration, String> {
    backend::check_redis_timeout(tollgate_policy::parse_duration(s).map_err(|e| e.to_string())?)
}

/// A Redis URL whose scheme has been checked. Its `Debug` shows no password.
#[derive(Clone)]
pub(crate) struct RedisUrl(pub(crate) String);

impl FromStr for RedisUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = [
            "redis://",
            "rediss://",
            "redis+cluster://",
            "rediss+cluster://",
        ]
        .into_iter()
        .find_map(|scheme| s.strip_prefix(scheme))
        .ok_or(
            "expected redis://host:port or redis+cluster://host:port,host:port \
                 (rediss:// and rediss+cluster:// for TLS)",
        )?;
        // Whatever precedes the host (user:password@) is not checked here.
        let hosts = rest.rsplit('@').next().unwrap_or(rest);
        let hosts = hosts.split('/').next().unwrap_or(hosts);
        if hosts.is_empty() || hosts.split(',').any(str::is_empty) {
            return Err("the URL names no host".into());
        }
        Ok(Self(s.to_owned()))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = self.0.split("://").next().unwrap_or_default();
        write!(f, "RedisUrl({scheme}://<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_urls_are_checked_and_redacted() {
        for good in [
            "redis://localhost:6379",
            "redis://:pw@h:1/0",
            "redis+cluster://a:1,b:2",
            "rediss://:pw@h:1/0",
            "rediss+cluster://a:1,b:2",
        ] {
            let url: RedisUrl = good.parse().expect(good);
            assert!(!format!("{url:?}").contains("pw"));
        }
        for bad in [
            "localhost:6379",
            "http://h:1",
            "redis://",
            "redis+cluster://a:1,,b:2",
            "rediss://",
        ] {
            assert!(bad.parse::<RedisUrl>().is_err(), "{bad}");
        }
    }
}
