//! The layer and the collector's analysis in one process share one registry of static strings
//! (`infertrace-intern`): a request value the layer made static is the very allocation the
//! analysis's interner adopts when the same value becomes popular there, and the reverse.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use infertrace_analysis::text::Interner;
use infertrace_tower::InferenceTraceLayer;
use opentelemetry::Value;
use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tower::{ServiceBuilder, ServiceExt};

/// Enough front-cache hits for the interner to make a string static (it takes 64).
const POPULAR: usize = 100;

/// The `url.path` value (as the span holds it) of the layer's span for a request to `path`.
async fn layer_path_value(path: &str) -> String {
    let spans = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let layer = InferenceTraceLayer::new().with_tracer_provider(&provider);
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
        }));
    let request = Request::post(path)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    response.into_body().collect().await.unwrap();
    for _ in 0..500 {
        let finished = spans.get_finished_spans().unwrap();
        if let Some(server) = finished.iter().find(|s| s.span_kind == SpanKind::Server) {
            let value = server
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == infertrace_semconv::net::URL_PATH)
                .map(|kv| kv.value.clone())
                .expect("url.path");
            let Value::String(s) = value else {
                panic!("url.path is a string")
            };
            // The address, not a copy: `as_str` of a static value is the static string.
            return format!("{:p}", s.as_str().as_ptr());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no server span exported");
}

#[tokio::test]
async fn the_layer_and_the_analysis_share_static_strings() {
    // The layer first: the analysis adopts the layer's static string.
    const LAYER_FIRST: &str = "/e2e/static-strings/layer-first";
    let layers = layer_path_value(LAYER_FIRST).await;
    let mut interner = Interner::default();
    for _ in 0..POPULAR {
        let _ = interner.intern(LAYER_FIRST);
    }
    let text = interner.intern(LAYER_FIRST);
    assert!(text.is_static());
    assert_eq!(format!("{:p}", text.as_ptr()), layers);

    // The analysis first: the layer's value is the analysis's static text.
    const ANALYSIS_FIRST: &str = "/e2e/static-strings/analysis-first";
    for _ in 0..POPULAR {
        let _ = interner.intern(ANALYSIS_FIRST);
    }
    let text = interner.intern(ANALYSIS_FIRST);
    assert!(text.is_static());
    assert_eq!(
        layer_path_value(ANALYSIS_FIRST).await,
        format!("{:p}", text.as_ptr())
    );
}
