//! [`InferenceTraceLayer`]: the builder users configure, and the shared state its services use.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::trace::TracerProvider;
use opentelemetry::{StringValue, global};
use opentelemetry_sdk::trace::ShouldSample;
use tower::Layer;

use crate::admission::{AdmissionConfig, AdmissionQueue};
use crate::config::{DescribeFn, PhaseSource, Shared, SkipFn, scope};
use crate::counters::Counters;
use crate::export::{SharedSpanProcessor, Sink};
use crate::interning::{self, Kind};
use crate::metrics::LayerMetrics;
#[cfg(feature = "otlp")]
use crate::otlp::OtlpProviders;
use crate::record::LayerState;
use crate::request_facts::{RequestDescription, RequestHead};
use crate::service::InferenceTraceService;

/// `gen_ai.provider.name` until [`InferenceTraceLayer::provider_name`] says otherwise: the layer
/// runs inside the serving system, which the GenAI conventions let name itself.
pub const DEFAULT_PROVIDER: &str = "self_hosted";

/// A Tower [`Layer`] that traces every LLM inference request into a request span with `queue`,
/// `prefill` and `decode` children, and records the GenAI server metrics.
///
/// Cheap to clone; every service it makes shares one admission queue and one set of instruments.
///
/// ```
/// use infertrace_tower::{AdmissionConfig, InferenceTraceLayer, PhaseSource};
/// let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
/// let layer = InferenceTraceLayer::new()
///     .with_tracer_provider(&provider)
///     .phase_source(PhaseSource::Derived)
///     .admission(AdmissionConfig::new(8, 64))
///     .default_model("llama-3.1-8b");
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct InferenceTraceLayer {
    /// The tracer sink of [`with_tracer_provider`](Self::with_tracer_provider).
    tracer: Option<Sink>,
    /// Export finished spans straight to this processor instead of through `tracer`, with the
    /// SDK's default sampler as read when it was given.
    direct: Option<(SharedSpanProcessor, Box<dyn ShouldSample>)>,
    /// The direct path's sampler when set by [`with_sampler`](Self::with_sampler) or
    /// `with_otlp`, and whether it may read span attributes.
    sampler: Option<(Box<dyn ShouldSample>, bool)>,
    metrics: Option<LayerMetrics>,
    meter: Option<Meter>,
    /// Whether requests are recorded as metrics (see [`without_metrics`](Self::without_metrics)).
    record_metrics: bool,
    phase_source: PhaseSource,
    gpu: Option<Counters>,
    admission: Option<Arc<AdmissionQueue>>,
    default_model: Option<StringValue>,
    default_operation: Cow<'static, str>,
    provider: StringValue,
    describe: Option<Arc<DescribeFn>>,
    skip: Option<Arc<SkipFn>>,
    /// The state every service shares, built lazily by the first `layer()` call so global
    /// providers set after the layer is built are still picked up.
    state: Arc<OnceLock<Arc<LayerState>>>,
}

impl fmt::Debug for InferenceTraceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InferenceTraceLayer")
            .field("direct_export", &self.direct.is_some())
            .field("phase_source", &self.phase_source)
            .field("admission", &self.admission.as_ref().map(|a| a.config()))
            .field("default_model", &self.default_model)
            .field("default_operation", &self.default_operation)
            .field("gpu_telemetry", &self.gpu.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for InferenceTraceLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl InferenceTraceLayer {
    /// A layer using the global tracer and meter providers (as set when the first service is
    /// built), engine phase marks, no admission queue.
    pub fn new() -> Self {
        Self {
            tracer: None,
            direct: None,
            sampler: None,
            metrics: None,
            meter: None,
            record_metrics: true,
            phase_source: PhaseSource::Engine,
            gpu: None,
            admission: None,
            default_model: None,
            default_operation: Cow::Borrowed(
                infertrace_semconv::gen_ai::operation::GENERATE_CONTENT,
            ),
            provider: StringValue::from(DEFAULT_PROVIDER),
            describe: None,
            skip: None,
            state: Arc::default(),
        }
    }

    fn changed(mut self) -> Self {
        self.state = Arc::default();
        self
    }

    /// Uses a tracer from `provider` instead of the global one. An
    /// [`SdkTracerProvider`](opentelemetry_sdk::trace::SdkTracerProvider) is used directly (no
    /// boxing per span); any other provider through `opentelemetry`'s boxed tracer.
    ///
    /// This alone keeps the layer on the tracer path. For the cheaper direct path give the
    /// layer the provider's span processor too ([`with_span_processor`](Self::with_span_processor),
    /// in either order), or, for providers from `otlp::init` (feature `otlp`), use
    /// `with_otlp`.
    pub fn with_tracer_provider<P>(mut self, provider: &P) -> Self
    where
        P: TracerProvider + 'static,
        P::Tracer: Send + Sync + 'static,
        <P::Tracer as opentelemetry::trace::Tracer>::Span: Send + Sync + 'static,
    {
        self.tracer = Some(Sink::tracer(provider));
        self.changed()
    }

    #[cfg(feature = "otlp")]
    /// Exports through what [`otlp::init`](crate::otlp::init) built: the layer's spans go
    /// straight to [`OtlpProviders::span_processor`] (the direct path of
    /// [`with_span_processor`](Self::with_span_processor)), sampled by the tracer provider's
    /// sampler; the layer's metrics go to the meter provider if metrics are on. If they are off,
    /// a meter provider given to the layer before ([`with_meter_provider`](Self::with_meter_provider))
    /// keeps them; otherwise none are recorded (as [`without_metrics`](Self::without_metrics)).
    /// The handler's
    /// own spans reach the same batch processor through the tracer provider (install it
    /// globally, or give it to `tracing-opentelemetry`).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), infertrace_tower::otlp::OtlpError> {
    /// use infertrace_tower::InferenceTraceLayer;
    /// use infertrace_tower::otlp::{self, OtlpConfig};
    /// let providers = otlp::init(OtlpConfig::from_env())?;
    /// providers.install_global(); // for the handler's `tracing` spans
    /// let layer = InferenceTraceLayer::new().with_otlp(&providers);
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn with_otlp(self, providers: &OtlpProviders) -> Self {
        let mut layer = self
            .with_tracer_provider(&providers.tracer_provider)
            .with_span_processor(providers.span_processor.clone());
        layer.sampler = Some((
            providers.sampler.clone(),
            providers.sampler_reads_attributes,
        ));
        match &providers.meter_provider {
            Some(meters) => layer.with_meter_provider(meters),
            // A meter provider given before (or `without_metrics`) stays as it was.
            None if layer.meter.is_some() => layer.changed(),
            None => layer.without_metrics(),
        }
    }

    /// Exports the layer's spans straight to `processor` instead of through a tracer. The layer
    /// builds its spans once, at the end, from instants it already recorded, so it skips the
    /// SDK's live-span work (builder, context, a sampler call and ids per span, the span's
    /// bookkeeping). With infertrace's batch processor ([`SharedSpanProcessor::batch`], what
    /// `with_otlp` uses) each finished request is one queue entry and its
    /// four spans are built on the export thread, which leaves the least work on the request's
    /// thread (see `docs/PERFORMANCE.md`). With any other processor
    /// ([`SharedSpanProcessor::new`]) the request span and its phase spans are handed over as
    /// finished [`SpanData`](opentelemetry_sdk::trace::SpanData), one `SpanProcessor::on_end`
    /// call each.
    ///
    /// What stays the same: span names, kinds, attributes, status and timestamps (a test checks
    /// both paths give equal spans); the incoming `traceparent` is continued; the handler runs
    /// under a context holding the request span's context, so `tracing` spans (through
    /// `tracing-opentelemetry`) and outgoing propagation nest under the request span. Share
    /// `processor` with the tracer provider those go to, so everything ends up in one queue.
    ///
    /// Sampling: the request span's decision is made once at arrival by the sampler of
    /// [`with_sampler`](Self::with_sampler), by default the SDK's default —
    /// `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (`always_on`, `always_off`,
    /// `traceidratio`, `parentbased_always_on` (the default), `parentbased_always_off`,
    /// `parentbased_traceidratio`), exactly as an `SdkTracerProvider` reads them. Phase spans
    /// follow the request span. Unlike the SDK tracer, the layer does not call
    /// `SpanProcessor::on_start` and applies no span limits (its spans carry at most ≈ 35
    /// attributes).
    ///
    /// `with_otlp` (feature `otlp`) sets this up for the providers of `otlp::init`. See [`SharedSpanProcessor`] for an example.
    pub fn with_span_processor(mut self, processor: SharedSpanProcessor) -> Self {
        let sampler = opentelemetry_sdk::trace::Config::default().sampler;
        self.direct = Some((processor, sampler));
        self.changed()
    }

    /// The sampler that decides, once per request, whether the request span (and with it the
    /// phase spans) is recorded on the direct path ([`with_span_processor`](Self::with_span_processor)).
    /// It is given the request span's arrival attributes (operation, model, HTTP or RPC
    /// attributes), as the SDK tracer would give them. Ignored on the tracer path, where the
    /// tracer provider's sampler decides.
    ///
    /// ```
    /// use infertrace_tower::InferenceTraceLayer;
    /// use opentelemetry_sdk::trace::Sampler;
    /// let layer = InferenceTraceLayer::new().with_sampler(Sampler::ParentBased(Box::new(
    ///     Sampler::TraceIdRatioBased(0.1),
    /// )));
    /// # let _ = layer;
    /// ```
    pub fn with_sampler(mut self, sampler: impl ShouldSample + 'static) -> Self {
        self.sampler = Some((Box::new(sampler), true));
        self.changed()
    }

    /// Records metrics through `provider` instead of the global meter provider.
    pub fn with_meter_provider<P: MeterProvider + ?Sized>(mut self, provider: &P) -> Self {
        let meter = provider.meter_with_scope(scope());
        self.metrics = Some(LayerMetrics::new(&meter));
        self.meter = Some(meter);
        self.record_metrics = true;
        self.changed()
    }

    /// Records no metrics, spans only: for a deployment whose GenAI metrics come from the
    /// spans (the collector derives the same latency and token figures from them), or to save
    /// the metrics' cost per request. GPU and host metrics are not registered either.
    /// [`with_meter_provider`](Self::with_meter_provider) afterwards turns them back on.
    pub fn without_metrics(mut self) -> Self {
        let noop = opentelemetry::metrics::noop::NoopMeterProvider::new();
        let meter = noop.meter_with_scope(scope());
        self.metrics = Some(LayerMetrics::new(&meter));
        self.meter = Some(meter);
        self.record_metrics = false;
        self.changed()
    }

    /// Where phase boundaries come from (default [`PhaseSource::Engine`]).
    pub fn phase_source(mut self, source: PhaseSource) -> Self {
        self.phase_source = source;
        self.changed()
    }

    #[cfg(feature = "gpu")]
    /// Enriches every phase span with the GPU and host counters of `telemetry` over exactly that
    /// phase (`gpu.*`, `host.*`, `process.*` window statistics and `gpu.energy.attributed`, the
    /// request's token-share estimate of the GPU energy), and registers its `hw.*` and host
    /// metrics once on the layer's meter.
    ///
    /// Start the telemetry once, at startup: [`GpuTelemetry::start`](crate::GpuTelemetry::start)
    /// blocks while NVML loads. Without GPUs (NVML absent, or
    /// [`GpuTelemetry::disabled`](crate::GpuTelemetry::disabled)) no `gpu.*` attribute is ever
    /// emitted — never zeros. See the crate docs, "GPU and host counters".
    ///
    /// ```
    /// use infertrace_tower::{GpuTelemetry, InferenceTraceLayer};
    /// let layer = InferenceTraceLayer::new().gpu_telemetry(GpuTelemetry::disabled());
    /// # let _ = layer;
    /// ```
    pub fn gpu_telemetry(mut self, telemetry: infertrace_gpu::GpuTelemetry) -> Self {
        self.gpu = Some(telemetry);
        self.changed()
    }

    /// Adds the built-in admission queue (see [`AdmissionConfig`]).
    pub fn admission(mut self, config: AdmissionConfig) -> Self {
        self.admission = Some(Arc::new(AdmissionQueue::new(config)));
        self.changed()
    }

    /// The model named when neither a [`describe`](Self::describe) function, the
    /// [`MODEL_HEADER`](crate::MODEL_HEADER) header nor the handler (through
    /// [`RequestRecorder::request_model`](crate::RequestRecorder::request_model)) names one.
    pub fn default_model(mut self, model: impl Into<String>) -> Self {
        self.default_model = Some(interning::shared_value(Kind::Model, &model.into()));
        self.changed()
    }

    /// `gen_ai.provider.name` on every request span (required by the GenAI semantic
    /// conventions): the serving system as your users know it, e.g. `vllm`, `sglang` or your
    /// platform's name. Default [`DEFAULT_PROVIDER`].
    pub fn provider_name(mut self, provider: impl Into<String>) -> Self {
        self.provider = StringValue::from(provider.into());
        self.changed()
    }

    /// The operation used for paths the layer does not recognise (default `generate_content`).
    /// Recognised paths: `…/chat/completions` → `chat`, `…/completions` → `text_completion`,
    /// `…/embeddings` → `embeddings`; gRPC requests → `generate_content`.
    pub fn default_operation(mut self, operation: impl Into<Cow<'static, str>>) -> Self {
        self.default_operation = operation.into();
        self.changed()
    }

    /// A function that names the operation and model of each request. Its answers win over the
    /// headers and the path; the handler can still set the model later through the recorder.
    pub fn describe<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> RequestDescription + Send + Sync + 'static,
    {
        self.describe = Some(Arc::new(f));
        self.changed()
    }

    /// A predicate selecting requests the layer passes through untraced (health checks,
    /// metrics scrapes). Skipped requests get no span, no metrics, no recorder and no wait for
    /// admission. With axum, `Router::route_layer` does the same by route: the routes before
    /// it only, not the fallback.
    pub fn skip<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.skip = Some(Arc::new(f));
        self.changed()
    }

    fn state(&self) -> Arc<LayerState> {
        self.state
            .get_or_init(|| {
                let sink = match (&self.direct, &self.tracer) {
                    (Some((processor, default_sampler)), _) => match &self.sampler {
                        Some((sampler, reads_attributes)) => {
                            Sink::processor(processor, sampler.clone(), *reads_attributes)
                        }
                        None => Sink::processor(processor, default_sampler.clone(), false),
                    },
                    (None, Some(tracer)) => tracer.clone(),
                    (None, None) => Sink::global(),
                };
                let meter = self
                    .meter
                    .clone()
                    .unwrap_or_else(|| global::meter_with_scope(scope()));
                let metrics = self
                    .metrics
                    .clone()
                    .unwrap_or_else(|| LayerMetrics::new(&meter));
                if let Some(gpu) = &self.gpu {
                    gpu.register_metrics(&meter);
                }
                let shared = Shared {
                    metrics,
                    record_metrics: self.record_metrics,
                    phase_source: self.phase_source,
                    admission: self.admission.clone(),
                    default_model: self.default_model.clone(),
                    default_operation: self.default_operation.clone(),
                    provider: self.provider.clone(),
                    describe: self.describe.clone(),
                    skip: self.skip.clone(),
                    gpu: self.gpu.clone(),
                };
                Arc::new(LayerState { shared, sink })
            })
            .clone()
    }
}

impl<S> Layer<S> for InferenceTraceLayer {
    type Service = InferenceTraceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InferenceTraceService::new(inner, self.state())
    }
}

#[cfg(feature = "otlp")]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{OtlpConfig, init};

    fn records_metrics(layer: &InferenceTraceLayer) -> bool {
        layer.state().shared.record_metrics
    }

    #[test]
    fn with_otlp_records_metrics_only_where_some_meter_wants_them() {
        let config = |metrics| {
            OtlpConfig::http("http://127.0.0.1:9")
                .service_name("layer-test")
                .metrics(metrics)
        };
        let off = init(config(false)).expect("providers");
        let on = init(config(true)).expect("providers");
        assert!(!records_metrics(
            &InferenceTraceLayer::new().with_otlp(&off)
        ));
        assert!(records_metrics(&InferenceTraceLayer::new().with_otlp(&on)));
        // A meter provider given before is kept when the config turns metrics off.
        let meters = opentelemetry_sdk::metrics::SdkMeterProvider::builder().build();
        let kept = InferenceTraceLayer::new()
            .with_meter_provider(&meters)
            .with_otlp(&off);
        assert!(records_metrics(&kept));
        assert!(!records_metrics(
            &InferenceTraceLayer::new().without_metrics().with_otlp(&off)
        ));
        assert!(records_metrics(&InferenceTraceLayer::new()));
    }
}
