//! Traces analysed on arrival: a [`PreparedTrace`] holds a trace's analysis ([`Analysed`]: its
//! request records and critical paths) and a [`SpanSource`] its spans can be decoded again
//! from; a [`PreparedRun`] places one in its batch.
//!
//! A source is ranges of the request body the spans came in, or of a compact copy
//! ([`span_codec`]) shared by a batch's prepared traces. Holding body ranges copies nothing on
//! the way in, but keeps everything the exporter sent until the batch's last prepared trace
//! completes; a body fatter than [`MAX_BODY_BYTES_PER_PREPARED_SPAN`] a prepared span (prompts,
//! events, long attribute values) is freed at once and a compact copy of the spans is held
//! instead ([`hold_the_body`], [`compact_copy`]).

use bytes::Bytes;
use infertrace_analysis::critical_path::{
    Adjustment, CriticalPath, CriticalPathOptions, Segment, critical_path,
};
use infertrace_analysis::dialect;
use infertrace_analysis::record::{GpuRecord, RequestRecord};
use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{Span, TraceId};
use smallvec::SmallVec;

use super::span_codec;
use crate::otlp_decode::{SpanRange, decode_span, with_text_interner};

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
    /// The memory limiter's estimate of its spans, decoded ([`span_footprint`](crate::limiter::span_footprint) each).
    pub(crate) span_bytes: usize,
}

/// Heap bookkeeping counted per allocation (allocator header and rounding), as the limiter's
/// span estimate counts it.
const ALLOCATION_OVERHEAD: usize = 16;

/// A prepared trace's slot in the assembler's queue (id, arrival, two pointers) and its entry
/// in the trace index (16 bytes at the table's load factor).
pub(super) const QUEUE_AND_INDEX_BYTES: usize = 64 + 24;

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

/// Where a prepared trace's spans lie in its source (four inline: the usual inference trace).
type Ranges = SmallVec<[SpanRange; 4]>;

/// Where a prepared trace's spans lie: ranges of its request body or of the compact copy of its
/// batch's prepared spans, all of one trace and one resource.
#[derive(Debug)]
pub(crate) struct SpanSource {
    buffer: Bytes,
    encoding: SourceEncoding,
    trace_id: TraceId,
    service: Text,
    ranges: Ranges,
}

/// How a [`SpanSource`]'s bytes are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourceEncoding {
    /// The protobuf request body as received: each range is a `Span` message.
    Otlp,
    /// A compact copy ([`span_codec`]).
    Compact,
}

/// Largest request body held per prepared span, in bytes: past it the compact copy is made
/// instead, which keeps a buffered span well under the 1 KiB budget either way (a typical
/// inference span is ~275 bytes on the wire and ~90 compact; analysis and bookkeeping add
/// ~270). The trade-off is measured in docs/PERFORMANCE.md.
pub(crate) const MAX_BODY_BYTES_PER_PREPARED_SPAN: usize = 640;

/// Whether the prepared traces of a batch hold ranges of its `body_len`-byte body rather than a
/// compact copy of their `prepared_spans` spans (see [`MAX_BODY_BYTES_PER_PREPARED_SPAN`]).
pub(crate) fn hold_the_body(body_len: usize, prepared_spans: usize) -> bool {
    u32::try_from(body_len).is_ok()
        && body_len <= prepared_spans.saturating_mul(MAX_BODY_BYTES_PER_PREPARED_SPAN)
}

impl SpanSource {
    /// A source of the spans of `trace_id` from `service` that points at nothing yet: give it
    /// its bytes with [`point_at_body`](Self::point_at_body) or [`compact_copy`].
    pub(crate) fn new(trace_id: TraceId, service: Text) -> Self {
        Self {
            buffer: Bytes::new(),
            encoding: SourceEncoding::Otlp,
            trace_id,
            service,
            ranges: Ranges::new(),
        }
    }

    /// A compact copy of `spans` (all of one trace and resource) of its own; `None` for no
    /// spans, or past 4 GiB.
    #[cfg(test)]
    pub(crate) fn compact(spans: &[Span]) -> Option<Self> {
        let first = spans.first()?;
        let mut run = [PreparedRun {
            trace_id: first.trace_id,
            start: 0,
            len: spans.len(),
            prepared: Box::new(PreparedTrace {
                analysed: Default::default(),
                source: Self::new(first.trace_id, first.service.clone()),
                span_bytes: 0,
            }),
        }];
        compact_copy(spans, &mut run)?;
        let [run] = run;
        Some(run.prepared.source)
    }

    /// Points the source at `ranges` of the protobuf request `body` (one `Span` message each).
    pub(crate) fn point_at_body(&mut self, body: &Bytes, ranges: &[SpanRange]) {
        self.encoding = SourceEncoding::Otlp;
        self.ranges = Ranges::from_slice(ranges);
        self.buffer = body.clone();
    }

    /// How its bytes are encoded.
    pub(crate) fn encoding(&self) -> SourceEncoding {
        self.encoding
    }

    /// How many spans it holds.
    pub(crate) fn span_count(&self) -> usize {
        self.ranges.len()
    }

    /// Whether its ranges spilled to the heap, and their capacity (for footprints).
    pub(crate) fn ranges_allocation(&self) -> (bool, usize) {
        (self.ranges.spilled(), self.ranges.capacity())
    }

    /// The spans, decoded again: spans equal to those the receiver decoded. The bytes are what
    /// the receiver decoded or [`span_codec::encode`] wrote, so this cannot fail short of a
    /// bug; if it ever did, the error is logged and the spans that decoded are returned.
    pub(crate) fn spans(&self) -> Vec<Span> {
        with_text_interner(|interner| {
            let mut spans = Vec::with_capacity(self.ranges.len());
            for r in &self.ranges {
                let Some(bytes) = r.of(&self.buffer) else {
                    tracing::error!("a span of a prepared trace lies outside its buffer");
                    continue;
                };
                let decoded = match self.encoding {
                    SourceEncoding::Otlp => decode_span(bytes, &self.service, interner)
                        .map_err(|e| e.to_string())
                        .and_then(|s| s.ok_or_else(|| "the span is invalid".to_owned())),
                    SourceEncoding::Compact => {
                        span_codec::decode(bytes, self.trace_id, &self.service, interner)
                            .map(|(span, _)| span)
                            .map_err(|e| e.to_string())
                    }
                };
                match decoded {
                    Ok(span) => spans.push(span),
                    Err(error) => {
                        tracing::error!(%error, "cannot decode a span of a prepared trace again");
                    }
                }
            }
            spans
        })
    }
}

/// Encodes the spans of the prepared `runs` (their `start..start + len` of `spans`,
/// [`span_codec`]) into one buffer they share, and points their sources at it instead of
/// whatever they held. The buffer's length, or `None` (far past any body limit) when offsets
/// would not fit in 32 bits.
pub(crate) fn compact_copy(spans: &[Span], runs: &mut [PreparedRun]) -> Option<usize> {
    COMPACT_SCRATCH.with_borrow_mut(|compact| {
        compact.clear();
        for run in runs.iter_mut() {
            let source = &mut run.prepared.source;
            source.encoding = SourceEncoding::Compact;
            source.ranges.clear();
            for span in spans
                .get(run.start..run.start + run.len)
                .unwrap_or_default()
            {
                let offset = compact.len();
                span_codec::encode(span, compact);
                source.ranges.push(SpanRange {
                    offset: offset as u32,
                    len: (compact.len() - offset) as u32,
                });
            }
        }
        if u32::try_from(compact.len()).is_err() {
            return None;
        }
        // One exact allocation for the batch. The scratch keeps its capacity for the next
        // batch, up to a bound (it is not counted by the memory limiter).
        let buffer = Bytes::copy_from_slice(compact);
        if compact.capacity() > MAX_SCRATCH_KEPT {
            *compact = Vec::new();
        }
        for run in runs.iter_mut() {
            run.prepared.source.buffer = buffer.clone();
        }
        Some(buffer.len())
    })
}

/// Largest encoding scratch a receiver thread keeps between batches (a 1,000-span batch of
/// inference traces needs ~90 KB).
const MAX_SCRATCH_KEPT: usize = 1 << 20;

thread_local! {
    /// Where a receiver thread encodes a batch's prepared spans before copying them out.
    static COMPACT_SCRATCH: std::cell::RefCell<Vec<u8>> =
        const { std::cell::RefCell::new(Vec::new()) };
}
