//! Fuzzes the lean OTLP protobuf decoder against prost: it must never panic, and whenever prost
//! accepts the bytes, the lean decoder must accept them too and produce exactly what
//! `from_proto` makes of prost's result (compared through `Debug` so a NaN equals itself).
#![no_main]

use infertrace_collector::otlp_decode::{count_spans, decode_protobuf, from_proto};
use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let lean = decode_protobuf(data);
    let counted = count_spans(data);
    if let Ok(reference) = ExportTraceServiceRequest::decode(data) {
        let lean = lean.expect("prost accepted a body the lean decoder refused");
        assert_eq!(format!("{lean:?}"), format!("{:?}", from_proto(&reference)));
        let total: usize = reference
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        assert_eq!(counted, Some(total as u64));
    }
});
