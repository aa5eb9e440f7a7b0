//! Which spans are request spans, and of which dialect (the detection rules of the
//! [module docs](super)): [`detect`] from a span alone, [`classify_detected`] with its trace.

use infertrace_semconv as sc;

use super::latency_attrs::LATENCY_KEYS;
use super::trace_view::TraceView;
use super::{sglang, tgi};
use crate::record::Dialect;
use crate::trace::{Span, SpanKind};

/// infertrace's own request attributes: any of them marks an infertrace request span.
const INFERTRACE_REQUEST_KEYS: [&str; 5] = [
    sc::infer::OUTCOME,
    sc::infer::PHASE_SOURCE,
    sc::infer::TIME_PER_OUTPUT_TOKEN,
    sc::infer::STREAM_CHUNKS,
    sc::infer::QUEUE_DEPTH,
];

/// Whether `span` is a request span, and of which dialect, from the span alone.
///
/// The collector's assembler uses it to know a trace's request span has arrived. A few request
/// spans are only recognisable with their trace ([`extract_requests`] sees those too): TGI
/// request spans of failed requests, and infertrace request spans stripped of `infer.*`.
///
/// [`extract_requests`]: super::extract_requests
pub fn detect(span: &Span) -> Option<Dialect> {
    if span.attr(sc::infer::PHASE).is_some() {
        return None; // an infertrace phase span, whatever else it carries
    }
    if span.name == sc::span::VLLM_REQUEST {
        return Some(Dialect::Vllm);
    }
    if INFERTRACE_REQUEST_KEYS
        .iter()
        .any(|k| span.attr(k).is_some())
    {
        return Some(Dialect::Infertrace);
    }
    if sglang::is_request_tree(span) {
        // The prefill side's role span ends long before the decode side's: it must not start
        // the grace period that completes the trace (the whole trace still classifies it).
        return (!sglang::is_prefill_role(span)).then_some(Dialect::Sglang);
    }
    if LATENCY_KEYS.iter().any(|k| span.attr(k).is_some()) {
        return Some(Dialect::Sglang);
    }
    if tgi::is_request_name(&span.name) && tgi::has_timing_fields(span) {
        return Some(Dialect::Tgi);
    }
    (span.kind == SpanKind::Server).then_some(Dialect::Generic)
}

/// [`detect`] extended with what the whole trace tells, and whether [`detect`] alone
/// recognised the span.
pub(super) fn classify_detected<'a>(
    trace: &TraceView<'a>,
    span: &'a Span,
) -> (Option<Dialect>, bool) {
    let detected = detect(span);
    (classify_with(trace, span, detected), detected.is_some())
}

/// The dialect of `span`, whose [`detect`] result is `detected`.
fn classify_with<'a>(
    trace: &TraceView<'a>,
    span: &'a Span,
    detected: Option<Dialect>,
) -> Option<Dialect> {
    if matches!(detected, Some(d) if d != Dialect::Generic) {
        return detected;
    }
    if sglang::is_role_request(span) {
        return Some(Dialect::Sglang);
    }
    if tgi::is_request_name(&span.name)
        && !trace.ancestors(span).any(|a| tgi::is_request_name(&a.name))
        && trace
            .descendants(span)
            .any(|d| d.name == sc::span::TGI_QUEUED || d.name == sc::span::TGI_INFER)
    {
        return Some(Dialect::Tgi);
    }
    if span.kind == SpanKind::Server
        && trace
            .children(span)
            .any(|c| c.attr(sc::infer::PHASE).is_some())
    {
        return Some(Dialect::Infertrace);
    }
    detected
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::test_spans::span;

    #[test]
    fn phase_spans_are_never_requests() {
        let mut s = span(1, None);
        s.kind = SpanKind::Server;
        assert_eq!(detect(&s), Some(Dialect::Generic));
        s.attributes.push((
            sc::infer::PHASE,
            crate::trace::AttrValue::Str("queue".into()),
        ));
        s.attributes.push((
            sc::infer::PHASE_SOURCE,
            crate::trace::AttrValue::Str("engine".into()),
        ));
        assert_eq!(detect(&s), None);
    }
}
