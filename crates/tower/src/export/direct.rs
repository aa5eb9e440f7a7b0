//! [`DirectSink`]: the layer's spans as finished [`SpanData`] straight to a span processor.
//!
//! The layer builds its spans once, at the end of a request, from instants it already
//! recorded, so the SDK's live-span machinery (span builder, a sampler call and ids per span,
//! the span's own bookkeeping) is pure overhead for them. This sink makes the request span's
//! identity and sampling decision itself at arrival ([`Sampling`]) and, at the end, hands the
//! request span and its phase spans to [`SpanProcessor::on_end`], one call each.
//!
//! [`SpanData`]: opentelemetry_sdk::trace::SpanData

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::Context;
use opentelemetry::trace::Status;
use opentelemetry_sdk::trace::SpanProcessor;

use super::sampling::Sampling;
use super::sink::SpanSink;
use super::span_data::{self, DirectSpan};
use crate::finished::FinishedRequest;
use crate::request_facts::StartAttributes;

/// A layer's spans to any span processor, built on the request's thread.
#[derive(Clone, Debug)]
pub(crate) struct DirectSink {
    processor: Arc<dyn SpanProcessor>,
    sampling: Sampling,
}

impl DirectSink {
    /// Exports to `processor`, deciding with `sampling`.
    pub(crate) fn new(processor: Arc<dyn SpanProcessor>, sampling: Sampling) -> Self {
        Self {
            processor,
            sampling,
        }
    }
}

impl SpanSink for DirectSink {
    type Span = DirectSpan;

    fn start(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        attributes: StartAttributes,
        parent: &Context,
    ) -> DirectSpan {
        self.sampling.start(name, start, attributes, parent, false)
    }

    fn finish(&self, span: DirectSpan, request: FinishedRequest, _parent: &Context) {
        if span.is_recording() {
            span_data::request_spans(span, request, self.sampling.ids(), |data| {
                self.processor.on_end(data)
            });
        }
    }

    fn end(&self, span: DirectSpan, end: SystemTime) {
        if span.is_recording() {
            self.processor
                .on_end(span.into_span_data(end, Status::Unset, |_| {}));
        }
    }
}
