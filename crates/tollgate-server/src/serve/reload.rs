//! Hot reload of `--config`: on a change, or on `POST /admin/reload`.
//!
//! The watcher polls: every [`POLL`] it reads the config file (or every
//! `.yaml`/`.yml` file of the config directory) and hashes the contents. A
//! change is reloaded once the contents have held still for one poll, so a
//! file caught half-written is not reported as broken. Polling contents
//! rather than waiting for file system events sees every way a file can
//! change: edits in place, editors that write a new file and rename it over
//! the old one, and Kubernetes ConfigMaps that swap a symlinked directory. A
//! reload that fails is logged with the file, line and reason, counted in
//! `tollgate_config_reloads_total{result="error"}`, and leaves the last good
//! config in force; the same broken contents are not retried until they
//! change again.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tollgate_core::Store;
use tollgate_policy::{ConfigError, Policy};

use super::metrics::{self, Trigger};
use tollgate_policy::Enforcer;

/// How often the watcher looks at the config.
const POLL: Duration = Duration::from_millis(500);

/// What the config looked like: each file and a hash of its contents (`None`
/// when it could not be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fingerprint(Vec<(PathBuf, Option<u64>)>);

impl Fingerprint {
    /// Reads the config at `path` now (blocking file I/O).
    pub(crate) fn of(path: &Path) -> Self {
        let files = if path.is_dir() {
            // The same files `Policy::load` reads.
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            files.sort();
            files
        } else {
            vec![path.to_owned()]
        };
        Self(
            files
                .into_iter()
                .map(|file| {
                    let hash = std::fs::read(&file).ok().map(|bytes| {
                        let mut hasher = DefaultHasher::new();
                        bytes.hash(&mut hasher);
                        hasher.finish()
                    });
                    (file, hash)
                })
                .collect(),
        )
    }
}

/// Loads the config at `path` and, if it is valid, puts it in force. Gives
/// the domains loaded, or the error (logged and counted; the old config
/// stays).
pub(crate) async fn reload<S: Store>(
    enforcer: &Enforcer<S>,
    path: &Path,
    trigger: Trigger,
) -> Result<Vec<String>, ConfigError> {
    let owned = path.to_owned();
    let loaded = tokio::task::spawn_blocking(move || Policy::load(&owned))
        .await
        .unwrap_or_else(|e| {
            Err(ConfigError {
                path: path.to_owned(),
                line: 0,
                column: 0,
                field: "file".into(),
                reason: format!("the reload task failed: {e}"),
            })
        });
    match loaded {
        Ok(policy) => {
            let domains: Vec<String> = policy.domains().map(str::to_owned).collect();
            enforcer.policy_handle().store(policy);
            metrics::config_reload(trigger, true);
            tracing::info!(path = %path.display(), ?domains, "config reloaded");
            Ok(domains)
        }
        Err(error) => {
            metrics::config_reload(trigger, false);
            tracing::error!("config reload failed, the last good config stays in force: {error}");
            Err(error)
        }
    }
}

/// Watches `path` until `stop` fires, reloading on change. `loaded` is what
/// the config looked like when it was last loaded.
pub(crate) async fn watch<S: Store + 'static>(
    enforcer: Arc<Enforcer<S>>,
    path: PathBuf,
    loaded: Fingerprint,
    mut stop: watch::Receiver<()>,
) {
    let mut attempted = loaded;
    let mut previous = attempted.clone();
    let mut ticks = tokio::time::interval(POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => return,
        }
        let at = path.clone();
        let Ok(now) = tokio::task::spawn_blocking(move || Fingerprint::of(&at)).await else {
            continue;
        };
        if now != attempted && now == previous {
            // Errors are logged and counted by `reload`.
            let _ = reload(&enforcer, &path, Trigger::Watch).await;
            attempted = now.clone();
        }
        previous = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_follow_contents_and_files() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, "one").expect("writable");
        std::fs::write(dir.path().join("notes.txt"), "ignored").expect("writable");
        let first = Fingerprint::of(dir.path());
        assert_eq!(first.0.len(), 1);
        assert_eq!(first, Fingerprint::of(dir.path()));
        std::fs::write(&file, "two").expect("writable");
        let second = Fingerprint::of(dir.path());
        assert_ne!(first, second);
        std::fs::write(dir.path().join("b.yml"), "three").expect("writable");
        assert_ne!(second, Fingerprint::of(dir.path()));
        assert_ne!(
            Fingerprint::of(&file),
            Fingerprint::of(&dir.path().join("gone.yaml"))
        );
    }
}
