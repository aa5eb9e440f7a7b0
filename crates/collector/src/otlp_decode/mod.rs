//! OTLP trace export requests → the analysis crate's [`Span`]s.
//!
//! Three decoders follow one set of rules (the reference restates them and shares no code with
//! the lean decoder, so that it can check it):
//! - [`decode_protobuf`]: the hot path. A hand-written protobuf reader over `&[u8]` that walks
//!   `ExportTraceServiceRequest` and builds [`Span`]s directly, keeping only what the analysis reads
//!   (service name, ids, name, kind, times, status code, links and the attributes in
//!   [`KNOWN_KEYS`](infertrace_analysis::trace::KNOWN_KEYS)). Dropped attributes, events and every
//!   other field are skipped by wire type without allocating.
//! - [`from_proto`]: the reference conversion from `opentelemetry-proto`'s generated (prost) types.
//!   The lean decoder is proven equal to "prost decode, then `from_proto`" by a property test
//!   (`tests/decode_equivalence.rs`) and a fuzz target (`fuzz/`).
//! - [`decode_json`]: OTLP/JSON (hex ids, integer enums, lowerCamelCase keys), through
//!   `opentelemetry-proto`'s serde support, then [`from_proto`].
//!
//! # Rules
//! - A span is rejected (counted in [`Decoded::rejected`], OTLP partial success) when its trace id
//!   is not 16 bytes or is all zero, its span id is not 8 bytes or is all zero, its parent span id
//!   is neither empty nor 8 bytes, or it ends before it starts. An all-zero 8-byte parent id means
//!   "no parent".
//! - A span is rejected too when a value of its attributes, of its events' or links' attributes,
//!   or of its resource's or scope's attributes nests arrays and key-value lists more than
//!   [`MAX_VALUE_NESTING`] (16) levels deep (a string is 0 levels, `["a"]` 1, `{k: ["a"]}` 2).
//!   Why: prost-based receivers (any Rust OTLP receiver; other decoders have limits of their
//!   own) refuse a message nested deeper than 100 messages, and each kvlist level costs 3 nested
//!   messages (`AnyValue` → `KeyValueList` → `KeyValue`): a span 16 levels deep is at most
//!   ~55 messages deep, half that limit, while one 200 levels deep would make the downstream
//!   refuse the *whole* forwarded batch, innocent spans included. No known SDK or
//!   instrumentation nests attribute values anywhere near 16 levels. The values are compared
//!   as prost reads them (the last `AnyValue` variant wins, repeated occurrences merge).
//!   [`Decoded::rejected_ranges`] says where the rejected spans lie, so that the forwarder can
//!   leave exactly them out ([`without_spans`]).
//! - A link is kept only when its trace id and span id are both valid; invalid links are skipped.
//! - The service is the first string-valued `service.name` attribute of the span's resource, else
//!   [`UNKNOWN_SERVICE`](infertrace_analysis::trace::UNKNOWN_SERVICE). It is interned like the
//!   names and values below: one [`Text`] for every span of every resource with that name
//!   (static once common, so spans and records clone it without touching a shared counter).
//!   Service names with many distinct values (one per pod, say) share the interner's bounded
//!   table and static budget with the other strings: past them, texts are simply not shared.
//! - Attribute values: strings, integers, doubles and booleans are kept as such; an array is kept
//!   when every element is a string (an empty array included); any other value (key-value lists,
//!   bytes, mixed arrays, a missing value) drops the attribute. Attributes keep their order,
//!   duplicates included.
//! - A body that is not valid protobuf (or JSON) is a [`DecodeError`]: the whole request is refused.
//! - Span names, service names and string values longer than
//!   [`MAX_TEXT_LEN`](infertrace_analysis::text::MAX_TEXT_LEN) (256 bytes) are cut at a character
//!   boundary and counted ([`take_truncated_texts`]): they become labels and dimensions.
//! - Span names and string values are [`Text`]s from a per-thread bounded [`Interner`] (the
//!   same model, route or phase name is one shared string across all spans), except
//!   `gen_ai.request.id`, which is unique per request and is copied. The bytes of strings a
//!   decode allocated are reported by [`take_fresh_text_bytes`] for the memory limiter.

mod json;
mod protobuf;
mod reference;

use std::cell::RefCell;

use infertrace_analysis::text::{Interner, Text};
use infertrace_analysis::trace::{Span, SpanId, TraceId};
use infertrace_semconv as sc;

pub use json::decode_json;
pub use protobuf::{count_spans, decode_protobuf, decode_span, without_spans};
pub use reference::{from_proto, retain_accepted};

/// Deepest nesting of arrays and key-value lists an attribute value may have (see the
/// [module rules](self)); a span with a deeper one is rejected.
pub const MAX_VALUE_NESTING: u32 = 16;

thread_local! {
    /// Each receiver thread's interner (see the module rules).
    static INTERNER: RefCell<Interner> = RefCell::default();
}

/// Runs `f` with this thread's interner.
fn with_interner<R>(f: impl FnOnce(&mut Interner) -> R) -> R {
    INTERNER.with(|i| match i.try_borrow_mut() {
        Ok(mut i) => f(&mut i),
        // Not reentrant in practice; a fresh interner keeps it correct if it ever were.
        Err(_) => f(&mut Interner::default()),
    })
}

/// Runs `f` with this thread's interner for decoding spans that were already accounted for
/// (a prepared trace's spans decoded again): strings new to the interner meanwhile are not
/// charged to the next request this thread decodes.
pub(crate) fn with_text_interner<R>(f: impl FnOnce(&mut Interner) -> R) -> R {
    with_interner(|interner| {
        let pending = interner.take_fresh_bytes();
        let truncated = interner.take_truncated();
        let out = f(interner);
        interner.take_fresh_bytes();
        interner.take_truncated();
        interner.restore_fresh_bytes(pending);
        interner.restore_truncated(truncated);
        out
    })
}

/// Heap bytes of the strings this thread's decoders allocated since the last call (see
/// [`Interner::take_fresh_bytes`]): call it right after decoding a request, on the same thread,
/// and reserve it with the request's spans.
pub fn take_fresh_text_bytes() -> usize {
    with_interner(Interner::take_fresh_bytes)
}

/// Strings this thread's decoders cut to [`MAX_TEXT_LEN`](infertrace_analysis::text::MAX_TEXT_LEN)
/// since the last call: call it right after decoding a request, on the same thread, and count
/// them (`texts_truncated_total`).
pub fn take_truncated_texts() -> u64 {
    with_interner(Interner::take_truncated)
}

/// A string attribute value, validated as UTF-8: interned unless its key holds a per-request
/// unique value.
fn intern_value(
    key: &'static str,
    value: &[u8],
    interner: &mut Interner,
) -> Result<Text, DecodeError> {
    if key == sc::gen_ai::REQUEST_ID {
        let s = std::str::from_utf8(value).map_err(|_| DecodeError::InvalidUtf8)?;
        let s = interner.truncate(s);
        interner.note_fresh(s.len());
        Ok(Text::from(s))
    } else {
        interner
            .intern_utf8(value)
            .map_err(|_| DecodeError::InvalidUtf8)
    }
}

/// The result of decoding one export request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decoded {
    /// The valid spans, in request order.
    pub spans: Vec<Span>,
    /// How many spans were invalid and left out (reported as `rejected_spans`).
    pub rejected: u32,
    /// Why the first rejected span was rejected (the partial-success message).
    pub first_error: Option<String>,
    /// From [`decode_protobuf`]: where each of `spans` lies in the body (same order), so that
    /// a span can be decoded again from the body with [`decode_span`]. Empty from the other
    /// decoders, and for a body of 4 GiB or more.
    pub span_ranges: Vec<SpanRange>,
    /// From [`decode_protobuf`]: where each rejected span lies in the body, in body order, so
    /// that the forwarder can send the body without them ([`without_spans`]). Empty from the
    /// other decoders.
    pub rejected_ranges: Vec<SpanRange>,
}

/// Where a span's bytes lie in a buffer (a `Span` message in its request body, or a compact
/// copy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanRange {
    /// Offset of the span's first byte.
    pub offset: u32,
    /// Length of the span's encoding.
    pub len: u32,
}

impl SpanRange {
    /// The range's bytes in `buf`; `None` when it lies outside.
    pub fn of<'b>(&self, buf: &'b [u8]) -> Option<&'b [u8]> {
        let at = self.offset as usize;
        buf.get(at..at + self.len as usize)
    }
}

impl Decoded {
    fn reject(&mut self, why: InvalidSpan) {
        self.rejected = self.rejected.saturating_add(1);
        if self.first_error.is_none() {
            self.first_error = Some(why.to_string());
        }
    }
}

/// A request body that cannot be decoded at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Malformed protobuf, with the byte offset (within the innermost message being read) and
    /// what was wrong.
    #[error("invalid protobuf at byte {offset}: {what}")]
    Protobuf {
        /// Offset inside the message being read.
        offset: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// A kept string field is not UTF-8.
    #[error("invalid protobuf: a string field is not valid UTF-8")]
    InvalidUtf8,
    /// Malformed OTLP/JSON.
    #[error("invalid OTLP/JSON: {0}")]
    Json(String),
}

/// Why a span was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InvalidSpan {
    TraceId { len: usize },
    SpanId { len: usize },
    ParentSpanId { len: usize },
    EndBeforeStart { start: u64, end: u64 },
    TooDeep,
}

impl std::fmt::Display for InvalidSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TraceId { len } => write!(
                f,
                "trace id must be 16 bytes and not all zero (got {len} bytes)"
            ),
            Self::SpanId { len } => write!(
                f,
                "span id must be 8 bytes and not all zero (got {len} bytes)"
            ),
            Self::ParentSpanId { len } => write!(
                f,
                "parent span id must be empty or 8 bytes (got {len} bytes)"
            ),
            Self::EndBeforeStart { start, end } => write!(
                f,
                "span ends before it starts (start {start} ns, end {end} ns)"
            ),
            Self::TooDeep => write!(
                f,
                "an attribute value (of the span, its events or links, its resource or scope) \
                 nests arrays/key-value lists more than {MAX_VALUE_NESTING} levels deep; \
                 downstream OTLP decoders refuse such data: flatten the attribute"
            ),
        }
    }
}

/// The identity of a valid span.
pub(crate) struct ValidIds {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
}

/// Applies the span validity rules shared by every decoder.
pub(crate) fn validate_span(
    trace_id: &[u8],
    span_id: &[u8],
    parent_span_id: &[u8],
    start: u64,
    end: u64,
) -> Result<ValidIds, InvalidSpan> {
    let trace = TraceId::from_bytes(trace_id).ok_or(InvalidSpan::TraceId {
        len: trace_id.len(),
    })?;
    let span = SpanId::from_bytes(span_id).ok_or(InvalidSpan::SpanId { len: span_id.len() })?;
    let parent = match parent_span_id.len() {
        0 => None,
        8 => SpanId::from_bytes(parent_span_id),
        len => return Err(InvalidSpan::ParentSpanId { len }),
    };
    if end < start {
        return Err(InvalidSpan::EndBeforeStart { start, end });
    }
    Ok(ValidIds {
        trace_id: trace,
        span_id: span,
        parent_span_id: parent,
    })
}

/// A link's ids when both are valid.
pub(crate) fn valid_link(
    trace_id: &[u8],
    span_id: &[u8],
) -> Option<infertrace_analysis::trace::SpanLink> {
    Some(infertrace_analysis::trace::SpanLink {
        trace_id: TraceId::from_bytes(trace_id)?,
        span_id: SpanId::from_bytes(span_id)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rules() {
        let t = [1u8; 16];
        let s = [2u8; 8];
        assert!(validate_span(&t, &s, &[], 1, 1).is_ok());
        assert_eq!(
            validate_span(&[0; 16], &s, &[], 1, 2).err(),
            Some(InvalidSpan::TraceId { len: 16 })
        );
        assert_eq!(
            validate_span(&t[..15], &s, &[], 1, 2).err(),
            Some(InvalidSpan::TraceId { len: 15 })
        );
        assert_eq!(
            validate_span(&t, &[0; 8], &[], 1, 2).err(),
            Some(InvalidSpan::SpanId { len: 8 })
        );
        assert_eq!(
            validate_span(&t, &s, &[3; 4], 1, 2).err(),
            Some(InvalidSpan::ParentSpanId { len: 4 })
        );
        assert_eq!(
            validate_span(&t, &s, &[], 3, 2).err(),
            Some(InvalidSpan::EndBeforeStart { start: 3, end: 2 })
        );
        let ids = validate_span(&t, &s, &[0; 8], 1, 2).ok().unwrap();
        assert_eq!(ids.parent_span_id, None);
        let ids = validate_span(&t, &s, &[7; 8], 1, 2).ok().unwrap();
        assert_eq!(ids.parent_span_id, Some(SpanId([7; 8])));
    }

    #[test]
    fn first_error_is_kept_and_rejections_counted() {
        let mut d = Decoded::default();
        d.reject(InvalidSpan::SpanId { len: 3 });
        d.reject(InvalidSpan::TraceId { len: 0 });
        assert_eq!(d.rejected, 2);
        assert_eq!(
            d.first_error.as_deref(),
            Some("span id must be 8 bytes and not all zero (got 3 bytes)")
        );
    }
}
