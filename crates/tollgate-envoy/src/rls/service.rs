//! gRPC: Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! with the protos of the `envoy-types` crate. The request is decoded by
//! prost and read straight into the enforcer's [`Request`]; the answer is
//! encoded from [`Answer`], the model `POST /json` encodes too, straight
//! into the answer's frame by [`super::encode`].
//!
//! The listener's service ([`GrpcService`]) reads and answers a
//! `ShouldRateLimit` message as Envoy sends it itself (`unary_call`), and
//! hands any other to tonic's unary machinery with a codec of this one
//! method; every other path (the health service, unknown methods) goes
//! through tonic's router, which would otherwise add its route lookup and
//! two boxed bodies to every check.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use futures_util::FutureExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::HeaderValue;
use prost::Message;
use tollgate_core::Store;
use tollgate_policy::{Check, Descriptor, Enforcer, Entry, Request, Verdict};
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::server::{Grpc, UnaryService};
use tonic::service::Routes;
use tonic::{Response, Status};
use tonic_prost::ProstDecoder;
use tower_service::Service;

use tollgate_listen::bodies::{Bodies, Refused, Reserved};

use super::answer::{self, Answer, Answered, Families, Outcome, Refusal, Reply, RequestDescriptor};
use super::encode;
use super::overload::{InFlight, Overload, OverloadAnswer};

/// The path of `ShouldRateLimit`.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The gRPC listener's service: `ShouldRateLimit` over the shared
/// [`Enforcer`], everything else through `routes`.
pub struct GrpcService<S> {
    rls: RateLimitGrpc<S>,
    routes: Routes,
}

impl<S> Clone for GrpcService<S> {
    fn clone(&self) -> Self {
        Self {
            rls: self.rls.clone(),
            routes: self.routes.clone(),
        }
    }
}

impl<S> GrpcService<S> {
    /// Serves `ShouldRateLimit` with `rls`, any other path with `routes`.
    pub fn new(rls: RateLimitGrpc<S>, routes: Routes) -> Self {
        Self { rls, routes }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S: Store + 'static> hyper::service::Service<hyper::Request<Incoming>> for GrpcService<S> {
    type Response = hyper::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        if request.uri().path() == PATH {
            // Past the bound the call is still read: what is known without
            // the store (a key the deny cache knows is over) is answered,
            // and only the rest gets the overload answer.
            let place = self.rls.inner.overload.enter();
            let bodies = Arc::clone(&self.rls.inner.bodies);
            let reserved = match bodies.reserve(None) {
                Ok(reserved) => reserved,
                Err(refused) => return Box::pin(std::future::ready(Ok(refusal(refused)))),
            };
            let rls = Arc::clone(&self.rls.inner);
            let budget = grpc_timeout(request.headers())
                .map_or(bodies.read_timeout(), |t| t.min(bodies.read_timeout()));
            let arrived = tokio::time::Instant::now();
            let deadline = arrived + budget;
            // The last quarter of the deadline is the answer's way back.
            let answer_by = arrived + budget * 3 / 4;
            Box::pin(async move {
                // Queued past its deadline: its caller has given up on the
                // answer (Envoy's filter has admitted or denied by its
                // failure mode), so no work is spent on it.
                if tokio::time::Instant::now() >= deadline {
                    return Ok(too_late());
                }
                let unary = Unary {
                    rls,
                    reserved: Some(reserved),
                    place,
                    answer_by,
                };
                let call = unary_call(unary, request, bodies.max_bytes());
                match tokio::time::timeout_at(deadline, call).await {
                    Ok(response) => Ok(response),
                    Err(_) => Ok(too_late()),
                }
            })
        } else {
            let mut routes = self.routes.clone();
            Box::pin(async move {
                poll_fn(|cx| Service::<hyper::Request<Incoming>>::poll_ready(&mut routes, cx))
                    .await?;
                routes.call(request).await
            })
        }
    }
}

/// The length of a gRPC message's prefix: its compressed flag and length.
const PREFIX: usize = 5;

/// One `ShouldRateLimit` call. Its message, as Envoy sends it (one DATA
/// frame, uncompressed, no trailers), is decoded and answered here; any
/// other (split, compressed, too large, malformed, with trailers) goes to
/// tonic's unary machinery as it came, which answers it as it answers every
/// call.
///
/// tonic's machinery costs a 2,152-byte future (past the 1,032 bytes
/// glibc serves from its per-thread cache, so malloc's slow path on every
/// call), about ten more allocations and its body's layers
/// (`scripts/bench-rls-cpu`).
async fn unary_call<S: Store + 'static>(
    mut unary: Unary<S>,
    request: hyper::Request<Incoming>,
    max_bytes: u32,
) -> hyper::Response<tonic::body::Body> {
    let (parts, body) = request.into_parts();
    let read = read_body(body, max_bytes).await;
    if let Read::One(data) = &read
        && !parts.headers.contains_key("grpc-encoding")
        && let Some(message) = message(data, max_bytes)
    {
        let request = tonic::Request::from_http(hyper::Request::from_parts(parts, message));
        return match unary.call(request).await {
            Ok(response) => answer_response(response.into_inner()),
            Err(status) => status.into_http(),
        };
    }
    let frames = match read {
        Read::One(data) => vec![Ok(Frame::data(data))],
        Read::Frames(frames) => frames,
    };
    let request =
        hyper::Request::from_parts(parts, StreamBody::new(futures_util::stream::iter(frames)));
    let mut grpc = Grpc::new(AnswerCodec::new()).max_decoding_message_size(max_bytes as usize);
    too_large_is_exhausted(Box::pin(grpc.unary(unary, request)).await)
}

/// A call's body, read whole.
enum Read {
    /// One DATA frame, as Envoy sends a message.
    One(Bytes),
    /// Every frame (or error) as it came.
    Frames(Vec<Result<Frame<Bytes>, hyper::Error>>),
}

/// Reads `body` to its end; or only until its prefix declares more than
/// `max_bytes`, which tonic then refuses at once from the prefix alone; or
/// until more than a message of `max_bytes` came.
async fn read_body(mut body: Incoming, max_bytes: u32) -> Read {
    let cap = (max_bytes as usize).saturating_add(PREFIX);
    let mut one: Option<Bytes> = None;
    let mut frames = Vec::new();
    let mut prefix = [0u8; PREFIX];
    let mut read = 0usize;
    while read <= cap {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = match frame.map(Frame::into_data) {
            // An empty DATA frame (a lone END_STREAM) carries nothing.
            Ok(Ok(data)) if data.is_empty() => continue,
            Ok(Ok(data)) => {
                if let Some(rest) = prefix.get_mut(read..) {
                    let n = rest.len().min(data.len());
                    rest[..n].copy_from_slice(&data[..n]);
                }
                read = read.saturating_add(data.len());
                if one.is_none() && frames.is_empty() {
                    one = Some(data);
                    None
                } else {
                    Some(Ok(Frame::data(data)))
                }
            }
            Ok(Err(trailers)) => Some(Ok(trailers)),
            Err(error) => Some(Err(error)),
        };
        let failed = matches!(frame, Some(Err(_)));
        if let Some(frame) = frame {
            frames.extend(one.take().map(|data| Ok(Frame::data(data))));
            frames.push(frame);
        }
        let [_, length @ ..] = prefix;
        if failed || (read >= PREFIX && u32::from_be_bytes(length) > max_bytes) {
            break;
        }
    }
    match one {
        Some(data) => Read::One(data),
        None => Read::Frames(frames),
    }
}

/// The request `data` holds as one whole uncompressed message of at most
/// `max_bytes`; `None` for anything else.
fn message(data: &Bytes, max_bytes: u32) -> Option<RateLimitRequest> {
    let (&[compressed, length @ ..], rest) = data.split_first_chunk::<PREFIX>()?;
    let length = u32::from_be_bytes(length);
    if compressed != 0 || length > max_bytes || length as usize != rest.len() {
        return None;
    }
    RateLimitRequest::decode(data.slice(PREFIX..)).ok()
}

/// The HTTP response of an answered call: as tonic's, the message in one
/// DATA frame, `grpc-status: 0` in the trailers.
fn answer_response<S: Store + 'static>(
    checked: Option<Checked<S>>,
) -> hyper::Response<tonic::body::Body> {
    let mut message = BytesMut::with_capacity(256);
    message.put_bytes(0, PREFIX);
    write_answer(checked, &mut message);
    let length = u32::try_from(message.len() - PREFIX).unwrap_or(u32::MAX);
    message[1..PREFIX].copy_from_slice(&length.to_be_bytes());
    let body = OneMessage::Message(message.freeze());
    let mut response = hyper::Response::new(tonic::body::Body::new(body));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A response body of one message, then `grpc-status: 0`.
enum OneMessage {
    Message(Bytes),
    Trailers,
    Ended,
}

impl hyper::body::Body for OneMessage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match std::mem::replace(&mut *self, OneMessage::Ended) {
            OneMessage::Message(message) => {
                *self = OneMessage::Trailers;
                Frame::data(message)
            }
            OneMessage::Trailers => {
                let mut trailers = hyper::HeaderMap::with_capacity(1);
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                Frame::trailers(trailers)
            }
            OneMessage::Ended => return std::task::Poll::Ready(None),
        };
        std::task::Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, OneMessage::Ended)
    }
}

/// The caller's deadline, `grpc-timeout` (at most 8 digits and a unit: `H`,
/// `M`, `S`, `m`, `u` or `n`), if it sent one that parses.
fn grpc_timeout(headers: &hyper::HeaderMap) -> Option<Duration> {
    let text = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

/// The answer to a call not read and answered by its deadline: the
/// caller's `grpc-timeout`, or `--body-read-timeout`, whichever is sooner.
fn too_late() -> hyper::Response<tonic::body::Body> {
    Status::deadline_exceeded("the call was not read and answered by its deadline").into_http()
}

/// The answer to a call whose message is not read.
fn refusal(refused: Refused) -> hyper::Response<tonic::body::Body> {
    match refused {
        Refused::TooLarge => Status::resource_exhausted("the message is too large"),
        Refused::Busy => Status::resource_exhausted(
            "too many request bytes in flight (--request-body-budget); retry",
        ),
    }
    .into_http()
}

/// tonic refuses a message past its size cap with `OUT_OF_RANGE`; gRPC's
/// status codes say `RESOURCE_EXHAUSTED`. Nothing else of a call answers
/// `OUT_OF_RANGE` ([`status`]), and the refusal is trailers-only: the
/// status is in the head.
fn too_large_is_exhausted(
    mut response: hyper::Response<tonic::body::Body>,
) -> hyper::Response<tonic::body::Body> {
    let headers = response.headers_mut();
    if headers.get("grpc-status").is_some_and(|code| code == "11") {
        headers.insert("grpc-status", hyper::header::HeaderValue::from_static("8"));
    }
    response
}

/// `ShouldRateLimit` over the shared [`Enforcer`].
pub struct RateLimitGrpc<S> {
    inner: Arc<Rls<S>>,
}

impl<S> Clone for RateLimitGrpc<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Rls<S> {
    enforcer: Arc<Enforcer<S>>,
    /// Whether a call's `authorization` metadata admits it; `None`: open.
    admits: Option<Admits>,
    /// The headers and metadata answers carry.
    reply: Arc<Reply>,
    /// Told of each answer.
    answered: Answered,
    /// How large a message may be and how long it may take.
    bodies: Arc<Bodies>,
    /// The bound on calls in flight, and what a call not checked in time
    /// is answered.
    overload: Arc<Overload>,
}

/// Whether the `authorization` value given (if any) admits a call.
pub type Admits = Box<dyn Fn(Option<&str>) -> bool + Send + Sync>;

impl<S> RateLimitGrpc<S> {
    /// Serves `enforcer` to the callers `admits` lets in (to any caller
    /// without it), answering as `reply` says, telling `answered` of each
    /// answer, reading messages as `bodies` says and answering what it
    /// cannot check in time as `overload` says.
    pub fn new(
        enforcer: Arc<Enforcer<S>>,
        admits: Option<Admits>,
        reply: Arc<Reply>,
        answered: Answered,
        bodies: Arc<Bodies>,
        overload: Arc<Overload>,
    ) -> Self {
        Self {
            inner: Arc::new(Rls {
                enforcer,
                admits,
                reply,
                answered,
                bodies,
                overload,
            }),
        }
    }
}

/// The service tonic's unary machinery calls for one call: crate-private,
/// as what it answers ([`Checked`]) is.
struct Unary<S> {
    rls: Arc<Rls<S>>,
    /// The call's share of the request body budget, held while its message
    /// is read and let go once it is decoded.
    reserved: Option<Reserved>,
    /// The call's place among those in flight, held until it is answered;
    /// `None` past the bound.
    place: Option<InFlight>,
    /// Three quarters of the way to the call's deadline: decoded later (it
    /// queued, or its message came slowly), it is not checked, answered at
    /// once rather than late. The last quarter is the answer's way back.
    answer_by: tokio::time::Instant,
}

/// What a call is answered: its checked request, or `None`, not checked
/// (the `OVER_LIMIT` overload answer).
type UnaryResult<S> = Result<Response<Option<Checked<S>>>, Status>;

impl<S: Store + 'static> UnaryService<RateLimitRequest> for Unary<S> {
    type Response = Option<Checked<S>>;
    type Future = BoxFuture<UnaryResult<S>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        // Decoded: the message's bytes are no longer held.
        self.reserved = None;
        let rls = &self.rls;
        if let Some(admits) = &rls.admits {
            let given = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok());
            if !admits(given) {
                return Box::pin(std::future::ready(Err(Status::unauthenticated(
                    "missing or wrong `authorization: Bearer <API token>` metadata",
                ))));
            }
        }
        // Not checked, past the bound or too late: only what is known
        // without the store is answered, the rest shed.
        if self.place.is_none() || tokio::time::Instant::now() >= self.answer_by {
            return Box::pin(std::future::ready(known(rls, request.into_inner())));
        }
        Box::pin(answered(Arc::clone(rls), request.into_inner()))
    }
}

/// Answers `request` from what is known without the store
/// ([`Enforcer::enforce_known`]), told to the [`Answered`] hook; what is not
/// known gets the overload answer.
fn known<S: Store + 'static>(rls: &Arc<Rls<S>>, request: RateLimitRequest) -> UnaryResult<S> {
    let started = Instant::now();
    let Some(checked) = check_known(rls, request) else {
        return match rls.overload.answer() {
            OverloadAnswer::OverLimit => Ok(Response::new(None)),
            OverloadAnswer::Unavailable => Err(Status::unavailable(
                "overloaded: the call could not be checked in time",
            )),
        };
    };
    (rls.answered)(outcome_of(&checked), started.elapsed());
    checked.map(|c| Response::new(Some(c)))
}

/// [`should_rate_limit`] from what is known without the store; `None` when
/// that is not enough.
fn check_known<S: Store>(
    rls: &Arc<Rls<S>>,
    request: RateLimitRequest,
) -> Option<Result<Checked<S>, Status>> {
    let (domain, descriptors, hits_addend) = match parse(request) {
        Ok(parsed) => parsed,
        Err(refused) => return Some(Err(refused)),
    };
    let verdict = rls.enforcer.enforce_known(&Request {
        domain: &domain,
        descriptors: &descriptors,
        hits_addend,
    })?;
    Some(
        verdict
            .map_err(|e| status(e.into()))
            .map(|verdict| checked(Arc::clone(rls), domain, descriptors, hits_addend, verdict)),
    )
}

/// [`should_rate_limit`], told to the service's [`Answered`] hook.
///
/// Mapped rather than awaited in an `async` block, which would keep the
/// request beside the check future that holds it: so the boxed future fits
/// glibc's per-thread cache (up to 1,032 bytes) rather than taking malloc's
/// slow path on every call (about 500 instructions of 55,000).
fn answered<S: Store + 'static>(
    rls: Arc<Rls<S>>,
    request: RateLimitRequest,
) -> impl Future<Output = UnaryResult<S>> + Send {
    let started = Instant::now();
    let answered = rls.answered;
    should_rate_limit(rls, request).map(move |checked| {
        answered(outcome_of(&checked), started.elapsed());
        checked.map(|c| Response::new(Some(c)))
    })
}

/// How `checked` answered.
fn outcome_of<S>(checked: &Result<Checked<S>, Status>) -> Outcome {
    match checked {
        Ok(c) if c.verdict.allowed() => Outcome::Ok,
        Ok(_) => Outcome::OverLimit,
        Err(_) => Outcome::Invalid,
    }
}

/// A checked request with its verdict and how to answer it: what the
/// encoder writes the [`Answer`] from, which borrows from them.
pub(crate) struct Checked<S> {
    domain: String,
    descriptors: Vec<Descriptor>,
    hits_addend: u64,
    verdict: Verdict,
    /// The service, for its [`Reply`]: the call's own reference moved here
    /// rather than another count taken on an `Arc` every worker shares.
    rls: Arc<Rls<S>>,
    families: Families,
}

impl<S> Checked<S> {
    fn answer(&self) -> Answer<'_> {
        let request = Request {
            domain: &self.domain,
            descriptors: &self.descriptors,
            hits_addend: self.hits_addend,
        };
        answer::answer(&request, &self.verdict, &self.rls.reply, self.families)
    }
}

/// The codec of `ShouldRateLimit`: prost's decoder for the request, the
/// answer written by [`encode::response`].
struct AnswerCodec<S>(PhantomData<fn() -> S>);

impl<S> AnswerCodec<S> {
    fn new() -> Self {
        Self(PhantomData)
    }
}

/// The codec's buffers: tonic's default is 8 KiB for each of a call's two
/// messages, where a request and an answer take a few hundred bytes (and
/// grow the buffer when larger). The yield threshold is tonic's default.
fn buffer() -> BufferSettings {
    BufferSettings::new(512, 32 * 1024)
}

impl<S: Store + 'static> Codec for AnswerCodec<S> {
    type Encode = Option<Checked<S>>;
    type Decode = RateLimitRequest;
    type Encoder = AnswerEncoder<S>;
    type Decoder = ProstDecoder<RateLimitRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        AnswerEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(buffer())
    }
}

struct AnswerEncoder<S>(PhantomData<fn() -> S>);

impl<S: Store + 'static> Encoder for AnswerEncoder<S> {
    type Item = Option<Checked<S>>;
    type Error = Status;

    fn encode(&mut self, checked: Self::Item, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        write_answer(checked, buf);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer()
    }
}

/// Writes the answer to a call, checked or not (then over the limit, with
/// no descriptor statuses).
fn write_answer<S>(checked: Option<Checked<S>>, buf: &mut impl BufMut) {
    match checked {
        Some(checked) => encode::response(&checked.answer(), buf),
        None => encode::response(
            &Answer {
                ok: false,
                statuses: Vec::new(),
                headers: Vec::new(),
                dynamic_metadata: None,
            },
            buf,
        ),
    }
}

/// Checks one `ShouldRateLimit` request; a malformed one fails with the
/// reason (see [`status`]).
async fn should_rate_limit<S: Store>(
    rls: Arc<Rls<S>>,
    request: RateLimitRequest,
) -> Result<Checked<S>, Status> {
    let (domain, descriptors, hits_addend) = parse(request)?;
    // Envoy's protocol has no release call: a concurrency permit lapses
    // after its rule's period.
    let verdict = rls
        .enforcer
        .enforce(Check::Policy(Request {
            domain: &domain,
            descriptors: &descriptors,
            hits_addend,
        }))
        .await
        .map_err(|e| status(e.into()))?;
    Ok(checked(rls, domain, descriptors, hits_addend, verdict))
}

/// A request's domain, descriptors and `hits_addend`; a malformed one fails
/// with the reason.
fn parse(request: RateLimitRequest) -> Result<(String, Vec<Descriptor>, u64), Status> {
    let RateLimitRequest {
        domain,
        descriptors: given,
        hits_addend,
    } = request;
    let descriptors = answer::descriptors(&domain, descriptors(given)).map_err(status)?;
    Ok((domain, descriptors, u64::from(hits_addend)))
}

/// The request and its verdict, with how to answer them.
fn checked<S: Store>(
    rls: Arc<Rls<S>>,
    domain: String,
    descriptors: Vec<Descriptor>,
    hits_addend: u64,
    verdict: Verdict,
) -> Checked<S> {
    let families = rls.reply.families(&rls.enforcer, &domain);
    Checked {
        domain,
        descriptors,
        hits_addend,
        verdict,
        rls,
        families,
    }
}

/// The failure a refusal is: envoyproxy/ratelimit's own refusals with its
/// code and words, Tollgate's `INVALID_ARGUMENT`.
fn status(refusal: Refusal) -> Status {
    match refusal {
        Refusal::Service(error) => Status::unknown(error.to_string()),
        Refusal::Invalid(reason) => Status::invalid_argument(reason),
    }
}

/// The request's descriptors, their strings moved rather than copied.
fn descriptors(descriptors: Vec<RateLimitDescriptor>) -> impl Iterator<Item = RequestDescriptor> {
    descriptors.into_iter().map(|d| RequestDescriptor {
        entries: d
            .entries
            .into_iter()
            .map(|e| Entry::new(e.key, e.value))
            .collect(),
        limit: d.limit.map(|o| (o.requests_per_unit, o.unit)),
        hits_addend: d.hits_addend.map(|h| h.value),
        is_negative_hits: d.is_negative_hits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Clock;
    use tollgate_store::MemoryStore;

    /// The in-process store as the server runs it, on a clock it is given.
    type Backend = MemoryStore<Arc<dyn Clock>>;

    #[test]
    fn grpc_timeouts_parse_as_the_protocol_writes_them() {
        let of = |value: &str| {
            let mut headers = hyper::HeaderMap::new();
            headers.insert("grpc-timeout", value.parse().unwrap());
            grpc_timeout(&headers)
        };
        assert_eq!(of("20m"), Some(Duration::from_millis(20)));
        assert_eq!(of("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(of("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(of("5S"), Some(Duration::from_secs(5)));
        for bad in ["m", "123456789m", "20x", "+5m", "-5m", "5 m"] {
            assert_eq!(of(bad), None, "{bad}");
        }
        assert_eq!(grpc_timeout(&hyper::HeaderMap::new()), None);
    }

    #[test]
    fn a_check_is_a_small_allocation() {
        /// The largest allocation glibc serves from its per-thread cache.
        const SMALL_ALLOCATION: usize = 1032;
        fn future_size<F: Future>(_: &impl Fn(Arc<Rls<Backend>>, RateLimitRequest) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let size = future_size(&|rls, request| answered(rls, request));
        assert!(
            size <= SMALL_ALLOCATION,
            "the check future takes {size} bytes"
        );
    }
}
