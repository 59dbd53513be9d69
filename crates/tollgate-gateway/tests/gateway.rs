//! The library on real sockets: options resolved, bound on port 0, served
//! with an enforcer in front of a local upstream, stopped by the signal,
//! with every answer told to the hook. (The binary's flags, config file and
//! every proxy behaviour are tested through `tollgate serve`, in
//! tollgate-server's `tests/gateway.rs`.)

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tollgate_gateway::{Gateway, Options, Outcome, Settings};
use tollgate_policy::{Enforcer, Policy};
use tollgate_store::MemoryStore;

/// The response header in which [`upstream`] tells the `X-Forwarded-For` it got.
const SAW_FORWARDED_FOR: &str = "x-upstream-saw-forwarded-for";

/// An upstream that answers every request `200 hello`, telling the
/// `X-Forwarded-For` it got in [`SAW_FORWARDED_FOR`]; its base URL.
async fn upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let hello = service_fn(|request: Request<Incoming>| async move {
                let mut response = Response::new(String::from("hello"));
                if let Some(seen) = request.headers().get("x-forwarded-for") {
                    response
                        .headers_mut()
                        .insert(SAW_FORWARDED_FOR, seen.clone());
                }
                Ok::<_, Infallible>(response)
            });
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), hello));
        }
    });
    format!("http://{addr}")
}

/// Signals the gateway to stop and waits for its workers, which must all
/// have served without error.
async fn stop_and_join(
    stop: tokio::sync::watch::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tollgate_gateway::Error>>,
) {
    stop.send(()).expect("the gateway listens for the signal");
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the workers stop")
        .expect("no worker panicked")
        .expect("the gateway served without error");
}

/// The settings of a gateway on a free loopback port in front of a fresh
/// [`upstream`], with `extra` options on top.
async fn settings(extra: Options) -> Settings {
    settings_for(&upstream().await, extra)
}

/// The settings of a gateway on a free loopback port in front of the
/// upstream at `url`, with `extra` options on top.
fn settings_for(url: &str, extra: Options) -> Settings {
    let options = Options {
        proxy_listen: Some("127.0.0.1:0".into()),
        upstream: Some(url.parse().expect("an upstream URL")),
        ..extra
    };
    Settings::resolve(options)
        .expect("valid options")
        .expect("a gateway is asked for")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_gateway_forwards_limits_tells_the_hook_and_stops() {
    let settings = settings(Options::default()).await;
    let policy = Policy::parse(
        "inline",
        "
domain: gateway
rules:
  - name: per-ip
    match: [{ key: remote_address }]
    limit: { requests: 1, per: 1h }
",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let gateway = Gateway::bind(settings, &policy).await.expect("bind");
    let addr = gateway.local_addr();
    assert_ne!(addr.port(), 0, "port 0 is resolved");

    let enforcer = Arc::new(Enforcer::new(policy, MemoryStore::default()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (stop, stopped) = tokio::sync::watch::channel(());
    let task = gateway.spawn(&enforcer, stopped, {
        let seen = Arc::clone(&seen);
        move |outcome, _elapsed| seen.lock().expect("not poisoned").push(outcome)
    });

    let client = reqwest::Client::new();
    let url = format!("http://{addr}/anything");
    let first = client.get(&url).send().await.expect("first request");
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()[SAW_FORWARDED_FOR], "127.0.0.1");
    assert_eq!(first.text().await.expect("body"), "hello");
    let second = client.get(&url).send().await.expect("second request");
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        *seen.lock().expect("not poisoned"),
        [Outcome::Forwarded, Outcome::Limited]
    );

    drop(client);
    stop_and_join(stop, task).await;
}

/// On the caller's runtime (for tests under paused time), every request is
/// served on the thread that runs it: here, the test's own.
#[tokio::test]
async fn on_the_caller_runtime_the_gateway_serves_on_the_callers_thread() {
    let settings = settings(Options::default()).await.on_caller_runtime();
    let policy = Policy::builtin();
    let gateway = Gateway::bind(settings, &policy).await.expect("bind");
    let url = format!("http://{}/anything", gateway.local_addr());
    let enforcer = Arc::new(Enforcer::new(policy, MemoryStore::default()));
    let threads = Arc::new(Mutex::new(Vec::new()));
    let (stop, stopped) = tokio::sync::watch::channel(());
    let task = gateway.spawn(&enforcer, stopped, {
        let threads = Arc::clone(&threads);
        move |_outcome, _elapsed| {
            threads
                .lock()
                .expect("not poisoned")
                .push(std::thread::current().id());
        }
    });

    let client = reqwest::Client::new();
    for _ in 0..2 {
        let response = client.get(&url).send().await.expect("a response");
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(
        *threads.lock().expect("not poisoned"),
        [std::thread::current().id(); 2]
    );

    drop(client);
    stop.send(()).expect("the gateway listens for the signal");
    task.await
        .expect("the task does not panic")
        .expect("the gateway served without error");
}

/// A gateway in front of `upstream` serving on the caller's runtime (so a
/// test's paused time is the gateway's too), deciding with the builtin
/// policy on a memory store: its URL for `path`, its stop signal and task.
async fn on_this_runtime(
    upstream: &str,
    path: &str,
) -> (
    String,
    tokio::sync::watch::Sender<()>,
    tokio::task::JoinHandle<Result<(), tollgate_gateway::Error>>,
) {
    let settings = settings_for(upstream, Options::default()).on_caller_runtime();
    let gateway = Gateway::bind(settings, &Policy::builtin())
        .await
        .expect("bind");
    let url = format!("http://{}{path}", gateway.local_addr());
    let enforcer = Arc::new(Enforcer::new(Policy::builtin(), MemoryStore::default()));
    let (stop, stopped) = tokio::sync::watch::channel(());
    let task = gateway.spawn(&enforcer, stopped, |_outcome, _elapsed| {});
    (url, stop, task)
}

/// Asks `url` and expects the gateway's `504`, 60 s (of paused time) after
/// asking and not before.
async fn expect_504_after_the_deadline(client: &reqwest::Client, url: &str) {
    let started = tokio::time::Instant::now();
    let response = client.get(url).send().await.expect("an answer");
    let waited = started.elapsed();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(
        (Duration::from_secs(60)..Duration::from_secs(61)).contains(&waited),
        "answered after {waited:?}"
    );
    let body: serde_json::Value = response.json().await.expect("a JSON body");
    assert_eq!(body["error"], "gateway_timeout");
}

/// An upstream that sends no answer within the deadline gets the client a
/// `504` with the proxy's JSON error, once the deadline (60 s, of paused
/// time here) has passed and not before; the next request on the same
/// client connection gets its own full deadline.
#[tokio::test(start_paused = true)]
async fn an_upstream_that_never_answers_is_a_504_after_the_deadline() {
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = format!("http://{}", silent.local_addr().expect("address"));
    tokio::spawn(async move {
        // Accepted and held open, never answered.
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let (url, stop, task) = on_this_runtime(&upstream, "/slow").await;

    let client = reqwest::Client::new();
    for _ in 0..2 {
        expect_504_after_the_deadline(&client, &url).await;
    }

    drop(client);
    stop_and_join(stop, task).await;
}

/// A pooled upstream connection carries each request's deadline anew: a
/// request on a connection reused after the last one's deadline has come
/// and gone (idle in the pool meanwhile) still waits its full 60 s (of
/// paused time) for its answer before the `504`.
#[tokio::test(start_paused = true)]
async fn a_reused_upstream_connection_gives_each_request_its_full_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", upstream.local_addr().expect("address"));
    let accepted = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&accepted);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = upstream.accept().await {
            *counted.lock().unwrap() += 1;
            // The first request of a connection is answered; the rest are
            // read and never answered.
            let mut head = Vec::new();
            let mut byte = [0; 1];
            while !head.ends_with(b"\r\n\r\n") {
                stream.read_exact(&mut byte).await.expect("a request");
                head.push(byte[0]);
            }
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .expect("an answer");
            held.push(stream);
        }
    });
    let (url, stop, task) = on_this_runtime(&url, "/").await;

    let client = reqwest::Client::new();
    let first = client.get(&url).send().await.expect("an answer");
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.text().await.expect("a body"), "ok");
    // Past the first request's deadline, within the pool's idle timeout.
    tokio::time::sleep(Duration::from_secs(70)).await;

    expect_504_after_the_deadline(&client, &url).await;
    assert_eq!(*accepted.lock().unwrap(), 1, "the connection was reused");

    drop(client);
    stop_and_join(stop, task).await;
}

/// The benchmark's floor: the same listeners and proxy with no limit step,
/// so every request is forwarded and no answer carries rate limit headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_gateway_forwards_every_request_with_no_limit_step() {
    let settings = settings(Options::default()).await;
    let gateway = Gateway::bind(settings, &Policy::builtin())
        .await
        .expect("bind");
    let url = format!("http://{}/anything", gateway.local_addr());
    let (stop, stopped) = tokio::sync::watch::channel(());
    let task = gateway.spawn_bare(stopped);

    let client = reqwest::Client::new();
    for _ in 0..3 {
        let response = client.get(&url).send().await.expect("a response");
        assert_eq!(response.status(), StatusCode::OK);
        let limit_headers: Vec<_> = response
            .headers()
            .keys()
            .filter(|name| name.as_str().contains("ratelimit"))
            .collect();
        assert!(limit_headers.is_empty(), "{limit_headers:?}");
        assert_eq!(response.headers()[SAW_FORWARDED_FOR], "127.0.0.1");
        assert_eq!(response.text().await.expect("body"), "hello");
    }

    drop(client);
    stop_and_join(stop, task).await;
}

#[test]
fn no_address_and_no_upstream_is_no_gateway() {
    assert!(matches!(Settings::resolve(Options::default()), Ok(None)));
    let upstream_only = Options {
        upstream: Some("http://127.0.0.1:9".parse().expect("an upstream URL")),
        ..Options::default()
    };
    assert!(matches!(
        Settings::resolve(upstream_only),
        Err(tollgate_gateway::SettingsError::NoListen)
    ));
}

/// Regression: at 10,000 gateway connections the process ran out of file
/// descriptors, and the API, gRPC and upstream connections failed with it.
/// Past `proxy_max_connections`, a new connection is closed at once; once an
/// open one closes, new connections are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_until_one_closes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
    /// The first bytes of the answer to `REQUEST` on a new connection, or
    /// what came before the connection closed.
    async fn first_bytes(addr: std::net::SocketAddr) -> (tokio::net::TcpStream, Vec<u8>) {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        // A write to a connection the gateway already closed may fail: that
        // is an answer too.
        let _ = stream.write_all(REQUEST).await;
        let mut buf = vec![0u8; 12];
        let mut read = 0;
        while read < buf.len() {
            match stream.read(&mut buf[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
        buf.truncate(read);
        (stream, buf)
    }

    let settings = settings(Options {
        proxy_max_connections: Some(2),
        ..Options::default()
    })
    .await;
    let policy =
        Policy::parse("inline", "domain: gateway\nrules: []\n").unwrap_or_else(|e| panic!("{e}"));
    let gateway = Gateway::bind(settings, &policy).await.expect("bind");
    let addr = gateway.local_addr();
    let enforcer = Arc::new(Enforcer::new(policy, MemoryStore::default()));
    let (_stop, stopped) = tokio::sync::watch::channel(());
    let _task = gateway.spawn(&enforcer, stopped, |_, _| {});

    // Two connections, answered and kept open, take the cap.
    let mut open = Vec::new();
    for _ in 0..2 {
        let (stream, answer) = first_bytes(addr).await;
        assert_eq!(answer, b"HTTP/1.1 200");
        open.push(stream);
    }
    let (_, refused) = first_bytes(addr).await;
    assert!(
        refused.is_empty(),
        "a third connection is closed unanswered"
    );
    drop(open.pop());
    // The closed connection's permit comes back as soon as the gateway sees
    // the close; a bounded number of tries covers the moment in between.
    let mut served = false;
    for _ in 0..100 {
        let (_stream, answer) = first_bytes(addr).await;
        if answer == b"HTTP/1.1 200" {
            served = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(served, "a connection is served once an open one closed");
}
