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

pub(crate) mod source;
pub(crate) mod span_codec;

use infertrace_analysis::critical_path::{
    Adjustment, CriticalPath, CriticalPathOptions, Segment, critical_path,
};
use infertrace_analysis::dialect;
use infertrace_analysis::record::{GpuRecord, RequestRecord};
use infertrace_analysis::trace::Span;
use smallvec::SmallVec;

use crate::limiter::span_footprint;
use crate::otlp_decode::SpanRange;
use infertrace_analysis::trace::TraceId;
pub(crate) use source::{SourceEncoding, SpanSource, compact_copy, hold_the_body};

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

/// Consecutive spans of one batch, all of one trace and including a request span, analysed on
/// arrival: what the pipeline offers the assembler in place of those spans.
#[derive(Debug)]
pub(crate) struct PreparedRun {
    /// Their trace.
    pub(crate) trace_id: TraceId,
    /// Index of the run's first span in the batch.
    pub(crate) start: usize,
    /// Spans in the run.
    pub(crate) len: usize,
    /// The analysis standing in for them.
    pub(crate) prepared: Box<PreparedTrace>,
}

/// Whether the prepared `runs` hold ranges of their request body (rather than compact copies).
pub(crate) fn holds_a_body(runs: &[PreparedRun]) -> bool {
    runs.first()
        .is_some_and(|r| r.prepared.source.encoding() == SourceEncoding::Otlp)
}

/// A trace's analysis: its request records (in the order `dialect::extract_requests` gives
/// them) and the critical path below each request span, when one could be computed.
///
/// A trace has one request as a rule: it is held inline, so a prepared trace is one
/// allocation for its record, path and span ranges rather than one each.
#[derive(Debug, Default)]
pub(crate) struct Analysed {
    /// The request records.
    pub(crate) records: Records,
    /// The critical path of each record (same index).
    pub(crate) paths: Paths,
}

/// A trace's request records (one inline).
pub(crate) type Records = SmallVec<[RequestRecord; 1]>;
/// The critical path of each record (one inline).
pub(crate) type Paths = SmallVec<[Option<CriticalPath>; 1]>;

impl Analysed {
    /// The request records of `spans`, each with its critical path.
    pub(crate) fn of(spans: &[Span], opts: &CriticalPathOptions) -> Self {
        let mut analysed = Self::default();
        dialect::extract_requests_into(spans, &mut analysed.records);
        analysed.add_paths(spans, opts);
        analysed
    }

    /// Adds the critical path of each record, computed from `spans`.
    pub(crate) fn add_paths(&mut self, spans: &[Span], opts: &CriticalPathOptions) {
        let Self { records, paths } = self;
        paths.extend(
            records
                .iter()
                .map(|r| critical_path(spans, r.span_id, opts)),
        );
    }
}

/// A trace analysed on arrival, standing in for its spans in the assembler.
#[derive(Debug)]
pub(crate) struct PreparedTrace {
    /// Its analysis.
    pub(crate) analysed: Analysed,
    /// Where its spans can be decoded again.
    pub(crate) source: SpanSource,
    /// The memory limiter's estimate of its spans, decoded ([`span_footprint`] each).
    pub(crate) span_bytes: usize,
}

/// Heap bookkeeping counted per allocation (allocator header and rounding), as the limiter's
/// span estimate counts it.
const ALLOCATION_OVERHEAD: usize = 16;

/// A prepared trace's slot in the assembler's queue (id, arrival, two pointers) and its entry
/// in the trace index (16 bytes at the table's load factor).
const QUEUE_AND_INDEX_BYTES: usize = 64 + 24;

impl PreparedTrace {
    /// How many spans it stands for.
    pub(crate) fn span_count(&self) -> usize {
        self.source.span_count()
    }

    /// The memory its spans take once decoded again (what a caller must reserve before more
    /// spans of the trace make the assembler take them back).
    pub(crate) fn span_bytes(&self) -> usize {
        self.span_bytes
    }

    /// Bytes it holds while it waits in the assembler: itself, its records, critical paths and
    /// span ranges, its queue slot and index entry — not the source of its spans (the body or
    /// the compact copy), which the batch holds once for all its traces.
    pub(crate) fn footprint(&self) -> usize {
        let vec = |capacity: usize, size: usize| {
            if capacity == 0 {
                0
            } else {
                capacity * size + ALLOCATION_OVERHEAD
            }
        };
        // Inline storage is part of `Self`; only a spilled one holds a heap block.
        let spilled = |spilled: bool, capacity: usize, size: usize| {
            if spilled { vec(capacity, size) } else { 0 }
        };
        let a = &self.analysed;
        let paths: usize = a
            .paths
            .iter()
            .flatten()
            .map(|p| {
                vec(p.segments.capacity(), size_of::<Segment>())
                    + vec(p.adjustments.capacity(), size_of::<Adjustment>())
            })
            .sum();
        let gpu = a.records.iter().filter(|r| r.gpu.is_some()).count()
            * (size_of::<GpuRecord>() + ALLOCATION_OVERHEAD);
        let (ranges_spilled, ranges_capacity) = self.source.ranges_allocation();
        size_of::<Self>()
            + ALLOCATION_OVERHEAD
            + spilled(
                a.records.spilled(),
                a.records.capacity(),
                size_of::<RequestRecord>(),
            )
            + gpu
            + spilled(
                a.paths.spilled(),
                a.paths.capacity(),
                size_of::<Option<CriticalPath>>(),
            )
            + paths
            + spilled(ranges_spilled, ranges_capacity, size_of::<SpanRange>())
            + QUEUE_AND_INDEX_BYTES
    }
}

#[cfg(test)]
mod tests {
    use infertrace_analysis::text::Text;
    use infertrace_analysis::trace::{SpanId, SpanKind, StatusCode, TraceId};

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
