//! envoyproxy/ratelimit's environment: the settings its `/bin/ratelimit`
//! reads (`src/settings/settings.go`), read with their meaning where they
//! apply, so that swapping the binary keeps the env, the mounted config and
//! the ports.
//!
//! The mode is entered when the binary runs under the name `ratelimit`
//! (argv\[0\]'s file name: a symlink or a copy), or with `tollgate serve
//! --envoy-env` (`TOLLGATE_ENVOY_ENV=true`). Outside it, none of these
//! variables is read, so a `PORT` set by a platform changes nothing.
//!
//! Precedence, for each setting: a Tollgate flag, then its `TOLLGATE_*`
//! variable, then envoyproxy/ratelimit's variable, then envoyproxy/ratelimit's
//! default (so `HOST`/`PORT` unset still listen on `0.0.0.0:8080`). Logging
//! reads `RUST_LOG` before `LOG_LEVEL`.
//!
//! A variable that makes no sense for Tollgate is accepted and logged once
//! at start-up with the reason; one Tollgate cannot honour
//! safely (a gRPC unix socket, Sentinel) stops the start with
//! an error naming it. The variables read by envoyproxy/ratelimit's Go
//! `envconfig` are parsed as it parses them (Go's `ParseBool`,
//! `ParseDuration`), which is not clap's syntax: hence this reader rather
//! than clap `env` attributes. `docs/envoy.md` ("Settings") has the table.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use axum::Router;
use axum::routing::get;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use tollgate_policy::{ConfigFiles, Counting, Policy, PolicyHandle};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};

use crate::error::SettingsError;
use crate::rls::{DEFAULT_NAMES, HeaderFamily};
use crate::tls::{self, GrpcTlsFlags, RedisTlsFlags};
use crate::xds;

/// Every variable envoyproxy/ratelimit's `settings.go` reads (at commit
/// f2fb157). Each is either read here or in [`IGNORED`].
pub const ENVOY_VARIABLES: &[&str] = &[
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

const GRPC_TUNING: &str =
    "Tollgate closes idle connections (--idle-timeout) and sets no maximum connection age";
const NO_GRPC_TLS: &str = "used with GRPC_SERVER_USE_TLS=true only";
const NO_XDS_TLS: &str = "used with CONFIG_GRPC_XDS_SERVER_USE_TLS=true only";
/// The gRPC listener's TLS files, read with `GRPC_SERVER_USE_TLS=true`.
const GRPC_TLS_VARIABLES: [&str; 4] = [
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
];
/// The xDS client's TLS files, read with `CONFIG_GRPC_XDS_SERVER_USE_TLS=true`.
const XDS_TLS_VARIABLES: [&str; 4] = [
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
];
const XDS_RETRY: &str =
    "Tollgate reconnects to the xDS server every CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL";
/// The variables of `CONFIG_TYPE=GRPC_XDS_SOTW`, ignored with `FILE`.
const XDS_VARIABLES: [&str; 11] = [
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
];
const NO_STATSD: &str =
    "Tollgate exports Prometheus metrics only (/metrics, or PROMETHEUS_ADDR with USE_PROMETHEUS)";
const NO_REDIS_TLS: &str = "used with REDIS_TLS=true only";
/// The Redis TLS settings, read with `REDIS_TLS=true`.
const REDIS_TLS_VARIABLES: [&str; 4] = [
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
];
const REDIS_POOL: &str =
    "Tollgate multiplexes one connection per Redis node and batches checks itself";
const PER_SECOND: &str = "per-second limits are kept in REDIS_URL's Redis with all others";
const NO_SENTINEL: &str = "used with REDIS_TYPE=sentinel only, which Tollgate refuses";
const NO_MEMCACHE: &str = "used with BACKEND_TYPE=memcache only, which Tollgate refuses";
const NO_TRACING: &str = "Tollgate exports no OpenTelemetry traces";

/// The variables accepted and not read, with the reason; logged once at
/// start-up when set.
const IGNORED: &[(&str, &str)] = &[
    ("GRPC_MAX_CONNECTION_AGE", GRPC_TUNING),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", GRPC_TUNING),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", XDS_RETRY),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", XDS_RETRY),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", XDS_RETRY),
    ("XDS_CLIENT_BACKOFF_JITTER", XDS_RETRY),
    ("USE_DOG_STATSD", NO_STATSD),
    ("USE_DOG_STATSD_MOGRIFIERS", NO_STATSD),
    ("USE_STATSD", NO_STATSD),
    ("STATSD_HOST", NO_STATSD),
    ("STATSD_PORT", NO_STATSD),
    ("EXTRA_TAGS", NO_STATSD),
    (
        "STATS_FLUSH_INTERVAL",
        "Prometheus reads Tollgate's metrics when it scrapes",
    ),
    (
        "DISABLE_STATS",
        "Tollgate's metrics cost nothing until they are scraped",
    ),
    (
        "PROMETHEUS_MAPPER_YAML",
        "Tollgate names its metrics itself (docs/service.md, Metrics)",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "Tollgate's latency histograms are in seconds",
    ),
    (
        "RUNTIME_WATCH_ROOT",
        "Tollgate polls the files' contents, which sees a swap of RUNTIME_ROOT and edits inside it alike",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "Tollgate's Redis keys expire when their state is back to full",
    ),
    ("REDIS_POOL_SIZE", REDIS_POOL),
    ("REDIS_PIPELINE_WINDOW", REDIS_POOL),
    ("REDIS_PIPELINE_LIMIT", REDIS_POOL),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", REDIS_POOL),
    ("REDIS_PERSECOND", PER_SECOND),
    ("REDIS_PERSECOND_SOCKET_TYPE", PER_SECOND),
    ("REDIS_PERSECOND_TYPE", PER_SECOND),
    ("REDIS_PERSECOND_URL", PER_SECOND),
    ("REDIS_PERSECOND_POOL_SIZE", PER_SECOND),
    ("REDIS_PERSECOND_AUTH", PER_SECOND),
    ("REDIS_PERSECOND_TLS", PER_SECOND),
    ("REDIS_PERSECOND_SENTINEL_AUTH", PER_SECOND),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", PER_SECOND),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", PER_SECOND),
    ("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", PER_SECOND),
    ("REDIS_PERSECOND_TIMEOUT", PER_SECOND),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", PER_SECOND),
    ("REDIS_SENTINEL_AUTH", NO_SENTINEL),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "Tollgate's health probes always follow whether Redis answers",
    ),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", REDIS_POOL),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "Tollgate refuses to start while Redis cannot be reached; the restart policy retries",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "Tollgate refuses to start while Redis cannot be reached; the restart policy retries",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "Tollgate refuses to start while Redis cannot be reached; the restart policy retries",
    ),
    ("MEMCACHE_HOST_PORT", NO_MEMCACHE),
    ("MEMCACHE_MAX_IDLE_CONNS", NO_MEMCACHE),
    ("MEMCACHE_SRV", NO_MEMCACHE),
    ("MEMCACHE_SRV_REFRESH", NO_MEMCACHE),
    ("MEMCACHE_TLS", NO_MEMCACHE),
    ("MEMCACHE_TLS_CLIENT_CERT", NO_MEMCACHE),
    ("MEMCACHE_TLS_CLIENT_KEY", NO_MEMCACHE),
    ("MEMCACHE_TLS_CACERT", NO_MEMCACHE),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", NO_MEMCACHE),
    ("TRACING_ENABLED", NO_TRACING),
    ("TRACING_SERVICE_NAME", NO_TRACING),
    ("TRACING_SERVICE_NAMESPACE", NO_TRACING),
    ("TRACING_SERVICE_INSTANCE_ID", NO_TRACING),
    ("TRACING_EXPORTER_PROTOCOL", NO_TRACING),
    ("TRACING_SAMPLING_RATE", NO_TRACING),
];

/// A Tollgate setting that, given as a flag or its `TOLLGATE_*` variable,
/// wins over envoyproxy/ratelimit's variable for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Flag {
    /// `--http` (`HOST`, `PORT`).
    Http,
    /// `--grpc` (`GRPC_HOST`, `GRPC_PORT`).
    Grpc,
    /// `--config` (`RUNTIME_ROOT` and its subdirectories).
    Config,
    /// `--admin-listen` (`PROMETHEUS_ADDR`).
    AdminListen,
    /// `--envoy-counting` (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
    EnvoyCounting,
    /// `--merge-domains` (`MERGE_DOMAIN_CONFIG`).
    MergeDomains,
    /// `--envoy-headers` (`LIMIT_RESPONSE_HEADERS_ENABLED`).
    EnvoyHeaders,
    /// `--redis` (`REDIS_URL` and its companions).
    Redis,
    /// `--redis-timeout` (`REDIS_TIMEOUT`).
    RedisTimeout,
    /// `--deny-cache` (`LOCAL_CACHE_SIZE_IN_BYTES`).
    DenyCache,
    /// `--grpc-tls-cert` (`GRPC_SERVER_TLS_CERT`).
    GrpcTlsCert,
    /// `--grpc-tls-key` (`GRPC_SERVER_TLS_KEY`).
    GrpcTlsKey,
    /// `--grpc-client-ca` (`GRPC_CLIENT_TLS_CACERT`).
    GrpcClientCa,
    /// `--grpc-client-san` (`GRPC_CLIENT_TLS_SAN`).
    GrpcClientSan,
    /// `--redis-tls-ca` (`REDIS_TLS_CACERT`).
    RedisTlsCa,
    /// `--redis-tls-cert` (`REDIS_TLS_CLIENT_CERT`).
    RedisTlsCert,
    /// `--redis-tls-key` (`REDIS_TLS_CLIENT_KEY`).
    RedisTlsKey,
    /// `--redis-tls-skip-hostname-verification`
    /// (`REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`).
    RedisTlsSkipHostnameVerification,
}

/// What Tollgate's own settings say, read before envoyproxy/ratelimit's.
pub struct Given<'a> {
    /// Whether a setting was given as a flag or `TOLLGATE_*` variable.
    pub explicit: &'a dyn Fn(Flag) -> bool,
    /// The gRPC listener's TLS flags.
    pub grpc_tls: &'a GrpcTlsFlags,
    /// The Redis TLS flags.
    pub redis_tls: &'a RedisTlsFlags,
    /// Whether the admin listener serves another endpoint at a path, which
    /// `PROMETHEUS_PATH` then cannot take.
    pub taken_path: &'a dyn Fn(&str) -> bool,
}

/// envoyproxy/ratelimit's settings, read from the environment `lookup`
/// gives (the process's: `std::env::var_os`) under the precedence of the
/// module's doc: a setting [`Given`] explicitly is left to Tollgate's own.
///
/// # Errors
///
/// A variable whose value is bad or that Tollgate cannot honour safely:
/// the error names the variable and why.
pub fn read(
    lookup: impl Fn(&str) -> Option<OsString>,
    given: &Given<'_>,
) -> Result<EnvoySettings, SettingsError> {
    read_env(&Env::new(lookup), given).map_err(SettingsError)
}

/// What envoyproxy/ratelimit's environment sets: the settings the server
/// maps onto its own options (each `None` where a [`Flag`] was given or
/// nothing is set), and those only this mode has.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct EnvoySettings {
    /// Where the HTTP API listens (`HOST`:`PORT`).
    pub http: Option<String>,
    /// Where gRPC listens (`GRPC_HOST`:`GRPC_PORT`).
    pub grpc: Option<String>,
    /// The config directory (`RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/
    /// `RUNTIME_APPDIRECTORY`), unless the config comes over xDS.
    pub config: Option<PathBuf>,
    /// Which of its files are read (`RUNTIME_IGNOREDOTFILES`).
    pub config_files: ConfigFiles,
    /// Where the admin listener serves the metrics (`PROMETHEUS_ADDR`).
    pub admin_listen: Option<String>,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub envoy_counting: Option<Counting>,
    /// `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
    /// The header family (`LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub envoy_headers: Option<HeaderFamily>,
    /// The Redis URL (`REDIS_URL` with `REDIS_TYPE`, `REDIS_SOCKET_TYPE`,
    /// `REDIS_AUTH`, `REDIS_TLS`).
    pub redis: Option<String>,
    /// `REDIS_TLS=true`: Redis's TLS files.
    pub redis_tls: Option<tls::RedisFiles>,
    /// How long a Redis round trip may take (`REDIS_TIMEOUT`).
    pub redis_timeout: Option<Duration>,
    /// Whether the deny cache is on (`LOCAL_CACHE_SIZE_IN_BYTES`).
    pub deny_cache: Option<bool>,
    /// `CACHE_KEY_PREFIX`.
    pub key_prefix: Option<String>,
    /// Where `/rlconfig` is served (`DEBUG_HOST`:`DEBUG_PORT`).
    pub debug: String,
    /// `SHADOW_MODE`.
    pub shadow_mode: bool,
    /// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`.
    pub header_names: [String; 3],
    /// `RESPONSE_DYNAMIC_METADATA`.
    pub dynamic_metadata: bool,
    /// `NEAR_LIMIT_RATIO`.
    pub near_limit_ratio: f32,
    /// `PROMETHEUS_PATH`, with `USE_PROMETHEUS`.
    pub metrics_path: Option<String>,
    /// `QUOTA_MODE`.
    pub quota_mode: bool,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: where the config comes from instead of
    /// files.
    pub xds: Option<xds::Settings>,
    /// `GRPC_SERVER_USE_TLS=true`: the gRPC listener's TLS files.
    pub grpc_tls: Option<tls::ServerFiles>,
    /// The log level when `RUST_LOG` does not say (`LOG_LEVEL`).
    pub log_level: &'static str,
    /// `LOG_FORMAT=json`.
    pub log_json: bool,
    /// What to log once at start-up: the variables ignored, and why.
    pub notes: Vec<String>,
}

impl EnvoySettings {
    fn ignored(&mut self, name: &str, value: &str, reason: &str) {
        self.notes
            .push(format!("{name}={value} is ignored: {reason}"));
    }
}

/// The process's environment, as envoyproxy/ratelimit's `envconfig` reads
/// it; remembers which variables were read.
struct Env<F> {
    lookup: F,
    read: RefCell<BTreeSet<&'static str>>,
}

impl<F: Fn(&str) -> Option<OsString>> Env<F> {
    fn new(lookup: F) -> Self {
        Self {
            lookup,
            read: RefCell::default(),
        }
    }

    /// The variable's value when it is set.
    fn get(&self, name: &'static str) -> anyhow::Result<Option<String>> {
        self.read.borrow_mut().insert(name);
        (self.lookup)(name)
            .map(|value| {
                value
                    .into_string()
                    .map_err(|_| anyhow::anyhow!("{name} is not valid UTF-8"))
            })
            .transpose()
    }

    fn string(&self, name: &'static str, default: &str) -> anyhow::Result<String> {
        Ok(self.get(name)?.unwrap_or_else(|| default.to_owned()))
    }

    /// A boolean as Go's `strconv.ParseBool` reads it.
    fn bool(&self, name: &'static str, default: bool) -> anyhow::Result<bool> {
        let Some(value) = self.get(name)? else {
            return Ok(default);
        };
        match value.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
            _ => bail!("{name}={value:?}: not a boolean (true or false)"),
        }
    }

    fn int(&self, name: &'static str, default: i64) -> anyhow::Result<i64> {
        let Some(value) = self.get(name)? else {
            return Ok(default);
        };
        value
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={value:?}: not an integer: {e}"))
    }

    /// A `float32` as Go's `strconv.ParseFloat(value, 32)` reads it (decimal
    /// forms, `Inf` and `NaN`; not its hexadecimal ones): one beyond
    /// `float32`'s range is an error, as Go's `ErrRange` is there.
    fn float32(&self, name: &'static str, default: f32) -> anyhow::Result<f32> {
        let Some(value) = self.get(name)? else {
            return Ok(default);
        };
        let parsed: f32 = value
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={value:?}: not a number: {e}"))?;
        if parsed.is_infinite() && !value.to_ascii_lowercase().contains("inf") {
            bail!("{name}={value:?}: out of range for a float32");
        }
        Ok(parsed)
    }

    fn port(&self, name: &'static str, default: u16) -> anyhow::Result<u16> {
        let port = self.int(name, default.into())?;
        u16::try_from(port).map_err(|_| anyhow::anyhow!("{name}={port}: not a port (0 to 65535)"))
    }

    fn duration(&self, name: &'static str) -> anyhow::Result<Option<Duration>> {
        self.get(name)?
            .map(|value| go_duration(&value).map_err(|e| anyhow::anyhow!("{name}={value:?}: {e}")))
            .transpose()
    }
}

/// Where the admin listener serves the metrics for `PROMETHEUS_PATH`:
/// `/metrics` when empty, as envoyproxy/ratelimit's Prometheus sink takes it.
///
/// # Errors
///
/// A path that does not start with `/`, holds a brace (a route pattern
/// here), or is one of the admin listener's own endpoints.
fn metrics_path(path: &str, taken: &dyn Fn(&str) -> bool) -> anyhow::Result<String> {
    if path.is_empty() {
        return Ok("/metrics".into());
    }
    if !path.starts_with('/') || path.contains(['{', '}']) {
        bail!(
            "PROMETHEUS_PATH={path:?}: not a path such as /metrics (it starts with /, no braces)"
        );
    }
    if taken(path) {
        bail!("PROMETHEUS_PATH={path:?}: Tollgate serves another endpoint there");
    }
    Ok(path.to_owned())
}

/// `host:port` as Go's `net.JoinHostPort` writes it, an empty host being
/// every IPv4 address (Go's `:port` listens on all of them).
fn join_host_port(host: &str, port: u16) -> String {
    match host {
        "" => format!("0.0.0.0:{port}"),
        h if h.contains(':') => format!("[{h}]:{port}"),
        h => format!("{h}:{port}"),
    }
}

/// Reads envoyproxy/ratelimit's variables from `env`, leaving out the
/// settings `given` explicitly.
fn read_env<F: Fn(&str) -> Option<OsString>>(
    env: &Env<F>,
    given: &Given<'_>,
) -> anyhow::Result<EnvoySettings> {
    let mut envoy = EnvoySettings::default();
    let explicit = |flag| (given.explicit)(flag);

    let http = join_host_port(&env.string("HOST", "0.0.0.0")?, env.port("PORT", 8080)?);
    let grpc = join_host_port(
        &env.string("GRPC_HOST", "0.0.0.0")?,
        env.port("GRPC_PORT", 8081)?,
    );
    envoy.debug = join_host_port(
        &env.string("DEBUG_HOST", "0.0.0.0")?,
        env.port("DEBUG_PORT", 6070)?,
    );
    if !explicit(Flag::Http) {
        envoy.http = Some(http);
    }
    if !explicit(Flag::Grpc) {
        envoy.grpc = Some(grpc);
    }
    if let Some(uds) = env.get("GRPC_UDS")?.filter(|u| !u.is_empty()) {
        bail!(
            "GRPC_UDS={uds:?}: Tollgate serves gRPC on TCP only (GRPC_HOST, GRPC_PORT); \
             unset GRPC_UDS"
        );
    }
    if env.bool("GRPC_SERVER_USE_TLS", false)? {
        envoy.grpc_tls = Some(read_grpc_tls(env, given, &mut envoy)?);
    } else {
        for name in GRPC_TLS_VARIABLES {
            if let Some(value) = env.get(name)? {
                envoy.ignored(name, &value, NO_GRPC_TLS);
            }
        }
    }

    envoy.log_level = log_level(&env.string("LOG_LEVEL", "WARN")?)?;
    envoy.log_json = env
        .string("LOG_FORMAT", "text")?
        .eq_ignore_ascii_case("json");

    let config_type = env.string("CONFIG_TYPE", "FILE")?;
    match config_type.as_str() {
        "FILE" => {
            for name in XDS_VARIABLES {
                if let Some(value) = env.get(name)? {
                    envoy.ignored(name, &value, "used with CONFIG_TYPE=GRPC_XDS_SOTW only");
                }
            }
            for (name, reason) in [
                (
                    "FORCE_START_WITHOUT_INITIAL_CONFIG",
                    "Tollgate reads its config files before it starts",
                ),
                (
                    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
                    "from files Tollgate never serves without rules: it refuses to start on a \
                     config with none, and a reload that would leave none keeps the last good config",
                ),
            ] {
                if let Some(value) = env.get(name)? {
                    envoy.ignored(name, &value, reason);
                }
            }
        }
        "GRPC_XDS_SOTW" => {
            if explicit(Flag::Config) {
                bail!(
                    "CONFIG_TYPE=GRPC_XDS_SOTW and --config (TOLLGATE_CONFIG): the config comes \
                     either over xDS or from files; unset one"
                );
            }
            envoy.xds = Some(read_xds(env, &mut envoy)?);
        }
        other => bail!("CONFIG_TYPE={other:?}: expected FILE or GRPC_XDS_SOTW"),
    }
    let mut config = PathBuf::from(env.string("RUNTIME_ROOT", "/srv/runtime_data/current")?);
    for part in [
        env.string("RUNTIME_SUBDIRECTORY", "")?,
        env.string("RUNTIME_APPDIRECTORY", "config")?,
    ] {
        // Go's filepath.Join keeps an absolute part under the root.
        let part = part.trim_start_matches('/');
        if !part.is_empty() {
            config.push(part);
        }
    }
    if envoy.xds.is_none() && !explicit(Flag::Config) {
        envoy.config = Some(config);
    }
    envoy.config_files =
        ConfigFiles::default().ignore_dot_files(env.bool("RUNTIME_IGNOREDOTFILES", false)?);

    read_redis(env, given, &mut envoy)?;

    envoy.shadow_mode = env.bool("SHADOW_MODE", false)?;
    if env.bool("USE_PROMETHEUS", false)? {
        let addr = env.string("PROMETHEUS_ADDR", ":9090")?;
        if !explicit(Flag::AdminListen) {
            envoy.admin_listen = Some(match addr.strip_prefix(':') {
                Some(port) => format!("0.0.0.0:{port}"),
                None => addr,
            });
        }
        envoy.metrics_path = Some(metrics_path(
            &env.string("PROMETHEUS_PATH", "/metrics")?,
            given.taken_path,
        )?);
    } else {
        env.get("PROMETHEUS_ADDR")?;
        env.get("PROMETHEUS_PATH")?;
    }
    envoy.near_limit_ratio = env.float32("NEAR_LIMIT_RATIO", 0.8)?;

    if env.bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)? && !explicit(Flag::EnvoyCounting)
    {
        envoy.envoy_counting = Some(Counting::AllOrNothing);
    }
    envoy.quota_mode = env.bool("QUOTA_MODE", false)?;
    if env.bool("MERGE_DOMAIN_CONFIG", false)? && !explicit(Flag::MergeDomains) {
        envoy.merge_domains = true;
    }
    envoy.dynamic_metadata = env.bool("RESPONSE_DYNAMIC_METADATA", false)?;
    let headers = env.bool("LIMIT_RESPONSE_HEADERS_ENABLED", false)?;
    envoy.header_names = [
        env.string("LIMIT_LIMIT_HEADER", DEFAULT_NAMES[0])?,
        env.string("LIMIT_REMAINING_HEADER", DEFAULT_NAMES[1])?,
        env.string("LIMIT_RESET_HEADER", DEFAULT_NAMES[2])?,
    ];
    if !explicit(Flag::EnvoyHeaders) {
        envoy.envoy_headers = Some(if headers {
            HeaderFamily::Ratelimit
        } else {
            HeaderFamily::None
        });
    }

    for (name, reason) in IGNORED {
        if let Some(value) = env.get(name)? {
            envoy.ignored(name, &value, reason);
        }
    }
    Ok(envoy)
}

/// The settings of `CONFIG_TYPE=GRPC_XDS_SOTW`, with
/// envoyproxy/ratelimit's defaults.
fn read_xds<F: Fn(&str) -> Option<OsString>>(
    env: &Env<F>,
    envoy: &mut EnvoySettings,
) -> anyhow::Result<xds::Settings> {
    let tls = if env.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        // As `utils.TlsConfigFromFiles` takes them: the client certificate
        // when both files are named, the CA when named, the SAN when set.
        let file = |name: &'static str| -> anyhow::Result<Option<tls::Named>> {
            Ok(env
                .get(name)?
                .filter(|path| !path.is_empty())
                .map(|path| tls::Named::new(name, path)))
        };
        let identity = match (
            file("CONFIG_GRPC_XDS_CLIENT_TLS_CERT")?,
            file("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")?,
        ) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => bail!(
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY: \
                 a client certificate needs both"
            ),
        };
        let ca = file("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")?;
        let san = env
            .get("CONFIG_GRPC_XDS_SERVER_TLS_SAN")?
            .filter(|san| !san.is_empty());
        if let Some(san) = &san {
            tracing::info!(
                "ServerName used for xDS Management Service hostname verification is {san}"
            );
        }
        Some(tls::xds_client(identity, ca, san)?)
    } else {
        for name in XDS_TLS_VARIABLES {
            if let Some(value) = env.get(name)? {
                envoy.ignored(name, &value, NO_XDS_TLS);
            }
        }
        None
    };
    let url = env.string("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")?;
    // gRPC's name resolver schemes for a plain address.
    let server = ["dns:///", "passthrough:///"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
        .unwrap_or(&url)
        .to_owned();
    if let Err(e) = tonic::transport::Endpoint::from_shared(format!("http://{server}")) {
        bail!("CONFIG_GRPC_XDS_SERVER_URL={url:?}: not a host:port address: {e}");
    }
    // As its provider splits it: `k=v` pairs, comma-separated, others skipped.
    let node_metadata = env
        .string("CONFIG_GRPC_XDS_NODE_METADATA", "")?
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let retry = env
        .duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")?
        .unwrap_or(Duration::from_secs(3));
    let max_message = match env.int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0)? {
        0 => None,
        n => Some(usize::try_from(n).map_err(|_| {
            anyhow::anyhow!("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={n}: not a size in bytes")
        })?),
    };
    let endpoint = xds::endpoint(&server, tls).map_err(|e| {
        anyhow::Error::new(e).context(format!(
            "CONFIG_GRPC_XDS_SERVER_USE_TLS=true: cannot set up TLS to {server}"
        ))
    })?;
    Ok(xds::Settings {
        endpoint,
        server,
        node_id: env.string("CONFIG_GRPC_XDS_NODE_ID", "default")?,
        node_metadata,
        retry,
        headers: headers(&env.string("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "")?)?,
        max_message,
        force_start: env.bool("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
        healthy_with_config: env.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
    })
}

/// The gRPC listener's TLS with `GRPC_SERVER_USE_TLS=true`: each file from
/// its variable unless its Tollgate flag names one.
fn read_grpc_tls<F: Fn(&str) -> Option<OsString>>(
    env: &Env<F>,
    given: &Given<'_>,
    envoy: &mut EnvoySettings,
) -> anyhow::Result<tls::ServerFiles> {
    let flags = given.grpc_tls;
    let file = |id: Flag, flag: &'static str, path: &Option<PathBuf>, name: &'static str| {
        tls_file(env, ((given.explicit)(id), flag, path), name)
    };
    let cert = file(
        Flag::GrpcTlsCert,
        "--grpc-tls-cert",
        &flags.grpc_tls_cert,
        "GRPC_SERVER_TLS_CERT",
    )?;
    let key = file(
        Flag::GrpcTlsKey,
        "--grpc-tls-key",
        &flags.grpc_tls_key,
        "GRPC_SERVER_TLS_KEY",
    )?;
    let (Some(cert), Some(key)) = (cert, key) else {
        bail!("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY");
    };
    let client_ca = file(
        Flag::GrpcClientCa,
        "--grpc-client-ca",
        &flags.grpc_client_ca,
        "GRPC_CLIENT_TLS_CACERT",
    )?;
    let client_san = match (
        &flags.grpc_client_san,
        (given.explicit)(Flag::GrpcClientSan),
    ) {
        (Some(san), true) => Some(("--grpc-client-san", san.clone())),
        _ => env
            .get("GRPC_CLIENT_TLS_SAN")?
            .filter(|san| !san.is_empty())
            .map(|san| ("GRPC_CLIENT_TLS_SAN", san)),
    };
    // envoyproxy/ratelimit checks the SAN of verified client certificates,
    // and asks for none without a CA.
    let client_san = match (client_san, &client_ca) {
        (Some((name, san)), None) => {
            envoy.ignored(name, &san, "used with GRPC_CLIENT_TLS_CACERT only");
            None
        }
        (san, _) => san,
    };
    Ok(tls::ServerFiles {
        cert,
        key,
        client_ca,
        client_san,
    })
}

/// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` as Go's `envconfig` reads a
/// map (`k1:v1,k2:v2`, each item exactly one `:`), as gRPC metadata.
fn headers(value: &str) -> anyhow::Result<Vec<(AsciiMetadataKey, AsciiMetadataValue)>> {
    if value.trim().is_empty() {
        return Ok(Vec::new());
    }
    let bad = |item: &str, why: &str| {
        anyhow::anyhow!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: {item:?}: {why}")
    };
    value
        .split(',')
        .map(|item| {
            let mut parts = item.split(':');
            let (Some(key), Some(header), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad(item, "invalid map item, expected key:value"));
            };
            let key = AsciiMetadataKey::from_bytes(key.to_ascii_lowercase().as_bytes())
                .map_err(|_| bad(item, "not a gRPC metadata key"))?;
            let header = AsciiMetadataValue::try_from(header)
                .map_err(|_| bad(item, "not a gRPC metadata value"))?;
            Ok((key, header))
        })
        .collect()
}

/// The Redis settings: envoyproxy/ratelimit always runs on Redis (or
/// Memcache), so this mode does too.
fn read_redis<F: Fn(&str) -> Option<OsString>>(
    env: &Env<F>,
    given: &Given<'_>,
    envoy: &mut EnvoySettings,
) -> anyhow::Result<()> {
    let explicit = |flag| (given.explicit)(flag);
    match env.string("BACKEND_TYPE", "redis")?.as_str() {
        "redis" | "" => {}
        "memcache" => bail!(
            "BACKEND_TYPE=memcache: Tollgate keeps shared limits in Redis only; \
             use BACKEND_TYPE=redis with REDIS_URL"
        ),
        other => bail!("BACKEND_TYPE={other:?}: expected redis"),
    }
    let use_tls = env.bool("REDIS_TLS", false)?;
    let socket = env.string("REDIS_SOCKET_TYPE", "unix")?;
    let kind = env.string("REDIS_TYPE", "SINGLE")?.to_ascii_lowercase();
    let url = env.string("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")?;
    let auth = env.string("REDIS_AUTH", "")?;
    let redis = redis_url(&socket, &kind, &url, &auth, use_tls)?;
    if use_tls {
        envoy.redis_tls = Some(read_redis_tls(env, given)?);
    } else {
        for name in REDIS_TLS_VARIABLES {
            if let Some(value) = env.get(name)? {
                envoy.ignored(name, &value, NO_REDIS_TLS);
            }
        }
    }
    if !explicit(Flag::Redis) {
        envoy.redis = Some(redis);
    }
    // Unset, envoyproxy/ratelimit's default: its decisions wait on Redis,
    // and so do a swapped binary's (Tollgate's own 10 ms default would
    // decide by failure policy on a slow answer that Redis may still apply).
    let timeout = env
        .duration("REDIS_TIMEOUT")?
        .unwrap_or(Duration::from_secs(10));
    if !explicit(Flag::RedisTimeout) {
        let longest = Duration::from_secs(60);
        if timeout.is_zero() || timeout > longest {
            envoy.ignored(
                "REDIS_TIMEOUT",
                &format!("{timeout:?}"),
                "Tollgate waits at most 1m for a Redis round trip, so it waits 1m",
            );
        }
        envoy.redis_timeout = Some(if timeout.is_zero() {
            longest
        } else {
            timeout.min(longest)
        });
    }
    let local_cache = env.int("LOCAL_CACHE_SIZE_IN_BYTES", 0)?;
    if !explicit(Flag::DenyCache) {
        envoy.deny_cache = Some(local_cache > 0);
    }
    let prefix = env.string("CACHE_KEY_PREFIX", "")?;
    if prefix.contains(['{', '}']) {
        bail!("CACHE_KEY_PREFIX={prefix:?}: Tollgate's Redis keys cannot hold braces");
    }
    if !prefix.is_empty() {
        envoy.key_prefix = Some(prefix);
    }
    Ok(())
}

/// A certificate file: the flag's (named `flag` in errors) when given
/// explicitly, else envoyproxy/ratelimit's variable `name` when set and not
/// empty.
fn tls_file<F: Fn(&str) -> Option<OsString>>(
    env: &Env<F>,
    (explicit, flag, given): (bool, &'static str, &Option<PathBuf>),
    name: &'static str,
) -> anyhow::Result<Option<tls::Named>> {
    if explicit && let Some(path) = given {
        return Ok(Some(tls::Named::new(flag, path)));
    }
    Ok(env
        .get(name)?
        .filter(|path| !path.is_empty())
        .map(|path| tls::Named::new(name, path)))
}

/// Redis's TLS with `REDIS_TLS=true`: each file from its variable unless
/// its Tollgate flag names one, as envoyproxy/ratelimit's
/// `utils.TlsConfigFromFiles` reads them for Redis.
fn read_redis_tls<F: Fn(&str) -> Option<OsString>>(
    env: &Env<F>,
    given: &Given<'_>,
) -> anyhow::Result<tls::RedisFiles> {
    let flags = given.redis_tls;
    let file = |id: Flag, flag: &'static str, path: &Option<PathBuf>, name: &'static str| {
        tls_file(env, ((given.explicit)(id), flag, path), name)
    };
    let skip_hostname_verification = if (given.explicit)(Flag::RedisTlsSkipHostnameVerification) {
        flags.skip_hostname_verification
    } else {
        env.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)?
    };
    Ok(tls::RedisFiles {
        ca: file(
            Flag::RedisTlsCa,
            "--redis-tls-ca",
            &flags.ca,
            "REDIS_TLS_CACERT",
        )?,
        cert: file(
            Flag::RedisTlsCert,
            "--redis-tls-cert",
            &flags.cert,
            "REDIS_TLS_CLIENT_CERT",
        )?,
        key: file(
            Flag::RedisTlsKey,
            "--redis-tls-key",
            &flags.key,
            "REDIS_TLS_CLIENT_KEY",
        )?,
        skip_hostname_verification,
    })
}

/// The URL Tollgate's Redis store takes for envoyproxy/ratelimit's
/// `REDIS_SOCKET_TYPE`, `REDIS_TYPE`, `REDIS_URL`, `REDIS_AUTH` (`password`
/// or `user:password`) and `REDIS_TLS` (`rediss`).
fn redis_url(
    socket: &str,
    kind: &str,
    url: &str,
    auth: &str,
    use_tls: bool,
) -> anyhow::Result<String> {
    let encode = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    let (user, password) = match auth.split_once(':') {
        Some((user, password)) => (encode(user), encode(password)),
        None => (String::new(), encode(auth)),
    };
    let userinfo = if auth.is_empty() {
        String::new()
    } else {
        format!("{user}:{password}@")
    };
    let scheme = if use_tls { "rediss" } else { "redis" };
    if url.starts_with("rediss://") && !use_tls {
        bail!("REDIS_URL=rediss://...: set REDIS_TLS=true (and its REDIS_TLS_* files) for TLS");
    }
    match kind {
        "single" if url.starts_with("redis://") || url.starts_with("rediss://") => {
            let (_, rest) = url.split_once("://").unwrap_or_default();
            Ok(if rest.contains('@') {
                format!("{scheme}://{rest}")
            } else {
                format!("{scheme}://{userinfo}{rest}")
            })
        }
        "single" => match socket {
            "tcp" | "tcp4" | "tcp6" => Ok(format!("{scheme}://{userinfo}{url}")),
            "unix" if use_tls => bail!(
                "REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: Tollgate speaks TLS to Redis \
                 over TCP only; set REDIS_SOCKET_TYPE=tcp"
            ),
            "unix" => {
                let mut query = Vec::new();
                if !user.is_empty() {
                    query.push(format!("user={user}"));
                }
                if !auth.is_empty() {
                    query.push(format!("pass={password}"));
                }
                let query = if query.is_empty() {
                    String::new()
                } else {
                    format!("?{}", query.join("&"))
                };
                Ok(format!("unix://{url}{query}"))
            }
            other => bail!("REDIS_SOCKET_TYPE={other:?}: expected tcp or unix"),
        },
        "cluster" => Ok(format!("{scheme}+cluster://{userinfo}{url}")),
        "sentinel" => bail!(
            "REDIS_TYPE=sentinel: Tollgate does not talk to Redis Sentinel; \
             use REDIS_TYPE=single (the master's address, or a proxy) or cluster"
        ),
        other => bail!("REDIS_TYPE={other:?}: expected single or cluster"),
    }
}

/// The `tracing` level for logrus's `LOG_LEVEL` names (any case); `panic`
/// and `fatal` are `error`, `tracing`'s most severe.
fn log_level(value: &str) -> anyhow::Result<&'static str> {
    Ok(match value.to_ascii_lowercase().as_str() {
        "panic" | "fatal" | "error" => "error",
        "warn" | "warning" => "warn",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        _ => bail!(
            "LOG_LEVEL={value:?}: not a log level (panic, fatal, error, warn, info, debug, trace)"
        ),
    })
}

/// A duration as Go's `time.ParseDuration` reads it: `0`, or numbers (with
/// fractions) each with a unit of `ns`, `us`, `µs`, `ms`, `s`, `m` or `h`
/// (`1h30m`, `1.5s`).
fn go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("not a duration (such as 300ms, 10s or 1h30m): {text:?}");
    let rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() || rest.starts_with('-') {
        return Err(bad());
    }
    let mut rest = rest;
    let mut nanos = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, tail) = rest.split_at(number_end);
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        let number: f64 = number.parse().map_err(|_| bad())?;
        nanos += number * scale;
        rest = tail;
    }
    if !nanos.is_finite() || nanos > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// envoyproxy/ratelimit's debug listener: `/rlconfig` dumps the config in
/// force, `/` lists the endpoints.
pub fn debug_router(policy: PolicyHandle) -> Router {
    Router::new()
        .route(
            "/rlconfig",
            get(move || {
                let policy = policy.load();
                async move { dump(&policy) }
            }),
        )
        .route(
            "/",
            get(|| async {
                "/rlconfig: print out the currently loaded configuration for debugging\n"
            }),
        )
}

/// The config in force, one line per rule, in envoyproxy/ratelimit's
/// `Dump` form (`domain.key_value: unit=MINUTE requests_per_unit=5,
/// shadow_mode: false`); a native rule shows its algorithm and quota.
fn dump(policy: &Policy) -> String {
    let mut text = String::new();
    for domain in policy.domains() {
        for rule in policy.rules(domain) {
            let _ = write!(text, "{domain}.{}: ", rule.id());
            match (rule.envoy_window(), rule.quota(), rule.algorithm()) {
                _ if rule.unlimited() => text.push_str("unlimited"),
                (Some(unit), quota, _) => {
                    let _ = write!(
                        text,
                        "unit={} requests_per_unit={}",
                        unit.name().to_ascii_uppercase(),
                        quota.map_or(0, |q| q.limit())
                    );
                }
                (None, Some(quota), Some(algorithm)) => {
                    let _ = write!(
                        text,
                        "algorithm={algorithm} limit={} per={:?} burst={}",
                        quota.limit(),
                        quota.period(),
                        quota.burst()
                    );
                }
                (None, _, _) => text.push_str("blocked"),
            }
            let _ = writeln!(text, ", shadow_mode: {}", rule.shadow());
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn every_variable_is_read_or_ignored_with_a_reason() {
        let vars: HashMap<&str, &str> = HashMap::new();
        let env = Env::new(move |name: &str| vars.get(name).map(OsString::from));
        let given = Given {
            explicit: &|_| false,
            grpc_tls: &GrpcTlsFlags::default(),
            redis_tls: &RedisTlsFlags::default(),
            taken_path: &|_| false,
        };
        read_env(&env, &given).expect("defaults are fine");
        let read = env.read.into_inner();
        let known: BTreeSet<&str> = ENVOY_VARIABLES.iter().copied().collect();
        assert_eq!(
            read, known,
            "read (or ignored) and settings.go's list differ"
        );
        let ignored: BTreeSet<&str> = IGNORED.iter().map(|(name, _)| *name).collect();
        assert!(ignored.is_subset(&known));
    }

    #[test]
    fn redis_urls_follow_type_socket_and_auth() {
        let url =
            |socket, kind, url, auth| redis_url(socket, kind, url, auth, false).expect("valid");
        let tls = |socket, kind, url| redis_url(socket, kind, url, "pw", true).expect("valid");
        assert_eq!(url("tcp", "single", "h:6379", ""), "redis://h:6379");
        assert_eq!(url("tcp", "single", "h:6379", "pw"), "redis://:pw@h:6379");
        assert_eq!(
            url("unix", "single", "/run/r.sock", "u:p+w"),
            "unix:///run/r.sock?user=u&pass=p%2Bw"
        );
        assert_eq!(
            url("tcp", "cluster", "a:1,b:2", "pw"),
            "redis+cluster://:pw@a:1,b:2"
        );
        assert_eq!(
            url("tcp", "single", "redis://h:1/2", "pw"),
            "redis://:pw@h:1/2"
        );
        assert!(redis_url("udp", "single", "h:1", "", false).is_err());
        // REDIS_TLS=true: rediss, over TCP only.
        assert_eq!(tls("tcp", "single", "h:1"), "rediss://:pw@h:1");
        assert_eq!(tls("tcp", "single", "redis://h:1/2"), "rediss://:pw@h:1/2");
        assert_eq!(tls("tcp", "single", "rediss://h:1/2"), "rediss://:pw@h:1/2");
        assert_eq!(
            tls("tcp", "cluster", "a:1,b:2"),
            "rediss+cluster://:pw@a:1,b:2"
        );
        assert!(redis_url("unix", "single", "/run/r.sock", "", true).is_err());
        assert!(redis_url("tcp", "single", "rediss://h:1", "", false).is_err());
    }

    #[test]
    fn go_durations() {
        for (text, nanos) in [
            ("0", 0),
            ("10s", 10_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("1.5s", 1_500_000_000),
            ("250ms", 250_000_000),
            ("7us", 7_000),
            ("3µs", 3_000),
            ("+2ns", 2),
        ] {
            assert_eq!(go_duration(text), Ok(Duration::from_nanos(nanos)), "{text}");
        }
        for bad in ["", "10", "-1s", "1d", "s", "1.s2"] {
            assert!(go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_dump_names_each_rule_with_its_limit() {
        let policy = Policy::parse(
            "api.yaml",
            "domain: api\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: free\n    rate_limit: { unlimited: true }\n  - key: dark\n    shadow_mode: true\n    rate_limit: { unit: second, requests_per_unit: 0 }\n",
        )
        .expect("valid");
        assert_eq!(
            dump(&policy),
            "api.user: unit=MINUTE requests_per_unit=5, shadow_mode: false\n\
             api.free: unlimited, shadow_mode: false\n\
             api.dark: unit=SECOND requests_per_unit=0, shadow_mode: true\n"
        );
    }
}
