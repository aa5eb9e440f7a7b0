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

use crate::direct::{DirectExport, DirectSpan};

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
        attributes: Vec<KeyValue>,
        parent: &Context,
    ) -> RequestSpan {
        let builder = |name, attributes| {
            SpanBuilder::from_name(name)
                .with_kind(SpanKind::Server)
                .with_start_time(start)
                .with_attributes(attributes)
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

    /// Emits one finished INTERNAL phase span `[start, end]` named `name` with `attributes`
    /// (`infer.phase = name` first, then any counter window statistics) under the request span
    /// `request`, whose context `parent` carries.
    pub(crate) fn phase(
        &self,
        name: &'static str,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
        parent: &Context,
        request: &RequestSpan,
    ) {
        let builder = |attributes| {
            SpanBuilder::from_name(name)
                .with_kind(SpanKind::Internal)
                .with_start_time(start)
                .with_attributes(attributes)
        };
        match self {
            TracerHandle::Sdk(t) => t
                .build_with_context(builder(attributes), parent)
                .end_with_timestamp(end),
            TracerHandle::Boxed(t) => t
                .build_with_context(builder(attributes), parent)
                .end_with_timestamp(end),
            TracerHandle::Direct(d) => {
                d.phase(name, start, end, attributes, request.span_context())
            }
        }
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

    /// The attribute list of a recording direct span, to append to without a call per
    /// attribute; `None` for SDK and boxed spans (use [`set_attribute`](Self::set_attribute)).
    pub(crate) fn attributes_mut(&mut self) -> Option<&mut Vec<KeyValue>> {
        match self {
            RequestSpan::Direct(s) => s.attributes_mut(),
            RequestSpan::Sdk(_) | RequestSpan::Boxed(_) => None,
        }
    }

    pub(crate) fn update_name(&mut self, name: Cow<'static, str>) {
        on_span!(self, s => s.update_name(name))
    }
}
