//! `https://` for the forwarder (gRPC and HTTP) and the Alertmanager client, against in-test
//! rustls servers with certificates from a private CA made by rcgen at test time: the server is
//! verified against `tls.ca_file` (and refused when it is signed by another CA), a client
//! certificate is presented for mutual TLS, and `forward.headers` reach the server. Also: the
//! config check refuses what the collector could not use.

mod support;

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use infertrace_analysis::alert::{AlertEvent, AlertState};
use infertrace_analysis::diagnosis::Severity;
use infertrace_collector::api::alerting::Alertmanager;
use infertrace_collector::config::{CollectorConfig, ForwardProtocol, TlsClientConfig};
use infertrace_collector::internal_events::ExportLabels;
use infertrace_collector::server;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use support::*;

const WAIT: Duration = Duration::from_secs(20);

/// A private CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
struct Pki {
    _dir: tempfile::TempDir,
    ca_file: PathBuf,
    server_cert: String,
    server_key: String,
    client_cert_file: PathBuf,
    client_key_file: PathBuf,
    /// The CA certificate of another, unrelated CA.
    other_ca_file: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("infertrace test CA");
    let server_key = KeyPair::generate().unwrap();
    let mut server = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    server
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let server_cert = server.signed_by(&server_key, &ca).unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(vec!["infertrace-collector".to_owned()]).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "infertrace-collector");
    let client_cert = client.signed_by(&client_key, &ca).unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_file = write("ca.pem", ca.pem());
    let client_cert_file = write("client.pem", client_cert.pem());
    let client_key_file = write("client-key.pem", client_key.serialize_pem());
    let other_ca_file = write("other-ca.pem", self::ca("another CA").pem());
    Pki {
        ca_file,
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
        client_cert_file,
        client_key_file,
        other_ca_file,
        _dir: dir,
    }
}

impl Pki {
    /// A rustls server config for the server certificate; requiring a client certificate
    /// signed by the CA when `mutual`.
    fn server_config(&self, mutual: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = vec![CertificateDer::from_pem_slice(self.server_cert.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(self.server_key.as_bytes()).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if mutual {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(&self.ca_file).unwrap() {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(builder.with_single_cert(chain, key).unwrap())
    }

    fn tls(&self, ca: &Path, mutual: bool) -> TlsClientConfig {
        TlsClientConfig {
            ca_file: Some(ca.to_path_buf()),
            cert_file: mutual.then(|| self.client_cert_file.clone()),
            key_file: mutual.then(|| self.client_key_file.clone()),
        }
    }
}

/// One request a TLS test server saw: path, `x-api-key` header, body.
type SeenRequest = (String, Option<String>, Bytes);

/// What a TLS test server saw.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<SeenRequest>>>);

impl Seen {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// An HTTPS server (HTTP/1.1 over rustls) recording every request, answering 200 with an empty
/// OTLP response.
async fn https_server(config: Arc<rustls::ServerConfig>, seen: Seen) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let key = req
                                .headers()
                                .get("x-api-key")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned);
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            seen.0.lock().unwrap().push((path, key, body));
                            let ok = ExportTraceServiceResponse::default().encode_to_vec();
                            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(ok))))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

/// An OTLP/gRPC sink recording each request with its `x-api-key` metadata.
#[derive(Clone, Default)]
struct GrpcSink(Arc<Mutex<Vec<KeyedRequest>>>);

/// A request with its `x-api-key` metadata.
type KeyedRequest = (Option<String>, ExportTraceServiceRequest);

#[tonic::async_trait]
impl TraceService for GrpcSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let key = request
            .metadata()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.0.lock().unwrap().push((key, request.into_inner()));
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A gRPC server over TLS (tonic's rustls), requiring a client certificate from the CA.
async fn grpc_tls_server(pki: &Pki, sink: GrpcSink) -> SocketAddr {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.server_cert, &pki.server_key))
        .client_ca_root(Certificate::from_pem(std::fs::read(&pki.ca_file).unwrap()));
    let server = tonic::transport::Server::builder()
        .tls_config(tls)
        .unwrap()
        .add_service(TraceServiceServer::new(sink));
    tokio::spawn(async move {
        server
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    addr
}

fn exported(c: &server::RunningCollector, outcome: &'static str) -> u64 {
    c.events()
        .exported_spans
        .get_or_create(&ExportLabels {
            exporter: "otlp_forward",
            outcome,
        })
        .get()
}

fn tls_config(
    endpoint: String,
    protocol: ForwardProtocol,
    tls: TlsClientConfig,
) -> CollectorConfig {
    let mut config = test_config();
    config.forward.endpoint = Some(endpoint);
    config.forward.protocol = protocol;
    config.forward.tls = tls;
    config
        .forward
        .headers
        .insert("x-api-key".to_owned(), "k-123".to_owned());
    config.forward.max_batch_delay = Duration::from_millis(10);
    config.forward.timeout = Duration::from_secs(2);
    config.forward.retry.initial_backoff = Duration::from_millis(20);
    config.forward.retry.max_backoff = Duration::from_millis(100);
    // Room for a slow first handshake; the refused cases below shorten it.
    config.forward.retry.max_elapsed = Duration::from_secs(15);
    config
}

async fn send_one(
    c: &server::RunningCollector,
    trace: u32,
) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
    let spans = infertrace_spans(&Req::new(trace, "m", 1, 2, 3), t0());
    assert_eq!(
        post_protobuf(c.http_addr.unwrap(), &request("llm", spans.clone())).await,
        200
    );
    spans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_forwarding_over_mutual_tls_with_a_private_ca_and_headers() {
    let pki = pki();
    let sink = GrpcSink::default();
    let addr = grpc_tls_server(&pki, sink.clone()).await;
    let endpoint = format!("https://127.0.0.1:{}", addr.port());

    let config = tls_config(
        endpoint.clone(),
        ForwardProtocol::Grpc,
        pki.tls(&pki.ca_file, true),
    );
    config.validate().unwrap();
    let c = server::run(config, std::future::pending()).await.unwrap();
    let sent = send_one(&c, 1).await;
    eventually(WAIT, "4 spans delivered over TLS", || {
        exported(&c, "ok") == 4
    })
    .await;
    {
        let got = sink.0.lock().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].0.as_deref(),
            Some("k-123"),
            "the header reached the server"
        );
        let spans: Vec<_> = got[0].1.resource_spans[0].scope_spans[0].spans.clone();
        assert_eq!(spans, sent);
    }
    c.stop().await.unwrap();

    // Verified: a server certificate from another CA is refused; so is a client without a
    // certificate. Nothing is delivered, every attempt and the give-up are counted.
    for (ca, mutual) in [(&pki.other_ca_file, true), (&pki.ca_file, false)] {
        let mut config = tls_config(endpoint.clone(), ForwardProtocol::Grpc, pki.tls(ca, mutual));
        config.forward.retry.max_elapsed = Duration::from_secs(1);
        let c = server::run(config, std::future::pending()).await.unwrap();
        send_one(&c, 2).await;
        eventually(WAIT, "given up", || exported(&c, "failed") == 4).await;
        assert_eq!(exported(&c, "ok"), 0);
        assert!(
            c.events().forward_attempts("retryable") + c.events().forward_attempts("permanent") > 0
        );
        c.stop().await.unwrap();
    }
    assert_eq!(sink.0.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_forwarding_over_tls_with_a_ca_file_and_headers() {
    let pki = pki();
    let seen = Seen::default();
    let addr = https_server(pki.server_config(false), seen.clone()).await;
    let endpoint = format!("https://127.0.0.1:{}", addr.port());
    let config = tls_config(
        endpoint.clone(),
        ForwardProtocol::Http,
        pki.tls(&pki.ca_file, false),
    );
    config.validate().unwrap();
    let c = server::run(config, std::future::pending()).await.unwrap();
    let sent = send_one(&c, 1).await;
    eventually(WAIT, "4 spans delivered over TLS", || {
        exported(&c, "ok") == 4
    })
    .await;
    {
        let got = seen.0.lock().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "/v1/traces");
        assert_eq!(got[0].1.as_deref(), Some("k-123"));
        let req = ExportTraceServiceRequest::decode(got[0].2.clone()).unwrap();
        assert_eq!(req.resource_spans[0].scope_spans[0].spans, sent);
    }
    c.stop().await.unwrap();

    // Another CA: refused, counted, nothing delivered.
    let mut config = tls_config(
        endpoint,
        ForwardProtocol::Http,
        pki.tls(&pki.other_ca_file, false),
    );
    config.forward.retry.max_elapsed = Duration::from_secs(1);
    let c = server::run(config, std::future::pending()).await.unwrap();
    send_one(&c, 2).await;
    eventually(WAIT, "given up", || exported(&c, "failed") == 4).await;
    assert_eq!(seen.len(), 1);
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_over_mutual_tls() {
    let pki = pki();
    let seen = Seen::default();
    let addr = https_server(pki.server_config(true), seen.clone()).await;
    let url = format!("https://127.0.0.1:{}/", addr.port());
    let event = AlertEvent {
        alert: "HighTtft".into(),
        service: "llm".into(),
        model: "m".into(),
        operation: String::new(),
        severity: Severity::Warning,
        state: AlertState::Firing,
        value: 2.0,
        threshold: 1.0,
        starts_at_unix_nano: t0(),
        ends_at_unix_nano: None,
        summary: "TTFT p95 over 1 s".into(),
        description: "ttft.p95 > 1s".into(),
        generator_url: "http://127.0.0.1:8080/api/alerts".into(),
    };
    let am = Alertmanager::new(&url, &pki.tls(&pki.ca_file, true), &Default::default()).unwrap();
    assert!(am.post(std::slice::from_ref(&event)).await);
    {
        let got = seen.0.lock().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "/api/v2/alerts");
        let body: serde_json::Value = serde_json::from_slice(&got[0].2).unwrap();
        assert_eq!(body[0]["labels"]["alertname"], "HighTtft");
    }
    // Without the client certificate, or trusting another CA: not delivered.
    for tls in [
        pki.tls(&pki.ca_file, false),
        pki.tls(&pki.other_ca_file, true),
    ] {
        let am = Alertmanager::new(&url, &tls, &Default::default()).unwrap();
        assert!(!am.post(std::slice::from_ref(&event)).await);
    }
    assert_eq!(seen.len(), 1);
}

#[test]
fn check_config_refuses_what_collect_cannot_use() {
    let pki = pki();
    let err = |yaml: String| {
        CollectorConfig::from_yaml_str(&yaml)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let ok = |yaml: String| CollectorConfig::from_yaml_str(&yaml).map(|_| ()).unwrap();
    ok(format!(
        "forward:\n  endpoint: https://tempo.example:4317\n  tls:\n    ca_file: {}\n  headers:\n    x-api-key: abc\n",
        pki.ca_file.display()
    ));
    let e = err("forward:\n  endpoint: ftp://tempo:4317\n".into());
    assert!(e.contains("http:// or https://"), "{e}");
    let e = err(
        "forward:\n  endpoint: https://tempo:4317\n  tls:\n    ca_file: /nonexistent/ca.pem\n"
            .into(),
    );
    assert!(
        e.contains("forward.tls") && e.contains("/nonexistent/ca.pem"),
        "{e}"
    );
    let e = err(format!(
        "forward:\n  endpoint: https://tempo:4317\n  tls:\n    ca_file: {}\n",
        pki.client_key_file.display()
    ));
    assert!(e.contains("no PEM certificate"), "{e}");
    let e = err(format!(
        "forward:\n  endpoint: https://tempo:4317\n  tls:\n    ca_file: {}\n    cert_file: {}\n",
        pki.ca_file.display(),
        pki.client_cert_file.display()
    ));
    assert!(e.contains("set both or neither"), "{e}");
    let e = err(format!(
        "forward:\n  endpoint: http://tempo:4317\n  tls:\n    ca_file: {}\n",
        pki.ca_file.display()
    ));
    assert!(e.contains("not https://"), "{e}");
    let e =
        err("forward:\n  endpoint: http://tempo:4317\n  headers:\n    \"bad name\": x\n".into());
    assert!(
        e.contains("forward.headers") && e.contains("not a valid header name"),
        "{e}"
    );
    let e = err("forward:\n  endpoint: http://tempo:4317\n  headers:\n    x-api-key: ${INFERTRACE_SURELY_UNSET_VARIABLE}\n".into());
    assert!(
        e.contains("INFERTRACE_SURELY_UNSET_VARIABLE is not set"),
        "{e}"
    );
    let e = err("alerts:\n  alertmanager_url: https://am:9093\n  alertmanager_tls:\n    ca_file: /nonexistent/am.pem\n".into());
    assert!(
        e.contains("alerts.alertmanager_tls.ca_file /nonexistent/am.pem"),
        "the key as written in the file: {e}"
    );
    // An encrypted client key is said as such (rustls skips it and finds none), as on the
    // listeners.
    let dir = tempfile::tempdir().unwrap();
    let encrypted = dir.path().join("encrypted.key");
    std::fs::write(
        &encrypted,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIBvTBXBgkqhkiG9w0BBQ0wSjApBgkqhkiG9w0BBQwwHAQI\n\
         -----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap();
    let e = err(format!(
        "forward:\n  endpoint: https://tempo:4317\n  tls:\n    ca_file: {}\n    cert_file: {}\n    key_file: {}\n",
        pki.ca_file.display(),
        pki.client_cert_file.display(),
        encrypted.display()
    ));
    assert!(e.contains("the private key is encrypted"), "{e}");
}
