//! The gRPC door under overload: a call it cannot check in time is answered
//! at once with `--overload-answer`, while its caller still listens, never
//! late (to Envoy failing open, a late answer is an admit). The figure
//! through a real Envoy at twice the capacity is `scripts/bench-peak`'s
//! (docs/reliability.md).

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic::Code as Status;

use crate::common::rls_request;
use crate::reliability::{held_call, start};

/// A call, through a fresh tonic client.
async fn call(addr: std::net::SocketAddr) -> Result<RateLimitResponse, tonic::Status> {
    let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("the gRPC listener accepts");
    client
        .should_rate_limit(rls_request("d", &[&[("user", "u")]]))
        .await
        .map(tonic::Response::into_inner)
}

/// Holds `--max-checks-in-flight` calls open (messages that never complete),
/// then calls again.
async fn past_the_bound(flags: &[&str]) -> Result<RateLimitResponse, tonic::Status> {
    let (running, _dir) = start(flags).await;
    let (mut sender, connection) = crate::common::h2_connection(running.grpc_addr()).await;
    let (hold, held) = held_call(&mut sender, 100, 50, Some("10S")).await;
    // The held call is in flight once the server has read its head, which
    // the client does not see: until then, a call is checked.
    let started = Instant::now();
    let answer = loop {
        let answer = call(running.grpc_addr()).await;
        if !matches!(&answer, Ok(a) if a.statuses.len() == 1) {
            break answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never past the bound"
        );
    };
    drop(hold);
    let _ = held.await;
    // Its place came back: checked again.
    let after = call(running.grpc_addr()).await.expect("checked");
    assert_eq!(after.overall_code, Code::Ok as i32);
    assert_eq!(after.statuses.len(), 1, "a checked answer");
    connection.abort();
    running.shutdown().await.expect("a clean shutdown");
    answer
}

#[tokio::test]
async fn a_call_past_the_bound_in_flight_is_answered_over_limit_at_once() {
    let answer = past_the_bound(&["--max-checks-in-flight", "1"])
        .await
        .expect("an answer, not an error");
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    assert!(answer.statuses.is_empty(), "not checked: no statuses");
}

#[tokio::test]
async fn the_overload_answer_may_leave_it_to_envoys_failure_mode() {
    let refused = past_the_bound(&[
        "--max-checks-in-flight",
        "1",
        "--overload-answer",
        "unavailable",
    ])
    .await
    .expect_err("UNAVAILABLE");
    assert_eq!(refused.code(), Status::Unavailable);
}
