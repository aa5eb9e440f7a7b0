//! [`InferenceTraceLayer`]: the builder users configure, and the shared state its services use.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, Method, Uri};
use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::trace::TracerProvider;
use opentelemetry::{InstrumentationScope, StringValue, global};
use opentelemetry_sdk::trace::{SdkTracerProvider, ShouldSample};
use tower::Layer;

use crate::admission::AdmissionQueue;
use crate::counters::Counters;
use crate::direct::{DirectExport, SharedSpanProcessor};
use crate::metrics::LayerMetrics;
#[cfg(feature = "otlp")]
use crate::otlp::OtlpProviders;
use crate::service::InferenceTraceService;
use crate::spans::TracerHandle;

/// Request header naming the model the client asked for (`gen_ai.request.model`).
pub const MODEL_HEADER: &str = "x-infertrace-model";
/// Request header naming the GenAI operation (`gen_ai.operation.name`), e.g. `chat`.
pub const OPERATION_HEADER: &str = "x-infertrace-operation";

/// Where the queue / prefill / decode boundaries come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PhaseSource {
    /// The engine marks them through the [`RequestRecorder`](crate::RequestRecorder) in the
    /// request extensions (`scheduled`, `first_token`, `tokens`). A request whose engine made no
    /// mark at all falls back to [`Derived`](Self::Derived), and says so in `infer.phase.source`.
    #[default]
    Engine,
    /// No engine changes: queue = arrival → admitted by the layer's admission queue; for streamed
    /// responses prefill = admitted → first body chunk and decode = first → last chunk; for
    /// non-streamed responses one `inference` span covers admitted → end of body, because there is
    /// no first-chunk signal to split prefill from decode.
    Derived,
}

impl PhaseSource {
    /// The `infer.phase.source` value.
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseSource::Engine => infertrace_semconv::infer::phase_source::ENGINE,
            PhaseSource::Derived => infertrace_semconv::infer::phase_source::DERIVED,
        }
    }
}

/// Settings of the optional built-in admission queue.
///
/// At most `max_concurrent` requests run the inner service at once; up to `max_queue` more wait in
/// FIFO order (their wait is the `queue` phase). A request arriving when both are full is answered
/// at once with `429 Too Many Requests` (HTTP) or a trailers-only `RESOURCE_EXHAUSTED` (gRPC), and
/// its span says `infer.outcome = rejected`. A slot is held until the response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Requests served at once (at least 1).
    pub max_concurrent: usize,
    /// Requests allowed to wait for a slot.
    pub max_queue: usize,
}

impl AdmissionConfig {
    /// An admission queue with `max_concurrent` slots and room for `max_queue` waiters.
    pub fn new(max_concurrent: usize, max_queue: usize) -> Self {
        Self {
            max_concurrent,
            max_queue,
        }
    }
}

/// The parts of a request a [`describe`](InferenceTraceLayer::describe) or
/// [`skip`](InferenceTraceLayer::skip) function sees.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    /// Request method.
    pub method: &'a Method,
    /// Request URI.
    pub uri: &'a Uri,
    /// Request headers (gRPC metadata included).
    pub headers: &'a HeaderMap,
}

/// What a [`describe`](InferenceTraceLayer::describe) function says about a request. `None`
/// fields fall back to the defaults (headers, path, the layer's default model).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestDescription {
    /// `gen_ai.operation.name`, e.g. `chat`.
    pub operation: Option<Cow<'static, str>>,
    /// `gen_ai.request.model`.
    pub model: Option<String>,
}

pub(crate) type DescribeFn = dyn Fn(&RequestHead<'_>) -> RequestDescription + Send + Sync;
pub(crate) type SkipFn = dyn Fn(&RequestHead<'_>) -> bool + Send + Sync;

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
    tracer: Option<TracerHandle>,
    /// Export finished spans straight to this processor instead of through `tracer`.
    direct: Option<DirectExport>,
    /// The sampler of the direct path, when set by [`with_sampler`](Self::with_sampler).
    /// The direct path's sampler, and whether it may read span attributes.
    sampler: Option<(Box<dyn ShouldSample>, bool)>,
    metrics: Option<LayerMetrics>,
    meter: Option<Meter>,
    phase_source: PhaseSource,
    gpu: Option<Counters>,
    admission: Option<Arc<AdmissionQueue>>,
    default_model: Option<StringValue>,
    default_operation: Cow<'static, str>,
    describe: Option<Arc<DescribeFn>>,
    skip: Option<Arc<SkipFn>>,
    /// The shared state, built lazily by the first `layer()` call so global providers set after
    /// the layer is built are still picked up.
    shared: Arc<std::sync::OnceLock<Arc<Shared>>>,
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

/// The instrumentation scope of every span and metric the layer emits.
#[inline]
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("infertrace-tower")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
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
            phase_source: PhaseSource::Engine,
            gpu: None,
            admission: None,
            default_model: None,
            default_operation: Cow::Borrowed(
                infertrace_semconv::gen_ai::operation::GENERATE_CONTENT,
            ),
            describe: None,
            skip: None,
            shared: Arc::default(),
        }
    }

    fn changed(mut self) -> Self {
        self.shared = Arc::default();
        self
    }

    /// Uses a tracer from `provider` instead of the global one. An
    /// [`SdkTracerProvider`] is used directly (no boxing per span); any other provider through
    /// `opentelemetry`'s boxed tracer.
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
        let any: &dyn std::any::Any = provider;
        self.tracer = Some(match any.downcast_ref::<SdkTracerProvider>() {
            Some(sdk) => TracerHandle::Sdk(sdk.tracer_with_scope(scope())),
            None => TracerHandle::Boxed(Arc::new(global::BoxedTracer::new(Box::new(
                provider.tracer_with_scope(scope()),
            )))),
        });
        self.changed()
    }

    #[cfg(feature = "otlp")]
    /// Exports through what [`otlp::init`](crate::otlp::init) built: the layer's spans go
    /// straight to [`OtlpProviders::span_processor`] (the direct path of
    /// [`with_span_processor`](Self::with_span_processor)), sampled by the tracer provider's
    /// sampler; the layer's metrics go to the meter provider, if metrics are on. The handler's
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
            None => layer.changed(),
        }
    }

    /// Exports the layer's spans straight to `processor` instead of through a tracer. The layer
    /// builds its spans once, at the end, from instants it already recorded, so it skips the
    /// SDK's live-span work (builder, context, a sampler call and ids per span, the span's
    /// bookkeeping). With infertrace's batch processor ([`SharedSpanProcessor::batch`], what
    /// `with_otlp` uses) each finished request is one queue entry and its
    /// four spans are built on the export thread: about a third of the tracer path's cost on
    /// the request's thread (see `docs/PERFORMANCE.md`). With any other processor
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
        self.direct = Some(DirectExport::new(processor, sampler));
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
    /// [`MODEL_HEADER`] header nor the handler (through
    /// [`RequestRecorder::request_model`](crate::RequestRecorder::request_model)) names one.
    pub fn default_model(mut self, model: impl Into<String>) -> Self {
        self.default_model = Some(crate::interning::shared_value(
            crate::interning::Kind::Model,
            &model.into(),
        ));
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
    /// metrics scrapes). Skipped requests get no span, no metrics and no recorder.
    pub fn skip<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.skip = Some(Arc::new(f));
        self.changed()
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared
            .get_or_init(|| {
                let tracer = match (&self.direct, &self.tracer) {
                    (Some(direct), _) => {
                        let mut direct = direct.clone();
                        if let Some((sampler, reads_attributes)) = &self.sampler {
                            direct.set_sampler(sampler.clone(), *reads_attributes);
                        }
                        TracerHandle::Direct(Arc::new(direct))
                    }
                    (None, Some(tracer)) => tracer.clone(),
                    (None, None) => {
                        TracerHandle::Boxed(Arc::new(global::tracer_with_scope(scope())))
                    }
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
                Arc::new(Shared {
                    tracer,
                    metrics,
                    phase_source: self.phase_source,
                    admission: self.admission.clone(),
                    default_model: self.default_model.clone(),
                    default_operation: self.default_operation.clone(),
                    describe: self.describe.clone(),
                    skip: self.skip.clone(),
                    gpu: self.gpu.clone(),
                })
            })
            .clone()
    }
}

impl<S> Layer<S> for InferenceTraceLayer {
    type Service = InferenceTraceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InferenceTraceService::new(inner, self.shared())
    }
}

/// State shared by every service a layer makes.
pub(crate) struct Shared {
    pub(crate) tracer: TracerHandle,
    pub(crate) metrics: LayerMetrics,
    pub(crate) phase_source: PhaseSource,
    pub(crate) admission: Option<Arc<AdmissionQueue>>,
    pub(crate) default_model: Option<StringValue>,
    pub(crate) default_operation: Cow<'static, str>,
    pub(crate) describe: Option<Arc<DescribeFn>>,
    pub(crate) skip: Option<Arc<SkipFn>>,
    /// GPU and host counters for the phase spans (`None`: no enrichment at all).
    pub(crate) gpu: Option<Counters>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("phase_source", &self.phase_source)
            .finish_non_exhaustive()
    }
}
