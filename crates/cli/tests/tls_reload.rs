//! `infertrace collect` as a process with TLS on every listener: SIGHUP re-reads the server
//! certificate, key and client CA. A new connection then sees the new certificate (and is
//! checked against the new client CA), a connection opened before goes on unaffected, and a bad
//! rotation (garbage PEM, a key that does not fit) changes nothing, is logged with the key and
//! the file, and is counted in `infertrace_reloads_total`.

mod common;
#[path = "../../collector/tests/support_tls/mod.rs"]
mod support_tls;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Ports, Process, collect};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use support_tls::TestPki;

type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A client trusting both test CAs (so it can connect whichever certificate is served),
/// offering `alpn`, presenting `cert` (certificate and key files) when given.
fn client(roots: &[&Path], alpn: &[&[u8]], cert: Option<(&Path, &Path)>) -> Arc<ClientConfig> {
    let mut store = RootCertStore::empty();
    for file in roots {
        for c in CertificateDer::pem_file_iter(file).unwrap() {
            store.add(c.unwrap()).unwrap();
        }
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(store);
    let mut config = match cert {
        None => builder.with_no_client_auth(),
        Some((c, k)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(c)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_file(k).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Connects and completes the TLS handshake (from the client's side).
fn connect(port: u16, config: &Arc<ClientConfig>) -> Result<Tls, String> {
    let mut sock = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut conn = ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).map_err(|e| e.to_string())?;
    }
    Ok(StreamOwned::new(conn, sock))
}

/// The end-entity certificate the server presented.
fn presented(tls: &Tls) -> Vec<u8> {
    tls.conn.peer_certificates().expect("a server certificate")[0].to_vec()
}

/// The end-entity certificate of a PEM file.
fn leaf(file: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(file).unwrap().to_vec()
}

/// One keep-alive HTTP/1.1 GET over `tls`: status and body, or why there was none (a refused
/// client certificate shows here: TLS 1.3 servers check it after the client's handshake ends).
fn get(tls: &mut Tls, path: &str) -> Result<(u16, String), String> {
    write!(tls, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    tls.flush().map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tls.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("closed after {} bytes", buf.len()));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no content-length in {head}"))?;
    while buf.len() < head_end + length {
        let n = tls.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed in the body".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();
    Ok((status, body))
}

/// The value of one sample line of `/metrics` (0 when absent).
fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
}

#[test]
fn sighup_reloads_the_certificates_of_every_listener() {
    let (a, b) = (TestPki::generate(), TestPki::generate());
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, clients) = (
        dir.path().join("server.pem"),
        dir.path().join("server.key"),
        dir.path().join("clients-ca.pem"),
    );
    copy(&a.server_cert, &cert);
    copy(&a.server_key, &key);
    copy(&a.ca, &clients);
    let tls = format!(
        "{{ cert_file: {}, key_file: {} }}",
        cert.display(),
        key.display()
    );
    let mtls = format!(
        "{{ cert_file: {}, key_file: {}, client_ca_file: {} }}",
        cert.display(),
        key.display(),
        clients.display()
    );
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!(
            // A long header timeout: the keep-alive connection opened before the reload waits
            // between its requests for as long as the machine takes (HTTP/1 applies it there).
            "receivers:\n  otlp_grpc:\n    tls: {tls}\n  otlp_http:\n    tls: {tls}\napi:\n  tls: {mtls}\n  connections: {{ header_read_timeout: 5m }}\n"
        ),
    )
    .unwrap();
    let ports = Ports::free();
    let (grpc, http, api) = (ports.grpc, ports.http, ports.api);
    let mut cmd = collect(&ports);
    cmd.args(["--no-store", "--config", config.to_str().unwrap()])
        .current_dir(dir.path());
    let mut p = Process::spawn(cmd, dir.path().join("stderr.log"));
    p.wait_log(&format!("API https://127.0.0.1:{api}"));

    let roots = [a.ca.as_path(), b.ca.as_path()];
    let h2 = client(&roots, &[b"h2"], None);
    let h1 = client(&roots, &[b"http/1.1"], None);
    let as_a = client(
        &roots,
        &[b"http/1.1"],
        Some((&a.client_cert, &a.client_key)),
    );
    let as_b = client(
        &roots,
        &[b"http/1.1"],
        Some((&b.client_cert, &b.client_key)),
    );
    let (cert_a, cert_b) = (leaf(&a.server_cert), leaf(&b.server_cert));
    assert_ne!(cert_a, cert_b);
    // Which of the two certificates a connection was shown.
    let name = |der: Vec<u8>| match der {
        d if d == cert_a => "A",
        d if d == cert_b => "B",
        _ => "another certificate",
    };
    let serves =
        |port: u16, config: &Arc<ClientConfig>| name(presented(&connect(port, config).unwrap()));

    // Certificate A everywhere; the API takes clients of CA A only.
    assert_eq!(serves(grpc, &h2), "A");
    assert_eq!(serves(http, &h1), "A");
    let mut before = connect(api, &as_a).unwrap();
    assert_eq!(name(presented(&before)), "A");
    assert_eq!(get(&mut before, "/health").unwrap().0, 200);
    let refused = |config: &Arc<ClientConfig>| {
        connect(api, config)
            .and_then(|mut t| get(&mut t, "/health"))
            .is_err()
    };
    assert!(refused(&as_b), "a client of CA B before the rotation");

    // Rotate to B (certificate, key, client CA), then SIGHUP.
    copy(&b.server_cert, &cert);
    copy(&b.server_key, &key);
    copy(&b.ca, &clients);
    p.hangup();
    p.wait_log("TLS of api reloaded");
    p.wait_log("TLS of otlp_grpc reloaded");
    p.wait_log("TLS of otlp_http reloaded");
    assert_eq!(serves(grpc, &h2), "B");
    assert_eq!(serves(http, &h1), "B");
    let mut after = connect(api, &as_b).unwrap();
    assert_eq!(name(presented(&after)), "B");
    assert_eq!(get(&mut after, "/health").unwrap().0, 200);
    assert!(
        refused(&as_a),
        "a client of the old CA is refused on a new connection"
    );
    // The connection opened before the reload is untouched: same session, still served.
    assert_eq!(get(&mut before, "/health").unwrap().0, 200);
    assert_eq!(name(presented(&before)), "A");

    // Garbage in the certificate file: every listener keeps B, and says why.
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
    p.hangup();
    let failed = "reloading the TLS certificate, key or client CA failed";
    let log = p.wait_log_times(failed, 3);
    for key in [
        "receivers.otlp_grpc.tls.cert_file",
        "receivers.otlp_http.tls.cert_file",
        "api.tls.cert_file",
    ] {
        assert!(
            log.contains(&format!("{key} ({})", cert.display())),
            "{log}"
        );
    }
    assert_eq!(serves(grpc, &h2), "B");
    assert_eq!(serves(http, &h1), "B");

    // A's certificate with B's key: refused ("does not fit"), B stays.
    copy(&a.server_cert, &cert);
    p.hangup();
    let log = p.wait_log_times(failed, 6);
    assert!(log.contains("does not fit the certificate"), "{log}");
    assert_eq!(serves(grpc, &h2), "B");
    assert_eq!(serves(http, &h1), "B");
    let mut c = connect(api, &as_b).unwrap();
    assert_eq!(name(presented(&c)), "B");

    // Counted: one good and two failed reloads per listener.
    let (status, metrics) = get(&mut c, "/metrics").unwrap();
    assert_eq!(status, 200);
    for what in ["tls_otlp_grpc", "tls_otlp_http", "tls_api"] {
        let n = |outcome: &str| {
            sample(
                &metrics,
                &format!("infertrace_reloads_total{{what=\"{what}\",outcome=\"{outcome}\"}}"),
            )
        };
        assert_eq!((n("ok"), n("failed")), (1, 2), "{what}:\n{metrics}");
    }
    // Nothing warned that there was nothing to reload.
    assert!(!p.log().contains("nothing to reload"), "{}", p.log());
}
