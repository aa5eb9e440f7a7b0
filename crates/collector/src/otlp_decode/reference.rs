//! The reference decoder: `opentelemetry-proto`'s generated (prost) types → spans.
//!
//! It serves OTLP/JSON and is the oracle the lean decoder is tested against
//! (`tests/decode_equivalence.rs`), so it shares no rule with the lean decoder: every check
//! below (id lengths and zero ids, times, nesting depth, kind and status numbers, which values
//! are kept, text length) is restated here from the OTLP specification and the
//! [module rules](super). Only the output types, the interner that holds texts and the list of
//! keys the analysis reads are common.

use infertrace_analysis::text::{Interner, MAX_ARRAY_ITEMS, MAX_TEXT_LEN, Text};
use infertrace_analysis::trace::{
    AttrValue, KNOWN_KEYS, Span, SpanId, SpanKind, SpanLink, StatusCode, TraceId, UNKNOWN_SERVICE,
};
use infertrace_semconv as sc;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::Span as ProtoSpan;

use super::decoded::Decoded;
use super::interner::with_interner;

/// OTLP: a trace id is 16 bytes, not all zero.
const TRACE_ID_BYTES: usize = 16;
/// OTLP: a span id is 8 bytes, not all zero.
const SPAN_ID_BYTES: usize = 8;
/// Deepest allowed nesting of arrays and key-value lists in one attribute value.
const NESTING_LIMIT: u32 = 16;

/// Why the reference rejects a span; [`Reject::message`] is the partial-success text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reject {
    TraceId(usize),
    SpanId(usize),
    ParentSpanId(usize),
    NoStart,
    EndBeforeStart(u64, u64),
    TooDeep,
}

impl Reject {
    fn message(self) -> String {
        match self {
            Self::TraceId(len) => {
                format!("trace id must be 16 bytes and not all zero (got {len} bytes)")
            }
            Self::SpanId(len) => {
                format!("span id must be 8 bytes and not all zero (got {len} bytes)")
            }
            Self::ParentSpanId(len) => {
                format!("parent span id must be empty or 8 bytes (got {len} bytes)")
            }
            Self::NoStart => super::validation::NO_START.to_owned(),
            Self::EndBeforeStart(start, end) => {
                format!("span ends before it starts (start {start} ns, end {end} ns)")
            }
            Self::TooDeep => format!(
                "an attribute value (of the span, its events or links, its resource or scope) \
                 nests arrays/key-value lists more than {NESTING_LIMIT} levels deep; \
                 downstream OTLP decoders refuse such data: flatten the attribute"
            ),
        }
    }
}

/// Converts a decoded `ExportTraceServiceRequest` into spans (see the [module rules](super)).
pub fn from_proto(req: &ExportTraceServiceRequest) -> Decoded {
    with_interner(|interner| convert(req, interner))
}

fn convert(req: &ExportTraceServiceRequest, interner: &mut Interner) -> Decoded {
    let mut out = Decoded::default();
    for resource_spans in &req.resource_spans {
        let resource_attributes = resource_spans
            .resource
            .as_ref()
            .map_or(&[][..], |r| &r.attributes[..]);
        let service = text(
            service_name(resource_attributes).unwrap_or(UNKNOWN_SERVICE),
            interner,
        );
        for scope_spans in &resource_spans.scope_spans {
            let scope_attributes = scope_spans
                .scope
                .as_ref()
                .map_or(&[][..], |s| &s.attributes[..]);
            let outer_too_deep = too_deep(resource_attributes) || too_deep(scope_attributes);
            for span in &scope_spans.spans {
                match span_ids(span, outer_too_deep) {
                    Ok((trace_id, span_id, parent_span_id)) => out.spans.push(Span {
                        trace_id,
                        span_id,
                        parent_span_id,
                        name: text(&span.name, interner),
                        service: service.clone(),
                        kind: kind(span.kind),
                        start_unix_nano: span.start_time_unix_nano,
                        end_unix_nano: span.end_time_unix_nano,
                        status: status(span.status.as_ref().map_or(0, |s| s.code)),
                        attributes: span
                            .attributes
                            .iter()
                            .filter_map(|kv| attribute(kv, interner))
                            .collect(),
                        links: span
                            .links
                            .iter()
                            .filter_map(|l| link(&l.trace_id, &l.span_id))
                            .collect(),
                    }),
                    Err(why) => {
                        out.rejected = out.rejected.saturating_add(1);
                        out.first_error.get_or_insert_with(|| why.message());
                    }
                }
            }
        }
    }
    out
}

/// Leaves out of `req` the spans [`from_proto`] rejects, and any `ScopeSpans` (then
/// `ResourceSpans`) all of whose spans were left out (its scope or resource may be why): what
/// the forwarder sends for an OTLP/JSON request some spans of which were rejected (the
/// protobuf counterpart is [`without_spans`](super::without_spans)). Returns how many spans
/// were left out.
pub fn retain_accepted(req: &mut ExportTraceServiceRequest) -> usize {
    retain_spans(req, |span, outer_too_deep| {
        span_ids(span, outer_too_deep).is_ok()
    })
}

/// Leaves out of `req` the spans at `positions` (ascending places in the request's span order:
/// resource by resource, scope by scope), and any `ScopeSpans` (then `ResourceSpans`) all of
/// whose spans were left out, as [`retain_accepted`] does: what the forwarder sends for an
/// OTLP/JSON request some accepted spans of which the pipeline did not keep (after
/// `retain_accepted`, if some were rejected, so that places count accepted spans). Returns how
/// many spans were left out.
pub fn leave_out_spans(req: &mut ExportTraceServiceRequest, positions: &[usize]) -> usize {
    let mut positions = positions.iter().copied().peekable();
    let mut place = 0usize;
    retain_spans(req, |_, _| {
        place += 1;
        positions.next_if_eq(&(place - 1)).is_none()
    })
}

/// Keeps the spans of `req` for which `keep(span, its resource or scope nests too deep)`, in
/// order, and leaves out any `ScopeSpans` (then `ResourceSpans`) that had spans and has none
/// left (its scope or resource may be why they went). Returns how many spans were left out.
fn retain_spans(
    req: &mut ExportTraceServiceRequest,
    mut keep: impl FnMut(&ProtoSpan, bool) -> bool,
) -> usize {
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
            ss.spans.retain(|span| keep(span, outer));
            left_out += before - ss.spans.len();
            before == 0 || !ss.spans.is_empty()
        });
        !had_spans || rs.scope_spans.iter().any(|s| !s.spans.is_empty())
    });
    left_out
}

/// A span's trace id, span id and parent, or why it is rejected; checked in the order ids,
/// times, nesting (the first failing rule names the rejection).
fn span_ids(
    span: &ProtoSpan,
    outer_too_deep: bool,
) -> Result<(TraceId, SpanId, Option<SpanId>), Reject> {
    let trace_id = valid_trace_id(&span.trace_id).ok_or(Reject::TraceId(span.trace_id.len()))?;
    let span_id = valid_span_id(&span.span_id).ok_or(Reject::SpanId(span.span_id.len()))?;
    // OTLP: an empty parent id means a root span; so does an all-zero one (W3C "invalid").
    let parent = match span.parent_span_id.len() {
        0 => None,
        SPAN_ID_BYTES => valid_span_id(&span.parent_span_id),
        len => return Err(Reject::ParentSpanId(len)),
    };
    let (start, end) = (span.start_time_unix_nano, span.end_time_unix_nano);
    if start == 0 {
        return Err(Reject::NoStart);
    }
    if start > end {
        return Err(Reject::EndBeforeStart(start, end));
    }
    let nested_too_deep = outer_too_deep
        || too_deep(&span.attributes)
        || span.events.iter().any(|e| too_deep(&e.attributes))
        || span.links.iter().any(|l| too_deep(&l.attributes));
    if nested_too_deep {
        return Err(Reject::TooDeep);
    }
    Ok((trace_id, span_id, parent))
}

fn valid_trace_id(bytes: &[u8]) -> Option<TraceId> {
    let id = <[u8; TRACE_ID_BYTES]>::try_from(bytes).ok()?;
    id.iter().any(|b| *b != 0).then_some(TraceId(id))
}

fn valid_span_id(bytes: &[u8]) -> Option<SpanId> {
    let id = <[u8; SPAN_ID_BYTES]>::try_from(bytes).ok()?;
    id.iter().any(|b| *b != 0).then_some(SpanId(id))
}

/// A link is kept only when both of its ids are valid.
fn link(trace: &[u8], span: &[u8]) -> Option<SpanLink> {
    Some(SpanLink {
        trace_id: valid_trace_id(trace)?,
        span_id: valid_span_id(span)?,
    })
}

/// OTLP `SpanKind` numbers; any other is unspecified.
fn kind(n: i32) -> SpanKind {
    match n {
        1 => SpanKind::Internal,
        2 => SpanKind::Server,
        3 => SpanKind::Client,
        4 => SpanKind::Producer,
        5 => SpanKind::Consumer,
        _ => SpanKind::Unspecified,
    }
}

/// OTLP `Status.code` numbers; any other is unset.
fn status(n: i32) -> StatusCode {
    match n {
        1 => StatusCode::Ok,
        2 => StatusCode::Error,
        _ => StatusCode::Unset,
    }
}

/// Whether any value nests arrays and key-value lists deeper than [`NESTING_LIMIT`] (a scalar
/// is 0 levels, `["a"]` 1, `{k: ["a"]}` 2). Iterative, so any depth is safe to look at.
fn too_deep(attributes: &[KeyValue]) -> bool {
    let mut pending: Vec<(&AnyValue, u32)> = attributes
        .iter()
        .filter_map(|kv| kv.value.as_ref())
        .map(|v| (v, 0))
        .collect();
    while let Some((value, above)) = pending.pop() {
        let level = above + 1;
        match &value.value {
            Some(Value::ArrayValue(array)) => {
                if level > NESTING_LIMIT {
                    return true;
                }
                pending.extend(array.values.iter().map(|v| (v, level)));
            }
            Some(Value::KvlistValue(list)) => {
                if level > NESTING_LIMIT {
                    return true;
                }
                let values = list.values.iter().filter_map(|kv| kv.value.as_ref());
                pending.extend(values.map(|v| (v, level)));
            }
            _ => {}
        }
    }
    false
}

/// The first string-valued `service.name`.
fn service_name(attributes: &[KeyValue]) -> Option<&str> {
    attributes
        .iter()
        .filter(|kv| kv.key == sc::resource::SERVICE_NAME)
        .find_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        })
}

/// A kept attribute: a key the analysis reads, with a string, integer, double, boolean or
/// all-string array value (an empty array included); anything else drops it.
fn attribute(kv: &KeyValue, interner: &mut Interner) -> Option<(&'static str, AttrValue)> {
    let key = KNOWN_KEYS.iter().copied().find(|k| *k == kv.key)?;
    let value = match kv.value.as_ref()?.value.as_ref()? {
        // A request id is unique per request: copied, not interned.
        Value::StringValue(s) if key == sc::gen_ai::REQUEST_ID => {
            let s = cut(s, interner);
            interner.note_fresh(s.len());
            AttrValue::Str(Text::from(s))
        }
        Value::StringValue(s) => AttrValue::Str(text(s, interner)),
        Value::BoolValue(b) => AttrValue::Bool(*b),
        Value::IntValue(i) => AttrValue::Int(*i),
        Value::DoubleValue(d) => AttrValue::Double(*d),
        Value::ArrayValue(array) => {
            let mut items = Vec::with_capacity(array.values.len().min(MAX_ARRAY_ITEMS));
            for v in &array.values {
                match v.value.as_ref()? {
                    Value::StringValue(s) if items.len() < MAX_ARRAY_ITEMS => {
                        items.push(text(s, interner));
                    }
                    Value::StringValue(_) => {}
                    _ => return None,
                }
            }
            if array.values.len() > items.len() {
                interner.count_truncated(1);
            }
            AttrValue::StrArray(items)
        }
        Value::KvlistValue(_) | Value::BytesValue(_) | Value::StringValueStrindex(_) => {
            return None;
        }
    };
    Some((key, value))
}

/// `s` cut to its first [`MAX_TEXT_LEN`] bytes at a character boundary (counted when cut), as
/// the interner's shared text.
fn text(s: &str, interner: &mut Interner) -> Text {
    let s = cut(s, interner);
    interner.intern(s)
}

/// `s` cut to at most [`MAX_TEXT_LEN`] bytes, ending on a character boundary; a cut is
/// counted in the interner's truncation count.
fn cut<'a>(s: &'a str, interner: &mut Interner) -> &'a str {
    if s.len() <= MAX_TEXT_LEN {
        return s;
    }
    interner.count_truncated(1);
    let end = (0..=MAX_TEXT_LEN)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(trace: &[u8], id: &[u8], parent: &[u8], start: u64, end: u64) -> ProtoSpan {
        ProtoSpan {
            trace_id: trace.to_vec(),
            span_id: id.to_vec(),
            parent_span_id: parent.to_vec(),
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            ..Default::default()
        }
    }

    #[test]
    fn id_and_time_rules() {
        let (t, s) = ([1u8; 16], [2u8; 8]);
        let check = |sp: ProtoSpan| span_ids(&sp, false);
        assert!(check(span(&t, &s, &[], 1, 1)).is_ok());
        assert_eq!(
            check(span(&[0; 16], &s, &[], 1, 2)),
            Err(Reject::TraceId(16))
        );
        assert_eq!(
            check(span(&t[..15], &s, &[], 1, 2)),
            Err(Reject::TraceId(15))
        );
        assert_eq!(check(span(&t, &[0; 8], &[], 1, 2)), Err(Reject::SpanId(8)));
        assert_eq!(
            check(span(&t, &s, &[3; 4], 1, 2)),
            Err(Reject::ParentSpanId(4))
        );
        assert_eq!(check(span(&t, &s, &[], 0, 2)), Err(Reject::NoStart));
        assert_eq!(
            check(span(&t, &s, &[], 3, 2)),
            Err(Reject::EndBeforeStart(3, 2))
        );
        assert_eq!(check(span(&t, &s, &[0; 8], 1, 2)).map(|i| i.2), Ok(None));
        assert_eq!(
            check(span(&t, &s, &[7; 8], 1, 2)).map(|i| i.2),
            Ok(Some(SpanId([7; 8])))
        );
        assert_eq!(
            span_ids(&span(&t, &s, &[], 1, 2), true),
            Err(Reject::TooDeep)
        );
    }

    #[test]
    fn spans_left_out_by_place_take_an_emptied_scope_and_resource_with_them() {
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
        let sp = |n: u8| span(&[1; 16], &[n; 8], &[], 1, 2);
        let resource = |scopes: Vec<Vec<ProtoSpan>>| ResourceSpans {
            scope_spans: scopes
                .into_iter()
                .map(|spans| ScopeSpans {
                    spans,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let mut req = ExportTraceServiceRequest {
            resource_spans: vec![
                resource(vec![vec![sp(1), sp(2)], vec![sp(3)]]),
                resource(vec![vec![sp(4)]]),
                resource(vec![vec![sp(5), sp(6)]]),
            ],
        };
        // Places 1 (span 2), 2 (span 3: its scope goes), 3 (span 4: its resource goes), 5.
        assert_eq!(leave_out_spans(&mut req, &[1, 2, 3, 5]), 4);
        let expected = ExportTraceServiceRequest {
            resource_spans: vec![resource(vec![vec![sp(1)]]), resource(vec![vec![sp(5)]])],
        };
        assert_eq!(req, expected);
    }

    #[test]
    fn cut_ends_on_a_character_boundary() {
        let mut interner = Interner::default();
        let s = "é".repeat(200); // 400 bytes, 2 per character
        assert_eq!(cut(&s, &mut interner).len(), MAX_TEXT_LEN);
        let s = format!("a{}", "é".repeat(200)); // boundary at 255
        assert_eq!(cut(&s, &mut interner).len(), MAX_TEXT_LEN - 1);
        assert_eq!(interner.take_truncated(), 2);
        assert_eq!(cut("short", &mut interner), "short");
        assert_eq!(interner.take_truncated(), 0);
    }
}
