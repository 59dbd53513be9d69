//! Hot reload: watching a config path and swapping a [`PolicyHandle`].
//!
//! A [`Reloader`] owns the decisions; callers bring the timing and the
//! reporting. Each [`Reloader::poll_once`] reads the config file (or every
//! `.yaml`/`.yml` file of the config directory, the files [`Policy::load`]
//! reads, less dot files when [`ConfigFiles`] says so) and hashes the contents into a [`Fingerprint`]. A change is loaded
//! once the contents have held still for one poll, so a file caught
//! half-written is not loaded. Polling contents rather than waiting for file
//! system events sees every way a file can change: edits in place, editors
//! that write a new file and rename it over the old one, and Kubernetes
//! ConfigMaps that swap a symlinked directory.
//!
//! A new config is put in force only if it validates and passes the
//! [`Safeguards`]: by default a reload that would leave no rules, or that
//! would drop a domain in force, is refused, since both are what an emptied
//! directory or a deploy caught between `rm` and `cp` look like, and would
//! silently turn limits off. Whatever happens, the last good config stays in
//! force, and the outcome goes to the observer (for logs and metrics) and to
//! [`Reloader::last`]. The same contents are not tried again until they
//! change.
//!
//! A config can also be pushed rather than read ([`Reloader::pushed`],
//! [`Reloader::push`]): a control plane (envoyproxy/ratelimit's xDS) sends
//! each config whole, as named texts, which are loaded, checked, observed and
//! put in force exactly as files are; nothing is polled.
//!
//! With the `watch` feature, `Reloader::watch` runs the poll loop on tokio.

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwapOption;

use crate::{ConfigError, ConfigFiles, Policy, PolicyHandle, Unsupported};

/// What a config looked like: each file read and a hash of its contents
/// (`None` when it could not be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(Vec<(PathBuf, Option<u64>)>);

impl Fingerprint {
    /// Reads the config at `path` now (blocking file I/O): the file, or the
    /// files of the directory that [`Policy::load`] would read.
    pub fn of(path: &Path) -> Self {
        Self::of_files(path, ConfigFiles::default())
    }

    /// [`Fingerprint::of`] the files of a directory that `files` picks.
    pub fn of_files(path: &Path, files: ConfigFiles) -> Self {
        let files = crate::policy::config_files(path, files).unwrap_or_default();
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

/// Which reloads are refused although the new config is valid. The default
/// refuses both kinds of vanishing config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Safeguards {
    /// Allow a config with no rules at all (at start-up and on reload).
    pub allow_empty: bool,
    /// Allow a reload that drops a domain in force.
    pub allow_domain_removal: bool,
}

impl Safeguards {
    /// Allows (or refuses) a config with no rules.
    pub fn allow_empty(mut self, allow: bool) -> Self {
        self.allow_empty = allow;
        self
    }

    /// Allows (or refuses) a reload that drops a domain in force.
    pub fn allow_domain_removal(mut self, allow: bool) -> Self {
        self.allow_domain_removal = allow;
        self
    }

    /// Whether `policy` may be the first one put in force.
    pub fn check_initial(&self, policy: &Policy) -> Result<(), Refusal> {
        if policy.is_empty() && !self.allow_empty {
            return Err(Refusal::NoRules);
        }
        Ok(())
    }

    /// Whether `next` may replace `current`. A config with no rules is judged
    /// by [`Safeguards::allow_empty`] alone: allowing an empty config allows
    /// the removal of every domain it implies.
    pub fn check(&self, current: &Policy, next: &Policy) -> Result<(), Refusal> {
        if next.is_empty() {
            return self.check_initial(next);
        }
        if self.allow_domain_removal {
            return Ok(());
        }
        let removed: Vec<String> = current
            .domains()
            .filter(|d| !next.domains.contains_key(*d))
            .map(str::to_owned)
            .collect();
        if removed.is_empty() {
            Ok(())
        } else {
            Err(Refusal::DomainsRemoved { domains: removed })
        }
    }
}

/// Why a valid config was not put in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// It defines no rules: every limit would be off.
    #[error("defines no rules, so every limit would be off")]
    NoRules,
    /// It lacks domains that are in force.
    #[error("drops domains in force: {}", domains.join(", "))]
    DomainsRemoved {
        /// The domains it lacks, in name order.
        domains: Vec<String>,
    },
}

/// Why a reload left the last good config in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The config does not parse or validate.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// A rule's limit is one the store in use cannot enforce exactly (see
    /// [`Reloader::with_check`]).
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    /// The config is valid but the [`Safeguards`] refuse it.
    #[error("the config at {} {refusal}", path.display())]
    Refused {
        /// The config path.
        path: PathBuf,
        /// Why.
        refusal: Refusal,
    },
}

/// What started a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trigger {
    /// The poll loop saw the config change.
    Watch,
    /// [`Reloader::reload`] was called (e.g. by an admin endpoint).
    Manual,
    /// A config was pushed ([`Reloader::push`]).
    Push,
}

/// One reload attempt and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reload {
    /// What started it.
    pub trigger: Trigger,
    /// The config path (a pushed config's source, see [`Reloader::pushed`]).
    pub path: PathBuf,
    /// The domains now in force, or why the last good config stays.
    pub outcome: Result<Vec<String>, ReloadError>,
}

/// Called with every reload attempt, on the thread that made it.
type Observer = Arc<dyn Fn(&Reload) + Send + Sync>;

/// Asked of every config before it is put in force.
type Validate = Arc<dyn Fn(&Policy) -> Result<(), Unsupported> + Send + Sync>;

/// Keeps a [`PolicyHandle`] in step with a config path. Clones share the
/// handle and the watch state; reloads through any clone are serialized.
#[derive(Clone)]
pub struct Reloader {
    path: PathBuf,
    /// Which files of the path are read; `None` when configs are pushed.
    files: Option<ConfigFiles>,
    handle: PolicyHandle,
    safeguards: Safeguards,
    observer: Option<Observer>,
    check: Option<Validate>,
    shared: Arc<Shared>,
}

struct Shared {
    /// Held for a whole reload, so two reloads never interleave.
    polls: Mutex<Polls>,
    last: ArcSwapOption<Reload>,
    /// The configs last pushed, which [`Reloader::reload`] loads again.
    pushed: Mutex<Arc<[Text]>>,
}

/// A pushed config: its name (how errors name it) and its text.
type Text = (PathBuf, String);

impl fmt::Debug for Reloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.path)
            .field("safeguards", &self.safeguards)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// Loads the config at `path` into a new handle (blocking file I/O).
    /// Refuses a config with no rules unless `safeguards` allow it.
    pub fn load(path: impl Into<PathBuf>, safeguards: Safeguards) -> Result<Self, ReloadError> {
        Self::load_files(path, ConfigFiles::default(), safeguards)
    }

    /// [`Reloader::load`], reading and watching the files of a directory
    /// that `files` picks.
    pub fn load_files(
        path: impl Into<PathBuf>,
        files: ConfigFiles,
        safeguards: Safeguards,
    ) -> Result<Self, ReloadError> {
        let path = path.into();
        // Taken before loading, so a change in between is seen by the next poll.
        let fingerprint = Fingerprint::of_files(&path, files);
        let policy = Policy::load_files(&path, files)?;
        safeguards
            .check_initial(&policy)
            .map_err(|refusal| ReloadError::Refused {
                path: path.clone(),
                refusal,
            })?;
        Ok(Self::with_fingerprint(
            path,
            Some(files),
            PolicyHandle::new(policy),
            safeguards,
            fingerprint,
        ))
    }

    /// A reloader of `handle`, which is taken to hold the config at `path` as
    /// it is now: only a later change is reloaded by the poll.
    pub fn new(path: impl Into<PathBuf>, handle: PolicyHandle, safeguards: Safeguards) -> Self {
        let path = path.into();
        let fingerprint = Fingerprint::of(&path);
        let files = ConfigFiles::default();
        Self::with_fingerprint(path, Some(files), handle, safeguards, fingerprint)
    }

    /// A reloader of configs pushed to it ([`Reloader::push`]) rather than
    /// read from files, named `source` (for logs: the control plane); it
    /// starts with an empty policy and never polls. The first push is
    /// judged by [`Safeguards::check`] against that empty policy.
    pub fn pushed(source: impl Into<PathBuf>, safeguards: Safeguards) -> Self {
        let empty = Fingerprint(Vec::new());
        Self::with_fingerprint(
            source.into(),
            None,
            PolicyHandle::new(Policy::default()),
            safeguards,
            empty,
        )
    }

    fn with_fingerprint(
        path: PathBuf,
        files: Option<ConfigFiles>,
        handle: PolicyHandle,
        safeguards: Safeguards,
        loaded: Fingerprint,
    ) -> Self {
        Self {
            path,
            files,
            handle,
            safeguards,
            observer: None,
            check: None,
            shared: Arc::new(Shared {
                polls: Mutex::new(Polls::new(loaded)),
                last: ArcSwapOption::empty(),
                pushed: Mutex::new(Arc::from([])),
            }),
        }
    }

    /// Calls `observer` with every reload attempt: where logs and metrics
    /// attach.
    pub fn with_observer(mut self, observer: impl Fn(&Reload) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Asks `check` of every reloaded config before it is put in force; a
    /// config it refuses is a failed reload ([`ReloadError::Unsupported`])
    /// and the last good config stays. For the store's limits:
    /// [`Enforcer::unsupported`](crate::Enforcer::unsupported).
    pub fn with_check(
        mut self,
        check: impl Fn(&Policy) -> Result<(), Unsupported> + Send + Sync + 'static,
    ) -> Self {
        self.check = Some(Arc::new(check));
        self
    }

    /// The handle this reloader swaps.
    pub fn handle(&self) -> &PolicyHandle {
        &self.handle
    }

    /// The config path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last reload attempt, if any.
    pub fn last(&self) -> Option<Arc<Reload>> {
        self.shared.last.load_full()
    }

    /// Loads the config now, whether or not it changed (blocking file I/O);
    /// a pushed reloader loads the configs last pushed again.
    pub fn reload(&self) -> Reload {
        let mut polls = self.polls();
        match self.files {
            Some(files) => {
                polls.attempted = Fingerprint::of_files(&self.path, files);
                self.apply(Trigger::Manual, || Policy::load_files(&self.path, files))
            }
            None => {
                let texts = Arc::clone(
                    &self
                        .shared
                        .pushed
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner),
                );
                self.apply(Trigger::Manual, || {
                    Policy::parse_all(texts.iter().map(|(n, t)| (n, t)))
                })
            }
        }
    }

    /// Puts `configs` in force as the whole config, each a name (how errors
    /// name it, e.g. `xds:<resource name>`) and a config file's text, read
    /// as files are. As with a file reload, a config that does not validate,
    /// or that the safeguards or the check refuse, leaves the last good one
    /// in force; the outcome is observed and returned.
    pub fn push<N: Into<PathBuf>, T: Into<String>>(
        &self,
        configs: impl IntoIterator<Item = (N, T)>,
    ) -> Reload {
        let _polls = self.polls();
        let texts: Arc<[Text]> = configs
            .into_iter()
            .map(|(name, text)| (name.into(), text.into()))
            .collect();
        *self
            .shared
            .pushed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::clone(&texts);
        self.apply(Trigger::Push, || {
            Policy::parse_all(texts.iter().map(|(n, t)| (n, t)))
        })
    }

    /// One step of the watch (blocking file I/O): reads the config's
    /// fingerprint and reloads if the contents changed since the last attempt
    /// and held still since the previous poll. `None` when nothing was tried,
    /// always for a pushed reloader.
    pub fn poll_once(&self) -> Option<Reload> {
        let files = self.files?;
        let mut polls = self.polls();
        polls
            .observe(Fingerprint::of_files(&self.path, files))
            .then(|| self.apply(Trigger::Watch, || Policy::load_files(&self.path, files)))
    }

    fn polls(&self) -> std::sync::MutexGuard<'_, Polls> {
        // The state is two fingerprints, consistent whatever panicked.
        self.shared
            .polls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Loads with `load`, checks and swaps; the caller holds the poll lock.
    fn apply(
        &self,
        trigger: Trigger,
        load: impl FnOnce() -> Result<Policy, ConfigError>,
    ) -> Reload {
        let outcome = load().map_err(ReloadError::from).and_then(|next| {
            self.safeguards
                .check(&self.handle.load(), &next)
                .map_err(|refusal| ReloadError::Refused {
                    path: self.path.clone(),
                    refusal,
                })?;
            if let Some(check) = &self.check {
                check(&next)?;
            }
            let domains = next.domains().map(str::to_owned).collect();
            self.handle.store(next);
            Ok(domains)
        });
        let reload = Reload {
            trigger,
            path: self.path.clone(),
            outcome,
        };
        // Observed (logged, counted) before it is published: whoever sees it
        // through `last` (`/readyz`) then finds it in the log too.
        if let Some(observer) = &self.observer {
            observer(&reload);
        }
        self.shared.last.store(Some(Arc::new(reload.clone())));
        reload
    }

    /// Polls every `every` until `stop` resolves, reloading on change (see
    /// [`Reloader::poll_once`]); each poll's file I/O runs on tokio's
    /// blocking pool.
    #[cfg(feature = "watch")]
    pub async fn watch(self, every: std::time::Duration, stop: impl Future<Output = ()>) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = &mut stop => return,
            }
            let reloader = self.clone();
            // A panicked poll (an observer's) is not retried specially: the
            // next tick polls again.
            let _ = tokio::task::spawn_blocking(move || reloader.poll_once()).await;
        }
    }
}

/// The watch's memory, a pure state machine over fingerprints.
#[derive(Debug)]
struct Polls {
    /// The contents last loaded or tried.
    attempted: Fingerprint,
    /// The contents seen at the previous poll.
    previous: Fingerprint,
}

impl Polls {
    fn new(loaded: Fingerprint) -> Self {
        Self {
            previous: loaded.clone(),
            attempted: loaded,
        }
    }

    /// Records the contents seen now; whether to reload them: they differ
    /// from the last attempt and held still since the previous poll.
    fn observe(&mut self, now: Fingerprint) -> bool {
        let due = now != self.attempted && now == self.previous;
        if due {
            self.attempted = now.clone();
        }
        self.previous = now;
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(files: &[(&str, u64)]) -> Fingerprint {
        Fingerprint(
            files
                .iter()
                .map(|(f, h)| (PathBuf::from(f), Some(*h)))
                .collect(),
        )
    }

    fn config(domain: &str, limit: u32) -> String {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      requests_per_unit: {limit}\n"
        )
    }

    fn policy(domains: &[&str]) -> Policy {
        let mut policy = Policy::default();
        for d in domains {
            policy
                .add_file(Path::new(d), &config(d, 1), false)
                .expect("valid");
        }
        policy
    }

    /// Whether `before` is still the policy in force.
    fn still(reloader: &Reloader, before: &Arc<Policy>) -> bool {
        Arc::ptr_eq(before, &reloader.handle().load())
    }

    #[test]
    fn a_change_is_due_once_it_held_still_for_one_poll() {
        let a = print(&[("a.yaml", 1)]);
        let b = print(&[("a.yaml", 2)]);
        let c = print(&[("a.yaml", 3)]);
        let mut polls = Polls::new(a.clone());
        assert!(!polls.observe(a.clone()), "unchanged");
        assert!(!polls.observe(b.clone()), "changed, not yet still");
        assert!(!polls.observe(c.clone()), "still changing");
        assert!(polls.observe(c.clone()), "held still");
        assert!(!polls.observe(c.clone()), "tried once only");
        assert!(!polls.observe(a.clone()));
        assert!(polls.observe(a), "back to the first contents: a change too");
    }

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

    #[test]
    fn safeguards_refuse_vanishing_rules_and_domains() {
        let strict = Safeguards::default();
        let two = policy(&["api", "batch"]);
        assert_eq!(
            strict.check_initial(&Policy::default()),
            Err(Refusal::NoRules)
        );
        assert_eq!(strict.check_initial(&two), Ok(()));
        assert_eq!(
            strict.check(&two, &Policy::default()),
            Err(Refusal::NoRules)
        );
        assert_eq!(
            strict.check(&two, &policy(&["api"])),
            Err(Refusal::DomainsRemoved {
                domains: vec!["batch".into()]
            })
        );
        assert_eq!(
            strict.check(&two, &policy(&["api", "batch", "new"])),
            Ok(())
        );

        let empty_ok = strict.allow_empty(true);
        assert_eq!(empty_ok.check_initial(&Policy::default()), Ok(()));
        assert_eq!(empty_ok.check(&two, &Policy::default()), Ok(()));
        assert!(empty_ok.check(&two, &policy(&["api"])).is_err());

        let removal_ok = strict.allow_domain_removal(true);
        assert_eq!(removal_ok.check(&two, &policy(&["api"])), Ok(()));
        assert_eq!(
            removal_ok.check(&two, &Policy::default()),
            Err(Refusal::NoRules)
        );
    }

    #[test]
    fn a_domain_without_rules_is_no_rules() {
        let ruleless = Policy::parse("x.yaml", "domain: api\ndescriptors: []\n").expect("valid");
        assert_eq!(ruleless.domains().collect::<Vec<_>>(), ["api"]);
        assert!(ruleless.is_empty());
        assert!(!policy(&["api"]).is_empty());
        assert_eq!(
            Safeguards::default().check(&policy(&["api"]), &ruleless),
            Err(Refusal::NoRules)
        );
    }

    #[test]
    fn start_up_refuses_an_empty_directory_unless_allowed() {
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::write(dir.path().join("README.txt"), "not a config").expect("writable");
        let refused = Reloader::load(dir.path(), Safeguards::default()).expect_err("refused");
        assert_eq!(
            refused,
            ReloadError::Refused {
                path: dir.path().to_owned(),
                refusal: Refusal::NoRules
            }
        );
        assert!(
            refused
                .to_string()
                .contains(&dir.path().display().to_string())
        );
        let allowed =
            Reloader::load(dir.path(), Safeguards::default().allow_empty(true)).expect("allowed");
        assert!(allowed.handle().load().is_empty());
    }

    /// Two domains in force from `dir`, watched with `safeguards`, every
    /// attempt recorded.
    fn watched(dir: &Path, safeguards: Safeguards) -> (Reloader, Arc<Mutex<Vec<Reload>>>) {
        std::fs::write(dir.join("api.yaml"), config("api", 1)).expect("writable");
        std::fs::write(dir.join("batch.yaml"), config("batch", 1)).expect("writable");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let reloader = Reloader::load(dir, safeguards)
            .expect("valid")
            .with_observer(move |r| record.lock().expect("lock").push(r.clone()));
        (reloader, seen)
    }

    /// Polls until an attempt is made (a change takes two polls).
    fn poll_twice(reloader: &Reloader) -> Reload {
        assert_eq!(reloader.poll_once(), None, "not yet still");
        reloader.poll_once().expect("an attempt")
    }

    #[test]
    fn an_emptied_directory_keeps_the_last_good_config() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (reloader, seen) = watched(dir.path(), Safeguards::default());
        let before = reloader.handle().load();
        std::fs::remove_file(dir.path().join("api.yaml")).expect("removable");
        std::fs::remove_file(dir.path().join("batch.yaml")).expect("removable");
        let reload = poll_twice(&reloader);
        assert_eq!(reload.trigger, Trigger::Watch);
        assert!(matches!(
            reload.outcome,
            Err(ReloadError::Refused {
                refusal: Refusal::NoRules,
                ..
            })
        ));
        assert!(still(&reloader, &before), "the last good config stays");
        assert_eq!(reloader.last().as_deref(), Some(&reload));
        assert_eq!(seen.lock().expect("lock").as_slice(), [reload]);
        assert_eq!(
            reloader.poll_once(),
            None,
            "the same contents are not retried"
        );

        // The deploy's `cp` lands: loaded.
        std::fs::write(dir.path().join("api.yaml"), config("api", 5)).expect("writable");
        std::fs::write(dir.path().join("batch.yaml"), config("batch", 5)).expect("writable");
        let reload = poll_twice(&reloader);
        assert_eq!(reload.outcome, Ok(vec!["api".into(), "batch".into()]));
        assert!(!still(&reloader, &before));
    }

    #[test]
    fn a_removed_domain_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (reloader, _) = watched(dir.path(), Safeguards::default());
        std::fs::remove_file(dir.path().join("batch.yaml")).expect("removable");
        let reload = poll_twice(&reloader);
        assert_eq!(
            reload.outcome,
            Err(ReloadError::Refused {
                path: dir.path().to_owned(),
                refusal: Refusal::DomainsRemoved {
                    domains: vec!["batch".into()]
                }
            })
        );
        assert!(
            !reloader.handle().load().rules("batch").is_empty(),
            "still in force"
        );

        let dir = tempfile::tempdir().expect("a temp dir");
        let allowing = Safeguards::default().allow_domain_removal(true);
        let (reloader, _) = watched(dir.path(), allowing);
        std::fs::remove_file(dir.path().join("batch.yaml")).expect("removable");
        assert_eq!(poll_twice(&reloader).outcome, Ok(vec!["api".into()]));
        assert!(reloader.handle().load().rules("batch").is_empty());
    }

    #[test]
    fn a_half_written_file_keeps_the_last_good_config() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (reloader, _) = watched(dir.path(), Safeguards::default());
        let before = reloader.handle().load();
        let full = config("api", 9);
        // Cut inside the rate limit: it no longer parses as a config.
        let cut = &full[..full.find("unit: day").expect("present") + 5];
        std::fs::write(dir.path().join("api.yaml"), cut).expect("writable");
        let reload = poll_twice(&reloader);
        assert!(
            matches!(&reload.outcome, Err(ReloadError::Invalid(e)) if e.path.ends_with("api.yaml")),
            "{reload:?}"
        );
        assert!(still(&reloader, &before));
    }

    #[test]
    fn a_manual_reload_loads_now_and_is_not_repeated_by_the_poll() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (reloader, seen) = watched(dir.path(), Safeguards::default());
        std::fs::write(dir.path().join("api.yaml"), config("api", 3)).expect("writable");
        let reload = reloader.reload();
        assert_eq!(reload.trigger, Trigger::Manual);
        assert_eq!(reload.outcome, Ok(vec!["api".into(), "batch".into()]));
        assert_eq!(reloader.poll_once(), None);
        assert_eq!(reloader.poll_once(), None);
        assert_eq!(seen.lock().expect("lock").len(), 1);
    }

    #[test]
    fn a_reloader_of_an_existing_handle_reloads_only_later_changes() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let file = dir.path().join("api.yaml");
        std::fs::write(&file, config("api", 1)).expect("writable");
        let handle = PolicyHandle::new(Policy::load(&file).expect("valid"));
        let before = handle.load();
        let reloader = Reloader::new(&file, handle.clone(), Safeguards::default());
        assert_eq!(reloader.poll_once(), None);
        assert_eq!(reloader.poll_once(), None, "what the handle holds already");
        std::fs::write(&file, config("renamed", 1)).expect("writable");
        let reload = poll_twice(&reloader);
        assert!(
            matches!(
                &reload.outcome,
                Err(ReloadError::Refused { refusal: Refusal::DomainsRemoved { domains }, .. })
                    if domains == &["api"]
            ),
            "{reload:?}"
        );
        std::fs::write(&file, config("api", 2)).expect("writable");
        assert_eq!(poll_twice(&reloader).outcome, Ok(vec!["api".into()]));
        assert!(
            !Arc::ptr_eq(&before, &handle.load()),
            "the caller's handle sees the swap"
        );
    }

    /// Writes `contents` as `name` in a new timestamped directory and swaps
    /// `dir/..data` over to it, as the kubelet updates a ConfigMap volume:
    /// the new link is made aside and renamed over the old one, atomically.
    #[cfg(unix)]
    fn configmap_swap(dir: &Path, stamp: &str, name: &str, contents: &str) {
        let target = format!("..{stamp}");
        std::fs::create_dir(dir.join(&target)).expect("writable");
        std::fs::write(dir.join(&target).join(name), contents).expect("writable");
        std::os::unix::fs::symlink(&target, dir.join("..data_tmp")).expect("a symlink");
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("renamed");
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), link).expect("a symlink");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_configmap_symlink_swap_is_reloaded() {
        let dir = tempfile::tempdir().expect("a temp dir");
        configmap_swap(dir.path(), "2026_01_01_v1", "api.yaml", &config("api", 1));
        let reloader = Reloader::load(dir.path(), Safeguards::default()).expect("valid");
        assert_eq!(
            reloader.handle().load().domains().collect::<Vec<_>>(),
            ["api"],
            "the linked file is read once, not again inside ..data"
        );
        let before = reloader.handle().load();
        assert_eq!(reloader.poll_once(), None);

        configmap_swap(dir.path(), "2026_01_01_v2", "api.yaml", &config("api", 7));
        std::fs::remove_dir_all(dir.path().join("..2026_01_01_v1")).expect("removable");
        assert_eq!(poll_twice(&reloader).outcome, Ok(vec!["api".into()]));
        assert!(
            !still(&reloader, &before),
            "the swapped contents are in force"
        );
        let policy = reloader.handle().load();
        assert_eq!(policy.rules("api")[0].quota().map(|q| q.limit()), Some(7));
    }

    #[test]
    fn dot_files_are_read_unless_ignored() {
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::write(dir.path().join("api.yaml"), config("api", 1)).expect("writable");
        std::fs::write(dir.path().join(".draft.yaml"), config("draft", 1)).expect("writable");
        let all = Reloader::load(dir.path(), Safeguards::default()).expect("valid");
        assert_eq!(
            all.handle().load().domains().collect::<Vec<_>>(),
            ["api", "draft"]
        );

        let files = ConfigFiles::default().ignore_dot_files(true);
        let reloader =
            Reloader::load_files(dir.path(), files, Safeguards::default()).expect("valid");
        assert_eq!(
            reloader.handle().load().domains().collect::<Vec<_>>(),
            ["api"]
        );
        std::fs::write(dir.path().join(".draft.yaml"), "not: [valid").expect("writable");
        assert_eq!(
            reloader.poll_once(),
            None,
            "a dot file's change is not seen"
        );
        assert_eq!(reloader.poll_once(), None);
    }

    #[test]
    fn a_pushed_config_is_judged_as_a_file_is() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let reloader = Reloader::pushed("xds:test", Safeguards::default())
            .with_observer(move |r| record.lock().expect("lock").push(r.clone()));
        assert!(reloader.handle().load().is_empty());
        assert_eq!(reloader.poll_once(), None, "nothing to poll");

        let reload = reloader.push([
            ("xds:api", config("api", 2)),
            ("xds:batch", config("batch", 3)),
        ]);
        assert_eq!(reload.trigger, Trigger::Push);
        assert_eq!(reload.path, Path::new("xds:test"));
        assert_eq!(reload.outcome, Ok(vec!["api".into(), "batch".into()]));
        let before = reloader.handle().load();

        let cut = config("api", 9).replace("unit: day", "unit: fortnight");
        let reload = reloader.push([("xds:api", cut)]);
        assert!(
            matches!(&reload.outcome, Err(ReloadError::Invalid(e)) if e.path == Path::new("xds:api")),
            "{reload:?}"
        );
        assert!(still(&reloader, &before), "the last good config stays");
        let reload = reloader.push([("xds:api", config("api", 2))]);
        assert!(
            matches!(
                &reload.outcome,
                Err(ReloadError::Refused {
                    refusal: Refusal::DomainsRemoved { .. },
                    ..
                })
            ),
            "the safeguards it was given apply: {reload:?}"
        );
        assert_eq!(seen.lock().expect("lock").len(), 3);

        // A reload loads the configs last pushed again.
        assert!(reloader.reload().outcome.is_err());
        assert!(still(&reloader, &before));
    }

    #[cfg(feature = "watch")]
    #[tokio::test(start_paused = true)]
    async fn the_loop_polls_on_its_interval_and_stops() {
        use std::time::Duration;

        let dir = tempfile::tempdir().expect("a temp dir");
        let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
        let (reloader, _) = watched(dir.path(), Safeguards::default());
        let reloader = reloader.with_observer(move |r| {
            let _ = sender.send(r.clone());
        });
        std::fs::write(dir.path().join("api.yaml"), config("api", 4)).expect("writable");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let every = Duration::from_secs(5);
        let started = tokio::time::Instant::now();
        let task = tokio::spawn(reloader.watch(every, async {
            let _ = stopped.await;
        }));
        let reload = received.recv().await.expect("a reload");
        assert_eq!(reload.outcome, Ok(vec!["api".into(), "batch".into()]));
        // Seen at the first tick (at once), loaded at the second.
        assert_eq!(started.elapsed(), every);
        stop.send(()).expect("the loop listens");
        task.await.expect("the loop ends");
    }
}
