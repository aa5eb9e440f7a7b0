//! A compact encoding of decoded [`Span`]s, for the spans of prepared traces from fat bodies.
//!
//! A prepared trace (see [`super::PreparedTrace`]) holds its analysis, not its spans, through the
//! grace period; it still needs its spans if more of the trace arrives (it is then analysed
//! again) or if it is kept for `/api/traces/{id}`. It holds ranges of the request body when the
//! body is lean; a body fatter than
//! [`MAX_BODY_BYTES_PER_PREPARED_SPAN`](super::source::MAX_BODY_BYTES_PER_PREPARED_SPAN) a
//! prepared span (prompts, events, long attribute values) is freed at once and its prepared
//! spans are kept in this encoding instead: exactly what a decoded [`Span`] holds (ids, name,
//! kind, times, status, the kept attributes as key indexes into [`KNOWN_KEYS`], links), about
//! 90 bytes a span of an inference trace, whatever the exporter sent besides.
//!
//! [`decode`] gives back a span equal to the one encoded (strings are interned again, so they
//! may be other allocations of the same text). The trace id is not in the encoding: a prepared
//! trace's spans all have its id, which the trace holds once. Layout, little-endian:
//!
//! ```text
//! span_id[8] flags:u8 (bit 0 parent, bits 1-3 kind, bits 4-5 status, bit 6 end before start)
//! [parent_span_id[8]] start:u64 (end - start):varint | (bit 6) end:u64
//! name:str attributes:varint {key:u8 value}* links:varint {trace_id[16] span_id[8]}*
//! str   = len:varint bytes
//! value = 0 str | 1 int:zigzag varint | 2 double:f64 | 3 bool:u8 | 4 count:varint str*
//! ```
//!
//! The trace id is kept once per trace and integers are varints, so a typical inference trace
//! takes about a third of its size on the wire.

use std::sync::LazyLock;

use infertrace_analysis::text::{Interner, Text};
use infertrace_analysis::trace::{
    AttrValue, KNOWN_KEYS, Span, SpanId, SpanKind, SpanLink, StatusCode, TraceId, known_key_index,
};
use infertrace_semconv as sc;

/// Why bytes did not decode (a bug: only [`encode`]'s output is ever decoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("compact span encoding: {0}")]
pub struct CodecError(pub(crate) &'static str);

/// Appends `span` to `out`, without its trace id (see the module docs). Attributes whose key is
/// not in [`KNOWN_KEYS`] (decoders never keep one) are left out.
pub fn encode(span: &Span, out: &mut Vec<u8>) {
    out.extend_from_slice(&span.span_id.0);
    let kind = match span.kind {
        SpanKind::Unspecified => 0u8,
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    let status = match span.status {
        StatusCode::Unset => 0u8,
        StatusCode::Ok => 1,
        StatusCode::Error => 2,
    };
    let duration = span.end_unix_nano.checked_sub(span.start_unix_nano);
    out.push(
        u8::from(span.parent_span_id.is_some())
            | kind << 1
            | status << 4
            | u8::from(duration.is_none()) << 6,
    );
    if let Some(p) = span.parent_span_id {
        out.extend_from_slice(&p.0);
    }
    out.extend_from_slice(&span.start_unix_nano.to_le_bytes());
    match duration {
        Some(d) => varint(d, out),
        None => out.extend_from_slice(&span.end_unix_nano.to_le_bytes()),
    }
    string(span.name.as_bytes(), out);
    // The count goes first; it is one byte below 128 (every real span), so a byte is kept
    // for it and the rare larger count is spliced in after.
    let count_at = out.len();
    out.push(0);
    let mut count = 0u64;
    for (k, v) in &span.attributes {
        let Some(k) = key_index(k) else { continue };
        count += 1;
        out.push(k);
        match v {
            AttrValue::Str(s) => {
                out.push(0);
                string(s.as_bytes(), out);
            }
            AttrValue::Int(i) => {
                out.push(1);
                varint(zigzag(*i), out);
            }
            AttrValue::Double(d) => {
                out.push(2);
                out.extend_from_slice(&d.to_bits().to_le_bytes());
            }
            AttrValue::Bool(b) => {
                out.push(3);
                out.push(u8::from(*b));
            }
            AttrValue::StrArray(items) => {
                out.push(4);
                varint(items.len() as u64, out);
                for s in items {
                    string(s.as_bytes(), out);
                }
            }
        }
    }
    if count < 0x80 {
        out[count_at] = count as u8;
    } else {
        let mut prefix = Vec::new();
        varint(count, &mut prefix);
        out.splice(count_at..=count_at, prefix);
    }
    varint(span.links.len() as u64, out);
    for l in &span.links {
        out.extend_from_slice(&l.trace_id.0);
        out.extend_from_slice(&l.span_id.0);
    }
}

/// The span encoded at the start of `buf`, of trace `trace_id` and the resource `service`, and
/// the bytes it took. Names and string values are interned with `interner`, except
/// `gen_ai.request.id` values (one per request, as the decoders treat them).
pub fn decode(
    buf: &[u8],
    trace_id: TraceId,
    service: &Text,
    interner: &mut Interner,
) -> Result<(Span, usize), CodecError> {
    let mut r = Reader { buf, at: 0 };
    let span_id = SpanId(r.array()?);
    let flags = r.byte()?;
    let parent_span_id = if flags & 1 == 1 {
        Some(SpanId(r.array()?))
    } else {
        None
    };
    let start_unix_nano = u64::from_le_bytes(r.array()?);
    let end_unix_nano = if flags & 0x40 == 0 {
        start_unix_nano
            .checked_add(r.varint()?)
            .ok_or(CodecError("end past the clock"))?
    } else {
        u64::from_le_bytes(r.array()?)
    };
    let name = r.text(interner)?;
    // Vectors sized exactly for valid input (as the decoders size them, so that spans decoded
    // again hold what was reserved for them), and bounded by the bytes left for bad input: an
    // attribute takes at least three bytes, a link 24, a string one.
    let count = r.varint()?;
    let mut attributes = Vec::with_capacity(r.at_most(count, 3));
    for _ in 0..count {
        let key = *KNOWN_KEYS
            .get(usize::from(r.byte()?))
            .ok_or(CodecError("unknown key index"))?;
        let value = match r.byte()? {
            0 if key == sc::gen_ai::REQUEST_ID => AttrValue::Str(Text::from(r.str()?)),
            0 => AttrValue::Str(r.text(interner)?),
            1 => AttrValue::Int(unzigzag(r.varint()?)),
            2 => AttrValue::Double(f64::from_bits(u64::from_le_bytes(r.array()?))),
            3 => AttrValue::Bool(r.byte()? != 0),
            4 => {
                let n = r.varint()?;
                let mut items = Vec::with_capacity(r.at_most(n, 1));
                for _ in 0..n {
                    items.push(r.text(interner)?);
                }
                AttrValue::StrArray(items)
            }
            _ => return Err(CodecError("unknown value tag")),
        };
        attributes.push((key, value));
    }
    let n = r.varint()?;
    let mut links = Vec::with_capacity(r.at_most(n, 24));
    for _ in 0..n {
        links.push(SpanLink {
            trace_id: TraceId(r.array()?),
            span_id: SpanId(r.array()?),
        });
    }
    let span = Span {
        trace_id,
        span_id,
        parent_span_id,
        name,
        service: service.clone(),
        kind: SpanKind::from_otlp(i32::from(flags >> 1 & 7)),
        start_unix_nano,
        end_unix_nano,
        status: StatusCode::from_otlp(i32::from(flags >> 4 & 3)),
        attributes,
        links,
    };
    Ok((span, r.at))
}

// Key indexes are one byte.
const _: () = assert!(KNOWN_KEYS.len() <= 256);

/// Slots of [`KEYS_BY_ADDRESS`] (a power of two, at least twice the keys).
const KEY_TABLE_SLOTS: usize = 512;

/// `KNOWN_KEYS` by the address and length of each key's own string, in an open-addressing
/// table built once: the decoders hand out exactly these `&'static str`s, so a span's key is
/// found with a probe or two instead of comparing text, with no per-thread cache. (Static memory is never freed or reused,
/// so an address with its length names one string for good.) Empty slots have address 0.
static KEYS_BY_ADDRESS: LazyLock<Box<[(usize, usize, u8)]>> = LazyLock::new(|| {
    let mut table = vec![(0usize, 0usize, 0u8); KEY_TABLE_SLOTS].into_boxed_slice();
    for (i, k) in KNOWN_KEYS.iter().enumerate() {
        let Ok(index) = u8::try_from(i) else { continue };
        let mut slot = address_slot(k.as_ptr() as usize);
        while table[slot].0 != 0 {
            slot = (slot + 1) % KEY_TABLE_SLOTS;
        }
        table[slot] = (k.as_ptr() as usize, k.len(), index);
    }
    table
});

const _: () = assert!(KNOWN_KEYS.len() * 2 <= KEY_TABLE_SLOTS);

fn address_slot(address: usize) -> usize {
    (address.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) % KEY_TABLE_SLOTS
}

/// The index of `key` in [`KNOWN_KEYS`] (`None` for a key not in it).
fn key_index(key: &'static str) -> Option<u8> {
    let address = key.as_ptr() as usize;
    let table = &*KEYS_BY_ADDRESS;
    let mut slot = address_slot(address);
    loop {
        let (a, len, index) = table[slot];
        if a == address && len == key.len() {
            return Some(index);
        }
        if a == 0 {
            break;
        }
        slot = (slot + 1) % KEY_TABLE_SLOTS;
    }
    // Another string with a known key's text (spans built by hand, other decoders).
    known_key_index(key.as_bytes())
}

/// An integer as an unsigned one with small magnitudes small (protobuf's `sint64` mapping).
fn zigzag(i: i64) -> u64 {
    ((i << 1) ^ (i >> 63)) as u64
}

fn unzigzag(n: u64) -> i64 {
    (n >> 1) as i64 ^ -((n & 1) as i64)
}

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    varint(s.len() as u64, out);
    out.extend_from_slice(s);
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// `count`, or fewer when the bytes left cannot hold `count` items of `min_size` bytes.
    fn at_most(&self, count: u64, min_size: usize) -> usize {
        let fit = (self.buf.len() - self.at) / min_size;
        usize::try_from(count).map_or(fit, |c| c.min(fit))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .at
            .checked_add(n)
            .ok_or(CodecError("length overflow"))?;
        let bytes = self.buf.get(self.at..end).ok_or(CodecError("truncated"))?;
        self.at = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn byte(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    fn varint(&mut self) -> Result<u64, CodecError> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(n);
            }
        }
        Err(CodecError("varint too long"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let n = usize::try_from(self.varint()?).map_err(|_| CodecError("length overflow"))?;
        self.take(n)
    }

    fn str(&mut self) -> Result<&'a str, CodecError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| CodecError("invalid UTF-8"))
    }

    fn text(&mut self, interner: &mut Interner) -> Result<Text, CodecError> {
        interner
            .intern_utf8(self.bytes()?)
            .map_err(|_| CodecError("invalid UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Span {
        Span {
            trace_id: TraceId([3; 16]),
            span_id: SpanId([4; 8]),
            parent_span_id: Some(SpanId([5; 8])),
            name: "chat llama".into(),
            service: Text::from("engine"),
            kind: SpanKind::Server,
            start_unix_nano: 1_790_000_000_000_000_000,
            end_unix_nano: 1_790_000_001_000_000_000,
            status: StatusCode::Error,
            attributes: vec![
                (sc::gen_ai::REQUEST_MODEL, AttrValue::Str("llama".into())),
                (sc::gen_ai::REQUEST_ID, AttrValue::Str("req-1".into())),
                (sc::gen_ai::USAGE_INPUT_TOKENS, AttrValue::Int(-7)),
                (sc::infer::TIME_PER_OUTPUT_TOKEN, AttrValue::Double(0.0063)),
                (sc::gen_ai::REQUEST_STREAM, AttrValue::Bool(true)),
                (
                    sc::gen_ai::RESPONSE_FINISH_REASONS,
                    AttrValue::StrArray(vec!["stop".into(), "length".into()]),
                ),
            ],
            links: vec![SpanLink {
                trace_id: TraceId([9; 16]),
                span_id: SpanId([8; 8]),
            }],
        }
    }

    fn round_trip(spans: &[Span]) -> Vec<Span> {
        let mut buf = Vec::new();
        for s in spans {
            encode(s, &mut buf);
        }
        let mut interner = Interner::default();
        let mut out = Vec::new();
        let mut at = 0;
        while at < buf.len() {
            let (span, used) = decode(
                &buf[at..],
                spans[0].trace_id,
                &spans[0].service,
                &mut interner,
            )
            .unwrap();
            out.push(span);
            at += used;
        }
        out
    }

    #[test]
    fn every_field_comes_back() {
        let span = sample();
        let mut root = sample();
        root.parent_span_id = None;
        root.kind = SpanKind::Consumer;
        root.status = StatusCode::Ok;
        root.attributes.clear();
        root.links.clear();
        assert_eq!(round_trip(&[span.clone(), root.clone()]), vec![span, root]);
    }

    #[test]
    fn a_span_with_hundreds_of_attributes_comes_back() {
        let mut span = sample();
        span.attributes = (0..300)
            .map(|i| (KNOWN_KEYS[i % KNOWN_KEYS.len()], AttrValue::Int(i as i64)))
            .collect();
        assert_eq!(round_trip(std::slice::from_ref(&span)), vec![span]);
    }

    #[test]
    fn it_is_smaller_than_the_span_in_the_body() {
        use opentelemetry_proto::tonic::common::v1::{
            AnyValue, ArrayValue, KeyValue, any_value::Value,
        };
        use opentelemetry_proto::tonic::trace::v1::{Span as ProtoSpan, Status, span::Link};
        use prost::Message;
        let span = sample();
        let value = |v: &AttrValue| match v {
            AttrValue::Str(s) => Value::StringValue(s.to_string()),
            AttrValue::Int(i) => Value::IntValue(*i),
            AttrValue::Double(d) => Value::DoubleValue(*d),
            AttrValue::Bool(b) => Value::BoolValue(*b),
            AttrValue::StrArray(items) => Value::ArrayValue(ArrayValue {
                values: items
                    .iter()
                    .map(|s| AnyValue {
                        value: Some(Value::StringValue(s.to_string())),
                    })
                    .collect(),
            }),
        };
        let proto = ProtoSpan {
            trace_id: span.trace_id.0.to_vec(),
            span_id: span.span_id.0.to_vec(),
            parent_span_id: span.parent_span_id.map_or(Vec::new(), |p| p.0.to_vec()),
            name: span.name.to_string(),
            kind: 2,
            start_time_unix_nano: span.start_unix_nano,
            end_time_unix_nano: span.end_unix_nano,
            attributes: span
                .attributes
                .iter()
                .map(|(k, v)| KeyValue {
                    key: (*k).to_string(),
                    value: Some(AnyValue {
                        value: Some(value(v)),
                    }),
                    ..Default::default()
                })
                .collect(),
            links: span
                .links
                .iter()
                .map(|l| Link {
                    trace_id: l.trace_id.0.to_vec(),
                    span_id: l.span_id.0.to_vec(),
                    ..Default::default()
                })
                .collect(),
            status: Some(Status {
                code: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut buf = Vec::new();
        encode(&span, &mut buf);
        let wire = proto.encoded_len();
        // Keys are one byte each instead of their text: well under the wire form.
        assert!(
            buf.len() * 3 < wire * 2,
            "{} against {wire} bytes",
            buf.len()
        );
    }

    #[test]
    fn a_key_outside_the_known_keys_is_left_out_and_bad_input_is_an_error() {
        let mut span = sample();
        span.attributes = vec![("not.a.known.key", AttrValue::Int(1))];
        assert!(round_trip(&[span])[0].attributes.is_empty());
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        let mut interner = Interner::default();
        let service = Text::from("s");
        for cut in [0, 10, 40, buf.len() - 1] {
            assert!(
                decode(&buf[..cut], TraceId([1; 16]), &service, &mut interner).is_err(),
                "{cut}"
            );
        }
    }

    #[test]
    fn every_known_key_is_found_by_its_address_and_by_its_text() {
        for (i, key) in KNOWN_KEYS.iter().enumerate() {
            assert_eq!(key_index(key), u8::try_from(i).ok(), "{key}");
            // The same text at another address (a span built by hand).
            let copy: &'static str = Box::leak(key.to_string().into_boxed_str());
            assert_eq!(key_index(copy), u8::try_from(i).ok(), "{key}");
        }
        assert_eq!(key_index("not.a.known.key"), None);
        assert_eq!(key_index(""), None);
    }

    fn arb_value() -> impl Strategy<Value = AttrValue> {
        prop_oneof![
            "[a-z0-9 é]{0,20}".prop_map(|s| AttrValue::Str(s.as_str().into())),
            any::<i64>().prop_map(AttrValue::Int),
            any::<f64>()
                .prop_filter("NaN is not equal to itself", |d| !d.is_nan())
                .prop_map(AttrValue::Double),
            any::<bool>().prop_map(AttrValue::Bool),
            prop::collection::vec("[a-z]{0,8}", 0..4)
                .prop_map(|v| AttrValue::StrArray(v.iter().map(|s| s.as_str().into()).collect())),
        ]
    }

    proptest! {
        #[test]
        fn any_span_comes_back_equal(
            ids in any::<([u8; 16], [u8; 8], Option<[u8; 8]>)>(),
            name in "[a-zA-Z0-9 /_.-]{0,200}",
            kind in 0i32..6,
            status in 0i32..3,
            times in any::<(u64, u64)>(),
            attrs in prop::collection::vec((0..KNOWN_KEYS.len(), arb_value()), 0..20),
            links in prop::collection::vec(any::<([u8; 16], [u8; 8])>(), 0..3),
        ) {
            let span = Span {
                trace_id: TraceId(ids.0),
                span_id: SpanId(ids.1),
                parent_span_id: ids.2.map(SpanId),
                name: name.as_str().into(),
                service: Text::from("svc"),
                kind: SpanKind::from_otlp(kind),
                start_unix_nano: times.0,
                end_unix_nano: times.1,
                status: StatusCode::from_otlp(status),
                attributes: attrs.into_iter().map(|(k, v)| (KNOWN_KEYS[k], v)).collect(),
                links: links
                    .into_iter()
                    .map(|(t, s)| SpanLink { trace_id: TraceId(t), span_id: SpanId(s) })
                    .collect(),
            };
            prop_assert_eq!(round_trip(&[span.clone(), span.clone()]), vec![span.clone(), span]);
        }

        #[test]
        fn any_integer_comes_back(i in any::<i64>()) {
            prop_assert_eq!(unzigzag(zigzag(i)), i);
        }
    }
}
