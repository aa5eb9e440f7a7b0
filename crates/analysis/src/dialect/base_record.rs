//! What every dialect reads alike: the record each starts from (identity, times, model,
//! outcome, tokens, infertrace's streaming attributes) and the attribute readers it is built
//! with.

use infertrace_semconv as sc;

use super::trace_view::TraceView;
use crate::record::{Dialect, InterTokenStats, Outcome, RequestRecord};
use crate::trace::{AttrValue, Span, StatusCode};

/// A non-negative, finite number of seconds from a numeric attribute.
pub(super) fn seconds_attr(span: &Span, key: &str) -> Option<f64> {
    span.attr_f64(key).filter(|v| v.is_finite() && *v >= 0.0)
}

/// A non-negative integer attribute.
pub(super) fn count_attr(span: &Span, key: &str) -> Option<u64> {
    span.attr_i64(key).and_then(|v| u64::try_from(v).ok())
}

/// The prompt tokens a span counts (`gen_ai.usage.input_tokens`, else `prompt_tokens`).
pub(super) fn input_tokens(span: &Span) -> Option<u64> {
    count_attr(span, sc::gen_ai::USAGE_INPUT_TOKENS)
        .or_else(|| count_attr(span, sc::gen_ai::USAGE_PROMPT_TOKENS))
}

/// The output tokens a span counts (`gen_ai.usage.output_tokens`, else `completion_tokens`).
pub(super) fn output_tokens(span: &Span) -> Option<u64> {
    count_attr(span, sc::gen_ai::USAGE_OUTPUT_TOKENS)
        .or_else(|| count_attr(span, sc::gen_ai::USAGE_COMPLETION_TOKENS))
}

/// Whether the end of a request's prefill (at `prefill_end`, when known) was its first token.
/// A request that counted its tokens (output tokens or stream chunks) saw one if it counted
/// any; without a count, if it ended ok (a whole response at once) or its prefill stopped
/// before its end (a prefill ends at the first token): a request that failed or was cancelled
/// before its first token has its prefill running to its end, and that end is no first token.
pub(super) fn prefill_end_is_first_token(
    r: &RequestRecord,
    request: &Span,
    prefill_end: Option<u64>,
) -> bool {
    match r.output_tokens.max(r.stream_chunks) {
        Some(n) => n > 0,
        None => r.outcome == Outcome::Ok || prefill_end.is_some_and(|e| e < request.end_unix_nano),
    }
}

/// TTFT from a prefill that ended at `prefill_end`: that end within the request span (a child
/// clocked past it, skew between services, gives at most e2e) − the request's start.
pub(super) fn ttft_at(request: &Span, prefill_end: u64) -> f64 {
    let first_token = prefill_end
        .min(request.end_unix_nano)
        .max(request.start_unix_nano);
    (first_token - request.start_unix_nano) as f64 / 1e9
}

/// The explicit outcome a span states, if any (see the [`crate::dialect`] docs for the order).
pub(super) fn outcome_signal(span: &Span) -> Option<Outcome> {
    if let Some(o) = span.attr_str(sc::infer::OUTCOME).and_then(Outcome::parse) {
        return Some(o);
    }
    let grpc = span.attr_i64(sc::net::RPC_GRPC_STATUS_CODE);
    let http = span.attr_i64(sc::net::HTTP_RESPONSE_STATUS_CODE);
    let said = grpc
        .and_then(sc::infer::outcome::of_grpc_status)
        .or_else(|| http.and_then(sc::infer::outcome::of_http_status));
    if let Some(o) = said.and_then(Outcome::parse) {
        return Some(o);
    }
    // An aborted request's finish reason is `abort` (SGLang writes the list as one JSON string,
    // `["abort"]`).
    let aborted = match span.attr(sc::gen_ai::RESPONSE_FINISH_REASONS) {
        Some(AttrValue::StrArray(reasons)) => reasons.iter().any(|r| &**r == "abort"),
        Some(AttrValue::Str(list)) => list
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .any(|word| word == "abort"),
        _ => false,
    };
    if aborted {
        return Some(Outcome::Cancelled);
    }
    if span.status == StatusCode::Error || span.attr(sc::net::ERROR_TYPE).is_some() {
        return Some(Outcome::Error);
    }
    (grpc.is_some() || http.is_some() || span.status == StatusCode::Ok).then_some(Outcome::Ok)
}

/// The outcome of a request span: its own signal, else its nearest same-service ancestor's.
pub(super) fn outcome_of(span: &Span, trace: &TraceView<'_>) -> Outcome {
    outcome_signal(span)
        .or_else(|| {
            trace
                .ancestors(span)
                .take_while(|a| a.service == span.service)
                .find_map(outcome_signal)
        })
        .unwrap_or(Outcome::Ok)
}

/// The record every dialect starts from: identity, times, e2e from the span, model, operation,
/// outcome, tokens and infertrace's streaming attributes where present.
pub(super) fn base_record(span: &Span, dialect: Dialect, trace: &TraceView<'_>) -> RequestRecord {
    let mut r = RequestRecord::new(
        span.trace_id,
        span.span_id,
        span.service.clone(),
        dialect,
        span.start_unix_nano,
        span.end_unix_nano,
    );
    if let Some(m) = span
        .attr_text(sc::gen_ai::RESPONSE_MODEL)
        .or_else(|| span.attr_text(sc::gen_ai::REQUEST_MODEL))
        .filter(|m| !m.is_empty())
    {
        r.model = m.clone();
    }
    if let Some(op) = span
        .attr_text(sc::gen_ai::OPERATION_NAME)
        .filter(|m| !m.is_empty())
    {
        r.operation = op.clone();
    }
    r.outcome = outcome_of(span, trace);
    r.input_tokens = input_tokens(span);
    r.output_tokens = output_tokens(span);
    r.stream_chunks = count_attr(span, sc::infer::STREAM_CHUNKS);
    r.queue_depth = count_attr(span, sc::infer::QUEUE_DEPTH);
    r.time_to_first_chunk = seconds_attr(span, sc::infer::TIME_TO_FIRST_CHUNK);
    r.cache_read_input_tokens = count_attr(span, sc::gen_ai::USAGE_CACHE_READ_INPUT_TOKENS);
    r.preemptions = count_attr(span, sc::infer::PREEMPTIONS);
    r.lora_adapter = span
        .attr_text(sc::infer::LORA_ADAPTER)
        .filter(|a| !a.is_empty())
        .cloned();
    let itl = |k| seconds_attr(span, k);
    // One after the other: a span without the first (most) is not scanned for the others.
    if let Some(p50) = itl(sc::infer::INTER_TOKEN_LATENCY_P50)
        && let Some(p99) = itl(sc::infer::INTER_TOKEN_LATENCY_P99)
        && let Some(max) = itl(sc::infer::INTER_TOKEN_LATENCY_MAX)
    {
        r.itl = Some(InterTokenStats { p50, p99, max });
    }
    r
}
