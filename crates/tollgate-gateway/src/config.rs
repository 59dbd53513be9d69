//! The gateway's config file (`--gateway-config`): where it listens and
//! forwards, whose forwarding headers it believes, and the `rate_limits`
//! actions that make each request's descriptors, mirroring Envoy's
//! route-level `rate_limits`. Every field is optional; a flag (or its
//! environment variable) overrides the field it names.
//!
//! ```yaml
//! listen: 0.0.0.0:8000              # --proxy-listen
//! upstream: http://127.0.0.1:9000   # --upstream
//! domain: gateway                   # --proxy-domain
//! trusted_proxies: [10.0.0.0/8]     # --trusted-proxy
//! forwarded_header: x-forwarded-for # or forwarded
//! ipv6_prefix: 64                   # --ipv6-prefix
//! routes: ["/users/{id}"]           # templates for the path and route actions
//! rate_limits:
//!   - actions:
//!       - remote_address: {}
//!   - actions:
//!       - request_headers: { header_name: x-api-key, descriptor_key: api_key }
//! shed:                             # load shedding by priority tier
//!   priority_header: x-priority
//!   thresholds: { critical: 100, high: 75, low: 50 }
//! ```
//!
//! The same fields may sit under `gateway:` in a native policy file, so that
//! one file runs a gateway (see [`GatewayFile::load`]).

use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;

use ipnet::IpNet;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use serde::Deserialize;
use tollgate_core::GradientConfig;
use tollgate_http::{ForwardedHeader, ShedConfig, Shedder};
use tollgate_policy::{ConfigError, ThresholdsSpec};

use crate::actions::{Prefix, RateLimitSpec};
use crate::proxy::Upstream;
use crate::routes::Template;

/// The gateway's config file, as read.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct GatewayFile {
    /// Where the gateway listens (`host:port`).
    pub(crate) listen: Option<String>,
    /// The upstream every admitted request is forwarded to.
    pub(crate) upstream: Option<Upstream>,
    /// The policy domain whose rules apply (default `gateway`).
    pub(crate) domain: Option<String>,
    /// The peers whose forwarding header is believed.
    pub(crate) trusted_proxies: Option<Vec<Cidr>>,
    /// Which forwarding header the trusted proxies write.
    pub(crate) forwarded_header: Option<HeaderChoice>,
    /// IPv6 clients are keyed by their network of this many bits (default 64).
    pub(crate) ipv6_prefix: Option<Prefix<128>>,
    /// Route templates, first match wins, for the `path` and `route` actions.
    pub(crate) routes: Vec<Template>,
    /// Envoy's route-level `rate_limits`; none means one descriptor
    /// `remote_address=<client IP>` per request.
    pub(crate) rate_limits: Vec<RateLimitSpec>,
    /// Load shedding by priority tier on an adaptive concurrency limit in
    /// front of the upstream; none means no shedding.
    pub(crate) shed: Option<ShedSection>,
}

/// A native policy file, of which only the `gateway:` section is read here.
#[derive(Deserialize)]
struct PolicyFile {
    gateway: Option<GatewayFile>,
}

/// Whether a file is a policy file (with `rules`) rather than a gateway's.
#[derive(Deserialize)]
struct Probe {
    rules: Option<serde::de::IgnoredAny>,
}

impl GatewayFile {
    /// Reads and checks the file at `path`: a gateway's file, or a native
    /// policy file whose `gateway:` section is taken (none is the defaults).
    pub(crate) fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = read(path)?;
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        match Self::section(path, &text)? {
            Some(section) => Ok(section.unwrap_or_default()),
            None => tollgate_policy::parse_yaml(path, &text),
        }
    }

    /// The `gateway:` section of the native policy file at `path`, if it
    /// has one; `None` for a directory, a file of envoyproxy/ratelimit's
    /// format or a policy without the section.
    pub(crate) fn embedded(path: &Path) -> Result<Option<Self>, ConfigError> {
        if !path.is_file() {
            return Ok(None);
        }
        Ok(Self::section(path, &read(path)?)?.flatten())
    }

    /// `Some(its gateway: section)` when `text` is a native policy file (it
    /// has `rules`), `None` when it is not one.
    fn section(path: &Path, text: &str) -> Result<Option<Option<Self>>, ConfigError> {
        let probe: Probe = tollgate_policy::parse_yaml(path, text)?;
        if probe.rules.is_none() {
            return Ok(None);
        }
        let policy: PolicyFile = tollgate_policy::parse_yaml(path, text)?;
        Ok(Some(policy.gateway))
    }
}

/// The text of the file at `path`.
fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        path: path.to_owned(),
        line: 0,
        column: 0,
        field: "file".into(),
        reason: e.to_string(),
    })
}

/// The `shed` section: the [`Shedder`] its config (over the defaults) makes,
/// checked as it is read, so a bad value is reported at its line.
#[derive(Debug, Deserialize)]
#[serde(try_from = "ShedSpec")]
pub(crate) struct ShedSection(pub(crate) Arc<Shedder>);

/// The `shed` section as written.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ShedSpec {
    /// The header naming a request's tier: `critical`, `high` or `low`
    /// (anything else is low).
    priority_header: String,
    /// The utilization (in flight over the learned limit, percent) from
    /// which each tier is shed.
    thresholds: ThresholdsSpec,
    /// The lowest learned limit, and the limit while `min_rtt` is probed.
    floor: u32,
    /// The highest learned limit.
    ceiling: u32,
    /// How long latencies are gathered before the limit moves.
    sample_window: Period,
    /// How often the latency with nothing queued is measured again.
    probe_interval: Period,
    /// How many requests a probe takes the median latency of.
    probe_samples: u32,
    /// Latency tolerated over `min_rtt` before the limit falls, in percent.
    buffer_percent: u32,
    /// A shed request's `Retry-After`.
    retry_after: Period,
}

impl Default for ShedSpec {
    fn default() -> Self {
        let ShedConfig {
            limit,
            thresholds,
            priority_header,
            retry_after,
        } = ShedConfig::default();
        Self {
            priority_header: priority_header.as_str().to_owned(),
            thresholds: thresholds.into(),
            floor: limit.floor,
            ceiling: limit.ceiling,
            sample_window: Period(limit.sample_window),
            probe_interval: Period(limit.probe_interval),
            probe_samples: limit.probe_samples,
            buffer_percent: limit.buffer_percent,
            retry_after: Period(retry_after),
        }
    }
}

impl TryFrom<ShedSpec> for ShedSection {
    type Error = String;

    fn try_from(spec: ShedSpec) -> Result<Self, String> {
        let priority_header = HeaderName::from_bytes(spec.priority_header.as_bytes())
            .map_err(|_| format!("{:?} is not a header name", spec.priority_header))?;
        let config = ShedConfig {
            limit: GradientConfig {
                floor: spec.floor,
                ceiling: spec.ceiling,
                sample_window: spec.sample_window.0,
                probe_samples: spec.probe_samples,
                probe_interval: spec.probe_interval.0,
                buffer_percent: spec.buffer_percent,
            },
            thresholds: spec.thresholds.into(),
            priority_header,
            retry_after: spec.retry_after.0,
        };
        let shedder = Shedder::new(config).map_err(|e| e.to_string())?;
        Ok(Self(Arc::new(shedder)))
    }
}

/// A duration written as `100ms`, `1s`, `1m`...
#[derive(Clone, Copy, Deserialize)]
#[serde(try_from = "String")]
struct Period(Duration);

impl TryFrom<String> for Period {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        tollgate_policy::parse_duration(&s)
            .map(Period)
            .map_err(|e| e.to_string())
    }
}

/// `X-Forwarded-For` or `Forwarded`, by name.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum HeaderChoice {
    /// `X-Forwarded-For`.
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    /// RFC 7239 `Forwarded`.
    #[serde(rename = "forwarded")]
    Forwarded,
}

impl From<HeaderChoice> for ForwardedHeader {
    fn from(choice: HeaderChoice) -> Self {
        match choice {
            HeaderChoice::XForwardedFor => ForwardedHeader::XForwardedFor,
            HeaderChoice::Forwarded => ForwardedHeader::Forwarded,
        }
    }
}

/// A network in CIDR notation, or a single address (a /32 or /128).
#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Cidr(pub(crate) IpNet);

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        s.parse::<IpNet>()
            .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
            .map(Cidr)
            .map_err(|_| format!("{s:?} is not an address or a network like 10.0.0.0/8"))
    }
}

impl TryFrom<String> for Cidr {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stripe_example_holds_its_gateway() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/stripe.yaml");
        let file = GatewayFile::embedded(&example)
            .unwrap_or_else(|e| panic!("{e}"))
            .expect("a gateway: section");
        assert_eq!(file.domain.as_deref(), Some("stripe"));
        assert_eq!(file.rate_limits.len(), 4);
        let ShedSection(shedder) = file.shed.expect("a shed: section");
        let thresholds = shedder.config().thresholds;
        assert_eq!(
            (thresholds.critical, thresholds.high, thresholds.low),
            (100, 75, 50)
        );
        // Read through --gateway-config too.
        assert!(GatewayFile::load(&example).unwrap().shed.is_some());
        // A directory or a file of envoyproxy/ratelimit's format has none.
        assert!(
            GatewayFile::embedded(example.parent().unwrap())
                .unwrap()
                .is_none()
        );
        let envoy = example.with_file_name("envoy-ratelimit.yaml");
        assert!(GatewayFile::embedded(&envoy).unwrap().is_none());
    }

    #[test]
    fn a_bad_shed_section_is_refused_at_its_line() {
        let refused = |text: &str| {
            tollgate_policy::parse_yaml::<GatewayFile>("gateway.yaml", text).expect_err("refused")
        };
        let e = refused("listen: x\nshed:\n  thresholds: { critical: 50, high: 75, low: 50 }\n");
        assert_eq!(e.line, 3, "{e}");
        assert!(e.reason.contains("critical >= high >= low"), "{e}");
        let e = refused("shed:\n  floor: 0\n");
        assert!(e.reason.contains("floor"), "{e}");
        let e = refused("shed:\n  sample_window: soon\n");
        assert!(e.reason.contains("soon"), "{e}");
        let e = refused("shed:\n  priority_header: \"a b\"\n");
        assert!(e.reason.contains("not a header name"), "{e}");
        let e = refused("shed:\n  tiers: 3\n");
        assert!(e.reason.contains("tiers"), "{e}");
    }

    #[test]
    fn a_whole_file_reads() {
        let file: GatewayFile = tollgate_policy::parse_yaml(
            "gateway.yaml",
            r#"
listen: 127.0.0.1:8000
upstream: http://127.0.0.1:9000/api
domain: edge
trusted_proxies: [10.0.0.0/8, "192.0.2.1", "2001:db8::/32"]
forwarded_header: forwarded
ipv6_prefix: 56
routes: ["/users/{id}"]
rate_limits:
  - actions:
      - remote_address: {}
"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(file.listen.as_deref(), Some("127.0.0.1:8000"));
        assert_eq!(
            file.upstream.map(|u| u.to_string()).as_deref(),
            Some("http://127.0.0.1:9000/api")
        );
        let trusted: Vec<String> = file
            .trusted_proxies
            .unwrap_or_default()
            .iter()
            .map(|c| c.0.to_string())
            .collect();
        assert_eq!(trusted, ["10.0.0.0/8", "192.0.2.1/32", "2001:db8::/32"]);
        assert!(matches!(
            file.forwarded_header,
            Some(HeaderChoice::Forwarded)
        ));
        assert_eq!(file.ipv6_prefix, Some(Prefix(56)));
        assert_eq!(file.routes.len(), 1);
        assert_eq!(file.rate_limits.len(), 1);
    }

    #[test]
    fn the_example_reads() {
        let file: GatewayFile = tollgate_policy::parse_yaml(
            "examples/gateway/gateway.yaml",
            include_str!("../../../examples/gateway/gateway.yaml"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(file.rate_limits.len(), 3);
        let policy = tollgate_policy::Policy::parse(
            "examples/gateway/policy.yaml",
            include_str!("../../../examples/gateway/policy.yaml"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(file.domain.as_deref(), policy.domains().next());
    }

    #[test]
    fn mistakes_name_their_line() {
        let cases = [
            ("upstream: https://x\n", "http://"),
            ("trusted_proxies: [10.0.0.0/33]\n", "not an address"),
            ("ipv6_prefix: 129\n", "at most 128"),
            ("routes: [users]\n", "does not start with /"),
            ("listen: 1\nupstreams: http://x\n", "unknown field"),
        ];
        for (yaml, reason) in cases {
            let e = tollgate_policy::parse_yaml::<GatewayFile>("gw.yaml", yaml)
                .expect_err(yaml)
                .to_string();
            assert!(
                e.starts_with("gw.yaml:") && e.contains(reason),
                "{yaml}: {e}"
            );
        }
    }
}
