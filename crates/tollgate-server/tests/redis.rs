//! `tollgate serve --redis`: instances sharing one real `redis-server` share
//! their limits, and a Redis that cannot be reached at start-up is a clear error.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, rls_request, tollgate};

/// A `redis-server` on a free loopback port, killed when dropped.
struct Redis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    fn start() -> Redis {
        let port = free_port();
        let dir = tempfile::tempdir().expect("a temp dir");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (./scripts/test installs it through apt)");
        let redis = Redis {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

const HOURLY: &str = "domain: shared\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_one_limit() {
    let redis = Redis::start();
    let url = redis.url();
    let a = Server::with_config(&[("shared.yaml", HOURLY)], &["--redis", &url]);
    let b = Server::with_config(&[("shared.yaml", HOURLY)], &["--redis", &url]);
    let mut clients = [a.grpc_client().await, b.grpc_client().await];
    let mut admitted = 0;
    for i in 0..12 {
        let response = clients[i % 2]
            .should_rate_limit(rls_request("shared", &[&[("user", "alice")]]))
            .await
            .expect("answers")
            .into_inner();
        admitted += usize::from(response.overall_code == 1);
    }
    assert_eq!(
        admitted, 5,
        "two instances together admit the limit once, not twice"
    );
}

#[test]
fn an_unreachable_redis_at_start_up_is_a_clear_error() {
    let port = free_port();
    let output = tollgate()
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(["--redis", &format!("redis://127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot connect to Redis"), "{stderr}");
}
