//! Fuzzes the lean OTLP protobuf decoder against prost: it must never panic, and whenever prost
//! accepts the bytes, the lean decoder must accept them too and produce exactly what
//! `from_proto` makes of prost's result (compared through `Debug` so a NaN equals itself), and
//! each span must decode again from its range of the body to the same span; and the body
//! without the rejected spans (`without_spans`) must be what prost reads, filtered by
//! `retain_accepted`.
#![no_main]

use infertrace_analysis::text::Interner;
use infertrace_collector::otlp_decode::{
    DecodeError, count_spans, decode_protobuf, decode_span, from_proto, retain_accepted,
    without_spans,
};
use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let lean = decode_protobuf(data);
    let counted = count_spans(data);
    if let Ok(reference) = ExportTraceServiceRequest::decode(data) {
        let lean = lean.expect("prost accepted a body the lean decoder refused");
        let reference_spans = from_proto(&reference);
        assert_eq!(
            format!("{:?}", (&lean.spans, lean.rejected, &lean.first_error)),
            format!(
                "{:?}",
                (&reference_spans.spans, reference_spans.rejected, &reference_spans.first_error)
            )
        );
        // Each span decodes again from its range of the body alone.
        let mut interner = Interner::default();
        assert_eq!(lean.span_ranges.len(), lean.spans.len());
        for (span, range) in lean.spans.iter().zip(&lean.span_ranges) {
            let bytes = range.of(data).expect("a span range lies outside the body");
            let again = decode_span(bytes, &span.service, &mut interner);
            assert_eq!(format!("{again:?}"), format!("{:?}", Ok::<_, DecodeError>(Some(span))));
        }
        let total: usize = reference
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        assert_eq!(counted, Some(total as u64));
        let cut = without_spans(data, &lean.rejected_ranges).expect("the cut failed");
        let mut filtered = reference.clone();
        assert_eq!(retain_accepted(&mut filtered), lean.rejected as usize);
        assert_eq!(ExportTraceServiceRequest::decode(&cut[..]).ok(), Some(filtered));
    }
});
