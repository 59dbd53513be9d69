//! The check every request goes through: descriptors, policy, local
//! pre-check, store, headers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use tollgate_core::{Clock, Decision, Limit, Nanos, Outcome, Store};
use tollgate_policy::{
    Applied, Descriptor, FailurePolicy, KillSwitch, Request, Resolved, Rule, Unit,
};

use super::PolicyHandle;
use crate::headers::{LimitReport, most_restrictive, retry_after_secs};
use crate::{DescriptorSource, HeaderStyle};

/// A future the layer boxes: the check, a permit release.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The limiter behind a layer, with its store types erased so that the
/// layer's types name only the inner service.
pub(crate) trait Check: Send + Sync + 'static {
    /// The descriptors the configured sources make of `request`.
    fn descriptors(&self, request: &Parts) -> Vec<Descriptor>;

    /// Decides a request with these descriptors.
    fn check(self: Arc<Self>, descriptors: Vec<Descriptor>, grpc: bool) -> BoxFuture<Verdict>;
}

/// What the check decided.
pub(crate) enum Verdict {
    /// Forward the request; add `headers` to the response; drop `permits`
    /// when the response is ready (or the request is abandoned).
    Pass {
        headers: HeaderMap,
        permits: Permits,
    },
    /// Answer with this response instead.
    Deny(Response<Bytes>),
}

/// Concurrency permits an admitted request holds, given back when dropped.
///
/// Each release is polled once at once (the memory store's is ready then);
/// one that is still pending is spawned on the current tokio runtime. Outside
/// a runtime it is dropped, and a remote store's lease expiry reclaims it.
#[derive(Default)]
pub(crate) struct Permits {
    releases: Vec<BoxFuture<()>>,
}

impl Permits {
    fn add(&mut self, release: Option<BoxFuture<()>>) {
        self.releases.extend(release);
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        for mut release in self.releases.drain(..) {
            if release.as_mut().poll(&mut cx).is_pending()
                && let Ok(runtime) = tokio::runtime::Handle::try_current()
            {
                runtime.spawn(release);
            }
        }
    }
}

/// The local pre-check: a store in this process, with its own policy or the
/// layer's.
pub(crate) struct LocalCheck<L> {
    pub(crate) store: L,
    pub(crate) policy: Option<PolicyHandle>,
}

/// Everything a layer's check needs.
pub(crate) struct Limiter<St, L> {
    pub(crate) domain: String,
    pub(crate) policy: PolicyHandle,
    pub(crate) store: St,
    pub(crate) local: Option<LocalCheck<L>>,
    pub(crate) sources: Vec<Box<dyn DescriptorSource>>,
    pub(crate) kill_switch: Option<Arc<KillSwitch>>,
    pub(crate) style: HeaderStyle,
    pub(crate) clock: Arc<dyn Clock>,
}

/// A resolved request, sorted by what each descriptor asks for.
#[derive(Default)]
struct Layers<'a> {
    enforce: Vec<&'a Applied>,
    shadow: Vec<&'a Applied>,
    blocked: Vec<(&'a Arc<Rule>, Unit)>,
}

impl<St: Store + 'static, L: Store + 'static> Check for Limiter<St, L> {
    fn descriptors(&self, request: &Parts) -> Vec<Descriptor> {
        // A descriptor with no entries (a custom source's) limits nothing.
        self.sources
            .iter()
            .filter_map(|source| source.descriptor(request))
            .filter(|descriptor| !descriptor.entries.is_empty())
            .collect()
    }

    fn check(self: Arc<Self>, descriptors: Vec<Descriptor>, grpc: bool) -> BoxFuture<Verdict> {
        Box::pin(async move { self.run(&descriptors, grpc).await })
    }
}

impl<St: Store + 'static, L: Store + 'static> Limiter<St, L> {
    async fn run(self: &Arc<Self>, descriptors: &[Descriptor], grpc: bool) -> Verdict {
        let pass = || Verdict::Pass {
            headers: HeaderMap::new(),
            permits: Permits::default(),
        };
        if descriptors.is_empty() {
            return pass();
        }
        // Read before any store, so `now + reset_after` never passes the true
        // reset instant and rounds up to the same second on every read.
        let now = self.clock.now();
        let request = Request {
            domain: &self.domain,
            descriptors,
            hits_addend: 1,
        };
        let policy = self.policy.load();
        // A request the policy cannot take (e.g. an entry with an empty key,
        // which only a custom source can make) is not limited.
        let Ok(resolved) = policy.resolve(&request) else {
            return pass();
        };
        let layers = self.sort(&resolved);

        // A rule that refuses everything answers without asking any store.
        if !layers.blocked.is_empty() {
            let reports: Vec<LimitReport<'_>> = layers
                .blocked
                .iter()
                .map(|(rule, unit)| LimitReport {
                    name: rule.id(),
                    quota: 0,
                    window: Some(unit.duration()),
                    concurrency: false,
                    bucket: None,
                    decision: blocked(*unit, now),
                })
                .collect();
            return Verdict::Deny(self.too_many(&reports, now, grpc));
        }

        let mut permits = Permits::default();
        let mut reports: Vec<LimitReport<'_>> = Vec::new();

        // The local pre-check: obviously-over-limit traffic stops here.
        let local_policy;
        let local_resolved;
        if let Some(local) = &self.local {
            let enforce = match &local.policy {
                None => layers.enforce.clone(),
                Some(handle) => {
                    local_policy = handle.load();
                    local_resolved = local_policy.resolve(&request).unwrap_or_default();
                    self.sort(&local_resolved).enforce
                }
            };
            if !enforce.is_empty() {
                let limits: Vec<Limit<'_>> = enforce.iter().map(|a| a.limit()).collect();
                // A local store that fails is skipped: the remote check decides.
                if let Ok(outcome) = local.store.check(&limits).await {
                    reports = report(&enforce, &outcome);
                    if !outcome.allowed() {
                        return Verdict::Deny(self.too_many(&reports, now, grpc));
                    }
                    permits.add(self.release_local(&enforce));
                }
            }
        }

        // The store of record: every enforcing limit in one call, all-or-nothing.
        let mut delay = Duration::ZERO;
        if !layers.enforce.is_empty() {
            let limits: Vec<Limit<'_>> = layers.enforce.iter().map(|a| a.limit()).collect();
            match self.store.check(&limits).await {
                Ok(outcome) => {
                    reports = report(&layers.enforce, &outcome);
                    if !outcome.allowed() {
                        // Dropping `permits` gives back what the pre-check took.
                        return Verdict::Deny(self.too_many(&reports, now, grpc));
                    }
                    permits.add(self.release(&layers.enforce));
                    delay = outcome
                        .decisions
                        .iter()
                        .map(|d| d.delay)
                        .max()
                        .unwrap_or_default();
                }
                Err(_) => {
                    if layers
                        .enforce
                        .iter()
                        .any(|a| a.failure == FailurePolicy::FailClosed)
                    {
                        return Verdict::Deny(unavailable(grpc));
                    }
                    // `fail_open` lets the request through, and so does
                    // `local`: a store with a local fallback (the Redis store)
                    // decides from it and never errs for being unreachable, so
                    // an error here comes from a store that has none. With a
                    // pre-check, the pre-check's decision (and headers) stand.
                }
            }
        }

        // Shadow limits: counted only for requests that pass, never denying,
        // so they answer "what would this rule refuse that passes today?".
        if !layers.shadow.is_empty() {
            let limits: Vec<Limit<'_>> = layers.shadow.iter().map(|a| a.limit()).collect();
            if let Ok(outcome) = self.store.check(&limits).await
                && outcome.allowed()
            {
                permits.add(self.release(&layers.shadow));
            }
        }

        let mut headers = HeaderMap::new();
        self.style.write(&reports, now, &mut headers);
        // A shaping rule admits with a delay: hold the request that long.
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Verdict::Pass { headers, permits }
    }

    /// Sorts resolved descriptors; kill-switched rules, unlimited, replaced
    /// and unmatched descriptors drop out.
    fn sort<'a>(&self, resolved: &'a [Resolved]) -> Layers<'a> {
        let mut layers = Layers::default();
        let enforced = |rule: &Rule| {
            self.kill_switch
                .as_ref()
                .is_none_or(|k| k.enforced(&self.domain, rule.id()))
        };
        for r in resolved {
            match r {
                Resolved::Limit(applied) if enforced(&applied.rule) => {
                    if applied.shadow {
                        layers.shadow.push(applied);
                    } else {
                        layers.enforce.push(applied);
                    }
                }
                Resolved::Blocked(rule, unit) if enforced(rule) && !rule.shadow() => {
                    layers.blocked.push((rule, *unit));
                }
                _ => {}
            }
        }
        layers
    }

    /// Gives back, in the store of record, the concurrency permits `admitted` holds.
    fn release(self: &Arc<Self>, admitted: &[&Applied]) -> Option<BoxFuture<()>> {
        let held = concurrency(admitted)?;
        let limiter = Arc::clone(self);
        Some(Box::pin(async move {
            let limits: Vec<Limit<'_>> = held.iter().map(Applied::limit).collect();
            // A failed release is left to the store's lease expiry.
            let _ = limiter.store.release(&limits).await;
        }))
    }

    /// The same in the local pre-check's store.
    fn release_local(self: &Arc<Self>, admitted: &[&Applied]) -> Option<BoxFuture<()>> {
        let held = concurrency(admitted)?;
        let limiter = Arc::clone(self);
        Some(Box::pin(async move {
            if let Some(local) = &limiter.local {
                let limits: Vec<Limit<'_>> = held.iter().map(Applied::limit).collect();
                let _ = local.store.release(&limits).await;
            }
        }))
    }

    /// 429 with the headers and a JSON body (or, to a gRPC client,
    /// `RESOURCE_EXHAUSTED` in a trailers-only response).
    fn too_many(&self, reports: &[LimitReport<'_>], now: Nanos, grpc: bool) -> Response<Bytes> {
        let mut headers = HeaderMap::new();
        self.style.write(reports, now, &mut headers);
        let reported = most_restrictive(reports).expect("a deny has a denying limit");
        let retry_after = retry_after_secs(&reported.decision);
        let message = format!(
            "rate limit \"{}\" exceeded; retry in {retry_after} s",
            reported.name
        );
        if grpc {
            return grpc_status(headers, GRPC_RESOURCE_EXHAUSTED, &message);
        }
        // Written straight into one string rather than built as a
        // `serde_json::Value` map: denials come in floods. The message
        // quotes a rule name, so it is escaped as a JSON string.
        let message = serde_json::Value::from(message);
        let body = format!(
            r#"{{"error":"rate_limit_exceeded","message":{message},"retry_after":{retry_after}}}"#
        );
        json_text(StatusCode::TOO_MANY_REQUESTS, headers, body)
    }
}

/// The reports of `applied` limits, in order, named by their shared bucket
/// when they spend one (every route of the bucket reports the same policy).
fn report<'a>(applied: &[&'a Applied], outcome: &Outcome) -> Vec<LimitReport<'a>> {
    applied
        .iter()
        .zip(&outcome.decisions)
        .map(|(a, d)| {
            let bucket = a.rule.bucket();
            LimitReport::new(bucket.unwrap_or(a.rule.id()), &a.quota, a.algorithm, *d)
                .with_bucket(bucket)
        })
        .collect()
}

/// The concurrency limits among `admitted`, owned, or `None` when there are none.
fn concurrency(admitted: &[&Applied]) -> Option<Vec<Applied>> {
    let held: Vec<Applied> = admitted
        .iter()
        .filter(|a| a.algorithm == tollgate_core::Algorithm::Concurrency)
        .map(|a| (*a).clone())
        .collect();
    (!held.is_empty()).then_some(held)
}

/// The decision of a rule that refuses everything: nothing left until the
/// current `unit` window (aligned to the epoch) ends; no retry helps.
fn blocked(unit: Unit, now: Nanos) -> Decision {
    let unit_ns = u64::try_from(unit.duration().as_nanos()).unwrap_or(u64::MAX);
    Decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        reset_after: Duration::from_nanos(unit_ns - now % unit_ns),
        retry_after: None,
        delay: Duration::ZERO,
    }
}

/// gRPC's `RESOURCE_EXHAUSTED`.
const GRPC_RESOURCE_EXHAUSTED: u16 = 8;
/// gRPC's `UNAVAILABLE`.
const GRPC_UNAVAILABLE: u16 = 14;

/// 503 when a `fail_closed` rule's store cannot answer: the limiter, not the
/// client, is at fault, and clients retry a 503 with backoff. No `Retry-After`:
/// when the store returns is unknown.
fn unavailable(grpc: bool) -> Response<Bytes> {
    let message = "the rate limiter cannot decide right now";
    if grpc {
        return grpc_status(HeaderMap::new(), GRPC_UNAVAILABLE, message);
    }
    let body = serde_json::json!({
        "error": "rate_limiter_unavailable",
        "message": message,
    });
    json(StatusCode::SERVICE_UNAVAILABLE, HeaderMap::new(), &body)
}

fn json(status: StatusCode, headers: HeaderMap, body: &serde_json::Value) -> Response<Bytes> {
    json_text(status, headers, body.to_string())
}

fn json_text(status: StatusCode, headers: HeaderMap, body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A gRPC trailers-only response: HTTP 200, the status in the headers, no body.
fn grpc_status(headers: HeaderMap, code: u16, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    *response.headers_mut() = headers;
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from(code),
    );
    // Printable ASCII without `%` needs no percent-encoding.
    if let Ok(message) = HeaderValue::from_str(message) {
        h.insert(HeaderName::from_static("grpc-message"), message);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_resets_at_the_unit_boundary() {
        let d = blocked(Unit::Minute, 61_500_000_000);
        assert!(!d.allowed);
        assert_eq!(d.reset_after, Duration::from_millis(58_500));
        assert_eq!(retry_after_secs(&d), 59);
    }

    #[test]
    fn unavailable_is_503_json_or_grpc_unavailable() {
        let http = unavailable(false);
        assert_eq!(http.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: serde_json::Value = serde_json::from_slice(http.body()).unwrap();
        assert_eq!(body["error"], "rate_limiter_unavailable");
        let grpc = unavailable(true);
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()["grpc-status"], "14");
    }
}
