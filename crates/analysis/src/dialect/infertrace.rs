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
//!   `time_to_first_token` (measured), else queue + prefill (derived); none for a request that
//!   ended before its first token (no decode child, and no token counted — or, with no count,
//!   a prefill running to the end of a request that did not end ok).
//! - TPOT: `infer.time_per_output_token` (measured), else decode / (output tokens − 1)
//!   (derived).
//! - When the middleware says `infer.phase.source = derived` (no engine marks: prefill and
//!   decode were split at the first response chunk), prefill, decode, TTFT and TPOT are marked
//!   derived; the queue (the admission queue's own timestamps) stays measured.
//! - GPU statistics from the phase children's `gpu.*` attributes.
//! - A request span with no phase child and a same-service infertrace request span below it
//!   (two layers stacked: one record, the outermost's) reads the phases, and the token counts
//!   it lacks, from the nearest such span that has them.
//! - Disaggregated sub-phases: children whose `infer.phase` is one of [`sc::disagg`]'s names
//!   (`routing`, `bootstrap`, `prefill_queue`, `kv_transfer`, `decode_bootstrap`,
//!   `decode_wait`, `first_token`) give [`DisaggPhases`] (measured durations); with any of
//!   them, the request's queue, prefill and decode fill the prefill queue, prefill and decode
//!   sub-phases they leave open.
//!
//! # Across services (disaggregated serving behind the layer)
//! When each role runs behind the layer as its own service and marks its request span with
//! `infer.disagg.role` (`router`, `prefill`, `decode`), a prefill or decode worker's request
//! span below another role-marked infertrace request span (any service) is part of that
//! request — one record, the outermost span's (its service, arrival, e2e, TTFT: the client's
//! view). The workers' phase children fill it:
//! - prefill worker: `queue` → prefill queue, `prefill` → prefill, and its `bootstrap` /
//!   `kv_transfer` children (the transfer cut where the decode worker's first sub-phase
//!   starts, when that lies inside it: the part on the way to the first token); the record's
//!   queue and prefill become the prefill worker's;
//! - decode worker: `decode_bootstrap`, `kv_transfer`, `decode_wait`, `first_token` children,
//!   `decode` → decode; the record's decode becomes the decode worker's (TPOT follows);
//! - the outermost span's own `routing` child → routing. TTFT is the router's own (the
//!   client's view); without one, or when a prefill worker's span is the outermost (no
//!   router traced), the end of the decode worker's `first_token` (else the start of its
//!   `decode`) − arrival.
//! - a role tried more than once (a prefill or decode retried on another worker): the attempt
//!   that served the request — the last to start of those that did not fail.
//! - tokens the outermost span does not count: the prefill worker's input tokens, the decode
//!   worker's output tokens.
//! - a router whose request went to a worker without a role (one that serves it whole): no
//!   disaggregated record — a `routing` child alone does not make one.
//!
//! Request spans without the role attribute keep the per-service rule (one record each).

use infertrace_semconv as sc;

use smallvec::SmallVec;

use super::base_record::{
    input_tokens, outcome_signal, output_tokens, prefill_end_is_first_token, seconds_attr, ttft_at,
};
use super::detection::detect;
use super::trace_view::TraceView;
use crate::record::{
    Dialect, DisaggPhases, GpuRecord, Outcome, PerPhase, PhaseOrigin, RequestRecord, tpot_from,
};
use crate::trace::Span;

/// The role a request span played in a disaggregated deployment (`infer.disagg.role`).
pub fn disagg_role(span: &Span) -> Option<&str> {
    span.attr_str(sc::disagg::ROLE)
}

fn is_worker(span: &Span) -> bool {
    matches!(
        disagg_role(span),
        Some(sc::disagg::role::PREFILL | sc::disagg::role::DECODE)
    )
}

/// Whether `span` is a prefill or decode worker's request span below another span: no
/// completion signal (the span above it — the router's — ends last and comes with its own
/// service's export, maybe seconds after the workers').
pub fn is_worker_below(span: &Span) -> bool {
    span.parent_span_id.is_some() && is_worker(span)
}

/// Whether `span`, an infertrace request span, is a prefill or decode worker's part of a
/// request that a role-marked infertrace request span above it (any service) stands for.
pub(crate) fn is_worker_part(span: &Span, trace: &TraceView<'_>) -> bool {
    is_worker(span)
        && trace
            .ancestors(span)
            .any(|a| disagg_role(a).is_some() && detect(a) == Some(Dialect::Infertrace))
}

/// Completes `r`, the base record (common to every dialect) of an infertrace request span.
pub fn refine(span: &Span, trace: &TraceView<'_>, r: &mut RequestRecord) {
    // The first child of each phase, in one pass over the children — of the request span,
    // else of the request span nested in it (same service: the same request, two layers
    // stacked) that has them.
    let (mut queue_span, mut prefill_span, mut decode_span, mut inference_span) =
        (None, None, None, None);
    let mut holder = Some(span);
    while let Some(h) = holder {
        for c in trace.children(h) {
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
        let found = queue_span
            .or(prefill_span)
            .or(decode_span)
            .or(inference_span);
        holder = found.is_none().then(|| nested_request(h, trace)).flatten();
        if let Some(inner) = holder {
            r.input_tokens = r.input_tokens.or_else(|| input_tokens(inner));
            r.output_tokens = r.output_tokens.or_else(|| output_tokens(inner));
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

    // A request that ended before its first token (an error, a cancel, a stream of no token)
    // has no decode child, and its prefill runs to its end: that end is no first token. Without
    // a decode child, a first token was seen when tokens were counted; with no count, when the
    // prefill stopped before the request's end (a prefill ends at the first token) or the
    // request ended ok (a whole response at once).
    let first_token_seen = decode_span.is_some()
        || prefill_end_is_first_token(r, span, prefill_span.map(|p| p.end_unix_nano));
    if let Some(p) = prefill_span.filter(|_| first_token_seen) {
        r.ttft = Some(ttft_at(span, p.end_unix_nano));
        r.origins.ttft = Some(engine_origin);
    } else if let Some(t) = seconds_attr(span, sc::latency::TIME_TO_FIRST_TOKEN) {
        r.ttft = Some(t);
        r.origins.ttft = Some(engine_origin);
    } else if let (true, Some(q), Some(p)) = (first_token_seen, r.queue, r.prefill) {
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

    let role = disagg_role(span).is_some();
    if role {
        // Across services: the workers' phases, not this span's own view of them.
        merge_workers(span, trace, r);
    }
    if r.disagg.as_deref().is_some_and(DisaggPhases::routing_only) {
        // Routed to a worker that serves the whole request: not across prefill and decode.
        r.disagg = None;
    } else if !role && let Some(d) = r.disagg.as_deref_mut() {
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

/// The first infertrace request span among `span`'s children of its own service: the same
/// request, one layer further in.
fn nested_request<'a>(span: &'a Span, trace: &TraceView<'a>) -> Option<&'a Span> {
    trace
        .children(span)
        .find(|c| c.service == span.service && detect(c) == Some(Dialect::Infertrace))
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

/// The first child of `span` whose `infer.phase` (or name) is `phase`.
fn phase_child<'a>(span: &'a Span, trace: &TraceView<'a>, phase: &str) -> Option<&'a Span> {
    trace
        .children(span)
        .find(|c| c.attr_str(sc::infer::PHASE).unwrap_or(&c.name) == phase)
}

/// Reads the prefill and decode workers of the request `outer` stands for into `r` (see the
/// module docs).
fn merge_workers<'a>(outer: &'a Span, trace: &TraceView<'a>, r: &mut RequestRecord) {
    // The outermost span's own TPOT attribute (the client's view) stands; else decode's.
    let own_tpot = seconds_attr(outer, sc::infer::TIME_PER_OUTPUT_TOKEN).is_some();
    let mut workers: SmallVec<[&Span; 4]> = SmallVec::new();
    if is_worker(outer) {
        workers.push(outer);
    }
    workers.extend(
        trace
            .descendants(outer)
            .filter(|d| is_worker(d) && detect(d) == Some(Dialect::Infertrace)),
    );
    let is_prefill = |w: &&Span| disagg_role(w) == Some(sc::disagg::role::PREFILL);
    let prefill = serving_attempt(workers.iter().copied().filter(is_prefill));
    let decode = serving_attempt(workers.iter().copied().filter(|w| !is_prefill(w)));
    if prefill.is_none() && decode.is_none() {
        return;
    }
    // A router that does not count tokens: its workers do (the prompt on either side, the
    // output on the decode side only: the prefill side's is at most the first token).
    r.input_tokens = r
        .input_tokens
        .or_else(|| prefill.or(decode).and_then(input_tokens));
    r.output_tokens = r.output_tokens.or_else(|| decode.and_then(output_tokens));
    let d = r.disagg.get_or_insert_with(Box::<DisaggPhases>::default);
    let fill = |slot: &mut Option<f64>, w: &'a Span, phase: &str| {
        if slot.is_none() {
            *slot = phase_child(w, trace, phase).map(Span::duration_secs);
        }
    };
    if let Some(w) = prefill {
        fill(&mut d.prefill_queue, w, sc::span::QUEUE);
        fill(&mut d.prefill, w, sc::span::PREFILL);
        fill(&mut d.bootstrap, w, sc::disagg::BOOTSTRAP);
        if d.kv_transfer.is_none() {
            let received = decode.and_then(|dw| decode_side_start(dw, trace));
            d.kv_transfer = phase_child(w, trace, sc::disagg::KV_TRANSFER)
                .map(|kv| until_received(kv, received));
        }
        d.prefill_worker.get_or_insert_with(|| w.service.clone());
        if !std::ptr::eq(w, outer) {
            r.queue = d.prefill_queue.or(r.queue);
            r.origins.queue = r.queue.map(|_| PhaseOrigin::Measured);
            r.prefill = d.prefill.or(r.prefill);
            r.origins.prefill = r.prefill.map(|_| PhaseOrigin::Measured);
        }
    }
    let (mut first_token_at, mut decode_from_worker) = (None, false);
    if let Some(w) = decode {
        fill(&mut d.decode_bootstrap, w, sc::disagg::DECODE_BOOTSTRAP);
        fill(&mut d.kv_transfer, w, sc::disagg::KV_TRANSFER);
        fill(&mut d.decode_wait, w, sc::disagg::DECODE_WAIT);
        fill(&mut d.first_token, w, sc::disagg::FIRST_TOKEN);
        fill(&mut d.decode, w, sc::span::DECODE);
        d.decode_worker.get_or_insert_with(|| w.service.clone());
        first_token_at = phase_child(w, trace, sc::disagg::FIRST_TOKEN)
            .map(|s| s.end_unix_nano)
            .or_else(|| phase_child(w, trace, sc::span::DECODE).map(|s| s.start_unix_nano));
        if !std::ptr::eq(w, outer) && d.decode.is_some() {
            r.decode = d.decode;
            r.origins.decode = Some(PhaseOrigin::Measured);
            decode_from_worker = true;
        }
    }
    // A prefill worker's span standing for the request (no router traced) ends with its own
    // part; the request goes on at the decode worker, until that one's end.
    if is_worker(outer)
        && let Some(w) = decode
        && w.end_unix_nano > r.end_unix_nano
    {
        r.end_unix_nano = w.end_unix_nano;
        r.e2e = r
            .e2e
            .max(r.end_unix_nano.saturating_sub(r.arrival_unix_nano) as f64 / 1e9);
    }
    // TPOT follows the decode worker's decode (or the workers' token count).
    if !own_tpot
        && (decode_from_worker || r.tpot.is_none())
        && let (Some(dec), Some(n)) = (r.decode, r.output_tokens)
        && let Some(t) = tpot_from(dec, n)
    {
        r.tpot = Some(t);
        r.origins.tpot = Some(PhaseOrigin::Derived);
    }
    // The router's TTFT is the client's; a prefill worker's own ends at its prefill, before the
    // token reaches the client through the decode worker.
    if (r.ttft.is_none() || is_worker(outer))
        && let Some(at) = first_token_at
        && at >= r.arrival_unix_nano
    {
        r.ttft = Some((at - r.arrival_unix_nano) as f64 / 1e9);
        r.origins.ttft = Some(PhaseOrigin::Measured);
    }
}

/// When the decode worker went on with the request: the start of its first sub-phase
/// (`decode_wait`, else `first_token`, else `decode`).
fn decode_side_start(worker: &Span, trace: &TraceView<'_>) -> Option<u64> {
    [
        sc::disagg::DECODE_WAIT,
        sc::disagg::FIRST_TOKEN,
        sc::span::DECODE,
    ]
    .into_iter()
    .find_map(|phase| phase_child(worker, trace, phase))
    .map(|s| s.start_unix_nano)
}

/// The KV transfer's seconds on the way to the first token: its span, cut where the decode
/// worker went on with the request when that lies inside it (the prefill side's span may
/// include waiting for the decode side's acknowledgement, overlapping the decode side's
/// work).
fn until_received(kv: &Span, received: Option<u64>) -> f64 {
    match received {
        Some(at) if at > kv.start_unix_nano && at < kv.end_unix_nano => {
            (at - kv.start_unix_nano) as f64 / 1e9
        }
        _ => kv.duration_secs(),
    }
}

/// Of the attempts at one role (a prefill or decode retried on another worker), the one that
/// served the request: the last to start of those that did not fail, else the last to start.
fn serving_attempt<'a>(attempts: impl Iterator<Item = &'a Span>) -> Option<&'a Span> {
    attempts.max_by_key(|w| {
        let failed = outcome_signal(w).is_some_and(|o| o != Outcome::Ok);
        (!failed, w.start_unix_nano)
    })
}

/// Which phase a span of an infertrace request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Queue,
    Prefill,
    Decode,
    Inference,
}

impl Phase {
    fn of(span: &Span) -> Option<Self> {
        let name = span.attr_str(sc::infer::PHASE).unwrap_or(&span.name);
        match name {
            sc::span::QUEUE => Some(Self::Queue),
            sc::span::PREFILL => Some(Self::Prefill),
            sc::span::DECODE => Some(Self::Decode),
            sc::span::INFERENCE => Some(Self::Inference),
            _ => None,
        }
    }

    fn slot(self, p: &mut PerPhase) -> &mut Option<f64> {
        match self {
            Self::Queue => &mut p.queue,
            Self::Prefill => &mut p.prefill,
            Self::Decode => &mut p.decode,
            Self::Inference => &mut p.inference,
        }
    }
}

/// GPU window statistics from phase spans' `gpu.*` attributes; `None` when none has any.
fn gpu_record<'a>(phases: impl Iterator<Item = (Phase, &'a Span)>) -> Option<Box<GpuRecord>> {
    let mut g = GpuRecord::default();
    let mut any = false;
    let add = |acc: &mut Option<f64>, v: Option<f64>| {
        if let Some(v) = v {
            *acc = Some(acc.unwrap_or(0.0) + v);
        }
    };
    for (phase, span) in phases {
        let [util, sm, power, energy, attributed, memory] = gpu_values(span);
        if [util, sm, power, energy, attributed, memory]
            .iter()
            .all(Option::is_none)
        {
            continue;
        }
        any = true;
        *phase.slot(&mut g.utilization_mean) = util;
        *phase.slot(&mut g.sm_activity_mean) = sm;
        *phase.slot(&mut g.power_mean_watts) = power;
        add(&mut g.energy_joules, energy);
        add(&mut g.energy_attributed_joules, attributed);
        if let Some(m) = memory {
            g.memory_used_max_bytes = Some(g.memory_used_max_bytes.map_or(m, |x| x.max(m)));
        }
    }
    any.then(|| Box::new(g))
}

/// The `gpu.*` window statistics of one phase span — utilisation, SM activity, power, energy,
/// attributed energy, memory — each as [`Span::attr_f64`] reads it (the first attribute with
/// the key, if a non-negative finite number), in one pass over the attributes rather than a
/// scan per key.
fn gpu_values(span: &Span) -> [Option<f64>; 6] {
    let mut first: [Option<Option<f64>>; 6] = [None; 6];
    for (k, v) in &span.attributes {
        if !k.starts_with("gpu.") {
            continue;
        }
        let i = match *k {
            sc::gpu::UTILIZATION_MEAN => 0,
            sc::gpu::SM_ACTIVITY_MEAN => 1,
            sc::gpu::POWER_MEAN => 2,
            sc::gpu::ENERGY => 3,
            sc::gpu::ENERGY_ATTRIBUTED => 4,
            sc::gpu::MEMORY_USED_MAX => 5,
            _ => continue,
        };
        first[i].get_or_insert_with(|| v.as_f64().filter(|v| v.is_finite() && *v >= 0.0));
    }
    first.map(Option::flatten)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::test_spans::span;
    use crate::text::Text;

    proptest::proptest! {
        /// One pass reads each GPU key as a scan per key does: the first attribute with the
        /// key, a number or not, non-negative and finite or not.
        #[test]
        fn gpu_values_read_what_a_scan_per_key_reads(
            attrs in proptest::collection::vec((0usize..9, 0u8..4, -2.0f64..500.0), 0..12),
        ) {
            const KEYS: [&str; 9] = [
                sc::gpu::UTILIZATION_MEAN,
                sc::gpu::SM_ACTIVITY_MEAN,
                sc::gpu::POWER_MEAN,
                sc::gpu::ENERGY,
                sc::gpu::ENERGY_ATTRIBUTED,
                sc::gpu::MEMORY_USED_MAX,
                sc::gpu::UTILIZATION_MAX,
                sc::infer::PHASE,
                sc::gen_ai::REQUEST_MODEL,
            ];
            let mut s = span(2, Some(1));
            s.attributes = attrs
                .into_iter()
                .map(|(k, kind, x)| {
                    let v = match kind {
                        0 => crate::trace::AttrValue::Double(x),
                        1 => crate::trace::AttrValue::Int(x as i64),
                        2 => crate::trace::AttrValue::Str(Text::from(x.to_string().as_str())),
                        _ => crate::trace::AttrValue::Double(f64::NAN),
                    };
                    (KEYS[k], v)
                })
                .collect();
            let by_scan: Vec<Option<f64>> = KEYS[..6]
                .iter()
                .map(|k| s.attr_f64(k).filter(|v| v.is_finite() && *v >= 0.0))
                .collect();
            proptest::prop_assert_eq!(gpu_values(&s).to_vec(), by_scan);
        }
    }
}
