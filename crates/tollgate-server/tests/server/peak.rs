//! Issue 39, item 1, at the gRPC door: what can be answered fast is
//! answered first. A call the door will not check (past
//! `--max-checks-in-flight`, or decoded past three quarters of its
//! deadline) is still answered what is known without the store: a key the
//! deny cache knows is over gets its whole `OVER_LIMIT` answer, even with
//! `--overload-answer unavailable`; the rest get the overload answer, and no
//! store call.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_testkit::RedisServer;
use tonic::transport::Channel;

use crate::common::rls_request;

/// One limit per user: 1 per 10 minutes (Tollgate's format).
const POLICY: &str = "domain: d\nrules:\n  - name: per-user\n    match: [{ key: user }]\n    algorithm: fixed-window\n    limit: { requests: 1, per: 10m }\n";

async fn client(running: &tollgate_server::serve::Running) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr()))
        .await
        .expect("the gRPC listener accepts")
}

async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    user: &str,
) -> Result<RateLimitResponse, tonic::Status> {
    client
        .should_rate_limit(rls_request("d", &[&[("user", user)]]))
        .await
        .map(tonic::Response::into_inner)
}

/// `tollgate_checks_total` of the gRPC door with `result`.
async fn grpc_checks(running: &tollgate_server::serve::Running, result: &str) -> u64 {
    let text = crate::in_process::client()
        .get(format!("http://{}/metrics", running.http_addr()))
        .send()
        .await
        .expect("/metrics answers")
        .text()
        .await
        .unwrap();
    let series = format!("tollgate_checks_total{{api=\"grpc\",result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// An answer without its durations, which move with the clock.
fn timeless(mut answer: RateLimitResponse) -> RateLimitResponse {
    for status in &mut answer.statuses {
        status.duration_until_reset = None;
    }
    answer
        .response_headers_to_add
        .retain(|h| !h.key.eq_ignore_ascii_case("x-ratelimit-reset"));
    answer
}

#[tokio::test]
async fn a_key_known_over_is_answered_over_limit_while_every_place_is_held() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (running, _dir) = crate::in_process::start(
        &[("d.yaml", POLICY)],
        &[
            "--redis",
            &url,
            // Calls that wait for a paused Redis wait, rather than fall back.
            "--redis-timeout",
            "1m",
            "--body-read-timeout",
            "1h",
            "--max-checks-in-flight",
            "2",
            "--overload-answer",
            "unavailable",
        ],
    )
    .await;
    let mut client = client(&running).await;
    // Over its limit, in Redis's word: the deny cache knows it now.
    assert_eq!(
        call(&mut client, "over").await.unwrap().overall_code,
        Code::Ok as i32
    );
    let denied = call(&mut client, "over").await.unwrap();
    assert_eq!(denied.overall_code, Code::OverLimit as i32);
    // The answer of the full path, from the cache.
    let full = call(&mut client, "over").await.unwrap();
    assert_eq!(timeless(full.clone()), timeless(denied));

    // Every place held: calls of new keys wait for a Redis that answers
    // nobody. Of three, two hold the two places and one is past the bound.
    redis.cli(&["CLIENT", "PAUSE", "600000", "WRITE"]);
    let mut calls = JoinSet::new();
    for user in ["a", "b", "c"] {
        let mut client = client.clone();
        calls.spawn(async move { call(&mut client, user).await });
    }
    let shed = calls.join_next().await.expect("a call").expect("no panic");
    assert_eq!(
        shed.expect_err("past the bound, not known").code(),
        tonic::Code::Unavailable
    );

    let over_before = grpc_checks(&running, "over_limit").await;
    let known = call(&mut client, "over")
        .await
        .expect("known: answered, not UNAVAILABLE");
    assert_eq!(known.overall_code, Code::OverLimit as i32);
    assert_eq!(timeless(known), timeless(full), "the full path's answer");
    assert_eq!(
        grpc_checks(&running, "over_limit").await,
        over_before + 1,
        "counted as a check"
    );
    // Still past the bound for what is not known.
    assert_eq!(
        call(&mut client, "d").await.unwrap_err().code(),
        tonic::Code::Unavailable
    );

    redis.cli(&["CLIENT", "UNPAUSE"]);
    while let Some(held) = calls.join_next().await {
        let answer = held.unwrap().expect("answered once Redis is back");
        assert_eq!(answer.overall_code, Code::Ok as i32);
    }
    running.shutdown().await.expect("a clean shutdown");
}

/// A request body sent frame by frame as the test says.
type Frames = Result<Frame<Bytes>, Infallible>;

/// A `ShouldRateLimit` call over a connection of its own whose message is
/// sent but for its last byte, which is sent when `rest` is; its answer
/// once it comes.
async fn call_in_two_parts(
    addr: std::net::SocketAddr,
    request: RateLimitRequest,
    grpc_timeout: &str,
) -> (
    impl FnOnce(),
    tokio::task::JoinHandle<(Option<String>, Option<RateLimitResponse>)>,
) {
    let message = request.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&message);
    let last = framed.split_off(framed.len() - 1);
    let (frames, body) = mpsc::channel::<Frames>(2);
    frames
        .send(Ok(Frame::data(Bytes::from(framed))))
        .await
        .unwrap();
    let (mut sender, _driver) = crate::common::h2_connection(addr).await;
    let call = hyper::Request::post(
        "http://localhost/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    )
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("grpc-timeout", grpc_timeout)
    .body(StreamBody::new(ReceiverStream::new(body)))
    .unwrap();
    sender.ready().await.expect("the connection takes a stream");
    let answer = sender.send_request(call);
    let answer = tokio::spawn(async move {
        let _sender = sender;
        let response = answer.await.expect("an answer");
        let head_status = response.headers().get("grpc-status").cloned();
        let collected = response.into_body().collect().await.expect("a body");
        let status = head_status
            .or_else(|| {
                collected
                    .trailers()
                    .and_then(|t| t.get("grpc-status").cloned())
            })
            .map(|s| s.to_str().unwrap().to_owned());
        let bytes = collected.to_bytes();
        let message = (bytes.len() >= 5)
            .then(|| RateLimitResponse::decode(&bytes[5..]).expect("a RateLimitResponse"));
        (status, message)
    });
    let rest = move || {
        frames
            .try_send(Ok(Frame::data(Bytes::from(last))))
            .expect("room for the last byte");
    };
    (rest, answer)
}

#[tokio::test(start_paused = true)]
async fn a_call_decoded_past_three_quarters_of_its_deadline_is_not_checked() {
    let (running, _dir) = crate::in_process::start(
        &[("d.yaml", POLICY)],
        &["--body-read-timeout", "1h", "--max-checks-in-flight", "1"],
    )
    .await;
    let mut client = client(&running).await;
    let deadline = Duration::from_secs(100);
    let sent = Instant::now();
    let (rest, answer) = call_in_two_parts(
        running.grpc_addr(),
        rls_request("d", &[&[("user", "late")]]),
        "100S",
    )
    .await;
    // The call is in flight once it holds the one place: another call is
    // then past the bound. Until then, that other call is checked.
    let mut probes = 0;
    loop {
        probes += 1;
        let probe = call(&mut client, &format!("probe-{probes}")).await.unwrap();
        if probe.statuses.is_empty() {
            assert_eq!(probe.overall_code, Code::OverLimit as i32);
            break;
        }
        assert!(probes < 1000, "the held call never took its place");
    }
    // Its message completes past three quarters of its deadline.
    let late = sent + deadline * 3 / 4 + Duration::from_secs(1);
    tokio::time::advance(late.saturating_duration_since(Instant::now())).await;
    assert!(
        Instant::now() < sent + deadline,
        "still within its deadline"
    );
    rest();
    let (status, message) = answer.await.unwrap();
    assert_eq!(
        status.as_deref(),
        Some("0"),
        "answered, not DEADLINE_EXCEEDED"
    );
    let message = message.expect("a message");
    assert_eq!(
        message.overall_code,
        Code::OverLimit as i32,
        "the overload answer"
    );
    assert!(message.statuses.is_empty(), "not checked");
    // Nothing was charged: the key's one unit is still there.
    let checked = call(&mut client, "late").await.unwrap();
    assert_eq!(checked.overall_code, Code::Ok as i32);
    assert_eq!(
        checked.statuses[0].limit_remaining, 0,
        "its one unit, spent now"
    );
    assert_eq!(
        call(&mut client, "late").await.unwrap().overall_code,
        Code::OverLimit as i32
    );
    running.shutdown().await.expect("a clean shutdown");
}
