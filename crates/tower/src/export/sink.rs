//! [`SpanSink`]: where a layer's spans go.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::Context;

use crate::finished::FinishedRequest;
use crate::request_facts::StartAttributes;

/// Where the spans of a layer's requests go. A request's SERVER span is started at arrival,
/// so its identity and sampling decision exist while the handler runs, and ended once, when the
/// request is over: with [`finish`](Self::finish) while it records, else with
/// [`end`](Self::end).
///
/// Implementations: [`TracerSink`](super::tracer::TracerSink) (an OpenTelemetry tracer),
/// [`DirectSink`](super::direct::DirectSink) (finished `SpanData` to any span processor) and
/// [`BatchSink`](super::batch::BatchSink) (whole requests to infertrace's batch processor).
/// All three give the same spans.
pub(crate) trait SpanSink {
    /// The request span while the request runs.
    type Span;

    /// Starts the SERVER span `name` at `start` under `parent`, with the attributes known at
    /// arrival.
    fn start(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        attributes: StartAttributes,
        parent: &Context,
    ) -> Self::Span;

    /// Ends a recording `span` as `request` says and, when the span is sampled, emits the
    /// phase spans under it (`parent`: the context holding the request span).
    fn finish(&self, span: Self::Span, request: FinishedRequest, parent: &Context);

    /// Ends `span` at `end` with nothing added (a span that does not record).
    fn end(&self, span: Self::Span, end: SystemTime);
}
