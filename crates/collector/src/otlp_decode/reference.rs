//! The reference conversion from `opentelemetry-proto`'s generated types, with the same rules as
//! the lean decoder. Used for OTLP/JSON and as the ground truth the lean decoder is tested against.

use infertrace_analysis::trace::{
    AttrValue, Span, SpanKind, StatusCode, UNKNOWN_SERVICE, known_key,
};
use infertrace_semconv::resource::SERVICE_NAME;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};

use infertrace_analysis::text::Interner;

use super::{Decoded, intern_value, valid_link, validate_span, with_interner};

/// Converts a decoded `ExportTraceServiceRequest` into spans (see the [module rules](super)).
pub fn from_proto(req: &ExportTraceServiceRequest) -> Decoded {
    with_interner(|interner| convert(req, interner))
}

fn convert(req: &ExportTraceServiceRequest, interner: &mut Interner) -> Decoded {
    let mut out = Decoded::default();
    for resource_spans in &req.resource_spans {
        let service = interner.intern(
            resource_spans
                .resource
                .as_ref()
                .and_then(|r| service_name(&r.attributes))
                .unwrap_or(UNKNOWN_SERVICE),
        );
        for span in resource_spans.scope_spans.iter().flat_map(|s| &s.spans) {
            let ids = match validate_span(
                &span.trace_id,
                &span.span_id,
                &span.parent_span_id,
                span.start_time_unix_nano,
                span.end_time_unix_nano,
            ) {
                Ok(ids) => ids,
                Err(why) => {
                    out.reject(why);
                    continue;
                }
            };
            out.spans.push(Span {
                trace_id: ids.trace_id,
                span_id: ids.span_id,
                parent_span_id: ids.parent_span_id,
                name: interner.intern(&span.name),
                service: service.clone(),
                kind: SpanKind::from_otlp(span.kind),
                start_unix_nano: span.start_time_unix_nano,
                end_unix_nano: span.end_time_unix_nano,
                status: StatusCode::from_otlp(span.status.as_ref().map_or(0, |s| s.code)),
                attributes: span
                    .attributes
                    .iter()
                    .filter_map(|kv| {
                        let key = known_key(kv.key.as_bytes())?;
                        Some((key, attr_value(key, kv.value.as_ref()?, interner)?))
                    })
                    .collect(),
                links: span
                    .links
                    .iter()
                    .filter_map(|l| valid_link(&l.trace_id, &l.span_id))
                    .collect(),
            });
        }
    }
    out
}

/// The first string-valued `service.name`.
fn service_name(attributes: &[KeyValue]) -> Option<&str> {
    attributes.iter().find_map(|kv| {
        if kv.key != SERVICE_NAME {
            return None;
        }
        match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        }
    })
}

/// The kept form of a value, `None` for kinds infertrace drops.
fn attr_value(key: &'static str, value: &AnyValue, interner: &mut Interner) -> Option<AttrValue> {
    Some(match value.value.as_ref()? {
        Value::StringValue(s) => AttrValue::Str(intern_value(key, s.as_bytes(), interner).ok()?),
        Value::BoolValue(b) => AttrValue::Bool(*b),
        Value::IntValue(i) => AttrValue::Int(*i),
        Value::DoubleValue(d) => AttrValue::Double(*d),
        Value::ArrayValue(array) => AttrValue::StrArray(
            array
                .values
                .iter()
                .map(|v| match v.value.as_ref()? {
                    Value::StringValue(s) => Some(interner.intern(s)),
                    _ => None,
                })
                .collect::<Option<_>>()?,
        ),
        Value::KvlistValue(_) | Value::BytesValue(_) | Value::StringValueStrindex(_) => {
            return None;
        }
    })
}
