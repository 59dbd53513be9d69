//! One config file of either format read into what it holds: the format told
//! by its top-level keys, then handed to that format's loader.

use std::path::Path;

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::config::{ConfigErrors, File};
use crate::domain::Domain;
use crate::{ConfigError, StoreSettings};

#[derive(Deserialize)]
struct Probe {
    domain: Option<IgnoredAny>,
    rules: Option<IgnoredAny>,
    descriptors: Option<IgnoredAny>,
    store: Option<IgnoredAny>,
}

/// The `store:` section of a Tollgate-format file, the rest left to the
/// policy's reader.
#[derive(Deserialize)]
struct StoreSection {
    store: StoreSettings,
}

/// Reads one file of either format into its domain.
pub(crate) fn read_any(path: &Path, text: &str) -> Result<Read, ConfigErrors> {
    let file = File { path };
    if text.trim().is_empty() {
        return Err(ConfigErrors::from(ConfigError {
            path: path.to_owned(),
            line: 0,
            column: 0,
            field: "file".into(),
            reason: "empty config file: expected `domain` and `rules` (native) or `descriptors` (envoyproxy/ratelimit)".into(),
        }));
    }
    let probe: Probe = file.parse(text)?;
    let store = match probe.store {
        Some(_) if probe.descriptors.is_some() => {
            return Err(ConfigErrors::from(ConfigError {
                path: path.to_owned(),
                line: 1,
                column: 1,
                field: "store".into(),
                reason: "`store` goes in a Tollgate-format file or a file of its own, not in an envoyproxy/ratelimit-format one".into(),
            }));
        }
        Some(_) => Some(file.parse::<StoreSection>(text)?.store),
        None => None,
    };
    if store.is_some() && probe.domain.is_none() && probe.rules.is_none() {
        return Ok(Read {
            domain: None,
            store,
        });
    }
    let domain = match (probe.rules.is_some(), probe.descriptors.is_some()) {
        (true, true) => Err(ConfigErrors::from(ConfigError {
            path: path.to_owned(),
            line: 1,
            column: 1,
            field: "rules".into(),
            reason: "a file has either `rules` (native format) or `descriptors` (envoyproxy/ratelimit format), not both".into(),
        })),
        (true, false) => crate::native::compile(file, file.parse(text)?),
        (false, _) => crate::envoy::read(file, text),
    }?;
    Ok(Read {
        domain: Some(domain),
        store,
    })
}

/// What one config file holds: a domain, a `store:` section, or both.
pub(crate) struct Read {
    pub(crate) domain: Option<(String, Domain)>,
    pub(crate) store: Option<StoreSettings>,
}
