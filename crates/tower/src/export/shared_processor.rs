//! [`SharedSpanProcessor`]: one span processor for a tracer provider and a layer together.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

use super::batch::{BatchProcessor, BatchSettings};

/// A [`SpanProcessor`] that can be shared: one clone goes into a tracer provider (for the
/// handler's own spans), another to
/// [`InferenceTraceLayer::with_span_processor`](crate::InferenceTraceLayer::with_span_processor),
/// and both feed the same processor (the same batch queue and exporter).
///
/// The resource is given once, to [`new`](Self::new): a tracer provider's later
/// `set_resource` call is ignored, because the processor is already shared by then. Give both
/// the same resource.
///
/// ```
/// use infertrace_tower::{InferenceTraceLayer, SharedSpanProcessor};
/// use opentelemetry_sdk::Resource;
/// use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
///
/// let resource = Resource::builder().with_service_name("my-llm-server").build();
/// let processor = SharedSpanProcessor::new(
///     SimpleSpanProcessor::new(InMemorySpanExporter::default()),
///     &resource,
/// );
/// let provider = SdkTracerProvider::builder()
///     .with_span_processor(processor.clone())
///     .with_resource(resource)
///     .build();
/// let layer = InferenceTraceLayer::new()
///     .with_tracer_provider(&provider)
///     .with_span_processor(processor);
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct SharedSpanProcessor {
    pub(crate) inner: Arc<dyn SpanProcessor>,
    /// The same processor when it is infertrace's own batch processor ([`Self::batch`]).
    pub(crate) batch: Option<Arc<BatchProcessor>>,
}

impl SharedSpanProcessor {
    /// Wraps `processor` after giving it `resource` (what a tracer provider would have done).
    pub fn new(mut processor: impl SpanProcessor + 'static, resource: &Resource) -> Self {
        processor.set_resource(resource);
        Self {
            inner: Arc::new(processor),
            batch: None,
        }
    }

    /// infertrace's batch processor exporting to `exporter` (given `resource`): batching as the
    /// SDK's `BatchSpanProcessor` does, with its `OTEL_BSP_MAX_QUEUE_SIZE`,
    /// `OTEL_BSP_SCHEDULE_DELAY` and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` variables and defaults, on
    /// one export thread. Other spans pass through it unchanged; a layer using it
    /// ([`with_span_processor`](crate::InferenceTraceLayer::with_span_processor),
    /// `with_otlp`) hands each finished request over
    /// as one queue entry, and its four spans are built on the export thread. The queue and
    /// batch sizes count entries (for the layer's requests: requests, not spans; see
    /// [`BatchSettings`]). A full queue drops
    /// (and counts, see [`dropped_spans`](Self::dropped_spans)) rather than block a request.
    /// `OTEL_BSP_EXPORT_TIMEOUT` is not applied: an export call takes as long as the exporter's
    /// own timeout allows (as with the SDK's thread-based processor). Like the SDK's batch
    /// processor, it exports every span it is given, record-only (unsampled) ones included; the
    /// queue is allocated up front (see [`BatchSettings::max_queue_size`]).
    ///
    /// Fails only if the export thread cannot be started.
    ///
    /// ```
    /// use infertrace_tower::{InferenceTraceLayer, SharedSpanProcessor};
    /// use opentelemetry_sdk::Resource;
    /// use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    ///
    /// let resource = Resource::builder().with_service_name("my-llm-server").build();
    /// let processor = SharedSpanProcessor::batch(InMemorySpanExporter::default(), &resource)?;
    /// let provider = SdkTracerProvider::builder()
    ///     .with_span_processor(processor.clone())
    ///     .with_resource(resource)
    ///     .build();
    /// let layer = InferenceTraceLayer::new()
    ///     .with_tracer_provider(&provider)
    ///     .with_span_processor(processor);
    /// # let _ = layer;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn batch(
        exporter: impl SpanExporter + 'static,
        resource: &Resource,
    ) -> std::io::Result<Self> {
        Self::batch_with(exporter, resource, BatchSettings::from_env())
    }

    /// [`batch`](Self::batch) with explicit settings instead of the environment's.
    pub fn batch_with(
        exporter: impl SpanExporter + 'static,
        resource: &Resource,
        settings: BatchSettings,
    ) -> std::io::Result<Self> {
        let batch = Arc::new(BatchProcessor::new(exporter, resource, settings)?);
        Ok(Self {
            inner: Arc::clone(&batch) as Arc<dyn SpanProcessor>,
            batch: Some(batch),
        })
    }

    /// [`batch_with`](Self::batch_with), the layer's requests going to `requests` (which
    /// encodes them and sends them with `exporter`'s export calls) instead of `SpanData`.
    #[cfg(feature = "otlp")]
    pub(crate) fn batch_with_requests(
        exporter: impl SpanExporter + 'static,
        resource: &Resource,
        settings: BatchSettings,
        requests: Box<dyn super::batch::RequestExport>,
    ) -> std::io::Result<Self> {
        let batch = Arc::new(BatchProcessor::with_requests(
            exporter,
            resource,
            settings,
            Some(requests),
        )?);
        Ok(Self {
            inner: Arc::clone(&batch) as Arc<dyn SpanProcessor>,
            batch: Some(batch),
        })
    }

    /// Spans dropped so far by infertrace's batch processor (queue full, or after shutdown);
    /// `None` for a processor made with [`new`](Self::new), which keeps its own account.
    pub fn dropped_spans(&self) -> Option<u64> {
        self.batch.as_ref().map(|b| b.dropped_spans())
    }
}

impl fmt::Debug for SharedSpanProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedSpanProcessor")
            .field(&self.inner)
            .finish()
    }
}

impl SpanProcessor for SharedSpanProcessor {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.inner.shutdown()
    }

    /// Ignored: the resource was given to [`SharedSpanProcessor::new`].
    fn set_resource(&mut self, _resource: &Resource) {}
}
