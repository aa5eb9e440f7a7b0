//! The layer's own spans straight to OTLP/HTTP protobuf, for infertrace's batch processor when
//! `otlp::init` built it with the HTTP/protobuf protocol.
//!
//! The export thread encodes each finished request from the compact form the layer hands over
//! ([`RequestEncoder`], [`writer`] for the protobuf primitives) instead of building four
//! `SpanData` that opentelemetry-otlp would convert to prost structs (a `String` copy of every
//! key and value) and then encode. The body goes out through opentelemetry-otlp's own exporter
//! ([`EncodingClient`]), with the handler's spans of the same batch, if any.

mod request;
mod transport;
mod writer;

use bytes::Bytes;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::RandomIdGenerator;

pub(crate) use request::RequestEncoder;
pub(crate) use transport::{EncodingClient, Staged, blocking_client};

use crate::export::batch::RequestExport;
use crate::export::span_data::DirectSpan;
use crate::finished::FinishedRequest;

/// The batch processor's [`RequestExport`]: encodes requests, stages the body for the
/// exporter's next request.
#[derive(Debug)]
pub(crate) struct OtlpRequests {
    encoder: RequestEncoder,
    staged: Staged,
}

impl OtlpRequests {
    /// Encodes spans of `resource` (the exporter's) and stages them in `staged` (shared with
    /// the exporter's [`EncodingClient`]).
    pub(crate) fn new(resource: &Resource, staged: Staged) -> Self {
        Self {
            encoder: RequestEncoder::new(resource),
            staged,
        }
    }
}

impl RequestExport for OtlpRequests {
    fn push(&mut self, span: DirectSpan, request: FinishedRequest, ids: &RandomIdGenerator) {
        self.encoder.push(span, request, ids);
    }

    fn stage(&mut self, with_other_spans: bool) -> usize {
        let spans = self.encoder.span_count();
        if spans > 0 {
            let mut body = Vec::new();
            self.encoder.finish(&mut body);
            self.staged.set(Bytes::from(body), !with_other_spans);
        }
        spans
    }

    fn unstage(&mut self) {
        self.staged.clear();
    }
}

#[cfg(test)]
mod tests {
    //! The encoder against what opentelemetry-otlp sends for the same requests: the
    //! `SpanData` of `span_data::request_spans`, converted by opentelemetry-proto and encoded
    //! by prost (`OtlpHttpClient::build_trace_export_body`). Bytes and decoded messages.

    use std::borrow::Cow;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry::{Array, KeyValue, StringValue, Value};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{IdGenerator, SpanData};
    use prost::Message as _;

    use super::*;
    use crate::end_attributes::{EndAttributes, StatusCode};
    use crate::export::span_data;
    use crate::finished::PhaseSpans;
    use crate::request_facts::{RequestFacts, StartAttributes};

    /// Span ids 1, 2, 3, … (the phase spans' ids must match on both sides).
    #[derive(Debug, Default)]
    struct Counting(AtomicU64);

    impl IdGenerator for Counting {
        fn new_trace_id(&self) -> TraceId {
            TraceId::from(u128::from(self.0.fetch_add(1, Ordering::Relaxed) + 1))
        }
        fn new_span_id(&self) -> SpanId {
            SpanId::from(self.0.fetch_add(1, Ordering::Relaxed) + 1)
        }
    }

    fn at(us: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(1_800_000_000_000_000 + us)
    }

    /// One request of the layer, as a test case builds it (twice: both paths consume it).
    #[derive(Clone)]
    struct Case {
        grpc: bool,
        path: String,
        user_agent: Option<String>,
        model: Option<String>,
        late_model: Option<String>,
        flags: TraceFlags,
        parent: Option<(SpanId, bool, TraceState)>,
        sampler_attributes: Vec<KeyValue>,
        phases: Vec<(usize, u64, u64, Option<Vec<KeyValue>>)>,
        end: fn() -> EndAttributes,
    }

    impl Case {
        fn base() -> Self {
            Self {
                grpc: false,
                path: "/v1/chat/completions".into(),
                user_agent: Some("bench/1.0".into()),
                model: Some("llama-3.1-8b".into()),
                late_model: None,
                flags: TraceFlags::SAMPLED,
                parent: None,
                sampler_attributes: Vec::new(),
                phases: vec![(0, 0, 100, None), (1, 100, 900, None), (2, 900, 5000, None)],
                end: || EndAttributes {
                    e2e: 0.005,
                    outcome: "ok",
                    status: Some(StatusCode::Http(200)),
                    ..EndAttributes::default()
                },
            }
        }

        fn build(&self) -> (DirectSpan, FinishedRequest) {
            let mut builder = http::Request::builder()
                .method("POST")
                .uri(self.path.as_str())
                .header("host", "localhost:8080");
            if self.grpc {
                builder = builder.header("content-type", "application/grpc");
            }
            if let Some(ua) = &self.user_agent {
                builder = builder.header("user-agent", ua.as_str());
            }
            let request = builder.body(()).unwrap_or_default();
            let facts = RequestFacts {
                operation: Cow::Borrowed(if self.grpc {
                    "generate_content"
                } else {
                    "chat"
                }),
                provider: "self_hosted".into(),
                request_model: self.model.clone().map(StringValue::from),
                grpc: self.grpc,
            };
            let (parent_span_id, parent_span_is_remote, trace_state) = self
                .parent
                .clone()
                .unwrap_or((SpanId::INVALID, false, TraceState::NONE));
            let span = DirectSpan {
                context: SpanContext::new(
                    TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736_u128),
                    SpanId::from(0x00f0_67aa_0ba9_02b7_u64),
                    self.flags,
                    false,
                    trace_state,
                ),
                parent_span_id,
                parent_span_is_remote,
                name: facts.span_name(),
                start: at(0),
                start_attributes: Some(StartAttributes::of_request(&request, &facts)),
                attributes: self.sampler_attributes.clone(),
                recording: true,
            };
            let mut phases = PhaseSpans::default();
            for (i, start, end, attributes) in &self.phases {
                phases.set(*i, at(*start), at(*end), attributes.clone());
            }
            let finished = FinishedRequest {
                end: at(5000),
                late_model: self
                    .late_model
                    .clone()
                    .map(|m| (Cow::Owned(format!("chat {m}")), StringValue::from(m))),
                end_attributes: (self.end)(),
                phases,
            };
            (span, finished)
        }
    }

    fn resource() -> Resource {
        Resource::builder_empty()
            .with_attributes([
                KeyValue::new("service.name", "svc-ünïcode"),
                KeyValue::new("service.instance.id", "i-1"),
                KeyValue::new("host.cores", 2_i64),
                KeyValue::new("sampled.share", 0.25),
                KeyValue::new("feature.on", true),
            ])
            .with_schema_url(
                Vec::<KeyValue>::new(),
                "https://opentelemetry.io/schemas/1.30.0",
            )
            .build()
    }

    /// What opentelemetry-otlp's HTTP exporter encodes for `cases` (one export).
    fn sdk_body(cases: &[Case], resource: &Resource) -> Vec<u8> {
        let ids = Counting::default();
        let mut spans: Vec<SpanData> = Vec::new();
        for case in cases {
            let (span, request) = case.build();
            span_data::request_spans(span, request, &ids, |d| spans.push(d));
        }
        let resource = ResourceAttributesWithSchema::from(resource);
        ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(spans, &resource),
        }
        .encode_to_vec()
    }

    /// What the encoder makes of `cases`.
    fn our_body(cases: &[Case], resource: &Resource) -> (Vec<u8>, usize) {
        let ids = Counting::default();
        let mut encoder = RequestEncoder::new(resource);
        let mut spans = 0;
        for case in cases {
            let (span, request) = case.build();
            spans += encoder.push(span, request, &ids);
        }
        assert_eq!(encoder.span_count(), spans);
        let mut body = Vec::new();
        encoder.finish(&mut body);
        assert_eq!(encoder.span_count(), 0, "starts over");
        (body, spans)
    }

    fn assert_same(cases: &[Case]) {
        let resource = resource();
        let theirs = sdk_body(cases, &resource);
        let (ours, spans) = our_body(cases, &resource);
        let decoded = ExportTraceServiceRequest::decode(&ours[..]).expect("our body decodes");
        let expected = ExportTraceServiceRequest::decode(&theirs[..]).expect("theirs decodes");
        // Field by field first (a readable diff), then the bytes.
        assert_eq!(decoded.resource_spans.len(), expected.resource_spans.len());
        for (a, b) in decoded.resource_spans.iter().zip(&expected.resource_spans) {
            assert_eq!(a.resource, b.resource);
            assert_eq!(a.schema_url, b.schema_url);
            assert_eq!(a.scope_spans.len(), b.scope_spans.len());
            for (x, y) in a.scope_spans.iter().zip(&b.scope_spans) {
                assert_eq!(x.scope, y.scope);
                assert_eq!(x.schema_url, y.schema_url);
                assert_eq!(x.spans.len(), spans);
                assert_eq!(x.spans.len(), y.spans.len());
                for (s, t) in x.spans.iter().zip(&y.spans) {
                    assert_eq!(s, t, "span {}", t.name);
                }
            }
        }
        assert_eq!(decoded, expected);
        assert_eq!(ours, theirs, "byte for byte");
    }

    fn gpu_counters(phase: &'static str) -> Option<Vec<KeyValue>> {
        Some(vec![
            KeyValue::new("infer.phase", phase),
            KeyValue::new("gpu.utilization.mean", 0.9),
            KeyValue::new("gpu.memory.used.max", 20_000_000_000_i64),
            KeyValue::new("gpu.energy.attributed", -0.0),
            KeyValue::new("gpu.throttled", false),
            KeyValue::new(
                "gpu.devices",
                Value::Array(Array::String(vec!["GPU-0".into(), "GPU-1".into()])),
            ),
            KeyValue::new("gpu.ids", Value::Array(Array::I64(vec![0, 1]))),
        ])
    }

    #[test]
    fn a_plain_non_streamed_request_encodes_as_the_sdk_exporter_does() {
        let mut case = Case::base();
        case.phases = vec![(0, 0, 100, None), (3, 100, 5000, None)];
        assert_same(&[case]);
    }

    #[test]
    fn a_streamed_request_with_every_attribute_and_gpu_counters() {
        let mut case = Case::base();
        case.parent = Some((
            SpanId::from(0x0102_0304_0506_0708_u64),
            true,
            TraceState::from_key_value([("vendor", "v"), ("other", "x")]).unwrap_or_default(),
        ));
        case.sampler_attributes = vec![KeyValue::new("sampler.rule", "keep")];
        case.phases = vec![
            (0, 0, 100, gpu_counters("queue")),
            (1, 100, 900, None),
            (2, 900, 5000, gpu_counters("decode")),
        ];
        case.end = || EndAttributes {
            response_model: Some("llama-3.1-8b-instruct".into()),
            max_tokens: Some(256),
            streamed: Some(true),
            response_id: Some(Arc::from("chatcmpl-1")),
            finish_reason: Some(Arc::from("stop")),
            input_tokens: Some(12),
            output_tokens: Some(300),
            cache_read_input_tokens: Some(8),
            status: Some(StatusCode::Http(200)),
            queue: Some(0.0001),
            ttft: Some(0.0009),
            prefill: Some(0.0008),
            decode: Some(0.0041),
            inference: Some(0.0049),
            e2e: 0.005,
            tpot: Some(0.000_013_7),
            time_to_first_chunk: Some(0.001),
            gaps: Some((Some(0.00001), Some(0.0001), None)),
            chunks: 301,
            outcome: "ok",
            phase_source: Some("engine"),
            queue_depth: Some(3),
            error_type: None,
        };
        assert_same(&[case]);
    }

    #[test]
    fn errors_cancellations_and_late_models() {
        let mut error = Case::base();
        error.end = || EndAttributes {
            e2e: 0.5,
            chunks: 3,
            outcome: "error",
            status: Some(StatusCode::Http(500)),
            error_type: Some(Cow::Borrowed("engine_oom")),
            ..EndAttributes::default()
        };
        let mut cancelled = Case::base();
        cancelled.phases = vec![(0, 0, 100, None)];
        cancelled.end = || EndAttributes {
            e2e: 0.0001,
            outcome: "cancelled",
            error_type: Some(Cow::Borrowed("cancelled")),
            ..EndAttributes::default()
        };
        let mut late = Case::base();
        late.model = None;
        late.late_model = Some("m2".into());
        let mut grpc = Case::base();
        grpc.grpc = true;
        grpc.path = "/inference.Engine/Generate".into();
        grpc.end = || EndAttributes {
            e2e: 0.01,
            outcome: "error",
            status: Some(StatusCode::Grpc(8)),
            error_type: Some(Cow::Borrowed("RESOURCE_EXHAUSTED")),
            ..EndAttributes::default()
        };
        // One export of all four: one scope, the spans in order.
        assert_same(&[error, cancelled, late, grpc]);
    }

    #[test]
    fn a_record_only_span_under_an_unsampled_parent_has_no_phase_spans() {
        let mut case = Case::base();
        case.flags = TraceFlags::default();
        case.parent = Some((SpanId::from(7_u64), true, TraceState::NONE));
        let (_, spans) = our_body(std::slice::from_ref(&case), &resource());
        assert_eq!(spans, 1);
        assert_same(&[case]);
    }

    #[test]
    fn long_and_non_ascii_strings_are_kept_whole() {
        let mut case = Case::base();
        case.model = Some(format!("模型-größe-{}", "x".repeat(20_000)));
        case.path = format!("/v1/chat/completions/{}", "p".repeat(5_000));
        case.user_agent = Some("agent ✓".into());
        case.end = || EndAttributes {
            e2e: 0.5,
            outcome: "ok",
            response_id: Some(Arc::from("r".repeat(70_000).as_str())),
            finish_reason: Some(Arc::from("länge")),
            ..EndAttributes::default()
        };
        assert_same(&[case]);
    }

    #[test]
    fn an_empty_resource_and_no_user_agent() {
        let mut case = Case::base();
        case.user_agent = None;
        let resource = Resource::builder_empty().build();
        let theirs = sdk_body(std::slice::from_ref(&case), &resource);
        let (ours, _) = our_body(&[case], &resource);
        assert_eq!(ours, theirs);
    }

    #[test]
    fn spans_of_every_size_in_one_body_get_the_shortest_lengths() {
        // Each span's length is written in the room the previous one of its kind needed:
        // request spans whose lengths take 2, then 3, then 2 bytes, and phase spans whose
        // lengths cross 127 bytes both ways (GPU counters or not), all in one body.
        let mut tiny = Case::base();
        tiny.model = None;
        tiny.user_agent = None;
        tiny.path = "/".into();
        tiny.phases = vec![(0, 0, 100, None)];
        tiny.end = || EndAttributes {
            e2e: 0.5,
            outcome: "ok",
            ..EndAttributes::default()
        };
        let mut huge = Case::base();
        huge.path = format!("/v1/{}", "p".repeat(20_000));
        huge.phases = vec![
            (0, 0, 100, gpu_counters("queue")),
            (1, 100, 900, None),
            (2, 900, 5000, gpu_counters("decode")),
        ];
        assert_same(&[tiny.clone(), huge, Case::base(), tiny, Case::base()]);
    }
}
