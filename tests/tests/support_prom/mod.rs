//! A real Prometheus for end-to-end tests: started on a free port with a temporary config and
//! TSDB directory, queried over its HTTP API, killed (and its directory removed) on drop.
//!
//! The binary is `$PROMETHEUS_BIN`, else `prometheus` on `PATH`, else `/usr/bin/prometheus`.
//! [`Prometheus::binary`] returns `None` only when none exists *and* `CI` is unset, so a
//! developer without Prometheus gets a clear skip while CI (which installs it, see .ci/run)
//! can never skip silently.

#![allow(dead_code)] // each test crate uses a different subset

pub mod dashboard;
pub mod python;
pub mod traffic;

/// Re-exported for the tests that use this module (one port registry per process).
pub use infertrace_e2e::free_port;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Finds an executable: `$env_var`, then `name` on `PATH`, then `/usr/bin/name`.
pub fn find_binary(env_var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env_var).map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let p = Path::new("/usr/bin").join(name);
        p.is_file().then_some(p)
    })
}

/// `Some(path)` of `name`, or `None` with a message when it is absent and `CI` is unset.
/// Panics when it is absent in CI: there the test must run.
pub fn require_binary(env_var: &str, name: &str, test: &str) -> Option<PathBuf> {
    match find_binary(env_var, name) {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => panic!(
            "{name} is not installed but CI is set: {test} must run in CI (.ci/run installs it; \
             or set {env_var})"
        ),
        None => {
            eprintln!(
                "SKIPPED {test}: `{name}` not found (set {env_var}, or `apt-get install prometheus`); \
                 in CI (CI set) this is a failure"
            );
            None
        }
    }
}

/// A fresh directory under the system temp dir, removed by [`TempDir`]'s drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `infertrace-<tag>-<pid>-<nanos>`.
    pub fn new(tag: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("infertrace-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tiny HTTP/1.1 client for loopback tests.
#[derive(Clone, Debug)]
pub struct HttpClient(Client<HttpConnector, Full<Bytes>>);

impl Default for HttpClient {
    fn default() -> Self {
        Self(Client::builder(TokioExecutor::new()).build_http())
    }
}

impl HttpClient {
    /// GET `url`: status and body.
    pub async fn get(&self, url: &str) -> Result<(u16, Bytes), String> {
        let req = http::Request::get(url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        self.send(req).await
    }

    /// POST `body` to `url` with `content_type`: status and body.
    pub async fn post(
        &self,
        url: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Bytes), String> {
        let req = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        self.send(req).await
    }

    async fn send(&self, req: http::Request<Full<Bytes>>) -> Result<(u16, Bytes), String> {
        let resp = tokio::time::timeout(Duration::from_secs(10), self.0.request(req))
            .await
            .map_err(|_| "request timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One sample of an instant query.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Labels (including `__name__` when kept).
    pub labels: BTreeMap<String, String>,
    /// The value (`NaN` and `±Inf` included).
    pub value: f64,
}

impl Sample {
    /// A label's value, or "".
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map(String::as_str).unwrap_or("")
    }
}

/// Parses Prometheus' sample value strings (`"1.5"`, `"NaN"`, `"+Inf"`, `"-Inf"`).
pub fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        other => other
            .parse()
            .map_err(|e| format!("bad sample value {other:?}: {e}")),
    }
}

/// A running Prometheus server.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    /// `127.0.0.1:port` of its HTTP API.
    pub addr: SocketAddr,
    dir: TempDir,
    http: HttpClient,
}

impl Prometheus {
    /// Starts `binary` with `config` (written as `prometheus.yml`) and `files` (name, content)
    /// beside it, and waits until it is ready.
    pub async fn start(binary: &Path, config: &str, files: &[(&str, &str)]) -> Self {
        let dir = TempDir::new("prometheus");
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write config");
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).expect("write file");
        }
        let port = free_port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut prom = Self {
            child,
            addr,
            dir,
            http: HttpClient::default(),
        };
        prom.wait_ready().await;
        prom
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = format!("http://{}/-/ready", self.addr);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("prometheus exited with {status}:\n{}", self.log());
            }
            if matches!(self.http.get(&url).await, Ok((200, _))) {
                return;
            }
            if Instant::now() > deadline {
                panic!("prometheus not ready after 20 s:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Prometheus' own log so far.
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.path().join("prometheus.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// GETs `/api/v1/{path}` and returns `data` of a `success` answer, or the error text.
    pub async fn api(&self, path_and_query: &str) -> Result<serde_json::Value, String> {
        let url = format!("http://{}/api/v1/{path_and_query}", self.addr);
        let (status, body) = self.http.get(&url).await?;
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
            format!(
                "HTTP {status}, not JSON ({e}): {}",
                String::from_utf8_lossy(&body)
            )
        })?;
        if v["status"] == "success" {
            Ok(v["data"].clone())
        } else {
            Err(format!(
                "HTTP {status}: {} {}",
                v["errorType"].as_str().unwrap_or(""),
                v["error"].as_str().unwrap_or("")
            ))
        }
    }

    /// Runs an instant query now. Vectors give one sample per series, scalars one unlabelled
    /// sample; errors (parse or evaluation) come back as `Err` with Prometheus' message.
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>, String> {
        let data = self
            .api(&format!("query?query={}", url_encode(expr)))
            .await?;
        let parse_pair = |pair: &serde_json::Value| -> Result<f64, String> {
            parse_value(pair[1].as_str().ok_or("sample value is not a string")?)
        };
        match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .ok_or("vector without result")?
                .iter()
                .map(|s| {
                    let labels = s["metric"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                                .collect()
                        })
                        .unwrap_or_default();
                    Ok(Sample {
                        labels,
                        value: parse_pair(&s["value"])?,
                    })
                })
                .collect(),
            Some("scalar") => Ok(vec![Sample {
                labels: BTreeMap::new(),
                value: parse_pair(&data["result"])?,
            }]),
            other => Err(format!("unexpected result type {other:?}")),
        }
    }

    /// The sum of an instant query's values (0 when empty).
    pub async fn query_sum(&self, expr: &str) -> Result<f64, String> {
        Ok(self.query(expr).await?.iter().map(|s| s.value).sum())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
