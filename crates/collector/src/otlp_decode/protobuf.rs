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

use infertrace_analysis::text::{MAX_ARRAY_ITEMS, Text};
use infertrace_analysis::trace::{AttrValue, KNOWN_KEYS, Span, SpanKind, StatusCode};
use infertrace_analysis::trace::{SpanLink, UNKNOWN_SERVICE, known_key_index};
use infertrace_semconv::resource::SERVICE_NAME;

use super::decoded::{DecodeError, Decoded, SpanRange};
use super::interner::{intern_value, with_interner};
use super::validation::{InvalidSpan, MAX_VALUE_NESTING, Unforwardable, valid_link, validate_span};
use infertrace_analysis::text::Interner;

use super::forwardable::{self, Head, Message, SPAN_BUDGET};
use super::wire::{LEN, Reader};

/// Decodes a protobuf `ExportTraceServiceRequest` into spans (see the [module rules](super)).
pub fn decode_protobuf(buf: &[u8]) -> Result<Decoded, DecodeError> {
    with_interner(|interner| decode_with(buf, interner, false))
}

/// [`decode_protobuf`] for a body that will be forwarded: every field of a span, its resource
/// and its scope is also checked as a prost-based forward target reads it (strings UTF-8, wire
/// types, nesting within prost's recursion limit counted as it counts it), and a span that
/// fails is rejected ([`Decoded::rejected_ranges`], so the forwarder leaves it out) instead of
/// making the target refuse the whole batch.
pub fn decode_protobuf_for_forwarding(buf: &[u8]) -> Result<Decoded, DecodeError> {
    with_interner(|interner| decode_with(buf, interner, true))
}

fn decode_with(
    buf: &[u8],
    interner: &mut Interner,
    forwarding: bool,
) -> Result<Decoded, DecodeError> {
    // Size the output for typical spans (~250 wire bytes) to skip most regrowth of a large
    // vector without a separate pass over the body.
    let mut decoder = RequestDecoder::new(buf, buf.len() / 256, interner);
    decoder.forwarding = forwarding;
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
        decoder.out.rejected_ranges = Vec::new();
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
    /// Whether the current resource's or scope's attributes nest too deep (every span under
    /// them is rejected).
    resource_too_deep: bool,
    scope_too_deep: bool,
    /// Whether the current resource's service name is not valid UTF-8 (every span under it is
    /// rejected).
    resource_bad_text: bool,
    /// Whether every field is checked as a forward target reads it ([`decode_protobuf_for_forwarding`]).
    forwarding: bool,
    /// Why the current resource's or scope's own fields would be refused by a forward target
    /// (every span under them is rejected); only when `forwarding`.
    head_unforwardable: Option<Unforwardable>,
    scope_unforwardable: Option<Unforwardable>,
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
            resource_too_deep: false,
            scope_too_deep: false,
            resource_bad_text: false,
            forwarding: false,
            head_unforwardable: None,
            scope_unforwardable: None,
            interner,
        }
    }

    fn resource_spans(&mut self, buf: &'a [u8]) -> Result<(), DecodeError> {
        // Pass 1: the service name, from every `resource` occurrence (they merge).
        let mut service_name: Option<&'a [u8]> = None;
        self.resource_too_deep = false;
        self.head_unforwardable = self.check_head(buf, Head::ResourceSpans);
        let mut r = Reader::new(buf);
        while let Some((field, wire)) = r.key()? {
            if field == 1 {
                let resource = r.len_field(wire)?;
                if service_name.is_none() {
                    service_name = resource_service_name(resource)?;
                }
                self.resource_too_deep |= attributes_too_deep(resource, 1);
            } else {
                r.skip(field, wire)?;
            }
        }
        let service = self.service(service_name.unwrap_or(UNKNOWN_SERVICE.as_bytes()));
        self.resource_bad_text = service.is_none();
        let service = service.unwrap_or_else(|| Text::from(UNKNOWN_SERVICE));
        // Pass 2: the spans.
        let mut r = Reader::new(buf);
        while let Some((field, wire)) = r.key()? {
            if field == 2 {
                let scope_spans = r.len_field(wire)?;
                // The scope (field 1, which may follow the spans) first: its attributes.
                self.scope_too_deep = false;
                self.scope_unforwardable = self.check_head(scope_spans, Head::ScopeSpans);
                let mut s = Reader::new(scope_spans);
                while let Some((field, wire)) = s.key()? {
                    if field == 1 && wire == LEN {
                        self.scope_too_deep |= attributes_too_deep(s.bytes()?, 3);
                    } else {
                        s.skip(field, wire)?;
                    }
                }
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

    /// When forwarding: why a forward target would refuse the own fields of `buf`, a
    /// `ResourceSpans` or `ScopeSpans`. Such a head is marked with an empty rejected range at its
    /// start, so that the forwarder cuts the body (and [`without_spans`] leaves it out) even when
    /// it holds no span to reject.
    fn check_head(&mut self, buf: &[u8], head: Head) -> Option<Unforwardable> {
        if !self.forwarding {
            return None;
        }
        let why = forwardable::check_head(buf, head).err()?;
        self.out.reject_range(SpanRange {
            offset: (buf.as_ptr() as usize - self.body_address) as u32,
            len: 0,
        });
        Some(why)
    }

    /// The interned text of a service name (reused while consecutive resources agree): the same
    /// allocation batch after batch, static once common (see [`Interner`]), so that spans and
    /// records clone it without touching a shared counter. `None` when it is not valid UTF-8.
    fn service(&mut self, name: &'a [u8]) -> Option<Text> {
        if let Some((last, arc)) = &self.last_service
            && *last == name
        {
            return Some(arc.clone());
        }
        let text = self.interner.intern_utf8(name).ok()?;
        self.last_service = Some((name, text.clone()));
        Some(text)
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
        let mut too_deep = self.resource_too_deep || self.scope_too_deep;
        // A string the collector reads that is not UTF-8 rejects its span, not the request.
        let mut bad_text = self.resource_bad_text;
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
                9 => {
                    let kv = r.len_field(wire)?;
                    match key_value(kv, self.interner, &mut self.attributes) {
                        Ok(deep) => too_deep |= deep,
                        Err(DecodeError::InvalidUtf8) => bad_text = true,
                        Err(e) => return Err(e),
                    }
                }
                // Events: only their attributes' nesting is read.
                11 if wire == LEN => {
                    let event = r.bytes()?;
                    too_deep = too_deep || attributes_too_deep(event, 3);
                }
                13 => {
                    let l = r.len_field(wire)?;
                    if let Some(link) = link(l)? {
                        self.links.push(link);
                    }
                    too_deep = too_deep || attributes_too_deep(l, 4);
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
        let name = self.interner.intern_utf8(name).unwrap_or_else(|_| {
            bad_text = true;
            Text::from("")
        });
        // Offsets past 4 GiB wrap; such a body's ranges are dropped as a whole.
        let range = SpanRange {
            offset: (buf.as_ptr() as usize - self.body_address) as u32,
            len: buf.len() as u32,
        };
        let unforwardable = || {
            self.head_unforwardable
                .or(self.scope_unforwardable)
                .or_else(|| forwardable::check(buf, Message::Span, SPAN_BUDGET).err())
        };
        let ids = match validate_span(trace_id, span_id, parent, start, end) {
            Ok(_) if bad_text => Err(InvalidSpan::NotUtf8),
            Ok(_) if too_deep => Err(InvalidSpan::TooDeep),
            Ok(_)
                if self.forwarding
                    && let Some(why) = unforwardable() =>
            {
                Err(InvalidSpan::Unforwardable(why))
            }
            other => other,
        };
        let ids = match ids {
            Ok(ids) => ids,
            Err(why) => {
                self.out.reject(why);
                self.out.reject_range(range);
                return Ok(());
            }
        };
        self.out.span_ranges.push(range);
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
/// kind. (Appending here, one push per kind, writes the pair straight into the vector rather
/// than returning it through the stack to be copied again.)
///
/// Returns whether the value nests arrays and key-value lists deeper than
/// [`MAX_VALUE_NESTING`] (any key: such a span is rejected), judged from the bytes this pass
/// already found: a scalar value is one field, so most attributes cost one more key read.
fn key_value(
    buf: &[u8],
    interner: &mut Interner,
    out: &mut Vec<(&'static str, AttrValue)>,
) -> Result<bool, DecodeError> {
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
    let too_deep = match value {
        _ if repeated_value => key_value_nesting(buf, MAX_VALUE_NESTING) > MAX_VALUE_NESTING,
        Some(v) if !one_scalar(v) => {
            let mut n = Nesting::default();
            n.feed(v, MAX_VALUE_NESTING);
            n.depth > MAX_VALUE_NESTING
        }
        _ => false,
    };
    let Some(key) = known_key(key) else {
        return Ok(too_deep);
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
            if items.count > items.kept.len() {
                interner.count_truncated(1);
            }
            let items = items
                .kept
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
    Ok(too_deep)
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
    Array(Option<StrItems<'a>>),
    /// A variant infertrace does not keep (key-value list, bytes, string index).
    Other,
}

/// The strings of an array value: the first [`MAX_ARRAY_ITEMS`], and how many there were.
#[derive(Default)]
struct StrItems<'a> {
    kept: Vec<&'a [u8]>,
    count: usize,
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
                    *state = AnyValueState::Array(Some(StrItems::default()));
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
    items: &mut Option<StrItems<'a>>,
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
            Some(s) => {
                list.count += 1;
                if list.kept.len() < MAX_ARRAY_ITEMS {
                    list.kept.push(s);
                }
            }
            None => *items = None,
        }
    }
    Ok(())
}

/// How deeply one `AnyValue` nests arrays and key-value lists, fed with every occurrence of it
/// (a `KeyValue`'s repeated `value` fields merge, as prost merges them: the last oneof variant
/// wins, and repeated arrays or lists concatenate).
#[derive(Default)]
struct Nesting {
    /// The current variant's field number: 5 (array), 6 (key-value list), 0 (anything else).
    variant: u32,
    depth: u32,
}

impl Nesting {
    /// Folds in one `AnyValue` occurrence; counts at most `allowed` levels exactly (a deeper
    /// value gives some depth over `allowed`, without reading further down). Malformed bytes end
    /// the reading (prost refuses them anyway).
    fn feed(&mut self, buf: &[u8], allowed: u32) {
        let mut r = Reader::new(buf);
        while let Ok(Some((field, wire))) = r.key() {
            if (field == 5 || field == 6) && wire == LEN {
                let Ok(inner) = r.bytes() else { return };
                let depth = if allowed == 0 {
                    1
                } else {
                    1 + container_nesting(inner, field, allowed - 1)
                };
                if self.variant == field {
                    self.depth = self.depth.max(depth);
                } else {
                    (self.variant, self.depth) = (field, depth);
                }
            } else {
                if r.skip(field, wire).is_err() {
                    return;
                }
                if (1..=8).contains(&field) {
                    (self.variant, self.depth) = (0, 0);
                }
            }
        }
    }
}

/// Whether an `AnyValue`'s bytes are exactly one short string, one varint (bool, int) or one
/// double: what nearly every attribute value is, recognised from its first bytes without
/// walking it (`false` only means "walk it").
#[inline(always)]
fn one_scalar(v: &[u8]) -> bool {
    match v {
        // string_value (field 1) shorter than 128 bytes, and nothing after it.
        [0x0a, len, ..] => *len < 0x80 && v.len() == 2 + *len as usize,
        // bool_value (2) or int_value (3): a varint ending the buffer.
        [0x10 | 0x18, rest @ .., last] => *last < 0x80 && rest.iter().all(|b| *b >= 0x80),
        // double_value (4).
        [0x21, ..] => v.len() == 9,
        _ => false,
    }
}

/// The deepest nesting of the values in an `ArrayValue` (`kind` 5) or `KeyValueList` (6).
fn container_nesting(buf: &[u8], kind: u32, allowed: u32) -> u32 {
    let mut deepest = 0;
    let mut r = Reader::new(buf);
    while let Ok(Some((field, wire))) = r.key() {
        if field == 1 && wire == LEN {
            let Ok(item) = r.bytes() else { break };
            let depth = if kind == 5 {
                let mut n = Nesting::default();
                n.feed(item, allowed);
                n.depth
            } else {
                key_value_nesting(item, allowed)
            };
            deepest = deepest.max(depth);
        } else if r.skip(field, wire).is_err() {
            break;
        }
    }
    deepest
}

/// The nesting of a `KeyValue`'s value (every `value` occurrence merged).
fn key_value_nesting(buf: &[u8], allowed: u32) -> u32 {
    let mut n = Nesting::default();
    let mut r = Reader::new(buf);
    while let Ok(Some((field, wire))) = r.key() {
        if field == 2 && wire == LEN {
            let Ok(value) = r.bytes() else { break };
            n.feed(value, allowed);
        } else if r.skip(field, wire).is_err() {
            break;
        }
    }
    n.depth
}

/// Whether a message's `KeyValue` attributes (field `field`) nest deeper than
/// [`MAX_VALUE_NESTING`].
fn attributes_too_deep(buf: &[u8], field: u32) -> bool {
    let mut r = Reader::new(buf);
    while let Ok(Some((f, wire))) = r.key() {
        if f == field && wire == LEN {
            let Ok(kv) = r.bytes() else { return false };
            if key_value_nesting(kv, MAX_VALUE_NESTING) > MAX_VALUE_NESTING {
                return true;
            }
        } else if r.skip(f, wire).is_err() {
            return false;
        }
    }
    false
}

/// `body` (a protobuf `ExportTraceServiceRequest` that [`decode_protobuf`] read) without the
/// spans at `rejected` ([`Decoded::rejected_ranges`], in body order): what the forwarder sends
/// when some spans of a request were rejected, so that the downstream gets exactly the accepted
/// ones. Works on the wire, so that everything else (unknown fields, attributes infertrace does
/// not read) is kept byte for byte, and a value nested too deep for prost to decode is never
/// decoded; a `ScopeSpans` (and then a `ResourceSpans`) all of whose spans were left out is left
/// out too, since its scope or resource may be what made them rejected, and so is one whose own
/// fields a prost-based downstream would refuse (see [`decode_protobuf_for_forwarding`]).
/// `None` when the body is malformed.
pub fn without_spans(body: &[u8], rejected: &[SpanRange]) -> Option<Vec<u8>> {
    fn copy_field(r: &Reader<'_>, from: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&r.buf[from..r.pos]);
    }
    fn put_len_field(field: u32, payload: &[u8], out: &mut Vec<u8>) {
        prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, out);
        prost::encoding::encode_varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }
    let base = body.as_ptr() as usize;
    // A range may cover several consecutive rejected spans (see `Decoded::rejected_ranges`);
    // its end counts as in it, for an empty last span (whose bytes start where they end): no
    // other span starts there, the next one's key and length come first.
    let is_rejected = |span: &[u8]| {
        let offset = span.as_ptr() as usize - base;
        let after = rejected.partition_point(|r| r.offset as usize <= offset);
        after > 0 && {
            let r = rejected[after - 1];
            offset <= r.offset as usize + r.len as usize
        }
    };
    let mut out = Vec::with_capacity(body.len());
    let mut r = Reader::new(body);
    loop {
        let from = r.pos;
        let Some((field, wire)) = r.key().ok()? else {
            break;
        };
        if field != 1 || wire != LEN {
            r.skip(field, wire).ok()?;
            copy_field(&r, from, &mut out);
            continue;
        }
        let resource_spans = r.bytes().ok()?;
        if forwardable::check_head(resource_spans, Head::ResourceSpans).is_err() {
            continue;
        }
        let mut rs_out = Vec::with_capacity(resource_spans.len());
        let (mut scopes, mut scopes_left) = (0, 0);
        let mut rr = Reader::new(resource_spans);
        loop {
            let from = rr.pos;
            let Some((field, wire)) = rr.key().ok()? else {
                break;
            };
            if field != 2 || wire != LEN {
                rr.skip(field, wire).ok()?;
                copy_field(&rr, from, &mut rs_out);
                continue;
            }
            let scope_spans = rr.bytes().ok()?;
            if forwardable::check_head(scope_spans, Head::ScopeSpans).is_err() {
                continue;
            }
            let mut ss_out = Vec::with_capacity(scope_spans.len());
            let (mut spans, mut spans_left) = (0, 0);
            let mut sr = Reader::new(scope_spans);
            loop {
                let from = sr.pos;
                let Some((field, wire)) = sr.key().ok()? else {
                    break;
                };
                if field == 2 && wire == LEN {
                    let span = sr.bytes().ok()?;
                    spans += 1;
                    if is_rejected(span) {
                        continue;
                    }
                    spans_left += 1;
                } else {
                    sr.skip(field, wire).ok()?;
                }
                copy_field(&sr, from, &mut ss_out);
            }
            if spans > 0 {
                scopes += 1;
                if spans_left == 0 {
                    continue;
                }
                scopes_left += 1;
            }
            put_len_field(2, &ss_out, &mut rs_out);
        }
        if scopes > 0 && scopes_left == 0 {
            continue;
        }
        put_len_field(1, &rs_out, &mut out);
    }
    Some(out)
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

/// Same answer as [`infertrace_analysis::trace::known_key`], faster.
fn known_key(key: &[u8]) -> Option<&'static str> {
    known_key_index(key).map(|i| KNOWN_KEYS[usize::from(i)])
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

    /// A value nesting `levels` key-value lists (alternating with arrays when `arrays`) around a
    /// string.
    fn nested(levels: u32, arrays: bool) -> AnyValue {
        let mut v = AnyValue {
            value: Some(any_value::Value::StringValue("leaf".into())),
        };
        for level in 0..levels {
            v = if arrays && level % 2 == 1 {
                AnyValue {
                    value: Some(any_value::Value::ArrayValue(ArrayValue { values: vec![v] })),
                }
            } else {
                AnyValue {
                    value: Some(any_value::Value::KvlistValue(
                        opentelemetry_proto::tonic::common::v1::KeyValueList {
                            values: vec![KeyValue {
                                key: "k".into(),
                                value: Some(v),
                                key_strindex: 0,
                            }],
                        },
                    )),
                }
            };
        }
        v
    }

    fn deep_kv(levels: u32, arrays: bool) -> KeyValue {
        KeyValue {
            key: "deep".into(),
            value: Some(nested(levels, arrays)),
            key_strindex: 0,
        }
    }

    #[test]
    fn values_nested_over_the_limit_reject_their_span_like_the_reference() {
        use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
        let limit = crate::otlp_decode::MAX_VALUE_NESTING;
        for arrays in [false, true] {
            for (levels, rejected) in [(limit, false), (limit + 1, true)] {
                let mut in_attr = span(1);
                in_attr.attributes = vec![deep_kv(levels, arrays)];
                let mut in_event = span(2);
                in_event.events = vec![Event {
                    attributes: vec![deep_kv(levels, arrays)],
                    ..Default::default()
                }];
                let mut in_link = span(3);
                in_link.links = vec![Link {
                    trace_id: vec![7; 16],
                    span_id: vec![7; 8],
                    attributes: vec![deep_kv(levels, arrays)],
                    ..Default::default()
                }];
                let req = request(vec![in_attr, span(4), in_event, in_link], Some("svc"));
                let body = req.encode_to_vec();
                let lean = decode_protobuf(&body).unwrap();
                let reference = from_proto(&ExportTraceServiceRequest::decode(&body[..]).unwrap());
                assert_eq!(lean.spans, reference.spans, "{levels} {arrays}");
                assert_eq!(lean.rejected, reference.rejected);
                assert_eq!(lean.first_error, reference.first_error);
                assert_eq!(
                    lean.rejected,
                    if rejected { 3 } else { 0 },
                    "{levels} {arrays}"
                );
                // The event's and the link's spans are consecutive: one range.
                assert_eq!(
                    lean.rejected_ranges.len(),
                    if rejected { 2 } else { 0 },
                    "{levels} {arrays}"
                );
                if rejected {
                    assert!(lean.first_error.unwrap().contains("16 levels"));
                    assert_eq!(lean.spans.len(), 1);
                    assert_eq!(lean.spans[0].span_id, SpanId([4; 8]));
                }
            }
        }
    }

    #[test]
    fn a_run_of_tiny_invalid_spans_costs_one_range() {
        // 100,000 empty spans (two bytes each on the wire) around two valid ones.
        let mut spans = vec![PSpan::default(); 100_000];
        spans.insert(50_000, span(1));
        spans.push(span(2));
        let body = request(spans, Some("svc")).encode_to_vec();
        let lean = decode_protobuf(&body).unwrap();
        assert_eq!((lean.spans.len(), lean.rejected), (2, 100_000));
        assert_eq!(
            lean.rejected_ranges.len(),
            2,
            "one range each side of span 1"
        );
        let cut = without_spans(&body, &lean.rejected_ranges).unwrap();
        let kept = ExportTraceServiceRequest::decode(&cut[..]).unwrap();
        let ids: Vec<_> = kept.resource_spans[0].scope_spans[0]
            .spans
            .iter()
            .map(|s| s.span_id.clone())
            .collect();
        assert_eq!(ids, [vec![1; 8], vec![2; 8]]);
    }

    #[test]
    fn a_resource_or_scope_nested_too_deep_rejects_its_spans() {
        let mut req = request(vec![span(1), span(2)], Some("svc"));
        req.resource_spans[0]
            .resource
            .as_mut()
            .unwrap()
            .attributes
            .push(deep_kv(17, false));
        let mut scoped = request(vec![span(3)], Some("svc")).resource_spans.remove(0);
        scoped.scope_spans[0].scope = Some(
            opentelemetry_proto::tonic::common::v1::InstrumentationScope {
                attributes: vec![deep_kv(30, true)],
                ..Default::default()
            },
        );
        req.resource_spans.push(scoped);
        req.resource_spans
            .push(request(vec![span(4)], Some("ok")).resource_spans.remove(0));
        let body = req.encode_to_vec();
        let lean = decode_protobuf(&body).unwrap();
        let reference = from_proto(&ExportTraceServiceRequest::decode(&body[..]).unwrap());
        assert_eq!(lean.spans, reference.spans);
        assert_eq!((lean.rejected, reference.rejected), (3, 3));
        // Cut out: the poisoned resource and scope go with their spans.
        let kept = without_spans(&body, &lean.rejected_ranges).unwrap();
        let kept = ExportTraceServiceRequest::decode(&kept[..]).unwrap();
        assert_eq!(kept.resource_spans.len(), 1);
        assert_eq!(kept.resource_spans[0], req.resource_spans[2]);
        let mut json = req.clone();
        assert_eq!(crate::otlp_decode::retain_accepted(&mut json), 3);
        assert_eq!(json, kept);
    }

    #[test]
    fn a_deep_value_overridden_on_the_wire_is_judged_as_prost_reads_it() {
        // KeyValue { value: <17 levels>, value: "flat" }: prost merges the two, the string wins.
        let mut first = deep_kv(17, false).encode_to_vec();
        let flat = AnyValue {
            value: Some(any_value::Value::StringValue("flat".into())),
        };
        prost::encoding::message::encode(2, &flat, &mut first);
        // And the other way round: a string, then a deep list.
        let mut kv2 = kv("x", any_value::Value::StringValue("flat".into())).encode_to_vec();
        prost::encoding::message::encode(2, &nested(17, true), &mut kv2);
        for (kv_bytes, rejected) in [(first, 0), (kv2, 1)] {
            let mut span_bytes = span(1).encode_to_vec();
            prost::encoding::bytes::encode(9, &kv_bytes, &mut span_bytes);
            let mut ss = Vec::new();
            prost::encoding::bytes::encode(2, &span_bytes, &mut ss);
            let mut rs = Vec::new();
            prost::encoding::bytes::encode(2, &ss, &mut rs);
            let mut body = Vec::new();
            prost::encoding::bytes::encode(1, &rs, &mut body);
            let lean = decode_protobuf(&body).unwrap();
            let reference = from_proto(&ExportTraceServiceRequest::decode(&body[..]).unwrap());
            assert_eq!(lean.rejected, rejected);
            assert_eq!(reference.rejected, rejected);
            assert_eq!(lean.spans, reference.spans);
        }
    }

    #[test]
    fn one_scalar_recognises_only_single_scalar_values() {
        let enc = |v: any_value::Value| AnyValue { value: Some(v) }.encode_to_vec();
        assert!(one_scalar(&enc(any_value::Value::StringValue("x".into()))));
        assert!(one_scalar(&enc(any_value::Value::IntValue(-1))));
        assert!(one_scalar(&enc(any_value::Value::IntValue(5))));
        assert!(one_scalar(&enc(any_value::Value::BoolValue(true))));
        assert!(one_scalar(&enc(any_value::Value::DoubleValue(0.5))));
        assert!(!one_scalar(&enc(any_value::Value::StringValue(
            "x".repeat(200)
        ))));
        assert!(!one_scalar(&nested(1, false).encode_to_vec()));
        assert!(!one_scalar(&nested(2, true).encode_to_vec()));
        // A scalar followed by a list: walked (prost keeps the list).
        let mut two = enc(any_value::Value::IntValue(1));
        two.extend(nested(1, false).encode_to_vec());
        assert!(!one_scalar(&two));
        for short in [&[0x10][..], &[0x18, 0x80], &[0x0a], &[0x21, 1], &[]] {
            assert!(!one_scalar(short), "{short:?}");
        }
    }

    #[test]
    fn without_spans_cuts_exactly_the_rejected_spans_even_past_prosts_limit() {
        // 200 levels: prost cannot decode this body at all (recursion limit 100).
        let mut poison = span(1);
        poison.attributes = vec![deep_kv(200, false)];
        let mut bad_id = span(2);
        bad_id.span_id = vec![0; 8];
        let innocent: Vec<PSpan> = (3..=6).map(span).collect();
        let mut spans = vec![poison, innocent[0].clone(), bad_id];
        spans.extend(innocent[1..].iter().cloned());
        let req = request(spans, Some("svc"));
        let mut body = req.encode_to_vec();
        // An unknown top-level field survives the cut.
        body.extend_from_slice(&[(9 << 3), 1]);
        assert!(
            ExportTraceServiceRequest::decode(&body[..]).is_err(),
            "prost's limit"
        );
        let lean = decode_protobuf(&body).unwrap();
        assert_eq!(lean.rejected, 2);
        assert_eq!(lean.spans.len(), 4);
        let kept = without_spans(&body, &lean.rejected_ranges).unwrap();
        assert!(kept.ends_with(&[(9 << 3), 1]));
        let decoded = ExportTraceServiceRequest::decode(&kept[..]).unwrap();
        assert_eq!(decoded, request(innocent, Some("svc")));
        // Nothing rejected: the body as it was.
        assert_eq!(
            without_spans(&body[..body.len() - 2], &[]).unwrap(),
            req.encode_to_vec()
        );
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
    fn a_long_string_array_keeps_its_first_strings_and_is_counted_as_cut() {
        let strings = |n: usize| {
            let values = (0..n)
                .map(|i| AnyValue {
                    value: Some(any_value::Value::StringValue(format!("r{i}"))),
                })
                .collect();
            any_value::Value::ArrayValue(ArrayValue { values })
        };
        let key = infertrace_semconv::gen_ai::RESPONSE_FINISH_REASONS;
        let _ = crate::otlp_decode::take_truncated_texts();
        for n in [0, 1, MAX_ARRAY_ITEMS, MAX_ARRAY_ITEMS + 1, 10_000] {
            let mut s = span(1);
            s.attributes = vec![kv(key, strings(n))];
            let bytes = request(vec![s], Some("svc")).encode_to_vec();
            let d = decode_protobuf(&bytes).unwrap();
            let Some(AttrValue::StrArray(items)) = d.spans[0].attr(key) else {
                panic!("{n} strings: not kept as an array");
            };
            let kept: Vec<String> = (0..n.min(MAX_ARRAY_ITEMS))
                .map(|i| format!("r{i}"))
                .collect();
            assert_eq!(
                items.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                kept
            );
            let cut = crate::otlp_decode::take_truncated_texts();
            assert_eq!(cut, u64::from(n > MAX_ARRAY_ITEMS), "{n} strings");
            let via_prost = from_proto(&ExportTraceServiceRequest::decode(&bytes[..]).unwrap());
            assert_eq!(d.spans, via_prost.spans, "{n} strings");
            assert_eq!(
                crate::otlp_decode::take_truncated_texts(),
                cut,
                "{n} strings"
            );
        }
        // A non-string element past the kept ones still drops the attribute, as before.
        let mut mixed = strings(MAX_ARRAY_ITEMS + 5);
        if let any_value::Value::ArrayValue(a) = &mut mixed {
            a.values.push(AnyValue {
                value: Some(any_value::Value::IntValue(1)),
            });
        }
        let mut s = span(1);
        s.attributes = vec![kv(key, mixed)];
        let bytes = request(vec![s], Some("svc")).encode_to_vec();
        assert_eq!(decode_protobuf(&bytes).unwrap().spans[0].attr(key), None);
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

    /// At the request's top level, a field inside `k` groups is read while prost reads it: up
    /// to 99 groups around a varint, not 100 (prost checks its limit for every field it skips).
    #[test]
    fn fields_nested_in_groups_are_refused_where_prost_refuses_them() {
        for (k, readable) in [(99usize, true), (100, false)] {
            let mut bytes = request(vec![span(1)], Some("svc")).encode_to_vec();
            bytes.extend(std::iter::repeat_n((7 << 3) | 3, k));
            bytes.extend_from_slice(&[1 << 3, 5]);
            bytes.extend(std::iter::repeat_n((7 << 3) | 4, k));
            assert_eq!(
                ExportTraceServiceRequest::decode(&bytes[..]).is_ok(),
                readable,
                "{k}"
            );
            assert_eq!(decode_protobuf(&bytes).is_ok(), readable, "{k}");
            assert_eq!(
                decode_protobuf_for_forwarding(&bytes).is_ok(),
                readable,
                "{k}"
            );
        }
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
    fn invalid_utf8_in_a_kept_string_rejects_its_span_only() {
        // `bytes` with the first occurrence of `marker` made invalid UTF-8.
        let spoil = |bytes: &mut Vec<u8>, marker: &[u8]| {
            let at = bytes
                .windows(marker.len())
                .position(|w| w == marker)
                .unwrap();
            bytes[at] = 0xff;
        };
        let model = |value: &str| {
            kv(
                infertrace_semconv::gen_ai::REQUEST_MODEL,
                any_value::Value::StringValue(value.into()),
            )
        };
        let mut named = span(2);
        named.name = "NAME".into();
        let mut attributed = span(3);
        attributed.attributes = vec![model("MODEL")];
        let mut bytes =
            request(vec![span(1), named, attributed, span(4)], Some("svc")).encode_to_vec();
        spoil(&mut bytes, b"NAME");
        spoil(&mut bytes, b"MODEL");
        let d = decode_protobuf(&bytes).unwrap();
        let ids: Vec<u8> = d.spans.iter().map(|s| s.span_id.0[0]).collect();
        assert_eq!((ids, d.rejected), (vec![1, 4], 2));
        assert!(d.first_error.unwrap().contains("not valid UTF-8"));
        // Cut out of what is forwarded, as any rejected span.
        let cut = without_spans(&bytes, &d.rejected_ranges).unwrap();
        let forwarded = ExportTraceServiceRequest::decode(&cut[..]).unwrap();
        assert_eq!(forwarded.resource_spans[0].scope_spans[0].spans.len(), 2);
        // A service name that is not UTF-8 rejects its resource's spans; the next resource's
        // spans are kept.
        let mut two = request(vec![span(5), span(6)], Some("SERVICE"));
        two.resource_spans
            .extend(request(vec![span(7)], Some("svc")).resource_spans);
        let mut bytes = two.encode_to_vec();
        spoil(&mut bytes, b"SERVICE");
        let d = decode_protobuf(&bytes).unwrap();
        let ids: Vec<u8> = d.spans.iter().map(|s| s.span_id.0[0]).collect();
        assert_eq!((ids, d.rejected), (vec![7], 2));
        assert_eq!(&*d.spans[0].service, "svc");
    }
}
