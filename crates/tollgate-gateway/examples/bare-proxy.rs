//! The gateway with no rate limit step: Tollgate's listeners, workers and
//! upstream pool forwarding every request ([`Gateway::spawn_bare`]). It is
//! the floor `scripts/bench-gateway` measures beside the gateway and NGINX:
//! what the proxy alone costs on Tollgate's stack, so that the rest of the
//! gateway's cost is the limiter's.
//!
//! ```text
//! cargo run --release -p tollgate-gateway --example bare-proxy -- LISTEN UPSTREAM
//! ```
//! e.g. `127.0.0.1:8000 http://127.0.0.1:9000`; it serves until killed.

use std::process::ExitCode;

use tollgate_gateway::{Gateway, Options, Settings};
use tollgate_policy::Policy;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, upstream] = args.as_slice() else {
        eprintln!("usage: bare-proxy LISTEN UPSTREAM (e.g. 127.0.0.1:8000 http://127.0.0.1:9000)");
        return ExitCode::from(2);
    };
    match serve(listen, upstream).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bare-proxy: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(listen: &str, upstream: &str) -> Result<(), Box<dyn std::error::Error>> {
    let options = Options {
        proxy_listen: Some(listen.to_owned()),
        upstream: Some(upstream.parse()?),
        ..Options::default()
    };
    let settings = Settings::resolve(options)?.ok_or("no gateway asked for")?;
    // The policy is only looked at by `bind`, to warn when it has no rules.
    let gateway = Gateway::bind(settings, &Policy::builtin()).await?;
    let (_stop, stopped) = tokio::sync::watch::channel(());
    gateway.spawn_bare(stopped).await??;
    Ok(())
}
