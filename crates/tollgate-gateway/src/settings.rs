//! The gateway's options (flags, environment variables, or a library
//! user's values) and the settings they resolve to over the
//! `--gateway-config` file and the defaults.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tollgate_http::{ClientIpConfig, HeaderStyle, Shedder};
use tollgate_policy::ConfigError;

use crate::actions::RateLimitSpec;
use crate::config::{Cidr, GatewayFile, ShedSection};
use crate::proxy::Upstream;
use crate::routes::Routes;

/// The domain the gateway checks requests in unless told otherwise.
const DEFAULT_DOMAIN: &str = "gateway";
/// IPv6 clients are keyed by their network of this many bits unless told otherwise.
const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Client connections held open at once unless told otherwise: well under
/// the usual 65,536 file descriptors, so the upstream pool and the other
/// listeners keep theirs.
const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Options of the gateway, part of `tollgate serve`'s. A flag (or its
/// environment variable) overrides the `--gateway-config` file's field.
/// With the `clap` feature, these are the flags.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[cfg_attr(feature = "clap", group(id = "gateway"))]
pub struct Options {
    /// Runs the gateway: a reverse proxy listening on ADDR that checks every
    /// request against the policy and forwards admitted ones to --upstream
    /// (port 0 picks a free port; the log says which).
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_PROXY_LISTEN", value_name = "ADDR")
    )]
    pub proxy_listen: Option<String>,

    /// The gateway's upstream: http://host:port, optionally with a base path.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_UPSTREAM", value_name = "URL")
    )]
    pub upstream: Option<Upstream>,

    /// The policy domain the gateway checks requests in [default: gateway].
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_PROXY_DOMAIN", value_name = "DOMAIN")
    )]
    pub proxy_domain: Option<String>,

    /// A proxy in front of the gateway (an address or a CIDR network) whose
    /// X-Forwarded-For is believed; repeat for several (the environment
    /// variable takes a comma-separated list).
    #[cfg_attr(
        feature = "clap",
        arg(
            long = "trusted-proxy",
            env = "TOLLGATE_TRUSTED_PROXIES",
            value_name = "CIDR",
            value_delimiter = ','
        )
    )]
    pub trusted_proxies: Vec<Cidr>,

    /// Keys IPv6 clients by their network of this many bits [default: 64].
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "TOLLGATE_IPV6_PREFIX",
            value_name = "BITS",
            value_parser = clap::value_parser!(u8).range(0..=128)
        )
    )]
    pub ipv6_prefix: Option<u8>,

    /// The gateway's YAML config: the `rate_limits` actions that make each
    /// request's descriptors (Envoy's), route templates, and any of the
    /// options above. Read once at start.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_GATEWAY_CONFIG", value_name = "PATH")
    )]
    pub gateway_config: Option<PathBuf>,

    /// The most client connections the gateway holds open at once, over all
    /// its workers [default: 10000]. Past it, a new connection is closed at
    /// once, so a flood of idle connections cannot take every file
    /// descriptor the API and gRPC listeners need.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "TOLLGATE_PROXY_MAX_CONNECTIONS",
            value_name = "N",
            value_parser = clap::value_parser!(u32).range(1..)
        )
    )]
    pub proxy_max_connections: Option<u32>,

    /// The rate limit headers the gateway's answers carry, a comma-separated
    /// list of families: x-ratelimit, reset-after, bucket, draft (the IETF
    /// draft's RateLimit-Policy and the most restrictive limit's RateLimit),
    /// draft-every-limit (RateLimit listing every limit), envoy; or default
    /// (x-ratelimit,draft), all, none [default: default].
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "TOLLGATE_PROXY_HEADERS", value_name = "FAMILIES")
    )]
    pub proxy_headers: Option<HeaderStyle>,
}

/// Why the gateway's options do not make a gateway.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The config file cannot be used.
    #[error("gateway config does not validate: {0}")]
    Config(#[from] ConfigError),
    /// An upstream or a config file, but nowhere to listen.
    #[error(
        "the gateway has no address: give --proxy-listen (or `listen` in the gateway config) with --upstream"
    )]
    NoListen,
    /// An address, but nowhere to forward.
    #[error("the gateway has no upstream: give --upstream (or `upstream` in the gateway config)")]
    NoUpstream,
    /// An empty domain, which no rule can be in.
    #[error("the gateway's domain cannot be empty")]
    EmptyDomain,
}

/// The gateway's settings: the options over the config file over the
/// defaults, checked.
#[derive(Debug)]
pub struct Settings {
    pub(crate) listen: String,
    pub(crate) upstream: Upstream,
    pub(crate) domain: String,
    pub(crate) client_ip: ClientIpConfig,
    pub(crate) routes: Arc<Routes>,
    pub(crate) rate_limits: Vec<RateLimitSpec>,
    pub(crate) max_connections: usize,
    /// The rate limit headers of its answers.
    pub(crate) headers: HeaderStyle,
    /// Load shedding in front of the upstream, when configured.
    pub(crate) shedder: Option<Arc<Shedder>>,
    /// Whether [`Gateway::spawn`](crate::Gateway::spawn) serves on the
    /// runtime that calls it instead of a thread per CPU.
    pub(crate) on_caller_runtime: bool,
}

impl Settings {
    /// The settings, or `None` when the options do not ask for a gateway
    /// (no address, no upstream, no config file). Reads the config file.
    ///
    /// # Errors
    ///
    /// When the config file cannot be read or does not validate, or the
    /// options ask for a gateway without saying where it listens or forwards.
    pub fn resolve(options: Options) -> Result<Option<Self>, SettingsError> {
        Self::resolve_with_policy(options, None)
    }

    /// [`Settings::resolve`], where the native policy file at `policy` (the
    /// service's `--config`) may hold the gateway's settings in a `gateway:`
    /// section: they apply when no `--gateway-config` is given and the
    /// options ask for a gateway (`--proxy-listen` or `--upstream`), so
    /// `tollgate serve --config examples/stripe.yaml --proxy-listen ADDR
    /// --upstream URL` runs the example's gateway.
    ///
    /// # Errors
    ///
    /// As [`Settings::resolve`], and when the policy file's `gateway:`
    /// section does not validate.
    pub fn resolve_with_policy(
        options: Options,
        policy: Option<&Path>,
    ) -> Result<Option<Self>, SettingsError> {
        let asked = options.proxy_listen.is_some() || options.upstream.is_some();
        let file = match (&options.gateway_config, policy) {
            (Some(path), _) => GatewayFile::load(path)?,
            (None, Some(policy)) if asked => GatewayFile::embedded(policy)?.unwrap_or_default(),
            (None, _) => GatewayFile::default(),
        };
        let upstream = options.upstream.or(file.upstream);
        let Some(listen) = options.proxy_listen.or(file.listen) else {
            if upstream.is_some() || options.gateway_config.is_some() {
                return Err(SettingsError::NoListen);
            }
            return Ok(None);
        };
        let upstream = upstream.ok_or(SettingsError::NoUpstream)?;
        let domain = options
            .proxy_domain
            .or(file.domain)
            .unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
        if domain.is_empty() {
            return Err(SettingsError::EmptyDomain);
        }
        let trusted = if options.trusted_proxies.is_empty() {
            file.trusted_proxies.unwrap_or_default()
        } else {
            options.trusted_proxies
        };
        let ipv6_prefix = options
            .ipv6_prefix
            .or(file.ipv6_prefix.map(|p| p.0))
            .unwrap_or(DEFAULT_IPV6_PREFIX);
        let mut client_ip = ClientIpConfig::new()
            .trust(trusted.into_iter().map(|c| c.0))
            .ipv6_prefix(ipv6_prefix);
        if let Some(header) = file.forwarded_header {
            client_ip = client_ip.header(header.into());
        }
        Ok(Some(Self {
            listen,
            upstream,
            domain,
            client_ip,
            routes: Arc::new(Routes(file.routes)),
            rate_limits: file.rate_limits,
            max_connections: options
                .proxy_max_connections
                .map_or(DEFAULT_MAX_CONNECTIONS, |n| n as usize),
            headers: options.proxy_headers.unwrap_or_default(),
            shedder: file.shed.map(|ShedSection(shedder)| shedder),
            on_caller_runtime: false,
        }))
    }

    /// The load shedder in front of the upstream, when the config has a
    /// `shed` section: its [`Shedder::snapshot`] shows the learned limit,
    /// the requests in flight and the sheds by tier.
    pub fn shedder(&self) -> Option<&Arc<Shedder>> {
        self.shedder.as_ref()
    }

    /// The most connections the gateway holds open.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The same gateway holding at most `max` connections open (at least
    /// one).
    #[must_use]
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// The same gateway with one listener, served on the tokio runtime that
    /// calls [`Gateway::spawn`](crate::Gateway::spawn) rather than on a
    /// worker thread per CPU, each with a runtime of its own. For tests under
    /// tokio's paused time: time is paused per runtime, so a shaped request's
    /// delay is only virtual on the test's own runtime.
    #[must_use]
    pub fn on_caller_runtime(mut self) -> Self {
        self.on_caller_runtime = true;
        self
    }
}
