//! A small axum app behind Tollgate's layer: 5 requests per 10 seconds per
//! client address, from an inline policy.
//!
//! ```sh
//! cargo run -p tollgate-http --example axum
//! for i in $(seq 7); do curl -si localhost:3000/hello | grep -iE '^(HTTP|x-ratelimit|ratelimit|retry-after)'; done
//! ```

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use tollgate_http::{ClientIpConfig, ClientIpKey, HeaderStyle, RateLimitLayer};
use tollgate_policy::Policy;
use tollgate_store::MemoryStore;

const POLICY: &str = "
domain: example
rules:
  - name: per-ip
    match: [{ key: remote_address }]
    algorithm: gcra
    limit: { requests: 5, per: 10s }
";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::parse("inline policy", POLICY)?;
    // Behind a load balancer, trust its addresses: `ClientIpConfig::new()
    // .trust(["10.0.0.0/8".parse()?])` reads X-Forwarded-For from it only.
    let per_ip = ClientIpKey::new(ClientIpConfig::new());
    let limit = RateLimitLayer::builder("example", policy, MemoryStore::default())
        .descriptor(per_ip)
        .headers(HeaderStyle::ALL)
        .build();
    let app = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .layer(limit);

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    // The layer reads the peer address from `ConnectInfo`.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
