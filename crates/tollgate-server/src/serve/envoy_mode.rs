//! envoyproxy/ratelimit's mode: the binary under the name `ratelimit`, or
//! `tollgate serve --envoy-env`. Its settings are read by
//! [`tollgate_envoy::settings`] into a value, which this module maps onto
//! `tollgate serve`'s options; a Tollgate flag or `TOLLGATE_*` variable
//! given explicitly wins over the variable for it.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use tollgate_envoy::SettingsError;
use tollgate_envoy::settings::{self, EnvoySettings, Flag, Given};
use tracing_subscriber::EnvFilter;

use super::args::{Args, RedisUrl, ServeFlags};
use tollgate_observe::live;

/// Whether the process was started under the name `ratelimit`
/// (envoyproxy/ratelimit's `/bin/ratelimit`), busybox-style.
pub fn invoked_as_ratelimit() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .is_some_and(|argv0| argv0.file_name().is_some_and(|name| name == "ratelimit"))
}

/// `tollgate serve`'s flags under the name `ratelimit`: what the binary
/// takes when [`invoked_as_ratelimit`] (no subcommand).
pub fn ratelimit_command() -> clap::Command {
    ServeFlags::command().name("ratelimit").about(
        "Tollgate as envoyproxy/ratelimit's binary: `tollgate serve`, configured by \
         envoyproxy/ratelimit's environment (docs/envoy.md, Settings)",
    )
}

impl Args {
    /// The options of `matches` (`tollgate serve`'s flags), with
    /// envoyproxy/ratelimit's environment read into them when `forced` (the
    /// binary runs as `ratelimit`) or asked for by `--envoy-env`, under the
    /// precedence of [`tollgate_envoy::settings`]' doc.
    ///
    /// # Errors
    ///
    /// A flag clap refuses, or a variable whose value is bad or that Tollgate
    /// cannot honour safely: the error names the variable and why.
    pub fn from_envoy_env(matches: &ArgMatches, forced: bool) -> anyhow::Result<Self> {
        let mut args = Args::from_arg_matches(matches)?;
        if forced || args.envoy_env {
            let envoy = read(|name| std::env::var_os(name), &mut args, matches)?;
            args.envoy = Some(Box::new(envoy));
        }
        Ok(args)
    }
}

/// The clap id of the flag for `flag`.
fn id(flag: Flag) -> &'static str {
    match flag {
        Flag::Http => "http",
        Flag::Grpc => "grpc",
        Flag::Config => "config",
        Flag::AdminListen => "admin_listen",
        Flag::EnvoyCounting => "envoy_counting",
        Flag::MergeDomains => "merge_domains",
        Flag::EnvoyHeaders => "envoy_headers",
        Flag::Redis => "redis",
        Flag::RedisTimeout => "redis_timeout",
        Flag::DenyCache => "deny_cache",
        Flag::GrpcTlsCert => "grpc_tls_cert",
        Flag::GrpcTlsKey => "grpc_tls_key",
        Flag::GrpcClientCa => "grpc_client_ca",
        Flag::GrpcClientSan => "grpc_client_san",
        Flag::RedisTlsCa => "redis_tls_ca",
        Flag::RedisTlsCert => "redis_tls_cert",
        Flag::RedisTlsKey => "redis_tls_key",
        Flag::RedisTlsSkipHostnameVerification => "redis_tls_skip_hostname_verification",
        _ => unreachable!("every flag Tollgate has is named above"),
    }
}

/// Whether the admin listener serves another endpoint at `path`.
fn taken_path(path: &str) -> bool {
    ["/", "/healthcheck", "/healthz", "/readyz", live::JSON_PATH].contains(&path)
        || path.starts_with("/admin/")
}

/// Reads envoyproxy/ratelimit's variables from `lookup` and puts those a
/// flag of `matches` does not set into `args`; the settings only its mode
/// has are returned.
fn read(
    lookup: impl Fn(&str) -> Option<OsString>,
    args: &mut Args,
    matches: &ArgMatches,
) -> Result<EnvoySettings, SettingsError> {
    let explicit = |flag| {
        matches!(
            matches.value_source(id(flag)),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    let redis_tls = args.store.redis_tls_flags();
    let mut envoy = settings::read(
        lookup,
        &Given {
            explicit: &explicit,
            grpc_tls: &args.grpc_tls,
            redis_tls: &redis_tls,
            taken_path: &taken_path,
        },
    )?;
    if let Some(http) = envoy.http.take() {
        args.http = http;
    }
    if let Some(grpc) = envoy.grpc.take() {
        args.grpc = grpc;
    }
    if let Some(config) = envoy.config.take() {
        args.config = Some(config);
    }
    args.reload.files = envoy.config_files;
    if let Some(admin_listen) = envoy.admin_listen.take() {
        args.listen.admin_listen = Some(admin_listen);
    }
    if let Some(counting) = envoy.envoy_counting {
        args.envoy_counting = counting;
    }
    if envoy.merge_domains {
        args.reload.merge_domains = true;
    }
    if let Some(family) = envoy.envoy_headers {
        args.envoy_headers = vec![family];
    }
    if let Some(redis_tls) = envoy.redis_tls.take() {
        args.store.redis_tls = Some(redis_tls);
    }
    if let Some(redis) = envoy.redis.take() {
        args.redis = Some(RedisUrl(redis));
    }
    if let Some(timeout) = envoy.redis_timeout {
        args.redis_timeout = Some(timeout);
    }
    if let Some(deny_cache) = envoy.deny_cache {
        args.store.deny_cache = Some(deny_cache);
    }
    if let Some(prefix) = envoy.key_prefix.take() {
        args.store.key_prefix = Some(prefix);
    }
    Ok(envoy)
}

/// Sets up the process's log: `RUST_LOG`, else envoyproxy/ratelimit's
/// `LOG_LEVEL` (in its mode), else `info`; JSON lines with `LOG_FORMAT=json`.
/// Then logs, once, what envoyproxy/ratelimit's environment set that
/// Tollgate ignores or does not honour yet.
pub(crate) fn init_logging(envoy: Option<&EnvoySettings>) -> anyhow::Result<()> {
    let level = envoy.map_or("info", |e| e.log_level);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = if envoy.is_some_and(|e| e.log_json) {
        log.json().try_init()
    } else {
        log.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
    installed.map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))?;
    // At WARN: envoyproxy/ratelimit's default LOG_LEVEL hides anything less.
    for note in envoy.iter().flat_map(|e| &e.notes) {
        tracing::warn!("envoyproxy/ratelimit setting {note}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use tollgate_envoy::{DEFAULT_NAMES, HeaderFamily};
    use tollgate_policy::Counting;

    use super::*;

    /// `args` read with the environment `vars`, in envoyproxy/ratelimit's mode.
    fn read_env(vars: &[(&str, &str)], flags: &[&str]) -> anyhow::Result<(Args, EnvoySettings)> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let matches = ratelimit_command()
            .try_get_matches_from(std::iter::once("ratelimit").chain(flags.iter().copied()))?;
        let mut args = Args::from_arg_matches(&matches)?;
        let envoy = read(
            move |name: &str| vars.get(name).map(OsString::from),
            &mut args,
            &matches,
        )?;
        Ok((args, envoy))
    }

    fn error(vars: &[(&str, &str)]) -> String {
        format!("{:#}", read_env(vars, &[]).expect_err("refused"))
    }

    #[test]
    fn defaults_are_envoyproxy_ratelimits() {
        let (args, envoy) = read_env(&[], &[]).expect("defaults");
        assert_eq!(args.http, "0.0.0.0:8080");
        assert_eq!(args.grpc, "0.0.0.0:8081");
        assert_eq!(envoy.debug, "0.0.0.0:6070");
        assert_eq!(
            args.config.as_deref(),
            Some(std::path::Path::new("/srv/runtime_data/current/config"))
        );
        assert_eq!(
            args.redis.as_ref().map(|r| r.0.as_str()),
            Some("unix:///var/run/nutcracker/ratelimit.sock")
        );
        assert_eq!(args.store.deny_cache, Some(false));
        assert_eq!(args.redis_timeout, Some(Duration::from_secs(10)));
        assert_eq!(args.envoy_counting, Counting::EachHit);
        assert!(!args.reload.merge_domains);
        assert_eq!(envoy.log_level, "warn");
        assert!(!envoy.shadow_mode && !envoy.quota_mode && !envoy.log_json);
        assert_eq!(args.listen.admin_listen, None);
        assert!(!args.reload.files.ignore_dot_files);
        assert_eq!(args.envoy_headers, [HeaderFamily::None]);
        assert_eq!(envoy.header_names, DEFAULT_NAMES);
        assert!(!envoy.dynamic_metadata);
        assert_eq!(envoy.near_limit_ratio, 0.8);
        assert_eq!(envoy.metrics_path, None);
    }

    #[test]
    fn answer_settings_are_read() {
        let (args, envoy) = read_env(
            &[
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("LIMIT_RESET_HEADER", "X-Reset"),
                ("RESPONSE_DYNAMIC_METADATA", "1"),
                ("NEAR_LIMIT_RATIO", "0.25"),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_PATH", ""),
            ],
            &[],
        )
        .expect("valid");
        assert_eq!(args.envoy_headers, [HeaderFamily::Ratelimit]);
        assert_eq!(
            envoy.header_names,
            ["RateLimit-Limit", "RateLimit-Remaining", "X-Reset"]
        );
        assert!(envoy.dynamic_metadata);
        assert_eq!(envoy.near_limit_ratio, 0.25);
        assert_eq!(envoy.metrics_path.as_deref(), Some("/metrics"));
        assert!(envoy.notes.is_empty(), "all honoured: {:?}", envoy.notes);

        let (flagged, _) = read_env(
            &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
            &["--envoy-headers", "x-ratelimit,draft"],
        )
        .expect("valid");
        assert_eq!(
            flagged.envoy_headers,
            [HeaderFamily::XRatelimit, HeaderFamily::Draft],
            "the flag wins"
        );
    }

    #[test]
    fn counting_quota_and_merging_are_read() {
        let (args, envoy) = read_env(
            &[
                ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
                ("QUOTA_MODE", "true"),
                ("MERGE_DOMAIN_CONFIG", "true"),
            ],
            &[],
        )
        .expect("valid");
        assert_eq!(args.envoy_counting, Counting::AllOrNothing);
        assert!(envoy.quota_mode);
        assert!(args.reload.merge_domains);
        let (flagged, _) = read_env(
            &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
            &["--envoy-counting", "each-hit", "--redis-timeout", "20ms"],
        )
        .expect("valid");
        assert_eq!(flagged.envoy_counting, Counting::EachHit, "the flag wins");
        assert_eq!(flagged.redis_timeout, Some(Duration::from_millis(20)));
    }

    #[test]
    fn a_deployment_env_is_read() {
        let (args, envoy) = read_env(
            &[
                ("HOST", "127.0.0.1"),
                ("PORT", "9080"),
                ("GRPC_HOST", "::1"),
                ("GRPC_PORT", "9081"),
                ("DEBUG_PORT", "0"),
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("RUNTIME_APPDIRECTORY", "/rules"),
                ("RUNTIME_IGNOREDOTFILES", "T"),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", "redis.default:6379"),
                ("REDIS_AUTH", "app:p@ss/word"),
                ("REDIS_TIMEOUT", "1.5s"),
                ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
                ("CACHE_KEY_PREFIX", "rl_"),
                ("SHADOW_MODE", "1"),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_ADDR", ":9102"),
                ("LOG_LEVEL", "Debug"),
                ("LOG_FORMAT", "JSON"),
                ("REDIS_POOL_SIZE", "20"),
            ],
            &[],
        )
        .expect("a valid env");
        assert_eq!(args.http, "127.0.0.1:9080");
        assert_eq!(args.grpc, "[::1]:9081");
        assert_eq!(envoy.debug, "0.0.0.0:0");
        assert_eq!(
            args.config.as_deref(),
            Some(std::path::Path::new("/data/ratelimit/rules"))
        );
        assert!(args.reload.files.ignore_dot_files);
        assert_eq!(
            args.redis.as_ref().map(|r| r.0.as_str()),
            Some("redis://app:p%40ss%2Fword@redis.default:6379")
        );
        assert_eq!(args.redis_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(args.store.deny_cache, Some(true));
        assert_eq!(args.store.key_prefix.as_deref(), Some("rl_"));
        assert!(envoy.shadow_mode && envoy.log_json);
        assert_eq!(envoy.log_level, "debug");
        assert_eq!(args.listen.admin_listen.as_deref(), Some("0.0.0.0:9102"));
        let ignored: Vec<&String> = envoy
            .notes
            .iter()
            .filter(|n| n.contains(" is ignored: "))
            .collect();
        assert_eq!(ignored.len(), 1, "{ignored:?}");
        assert!(ignored[0].starts_with("REDIS_POOL_SIZE=20 is ignored: "));
    }

    #[test]
    fn xds_settings_are_read_with_envoyproxy_ratelimits_defaults() {
        let (args, envoy) = read_env(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")], &[]).expect("valid");
        assert_eq!(args.config, None, "no files are read");
        let xds = envoy.xds.expect("xDS");
        assert_eq!(xds.server, "localhost:18000");
        assert_eq!(xds.node_id, "default");
        assert!(xds.node_metadata.is_empty() && xds.headers.is_empty());
        assert_eq!(xds.retry, Duration::from_secs(3));
        assert_eq!(xds.max_message, None);
        assert!(!xds.force_start && !xds.healthy_with_config);

        let (_, envoy) = read_env(
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", "dns:///eg.system:18001"),
                ("CONFIG_GRPC_XDS_NODE_ID", "ratelimit-0"),
                ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,bare,k=v=w"),
                ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "250ms"),
                (
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                    "X-Team:rl,tenant:a",
                ),
                ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1048576"),
                ("XDS_CLIENT_BACKOFF_JITTER", "false"),
                ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
                ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "1"),
            ],
            &[],
        )
        .expect("valid");
        let xds = envoy.xds.expect("xDS");
        assert_eq!(xds.server, "eg.system:18001");
        assert_eq!(xds.node_id, "ratelimit-0");
        let metadata = [("zone", "a"), ("k", "v=w")].map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(xds.node_metadata, metadata);
        assert_eq!(xds.retry, Duration::from_millis(250));
        let headers: Vec<(&str, &str)> = xds
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().expect("ASCII")))
            .collect();
        assert_eq!(headers, [("x-team", "rl"), ("tenant", "a")]);
        assert_eq!(xds.max_message, Some(1 << 20));
        assert!(xds.force_start && xds.healthy_with_config);
        assert!(
            envoy
                .notes
                .iter()
                .any(|n| n.starts_with("XDS_CLIENT_BACKOFF_JITTER=false is ignored: "))
        );

        let (args, envoy) =
            read_env(&[("CONFIG_GRPC_XDS_NODE_ID", "n")], &[]).expect("FILE ignores it");
        assert!(envoy.xds.is_none() && args.config.is_some());
        assert!(
            envoy
                .notes
                .iter()
                .any(|n| n.starts_with("CONFIG_GRPC_XDS_NODE_ID=n is ignored"))
        );
        let both = read_env(
            &[("CONFIG_TYPE", "GRPC_XDS_SOTW")],
            &["--config", "/etc/rl"],
        );
        assert!(format!("{:#}", both.expect_err("refused")).contains("--config"));
    }

    #[test]
    fn grpc_tls_files_come_from_flags_then_variables() {
        let vars = [
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
            ("GRPC_SERVER_TLS_KEY", "/tls/key.pem"),
            ("GRPC_CLIENT_TLS_CACERT", "/tls/ca.pem"),
            ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
        ];
        let (_, envoy) = read_env(&vars, &["--grpc-tls-cert", "/mine/cert.pem"]).expect("valid");
        let tls = envoy.grpc_tls.expect("TLS asked for");
        let setting =
            |named: &tollgate_envoy::Named| (named.setting, named.path.display().to_string());
        assert_eq!(
            setting(&tls.cert),
            ("--grpc-tls-cert", "/mine/cert.pem".into())
        );
        assert_eq!(
            setting(&tls.key),
            ("GRPC_SERVER_TLS_KEY", "/tls/key.pem".into())
        );
        assert_eq!(
            tls.client_ca.as_ref().map(setting),
            Some(("GRPC_CLIENT_TLS_CACERT", "/tls/ca.pem".into()))
        );
        assert_eq!(
            tls.client_san,
            Some(("GRPC_CLIENT_TLS_SAN", "envoy.example".into()))
        );

        // settings.go asks for no client certificate without a CA, so the
        // SAN has nothing to check.
        let (_, envoy) = read_env(&[vars[0], vars[1], vars[2], vars[4]], &[]).expect("valid");
        assert_eq!(envoy.grpc_tls.expect("TLS asked for").client_san, None);
        assert!(
            envoy
                .notes
                .iter()
                .any(|n| n.starts_with("GRPC_CLIENT_TLS_SAN=envoy.example is ignored")),
            "{:?}",
            envoy.notes
        );

        // Without GRPC_SERVER_USE_TLS the files are not read.
        let (_, envoy) = read_env(&vars[1..], &[]).expect("valid");
        assert!(envoy.grpc_tls.is_none());
        assert_eq!(envoy.notes.len(), 4, "{:?}", envoy.notes);
    }

    #[test]
    fn flags_and_tollgate_variables_win() {
        let (args, _) = read_env(
            &[
                ("PORT", "9080"),
                ("REDIS_URL", "h:1"),
                ("REDIS_SOCKET_TYPE", "tcp"),
            ],
            &[
                "--http",
                "127.0.0.1:0",
                "--redis",
                "redis://other:2",
                "--deny-cache",
                "true",
            ],
        )
        .expect("valid");
        assert_eq!(args.http, "127.0.0.1:0");
        assert_eq!(args.grpc, "0.0.0.0:8081", "its own default still applies");
        assert_eq!(
            args.redis.as_ref().map(|r| r.0.as_str()),
            Some("redis://other:2")
        );
        assert_eq!(args.store.deny_cache, Some(true));
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        for (vars, needle) in [
            (vec![("PORT", "x")], "PORT=\"x\": not an integer"),
            (vec![("GRPC_PORT", "70000")], "GRPC_PORT=70000: not a port"),
            (
                vec![("SHADOW_MODE", "yes")],
                "SHADOW_MODE=\"yes\": not a boolean",
            ),
            (
                vec![("REDIS_TIMEOUT", "10")],
                "REDIS_TIMEOUT=\"10\": not a duration",
            ),
            (
                vec![("LOG_LEVEL", "loud")],
                "LOG_LEVEL=\"loud\": not a log level",
            ),
            (vec![("REDIS_TYPE", "sentinel")], "REDIS_TYPE=sentinel: "),
            (vec![("REDIS_TYPE", "ring")], "REDIS_TYPE=\"ring\""),
            (
                vec![("REDIS_TLS", "true")],
                "REDIS_TLS=true with REDIS_SOCKET_TYPE=unix",
            ),
            (
                vec![("GRPC_UDS", "/tmp/rl.sock")],
                "GRPC_UDS=\"/tmp/rl.sock\"",
            ),
            (
                vec![
                    ("GRPC_SERVER_USE_TLS", "true"),
                    ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
                ],
                "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY",
            ),
            (vec![("BACKEND_TYPE", "memcache")], "BACKEND_TYPE=memcache"),
            (vec![("CONFIG_TYPE", "XDS")], "CONFIG_TYPE=\"XDS\""),
            (
                vec![
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/tls/key.pem"),
                ],
                "a client certificate needs both",
            ),
            (
                vec![
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/nowhere/ca.pem"),
                ],
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT: cannot read /nowhere/ca.pem",
            ),
            (
                vec![
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b,c"),
                ],
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: \"c\": invalid map item",
            ),
            (
                vec![
                    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3"),
                ],
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=\"3\": not a duration",
            ),
            (
                vec![("CACHE_KEY_PREFIX", "{x}")],
                "CACHE_KEY_PREFIX=\"{x}\"",
            ),
        ] {
            let error = error(&vars);
            assert!(error.contains(needle), "{vars:?}: {error}");
        }
    }

    #[test]
    fn the_metrics_path_cannot_take_the_live_page() {
        for taken in ["/", "/live.json", "/healthz", "/admin/reload"] {
            let vars = [("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", taken)];
            let error = error(&vars);
            assert!(
                error.contains("Tollgate serves another endpoint"),
                "{taken}: {error}"
            );
        }
        let vars = [("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "/stats")];
        let (_, envoy) = read_env(&vars, &[]).expect("valid");
        assert_eq!(envoy.metrics_path.as_deref(), Some("/stats"));
    }
}
