//! The critical path of a request whose engine reports its phases in a shape the span walk
//! cannot see:
//! - as attributes of one span (vLLM's and TensorRT-LLM's `gen_ai.latency.*`, SGLang's latency
//!   attributes): the span has nothing below it on its path, so the walk of
//!   [`super::critical_path`] gives it all of the request's time;
//! - as the engine's own spans (SGLang's thread spans and stage slices, TGI's `queued` and
//!   `infer`): the walk follows whichever thread or step ends last — SGLang's `Tokenizer`
//!   thread holds the whole request — and no segment is a phase.
//!
//! Either way the aggregate would blame "time outside the engine" for what the engine says was
//! queue, prefill and decode. For the windows such a path is re-read from the record: `queue`,
//! `prefill` and `decode` laid out in that order from the path's start (each cut at its end),
//! owned by the request's service, and the rest as [`UNATTRIBUTED`] (tokenising,
//! detokenising, whatever the phases do not cover). The span path itself stays
//! what the waterfall and the store show. A path through other spans of another kind (the
//! infertrace layer's, a gateway's, a generic server's) is left as it is: its spans say more
//! than the phases.

use std::sync::LazyLock;

use infertrace_semconv::span;

use super::disagg::nanos;
use super::path::{CriticalPath, Tiling};
use crate::record::{Dialect, RequestRecord};
use crate::trace::Text;

/// Name of the segment owning a request's time outside its phases.
pub const UNATTRIBUTED: &str = "unattributed";

/// The phase names as static texts (a path per request allocates none).
static PHASES: LazyLock<[Text; 3]> =
    LazyLock::new(|| [span::QUEUE, span::PREFILL, span::DECODE].map(Text::leaked));

/// [`UNATTRIBUTED`] as a static text.
static REST: LazyLock<Text> = LazyLock::new(|| Text::leaked(UNATTRIBUTED));

/// The path of `r` from its phases, when the record has a phase and `span_path` (its span's own
/// critical path) is that one span alone, or is an engine dialect's (vLLM, SGLang, TGI) with no
/// phase on it; else `None`.
pub fn attributed_path(r: &RequestRecord, span_path: &CriticalPath) -> Option<CriticalPath> {
    let (first, last) = (span_path.segments.first()?, span_path.segments.last()?);
    let segments = &span_path.segments;
    let its_span_alone = segments.iter().all(|s| s.span_id == r.span_id);
    let engine_spans = matches!(r.dialect, Dialect::Vllm | Dialect::Sglang | Dialect::Tgi)
        && !segments.iter().any(|s| PHASES.contains(&s.name));
    if !(its_span_alone || engine_spans)
        || (r.queue.is_none() && r.prefill.is_none() && r.decode.is_none())
    {
        return None;
    }
    let end = last.end_unix_nano;
    let mut path = Tiling::new(r.span_id, first.start_unix_nano);
    for (name, secs) in PHASES.iter().zip([r.queue, r.prefill, r.decode]) {
        let until = path.at().saturating_add(secs.map_or(0, nanos)).min(end);
        path.lay(until, name, &r.service);
    }
    path.lay(end, &REST, &r.service);
    Some(path.into_path(span_path.trace_id, span_path.root))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::critical_path::Segment;
    use crate::trace::{SpanId, TraceId};

    const MS: u64 = 1_000_000;

    fn one_span_path(id: SpanId, start: u64, end: u64) -> CriticalPath {
        CriticalPath {
            trace_id: TraceId([1; 16]),
            root: id,
            segments: vec![Segment {
                span_id: id,
                name: Text::from("llm_request"),
                service: Text::from("vllm"),
                start_unix_nano: start,
                end_unix_nano: end,
            }],
            adjustments: Vec::new(),
        }
    }

    /// Each segment's name and milliseconds.
    fn pieces(path: &CriticalPath) -> Vec<(&str, u64)> {
        path.segments
            .iter()
            .map(|s| (s.name.as_str(), s.duration_nanos() / MS))
            .collect()
    }

    fn record(id: SpanId) -> RequestRecord {
        RequestRecord::new(
            TraceId([1; 16]),
            id,
            Text::from("vllm"),
            Dialect::Vllm,
            1_000 * MS,
            2_000 * MS,
        )
    }

    #[test]
    fn the_phases_tile_the_span_and_the_rest_keeps_its_name() {
        let id = SpanId([2; 8]);
        let mut r = record(id);
        (r.queue, r.prefill, r.decode) = (Some(0.05), Some(0.05), Some(0.85));
        let path = attributed_path(&r, &one_span_path(id, 1_000 * MS, 2_000 * MS)).unwrap();
        let got = pieces(&path);
        assert_eq!(
            got,
            [
                ("queue", 50),
                ("prefill", 50),
                ("decode", 850),
                ("unattributed", 50)
            ]
        );
        assert_eq!(path.total_nanos(), 1_000 * MS);
        assert!(path.segments.iter().all(|s| s.service == "vllm"));
    }

    #[test]
    fn phases_past_the_span_are_cut_at_its_end() {
        let id = SpanId([2; 8]);
        let mut r = record(id);
        (r.queue, r.decode) = (Some(0.6), Some(0.6));
        let path = attributed_path(&r, &one_span_path(id, 0, 1_000 * MS)).unwrap();
        let got = pieces(&path);
        assert_eq!(got, [("queue", 600), ("decode", 400)]);
    }

    fn with_a_child(id: SpanId, child: &str) -> CriticalPath {
        let mut path = one_span_path(id, 0, 1_000 * MS);
        path.segments[0].end_unix_nano = 500 * MS;
        path.segments.push(Segment {
            span_id: SpanId([3; 8]),
            name: Text::from(child),
            service: Text::from("vllm"),
            start_unix_nano: 500 * MS,
            end_unix_nano: 1_000 * MS,
        });
        path
    }

    #[test]
    fn a_path_through_other_spans_or_a_record_without_phases_is_left_alone() {
        let id = SpanId([2; 8]);
        let mut r = record(id);
        assert!(attributed_path(&r, &one_span_path(id, 0, 1_000 * MS)).is_none());
        r.decode = Some(0.9);
        assert!(attributed_path(&r, &one_span_path(id, 0, 1_000 * MS)).is_some());
        // The layer's (or a gateway's) spans say more than the phases.
        r.dialect = Dialect::Infertrace;
        assert!(attributed_path(&r, &with_a_child(id, "tool call")).is_none());
        // An engine's path that shows its phases stays as it is.
        r.dialect = Dialect::Sglang;
        assert!(attributed_path(&r, &with_a_child(id, "decode")).is_none());
    }

    /// SGLang's `Tokenizer` thread span lasts the whole request, so the walk gives it nearly
    /// all of it (a review: 99.5 %, and a hotspot finding); the engine's phases stand instead,
    /// the rest as unattributed.
    #[test]
    fn an_engines_own_spans_without_a_phase_give_way_to_its_phases() {
        let id = SpanId([2; 8]);
        let mut r = record(id);
        r.dialect = Dialect::Sglang;
        (r.queue, r.prefill, r.decode) = (Some(0.1), Some(0.2), Some(0.5));
        let path = attributed_path(&r, &with_a_child(id, "Tokenizer")).unwrap();
        let got = pieces(&path);
        assert_eq!(
            got,
            [
                ("queue", 100),
                ("prefill", 200),
                ("decode", 500),
                ("unattributed", 200)
            ]
        );
    }
}
