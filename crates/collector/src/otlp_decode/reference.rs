//! The reference conversion from `opentelemetry-proto`'s generated types, with the same rules as
//! the lean decoder. Used for OTLP/JSON and as the ground truth the lean decoder is tested against.

use infertrace_analysis::trace::{
    AttrValue, Span, SpanKind, StatusCode, UNKNOWN_SERVICE, known_key,
};
use infertrace_semconv::resource::SERVICE_NAME;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};

use infertrace_analysis::text::Interner;

use opentelemetry_proto::tonic::trace::v1::Span as ProtoSpan;

use super::{
    Decoded, InvalidSpan, MAX_VALUE_NESTING, ValidIds, intern_value, valid_link, validate_span,
    with_interner,
};

/// Converts a decoded `ExportTraceServiceRequest` into spans (see the [module rules](super)).
pub fn from_proto(req: &ExportTraceServiceRequest) -> Decoded {
    with_interner(|interner| convert(req, interner))
}

fn convert(req: &ExportTraceServiceRequest, interner: &mut Interner) -> Decoded {
    let mut out = Decoded::default();
    for resource_spans in &req.resource_spans {
        let resource_too_deep = resource_spans
            .resource
            .as_ref()
            .is_some_and(|r| too_deep(&r.attributes));
        let service = interner.intern(
            resource_spans
                .resource
                .as_ref()
                .and_then(|r| service_name(&r.attributes))
                .unwrap_or(UNKNOWN_SERVICE),
        );
        for scope_spans in &resource_spans.scope_spans {
            let outer_too_deep = resource_too_deep
                || scope_spans
                    .scope
                    .as_ref()
                    .is_some_and(|s| too_deep(&s.attributes));
            for span in &scope_spans.spans {
                let ids = match check_span(span, outer_too_deep) {
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
    }
    out
}

/// The rules of the lean decoder for one span; `outer_too_deep` when its resource's or scope's
/// attributes nest too deep.
fn check_span(span: &ProtoSpan, outer_too_deep: bool) -> Result<ValidIds, InvalidSpan> {
    let ids = validate_span(
        &span.trace_id,
        &span.span_id,
        &span.parent_span_id,
        span.start_time_unix_nano,
        span.end_time_unix_nano,
    )?;
    if outer_too_deep
        || too_deep(&span.attributes)
        || span.events.iter().any(|e| too_deep(&e.attributes))
        || span.links.iter().any(|l| too_deep(&l.attributes))
    {
        return Err(InvalidSpan::TooDeep);
    }
    Ok(ids)
}

/// Leaves out of `req` the spans [`from_proto`] rejects, and any `ScopeSpans` (then
/// `ResourceSpans`) all of whose spans were left out (its scope or resource may be why): what
/// the forwarder sends for an OTLP/JSON request some spans of which were rejected (the
/// protobuf counterpart is [`without_spans`](super::without_spans)). Returns how many spans
/// were left out.
pub fn retain_accepted(req: &mut ExportTraceServiceRequest) -> usize {
    let mut left_out = 0;
    req.resource_spans.retain_mut(|rs| {
        let resource_too_deep = rs
            .resource
            .as_ref()
            .is_some_and(|r| too_deep(&r.attributes));
        let had_spans = rs.scope_spans.iter().any(|s| !s.spans.is_empty());
        rs.scope_spans.retain_mut(|ss| {
            let outer =
                resource_too_deep || ss.scope.as_ref().is_some_and(|s| too_deep(&s.attributes));
            let before = ss.spans.len();
            ss.spans.retain(|span| check_span(span, outer).is_ok());
            left_out += before - ss.spans.len();
            before == 0 || !ss.spans.is_empty()
        });
        !had_spans || rs.scope_spans.iter().any(|s| !s.spans.is_empty())
    });
    left_out
}

/// Whether an attribute value nests deeper than [`MAX_VALUE_NESTING`].
fn too_deep(attributes: &[KeyValue]) -> bool {
    attributes
        .iter()
        .filter_map(|kv| kv.value.as_ref())
        .any(|v| nesting(v, MAX_VALUE_NESTING) > MAX_VALUE_NESTING)
}

/// Levels of arrays and key-value lists in `value`, exact up to `allowed` (over it: some depth
/// over `allowed`, without looking further down).
fn nesting(value: &AnyValue, allowed: u32) -> u32 {
    let children: Box<dyn Iterator<Item = &AnyValue>> = match value.value.as_ref() {
        Some(Value::ArrayValue(a)) => Box::new(a.values.iter()),
        Some(Value::KvlistValue(l)) => Box::new(l.values.iter().filter_map(|kv| kv.value.as_ref())),
        _ => return 0,
    };
    if allowed == 0 {
        return 1;
    }
    1 + children.map(|c| nesting(c, allowed - 1)).max().unwrap_or(0)
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
