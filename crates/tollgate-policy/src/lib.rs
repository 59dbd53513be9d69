//! Tollgate's policies: which limits apply to a request.
//!
//! A request names a *domain* and carries *descriptors*, each a list of
//! `(key, value)` entries, exactly as Envoy sends them. A [`Policy`] maps each
//! descriptor to at most one rule and gives back, per descriptor, what to check:
//! a [`Applied`] limit (storage key, quota, algorithm, cost, flags), an unlimited
//! rule, or nothing. Several descriptors make layers, checked together as
//! the [`Enforcer`]'s [`Counting`] says.
//!
//! Policies are read from YAML in two formats, told apart by their top-level
//! keys: envoyproxy/ratelimit's (`domain` + `descriptors`), read unchanged, and
//! Tollgate's native one (`domain` + `rules`), which adds algorithms, bursts,
//! tiers, priority reserves, shared buckets and failure policies. Both compile to
//! the same matching tree, so matching has one set of rules: at each level an
//! exact value beats a wildcard, which beats a key with no value (one budget
//! per distinct value). Native `prefix*` wildcards are tried longest first;
//! envoyproxy/ratelimit's (`*` anywhere) in file order, as it tries them, and a
//! value it lists without a limit exempts that value (`docs/envoy.md`). A
//! config is parsed, validated and only then used; every error names the file,
//! line, field and reason.
//!
//! A [`Reloader`] keeps a [`PolicyHandle`] in step with a config path, or
//! with the configs a control plane pushes to it: it reloads on change, keeps
//! the last good config when the new one is invalid or would silently turn
//! limits off ([`Safeguards`]), and reports each attempt to an observer. Its poll loop, `Reloader::watch`, needs the
//! `watch` feature (and tokio); everything else works without a runtime.

mod config;
mod descriptor;
mod domain;
mod enforcer;
mod envoy;
mod error;
mod kill_switch;
mod metadata;
mod native;
mod policy;
mod policy_handle;
mod read;
mod reload;
mod rule;
mod shed;
mod stat_key;
mod store_settings;
mod tree;

pub use config::parse_yaml;
pub use descriptor::{Descriptor, Entry, LimitOverride, Request, Unit};
pub use enforcer::{
    AdHoc, Check, Counting, Decided, DescriptorVerdict, Enforcer, NoObserver, Observer, Permit,
    Prepared, Pressure, RequestLimits, Shed, State, UtilizationReport, Verdict,
};
pub use error::{ConfigError, ReportError, RequestError, ResetError, Unsupported};
pub use kill_switch::KillSwitch;
pub use metadata::{Metadata, MetadataValue};
pub use policy::{Applied, ConfigFiles, Policy, Resolved};
pub use policy_handle::PolicyHandle;
pub use reload::{Fingerprint, Refusal, Reload, ReloadError, Reloader, Safeguards, Trigger};
pub use rule::{Rule, RuleIndex};
pub use shed::{Shedding, ThresholdsSpec};
pub use store_settings::StoreSettings;
pub use tollgate_core::FailurePolicy;
pub use tollgate_core::{ParseDurationError, parse_duration};
