//! Analyse on arrival: when all of a trace's spans come in one protobuf batch (as the layer,
//! vLLM and most SDK exporters send them), the receiver thread extracts its request records and
//! critical paths right away, while the decoded spans are in cache, and the assembler holds that
//! [`PreparedTrace`] through the grace period instead of the spans, which are dropped at once
//! (see [`crate::held`] for how its spans are kept).
//!
//! The analysis is the same function of the same spans whichever way it runs; tests check that
//! the KPIs, critical paths and stored traces are the same as when every trace is analysed at
//! completion, with spans held either way.

use std::collections::{HashMap, HashSet};

use foldhash::fast::RandomState;
use infertrace_analysis::critical_path::CriticalPathOptions;
use infertrace_analysis::dialect;
use infertrace_analysis::trace::{Span, TraceId};

use crate::assembler::has_duplicate_span_ids;
use crate::held::{Analysed, PreparedRun, PreparedTrace, SpanSource, compact_copy, hold_the_body};
use crate::ingest::IngestBatch;
use crate::limiter::span_footprint;
use crate::otlp_decode::SpanRange;

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
) -> (Vec<PreparedRun>, usize) {
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
        // A run with a span twice (a batch holding a retry) is assembled as spans, where the
        // copies are dropped.
        if !run.iter().all(|s| s.service == *service) || has_duplicate_span_ids(run) {
            continue;
        }
        // The analysis is written straight into the box the assembler will hold (a record and
        // its path are a few hundred bytes: moved from call to call, they were copied several
        // times each).
        let mut prepared = Box::new(PreparedTrace {
            analysed: Analysed::default(),
            source: SpanSource::new(run[0].trace_id, service.clone()),
            span_bytes: run.iter().map(span_footprint).sum(),
        });
        // Only a trace with a request span (as the assembler's detector sees it) completes
        // after its grace period; the others are left to the assembler's idle rules.
        if !dialect::extract_requests_into(run, &mut prepared.analysed.records) {
            continue;
        }
        prepared.analysed.add_paths(run, opts);
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
            let ranges = &batch.span_ranges[run.start..run.start + run.len];
            run.prepared.source.point_at_body(&body, ranges);
        }
        return (out, body.len());
    }
    let len = compact_copy(spans, &mut out);
    if len.is_none() {
        out.clear();
    }
    (out, len.unwrap_or(0))
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
    use infertrace_analysis::text::Text;
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
