//! The live page in a real browser: a real `tollgate serve` takes traffic
//! (allowed, denied, shadow-denied, ad hoc), then headless Chromium loads
//! `GET /`, runs its script (which polls `/live.json`) and the DOM it renders
//! is checked: the counts by rule and result, the top denied keys, the shadow
//! rule's would-be denials, the store and the config with its last reload
//! error. With `--admin-token`, `/live.json` needs the token and the page
//! asks for it.
//!
//! Chromium is `/usr/bin/chromium` (Debian's `chromium`, which
//! `./scripts/test` installs when missing); without it these tests fail.
//! `TOLLGATE_LIVE_SCREENSHOT=<path.png>` also saves a screenshot of the
//! page (how `docs/live-page.png` is made).

use crate::common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::Server;
use reqwest::StatusCode;

const CHROMIUM: &str = "/usr/bin/chromium";
/// How long one Chromium run may take on a loaded machine.
const BROWSER: Duration = Duration::from_secs(90);
const RELOAD: Duration = Duration::from_secs(30);

const POLICY: &str = "\
domain: api
rules:
  - name: per-user
    match:
      - key: user
    algorithm: token-bucket
    limit: { requests: 5, per: 1h }
  - name: new-search-limit
    match:
      - key: route
        value: /search*
    algorithm: token-bucket
    limit: { requests: 3, per: 1h }
    shadow: true
";

/// Runs headless Chromium on `url` with `what` (`--dump-dom`, or
/// `--screenshot=...` and a window size) and gives what it wrote to stdout.
/// Virtual time lets the page's one-second polls run without waiting for
/// them.
fn chromium(url: &str, what: &[&str]) -> String {
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "headless Chromium is needed at {CHROMIUM}: `apt-get install chromium` \
         (./scripts/test installs it when missing)"
    );
    let profile = tempfile::tempdir().expect("a temp dir");
    let stderr = profile.path().join("stderr");
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(what)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).expect("a writable temp dir"))
        .spawn()
        .expect("chromium starts");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let (sent, received) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        let _ = sent.send(text);
    });
    let Ok(text) = received.recv_timeout(BROWSER) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("chromium did not finish within {BROWSER:?}");
    };
    let status = child.wait().expect("chromium can be waited for");
    let log = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(status.success(), "chromium failed: {status}\n{log}");
    text
}

/// The DOM once the page has rendered a poll: Chromium is run again (at
/// most a few times) while it shows none yet.
pub(crate) fn rendered_dom(url: &str) -> String {
    for _ in 0..3 {
        let dom = chromium(url, &["--dump-dom"]);
        if dom.contains(r#"id="status" class="ok""#) {
            return dom;
        }
    }
    panic!(
        "the page never rendered a poll of live.json: {}",
        chromium(url, &["--dump-dom"])
    );
}

/// The text of each cell of each body row of the table `id`.
pub(crate) fn rows(dom: &str, id: &str) -> Vec<Vec<String>> {
    let start = dom
        .find(&format!(r#"id="{id}""#))
        .unwrap_or_else(|| panic!("no table {id} in the page:\n{dom}"));
    let table = &dom[start..];
    let table = &table[..table.find("</table>").expect("the table ends")];
    let body = &table[table.find("<tbody").expect("a body")..];
    body.split("<tr")
        .skip(1)
        .map(|row| {
            row.split("<t")
                .skip(1)
                .filter(|cell| cell.starts_with('d') || cell.starts_with('h'))
                .map(|cell| {
                    let cell = &cell[cell.find('>').expect("a tag ends") + 1..];
                    text(cell.split("</t").next().unwrap_or_default())
                })
                .collect()
        })
        .collect()
}

/// `html` without its tags, with the entities a DOM dump uses decoded.
fn text(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&")
        .trim()
        .to_owned()
}

/// The row of `table` whose first cells are `first`.
pub(crate) fn row<'a>(table: &'a [Vec<String>], first: &[&str]) -> &'a [String] {
    table
        .iter()
        .find(|cells| cells.len() >= first.len() && cells.iter().zip(first).all(|(c, f)| c == f))
        .unwrap_or_else(|| panic!("no row starting {first:?} in {table:?}"))
}

/// The value of the key-value table `id` under `label`.
fn value(dom: &str, id: &str, label: &str) -> String {
    row(&rows(dom, id), &[label])[1].clone()
}

/// Sends `user`'s request (with a search route, which the shadow rule
/// counts) `times` times; how many were admitted.
async fn check(http: &reqwest::Client, server: &Server, user: &str, times: usize) -> usize {
    let body = serde_json::json!({
        "domain": "api",
        "descriptors": [
            {"entries": [{"key": "user", "value": user}]},
            {"entries": [{"key": "route", "value": "/search/books"}]},
        ],
    });
    let mut admitted = 0;
    for _ in 0..times {
        let response = http
            .post(server.url("/v1/check"))
            .json(&body)
            .send()
            .await
            .expect("the HTTP API answers");
        admitted += usize::from(response.status() == StatusCode::OK);
    }
    admitted
}

async fn adhoc(http: &reqwest::Client, server: &Server, key: &str, times: usize) {
    for _ in 0..times {
        http.post(server.url("/v1/check"))
            .json(&serde_json::json!({"key": key, "limit": 1, "period": "1h"}))
            .send()
            .await
            .expect("the HTTP API answers");
    }
}

#[tokio::test]
async fn the_page_shows_decisions_denied_keys_shadow_denials_store_and_config() {
    let server = Server::with_config(&[("api.yaml", POLICY)], &[]);
    let http = reqwest::Client::new();
    assert_eq!(check(&http, &server, "alice", 3).await, 3);
    // 5 admitted, 7 denied.
    assert_eq!(check(&http, &server, "mallory", 12).await, 5);
    adhoc(&http, &server, "tenant-7", 3).await;
    // A config that does not load: the old one stays, the page says why.
    std::fs::write(server.config_path().join("broken.yaml"), "domain: [").expect("writable");
    assert!(
        server.wait_for_log(&["config reload failed"], RELOAD).await,
        "no failed reload logged\n{}",
        server.log()
    );

    let url = server.url("/");
    let dom = rendered_dom(&url);

    let decisions = rows(&dom, "decisions");
    for (rule, result, total) in [
        ("per-user", "ok", "8"),
        ("per-user", "over_limit", "7"),
        ("new-search-limit", "ok", "3"),
        ("new-search-limit", "shadow_over_limit", "12"),
    ] {
        let cells = row(&decisions, &["api", rule, result]);
        assert_eq!(cells[4], total, "{rule} {result}: {cells:?}");
        let per_second: f64 = cells[3].parse().unwrap_or_else(|_| panic!("{cells:?}"));
        assert!(per_second >= 0.0, "{cells:?}");
    }
    assert_eq!(row(&decisions, &["ad hoc", "–", "over_limit"])[4], "2");

    let denied = rows(&dom, "top-denied");
    assert_eq!(denied[0], ["user=mallory", "api", "per-user", "7", "0"]);
    assert_eq!(denied[1], ["tenant-7", "ad hoc", "–", "2", "0"]);
    assert_eq!(denied.len(), 2, "{denied:?}");
    assert!(
        dom.contains("64 counters over 9 denials"),
        "the top-K's bound is stated"
    );

    assert_eq!(
        row(&rows(&dom, "shadow"), &["api", "new-search-limit"])[3],
        "12"
    );
    assert_eq!(
        rows(&dom, "top-shadow")[0],
        ["route=/search/books", "api", "new-search-limit", "12", "0"]
    );

    assert_eq!(value(&dom, "store", "kind"), "memory");
    assert_eq!(value(&dom, "store", "failed store calls"), "0");
    let keys: u64 = value(&dom, "store", "keys held").parse().expect("a count");
    assert!(keys >= 4, "alice, mallory, the route and tenant-7: {keys}");

    assert_eq!(value(&dom, "config", "version"), "1");
    assert_eq!(value(&dom, "config", "domains"), "api");
    assert_eq!(value(&dom, "config", "rules"), "2");
    let error = value(&dom, "config", "last reload error");
    assert!(error.contains("broken.yaml"), "{error}");
    assert!(value(&dom, "config", "last reload").contains("error (watch)"));

    // Fixed: the next version is in force; the last error is still shown.
    std::fs::remove_file(server.config_path().join("broken.yaml")).expect("removable");
    assert!(
        server.wait_for_log(&["config reloaded"], RELOAD).await,
        "no reload logged\n{}",
        server.log()
    );
    let live: serde_json::Value = http
        .get(server.url("/live.json"))
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON");
    let config = &live["config"];
    assert_eq!(config["version"], 2, "{config}");
    assert_eq!(config["last_reload"]["result"], "ok", "{config}");
    assert_eq!(config["last_error"]["result"], "error", "{config}");

    if let Some(path) = std::env::var_os("TOLLGATE_LIVE_SCREENSHOT") {
        let path = std::path::Path::new(&path);
        let shot = format!("--screenshot={}", path.display());
        chromium(&url, &[&shot, "--window-size=1280,1300"]);
        assert!(path.exists(), "no screenshot at {}", path.display());
    }
}

#[tokio::test]
async fn with_an_admin_token_the_data_needs_it_and_the_page_asks_for_it() {
    const TOKEN: &str = "live-s3cret";
    let server = Server::with_config(
        &[("api.yaml", POLICY)],
        &["--admin-token", TOKEN, "--admin-listen", "127.0.0.1:0"],
    );
    let admin = server.admin();
    let http = reqwest::Client::new();
    assert_eq!(check(&http, &server, "mallory", 6).await, 5);

    // The page and its data are where /metrics is: on the admin listener.
    for path in ["/", "/live.json"] {
        let response = http.get(server.url(path)).send().await.expect("answers");
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let live = format!("http://{admin}/live.json");
    let refused = http.get(&live).send().await.expect("answers");
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    let wrong = http
        .get(&live)
        .bearer_auth("nope")
        .send()
        .await
        .expect("answers");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let json: serde_json::Value = http
        .get(&live)
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("answers")
        .error_for_status()
        .expect("200 with the token")
        .json()
        .await
        .expect("JSON");
    assert_eq!(json["top_denied"]["keys"][0]["key"], "user=mallory");
    assert_eq!(json["top_denied"]["keys"][0]["count"], 1);

    // The page itself holds no data and needs no token.
    let page = http
        .get(format!("http://{admin}/"))
        .send()
        .await
        .expect("answers");
    assert_eq!(page.status(), StatusCode::OK);
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .expect("ASCII");
    assert!(policy.contains("default-src 'none'"), "{policy}");

    // Without the token it asks for one; given one (in the fragment, which
    // the browser never sends), it shows the data.
    let asks = chromium(&format!("http://{admin}/"), &["--dump-dom"]);
    assert!(asks.contains(r#"<form id="login">"#), "{asks}");
    assert!(asks.contains(r#"<main id="main" hidden="">"#), "{asks}");
    let dom = rendered_dom(&format!("http://{admin}/#token={TOKEN}"));
    assert_eq!(
        rows(&dom, "top-denied")[0],
        ["user=mallory", "api", "per-user", "1", "0"]
    );
}
