//! What a span's arrival tells a collector about its trace (the dialects' rules, beside
//! [`detect`]): whether the trace's request has arrived, and whether a span arriving after the
//! trace was completed may be a request of its own.

use super::detection::detect;
use super::infertrace::is_worker_below;
use crate::record::Dialect;
use crate::trace::Span;

/// Whether `span`'s arrival tells a collector that its trace's request has arrived (its
/// grace period may start): a request span ([`detect`]) — but a disaggregated worker's below
/// another span ([`infertrace::is_worker_below`]), whose router's span ends last and may be
/// exported seconds after it.
///
/// [`infertrace::is_worker_below`]: super::infertrace::is_worker_below
pub fn completes_trace(span: &Span) -> bool {
    detect(span).is_some() && !is_worker_below(span)
}

/// Whether a span that [`completes_trace`], arriving after its trace was completed with a
/// request, may be a request of its own (an agent's next call in the trace: an infertrace,
/// vLLM or TGI request span, counted per service as on time) rather than a part of a request
/// counted already (an SGLang role span, a generic server span, a disaggregated worker's).
pub fn may_be_own_request(span: &Span) -> bool {
    matches!(
        detect(span),
        Some(Dialect::Infertrace | Dialect::Vllm | Dialect::Tgi)
    ) && !is_worker_below(span)
}

/// Whether a late span of a completed trace may stand for a request the trace's analysis did
/// not count: a generic server span, such as a gateway's in front of the engine whose exporter
/// sent after the grace period (a request of the gateway's service), or the engine's own
/// framework span (the engine's request, counted already). Unlike [`may_be_own_request`], it
/// does not re-open the trace: the collector analyses its stored trace with it, counts only a
/// request not counted, and the span stays a late span (it teaches the grace period).
pub fn may_be_late_request(span: &Span) -> bool {
    detect(span) == Some(Dialect::Generic)
}
