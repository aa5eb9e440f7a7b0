//! A deterministic measure of the layer's cost: serves `N` requests through one variant of
//! `layer_overhead` (the same request, engine and exporters), for `valgrind --tool=callgrind
//! --separate-threads=yes`, whose instruction counts do not depend on the machine's load.
//!
//! ```sh
//! cargo bench -p infertrace-tower --bench layer_callgrind --no-run
//! scripts/layer-callgrind.sh            # every variant, instructions per request
//! ```
//!
//! Run directly: `layer_callgrind VARIANT N`. Variants (as in `layer_overhead`):
//! `bare`; `infertrace_handover` (infertrace's batch processor, dropping exporter) and
//! `otel_instrumentation_tower` (the peer, the SDK's batch processor, dropping exporter), both
//! flushed after every batch's worth (infertrace: its default 512 entries, 512 requests;
//! the peer: 4,096 spans); `infertrace_otlp` (`otlp::init` + `with_otlp`: the layer's own
//! OTLP encoding) and `otel_instrumentation_tower_otlp` (the peer through opentelemetry-otlp),
//! both to a local receiver in a child process, flushed after every batch's worth (512
//! entries) as the bench paces them. The script runs each variant with
//! two counts and divides the difference by the difference of the counts: set-up, warm-up and
//! shutdown cancel out, what is left is the cost per request, on the request thread (the main
//! thread) and in the whole process (every thread).

use std::future::{Future, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use infertrace_tower::{BatchSettings, InferenceTraceLayer, SharedSpanProcessor};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter, SpanProcessor as _};
use tower::{Layer, Service};

mod support;

use support::{Engine, RECEIVER_ENV, one, run_receiver, start_receiver};

/// `layer_overhead`'s engine with one SSE chunk.
const ENGINE: Engine = Engine { chunks: 1 };

#[derive(Debug)]
struct DropExporter;

impl SpanExporter for DropExporter {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        drop(batch);
        ready(Ok(()))
    }
}

/// Serves `n` requests, flushing `processor` after every `every` of them and at the end.
fn serve<S, B>(mut svc: S, n: u64, processor: Option<(&SharedSpanProcessor, u64)>)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    B: Body,
{
    for i in 1..=n {
        one(&mut svc);
        if let Some((processor, every)) = processor
            && (i % every == 0 || i == n)
        {
            let _ = processor.force_flush();
        }
    }
}

fn resource() -> opentelemetry_sdk::Resource {
    opentelemetry_sdk::Resource::builder()
        .with_service_name("bench")
        .build()
}

/// The peer (opentelemetry-instrumentation-tower 0.19, tracing only) over the global provider.
fn peer(
    provider: SdkTracerProvider,
    processor: &SharedSpanProcessor,
    n: u64,
    every: u64,
) -> Result<(), String> {
    opentelemetry::global::set_tracer_provider(provider);
    let layer = opentelemetry_instrumentation_tower::http::server::LayerBuilder::builder()
        .with_metrics(false)
        .build()
        .map_err(|e| format!("peer layer: {e}"))?;
    serve(layer.layer(ENGINE), n, Some((processor, every)));
    Ok(())
}

fn run(variant: &str, n: u64) -> Result<(), String> {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    match variant {
        "bare" => serve(ENGINE, n, None),
        "infertrace_handover" => {
            let own = SharedSpanProcessor::batch_with(
                DropExporter,
                &resource(),
                BatchSettings {
                    max_queue_size: 1 << 14,
                    scheduled_delay: Duration::from_secs(5),
                    max_export_batch_size: 512,
                },
            )
            .map_err(|e| format!("export thread: {e}"))?;
            let provider = SdkTracerProvider::builder()
                .with_span_processor(own.clone())
                .build();
            // Tracing only, as the peer (`with_metrics(false)`).
            let layer = InferenceTraceLayer::new()
                .with_tracer_provider(&provider)
                .with_span_processor(own.clone())
                .without_metrics()
                .default_model("llama-3.1-8b");
            serve(layer.layer(ENGINE), n, Some((&own, 512)));
        }
        "otel_instrumentation_tower" => {
            let config = opentelemetry_sdk::trace::BatchConfigBuilder::default()
                .with_max_queue_size(1 << 16)
                .with_max_export_batch_size(4096)
                .build();
            let sdk = opentelemetry_sdk::trace::BatchSpanProcessor::builder(DropExporter)
                .with_batch_config(config)
                .build();
            let sdk = SharedSpanProcessor::new(sdk, &resource());
            let provider = SdkTracerProvider::builder()
                .with_span_processor(sdk.clone())
                .build();
            peer(provider, &sdk, n, 4096)?;
        }
        "infertrace_otlp" | "otel_instrumentation_tower_otlp" => {
            let (mut child, base) = start_receiver().ok_or("no receiver")?;
            let result = if variant == "infertrace_otlp" {
                let config = infertrace_tower::otlp::OtlpConfig::http(&base)
                    .service_name("bench")
                    .metrics(false);
                let providers =
                    infertrace_tower::otlp::init(config).map_err(|e| format!("otlp: {e}"))?;
                let own = providers.span_processor.clone();
                let layer = InferenceTraceLayer::new()
                    .with_otlp(&providers)
                    .default_model("llama-3.1-8b");
                serve(layer.layer(ENGINE), n, Some((&own, 512)));
                Ok(())
            } else {
                use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
                // The exporter's own blocking client, given explicitly: the test build turns
                // on opentelemetry-otlp's async client too, which it would otherwise pick.
                let client = reqwest::blocking::Client::builder()
                    .build()
                    .map_err(|e| format!("client: {e}"))?;
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(format!("{base}/v1/traces"))
                    .build()
                    .map_err(|e| format!("exporter: {e}"))?;
                let sdk = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter).build();
                let sdk = SharedSpanProcessor::new(sdk, &resource());
                let provider = SdkTracerProvider::builder()
                    .with_span_processor(sdk.clone())
                    .with_resource(resource())
                    .build();
                peer(provider, &sdk, n, 512)
            };
            let _ = child.kill();
            let _ = child.wait();
            result?;
        }
        other => return Err(format!("unknown variant {other}")),
    }
    Ok(())
}

fn main() {
    if std::env::var_os(RECEIVER_ENV).is_some() {
        run_receiver();
        return;
    }
    // `cargo bench` and `cargo test --benches` pass flags (`--bench`, filters): nothing to do
    // then; this binary runs only when named a variant and a count.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(variant), Some(n)) = (
        args.first().filter(|a| !a.starts_with('-')),
        args.get(1).and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!(
            "layer_callgrind: run as `layer_callgrind VARIANT N` (scripts/layer-callgrind.sh)"
        );
        return;
    };
    if let Err(e) = run(variant, n) {
        eprintln!("layer_callgrind: {e}");
        std::process::exit(1);
    }
}
