//! envoyproxy/ratelimit's own test sequences, run against the real binary in
//! its mode: started as `ratelimit` with a deployment's environment
//! (`RUNTIME_ROOT`, `REDIS_SOCKET_TYPE=tcp`, `REDIS_URL` at a real
//! `redis-server` on loopback), driven by gRPC `ShouldRateLimit`.
//!
//! Sources, at commit f2fb157 of envoyproxy/ratelimit:
//! - `test/integration/integration_test.go`: `testBasicBaseConfig` and the
//!   settings it runs under, `testConfigReload`, `TestBasicConfig_ExtraTags`
//!   and `testShareThreshold`, with its config files copied unchanged into
//!   `tests/envoy_conformance/runtime/`.
//! - `test/redis/fixed_cache_impl_test.go`: the request and answer sequences
//!   of its cache, with the counts its mocked Redis returns reached by real
//!   requests first, and its per-rule stats as `/metrics` shows them
//!   (`ratelimit_service_rate_limit_*`).
//! - `test/service/ratelimit_test.go`: the service's cases that
//!   `tests/grpc.rs` does not port, with what its mocked cache returns
//!   replaced by what envoyproxy/ratelimit's cache answers for real requests.
//!
//! Every expected value is envoyproxy/ratelimit's, whatever Tollgate does
//! now. `duration_until_reset` is its `utils.CalculateReset` (the unit's
//! length minus the Unix second modulo it) for a second read before or after
//! the call. A sequence that must stay in one fixed window runs again with
//! fresh descriptor values when its first and last second fall in two
//! windows ([`in_one_window`]); no test sleeps.
//!
//! Each test gathers every mismatch of its sequence and fails with all of
//! them, as `case: observed ... expected ...`.

use crate::common;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Redis, Server, ratelimit};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt64Value};
use tonic::transport::Channel;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/envoy_conformance");
/// How long a config change may take to be seen (the watcher polls).
const RELOAD: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// A deployment: Redis, a runtime directory and the binary as `ratelimit`.

struct Deployment {
    server: Server,
    client: RateLimitServiceClient<Channel>,
    redis: Redis,
    /// `RUNTIME_ROOT`.
    root: tempfile::TempDir,
    _bin: tempfile::TempDir,
    _per_second: Option<Redis>,
}

/// Copies the directory `from` into `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a writable temp dir");
    for entry in std::fs::read_dir(from).expect("the fixture directory") {
        let entry = entry.expect("a fixture entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("a copied fixture");
        }
    }
}

/// `127.0.0.1:<port>` of `redis` (envoyproxy/ratelimit's tests give
/// `localhost:<port>`; the test's Redis listens on IPv4 loopback only).
fn address(redis: &Redis) -> String {
    redis
        .url()
        .strip_prefix("redis://")
        .expect("a redis:// URL")
        .to_owned()
}

impl Deployment {
    /// envoyproxy/ratelimit's integration settings (`defaultSettings` and
    /// `makeSimpleRedisSettings`): `RUNTIME_ROOT` is a copy of
    /// `tests/envoy_conformance/runtime/current`, `RUNTIME_SUBDIRECTORY`
    /// `ratelimit`, Redis over TCP, no statsd; then `env`.
    async fn integration(redis: Redis, env: &[(&str, &str)]) -> Deployment {
        let root = tempfile::tempdir().expect("a temp dir");
        copy_tree(&Path::new(FIXTURES).join("runtime/current"), root.path());
        Self::start(redis, root, env).await
    }

    /// The config files of `tests/envoy_conformance/<fixture>` as
    /// `RUNTIME_ROOT/ratelimit/config`, then `env`.
    async fn with_config(fixture: &str, redis: Redis, env: &[(&str, &str)]) -> Deployment {
        let root = tempfile::tempdir().expect("a temp dir");
        copy_tree(
            &Path::new(FIXTURES).join(fixture),
            &root.path().join("ratelimit/config"),
        );
        Self::start(redis, root, env).await
    }

    async fn start(redis: Redis, root: tempfile::TempDir, env: &[(&str, &str)]) -> Deployment {
        let bin = tempfile::tempdir().expect("a temp dir");
        let mut command = ratelimit(bin.path());
        command.envs([
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
            ("RUNTIME_ROOT", root.path().to_str().expect("UTF-8")),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_APPDIRECTORY", "config"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &address(&redis)),
            ("USE_STATSD", "false"),
            // envoyproxy/ratelimit's default, given: Tollgate's own (10 ms)
            // lets a slow Redis round trip on a loaded test machine be
            // decided by the failure policy, uncounted or counted late,
            // which no expected value here could follow.
            ("REDIS_TIMEOUT", "10s"),
            // The listener lines the harness waits for are at INFO.
            ("LOG_LEVEL", "info"),
        ]);
        command.envs(env.iter().copied());
        let server = Server::spawn(command, &[], None);
        let client = server.grpc_client().await;
        Deployment {
            server,
            client,
            redis,
            root,
            _bin: bin,
            _per_second: None,
        }
    }

    /// `RUNTIME_ROOT/ratelimit/config`.
    fn config_dir(&self) -> PathBuf {
        self.root.path().join("ratelimit/config")
    }

    /// Sends `request`, with the Unix second read before and after.
    async fn ask(&self, request: RateLimitRequest) -> Exchange {
        let before = unix_now();
        let response = self
            .client
            .clone()
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner);
        Exchange {
            before,
            after: unix_now(),
            response,
        }
    }

    /// envoyproxy/ratelimit's per-rule stats of the rule whose stat key's
    /// labels are `labels` (`domain`, `key1`, `key2`), as `/metrics` shows
    /// them; a series not there yet is 0.
    async fn stats(&self, labels: &[&str]) -> Stats {
        let text = reqwest::get(self.server.url("/metrics"))
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("a text body");
        let samples: BTreeMap<&str, u64> = text
            .lines()
            .filter(|l| l.starts_with("ratelimit_service_rate_limit_"))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series, value.parse().ok()?))
            })
            .collect();
        let names = ["domain", "key1", "key2"];
        let labels: Vec<String> = names
            .iter()
            .zip(labels)
            .map(|(name, value)| format!("{name}=\"{value}\""))
            .collect();
        let of = |stat: &str| {
            let series = format!(
                "ratelimit_service_rate_limit_{stat}{{{}}}",
                labels.join(",")
            );
            samples.get(series.as_str()).copied().unwrap_or(0)
        };
        Stats {
            total_hits: of("total_hits"),
            over_limit: of("over_limit"),
            near_limit: of("near_limit"),
            within_limit: of("within_limit"),
            shadow_mode: of("shadow_mode"),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// A value no earlier attempt used: the nanoseconds of now.
fn fresh() -> String {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
        .to_string()
}

/// Runs `phase` with a fresh value until its first and last second fall in
/// one window of `unit` (a window of a shorter unit lies inside one of a
/// longer unit, as all are aligned to the Unix epoch), at most five times;
/// the mismatches of the attempt that did.
async fn in_one_window(unit: Unit, phase: impl AsyncFn(String) -> Check) -> Check {
    let seconds = unit_seconds(unit);
    for _ in 0..5 {
        let start = unix_now();
        let check = phase(fresh()).await;
        if start / seconds == unix_now() / seconds {
            return check;
        }
    }
    panic!("five attempts in a row straddled a {unit:?} window");
}

/// envoyproxy/ratelimit's `utils.UnitToDivider`.
fn unit_seconds(unit: Unit) -> u64 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => 86_400,
        Unit::Week => 604_800,
        Unit::Month => 2_592_000,
        Unit::Year => 31_536_000,
        Unit::Unknown => unreachable!("envoyproxy/ratelimit panics on it"),
    }
}

// ---------------------------------------------------------------------------
// Requests.

/// A descriptor of `entries` with its own `hits_addend`, if `hits` is some.
fn desc(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

/// envoyproxy/ratelimit's `common.NewRateLimitRequest`: one descriptor per
/// entry list, the request's `hits_addend`.
fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|e| desc(e, None)).collect(),
        hits_addend: hits,
    }
}

/// `common.NewRateLimitRequestWithPerDescriptorHitsAddend`: the request's
/// `hits_addend` is 1, each descriptor has its own.
fn request_per_descriptor(
    domain: &str,
    descriptors: &[(&[(&str, &str)], u64)],
) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|(entries, hits)| desc(entries, Some(*hits)))
            .collect(),
        hits_addend: 1,
    }
}

// ---------------------------------------------------------------------------
// Expectations.

/// One call: the Unix seconds read before and after it, and its answer.
struct Exchange {
    before: u64,
    after: u64,
    response: Result<RateLimitResponse, tonic::Status>,
}

/// An expected descriptor status.
#[derive(Clone, Copy)]
struct Want {
    code: Code,
    /// `requests_per_unit`, unit and name of `current_limit`.
    limit: Option<(u32, Unit, &'static str)>,
    remaining: u32,
}

/// `OK` with no limit: no rule applies (`GetResponseDescriptorStatus` with
/// an empty cache key).
const NO_LIMIT: Want = Want {
    code: Code::Ok,
    limit: None,
    remaining: 0,
};

/// `OK` under an unnamed limit with `remaining` left.
fn ok(requests_per_unit: u32, unit: Unit, remaining: u32) -> Want {
    Want {
        code: Code::Ok,
        limit: Some((requests_per_unit, unit, "")),
        remaining,
    }
}

/// `OVER_LIMIT` under an unnamed limit (nothing left).
fn over(requests_per_unit: u32, unit: Unit) -> Want {
    Want {
        code: Code::OverLimit,
        limit: Some((requests_per_unit, unit, "")),
        remaining: 0,
    }
}

impl Want {
    fn named(mut self, name: &'static str) -> Want {
        if let Some(limit) = &mut self.limit {
            limit.2 = name;
        }
        self
    }
}

/// What `utils.CalculateReset` gives for `unit` at any second from `before`
/// to `after`: `observed` if it is one of them, else the one at `before`.
fn reset(unit: Unit, before: u64, after: u64, observed: Option<i64>) -> i64 {
    let length = unit_seconds(unit);
    let candidates: Vec<i64> = (before..=after)
        .map(|now| i64::try_from(length - now % length).expect("a small number"))
        .collect();
    match observed {
        Some(seconds) if candidates.contains(&seconds) => seconds,
        _ => candidates[0],
    }
}

/// envoyproxy/ratelimit's per-rule stats of one rule (`NewStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Stats {
    total_hits: u64,
    over_limit: u64,
    near_limit: u64,
    within_limit: u64,
    shadow_mode: u64,
}

impl Stats {
    /// `(total_hits, over_limit, near_limit, within_limit)`, shadow 0.
    fn of(total_hits: u64, over_limit: u64, near_limit: u64, within_limit: u64) -> Stats {
        Stats {
            total_hits,
            over_limit,
            near_limit,
            within_limit,
            shadow_mode: 0,
        }
    }

    /// What was counted since `earlier`.
    fn since(self, earlier: Stats) -> Stats {
        Stats {
            total_hits: self.total_hits.wrapping_sub(earlier.total_hits),
            over_limit: self.over_limit.wrapping_sub(earlier.over_limit),
            near_limit: self.near_limit.wrapping_sub(earlier.near_limit),
            within_limit: self.within_limit.wrapping_sub(earlier.within_limit),
            shadow_mode: self.shadow_mode.wrapping_sub(earlier.shadow_mode),
        }
    }
}

/// The mismatches found so far.
#[derive(Default)]
struct Check {
    failures: Vec<String>,
}

impl Check {
    fn equal<T: PartialEq + Debug>(&mut self, case: &str, observed: T, expected: T) {
        if observed != expected {
            self.failures.push(format!(
                "{case}:\n    observed {observed:?}\n    expected {expected:?}"
            ));
        }
    }

    /// The whole answer of `exchange` is envoyproxy/ratelimit's: `overall`,
    /// one status per `wants` (with its reset when it has a limit), and
    /// `headers` as `response_headers_to_add` (its default: none).
    fn response(
        &mut self,
        case: &str,
        exchange: &Exchange,
        overall: Code,
        wants: &[Want],
        headers: &[(&str, HeaderWant)],
    ) {
        let observed = match &exchange.response {
            Ok(response) => response,
            Err(status) => {
                self.failures.push(format!(
                    "{case}:\n    observed the error {status:?}\n    expected an answer"
                ));
                return;
            }
        };
        let statuses = wants
            .iter()
            .enumerate()
            .map(|(i, want)| {
                let seen = observed
                    .statuses
                    .get(i)
                    .and_then(|s| s.duration_until_reset.as_ref())
                    .map(|d| d.seconds);
                DescriptorStatus {
                    code: want.code as i32,
                    current_limit: want.limit.map(|(requests_per_unit, unit, name)| RateLimit {
                        name: name.to_owned(),
                        requests_per_unit,
                        unit: unit as i32,
                    }),
                    limit_remaining: want.remaining,
                    duration_until_reset: want.limit.map(|(_, unit, _)| PbDuration {
                        seconds: reset(unit, exchange.before, exchange.after, seen),
                        nanos: 0,
                    }),
                    ..DescriptorStatus::default()
                }
            })
            .collect();
        let response_headers_to_add = headers
            .iter()
            .map(|(key, want)| {
                let value = match want {
                    HeaderWant::Value(value) => value.clone(),
                    HeaderWant::Reset(unit) => {
                        let seen = observed
                            .response_headers_to_add
                            .iter()
                            .find(|h| h.key == *key)
                            .and_then(|h| h.value.parse().ok());
                        reset(*unit, exchange.before, exchange.after, seen).to_string()
                    }
                };
                HeaderValue {
                    key: (*key).to_owned(),
                    value,
                    ..HeaderValue::default()
                }
            })
            .collect();
        let expected = RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            ..RateLimitResponse::default()
        };
        // Part by part, so that a mismatch says where it is.
        self.equal(
            &format!("{case}: overall_code"),
            code(observed.overall_code),
            overall,
        );
        self.equal(
            &format!("{case}: statuses"),
            observed.statuses.iter().map(brief).collect::<Vec<_>>(),
            expected.statuses.iter().map(brief).collect::<Vec<_>>(),
        );
        let pairs = |headers: &[HeaderValue]| -> Vec<(String, String)> {
            headers
                .iter()
                .map(|h| (h.key.clone(), h.value.clone()))
                .collect()
        };
        self.equal(
            &format!("{case}: response_headers_to_add"),
            pairs(&observed.response_headers_to_add),
            pairs(&expected.response_headers_to_add),
        );
        let rest = |r: &RateLimitResponse| RateLimitResponse {
            overall_code: 0,
            statuses: Vec::new(),
            response_headers_to_add: r
                .response_headers_to_add
                .iter()
                .filter(|h| !h.raw_value.is_empty())
                .cloned()
                .collect(),
            ..r.clone()
        };
        self.equal(
            &format!("{case}: the other fields"),
            rest(observed),
            rest(&expected),
        );
    }

    fn merge(&mut self, other: Check) {
        self.failures.extend(other.failures);
    }

    /// Fails the test with every mismatch.
    fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} of envoyproxy/ratelimit's expectations failed:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

/// A status on one line, every field in it.
fn brief(status: &DescriptorStatus) -> String {
    let mut text = format!("{:?}", code(status.code));
    if let Some(limit) = &status.current_limit {
        let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
        text += &format!(" {}/{unit:?} {:?}", limit.requests_per_unit, limit.name);
    }
    text += &format!(" left {}", status.limit_remaining);
    if let Some(reset) = &status.duration_until_reset {
        text += &format!(" reset {}s", reset.seconds);
        if reset.nanos != 0 {
            text += &format!(" {}ns", reset.nanos);
        }
    }
    if let Some(quota) = &status.quota {
        text += &format!(" quota {quota:?}");
    }
    text
}

fn code(value: i32) -> Code {
    Code::try_from(value).unwrap_or(Code::Unknown)
}

/// An expected header value.
enum HeaderWant {
    Value(String),
    /// `utils.CalculateReset` of the unit, in seconds.
    Reset(Unit),
}

// ---------------------------------------------------------------------------
// test/integration/integration_test.go

/// `getCacheKey`: the `_local` keys of `basic.yaml` and `another.yaml` when
/// the local cache is on.
fn cache_key(key: &str, local_cache: bool) -> String {
    if local_cache {
        format!("{key}_local")
    } else {
        key.to_owned()
    }
}

/// `testBasicBaseConfig`. `stop` is `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
/// The local cache's own gauges (`ratelimit.localcache.*`) and
/// `over_limit_with_local_cache` have no series in Tollgate and are not
/// checked. Its last step slept two seconds to see the reset shrink; here
/// the reset is checked against `CalculateReset` instead.
async fn basic_config(d: &Deployment, local_cache: bool, stop: bool) -> Check {
    let mut check = Check::default();
    let key = |k: &str| cache_key(k, local_cache);

    let hello = d
        .ask(request("foo", &[&[(&key("hello"), "world")]], 1))
        .await;
    check.response(
        "foo hello=world (no such domain)",
        &hello,
        Code::Ok,
        &[NO_LIMIT],
        &[],
    );

    let key1 = key("key1");
    let first = d.ask(request("basic", &[&[(&key1, "foo")]], 1)).await;
    check.response(
        "basic key1=foo",
        &first,
        Code::Ok,
        &[ok(50, Unit::Second, 49)],
        &[],
    );
    let stats = d.stats(&["basic", &key1]).await;
    check.equal("basic key1 total_hits", stats.total_hits, 1);

    // 25 hits on a limit of 20 a minute, with a new value.
    let key2 = key("key2");
    let phase = in_one_window(Unit::Minute, async |value| {
        let mut check = Check::default();
        let start = d.stats(&["another", &key2]).await;
        for i in 0..25u32 {
            let exchange = d.ask(request("another", &[&[(&key2, &value)]], 1)).await;
            let want = if i >= 20 {
                over(20, Unit::Minute)
            } else {
                ok(20, Unit::Minute, 20 - (i + 1))
            };
            check.response(
                &format!("another key2, hit {}", i + 1),
                &exchange,
                want.code,
                &[want],
                &[],
            );
            let stats = d.stats(&["another", &key2]).await.since(start);
            check.equal(
                &format!("another key2 total_hits after hit {}", i + 1),
                stats.total_hits,
                u64::from(i + 1),
            );
            check.equal(
                &format!("another key2 over_limit after hit {}", i + 1),
                stats.over_limit,
                u64::from(i.saturating_sub(19)),
            );
        }
        check
    })
    .await;
    check.merge(phase);

    // Two descriptors: 20 a minute and 10 an hour, 15 hits each.
    let key3 = key("key3");
    let phase = in_one_window(Unit::Minute, async |value| {
        let mut check = Check::default();
        let start2 = d.stats(&["another", &key2]).await;
        let start3 = d.stats(&["another", &key3]).await;
        for i in 0..15u32 {
            let exchange = d
                .ask(request(
                    "another",
                    &[&[(&key2, &value)], &[(&key3, &value)]],
                    1,
                ))
                .await;
            let mut remaining1 = 20 - (i + 1);
            let (overall, second) = if i >= 10 {
                // With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, key2 stops
                // counting once key3 would go over.
                if stop {
                    remaining1 = 10;
                }
                (Code::OverLimit, over(10, Unit::Hour))
            } else {
                (Code::Ok, ok(10, Unit::Hour, 10 - (i + 1)))
            };
            check.response(
                &format!("another key2 and key3, hit {}", i + 1),
                &exchange,
                overall,
                &[ok(20, Unit::Minute, remaining1), second],
                &[],
            );
            let stats2 = d.stats(&["another", &key2]).await.since(start2);
            let stats3 = d.stats(&["another", &key3]).await.since(start3);
            let hit = i + 1;
            check.equal(
                &format!("another key2 (total_hits, over_limit) after hit {hit}"),
                (stats2.total_hits, stats2.over_limit),
                (u64::from(hit), 0),
            );
            check.equal(
                &format!("another key3 (total_hits, over_limit) after hit {hit}"),
                (stats3.total_hits, stats3.over_limit),
                (u64::from(hit), u64::from(i.saturating_sub(9))),
            );
        }
        check
    })
    .await;
    check.merge(phase);

    let key4 = key("key4");
    for remaining in [19, 18] {
        let exchange = d.ask(request("another", &[&[(&key4, "durTest")]], 1)).await;
        check.response(
            &format!("another key4=durTest, {remaining} left"),
            &exchange,
            Code::Ok,
            &[ok(20, Unit::Day, remaining)],
            &[],
        );
    }
    check
}

/// `TestBasicConfig`, `WithoutPerSecondRedis`.
#[tokio::test]
async fn basic_config_without_per_second_redis() {
    let d = Deployment::integration(Redis::start(), &[]).await;
    basic_config(&d, false, false).await.finish();
}

/// `TestBasicConfig`, `WithPerSecondRedis`: `REDIS_PERSECOND` and its own
/// Redis change no answer (Tollgate keeps per-second limits with the
/// others).
#[tokio::test]
async fn basic_config_with_per_second_redis() {
    let per_second = Redis::start();
    let url = address(&per_second);
    let mut d = Deployment::integration(
        Redis::start(),
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", &url),
        ],
    )
    .await;
    d._per_second = Some(per_second);
    basic_config(&d, false, false).await.finish();
}

/// `TestBasicConfig`, `WithoutPerSecondRedisWithLocalCache`.
#[tokio::test]
async fn basic_config_with_local_cache() {
    let d = Deployment::integration(Redis::start(), &[("LOCAL_CACHE_SIZE_IN_BYTES", "1000")]).await;
    basic_config(&d, true, false).await.finish();
}

/// `TestBasicConfig`, `WithoutPerSecondRedisWithCachePrefix`.
#[tokio::test]
async fn basic_config_with_cache_prefix() {
    let d = Deployment::integration(Redis::start(), &[("CACHE_KEY_PREFIX", "prefix:")]).await;
    basic_config(&d, false, false).await.finish();
}

/// `TestBasicConfig`,
/// `WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig`.
#[tokio::test]
async fn basic_config_with_stop_cache_key_increment_when_overlimit() {
    let d = Deployment::integration(
        Redis::start(),
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    )
    .await;
    basic_config(&d, false, true).await.finish();
}

/// `TestBasicConfig`,
/// `WithoutPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig`.
#[tokio::test]
async fn basic_config_with_local_cache_and_stop_cache_key_increment_when_overlimit() {
    let d = Deployment::integration(
        Redis::start(),
        &[
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1000"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ],
    )
    .await;
    basic_config(&d, true, true).await.finish();
}

/// `TestBasicAuthConfig`, `WithoutPerSecondRedisAuth`: a Redis that wants
/// a password, given by `REDIS_AUTH`.
#[tokio::test]
async fn basic_auth_config() {
    let redis = Redis::start_with(&["--requirepass", "password123"]);
    let d = Deployment::integration(redis, &[("REDIS_AUTH", "password123")]).await;
    basic_config(&d, false, false).await.finish();
}

/// `TestBasicReloadConfig`, `BasicWithoutWatchRoot`
/// (`testBasicConfigWithoutWatchRoot`).
#[tokio::test]
async fn basic_config_without_watch_root() {
    let d = Deployment::integration(Redis::start(), &[("RUNTIME_WATCH_ROOT", "false")]).await;
    basic_config(&d, false, false).await.finish();
}

/// `TestBasicConfig_ExtraTags`: with `EXTRA_TAGS`, one hit counts one in
/// `total_hits`. The tags themselves are not checked: Tollgate ignores
/// `EXTRA_TAGS` (envoyproxy/ratelimit gives them to its statsd stats).
#[tokio::test]
async fn basic_config_extra_tags() {
    let d = Deployment::integration(Redis::start(), &[("EXTRA_TAGS", "foo:bar,a:b")]).await;
    let mut check = Check::default();
    let exchange = d.ask(request("basic", &[&[("key1", "foo")]], 1)).await;
    check.response(
        "basic key1=foo",
        &exchange,
        Code::Ok,
        &[ok(50, Unit::Second, 49)],
        &[],
    );
    let stats = d.stats(&["basic", "key1"]).await;
    check.equal("basic key1 total_hits", stats.total_hits, 1);
    check.finish();
}

/// Waits until the log has `count` lines containing `needle`.
async fn wait_for_lines(d: &Deployment, needle: &'static str, count: usize) -> bool {
    d.server
        .wait_until(RELOAD, move |log| log.matches(needle).count() >= count)
        .await
}

/// `TestBasicReloadConfig`, `ReloadWithoutWatchRoot` (`testConfigReload`):
/// `reload.yaml` copied into the config directory is loaded, and its
/// removal is loaded too. Tollgate refuses by default a reload that drops a
/// domain in force (`docs/envoy.md`, Differences; pinned in `reload.rs`);
/// `TOLLGATE_ALLOW_DOMAIN_REMOVAL` is envoyproxy/ratelimit's behaviour.
#[tokio::test]
async fn reload_without_watch_root() {
    let d = Deployment::integration(
        Redis::start(),
        &[
            ("RUNTIME_WATCH_ROOT", "false"),
            ("TOLLGATE_ALLOW_DOMAIN_REMOVAL", "true"),
        ],
    )
    .await;
    let mut check = Check::default();
    let block = d.ask(request("reload", &[&[("block", "foo")]], 1)).await;
    check.response(
        "reload block=foo before reload.yaml",
        &block,
        Code::Ok,
        &[NO_LIMIT],
        &[],
    );

    let reloads = d.server.log().matches("config reloaded").count();
    std::fs::copy(
        d.root.path().join("ratelimit/reload.yaml"),
        d.config_dir().join("reload.yaml"),
    )
    .expect("a writable config dir");
    assert!(
        wait_for_lines(&d, "config reloaded", reloads + 1).await,
        "reload.yaml was not loaded\n{}",
        d.server.log()
    );
    let key1 = d.ask(request("reload", &[&[("key1", "foo")]], 1)).await;
    check.response(
        "reload key1=foo after reload.yaml",
        &key1,
        Code::Ok,
        &[ok(50, Unit::Second, 49)],
        &[],
    );

    std::fs::remove_file(d.config_dir().join("reload.yaml")).expect("removed");
    if !wait_for_lines(&d, "config reloaded", reloads + 2).await {
        let log = d.server.log();
        let last = log.lines().rfind(|l| l.contains("reload")).unwrap_or("");
        check.failures.push(format!(
            "removing reload.yaml:\n    observed no reload within {RELOAD:?}: {last}\n    expected a reload"
        ));
    }
    // The domain went with its file.
    let key1 = d.ask(request("reload", &[&[("key1", "foo")]], 1)).await;
    check.response(
        "reload key1=foo after removing reload.yaml",
        &key1,
        Code::Ok,
        &[NO_LIMIT],
        &[],
    );
    check.finish();
}

/// `TestShareThreshold` (`testShareThreshold`) with `share_threshold.yaml`:
/// every value under `files/*` spends one budget of 10 an hour; values
/// under `files_no_share/*` have one each.
#[tokio::test]
async fn share_threshold() {
    let d = Deployment::integration(Redis::start(), &[]).await;
    let domain = "share-threshold-test";
    let mut check = in_one_window(Unit::Hour, async |_| {
        let mut check = Check::default();
        for i in 0..10 {
            let exchange = d
                .ask(request(domain, &[&[("files", "files/a.pdf")]], 1))
                .await;
            // As there, either: the shared budget may have been spent by an
            // earlier attempt in this window.
            let code = exchange.response.as_ref().map(|r| r.overall_code).ok();
            check.equal(
                &format!("files/a.pdf, hit {}: OK or OVER_LIMIT", i + 1),
                code.is_some_and(|c| c == Code::Ok as i32 || c == Code::OverLimit as i32),
                true,
            );
        }
        let exchange = d
            .ask(request(domain, &[&[("files", "files/b.csv")]], 1))
            .await;
        check.response(
            "files/b.csv after 10 files/a.pdf",
            &exchange,
            Code::OverLimit,
            &[over(10, Unit::Hour)],
            &[],
        );
        check
    })
    .await;
    let base = fresh();
    for i in 0..10 {
        let value = format!("files_no_share/{base}-{i}");
        let exchange = d
            .ask(request(domain, &[&[("files_no_share", &value)]], 1))
            .await;
        check.response(
            &format!("files_no_share value {}", i + 1),
            &exchange,
            Code::Ok,
            &[ok(10, Unit::Hour, 9)],
            &[],
        );
    }
    check.finish();
}

// ---------------------------------------------------------------------------
// test/redis/fixed_cache_impl_test.go, with tests/envoy_conformance/cache/.
//
// Its mocked Redis answers each INCRBY with a count; here real requests
// reach that count first ("prime"), and the stats checked are those counted
// by the request under test alone.

const CACHE: &str = "cache";

/// Sends `request` to bring a counter to where the Go test's mock starts.
async fn prime(d: &Deployment, check: &mut Check, case: &str, request: RateLimitRequest) {
    if let Err(status) = d.ask(request).await.response {
        check
            .failures
            .push(format!("{case}: priming failed: {status:?}"));
    }
}

/// `testRedis`: its three requests.
async fn redis_sequence(d: &Deployment) -> Check {
    let mut check = in_one_window(Unit::Second, async |v| {
        let mut check = Check::default();
        let case = "TestRedis key=value, 10 a second, 4 spent";
        prime(d, &mut check, case, request("domain", &[&[("key", &v)]], 4)).await;
        let start = d.stats(&["domain", "key"]).await;
        let exchange = d.ask(request("domain", &[&[("key", &v)]], 1)).await;
        check.response(case, &exchange, Code::Ok, &[ok(10, Unit::Second, 5)], &[]);
        let stats = d.stats(&["domain", "key"]).await.since(start);
        check.equal(&format!("{case}: stats"), stats, Stats::of(1, 0, 0, 1));
        check
    })
    .await;

    let phase = in_one_window(Unit::Minute, async |v| {
        let mut check = Check::default();
        let case = "TestRedis key2 and key2/subkey2 (10 a minute, 10 spent), hits 0 and 1";
        let nested: &[(&str, &str)] = &[("key2", &v), ("subkey2", &v)];
        prime(d, &mut check, case, request("domain", &[nested], 10)).await;
        let labels = ["domain", "key2", "subkey2"];
        let start = d.stats(&labels).await;
        let exchange = d
            .ask(request_per_descriptor(
                "domain",
                &[(&[("key2", &v)], 0), (nested, 1)],
            ))
            .await;
        check.response(
            case,
            &exchange,
            Code::OverLimit,
            &[NO_LIMIT, over(10, Unit::Minute)],
            &[],
        );
        let stats = d.stats(&labels).await.since(start);
        check.equal(&format!("{case}: stats"), stats, Stats::of(1, 1, 0, 0));
        check
    })
    .await;
    check.merge(phase);

    // The hour's window lies inside the day's.
    let phase = in_one_window(Unit::Hour, async |v| {
        let mut check = Check::default();
        let case = "TestRedis key3 (10 an hour, 11 counted) and key3/subkey3 \
                    (10 a day, 12 counted), hits 0 and 1";
        let top: &[(&str, &str)] = &[("key3", &v)];
        let nested: &[(&str, &str)] = &[("key3", &v), ("subkey3", &v)];
        // Over the limit, envoyproxy/ratelimit still counts: 10 + 1, 10 + 2.
        prime(d, &mut check, case, request("domain", &[top], 10)).await;
        prime(d, &mut check, case, request("domain", &[top], 1)).await;
        prime(d, &mut check, case, request("domain", &[nested], 10)).await;
        prime(d, &mut check, case, request("domain", &[nested], 2)).await;
        let start_top = d.stats(&["domain", "key3"]).await;
        let start_nested = d.stats(&["domain", "key3", "subkey3"]).await;
        let exchange = d
            .ask(request_per_descriptor("domain", &[(top, 0), (nested, 1)]))
            .await;
        check.response(
            case,
            &exchange,
            Code::OverLimit,
            &[over(10, Unit::Hour), over(10, Unit::Day)],
            &[],
        );
        let top_stats = d.stats(&["domain", "key3"]).await.since(start_top);
        let nested_stats = d
            .stats(&["domain", "key3", "subkey3"])
            .await
            .since(start_nested);
        check.equal(&format!("{case}: key3 stats"), top_stats, Stats::default());
        check.equal(
            &format!("{case}: key3/subkey3 stats"),
            nested_stats,
            Stats::of(1, 1, 0, 0),
        );
        check
    })
    .await;
    check.merge(phase);
    check
}

/// `TestRedis` (`WithoutPerSecondRedis`).
#[tokio::test]
async fn redis_cache() {
    let d = Deployment::with_config(CACHE, Redis::start(), &[]).await;
    redis_sequence(&d).await.finish();
}

/// `TestRedisWithJitter`: a jittered expiry changes no answer.
#[tokio::test]
async fn redis_cache_with_jitter() {
    let d = Deployment::with_config(
        CACHE,
        Redis::start(),
        &[("EXPIRATION_JITTER_MAX_SECONDS", "3600")],
    )
    .await;
    redis_sequence(&d).await.finish();
}

/// The three (or, with `local_cache`, four) requests of `TestNearLimit` and
/// `TestOverLimitWithLocalCache` on `key` (15 an hour): the counts 10, 12
/// and 15 are reached before each, and each is 1 hit. A shadow rule answers
/// `OK` and counts its over-limit hits in `shadow_mode`
/// (`TestOverLimitWithLocalCacheShadowRule`).
async fn near_limit_sequence(d: &Deployment, key: &'static str, local_cache: bool) -> Check {
    in_one_window(Unit::Hour, async |v| {
        let mut check = Check::default();
        let one = || request("domain", &[&[(key, &v)]], 1);
        let shadow = key.starts_with("shadow");
        let over_code = if shadow { Code::Ok } else { Code::OverLimit };
        let over_want = Want {
            code: over_code,
            ..over(15, Unit::Hour)
        };
        let over_stats = Stats {
            shadow_mode: u64::from(shadow),
            ..Stats::of(1, 1, 0, 0)
        };
        let mut steps = vec![
            (10, ok(15, Unit::Hour, 4), Stats::of(1, 0, 0, 1)),
            (1, ok(15, Unit::Hour, 2), Stats::of(1, 0, 1, 1)),
            (2, over_want, over_stats),
        ];
        if local_cache {
            steps.push((0, over_want, over_stats));
        }
        for (n, (spend, want, stats)) in steps.into_iter().enumerate() {
            let case = format!("{key} (15 an hour), request {}", n + 1);
            if spend > 0 {
                prime(
                    d,
                    &mut check,
                    &case,
                    request("domain", &[&[(key, &v)]], spend),
                )
                .await;
            }
            let start = d.stats(&["domain", key]).await;
            let exchange = d.ask(one()).await;
            check.response(&case, &exchange, want.code, &[want], &[]);
            let counted = d.stats(&["domain", key]).await.since(start);
            check.equal(&format!("{case}: stats"), counted, stats);
        }
        check
    })
    .await
}

/// `TestNearLimit`: near and over counts, and requests of several hits.
#[tokio::test]
async fn near_limit() {
    let d = Deployment::with_config(CACHE, Redis::start(), &[]).await;
    let mut check = near_limit_sequence(&d, "key4", false).await;
    // (key, limit a second, count before, hits, answer, stats)
    let cases: [(&str, u32, u32, u32, Want, Stats); 6] = [
        (
            "key5",
            20,
            2,
            3,
            ok(20, Unit::Second, 15),
            Stats::of(3, 0, 0, 3),
        ),
        (
            "key6",
            8,
            5,
            2,
            ok(8, Unit::Second, 1),
            Stats::of(2, 0, 1, 2),
        ),
        (
            "key7",
            20,
            16,
            3,
            ok(20, Unit::Second, 1),
            Stats::of(3, 0, 3, 3),
        ),
        (
            "key8",
            20,
            19,
            3,
            over(20, Unit::Second),
            Stats::of(3, 2, 1, 0),
        ),
        (
            "key9",
            20,
            15,
            7,
            over(20, Unit::Second),
            Stats::of(7, 2, 4, 0),
        ),
        (
            "key10",
            10,
            27,
            3,
            over(10, Unit::Second),
            Stats::of(3, 3, 0, 0),
        ),
    ];
    for (key, limit, spent, hits, want, stats) in cases {
        let phase = in_one_window(Unit::Second, async |v| {
            let mut check = Check::default();
            let case = format!("{key} ({limit} a second, {spent} counted), {hits} hits");
            // Up to the limit, then past it: envoyproxy/ratelimit counts a
            // denied request's hits.
            let first = spent.min(limit);
            prime(
                &d,
                &mut check,
                &case,
                request("domain", &[&[(key, &v)]], first),
            )
            .await;
            if spent > first {
                let rest = request("domain", &[&[(key, &v)]], spent - first);
                prime(&d, &mut check, &case, rest).await;
            }
            let start = d.stats(&["domain", key]).await;
            let exchange = d.ask(request("domain", &[&[(key, &v)]], hits)).await;
            check.response(&case, &exchange, want.code, &[want], &[]);
            let counted = d.stats(&["domain", key]).await.since(start);
            check.equal(&format!("{case}: stats"), counted, stats);
            check
        })
        .await;
        check.merge(phase);
    }
    check.finish();
}

/// `TestOverLimitWithLocalCache`: the fourth request is answered from the
/// local cache, and counted as over.
#[tokio::test]
async fn over_limit_with_local_cache() {
    let d = Deployment::with_config(
        CACHE,
        Redis::start(),
        &[("LOCAL_CACHE_SIZE_IN_BYTES", "1000")],
    )
    .await;
    near_limit_sequence(&d, "key4", true).await.finish();
}

/// `TestOverLimitWithLocalCacheShadowRule`.
#[tokio::test]
async fn over_limit_with_local_cache_shadow_rule() {
    let d = Deployment::with_config(
        CACHE,
        Redis::start(),
        &[("LOCAL_CACHE_SIZE_IN_BYTES", "1000")],
    )
    .await;
    near_limit_sequence(&d, "shadow4", true).await.finish();
}

/// `TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig`: two
/// descriptors (15 and 14 an hour) from 10 each; when one would go over,
/// only that one is charged.
#[tokio::test]
async fn over_limit_with_stop_cache_key_increment_when_overlimit() {
    let d = Deployment::with_config(
        CACHE,
        Redis::start(),
        &[
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1000"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ],
    )
    .await;
    in_one_window(Unit::Hour, async |v| {
        let mut check = Check::default();
        let four: &[(&str, &str)] = &[("stop4", &v)];
        let five: &[(&str, &str)] = &[("stop5", &v)];
        let both = |hits| request_per_descriptor("domain", &[(four, hits), (five, hits)]);
        prime(&d, &mut check, "stop4 and stop5 to 10", both(10)).await;
        let steps = [
            (
                1,
                Code::Ok,
                [ok(15, Unit::Hour, 4), ok(14, Unit::Hour, 3)],
                [Stats::of(1, 0, 0, 1), Stats::of(1, 0, 0, 1)],
            ),
            (
                2,
                Code::Ok,
                [ok(15, Unit::Hour, 2), ok(14, Unit::Hour, 1)],
                [Stats::of(2, 0, 1, 2), Stats::of(2, 0, 2, 2)],
            ),
            (
                2,
                Code::OverLimit,
                [ok(15, Unit::Hour, 2), over(14, Unit::Hour)],
                [Stats::of(2, 0, 1, 2), Stats::of(2, 1, 1, 0)],
            ),
        ];
        for (n, (hits, overall, wants, stats)) in steps.into_iter().enumerate() {
            let case = format!(
                "stop4 (15 an hour) and stop5 (14), request {}, {hits} hits each",
                n + 1
            );
            let start4 = d.stats(&["domain", "stop4"]).await;
            let start5 = d.stats(&["domain", "stop5"]).await;
            let exchange = d.ask(both(hits)).await;
            check.response(&case, &exchange, overall, &wants, &[]);
            let counted4 = d.stats(&["domain", "stop4"]).await.since(start4);
            let counted5 = d.stats(&["domain", "stop5"]).await.since(start5);
            check.equal(&format!("{case}: stop4 stats"), counted4, stats[0]);
            check.equal(&format!("{case}: stop5 stats"), counted5, stats[1]);
        }
        check
    })
    .await
    .finish();
}

// ---------------------------------------------------------------------------
// test/service/ratelimit_test.go, with tests/envoy_conformance/service/.
//
// Its mocked cache returns statuses without a reset and, for a shadow or
// quota rule, whatever the case needs; here the cache is real, so each case
// spends the budgets that make its mocked statuses true and expects what
// envoyproxy/ratelimit's cache answers then (a reset with every limit).

const SERVICE: &str = "service";

/// Spends all of `key`'s `limit` in domain `domain` for value `v`.
async fn spend(d: &Deployment, check: &mut Check, domain: &str, key: &str, v: &str, limit: u32) {
    prime(
        d,
        check,
        &format!("spending {key}"),
        request(domain, &[&[(key, v)]], limit),
    )
    .await;
}

/// `TestService`: an unknown domain, a spent named limit beside a
/// descriptor no rule matches, and the same after a config that fails to
/// load (the last one stays; order does not matter).
#[tokio::test]
async fn service() {
    let d = Deployment::with_config(SERVICE, Redis::start(), &[]).await;
    let mut check = Check::default();
    let first = d
        .ask(request("test-domain", &[&[("hello", "world")]], 1))
        .await;
    check.response(
        "test-domain hello=world",
        &first,
        Code::Ok,
        &[NO_LIMIT],
        &[],
    );

    let spent = over(10, Unit::Minute).named("key_name");
    let phase = in_one_window(Unit::Minute, async |v| {
        let mut check = Check::default();
        spend(&d, &mut check, "different-domain", "foo", &v, 10).await;
        let exchange = d
            .ask(request(
                "different-domain",
                &[&[("foo", &v)], &[("hello", "world")]],
                1,
            ))
            .await;
        check.response(
            "different-domain foo (spent) and hello",
            &exchange,
            Code::OverLimit,
            &[spent, NO_LIMIT],
            &[],
        );

        let bad = format!("bad-{v}.yaml");
        std::fs::write(d.config_dir().join(&bad), "domain: [").expect("writable");
        let failed = d
            .server
            .wait_for_log(&["config reload failed", &bad], RELOAD)
            .await;
        assert!(failed, "{bad} was not read\n{}", d.server.log());
        let exchange = d
            .ask(request(
                "different-domain",
                &[&[("hello", "world")], &[("foo", &v)]],
                1,
            ))
            .await;
        check.response(
            "after a failed load: different-domain hello and foo (spent)",
            &exchange,
            Code::OverLimit,
            &[NO_LIMIT, spent],
            &[],
        );
        // A later attempt (this one straddled a window) writes its own bad
        // file, and waits for the failure that names it.
        std::fs::remove_file(d.config_dir().join(&bad)).expect("removable");
        check
    })
    .await;
    check.merge(phase);
    check.finish();
}

/// `TestServiceGlobalShadowMode`: with `SHADOW_MODE`, a descriptor over
/// its limit keeps `OVER_LIMIT`; only the overall code is `OK`.
#[tokio::test]
async fn service_global_shadow_mode() {
    let d = Deployment::with_config(SERVICE, Redis::start(), &[("SHADOW_MODE", "true")]).await;
    in_one_window(Unit::Minute, async |v| {
        let mut check = Check::default();
        spend(&d, &mut check, "different-domain", "foo", &v, 10).await;
        let exchange = d
            .ask(request(
                "different-domain",
                &[&[("foo", &v)], &[("hello", "world")]],
                1,
            ))
            .await;
        check.response(
            "SHADOW_MODE: foo (spent) and hello",
            &exchange,
            Code::Ok,
            &[over(10, Unit::Minute).named("key_name"), NO_LIMIT],
            &[],
        );
        check
    })
    .await
    .finish();
}

/// `TestRuleShadowMode` and `TestMixedRuleShadowMode`: a `shadow_mode` rule
/// over its limit answers `OK` with nothing left; a plain one beside it
/// still denies.
#[tokio::test]
async fn rule_shadow_mode() {
    let d = Deployment::with_config(SERVICE, Redis::start(), &[]).await;
    in_one_window(Unit::Minute, async |v| {
        let mut check = Check::default();
        for key in ["shadow_foo", "shadow_hello", "regular_hello"] {
            spend(&d, &mut check, "different-domain", key, &v, 10).await;
        }
        let exchange = d
            .ask(request(
                "different-domain",
                &[&[("shadow_foo", &v)], &[("shadow_hello", &v)]],
                1,
            ))
            .await;
        check.response(
            "TestRuleShadowMode: two spent shadow rules",
            &exchange,
            Code::Ok,
            &[ok(10, Unit::Minute, 0), ok(10, Unit::Minute, 0)],
            &[],
        );
        let exchange = d
            .ask(request(
                "different-domain",
                &[&[("shadow_foo", &v)], &[("regular_hello", &v)]],
                1,
            ))
            .await;
        check.response(
            "TestMixedRuleShadowMode: a spent shadow rule and a spent plain one",
            &exchange,
            Code::OverLimit,
            &[ok(10, Unit::Minute, 0), over(10, Unit::Minute)],
            &[],
        );
        check
    })
    .await
    .finish();
}

/// The header tests: with `LIMIT_RESPONSE_HEADERS_ENABLED`, the limit,
/// what is left and the reset of the descriptor closest to its limit (a
/// denying one first), under `names`.
async fn ratelimit_headers(env: &[(&str, &str)], names: [&'static str; 3]) {
    let d = Deployment::with_config(SERVICE, Redis::start(), env).await;
    in_one_window(Unit::Minute, async |v| {
        let mut check = Check::default();
        spend(&d, &mut check, "different-domain", "foo", &v, 10).await;
        let exchange = d
            .ask(request(
                "different-domain",
                &[&[("foo", &v)], &[("hello", "world")]],
                1,
            ))
            .await;
        check.response(
            "headers: foo (spent) and hello",
            &exchange,
            Code::OverLimit,
            &[over(10, Unit::Minute).named("key_name"), NO_LIMIT],
            &[
                (names[0], HeaderWant::Value("10".into())),
                (names[1], HeaderWant::Value("0".into())),
                (names[2], HeaderWant::Reset(Unit::Minute)),
            ],
        );
        check
    })
    .await
    .finish();
}

/// `TestServiceWithCustomRatelimitHeaders`.
#[tokio::test]
async fn service_with_custom_ratelimit_headers() {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "A-Ratelimit-Limit"),
        ("LIMIT_REMAINING_HEADER", "A-Ratelimit-Remaining"),
        ("LIMIT_RESET_HEADER", "A-Ratelimit-Reset"),
    ];
    let names = [
        "A-Ratelimit-Limit",
        "A-Ratelimit-Remaining",
        "A-Ratelimit-Reset",
    ];
    ratelimit_headers(&env, names).await;
}

/// `TestServiceWithDefaultRatelimitHeaders`.
#[tokio::test]
async fn service_with_default_ratelimit_headers() {
    let env = [("LIMIT_RESPONSE_HEADERS_ENABLED", "true")];
    let names = ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"];
    ratelimit_headers(&env, names).await;
}

/// `TestUnlimited`: a limited descriptor, one no rule matches and an
/// unlimited one (`OK`, no limit, 4294967295 left).
#[tokio::test]
async fn unlimited() {
    let d = Deployment::with_config(SERVICE, Redis::start(), &[]).await;
    let mut check = Check::default();
    let v = fresh();
    let exchange = d
        .ask(request(
            "some-domain",
            &[&[("foo", &v)], &[("hello", "world")], &[("baz", "qux")]],
            1,
        ))
        .await;
    let unlimited = Want {
        code: Code::Ok,
        limit: None,
        remaining: u32::MAX,
    };
    check.response(
        "some-domain foo, hello and baz (unlimited)",
        &exchange,
        Code::Ok,
        &[ok(10, Unit::Minute, 9), NO_LIMIT, unlimited],
        &[],
    );
    check.finish();
}

/// `TestCacheError`: when Redis fails, envoyproxy/ratelimit answers a plain
/// Go error (`UNKNOWN`) and Envoy's `failure_mode_deny` decides (allow, by
/// default). Tollgate decides by each rule's failure policy instead, a
/// documented difference (`docs/envoy.md`, Differences): with the default,
/// `local`, this instance counts on from what Redis last reported.
#[tokio::test]
async fn cache_error_is_decided_by_the_failure_policy() {
    let mut d = Deployment::with_config(SERVICE, Redis::start(), &[]).await;
    let mut check = Check::default();
    let foo = || request("different-domain", &[&[("foo", "bar")]], 1);
    // The listeners open before the store connects: one answer from Redis
    // first, so that Redis is killed under a running service.
    let up = d.ask(foo()).await;
    check.response(
        "different-domain foo=bar with Redis up",
        &up,
        Code::Ok,
        &[ok(10, Unit::Minute, 9).named("key_name")],
        &[],
    );
    d.redis.kill();
    let down = d.ask(foo()).await;
    check.response(
        "different-domain foo=bar with Redis down",
        &down,
        Code::Ok,
        &[ok(10, Unit::Minute, 8).named("key_name")],
        &[],
    );
    check.finish();
}

/// A quota-mode case: its name, what is spent beforehand (key, hits), the
/// two keys asked, and the expected overall code and statuses.
type QuotaCase = (
    &'static str,
    &'static [(&'static str, u32)],
    [&'static str; 2],
    Code,
    [Want; 2],
);

/// The per-descriptor quota-mode tests: `TestServicePerDescriptorQuotaMode`,
/// `TestServiceMixedPerDescriptorModes`,
/// `TestServiceMixedPerDescriptorModesUnderLimit`,
/// `TestServiceQuotaModeOnlyAllOverTheLimit` and
/// `TestServiceQuotaModeOnlySomeOverTheLimit`. A request is over its limit
/// when a rate-limit descriptor is, or when every quota-mode one is.
#[tokio::test]
async fn per_descriptor_quota_mode() {
    let d = Deployment::with_config(SERVICE, Redis::start(), &[]).await;
    let quota = "quota-domain";
    let mut check = Check::default();
    // (case, spent beforehand, keys asked, overall, statuses)
    let cases: [QuotaCase; 5] = [
        (
            "TestServicePerDescriptorQuotaMode: regular (spent) and quota",
            &[("regular", 5)],
            ["regular", "quota"],
            Code::OverLimit,
            [over(5, Unit::Minute), ok(3, Unit::Minute, 2)],
        ),
        (
            "TestServiceMixedPerDescriptorModes: regular and quota (spent)",
            &[("quota", 3)],
            ["regular", "quota"],
            Code::OverLimit,
            [ok(5, Unit::Minute, 4), over(3, Unit::Minute)],
        ),
        (
            "TestServiceMixedPerDescriptorModesUnderLimit: regular and quota",
            &[],
            ["regular", "quota"],
            Code::Ok,
            [ok(5, Unit::Minute, 4), ok(3, Unit::Minute, 2)],
        ),
        (
            "TestServiceQuotaModeOnlyAllOverTheLimit: quota1 and quota2 (both spent)",
            &[("quota1", 5), ("quota2", 3)],
            ["quota1", "quota2"],
            Code::OverLimit,
            [over(5, Unit::Minute), over(3, Unit::Minute)],
        ),
        (
            "TestServiceQuotaModeOnlySomeOverTheLimit: quota1 (spent) and quota2",
            &[("quota1", 5)],
            ["quota1", "quota2"],
            Code::Ok,
            [over(5, Unit::Minute), ok(3, Unit::Minute, 2)],
        ),
    ];
    for (case, spent, keys, overall, wants) in cases {
        let phase = in_one_window(Unit::Minute, async |v| {
            let mut check = Check::default();
            for (key, limit) in spent {
                spend(&d, &mut check, quota, key, &v, *limit).await;
            }
            let exchange = d
                .ask(request(quota, &[&[(keys[0], &v)], &[(keys[1], &v)]], 1))
                .await;
            check.response(case, &exchange, overall, &wants, &[]);
            check
        })
        .await;
        check.merge(phase);
    }
    check.finish();
}

/// `TestServiceGlobalQuotaMode`: with `QUOTA_MODE`, every rule is a quota;
/// two spent ones deny.
#[tokio::test]
async fn service_global_quota_mode() {
    let d = Deployment::with_config(SERVICE, Redis::start(), &[("QUOTA_MODE", "true")]).await;
    in_one_window(Unit::Minute, async |v| {
        let mut check = Check::default();
        spend(&d, &mut check, "different-domain", "foo", &v, 10).await;
        spend(&d, &mut check, "different-domain", "regular_hello", &v, 10).await;
        let exchange = d
            .ask(request(
                "different-domain",
                &[&[("foo", &v)], &[("regular_hello", &v)]],
                1,
            ))
            .await;
        check.response(
            "QUOTA_MODE: foo and regular_hello, both spent",
            &exchange,
            Code::OverLimit,
            &[
                over(10, Unit::Minute).named("key_name"),
                over(10, Unit::Minute),
            ],
            &[],
        );
        check
    })
    .await
    .finish();
}

/// `TestServiceQuotaModeWithShadowMode` and
/// `TestServiceMixedModeWithShadowMode`: `SHADOW_MODE` turns the overall
/// code to `OK`, the statuses stay.
#[tokio::test]
async fn quota_mode_with_global_shadow_mode() {
    let d = Deployment::with_config(SERVICE, Redis::start(), &[("SHADOW_MODE", "true")]).await;
    let quota = "quota-domain";
    in_one_window(Unit::Minute, async |v| {
        let mut check = Check::default();
        for (key, limit) in [("regular", 5), ("quota", 3), ("quota1", 5), ("quota2", 3)] {
            spend(&d, &mut check, quota, key, &v, limit).await;
        }
        let exchange = d
            .ask(request(quota, &[&[("quota1", &v)], &[("quota2", &v)]], 1))
            .await;
        check.response(
            "TestServiceQuotaModeWithShadowMode: quota1 and quota2, both spent",
            &exchange,
            Code::Ok,
            &[over(5, Unit::Minute), over(3, Unit::Minute)],
            &[],
        );
        let exchange = d
            .ask(request(quota, &[&[("regular", &v)], &[("quota", &v)]], 1))
            .await;
        check.response(
            "TestServiceMixedModeWithShadowMode: regular and quota, both spent",
            &exchange,
            Code::Ok,
            &[over(5, Unit::Minute), over(3, Unit::Minute)],
            &[],
        );
        check
    })
    .await
    .finish();
}
