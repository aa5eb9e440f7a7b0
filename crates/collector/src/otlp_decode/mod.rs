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
//! - [`decode_json`]: OTLP/JSON (hex ids, integer enums, lowerCamelCase keys; also `null`
//!   fields, enum names and numbers as strings, as the protobuf JSON mapping allows), through
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
//!   bytes, mixed arrays, a missing value) drops the attribute. An array keeps its first
//!   [`MAX_ARRAY_ITEMS`](infertrace_analysis::text::MAX_ARRAY_ITEMS) (64) strings, the rest
//!   are not read (counted as a cut text, [`take_truncated_texts`]). Attributes keep their
//!   order, duplicates included.
//! - A body that is not valid protobuf (or JSON) is a [`DecodeError`]: the whole request is
//!   refused. Exceptions, so that one span does not cost the others: a string the collector
//!   reads (a span or service name, a kept attribute value) that is not UTF-8 rejects its span
//!   (a service name: its resource's spans); for JSON, whose parser stops at 128 levels of
//!   nesting where the protobuf reader follows any depth, a span the parser cannot read (nested
//!   that deep, an id that is not hex, a string that is not UTF-8 or holds a bad escape) is cut
//!   out and rejected, and the rest decoded ([`decode_json_cutting`]); so is a scope or
//!   resource, with all its spans.
//! - Span names, service names and string values longer than
//!   [`MAX_TEXT_LEN`](infertrace_analysis::text::MAX_TEXT_LEN) (256 bytes) are cut at a character
//!   boundary and counted ([`take_truncated_texts`]): they become labels and dimensions.
//! - Span names and string values are [`Text`]s from a per-thread bounded [`Interner`] (the
//!   same model, route or phase name is one shared string across all spans), except
//!   `gen_ai.request.id`, which is unique per request and is copied. The bytes of strings a
//!   decode allocated are reported by [`take_fresh_text_bytes`] for the memory limiter.
//!
//! [`Span`]: infertrace_analysis::trace::Span
//! [`Text`]: infertrace_analysis::text::Text
//! [`Interner`]: infertrace_analysis::text::Interner

mod decoded;
mod forwardable;
mod interner;
mod json;
mod json_lenient;
mod json_spans;
mod protobuf;
mod reference;
mod split;
mod validation;
mod wire;

pub use decoded::{DecodeError, Decoded, SpanRange};
pub(crate) use interner::with_text_interner;
pub use interner::{take_fresh_text_bytes, take_truncated_texts};
pub use json::{
    JSON_BYTES_PER_ARRAY, JSON_BYTES_PER_ELEMENT, JSON_BYTES_PER_OBJECT, decode_json,
    decode_json_cutting, json_decode_bound,
};
pub use protobuf::{
    count_spans, decode_protobuf, decode_protobuf_for_forwarding, decode_span, without_spans,
};
pub use reference::{from_proto, leave_out_spans, retain_accepted};
pub use split::split_request;
pub use validation::MAX_VALUE_NESTING;
