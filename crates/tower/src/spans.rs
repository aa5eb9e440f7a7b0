//! The tracer the layer uses and the request span it holds while a request runs.
//!
//! An [`SdkTracer`] is used directly so spans are neither boxed nor locked; any other tracer
//! goes through `opentelemetry`'s [`BoxedTracer`]; with a span processor the layer bypasses the
//! tracer and exports finished spans itself ([`DirectExport`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::global::{BoxedSpan, BoxedTracer};
use opentelemetry::trace::{Span, SpanBuilder, SpanContext, SpanKind, Status, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use crate::batch::{PhaseSpan, PhaseSpans};
use crate::direct::{DirectExport, DirectSpan};
use crate::end_attributes::EndAttributes;
use crate::request_facts::StartAttributes;

/// Room for the request span's attributes after those known at arrival: the end-of-request
/// attributes (at most 24) and a few more (a later model, a sampler's).
pub(crate) const REQUEST_ATTRIBUTE_ROOM: usize = 28;

/// The tracer of a layer.
#[derive(Clone, Debug)]
pub(crate) enum TracerHandle {
    /// The SDK tracer, used without boxing.
    Sdk(SdkTracer),
    /// Any other tracer (the global one included).
    Boxed(Arc<BoxedTracer>),
    /// No tracer: finished spans go straight to a span processor.
    Direct(Arc<DirectExport>),
}

/// The request span, started at arrival and ended once the request is over.
// It lives inside the already boxed `RequestRecord`: boxing the SDK span again would only
// add an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum RequestSpan {
    Sdk(opentelemetry_sdk::trace::Span),
    Boxed(BoxedSpan),
    Direct(DirectSpan),
}

macro_rules! on_span {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            RequestSpan::Sdk($s) => $e,
            RequestSpan::Boxed($s) => $e,
            RequestSpan::Direct($s) => $e,
        }
    };
}

impl TracerHandle {
    /// Starts the SERVER request span at `start` under `parent`.
    pub(crate) fn start_request(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        attributes: StartAttributes,
        parent: &Context,
    ) -> RequestSpan {
        let builder = |name, attributes: StartAttributes| {
            SpanBuilder::from_name(name)
                .with_kind(SpanKind::Server)
                .with_start_time(start)
                .with_attributes(attributes.to_vec(REQUEST_ATTRIBUTE_ROOM))
        };
        match self {
            TracerHandle::Sdk(t) => {
                RequestSpan::Sdk(t.build_with_context(builder(name, attributes), parent))
            }
            TracerHandle::Boxed(t) => {
                RequestSpan::Boxed(t.build_with_context(builder(name, attributes), parent))
            }
            TracerHandle::Direct(d) => {
                RequestSpan::Direct(d.start_request(name, start, attributes, parent))
            }
        }
    }

    /// Emits one finished INTERNAL phase span through the tracer, under `parent` (a context
    /// holding the request span). The direct path builds its phase spans itself
    /// ([`DirectExport::finish`]), so it never comes here.
    fn phase(&self, phase: PhaseSpan, parent: &Context) {
        let end = phase.end;
        let builder = SpanBuilder::from_name(phase.name)
            .with_kind(SpanKind::Internal)
            .with_start_time(phase.start)
            .with_attributes(phase.into_attributes());
        match self {
            TracerHandle::Sdk(t) => t
                .build_with_context(builder, parent)
                .end_with_timestamp(end),
            TracerHandle::Boxed(t) => t
                .build_with_context(builder, parent)
                .end_with_timestamp(end),
            TracerHandle::Direct(_) => {}
        }
    }

    /// Ends the request span `span` at `end`: while it records, with `end_attributes`, the
    /// error `status` if any, and (when sampled) the phase spans under `parent` (the context
    /// holding the request span). On the direct path with infertrace's batch processor this is
    /// one hand-over of the whole request.
    #[inline]
    pub(crate) fn finish(
        &self,
        span: &mut RequestSpan,
        end: SystemTime,
        end_attributes: EndAttributes,
        status: Option<Status>,
        phases: PhaseSpans,
        parent: &Context,
    ) {
        if let (TracerHandle::Direct(d), RequestSpan::Direct(s)) = (self, &mut *span) {
            if let Some(status) = status {
                s.set_status(status);
            }
            d.finish(s, end, end_attributes, phases);
            return;
        }
        if span.is_recording() {
            end_attributes.write(&mut |kv| span.set_attribute(kv));
            if let Some(status) = status {
                span.set_status(status);
            }
            if span.span_context().is_sampled() {
                for phase in phases {
                    self.phase(phase, parent);
                }
            }
        }
        self.end(span, end);
    }

    /// Ends `span` at `end` (and, on the direct path, exports it).
    pub(crate) fn end(&self, span: &mut RequestSpan, end: SystemTime) {
        match (self, span) {
            (TracerHandle::Direct(d), RequestSpan::Direct(s)) => d.end(s, end),
            (_, RequestSpan::Sdk(s)) => s.end_with_timestamp(end),
            (_, RequestSpan::Boxed(s)) => s.end_with_timestamp(end),
            // A direct span always comes from a direct handle (one handle per layer).
            (_, RequestSpan::Direct(_)) => {}
        }
    }
}

impl RequestSpan {
    pub(crate) fn span_context(&self) -> &SpanContext {
        on_span!(self, s => s.span_context())
    }

    pub(crate) fn is_recording(&self) -> bool {
        on_span!(self, s => s.is_recording())
    }

    pub(crate) fn set_attribute(&mut self, attribute: KeyValue) {
        on_span!(self, s => s.set_attribute(attribute))
    }

    pub(crate) fn set_status(&mut self, status: Status) {
        on_span!(self, s => s.set_status(status))
    }

    pub(crate) fn update_name(&mut self, name: Cow<'static, str>) {
        on_span!(self, s => s.update_name(name))
    }
}
