//! A `ShouldRateLimit` message is answered alike however its frames come:
//! whole in one DATA frame, as Envoy sends it (read and answered by the
//! service itself), or split, padded with an empty frame, or followed by
//! trailers (read by tonic's unary machinery).

use std::convert::Infallible;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use prost::Message;

use crate::common::rls_request;
use crate::reliability::start;

type Body =
    StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// `user`'s call in `frames` (what `split` makes of its framed message),
/// and its answer: `grpc-status` and the message, if any.
async fn call(
    sender: &mut hyper::client::conn::http2::SendRequest<Body>,
    user: &str,
    split: impl FnOnce(Bytes) -> Vec<Frame<Bytes>>,
) -> (String, Option<RateLimitResponse>) {
    let message = rls_request("d", &[&[("user", user)]]).encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&message);
    let frames = split(Bytes::from(framed))
        .into_iter()
        .map(Ok)
        .collect::<Vec<_>>();
    let request = hyper::Request::post(
        "http://localhost/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    )
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(StreamBody::new(futures_util::stream::iter(frames)))
    .unwrap();
    sender.ready().await.expect("the connection takes a stream");
    let response = sender.send_request(request).await.expect("an answer");
    let head_status = response.headers().get("grpc-status").cloned();
    let collected = response.into_body().collect().await.expect("a body");
    let status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status").cloned())
        .or(head_status)
        .expect("a grpc-status");
    let data = collected.to_bytes();
    let answer =
        (data.len() >= 5).then(|| RateLimitResponse::decode(&data[5..]).expect("an answer"));
    (status.to_str().unwrap().to_owned(), answer)
}

#[tokio::test]
async fn a_message_is_answered_alike_in_one_frame_or_many() {
    let (running, _dir) = start(&[]).await;
    let (mut sender, connection) = crate::common::h2_connection(running.grpc_addr()).await;

    let whole = |framed: Bytes| vec![Frame::data(framed)];
    let split = |framed: Bytes| {
        // The prefix itself split, as a client may.
        vec![
            Frame::data(framed.slice(..2)),
            Frame::data(framed.slice(2..9)),
            Frame::data(framed.slice(9..)),
        ]
    };
    let padded = |framed: Bytes| vec![Frame::data(framed), Frame::data(Bytes::new())];
    let with_trailers = |framed: Bytes| {
        let mut trailers = hyper::HeaderMap::new();
        trailers.insert("x-note", "trailing".parse().unwrap());
        vec![Frame::data(framed), Frame::trailers(trailers)]
    };
    let answers = [
        call(&mut sender, "whole", whole).await,
        call(&mut sender, "split", split).await,
        call(&mut sender, "padded", padded).await,
        call(&mut sender, "trailers", with_trailers).await,
    ];
    for (status, answer) in &answers {
        assert_eq!(status, "0");
        let answer = answer.as_ref().expect("a message");
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses.len(), 1);
        // Each user's first call: charged once.
        assert_eq!(answer.statuses[0].limit_remaining, 99);
    }
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");

    // A second call of one user, whole: charged again.
    let (_, again) = call(&mut sender, "split", whole).await;
    assert_eq!(again.expect("a message").statuses[0].limit_remaining, 98);

    // A compressed message (no `grpc-encoding` said) is refused as tonic
    // refuses it, charging nothing.
    let compressed = |framed: Bytes| {
        let mut bytes = framed.to_vec();
        bytes[0] = 1;
        vec![Frame::data(Bytes::from(bytes))]
    };
    let (status, answer) = call(&mut sender, "whole", compressed).await;
    assert_ne!(status, "0");
    assert!(answer.is_none());
    let (_, after) = call(&mut sender, "whole", whole).await;
    assert_eq!(after.expect("a message").statuses[0].limit_remaining, 98);

    connection.abort();
    running.shutdown().await.expect("a clean shutdown");
}
