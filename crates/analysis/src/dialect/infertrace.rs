//! infertrace's own dialect: the request span with `queue` / `prefill` / `decode` (or
//! `inference`) children.
//!
//! Child span timings are preferred; `gen_ai.latency.*` attributes on the request span fill in
//! what no child tells.
//! - e2e: the request span's duration (measured).
//! - queue / prefill / decode / inference: the phase child's duration (measured), else
//!   `time_in_queue` / `time_in_model_prefill` / `time_in_model_decode` /
//!   `time_in_model_inference` (measured).
//! - TTFT: the prefill child's end − the request's start (measured), else
//!   `time_to_first_token` (measured), else queue + prefill (derived).
//! - TPOT: `infer.time_per_output_token` (measured), else decode / (output tokens − 1)
//!   (derived).
//! - When the middleware says `infer.phase.source = derived` (no engine marks: prefill and
//!   decode were split at the first response chunk), prefill, decode, TTFT and TPOT are marked
//!   derived; the queue (the admission queue's own timestamps) stays measured.
//! - GPU statistics from the phase children's `gpu.*` attributes.
//! - Disaggregated sub-phases: children whose `infer.phase` is one of [`sc::disagg`]'s names
//!   (`routing`, `bootstrap`, `prefill_queue`, `kv_transfer`, `decode_bootstrap`,
//!   `decode_wait`, `first_token`) give [`DisaggPhases`] (measured durations); with any of
//!   them, the request's queue, prefill and decode fill the prefill queue, prefill and decode
//!   sub-phases they leave open.

use infertrace_semconv as sc;

use super::{Phase, TraceView, gpu_record, seconds_attr};
use crate::record::{DisaggPhases, PhaseOrigin, RequestRecord, tpot_from};
use crate::trace::Span;

/// Completes `r`, the [`base_record`](super::base_record) of an infertrace request span.
pub fn refine(span: &Span, trace: &TraceView<'_>, r: &mut RequestRecord) {
    // The first child of each phase, in one pass over the children.
    let (mut queue_span, mut prefill_span, mut decode_span, mut inference_span) =
        (None, None, None, None);
    for c in trace.children(span) {
        let slot = match Phase::of(c) {
            Some(Phase::Queue) => &mut queue_span,
            Some(Phase::Prefill) => &mut prefill_span,
            Some(Phase::Decode) => &mut decode_span,
            Some(Phase::Inference) => &mut inference_span,
            None => {
                if let Some(name) = c.attr_str(sc::infer::PHASE) {
                    set_sub_phase(r, name, c.duration_secs());
                }
                continue;
            }
        };
        if slot.is_none() {
            *slot = Some(c);
        }
    }
    let derived_mode = span
        .attr_str(sc::infer::PHASE_SOURCE)
        .or_else(|| prefill_span.and_then(|p| p.attr_str(sc::infer::PHASE_SOURCE)))
        .is_some_and(|s| s == sc::infer::phase_source::DERIVED);
    let engine_origin = if derived_mode {
        PhaseOrigin::Derived
    } else {
        PhaseOrigin::Measured
    };
    let phase = |s: Option<&Span>, key: &str| {
        s.map(Span::duration_secs)
            .or_else(|| seconds_attr(span, key))
    };

    r.queue = phase(queue_span, sc::latency::TIME_IN_QUEUE);
    r.origins.queue = r.queue.map(|_| PhaseOrigin::Measured);
    r.prefill = phase(prefill_span, sc::latency::TIME_IN_MODEL_PREFILL);
    r.origins.prefill = r.prefill.map(|_| engine_origin);
    r.decode = phase(decode_span, sc::latency::TIME_IN_MODEL_DECODE);
    r.origins.decode = r.decode.map(|_| engine_origin);
    r.inference = phase(inference_span, sc::latency::TIME_IN_MODEL_INFERENCE);

    if let Some(p) = prefill_span {
        r.ttft = Some(p.end_unix_nano.saturating_sub(span.start_unix_nano) as f64 / 1e9);
        r.origins.ttft = Some(engine_origin);
    } else if let Some(t) = seconds_attr(span, sc::latency::TIME_TO_FIRST_TOKEN) {
        r.ttft = Some(t);
        r.origins.ttft = Some(engine_origin);
    } else if let (Some(q), Some(p)) = (r.queue, r.prefill) {
        r.ttft = Some(q + p);
        r.origins.ttft = Some(PhaseOrigin::Derived);
    }

    if let Some(t) = seconds_attr(span, sc::infer::TIME_PER_OUTPUT_TOKEN) {
        r.tpot = Some(t);
        r.origins.tpot = Some(engine_origin);
    } else if let (Some(d), Some(n)) = (r.decode, r.output_tokens) {
        r.tpot = tpot_from(d, n);
        r.origins.tpot = r.tpot.map(|_| PhaseOrigin::Derived);
    }

    if let Some(d) = r.disagg.as_deref_mut() {
        d.prefill_queue = d.prefill_queue.or(r.queue);
        d.prefill = d.prefill.or(r.prefill);
        d.decode = d.decode.or(r.decode);
    }

    r.gpu = gpu_record(
        [
            (Phase::Queue, queue_span),
            (Phase::Prefill, prefill_span),
            (Phase::Decode, decode_span),
            (Phase::Inference, inference_span),
        ]
        .into_iter()
        .filter_map(|(p, s)| Some((p, s?))),
    );
}

/// Records a disaggregated sub-phase child (`infer.phase` = one of [`sc::disagg`]'s names);
/// the first child of each name counts.
fn set_sub_phase(r: &mut RequestRecord, name: &str, secs: f64) {
    let d = r.disagg.get_or_insert_with(Box::<DisaggPhases>::default);
    let slot = match name {
        sc::disagg::ROUTING => &mut d.routing,
        sc::disagg::BOOTSTRAP => &mut d.bootstrap,
        sc::disagg::PREFILL_QUEUE => &mut d.prefill_queue,
        sc::disagg::KV_TRANSFER => &mut d.kv_transfer,
        sc::disagg::DECODE_BOOTSTRAP => &mut d.decode_bootstrap,
        sc::disagg::DECODE_WAIT => &mut d.decode_wait,
        sc::disagg::FIRST_TOKEN => &mut d.first_token,
        _ => {
            if d.is_empty() {
                r.disagg = None;
            }
            return;
        }
    };
    slot.get_or_insert(secs);
}
