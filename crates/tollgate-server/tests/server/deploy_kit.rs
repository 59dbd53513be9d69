//! The deploy kit (`deploy/` and the `Dockerfile`), checked as far as a
//! machine without a Kubernetes cluster, Envoy, Grafana or a Docker daemon
//! allows: every file parses; `promtool` parses the alert rules and the
//! dashboard's queries, and its rule unit tests fire each alert; the ConfigMap's policy passes the real
//! `tollgate check-config` as Kubernetes mounts it; the Deployment, the
//! Service, the Envoy bootstrap and the Dockerfile agree on names, ports,
//! paths and users; Envoy's rate limit actions, run by the gateway (which
//! implements them), make descriptors the ConfigMap limits; and every metric
//! the Grafana dashboard and the alert rules name is served on `/metrics` by
//! the service started as the Deployment starts it, in memory and with
//! Redis (the Redis metrics), after requests, a deny, a refused reload and a
//! Redis outage (decided by the local fallback) have made each one appear.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{Redis, Server, rls_request, tollgate};
use serde_json::Value;

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of a YAML file (Kubernetes manifests hold several).
fn yaml(relative: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(&read(relative))
        .unwrap_or_else(|e| panic!("{relative} is not YAML: {e}"))
}

/// The one document of `kind` named `name` in `relative`.
fn manifest(relative: &str, kind: &str, name: &str) -> Value {
    yaml(relative)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {relative}"))
}

fn at<'v>(value: &'v Value, pointer: &str) -> &'v Value {
    value
        .pointer(pointer)
        .unwrap_or_else(|| panic!("no {pointer} in {value}"))
}

fn str_at<'v>(value: &'v Value, pointer: &str) -> &'v str {
    at(value, pointer)
        .as_str()
        .unwrap_or_else(|| panic!("{pointer} is not a string in {value}"))
}

fn configmap() -> Value {
    manifest(
        "deploy/kubernetes/configmap.yaml",
        "ConfigMap",
        "tollgate-config",
    )
}

fn deployment() -> Value {
    manifest(
        "deploy/kubernetes/deployment.yaml",
        "Deployment",
        "tollgate",
    )
}

fn service() -> Value {
    manifest("deploy/kubernetes/service.yaml", "Service", "tollgate")
}

fn container(deployment: &Value) -> &Value {
    at(deployment, "/spec/template/spec/containers/0")
}

/// The container's arguments.
fn args(deployment: &Value) -> Vec<&str> {
    at(container(deployment), "/args")
        .as_array()
        .expect("args is a list")
        .iter()
        .map(|a| a.as_str().expect("args are strings"))
        .collect()
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &[&'a str], flag: &str) -> &'a str {
    let at = args.iter().position(|a| *a == flag);
    at.and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"))
}

fn port_of(address: &str) -> u64 {
    address
        .parse::<SocketAddr>()
        .unwrap_or_else(|e| panic!("{address}: {e}"))
        .port()
        .into()
}

/// The container's ports by name.
fn container_ports(deployment: &Value) -> BTreeMap<String, u64> {
    at(container(deployment), "/ports")
        .as_array()
        .expect("ports is a list")
        .iter()
        .map(|p| {
            (
                str_at(p, "/name").to_owned(),
                at(p, "/containerPort").as_u64().expect("a port number"),
            )
        })
        .collect()
}

/// The ConfigMap's files laid out as Kubernetes mounts a ConfigMap volume:
/// each key a symlink through `..data` to a timestamped directory.
fn mounted_configmap() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    let version = dir.path().join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir(&version).expect("a writable temp dir");
    let cm = configmap();
    let data = at(&cm, "/data").as_object().expect("data is a map");
    assert!(!data.is_empty(), "the ConfigMap holds a policy");
    for (key, contents) in data {
        let text = contents.as_str().expect("ConfigMap values are strings");
        std::fs::write(version.join(key), text).expect("a writable temp dir");
        std::os::unix::fs::symlink(Path::new("..data").join(key), dir.path().join(key))
            .expect("a symlink");
    }
    std::os::unix::fs::symlink(version.file_name().unwrap(), dir.path().join("..data"))
        .expect("a symlink");
    dir
}

/// `tollgate check-config --format json` on the mounted ConfigMap.
fn checked_rules() -> Vec<Value> {
    let dir = mounted_configmap();
    let out = tollgate()
        .args(["check-config", "--format", "json"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["valid"], true, "{report}");
    report["rules"].as_array().expect("rules").clone()
}

/// The service started as the Deployment starts it, on the mounted
/// ConfigMap, with the listeners on free loopback ports and `extra` args.
fn deployed(config: &Path, extra: &[&str]) -> Server {
    let deployment = deployment();
    let mut args: Vec<String> = args(&deployment).iter().map(|a| (*a).to_owned()).collect();
    for (flag, address) in [("--http", "127.0.0.1:0"), ("--grpc", "127.0.0.1:0")] {
        let i = args.iter().position(|a| a == flag).expect("the flag");
        args[i + 1] = address.to_owned();
    }
    let i = args.iter().position(|a| a == "--config").expect("--config");
    args[i + 1] = config.to_str().expect("a UTF-8 temp path").to_owned();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::spawn(tollgate(), &args, None)
}

#[test]
fn every_file_in_deploy_parses() {
    let mut files = Vec::new();
    let mut dirs = vec![repo().join("deploy")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("deploy/ is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut manifests = 0;
    for path in &files {
        let relative = path.strip_prefix(repo()).unwrap().to_str().unwrap();
        match path.extension().and_then(|x| x.to_str()) {
            Some("yaml") => {
                let documents = yaml(relative);
                assert!(!documents.is_empty(), "{relative} is empty");
                for document in documents {
                    assert!(document.is_object(), "{relative}: {document}");
                    if document.get("kind").is_some() {
                        manifests += 1;
                        assert!(document["apiVersion"].is_string(), "{relative}: {document}");
                        assert!(
                            document["metadata"]["name"].is_string(),
                            "{relative}: {document}"
                        );
                    }
                }
            }
            Some("json") => {
                let parsed: Result<Value, _> = serde_json::from_str(&read(relative));
                assert!(parsed.is_ok(), "{relative}: {parsed:?}");
            }
            _ => panic!("{relative}: a file this test does not know how to check"),
        }
    }
    // configmap, deployment, service, redis (3), and nothing lost; beside
    // them the three Envoy configs, the alert rules and the dashboard.
    assert_eq!(manifests, 6, "{files:?}");
    assert_eq!(files.len(), 9, "{files:?}");
}

#[test]
fn the_configmap_policy_passes_check_config_as_kubernetes_mounts_it() {
    let rules = checked_rules();
    let domains: BTreeSet<&str> = rules.iter().map(|r| str_at(r, "/domain")).collect();
    assert_eq!(domains, BTreeSet::from(["edge"]));
    let limits: BTreeSet<(String, String)> = rules
        .iter()
        .map(|r| (r["limit"].to_string(), r["period"].to_string()))
        .collect();
    assert_eq!(
        limits,
        [("20", "\"1s\""), ("600", "\"1m\""), ("5000", "\"1s\"")]
            .map(|(l, p)| (l.to_owned(), p.to_owned()))
            .into()
    );
}

#[test]
fn the_deployment_service_and_configmap_agree() {
    let deployment = deployment();
    let service = service();
    let args = args(&deployment);
    assert_eq!(args[0], "serve");
    let ports = container_ports(&deployment);
    assert_eq!(ports.get("http"), Some(&port_of(flag(&args, "--http"))));
    assert_eq!(ports.get("grpc"), Some(&port_of(flag(&args, "--grpc"))));

    // The probes ask the HTTP listener. The Service keeps pods that are not
    // ready (Redis down) in Envoy's cluster: their fallback keeps limiting.
    assert_eq!(at(&service, "/spec/publishNotReadyAddresses"), true);
    let c = container(&deployment);
    assert_eq!(str_at(c, "/livenessProbe/httpGet/path"), "/healthz");
    assert_eq!(str_at(c, "/readinessProbe/httpGet/path"), "/readyz");
    assert_eq!(str_at(c, "/livenessProbe/httpGet/port"), "http");
    assert_eq!(str_at(c, "/readinessProbe/httpGet/port"), "http");
    let annotations = at(&deployment, "/spec/template/metadata/annotations");
    assert_eq!(
        annotations["prometheus.io/port"]
            .as_str()
            .map(str::parse::<u64>),
        Some(Ok(ports["http"]))
    );
    assert_eq!(annotations["prometheus.io/path"], "/metrics");

    // --config is where the ConfigMap's volume is mounted.
    let mount = at(c, "/volumeMounts/0");
    assert_eq!(str_at(mount, "/mountPath"), flag(&args, "--config"));
    let volume = at(&deployment, "/spec/template/spec/volumes")
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    assert_eq!(volume["configMap"]["name"], configmap()["metadata"]["name"]);

    // Labels: the Deployment's selector and the Service's pick its pods.
    let labels = at(&deployment, "/spec/template/metadata/labels")
        .as_object()
        .unwrap();
    for selector in [
        at(&deployment, "/spec/selector/matchLabels"),
        at(&service, "/spec/selector"),
    ] {
        for (key, value) in selector.as_object().unwrap() {
            assert_eq!(labels.get(key), Some(value), "{key}");
        }
    }
    // The Service's ports lead to the container's, by name.
    for port in at(&service, "/spec/ports").as_array().unwrap() {
        let target = str_at(port, "/targetPort");
        assert_eq!(
            ports.get(target),
            port["port"].as_u64().as_ref(),
            "{target}"
        );
    }

    // TOLLGATE_REDIS comes from redis.yaml's ConfigMap, naming its Service.
    let redis_env = at(c, "/env")
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "TOLLGATE_REDIS")
        .expect("TOLLGATE_REDIS");
    let reference = at(redis_env, "/valueFrom/configMapKeyRef");
    assert_eq!(reference["optional"], true);
    let redis_config = manifest(
        "deploy/kubernetes/redis.yaml",
        "ConfigMap",
        str_at(reference, "/name"),
    );
    let url = str_at(
        &redis_config,
        &format!("/data/{}", str_at(reference, "/key")),
    );
    let redis_service = manifest("deploy/kubernetes/redis.yaml", "Service", "tollgate-redis");
    assert_eq!(
        url,
        format!(
            "redis://{}:{}",
            str_at(&redis_service, "/metadata/name"),
            at(&redis_service, "/spec/ports/0/port")
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployments_command_serves_its_probes() {
    let config = mounted_configmap();
    let server = deployed(config.path(), &[]);
    for path in ["/healthz", "/readyz"] {
        let response = reqwest::get(server.url(path)).await.expect("answers");
        assert_eq!(response.status(), 200, "{path}");
    }
}

/// The descriptor a rate limit entry's actions make: each action's key and,
/// when the action fixes it, its value (`None`: taken from the request).
fn descriptor_of(actions: &Value) -> Vec<(String, Option<String>)> {
    actions
        .as_array()
        .expect("actions is a list")
        .iter()
        .map(|action| {
            let (name, body) = action
                .as_object()
                .and_then(|a| a.iter().next())
                .expect("one action");
            let key = |default: &str| {
                body["descriptor_key"]
                    .as_str()
                    .unwrap_or(default)
                    .to_owned()
            };
            match name.as_str() {
                "remote_address" => ("remote_address".to_owned(), None),
                "request_headers" => (key(""), None),
                "generic_key" => (
                    key("generic_key"),
                    Some(str_at(body, "/descriptor_value").to_owned()),
                ),
                other => panic!("an action this test does not know: {other}"),
            }
        })
        .collect()
}

fn envoy_route(envoy: &Value) -> &Value {
    at(
        envoy,
        "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes/0/route",
    )
}

#[test]
fn envoys_bootstrap_asks_the_service_over_http2_for_the_configmaps_descriptors() {
    let envoy = &yaml("deploy/envoy/envoy.yaml")[0];
    let manager = at(
        envoy,
        "/static_resources/listeners/0/filter_chains/0/filters/0",
    );
    assert_eq!(
        manager["name"],
        "envoy.filters.network.http_connection_manager"
    );
    let filters = at(manager, "/typed_config/http_filters")
        .as_array()
        .unwrap();
    assert_eq!(filters[0]["name"], "envoy.filters.http.ratelimit");
    assert_eq!(
        filters.last().unwrap()["name"],
        "envoy.filters.http.router",
        "the router comes last"
    );
    let ratelimit = &filters[0]["typed_config"];
    let rules = checked_rules();
    assert_eq!(ratelimit["domain"], rules[0]["domain"]);
    assert_eq!(
        str_at(ratelimit, "/rate_limit_service/transport_api_version"),
        "V3"
    );

    // The cluster it asks is the Service's gRPC port, over HTTP/2.
    let cluster_name = str_at(
        ratelimit,
        "/rate_limit_service/grpc_service/envoy_grpc/cluster_name",
    );
    let clusters = at(envoy, "/static_resources/clusters").as_array().unwrap();
    let cluster = clusters
        .iter()
        .find(|c| c["name"] == cluster_name)
        .expect("the rate limit cluster is defined");
    assert!(
        cluster
            .pointer("/typed_extension_protocol_options/envoy.extensions.upstreams.http.v3.HttpProtocolOptions/explicit_http_config/http2_protocol_options")
            .is_some(),
        "gRPC needs HTTP/2: {cluster}"
    );
    let address = at(
        cluster,
        "/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address",
    );
    let service = service();
    let host = str_at(address, "/address");
    let name = str_at(&service, "/metadata/name");
    assert!(
        host == name || host.starts_with(&format!("{name}.")),
        "{host}"
    );
    let grpc_port = at(&service, "/spec/ports")
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "grpc")
        .expect("a grpc port");
    assert_eq!(address["port_value"], grpc_port["port"]);
    // STRICT_DNS over a headless Service reaches every pod.
    assert_eq!(cluster["type"], "STRICT_DNS");
    assert_eq!(service["spec"]["clusterIP"], "None");

    // The route's cluster exists too.
    let route = envoy_route(envoy);
    let upstream = str_at(route, "/cluster");
    assert!(clusters.iter().any(|c| c["name"] == upstream));

    // Each rate limit entry makes a descriptor one of the ConfigMap's rules
    // matches exactly (a value from the request needs an any-value entry),
    // and every rule is reached by one.
    let paths: Vec<Vec<(String, Option<String>)>> = rules
        .iter()
        .map(|r| {
            at(r, "/path")
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        str_at(e, "/key").to_owned(),
                        e["value"].as_str().map(str::to_owned),
                    )
                })
                .collect()
        })
        .collect();
    let mut reached = BTreeSet::new();
    for entry in at(route, "/rate_limits").as_array().unwrap() {
        let descriptor = descriptor_of(&entry["actions"]);
        let rule = paths.iter().position(|p| *p == descriptor);
        let rule = rule.unwrap_or_else(|| panic!("no rule for {descriptor:?} in {paths:?}"));
        reached.insert(rule);
    }
    assert_eq!(reached.len(), rules.len(), "every rule is reached");
}

#[test]
fn envoys_bootstrap_names_envoys_own_types_and_enum_values() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::{DiscoveryType, LbPolicy};
    use envoy_types::pb::envoy::config::core::v3::ApiVersion;
    use envoy_types::pb::envoy::extensions::filters::http::ratelimit::v3::RateLimit;
    use envoy_types::pb::envoy::extensions::filters::http::ratelimit::v3::rate_limit::XRateLimitHeadersRfcVersion;
    use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
    use prost::Name;

    // Every `@type` is the type URL of the message Envoy expects there (from
    // Envoy's protos, as the envoy-types crate compiles them).
    let envoy = &yaml("deploy/envoy/envoy.yaml")[0];
    let mut types = BTreeSet::new();
    fn collect(value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(url) = map.get("@type").and_then(Value::as_str) {
                    out.insert(url.to_owned());
                }
                map.values().for_each(|v| collect(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    collect(envoy, &mut types);
    assert_eq!(
        types,
        BTreeSet::from([
            HttpConnectionManager::type_url(),
            RateLimit::type_url(),
            Router::type_url(),
            HttpProtocolOptions::type_url(),
        ])
    );

    // Enum values are Envoy's names.
    let ratelimit = at(
        envoy,
        "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config",
    );
    let headers = str_at(ratelimit, "/enable_x_ratelimit_headers");
    assert!(
        XRateLimitHeadersRfcVersion::from_str_name(headers).is_some(),
        "{headers}"
    );
    let api = str_at(ratelimit, "/rate_limit_service/transport_api_version");
    assert_eq!(ApiVersion::from_str_name(api), Some(ApiVersion::V3));
    for cluster in at(envoy, "/static_resources/clusters").as_array().unwrap() {
        let kind = str_at(cluster, "/type");
        assert!(DiscoveryType::from_str_name(kind).is_some(), "{kind}");
        if let Some(policy) = cluster["lb_policy"].as_str() {
            assert!(LbPolicy::from_str_name(policy).is_some(), "{policy}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_actions_run_by_the_gateway_meet_the_configmaps_limits() {
    // The upstream: answers everything.
    let app = axum::Router::new().fallback(|| async { "hello" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let upstream = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Envoy's route-level rate_limits, as the gateway's config (JSON is YAML).
    let envoy = &yaml("deploy/envoy/envoy.yaml")[0];
    let filters = at(
        envoy,
        "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters/0/typed_config",
    );
    let gateway = format!(
        "domain: {}\nrate_limits: {}\n",
        str_at(filters, "/domain"),
        at(envoy_route(envoy), "/rate_limits")
    );
    let gateway_dir = common::config_dir(&[("gateway.yaml", &gateway)]);
    let gateway_file = gateway_dir.path().join("gateway.yaml");
    let config = mounted_configmap();
    let server = deployed(
        config.path(),
        &[
            "--proxy-listen",
            "127.0.0.1:0",
            "--upstream",
            &format!("http://{upstream}"),
            "--gateway-config",
            gateway_file.to_str().unwrap(),
        ],
    );
    let base = format!("http://{}", server.gateway());
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // Each policy's `q` and `w`, sorted (names are the rules').
    let policies = |response: &reqwest::Response| {
        let field = response
            .headers()
            .get("ratelimit-policy")
            .expect("RateLimit-Policy")
            .to_str()
            .unwrap()
            .to_owned();
        let mut quotas: Vec<String> = field
            .split(", ")
            .map(|member| member.split_once(';').expect("parameters").1.to_owned())
            .collect();
        quotas.sort();
        quotas
    };
    let keyed = http
        .get(format!("{base}/items"))
        .header("x-api-key", "k-1")
        .send()
        .await
        .expect("answers");
    assert_eq!(keyed.status(), 200);
    assert_eq!(policies(&keyed), ["q=20;w=1", "q=5000;w=1", "q=600;w=60"]);
    // Without the header, Envoy leaves that descriptor out.
    let anonymous = http
        .get(format!("{base}/items"))
        .send()
        .await
        .expect("answers");
    assert_eq!(anonymous.status(), 200);
    assert_eq!(policies(&anonymous), ["q=20;w=1", "q=5000;w=1"]);
}

#[test]
fn the_dashboard_and_the_alert_rules_are_well_formed() {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/tollgate.json")).unwrap();
    assert_eq!(dashboard["uid"], "tollgate");
    let variables: BTreeSet<&str> = at(&dashboard, "/templating/list")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| str_at(v, "/name"))
        .collect();
    assert_eq!(variables, BTreeSet::from(["datasource", "instance"]));
    let panels = at(&dashboard, "/panels").as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    for panel in panels {
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        for key in ["x", "y", "w", "h"] {
            assert!(panel["gridPos"][key].is_u64(), "{panel}");
        }
        let targets = at(panel, "/targets").as_array().unwrap();
        assert!(!targets.is_empty(), "{panel}");
        for target in targets {
            assert!(str_at(target, "/expr").contains("$instance"), "{target}");
        }
    }

    let rules = yaml("deploy/prometheus/alerts.yaml");
    let rules = at(&rules[0], "/groups/0/rules").as_array().unwrap();
    let names: BTreeSet<&str> = rules.iter().map(|r| str_at(r, "/alert")).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "TollgateFallbackActive",
            "TollgateHighDenyRatio",
            "TollgateReloadFailing",
            "TollgateStoreFailing",
        ])
    );
    for rule in rules {
        assert!(!str_at(rule, "/expr").trim().is_empty(), "{rule}");
        assert!(
            ["warning", "critical"].contains(&str_at(rule, "/labels/severity")),
            "{rule}"
        );
        assert!(!str_at(rule, "/annotations/summary").is_empty(), "{rule}");
    }
}

/// `promtool ARGS...`, which must succeed (Prometheus's own checker;
/// `./scripts/test` installs it through apt when missing).
fn promtool(args: &[&std::ffi::OsStr]) {
    let out = std::process::Command::new("promtool")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("promtool is installed (./scripts/test installs the prometheus package)");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_passes_the_alert_rules_and_every_dashboard_query() {
    let alerts = repo().join("deploy/prometheus/alerts.yaml");
    promtool(&["check".as_ref(), "rules".as_ref(), alerts.as_os_str()]);

    // The dashboard's queries, with Grafana's variables given values, as
    // recording rules: promtool parses each one as PromQL.
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/tollgate.json")).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for panel in at(&dashboard, "/panels").as_array().unwrap() {
        for target in at(panel, "/targets").as_array().unwrap() {
            let expr = str_at(target, "/expr")
                .replace("$__rate_interval", "5m")
                .replace("$__range", "6h")
                .replace("$instance", ".*");
            rules.push_str(&format!(
                "      - record: dashboard_panel_{}_{}\n        expr: {}\n",
                panel["id"],
                str_at(target, "/refId"),
                Value::from(expr)
            ));
        }
    }
    let dir = common::config_dir(&[("dashboard.yaml", &rules)]);
    promtool(&[
        "check".as_ref(),
        "rules".as_ref(),
        dir.path().join("dashboard.yaml").as_os_str(),
    ]);
}

/// The annotation `key` of `alert` in alerts.yaml, with `{{ template }}`
/// parts replaced as `values` says.
fn annotation(alert: &str, key: &str, values: &[(&str, &str)]) -> String {
    let rules = yaml("deploy/prometheus/alerts.yaml");
    let rule = at(&rules[0], "/groups/0/rules")
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["alert"] == alert)
        .unwrap_or_else(|| panic!("no alert {alert}"))
        .clone();
    let mut text = str_at(&rule, &format!("/annotations/{key}")).to_owned();
    for (template, value) in values {
        text = text.replace(template, value);
    }
    text
}

#[test]
fn each_alert_fires_on_the_series_it_watches_and_not_before() {
    let instance = [("{{ $labels.instance }}", "a")];
    // Expected alerts as promtool's unit tests write them.
    let expect = |alert: &str, severity: &str, values: &[(&str, &str)]| {
        let mut all = instance.to_vec();
        all.extend_from_slice(values);
        format!(
            "          - exp_labels: {{ severity: {severity}, instance: a }}\n            exp_annotations:\n              summary: {}\n              description: {}\n",
            Value::from(annotation(alert, "summary", &all)),
            Value::from(annotation(alert, "description", &all)),
        )
    };
    let case = |alert: &str, at: &str, fired: Option<String>| {
        format!(
            "      - eval_time: {at}\n        alertname: {alert}\n        exp_alerts:{}\n",
            fired.map_or(" []".to_owned(), |a| format!("\n{a}"))
        )
    };
    let alerts = repo().join("deploy/prometheus/alerts.yaml");
    let mut tests = format!(
        "rule_files: [{}]\nevaluation_interval: 1m\ntests:\n",
        Value::from(alerts.to_str().unwrap())
    );
    // Each series once a minute: counters rising by 60 a minute are 1/s.
    let series = |name: &str, values: &str| {
        format!(
            "      - series: '{}'\n        values: '{values}'\n",
            name.replace('{', "{instance=\"a\",")
        )
    };
    // 40% denied: fires after its 10 minutes; 10% never does.
    tests.push_str("  - interval: 1m\n    input_series:\n");
    tests.push_str(&series(
        "tollgate_checks_total{api=\"grpc\",result=\"ok\"}",
        "0+60x30",
    ));
    tests.push_str(&series(
        "tollgate_checks_total{api=\"grpc\",result=\"over_limit\"}",
        "0+40x30",
    ));
    tests.push_str("    alert_rule_test:\n");
    tests.push_str(&case("TollgateHighDenyRatio", "8m", None));
    let deny = expect(
        "TollgateHighDenyRatio",
        "warning",
        &[("{{ $value | humanizePercentage }}", "40%")],
    );
    tests.push_str(&case("TollgateHighDenyRatio", "20m", Some(deny)));
    tests.push_str("  - interval: 1m\n    input_series:\n");
    tests.push_str(&series(
        "tollgate_checks_total{api=\"grpc\",result=\"ok\"}",
        "0+90x30",
    ));
    tests.push_str(&series(
        "tollgate_checks_total{api=\"grpc\",result=\"over_limit\"}",
        "0+10x30",
    ));
    tests.push_str("    alert_rule_test:\n");
    tests.push_str(&case("TollgateHighDenyRatio", "25m", None));
    // Redis erring once a second: the store is failing after 5 minutes.
    tests.push_str("  - interval: 1m\n    input_series:\n");
    tests.push_str(&series("tollgate_redis_errors_total{}", "0+60x20"));
    tests.push_str(&series("tollgate_redis_timeouts_total{}", "0x20"));
    tests.push_str("    alert_rule_test:\n");
    tests.push_str(&case("TollgateStoreFailing", "3m", None));
    let store = expect(
        "TollgateStoreFailing",
        "warning",
        &[("{{ $value | humanize }}", "1")],
    );
    tests.push_str(&case("TollgateStoreFailing", "15m", Some(store)));
    // The breaker open: decisions without Redis after 2 minutes; closed, none.
    tests.push_str("  - interval: 1m\n    input_series:\n");
    tests.push_str(&series(
        "tollgate_redis_breaker_state{}",
        "0 0 0 2 2 2 2 2 2 2",
    ));
    tests.push_str(&series(
        "tollgate_redis_fallbacks_total{failure=\"local\"}",
        "0x10",
    ));
    tests.push_str("    alert_rule_test:\n");
    tests.push_str(&case("TollgateFallbackActive", "2m", None));
    let fallback = expect("TollgateFallbackActive", "critical", &[]);
    tests.push_str(&case("TollgateFallbackActive", "7m", Some(fallback)));
    // A refused reload: at once, and for 15 minutes.
    tests.push_str("  - interval: 1m\n    input_series:\n");
    tests.push_str(&series(
        "tollgate_config_reloads_total{result=\"ok\",trigger=\"watch\"}",
        "1x30",
    ));
    tests.push_str(&series(
        "tollgate_config_reloads_total{result=\"error\",trigger=\"watch\"}",
        "0 0 0 1x27",
    ));
    tests.push_str("    alert_rule_test:\n");
    tests.push_str(&case("TollgateReloadFailing", "2m", None));
    let reload = expect("TollgateReloadFailing", "warning", &[]);
    tests.push_str(&case("TollgateReloadFailing", "4m", Some(reload)));
    tests.push_str(&case("TollgateReloadFailing", "25m", None));

    let dir = common::config_dir(&[("alerts_test.yaml", &tests)]);
    let file = dir.path().join("alerts_test.yaml");
    promtool(&["test".as_ref(), "rules".as_ref(), file.as_os_str()]);
}

/// Every `tollgate_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("tollgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// Every PromQL expression of the dashboard (panels' targets and template
/// queries) and of the alert rules.
fn expressions() -> Vec<String> {
    fn walk(value: &Value, key: Option<&str>, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => map.iter().for_each(|(k, v)| walk(v, Some(k), out)),
            Value::Array(items) => items.iter().for_each(|v| walk(v, key, out)),
            Value::String(s) if matches!(key, Some("expr" | "definition")) => out.push(s.clone()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/tollgate.json")).unwrap();
    walk(&dashboard, None, &mut out);
    let panels = out.len();
    let alerts = &yaml("deploy/prometheus/alerts.yaml")[0];
    walk(alerts, None, &mut out);
    assert!(panels >= 10 && out.len() >= panels + 4, "{out:#?}");
    out
}

/// The series names and `name{label="value"}` pairs a scrape holds.
fn scraped(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut labelled = BTreeSet::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..end];
        names.insert(name.to_owned());
        if let Some(labels) = line[end..]
            .strip_prefix('{')
            .and_then(|l| l.split_once('}'))
        {
            for pair in labels.0.split(',') {
                labelled.insert(format!("{name}{{{pair}}}"));
            }
        }
    }
    (names, labelled)
}

async fn scrape(server: &Server) -> String {
    reqwest::get(server.url("/metrics"))
        .await
        .expect("answers")
        .text()
        .await
        .expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_name_is_served() {
    const OVER_LIMIT: i32 = 2;
    const TOKEN: &str = "deploy-kit-test";
    let over_limit = || {
        let mut request = rls_request("edge", &[&[("api_key", "k-1")]]);
        request.hits_addend = 10_000;
        request
    };

    // In memory, as the Deployment runs without Redis: an answer, a deny,
    // and a reload of a broken config.
    let config = mounted_configmap();
    let memory = deployed(config.path(), &["--admin-token", TOKEN]);
    let mut grpc = memory.grpc_client().await;
    let allowed = rls_request("edge", &[&[("remote_address", "10.0.0.1")]]);
    assert_eq!(
        grpc.should_rate_limit(allowed)
            .await
            .unwrap()
            .into_inner()
            .overall_code,
        1
    );
    let denied = grpc.should_rate_limit(over_limit()).await.unwrap();
    assert_eq!(denied.into_inner().overall_code, OVER_LIMIT);
    std::fs::write(config.path().join("zz-broken.yaml"), "domain: [").unwrap();
    let reload = reqwest::Client::new()
        .post(memory.url("/admin/reload"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("answers");
    assert_eq!(reload.status(), 422, "the broken file is refused");
    let memory_text = scrape(&memory).await;

    // On Redis, then without it: the Redis stack's metrics and a fallback.
    let mut redis = Redis::start();
    let config = mounted_configmap();
    let shared = deployed(
        config.path(),
        &["--redis", &redis.url(), "--breaker-failures", "1"],
    );
    let mut grpc = shared.grpc_client().await;
    let denied = grpc.should_rate_limit(over_limit()).await.unwrap();
    assert_eq!(denied.into_inner().overall_code, OVER_LIMIT);
    redis.kill();
    for _ in 0..3 {
        let request = rls_request("edge", &[&[("remote_address", "10.0.0.2")]]);
        grpc.should_rate_limit(request)
            .await
            .expect("answers without Redis");
    }
    let redis_text = scrape(&shared).await;
    let fallbacks = redis_text
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_redis_fallbacks_total{failure=\"local\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(
        fallbacks.is_some_and(|n| n >= 1.0),
        "the outage was decided locally:\n{redis_text}"
    );

    let (mut names, mut labelled) = scraped(&memory_text);
    let (redis_names, redis_labelled) = scraped(&redis_text);
    names.extend(redis_names);
    labelled.extend(redis_labelled);
    let mut named = BTreeSet::new();
    for expr in expressions() {
        for name in metric_names(&expr) {
            assert!(
                names.contains(&name),
                "{name} (in {expr}) is not served:\n{memory_text}\n{redis_text}"
            );
            named.insert(name);
        }
        // Exact label matches name values the service uses.
        for (at, _) in expr.match_indices('{') {
            let before = &expr[..at];
            let start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            let name = &before[start..];
            let selector = &expr[at + 1..at + expr[at..].find('}').expect("a closed selector")];
            let exact = selector.split(',').filter(|m| !m.contains("=~"));
            for matcher in exact.filter(|m| m.contains('=')) {
                let pair = format!("{name}{{{matcher}}}");
                assert!(labelled.contains(&pair), "{pair} (in {expr}) is not served");
            }
        }
    }
    // The four things the alerts watch are among them.
    for name in [
        "tollgate_redis_errors_total",
        "tollgate_redis_fallbacks_total",
        "tollgate_config_reloads_total",
        "tollgate_checks_total",
    ] {
        assert!(named.contains(name), "{name} is not used");
    }
}

/// The Dockerfile's instructions, joined across continuation lines, as
/// (instruction, arguments).
fn dockerfile() -> Vec<(String, String)> {
    let text = read("Dockerfile");
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        if !current.is_empty() {
            joined.push(std::mem::take(&mut current));
        }
    }
    joined
        .into_iter()
        .map(|l| {
            let (op, rest) = l.split_once(' ').unwrap_or((&l, ""));
            (op.to_uppercase(), rest.trim().to_owned())
        })
        .collect()
}

#[test]
fn the_dockerfile_builds_the_binary_into_a_small_static_non_root_image() {
    let steps = dockerfile();
    let froms: Vec<&str> = steps
        .iter()
        .filter(|(op, _)| op == "FROM")
        .map(|(_, a)| a.as_str())
        .collect();
    assert_eq!(froms.len(), 2, "{froms:?}");

    // The builder: Rust on musl, at least the workspace's rust-version.
    let (image, stage) = froms[0].split_once(" AS ").expect("a named build stage");
    let version = image
        .strip_prefix("rust:")
        .and_then(|t| t.strip_suffix("-alpine"))
        .expect("rust:<version>-alpine");
    let manifest = read("Cargo.toml");
    let required = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("a rust-version")
        .trim_matches('"');
    let numbers = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap()).collect() };
    assert!(
        numbers(version) >= numbers(required),
        "{version} < {required}"
    );
    let build = steps
        .iter()
        .find(|(op, a)| op == "RUN" && a.contains("cargo build"))
        .expect("a cargo build");
    for part in [
        "--release",
        "--locked",
        "-p tollgate-server",
        "--bin tollgate",
    ] {
        assert!(build.1.contains(part), "{part} in {}", build.1);
    }
    for (op, args) in &steps {
        if op == "COPY" && !args.starts_with("--from") {
            let sources: Vec<&str> = args.split_whitespace().collect();
            for source in &sources[..sources.len() - 1] {
                assert!(repo().join(source).exists(), "COPY {source}: no such path");
            }
        }
    }

    // The image: a static base, the binary, the Deployment's user and ports.
    assert!(
        froms[1].starts_with("gcr.io/distroless/static") && froms[1].ends_with(":nonroot"),
        "{}",
        froms[1]
    );
    let copy = steps
        .iter()
        .find(|(op, a)| op == "COPY" && a.starts_with(&format!("--from={stage} ")))
        .expect("the binary copied from the build stage");
    let installed = copy.1.split_whitespace().last().unwrap();
    let entrypoint: Vec<String> = serde_json::from_str(
        &steps
            .iter()
            .find(|(op, _)| op == "ENTRYPOINT")
            .expect("an ENTRYPOINT")
            .1,
    )
    .expect("ENTRYPOINT in exec form");
    assert_eq!(entrypoint, [installed]);
    // envoyproxy/ratelimit's Deployments, as written, run `/bin/ratelimit`.
    assert!(
        steps
            .iter()
            .any(|(op, a)| op == "COPY" && *a == format!("--from={stage} /tollgate /bin/ratelimit")),
        "the binary also installed as /bin/ratelimit"
    );
    let deployment = deployment();
    let user = &steps.iter().find(|(op, _)| op == "USER").expect("a USER").1;
    let uid = at(&deployment, "/spec/template/spec/securityContext/runAsUser");
    assert_eq!(user.split(':').next(), Some(uid.to_string().as_str()));
    let exposed: BTreeSet<u64> = steps
        .iter()
        .filter(|(op, _)| op == "EXPOSE")
        .flat_map(|(_, a)| a.split_whitespace().map(|p| p.parse().unwrap()))
        .collect();
    let ports: BTreeSet<u64> = container_ports(&deployment).into_values().collect();
    assert_eq!(exposed, ports);
}
