//! The critical path of a request whose engine reports its phases as attributes of one span
//! (vLLM's and TensorRT-LLM's `gen_ai.latency.*`, SGLang's latency attributes): the span has
//! nothing below it on its path, so the walk of [`super::critical_path`] gives it all of the
//! request's time, and the aggregate would blame "time outside the engine" for what the engine
//! says was queue, prefill and decode.
//!
//! For the windows such a path is re-read from the record: `queue`, `prefill` and `decode`
//! laid out in that order from the span's start (each cut at its end), owned by the span's
//! service, and the rest of the span under its own name (tokenising, detokenising, whatever
//! the attributes do not cover). The span path itself stays what the waterfall and the store
//! show. A path with any other span on it is left as it is: its children say more than the
//! attributes.

use std::sync::LazyLock;

use infertrace_semconv::span;

use super::disagg::nanos;
use super::path::{CriticalPath, Tiling};
use crate::record::RequestRecord;
use crate::trace::Text;

/// The phase names as static texts (a path per request allocates none).
static PHASES: LazyLock<[Text; 3]> =
    LazyLock::new(|| [span::QUEUE, span::PREFILL, span::DECODE].map(Text::leaked));

/// The path of `r` from its phases, when `span_path` (its span's own critical path) is that one
/// span alone and the record has a phase; else `None`.
pub fn attributed_path(r: &RequestRecord, span_path: &CriticalPath) -> Option<CriticalPath> {
    let (first, last) = (span_path.segments.first()?, span_path.segments.last()?);
    if span_path.segments.iter().any(|s| s.span_id != r.span_id)
        || (r.queue.is_none() && r.prefill.is_none() && r.decode.is_none())
    {
        return None;
    }
    let end = last.end_unix_nano;
    let mut path = Tiling::new(r.span_id, first.start_unix_nano);
    for (name, secs) in PHASES.iter().zip([r.queue, r.prefill, r.decode]) {
        let until = path.at().saturating_add(secs.map_or(0, nanos)).min(end);
        path.lay(until, name, &first.service);
    }
    path.lay(end, &first.name, &first.service);
    Some(path.into_path(span_path.trace_id, span_path.root))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::critical_path::Segment;
    use crate::record::Dialect;
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
        let got: Vec<(&str, u64)> = path
            .segments
            .iter()
            .map(|s| (s.name.as_str(), s.duration_nanos() / MS))
            .collect();
        assert_eq!(
            got,
            [
                ("queue", 50),
                ("prefill", 50),
                ("decode", 850),
                ("llm_request", 50)
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
        let got: Vec<(&str, u64)> = path
            .segments
            .iter()
            .map(|s| (s.name.as_str(), s.duration_nanos() / MS))
            .collect();
        assert_eq!(got, [("queue", 600), ("decode", 400)]);
    }

    #[test]
    fn a_path_through_other_spans_or_a_record_without_phases_is_left_alone() {
        let id = SpanId([2; 8]);
        let mut with_child = one_span_path(id, 0, 1_000 * MS);
        with_child.segments[0].end_unix_nano = 500 * MS;
        with_child.segments.push(Segment {
            span_id: SpanId([3; 8]),
            name: Text::from("tool call"),
            service: Text::from("vllm"),
            start_unix_nano: 500 * MS,
            end_unix_nano: 1_000 * MS,
        });
        let mut r = record(id);
        assert!(attributed_path(&r, &one_span_path(id, 0, 1_000 * MS)).is_none());
        r.decode = Some(0.9);
        assert!(attributed_path(&r, &with_child).is_none());
        assert!(attributed_path(&r, &one_span_path(id, 0, 1_000 * MS)).is_some());
    }
}
