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
    SpanLinks, SpanProcessor,
};

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
}

impl SharedSpanProcessor {
    /// Wraps `processor` after giving it `resource` (what a tracer provider would have done).
    pub fn new(mut processor: impl SpanProcessor + 'static, resource: &Resource) -> Self {
        processor.set_resource(resource);
        Self {
            inner: Arc::new(processor),
        }
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
    ids: RandomIdGenerator,
}

impl DirectExport {
    pub(crate) fn new(processor: SharedSpanProcessor, sampler: Box<dyn ShouldSample>) -> Self {
        Self {
            processor,
            sampler,
            ids: RandomIdGenerator::default(),
        }
    }

    pub(crate) fn set_sampler(&mut self, sampler: Box<dyn ShouldSample>) {
        self.sampler = sampler;
    }

    /// The SERVER request span, started at `start` under `parent`: its identity and sampling
    /// decision are final; attributes and status are added until [`DirectSpan::end`].
    pub(crate) fn start_request(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        mut attributes: Vec<KeyValue>,
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
        let result = if parent.is_telemetry_suppressed() {
            None
        } else {
            Some(self.sampler.should_sample(
                Some(parent),
                trace_id,
                &name,
                &SpanKind::Server,
                &attributes,
                &[],
            ))
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
            attributes,
            status: Status::Unset,
            recording,
            ended: false,
        }
    }

    /// Exports one finished INTERNAL phase span `[start, end]` under the request span `parent`.
    pub(crate) fn phase(
        &self,
        name: &'static str,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
        parent: &SpanContext,
    ) {
        let context = SpanContext::new(
            parent.trace_id(),
            self.ids.new_span_id(),
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        );
        self.processor.on_end(SpanData {
            span_context: context,
            parent_span_id: parent.span_id(),
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed(name),
            start_time: start,
            end_time: end,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            // Built from constants: cheaper than cloning a stored scope.
            instrumentation_scope: crate::layer::scope(),
        });
    }

    /// Ends `span` at `end` and exports it, once, if it is recording.
    pub(crate) fn end(&self, span: &mut DirectSpan, end: SystemTime) {
        if span.ended {
            return;
        }
        span.ended = true;
        if !span.recording {
            return;
        }
        self.processor.on_end(SpanData {
            span_context: span.context.clone(),
            parent_span_id: span.parent_span_id,
            parent_span_is_remote: span.parent_span_is_remote,
            span_kind: SpanKind::Server,
            name: std::mem::take(&mut span.name),
            start_time: span.start,
            end_time: end,
            attributes: std::mem::take(&mut span.attributes),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: std::mem::take(&mut span.status),
            // Built from constants: cheaper than cloning a stored scope.
            instrumentation_scope: crate::layer::scope(),
        });
    }
}

/// The request span on the direct path: its final identity, and what it collects until it ends.
#[derive(Debug)]
pub(crate) struct DirectSpan {
    context: SpanContext,
    parent_span_id: SpanId,
    parent_span_is_remote: bool,
    name: Cow<'static, str>,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    status: Status,
    recording: bool,
    ended: bool,
}

impl DirectSpan {
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

    /// The attribute list, while the span is recording.
    pub(crate) fn attributes_mut(&mut self) -> Option<&mut Vec<KeyValue>> {
        self.is_recording().then_some(&mut self.attributes)
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

    /// Drives `tracer` the way `RequestRecord` does: start, attributes, rename, status, three
    /// phases, end.
    fn one_request(tracer: &TracerHandle, parent: &Context) -> SpanContext {
        let mut span = tracer.start_request(
            Cow::Borrowed("chat m"),
            at(0),
            vec![KeyValue::new("gen_ai.operation.name", "chat")],
            parent,
        );
        let cx = parent.with_remote_span_context(span.span_context().clone());
        if span.is_recording() {
            span.update_name(Cow::Borrowed("chat m2"));
            span.set_attribute(KeyValue::new("infer.outcome", "error"));
            span.set_attribute(KeyValue::new("gen_ai.latency.e2e", 0.5));
            span.set_status(Status::error("engine_oom"));
            span.set_status(Status::Unset);
            if span.span_context().is_sampled() {
                for (name, s, e) in [("queue", 0, 10), ("prefill", 10, 50), ("decode", 50, 500)] {
                    let attrs = vec![KeyValue::new("infer.phase", name)];
                    tracer.phase(name, at(s), at(e), attrs, &cx, &span);
                }
            }
        }
        let context = span.span_context().clone();
        tracer.end(&mut span, at(500));
        tracer.end(&mut span, at(900)); // idempotent
        drop::<RequestSpan>(span);
        context
    }

    #[test]
    fn direct_spans_equal_the_sdk_tracers_spans() {
        let api = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(api.clone())
            .build();
        let sdk = TracerHandle::Sdk(provider.tracer_with_scope(crate::layer::scope()));
        let (fast, processor) = in_memory();
        let fast_tracer = direct(processor, Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        for parent in [remote_parent(true), Context::new()] {
            api.reset();
            fast.reset();
            one_request(&sdk, &parent);
            one_request(&fast_tracer, &parent);
            let a = api.get_finished_spans().unwrap_or_default();
            let b = fast.get_finished_spans().unwrap_or_default();
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
        let (exporter, processor) = in_memory();
        let tracer = direct(processor, Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let sc = one_request(&tracer, &remote_parent(false));
        assert!(!sc.is_sampled());
        assert_eq!(
            sc.trace_id(),
            TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128)
        );
        assert!(exporter.get_finished_spans().unwrap_or_default().is_empty());
        // A sampled parent is followed even when roots would never be sampled.
        let (exporter, processor) = in_memory();
        let tracer = direct(
            processor,
            Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        );
        assert!(one_request(&tracer, &remote_parent(true)).is_sampled());
        assert_eq!(exporter.get_finished_spans().unwrap_or_default().len(), 4);
        one_request(&tracer, &Context::new());
        assert_eq!(exporter.get_finished_spans().unwrap_or_default().len(), 4);
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

    #[test]
    fn suppressed_telemetry_emits_nothing() {
        let (exporter, processor) = in_memory();
        let tracer = direct(processor, Sampler::AlwaysOn);
        let _guard = Context::enter_telemetry_suppressed_scope();
        one_request(&tracer, &Context::current());
        assert!(exporter.get_finished_spans().unwrap_or_default().is_empty());
    }
}
