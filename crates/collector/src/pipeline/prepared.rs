//! Traces analysed on arrival: when all of a trace's spans come in one protobuf batch (as the
//! layer, vLLM and most SDK exporters send them), the receiver thread extracts its request
//! records and critical paths right away, while the decoded spans are in cache, and the
//! assembler holds that compact result through the grace period instead of the spans — which
//! are dropped at once. What a trace then holds is its records, their critical paths and where
//! its spans can be decoded again if more of the trace arrives before it completes (it is then
//! analysed again, with every span) or if the trace is kept for `/api/traces/{id}`:
//!
//! - **ranges of the request body**, shared by the batch's prepared traces, when the body is
//!   lean (at most [`MAX_BODY_BYTES_PER_PREPARED_SPAN`] a prepared span, as inference traces
//!   are): nothing is copied on the way in;
//! - otherwise a **compact copy** of the spans ([`span_codec`], in one buffer shared by the
//!   batch's prepared traces), and the body is freed at once: a body carrying prompts, events
//!   or large attributes is not held for the grace period.
//!
//! The analysis is the same function of the same spans whichever way it runs; tests check that
//! the KPIs, critical paths and stored traces are the same as when every trace is analysed at
//! completion, with spans held either way.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use foldhash::fast::RandomState;
use infertrace_analysis::critical_path::{Adjustment, CriticalPath, CriticalPathOptions, Segment};
use infertrace_analysis::record::{GpuRecord, RequestRecord};
use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{Span, TraceId};
use smallvec::SmallVec;

use super::add_paths;
use super::span_codec;
use crate::assembler::{Prepared, PreparedRun};
use crate::ingest::IngestBatch;
use crate::limiter::span_footprint;
use crate::otlp_decode::{SpanRange, decode_span, with_text_interner};
use infertrace_analysis::dialect;

/// A trace's analysis: its request records (in the order `dialect::extract_requests` gives
/// them) and the critical path below each request span, when one could be computed.
///
/// A trace has one request as a rule: it is held inline, so a prepared trace is one
/// allocation for its record, path and span ranges rather than one each.
#[derive(Debug, Default)]
pub struct Analysed {
    /// The request records.
    pub records: Records,
    /// The critical path of each record (same index).
    pub paths: Paths,
}

/// A trace's request records (one inline).
pub type Records = SmallVec<[RequestRecord; 1]>;
/// The critical path of each record (one inline).
pub type Paths = SmallVec<[Option<CriticalPath>; 1]>;
/// Where a prepared trace's spans lie in its source (four inline: the usual inference trace).
type Ranges = SmallVec<[SpanRange; 4]>;

/// A trace's analysis, standing in for its spans in the assembler.
#[derive(Debug)]
pub struct PreparedTrace {
    /// Its analysis.
    pub analysed: Analysed,
    /// Where its spans can be decoded again.
    pub source: SpanSource,
    /// The memory limiter's estimate of its spans, decoded ([`span_footprint`] each).
    pub span_bytes: usize,
}

/// Where a prepared trace's spans lie: ranges of its request body or of the compact copy of its
/// batch's prepared spans, all of one resource.
#[derive(Debug)]
pub struct SpanSource {
    body: Bytes,
    encoding: SourceEncoding,
    trace_id: TraceId,
    service: Text,
    ranges: Ranges,
}

/// How a [`SpanSource`]'s bytes are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceEncoding {
    /// The protobuf request body as received: each range is a `Span` message.
    Otlp,
    /// A compact copy ([`span_codec`]).
    Compact,
}

impl SpanSource {
    /// How its bytes are encoded.
    pub fn encoding(&self) -> SourceEncoding {
        self.encoding
    }

    /// The spans, decoded again from their source: spans equal to those the receiver decoded.
    /// The bytes are what the receiver decoded or [`span_codec::encode`] wrote, so this cannot
    /// fail short of a bug; if it ever did, the error is logged and the spans that decoded are
    /// returned.
    pub fn spans(&self) -> Vec<Span> {
        with_text_interner(|interner| {
            let mut spans = Vec::with_capacity(self.ranges.len());
            for r in &self.ranges {
                let Some(bytes) = r.of(&self.body) else {
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

/// Heap bookkeeping counted per allocation (allocator header and rounding), as the limiter's
/// span estimate counts it.
const ALLOCATION_OVERHEAD: usize = 16;

impl PreparedTrace {
    /// Bytes it holds while it waits in the assembler: itself, its records, critical paths and
    /// span ranges, its queue slot and index entry — not the source of its spans (the body or
    /// the compact copy), which the batch holds once for all its traces.
    pub fn footprint(&self) -> usize {
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
        let r = &self.source.ranges;
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
            + spilled(r.spilled(), r.capacity(), size_of::<SpanRange>())
            + QUEUE_AND_INDEX_BYTES
    }
}

/// A prepared trace's slot in the assembler's queue (id, arrival, two pointers) and its entry
/// in the trace index (16 bytes at the table's load factor).
const QUEUE_AND_INDEX_BYTES: usize = 64 + 24;

impl Prepared for PreparedTrace {
    fn span_count(&self) -> usize {
        self.source.ranges.len()
    }

    fn span_bytes(&self) -> usize {
        self.span_bytes
    }

    fn into_spans(self) -> Vec<Span> {
        self.source.spans()
    }
}

/// The analysis of every trace of `batch` whose spans are all in the batch (at least as far as
/// it can tell), from one resource, with a request span, and the bytes of the source of their
/// spans they share: the request body, or a compact copy of their spans (see
/// [`hold_the_body`]). When the spans of traces are interleaved (an SDK's batch processor
/// exports spans as they end, so concurrent requests mix), the batch's spans are first
/// regrouped by trace, keeping their order within each trace, so that each trace is one run.
/// Only protobuf batches are prepared: JSON ones (test clients and debugging, rarely high
/// rates) take the span path, analysed at completion.
pub fn prepare_runs(
    batch: &mut IngestBatch,
    opts: &CriticalPathOptions,
) -> (Vec<PreparedRun<PreparedTrace>>, usize) {
    let Some(body) = batch.raw_protobuf.clone() else {
        return (Vec::new(), 0);
    };
    if batch.spans.is_empty() {
        return (Vec::new(), 0);
    }
    let mut runs = trace_runs(&batch.spans);
    if has_repeated_trace(&batch.spans, &runs) {
        group_by_trace(batch);
        runs = trace_runs(&batch.spans);
    }
    let spans = &batch.spans;
    let mut out = Vec::with_capacity(runs.len());
    for r in runs {
        let run = &spans[r.clone()];
        let service = &run[0].service;
        if !run.iter().all(|s| s.service == *service) {
            continue;
        }
        // The analysis is written straight into the box the assembler will hold (a record and
        // its path are a few hundred bytes: moved from call to call, they were copied several
        // times each).
        let mut prepared = Box::new(PreparedTrace {
            analysed: Analysed::default(),
            source: SpanSource {
                body: Bytes::new(),
                encoding: SourceEncoding::Otlp,
                trace_id: run[0].trace_id,
                service: service.clone(),
                ranges: Ranges::new(),
            },
            span_bytes: run.iter().map(span_footprint).sum(),
        });
        // Only a trace with a request span (as the assembler's detector sees it) completes
        // after its grace period; the others are left to the assembler's idle rules.
        if !dialect::extract_requests_into(run, &mut prepared.analysed.records) {
            continue;
        }
        add_paths(run, &mut prepared.analysed, opts);
        out.push(PreparedRun {
            trace_id: run[0].trace_id,
            start: r.start,
            len: run.len(),
            prepared,
        });
    }
    if out.is_empty() {
        return (out, 0);
    }
    let prepared_spans = out.iter().map(|r| r.len).sum();
    if batch.span_ranges.len() == spans.len() && hold_the_body(body.len(), prepared_spans) {
        for run in &mut out {
            let source = &mut run.prepared.source;
            source.ranges = Ranges::from_slice(&batch.span_ranges[run.start..run.start + run.len]);
            source.body = body.clone();
        }
        return (out, body.len());
    }
    let len = compact_copy(spans, &mut out);
    if len.is_none() {
        out.clear();
    }
    (out, len.unwrap_or(0))
}

/// Largest request body held per prepared span, in bytes.
///
/// A prepared trace must be able to give back its spans. Holding the ranges of the request body
/// costs nothing on the way in, where copying the spans into a compact encoding cost ~12 % of
/// the collector's CPU at full rate (`otlp-blast --pipeline-only`: 530 → 465 ns a span). But
/// the body holds everything the exporter sent, and all of it stays until the batch's last
/// prepared trace completes: a typical inference span is ~275 bytes on the wire, where the
/// compact copy is ~90, while a span carrying prompts or long attribute values may be many
/// kilobytes. Past this many bytes per prepared span the compact copy is made instead, which
/// keeps a buffered span well under the 1 KiB budget either way (~270 bytes of analysis and
/// bookkeeping plus at most this).
pub const MAX_BODY_BYTES_PER_PREPARED_SPAN: usize = 640;

/// Whether the prepared traces of a batch hold ranges of its `body_len`-byte body rather than a
/// compact copy of their `prepared_spans` spans (see [`MAX_BODY_BYTES_PER_PREPARED_SPAN`]).
pub fn hold_the_body(body_len: usize, prepared_spans: usize) -> bool {
    u32::try_from(body_len).is_ok()
        && body_len <= prepared_spans.saturating_mul(MAX_BODY_BYTES_PER_PREPARED_SPAN)
}

/// Whether the prepared `runs` hold ranges of their request body.
pub fn holds_a_body(runs: &[PreparedRun<PreparedTrace>]) -> bool {
    runs.first()
        .is_some_and(|r| r.prepared.source.encoding == SourceEncoding::Otlp)
}

/// Encodes the spans of the prepared `runs` (their `start..start + len` of `spans`,
/// [`span_codec`]) into one buffer they share, and points their sources at it instead of
/// whatever they held. Its length, or `None` (far past any body limit) when offsets would not
/// fit in 32 bits.
pub fn compact_copy(spans: &[Span], runs: &mut [PreparedRun<PreparedTrace>]) -> Option<usize> {
    COMPACT_SCRATCH.with_borrow_mut(|compact| {
        compact.clear();
        for run in runs.iter_mut() {
            let source = &mut run.prepared.source;
            source.encoding = SourceEncoding::Compact;
            source.ranges.clear();
            for span in &spans[run.start..run.start + run.len] {
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
        let body = Bytes::copy_from_slice(compact);
        if compact.capacity() > MAX_SCRATCH_KEPT {
            *compact = Vec::new();
        }
        for run in runs.iter_mut() {
            run.prepared.source.body = body.clone();
        }
        Some(body.len())
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

/// Whether a trace id starts more than one of `runs`.
fn has_repeated_trace(spans: &[Span], runs: &[std::ops::Range<usize>]) -> bool {
    if runs.len() < 2 {
        return false;
    }
    let mut seen: HashSet<TraceId, RandomState> =
        HashSet::with_capacity_and_hasher(runs.len(), RandomState::default());
    runs.iter().any(|r| !seen.insert(spans[r.start].trace_id))
}

/// Reorders `batch`'s spans (and their ranges in the body) so that each trace's spans are consecutive:
/// traces in the order of their first span, spans in their order within each trace.
fn group_by_trace(batch: &mut IngestBatch) {
    let n = batch.spans.len();
    let mut group_of: HashMap<TraceId, usize, RandomState> =
        HashMap::with_capacity_and_hasher(n / 2, RandomState::default());
    let mut groups: Vec<usize> = Vec::with_capacity(n);
    let mut sizes: Vec<usize> = Vec::new();
    for s in &batch.spans {
        let next = sizes.len();
        let g = *group_of.entry(s.trace_id).or_insert(next);
        if g == next {
            sizes.push(0);
        }
        sizes[g] += 1;
        groups.push(g);
    }
    // Counting sort: each group's first position, then every span to the next free one.
    let mut next_at: Vec<usize> = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for size in sizes {
        next_at.push(at);
        at += size;
    }
    let mut position = Vec::with_capacity(n);
    for g in groups {
        position.push(next_at[g]);
        next_at[g] += 1;
    }
    let mut spans: Vec<Option<Span>> = (0..n).map(|_| None).collect();
    let old = std::mem::take(&mut batch.spans).into_iter();
    for (span, &p) in old.zip(&position) {
        spans[p] = Some(span);
    }
    batch.spans = spans.into_iter().flatten().collect();
    if batch.span_ranges.len() == n {
        let mut ranges = vec![SpanRange::default(); n];
        for (range, &p) in batch.span_ranges.iter().zip(&position) {
            ranges[p] = *range;
        }
        batch.span_ranges = ranges;
    }
}

/// The maximal runs of consecutive spans with the same trace id.
fn trace_runs(spans: &[Span]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::with_capacity(spans.len() / 4 + 1);
    let mut start = 0;
    for i in 1..=spans.len() {
        if i == spans.len() || spans[i].trace_id != spans[start].trace_id {
            runs.push(start..i);
            start = i;
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use infertrace_analysis::trace::{SpanId, SpanKind, StatusCode};

    use super::*;

    fn span(trace: u8, n: u8) -> Span {
        Span {
            trace_id: TraceId([trace; 16]),
            span_id: SpanId([n; 8]),
            parent_span_id: None,
            name: format!("s{trace}-{n}").into(),
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
    fn interleaved_traces_are_regrouped_in_order() {
        let order = [(1, 1), (2, 1), (1, 2), (3, 1), (2, 2), (1, 3)];
        let spans: Vec<Span> = order.iter().map(|&(t, n)| span(t, n)).collect();
        // Each span's range names it: offset = its trace, len = its number.
        let span_ranges = order
            .iter()
            .map(|&(t, n)| SpanRange {
                offset: u32::from(t),
                len: u32::from(n),
            })
            .collect();
        let mut batch = IngestBatch {
            spans,
            span_ranges,
            ..Default::default()
        };
        assert!(has_repeated_trace(&batch.spans, &trace_runs(&batch.spans)));
        group_by_trace(&mut batch);
        let ranges: Vec<(u32, u32)> = batch
            .span_ranges
            .iter()
            .map(|r| (r.offset, r.len))
            .collect();
        assert_eq!(ranges, [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)]);
        let got: Vec<(u8, u8)> = batch
            .spans
            .iter()
            .map(|s| (s.trace_id.0[0], s.span_id.0[0]))
            .collect();
        assert_eq!(got, [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 1)]);
        assert_eq!(trace_runs(&batch.spans), [0..3, 3..5, 5..6]);
        assert!(!has_repeated_trace(&batch.spans, &trace_runs(&batch.spans)));
    }
}
