//! A minimal OTLP receiver on loopback (gRPC and HTTP/protobuf, every body kept) and one traced
//! request, for the tests of `otlp::init`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use infertrace_tower::otlp;
use infertrace_tower::{InferenceTraceLayer, RequestRecorder};
use tower::{Layer, ServiceExt};

/// (path, content type, body) of every export the receiver got.
pub type Received = Arc<Mutex<Vec<(String, String, Bytes)>>>;

pub async fn receiver() -> (SocketAddr, Received) {
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
pub async fn one_traced_request(providers: &otlp::OtlpProviders) {
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

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Runs `test` on a Tokio runtime after setting the environment variable `var` (name, value):
/// for a test that is the only one of its process (its own file), so that no other thread
/// reads the environment meanwhile.
#[allow(dead_code)] // not every test file that shares this module calls it
pub fn alone_with_env(var: (&str, &str), test: impl std::future::Future<Output = ()>) {
    // SAFETY: called first by the only test of its process, before the runtime (or anything
    // else of the test) starts a thread.
    unsafe { std::env::set_var(var.0, var.1) };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime")
        .block_on(test);
}
