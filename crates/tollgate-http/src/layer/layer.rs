//! [`RateLimitLayer`] and its builder.

use std::fmt;
use std::sync::Arc;

use tollgate_core::{Clock, Store, SystemClock};
use tollgate_policy::{Counting, Enforcer, KillSwitch, Observer, PolicyHandle};
use tollgate_store::MemoryStore;
use tower_layer::Layer;

use super::check::{DynLimiter, Limiter};
use super::descriptors::{ClientIpKey, DescriptorSource};
use super::service::RateLimit;
use crate::HeaderStyle;

/// Applies a Tollgate policy to every request of the services it wraps: see
/// [`RateLimit`].
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate_http::{ClientIpKey, RateLimitLayer};
/// use tollgate_policy::Policy;
/// use tollgate_store::MemoryStore;
///
/// let policy = Policy::parse("inline", "
/// domain: api
/// rules:
///   - name: per-ip
///     match: [{ key: remote_address }]
///     limit: { requests: 5, per: 1m }
/// ")?;
/// let layer = RateLimitLayer::builder("api", policy, MemoryStore::default())
///     .descriptor(ClientIpKey::default())
///     .build();
/// # let _ = layer;
/// # Ok::<(), tollgate_policy::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<dyn DynLimiter>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// Starts a layer that enforces `policy`'s rules for `domain`, keeping
    /// state in `store` (the store of record: the memory store for one
    /// process, a shared store such as Redis across instances).
    pub fn builder<St: Store + 'static>(
        domain: impl Into<String>,
        policy: impl Into<PolicyHandle>,
        store: St,
    ) -> Builder<St> {
        Self::with(
            domain,
            Source::Parts {
                policy: policy.into(),
                store,
                kill_switch: None,
                observer: None,
                clock: Arc::new(SystemClock),
                counting: Counting::default(),
            },
        )
    }

    /// Starts a layer that asks `enforcer` (shared with other doors, such as
    /// `tollgate serve`'s APIs) about `domain`: its policy, kill switch, store
    /// and observer decide, so a request gets the same answer, and is counted
    /// the same, as through any other door.
    pub fn shared<St: Store + 'static>(
        domain: impl Into<String>,
        enforcer: Arc<Enforcer<St>>,
    ) -> Builder<St> {
        Self::with(domain, Source::Shared(enforcer))
    }

    fn with<St>(domain: impl Into<String>, source: Source<St>) -> Builder<St> {
        Builder {
            domain: domain.into(),
            source,
            local: None,
            sources: Vec::new(),
            style: HeaderStyle::default(),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, Arc::clone(&self.limiter))
    }
}

/// Where a layer's enforcer comes from.
enum Source<St> {
    /// Made by the builder from these parts.
    Parts {
        policy: PolicyHandle,
        store: St,
        kill_switch: Option<Arc<KillSwitch>>,
        observer: Option<Arc<dyn Observer>>,
        clock: Arc<dyn Clock>,
        counting: Counting,
    },
    /// Shared with its owner.
    Shared(Arc<Enforcer<St>>),
}

/// The local pre-check's store, and its own policy if it has one.
struct LocalCheck<L> {
    store: L,
    policy: Option<PolicyHandle>,
}

/// Configures a [`RateLimitLayer`]; made by [`RateLimitLayer::builder`] or
/// [`RateLimitLayer::shared`].
pub struct Builder<St, L = MemoryStore> {
    domain: String,
    source: Source<St>,
    local: Option<LocalCheck<L>>,
    sources: Vec<Box<dyn DescriptorSource>>,
    style: HeaderStyle,
}

impl<St, L> fmt::Debug for Builder<St, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("domain", &self.domain)
            .field("shared", &matches!(self.source, Source::Shared(_)))
            .field("sources", &self.sources.len())
            .field("local", &self.local.is_some())
            .field("style", &self.style)
            .finish_non_exhaustive()
    }
}

impl<St: Store + 'static, L: Store + 'static> Builder<St, L> {
    /// Adds a descriptor source: one more layer of limits per request. With
    /// none, the layer uses [`ClientIpKey::default()`] (`remote_address` = the
    /// socket peer), as the gateway does with no actions configured.
    pub fn descriptor(mut self, source: impl DescriptorSource) -> Self {
        self.sources.push(Box::new(source));
        self
    }

    /// Which rate limit headers to send (default: `X-RateLimit-*` and the IETF fields).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.style = style;
        self
    }

    /// Honours `kill_switch`: switched-off rules (or the whole domain) are
    /// neither counted nor enforced. A shared enforcer has its own.
    pub fn kill_switch(mut self, kill_switch: Arc<KillSwitch>) -> Self {
        if let Source::Parts { kill_switch: k, .. } = &mut self.source {
            *k = Some(kill_switch);
        }
        self
    }

    /// Reports every decision to `observer` (metrics, logs). A shared
    /// enforcer has its own.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        if let Source::Parts { observer: o, .. } = &mut self.source {
            *o = Some(observer);
        }
        self
    }

    /// The wall clock `X-RateLimit-Reset` is computed from (nanoseconds since
    /// the Unix epoch; default [`SystemClock`]). Tests pass a manual one. A
    /// shared enforcer has its own.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        if let Source::Parts { clock: c, .. } = &mut self.source {
            *c = Arc::new(clock);
        }
        self
    }

    /// How a domain in envoyproxy/ratelimit's format is counted (default:
    /// as it counts, each descriptor charged whatever the others decide; see
    /// [`Counting`]). A shared enforcer has its own.
    pub fn envoy_counting(mut self, counting: Counting) -> Self {
        if let Source::Parts { counting: c, .. } = &mut self.source {
            *c = counting;
        }
        self
    }

    /// Checks every request against `store` first, with the same policy,
    /// before the store of record (Envoy's local + global pattern). A request
    /// the local store denies is answered at once and never reaches the
    /// store of record; one it admits is then checked there, which decides.
    /// With the same quota in both, one instance alone can never pass more
    /// than the global limit, so a flood from one client is cut off locally.
    /// What the local store admits stays counted there even when the store of
    /// record then denies (as Envoy's local limit does): under a sustained
    /// global deny the local budget drains too, and denies sooner.
    pub fn local<L2: Store + 'static>(self, store: L2) -> Builder<St, L2> {
        self.with_local(LocalCheck {
            store,
            policy: None,
        })
    }

    /// Like [`Builder::local`], with a policy of its own for the pre-check:
    /// the same domain and descriptors, usually looser quotas (a pre-check
    /// stricter than the store of record would deny what the global limit
    /// allows).
    pub fn local_with_policy<L2: Store + 'static>(
        self,
        store: L2,
        policy: impl Into<PolicyHandle>,
    ) -> Builder<St, L2> {
        self.with_local(LocalCheck {
            store,
            policy: Some(policy.into()),
        })
    }

    fn with_local<L2>(self, local: LocalCheck<L2>) -> Builder<St, L2> {
        Builder {
            domain: self.domain,
            source: self.source,
            local: Some(local),
            sources: self.sources,
            style: self.style,
        }
    }

    /// The layer.
    pub fn build(mut self) -> RateLimitLayer {
        if self.sources.is_empty() {
            self.sources.push(Box::new(ClientIpKey::default()));
        }
        let enforcer = match self.source {
            Source::Shared(enforcer) => enforcer,
            Source::Parts {
                policy,
                store,
                kill_switch,
                observer,
                clock,
                counting,
            } => {
                let mut enforcer = Enforcer::new(policy, store)
                    .with_clock(clock)
                    .with_envoy_counting(counting);
                if let Some(kill_switch) = kill_switch {
                    enforcer = enforcer.with_kill_switch(kill_switch);
                }
                if let Some(observer) = observer {
                    enforcer = enforcer.with_observer(observer);
                }
                Arc::new(enforcer)
            }
        };
        // The pre-check obeys the same kill switch, clock and counting, and is not
        // observed: the store of record's decision is the one that counts.
        let precheck = self.local.map(|local| {
            let policy = local
                .policy
                .unwrap_or_else(|| enforcer.policy_handle().clone());
            Arc::new(
                Enforcer::new(policy, local.store)
                    .with_kill_switch(Arc::clone(enforcer.kill_switch()))
                    .with_clock(enforcer.clock())
                    .with_envoy_counting(enforcer.envoy_counting()),
            )
        });
        RateLimitLayer {
            limiter: Arc::new(Limiter {
                domain: self.domain,
                enforcer,
                precheck,
                sources: self.sources,
                style: self.style,
            }),
        }
    }
}
