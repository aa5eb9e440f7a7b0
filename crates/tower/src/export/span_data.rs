//! [`DirectSpan`]: a request span the layer keeps itself instead of a tracer's live span, and
//! the finished [`SpanData`] built from it and a [`FinishedRequest`], exactly as the SDK
//! tracer would have built them.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
use opentelemetry_sdk::trace::{IdGenerator, SpanData, SpanEvents, SpanLinks};

use infertrace_semconv::gen_ai;

use crate::config::scope;
use crate::finished::{FinishedRequest, PhaseSpan};
use crate::request_facts::{REQUEST_ATTRIBUTE_ROOM, StartAttributes};

/// A SERVER request span from start to end: its final identity and sampling decision, and the
/// attributes it collects.
#[derive(Debug)]
pub(crate) struct DirectSpan {
    pub(crate) context: SpanContext,
    pub(crate) parent_span_id: SpanId,
    pub(crate) parent_span_is_remote: bool,
    pub(crate) name: Cow<'static, str>,
    pub(crate) start: SystemTime,
    /// The arrival attributes as values, written first when the span is built (with
    /// infertrace's batch processor, on its export thread); `None` when they are already the
    /// start of `attributes`.
    pub(crate) start_attributes: Option<StartAttributes>,
    /// The attributes (after `start_attributes`, if any).
    pub(crate) attributes: Vec<KeyValue>,
    pub(crate) recording: bool,
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
            recording: true,
        }
    }

    pub(crate) fn span_context(&self) -> &SpanContext {
        &self.context
    }

    pub(crate) fn is_recording(&self) -> bool {
        self.recording
    }

    /// The finished SERVER span ended at `end` with `status`, after `more` appended its last
    /// attributes.
    pub(crate) fn into_span_data(
        mut self,
        end: SystemTime,
        status: Status,
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
            status,
            instrumentation_scope: scope(),
        }
    }
}

/// The spans of a finished request in the order the SDK tracer ends them: the phase spans
/// (when the request span is sampled), then the request span. Each goes to `emit`.
pub(crate) fn request_spans(
    span: DirectSpan,
    request: FinishedRequest,
    ids: &impl IdGenerator,
    mut emit: impl FnMut(SpanData),
) {
    let status = request.status().unwrap_or(Status::Unset);
    let FinishedRequest {
        end,
        late_model,
        end_attributes,
        phases,
    } = request;
    let mut span = span;
    if let Some((name, model)) = late_model {
        span.name = name;
        span.attributes
            .push(KeyValue::new(gen_ai::REQUEST_MODEL, model));
    }
    if span.context.is_sampled() {
        for phase in phases {
            emit(phase_span_data(&span.context, ids, phase));
        }
    }
    emit(span.into_span_data(end, status, |attributes| {
        end_attributes.write(&mut |kv| attributes.push(kv));
    }));
}

/// The number of spans [`request_spans`] makes of a request span and its phases.
pub(crate) fn span_count(span: &DirectSpan, request: &FinishedRequest) -> usize {
    1 + if span.context.is_sampled() {
        request.phases.len()
    } else {
        0
    }
}

/// The `SpanData` of one INTERNAL phase span under the request span `parent`.
pub(crate) fn phase_span_data(
    parent: &SpanContext,
    ids: &impl IdGenerator,
    phase: PhaseSpan,
) -> SpanData {
    let context = SpanContext::new(
        parent.trace_id(),
        ids.new_span_id(),
        parent.trace_flags(),
        false,
        parent.trace_state().clone(),
    );
    SpanData {
        span_context: context,
        parent_span_id: parent.span_id(),
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: Cow::Borrowed(phase.name),
        start_time: phase.start,
        end_time: phase.end,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: scope(),
        attributes: phase.into_attributes(),
    }
}
