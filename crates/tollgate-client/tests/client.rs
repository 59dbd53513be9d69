//! The client over real HTTP: against a server that enforces a limit with
//! tollgate-http's layer (real time), and against scripted servers with a
//! manual clock (no real waiting: the schedule is read off the clock).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::routing::get;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::oneshot;
use tollgate_client::{Client, Error, ManualClock, RetryConfig};
use tollgate_http::{HeaderStyle, RateLimitLayer};
use tollgate_policy::Policy;
use tollgate_store::MemoryStore;

/// An axum server on 127.0.0.1:0 that stops cleanly.
struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self { addr, stop, task }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

#[tokio::test]
async fn following_the_headers_it_never_gets_two_429s_in_a_row() {
    // Paced: 20 a second with bursts of 5, 25 requests in about a second.
    let seen = against_the_layer("{ requests: 20, per: 1s, burst: 5 }", true, 25).await;
    assert!(no_two_429s_in_a_row(&seen), "{seen:?}");
    // Not paced: it runs into the limit, then follows Retry-After.
    let seen = against_the_layer("{ requests: 5, per: 1s }", false, 8).await;
    assert!(no_two_429s_in_a_row(&seen), "{seen:?}");
}

fn no_two_429s_in_a_row(seen: &[StatusCode]) -> bool {
    seen.windows(2)
        .all(|w| !(w[0] == StatusCode::TOO_MANY_REQUESTS && w[1] == StatusCode::TOO_MANY_REQUESTS))
}

/// Sends `requests` requests, one after the other, to a server that enforces
/// `limit` per client address with the tollgate-http layer; returns the
/// statuses the client received, in order, as recorded on the server's side
/// of the wire (outside the layer).
async fn against_the_layer(limit: &str, pace: bool, requests: usize) -> Vec<StatusCode> {
    let policy = Policy::parse(
        "inline",
        &format!(
            "
domain: api
rules:
  - name: per-ip
    match: [{{ key: remote_address }}]
    algorithm: gcra
    limit: {limit}
"
        ),
    )
    .unwrap();
    let layer = RateLimitLayer::builder("api", policy, MemoryStore::default())
        .headers(HeaderStyle::ALL)
        .build();
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let record = {
        let statuses = Arc::clone(&statuses);
        move |request: Request, next: Next| {
            let statuses = Arc::clone(&statuses);
            async move {
                let response = next.run(request).await;
                statuses.lock().unwrap().push(response.status());
                response
            }
        }
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .layer(middleware::from_fn(record));
    let server = Server::start(app).await;

    let config = RetryConfig {
        pace,
        ..RetryConfig::default()
    };
    let client = Client::with(
        reqwest::Client::new(),
        config,
        tollgate_client::TokioClock::default(),
        StdRng::seed_from_u64(3),
    );
    for _ in 0..requests {
        let response = client.send(client.http().get(server.url("/"))).await;
        assert_eq!(response.unwrap().status(), StatusCode::OK);
    }
    server.stop().await;
    let seen = statuses.lock().unwrap().clone();
    assert!(seen.len() >= requests, "{seen:?}");
    seen
}

/// A server whose `/` answers with `script`'s responses in turn (the last
/// one forever), counting requests.
async fn scripted(
    script: Vec<(StatusCode, Vec<(&'static str, String)>)>,
) -> (Server, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let served = Arc::clone(&count);
    let script = Arc::new(script);
    let app = Router::new().route(
        "/",
        get(move || {
            let (count, script) = (Arc::clone(&served), Arc::clone(&script));
            async move {
                let i = count.fetch_add(1, Ordering::SeqCst).min(script.len() - 1);
                let (status, headers) = &script[i];
                let mut map = HeaderMap::new();
                for (name, value) in headers {
                    map.insert(*name, value.parse().unwrap());
                }
                (*status, map, "body").into_response()
            }
        }),
    );
    (Server::start(app).await, count)
}

fn manual_client(config: RetryConfig, wall: SystemTime) -> Client<Arc<ManualClock>, StdRng> {
    let clock = Arc::new(ManualClock::new(wall));
    Client::with(
        reqwest::Client::new(),
        config,
        clock,
        StdRng::seed_from_u64(1),
    )
}

const WALL: Duration = Duration::from_secs(1_700_000_000);

#[tokio::test]
async fn retries_wait_at_least_retry_after_then_give_up_with_a_typed_error() {
    let too_many = (
        StatusCode::TOO_MANY_REQUESTS,
        vec![("retry-after", "2".to_owned())],
    );
    let (server, served) = scripted(vec![too_many]).await;
    let config = RetryConfig {
        max_retries: 3,
        ..RetryConfig::default()
    };
    let client = manual_client(config.clone(), SystemTime::UNIX_EPOCH + WALL);
    let error = client
        .send(client.http().get(server.url("/")))
        .await
        .unwrap_err();
    match error {
        Error::RetriesExhausted {
            attempts,
            status,
            retry_after,
        } => {
            assert_eq!(attempts, 4);
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(retry_after, Some(Duration::from_secs(2)));
        }
        other => panic!("{other:?}"),
    }
    assert!(error_is_retryable_later());
    assert_eq!(served.load(Ordering::SeqCst), 4);
    let sleeps = client.clock().sleeps();
    assert_eq!(sleeps.len(), 3, "{sleeps:?}");
    assert!(
        sleeps
            .iter()
            .all(|s| *s >= Duration::from_secs(2)
                && *s <= Duration::from_secs(2) + config.base_delay),
        "{sleeps:?}"
    );
    server.stop().await;
}

fn error_is_retryable_later() -> bool {
    Error::RetriesExhausted {
        attempts: 1,
        status: StatusCode::TOO_MANY_REQUESTS,
        retry_after: None,
    }
    .is_retryable()
}

#[tokio::test]
async fn an_http_date_retry_after_and_then_success() {
    let wall = SystemTime::UNIX_EPOCH + WALL;
    let date = httpdate::fmt_http_date(wall + Duration::from_secs(3));
    let (server, served) = scripted(vec![
        (StatusCode::SERVICE_UNAVAILABLE, vec![("retry-after", date)]),
        (StatusCode::OK, vec![]),
    ])
    .await;
    let client = manual_client(RetryConfig::default(), wall);
    let response = client
        .send(client.http().get(server.url("/")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(served.load(Ordering::SeqCst), 2);
    let sleeps = client.clock().sleeps();
    assert_eq!(sleeps.len(), 1);
    assert!(sleeps[0] >= Duration::from_secs(3), "{sleeps:?}");
    server.stop().await;
}

#[tokio::test]
async fn without_retry_after_it_backs_off_exponentially_within_the_cap() {
    let (server, _) = scripted(vec![(StatusCode::SERVICE_UNAVAILABLE, vec![])]).await;
    let config = RetryConfig {
        max_retries: 6,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(1_000),
        ..RetryConfig::default()
    };
    let client = manual_client(config.clone(), SystemTime::UNIX_EPOCH + WALL);
    let error = client
        .send(client.http().get(server.url("/")))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::RetriesExhausted { attempts: 7, .. }));
    let sleeps = client.clock().sleeps();
    assert_eq!(sleeps.len(), 6);
    for (retry, sleep) in sleeps.iter().enumerate() {
        let bound = config.backoff_bound(u32::try_from(retry).unwrap());
        assert!(*sleep <= bound, "retry {retry}: {sleep:?} > {bound:?}");
    }
    assert_eq!(
        config.backoff_bound(5),
        Duration::from_millis(1_000),
        "capped"
    );
    server.stop().await;
}

#[tokio::test]
async fn it_slows_down_before_exhaustion_and_waits_for_a_shared_bucket() {
    // The server says 2 requests remain for 10 s in the bucket "b", then none.
    let remaining = |r: u64| {
        (
            StatusCode::OK,
            vec![
                ("ratelimit", format!(r#""b";r={r};t=10"#)),
                ("x-ratelimit-bucket", "b".to_owned()),
            ],
        )
    };
    let (server, _) = scripted(vec![remaining(2), remaining(1), remaining(0), remaining(5)]).await;
    let client = manual_client(RetryConfig::default(), SystemTime::UNIX_EPOCH + WALL);
    let route = |path: &str| {
        let request = client.http().get(server.url("/")).build().unwrap();
        let client = client.clone();
        let path = path.to_owned();
        async move { client.execute_on(&path, request).await.unwrap().status() }
    };
    assert_eq!(route("GET /a").await, StatusCode::OK);
    assert_eq!(route("GET /a").await, StatusCode::OK);
    assert_eq!(
        route("GET /b").await,
        StatusCode::OK,
        "route b knows no bucket yet"
    );
    assert_eq!(route("GET /a").await, StatusCode::OK);
    let sleeps = client.clock().sleeps();
    // 2 left for 10 s: route a's next request waits 5 s. Route b spends no
    // known bucket yet and goes at once; its response maps it to bucket "b"
    // with none left for 10 s, and route a, on the same bucket, waits 10 s.
    assert_eq!(sleeps, [Duration::from_secs(5), Duration::from_secs(10)]);
    server.stop().await;
}
