//! The layer on a bare hyper service (`tower::service_fn`, no framework) over real loopback
//! sockets, HTTP/1.1 and HTTP/2.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use infertrace_tower::{AdmissionConfig, InferenceTraceLayer, PhaseSource, RequestRecorder};
use tokio::sync::mpsc;
use tower::ServiceBuilder;

type Body = BoxBody<Bytes, Infallible>;

/// Instants (s from arrival) the handler measured: scheduled, first token, last token, end.
type Truth = Arc<Mutex<Vec<[Bracket; 4]>>>;

async fn handle(req: Request<Incoming>, truth: Truth) -> Result<Response<Body>, Infallible> {
    let rec = req.extensions().get::<RequestRecorder>().cloned();
    match req.uri().path() {
        "/health" => Ok(Response::new(Full::new(Bytes::from_static(b"ok")).boxed())),
        "/v1/chat/completions" => {
            let Some(rec) = rec else {
                return Ok(Response::new(Full::new(Bytes::new()).boxed()));
            };
            let (tx, rx) = mpsc::channel::<Bytes>(8);
            tokio::spawn(async move {
                let a = rec.arrival();
                let mut t = [Bracket::default(); 4];
                tokio::time::sleep(Duration::from_millis(15)).await;
                t[0] = Bracket::around(a, || rec.scheduled());
                tokio::time::sleep(Duration::from_millis(25)).await;
                t[1] = Bracket::around(a, || rec.tokens(1));
                let _ = tx.send(Bytes::from_static(b"data: 0\n\n")).await;
                for _ in 0..3 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    t[2] = Bracket::around(a, || rec.tokens(1));
                    let _ = tx.send(Bytes::from_static(b"data: n\n\n")).await;
                }
                rec.finish("stop");
                truth.lock().unwrap().push(t);
            });
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
            });
            let mut r = Response::new(StreamBody::new(stream).boxed());
            r.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            Ok(r)
        }
        _ => {
            let start = rec.as_ref().map(|r| r.arrival().elapsed().as_secs_f64());
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let (Some(r), Some(s)) = (rec, start) {
                let end = Bracket::exact(r.arrival().elapsed().as_secs_f64());
                truth.lock().unwrap().push([
                    Bracket { lo: 0.0, hi: s },
                    Bracket::default(),
                    Bracket::default(),
                    end,
                ]);
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"{}")).boxed()))
        }
    }
}

async fn serve(layer: InferenceTraceLayer, truth: Truth) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let truth = Arc::clone(&truth);
            let service = ServiceBuilder::new()
                .layer(layer.clone())
                .service(tower::service_fn(move |req| {
                    handle(req, Arc::clone(&truth))
                }));
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_stream_engine_phases_match() {
    let tel = Telemetry::new();
    let truth = Truth::default();
    let layer = tel.layer().default_model("m").provider_name("vllm");
    let addr = serve(layer, Arc::clone(&truth)).await;
    let (status, _, body) = send(addr, "/v1/chat/completions", &[], "{}").await;
    assert_eq!(status, 200);
    assert_eq!(body.len(), 4 * 9);
    let spans = tel.wait_for_requests(1).await;
    let req = requests(&spans)[0];
    assert_well_formed(&spans, req);
    let t = truth.lock().unwrap()[0];
    assert_eq!(req.name, "chat m");
    assert_eq!(attr_str(req, "gen_ai.provider.name"), "vllm");
    assert_between(
        "queue",
        secs(child(&spans, req, "queue").unwrap()),
        Bracket::exact(0.0),
        t[0],
    );
    assert_between(
        "prefill",
        secs(child(&spans, req, "prefill").unwrap()),
        t[0],
        t[1],
    );
    assert_between(
        "decode",
        secs(child(&spans, req, "decode").unwrap()),
        t[1],
        t[2],
    );
    assert_eq!(attr_i64(req, "infer.stream.chunks"), 4);
    assert_eq!(attr_i64(req, "gen_ai.usage.output_tokens"), 4);
    assert!(attr(req, "http.route").is_none(), "no router, no route");
    assert_eq!(attr_str(req, "infer.outcome"), "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_derived_non_streamed_and_skipped_paths() {
    let tel = Telemetry::new();
    let truth = Truth::default();
    let layer = tel
        .layer()
        .phase_source(PhaseSource::Derived)
        .admission(AdmissionConfig::new(2, 2))
        .skip(|head| head.uri.path() == "/health");
    let addr = serve(layer, Arc::clone(&truth)).await;
    let client = h2_client();
    let mut client_e2e = Duration::ZERO;
    for path in ["/health", "/v1/embeddings"] {
        let req = Request::post(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let sent = std::time::Instant::now();
        let response = client.request(req).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_2);
        response.into_body().collect().await.unwrap();
        client_e2e = sent.elapsed();
    }
    let spans = tel.wait_for_requests(1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let spans_later = tel.spans.get_finished_spans().unwrap();
    assert_eq!(requests(&spans_later).len(), 1, "/health is skipped");
    let req = requests(&spans)[0];
    assert_well_formed(&spans, req);
    assert_eq!(req.name, "embeddings");
    assert_eq!(children_names(&spans, req), ["inference", "queue"]);
    // From admission (before the handler starts) to the body's end: after the handler's
    // work, before the client has the whole response.
    let t = truth.lock().unwrap()[0];
    assert_between(
        "inference",
        secs(child(&spans, req, "inference").unwrap()),
        t[0],
        Bracket {
            lo: t[3].lo,
            hi: client_e2e.as_secs_f64(),
        },
    );
}
