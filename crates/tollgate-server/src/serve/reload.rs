//! Hot reload of `--config`, wired: [`tollgate_policy::Reloader`] decides
//! when to reload and whether the new config may replace the old; this
//! module gives it the service's settings, logs and metrics.
//!
//! Every attempt is logged and counted in
//! `tollgate_config_reloads_total{result,trigger}`: `ok` (INFO `config
//! reloaded`), `error` (ERROR `config reload failed`: file, line and reason)
//! or `refused` (ERROR `config reload refused`: the config is valid but
//! would leave no rules or drop a domain in force). On `error` and `refused`
//! the last good config stays in force, and `/readyz` says so in its body.

use std::path::Path;
use std::time::Duration;

use tollgate_policy::{ConfigFiles, Refusal, Reload, ReloadError, Reloader, Safeguards};

use tollgate_observe::metrics;

/// How often the watcher looks at the config. A change is loaded at the
/// second look that sees it (once the files have held still for a poll).
pub const POLL: Duration = Duration::from_millis(500);

/// What a reload may do; each also comes from its `TOLLGATE_*` variable.
#[derive(Debug, clap::Args)]
#[group(id = "reload")]
pub(crate) struct Args {
    /// Allow a config with no rules (an empty directory, or files defining no
    /// rule), at start-up and on reload. Without it, such a config is refused:
    /// the service does not start, and a reload keeps the last good config.
    #[arg(long, env = "TOLLGATE_ALLOW_EMPTY_CONFIG")]
    allow_empty_config: bool,

    /// Allow a reload to drop a domain in force. Without it, such a reload is
    /// refused and the last good config stays.
    #[arg(long, env = "TOLLGATE_ALLOW_DOMAIN_REMOVAL")]
    allow_domain_removal: bool,

    /// Merge config files that define one domain in envoyproxy/ratelimit's
    /// format (its `MERGE_DOMAIN_CONFIG`): the later file's descriptors join
    /// the domain, and a top-level descriptor both define is an error.
    /// Without it, a domain defined twice is refused.
    #[arg(long, env = "TOLLGATE_MERGE_DOMAINS")]
    pub(crate) merge_domains: bool,

    /// Which files of a config directory are read (envoyproxy/ratelimit's
    /// `RUNTIME_IGNOREDOTFILES`).
    #[arg(skip)]
    pub(crate) files: ConfigFiles,
}

/// Loads `path` for start-up and gives the reloader that keeps it current;
/// the caller attaches [`observe`] once the service is assembled.
pub(crate) fn load(path: &Path, args: &Args) -> anyhow::Result<Reloader> {
    let safeguards = Safeguards::default()
        .allow_empty(args.allow_empty_config)
        .allow_domain_removal(args.allow_domain_removal);
    let files = args.files.merge_domains(args.merge_domains);
    let reloader = Reloader::load_files(path, files, safeguards).map_err(|e| match e {
        ReloadError::Refused { ref refusal, .. } => {
            anyhow::anyhow!("refusing to start: {e}{}", allowed_by(refusal))
        }
        e => anyhow::anyhow!("config does not validate: {e}"),
    })?;
    if reloader.handle().load().is_empty() {
        tracing::warn!(path = %path.display(), "the config has no rules: nothing is limited");
    }
    Ok(reloader)
}

/// The reloader of a config pushed from `source` (xDS). A snapshot is the
/// control plane's whole config, never a deploy caught half-way, so one with
/// no rules or fewer domains is put in force, as envoyproxy/ratelimit puts it.
pub(crate) fn pushed(source: String) -> Reloader {
    let safeguards = Safeguards::default()
        .allow_empty(true)
        .allow_domain_removal(true);
    Reloader::pushed(source, safeguards)
}

/// Logs and counts one reload attempt (the live page notes it too, see
/// `serve::launch`).
pub(crate) fn observe(reload: &Reload) {
    metrics::config_reload(reload.trigger, metrics::result_label(reload));
    match &reload.outcome {
        Ok(domains) => {
            tracing::info!(path = %reload.path.display(), ?domains, "config reloaded");
        }
        Err(error @ ReloadError::Refused { refusal, .. }) => {
            tracing::error!(
                "config reload refused, the last good config stays in force: {error}{}",
                allowed_by(refusal)
            );
        }
        Err(error) => {
            tracing::error!("config reload failed, the last good config stays in force: {error}");
        }
    }
}

/// The setting that would let a refused config through.
fn allowed_by(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::NoRules => " (--allow-empty-config or TOLLGATE_ALLOW_EMPTY_CONFIG=true allows it)",
        Refusal::DomainsRemoved { .. } => {
            " (--allow-domain-removal or TOLLGATE_ALLOW_DOMAIN_REMOVAL=true allows it)"
        }
        _ => "",
    }
}

/// What `/readyz` adds to its body when the last reload left the old config
/// in force; `None` when it succeeded or none was tried.
pub(crate) fn readiness_note(reloader: &Reloader) -> Option<String> {
    let last = reloader.last()?;
    let error = last.outcome.as_ref().err()?;
    let what = match error {
        ReloadError::Refused { .. } => "refused",
        _ => "failed",
    };
    Some(format!(
        "last config reload {what}, the last good config stays in force: {error}"
    ))
}
