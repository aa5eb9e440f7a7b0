//! [`BatchSink`]: the layer's spans as whole requests to infertrace's batch processor.
//!
//! Like [`DirectSink`](crate::export::direct::DirectSink) it decides the request span's
//! identity and sampling itself at arrival; it keeps the arrival attributes as values and, at
//! the end, hands the request over as one queue entry. The export thread builds the spans.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::Context;
use opentelemetry::trace::Status;
use opentelemetry_sdk::trace::SpanProcessor;

use super::processor::BatchProcessor;
use crate::export::sampling::Sampling;
use crate::export::sink::SpanSink;
use crate::export::span_data::DirectSpan;
use crate::finished::FinishedRequest;
use crate::request_facts::StartAttributes;

/// A layer's spans to infertrace's batch processor, one queue entry per request.
#[derive(Clone, Debug)]
pub(crate) struct BatchSink {
    processor: Arc<BatchProcessor>,
    sampling: Sampling,
}

impl BatchSink {
    /// Hands requests to `processor`, deciding with `sampling`.
    pub(crate) fn new(processor: Arc<BatchProcessor>, sampling: Sampling) -> Self {
        Self {
            processor,
            sampling,
        }
    }
}

impl SpanSink for BatchSink {
    type Span = DirectSpan;

    fn start(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        attributes: StartAttributes,
        parent: &Context,
    ) -> DirectSpan {
        self.sampling.start(name, start, attributes, parent, true)
    }

    #[inline]
    fn finish(&self, span: DirectSpan, request: FinishedRequest, _parent: &Context) {
        if span.is_recording() {
            self.processor.submit_request(span, request);
        }
    }

    fn end(&self, span: DirectSpan, end: SystemTime) {
        if span.is_recording() {
            self.processor
                .on_end(span.into_span_data(end, Status::Unset, |_| {}));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use opentelemetry::trace::{SpanKind, TraceContextExt};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, Sampler};

    use super::*;
    use crate::end_attributes::EndAttributes;
    use crate::export::batch::BatchSettings;
    use crate::finished::PhaseSpans;
    use crate::request_facts::RequestFacts;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
    }

    /// A batch sink into memory that exports only when flushed, sampling with `sampler`.
    fn sink(sampler: Sampler) -> (InMemorySpanExporter, Arc<BatchProcessor>, BatchSink) {
        let exporter = InMemorySpanExporter::default();
        let settings = BatchSettings {
            max_queue_size: 64,
            scheduled_delay: Duration::from_secs(3600),
            max_export_batch_size: 64,
        };
        let processor = Arc::new(
            BatchProcessor::new(exporter.clone(), &Resource::builder().build(), settings)
                .expect("export thread"),
        );
        let sampling = Sampling::new(Box::new(sampler), false);
        let sink = BatchSink::new(Arc::clone(&processor), sampling);
        (exporter, processor, sink)
    }

    fn arrival() -> StartAttributes {
        let request = http::Request::builder()
            .method("POST")
            .uri("/v1/chat/completions")
            .body(())
            .unwrap_or_default();
        let facts = RequestFacts {
            operation: Cow::Borrowed("chat"),
            provider: "self_hosted".into(),
            request_model: None,
            grpc: false,
        };
        StartAttributes::of_request(&request, &facts)
    }

    fn finished() -> FinishedRequest {
        let mut phases = PhaseSpans::default();
        phases.set(0, at(0), at(5), None);
        phases.set(1, at(5), at(20), None);
        phases.set(2, at(20), at(80), None);
        FinishedRequest {
            end: at(80),
            late_model: Some((Cow::Borrowed("chat m"), "m".into())),
            end_attributes: EndAttributes {
                e2e: 0.08,
                chunks: 2,
                outcome: "error",
                error_type: Some(Cow::Borrowed("engine_oom")),
                ..EndAttributes::default()
            },
            phases,
        }
    }

    #[test]
    fn a_batch_sink_on_its_own_hands_over_a_request_as_four_spans() {
        let (exporter, processor, sink) = sink(Sampler::AlwaysOn);
        let span = sink.start(Cow::Borrowed("chat"), at(0), arrival(), &Context::new());
        assert!(span.is_recording() && span.span_context().is_sampled());
        let id = span.span_context().span_id();
        sink.finish(span, finished(), &Context::new());
        assert!(processor.force_flush().is_ok());
        let spans = exporter.get_finished_spans().unwrap_or_default();
        let names: Vec<_> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["queue", "prefill", "decode", "chat m"]);
        let server = &spans[3];
        assert_eq!(server.span_kind, SpanKind::Server);
        assert_eq!(server.span_context.span_id(), id);
        assert_eq!((server.start_time, server.end_time), (at(0), at(80)));
        assert_eq!(server.status, Status::error("engine_oom"));
        let keys: Vec<_> = server.attributes.iter().map(|kv| kv.key.as_str()).collect();
        // Arrival attributes first, then the late model, then the end attributes.
        assert_eq!(
            keys[..5],
            [
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "http.request.method",
                "url.path",
                "gen_ai.request.model"
            ]
        );
        assert_eq!(keys.last(), Some(&"error.type"));
        for phase in &spans[..3] {
            assert_eq!(phase.parent_span_id, id);
            assert_eq!(phase.span_kind, SpanKind::Internal);
        }
    }

    #[test]
    fn a_dropped_request_span_queues_nothing() {
        let (exporter, processor, sink) = sink(Sampler::AlwaysOff);
        let span = sink.start(Cow::Borrowed("chat"), at(0), arrival(), &Context::new());
        assert!(!span.is_recording());
        let parent = Context::new().with_remote_span_context(span.span_context().clone());
        sink.end(span, at(10));
        let span = sink.start(Cow::Borrowed("chat"), at(0), arrival(), &parent);
        sink.finish(span, finished(), &parent);
        assert!(processor.force_flush().is_ok());
        assert!(exporter.get_finished_spans().unwrap_or_default().is_empty());
        assert_eq!(processor.dropped_spans(), 0);
    }
}
