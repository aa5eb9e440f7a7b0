//! [`HeldSpans`]: how a trace's spans are held while the assembler waits for the trace to
//! complete — the one owner of a held trace.
//!
//! A trace is held either as its **decoded spans** (assembled span by span), or **analysed on
//! arrival** ([`PreparedTrace`]): when all of its spans came in one protobuf batch, the receiver
//! thread analysed them while they were in cache, and the trace holds that compact analysis
//! plus a [`SpanSource`] its spans can be decoded again from — ranges of the request body, or a
//! compact copy of the spans ([`span_codec`]). Whatever the form, [`HeldSpans::into_spans`] gives
//! the spans back and [`HeldSpans::footprint`] says what holding it costs the memory limiter.
//! The assembler only decides *when* a trace completes; it never looks inside this type beyond
//! those methods.

pub(crate) mod prepared;
pub(crate) mod span_codec;

use infertrace_analysis::trace::Span;

use crate::limiter::span_footprint;
pub(crate) use prepared::{
    Analysed, PreparedRun, PreparedTrace, SpanSource, compact_copy, hold_the_body, holds_a_body,
};

/// How a trace's spans are held (see the module docs).
#[derive(Debug)]
pub(crate) enum HeldSpans {
    /// The spans as decoded, in arrival order.
    Decoded(Vec<Span>),
    /// The trace's analysis, made on arrival, and where its spans can be decoded again.
    Prepared(Box<PreparedTrace>),
}

impl HeldSpans {
    /// How many spans it holds or stands for.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "the pipeline reserves per batch")
    )]
    pub(crate) fn span_count(&self) -> usize {
        match self {
            Self::Decoded(spans) => spans.len(),
            Self::Prepared(p) => p.span_count(),
        }
    }

    /// Bytes the memory limiter counts for holding it: [`span_footprint`] of each decoded span,
    /// or a prepared trace's [`PreparedTrace::footprint`] (its share of the source is counted
    /// once per batch).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "the pipeline reserves per batch")
    )]
    pub(crate) fn footprint(&self) -> usize {
        match self {
            Self::Decoded(spans) => spans.iter().map(span_footprint).sum(),
            Self::Prepared(p) => p.footprint(),
        }
    }

    /// The spans, decoded again from their source if it was prepared.
    pub(crate) fn into_spans(self) -> Vec<Span> {
        match self {
            Self::Decoded(spans) => spans,
            Self::Prepared(p) => p.source.spans(),
        }
    }
}

#[cfg(test)]
mod tests {
    use infertrace_analysis::text::Text;
    use infertrace_analysis::trace::{SpanId, SpanKind, StatusCode, TraceId};

    use super::prepared::QUEUE_AND_INDEX_BYTES;
    use super::*;

    fn span(n: u8) -> Span {
        Span {
            trace_id: TraceId([7; 16]),
            span_id: SpanId([n; 8]),
            parent_span_id: None,
            name: format!("s{n}").into(),
            service: Text::from("svc"),
            kind: SpanKind::Internal,
            start_unix_nano: 1,
            end_unix_nano: 2,
            status: StatusCode::Unset,
            attributes: Vec::new(),
            links: Vec::new(),
        }
    }

    #[test]
    fn either_form_gives_the_spans_back_and_says_its_footprint() {
        let spans: Vec<Span> = (1..=3).map(span).collect();
        let decoded = HeldSpans::Decoded(spans.clone());
        assert_eq!(decoded.span_count(), 3);
        assert_eq!(
            decoded.footprint(),
            spans.iter().map(span_footprint).sum::<usize>()
        );
        assert_eq!(decoded.into_spans(), spans);

        let prepared = HeldSpans::Prepared(Box::new(PreparedTrace {
            analysed: Analysed::default(),
            source: SpanSource::compact(&spans).expect("small"),
            span_bytes: 300,
        }));
        assert_eq!(prepared.span_count(), 3);
        assert!(prepared.footprint() >= size_of::<PreparedTrace>() + QUEUE_AND_INDEX_BYTES);
        assert_eq!(prepared.into_spans(), spans);
    }
}
