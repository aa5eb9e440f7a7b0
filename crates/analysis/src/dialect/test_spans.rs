//! A span builder for the dialect modules' unit tests.

use crate::text::Text;
use crate::trace::{Span, SpanId, SpanKind, StatusCode, TraceId};

/// An internal span `s{id}` of service `svc`, `[0, 1]`, child of `parent`, with no attributes.
pub(super) fn span(id: u8, parent: Option<u8>) -> Span {
    Span {
        trace_id: TraceId([1; 16]),
        span_id: SpanId([id; 8]),
        parent_span_id: parent.map(|p| SpanId([p; 8])),
        name: format!("s{id}").into(),
        service: Text::from("svc"),
        kind: SpanKind::Internal,
        start_unix_nano: 0,
        end_unix_nano: 1,
        status: StatusCode::Unset,
        attributes: Vec::new(),
        links: Vec::new(),
    }
}
