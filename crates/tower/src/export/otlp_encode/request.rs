//! [`RequestEncoder`]: the layer's finished requests straight to the body of an OTLP
//! `ExportTraceServiceRequest`, without building `SpanData`.
//!
//! The spans are the ones [`span_data::request_spans`] builds, in the same order, with the same
//! fields, and encoded as opentelemetry-otlp encodes them (opentelemetry-proto's conversion,
//! then prost): the tests compare the bytes. What is constant is encoded once: the resource and
//! the layer's instrumentation scope. Each span is written in place in the batch's list of
//! spans, after room for its length (see [`RequestEncoder::end_span`]).
//! is then known) and from there into the batch's list of spans.
//!
//! [`span_data::request_spans`]: crate::export::span_data::request_spans

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
use opentelemetry::{InstrumentationScope, KeyValue, StringValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::IdGenerator;

use infertrace_semconv::{gen_ai, infer};

use super::writer::{
    LEN, len_field_len, put_bool_attribute, put_bytes, put_bytes_unless_empty, put_f64_attribute,
    put_fixed32_unless_zero, put_fixed64_unless_zero, put_i64_attribute, put_key_value,
    put_len_header, put_str_attribute, put_str_list_attribute, put_tag, put_varint_unless_zero,
    varint_len, write_varint,
};
use crate::attribute_writer::AttributeWriter;
use crate::config::scope;
use crate::export::span_data::DirectSpan;
use crate::finished::FinishedRequest;
use crate::request_facts::StartAttributes;

// Field numbers (opentelemetry/proto/trace/v1/trace.proto and friends).
const RESOURCE_SPANS: u32 = 1; // ExportTraceServiceRequest.resource_spans
const RS_RESOURCE: u32 = 1;
const RS_SCOPE_SPANS: u32 = 2;
const RS_SCHEMA_URL: u32 = 3;
const SS_SCOPE: u32 = 1;
const SS_SPANS: u32 = 2;
const SS_SCHEMA_URL: u32 = 3;
const ATTRIBUTES: u32 = 1; // Resource.attributes
const SCOPE_NAME: u32 = 1;
const SCOPE_VERSION: u32 = 2;
const SCOPE_ATTRIBUTES: u32 = 3;
const SPAN_TRACE_ID: u32 = 1;
const SPAN_SPAN_ID: u32 = 2;
const SPAN_TRACE_STATE: u32 = 3;
const SPAN_PARENT_SPAN_ID: u32 = 4;
const SPAN_NAME: u32 = 5;
const SPAN_KIND: u32 = 6;
const SPAN_START: u32 = 7;
const SPAN_END: u32 = 8;
const SPAN_ATTRIBUTES: u32 = 9;
const SPAN_STATUS: u32 = 15;
const SPAN_FLAGS: u32 = 16;
const STATUS_MESSAGE: u32 = 2;
const STATUS_CODE: u32 = 3;

/// [`RequestEncoder::length_room`] of request spans and of phase spans.
const REQUEST_SPAN: usize = 0;
const PHASE_SPAN: usize = 1;

/// `SpanFlags`: the context's is-remote bit is known (always set), and its value.
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

/// Encodes finished requests into one `ExportTraceServiceRequest` body at a time.
#[derive(Debug)]
pub(crate) struct RequestEncoder {
    /// The `Resource` message's content (as opentelemetry-proto converts the resource).
    resource: Vec<u8>,
    resource_schema_url: String,
    /// The `InstrumentationScope` message's content for the layer's scope.
    scope: Vec<u8>,
    scope_schema_url: String,
    /// The spans so far, each as a `ScopeSpans.spans` field.
    spans: Vec<u8>,
    span_count: usize,
    /// Bytes the length of the last request span took, then of the last phase span: the room
    /// left for the next span's length (it is written once the span's size is known).
    length_room: [usize; 2],
    /// The last request's arrival attributes and their encoding: the next request with the
    /// very same values (usually every request of a layer) copies the bytes.
    arrival: Option<(StartAttributes, Vec<u8>)>,
}

impl RequestEncoder {
    /// An encoder for spans of `resource` (the one the exporter was given).
    pub(crate) fn new(resource: &Resource) -> Self {
        let mut encoded_resource = Vec::new();
        for (key, value) in resource.iter() {
            put_key_value(&mut encoded_resource, ATTRIBUTES, key.as_str(), value);
        }
        let layer_scope = scope();
        Self {
            resource: encoded_resource,
            resource_schema_url: resource.schema_url().unwrap_or_default().to_owned(),
            scope: encode_scope(&layer_scope),
            scope_schema_url: layer_scope.schema_url().unwrap_or_default().to_owned(),
            spans: Vec::with_capacity(64 * 1024),
            span_count: 0,
            length_room: [2, 1],
            arrival: None,
        }
    }

    /// Spans encoded since the last [`finish`](Self::finish).
    pub(crate) fn span_count(&self) -> usize {
        self.span_count
    }

    /// Encodes a finished request: its phase spans when the request span is sampled, then the
    /// request span (the order and content of `span_data::request_spans`). Returns how many
    /// spans that was.
    pub(crate) fn push(
        &mut self,
        span: DirectSpan,
        request: FinishedRequest,
        ids: &impl IdGenerator,
    ) -> usize {
        let status = request.status().unwrap_or(Status::Unset);
        let FinishedRequest {
            end,
            late_model,
            end_attributes,
            phases,
        } = request;
        let DirectSpan {
            context,
            parent_span_id,
            parent_span_is_remote,
            name,
            start,
            start_attributes,
            attributes,
            recording: _,
        } = span;
        let mut count = 0;
        if context.is_sampled() {
            for (name, start, end, attributes) in phases.iter() {
                let phase = PhaseHead { name, start, end };
                self.phase(&context, ids.new_span_id(), phase, attributes);
                count += 1;
            }
        }
        let (name, late_model) = match late_model {
            Some((name, model)) => (name, Some(model)),
            None => (name, None),
        };
        let head = SpanHead {
            context: &context,
            parent_span_id,
            name: &name,
            kind: SpanKind::Server,
            start,
            end,
        };
        let content = self.begin_span(REQUEST_SPAN);
        let scratch = &mut self.spans;
        head.put(scratch);
        // Attributes in the order `DirectSpan::into_span_data` lists them: arrival, the
        // sampler's (and a direct sink's own), the late model, then the end attributes.
        if let Some(values) = start_attributes {
            match &mut self.arrival {
                Some((last, bytes)) if last.same_values(&values) => {
                    scratch.extend_from_slice(bytes);
                }
                cache => {
                    let from = scratch.len();
                    values.write_to(&mut SpanAttributes(scratch));
                    let mut bytes = cache.take().map(|(_, bytes)| bytes).unwrap_or_default();
                    bytes.clear();
                    bytes.extend_from_slice(&scratch[from..]);
                    *cache = Some((values, bytes));
                }
            }
        }
        for kv in &attributes {
            put_key_value(scratch, SPAN_ATTRIBUTES, kv.key.as_str(), &kv.value);
        }
        if let Some(model) = &late_model {
            put_str_attribute(
                scratch,
                SPAN_ATTRIBUTES,
                gen_ai::REQUEST_MODEL,
                model.as_str(),
            );
        }
        end_attributes.write_to(&mut SpanAttributes(scratch));
        put_status(scratch, &status);
        put_flags(scratch, &context, parent_span_is_remote);
        self.end_span(REQUEST_SPAN, content);
        count + 1
    }

    /// One INTERNAL phase span with id `span_id` under the request span `parent`; `attributes`:
    /// its own list (with counters), else `infer.phase` alone.
    fn phase(
        &mut self,
        parent: &SpanContext,
        span_id: SpanId,
        phase: PhaseHead,
        attributes: Option<&[KeyValue]>,
    ) {
        let context = SpanContext::new(
            parent.trace_id(),
            span_id,
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        );
        let head = SpanHead {
            context: &context,
            parent_span_id: parent.span_id(),
            name: phase.name,
            kind: SpanKind::Internal,
            start: phase.start,
            end: phase.end,
        };
        let content = self.begin_span(PHASE_SPAN);
        let scratch = &mut self.spans;
        head.put(scratch);
        match attributes {
            Some(list) => {
                for kv in list {
                    put_key_value(scratch, SPAN_ATTRIBUTES, kv.key.as_str(), &kv.value);
                }
            }
            None => put_str_attribute(scratch, SPAN_ATTRIBUTES, infer::PHASE, phase.name),
        }
        put_status(scratch, &Status::Unset);
        put_flags(scratch, &context, false);
        self.end_span(PHASE_SPAN, content);
    }

    /// Starts a span of `kind` in the list of spans: its tag and room for its length (as many
    /// bytes as the last span of that kind needed). Returns where its content starts.
    fn begin_span(&mut self, kind: usize) -> usize {
        put_tag(&mut self.spans, SS_SPANS, LEN);
        let room = self.length_room[kind];
        self.spans.resize(self.spans.len() + room, 0);
        self.spans.len()
    }

    /// Ends the span whose content starts at `content`: writes its length into the room
    /// before it, moving the content first if the length needs more or fewer bytes (the
    /// varint must be the shortest, as prost writes it).
    fn end_span(&mut self, kind: usize, content: usize) {
        let len = self.spans.len() - content;
        let room = self.length_room[kind];
        let needed = varint_len(len as u64);
        let content = if needed == room {
            content
        } else {
            let moved = content + needed - room;
            if needed > room {
                self.spans.resize(self.spans.len() + needed - room, 0);
            }
            self.spans.copy_within(content..content + len, moved);
            self.spans.truncate(moved + len);
            self.length_room[kind] = needed;
            moved
        };
        write_varint(&mut self.spans[content - needed..content], len as u64);
        self.span_count += 1;
    }

    /// The `ExportTraceServiceRequest` body holding every span encoded since the last call
    /// (one `ResourceSpans`, one `ScopeSpans`), appended to `body`; the encoder starts over.
    pub(crate) fn finish(&mut self, body: &mut Vec<u8>) {
        let scope_spans = len_field_len(SS_SCOPE, self.scope.len())
            + self.spans.len()
            + str_field_len(SS_SCHEMA_URL, &self.scope_schema_url);
        let resource_spans = len_field_len(RS_RESOURCE, self.resource.len())
            + len_field_len(RS_SCOPE_SPANS, scope_spans)
            + str_field_len(RS_SCHEMA_URL, &self.resource_schema_url);
        body.reserve(len_field_len(RESOURCE_SPANS, resource_spans));
        put_len_header(body, RESOURCE_SPANS, resource_spans);
        put_bytes(body, RS_RESOURCE, &self.resource);
        put_len_header(body, RS_SCOPE_SPANS, scope_spans);
        put_bytes(body, SS_SCOPE, &self.scope);
        body.extend_from_slice(&self.spans);
        put_bytes_unless_empty(body, SS_SCHEMA_URL, self.scope_schema_url.as_bytes());
        put_bytes_unless_empty(body, RS_SCHEMA_URL, self.resource_schema_url.as_bytes());
        self.clear();
    }

    /// Forgets the spans encoded since the last [`finish`](Self::finish).
    pub(crate) fn clear(&mut self) {
        self.spans.clear();
        self.span_count = 0;
    }
}

/// Bytes of a string field left out when empty.
fn str_field_len(field: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        len_field_len(field, s.len())
    }
}

/// The `InstrumentationScope` message's content, as opentelemetry-proto converts `scope`.
fn encode_scope(scope: &InstrumentationScope) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes_unless_empty(&mut out, SCOPE_NAME, scope.name().as_bytes());
    put_bytes_unless_empty(
        &mut out,
        SCOPE_VERSION,
        scope.version().unwrap_or_default().as_bytes(),
    );
    for kv in scope.attributes() {
        put_key_value(&mut out, SCOPE_ATTRIBUTES, kv.key.as_str(), &kv.value);
    }
    out
}

/// A phase span's name and interval.
struct PhaseHead {
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
}

/// The request span's arrival and end attributes, written as the span's `attributes` fields
/// straight from their values (no `KeyValue` each).
struct SpanAttributes<'a>(&'a mut Vec<u8>);

impl AttributeWriter for SpanAttributes<'_> {
    #[inline]
    fn string(&mut self, key: &'static str, value: &StringValue) {
        put_str_attribute(self.0, SPAN_ATTRIBUTES, key, value.as_str());
    }

    #[inline]
    fn static_str(&mut self, key: &'static str, value: &'static str) {
        put_str_attribute(self.0, SPAN_ATTRIBUTES, key, value);
    }

    #[inline]
    fn cow(&mut self, key: &'static str, value: &Cow<'static, str>) {
        put_str_attribute(self.0, SPAN_ATTRIBUTES, key, value);
    }

    #[inline]
    fn shared(&mut self, key: &'static str, value: &Arc<str>) {
        put_str_attribute(self.0, SPAN_ATTRIBUTES, key, value);
    }

    #[inline]
    fn shared_list(&mut self, key: &'static str, value: &Arc<str>) {
        put_str_list_attribute(self.0, SPAN_ATTRIBUTES, key, value);
    }

    #[inline]
    fn i64(&mut self, key: &'static str, value: i64) {
        put_i64_attribute(self.0, SPAN_ATTRIBUTES, key, value);
    }

    #[inline]
    fn f64(&mut self, key: &'static str, value: f64) {
        put_f64_attribute(self.0, SPAN_ATTRIBUTES, key, value);
    }

    #[inline]
    fn bool(&mut self, key: &'static str, value: bool) {
        put_bool_attribute(self.0, SPAN_ATTRIBUTES, key, value);
    }
}

/// A span's fields before its attributes (fields 1 to 8; the parent's is-remote bit goes into
/// the flags, written last).
struct SpanHead<'a> {
    context: &'a SpanContext,
    parent_span_id: SpanId,
    name: &'a str,
    kind: SpanKind,
    start: SystemTime,
    end: SystemTime,
}

impl SpanHead<'_> {
    fn put(&self, buf: &mut Vec<u8>) {
        put_bytes(buf, SPAN_TRACE_ID, &self.context.trace_id().to_bytes());
        put_bytes(buf, SPAN_SPAN_ID, &self.context.span_id().to_bytes());
        // An empty trace state's header is an empty string (no allocation).
        let trace_state = self.context.trace_state().header();
        put_bytes_unless_empty(buf, SPAN_TRACE_STATE, trace_state.as_bytes());
        if self.parent_span_id != SpanId::INVALID {
            put_bytes(buf, SPAN_PARENT_SPAN_ID, &self.parent_span_id.to_bytes());
        }
        put_bytes_unless_empty(buf, SPAN_NAME, self.name.as_bytes());
        let kind = match self.kind {
            SpanKind::Internal => 1,
            SpanKind::Server => 2,
            SpanKind::Client => 3,
            SpanKind::Producer => 4,
            SpanKind::Consumer => 5,
        };
        put_varint_unless_zero(buf, SPAN_KIND, kind);
        put_fixed64_unless_zero(buf, SPAN_START, nanos(self.start));
        put_fixed64_unless_zero(buf, SPAN_END, nanos(self.end));
    }
}

/// Nanoseconds since the epoch, 0 before it (as opentelemetry-proto converts times).
fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The `Status` message (always present, as opentelemetry-proto sets it).
fn put_status(buf: &mut Vec<u8>, status: &Status) {
    let (code, message): (u64, &str) = match status {
        Status::Unset => (0, ""),
        Status::Ok => (1, ""),
        Status::Error { description } => (2, description.as_ref()),
    };
    let mut len = str_field_len(STATUS_MESSAGE, message);
    if code != 0 {
        len += 2;
    }
    put_len_header(buf, SPAN_STATUS, len);
    put_bytes_unless_empty(buf, STATUS_MESSAGE, message.as_bytes());
    put_varint_unless_zero(buf, STATUS_CODE, code);
}

/// `flags` (`fixed32`): the W3C trace flags and the parent's is-remote bits.
fn put_flags(buf: &mut Vec<u8>, context: &SpanContext, parent_is_remote: bool) {
    let mut flags = u32::from(context.trace_flags().to_u8()) | FLAG_HAS_IS_REMOTE;
    if parent_is_remote {
        flags |= FLAG_IS_REMOTE;
    }
    put_fixed32_unless_zero(buf, SPAN_FLAGS, flags);
}
