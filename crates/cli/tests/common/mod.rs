//! What the CLI's process tests share: the binary, free ports, a minimal HTTP/1.1 client, an
//! `infertrace collect` child process that is killed when dropped (reading its stderr, or
//! logging it to a file and sent signals: [`Process`]), and OTLP/JSON traffic.

#![allow(dead_code)] // each test crate uses a different subset

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the process tests wait for something the collector does asynchronously.
pub const WAIT: Duration = Duration::from_secs(20);

/// The `infertrace` binary under test, without the `INFERTRACE_*` variables of the shell the
/// tests run in ([`isolate`]); a test sets the ones it needs.
pub fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infertrace"));
    isolate(&mut cmd);
    cmd
}

/// A loopback port free right now (the listener is closed again), never the same twice in this
/// process: the OS may hand a just-closed port out again, and one collector given the same port
/// for two listeners refuses to start.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind an ephemeral port")
            .local_addr()
            .expect("local addr")
            .port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// The three listen addresses of a collector under test.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// OTLP/gRPC.
    pub grpc: u16,
    /// OTLP/HTTP.
    pub http: u16,
    /// API, dashboard and /metrics.
    pub api: u16,
}

impl Ports {
    /// Three free loopback ports.
    pub fn free() -> Self {
        Self {
            grpc: free_port(),
            http: free_port(),
            api: free_port(),
        }
    }

    /// `collect` and its three listen flags on 127.0.0.1.
    pub fn collect_args(&self) -> Vec<String> {
        let addr = |port: u16| format!("127.0.0.1:{port}");
        vec![
            "collect".into(),
            "--otlp-grpc".into(),
            addr(self.grpc),
            "--otlp-http".into(),
            addr(self.http),
            "--listen".into(),
            addr(self.api),
        ]
    }
}

/// `infertrace collect` on `ports` ([`bin`]: no `INFERTRACE_*` from the shell); add flags such
/// as `--no-store` or `--config` to it.
pub fn collect(ports: &Ports) -> Command {
    let mut cmd = bin();
    cmd.args(ports.collect_args());
    cmd
}

/// Removes from `cmd`'s environment every `INFERTRACE_*` variable this process has (a
/// developer's config, tokens, log level or format would change what the tests see).
pub fn isolate(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("INFERTRACE_") {
            cmd.env_remove(name);
        }
    }
}

/// One HTTP/1.1 exchange with `Connection: close` (no client crate needed): status and body.
pub fn http(port: u16, method: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// `infertrace collect` on free ports, killed on drop.
pub struct Collector {
    /// The child process.
    pub child: Child,
    /// Its OTLP/HTTP port.
    pub otlp_http: u16,
    /// Its API port.
    pub api: u16,
    /// The first line it printed on stderr (where it listens, where history goes).
    pub startup_line: String,
}

impl Collector {
    /// Starts the collector with `extra` flags (e.g. `--no-store`, or `--data-dir DIR`) and
    /// waits for its startup line, which must name the API address.
    pub fn start<I, S>(extra: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let ports = Ports::free();
        let (otlp_http, api) = (ports.http, ports.api);
        let mut child = collect(&ports)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start infertrace collect");
        let mut line = String::new();
        BufReader::new(child.stderr.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.contains(&format!("127.0.0.1:{api}")),
            "startup line: {line}"
        );
        Self {
            child,
            otlp_http,
            api,
            startup_line: line,
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// OTLP/JSON of `n` infertrace requests of service `cli-test`, model `m`, ending just now:
/// 20 ms queue, 30 ms prefill, 100 ms decode, 11 output tokens; trace ids from `id_base` on.
pub fn traces(n: u64, id_base: u64) -> serde_json::Value {
    use serde_json::json;
    let now = infertrace_collector::store::unix_nanos_now();
    let ms = 1_000_000u64;
    let mut spans = Vec::new();
    for i in 0..n {
        let t0 = now - 200 * ms - i * ms;
        let trace = format!("{:032x}", id_base + i);
        let root = format!("{:016x}", 0x10 + i * 8);
        let kv = |k: &str, v: &str| json!({"key": k, "value": {"stringValue": v}});
        spans.push(json!({"traceId": trace, "spanId": root, "name": "chat m", "kind": 2,
            "startTimeUnixNano": t0.to_string(), "endTimeUnixNano": (t0 + 150 * ms).to_string(),
            "attributes": [kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", "m"), kv("infer.outcome", "ok"),
                           {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "11"}}]}));
        for (j, (name, a, b)) in [("queue", 0, 20), ("prefill", 20, 50), ("decode", 50, 150)]
            .into_iter()
            .enumerate()
        {
            spans.push(json!({"traceId": trace, "spanId": format!("{:016x}", 0x10 + i * 8 + j as u64 + 1),
                "parentSpanId": root, "name": name, "kind": 1,
                "startTimeUnixNano": (t0 + a * ms).to_string(), "endTimeUnixNano": (t0 + b * ms).to_string()}));
        }
    }
    json!({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "cli-test"}}]},
        "scopeSpans": [{"spans": spans}]}]})
}

/// A collector process whose stderr goes to a file; killed on drop.
pub struct Process {
    /// The child process.
    pub child: Child,
    log: PathBuf,
}

impl Process {
    /// Starts `cmd` with stdout discarded and stderr written to `log`.
    pub fn spawn(mut cmd: Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start infertrace collect");
        Self { child, log }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `what` (panics on exit or after [`WAIT`]).
    pub fn wait_log(&mut self, what: &str) -> String {
        self.wait_log_times(what, 1)
    }

    /// Waits until the log contains `what` at least `times` times (panics on exit or after
    /// [`WAIT`]).
    pub fn wait_log_times(&mut self, what: &str, times: usize) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let log = self.log();
            if log.matches(what).count() >= times {
                return log;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("collector exited ({status}) before logging {what:?} {times} times:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "{what:?} not {times} times in:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends it SIGHUP.
    pub fn hangup(&self) {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -HUP failed");
    }

    /// Sends it SIGTERM and waits for it to exit; asserts it exited 0.
    pub fn terminate(&mut self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -TERM failed");
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "{status}");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
