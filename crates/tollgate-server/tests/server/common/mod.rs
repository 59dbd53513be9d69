//! Starts the real `tollgate serve` binary on free ports and talks to it.
//!
//! Shared by every module of the test binary.

pub(crate) use tollgate_testkit::pki;
pub(crate) use tollgate_testkit::{RedisServer as Redis, free_port};

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// Generous: a loaded 2-core machine may take a while to start a process.
pub(crate) const STARTUP: Duration = Duration::from_secs(60);
/// How long a shutdown may take before a test fails.
pub(crate) const SHUTDOWN: Duration = Duration::from_secs(30);

/// A running `tollgate serve`, killed when dropped.
pub(crate) struct Server {
    child: Child,
    /// Where the HTTP API listens.
    pub(crate) http: SocketAddr,
    /// Where the gRPC service listens.
    pub(crate) grpc: SocketAddr,
    log: Arc<Log>,
    /// The config directory, if the test gave files; removed when dropped.
    pub(crate) config: Option<tempfile::TempDir>,
}

/// The binary, with no `TOLLGATE_*`, envoyproxy/ratelimit variable or
/// `RUST_LOG` from the environment.
pub(crate) fn tollgate() -> Command {
    clean(Command::new(env!("CARGO_BIN_EXE_tollgate")))
}

/// The binary under the name `ratelimit` (a symlink in `dir`), as
/// envoyproxy/ratelimit's image runs it, with nothing from the environment
/// (`RUST_LOG` neither: `LOG_LEVEL` says).
pub(crate) fn ratelimit(dir: &Path) -> Command {
    let link = dir.join("ratelimit");
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), &link)
            .expect("a symlink in the temp dir");
    }
    let mut command = clean(Command::new(link));
    command.env_remove("RUST_LOG");
    command
}

/// Runs `command` to its exit (bounded by [`STARTUP`], then killed): its
/// status and stderr. The wait is a thread's, woken when the child exits.
pub(crate) fn exit_of(mut command: Command) -> (ExitStatus, String) {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let id = child.id();
    let (done, exited) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let Ok(output) = exited.recv_timeout(STARTUP) else {
        // Killed, so that the waiting thread and the test end.
        let _ = Command::new("kill").args(["-9", &id.to_string()]).status();
        panic!("{command:?} did not exit within {STARTUP:?}");
    };
    let output = output.expect("the child can be waited for");
    let stderr = String::from_utf8(output.stderr).expect("stderr is UTF-8");
    (output.status, stderr)
}

/// The binary run by `sh` with at most `files` open files (soft and hard
/// limit), so that it cannot raise its own.
pub(crate) fn tollgate_with_file_limit(files: u32) -> Command {
    let mut command = Command::new("sh");
    command.args([
        "-c",
        &format!("ulimit -n {files} && exec \"$0\" \"$@\""),
        env!("CARGO_BIN_EXE_tollgate"),
    ]);
    clean(command)
}

fn clean(mut command: Command) -> Command {
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("TOLLGATE_") {
            command.env_remove(var);
        }
    }
    for var in tollgate_server::serve::ENVOY_VARIABLES {
        command.env_remove(var);
    }
    command.env("RUST_LOG", "info");
    command
}

/// A temp directory holding `files` (name, contents).
pub(crate) fn config_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    for (name, contents) in files {
        std::fs::write(dir.path().join(name), contents).expect("a writable temp dir");
    }
    dir
}

impl Server {
    /// Starts `tollgate serve` on port 0 for both APIs with `args` added.
    pub(crate) fn start(args: &[&str]) -> Server {
        Self::spawn(tollgate(), &serve_args(args), None)
    }

    /// Starts it with a config directory holding `files`.
    pub(crate) fn with_config(files: &[(&str, &str)], args: &[&str]) -> Server {
        Self::with_config_by(tollgate(), files, args)
    }

    /// Starts it with a config directory holding `files`, by `command`.
    pub(crate) fn with_config_by(
        command: Command,
        files: &[(&str, &str)],
        args: &[&str],
    ) -> Server {
        let dir = config_dir(files);
        let path = dir.path().to_str().expect("a UTF-8 temp path").to_owned();
        let mut all = vec!["--config", path.as_str()];
        all.extend_from_slice(args);
        Self::spawn(command, &serve_args(&all), Some(dir))
    }

    /// Runs `command args...` and waits for both listeners' log lines.
    pub(crate) fn spawn(
        mut command: Command,
        args: &[&str],
        config: Option<tempfile::TempDir>,
    ) -> Server {
        let mut child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the tollgate binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Log::default());
        let (lines, received) = mpsc::channel();
        let shared = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                shared.push(&line);
                let _ = lines.send(line);
            }
        });
        let (http, grpc) = match wait_for_listeners(&received) {
            Ok(addresses) => addresses,
            Err(why) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = log.text();
                panic!("tollgate serve did not start: {why}\n{log}");
            }
        };
        Server {
            child,
            http,
            grpc,
            log,
            config,
        }
    }

    /// Everything the server logged so far.
    pub(crate) fn log(&self) -> String {
        self.log.text()
    }

    /// Waits (bounded) until the log has a line containing every `needle`.
    pub(crate) async fn wait_for_log(&self, needles: &[&str], within: Duration) -> bool {
        let needles: Vec<String> = needles.iter().map(|n| (*n).to_owned()).collect();
        let log = Arc::clone(&self.log);
        tokio::task::spawn_blocking(move || {
            log.wait_for(within, |text| {
                text.lines()
                    .any(|line| needles.iter().all(|n| line.contains(n.as_str())))
            })
        })
        .await
        .expect("the wait does not panic")
    }

    /// Waits (bounded) until `done(log)` holds for everything logged so
    /// far, woken by each line; whether it held.
    pub(crate) async fn wait_until(
        &self,
        within: Duration,
        done: impl FnMut(&str) -> bool + Send + 'static,
    ) -> bool {
        let log = Arc::clone(&self.log);
        tokio::task::spawn_blocking(move || log.wait_for(within, done))
            .await
            .expect("the wait does not panic")
    }

    /// Where the gateway listens (`--proxy-listen`); it logs this before
    /// the HTTP and gRPC lines that `spawn` waits for.
    pub(crate) fn gateway(&self) -> SocketAddr {
        let found = self
            .log
            .text()
            .lines()
            .find_map(|line| address_after(line, "listening for the gateway on "));
        found.unwrap_or_else(|| panic!("no gateway listener in the log\n{}", self.log()))
    }

    /// Where the admin listener listens (`--admin-listen`); logged before
    /// the HTTP and gRPC lines.
    pub(crate) fn admin(&self) -> SocketAddr {
        let found = self
            .log
            .text()
            .lines()
            .find_map(|line| address_after(line, "listening for admin on "));
        found.unwrap_or_else(|| panic!("no admin listener in the log\n{}", self.log()))
    }

    /// The config directory.
    pub(crate) fn config_path(&self) -> &Path {
        self.config.as_ref().expect("started with a config").path()
    }

    /// The process's id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://<http address><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// A gRPC client of the rate limit service.
    pub(crate) async fn grpc_client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("the gRPC listener accepts")
    }

    /// Sends `signal` (e.g. `TERM`) and waits (bounded) for the process to exit.
    pub(crate) fn stop_with(&mut self, signal: &str) -> ExitStatus {
        self.signal(signal);
        self.wait(SHUTDOWN)
            .unwrap_or_else(|| panic!("no exit within {SHUTDOWN:?} of SIG{signal}\n{}", self.log()))
    }

    /// Sends `signal` (e.g. `TERM`) without waiting.
    pub(crate) fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{signal} failed");
    }

    /// Waits up to `within` for the process to exit.
    pub(crate) fn wait(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("the child can be polled") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve` on port 0 for both APIs, then `args`.
fn serve_args<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"];
    all.extend_from_slice(args);
    all
}

fn wait_for_listeners(lines: &Receiver<String>) -> Result<(SocketAddr, SocketAddr), String> {
    let deadline = Instant::now() + STARTUP;
    let (mut http, mut grpc) = (None, None);
    while http.is_none() || grpc.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!("no listener lines within {STARTUP:?}"));
            }
            Err(RecvTimeoutError::Disconnected) => return Err("the process exited".into()),
        };
        if let Some(addr) = address_after(&line, "listening for HTTP on ") {
            http = Some(addr);
        }
        if let Some(addr) = address_after(&line, "listening for gRPC on ") {
            grpc = Some(addr);
        }
    }
    Ok((
        http.unwrap_or_else(|| unreachable!()),
        grpc.unwrap_or_else(|| unreachable!()),
    ))
}

/// The number after `marker` in the first log line that has it.
pub(crate) fn logged_number(log: &str, marker: &str) -> usize {
    log.lines()
        .find_map(|line| {
            let rest = &line[line.find(marker)? + marker.len()..];
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {marker} in the log:\n{log}"))
}

/// The socket address that follows `marker` in a log line.
pub(crate) fn address_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(marker)? + marker.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// A `RateLimitRequest` for `domain` with one descriptor per entry list.
pub(crate) fn rls_request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| descriptor(entries))
            .collect(),
        hits_addend: 0,
    }
}

/// One descriptor of `entries`.
pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A log as it is written (a process's stderr, or this process's
/// subscriber), which a test can wait on without polling.
#[derive(Default)]
pub(crate) struct Log {
    text: Mutex<String>,
    grew: std::sync::Condvar,
}

impl Log {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        self.text.lock().expect("log lock").clone()
    }

    /// Appends `line` and wakes the waiters.
    fn push(&self, line: &str) {
        let mut text = self.text.lock().expect("log lock");
        text.push_str(line);
        text.push('\n');
        self.grew.notify_all();
    }

    /// Blocks until `done(text)` holds, woken by each write, for at most
    /// `within`; whether it held.
    pub(crate) fn wait_for(&self, within: Duration, mut done: impl FnMut(&str) -> bool) -> bool {
        let text = self.text.lock().expect("log lock");
        let (text, waited) = self
            .grew
            .wait_timeout_while(text, within, |text| !done(text))
            .expect("log lock");
        drop(text);
        !waited.timed_out()
    }
}

/// Installs a subscriber writing this process's log into the [`Log`] it
/// gives (global: the reload watcher logs from tokio's blocking pool).
pub(crate) fn capture_log() -> Arc<Log> {
    let captured = Arc::new(Log::default());
    let writer = Arc::clone(&captured);
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || LogWriter(Arc::clone(&writer)))
        .try_init()
        .expect("no other subscriber in this test process");
    captured
}

struct LogWriter(Arc<Log>);

impl std::io::Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut text = self.0.text.lock().expect("log lock");
        text.push_str(&String::from_utf8_lossy(bytes));
        self.0.grew.notify_all();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A raw HTTP/2 connection to `addr` (a gRPC port), driven on its own task:
/// for calls whose frames a test sends itself (split, held, cut short),
/// which a gRPC client does not.
pub(crate) async fn h2_connection<B>(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<B>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
)
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("an HTTP/2 connection");
    (sender, tokio::spawn(conn))
}
