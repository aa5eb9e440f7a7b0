//! The path a request's time is aggregated along in the critical-path windows.
//!
//! One trace, one path in the windows: a request whose span lies on another request's path of
//! the same trace (an engine's `llm_request` under a gateway's `POST /chat`) is that request's
//! time, not more of it. Aggregating both would count the trace twice (every share halved)
//! and leave the engine's span on the gateway's path as one opaque segment ("time outside the
//! engine"). So the windows take the outer request's path, with each nested request's span read
//! along that request's own aggregation path ([`aggregation_path`]: its phases), and
//! nothing for the nested request itself.

use std::borrow::Cow;

use super::attributed::attributed_path;
use super::disagg::disaggregated_path;
use super::path::{CriticalPath, Segment};
use crate::record::RequestRecord;
use crate::trace::SpanId;

/// The path a request's time is aggregated along in the windows when its span path does not
/// show it: a disaggregated request's sub-phases across services ([`disaggregated_path`]), or
/// the phases an engine reported as attributes of a span with nothing below it on its path
/// ([`attributed_path`]). `None`: aggregate `span_path` as it is.
pub fn aggregation_path(
    r: &RequestRecord,
    span_path: Option<&CriticalPath>,
) -> Option<CriticalPath> {
    disaggregated_path(r).or_else(|| attributed_path(r, span_path?))
}

/// The path each of one trace's requests is aggregated along in the critical-path windows, in
/// the order of `records` (`paths` are their span paths; `counted`, the spans of requests of
/// this trace whose paths the windows hold already, from an earlier part of the trace): `None`
/// for a request whose path runs through another request's span (its time is counted there),
/// else the request's aggregation path, or its span path with the nested requests' spans read
/// along theirs. Borrowed unless something was changed: most traces are one request.
pub fn windows_paths<'a>(
    records: &[RequestRecord],
    paths: &'a [Option<CriticalPath>],
    counted: &[SpanId],
) -> Vec<Option<Cow<'a, CriticalPath>>> {
    let through = |i: usize, span: SpanId| {
        paths[i]
            .as_ref()
            .is_some_and(|p| p.segments.iter().any(|s| s.span_id == span))
    };
    let on_path = |i: usize, j: usize| i != j && through(i, records[j].span_id);
    (0..records.len())
        .map(|i| {
            let nested = (0..records.len()).any(|o| on_path(o, i));
            if nested || counted.iter().any(|&c| through(i, c)) {
                return None;
            }
            let own = paths[i].as_ref();
            if let Some(across) = aggregation_path(&records[i], own) {
                return Some(Cow::Owned(across));
            }
            let mut path = Cow::Borrowed(own?);
            for j in (0..records.len()).filter(|&j| on_path(i, j)) {
                if let Some(inner) = aggregation_path(&records[j], paths[j].as_ref()) {
                    let spliced = splice(&path.segments, records[j].span_id, &inner.segments);
                    path.to_mut().segments = spliced;
                }
            }
            Some(path)
        })
        .collect()
}

/// `segments` with every piece owned by `span` replaced by `inner`'s pieces within it (the
/// piece itself where `inner` leaves a gap), so the pieces still tile the same time.
fn splice(segments: &[Segment], span: SpanId, inner: &[Segment]) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segments.len() + inner.len());
    for s in segments {
        if s.span_id != span {
            out.push(s.clone());
            continue;
        }
        let piece = |from: u64, to: u64, like: &Segment| Segment {
            start_unix_nano: from,
            end_unix_nano: to,
            ..like.clone()
        };
        let mut at = s.start_unix_nano;
        for part in inner {
            let (from, to) = (
                part.start_unix_nano.max(at),
                part.end_unix_nano.min(s.end_unix_nano),
            );
            if from >= to {
                continue;
            }
            if from > at {
                out.push(piece(at, from, s));
            }
            out.push(piece(from, to, part));
            at = to;
        }
        if at < s.end_unix_nano {
            out.push(piece(at, s.end_unix_nano, s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Dialect;
    use crate::trace::{Text, TraceId};

    const MS: u64 = 1_000_000;
    const T: u64 = 1_000_000 * MS;

    fn seg(span: u8, name: &str, service: &str, from: u64, to: u64) -> Segment {
        Segment {
            span_id: SpanId([span; 8]),
            name: Text::from(name),
            service: Text::from(service),
            start_unix_nano: T + from * MS,
            end_unix_nano: T + to * MS,
        }
    }

    fn path(root: u8, segments: Vec<Segment>) -> Option<CriticalPath> {
        Some(CriticalPath {
            trace_id: TraceId([1; 16]),
            root: SpanId([root; 8]),
            segments,
            adjustments: Vec::new(),
        })
    }

    fn record(span: u8, service: &str, dialect: Dialect, from: u64, to: u64) -> RequestRecord {
        RequestRecord::new(
            TraceId([1; 16]),
            SpanId([span; 8]),
            Text::from(service),
            dialect,
            T + from * MS,
            T + to * MS,
        )
    }

    fn pieces(p: &CriticalPath) -> Vec<(String, u64)> {
        p.segments
            .iter()
            .map(|s| (s.name.to_string(), s.duration_nanos() / MS))
            .collect()
    }

    /// A gateway's `POST /chat` (0–1,000 ms) over vLLM's `llm_request` (10–990 ms, its phases
    /// as attributes): one path, the engine's span read along its phases.
    #[test]
    fn a_gateway_over_vllm_is_one_path_along_the_engines_phases() {
        let gateway = record(1, "app", Dialect::Generic, 0, 1_000);
        let mut engine = record(2, "vllm", Dialect::Vllm, 10, 990);
        (engine.queue, engine.prefill, engine.decode) = (Some(0.5), Some(0.1), Some(0.3));
        let gateway_path = path(
            1,
            vec![
                seg(1, "POST /chat", "app", 0, 10),
                seg(2, "llm_request", "vllm", 10, 990),
                seg(1, "POST /chat", "app", 990, 1_000),
            ],
        );
        let engine_path = path(2, vec![seg(2, "llm_request", "vllm", 10, 990)]);
        let paths = [gateway_path, engine_path];
        let got = windows_paths(&[gateway.clone(), engine.clone()], &paths, &[]);
        assert!(
            got[1].is_none(),
            "the engine's time is counted in the gateway's path"
        );
        let outer = got[0].as_deref().unwrap();
        assert_eq!(
            pieces(outer),
            [
                ("POST /chat".into(), 10),
                ("queue".into(), 500),
                ("prefill".into(), 100),
                ("decode".into(), 300),
                ("unattributed".into(), 80),
                ("POST /chat".into(), 10)
            ]
        );
        assert_eq!(outer.total_nanos(), 1_000 * MS);
        // The gateway's part alone, its engine's request counted before: nothing more.
        let got = windows_paths(&[gateway], &paths[..1], &[engine.span_id]);
        assert_eq!(got, [None]);
    }

    /// An engine whose phases are spans (infertrace's layer) is already walked through: the
    /// gateway's path stays as it is, and the engine's request is not counted again.
    #[test]
    fn an_engine_with_phase_spans_is_counted_once() {
        let gateway = record(1, "app", Dialect::Generic, 0, 100);
        let engine = record(2, "llm", Dialect::Infertrace, 10, 90);
        let gateway_path = path(
            1,
            vec![
                seg(1, "POST /chat", "app", 0, 10),
                seg(3, "queue", "llm", 10, 30),
                seg(4, "decode", "llm", 30, 90),
                seg(1, "POST /chat", "app", 90, 100),
            ],
        );
        let engine_path = path(
            2,
            vec![
                seg(3, "queue", "llm", 10, 30),
                seg(4, "decode", "llm", 30, 90),
            ],
        );
        let paths = [gateway_path, engine_path];
        let got = windows_paths(&[gateway, engine], &paths, &[]);
        assert!(matches!(got[0], Some(Cow::Borrowed(p)) if Some(p) == paths[0].as_ref()));
        // The engine's span is not on the gateway's path here (its phases are): both count.
        assert_eq!(got[1].as_deref(), paths[1].as_ref());
    }

    /// Requests of one trace that do not nest (two calls side by side) each keep their path.
    #[test]
    fn requests_side_by_side_keep_their_paths() {
        let a = record(1, "app", Dialect::Generic, 0, 10);
        let b = record(2, "app", Dialect::Generic, 20, 30);
        let pa = path(1, vec![seg(1, "a", "app", 0, 10)]);
        let pb = path(2, vec![seg(2, "b", "app", 20, 30)]);
        let paths = [pa, pb];
        let got = windows_paths(&[a, b], &paths, &[]);
        assert_eq!(got[0].as_deref(), paths[0].as_ref());
        assert_eq!(got[1].as_deref(), paths[1].as_ref());
    }
}
