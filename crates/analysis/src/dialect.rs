//! Engine dialects (docs/reference.md#dialects): which spans are inference requests, and how each
//! engine's spans become one [`RequestRecord`].
//!
//! # Detection rules, in order
//! 0. A span carrying `infer.phase` is an infertrace phase span, never a request.
//! 1. A span named `llm_request` is **vLLM**'s request span.
//! 2. A span carrying any of infertrace's own request attributes (`infer.outcome`,
//!    `infer.phase.source`, `infer.time_per_output_token`, `infer.stream.chunks`,
//!    `infer.queue.depth`) is an **infertrace** request span (it may carry the
//!    `gen_ai.latency.*` family too). In a whole trace, a SERVER span with a child carrying
//!    `infer.phase` is one as well.
//! 3. SGLang's request tree: a `Bootstrap Room 0x…` span (or one carrying `bootstrap_room`)
//!    and a per-role `"{role} Req {rid}"` span carrying `rid` are **SGLang**'s (see [`sglang`]:
//!    the room is the request, the role spans, thread spans and stage slices below it are
//!    read into its one record, across services). A `prefill Req …` span is recognised only
//!    with its trace: the prefill side ends long before the decode side, and its arrival must
//!    not complete the trace before the decode side's spans and the room arrive.
//! 4. Any other span carrying the `gen_ai.latency.*` family (e2e, time to first token, time in
//!    queue, prefill or decode) is read as **SGLang**'s too (older versions, and engines that
//!    copied vLLM's attributes, such as TensorRT-LLM, under another span name): vLLM always
//!    names its span `llm_request`, so the name decides. (The instrumentation scope would be a
//!    second signal, but the span model does not keep it.)
//! 5. A span named `generate`, `generate_stream`, `completions` or `chat_completions` carrying a
//!    TGI timing field (`total_time`, `validation_time`, `queue_time`, `inference_time`,
//!    `time_per_token`) is **TGI**'s request span. TGI records those fields only on success; in
//!    a whole trace, the outermost such-named span with a `queued` or `infer` descendant is one
//!    too (TGI's inner `Infer::generate*` spans of the same names are not).
//! 6. Any other SERVER span is **generic**: e2e latency, rate and errors. In a whole trace, a
//!    generic span is not a request of its own when it is an ancestor or descendant of a
//!    recognised request span of the same service (the HTTP span around TGI's `generate`, a
//!    `TraceLayer` span around infertrace's).
//!
//! A request span nested inside a same-service request span of the same dialect is the same
//! request (the outermost stands); an SGLang room or role span below another one, of any
//! service, is part of that one's request.
//!
//! # Outcome
//! `infer.outcome` if present; else a non-OK `rpc.grpc.status_code` (1 CANCELLED → cancelled,
//! 8 RESOURCE_EXHAUSTED → rejected, others → error); else `http.response.status_code` 429 →
//! rejected, 499 → cancelled, any other 4xx or 5xx → error; else `gen_ai.response.finish_reasons`
//! holding `abort` (vLLM's) → cancelled; else span status ERROR or `error.type` → error; else
//! ok. When the request span says nothing at all, the nearest same-service ancestor that does
//! decides (TGI's status lives on the HTTP span around it).
//!
//! Phase extraction per dialect is documented in [`infertrace`], [`latency_attrs`],
//! [`sglang`] and [`tgi`].
//!
//! # Every dialect
//! Prefix-cache hits (`gen_ai.usage.cache_read.input_tokens`), preemptions
//! (`infer.preemptions`) and the LoRA adapter (`infer.lora.adapter`) are read from the request
//! span when present.
//!
//! [`RequestRecord`]: crate::record::RequestRecord

pub mod infertrace;
pub mod latency_attrs;
pub mod sglang;
pub mod tgi;

mod base_record;
mod completion;
mod detection;
mod extract;
mod trace_view;

#[cfg(test)]
mod test_spans;

pub use completion::{completes_trace, may_be_late_request, may_be_own_request};
pub use detection::detect;
pub use extract::{RecordSink, extract_requests, extract_requests_detected, extract_requests_into};
pub use tgi::parse_duration;
pub use trace_view::TraceView;
