//! One health state for every probe: `GET /healthcheck` (envoyproxy/ratelimit's
//! HTTP probe) and the gRPC health service (`grpc.health.v1.Health`) for
//! `ratelimit` (the name envoyproxy/ratelimit registers), `""` and the Rate
//! Limit Service's full name. The service is healthy while its store answers
//! (what `/readyz` checks), polled every [`POLL`], and until the shutdown
//! signal; every probe turns unhealthy together.
//!
//! envoyproxy/ratelimit (`src/server/health.go`) is healthy while Redis is
//! connected and no SIGTERM has come; `/healthcheck` then answers 200 `OK`,
//! and 500 with an empty body otherwise. A third component, the config,
//! counts only over xDS ([`Health::config`]): envoyproxy/ratelimit's is
//! failed until a config loads with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`,
//! and without `FORCE_START_WITHOUT_INITIAL_CONFIG` it serves nothing before
//! the first config.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME;
use tokio::sync::{Mutex, watch};
use tollgate_core::Store;
use tollgate_policy::Enforcer;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tonic_health::server::{HealthReporter, health_reporter};

/// How often the store is asked whether it answers.
const POLL: Duration = Duration::from_secs(1);

/// The gRPC health service's names for the service.
const NAMES: [&str; 3] = ["", "ratelimit", SERVICE_NAME];

/// The health every probe reports.
#[derive(Debug)]
pub struct Health {
    reporter: HealthReporter,
    /// What `/healthcheck` answers; published to gRPC under `stopped`.
    healthy: AtomicBool,
    /// Whether the store answered the last poll.
    store: AtomicBool,
    /// Whether the config is as the health rules want it (always, but over
    /// xDS).
    config: AtomicBool,
    /// Set by the shutdown. Publications hold it, so a poll that ends after
    /// the shutdown cannot turn the probes healthy again.
    stopped: Mutex<bool>,
}

impl Health {
    /// A healthy service, and the gRPC health service that reports it.
    pub async fn start() -> (Arc<Self>, HealthServer<impl HealthService>) {
        let (reporter, service) = health_reporter();
        for name in NAMES {
            reporter
                .set_service_status(name, ServingStatus::Serving)
                .await;
        }
        let health = Self {
            reporter,
            healthy: AtomicBool::new(true),
            store: AtomicBool::new(true),
            config: AtomicBool::new(true),
            stopped: Mutex::new(false),
        };
        (Arc::new(health), service)
    }

    /// Whether the service is healthy.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Follows whether `enforcer`'s store answers until `stopped` changes.
    pub async fn follow<S: Store>(
        self: Arc<Self>,
        enforcer: Arc<Enforcer<S>>,
        mut stopped: watch::Receiver<()>,
    ) {
        let mut ticks = tokio::time::interval(POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let ready = async {
                ticks.tick().await;
                enforcer.ready().await
            };
            tokio::select! {
                ready = ready => {
                    let stopped = self.stopped.lock().await;
                    if *stopped {
                        continue;
                    }
                    if self.store.swap(ready, Ordering::AcqRel) != ready {
                        if ready {
                            tracing::info!("the store answers again");
                        } else {
                            tracing::warn!("the store does not answer: health probes report unhealthy");
                        }
                    }
                    self.publish().await;
                }
                _ = stopped.changed() => return,
            }
        }
    }

    /// Sets the config component: `ready` when the config in force is what
    /// the health rules ask for. Ignored once the shutdown has started.
    pub async fn config(&self, ready: bool) {
        let stopped = self.stopped.lock().await;
        if *stopped {
            return;
        }
        if self.config.swap(ready, Ordering::AcqRel) != ready && !ready {
            tracing::warn!("no rate limit config loaded: health probes report unhealthy");
        }
        self.publish().await;
    }

    /// Publishes the components' verdict; the caller holds `stopped`.
    async fn publish(&self) {
        let healthy = self.store.load(Ordering::Acquire) && self.config.load(Ordering::Acquire);
        if self.set(healthy).await && healthy {
            tracing::info!("health probes report healthy");
        }
    }

    /// Turns every probe unhealthy for good: the service is shutting down.
    pub async fn stop(&self) {
        let mut stopped = self.stopped.lock().await;
        *stopped = true;
        self.set(false).await;
    }

    /// Publishes `healthy`; whether it changed.
    async fn set(&self, healthy: bool) -> bool {
        if self.healthy.swap(healthy, Ordering::AcqRel) == healthy {
            return false;
        }
        let status = if healthy {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in NAMES {
            self.reporter.set_service_status(name, status).await;
        }
        true
    }
}
