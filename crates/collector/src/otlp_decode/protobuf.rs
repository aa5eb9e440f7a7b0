//! The lean protobuf decoder: `ExportTraceServiceRequest` bytes → [`Span`]s, reading only what
//! the analysis needs and skipping everything else by wire type.
//!
//! Field semantics follow prost exactly where prost accepts the input: the last occurrence of a
//! scalar or bytes field wins, repeated fields append, repeated occurrences of an embedded message
//! merge (so `resource` and `status` may come in pieces), and the `AnyValue` oneof takes the last
//! variant seen (two `array_value`s in a row concatenate). Fields may come in any order; a
//! `ResourceSpans` is read twice (first its `resource`, then its spans) so the service name is
//! known even when the resource follows the spans.
//!
//! Where prost would reject the input this decoder may accept it (it does not look inside what it
//! skips), never the other way round.

use std::sync::LazyLock;

use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{AttrValue, KNOWN_KEYS, Span, SpanKind, StatusCode};
use infertrace_analysis::trace::{SpanLink, UNKNOWN_SERVICE};
use infertrace_semconv::resource::SERVICE_NAME;

use super::{
    DecodeError, Decoded, SpanRange, intern_value, valid_link, validate_span, with_interner,
};
use infertrace_analysis::text::{Interner, same_bytes};

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// Nesting limit for skipped groups (prost's recursion limit).
const MAX_GROUP_DEPTH: u32 = 100;

/// Decodes a protobuf `ExportTraceServiceRequest` into spans (see the [module rules](super)).
pub fn decode_protobuf(buf: &[u8]) -> Result<Decoded, DecodeError> {
    with_interner(|interner| decode_with(buf, interner))
}

fn decode_with(buf: &[u8], interner: &mut Interner) -> Result<Decoded, DecodeError> {
    // Size the output for typical spans (~250 wire bytes) to skip most regrowth of a large
    // vector without a separate pass over the body.
    let mut decoder = RequestDecoder::new(buf, buf.len() / 256, interner);
    let mut r = Reader::new(buf);
    while let Some((field, wire)) = r.key()? {
        if field == 1 {
            let resource_spans = r.len_field(wire)?;
            decoder.resource_spans(resource_spans)?;
        } else {
            r.skip(field, wire)?;
        }
    }
    if u32::try_from(buf.len()).is_err() {
        decoder.out.span_ranges = Vec::new();
    }
    Ok(decoder.out)
}

/// Decodes one `Span` message again — the bytes at one of [`Decoded::span_ranges`] in the body
/// [`decode_protobuf`] read — as a span of `service` (its resource's service, which the message
/// does not hold): the span `decode_protobuf` gave. `Ok(None)` when the span is invalid (such a
/// span was rejected, and has no range).
pub fn decode_span(
    buf: &[u8],
    service: &Text,
    interner: &mut Interner,
) -> Result<Option<Span>, DecodeError> {
    let mut decoder = RequestDecoder::new(buf, 1, interner);
    decoder.span(buf, service)?;
    Ok(decoder.out.spans.pop())
}

/// Counts the spans of a protobuf `ExportTraceServiceRequest` without decoding them (to count
/// what a refused request held). `None` when the body is not a well-formed request.
pub fn count_spans(buf: &[u8]) -> Option<u64> {
    fn count(buf: &[u8], path: &[u32]) -> Result<u64, DecodeError> {
        let Some((&wanted, rest)) = path.split_first() else {
            return Ok(1);
        };
        let mut n = 0;
        let mut r = Reader::new(buf);
        while let Some((field, wire)) = r.key()? {
            if field == wanted {
                n += count(r.len_field(wire)?, rest)?;
            } else {
                r.skip(field, wire)?;
            }
        }
        Ok(n)
    }
    // request.resource_spans(1) → scope_spans(2) → spans(2)
    count(buf, &[1, 2, 2]).ok()
}

/// Per-request state: the output and scratch vectors reused for every span.
struct RequestDecoder<'a, 'i> {
    out: Decoded,
    /// The address of the body's first byte (span ranges are offsets from it).
    body_address: usize,
    interner: &'i mut Interner,
    attributes: Vec<(&'static str, AttrValue)>,
    links: Vec<SpanLink>,
    last_service: Option<(&'a [u8], Text)>,
}

impl<'a, 'i> RequestDecoder<'a, 'i> {
    /// A decoder of `body` sized for `capacity` spans.
    fn new(body: &[u8], capacity: usize, interner: &'i mut Interner) -> Self {
        Self {
            out: Decoded {
                spans: Vec::with_capacity(capacity),
                span_ranges: Vec::with_capacity(capacity),
                ..Decoded::default()
            },
            body_address: body.as_ptr() as usize,
            attributes: Vec::new(),
            links: Vec::new(),
            last_service: None,
            interner,
        }
    }

    fn resource_spans(&mut self, buf: &'a [u8]) -> Result<(), DecodeError> {
        // Pass 1: the service name, from every `resource` occurrence (they merge).
        let mut service_name: Option<&'a [u8]> = None;
        let mut r = Reader::new(buf);
        while let Some((field, wire)) = r.key()? {
            if field == 1 {
                let resource = r.len_field(wire)?;
                if service_name.is_none() {
                    service_name = resource_service_name(resource)?;
                }
            } else {
                r.skip(field, wire)?;
            }
        }
        let service = self.service(service_name.unwrap_or(UNKNOWN_SERVICE.as_bytes()))?;
        // Pass 2: the spans.
        let mut r = Reader::new(buf);
        while let Some((field, wire)) = r.key()? {
            if field == 2 {
                let scope_spans = r.len_field(wire)?;
                let mut s = Reader::new(scope_spans);
                while let Some((field, wire)) = s.key()? {
                    if field == 2 {
                        let span = s.len_field(wire)?;
                        self.span(span, &service)?;
                    } else {
                        s.skip(field, wire)?;
                    }
                }
            } else {
                r.skip(field, wire)?;
            }
        }
        Ok(())
    }

    /// The interned text of a service name (reused while consecutive resources agree): the same
    /// allocation batch after batch, static once common (see [`Interner`]), so that spans and
    /// records clone it without touching a shared counter.
    fn service(&mut self, name: &'a [u8]) -> Result<Text, DecodeError> {
        if let Some((last, arc)) = &self.last_service
            && *last == name
        {
            return Ok(arc.clone());
        }
        let text = self
            .interner
            .intern_utf8(name)
            .map_err(|_| DecodeError::InvalidUtf8)?;
        self.last_service = Some((name, text.clone()));
        Ok(text)
    }

    fn span(&mut self, buf: &[u8], service: &Text) -> Result<(), DecodeError> {
        let mut trace_id: &[u8] = &[];
        let mut span_id: &[u8] = &[];
        let mut parent: &[u8] = &[];
        let mut name: &[u8] = &[];
        let mut kind = 0i32;
        let mut start = 0u64;
        let mut end = 0u64;
        let mut status = 0i32;
        self.attributes.clear();
        self.links.clear();
        let mut r = Reader::new(buf);
        while let Some((field, wire)) = r.key()? {
            match field {
                1 => trace_id = r.len_field(wire)?,
                2 => span_id = r.len_field(wire)?,
                4 => parent = r.len_field(wire)?,
                5 => name = r.len_field(wire)?,
                6 => kind = r.varint_field(wire)? as i32,
                7 => start = r.fixed64_field(wire)?,
                8 => end = r.fixed64_field(wire)?,
                9 => key_value(r.len_field(wire)?, self.interner, &mut self.attributes)?,
                13 => {
                    if let Some(link) = link(r.len_field(wire)?)? {
                        self.links.push(link);
                    }
                }
                15 => {
                    let mut s = Reader::new(r.len_field(wire)?);
                    while let Some((field, wire)) = s.key()? {
                        if field == 3 {
                            status = s.varint_field(wire)? as i32;
                        } else {
                            s.skip(field, wire)?;
                        }
                    }
                }
                _ => r.skip(field, wire)?,
            }
        }
        let name = self
            .interner
            .intern_utf8(name)
            .map_err(|_| DecodeError::InvalidUtf8)?;
        let ids = match validate_span(trace_id, span_id, parent, start, end) {
            Ok(ids) => ids,
            Err(why) => {
                self.out.reject(why);
                return Ok(());
            }
        };
        // Offsets past 4 GiB wrap; such a body's ranges are dropped as a whole.
        self.out.span_ranges.push(SpanRange {
            offset: (buf.as_ptr() as usize - self.body_address) as u32,
            len: buf.len() as u32,
        });
        self.out.spans.push(Span {
            trace_id: ids.trace_id,
            span_id: ids.span_id,
            parent_span_id: ids.parent_span_id,
            name,
            service: service.clone(),
            kind: SpanKind::from_otlp(kind),
            start_unix_nano: start,
            end_unix_nano: end,
            status: StatusCode::from_otlp(status),
            attributes: take_exact(&mut self.attributes),
            links: take_exact(&mut self.links),
        });
        Ok(())
    }
}

/// The scratch's items moved into a vector of exactly their number (one copy of the block; none
/// and no allocation when empty), leaving the scratch empty with its capacity.
fn take_exact<T>(scratch: &mut Vec<T>) -> Vec<T> {
    if scratch.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(scratch.len());
    out.append(scratch);
    out
}

/// The first string-valued `service.name` of a `Resource` message.
fn resource_service_name(buf: &[u8]) -> Result<Option<&[u8]>, DecodeError> {
    let mut r = Reader::new(buf);
    while let Some((field, wire)) = r.key()? {
        if field == 1 {
            let kv = r.len_field(wire)?;
            if last_key(kv)? == SERVICE_NAME.as_bytes()
                && let AnyValueState::Str(name) = value_state(kv)?
            {
                utf8(name)?;
                return Ok(Some(name));
            }
        } else {
            r.skip(field, wire)?;
        }
    }
    Ok(None)
}

/// A `KeyValue` whose key is kept, converted; `None` for dropped keys and values.
/// Reads a `KeyValue` and appends it to `out` when its key is kept and its value is of a kept
/// kind. (Appending here, one push per kind, writes the pair straight into the vector; returned
/// through the stack, it was copied back with 16-byte loads over 8-byte stores, which `perf`
/// showed stalling. Decode-only time went from 254 to 238–243 ns per span.)
fn key_value(
    buf: &[u8],
    interner: &mut Interner,
    out: &mut Vec<(&'static str, AttrValue)>,
) -> Result<(), DecodeError> {
    // One pass for the usual shape (one key, one value); repeated values fold in a second pass.
    let mut key: &[u8] = &[];
    let mut value: Option<&[u8]> = None;
    let mut repeated_value = false;
    let mut r = Reader::new(buf);
    while let Some((field, wire)) = r.key()? {
        match field {
            1 => key = r.len_field(wire)?,
            2 => {
                repeated_value |= value.is_some();
                value = Some(r.len_field(wire)?);
            }
            _ => r.skip(field, wire)?,
        }
    }
    let Some(key) = known_key(key) else {
        return Ok(());
    };
    let state = if repeated_value {
        value_state(buf)?
    } else {
        let mut state = AnyValueState::Empty;
        if let Some(value) = value {
            merge_any_value(value, &mut state)?;
        }
        state
    };
    // One push per kind: each writes its tag and payload straight into the vector.
    match state {
        AnyValueState::Str(s) => {
            let t = intern_value(key, s, interner)?;
            out.push((key, AttrValue::Str(t)));
        }
        AnyValueState::Bool(b) => out.push((key, AttrValue::Bool(b))),
        AnyValueState::Int(i) => out.push((key, AttrValue::Int(i))),
        AnyValueState::Double(d) => out.push((key, AttrValue::Double(d))),
        AnyValueState::Array(Some(items)) => {
            let items = items
                .into_iter()
                .map(|s| {
                    interner
                        .intern_utf8(s)
                        .map_err(|_| DecodeError::InvalidUtf8)
                })
                .collect::<Result<_, _>>()?;
            out.push((key, AttrValue::StrArray(items)));
        }
        AnyValueState::Array(None) | AnyValueState::Other | AnyValueState::Empty => {}
    }
    Ok(())
}

/// The key of a `KeyValue` message (last occurrence wins).
fn last_key(buf: &[u8]) -> Result<&[u8], DecodeError> {
    let mut key: &[u8] = &[];
    let mut r = Reader::new(buf);
    while let Some((field, wire)) = r.key()? {
        if field == 1 {
            key = r.len_field(wire)?;
        } else {
            r.skip(field, wire)?;
        }
    }
    Ok(key)
}

/// What an `AnyValue` holds after merging every occurrence, with strings still as bytes.
enum AnyValueState<'a> {
    Empty,
    Str(&'a [u8]),
    Bool(bool),
    Int(i64),
    Double(f64),
    /// `Some(strings)` while every element is a string.
    Array(Option<Vec<&'a [u8]>>),
    /// A variant infertrace does not keep (key-value list, bytes, string index).
    Other,
}

/// Folds every `value` field (2) of a `KeyValue` into one [`AnyValueState`].
fn value_state(buf: &[u8]) -> Result<AnyValueState<'_>, DecodeError> {
    let mut state = AnyValueState::Empty;
    let mut r = Reader::new(buf);
    while let Some((field, wire)) = r.key()? {
        if field == 2 {
            merge_any_value(r.len_field(wire)?, &mut state)?;
        } else {
            r.skip(field, wire)?;
        }
    }
    Ok(state)
}

fn merge_any_value<'a>(buf: &'a [u8], state: &mut AnyValueState<'a>) -> Result<(), DecodeError> {
    let mut r = Reader::new(buf);
    while let Some((field, wire)) = r.key()? {
        match field {
            1 => *state = AnyValueState::Str(r.len_field(wire)?),
            2 => *state = AnyValueState::Bool(r.varint_field(wire)? != 0),
            3 => *state = AnyValueState::Int(r.varint_field(wire)? as i64),
            4 => *state = AnyValueState::Double(f64::from_bits(r.fixed64_field(wire)?)),
            5 => {
                let array = r.len_field(wire)?;
                if !matches!(state, AnyValueState::Array(_)) {
                    *state = AnyValueState::Array(Some(Vec::new()));
                }
                if let AnyValueState::Array(items) = state {
                    merge_string_array(array, items)?;
                }
            }
            6..=8 => {
                r.skip(field, wire)?;
                *state = AnyValueState::Other;
            }
            _ => r.skip(field, wire)?,
        }
    }
    Ok(())
}

/// Appends the elements of an `ArrayValue` while they are all strings.
fn merge_string_array<'a>(
    buf: &'a [u8],
    items: &mut Option<Vec<&'a [u8]>>,
) -> Result<(), DecodeError> {
    let mut r = Reader::new(buf);
    while let Some((field, wire)) = r.key()? {
        if field != 1 {
            r.skip(field, wire)?;
            continue;
        }
        let element = r.len_field(wire)?;
        let Some(list) = items else { continue };
        // The element's final variant: a string only if the last oneof field is string_value.
        let mut string: Option<&[u8]> = None;
        let mut e = Reader::new(element);
        while let Some((field, wire)) = e.key()? {
            match field {
                1 => string = Some(e.len_field(wire)?),
                2..=8 => {
                    e.skip(field, wire)?;
                    string = None;
                }
                _ => e.skip(field, wire)?,
            }
        }
        match string {
            Some(s) => list.push(s),
            None => *items = None,
        }
    }
    Ok(())
}

/// A `Link` with valid ids.
fn link(buf: &[u8]) -> Result<Option<SpanLink>, DecodeError> {
    let mut trace_id: &[u8] = &[];
    let mut span_id: &[u8] = &[];
    let mut r = Reader::new(buf);
    while let Some((field, wire)) = r.key()? {
        match field {
            1 => trace_id = r.len_field(wire)?,
            2 => span_id = r.len_field(wire)?,
            _ => r.skip(field, wire)?,
        }
    }
    Ok(valid_link(trace_id, span_id))
}

fn utf8(b: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(b).map_err(|_| DecodeError::InvalidUtf8)
}

/// [`KNOWN_KEYS`] bucketed by length, so a lookup compares against a handful of keys at most.
static KNOWN_BY_LEN: LazyLock<Vec<Vec<&'static str>>> = LazyLock::new(|| {
    let longest = KNOWN_KEYS.iter().map(|k| k.len()).max().unwrap_or(0);
    let mut buckets = vec![Vec::new(); longest + 1];
    for key in KNOWN_KEYS {
        buckets[key.len()].push(*key);
    }
    buckets
});

/// Same answer as [`infertrace_analysis::trace::known_key`], faster.
fn known_key(key: &[u8]) -> Option<&'static str> {
    KNOWN_BY_LEN
        .get(key.len())?
        .iter()
        .copied()
        .find(|k| same_bytes(k.as_bytes(), key))
}

/// A cursor over one protobuf message.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    #[cold]
    fn error(&self, what: &'static str) -> DecodeError {
        DecodeError::Protobuf {
            offset: self.pos,
            what,
        }
    }

    /// A varint; the one- and two-byte cases (keys, most lengths) stay inline.
    #[inline(always)]
    fn varint(&mut self) -> Result<u64, DecodeError> {
        match self.buf.get(self.pos..self.pos + 2) {
            Some(&[b0, _]) if b0 < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b0))
            }
            Some(&[b0, b1]) if b1 < 0x80 => {
                self.pos += 2;
                Ok(u64::from(b0 & 0x7f) | (u64::from(b1) << 7))
            }
            _ => self.varint_slow(),
        }
    }

    #[inline(never)]
    fn varint_slow(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(self.error("truncated varint"));
            };
            self.pos += 1;
            if i == 9 && byte > 1 {
                return Err(self.error("varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(self.error("varint longer than 10 bytes"))
    }

    /// The next field's number and wire type, or `None` at the end of the message.
    #[inline(always)]
    fn key(&mut self) -> Result<Option<(u32, u8)>, DecodeError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let wire = (key & 7) as u8;
        let field = key >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(self.error("invalid field number"));
        }
        if wire > FIXED32 {
            return Err(self.error("invalid wire type"));
        }
        Ok(Some((field as u32, wire)))
    }

    #[inline]
    fn len_field(&mut self, wire: u8) -> Result<&'a [u8], DecodeError> {
        if wire != LEN {
            return Err(self.error("expected a length-delimited field"));
        }
        self.bytes()
    }

    #[inline]
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.varint()?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| self.pos.checked_add(len))
            .filter(|end| *end <= self.buf.len())
            .ok_or_else(|| self.error("length past the end of the message"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    #[inline]
    fn varint_field(&mut self, wire: u8) -> Result<u64, DecodeError> {
        if wire != VARINT {
            return Err(self.error("expected a varint field"));
        }
        self.varint()
    }

    #[inline]
    fn fixed64_field(&mut self, wire: u8) -> Result<u64, DecodeError> {
        if wire != FIXED64 {
            return Err(self.error("expected a fixed64 field"));
        }
        let bytes = self.take(8)?;
        let mut arr = [0u8; 8];
        arr.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(arr))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.buf.len())
            .ok_or_else(|| self.error("truncated fixed-width field"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// Skips the value of a field of any wire type, groups included.
    fn skip(&mut self, field: u32, wire: u8) -> Result<(), DecodeError> {
        self.skip_at_depth(field, wire, 0)
    }

    fn skip_at_depth(&mut self, field: u32, wire: u8, depth: u32) -> Result<(), DecodeError> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            LEN => self.bytes().map(drop),
            FIXED32 => self.take(4).map(drop),
            START_GROUP => {
                if depth >= MAX_GROUP_DEPTH {
                    return Err(self.error("groups nested too deep"));
                }
                loop {
                    let Some((inner, inner_wire)) = self.key()? else {
                        return Err(self.error("unterminated group"));
                    };
                    if inner_wire == END_GROUP {
                        if inner != field {
                            return Err(self.error("mismatched end group"));
                        }
                        return Ok(());
                    }
                    self.skip_at_depth(inner, inner_wire, depth + 1)?;
                }
            }
            _ => Err(self.error("unexpected end group")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp_decode::from_proto;
    use infertrace_analysis::trace::{SpanId, TraceId, known_key as reference_known_key};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as PSpan};
    use prost::Message;

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            key_strindex: 0,
        }
    }

    fn request(spans: Vec<PSpan>, service: Option<&str>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: service.map(|s| Resource {
                    attributes: vec![kv(SERVICE_NAME, any_value::Value::StringValue(s.into()))],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                schema_url: String::new(),
            }],
        }
    }

    fn span(id: u8) -> PSpan {
        PSpan {
            trace_id: vec![9; 16],
            span_id: vec![id; 8],
            name: format!("span {id}"),
            kind: 2,
            start_time_unix_nano: 100,
            end_time_unix_nano: 200,
            ..Default::default()
        }
    }

    #[test]
    fn bytes_of_new_strings_are_reported_once_for_the_memory_limiter() {
        let _ = crate::otlp_decode::take_fresh_text_bytes();
        let spans: Vec<PSpan> = (1..=50u8)
            .map(|i| PSpan {
                name: format!("fresh-bytes test name {i:02}"),
                ..span(i)
            })
            .collect();
        let body = request(spans, Some("svc")).encode_to_vec();
        decode_protobuf(&body).unwrap();
        let first = crate::otlp_decode::take_fresh_text_bytes();
        assert!(first >= 50 * "fresh-bytes test name 00".len(), "{first}");
        decode_protobuf(&body).unwrap();
        assert_eq!(
            crate::otlp_decode::take_fresh_text_bytes(),
            0,
            "the same names again are shared"
        );
    }

    #[test]
    fn known_key_index_agrees_with_the_reference() {
        for key in KNOWN_KEYS {
            assert_eq!(known_key(key.as_bytes()), Some(*key));
        }
        for key in ["", "service.name", "gen_ai.request.modelx", "gen_ai", "x"] {
            assert_eq!(
                known_key(key.as_bytes()),
                reference_known_key(key.as_bytes())
            );
        }
    }

    #[test]
    fn decodes_ids_times_kind_name_and_kept_attributes() {
        let mut s = span(1);
        s.parent_span_id = vec![5; 8];
        s.attributes = vec![
            kv(
                infertrace_semconv::gen_ai::REQUEST_MODEL,
                any_value::Value::StringValue("llama".into()),
            ),
            kv("not.kept", any_value::Value::StringValue("x".into())),
            kv(
                infertrace_semconv::gen_ai::USAGE_OUTPUT_TOKENS,
                any_value::Value::IntValue(42),
            ),
            kv(
                infertrace_semconv::gen_ai::RESPONSE_FINISH_REASONS,
                any_value::Value::ArrayValue(ArrayValue {
                    values: vec![AnyValue {
                        value: Some(any_value::Value::StringValue("stop".into())),
                    }],
                }),
            ),
        ];
        let bytes = request(vec![s], Some("svc")).encode_to_vec();
        let d = decode_protobuf(&bytes).unwrap();
        assert_eq!(d.rejected, 0);
        let got = &d.spans[0];
        assert_eq!(got.trace_id, TraceId([9; 16]));
        assert_eq!(got.span_id, SpanId([1; 8]));
        assert_eq!(got.parent_span_id, Some(SpanId([5; 8])));
        assert_eq!(got.name, "span 1");
        assert_eq!(&*got.service, "svc");
        assert_eq!(got.kind, SpanKind::Server);
        assert_eq!((got.start_unix_nano, got.end_unix_nano), (100, 200));
        assert_eq!(
            got.attributes,
            vec![
                (
                    infertrace_semconv::gen_ai::REQUEST_MODEL,
                    AttrValue::Str("llama".into())
                ),
                (
                    infertrace_semconv::gen_ai::USAGE_OUTPUT_TOKENS,
                    AttrValue::Int(42)
                ),
                (
                    infertrace_semconv::gen_ai::RESPONSE_FINISH_REASONS,
                    AttrValue::StrArray(vec!["stop".into()])
                ),
            ]
        );
    }

    #[test]
    fn invalid_spans_are_rejected_individually() {
        let mut bad_trace = span(1);
        bad_trace.trace_id = vec![1; 15];
        let mut backwards = span(2);
        backwards.end_time_unix_nano = 50;
        let bytes = request(vec![bad_trace, span(3), backwards], None).encode_to_vec();
        let d = decode_protobuf(&bytes).unwrap();
        assert_eq!(d.rejected, 2);
        assert_eq!(d.spans.len(), 1);
        assert_eq!(&*d.spans[0].service, UNKNOWN_SERVICE);
        assert!(d.first_error.unwrap().contains("15 bytes"));
    }

    #[test]
    fn resource_after_spans_and_merged_array_values() {
        // resource_spans { scope_spans {...} ; resource {...} } in that order on the wire.
        let req = request(vec![span(1)], Some("late"));
        let rs = &req.resource_spans[0];
        let mut rs_bytes = Vec::new();
        prost::encoding::message::encode(2, &rs.scope_spans[0], &mut rs_bytes);
        prost::encoding::message::encode(1, rs.resource.as_ref().unwrap(), &mut rs_bytes);
        let mut bytes = Vec::new();
        prost::encoding::bytes::encode(1, &rs_bytes, &mut bytes);
        let d = decode_protobuf(&bytes).unwrap();
        assert_eq!(&*d.spans[0].service, "late");
        let via_prost = from_proto(&ExportTraceServiceRequest::decode(&bytes[..]).unwrap());
        assert_eq!(d.spans, via_prost.spans);
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let bytes = request(vec![span(1)], Some("svc")).encode_to_vec();
        for cut in 1..bytes.len() {
            // Every strict prefix is malformed somewhere: a length runs past the end.
            let truncated = &bytes[..cut];
            let lean = decode_protobuf(truncated);
            let prost_ok = ExportTraceServiceRequest::decode(truncated).is_ok();
            if prost_ok {
                assert_eq!(
                    lean.unwrap().spans,
                    from_proto(&ExportTraceServiceRequest::decode(truncated).unwrap()).spans
                );
            } else {
                assert!(lean.is_err(), "cut at {cut} accepted");
            }
        }
        assert!(decode_protobuf(&[0x0f]).is_err()); // wire type 7
        assert!(decode_protobuf(&[0x0a, 0x05, 0x01]).is_err()); // length past end
        assert!(decode_protobuf(&[0xff; 11]).is_err()); // varint too long
        assert_eq!(decode_protobuf(&[]).unwrap(), Decoded::default());
    }

    #[test]
    fn groups_in_unknown_fields_are_skipped() {
        let mut bytes = request(vec![span(1)], Some("svc")).encode_to_vec();
        // field 7, start group; inside: field 1 varint 5; end group field 7.
        bytes.extend_from_slice(&[(7 << 3) | 3, 1 << 3, 5, (7 << 3) | 4]);
        let d = decode_protobuf(&bytes).unwrap();
        assert_eq!(d.spans.len(), 1);
        assert_eq!(
            d.spans,
            from_proto(&ExportTraceServiceRequest::decode(&bytes[..]).unwrap()).spans
        );
        // Mismatched end group.
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 1] = (8 << 3) | 4;
        assert!(decode_protobuf(&bad).is_err());
    }

    #[test]
    fn count_spans_counts_valid_and_invalid() {
        let mut bad = span(1);
        bad.span_id.clear();
        let bytes = request(vec![bad, span(2), span(3)], Some("svc")).encode_to_vec();
        assert_eq!(count_spans(&bytes), Some(3));
        assert_eq!(count_spans(&[0x0a, 0x05]), None);
    }

    #[test]
    fn invalid_utf8_in_a_kept_string_is_an_error() {
        let mut s = span(1);
        s.name = "ok".into();
        let mut bytes = request(vec![s], None).encode_to_vec();
        let at = bytes.windows(2).position(|w| w == b"ok").unwrap();
        bytes[at] = 0xff;
        assert_eq!(decode_protobuf(&bytes), Err(DecodeError::InvalidUtf8));
    }
}
