//! Reading config files: telling the two formats apart and turning parse and
//! validation failures into [`ConfigError`]s that point at a line.
//!
//! The loaders of both formats go on past a bad rule or descriptor, gathering
//! every error of a file in a [`Found`], so `tollgate check-config` can list
//! them all; the load path (`serve`, reload) reports the first, the one it
//! would have stopped at. What the YAML parser or serde refuses (bad syntax, a
//! value of the wrong type, a native file's unknown field) stops a file
//! there: serde gives no value to go on with.

use std::path::Path;

use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use crate::ConfigError;

/// The errors found so far in one file, in the order the loader met them,
/// which is the order it checked in when it stopped at the first.
#[derive(Default)]
pub(crate) struct Found(Vec<ConfigError>);

impl Found {
    pub(crate) fn push(&mut self, error: ConfigError) {
        self.0.push(error);
    }

    /// `result`'s value, or `None` with its error kept.
    pub(crate) fn keep<T>(&mut self, result: Result<T, ConfigError>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }

    /// What `check` builds, unless it found an error: a rule or descriptor
    /// with one is left out of what follows (duplicates, overlaps, its
    /// nested descriptors), so one mistake gives one error.
    pub(crate) fn scope<T>(&mut self, check: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        let before = self.0.len();
        let built = check(self);
        built.filter(|_| self.0.len() == before)
    }

    /// `Ok` when nothing was found.
    pub(crate) fn finish(self) -> Result<(), ConfigErrors> {
        let mut errors = self.0.into_iter();
        match errors.next() {
            None => Ok(()),
            Some(first) => Err(ConfigErrors {
                first,
                more: errors.collect(),
            }),
        }
    }
}

/// Every error found in one file, never none: the load path reports `first`,
/// `Policy::load_errors` all of them.
#[derive(Debug)]
pub(crate) struct ConfigErrors {
    pub(crate) first: ConfigError,
    more: Vec<ConfigError>,
}

impl ConfigErrors {
    pub(crate) fn into_vec(self) -> Vec<ConfigError> {
        let mut all = Vec::with_capacity(1 + self.more.len());
        all.push(self.first);
        all.extend(self.more);
        all
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(first: ConfigError) -> Self {
        ConfigErrors {
            first,
            more: Vec::new(),
        }
    }
}

/// Where in a file something is, for errors.
#[derive(Clone, Copy)]
pub(crate) struct File<'a> {
    pub(crate) path: &'a Path,
}

impl File<'_> {
    pub(crate) fn error(
        &self,
        at: Location,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            path: self.path.to_owned(),
            line: at.line(),
            column: at.column(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn at<T>(
        &self,
        spanned: &Spanned<T>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> ConfigError {
        self.error(spanned.referenced, field, reason)
    }

    pub(crate) fn source(&self, at: Location) -> String {
        format!("{}:{}", self.path.display(), at.line())
    }

    pub(crate) fn parse<'de, T: Deserialize<'de>>(&self, text: &'de str) -> Result<T, ConfigError> {
        serde_saphyr::from_str_with_options(text, options()).map_err(|e| {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            let rendered = e.to_string();
            let message = message(&rendered);
            // The parser wraps its budget error with the location, so it is
            // told by its message.
            let reason = match message.strip_prefix("budget breached: ") {
                Some(breach) => format!(
                    "the file is larger than one config file may be ({breach}); at most \
                     {MAX_NODES} YAML nodes and {MAX_EVENTS} parser events per file \
                     (about 350,000 rules): split it into several files of a directory"
                ),
                None => message.to_owned(),
            };
            ConfigError {
                path: self.path.to_owned(),
                line,
                column,
                field: "yaml".into(),
                reason,
            }
        })
    }
}

/// The most YAML nodes one config file may hold: a native rule takes about
/// 14, so about 350,000 rules. The parser's own default (250,000 nodes, about
/// 17,800 rules) refused configs that real deployments have; the bound stays,
/// so a file cannot make the parser's memory grow without limit.
const MAX_NODES: usize = 5_000_000;
/// The most parser events one config file may produce (about two per node).
const MAX_EVENTS: usize = 10_000_000;

/// The parser's options: its defaults, with room for large configs.
fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = MAX_NODES;
    budget.max_events = MAX_EVENTS;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// The parser's message without its rendered snippet and its own position
/// prefix (`error: line 6 column 5: `), which the error carries as fields.
fn message(rendered: &str) -> &str {
    let first = rendered.lines().next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match first
        .strip_prefix("line ")
        .and_then(|rest| rest.split_once(": "))
    {
        Some((_position, message)) => message,
        None => first,
    }
}

/// Reads YAML `text` into `T`, reporting what fails as a [`ConfigError`] that
/// points at the line, as policy files do: for config files that sit beside a
/// policy (the gateway's). `name` is how errors name the file.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(
    name: impl AsRef<Path>,
    text: &str,
) -> Result<T, ConfigError> {
    File {
        path: name.as_ref(),
    }
    .parse(text)
}
