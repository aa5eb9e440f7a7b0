//! The direct export path: the layer hands finished [`SpanData`] straight to a span processor.
//!
//! The layer builds its phase spans once, at the end of a request, from instants it already
//! recorded, so the SDK's live-span machinery (span builder, `Context`, a sampler call and id
//! generation per span, the span's own bookkeeping, `end` → processor) is pure overhead for them.
//! With a processor (see [`InferenceTraceLayer::with_span_processor`](crate::InferenceTraceLayer::with_span_processor))
//! the layer instead:
//!
//! - at arrival, takes the trace id of the parent context (incoming `traceparent` or the current
//!   span) or makes a new one, makes the request span's id, asks the sampler once (with the
//!   request attributes known then, exactly as the SDK would for the SERVER span), and runs the
//!   handler under a context holding that span context, so `tracing` spans and outgoing
//!   propagation nest under the request span;
//! - at the end, builds the request span and its phase spans as [`SpanData`] (phase spans follow
//!   the request span's sampling decision, as a parent-based sampler would decide) and calls
//!   [`SpanProcessor::on_end`] for each.
//!
//! What the direct path does not do, unlike the SDK tracer: call `SpanProcessor::on_start` (there
//! is no live SDK span to pass; the batch and simple processors ignore it), apply span limits
//! (the layer's spans carry at most ≈ 35 attributes, well under the default limit of 128), or
//! notice a tracer provider's shutdown (the processor is shut down with it and drops what it
//! receives afterwards).

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceState,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, SamplingDecision, ShouldSample, Span, SpanData, SpanEvents,
    SpanExporter, SpanLinks, SpanProcessor,
};

use crate::batch::{
    BatchProcessor, BatchSettings, FinishedRequest, PhaseSpan, PhaseSpans, phase_span_data,
};
use crate::end_attributes::EndAttributes;
use crate::request_facts::{START_ATTRIBUTES, StartAttributes};
use crate::spans::REQUEST_ATTRIBUTE_ROOM;

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
    inner: Arc<dyn SpanProcessor>,
    /// The same processor when it is infertrace's own batch processor ([`Self::batch`]).
    batch: Option<Arc<BatchProcessor>>,
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
    /// as one queue entry, and its four spans are built on the export thread. A full queue drops
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

/// Where and how the layer exports directly: the processor and the sampler for request spans.
#[derive(Clone, Debug)]
pub(crate) struct DirectExport {
    processor: SharedSpanProcessor,
    sampler: Box<dyn ShouldSample>,
    /// Whether the sampler may read the request span's attributes: the SDK's own samplers
    /// (from `OTEL_TRACES_SAMPLER`, the default) never do, so they are not listed for them.
    sampler_reads_attributes: bool,
    ids: RandomIdGenerator,
}

impl DirectExport {
    /// Exports to `processor`, sampling with `sampler`, one of the SDK's own samplers (which
    /// never read attributes).
    pub(crate) fn new(processor: SharedSpanProcessor, sampler: Box<dyn ShouldSample>) -> Self {
        Self {
            processor,
            sampler,
            sampler_reads_attributes: false,
            ids: RandomIdGenerator::default(),
        }
    }

    /// Samples with `sampler` instead; `reads_attributes`: it may look at span attributes.
    pub(crate) fn set_sampler(&mut self, sampler: Box<dyn ShouldSample>, reads_attributes: bool) {
        self.sampler = sampler;
        self.sampler_reads_attributes = reads_attributes;
    }

    /// The SERVER request span, started at `start` under `parent`: its identity and sampling
    /// decision are final; attributes and status are added until [`DirectSpan::end`].
    ///
    /// With infertrace's batch processor the arrival attributes stay values until the export
    /// thread writes them (a sampler that may read attributes sees them in a reused per-thread
    /// list); otherwise they become the span's attribute list now.
    pub(crate) fn start_request(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        start_attributes: StartAttributes,
        parent: &Context,
    ) -> DirectSpan {
        let parent_span = parent.span();
        let psc = parent_span.span_context();
        let (psc_valid, trace_id) = if psc.is_valid() {
            (true, psc.trace_id())
        } else {
            (false, self.ids.new_trace_id())
        };
        let span_id = self.ids.new_span_id();
        let (mut attributes, deferred) = if self.processor.batch.is_some() {
            (Vec::new(), Some(start_attributes))
        } else {
            (start_attributes.to_vec(REQUEST_ATTRIBUTE_ROOM), None)
        };
        let result = if parent.is_telemetry_suppressed() {
            None
        } else {
            let sample = |attributes: &[KeyValue]| {
                self.sampler.should_sample(
                    Some(parent),
                    trace_id,
                    &name,
                    &SpanKind::Server,
                    attributes,
                    &[],
                )
            };
            Some(match &deferred {
                None => sample(&attributes),
                Some(_) if !self.sampler_reads_attributes => sample(&[]),
                Some(start) => SAMPLER_SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
                    Ok(mut list) => {
                        // Cleared first too: a panicking sampler would have left its list.
                        list.clear();
                        start.write(&mut |kv| list.push(kv));
                        let result = sample(&list);
                        list.clear();
                        result
                    }
                    Err(_) => sample(&start.to_vec(0)),
                }),
            })
        };
        let (decision, trace_state) = match result {
            Some(r) => {
                attributes.extend(r.attributes);
                (r.decision, r.trace_state)
            }
            None => (SamplingDecision::Drop, TraceState::NONE),
        };
        let flags = if psc_valid {
            psc.trace_flags()
        } else {
            TraceFlags::default()
        };
        let (recording, flags) = match decision {
            SamplingDecision::RecordAndSample => (true, flags.with_sampled(true)),
            SamplingDecision::RecordOnly => (true, flags.with_sampled(false)),
            SamplingDecision::Drop => (false, TraceFlags::default()),
        };
        DirectSpan {
            context: SpanContext::new(trace_id, span_id, flags, false, trace_state),
            parent_span_id: psc.span_id(),
            parent_span_is_remote: psc_valid && psc.is_remote(),
            name,
            start,
            start_attributes: deferred.filter(|_| recording),
            attributes,
            status: Status::Unset,
            recording,
            ended: false,
        }
    }

    /// Exports one finished INTERNAL phase span under the request span `parent`.
    pub(crate) fn phase(&self, phase: PhaseSpan, parent: &SpanContext) {
        self.processor
            .on_end(phase_span_data(parent, &self.ids, phase));
    }

    /// Ends `span` at `end` and exports it, once, if it is recording.
    pub(crate) fn end(&self, span: &mut DirectSpan, end: SystemTime) {
        self.export_request(span, end, |_| {});
    }

    /// Ends a recording request span at `end` with its end attributes and phase spans: as one
    /// queue entry to infertrace's batch processor, else span by span.
    #[inline]
    pub(crate) fn finish(
        &self,
        span: &mut DirectSpan,
        end: SystemTime,
        end_attributes: EndAttributes,
        phases: PhaseSpans,
    ) {
        if span.is_recording()
            && let Some(batch) = &self.processor.batch
        {
            batch.submit_request(FinishedRequest {
                span: DirectSpan::take(span),
                end,
                end_attributes,
                phases,
            });
            return;
        }
        if span.is_recording() && span.context.is_sampled() {
            for phase in phases {
                self.phase(phase, &span.context);
            }
        }
        self.export_request(span, end, |attributes| {
            end_attributes.write(&mut |kv| attributes.push(kv))
        });
    }

    /// Ends `span` at `end` and, if it was recording, exports it after `more` appended its last
    /// attributes. Once: later calls do nothing.
    fn export_request(
        &self,
        span: &mut DirectSpan,
        end: SystemTime,
        more: impl FnOnce(&mut Vec<KeyValue>),
    ) {
        if span.is_recording() {
            self.processor
                .on_end(DirectSpan::take(span).into_span_data(end, more));
        }
        span.ended = true;
    }
}

thread_local! {
    /// The list a sampler sees a request's arrival attributes in, when they are kept as values.
    static SAMPLER_SCRATCH: RefCell<Vec<KeyValue>> = RefCell::new(Vec::with_capacity(START_ATTRIBUTES));
}

/// The request span on the direct path: its final identity, and what it collects until it ends.
#[derive(Debug)]
pub(crate) struct DirectSpan {
    context: SpanContext,
    parent_span_id: SpanId,
    parent_span_is_remote: bool,
    name: Cow<'static, str>,
    start: SystemTime,
    /// The arrival attributes as values, written first when the span is built (with
    /// infertrace's batch processor, on its export thread); `None` when they are already the
    /// start of `attributes`.
    start_attributes: Option<StartAttributes>,
    /// The attributes (after `start_attributes`, if any).
    attributes: Vec<KeyValue>,
    status: Status,
    recording: bool,
    ended: bool,
}

impl DirectSpan {
    /// A recording span (for tests of what is built from it).
    #[cfg(test)]
    pub(crate) fn for_test(context: SpanContext, name: &'static str, start: SystemTime) -> Self {
        Self {
            context,
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            name: Cow::Borrowed(name),
            start,
            start_attributes: None,
            attributes: vec![KeyValue::new("gen_ai.operation.name", "chat")],
            status: Status::Unset,
            recording: true,
            ended: false,
        }
    }

    /// Takes the span out of `slot`, leaving an ended span with the same context behind.
    fn take(slot: &mut Self) -> Self {
        let left = Self {
            context: slot.context.clone(),
            parent_span_id: slot.parent_span_id,
            parent_span_is_remote: slot.parent_span_is_remote,
            name: Cow::Borrowed(""),
            start: slot.start,
            start_attributes: None,
            attributes: Vec::new(),
            status: Status::Unset,
            recording: slot.recording,
            ended: true,
        };
        std::mem::replace(slot, left)
    }

    pub(crate) fn span_context(&self) -> &SpanContext {
        &self.context
    }

    pub(crate) fn is_recording(&self) -> bool {
        self.recording && !self.ended
    }

    pub(crate) fn set_attribute(&mut self, attribute: KeyValue) {
        if self.is_recording() {
            self.attributes.push(attribute);
        }
    }

    /// As the SDK does: `Ok` is final, `Error` replaces `Unset`, `Unset` never replaces.
    pub(crate) fn set_status(&mut self, status: Status) {
        if self.is_recording() && status > self.status {
            self.status = status;
        }
    }

    pub(crate) fn update_name(&mut self, name: Cow<'static, str>) {
        if self.is_recording() {
            self.name = name;
        }
    }

    /// The finished SERVER span, ended at `end`, after `more` appended its last attributes.
    pub(crate) fn into_span_data(
        mut self,
        end: SystemTime,
        more: impl FnOnce(&mut Vec<KeyValue>),
    ) -> SpanData {
        if let Some(start) = self.start_attributes.take() {
            let mut all = start.to_vec(REQUEST_ATTRIBUTE_ROOM);
            all.append(&mut self.attributes);
            self.attributes = all;
        }
        more(&mut self.attributes);
        SpanData {
            span_context: self.context,
            parent_span_id: self.parent_span_id,
            parent_span_is_remote: self.parent_span_is_remote,
            span_kind: SpanKind::Server,
            name: self.name,
            start_time: self.start,
            end_time: end,
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: self.status,
            // Built from constants: cheaper than cloning a stored scope.
            instrumentation_scope: crate::layer::scope(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
    use opentelemetry_sdk::trace::{
        InMemorySpanExporter, Sampler, SdkTracerProvider, SimpleSpanProcessor,
    };

    use super::*;
    use crate::spans::{RequestSpan, TracerHandle};

    fn in_memory() -> (InMemorySpanExporter, SharedSpanProcessor) {
        let exporter = InMemorySpanExporter::default();
        let processor = SharedSpanProcessor::new(
            SimpleSpanProcessor::new(exporter.clone()),
            &Resource::builder().build(),
        );
        (exporter, processor)
    }

    /// infertrace's batch processor into memory; exports only when flushed (in these tests).
    fn in_memory_batch() -> (InMemorySpanExporter, SharedSpanProcessor) {
        let exporter = InMemorySpanExporter::default();
        let settings = BatchSettings {
            max_queue_size: 65_536,
            scheduled_delay: Duration::from_secs(3600),
            max_export_batch_size: 65_536,
        };
        let processor = SharedSpanProcessor::batch_with(
            exporter.clone(),
            &Resource::builder().build(),
            settings,
        )
        .expect("export thread");
        (exporter, processor)
    }

    fn direct(processor: SharedSpanProcessor, sampler: Sampler) -> TracerHandle {
        TracerHandle::Direct(Arc::new(DirectExport::new(processor, Box::new(sampler))))
    }

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
    }

    fn remote_parent(sampled: bool) -> Context {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128),
            SpanId::from(0x00f0_67aa_0ba9_02b7_u64),
            flags,
            true,
            TraceState::from_key_value([("vendor", "v")]).unwrap_or_default(),
        ))
    }

    /// Drives `tracer` the way `RequestRecord` does: start, rename, an attribute, end
    /// attributes, error status, three phases (one with its own attributes), end; then an
    /// extra `end` that must change nothing.
    fn one_request(tracer: &TracerHandle, parent: &Context) -> SpanContext {
        let request = http::Request::builder()
            .method("POST")
            .uri("/v1/chat/completions")
            .header("host", "localhost:8080")
            .body(())
            .unwrap_or_default();
        let facts = crate::request_facts::RequestFacts {
            operation: Cow::Borrowed("chat"),
            request_model: Some("m".into()),
            grpc: false,
        };
        let attributes = StartAttributes::read(&request, &facts);
        let mut span = tracer.start_request(Cow::Borrowed("chat m"), at(0), attributes, parent);
        let cx = parent.with_remote_span_context(span.span_context().clone());
        let context = span.span_context().clone();
        if span.is_recording() {
            span.update_name(Cow::Borrowed("chat m2"));
            span.set_attribute(KeyValue::new("gen_ai.request.model", "m2"));
            let end = EndAttributes {
                e2e: 0.5,
                chunks: 3,
                outcome: "error",
                error_type: Some(Cow::Borrowed("engine_oom")),
                response_id: Some(Arc::from("resp-1")),
                ..EndAttributes::default()
            };
            let counters = vec![
                KeyValue::new("infer.phase", "decode"),
                KeyValue::new("gpu.utilization.mean", 0.9),
            ];
            let mut phases = PhaseSpans::default();
            phases.set(0, at(0), at(10), None);
            phases.set(1, at(10), at(50), None);
            phases.set(2, at(50), at(500), Some(counters));
            let status = Some(Status::error("engine_oom"));
            tracer.finish(&mut span, at(500), end, status, phases, &cx);
        }
        tracer.end(&mut span, at(900)); // idempotent
        drop::<RequestSpan>(span);
        context
    }

    /// What `exporter` holds once `processor` flushed.
    fn flushed(exporter: &InMemorySpanExporter, processor: &SharedSpanProcessor) -> Vec<SpanData> {
        let _ = processor.force_flush();
        exporter.get_finished_spans().unwrap_or_default()
    }

    #[test]
    fn direct_spans_equal_the_sdk_tracers_spans() {
        let api = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(api.clone())
            .build();
        let sdk = TracerHandle::Sdk(provider.tracer_with_scope(crate::layer::scope()));
        for ((fast, processor), parent) in [
            (in_memory(), remote_parent(true)),
            (in_memory(), Context::new()),
            (in_memory_batch(), remote_parent(true)),
            (in_memory_batch(), Context::new()),
        ] {
            let fast_tracer = direct(
                processor.clone(),
                Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            );
            api.reset();
            one_request(&sdk, &parent);
            one_request(&fast_tracer, &parent);
            let a = api.get_finished_spans().unwrap_or_default();
            let b = flushed(&fast, &processor);
            assert_eq!(a.len(), 4);
            assert_eq!(b.len(), 4);
            let request_id = |spans: &[SpanData]| {
                spans
                    .iter()
                    .find(|s| s.span_kind == SpanKind::Server)
                    .map(|s| s.span_context.span_id())
            };
            let (ra, rb) = (request_id(&a), request_id(&b));
            for (x, y) in a.iter().zip(&b) {
                // Ids are random; everything else must be equal.
                assert_eq!(x.name, y.name);
                assert_eq!(x.span_kind, y.span_kind);
                assert_eq!(x.start_time, y.start_time, "{}", x.name);
                assert_eq!(x.end_time, y.end_time, "{}", x.name);
                assert_eq!(x.attributes, y.attributes, "{}", x.name);
                assert_eq!(x.status, y.status, "{}", x.name);
                assert_eq!(x.instrumentation_scope, y.instrumentation_scope);
                assert_eq!(x.parent_span_is_remote, y.parent_span_is_remote);
                assert_eq!(x.dropped_attributes_count, y.dropped_attributes_count);
                assert_eq!(x.events, y.events);
                assert_eq!(x.links, y.links);
                assert_eq!(x.span_context.trace_flags(), y.span_context.trace_flags());
                assert_eq!(x.span_context.trace_state(), y.span_context.trace_state());
                assert_eq!(x.span_context.is_remote(), y.span_context.is_remote());
                if x.span_kind == SpanKind::Internal {
                    assert_eq!(Some(x.parent_span_id), ra);
                    assert_eq!(Some(y.parent_span_id), rb);
                    assert_eq!(y.span_context.trace_id(), b[3].span_context.trace_id());
                } else if parent.has_active_span() {
                    assert_eq!(x.parent_span_id, y.parent_span_id);
                    assert_eq!(x.span_context.trace_id(), y.span_context.trace_id());
                } else {
                    assert_eq!(y.parent_span_id, SpanId::INVALID);
                    assert_ne!(y.span_context.trace_id(), TraceId::INVALID);
                }
            }
        }
    }

    #[test]
    fn unsampled_remote_parent_exports_nothing_but_keeps_the_trace() {
        for (exporter, processor) in [in_memory(), in_memory_batch()] {
            let tracer = direct(
                processor.clone(),
                Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            );
            let sc = one_request(&tracer, &remote_parent(false));
            assert!(!sc.is_sampled());
            assert_eq!(
                sc.trace_id(),
                TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128)
            );
            assert!(flushed(&exporter, &processor).is_empty());
        }
        // A sampled parent is followed even when roots would never be sampled.
        for (exporter, processor) in [in_memory(), in_memory_batch()] {
            let tracer = direct(
                processor.clone(),
                Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            );
            assert!(one_request(&tracer, &remote_parent(true)).is_sampled());
            assert_eq!(flushed(&exporter, &processor).len(), 4);
            one_request(&tracer, &Context::new());
            assert_eq!(flushed(&exporter, &processor).len(), 4);
        }
    }

    #[test]
    fn ratio_sampling_decides_per_trace_like_the_sdk() {
        let ratio = Sampler::TraceIdRatioBased(0.25);
        let (exporter, processor) = in_memory();
        let tracer = direct(processor, Sampler::ParentBased(Box::new(ratio.clone())));
        let n = 2000;
        let mut sampled = 0;
        for _ in 0..n {
            let sc = one_request(&tracer, &Context::new());
            // The same decision the SDK's sampler makes for this trace id.
            let expected = ratio
                .should_sample(None, sc.trace_id(), "x", &SpanKind::Server, &[], &[])
                .decision;
            assert_eq!(
                sc.is_sampled(),
                expected == SamplingDecision::RecordAndSample
            );
            sampled += usize::from(sc.is_sampled());
        }
        assert!((400..600).contains(&sampled), "{sampled} of {n}");
        let spans = exporter.get_finished_spans().unwrap_or_default();
        assert_eq!(spans.len(), 4 * sampled);
    }

    /// A sampler that samples everything and keeps the attribute keys it was shown.
    #[derive(Clone, Debug, Default)]
    struct Seen(Arc<std::sync::Mutex<Vec<String>>>);

    impl ShouldSample for Seen {
        fn should_sample(
            &self,
            _: Option<&Context>,
            _: TraceId,
            _: &str,
            _: &SpanKind,
            attributes: &[KeyValue],
            _: &[opentelemetry::trace::Link],
        ) -> opentelemetry_sdk::trace::SamplingResult {
            if let Ok(mut seen) = self.0.lock() {
                seen.extend(attributes.iter().map(|kv| kv.key.as_str().to_owned()));
            }
            opentelemetry_sdk::trace::SamplingResult {
                decision: SamplingDecision::RecordAndSample,
                attributes: Vec::new(),
                trace_state: TraceState::NONE,
            }
        }
    }

    #[test]
    fn a_sampler_that_reads_attributes_sees_the_arrival_attributes_on_both_paths() {
        for (_, processor) in [in_memory(), in_memory_batch()] {
            let seen = Seen::default();
            let mut export = DirectExport::new(processor, Box::new(Sampler::AlwaysOn));
            export.set_sampler(Box::new(seen.clone()), true);
            one_request(&TracerHandle::Direct(Arc::new(export)), &Context::new());
            let keys = seen.0.lock().map(|k| k.clone()).unwrap_or_default();
            assert_eq!(
                keys,
                [
                    "gen_ai.operation.name",
                    "gen_ai.request.model",
                    "http.request.method",
                    "url.path",
                    "server.address",
                    "server.port"
                ]
            );
        }
    }

    #[test]
    fn suppressed_telemetry_emits_nothing() {
        let (exporter, processor) = in_memory();
        let tracer = direct(processor, Sampler::AlwaysOn);
        let _guard = Context::enter_telemetry_suppressed_scope();
        one_request(&tracer, &Context::current());
        assert!(exporter.get_finished_spans().unwrap_or_default().is_empty());
    }
}
