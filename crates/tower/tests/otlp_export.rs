//! `otlp::init` against a real (minimal) OTLP receiver on loopback, over gRPC and HTTP/protobuf:
//! the spans and metrics of a traced request must arrive, with the configured service name.
//! The receiver does not decode protobuf; it checks that the encoded request carries the
//! expected strings (protobuf stores strings as raw bytes, and compression is off by default).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use infertrace_tower::otlp::{self, OtlpConfig};
use infertrace_tower::{InferenceTraceLayer, RequestRecorder};
use tower::{Layer, ServiceExt};

/// (path, content type, body) of every export the receiver got.
type Received = Arc<Mutex<Vec<(String, String, Bytes)>>>;

async fn receiver() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let seen = Arc::clone(&received);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = Arc::clone(&seen);
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let seen = Arc::clone(&seen);
                async move {
                    let path = req.uri().path().to_owned();
                    let ct = req
                        .headers()
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let grpc = ct.starts_with("application/grpc");
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    seen.lock().unwrap().push((path, ct, body));
                    let response: Response<BoxBody<Bytes, Infallible>> = if grpc {
                        // An empty Export*ServiceResponse message, then grpc-status 0.
                        let mut trailers = HeaderMap::new();
                        trailers.insert("grpc-status", HeaderValue::from_static("0"));
                        let frames = futures_util::stream::iter([
                            Ok::<_, Infallible>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
                            Ok(Frame::trailers(trailers)),
                        ]);
                        let mut r = Response::new(StreamBody::new(frames).boxed());
                        r.headers_mut()
                            .insert("content-type", HeaderValue::from_static("application/grpc"));
                        r
                    } else {
                        let mut r = Response::new(Full::new(Bytes::new()).boxed());
                        r.headers_mut().insert(
                            "content-type",
                            HeaderValue::from_static("application/x-protobuf"),
                        );
                        r
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, received)
}

/// Serves one traced request in-process through a layer using `providers`.
async fn one_traced_request(providers: &otlp::OtlpProviders) {
    // The tracer provider alone keeps the tracer path; `with_otlp` turns on the direct export
    // to the providers' batch processor.
    let tracer_only = InferenceTraceLayer::new().with_tracer_provider(&providers.tracer_provider);
    assert!(
        format!("{tracer_only:?}").contains("direct_export: false"),
        "{tracer_only:?}"
    );
    let layer = InferenceTraceLayer::new()
        .with_otlp(providers)
        .default_model("m");
    assert!(
        format!("{layer:?}").contains("direct_export: true"),
        "{layer:?}"
    );
    let svc = layer.layer(tower::service_fn(|req: Request<Full<Bytes>>| async move {
        if let Some(rec) = req.extensions().get::<RequestRecorder>() {
            rec.scheduled();
            rec.tokens(1);
            rec.tokens(2);
            rec.finish("stop");
        }
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
    }));
    let req = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = svc.oneshot(req).await.unwrap();
    response.into_body().collect().await.unwrap();
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn exported_to(
    config: OtlpConfig,
    received: &Received,
    traces_path: &str,
    metrics_path: &str,
) {
    let providers = otlp::init(config.service_name("svc-otlp-test")).unwrap();
    one_traced_request(&providers).await;
    // Shutdown blocks until the batch processor and the periodic reader have flushed.
    let p = providers.clone();
    tokio::task::spawn_blocking(move || p.shutdown())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let got = received.lock().unwrap().clone();
    let traces: Vec<_> = got.iter().filter(|(p, _, _)| p == traces_path).collect();
    assert!(
        !traces.is_empty(),
        "no trace export to {traces_path}: {:?}",
        got.iter().map(|g| &g.0).collect::<Vec<_>>()
    );
    let all: Vec<u8> = traces.iter().flat_map(|(_, _, b)| b.to_vec()).collect();
    for needle in [
        &b"svc-otlp-test"[..],
        b"chat m",
        b"queue",
        b"prefill",
        b"decode",
        b"infer.outcome",
    ] {
        assert!(
            contains(&all, needle),
            "{} missing from the trace export",
            String::from_utf8_lossy(needle)
        );
    }
    let metrics: Vec<u8> = got
        .iter()
        .filter(|(p, _, _)| p == metrics_path)
        .flat_map(|(_, _, b)| b.to_vec())
        .collect();
    assert!(
        contains(&metrics, b"gen_ai.server.request.duration"),
        "metrics export missing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_export_reaches_the_receiver() {
    let (addr, received) = receiver().await;
    exported_to(
        OtlpConfig::grpc(format!("http://{addr}")),
        &received,
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    )
    .await;
    let got = received.lock().unwrap();
    assert!(
        got.iter()
            .all(|(_, ct, _)| ct.starts_with("application/grpc"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_export_reaches_the_receiver() {
    let (addr, received) = receiver().await;
    exported_to(
        OtlpConfig::http(format!("http://{addr}")),
        &received,
        "/v1/traces",
        "/v1/metrics",
    )
    .await;
    let got = received.lock().unwrap();
    assert!(got.iter().all(|(_, ct, _)| ct == "application/x-protobuf"));
}
