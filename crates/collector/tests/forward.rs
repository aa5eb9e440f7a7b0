//! Forwarding: spans reach a downstream unchanged (gRPC and HTTP), JSON is transcoded, a
//! second collector downstream computes the same KPIs, and retries deliver once (the faults —
//! outage, blackhole, poison spans — are in `forward_faults.rs`).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use infertrace_collector::config::ForwardProtocol;
use infertrace_collector::server;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use support::*;

const WAIT: Duration = Duration::from_secs(10);

/// A test OTLP/gRPC sink recording every request.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Sink {
    async fn start(&self) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = TraceServiceServer::new(self.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        addr
    }
    fn spans(&self) -> Vec<Span> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| r.resource_spans.iter())
            .flat_map(|rs| rs.scope_spans.iter())
            .flat_map(|ss| ss.spans.iter().cloned())
            .collect()
    }
}

/// A collector forwarding to `sink` (started here), merging for at most `batch_delay`.
async fn forwarding_to(sink: &Sink, batch_delay: Duration) -> server::RunningCollector {
    let sink_addr = sink.start().await;
    let mut config = test_config();
    config.forward.endpoint = Some(format!("http://{sink_addr}"));
    config.forward.max_batch_delay = batch_delay;
    server::run(config, std::future::pending()).await.unwrap()
}

fn by_id(mut spans: Vec<Span>) -> Vec<Span> {
    spans.sort_by(|a, b| a.span_id.cmp(&b.span_id));
    spans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_a_grpc_sink_unchanged_and_json_is_transcoded() {
    let sink = Sink::default();
    let c = forwarding_to(&sink, Duration::from_millis(20)).await;

    let reqs: Vec<Req> = (0..4).map(|k| Req::new(k + 1, "m", 10, 20, 30)).collect();
    let t0 = t0();
    let sent_proto: Vec<Span> = reqs[..2]
        .iter()
        .flat_map(|r| infertrace_spans(r, t0))
        .collect();
    let sent_json: Vec<Span> = reqs[2..]
        .iter()
        .flat_map(|r| infertrace_spans(r, t0))
        .collect();
    assert_eq!(
        post_protobuf(c.http_addr.unwrap(), &request("llm", sent_proto.clone())).await,
        200
    );
    let json = serde_json::to_string(&request("llm", sent_json.clone())).unwrap();
    assert_eq!(post_json(c.http_addr.unwrap(), &json).await, 200);

    eventually(WAIT, "16 spans forwarded", || sink.spans().len() == 16).await;
    let mut sent = sent_proto;
    sent.extend(sent_json);
    // Every field, including attributes the collector itself does not keep.
    assert_eq!(by_id(sink.spans()), by_id(sent));
    assert!(sink.spans().iter().any(|s| {
        s.attributes
            .iter()
            .any(|a| a.key == "http.request.header.x-custom")
    }));
    // Counted once the downstream has answered.
    let events = c.events().clone();
    eventually(WAIT, "16 spans counted as exported", || {
        events
            .exported_spans
            .get_or_create(&infertrace_collector::internal_events::ExportLabels {
                exporter: "otlp_forward",
                outcome: "ok",
            })
            .get()
            == 16
    })
    .await;
    let (_, text) = get(c.api_addr, "/metrics").await;
    assert_eq!(
        metric(
            &text,
            r#"infertrace_exported_spans_total{exporter="otlp_forward",outcome="ok"}"#
        ),
        Some(16.0),
        "{text}"
    );
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_collector_computes_the_same_kpis_over_grpc_and_http() {
    for protocol in [ForwardProtocol::Grpc, ForwardProtocol::Http] {
        let downstream = server::run(test_config(), std::future::pending())
            .await
            .unwrap();
        let mut config = test_config();
        config.forward.protocol = protocol;
        config.forward.endpoint = Some(match protocol {
            ForwardProtocol::Grpc => format!("http://{}", downstream.grpc_addr.unwrap()),
            ForwardProtocol::Http => format!("http://{}", downstream.http_addr.unwrap()),
        });
        let upstream = server::run(config, std::future::pending()).await.unwrap();
        let reqs: Vec<Req> = (0..10)
            .map(|k| Req::new(k + 1, "m", 10 + k as u64, 20, 300))
            .collect();
        let spans = reqs
            .iter()
            .flat_map(|r| infertrace_spans(r, t0()))
            .collect();
        assert_eq!(
            post_protobuf(upstream.http_addr.unwrap(), &request("llm", spans)).await,
            200
        );
        let (up, down) = (upstream.pipeline().clone(), downstream.pipeline().clone());
        eventually(WAIT, "both collectors recorded 10", || {
            up.requests_recorded() == 10 && down.requests_recorded() == 10
        })
        .await;
        let w = Duration::from_secs(60);
        let (a, b) = (upstream.kpis(w), downstream.kpis(w));
        assert_eq!(a.series.len(), 1);
        assert_eq!(a.series[0].requests, b.series[0].requests, "{protocol:?}");
        assert_eq!(a.series[0].e2e, b.series[0].e2e, "{protocol:?}");
        assert_eq!(a.series[0].queue, b.series[0].queue, "{protocol:?}");
        upstream.stop().await.unwrap();
        downstream.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_forwarding_retries_503_then_delivers_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    use prost::Message;

    // Answers 503 + Retry-After: 0 twice, then accepts (recording the body).
    let calls = Arc::new(AtomicUsize::new(0));
    let bodies: Arc<Mutex<Vec<ExportTraceServiceRequest>>> = Arc::default();
    let (c2, b2) = (calls.clone(), bodies.clone());
    let app = Router::new().route(
        "/v1/traces",
        post(move |headers: HeaderMap, body: bytes::Bytes| {
            let (calls, bodies) = (c2.clone(), b2.clone());
            async move {
                assert_eq!(headers["content-type"], "application/x-protobuf");
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "0")],
                        Vec::new(),
                    );
                }
                let req = ExportTraceServiceRequest::decode(body).unwrap();
                bodies.lock().unwrap().push(req);
                let ok = ExportTraceServiceResponse::default().encode_to_vec();
                (StatusCode::OK, [("retry-after", "0")], ok)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut config = test_config();
    config.forward.protocol = ForwardProtocol::Http;
    config.forward.endpoint = Some(format!("http://{addr}"));
    config.forward.retry.initial_backoff = Duration::from_millis(10);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let r = Req::new(1, "m", 1, 2, 3);
    let sent = infertrace_spans(&r, t0());
    assert_eq!(
        post_protobuf(c.http_addr.unwrap(), &request("llm", sent.clone())).await,
        200
    );
    let events = c.events().clone();
    eventually(WAIT, "4 spans exported", || {
        events
            .exported_spans
            .get_or_create(&infertrace_collector::internal_events::ExportLabels {
                exporter: "otlp_forward",
                outcome: "ok",
            })
            .get()
            == 4
    })
    .await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "two refusals, one delivery"
    );
    let got: Vec<Span> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|r| r.resource_spans.iter())
        .flat_map(|rs| rs.scope_spans.iter())
        .flat_map(|ss| ss.spans.iter().cloned())
        .collect();
    assert_eq!(by_id(got), by_id(sent));
    assert_eq!(events.dropped("forward_failed"), 0);
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_the_forward_queue() {
    let sink = Sink::default();
    // Without a shutdown, nothing would be sent for a minute.
    let c = forwarding_to(&sink, Duration::from_secs(60)).await;
    let r = Req::new(1, "m", 1, 2, 3);
    let sent = infertrace_spans(&r, t0());
    assert_eq!(
        post_protobuf(c.http_addr.unwrap(), &request("llm", sent.clone())).await,
        200
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(sink.spans().is_empty(), "still batching");
    let started = std::time::Instant::now();
    c.stop().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(by_id(sink.spans()), by_id(sent));
}

/// Requests larger than the downstream's message limit (tonic's and grpc-go's 4 MiB) reach it
/// whole, in parts under `forward.max_batch_bytes`: a review saw a 5.9 MB export answered OK,
/// retried for a minute and dropped, with every span merged beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_downstreams_message_limit_arrive_in_parts() {
    let sink = Sink::default();
    let c = forwarding_to(&sink, Duration::from_millis(20)).await;
    let pad = kv(
        "prompt",
        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue("x".repeat(2_000)),
    );
    let t0 = t0();
    let mut sent = Vec::new();
    for part in 0..2u32 {
        // 2,500 spans of ~2 KB: ~5.2 MB, past the sink's 4 MiB.
        let spans: Vec<Span> = (0..625)
            .map(|k| Req::new(part * 1_000 + k + 1, "m", 10, 20, 30))
            .flat_map(|r| infertrace_spans(&r, t0))
            .map(|mut s| {
                s.attributes.push(pad.clone());
                s
            })
            .collect();
        let body = request("llm", spans.clone());
        assert!(prost::Message::encoded_len(&body) > 5 << 20);
        assert_eq!(post_protobuf(c.http_addr.unwrap(), &body).await, 200);
        sent.extend(spans);
    }
    eventually(Duration::from_secs(30), "5,000 spans forwarded", || {
        sink.spans().len() == 5_000
    })
    .await;
    assert_eq!(
        by_id(sink.spans()),
        by_id(sent),
        "every span once, unchanged"
    );
    let largest = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .map(prost::Message::encoded_len)
        .max()
        .unwrap();
    assert!(largest <= 3 << 20, "{largest}");
    let (_, text) = get(c.api_addr, "/metrics").await;
    let exported = |outcome: &str| {
        metric(
            &text,
            &format!(
                r#"infertrace_exported_spans_total{{exporter="otlp_forward",outcome="{outcome}"}}"#
            ),
        )
    };
    assert_eq!(exported("ok"), Some(5_000.0), "{text}");
    assert_eq!(exported("failed").unwrap_or(0.0), 0.0);
    c.stop().await.unwrap();
}
