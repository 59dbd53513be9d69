//! The one error of envoyproxy/ratelimit's settings: a message naming the
//! setting (variable, flag or file) and what is wrong with it.

/// A setting Tollgate refuses: a bad value, one it cannot honour safely, or a
/// file that cannot be read; the message names the setting and why.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct SettingsError(pub(crate) anyhow::Error);
