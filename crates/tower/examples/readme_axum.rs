//! The README's axum example, compiled with the tests so that it stays true: a unary and an SSE
//! handler marking their phases, exported with `otlp::init`. Run it against a collector:
//!
//! ```text
//! OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 cargo run -p infertrace-tower --example readme_axum
//! curl -X POST localhost:3000/v1/chat/stream
//! ```

use axum::Router;
use axum::response::sse::{Event, Sse};
use axum::routing::{get, post};
use futures_util::{Stream, StreamExt, stream};
use infertrace_tower::otlp::{self, OtlpConfig};
use infertrace_tower::{InferenceTraceLayer, RequestRecorder};
use opentelemetry::trace::TracerProvider as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

async fn chat(rec: RequestRecorder) -> &'static str {
    rec.scheduled();
    rec.tokens(1);
    rec.finish("stop"); // your engine calls these as it works
    "hi"
}

// A stream: move the recorder into it, one `tokens(1)` per token (the first marks the first
// token). The request span ends with the stream — `cancelled`, with the tokens so far, if the
// client goes away.
async fn chat_stream(
    rec: RequestRecorder,
) -> Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>> {
    rec.scheduled();
    Sse::new(stream::iter(["Hel", "lo"]).map(move |t| {
        rec.tokens(1);
        Ok(Event::default().data(t))
    }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf to :4318 by
    // default, grpc to :4317) and OTEL_TRACES_SAMPLER are honoured; a name given in code wins over
    // OTEL_SERVICE_NAME (leave `.service_name` out to take the variable's). Metrics off:
    // infertrace's collector, Jaeger and Tempo take traces only (and would answer the meter
    // provider's exports with errors, and `shutdown` with one); on for an OpenTelemetry Collector.
    let providers = otlp::init(
        OtlpConfig::from_env()
            .service_name("my-llm-server")
            .metrics(false),
    )?;
    providers.install_global(); // for other OpenTelemetry instrumentation in the process
    // The handlers' own `tracing` spans nest under the request span (optional). INFO and up:
    // the exporter's transport (tonic, h2, hyper) traces each export at DEBUG/TRACE, and those
    // spans would be exported in turn, more at every export.
    let tracer = providers.tracer_provider.tracer("my-llm-server");
    let handler_spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(LevelFilter::INFO);
    tracing_subscriber::registry().with(handler_spans).init();
    let app: Router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/chat/stream", post(chat_stream))
        // `route_layer`: the routes above only. A 404, or a route added below (health checks,
        // /metrics), is no inference request: not counted, and never queued for admission.
        // `/v1/chat/completions` is named `chat` by its path; a path it does not know, `chat` too.
        .route_layer(
            InferenceTraceLayer::new()
                .default_model("llama-3.1-8b")
                .default_operation("chat")
                .with_otlp(&providers),
        )
        .route("/health", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    providers.shutdown()?;
    Ok(())
}
