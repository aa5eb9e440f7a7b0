//! Whether a downstream decoder built on prost would accept a part of a request — the check
//! made when forwarding is on, so that one span another receiver would refuse is left out of
//! the forwarded batch (and rejected in the answer) instead of making the downstream refuse the
//! whole batch, other senders' spans included.
//!
//! The lean decoder reads only what the analysis needs; prost reads everything: every string
//! field must be UTF-8 (attribute keys and values, `trace_state`, status messages, event names,
//! scope names…), every known field must have its wire type, and nesting is bounded by its
//! recursion limit of 100, counted as prost counts it: each nested message takes one level, and
//! so does each group an unknown field nests, wherever it sits (a group 98 deep inside a span,
//! itself 3 messages deep, is refused).

use super::validation::Unforwardable;
use super::wire::{END_GROUP, FIXED32, FIXED64, LEN, Reader, START_GROUP, VARINT};

/// The OTLP messages a span, its resource and its scope are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// `Span`.
    Span,
    /// `Span.Event`.
    Event,
    /// `Span.Link`.
    Link,
    /// `Status`.
    Status,
    /// `KeyValue`.
    KeyValue,
    /// `AnyValue`.
    AnyValue,
    /// `ArrayValue`.
    ArrayValue,
    /// `KeyValueList`.
    KeyValueList,
    /// `Resource`.
    Resource,
    /// `InstrumentationScope`.
    Scope,
    /// `EntityRef` (a resource's entity references).
    EntityRef,
}

/// How prost reads one field of a message, as `opentelemetry-proto` 0.33 defines them (a field
/// a later version adds is read as unknown until it is listed here).
enum Field {
    /// A `string`: length-delimited, UTF-8.
    Text,
    /// A nested message.
    Nested(Message),
    /// A scalar or `bytes` field of this wire type.
    Plain(u8),
    /// Not in the schema: skipped (its groups count towards the limit).
    Unknown,
}

fn field(message: Message, number: u32) -> Field {
    use Field::*;
    use Message as M;
    match (message, number) {
        (M::Span, 1 | 2 | 4) => Plain(LEN),
        (M::Span, 3 | 5) => Text,
        (M::Span, 6 | 10 | 12 | 14) => Plain(VARINT),
        (M::Span, 7 | 8) => Plain(FIXED64),
        (M::Span, 9) => Nested(M::KeyValue),
        (M::Span, 11) => Nested(M::Event),
        (M::Span, 13) => Nested(M::Link),
        (M::Span, 15) => Nested(M::Status),
        (M::Span, 16) => Plain(FIXED32),
        (M::Event, 1) => Plain(FIXED64),
        (M::Event, 2) => Text,
        (M::Event, 3) => Nested(M::KeyValue),
        (M::Event, 4) => Plain(VARINT),
        (M::Link, 1 | 2) => Plain(LEN),
        (M::Link, 3) => Text,
        (M::Link, 4) => Nested(M::KeyValue),
        (M::Link, 5) => Plain(VARINT),
        (M::Link, 6) => Plain(FIXED32),
        (M::Status, 2) => Text,
        (M::Status, 3) => Plain(VARINT),
        (M::KeyValue, 1) => Text,
        (M::KeyValue, 2) => Nested(M::AnyValue),
        (M::KeyValue, 3) => Plain(VARINT),
        (M::AnyValue, 1) => Text,
        (M::AnyValue, 2 | 3) => Plain(VARINT),
        (M::AnyValue, 4) => Plain(FIXED64),
        (M::AnyValue, 5) => Nested(M::ArrayValue),
        (M::AnyValue, 6) => Nested(M::KeyValueList),
        (M::AnyValue, 7) => Plain(LEN),
        (M::AnyValue, 8) => Plain(VARINT),
        (M::ArrayValue, 1) => Nested(M::AnyValue),
        (M::KeyValueList, 1) => Nested(M::KeyValue),
        (M::Resource, 1) => Nested(M::KeyValue),
        (M::Resource, 2) => Plain(VARINT),
        (M::Resource, 3) => Nested(M::EntityRef),
        (M::EntityRef, 1..=4) => Text,
        (M::Scope, 1 | 2) => Text,
        (M::Scope, 3) => Nested(M::KeyValue),
        (M::Scope, 4) => Plain(VARINT),
        _ => Unknown,
    }
}

/// Prost's recursion budget inside a `ResourceSpans` (the request's loop has 100; each message
/// nested in it has one less).
const RESOURCE_SPANS_BUDGET: u32 = 99;

/// Prost's recursion budget inside a `Span` (request → resource spans → scope spans → span).
pub(crate) const SPAN_BUDGET: u32 = RESOURCE_SPANS_BUDGET - 2;

/// The level of a [`check_head`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// `ResourceSpans`: its resource, schema URL and unknown fields.
    ResourceSpans,
    /// `ScopeSpans`: its scope, schema URL and unknown fields.
    ScopeSpans,
}

/// Checks the fields of a `ResourceSpans` or `ScopeSpans` other than its list (field 2: the
/// scope spans, or the spans, checked one by one): when they fail, every span under them does.
pub(crate) fn check_head(buf: &[u8], head: Head) -> Result<(), Unforwardable> {
    let (budget, first) = match head {
        Head::ResourceSpans => (RESOURCE_SPANS_BUDGET, Message::Resource),
        Head::ScopeSpans => (RESOURCE_SPANS_BUDGET - 1, Message::Scope),
    };
    let mut r = Reader::new(buf);
    while let Some((number, wire)) = r.key().map_err(|_| Unforwardable::Malformed)? {
        if !(1..=3).contains(&number) {
            skip_unknown(&mut r, number, wire, budget)?;
            continue;
        }
        let value = r.len_field(wire).map_err(|_| Unforwardable::Malformed)?;
        match number {
            1 => check(value, first, budget - 1)?,
            3 => drop(std::str::from_utf8(value).map_err(|_| Unforwardable::NotUtf8)?),
            _ => {}
        }
    }
    Ok(())
}

/// Checks `buf`, a `message`, as prost would read it with `budget` left (its decode context
/// inside that message: 100 less one per enclosing message; a span's is [`SPAN_BUDGET`]).
pub(crate) fn check(buf: &[u8], message: Message, budget: u32) -> Result<(), Unforwardable> {
    let mut r = Reader::new(buf);
    while let Some((number, wire)) = r.key().map_err(|_| Unforwardable::Malformed)? {
        match field(message, number) {
            Field::Text => {
                let text = r.len_field(wire).map_err(|_| Unforwardable::Malformed)?;
                std::str::from_utf8(text).map_err(|_| Unforwardable::NotUtf8)?;
            }
            Field::Nested(inner) => {
                let inner_buf = r.len_field(wire).map_err(|_| Unforwardable::Malformed)?;
                // prost checks the limit before it enters a message (and skips a field).
                if budget == 0 {
                    return Err(Unforwardable::TooDeep);
                }
                check(inner_buf, inner, budget - 1)?;
            }
            Field::Plain(expected) if wire == expected => {
                r.skip(number, wire).map_err(|_| Unforwardable::Malformed)?;
            }
            Field::Plain(_) => return Err(Unforwardable::Malformed),
            Field::Unknown => skip_unknown(&mut r, number, wire, budget)?,
        }
    }
    Ok(())
}

/// Skips an unknown field as prost does: a group's fields with one level less each.
fn skip_unknown(
    r: &mut Reader<'_>,
    number: u32,
    wire: u8,
    budget: u32,
) -> Result<(), Unforwardable> {
    if budget == 0 {
        return Err(Unforwardable::TooDeep);
    }
    if wire != START_GROUP {
        return r.skip(number, wire).map_err(|_| Unforwardable::Malformed);
    }
    loop {
        let Some((inner, inner_wire)) = r.key().map_err(|_| Unforwardable::Malformed)? else {
            return Err(Unforwardable::Malformed);
        };
        if inner_wire == END_GROUP {
            return if inner == number {
                Ok(())
            } else {
                Err(Unforwardable::Malformed)
            };
        }
        skip_unknown(r, inner, inner_wire, budget - 1)?;
    }
}

#[cfg(test)]
mod tests {
    //! The field table against what prost encodes. Every message is built with every field
    //! set — struct literals without `..Default::default()` and an exhaustive match over
    //! `AnyValue`'s variants, so that a field or variant a later `opentelemetry-proto` adds
    //! stops this from compiling until the table lists it — and every field on the wire must be
    //! in the table with its wire type.

    use super::*;
    use opentelemetry_proto::tonic::common::v1::{
        AnyValue, ArrayValue, EntityRef, InstrumentationScope, KeyValue, KeyValueList,
        any_value::Value,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
    use prost::Message as _;

    fn any(value: Value) -> AnyValue {
        AnyValue { value: Some(value) }
    }

    fn key_value() -> KeyValue {
        KeyValue {
            key: "k".into(),
            value: Some(any(Value::IntValue(1))),
            key_strindex: 1,
        }
    }

    /// One value of each variant; the match fails to compile when a variant is added.
    fn every_value() -> Vec<Value> {
        let values = vec![
            Value::StringValue("s".into()),
            Value::BoolValue(true),
            Value::IntValue(1),
            Value::DoubleValue(0.5),
            Value::ArrayValue(ArrayValue {
                values: vec![any(Value::IntValue(1))],
            }),
            Value::KvlistValue(KeyValueList {
                values: vec![key_value()],
            }),
            Value::BytesValue(vec![1]),
            Value::StringValueStrindex(1),
        ];
        for v in &values {
            match v {
                Value::StringValue(_)
                | Value::BoolValue(_)
                | Value::IntValue(_)
                | Value::DoubleValue(_)
                | Value::ArrayValue(_)
                | Value::KvlistValue(_)
                | Value::BytesValue(_)
                | Value::StringValueStrindex(_) => {}
            }
        }
        values
    }

    fn scope() -> InstrumentationScope {
        InstrumentationScope {
            name: "scope".into(),
            version: "1".into(),
            attributes: vec![key_value()],
            dropped_attributes_count: 1,
        }
    }

    fn resource() -> Resource {
        Resource {
            attributes: vec![key_value()],
            dropped_attributes_count: 1,
            entity_refs: vec![EntityRef {
                schema_url: "https://example.com/s".into(),
                r#type: "service".into(),
                id_keys: vec!["service.name".into()],
                description_keys: vec!["service.version".into()],
            }],
        }
    }

    fn span() -> Span {
        Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            trace_state: "a=b".into(),
            parent_span_id: vec![3; 8],
            flags: 1,
            name: "span".into(),
            kind: 2,
            start_time_unix_nano: 1,
            end_time_unix_nano: 2,
            attributes: vec![key_value()],
            dropped_attributes_count: 1,
            events: vec![Event {
                time_unix_nano: 1,
                name: "event".into(),
                attributes: vec![key_value()],
                dropped_attributes_count: 1,
            }],
            dropped_events_count: 1,
            links: vec![Link {
                trace_id: vec![4; 16],
                span_id: vec![5; 8],
                trace_state: "c=d".into(),
                attributes: vec![key_value()],
                dropped_attributes_count: 1,
                flags: 1,
            }],
            dropped_links_count: 1,
            status: Some(Status {
                message: "m".into(),
                code: 2,
            }),
        }
    }

    /// The (number, wire type) of each field at the top level of `bytes`.
    fn fields(bytes: &[u8]) -> Vec<(u32, u8)> {
        let mut r = Reader::new(bytes);
        let mut out = Vec::new();
        while let Some((number, wire)) = r.key().unwrap() {
            out.push((number, wire));
            r.skip(number, wire).unwrap();
        }
        out
    }

    /// Every field of `encoded` (`count` of them) is listed for `message` with its wire type,
    /// and the whole message passes the check.
    fn assert_listed(message: Message, encoded: &[u8], count: usize) {
        let found = fields(encoded);
        assert_eq!(found.len(), count, "{message:?}: {found:?}");
        for (number, wire) in found {
            let listed = match field(message, number) {
                Field::Text | Field::Nested(_) => Some(LEN),
                Field::Plain(wire) => Some(wire),
                Field::Unknown => None,
            };
            assert_eq!(listed, Some(wire), "{message:?} field {number}");
        }
        assert_eq!(check(encoded, message, SPAN_BUDGET), Ok(()), "{message:?}");
    }

    #[test]
    fn every_field_prost_writes_is_in_the_table_with_its_wire_type() {
        let s = span();
        assert_listed(Message::Span, &s.encode_to_vec(), 16);
        assert_listed(Message::Event, &s.events[0].encode_to_vec(), 4);
        assert_listed(Message::Link, &s.links[0].encode_to_vec(), 6);
        assert_listed(Message::Status, &s.status.unwrap().encode_to_vec(), 2);
        assert_listed(Message::KeyValue, &key_value().encode_to_vec(), 3);
        for value in every_value() {
            assert_listed(Message::AnyValue, &any(value).encode_to_vec(), 1);
        }
        let array = ArrayValue {
            values: vec![any(Value::IntValue(1))],
        };
        assert_listed(Message::ArrayValue, &array.encode_to_vec(), 1);
        let list = KeyValueList {
            values: vec![key_value()],
        };
        assert_listed(Message::KeyValueList, &list.encode_to_vec(), 1);
        let r = resource();
        assert_listed(Message::Resource, &r.encode_to_vec(), 3);
        assert_listed(Message::EntityRef, &r.entity_refs[0].encode_to_vec(), 4);
        assert_listed(Message::Scope, &scope().encode_to_vec(), 4);
    }

    /// The heads' own fields are the three `check_head` knows (1, 2, 3), all length-delimited,
    /// and a head with every field set passes.
    #[test]
    fn the_heads_have_the_fields_check_head_knows() {
        let scope_spans = ScopeSpans {
            scope: Some(scope()),
            spans: vec![span()],
            schema_url: "https://example.com/s".into(),
        };
        let resource_spans = ResourceSpans {
            resource: Some(resource()),
            scope_spans: vec![scope_spans.clone()],
            schema_url: "https://example.com/r".into(),
        };
        for (head, encoded) in [
            (Head::ScopeSpans, scope_spans.encode_to_vec()),
            (Head::ResourceSpans, resource_spans.encode_to_vec()),
        ] {
            assert_eq!(fields(&encoded), [(1, LEN), (2, LEN), (3, LEN)], "{head:?}");
            assert_eq!(check_head(&encoded, head), Ok(()), "{head:?}");
        }
    }
}
