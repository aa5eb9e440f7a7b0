//! Traces analysed on arrival: when all of a trace's spans come in one protobuf batch (as the
//! layer, vLLM and most SDK exporters send them), the receiver thread extracts its request
//! records and critical paths right away, while the decoded spans are in cache, and the
//! assembler holds that compact result through the grace period instead of the spans — which
//! are dropped at once. What a trace then holds is its records, their critical paths and where
//! its spans lie in the request body (a reference-counted buffer shared by the batch), so that
//! the spans can be decoded again if more of the trace arrives before it completes (it is then
//! analysed again, with every span) or if the trace is kept for `/api/traces/{id}`.
//!
//! The analysis is the same function of the same spans whichever way it runs; a test checks that
//! the KPIs, critical paths and stored traces are the same as when every trace is analysed at
//! completion.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use foldhash::fast::RandomState;
use infertrace_analysis::critical_path::{Adjustment, CriticalPath, CriticalPathOptions, Segment};
use infertrace_analysis::record::RequestRecord;
use infertrace_analysis::trace::{Span, TraceId};

use super::{analyse_spans, is_request_span};
use crate::assembler::{Prepared, PreparedRun};
use crate::ingest::IngestBatch;
use crate::otlp_decode::{SpanRange, decode_spans_at};

/// A trace's analysis: its request records (in the order `dialect::extract_requests` gives
/// them) and the critical path below each request span, when one could be computed.
#[derive(Debug, Default)]
pub struct Analysed {
    /// The request records.
    pub records: Vec<RequestRecord>,
    /// The critical path of each record (same index).
    pub paths: Vec<Option<CriticalPath>>,
}

/// A trace's analysis, standing in for its spans in the assembler.
#[derive(Debug)]
pub struct PreparedTrace {
    /// Its analysis.
    pub analysed: Analysed,
    /// Where its spans can be decoded again.
    pub source: SpanSource,
}

/// Where a prepared trace's spans lie: ranges of a protobuf request body, all of one resource.
#[derive(Debug)]
pub struct SpanSource {
    body: Bytes,
    service: Arc<str>,
    ranges: Vec<SpanRange>,
}

impl SpanSource {
    /// The spans, decoded again from the body: the same spans the receiver decoded. The body
    /// was decoded once already, so this cannot fail short of a bug; if it ever did, the error
    /// is logged and the spans that decoded are returned.
    pub fn spans(&self) -> Vec<Span> {
        match decode_spans_at(&self.body, &self.ranges, &self.service) {
            Ok(spans) => spans,
            Err(error) => {
                tracing::error!(%error, "cannot decode the spans of a prepared trace again");
                self.ranges
                    .iter()
                    .filter_map(|r| decode_spans_at(&self.body, &[*r], &self.service).ok())
                    .flatten()
                    .collect()
            }
        }
    }
}

/// Heap bookkeeping counted per allocation (allocator header and rounding), as the limiter's
/// span estimate counts it.
const ALLOCATION_OVERHEAD: usize = 16;

impl PreparedTrace {
    /// Bytes it holds while it waits in the assembler: itself, its records, critical paths and
    /// span ranges, its queue slot and index entry — not the request body, which the batch
    /// holds once for all its traces.
    pub fn footprint(&self) -> usize {
        let vec = |capacity: usize, size: usize| {
            if capacity == 0 {
                0
            } else {
                capacity * size + ALLOCATION_OVERHEAD
            }
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
        size_of::<Self>()
            + ALLOCATION_OVERHEAD
            + vec(a.records.capacity(), size_of::<RequestRecord>())
            + vec(a.paths.capacity(), size_of::<Option<CriticalPath>>())
            + paths
            + vec(self.source.ranges.capacity(), size_of::<SpanRange>())
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

    fn into_spans(self) -> Vec<Span> {
        self.source.spans()
    }
}

/// The analysis of every trace of `batch` whose spans all lie in one run of consecutive spans
/// holding a request span, from one resource; nothing for a batch without span ranges (JSON).
pub fn prepare_runs(
    batch: &IngestBatch,
    opts: &CriticalPathOptions,
) -> Vec<PreparedRun<PreparedTrace>> {
    let spans = &batch.spans;
    let Some(body) = &batch.raw_protobuf else {
        return Vec::new();
    };
    if batch.span_ranges.len() != spans.len() || spans.is_empty() {
        return Vec::new();
    }
    let runs = trace_runs(spans);
    // A trace whose spans are in two runs of the batch is assembled from its spans.
    let mut seen: HashSet<TraceId, RandomState> =
        HashSet::with_capacity_and_hasher(runs.len(), RandomState::default());
    let mut repeated: HashSet<TraceId, RandomState> = HashSet::default();
    for r in &runs {
        let id = spans[r.start].trace_id;
        if !seen.insert(id) {
            repeated.insert(id);
        }
    }
    let mut out = Vec::with_capacity(runs.len());
    for r in runs {
        let run = &spans[r.clone()];
        let service = &run[0].service;
        if !repeated.is_empty() && repeated.contains(&run[0].trace_id)
            || !run.iter().all(|s| s.service == *service)
            || !run.iter().any(is_request_span)
        {
            continue;
        }
        let analysed = analyse_spans(run, opts);
        out.push(PreparedRun {
            trace_id: run[0].trace_id,
            start: r.start,
            len: run.len(),
            prepared: Box::new(PreparedTrace {
                analysed,
                source: SpanSource {
                    body: body.clone(),
                    service: service.clone(),
                    ranges: batch.span_ranges[r].to_vec(),
                },
            }),
        });
    }
    out
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
