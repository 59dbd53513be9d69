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
//! ```

use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Deserialize;
use tollgate_http::ForwardedHeader;
use tollgate_policy::ConfigError;

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
}

impl GatewayFile {
    /// Reads and checks the file at `path`.
    pub(crate) fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_owned(),
            line: 0,
            column: 0,
            field: "file".into(),
            reason: e.to_string(),
        })?;
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        tollgate_policy::parse_yaml(path, &text)
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
