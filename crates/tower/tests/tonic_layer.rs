//! The layer on a tonic server over a real loopback HTTP/2 connection. The service is a tiny
//! hand-written tonic service (no protoc) whose bodies are gRPC-framed messages followed by
//! trailers, so status-in-trailers, trailers-only responses and message counting are exercised
//! exactly as tonic-generated servers produce them.
//!
//! These tests need none of the layer's features: a tonic-only server depends on
//! `infertrace-tower` with `default-features = false` (plus `otlp` for `otlp::init`) and has no
//! axum in its build. CI runs them with `--no-default-features --features otlp` and checks the
//! dependency tree for axum.

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use infertrace_tower::{AdmissionConfig, InferenceTraceLayer, PhaseSource, RequestRecorder};
use opentelemetry::trace::Status;
use tokio::sync::{Notify, mpsc};

/// One gRPC message: flag, big-endian length, payload.
fn message(payload: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8];
    m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    m.extend_from_slice(payload);
    m
}

fn trailers(code: u8) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from(u16::from(code)));
    t
}

fn grpc_response(rx: mpsc::Receiver<Frame<Bytes>>) -> Response<tonic::body::Body> {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (Ok::<_, Infallible>(f), rx))
    });
    let mut r = Response::new(tonic::body::Body::new(StreamBody::new(stream)));
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    r
}

/// `infer.v1.Generator` with methods:
/// - `Generate`: engine marks; 3 messages, one per frame, 10 ms apart; `grpc-status: 0`.
/// - `Pairs`: no marks; 2 frames of 2 messages each; `grpc-status: 0`.
/// - `Fail`: 2 messages then `grpc-status: 13` in the trailers.
/// - `Missing`: trailers-only response with `grpc-status: 5` in the headers.
/// - `Hold`: signals `Gate::entered`, waits for `Gate::release`, then answers like `Generate`
///   without marks.
/// - `Endless`: engine marks; a message every 10 ms until the client goes away.
#[derive(Clone)]
struct Generator {
    hold: Arc<Gate>,
}

/// Where a `Hold` call tells the test it has reached the service, and waits to be released.
#[derive(Default)]
struct Gate {
    entered: Notify,
    release: Notify,
}

impl tonic::server::NamedService for Generator {
    const NAME: &'static str = "infer.v1.Generator";
}

impl tower::Service<Request<tonic::body::Body>> for Generator {
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        let method = req.uri().path().rsplit('/').next().unwrap_or("").to_owned();
        let rec = req.extensions().get::<RequestRecorder>().cloned();
        let hold = Arc::clone(&self.hold);
        Box::pin(async move {
            // Trailers-only answers: NOT_FOUND, RESOURCE_EXHAUSTED (the service's own
            // refusal), CANCELLED.
            let trailers_only = match method.as_str() {
                "Missing" => Some("5"),
                "Busy" => Some("8"),
                "Gone" => Some("1"),
                _ => None,
            };
            if let Some(code) = trailers_only {
                let mut r = Response::new(tonic::body::Body::empty());
                r.headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/grpc"));
                r.headers_mut()
                    .insert("grpc-status", HeaderValue::from_static(code));
                return Ok(r);
            }
            if method == "Hold" {
                hold.entered.notify_one();
                hold.release.notified().await;
            }
            let (tx, rx) = mpsc::channel(8);
            tokio::spawn(async move {
                let rec_for_endless = if method == "Endless" {
                    rec.clone()
                } else {
                    None
                };
                let marks = if method == "Generate" { rec } else { None };
                if let Some(r) = &marks {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    r.scheduled();
                }
                match method.as_str() {
                    "Endless" => {
                        if let Some(r) = &rec_for_endless {
                            r.scheduled();
                        }
                        loop {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            if let Some(r) = &rec_for_endless {
                                r.tokens(1);
                            }
                            if tx
                                .send(Frame::data(Bytes::from(message(b"t"))))
                                .await
                                .is_err()
                            {
                                break;
                            }
                        }
                    }
                    "Pairs" => {
                        for _ in 0..2 {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            let mut two = message(b"tok");
                            two.extend(message(b"tok2"));
                            let _ = tx.send(Frame::data(Bytes::from(two))).await;
                        }
                        let _ = tx.send(Frame::trailers(trailers(0))).await;
                    }
                    "Fail" => {
                        for _ in 0..2 {
                            let _ = tx.send(Frame::data(Bytes::from(message(b"x")))).await;
                        }
                        let _ = tx.send(Frame::trailers(trailers(13))).await;
                    }
                    _ => {
                        for i in 0..3u8 {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            if let Some(r) = &marks {
                                r.tokens(1);
                            }
                            let _ = tx.send(Frame::data(Bytes::from(message(&[i; 8])))).await;
                        }
                        if let Some(r) = &marks {
                            r.usage(4, 3);
                            r.finish("stop");
                        }
                        let _ = tx.send(Frame::trailers(trailers(0))).await;
                    }
                }
            });
            Ok(grpc_response(rx))
        })
    }
}

async fn serve(layer: InferenceTraceLayer, hold: Arc<Gate>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(async move {
        // One service, no router: `serve_with_incoming` needs only tonic's `server` feature,
        // so this server (and this test) builds without axum (the layer's `axum` feature off).
        tonic::transport::Server::builder()
            .layer(layer)
            .serve_with_incoming(Generator { hold }, incoming)
            .await
            .unwrap();
    });
    addr
}

/// Calls `method`; returns (HTTP status, response headers, data frames, trailers).
async fn call(addr: SocketAddr, method: &str) -> (u16, HeaderMap, usize, Option<HeaderMap>) {
    let req = Request::post(format!("http://{addr}/infer.v1.Generator/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-infertrace-model", "test-model")
        .body(Full::new(Bytes::from(message(b"prompt"))))
        .unwrap();
    let response = h2_client().request(req).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let mut frames = 0;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        if frame.is_data() {
            frames += 1;
        } else if let Ok(t) = frame.into_trailers() {
            trailers = Some(t);
        }
    }
    (status, headers, frames, trailers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_rpc_reads_status_from_trailers() {
    let tel = Telemetry::new();
    let addr = serve(tel.layer(), Arc::default()).await;
    let (status, _, frames, trailers) = call(addr, "Generate").await;
    assert_eq!((status, frames), (200, 3));
    assert_eq!(trailers.unwrap()["grpc-status"], "0");
    let spans = tel.wait_for_requests(1).await;
    let req = requests(&spans)[0];
    assert_well_formed(&spans, req);
    assert_eq!(req.name, "generate_content test-model");
    assert_eq!(attr_str(req, "rpc.system"), "grpc");
    assert_eq!(attr_str(req, "rpc.service"), "infer.v1.Generator");
    assert_eq!(attr_str(req, "rpc.method"), "Generate");
    assert_eq!(attr_i64(req, "rpc.grpc.status_code"), 0);
    assert!(attr(req, "http.response.status_code").is_none());
    assert_eq!(attr_i64(req, "infer.stream.chunks"), 3);
    assert_eq!(attr_str(req, "infer.outcome"), "ok");
    assert_eq!(attr_str(req, "infer.phase.source"), "engine");
    assert_eq!(
        attr(req, "gen_ai.request.stream"),
        Some(&opentelemetry::Value::Bool(true))
    );
    assert_eq!(children_names(&spans, req), ["decode", "prefill", "queue"]);
    // Engine: first token ~10 ms after scheduled, two more tokens ~10 ms apart.
    let decode = child(&spans, req, "decode").unwrap();
    assert!(
        (0.015..0.060).contains(&secs(decode)),
        "decode {}",
        secs(decode)
    );
    assert_eq!(req.status, Status::Unset);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_mode_counts_grpc_messages_not_frames() {
    let tel = Telemetry::new();
    let addr = serve(
        tel.layer().phase_source(PhaseSource::Derived),
        Arc::default(),
    )
    .await;
    let sent = std::time::Instant::now();
    let (_, _, frames, _) = call(addr, "Pairs").await;
    let client_e2e = sent.elapsed().as_secs_f64();
    assert_eq!(frames, 2);
    let spans = tel.wait_for_requests(1).await;
    let req = requests(&spans)[0];
    assert_well_formed(&spans, req);
    assert_eq!(attr_i64(req, "infer.stream.chunks"), 4);
    assert_eq!(attr_str(req, "infer.phase.source"), "derived");
    assert_eq!(attr_str(req, "infer.outcome"), "ok");
    // Streamed (more than one message): split at the first frame.
    assert_eq!(children_names(&spans, req), ["decode", "prefill"]);
    let prefill = child(&spans, req, "prefill").unwrap();
    let decode = child(&spans, req, "decode").unwrap();
    assert_close(
        "prefill",
        secs(prefill),
        attr_f64(req, "infer.time_to_first_chunk"),
        1e-6,
    );
    // The frames are 10 ms apart; the whole call, seen by the client, bounds it above.
    assert!(
        (0.005..=client_e2e).contains(&secs(decode)),
        "decode {}, client e2e {client_e2e}",
        secs(decode)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_ok_status_in_trailers_or_headers_is_an_error() {
    let tel = Telemetry::new();
    let addr = serve(tel.layer(), Arc::default()).await;
    let (_, _, frames, trailers) = call(addr, "Fail").await;
    assert_eq!(frames, 2);
    assert_eq!(trailers.unwrap()["grpc-status"], "13");
    let (status, headers, frames, _) = call(addr, "Missing").await;
    assert_eq!((status, frames), (200, 0));
    assert_eq!(headers["grpc-status"], "5");

    let spans = tel.wait_for_requests(2).await;
    for req in requests(&spans) {
        assert!(matches!(req.status, Status::Error { .. }), "{}", req.name);
        assert_eq!(attr_str(req, "infer.outcome"), "error");
        let (code, name) = match attr_str(req, "rpc.method").as_str() {
            "Fail" => (13, "INTERNAL"),
            _ => (5, "NOT_FOUND"),
        };
        assert_eq!(attr_i64(req, "rpc.grpc.status_code"), code);
        assert_eq!(attr_str(req, "error.type"), name);
    }
}

/// The service's own RESOURCE_EXHAUSTED is a rejection and CANCELLED a cancel, as HTTP's 429
/// and 499 are, and as the collector reads them: not errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_own_refusal_and_cancel_are_not_errors() {
    let tel = Telemetry::new();
    let addr = serve(tel.layer(), Arc::default()).await;
    assert_eq!(call(addr, "Busy").await.1["grpc-status"], "8");
    assert_eq!(call(addr, "Gone").await.1["grpc-status"], "1");
    let spans = tel.wait_for_requests(2).await;
    for req in requests(&spans) {
        let want = match attr_str(req, "rpc.method").as_str() {
            "Busy" => "rejected",
            _ => "cancelled",
        };
        assert_eq!(attr_str(req, "infer.outcome"), want);
        assert_eq!(req.status, Status::Unset, "{}", req.name);
        assert!(attr(req, "error.type").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_admission_queue_answers_resource_exhausted() {
    let tel = Telemetry::new();
    let hold = Arc::new(Gate::default());
    let addr = serve(
        tel.layer().admission(AdmissionConfig::new(1, 0)),
        Arc::clone(&hold),
    )
    .await;
    let first = tokio::spawn(async move { call(addr, "Hold").await });
    hold.entered.notified().await;
    let (status, headers, frames, trailers) = call(addr, "Generate").await;
    assert_eq!((status, frames), (200, 0));
    assert_eq!(headers["grpc-status"], "8");
    assert!(trailers.is_none(), "trailers-only response");
    hold.release.notify_one();
    assert_eq!(first.await.unwrap().2, 3);

    let spans = tel.wait_for_requests(2).await;
    let rejected = requests(&spans)
        .into_iter()
        .find(|s| attr_str(s, "infer.outcome") == "rejected")
        .unwrap();
    assert_eq!(attr_i64(rejected, "rpc.grpc.status_code"), 8);
    assert_eq!(attr_str(rejected, "rpc.method"), "Generate");
    assert!(children_names(&spans, rejected).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancelling_a_stream_is_cancelled_not_error() {
    let tel = Telemetry::new();
    let addr = serve(tel.layer(), Arc::default()).await;
    {
        let req = Request::post(format!("http://{addr}/infer.v1.Generator/Endless"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from(message(b"prompt"))))
            .unwrap();
        let client = h2_client();
        let mut body = client.request(req).await.unwrap().into_body();
        for _ in 0..3 {
            assert!(body.frame().await.unwrap().unwrap().is_data());
        }
        // Dropping the body resets the HTTP/2 stream (RST_STREAM CANCEL).
    }
    let spans = tel.wait_for_requests(1).await;
    let req = requests(&spans)[0];
    assert_well_formed(&spans, req);
    assert_eq!(attr_str(req, "infer.outcome"), "cancelled");
    assert_eq!(req.status, Status::Unset);
    // No status went out: CANCELLED, as gRPC servers report a call the client cancelled (a
    // review saw 0, OK, which Jaeger and Tempo show as a successful call).
    assert_eq!(attr_i64(req, "rpc.grpc.status_code"), 1);
    assert!(attr_i64(req, "infer.stream.chunks") >= 3);
    assert!(attr_i64(req, "gen_ai.usage.output_tokens") >= 3);
}
