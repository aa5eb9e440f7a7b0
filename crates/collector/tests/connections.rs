//! Connection faults against the whole collector over loopback, with low limits so they run in
//! seconds: an idle-connection flood (capped, refused and counted, idle ones closed), slow-loris
//! headers (cut at the header timeout, HTTP/1 and HTTP/2), idle HTTP/1 keep-alive and HTTP/2
//! connections (closed), half-open requests at shutdown (cut at the deadline), and TLS / mutual
//! TLS on all three listeners with real rustls clients.

mod support;
mod support_tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use infertrace_collector::config::{CollectorConfig, ConnectionsConfig};
use infertrace_collector::internal_events::{ConnectionCloseLabels, ListenerLabels};
use infertrace_collector::server::{self, RunningCollector};
use prost::Message;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use support::*;
use support_tls::TestPki;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bound of every wait in this file: far above what each check needs on a busy machine.
const WAIT: Duration = Duration::from_secs(30);

fn connections(max: usize, idle: Duration, header: Duration) -> ConnectionsConfig {
    ConnectionsConfig {
        max,
        idle_timeout: idle,
        header_read_timeout: header,
        ..ConnectionsConfig::default()
    }
}

/// The test config with bearer tokens from a file holding `lines` (kept while the directory
/// returned lives).
fn with_tokens(lines: &str) -> (CollectorConfig, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, lines).unwrap();
    let mut config = test_config();
    config.auth.tokens_file = Some(tokens);
    (config, dir)
}

fn refused(c: &RunningCollector, listener: &'static str) -> u64 {
    c.events()
        .connections_refused
        .get_or_create(&ListenerLabels { listener })
        .get()
}

fn open(c: &RunningCollector, listener: &'static str) -> i64 {
    c.events()
        .connections_open
        .get_or_create(&ListenerLabels { listener })
        .get()
}

fn closed(c: &RunningCollector, listener: &'static str, reason: &'static str) -> u64 {
    c.events()
        .connections_closed
        .get_or_create(&ConnectionCloseLabels { listener, reason })
        .get()
}

/// Whether the peer closed `s` within `within` (EOF or reset); `false` if it is still open.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // an answer (e.g. 408): keep reading until the close
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_flood_is_capped_refused_and_counted() {
    let mut config = test_config();
    // Long timeouts: the flood must be held, not timed out, while it is counted.
    config.receivers.otlp_http.connections =
        connections(100, Duration::from_secs(120), Duration::from_secs(120));
    let c = server::run(config, std::future::pending()).await.unwrap();
    let addr = c.http_addr.unwrap();
    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(TcpStream::connect(addr).await.unwrap());
    }
    eventually(WAIT, "200 connections refused", || {
        refused(&c, "otlp_http") == 200
    })
    .await;
    eventually(WAIT, "100 connections held", || {
        open(&c, "otlp_http") == 100
    })
    .await;
    // The refused ones see their connection closed; the held ones stay open.
    let mut shut = 0;
    for s in &mut flood {
        if closed_within(s, Duration::from_millis(100)).await {
            shut += 1;
        }
    }
    assert_eq!(
        shut, 200,
        "the connections over the limit are closed at once"
    );
    assert_eq!(open(&c, "otlp_http"), 100);
    assert_eq!(
        refused(&c, "otlp_http"),
        200,
        "no more refusals than the flood"
    );
    // The other listeners are unaffected, and the metrics say what happened.
    let (status, metrics) = get(c.api_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(
            &metrics,
            "infertrace_connections_refused_total{listener=\"otlp_http\"}"
        ),
        Some(200.0),
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "infertrace_connections_open{listener=\"otlp_http\"}"
        ),
        Some(100.0)
    );
    // Freeing held connections lets new ones in.
    flood.clear();
    eventually(WAIT, "the flood's connections released", || {
        open(&c, "otlp_http") == 0
    })
    .await;
    let spans = infertrace_spans(&Req::new(1, "m", 10, 20, 300), t0());
    assert_eq!(post_protobuf(addr, &request("llm", spans)).await, 200);
    c.stop().await.unwrap();
}

/// Every TLS error of a failed [`CollectorConfig::tls_server_configs`], a line each.
fn every_error<T>(result: Result<T, Vec<infertrace_collector::config::TlsError>>) -> String {
    match result {
        Ok(_) => panic!("the TLS files were expected to fail"),
        Err(errors) => errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// The frames of an HTTP/2 byte stream from the server (after the client's preface), as (type,
/// stream id): each frame a 9-byte header — 24-bit length, type, flags, stream id — and its
/// payload.
fn h2_frames(bytes: &[u8]) -> Vec<(u8, u32)> {
    let (mut frames, mut i) = (Vec::new(), 0);
    while i + 9 <= bytes.len() {
        let len = u32::from_be_bytes([0, bytes[i], bytes[i + 1], bytes[i + 2]]) as usize;
        let stream = u32::from_be_bytes([bytes[i + 5], bytes[i + 6], bytes[i + 7], bytes[i + 8]]);
        frames.push((bytes[i + 3], stream & 0x7fff_ffff));
        i += 9 + len;
    }
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_gets_a_goaway_before_it_is_closed() {
    let mut config = test_config();
    config.receivers.otlp_grpc.connections =
        connections(100, Duration::from_secs(1), Duration::from_secs(60));
    let c = server::run(config, std::future::pending()).await.unwrap();
    let mut s = TcpStream::connect(c.grpc_addr.unwrap()).await.unwrap();
    // The client preface and an empty SETTINGS frame, then nothing.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(WAIT, s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the idle connection is closed");
    let types: Vec<u8> = h2_frames(&got).into_iter().map(|(t, _)| t).collect();
    // 4 SETTINGS, 8 WINDOW_UPDATE, 7 GOAWAY.
    assert!(
        types.contains(&7),
        "a GOAWAY before the close, so the client reconnects rather than meets a reset: frame \
         types {types:?}"
    );
    eventually(WAIT, "the close counted", || {
        closed(&c, "otlp_grpc", "idle_timeout") == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_http1_keepalive_and_http2() {
    let mut config = test_config();
    let idle = Duration::from_secs(1);
    config.receivers.otlp_http.connections = connections(100, idle, Duration::from_secs(60));
    config.receivers.otlp_grpc.connections = connections(100, idle, Duration::from_secs(60));
    let c = server::run(config, std::future::pending()).await.unwrap();

    // 50 connections that never send anything.
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(TcpStream::connect(c.http_addr.unwrap()).await.unwrap());
    }
    // An HTTP/1.1 keep-alive connection after one request.
    let mut keepalive = TcpStream::connect(c.http_addr.unwrap()).await.unwrap();
    keepalive
        .write_all(b"GET /v1/traces HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = keepalive.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 405"),
        "answered, kept alive"
    );
    // An HTTP/2 connection that did one export and has no open stream since.
    let stream = TcpStream::connect(c.grpc_addr.unwrap()).await.unwrap();
    let (mut sender, h2conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let h2 = tokio::spawn(h2conn);
    let req = http::Request::post(format!(
        "http://{}/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        c.grpc_addr.unwrap()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(grpc_frame(
        &request("llm", vec![]).encode_to_vec(),
    )))
    .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.into_body().collect().await.unwrap();

    for s in &mut silent {
        assert!(closed_within(s, WAIT).await, "an idle connection is closed");
    }
    assert!(closed_within(&mut keepalive, WAIT).await);
    // The client's connection task ends when the server closes the connection.
    tokio::time::timeout(WAIT, h2)
        .await
        .expect("the idle HTTP/2 connection is closed")
        .unwrap()
        .ok();
    eventually(WAIT, "closes counted", || {
        closed(&c, "otlp_grpc", "idle_timeout") == 1
            && closed(&c, "otlp_http", "idle_timeout") == 51
    })
    .await;
    assert_eq!(
        closed(&c, "otlp_http", "header_timeout"),
        0,
        "the idle timeout (1 s) is shorter than the header timeout (60 s)"
    );
    // A connection's task counts its close, then ends and leaves the open gauge: a moment
    // later under load.
    eventually(WAIT, "no connection left open", || {
        open(&c, "otlp_http") + open(&c, "otlp_grpc") == 0
    })
    .await;
    c.stop().await.unwrap();
}

fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = vec![0u8];
    out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_at_the_header_timeout() {
    let mut config = test_config();
    let header = Duration::from_secs(1);
    config.receivers.otlp_http.connections = connections(100, Duration::from_secs(60), header);
    config.receivers.otlp_grpc.connections = connections(100, Duration::from_secs(60), header);
    config.api.connections = connections(100, Duration::from_secs(60), header);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let head = b"POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-protobuf\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    for (addr, listener) in [(c.http_addr.unwrap(), "otlp_http"), (c.api_addr, "api")] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        // One byte every 100 ms: the whole head would take ~14 s, the timeout is 1 s.
        let mut sent = 0;
        let mut cut = false;
        for b in head {
            if s.write_all(&[*b]).await.is_err() {
                cut = true;
                break;
            }
            sent += 1;
            let mut buf = [0u8; 256];
            if let Ok(r) = tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await
            {
                // An answer (408) or the close: the server gave up on the head.
                let _ = r;
                cut = true;
                break;
            }
        }
        assert!(
            cut,
            "{listener}: a slow head is cut before it is complete ({sent} of {} bytes sent in {:?})",
            head.len(),
            started.elapsed()
        );
        assert!(sent < head.len());
        eventually(WAIT, "header timeout counted", || {
            closed(&c, listener, "header_timeout") == 1
        })
        .await;
    }
    // HTTP/2: a connection that sends half of the preface and nothing more.
    let mut s = TcpStream::connect(c.grpc_addr.unwrap()).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert!(
        closed_within(&mut s, WAIT).await,
        "a stalled preface is cut"
    );
    eventually(WAIT, "h2 header timeout counted", || {
        closed(&c, "otlp_grpc", "header_timeout") == 1
    })
    .await;
    c.stop().await.unwrap();
}

/// A kept-alive HTTP/1 connection waiting for its next request (an exporter between exports)
/// is idle, not a slow head: hyper's head timeout that closes it counts as `idle_timeout`,
/// which is not logged (a review saw a warn line a minute from an idle exporter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_between_requests_closes_as_idle() {
    let mut config = test_config();
    config.receivers.otlp_http.connections =
        connections(100, Duration::from_secs(60), Duration::from_millis(500));
    let c = server::run(config, std::future::pending()).await.unwrap();
    let mut s = TcpStream::connect(c.http_addr.unwrap()).await.unwrap();
    let body = request("llm", vec![]).encode_to_vec();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    let mut answer = [0u8; 512];
    let n = s.read(&mut answer).await.unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&answer[..n])
    );
    // Then nothing: closed after the head timeout, as idle.
    assert!(
        closed_within(&mut s, WAIT).await,
        "the idle connection is closed"
    );
    eventually(WAIT, "the close counted", || {
        closed(&c, "otlp_http", "idle_timeout") == 1
    })
    .await;
    assert_eq!(closed(&c, "otlp_http", "header_timeout"), 0);
    c.stop().await.unwrap();
}

/// A request that never completes: `request` is written and nothing more.
async fn half_open(addr: SocketAddr, request: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    s
}

/// A receiver request whose head is complete and whose body never is.
const HALF_BODY: &str = "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\npartial";
/// An API request whose head never ends (the API has no request bodies).
const HALF_HEAD: &str = "GET /health HTTP/1.1\r\nHost: localhost\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_half_open_requests_at_the_deadline() {
    let mut config = test_config();
    config.shutdown_timeout = Duration::from_secs(1);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let mut receiver = half_open(c.http_addr.unwrap(), HALF_BODY).await;
    let mut api = half_open(c.api_addr, HALF_HEAD).await;
    // A plain idle API connection too.
    let mut idle = TcpStream::connect(c.api_addr).await.unwrap();
    eventually(WAIT, "connections accepted", || {
        open(&c, "otlp_http") == 1 && open(&c, "api") == 2
    })
    .await;
    let events = c.events().clone();
    let started = Instant::now();
    let report = tokio::time::timeout(WAIT, c.stop())
        .await
        .expect("shutdown ends despite half-open requests");
    report.unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "in-flight requests were given the deadline ({took:?})"
    );
    for s in [&mut receiver, &mut api, &mut idle] {
        assert!(closed_within(s, Duration::from_secs(5)).await);
    }
    let cut = |listener| {
        events
            .connections_closed
            .get_or_create(&ConnectionCloseLabels {
                listener,
                reason: "shutdown",
            })
            .get()
    };
    assert_eq!(cut("otlp_http"), 1);
    // The API stops after the receivers, which used the whole deadline: the hanging request is
    // cut; the idle connection is either closed by the drain or cut in the same instant.
    assert!((1..=2).contains(&cut("api")), "{}", cut("api"));
}

/// A rustls client trusting the test CA, offering `alpn`, presenting `client` (certificate and
/// key files) when given.
fn client_config(
    pki: &TestPki,
    alpn: &[&[u8]],
    client: Option<(&std::path::Path, &std::path::Path)>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&pki.ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// GET over HTTP/1.1 on TLS; `Err` when the handshake or the exchange fails.
async fn tls_get(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<(u16, String), Box<dyn std::error::Error + Send + Sync>> {
    let tls = tls_connect(addr, config).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls_on_every_listener() {
    let pki = TestPki::generate();
    let mut config = test_config();
    config.receivers.otlp_grpc.tls = Some(pki.server_tls(false));
    config.receivers.otlp_http.tls = Some(pki.server_tls(false));
    config.api.tls = Some(pki.server_tls(true));
    let c = server::run(config, std::future::pending()).await.unwrap();
    let plain = client_config(&pki, &[b"h2", b"http/1.1"], None);
    let with_cert = client_config(
        &pki,
        &[b"h2", b"http/1.1"],
        Some((&pki.client_cert, &pki.client_key)),
    );
    let other_ca = client_config(
        &pki,
        &[b"http/1.1"],
        Some((&pki.other_client_cert, &pki.other_client_key)),
    );

    // gRPC over TLS: ALPN h2, an export accepted.
    let tls = tls_connect(c.grpc_addr.unwrap(), plain.clone())
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let spans = infertrace_spans(&Req::new(1, "m", 10, 20, 300), t0());
    let req = http::Request::post(
        "https://localhost/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    )
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(grpc_frame(
        &request("llm", spans).encode_to_vec(),
    )))
    .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..]),
        "{trailers:?}"
    );

    // OTLP/HTTP over TLS (HTTP/1.1 by ALPN).
    let tls = tls_connect(
        c.http_addr.unwrap(),
        client_config(&pki, &[b"http/1.1"], None),
    )
    .await
    .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let spans = infertrace_spans(&Req::new(2, "m", 10, 20, 300), t0());
    let req = http::Request::post("/v1/traces")
        .header("host", "localhost")
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::from(
            request("llm", spans).encode_to_vec(),
        )))
        .unwrap();
    assert_eq!(sender.send_request(req).await.unwrap().status(), 200);
    let p = c.pipeline().clone();
    eventually(WAIT, "both requests recorded", || {
        p.requests_recorded() == 2
    })
    .await;

    // Plain text on a TLS port is not served.
    let (status, _) = tokio::time::timeout(WAIT, async {
        let mut s = TcpStream::connect(c.http_addr.unwrap()).await.unwrap();
        s.write_all(b"GET /v1/traces HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf).await;
        (buf.starts_with(b"HTTP/1.1"), ())
    })
    .await
    .unwrap();
    assert!(!status, "no HTTP answer in plain text on a TLS port");

    // Mutual TLS on the API: a client certificate from the CA is accepted...
    let (status, body) = tls_get(c.api_addr, with_cert.clone(), "/health")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, metrics) = tls_get(c.api_addr, with_cert, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("infertrace_receiver_spans_total"));
    // ...no certificate, or one from another CA, is refused.
    assert!(tls_get(c.api_addr, plain, "/health").await.is_err());
    assert!(tls_get(c.api_addr, other_ca, "/health").await.is_err());
    eventually(WAIT, "refused handshakes counted", || {
        closed(&c, "api", "tls_handshake") == 2
    })
    .await;
    c.stop().await.unwrap();
}

#[tokio::test]
async fn unreadable_or_invalid_tls_files_stop_the_start_naming_key_and_file() {
    let pki = TestPki::generate();
    let mut config = test_config();
    let mut tls = pki.server_tls(false);
    tls.key_file = pki.dir.path().join("missing.key");
    config.receivers.otlp_http.tls = Some(tls);
    let e = server::run(config, std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("receivers.otlp_http.tls.key_file"), "{e}");
    assert!(e.contains("missing.key"), "{e}");

    let mut config = test_config();
    let mut tls = pki.server_tls(true);
    tls.client_ca_file = Some(pki.server_key.clone()); // a key, not a certificate
    config.api.tls = Some(tls);
    let e = every_error(config.tls_server_configs());
    assert!(e.contains("api.tls.client_ca_file"), "{e}");
    assert!(e.contains("no certificate found"), "{e}");

    let mut config = test_config();
    let mut tls = pki.server_tls(false);
    tls.key_file = pki.client_key.clone(); // a key of another certificate
    config.receivers.otlp_grpc.tls = Some(tls);
    let e = every_error(config.tls_server_configs());
    assert!(e.contains("receivers.otlp_grpc.tls.key_file"), "{e}");
    assert!(e.contains("does not fit"), "{e}");
}

#[test]
fn connection_limits_are_validated() {
    let mut c = CollectorConfig::default();
    c.api.connections.max = 0;
    let e = c.validate().unwrap_err().to_string();
    assert!(e.starts_with("api.connections.max"), "{e}");
    let mut c = CollectorConfig::default();
    c.receivers.otlp_grpc.connections.idle_timeout = Duration::ZERO;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.starts_with("receivers.otlp_grpc.connections.idle_timeout"),
        "{e}"
    );
    let c = CollectorConfig::from_yaml_str(
        "shutdown_timeout: 3s\napi:\n  connections: { max: 7, idle_timeout: 2s }\n  tls: { cert_file: a.pem, key_file: a.key }\n",
    )
    .unwrap();
    assert_eq!(c.shutdown_timeout, Duration::from_secs(3));
    assert_eq!(c.api.connections.max, 7);
    assert_eq!(
        c.api.connections.header_read_timeout,
        ConnectionsConfig::default().header_read_timeout
    );
    assert!(c.api.tls.unwrap().client_ca_file.is_none());
}

/// One HTTP/2 frame: 9-byte header and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The HPACK block of a request head, names from the static table: `:method` POST or GET,
/// `:scheme` http, `:path`, `:authority` and, when given, `content-type`.
fn h2_head(post: bool, path: &str, authority: &str, content_type: Option<&str>) -> Vec<u8> {
    let mut head = vec![if post { 0x83 } else { 0x82 }, 0x86];
    let mut literal = |name_index: u8, value: &str| {
        // A literal without indexing, of an indexed name: a 4-bit prefixed integer.
        if name_index < 15 {
            head.push(name_index);
        } else {
            head.extend([0x0f, name_index - 15]);
        }
        head.push(u8::try_from(value.len()).unwrap());
        head.extend_from_slice(value.as_bytes());
    };
    literal(4, path);
    literal(1, authority);
    if let Some(content_type) = content_type {
        literal(31, content_type);
    }
    head
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_http2_peer_is_detected_by_keepalive_pings() {
    let mut config = test_config();
    // Idle and header timeouts far away: only the unanswered pings can end the connection.
    config.receivers.otlp_http.connections = ConnectionsConfig {
        http2_keepalive_interval: Duration::from_secs(1),
        http2_keepalive_timeout: Duration::from_secs(1),
        ..connections(100, Duration::from_secs(300), Duration::from_secs(300))
    };
    let c = server::run(config, std::future::pending()).await.unwrap();
    // A peer that opens a request stream (its body never comes) and then goes silent: it never
    // reads, so it never answers a PING.
    let mut s = TcpStream::connect(c.http_addr.unwrap()).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[])); // SETTINGS
    let headers = h2_head(true, "/v1/traces", "x", Some("application/x-protobuf"));
    out.extend(h2_frame(1, 0x4, 1, &headers)); // HEADERS, END_HEADERS, no END_STREAM
    s.write_all(&out).await.unwrap();
    eventually(WAIT, "the request in flight", || open(&c, "otlp_http") == 1).await;
    // Not reading means not seeing the close either: wait for the server side to let go.
    eventually(WAIT, "the dead peer's connection closed", || {
        open(&c, "otlp_http") == 0
    })
    .await;
    assert_eq!(closed(&c, "otlp_http", "keepalive_timeout"), 1);
    assert_eq!(
        closed(&c, "otlp_http", "idle_timeout") + closed(&c, "otlp_http", "header_timeout"),
        0,
        "closed by the keep-alive, not by a timeout"
    );
    drop(s);
    c.stop().await.unwrap();
}

/// A client that takes no answer — its HTTP/2 stream window set to 0, so no DATA can reach it,
/// while it reads every frame and stays otherwise healthy — cannot hold a connection past the
/// idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_client_never_takes_does_not_hold_the_connection() {
    let mut config = test_config();
    config.api.connections = connections(100, Duration::from_secs(1), Duration::from_secs(60));
    let c = server::run(config, std::future::pending()).await.unwrap();
    let mut s = TcpStream::connect(c.api_addr).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[0, 4, 0, 0, 0, 0])); // SETTINGS INITIAL_WINDOW_SIZE = 0
    out.extend(h2_frame(4, 1, 0, &[])); // ACK of the server's SETTINGS
    let headers = h2_head(false, "/api/kpis", "localhost", None);
    out.extend(h2_frame(1, 0x5, 1, &headers)); // HEADERS, END_HEADERS | END_STREAM
    s.write_all(&out).await.unwrap();
    let started = Instant::now();
    assert!(
        closed_within(&mut s, WAIT).await,
        "the stalled answer's connection is cut"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "not before the idle timeout"
    );
    eventually(WAIT, "the cut counted", || {
        closed(&c, "api", "send_timeout") == 1
    })
    .await;
    c.stop().await.unwrap();
}

/// The answer to a `HEAD` over HTTP/2 carries no DATA (a protocol error to clients such as
/// curl), whoever answers it: the OTLP/HTTP receiver (405 on its path), a Host refusal on the
/// API, and the API's fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_answer_over_http2_has_no_body() {
    let c = server::run(test_config(), std::future::pending())
        .await
        .unwrap();
    for (addr, path, authority) in [
        (c.http_addr.unwrap(), "/v1/traces", "localhost"),
        (c.api_addr, "/api/kpis", "evil.example"),
        (c.api_addr, "/api/nope", "evil.example"),
    ] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend(h2_frame(4, 0, 0, &[])); // SETTINGS
        out.extend(h2_frame(4, 1, 0, &[])); // ACK of the server's SETTINGS
        // `:method: HEAD` as a literal of the static table's `:method` name (index 2), then
        // the rest of a GET head.
        let mut headers = vec![0x02, 4, b'H', b'E', b'A', b'D'];
        headers.extend(&h2_head(false, path, authority, None)[1..]);
        out.extend(h2_frame(1, 0x5, 1, &headers)); // HEADERS, END_HEADERS | END_STREAM
        s.write_all(&out).await.unwrap();
        // Frames until the stream's end (END_STREAM on its HEADERS or DATA) or a reset.
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let ended = |got: &[u8]| {
            let mut i = 0;
            while i + 9 <= got.len() {
                let len = u32::from_be_bytes([0, got[i], got[i + 1], got[i + 2]]) as usize;
                let (kind, flags) = (got[i + 3], got[i + 4]);
                let stream = u32::from_be_bytes([got[i + 5], got[i + 6], got[i + 7], got[i + 8]]);
                if stream == 1 && (kind == 3 || (kind <= 1 && flags & 1 == 1)) {
                    return i + 9 + len <= got.len();
                }
                i += 9 + len;
            }
            false
        };
        while !ended(&got) {
            let n = tokio::time::timeout(WAIT, s.read(&mut buf))
                .await
                .expect("an answer")
                .unwrap();
            assert!(n > 0, "{path}: closed before the answer ended");
            got.extend_from_slice(&buf[..n]);
        }
        let on_stream: Vec<u8> = h2_frames(&got)
            .into_iter()
            .filter(|&(_, stream)| stream == 1)
            .map(|(kind, _)| kind)
            .collect();
        // 1 HEADERS, 0 DATA, 3 RST_STREAM.
        assert_eq!(
            on_stream,
            vec![1],
            "{path} at {authority}: frames {on_stream:?}"
        );
    }
    c.stop().await.unwrap();
}

/// A request head larger than the HTTP/1 read buffer is refused at once: a client sending
/// half of a huge head holds at most the buffer (128 KiB on OTLP/HTTP, 16 KiB on the API), not
/// hyper's default ~400 KiB, until the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_http1_head_is_refused_without_waiting_for_its_end() {
    let mut config = test_config();
    let patient = connections(100, Duration::from_secs(60), Duration::from_secs(60));
    config.api.connections = patient.clone();
    config.receivers.otlp_http.connections = patient;
    let c = server::run(config, std::future::pending()).await.unwrap();
    for (addr, size) in [(c.api_addr, 32 * 1024), (c.http_addr.unwrap(), 200 * 1024)] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut head = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Padding: ".to_vec();
        head.resize(size, b'a');
        // The server may answer and close before reading it all: a failed write is fine.
        let _ = s.write_all(&head).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 431"),
            "{addr}: refused as too large before the 60 s header timeout: {answer:?}"
        );
    }
    c.stop().await.unwrap();
}

/// The status line of a raw HTTP/1.1 exchange (`Connection: close`).
async fn status_of(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// DNS rebinding: a page on the attacker's name resolved to 127.0.0.1 sends that name as
/// `Host`. On loopback without authentication, the API and OTLP/HTTP answer only the allowed
/// names (and IP addresses), so a page can neither read the KPIs nor post spans; `/health`
/// answers any name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_host_is_refused_on_the_api_and_otlp_http() {
    let c = server::run(test_config(), std::future::pending())
        .await
        .unwrap();
    let empty = "{}";
    for (host, want) in [
        ("evil.example", "421"),
        ("localhost", "200"),
        ("127.0.0.1", "200"),
    ] {
        let post = format!(
            "POST /v1/traces HTTP/1.1\r\nHost: {host}:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{empty}",
            c.http_addr.unwrap().port(),
            empty.len()
        );
        let line = status_of(c.http_addr.unwrap(), &post).await;
        assert!(line.contains(want), "OTLP/HTTP, Host {host}: {line}");
        let get = format!("GET /api/kpis HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let line = status_of(c.api_addr, &get).await;
        assert!(line.contains(want), "API, Host {host}: {line}");
        // Probes name any host, and /health holds nothing to read.
        let health = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let line = status_of(c.api_addr, &health).await;
        assert!(line.contains("200"), "/health, Host {host}: {line}");
    }
    assert_eq!(
        c.events()
            .auth_failures
            .get_or_create(&infertrace_collector::internal_events::AuthFailureLabels {
                listener: "otlp_http",
                reason: "host_not_allowed",
            })
            .get(),
        1
    );
    c.stop().await.unwrap();
}

/// A client that keeps sending a body after its refusal (401) is cut 5 s after the answer
/// (`listener.rs`'s `REFUSED_CUT_AFTER`), though its idle, header and body read timeouts are
/// two minutes: a refused client cannot hold a connection slot by trickling bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_that_keeps_sending_is_cut() {
    let (mut config, _tokens) = with_tokens("ingest ingest-token-0123456789\n");
    config.receivers.otlp_http.connections =
        connections(100, Duration::from_secs(120), Duration::from_secs(120));
    config.receivers.body_read_timeout = Duration::from_secs(120);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let s = TcpStream::connect(c.http_addr.unwrap()).await.unwrap();
    let (mut read, mut write) = s.into_split();
    let head = "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\nContent-Type: \
                application/x-protobuf\r\nContent-Length: 10000000\r\n\r\n";
    write.write_all(head.as_bytes()).await.unwrap();
    // A kilobyte every 50 ms, for longer than the test waits.
    let trickle = tokio::spawn(async move {
        for _ in 0..600 {
            if write.write_all(&[b'x'; 1024]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let mut answered_at = None;
    let cut_at = tokio::time::timeout(WAIT, async {
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(n) => {
                    answered_at.get_or_insert_with(Instant::now);
                    answer.extend_from_slice(&buf[..n]);
                }
            }
        }
    })
    .await
    .expect("the connection is cut, not kept while the client sends");
    trickle.abort();
    let head = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
    assert!(head.starts_with("HTTP/1.1 401"), "{head:?}");
    let after_answer = cut_at - answered_at.unwrap();
    eprintln!("cut {after_answer:?} after the answer");
    assert!(
        after_answer >= Duration::from_secs(4) && after_answer <= Duration::from_secs(10),
        "cut {after_answer:?} after the answer (5 s expected)"
    );
    assert_eq!(closed(&c, "otlp_http", "refused"), 1);
    c.stop().await.unwrap();
}

/// An HTTP/2 answer given before a small request body has arrived (here a 401 at the head)
/// waits for that body. Ending the stream with RST_STREAM(NO_ERROR) instead, as HTTP/2 allows,
/// made curl 7.88 report "Stream error in the HTTP/2 framing layer" and lose the 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_http2_answer_waits_for_a_small_body_on_its_way() {
    let (config, _tokens) = with_tokens("ingest ingest-token-0123456789\n");
    let c = server::run(config, std::future::pending()).await.unwrap();
    let mut s = TcpStream::connect(c.http_addr.unwrap()).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[])); // SETTINGS
    let headers = h2_head(true, "/v1/traces", "localhost", Some("application/json"));
    out.extend(h2_frame(1, 0x4, 1, &headers)); // HEADERS, END_HEADERS, no END_STREAM
    s.write_all(&out).await.unwrap();
    // The body follows the head a moment later, as a client's next write does.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let body = h2_frame(0, 0x1, 1, br#"{"resourceSpans":[]}"#); // DATA, END_STREAM
    s.write_all(&body).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while let Ok(n @ 1..) = s.read(&mut buf).await {
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    let frames = h2_frames(&got);
    assert!(frames.contains(&(1, 1)), "the answer's HEADERS: {frames:?}");
    // 3 RST_STREAM.
    assert!(
        !frames.contains(&(3, 1)),
        "the request's stream ended by its body, not reset: {frames:?}"
    );
    c.stop().await.unwrap();
}

/// A client without a valid token cannot hold a connection slot by sending refused requests:
/// each refusal (401, 403, 421; gRPC UNAUTHENTICATED) closes its connection once answered,
/// while a valid token's connection is kept alive. The timeouts are long (120 s), so a close
/// within the test's 10 s wait is the refusal's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_close_their_connection() {
    const INGEST: &str = "ingest-token-0123456789";
    const READ: &str = "read-token-0123456789";
    let (mut config, _tokens) = with_tokens(&format!("ingest {INGEST}\nread {READ}\n"));
    let patient = connections(100, Duration::from_secs(120), Duration::from_secs(120));
    config.api.connections = patient.clone();
    config.receivers.otlp_http.connections = patient.clone();
    // HTTP/2 is not closed on a refusal (a GOAWAY fails the client's other streams): a refusal
    // is no activity there, and the idle timeout (2 s here) closes a connection of refusals.
    config.receivers.otlp_grpc.connections =
        connections(100, Duration::from_secs(2), Duration::from_secs(120));
    let c = server::run(config, std::future::pending()).await.unwrap();
    let (http, api) = (c.http_addr.unwrap(), c.api_addr);
    let close_wait = Duration::from_secs(10);
    // A body the refusal does not read is read past, so the client sees the answer, not a reset.
    let body = "x".repeat(2 << 20);
    let post = |auth: &str, body: &str| {
        format!(
            "POST /v1/traces HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: \
             application/x-protobuf\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let get =
        |host: &str, auth: &str| format!("GET /api/kpis HTTP/1.1\r\nHost: {host}\r\n{auth}\r\n");
    let bearer = |t: &str| format!("Authorization: Bearer {t}\r\n");
    let cases = [
        ("otlp_http", http, post("", ""), "401"),
        ("otlp_http", http, post("", &body), "401"),
        ("otlp_http", http, post(&bearer(READ), ""), "403"),
        ("api", api, get("localhost", ""), "401"),
        ("api", api, get("localhost", &bearer(INGEST)), "403"),
        ("api", api, get("evil.example", &bearer(READ)), "421"),
    ];
    for (listener, addr, request, want) in &cases {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let (mut read, mut write) = s.split();
        let (written, answer) = tokio::join!(write.write_all(request.as_bytes()), async {
            let mut answer = Vec::new();
            let read = tokio::time::timeout(close_wait, read.read_to_end(&mut answer)).await;
            (read, answer)
        });
        written.unwrap();
        let (read, answer) = answer;
        let head = String::from_utf8_lossy(&answer[..answer.len().min(200)]).into_owned();
        assert!(
            matches!(read, Ok(Ok(_))),
            "{listener}: closed after the answer, not kept (nor reset): {read:?} {head:?}"
        );
        assert!(
            head.starts_with(&format!("HTTP/1.1 {want}")),
            "{listener}: {head:?}"
        );
    }
    assert_eq!(closed(&c, "otlp_http", "refused"), 3);
    assert_eq!(closed(&c, "api", "refused"), 3);

    // A valid token keeps its connection: two requests on one HTTP/1 connection.
    let io = TokioIo::new(TcpStream::connect(api).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    let driver = tokio::spawn(conn);
    for pause in [0, 0, 300] {
        // The last after a pause: the connection is still there, kept alive.
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let req = http::Request::get("/api/kpis")
            .header("host", "localhost")
            .header("authorization", format!("Bearer {READ}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(req).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
    assert!(
        !driver.is_finished(),
        "a valid token's connection is kept alive"
    );

    // gRPC: every call answered on the same connection (UNAUTHENTICATED without a token, OK
    // with one), but refusals every 300 ms do not keep it past the 2 s idle timeout, while
    // accepted calls do.
    let grpc_connection = || async {
        let io = TokioIo::new(TcpStream::connect(c.grpc_addr.unwrap()).await.unwrap());
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        (sender, tokio::spawn(conn))
    };
    let export = |token: Option<&str>| {
        let mut req =
            http::Request::post("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
                .header("content-type", "application/grpc")
                .header("te", "trailers");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        req.body(Full::new(grpc_frame(&[]))).unwrap()
    };
    let status = |r: &http::Response<hyper::body::Incoming>| {
        r.headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap_or_default().to_owned())
    };
    for (token, closes) in [(None, true), (Some(INGEST), false)] {
        let (mut sender, driver) = grpc_connection().await;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) && !driver.is_finished() {
            match sender.send_request(export(token)).await {
                Ok(r) => {
                    let want = if token.is_some() {
                        None
                    } else {
                        Some("16".to_owned())
                    };
                    if want.is_some() {
                        assert_eq!(status(&r), want);
                    } else {
                        assert_eq!(r.status(), 200);
                    }
                    let _ = r.into_body().collect().await;
                }
                // The connection going away between two calls.
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert_eq!(
            driver.is_finished(),
            closes,
            "token {token:?}: closed by the idle timeout only when every call was refused"
        );
    }
    assert_eq!(closed(&c, "otlp_grpc", "refused"), 0);
    assert!(closed(&c, "otlp_grpc", "idle_timeout") >= 1);
    c.stop().await.unwrap();
}
