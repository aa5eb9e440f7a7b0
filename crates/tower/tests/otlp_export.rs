//! `otlp::init` against a real (minimal) OTLP receiver on loopback, over gRPC and HTTP/protobuf:
//! the spans and metrics of a traced request must arrive, with the configured service name.
//! The first two tests look for the expected strings in the encoded requests (protobuf stores
//! strings as raw bytes, and compression is off by default); the third decodes the HTTP/protobuf
//! bodies with prost (opentelemetry-proto's types), where the layer's spans are the ones its own
//! encoder wrote (`export/otlp_encode`).

mod support_otlp;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use infertrace_tower::otlp::{self, OtlpConfig};
use infertrace_tower::{InferenceTraceLayer, RequestRecorder};
use support_otlp::{Received, contains, one_traced_request, receiver};
use tower::{Layer, ServiceExt};

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

/// The spans of every trace export the receiver got, decoded with prost:
/// (service.name of the resource, scope name, span).
fn decoded_spans(
    received: &Received,
) -> Vec<(String, String, opentelemetry_proto::tonic::trace::v1::Span)> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message as _;
    let mut out = Vec::new();
    for (path, _, body) in received.lock().unwrap().iter() {
        if path != "/v1/traces" {
            continue;
        }
        let request = ExportTraceServiceRequest::decode(&body[..]).expect("a valid OTLP body");
        for rs in request.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone())
                .map(|v| match v {
                    Value::StringValue(s) => s,
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                let scope = ss.scope.map(|s| s.name).unwrap_or_default();
                for span in ss.spans {
                    out.push((service.clone(), scope.clone(), span));
                }
            }
        }
    }
    out
}

fn attribute(
    span: &opentelemetry_proto::tonic::trace::v1::Span,
    key: &str,
) -> Option<opentelemetry_proto::tonic::common::v1::any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
}

/// The layer's own encoding (HTTP/protobuf from `otlp::init`) over loopback: a receiver decoding
/// with prost gets the layer's four spans per request, with their attributes and parents, and
/// the handler's own span (through the tracer provider, encoded by opentelemetry-otlp) from the
/// same batch processor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_bodies_decode_to_the_layers_and_the_handlers_spans() {
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
    let (addr, received) = receiver().await;
    let providers = otlp::init(
        OtlpConfig::http(format!("http://{addr}"))
            .service_name("svc-ünïcode")
            .metrics(false),
    )
    .unwrap();
    // The export thread encodes the layer's requests itself.
    assert!(
        format!("{:?}", providers.span_processor).contains("request_export: true"),
        "{:?}",
        providers.span_processor
    );
    let tracer = providers.tracer_provider.tracer("handler");
    let handler = tower::service_fn(move |req: Request<Full<Bytes>>| {
        let tracer = tracer.clone();
        async move {
            tracer.in_span("handler-work", |_| {});
            if let Some(rec) = req.extensions().get::<RequestRecorder>() {
                rec.scheduled();
                rec.tokens(1);
                rec.tokens(2);
                rec.cache_read_input_tokens(64);
                rec.finish("stop");
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
        }
    });
    // Non-ASCII and long values (a header value must be visible ASCII: the layer's default
    // model instead).
    let long = "x".repeat(5000);
    let models = ["模型-größe", "m", long.as_str()];
    for model in models {
        let layer = InferenceTraceLayer::new()
            .with_otlp(&providers)
            .default_model(model);
        let req = Request::post("/v1/chat/completions")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = layer.layer(handler.clone()).oneshot(req).await.unwrap();
        response.into_body().collect().await.unwrap();
    }
    let p = providers.clone();
    tokio::task::spawn_blocking(move || p.shutdown())
        .await
        .unwrap()
        .unwrap();
    let spans = decoded_spans(&received);
    assert!(spans.iter().all(|(service, _, _)| service == "svc-ünïcode"));
    // Exported in one call (the usual case: everything queued until the shutdown's flush), the
    // layer's body went after the exporter's own: one POST holds both, as two `ResourceSpans`.
    let posts = received
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, _, _)| path == "/v1/traces")
        .count();
    if posts == 1 {
        let scopes: std::collections::BTreeSet<_> =
            spans.iter().map(|(_, scope, _)| scope.as_str()).collect();
        assert_eq!(
            scopes.into_iter().collect::<Vec<_>>(),
            ["handler", "infertrace-tower"]
        );
    }
    let handler: Vec<_> = spans
        .iter()
        .filter(|(_, scope, _)| scope == "handler")
        .collect();
    assert_eq!(handler.len(), 3, "the handler's spans");
    let ours: Vec<_> = spans
        .iter()
        .filter(|(_, scope, _)| scope == "infertrace-tower")
        .map(|(_, _, span)| span)
        .collect();
    assert_eq!(ours.len(), 12, "four spans per request");
    let requests: Vec<_> = ours
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(requests.len(), 3);
    for (request, model) in requests.iter().zip(models) {
        assert_eq!(request.name, format!("chat {model}"));
        assert_eq!(
            attribute(request, "gen_ai.request.model"),
            Some(Value::StringValue(model.to_owned()))
        );
        assert_eq!(
            attribute(request, "infer.outcome"),
            Some(Value::StringValue("ok".into()))
        );
        assert_eq!(
            attribute(request, "http.response.status_code"),
            Some(Value::IntValue(200))
        );
        assert_eq!(
            attribute(request, "gen_ai.usage.cache_read.input_tokens"),
            Some(Value::IntValue(64))
        );
        assert!(request.end_time_unix_nano >= request.start_time_unix_nano);
        let phases: Vec<_> = ours
            .iter()
            .filter(|s| s.parent_span_id == request.span_id)
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(phases, ["queue", "prefill", "decode"]);
        // The handler's span ran under the request span.
        assert!(
            handler
                .iter()
                .any(|(_, _, h)| h.parent_span_id == request.span_id
                    && h.trace_id == request.trace_id),
            "a handler span under {}",
            request.name
        );
    }
}
