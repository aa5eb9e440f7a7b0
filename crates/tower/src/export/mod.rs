//! Where the layer's spans go: one [`SpanSink`] trait and its three implementations.
//!
//! - [`TracerSink`]: through an OpenTelemetry tracer (the SDK's unboxed, any other boxed);
//! - [`DirectSink`]: finished `SpanData` to any span processor, built on the request's thread;
//! - [`BatchSink`]: whole requests to infertrace's batch processor, spans built on its export
//!   thread (with OTLP/HTTP protobuf from `otlp::init`, encoded there straight to protobuf,
//!   [`otlp_encode`], no `SpanData` at all).
//!
//! A layer uses one of them, chosen when it is built; [`Sink`] holds that choice and
//! [`SinkSpan`] the request span it started. Both sinks that bypass a tracer decide sampling
//! with [`Sampling`] and build spans with [`span_data`], so every sink gives the same spans.

mod batch;
mod direct;
#[cfg(feature = "otlp")]
pub(crate) mod otlp_encode;
mod sampling;
mod shared_processor;
mod sink;
mod span_data;
mod tracer;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::Context;
use opentelemetry::global::{self, BoxedSpan, BoxedTracer};
use opentelemetry::trace::{Span as _, SpanContext, TracerProvider};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, ShouldSample};

use batch::BatchSink;
pub use batch::{BatchSettings, MAX_QUEUE_ENTRIES};
use direct::DirectSink;
use sampling::Sampling;
pub use shared_processor::SharedSpanProcessor;
pub(crate) use sink::SpanSink;
use span_data::DirectSpan;
use tracer::TracerSink;

use crate::config::scope;
use crate::finished::FinishedRequest;
use crate::request_facts::StartAttributes;

/// The sink of a layer.
#[derive(Clone, Debug)]
pub(crate) enum Sink {
    /// The SDK tracer, used without boxing.
    Sdk(TracerSink<SdkTracer>),
    /// Any other tracer (the global one included).
    Boxed(Arc<TracerSink<BoxedTracer>>),
    /// Any span processor, span by span.
    Direct(DirectSink),
    /// infertrace's batch processor, request by request.
    Batch(BatchSink),
}

/// The request span a [`Sink`] started.
// It lives inside the already boxed `RequestRecord`: boxing the SDK span again would only add
// an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum SinkSpan {
    Sdk(opentelemetry_sdk::trace::Span),
    Boxed(BoxedSpan),
    Direct(DirectSpan),
}

impl Sink {
    /// A tracer from `provider`: an [`SdkTracerProvider`]'s unboxed, any other's boxed.
    pub(crate) fn tracer<P>(provider: &P) -> Self
    where
        P: TracerProvider + 'static,
        P::Tracer: Send + Sync + 'static,
        <P::Tracer as opentelemetry::trace::Tracer>::Span: Send + Sync + 'static,
    {
        let any: &dyn std::any::Any = provider;
        match any.downcast_ref::<SdkTracerProvider>() {
            Some(sdk) => Sink::Sdk(TracerSink(sdk.tracer_with_scope(scope()))),
            None => Sink::Boxed(Arc::new(TracerSink(BoxedTracer::new(Box::new(
                provider.tracer_with_scope(scope()),
            ))))),
        }
    }

    /// The global tracer provider's tracer (as set now).
    pub(crate) fn global() -> Self {
        Sink::Boxed(Arc::new(TracerSink(global::tracer_with_scope(scope()))))
    }

    /// Straight to `processor`: request by request when it is infertrace's batch processor,
    /// else span by span. `sampler` decides at arrival; `reads_attributes`: it may look at the
    /// request span's attributes.
    pub(crate) fn processor(
        processor: &SharedSpanProcessor,
        sampler: Box<dyn ShouldSample>,
        reads_attributes: bool,
    ) -> Self {
        let sampling = Sampling::new(sampler, reads_attributes);
        match &processor.batch {
            Some(batch) => Sink::Batch(BatchSink::new(Arc::clone(batch), sampling)),
            None => Sink::Direct(DirectSink::new(Arc::clone(&processor.inner), sampling)),
        }
    }
}

impl SpanSink for Sink {
    type Span = SinkSpan;

    fn start(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        attributes: StartAttributes,
        parent: &Context,
    ) -> SinkSpan {
        match self {
            Sink::Sdk(s) => SinkSpan::Sdk(s.start(name, start, attributes, parent)),
            Sink::Boxed(s) => SinkSpan::Boxed(s.start(name, start, attributes, parent)),
            Sink::Direct(s) => SinkSpan::Direct(s.start(name, start, attributes, parent)),
            Sink::Batch(s) => SinkSpan::Direct(s.start(name, start, attributes, parent)),
        }
    }

    #[inline]
    fn finish(&self, span: SinkSpan, request: FinishedRequest, parent: &Context) {
        match (self, span) {
            (Sink::Sdk(s), SinkSpan::Sdk(span)) => s.finish(span, request, parent),
            (Sink::Boxed(s), SinkSpan::Boxed(span)) => s.finish(span, request, parent),
            (Sink::Direct(s), SinkSpan::Direct(span)) => s.finish(span, request, parent),
            (Sink::Batch(s), SinkSpan::Direct(span)) => s.finish(span, request, parent),
            // A span only ever comes back to the sink that started it.
            _ => {}
        }
    }

    fn end(&self, span: SinkSpan, end: SystemTime) {
        match (self, span) {
            (Sink::Sdk(s), SinkSpan::Sdk(span)) => s.end(span, end),
            (Sink::Boxed(s), SinkSpan::Boxed(span)) => s.end(span, end),
            (Sink::Direct(s), SinkSpan::Direct(span)) => s.end(span, end),
            (Sink::Batch(s), SinkSpan::Direct(span)) => s.end(span, end),
            _ => {}
        }
    }
}

impl SinkSpan {
    /// The request span's identity.
    pub(crate) fn span_context(&self) -> &SpanContext {
        match self {
            SinkSpan::Sdk(s) => s.span_context(),
            SinkSpan::Boxed(s) => s.span_context(),
            SinkSpan::Direct(s) => s.span_context(),
        }
    }

    /// Whether the request span records (sampled, or record-only).
    pub(crate) fn is_recording(&self) -> bool {
        match self {
            SinkSpan::Sdk(s) => s.is_recording(),
            SinkSpan::Boxed(s) => s.is_recording(),
            SinkSpan::Direct(s) => s.is_recording(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use opentelemetry::KeyValue;
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
        TracerProvider as _,
    };
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::{
        InMemorySpanExporter, Sampler, SamplingDecision, SdkTracerProvider, ShouldSample,
        SimpleSpanProcessor, SpanData, SpanProcessor as _,
    };

    use super::*;
    use crate::end_attributes::EndAttributes;
    use crate::finished::PhaseSpans;

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

    fn direct(processor: SharedSpanProcessor, sampler: Sampler) -> Sink {
        Sink::processor(&processor, Box::new(sampler), false)
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

    /// Drives `sink` the way `RequestRecord` does: start; if recording, finish with a late
    /// model (rename and attribute), end attributes, an error, three phases (one with its own
    /// attributes); else end.
    fn one_request(sink: &Sink, parent: &Context) -> SpanContext {
        let request = http::Request::builder()
            .method("POST")
            .uri("/v1/chat/completions")
            .header("host", "localhost:8080")
            .body(())
            .unwrap_or_default();
        let facts = crate::request_facts::RequestFacts {
            operation: Cow::Borrowed("chat"),
            provider: "self_hosted".into(),
            request_model: Some("m".into()),
            grpc: false,
        };
        let attributes = StartAttributes::of_request(&request, &facts);
        let span = sink.start(Cow::Borrowed("chat m"), at(0), attributes, parent);
        let cx = parent.with_remote_span_context(span.span_context().clone());
        let context = span.span_context().clone();
        if span.is_recording() {
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
            let finished = FinishedRequest {
                end: at(500),
                late_model: Some((Cow::Borrowed("chat m2"), "m2".into())),
                end_attributes: end,
                phases,
            };
            sink.finish(span, finished, &cx);
        } else {
            sink.end(span, at(900));
        }
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
        let sdk = Sink::Sdk(TracerSink(
            provider.tracer_with_scope(crate::config::scope()),
        ));
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
            let sink = Sink::processor(&processor, Box::new(seen.clone()), true);
            one_request(&sink, &Context::new());
            let keys = seen.0.lock().map(|k| k.clone()).unwrap_or_default();
            assert_eq!(
                keys,
                [
                    "gen_ai.operation.name",
                    "gen_ai.provider.name",
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
