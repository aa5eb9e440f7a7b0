//! OTLP/JSON: the protobuf JSON mapping with OTLP's differences (trace and span ids as hex
//! strings, enums as integers, 64-bit integers as decimal strings or numbers, lowerCamelCase
//! keys, unknown keys ignored). `opentelemetry-proto`'s `with-serde` derives implement exactly
//! that mapping, so a body is read into its types and converted with [`from_proto`].

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::decoded::{DecodeError, Decoded};
use super::reference::from_proto;

/// Decodes an OTLP/JSON `ExportTraceServiceRequest` into spans (see the [module rules](super)).
pub fn decode_json(buf: &[u8]) -> Result<Decoded, DecodeError> {
    let req: ExportTraceServiceRequest =
        serde_json::from_slice(buf).map_err(|e| DecodeError::Json(e.to_string()))?;
    Ok(from_proto(&req))
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_analysis::trace::{AttrValue, SpanId, SpanKind, StatusCode, TraceId};
    use infertrace_semconv as sc;

    /// An OTLP/JSON body as the OpenTelemetry SDKs write it (ids hex, enums integers, int64 as
    /// strings), with an unknown key thrown in.
    const BODY: &str = r#"{
      "resourceSpans": [{
        "resource": {"attributes": [
          {"key": "service.name", "value": {"stringValue": "vllm-a"}},
          {"key": "host.name", "value": {"stringValue": "h1"}}
        ]},
        "scopeSpans": [{
          "scope": {"name": "vllm"},
          "spans": [{
            "traceId": "5B8EFFF798038103D269B633813FC60C",
            "spanId": "EEE19B7EC3C1B174",
            "parentSpanId": "",
            "name": "llm_request",
            "kind": 2,
            "startTimeUnixNano": "1544712660000000000",
            "endTimeUnixNano": 1544712661000000000,
            "attributes": [
              {"key": "gen_ai.latency.time_in_queue", "value": {"doubleValue": 0.25}},
              {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "17"}},
              {"key": "gen_ai.request.stream", "value": {"boolValue": true}},
              {"key": "gen_ai.response.finish_reasons", "value": {"arrayValue": {"values": [{"stringValue": "stop"}]}}},
              {"key": "dropped.attr", "value": {"stringValue": "x"}}
            ],
            "links": [{"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "0000000000000001"}],
            "status": {"code": 2, "message": "boom"},
            "someFutureField": {"x": 1}
          }, {
            "traceId": "00000000000000000000000000000000",
            "spanId": "EEE19B7EC3C1B175",
            "name": "bad",
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2"
          }]
        }]
      }]
    }"#;

    #[test]
    fn decodes_the_otlp_json_mapping() {
        let d = decode_json(BODY.as_bytes()).unwrap();
        assert_eq!(d.rejected, 1);
        assert_eq!(d.spans.len(), 1);
        let s = &d.spans[0];
        assert_eq!(
            s.trace_id,
            TraceId::from_hex("5b8efff798038103d269b633813fc60c").unwrap()
        );
        assert_eq!(s.span_id, SpanId::from_hex("eee19b7ec3c1b174").unwrap());
        assert_eq!(s.parent_span_id, None);
        assert_eq!(&*s.service, "vllm-a");
        assert_eq!(s.kind, SpanKind::Server);
        assert_eq!(s.status, StatusCode::Error);
        assert_eq!(s.start_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(s.end_unix_nano, 1_544_712_661_000_000_000);
        assert_eq!(s.attr_f64(sc::latency::TIME_IN_QUEUE), Some(0.25));
        assert_eq!(
            s.attr(sc::gen_ai::USAGE_COMPLETION_TOKENS),
            Some(&AttrValue::Int(17))
        );
        assert_eq!(
            s.attr(sc::gen_ai::REQUEST_STREAM),
            Some(&AttrValue::Bool(true))
        );
        assert_eq!(
            s.attr(sc::gen_ai::RESPONSE_FINISH_REASONS),
            Some(&AttrValue::StrArray(vec!["stop".into()]))
        );
        assert_eq!(s.attributes.len(), 4);
        assert_eq!(s.links.len(), 1);
    }

    #[test]
    fn malformed_json_is_an_error() {
        assert!(matches!(
            decode_json(b"{\"resourceSpans\": ["),
            Err(DecodeError::Json(_))
        ));
        assert!(matches!(
            decode_json(br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}"#),
            Err(DecodeError::Json(_))
        ));
        assert_eq!(decode_json(b"{}").unwrap(), Decoded::default());
    }
}
