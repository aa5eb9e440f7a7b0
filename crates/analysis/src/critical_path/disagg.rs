//! The critical path of a disaggregated request across its services, from its record's
//! sub-phases ([`DisaggPhases`]).
//!
//! The span tree of a disaggregated request does not show where its time went: the router
//! waits on its workers (SGLang's `wait_pd_finish`, or the phase spans infertrace's layer puts
//! on the router's own request span) and that one span ends last, so the walk of
//! [`super::critical_path`] gives the router's span the whole time to first token. Along TTFT
//! the sub-phases follow one another (docs/disaggregated.md), so the path is theirs, in order,
//! each owned by the service that ran it:
//!
//! `routing` (the router) → `bootstrap`, `prefill_queue`, `prefill`, `kv_transfer` (the prefill
//! worker) → `decode_wait`, `first_token` (the decode worker) → [`HANDOVER`] (the rest of TTFT:
//! hand-overs between services, owned by the record's service) → `decode` (the decode worker)
//! → [`HANDOVER`] (the rest of e2e: relaying the end of the stream).
//!
//! The segments tile `[arrival, end]` of the record exactly: they are laid out from the
//! arrival, each sub-phase cut at the first token (overlapping reports cannot push past it) and
//! `decode` at the end. The prefill queue and prefill are the record's queue and prefill where
//! the sub-phases do not tell them (TensorRT-LLM reports only the KV transfer beside its
//! latency attributes). A sub-phase the trace did not tell is left out (its time becomes part
//! of the hand-over). `decode_bootstrap` runs beside the prefill side and is not on the path.

use std::sync::LazyLock;

use infertrace_semconv::disagg as d;

use super::path::{CriticalPath, Tiling};
use crate::record::RequestRecord;
use crate::trace::Text;

/// Name of the segments owning the time between sub-phases (hand-overs between services, and
/// sub-phases the trace did not tell).
pub const HANDOVER: &str = "handover";

/// The segment names as static texts (a path per request allocates none), in path order:
/// the seven TTFT sub-phases, `decode`, [`HANDOVER`].
static NAMES: LazyLock<[Text; 9]> = LazyLock::new(|| {
    [
        d::ROUTING,
        d::BOOTSTRAP,
        d::PREFILL_QUEUE,
        d::PREFILL,
        d::KV_TRANSFER,
        d::DECODE_WAIT,
        d::FIRST_TOKEN,
        d::DECODE,
        HANDOVER,
    ]
    .map(Text::leaked)
});

/// `seconds` as whole nanoseconds; 0 for a negative or non-finite value.
pub(super) fn nanos(seconds: f64) -> u64 {
    if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1e9).round() as u64
    } else {
        0
    }
}

/// The critical path of a disaggregated request from its sub-phases; `None` for a record
/// without sub-phases or without a TTFT.
pub fn disaggregated_path(r: &RequestRecord) -> Option<CriticalPath> {
    let p = r.disagg.as_deref()?;
    let ttft = r.ttft?;
    let (start, end) = (
        r.arrival_unix_nano,
        r.end_unix_nano.max(r.arrival_unix_nano),
    );
    let first_token = start.saturating_add(nanos(ttft)).min(end);
    let router = &r.service;
    let prefill = p.prefill_worker.as_ref().unwrap_or(router);
    let decode = p.decode_worker.as_ref().unwrap_or(router);
    let mut path = Tiling::new(r.span_id, start);
    let names = &*NAMES;
    let along_ttft = [
        (router, p.routing),
        (prefill, p.bootstrap),
        (prefill, p.prefill_queue.or(r.queue)),
        (prefill, p.prefill.or(r.prefill)),
        (prefill, p.kv_transfer),
        (decode, p.decode_wait),
        (decode, p.first_token),
    ];
    for (name, (service, secs)) in names.iter().zip(along_ttft) {
        let until = path
            .at()
            .saturating_add(secs.map_or(0, nanos))
            .min(first_token);
        path.lay(until, name, service);
    }
    path.lay(first_token, &names[8], router);
    let decode_end = path
        .at()
        .saturating_add(p.decode.or(r.decode).map_or(0, nanos))
        .min(end);
    path.lay(decode_end, &names[7], decode);
    path.lay(end, &names[8], router);
    Some(path.into_path(r.trace_id, r.span_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Dialect, DisaggPhases};
    use crate::trace::{SpanId, TraceId};

    const MS: u64 = 1_000_000;

    fn record(disagg: DisaggPhases, ttft_ms: u64, e2e_ms: u64) -> RequestRecord {
        let arrival = 1_700_000_000_000 * MS;
        let mut r = RequestRecord::new(
            TraceId([1; 16]),
            SpanId([2; 8]),
            Text::from("pd-router"),
            Dialect::Infertrace,
            arrival,
            arrival + e2e_ms * MS,
        );
        r.ttft = Some(ttft_ms as f64 / 1e3);
        r.disagg = Some(Box::new(disagg));
        r
    }

    fn pieces(p: &CriticalPath) -> Vec<(String, String, u64)> {
        p.segments
            .iter()
            .map(|s| {
                (
                    s.service.to_string(),
                    s.name.to_string(),
                    s.duration_nanos() / MS,
                )
            })
            .collect()
    }

    #[test]
    fn sub_phases_tile_the_request_in_time_order_on_their_services() {
        // Routing 2, bootstrap 3, queue 5, prefill 30, transfer 40, decode wait 4, first token 8:
        // 92 ms of a 100 ms TTFT; decode 700 of the 900 ms after it.
        let p = DisaggPhases {
            routing: Some(0.002),
            bootstrap: Some(0.003),
            prefill_queue: Some(0.005),
            prefill: Some(0.030),
            kv_transfer: Some(0.040),
            decode_bootstrap: Some(0.050),
            decode_wait: Some(0.004),
            first_token: Some(0.008),
            decode: Some(0.700),
            prefill_worker: Some(Text::from("pd-prefill-0")),
            decode_worker: Some(Text::from("pd-decode-1")),
        };
        let r = record(p, 100, 1000);
        let path = disaggregated_path(&r).unwrap();
        let s = |a: &str, b: &str, n: u64| (a.to_string(), b.to_string(), n);
        assert_eq!(
            pieces(&path),
            [
                s("pd-router", "routing", 2),
                s("pd-prefill-0", "bootstrap", 3),
                s("pd-prefill-0", "prefill_queue", 5),
                s("pd-prefill-0", "prefill", 30),
                s("pd-prefill-0", "kv_transfer", 40),
                s("pd-decode-1", "decode_wait", 4),
                s("pd-decode-1", "first_token", 8),
                s("pd-router", "handover", 8),
                s("pd-decode-1", "decode", 700),
                s("pd-router", "handover", 200),
            ]
        );
        assert_eq!(path.total_nanos(), 1000 * MS);
        assert_eq!(path.segments[0].start_unix_nano, r.arrival_unix_nano);
        assert!(
            path.segments
                .windows(2)
                .all(|w| w[0].end_unix_nano == w[1].start_unix_nano)
        );
    }

    #[test]
    fn overlapping_or_missing_sub_phases_still_tile_exactly() {
        // Sub-phases summing past TTFT are cut at the first token; decode past the end at the
        // end; without workers, the record's service owns them.
        let p = DisaggPhases {
            prefill: Some(0.080),
            kv_transfer: Some(0.050),
            decode: Some(5.0),
            ..DisaggPhases::default()
        };
        let path = disaggregated_path(&record(p, 100, 300)).unwrap();
        let s = |b: &str, n: u64| ("pd-router".to_string(), b.to_string(), n);
        assert_eq!(
            pieces(&path),
            [s("prefill", 80), s("kv_transfer", 20), s("decode", 200)]
        );
        assert_eq!(path.total_nanos(), 300 * MS);
        let mut plain = record(DisaggPhases::default(), 100, 300);
        plain.disagg = None;
        assert!(disaggregated_path(&plain).is_none());
    }

    /// TensorRT-LLM tells only the KV transfer among the sub-phases; its queue and prefill
    /// come from its latency attributes and stand in (a review saw them under `handover`).
    #[test]
    fn the_records_queue_and_prefill_stand_in_for_missing_sub_phases() {
        let p = DisaggPhases {
            kv_transfer: Some(0.1),
            ..DisaggPhases::default()
        };
        let mut r = record(p, 400, 1500);
        (r.queue, r.prefill, r.decode) = (Some(0.1), Some(0.2), Some(1.1));
        let s = |b: &str, n: u64| ("pd-router".to_string(), b.to_string(), n);
        assert_eq!(
            pieces(&disaggregated_path(&r).unwrap()),
            [
                s("prefill_queue", 100),
                s("prefill", 200),
                s("kv_transfer", 100),
                s("decode", 1100)
            ]
        );
    }
}
