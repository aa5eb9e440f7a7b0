//! The dashboard test's machinery: a plain HTTP client and a headless Chromium driven through
//! chromedriver (WebDriver, with the `fantoccini` client).

pub mod traffic;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infertrace_e2e::free_port;
use serde_json::{Value, json};

/// A small HTTP/1 client.
pub struct HttpClient(HyperClient<HttpConnector, Full<Bytes>>);

impl Default for HttpClient {
    fn default() -> Self {
        Self(HyperClient::builder(TokioExecutor::new()).build_http())
    }
}

impl HttpClient {
    /// GET `url`: status and body.
    pub async fn get(&self, url: &str) -> (u16, Bytes) {
        let req = http::Request::get(url)
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send(req).await
    }

    /// GET `url` as JSON (panics unless 200).
    pub async fn json(&self, url: &str) -> Value {
        let (status, body) = self.get(url).await;
        assert_eq!(status, 200, "GET {url}: {}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }

    /// POST `body` to `url`: status and body.
    pub async fn post(&self, url: &str, content_type: &str, body: Vec<u8>) -> (u16, Bytes) {
        let req = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        self.send(req).await
    }

    async fn send(&self, req: http::Request<Full<Bytes>>) -> (u16, Bytes) {
        let resp = tokio::time::timeout(Duration::from_secs(10), self.0.request(req))
            .await
            .expect("request timed out")
            .expect("request failed");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    }
}

/// What the page shows, for failure messages.
const DEBUG_JS: &str = "return {
  status: document.getElementById('status').textContent,
  polls: document.body.dataset.polls,
  points: Array.from(document.querySelectorAll('[data-points]')).map(e => e.id + '=' + e.dataset.points).join(' '),
};";

/// A WebDriver command fantoccini has no method for (chromedriver's log and CDP endpoints).
#[derive(Debug)]
struct SessionCommand {
    method: http::Method,
    path: &'static str,
    body: Option<Value>,
}

impl WebDriverCompatibleCommand for SessionCommand {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        let session = session_id.unwrap_or_default();
        base_url.join(&format!("session/{session}/{}", self.path))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (
            self.method.clone(),
            self.body.as_ref().map(Value::to_string),
        )
    }
}

/// Where Chromium and chromedriver are, or why the test cannot run.
pub fn find_browser() -> Result<(PathBuf, PathBuf), String> {
    let pick = |env: &str, candidates: &[&str]| -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(env) {
            return Some(PathBuf::from(p));
        }
        candidates.iter().map(PathBuf::from).find(|p| p.exists())
    };
    let chromium = pick(
        "INFERTRACE_CHROMIUM",
        &["/usr/bin/chromium", "/usr/bin/chromium-browser"],
    )
    .ok_or("no Chromium (apt-get install chromium, or set INFERTRACE_CHROMIUM)")?;
    let driver = pick("INFERTRACE_CHROMEDRIVER", &["/usr/bin/chromedriver"]).ok_or(
        "no chromedriver (apt-get install chromium-driver, or set INFERTRACE_CHROMEDRIVER)",
    )?;
    Ok((chromium, driver))
}

/// A headless Chromium session; the session (so Chromium), chromedriver and the profile
/// directory go away on drop, also when the test panics.
pub struct Browser {
    pub client: Client,
    driver: Child,
    port: u16,
    session: Option<String>,
    profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(session) = &self.session {
            // Blocking on purpose: drop may run while a panic unwinds, with no runtime to await.
            end_session(self.port, session);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// `DELETE /session/{id}` to chromedriver, which makes Chromium exit.
fn end_session(port: u16, session: &str) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!(
        "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_ok() {
        let _ = stream.read_to_end(&mut Vec::new());
    }
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a fresh profile, window `w`×`h`.
    pub async fn start(chromium: &Path, driver: &Path, w: u32, h: u32) -> Browser {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("infertrace-chromedriver-{port}.log"));
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver.display()));
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let profile = std::env::temp_dir().join(format!("infertrace-chromium-{port}-{nanos}"));
        std::fs::create_dir_all(&profile).unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--hide-scrollbars",
                    format!("--user-data-dir={}", profile.display()),
                    format!("--window-size={w},{h}"),
                ],
            }),
        );
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "no WebDriver session from {} within 30 s: {e} (log: {})",
                        driver.display(),
                        log.display()
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let session = client.session_id().await.ok().flatten();
        Browser {
            client,
            driver: child,
            port,
            session,
            profile,
        }
    }

    /// Ends the WebDriver session (Chromium exits), then chromedriver.
    pub async fn close(mut self) {
        if self.client.clone().close().await.is_ok() {
            self.session = None;
        }
    }

    async fn command(
        &self,
        method: http::Method,
        path: &'static str,
        body: Option<Value>,
    ) -> Value {
        self.client
            .issue_cmd(SessionCommand { method, path, body })
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The browser console entries since the last call (chromedriver's `browser` log).
    pub async fn console(&self) -> Vec<Value> {
        let v = self
            .command(
                http::Method::POST,
                "se/log",
                Some(json!({"type": "browser"})),
            )
            .await;
        v.as_array().cloned().unwrap_or_default()
    }

    /// Runs a Chrome DevTools Protocol command.
    pub async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.command(
            http::Method::POST,
            "goog/cdp/execute",
            Some(json!({"cmd": cmd, "params": params})),
        )
        .await
    }

    /// Evaluates `script` (a function body; `arguments` are `args`) in the page.
    pub async fn eval(&self, script: &str, args: Vec<Value>) -> Value {
        self.client
            .execute(script, args)
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Waits until `script` returns a truthy value; returns it.
    pub async fn wait_until(&self, what: &str, script: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(script, vec![]).await;
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the page shows {}",
                self.eval(DEBUG_JS, vec![]).await
            );
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// Saves a screenshot of the viewport as PNG.
    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
