//! vLLM (`llm_request`) and SGLang request spans: the `gen_ai.latency.*` attribute family.
//!
//! vLLM creates its span after the request ends, with the start set back to arrival; phases
//! follow one another: queue = `time_in_queue`, then prefill = `time_in_model_prefill`, then
//! decode = `time_in_model_decode`.
//! - e2e: `e2e` (measured), else the span's duration (measured).
//! - queue: `time_in_queue` (measured).
//! - TTFT: `time_to_first_token` (measured), else queue + prefill (derived); none when the
//!   span counts 0 output tokens (vLLM then reports its default, 0).
//! - prefill: `time_in_model_prefill` (measured), else TTFT − queue (derived).
//! - decode: `time_in_model_decode` (measured), else `time_in_model_inference` − prefill, else
//!   e2e − TTFT (derived).
//! - With 0 output tokens, a prefill or decode of exactly 0 is vLLM's default, not a
//!   measurement: none.
//! - tokens: `gen_ai.usage.input_tokens` / `output_tokens`, else vLLM's old `prompt_tokens` /
//!   `completion_tokens`. TPOT = decode / (output tokens − 1) (derived).
//! - KV transfer (disaggregated serving): TensorRT-LLM's `kv_cache_transfer_time` (measured)
//!   → [`DisaggPhases::kv_transfer`](crate::record::DisaggPhases::kv_transfer).
//! - vLLM does not say the operation: it is [`UNKNOWN`](crate::record::UNKNOWN) unless
//!   `gen_ai.operation.name` is set.

use infertrace_semconv as sc;

use super::base_record::seconds_attr;
use crate::record::{DisaggPhases, PhaseOrigin, RequestRecord, tpot_from};
use crate::trace::Span;

/// The `gen_ai.latency.*` attributes that mark a vLLM / SGLang request span.
pub(super) const LATENCY_KEYS: [&str; 5] = [
    sc::latency::E2E,
    sc::latency::TIME_TO_FIRST_TOKEN,
    sc::latency::TIME_IN_QUEUE,
    sc::latency::TIME_IN_MODEL_PREFILL,
    sc::latency::TIME_IN_MODEL_DECODE,
];

/// Completes `r`, the base record (common to every dialect) of a vLLM or SGLang request span.
pub fn refine(span: &Span, r: &mut RequestRecord) {
    let attr = |k| seconds_attr(span, k);
    let measured = |v: Option<f64>| v.map(|_| PhaseOrigin::Measured);
    let derived = |v: Option<f64>| v.map(|_| PhaseOrigin::Derived);
    let non_negative = |v: f64| (v >= 0.0).then_some(v);

    if let Some(e2e) = attr(sc::latency::E2E) {
        r.e2e = e2e;
    }
    r.queue = attr(sc::latency::TIME_IN_QUEUE);
    r.origins.queue = measured(r.queue);
    r.inference = attr(sc::latency::TIME_IN_MODEL_INFERENCE);
    if let Some(kv) = attr(sc::latency::KV_CACHE_TRANSFER_TIME) {
        r.disagg
            .get_or_insert_with(Box::<DisaggPhases>::default)
            .kv_transfer = Some(kv);
    }

    // A request that produced no token has no TTFT, and a prefill or decode of 0 is no
    // measurement either: vLLM then reports its defaults, 0. (An embedding's prefill, not 0,
    // is kept.)
    let no_token = r.output_tokens == Some(0);
    let unless_default = |v: Option<f64>| v.filter(|v| !(no_token && *v == 0.0));
    let ttft = attr(sc::latency::TIME_TO_FIRST_TOKEN);
    let prefill = unless_default(attr(sc::latency::TIME_IN_MODEL_PREFILL));
    (r.ttft, r.origins.ttft) = match (ttft, r.queue, prefill) {
        _ if no_token => (None, None),
        (Some(t), _, _) => (Some(t), measured(Some(t))),
        (None, Some(q), Some(p)) => (Some(q + p), derived(Some(q))),
        _ => (None, None),
    };
    (r.prefill, r.origins.prefill) = match (prefill, r.ttft, r.queue) {
        (Some(p), _, _) => (Some(p), measured(Some(p))),
        (None, Some(t), Some(q)) => {
            let p = non_negative(t - q);
            (p, derived(p))
        }
        _ => (None, None),
    };
    let decode = unless_default(attr(sc::latency::TIME_IN_MODEL_DECODE));
    (r.decode, r.origins.decode) = match (decode, r.inference, r.prefill, r.ttft) {
        (Some(d), ..) => (Some(d), measured(Some(d))),
        (None, Some(i), Some(p), _) => {
            let d = non_negative(i - p);
            (d, derived(d))
        }
        // Without a prefill, inference − prefill is unknown even where inference is told.
        (None, _, _, Some(t)) => {
            let d = non_negative(r.e2e - t);
            (d, derived(d))
        }
        _ => (None, None),
    };

    if let Some(t) = attr(sc::infer::TIME_PER_OUTPUT_TOKEN) {
        r.tpot = Some(t);
        r.origins.tpot = measured(r.tpot);
    } else if let (Some(d), Some(n)) = (r.decode, r.output_tokens) {
        r.tpot = tpot_from(d, n);
        r.origins.tpot = derived(r.tpot);
    }
}
