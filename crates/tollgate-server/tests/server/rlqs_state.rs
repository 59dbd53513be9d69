//! The Rate Limit Quota Service's state: shared by several Tollgates behind
//! one Service (replicas, real `tollgate serve` processes, on one real
//! redis-server, with Envoys on different replicas), and seen on the live
//! page and in the recording. The logic tests speak the RLQS stream through
//! tonic, as an Envoy that applies assignments as Envoy 1.40 does; one test
//! runs real Envoys.

use crate::common;
use crate::live_page;
use crate::real_envoy;

use std::net::SocketAddr;

use common::{Redis, Server, tollgate};
use envoy_types::pb::envoy::r#type::v3::RateLimitStrategy;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// 10 a day per user (`real_envoy::POLICY`), rule `name_per-user.user`.
const RULE: &str = "name_per-user.user";

/// Two replicas of `tollgate serve` on `redis`.
fn replicas(redis: &Redis) -> (Server, Server) {
    let url = redis.url();
    let start = || Server::with_config(&[("edge.yaml", real_envoy::POLICY)], &["--redis", &url]);
    (start(), start())
}

/// One Envoy's bucket `{name: per-user, user: alice}` as Envoy 1.40 keeps
/// it, and its stream to one replica.
struct SimEnvoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
    /// The strategy in force; before the first, everything is admitted
    /// (`no_assignment_behavior: ALLOW_ALL`, as `deploy/envoy/rlqs.yaml`).
    strategy: Option<Strategy>,
    tokens: u32,
    allowed: u64,
    denied: u64,
    /// Everything reported so far: admitted, denied.
    reported: (u64, u64),
}

impl SimEnvoy {
    async fn connect(replica: SocketAddr) -> SimEnvoy {
        let (reports, answers) = stream(replica).await;
        SimEnvoy {
            reports,
            answers,
            strategy: None,
            tokens: 0,
            allowed: 0,
            denied: 0,
            reported: (0, 0),
        }
    }

    /// Opens a new stream to `replica`, keeping the bucket: what Envoy does
    /// when its stream fails.
    async fn reconnect(&mut self, replica: SocketAddr) {
        (self.reports, self.answers) = stream(replica).await;
    }

    fn admit(&mut self) -> bool {
        let admitted = match self.strategy {
            None => true,
            Some(Strategy::TokenBucket(_)) if self.tokens > 0 => {
                self.tokens -= 1;
                true
            }
            _ => false,
        };
        if admitted {
            self.allowed += 1;
        } else {
            self.denied += 1;
        }
        admitted
    }

    /// Sends the usage since the last report and applies the answer.
    async fn report(&mut self) {
        self.reported.0 += self.allowed;
        self.reported.1 += self.denied;
        let report = RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(alice()),
                time_elapsed: None,
                num_requests_allowed: std::mem::take(&mut self.allowed),
                num_requests_denied: std::mem::take(&mut self.denied),
            }],
        };
        self.reports.send(report).await.expect("the stream is open");
        let answer = self
            .answers
            .message()
            .await
            .expect("an answer")
            .expect("the stream is open");
        for action in answer.bucket_action {
            assert_eq!(action.bucket_id, Some(alice()));
            let Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                rate_limit_strategy:
                    Some(RateLimitStrategy {
                        strategy: Some(strategy),
                    }),
                ..
            })) = action.bucket_action
            else {
                panic!("not an assignment: {action:?}");
            };
            self.apply(strategy);
        }
    }

    /// As Envoy applies an assignment: the same token bucket keeps its
    /// tokens, another starts as full in proportion as the one it
    /// replaces, and one after a blanket rule starts full.
    fn apply(&mut self, strategy: Strategy) {
        if let Strategy::TokenBucket(new) = &strategy {
            self.tokens = match &self.strategy {
                Some(Strategy::TokenBucket(old)) if old == new => self.tokens,
                Some(Strategy::TokenBucket(old)) => {
                    let kept = u64::from(self.tokens) * u64::from(new.max_tokens)
                        / u64::from(old.max_tokens.max(1));
                    u32::try_from(kept).expect("at most max_tokens")
                }
                _ => new.max_tokens,
            };
        }
        self.strategy = Some(strategy);
    }

    fn denies_all(&self) -> bool {
        self.strategy == Some(Strategy::BlanketRule(BlanketRule::DenyAll.into()))
    }
}

fn alice() -> BucketId {
    BucketId {
        bucket: [("name", "per-user"), ("user", "alice")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    }
}

async fn stream(
    replica: SocketAddr,
) -> (
    mpsc::Sender<RateLimitQuotaUsageReports>,
    Streaming<RateLimitQuotaResponse>,
) {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{replica}"))
        .await
        .expect("the replica accepts");
    let (reports, rx) = mpsc::channel(4);
    let answers = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
        .expect("a stream")
        .into_inner();
    (reports, answers)
}

/// One round: three requests through each Envoy, then its report; the
/// number admitted. An Envoy meeting the bucket reports it at once, as
/// Envoy does, so one request per Envoy comes before its first assignment.
async fn round(envoys: &mut [&mut SimEnvoy]) -> u32 {
    let mut admitted = 0;
    for envoy in envoys.iter_mut() {
        for _ in 0..3 {
            admitted += u32::from(envoy.admit());
            if envoy.strategy.is_none() {
                envoy.report().await;
            }
        }
        envoy.report().await;
    }
    admitted
}

/// The value of rule `RULE`'s gauge `name` on `server`'s `/metrics`.
async fn gauge(server: &Server, name: &str) -> Option<f64> {
    let text = reqwest::get(server.url("/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(name) && l.contains(&format!("rule=\"{RULE}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The quotas of `server`'s `/live.json`.
async fn quotas(server: &Server) -> Vec<serde_json::Value> {
    let live: serde_json::Value = reqwest::get(server.url("/live.json"))
        .await
        .expect("live.json answers")
        .json()
        .await
        .expect("JSON");
    live["quotas"].as_array().expect("a list of quotas").clone()
}

/// Each replica alone would grant its Envoy the whole 10; together they
/// grant 10 in all, plus the one request each Envoy admits before its
/// first assignment, and each replica sees both Envoys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_on_two_replicas_share_one_quota() {
    let redis = Redis::start();
    let (one, two) = replicas(&redis);
    let mut a = SimEnvoy::connect(one.grpc).await;
    let mut b = SimEnvoy::connect(two.grpc).await;
    let mut admitted = 0;
    for _ in 0..15 {
        admitted += round(&mut [&mut a, &mut b]).await;
    }
    assert!(
        (10..=12).contains(&admitted),
        "{admitted} admitted through two replicas for a quota of 10\n{}\n{}",
        one.log(),
        two.log()
    );
    assert!(a.denies_all() && b.denies_all(), "the window is spent");
    for replica in [&one, &two] {
        assert_eq!(
            gauge(replica, "tollgate_rlqs_subscriptions").await,
            Some(2.0),
            "each replica sees both Envoys"
        );
        let live = quotas(replica).await;
        assert_eq!(live[0]["envoys"], 2, "{live:?}");
    }
}

/// A replica killed mid-window: its Envoy's stream fails, the Envoy opens
/// one to the other replica with its bucket as it was, and the fleet still
/// admits no more than the quota's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_envoys_move_to_the_other_and_the_quota_holds() {
    let redis = Redis::start();
    let (one, two) = replicas(&redis);
    let mut a = SimEnvoy::connect(one.grpc).await;
    let mut b = SimEnvoy::connect(two.grpc).await;
    let mut admitted = 0;
    for _ in 0..2 {
        admitted += round(&mut [&mut a, &mut b]).await;
    }
    assert!(admitted < 10, "{admitted}: the window is not spent yet");
    drop(one);
    a.reconnect(two.grpc).await;
    for _ in 0..15 {
        admitted += round(&mut [&mut a, &mut b]).await;
    }
    assert!(
        admitted <= 12,
        "{admitted} admitted for a quota of 10 across a replica's loss\n{}",
        two.log()
    );
    assert!(a.denies_all() && b.denies_all(), "the window is spent");
}

/// Real Envoys, each streaming to its own replica: one user's 10 a day
/// through both is 10 to 12 admitted, as through one Tollgate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_envoys_on_two_replicas_share_one_quota() {
    let Some(binary) = real_envoy::envoy() else {
        return;
    };
    let redis = Redis::start();
    let (one, two) = replicas(&redis);
    let up = real_envoy::upstream().await;
    let a = real_envoy::Envoy::start(&binary, one.grpc, up).await;
    let b = real_envoy::Envoy::start(&binary, two.grpc, up).await;
    let client = reqwest::Client::new();
    let report = real_envoy::REPORT;
    let reached = real_envoy::drive(&client, &[&a, &b], "alice", 8 * report, |n| n >= 10).await;
    assert!(
        reached >= 10,
        "alice had {reached} of her 10 within 8 reports"
    );
    let more = real_envoy::drive(&client, &[&a, &b], "alice", 2 * report, |_| false).await;
    assert!(
        reached + more <= 12,
        "alice had {} requests through two Envoys on two replicas for a quota of 10",
        reached + more
    );
}

/// Each report of a bucket is recorded as one line of its descriptor with
/// the requests Envoy saw, and `simulate` replays them against the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_usage_is_recorded_and_replays() {
    let recording = tempfile::tempdir().expect("a temp dir");
    let path = recording.path().join("requests.ndjson");
    let record = path.to_str().expect("UTF-8");
    let server = Server::with_config(&[("edge.yaml", real_envoy::POLICY)], &["--record", record]);
    let mut a = SimEnvoy::connect(server.grpc).await;
    for _ in 0..5 {
        round(&mut [&mut a]).await;
    }
    // The first report (one request, at once), the rest of the first
    // round's, then four rounds of three.
    let deadline = std::time::Instant::now() + common::STARTUP;
    let lines = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        if lines.len() >= 6 || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(lines.len(), 6, "{}", server.log());
    let entries = serde_json::json!([{"entries": [
        {"key": "name", "value": "per-user"},
        {"key": "user", "value": "alice"}
    ]}]);
    assert!(
        lines
            .iter()
            .all(|l| l["domain"] == "edge" && l["descriptors"] == entries)
    );
    let hits: u64 = lines
        .iter()
        .map(|l| l["hits_addend"].as_u64().expect("hits"))
        .sum();
    assert_eq!(hits, 5 * 3, "every request Envoy saw, admitted or denied");

    let config = server.config.as_ref().expect("a config dir").path();
    let output = tollgate()
        .arg("simulate")
        .arg("--policy")
        .arg(config)
        .args(["--requests", record, "--format", "json"])
        .output()
        .expect("simulate runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let rule = &report["rules"][0];
    assert_eq!(
        (rule["rule"].as_str(), rule["requests"].as_u64()),
        (Some(RULE), Some(6))
    );
}

/// The live page shows each rule's reported usage, its assignment and the
/// Envoys subscribed, in `/live.json` and rendered by a real browser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_shows_what_envoys_report_and_hold() {
    let server = Server::with_config(&[("edge.yaml", real_envoy::POLICY)], &[]);
    let mut a = SimEnvoy::connect(server.grpc).await;
    let mut b = SimEnvoy::connect(server.grpc).await;
    for _ in 0..6 {
        round(&mut [&mut a, &mut b]).await;
    }
    let (allowed, denied) = (a.reported.0 + b.reported.0, a.reported.1 + b.reported.1);
    assert!(denied > 0, "the window is spent: some were denied");
    let live = quotas(&server).await;
    assert_eq!(live.len(), 1, "{live:?}");
    let q = &live[0];
    assert_eq!(
        (&q["domain"], &q["rule"], &q["buckets"], &q["envoys"]),
        (&"edge".into(), &RULE.into(), &1.into(), &2.into())
    );
    assert_eq!(
        (&q["allowed"], &q["denied"]),
        (&allowed.into(), &denied.into())
    );
    // Spent: both Envoys hold DENY_ALL, no tokens.
    assert_eq!(q["assigned"], 0);

    let dom = live_page::rendered_dom(&server.url("/"));
    let table = live_page::rows(&dom, "quotas");
    let cells = live_page::row(&table, &["edge", RULE]);
    assert_eq!(
        cells[2..7],
        ["1", "2", &allowed.to_string(), &denied.to_string(), "0"],
        "{table:?}"
    );
}
