//! [`TracerSink`]: the layer's spans through an OpenTelemetry tracer.
//!
//! The request span is a live span of the tracer from arrival to end (the tracer's sampler and
//! span processors see it start); the phase spans are built at the end with exact start and
//! end times. An [`SdkTracer`](opentelemetry_sdk::trace::SdkTracer) is used as it is, so its
//! spans are neither boxed nor locked; any other tracer goes through `opentelemetry`'s
//! [`BoxedTracer`](opentelemetry::global::BoxedTracer).

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{Span, SpanBuilder, SpanKind, Tracer};
use opentelemetry::{Context, KeyValue};

use infertrace_semconv::gen_ai;

use super::sink::SpanSink;
use crate::finished::FinishedRequest;
use crate::request_facts::{REQUEST_ATTRIBUTE_ROOM, StartAttributes};

/// A layer's spans through the tracer `T`.
#[derive(Clone, Debug)]
pub(crate) struct TracerSink<T>(pub(crate) T);

impl<T: Tracer> SpanSink for TracerSink<T> {
    type Span = T::Span;

    fn start(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        attributes: StartAttributes,
        parent: &Context,
    ) -> T::Span {
        let builder = SpanBuilder::from_name(name)
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes(attributes.to_vec(REQUEST_ATTRIBUTE_ROOM));
        self.0.build_with_context(builder, parent)
    }

    fn finish(&self, mut span: T::Span, request: FinishedRequest, parent: &Context) {
        if span.is_recording() {
            let status = request.status();
            let FinishedRequest {
                end,
                late_model,
                end_attributes,
                phases,
            } = request;
            if let Some((name, model)) = late_model {
                span.update_name(name);
                span.set_attribute(KeyValue::new(gen_ai::REQUEST_MODEL, model));
            }
            end_attributes.write(&mut |kv| span.set_attribute(kv));
            if let Some(status) = status {
                span.set_status(status);
            }
            if span.span_context().is_sampled() {
                for phase in phases {
                    let end = phase.end;
                    let builder = SpanBuilder::from_name(phase.name)
                        .with_kind(SpanKind::Internal)
                        .with_start_time(phase.start)
                        .with_attributes(phase.into_attributes());
                    self.0
                        .build_with_context(builder, parent)
                        .end_with_timestamp(end);
                }
            }
            span.end_with_timestamp(end);
        } else {
            span.end_with_timestamp(request.end);
        }
    }

    fn end(&self, mut span: T::Span, end: SystemTime) {
        span.end_with_timestamp(end);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use opentelemetry::trace::{SpanKind, Status, TraceContextExt, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

    use super::*;
    use crate::end_attributes::EndAttributes;
    use crate::finished::PhaseSpans;
    use crate::request_facts::RequestFacts;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
    }

    #[test]
    fn a_tracer_sink_on_its_own_ends_the_request_span_after_its_phases() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let sink = TracerSink(provider.tracer_with_scope(crate::config::scope()));
        let request = http::Request::builder()
            .uri("/v1/chat/completions")
            .body(())
            .unwrap_or_default();
        let facts = RequestFacts {
            operation: Cow::Borrowed("chat"),
            provider: "self_hosted".into(),
            request_model: None,
            grpc: false,
        };
        let parent = Context::new();
        let span = sink.start(
            Cow::Borrowed("chat"),
            at(0),
            StartAttributes::of_request(&request, &facts),
            &parent,
        );
        let cx = parent.with_remote_span_context(span.span_context().clone());
        let mut phases = PhaseSpans::default();
        phases.set(0, at(0), at(10), None);
        phases.set(2, at(10), at(40), None);
        let finished = FinishedRequest {
            end: at(40),
            late_model: Some((Cow::Borrowed("chat m"), "m".into())),
            end_attributes: EndAttributes {
                e2e: 0.04,
                outcome: "error",
                error_type: Some(Cow::Borrowed("engine_oom")),
                ..EndAttributes::default()
            },
            phases,
        };
        sink.finish(span, finished, &cx);
        let spans = exporter.get_finished_spans().unwrap_or_default();
        let names: Vec<_> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["queue", "decode", "chat m"]);
        let server = &spans[2];
        assert_eq!(server.span_kind, SpanKind::Server);
        assert_eq!((server.start_time, server.end_time), (at(0), at(40)));
        assert_eq!(server.status, Status::error("engine_oom"));
        let model = server
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == gen_ai::REQUEST_MODEL);
        assert_eq!(model.map(|kv| kv.value.as_str()), Some("m".into()));
        for phase in &spans[..2] {
            assert_eq!(phase.parent_span_id, server.span_context.span_id());
        }
    }
}
