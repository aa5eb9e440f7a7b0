//! [`SpanSource`]: where a prepared trace's spans can be decoded again — ranges of the request
//! body they came in, or of a compact copy ([`span_codec`]) shared by a batch's prepared traces.
//!
//! Holding body ranges copies nothing on the way in, but keeps everything the exporter sent
//! until the batch's last prepared trace completes; a body fatter than
//! [`MAX_BODY_BYTES_PER_PREPARED_SPAN`] a prepared span (prompts, events, long attribute values)
//! is freed at once and a compact copy of the spans is held instead ([`hold_the_body`]).

use bytes::Bytes;
use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{Span, TraceId};
use smallvec::SmallVec;

use super::{PreparedRun, span_codec};
use crate::otlp_decode::{SpanRange, decode_span, with_text_interner};

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
            prepared: Box::new(super::PreparedTrace {
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
