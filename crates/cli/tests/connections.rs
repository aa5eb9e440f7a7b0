//! The real `infertrace collect` process: SIGTERM with requests left hanging on the API and on
//! a receiver still exits (0) within the shutdown deadline plus a margin, and `check-config`
//! reads the TLS files a config names.

mod common;
#[path = "../../collector/tests/support_tls/mod.rs"]
mod support_tls;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use support_tls::TestPki;

/// A request whose head never ends (the API has no request bodies).
const HALF_HEAD: &str = "GET /health HTTP/1.1\r\nHost: x\r\n";
/// A receiver request whose head is complete and whose body never is.
const HALF_BODY: &str = "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\npartial";

#[test]
#[cfg(unix)]
fn sigterm_with_half_open_requests_exits_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    // Header timeouts far above the deadline: only the shutdown deadline can end these.
    std::fs::write(
        &config,
        "shutdown_timeout: 2s\napi:\n  connections: { header_read_timeout: 5m }\nreceivers:\n  otlp_http:\n    connections: { header_read_timeout: 5m }\n",
    )
    .unwrap();
    let mut c = Collector::start(["--no-store", "--config", config.to_str().unwrap()]);
    let mut hanging = Vec::new();
    for (port, request) in [(c.api, HALF_HEAD), (c.otlp_http, HALF_BODY)] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        hanging.push(s);
    }
    // Let the collector read what was sent before the signal.
    let (status, _) = http(c.api, "GET", "/health", "text/plain", b"");
    assert_eq!(status, 200);
    let started = Instant::now();
    let pid = c.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // While the requests drain, /health says the collector is going away.
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = http(c.api, "GET", "/health", "text/plain", b"");
    assert_eq!(status, 503, "{body}");
    // Deadline 2 s plus a generous margin for a busy machine.
    let bound = Duration::from_secs(32);
    let status = loop {
        if let Some(status) = c.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < bound,
            "the collector did not exit within {bound:?} of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    eprintln!("exited {took:?} after SIGTERM with two hanging requests (shutdown_timeout 2s)");
    assert!(status.success(), "exit status {status}");
    assert!(
        took >= Duration::from_millis(1900),
        "the hanging requests were given the deadline ({took:?})"
    );
    // Both hanging connections were closed by the collector.
    for mut s in hanging {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        assert!(s.read_to_end(&mut buf).is_ok(), "closed, not timed out");
    }
}

#[test]
fn check_config_reads_the_tls_files() {
    let pki = TestPki::generate();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        format!(
            "receivers:\n  otlp_grpc:\n    tls: {{ cert_file: {}, key_file: {} }}\napi:\n  tls: {{ cert_file: {}, key_file: {}, client_ca_file: {} }}\n",
            pki.server_cert.display(),
            pki.server_key.display(),
            pki.server_cert.display(),
            pki.server_key.display(),
            pki.ca.display(),
        ),
    )
    .unwrap();
    let out = bin().arg("check-config").arg(&good).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        format!(
            "receivers:\n  otlp_http:\n    tls: {{ cert_file: {}, key_file: {} }}\n",
            pki.server_cert.display(),
            pki.ca.display(), // a certificate where the key should be
        ),
    )
    .unwrap();
    let out = bin().arg("check-config").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("receivers.otlp_http.tls.key_file"), "{err}");
    assert!(err.contains(&pki.ca.display().to_string()), "{err}");
    assert!(err.contains("no private key found"), "{err}");

    let missing = dir.path().join("missing.yaml");
    std::fs::write(
        &missing,
        "api:\n  tls: { cert_file: /nonexistent/server.pem, key_file: /nonexistent/server.key }\n",
    )
    .unwrap();
    let out = bin().arg("check-config").arg(&missing).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("api.tls.cert_file (/nonexistent/server.pem): cannot read the file"),
        "{err}"
    );
}
