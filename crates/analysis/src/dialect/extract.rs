//! Request records from one trace's spans: classify every span, keep one request span per
//! request, and let its dialect fill the record.

use smallvec::SmallVec;

use super::base_record::base_record;
use super::detection::classify_detected;
use super::trace_view::TraceView;
use super::{infertrace, latency_attrs, sglang, tgi};
use crate::record::{Dialect, RequestRecord};
use crate::trace::Span;

/// Every request record in one trace's spans (order: request spans in slice order).
pub fn extract_requests(spans: &[Span]) -> Vec<RequestRecord> {
    extract_requests_detected::<Vec<_>>(spans).0
}

/// [`extract_requests`], and whether a span among `spans` [`completes_trace`] (what a collector
/// needs to know to complete the trace after its grace period), in the same pass. The records
/// are collected into `C` (a collector holding one trace's records for seconds keeps them
/// inline rather than in a vector of their own).
///
/// [`completes_trace`]: super::completes_trace
pub fn extract_requests_detected<C: Default + RecordSink>(spans: &[Span]) -> (C, bool) {
    let mut records = C::default();
    let detected = extract_requests_into(spans, &mut records);
    (records, detected)
}

/// [`extract_requests_detected`] appending to `out`, each record written in place (a record is
/// ~300 bytes: built on the stack and moved from call to call, it was copied several times);
/// returns whether a span [`completes_trace`] (from the detection made here anyway).
///
/// [`completes_trace`]: super::completes_trace
pub fn extract_requests_into(spans: &[Span], out: &mut impl RecordSink) -> bool {
    let trace = TraceView::new(spans);
    // A trace has one or two request spans as a rule: no allocation for those.
    let mut specific: SmallVec<[(usize, Dialect); 4]> = SmallVec::new();
    let mut generic: SmallVec<[usize; 4]> = SmallVec::new();
    let mut detected_any = false;
    for (i, span) in spans.iter().enumerate() {
        let (class, detected) = classify_detected(&trace, span);
        detected_any |= detected && !infertrace::is_worker_below(span);
        match class {
            Some(Dialect::Generic) => generic.push(i),
            Some(d) => specific.push((i, d)),
            None => {}
        }
    }
    // SGLang: the room span is the request; its role spans (of any service) are part of it.
    specific.retain(|&mut (i, d)| {
        d != Dialect::Sglang
            || !sglang::is_request_tree(&spans[i])
            || !sglang::is_part_of_other(&spans[i], i, &trace)
    });
    // infertrace across services: a prefill / decode worker's request span below another
    // role-marked request span is part of that request.
    specific.retain(|&mut (i, d)| {
        d != Dialect::Infertrace || !infertrace::is_worker_part(&spans[i], &trace)
    });
    // One request, one record: a request span nested in a same-service request span of the same
    // dialect (SGLang's latency attributes on nested spans, two layers stacked) is not another
    // request; the outermost stands.
    let nested: SmallVec<[usize; 4]> = specific
        .iter()
        .filter(|&&(i, d)| {
            specific.iter().any(|&(j, e)| {
                j != i
                    && e == d
                    && spans[j].service == spans[i].service
                    && trace.is_ancestor(&spans[j], &spans[i])
            })
        })
        .map(|&(i, _)| i)
        .collect();
    specific.retain(|(i, _)| !nested.contains(i));
    // A generic server span of a service whose request span it encloses or lies in is the same
    // request; so is, for each request span, the sibling server span of its service that
    // overlaps it most (an HTTP framework's span beside an engine's own: vLLM under
    // `opentelemetry-instrument` continues the client's context, so the two are siblings).
    // Other overlapping server spans are requests of their own (a concurrent one that failed).
    let overlap = |a: &Span, b: &Span| {
        a.end_unix_nano
            .min(b.end_unix_nano)
            .saturating_sub(a.start_unix_nano.max(b.start_unix_nano))
    };
    let mut beside: SmallVec<[usize; 4]> = SmallVec::new();
    for &(s, _) in &specific {
        let ss = &spans[s];
        let closest = generic
            .iter()
            .copied()
            .filter(|g| !beside.contains(g))
            .filter(|&g| {
                let gs = &spans[g];
                gs.service == ss.service
                    && gs.parent_span_id == ss.parent_span_id
                    && overlap(gs, ss) > 0
            })
            .max_by_key(|&g| overlap(&spans[g], ss));
        beside.extend(closest);
    }
    generic.retain(|g| {
        !beside.contains(g)
            && !specific.iter().any(|&(s, _)| {
                let (gs, ss) = (&spans[*g], &spans[s]);
                gs.service == ss.service && (trace.is_ancestor(gs, ss) || trace.is_ancestor(ss, gs))
            })
    });
    let mut all = specific;
    all.extend(generic.into_iter().map(|g| (g, Dialect::Generic)));
    all.sort_by_key(|&(i, _)| i);
    for (i, d) in all {
        let span = &spans[i];
        let r = out.push_record(base_record(span, d, &trace));
        match d {
            Dialect::Infertrace => infertrace::refine(span, &trace, r),
            Dialect::Sglang if sglang::is_request_tree(span) => sglang::refine(span, &trace, r),
            Dialect::Vllm | Dialect::Sglang => latency_attrs::refine(span, r),
            Dialect::Tgi => tgi::refine(span, &trace, r),
            Dialect::Generic => tgi::name_generic(span, &trace, r),
        }
        r.cap_at_e2e();
    }
    detected_any
}

/// A vector of request records that [`extract_requests_into`] appends to (`Vec`, `SmallVec`).
pub trait RecordSink {
    /// Appends `r` and returns it, in its place.
    fn push_record(&mut self, r: RequestRecord) -> &mut RequestRecord;
}

impl<V> RecordSink for V
where
    V: Extend<RequestRecord> + std::ops::DerefMut<Target = [RequestRecord]>,
{
    fn push_record(&mut self, r: RequestRecord) -> &mut RequestRecord {
        let at = self.len();
        self.extend(std::iter::once(r));
        &mut self[at]
    }
}

#[cfg(test)]
mod tests {
    use infertrace_semconv as sc;

    use super::*;
    use crate::dialect::test_spans::span;
    use crate::trace::SpanKind;

    #[test]
    fn extraction_says_whether_the_detector_found_a_request_span() {
        // Nothing recognisable.
        assert_eq!(
            extract_requests_detected(&[span(1, None)]),
            (Vec::new(), false)
        );
        // A server span: detected (generic).
        let mut server = span(1, None);
        server.kind = SpanKind::Server;
        let (records, detected) =
            extract_requests_detected::<Vec<_>>(std::slice::from_ref(&server));
        assert_eq!((records.len(), detected), (1, true));
        // A TGI request known only by its children: a record, but not detected on its own.
        let mut request = span(1, None);
        request.name = "generate".into();
        let mut queued = span(2, Some(1));
        queued.name = sc::span::TGI_QUEUED.into();
        let spans = [request, queued];
        let (records, detected) = extract_requests_detected::<Vec<_>>(&spans);
        assert_eq!((records.len(), detected), (1, false));
        assert_eq!(records, extract_requests(&spans));
    }
}
