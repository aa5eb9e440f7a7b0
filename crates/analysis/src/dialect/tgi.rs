//! text-generation-inference (TGI) router spans.
//!
//! TGI's handlers (`generate`, `generate_stream`, `completions`, `chat_completions`) record
//! `total_time`, `validation_time`, `queue_time`, `inference_time` and `time_per_token` as
//! Rust `Debug` strings of `std::time::Duration` (`"12.3ms"`, `"1.2s"`, `"850µs"`, `"12ns"`);
//! [`parse_duration`] reads those (and compound forms like `"2m3s"`). A `queued` span covers
//! the wait; each batch step adds an `infer` span linked (span links) to a `batch` span (its own
//! trace) whose `prefill` / `decode` child is the model call.
//!
//! - e2e: `total_time` (measured), else the span's duration.
//! - queue: `queue_time` (measured), else the `queued` descendant's duration (measured), up to
//!   the request's end (a dropped stream's `queued` and `infer` outlive it; so for prefill).
//! - inference: `inference_time` (measured).
//! - prefill: the `prefill` child of the `batch` span the first `infer` span links to, when the
//!   spans given include it (measured); else the first `infer` span's duration — the prefill
//!   step, up to the scheduler's bookkeeping (derived).
//! - TTFT: that prefill's end − the request's start (measured when from the batch's `prefill`
//!   span, derived from the `infer` span); unknown without either, and for a request that did
//!   not end ok, counted no token, and whose prefill step ran to its end (it ended before its
//!   first token).
//! - output tokens: TGI's `time_per_token` is `inference_time / generated tokens`, so tokens =
//!   round(inference_time / time_per_token) (derived; TGI's spans carry no token counts).
//! - decode = inference_time − prefill (derived), and the GenAI TPOT = decode / (tokens − 1)
//!   (derived). TGI's own `time_per_token` includes prefill and is *not* the GenAI TPOT; without
//!   a prefill figure TPOT stays unknown rather than using it.
//! - outcome: as every dialect's; a span without any timing field and without an error (TGI
//!   records them once it has served the request) is a stream its client dropped: cancelled.
//! - operation: `chat_completions` → `chat`, the others → `text_completion`; model from
//!   `gen_ai.*` attributes if any, else `unknown` (TGI serves one model per router). A request
//!   TGI refused before recording any timing field (a 422, a 429) is a generic request; its
//!   operation is still its handler's ([`name_generic`]), so it counts in the same series.

use infertrace_semconv as sc;

use super::base_record::{prefill_end_is_first_token, ttft_at};
use super::trace_view::TraceView;
use crate::record::{Outcome, PhaseOrigin, RequestRecord, tpot_from};
use crate::trace::{AttrValue, Span};

/// The TGI timing fields.
const TIMING_FIELDS: [&str; 5] = [
    sc::tgi::TOTAL_TIME,
    sc::tgi::VALIDATION_TIME,
    sc::tgi::QUEUE_TIME,
    sc::tgi::INFERENCE_TIME,
    sc::tgi::TIME_PER_TOKEN,
];

/// True for TGI's request span names.
pub fn is_request_name(name: &str) -> bool {
    sc::span::TGI_REQUESTS.contains(&name)
}

/// True when the span carries at least one TGI timing field.
pub fn has_timing_fields(span: &Span) -> bool {
    TIMING_FIELDS.iter().any(|k| span.attr(k).is_some())
}

/// Parses a duration written as Rust's `Debug` of `Duration` (`"12.3ms"`, `"1.000000001s"`,
/// `"850µs"`, `"1.5us"`, `"12ns"`), compound forms (`"2m3s"`, `"1h 2m"`), or a bare number of
/// seconds. Returns seconds; `None` for anything else (negative, empty, unknown unit).
///
/// ```
/// use infertrace_analysis::dialect::parse_duration;
/// assert_eq!(parse_duration("12.5ms"), Some(0.0125));
/// assert_eq!(parse_duration("2m3s"), Some(123.0));
/// assert_eq!(parse_duration("soon"), None);
/// ```
pub fn parse_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(v) = s.parse::<f64>() {
        return (v.is_finite() && v >= 0.0).then_some(v);
    }
    let is_num = |c: char| c.is_ascii_digit() || c == '.';
    let mut rest = s;
    let mut total = 0.0;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !is_num(c)).unwrap_or(rest.len());
        if end == 0 {
            return None;
        }
        let value: f64 = rest[..end].parse().ok()?;
        rest = rest[end..].trim_start();
        let unit_end = rest
            .find(|c: char| is_num(c) || c.is_whitespace())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" | "hr" | "hrs" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = rest[unit_end..].trim_start();
    }
    total.is_finite().then_some(total)
}

/// Names the operation of `r`, a generic request's record, when its span or one of its children
/// is a TGI handler: TGI refuses a request (a validation error, a full queue) before it records
/// any timing field, so its span is generic, and it must count in the series of the requests
/// TGI served.
pub fn name_generic(span: &Span, trace: &TraceView<'_>, r: &mut RequestRecord) {
    if r.operation != crate::record::UNKNOWN {
        return;
    }
    let handler = if is_request_name(&span.name) {
        Some(span)
    } else {
        trace.children(span).find(|c| is_request_name(&c.name))
    };
    if let Some(h) = handler {
        r.operation = operation_of(h).into();
    }
}

/// A TGI timing field in seconds: a duration string, or a number of seconds.
pub fn field_seconds(span: &Span, key: &str) -> Option<f64> {
    match span.attr(key)? {
        AttrValue::Str(s) => parse_duration(s),
        v => v.as_f64().filter(|v| v.is_finite() && *v >= 0.0),
    }
}

/// The operation of a TGI handler: `chat_completions` → `chat`, the others →
/// `text_completion`.
fn operation_of(handler: &Span) -> &'static str {
    if handler.name == "chat_completions" {
        sc::gen_ai::operation::CHAT
    } else {
        sc::gen_ai::operation::TEXT_COMPLETION
    }
}

/// Completes `r`, the base record (common to every dialect) of a TGI request span.
pub fn refine(span: &Span, trace: &TraceView<'_>, r: &mut RequestRecord) {
    if r.operation == crate::record::UNKNOWN {
        r.operation = operation_of(span).into();
    }
    // TGI records its timing fields when it has served a request; a span that ended without
    // them and without an error is a stream its client dropped.
    if r.outcome == Outcome::Ok && !has_timing_fields(span) {
        r.outcome = Outcome::Cancelled;
    }
    let field = |k| field_seconds(span, k);
    if let Some(total) = field(sc::tgi::TOTAL_TIME) {
        r.e2e = total;
    }
    // A step still running when the request ended (a stream its client dropped) counts up to
    // that end: TGI's `queued` and `infer` spans outlive the handler's.
    let until_the_end = |step: &Span| {
        step.end_unix_nano
            .min(span.end_unix_nano)
            .saturating_sub(step.start_unix_nano) as f64
            / 1e9
    };
    r.queue = field(sc::tgi::QUEUE_TIME).or_else(|| {
        trace
            .descendants(span)
            .find(|d| d.name == sc::span::TGI_QUEUED)
            .map(until_the_end)
    });
    r.origins.queue = r.queue.map(|_| PhaseOrigin::Measured);
    r.inference = field(sc::tgi::INFERENCE_TIME);

    // The first batch step: the earliest `infer` span, and the `prefill` span of the batch it
    // links to when that batch's spans were given.
    let first_infer = trace
        .descendants(span)
        .filter(|d| d.name == sc::span::TGI_INFER)
        .min_by_key(|d| d.start_unix_nano);
    let batch_prefill = first_infer.and_then(|infer| {
        infer.links.iter().find_map(|link| {
            let batch = trace
                .get(link.span_id)
                .filter(|b| b.name == sc::span::TGI_BATCH)?;
            trace.children(batch).find(|c| c.name == sc::span::PREFILL)
        })
    });
    let prefill_step = batch_prefill
        .map(|p| (p, PhaseOrigin::Measured))
        .or_else(|| first_infer.map(|i| (i, PhaseOrigin::Derived)));
    let per_token = field(sc::tgi::TIME_PER_TOKEN).filter(|t| *t > 0.0);
    if r.output_tokens.is_none()
        && let (Some(inference), Some(per_token)) = (r.inference, per_token)
    {
        let n = (inference / per_token).round();
        if n.is_finite() && n >= 1.0 && n < u64::MAX as f64 {
            r.output_tokens = Some(n as u64);
        }
    }

    if let Some((step, origin)) = prefill_step {
        r.prefill = Some(until_the_end(step));
        r.origins.prefill = Some(origin);
        if prefill_end_is_first_token(r, span, Some(step.end_unix_nano)) {
            r.ttft = Some(ttft_at(span, step.end_unix_nano));
            r.origins.ttft = Some(origin);
        }
    }
    if let (Some(inference), Some(prefill)) = (r.inference, r.prefill) {
        let decode = (inference - prefill).max(0.0);
        r.decode = Some(decode);
        r.origins.decode = Some(PhaseOrigin::Derived);
        if let Some(n) = r.output_tokens {
            r.tpot = tpot_from(decode, n);
            r.origins.tpot = r.tpot.map(|_| PhaseOrigin::Derived);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() <= 1e-12 * b.max(1.0))
    }

    #[test]
    fn parses_rust_debug_durations() {
        use std::time::Duration;
        for d in [
            Duration::from_nanos(12),
            Duration::from_nanos(1_500),
            Duration::from_micros(850),
            Duration::from_micros(12_300),
            Duration::from_millis(1_200),
            Duration::from_nanos(1_000_000_001),
            Duration::from_secs(123),
            Duration::ZERO,
        ] {
            let s = format!("{d:?}");
            assert!(close(parse_duration(&s), d.as_secs_f64()), "{s}");
        }
    }

    #[test]
    fn parses_units_and_compound_forms() {
        assert!(close(parse_duration("12.3ms"), 0.0123));
        assert!(close(parse_duration("1.2s"), 1.2));
        assert!(close(parse_duration("850µs"), 850e-6));
        assert!(close(parse_duration("850μs"), 850e-6));
        assert!(close(parse_duration("1.5us"), 1.5e-6));
        assert!(close(parse_duration("12ns"), 12e-9));
        assert!(close(parse_duration("2m3s"), 123.0));
        assert!(close(parse_duration("1h 2m 3.5s"), 3723.5));
        assert!(close(parse_duration(" 0.25 "), 0.25));
        assert!(close(parse_duration("3 ms"), 0.003));
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            " ",
            "ms",
            "-5ms",
            "1.2.3s",
            "12parsecs",
            "NaN",
            "inf",
            "5 ms x",
        ] {
            assert_eq!(parse_duration(s), None, "{s:?}");
        }
    }
}
