//! envoyproxy/ratelimit's config over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`): a
//! state-of-the-world client of the Aggregated Discovery Service, the one
//! envoyproxy/ratelimit's provider uses (go-control-plane's
//! `pkg/client/sotw/v3`), for `RateLimitConfig` resources.
//!
//! Each response is the whole config: every resource is decoded, turned into
//! the envoyproxy/ratelimit-format config file it stands for (as its
//! `ConfigXdsProtoToYaml` does) and pushed to the [`Reloader`], which loads,
//! validates, observes and puts it in force as it does files, so a rule
//! means the same and fails the same whichever way it came. An accepted
//! response is ACKed (its `version_info` and `nonce`); one that does not
//! decode or that the reloader refuses is NACKed (the version last ACKed,
//! its nonce and an `error_detail`), and the last good config stays in
//! force. When the stream cannot be opened or breaks, the client tries again
//! every `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`, sending the
//! version it last ACKed. With `CONFIG_GRPC_XDS_SERVER_USE_TLS` it speaks
//! TLS, set up at start-up (`crate::tls::xds_client`); a server that fails
//! verification ends the attempt like an unreachable one.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::{Message, Name};
use serde_json::{Map, json};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tollgate_policy::Reloader;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{ClientTlsConfig, Endpoint};

use crate::health::Health;

/// How long one connection attempt may take: an address that drops packets
/// would otherwise hold the client for the system's TCP timeout (minutes)
/// before the next attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and as whom the client asks for its config: envoyproxy/ratelimit's
/// `CONFIG_GRPC_XDS_*` settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The management server, `host:port` (`CONFIG_GRPC_XDS_SERVER_URL`).
    pub server: String,
    /// `CONFIG_GRPC_XDS_NODE_ID`.
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`, as string values.
    pub node_metadata: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`.
    pub retry: Duration,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`, sent with the stream.
    pub headers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    /// How to reach `server`: [`endpoint`]'s, TLS (with
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS`) set up once, at start-up.
    pub endpoint: Endpoint,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`; gRPC's 4 MiB when unset.
    pub max_message: Option<usize>,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: healthy before the first
    /// config (envoyproxy/ratelimit serves nothing before it otherwise).
    pub force_start: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: unhealthy while the config
    /// in force has no domain.
    pub healthy_with_config: bool,
}

impl Settings {
    /// How logs and reloads name the config's source.
    pub fn source(&self) -> String {
        format!("xds:{}", self.server)
    }

    /// Whether the health's config component is healthy before any config.
    pub fn healthy_at_start(&self) -> bool {
        self.force_start && !self.healthy_with_config
    }

    /// Whether it is once a config of `domains` domains is in force, as
    /// envoyproxy/ratelimit's `SetConfig` judges it.
    fn healthy_with(&self, domains: usize) -> bool {
        !self.healthy_with_config || domains > 0
    }

    fn node(&self) -> Node {
        let fields = self
            .node_metadata
            .iter()
            .map(|(key, value)| {
                let value = Value {
                    kind: Some(Kind::StringValue(value.clone())),
                };
                (key.clone(), value)
            })
            .collect();
        Node {
            id: self.node_id.clone(),
            metadata: Some(Struct { fields }),
            ..Node::default()
        }
    }
}

/// What the stream has agreed with the server so far; kept across
/// reconnections, as go-control-plane's client keeps it.
#[derive(Debug, Default)]
struct Acked {
    /// The version last ACKed.
    version: String,
    /// The nonce of the last response received.
    nonce: String,
}

impl Acked {
    /// The request that ACKs (no `error`) or NACKs what was last received.
    fn request(&self, node: &Node, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.version.clone(),
            node: Some(node.clone()),
            type_url: RateLimitConfig::type_url(),
            response_nonce: self.nonce.clone(),
            error_detail: error.map(|message| Status {
                message,
                ..Status::default()
            }),
            ..DiscoveryRequest::default()
        }
    }
}

/// Follows the management server's config into `reloader` until `stopped`
/// changes, reconnecting whenever the stream cannot be opened or ends; each
/// config put in force sets `health`'s config component.
pub async fn follow(
    settings: Settings,
    reloader: Reloader,
    health: Arc<Health>,
    mut stopped: watch::Receiver<()>,
) {
    let node = settings.node();
    let mut acked = Acked::default();
    tracing::info!(
        server = %settings.server,
        node = %settings.node_id,
        "waiting for the rate limit config from the xDS server"
    );
    loop {
        tokio::select! {
            ended = session(&settings, &node, &reloader, &health, &mut acked) => {
                tracing::error!(
                    server = %settings.server,
                    "xDS stream ended, reconnecting in {:?}: {ended}",
                    settings.retry
                );
            }
            _ = stopped.changed() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(settings.retry) => {}
            _ = stopped.changed() => return,
        }
    }
}

/// The endpoint of the management server `server` (`host:port`): over TLS
/// with `tls`, whose certificates (and the system's roots) are loaded now.
///
/// # Errors
///
/// An address that is not one, or a TLS config rustls refuses.
pub(crate) fn endpoint(
    server: &str,
    tls: Option<ClientTlsConfig>,
) -> Result<Endpoint, tonic::transport::Error> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint =
        Endpoint::from_shared(format!("{scheme}://{server}"))?.connect_timeout(CONNECT_TIMEOUT);
    match tls {
        Some(tls) => endpoint.tls_config(tls),
        None => Ok(endpoint),
    }
}

/// One stream, from connecting to its end; why it ended.
async fn session(
    settings: &Settings,
    node: &Node,
    reloader: &Reloader,
    health: &Health,
    acked: &mut Acked,
) -> String {
    let channel = match settings.endpoint.connect().await {
        Ok(channel) => channel,
        // tonic's transport errors say little at the top: every source too.
        Err(e) => return format!("cannot connect: {:#}", anyhow::Error::new(e)),
    };
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    if let Some(max) = settings.max_message {
        client = client.max_decoding_message_size(max);
    }
    // Each response gets one answer before the next is read: two fit.
    let (requests, outgoing) = mpsc::channel(2);
    // The receiver is held below until the stream ends.
    let _ = requests.send(acked.request(node, None)).await;
    let mut request = tonic::Request::new(ReceiverStream::new(outgoing));
    for (key, value) in &settings.headers {
        request.metadata_mut().insert(key.clone(), value.clone());
    }
    let mut responses = match client.stream_aggregated_resources(request).await {
        Ok(responses) => responses.into_inner(),
        Err(status) => return format!("the server refused the stream: {status}"),
    };
    tracing::info!(server = %settings.server, "xDS stream open");
    loop {
        let response = match responses.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return "the server closed the stream".into(),
            Err(status) => return format!("{status}"),
        };
        let (version, nonce) = (response.version_info.clone(), response.nonce.clone());
        let pushed = reloader.clone();
        let outcome = tokio::task::spawn_blocking(move || apply(&pushed, &response))
            .await
            .unwrap_or_else(|e| Err(format!("applying the config panicked: {e}")));
        acked.nonce = nonce;
        let answer = match outcome {
            Ok(domains) => {
                // Before the ACK: whoever sees the ACK sees the health too.
                health.config(settings.healthy_with(domains)).await;
                acked.version.clone_from(&version);
                tracing::info!(%version, "xDS config ACKed");
                acked.request(node, None)
            }
            Err(error) => {
                tracing::error!(%version, "xDS config NACKed: {error}");
                acked.request(node, Some(error))
            }
        };
        if requests.send(answer).await.is_err() {
            return "the stream is closed".into();
        }
    }
}

/// Decodes `response`'s resources and pushes them as the whole config: the
/// number of domains now in force, or the error detail for a NACK when it
/// does not decode or is not put in force (the reloader's observer has
/// logged and counted that).
fn apply(reloader: &Reloader, response: &DiscoveryResponse) -> Result<usize, String> {
    let configs = response
        .resources
        .iter()
        .map(|resource| decode(resource).map(|config| config_file(&config)))
        .collect::<Result<Vec<_>, _>>()?;
    reloader
        .push(configs)
        .outcome
        .map(|domains| domains.len())
        .map_err(|e| e.to_string())
}

/// A resource as a `RateLimitConfig`, checked as protobuf's `Any` unpacking
/// checks it: by the type name after the URL's last `/`.
fn decode(resource: &Any) -> Result<RateLimitConfig, String> {
    let name = resource
        .type_url
        .rsplit_once('/')
        .map_or(resource.type_url.as_str(), |(_, name)| name);
    if name != RateLimitConfig::full_name() {
        return Err(format!(
            "a resource of type {:?}, expected {}",
            resource.type_url,
            RateLimitConfig::type_url()
        ));
    }
    RateLimitConfig::decode(resource.value.as_slice())
        .map_err(|e| format!("a RateLimitConfig that does not decode: {e}"))
}

/// The config file `config` stands for, named `xds:<name>`: its domain and
/// descriptors in envoyproxy/ratelimit's format, field for field as its
/// `ConfigXdsProtoToYaml` maps them, written as JSON (which YAML reads).
fn config_file(config: &RateLimitConfig) -> (String, String) {
    let file = json!({
        "domain": config.domain,
        "descriptors": descriptors(&config.descriptors),
    });
    let text = serde_json::to_string_pretty(&file).expect("a JSON value serializes");
    (format!("xds:{}", config.name), text)
}

fn descriptors(list: &[RateLimitDescriptor]) -> serde_json::Value {
    list.iter()
        .map(|d| {
            let mut out = Map::new();
            out.insert("key".into(), json!(d.key));
            out.insert("value".into(), json!(d.value));
            if let Some(policy) = &d.rate_limit {
                out.insert("rate_limit".into(), rate_limit(policy));
            }
            out.insert("descriptors".into(), descriptors(&d.descriptors));
            out.insert("shadow_mode".into(), json!(d.shadow_mode));
            out.insert("detailed_metric".into(), json!(d.detailed_metric));
            out.insert("quota_mode".into(), json!(d.quota_mode));
            if let Some(metadata) = &d.metadata {
                out.insert("metadata".into(), structure(metadata));
            }
            serde_json::Value::Object(out)
        })
        .collect()
}

fn rate_limit(policy: &RateLimitPolicy) -> serde_json::Value {
    // Go's enum `String()`: the value's name, or its number when it has none.
    let unit = RateLimitUnit::try_from(policy.unit)
        .map_or_else(|_| policy.unit.to_string(), |u| u.as_str_name().to_owned());
    json!({
        "requests_per_unit": policy.requests_per_unit,
        "unit": unit,
        "unlimited": policy.unlimited,
        "name": policy.name,
        "replaces": policy.replaces.iter().map(|r| json!({ "name": r.name })).collect::<Vec<_>>(),
    })
}

fn structure(fields: &Struct) -> serde_json::Value {
    fields
        .fields
        .iter()
        .map(|(key, value)| (key.clone(), json_value(value)))
        .collect::<Map<_, _>>()
        .into()
}

fn json_value(value: &Value) -> serde_json::Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(list)) => list.values.iter().map(json_value).collect(),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;
    use tollgate_policy::{Descriptor, Entry, Policy, Request, Resolved, Safeguards};

    use super::*;

    fn descriptor(key: &str, value: &str, policy: Option<RateLimitPolicy>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: policy,
            ..RateLimitDescriptor::default()
        }
    }

    fn per(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..RateLimitPolicy::default()
        })
    }

    fn any(config: &RateLimitConfig) -> Any {
        Any {
            type_url: RateLimitConfig::type_url(),
            value: config.encode_to_vec(),
        }
    }

    /// The YAML file that says the same, loaded as a file is.
    fn same_as_yaml(config: &RateLimitConfig, yaml: &str) {
        let (name, text) = config_file(config);
        let pushed = Policy::parse(&name, &text).expect("valid");
        let file = Policy::parse("file.yaml", yaml).expect("valid");
        let domain = &config.domain;
        let ids = |p: &Policy| -> Vec<String> {
            p.rules(domain)
                .iter()
                .map(|r| {
                    format!(
                        "{} {:?} {:?} {} {:?} {}",
                        r.id(),
                        r.envoy_window(),
                        r.quota().map(|q| q.limit()),
                        r.shadow(),
                        r.name(),
                        r.unlimited()
                    )
                })
                .collect()
        };
        assert_eq!(ids(&pushed), ids(&file), "{text}");
    }

    #[test]
    fn a_config_means_what_its_yaml_means() {
        let mut nested = descriptor("user", "", per(RateLimitUnit::Minute, 5));
        nested.shadow_mode = true;
        let mut named = descriptor("path", "/login", per(RateLimitUnit::Second, 3));
        if let Some(p) = named.rate_limit.as_mut() {
            p.name = "login".into();
            p.replaces = vec![RateLimitReplace {
                name: "other".into(),
            }];
        }
        let config = RateLimitConfig {
            name: "shop".into(),
            domain: "shop".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    descriptors: vec![nested],
                    ..descriptor("tenant", "acme", None)
                },
                named,
                descriptor(
                    "free",
                    "",
                    Some(RateLimitPolicy {
                        unlimited: true,
                        ..RateLimitPolicy::default()
                    }),
                ),
                descriptor("block", "", per(RateLimitUnit::Day, 0)),
            ],
        };
        same_as_yaml(
            &config,
            "domain: shop\ndescriptors:\n  - key: tenant\n    value: acme\n    descriptors:\n      - key: user\n        shadow_mode: true\n        rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: path\n    value: /login\n    rate_limit: { unit: second, requests_per_unit: 3, name: login, replaces: [{ name: other }] }\n  - key: free\n    rate_limit: { unlimited: true }\n  - key: block\n    rate_limit: { unit: day, requests_per_unit: 0 }\n",
        );
    }

    #[test]
    fn a_bad_config_fails_as_its_yaml_fails() {
        // envoyproxy/ratelimit: a rate limit without a unit is
        // `invalid rate limit unit 'UNKNOWN'` (its unit's `String()`).
        let config = RateLimitConfig {
            name: "bad".into(),
            domain: "bad".into(),
            descriptors: vec![descriptor("k", "", per(RateLimitUnit::Unknown, 5))],
        };
        let (name, text) = config_file(&config);
        let error = Policy::parse(&name, &text).expect_err("refused");
        assert!(error.path.ends_with("xds:bad"), "{error}");
        assert_eq!(error.field, "descriptors[0].rate_limit.unit");
        assert!(error.reason.contains("\"UNKNOWN\""), "{error}");

        let unnamed = RateLimitConfig {
            name: "empty".into(),
            ..RateLimitConfig::default()
        };
        let (name, text) = config_file(&unnamed);
        let error = Policy::parse(&name, &text).expect_err("refused");
        assert_eq!(error.reason, "config file cannot have empty domain");
    }

    #[test]
    fn a_response_is_pushed_whole_or_refused() {
        let reloader = Reloader::pushed(
            "xds:test",
            Safeguards::default()
                .allow_empty(true)
                .allow_domain_removal(true),
        );
        let shop = RateLimitConfig {
            name: "shop".into(),
            domain: "shop".into(),
            descriptors: vec![descriptor("user", "", per(RateLimitUnit::Minute, 5))],
        };
        let response = |resources| DiscoveryResponse {
            resources,
            ..DiscoveryResponse::default()
        };
        assert_eq!(apply(&reloader, &response(vec![any(&shop)])), Ok(1));
        let before = reloader.handle().load();
        assert_eq!(before.domains().collect::<Vec<_>>(), ["shop"]);

        let twice = response(vec![any(&shop), any(&shop)]);
        let error = apply(&reloader, &twice).expect_err("refused");
        assert!(error.contains("duplicate domain \"shop\""), "{error}");
        let wrong = Any {
            type_url: "type.googleapis.com/google.protobuf.Struct".into(),
            value: Vec::new(),
        };
        let error = apply(&reloader, &response(vec![wrong])).expect_err("refused");
        assert!(
            error.contains(
                "expected type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
            ),
            "{error}"
        );
        let garbled = Any {
            type_url: RateLimitConfig::type_url(),
            value: vec![0xff],
        };
        assert!(apply(&reloader, &response(vec![garbled])).is_err());
        assert!(Arc::ptr_eq(&before, &reloader.handle().load()));

        assert_eq!(apply(&reloader, &response(Vec::new())), Ok(0));
        assert!(
            reloader.handle().load().is_empty(),
            "an empty snapshot is the config"
        );
        let descriptors = [Descriptor {
            entries: vec![Entry::new("user", "ann")],
            ..Descriptor::default()
        }];
        let request = Request {
            domain: "shop",
            descriptors: &descriptors,
            hits_addend: 1,
        };
        assert!(matches!(
            reloader.handle().load().resolve(&request).expect("valid")[..],
            [Resolved::NoRule]
        ));
    }

    fn settings() -> Settings {
        Settings {
            server: "localhost:18000".into(),
            node_id: "ratelimit".into(),
            node_metadata: vec![("zone".into(), "a".into())],
            retry: Duration::from_secs(3),
            headers: Vec::new(),
            endpoint: Endpoint::from_static("http://localhost:18000"),
            max_message: None,
            force_start: false,
            healthy_with_config: false,
        }
    }

    #[test]
    fn health_follows_envoyproxy_ratelimits_rules() {
        // (force_start, healthy_with_config): at start, with an empty
        // config, with a domain.
        for (force_start, healthy_with_config, expected) in [
            (false, false, [false, true, true]),
            (true, false, [true, true, true]),
            (false, true, [false, false, true]),
            (true, true, [false, false, true]),
        ] {
            let settings = Settings {
                force_start,
                healthy_with_config,
                ..settings()
            };
            let got = [
                settings.healthy_at_start(),
                settings.healthy_with(0),
                settings.healthy_with(1),
            ];
            assert_eq!(got, expected, "{force_start} {healthy_with_config}");
        }
    }

    #[test]
    fn the_node_carries_id_and_metadata() {
        let node = settings().node();
        assert_eq!(node.id, "ratelimit");
        let metadata = node.metadata.as_ref().expect("present");
        assert_eq!(
            metadata.fields["zone"].kind,
            Some(Kind::StringValue("a".into()))
        );
        let nack = Acked {
            version: "1".into(),
            nonce: "n2".into(),
        }
        .request(&node, Some("bad".into()));
        assert_eq!(nack.version_info, "1");
        assert_eq!(nack.response_nonce, "n2");
        assert_eq!(
            nack.type_url,
            "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
        );
        assert_eq!(nack.error_detail.map(|s| s.message).as_deref(), Some("bad"));
    }
}
