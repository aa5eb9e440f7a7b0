//! Prefix-cache hits from the layer to the collector's record, over loopback OTLP/gRPC: a
//! handler reports `RequestRecorder::cache_read_input_tokens`, the layer puts
//! `gen_ai.usage.cache_read.input_tokens` on its request span — on both export paths, the SDK
//! tracer's (encoded by opentelemetry-otlp) and infertrace's own encoder — and the collector
//! reads it into the request record. A request without a report has no value.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server;
use infertrace_tower::otlp::{self, OtlpConfig};
use infertrace_tower::{InferenceTraceLayer, RequestRecorder};
use tower::{Layer as _, ServiceExt as _};

const CONFIG: &str = r#"
receivers:
  otlp_grpc: { endpoint: "127.0.0.1:0" }
  otlp_http: { enabled: false }
api: { listen: "127.0.0.1:0" }
assembly: { grace: 200ms, tick: 50ms }
store: { enabled: false }
"#;

/// One request through `layer`; its handler reports `prompt` input tokens (the request's
/// name in the records) and `cached` prefix-cache hits (if any).
async fn one_request(layer: &InferenceTraceLayer, prompt: u64, cached: Option<u64>) {
    let svc = layer.clone().layer(tower::service_fn(
        move |req: Request<Full<Bytes>>| async move {
            if let Some(rec) = req.extensions().get::<RequestRecorder>() {
                rec.scheduled();
                rec.tokens(1);
                rec.tokens(3);
                rec.usage(prompt, 4);
                if let Some(n) = cached {
                    rec.cache_read_input_tokens(n);
                }
                rec.finish("stop");
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
        },
    ));
    let req = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("a request");
    let response = svc.oneshot(req).await.expect("served");
    response.into_body().collect().await.expect("the body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_hits_reach_the_record_on_both_export_paths() {
    let config = CollectorConfig::from_yaml_str(CONFIG).expect("config");
    let collector = server::run(config, std::future::pending())
        .await
        .expect("collector");
    let grpc = collector.grpc_addr.expect("the gRPC receiver");
    let providers = otlp::init(
        OtlpConfig::grpc(format!("http://{grpc}"))
            .service_name("cache-svc")
            .metrics(false),
    )
    .expect("exporter");
    // `with_otlp`: the layer's own encoder; the tracer provider alone: the SDK's spans.
    let direct = InferenceTraceLayer::new()
        .with_otlp(&providers)
        .default_model("m");
    let tracer = InferenceTraceLayer::new()
        .with_tracer_provider(&providers.tracer_provider)
        .default_model("m");
    one_request(&direct, 201, Some(128)).await;
    one_request(&direct, 202, None).await;
    one_request(&tracer, 203, Some(96)).await;
    one_request(&tracer, 204, None).await;
    let p = providers.clone();
    tokio::task::spawn_blocking(move || p.tracer_provider.force_flush())
        .await
        .expect("flush task")
        .expect("flushed");

    let deadline = Instant::now() + Duration::from_secs(20);
    while collector.pipeline().requests_recorded() < 4 {
        assert!(
            Instant::now() < deadline,
            "{} of 4 requests recorded",
            collector.pipeline().requests_recorded()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each record by its prompt tokens.
    let mut cached: HashMap<Option<u64>, Option<u64>> = HashMap::new();
    collector.pipeline().visit_recent_traces(&mut |trace| {
        for req in &trace.requests {
            let r = &req.record;
            cached.insert(r.input_tokens, r.cache_read_input_tokens);
        }
    });
    let want: HashMap<Option<u64>, Option<u64>> = [
        (Some(201), Some(128)),
        (Some(202), None),
        (Some(203), Some(96)),
        (Some(204), None),
    ]
    .into_iter()
    .collect();
    assert_eq!(cached, want);

    let _ = tokio::task::spawn_blocking(move || providers.shutdown()).await;
    collector.stop().await.expect("clean shutdown");
}
