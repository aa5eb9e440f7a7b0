//! The lean protobuf decoder is equivalent to "prost decode, then `from_proto`":
//! - on random requests encoded by prost, with unknown fields (groups included) injected at several
//!   levels and the resource placed after the spans, and every attribute value kind nested;
//! - on random corruptions of such encodings: whenever prost accepts the bytes, the lean decoder
//!   must accept them too and produce the same spans (where prost rejects, the lean decoder may
//!   accept, since it does not look inside what it skips, but must not panic);
//! - on requests holding values nested around the limit (`MAX_VALUE_NESTING`, 16 levels) in a
//!   span's attributes, events or links, or its resource or scope, and the body
//!   [`without_spans`] leaves is exactly the accepted spans.

use infertrace_analysis::text::Interner;
use infertrace_analysis::trace::KNOWN_KEYS;
use infertrace_collector::otlp_decode::{
    DecodeError, Decoded, MAX_VALUE_NESTING, count_spans, decode_protobuf,
    decode_protobuf_for_forwarding, decode_span, from_proto, retain_accepted, without_spans,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use proptest::prelude::*;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

fn id(len: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), len),
        1 => Just(vec![0u8; len]),
        1 => proptest::collection::vec(any::<u8>(), 0..20),
    ]
}

fn parent_id() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => Just(Vec::new()),
        5 => proptest::collection::vec(any::<u8>(), 8),
        1 => Just(vec![0u8; 8]),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        5 => proptest::sample::select(KNOWN_KEYS).prop_map(str::to_owned),
        1 => Just("service.name".to_owned()),
        2 => "[a-z._]{0,24}",
    ]
}

fn any_value() -> impl Strategy<Value = Option<AnyValue>> {
    let leaf = prop_oneof![
        Just(None),
        ".{0,12}"
            .prop_map(any_value::Value::StringValue)
            .prop_map(Some),
        any::<bool>()
            .prop_map(any_value::Value::BoolValue)
            .prop_map(Some),
        any::<i64>()
            .prop_map(any_value::Value::IntValue)
            .prop_map(Some),
        (-1e12f64..1e12)
            .prop_map(any_value::Value::DoubleValue)
            .prop_map(Some),
        proptest::collection::vec(any::<u8>(), 0..6)
            .prop_map(any_value::Value::BytesValue)
            .prop_map(Some),
        any::<i32>()
            .prop_map(any_value::Value::StringValueStrindex)
            .prop_map(Some),
    ]
    .prop_map(|value| AnyValue { value });
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            // Arrays of strings only (kept) and of anything (dropped unless all strings).
            proptest::collection::vec(".{0,6}", 0..4).prop_map(|items| AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue {
                    values: items
                        .into_iter()
                        .map(|s| AnyValue {
                            value: Some(any_value::Value::StringValue(s)),
                        })
                        .collect(),
                })),
            }),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|values| AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue { values })),
            }),
            proptest::collection::vec(("[a-z.]{0,8}", inner), 0..3).prop_map(|kvs| AnyValue {
                value: Some(any_value::Value::KvlistValue(KeyValueList {
                    values: kvs
                        .into_iter()
                        .map(|(key, value)| KeyValue {
                            key,
                            value: Some(value),
                            key_strindex: 0,
                        })
                        .collect(),
                })),
            }),
        ]
    });
    prop_oneof![1 => Just(None), 9 => value.prop_map(Some)]
}

fn key_value() -> impl Strategy<Value = KeyValue> {
    (key(), any_value(), 0..3i32).prop_map(|(key, value, key_strindex)| KeyValue {
        key,
        value,
        key_strindex,
    })
}

fn attributes() -> impl Strategy<Value = Vec<KeyValue>> {
    proptest::collection::vec(key_value(), 0..6)
}

/// End minus start: often exactly at the boundaries of the time rule (-1, 0, 1).
fn duration() -> impl Strategy<Value = i64> {
    prop_oneof![
        1 => Just(-1i64),
        1 => Just(0i64),
        1 => Just(1i64),
        6 => -1000i64..1_000_000,
    ]
}

fn span() -> impl Strategy<Value = Span> {
    (
        (id(16), id(8), parent_id(), ".{0,16}", -1..8i32),
        (any::<u64>(), duration(), any::<u32>(), ".{0,4}"),
        attributes(),
        proptest::collection::vec((".{0,6}", any::<u64>(), attributes()), 0..2),
        proptest::collection::vec((id(16), id(8), attributes()), 0..3),
        proptest::option::of((-1..4i32, ".{0,6}")),
    )
        .prop_map(
            |(
                (trace_id, span_id, parent_span_id, name, kind),
                (start, delta, flags, trace_state),
                attributes,
                events,
                links,
                status,
            )| {
                let end = start.saturating_add_signed(delta);
                Span {
                    trace_id,
                    span_id,
                    trace_state,
                    parent_span_id,
                    flags,
                    name,
                    kind,
                    start_time_unix_nano: start,
                    end_time_unix_nano: end,
                    attributes,
                    dropped_attributes_count: 1,
                    events: events
                        .into_iter()
                        .map(|(name, time, attributes)| Event {
                            time_unix_nano: time,
                            name,
                            attributes,
                            dropped_attributes_count: 0,
                        })
                        .collect(),
                    dropped_events_count: 2,
                    links: links
                        .into_iter()
                        .map(|(trace_id, span_id, attributes)| Link {
                            trace_id,
                            span_id,
                            trace_state: String::new(),
                            attributes,
                            dropped_attributes_count: 0,
                            flags: 0,
                        })
                        .collect(),
                    dropped_links_count: 0,
                    status: status.map(|(code, message)| Status { message, code }),
                }
            },
        )
}

fn request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    let resource = proptest::option::of(attributes().prop_map(|attributes| Resource {
        attributes,
        dropped_attributes_count: 0,
        entity_refs: Vec::new(),
    }));
    let scope = proptest::option::of(".{0,6}".prop_map(|name| InstrumentationScope {
        name,
        ..Default::default()
    }));
    let scope_spans =
        (scope, proptest::collection::vec(span(), 0..4)).prop_map(|(scope, spans)| ScopeSpans {
            scope,
            spans,
            schema_url: "https://opentelemetry.io/schemas/1.26.0".into(),
        });
    let resource_spans = (resource, proptest::collection::vec(scope_spans, 0..3)).prop_map(
        |(resource, scope_spans)| ResourceSpans {
            resource,
            scope_spans,
            schema_url: String::new(),
        },
    );
    proptest::collection::vec(resource_spans, 0..3)
        .prop_map(|resource_spans| ExportTraceServiceRequest { resource_spans })
}

/// A tiny deterministic generator for the noise choices.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn chance(&mut self, in_four: u64) -> bool {
        self.next() % 4 < in_four
    }

    /// Appends 0–2 unknown fields (numbers 17–60, every wire type, groups included).
    fn unknown_fields(&mut self, out: &mut Vec<u8>) {
        for _ in 0..self.next() % 3 {
            let tag = 17 + (self.next() % 44) as u32;
            match self.next() % 5 {
                0 => {
                    encode_key(tag, WireType::Varint, out);
                    encode_varint(self.next(), out);
                }
                1 => {
                    encode_key(tag, WireType::SixtyFourBit, out);
                    out.extend_from_slice(&self.next().to_le_bytes());
                }
                2 => {
                    encode_key(tag, WireType::LengthDelimited, out);
                    let len = (self.next() % 9) as usize;
                    encode_varint(len as u64, out);
                    out.extend((0..len).map(|i| i as u8 ^ 0xa5));
                }
                3 => {
                    encode_key(tag, WireType::ThirtyTwoBit, out);
                    out.extend_from_slice(&(self.next() as u32).to_le_bytes());
                }
                _ => {
                    encode_key(tag, WireType::StartGroup, out);
                    encode_key(1, WireType::Varint, out);
                    encode_varint(self.next() % 1000, out);
                    encode_key(tag, WireType::EndGroup, out);
                }
            }
        }
    }
}

fn length_delimited(tag: u32, body: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// Encodes `req` as prost would, plus noise: unknown fields at several levels, the resource
/// sometimes after the spans (prost always writes it first), and repeated occurrences of singular
/// messages, which protobuf merges: a second `resource`, a span followed by another span's
/// encoding (last scalar wins, repeated fields append, `status` merges), and a `KeyValue`
/// followed by another one (its `AnyValue` oneof merges: arrays concatenate, variants replace).
fn encode_with_noise(req: &ExportTraceServiceRequest, noise: &mut Noise) -> Vec<u8> {
    let all_spans: Vec<&Span> = req
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .collect();
    let all_attributes: Vec<&KeyValue> = all_spans.iter().flat_map(|s| &s.attributes).collect();
    let mut out = Vec::new();
    for rs in &req.resource_spans {
        let mut rs_bytes = Vec::new();
        let resource_last = noise.chance(2);
        if !resource_last && let Some(resource) = &rs.resource {
            prost::encoding::message::encode(1, resource, &mut rs_bytes);
        }
        noise.unknown_fields(&mut rs_bytes);
        for ss in &rs.scope_spans {
            let mut ss_bytes = Vec::new();
            if let Some(scope) = &ss.scope {
                prost::encoding::message::encode(1, scope, &mut ss_bytes);
            }
            for span in &ss.spans {
                let mut span_bytes = Vec::new();
                noise.unknown_fields(&mut span_bytes);
                let bare = Span {
                    attributes: Vec::new(),
                    ..(*span).clone()
                };
                bare.encode(&mut span_bytes).unwrap();
                for kv in &span.attributes {
                    let mut kv_bytes = kv.encode_to_vec();
                    if noise.chance(1) && !all_attributes.is_empty() {
                        let other = all_attributes[noise.next() as usize % all_attributes.len()];
                        other.encode(&mut kv_bytes).unwrap();
                    }
                    length_delimited(9, &kv_bytes, &mut span_bytes);
                }
                if noise.chance(1) {
                    let other = all_spans[noise.next() as usize % all_spans.len()];
                    other.encode(&mut span_bytes).unwrap();
                }
                noise.unknown_fields(&mut span_bytes);
                length_delimited(2, &span_bytes, &mut ss_bytes);
            }
            noise.unknown_fields(&mut ss_bytes);
            prost::encoding::string::encode(3, &ss.schema_url, &mut ss_bytes);
            length_delimited(2, &ss_bytes, &mut rs_bytes);
        }
        if resource_last && let Some(resource) = &rs.resource {
            prost::encoding::message::encode(1, resource, &mut rs_bytes);
        }
        let pick = noise.next() as usize % req.resource_spans.len();
        if noise.chance(1)
            && let Some(other) = &req.resource_spans[pick].resource
        {
            prost::encoding::message::encode(1, other, &mut rs_bytes);
        }
        length_delimited(1, &rs_bytes, &mut out);
        noise.unknown_fields(&mut out);
    }
    out
}

/// The lean decoder's reading of `body` equals `reference`.
fn check_lean(body: &[u8], reference: &Decoded) -> Result<(), TestCaseError> {
    let lean = decode_protobuf(body).unwrap();
    prop_assert_eq!(&lean.spans, &reference.spans);
    prop_assert_eq!(lean.rejected, reference.rejected);
    prop_assert_eq!(&lean.first_error, &reference.first_error);
    check_ranges(body, &lean)
}

/// Every span decodes again, from its range of the body alone, to the span `decoded` holds.
fn check_ranges(body: &[u8], decoded: &Decoded) -> Result<(), TestCaseError> {
    prop_assert_eq!(decoded.span_ranges.len(), decoded.spans.len());
    let mut interner = Interner::default();
    for (span, range) in decoded.spans.iter().zip(&decoded.span_ranges) {
        let bytes = range.of(body);
        prop_assert!(bytes.is_some(), "range {:?} outside the body", range);
        let again = decode_span(bytes.unwrap_or_default(), &span.service, &mut interner);
        prop_assert_eq!(
            format!("{:?}", again),
            format!("{:?}", Ok::<_, DecodeError>(Some(span)))
        );
    }
    Ok(())
}

/// Byte edits of a body: at an index, a byte, and what to do (0 replace, 1 insert, 2 cut there).
type Edits = Vec<(prop::sample::Index, u8, u8)>;

/// `req` encoded, then `edits` applied in turn.
fn corrupted(req: &ExportTraceServiceRequest, edits: &Edits) -> Vec<u8> {
    edited(req.encode_to_vec(), edits)
}

/// `bytes` with `edits` applied in turn.
fn edited(mut bytes: Vec<u8>, edits: &Edits) -> Vec<u8> {
    for &(at, byte, kind) in edits {
        if bytes.is_empty() {
            break;
        }
        let i = at.index(bytes.len());
        match kind {
            0 => bytes[i] = byte,
            1 => bytes.insert(i, byte),
            _ => bytes.truncate(i),
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn lean_decoder_equals_prost_then_from_proto(req in request(), seed in 1..u64::MAX) {
        let plain = req.encode_to_vec();
        check_lean(&plain, &from_proto(&req))?;

        let noisy = encode_with_noise(&req, &mut Noise(seed));
        // The noise is valid protobuf; prost's reading of it is the reference.
        let reference = ExportTraceServiceRequest::decode(&noisy[..]).unwrap();
        check_lean(&noisy, &from_proto(&reference))?;

        let total: usize = reference.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        prop_assert_eq!(count_spans(&noisy), Some(total as u64));

        // The body without its rejected spans is prost's reading, filtered.
        let lean = decode_protobuf(&noisy).unwrap();
        // Where prost reads the body, the forwarding check rejects nothing more.
        let forwarding = decode_protobuf_for_forwarding(&noisy).unwrap();
        prop_assert_eq!((&forwarding.spans, forwarding.rejected), (&lean.spans, lean.rejected));
        let cut = without_spans(&noisy, &lean.rejected_ranges).unwrap();
        let mut filtered = reference.clone();
        prop_assert_eq!(retain_accepted(&mut filtered), lean.rejected as usize);
        prop_assert_eq!(ExportTraceServiceRequest::decode(&cut[..]).unwrap(), filtered);
    }

    #[test]
    fn where_prost_accepts_corrupted_bytes_the_lean_decoder_agrees(
        req in request(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..4),
    ) {
        let bytes = corrupted(&req, &edits);
        let lean = decode_protobuf(&bytes);
        if let Ok(reference) = ExportTraceServiceRequest::decode(&bytes[..]) {
            // Compared through Debug so that a NaN double equals itself.
            prop_assert!(lean.is_ok(), "prost accepted, lean refused: {:?}", lean);
            let (lean, reference) = (lean.unwrap(), from_proto(&reference));
            prop_assert_eq!(
                format!("{:?}", (&lean.spans, lean.rejected, &lean.first_error)),
                format!("{:?}", (&reference.spans, reference.rejected, &reference.first_error))
            );
            check_ranges(&bytes, &lean)?;
        }
    }

    /// With forwarding on, what is forwarded — the body without the spans rejected — is what a
    /// prost-based downstream reads, however the body was corrupted (a string made invalid,
    /// a wire type changed in a field the collector does not read…); and where prost reads the
    /// whole body, nothing more is rejected than without forwarding.
    #[test]
    fn what_is_forwarded_a_prost_downstream_reads(
        req in request(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..4),
    ) {
        let bytes = corrupted(&req, &edits);
        let Ok(forwarding) = decode_protobuf_for_forwarding(&bytes) else {
            return Ok(());
        };
        if ExportTraceServiceRequest::decode(&bytes[..]).is_ok() {
            let lean = decode_protobuf(&bytes).unwrap();
            prop_assert_eq!(forwarding.rejected, lean.rejected);
        }
        // As the forwarder does: the body as it came when nothing was rejected, else cut.
        let forwarded = if forwarding.rejected_ranges.is_empty() {
            Some(bytes.clone())
        } else {
            without_spans(&bytes, &forwarding.rejected_ranges)
        };
        if let Some(forwarded) = forwarded {
            let read = ExportTraceServiceRequest::decode(&forwarded[..]);
            prop_assert!(read.is_ok(), "forwarded, refused downstream: {:?}", read);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A short fuzz run of the OTLP/JSON decoder, in every test run: random requests in the
    /// OTLP/JSON mapping, then randomly corrupted. It never panics; whatever it accepts it
    /// decodes exactly as `from_proto` of what serde read; and the limiter's bound covers the
    /// body whatever it holds.
    #[test]
    fn the_json_decoder_survives_corrupted_bodies(
        req in request(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 0..4),
    ) {
        let bytes = edited(serde_json::to_vec(&req).unwrap(), &edits);
        let bound = infertrace_collector::otlp_decode::json_decode_bound(&bytes);
        prop_assert!(bound >= 6 * bytes.len());
        let decoded = infertrace_collector::otlp_decode::decode_json_cutting(&bytes);
        if let Ok(reference) = serde_json::from_slice::<ExportTraceServiceRequest>(&bytes) {
            let (decoded, cut) = decoded.unwrap();
            prop_assert!(cut.is_none());
            let reference = from_proto(&reference);
            prop_assert_eq!(
                format!("{:?}", (&decoded.spans, decoded.rejected)),
                format!("{:?}", (&reference.spans, reference.rejected))
            );
        } else if let Ok((decoded, cut)) = decoded {
            // Recovered by cutting out the spans (or scopes, resources) the parser could not
            // read: the body as cut parses, and decodes to the same spans; the rejected count
            // adds the spans of the scopes and resources cut.
            let cut = cut.expect("a body the parser refuses decodes only after cuts");
            let reference = serde_json::from_slice::<ExportTraceServiceRequest>(&cut);
            prop_assert!(reference.is_ok(), "the cut body parses");
            let reference = from_proto(&reference.unwrap());
            prop_assert_eq!(
                format!("{:?}", &decoded.spans),
                format!("{:?}", &reference.spans)
            );
            prop_assert!(decoded.rejected >= reference.rejected);
        }
    }
}

/// `value` (a request in the strict OTLP/JSON form) spelled as the protobuf JSON mapping also
/// allows, meaning the same: defaults as `null` (except in a oneof) or left out, enums by name, integers and doubles as strings,
/// each where `pick` says so.
fn lenient_spelling(value: &mut serde_json::Value, pick: &mut impl FnMut() -> bool) {
    use serde_json::Value;
    const KINDS: [&str; 6] = [
        "SPAN_KIND_UNSPECIFIED",
        "SPAN_KIND_INTERNAL",
        "SPAN_KIND_SERVER",
        "SPAN_KIND_CLIENT",
        "SPAN_KIND_PRODUCER",
        "SPAN_KIND_CONSUMER",
    ];
    const CODES: [&str; 3] = ["STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"];
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| lenient_spelling(v, pick)),
        Value::Object(members) => {
            for (key, v) in members.iter_mut() {
                // A member of a oneof (an `AnyValue`'s) set to its default is still set: only
                // fields outside a oneof mean the same as `null`.
                let in_oneof = key.ends_with("Value");
                let default = !in_oneof
                    && match v {
                        Value::String(s) => s.is_empty(),
                        Value::Number(n) => n.as_f64() == Some(0.0) && key != "doubleValue",
                        Value::Array(a) => a.is_empty(),
                        _ => false,
                    };
                let n = v.as_u64().and_then(|n| usize::try_from(n).ok());
                if default && pick() {
                    *v = Value::Null;
                } else if key == "kind"
                    && pick()
                    && let Some(name) = n.and_then(|n| KINDS.get(n))
                {
                    *v = Value::from(*name);
                } else if key == "code"
                    && pick()
                    && let Some(name) = n.and_then(|n| CODES.get(n))
                {
                    *v = Value::from(*name);
                } else if matches!(key.as_str(), "droppedAttributesCount" | "doubleValue")
                    && v.is_number()
                    && pick()
                {
                    *v = Value::from(v.to_string());
                } else {
                    lenient_spelling(v, pick);
                }
            }
            // Defaults left out, as Go's encoder leaves them (the required `values` and `key`
            // included).
            members.retain(|_, v| !(v.is_null() && pick()));
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// What the protobuf JSON mapping allows but the generated types refuse (`null` defaults,
    /// enum names, numbers as strings) decodes exactly as the strict spelling of the same
    /// request, and the body forwarded parses as it is.
    #[test]
    fn the_lenient_json_spelling_decodes_as_the_strict_one(req in request(), seed in any::<u64>()) {
        let strict = serde_json::to_vec(&req).unwrap();
        let mut value: serde_json::Value = serde_json::from_slice(&strict).unwrap();
        let mut noise = Noise(seed | 1);
        lenient_spelling(&mut value, &mut || noise.chance(2));
        let lenient = serde_json::to_vec(&value).unwrap();
        let strict = infertrace_collector::otlp_decode::decode_json(&strict).unwrap();
        let (decoded, fixed) = infertrace_collector::otlp_decode::decode_json_cutting(&lenient).unwrap();
        prop_assert_eq!(
            format!("{:?}", (&decoded.spans, decoded.rejected)),
            format!("{:?}", (&strict.spans, strict.rejected))
        );
        if let Some(fixed) = fixed {
            prop_assert!(serde_json::from_slice::<ExportTraceServiceRequest>(&fixed).is_ok());
        }
    }
}

/// A value `shape.len()` levels deep: each level an array (`true`) or a key-value list.
fn nested_value(shape: &[bool]) -> AnyValue {
    let mut v = AnyValue {
        value: Some(any_value::Value::IntValue(1)),
    };
    for &array in shape {
        v = AnyValue {
            value: Some(if array {
                any_value::Value::ArrayValue(ArrayValue {
                    values: vec![AnyValue::default(), v],
                })
            } else {
                any_value::Value::KvlistValue(KeyValueList {
                    values: vec![KeyValue {
                        key: "k".into(),
                        value: Some(v),
                        key_strindex: 0,
                    }],
                })
            }),
        };
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn values_nested_around_the_limit_are_judged_like_the_reference(
        req in request(),
        deep in proptest::collection::vec(
            (proptest::collection::vec(any::<bool>(), (MAX_VALUE_NESTING as usize - 2)..(MAX_VALUE_NESTING as usize + 3)), 0..5u8, any::<prop::sample::Index>()),
            1..4,
        ),
    ) {
        // Where each deep value goes: 0 span attribute, 1 event, 2 link, 3 resource, 4 scope.
        let mut req = req;
        let span_count: usize = req.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        prop_assume!(span_count > 0);
        for (shape, place, at) in &deep {
            let kv = KeyValue { key: "deep".into(), value: Some(nested_value(shape)), key_strindex: 0 };
            let mut all: Vec<(usize, usize, usize)> = Vec::new();
            for (r, rs) in req.resource_spans.iter().enumerate() {
                for (s, ss) in rs.scope_spans.iter().enumerate() {
                    for i in 0..ss.spans.len() {
                        all.push((r, s, i));
                    }
                }
            }
            let (r, s, i) = all[at.index(all.len())];
            let rs = &mut req.resource_spans[r];
            match place {
                0 => rs.scope_spans[s].spans[i].attributes.push(kv),
                1 => rs.scope_spans[s].spans[i].events.push(Event { attributes: vec![kv], ..Default::default() }),
                2 => rs.scope_spans[s].spans[i].links.push(Link { attributes: vec![kv], ..Default::default() }),
                3 => rs.resource.get_or_insert_with(Resource::default).attributes.push(kv),
                _ => rs.scope_spans[s].scope.get_or_insert_with(InstrumentationScope::default).attributes.push(kv),
            }
        }
        let body = req.encode_to_vec();
        let reference = from_proto(&req);
        check_lean(&body, &reference)?;
        let lean = decode_protobuf(&body).unwrap();
        prop_assert!(lean.rejected_ranges.len() <= lean.rejected as usize);
        prop_assert_eq!(lean.rejected_ranges.is_empty(), lean.rejected == 0);
        // The body without the rejected spans is the reference's filtered request.
        let cut = without_spans(&body, &lean.rejected_ranges).unwrap();
        let mut filtered = req.clone();
        prop_assert_eq!(retain_accepted(&mut filtered), reference.rejected as usize);
        prop_assert_eq!(ExportTraceServiceRequest::decode(&cut[..]).unwrap(), filtered);
    }
}
