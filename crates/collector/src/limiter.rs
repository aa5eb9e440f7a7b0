//! The memory limiter: one shared budget of bytes that receivers and the assembler reserve from
//! before they hold data, so the collector refuses work (HTTP 429, gRPC `UNAVAILABLE`) before the
//! process grows past its configured limit, instead of being killed for running out of memory.
//!
//! Accounting is by estimate, not by asking the allocator: receivers reserve the body they hold
//! as it reads it, then an estimate of what decoding allocates ([`DECODED_BYTES_PER_WIRE_BYTE`]
//! for protobuf, [`json_decode_bound`] for JSON), the assembler reserves
//! [`span_footprint`] for every span it buffers. A [`MemoryReservation`] gives its bytes back when
//! dropped, so a refused, failed or finished piece of work can never leak budget.
//!
//! ```
//! use infertrace_collector::limiter::MemoryLimiter;
//!
//! let limiter = MemoryLimiter::new(1_000);
//! let mut held = limiter.try_reserve(600).unwrap();
//! assert!(limiter.try_reserve(600).is_none()); // would pass the limit: refused
//! let part = held.split(200).unwrap(); // hand 200 bytes to someone else
//! drop(held);
//! assert_eq!(limiter.used(), 200);
//! drop(part);
//! assert_eq!(limiter.used(), 0);
//! ```

use std::mem::size_of;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{AttrValue, Span, SpanLink};

/// Default memory limit: 512 MiB.
pub const DEFAULT_MEMORY_LIMIT_BYTES: usize = 512 * 1024 * 1024;

/// Estimated bytes a decoded batch occupies per byte of its protobuf encoding: an upper bound
/// for realistic inference traces (the `decoded_footprint_per_wire_byte_is_covered` test below
/// measures [`span_footprint`] of decoded spans ÷ wire bytes; `otlp-blast` prints it too).
pub const DECODED_BYTES_PER_WIRE_BYTE: usize = 3;

/// Heap bookkeeping counted per allocation in [`span_footprint`] (allocator header and rounding).
const ALLOCATION_OVERHEAD: usize = 16;

/// A shared memory budget. Cheap to clone: clones share the same budget.
#[derive(Clone, Debug)]
pub struct MemoryLimiter {
    state: Arc<LimiterState>,
}

#[derive(Debug)]
struct LimiterState {
    limit: usize,
    used: AtomicUsize,
    refusals: AtomicU64,
}

impl Default for MemoryLimiter {
    /// A limiter of [`DEFAULT_MEMORY_LIMIT_BYTES`].
    fn default() -> Self {
        Self::new(DEFAULT_MEMORY_LIMIT_BYTES)
    }
}

impl MemoryLimiter {
    /// A limiter that lets at most `limit_bytes` be reserved at once.
    pub fn new(limit_bytes: usize) -> Self {
        Self {
            state: Arc::new(LimiterState {
                limit: limit_bytes,
                used: AtomicUsize::new(0),
                refusals: AtomicU64::new(0),
            }),
        }
    }

    /// The configured limit in bytes.
    pub fn limit(&self) -> usize {
        self.state.limit
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> usize {
        self.state.used.load(Ordering::Relaxed)
    }

    /// Bytes that can still be reserved.
    pub fn available(&self) -> usize {
        self.limit().saturating_sub(self.used())
    }

    /// How many reservations were refused so far.
    pub fn refusals(&self) -> u64 {
        self.state.refusals.load(Ordering::Relaxed)
    }

    /// Reserves `bytes`, or returns `None` (and counts a refusal) when that would pass the limit.
    /// The bytes are given back when the returned reservation is dropped.
    pub fn try_reserve(&self, bytes: usize) -> Option<MemoryReservation> {
        if self.grow_used(bytes) {
            Some(MemoryReservation {
                limiter: self.clone(),
                bytes,
            })
        } else {
            None
        }
    }

    /// A reservation of zero bytes, to grow later.
    pub fn empty_reservation(&self) -> MemoryReservation {
        MemoryReservation {
            limiter: self.clone(),
            bytes: 0,
        }
    }

    fn grow_used(&self, bytes: usize) -> bool {
        let limit = self.limit();
        let updated = self
            .state
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            });
        if updated.is_err() {
            self.state.refusals.fetch_add(1, Ordering::Relaxed);
        }
        updated.is_ok()
    }

    fn release(&self, bytes: usize) {
        self.state.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    fn same_budget(&self, other: &MemoryLimiter) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

/// Bytes held from a [`MemoryLimiter`]; given back when dropped.
#[derive(Debug)]
pub struct MemoryReservation {
    limiter: MemoryLimiter,
    bytes: usize,
}

impl MemoryReservation {
    /// Bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The limit of the limiter it reserves from.
    pub fn limit(&self) -> usize {
        self.limiter.limit()
    }

    /// Reserves `bytes` more into this reservation; `false` (nothing changed) if over the limit.
    pub fn try_grow(&mut self, bytes: usize) -> bool {
        let grown = self.limiter.grow_used(bytes);
        if grown {
            self.bytes += bytes;
        }
        grown
    }

    /// Gives `bytes` back to the limiter now (at most what is held).
    pub fn shrink(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        self.limiter.release(bytes);
    }

    /// Moves `bytes` of this reservation into a new one (for handing part of the budget to
    /// another owner); `None` if this reservation holds fewer bytes.
    pub fn split(&mut self, bytes: usize) -> Option<MemoryReservation> {
        (bytes <= self.bytes).then(|| {
            self.bytes -= bytes;
            MemoryReservation {
                limiter: self.limiter.clone(),
                bytes,
            }
        })
    }

    /// Takes `other`'s bytes into this reservation. Fails, giving `other` back unchanged, when it
    /// comes from a different limiter.
    pub fn merge(&mut self, mut other: MemoryReservation) -> Result<(), MemoryReservation> {
        if !self.limiter.same_budget(&other.limiter) {
            return Err(other);
        }
        self.bytes += std::mem::take(&mut other.bytes);
        Ok(())
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.limiter.release(self.bytes);
        }
    }
}

/// Bytes that decoding an OTLP/JSON body may allocate at most, as a bound for the memory
/// limiter: [`JSON_BYTES_PER_OBJECT`] for every `{` (each span, attribute, value, resource... is
/// an object, and the generated types it becomes plus the spans made from them stay under that)
/// plus twice the body for the strings copied out of it. Counting braces is one pass over
/// the body; it over-counts braces inside strings, which only makes the bound safer.
pub fn json_decode_bound(body: &[u8]) -> usize {
    let objects = body.iter().filter(|&&b| b == b'{').count();
    objects
        .saturating_mul(JSON_BYTES_PER_OBJECT)
        .saturating_add(body.len().saturating_mul(2))
}

/// Bytes [`json_decode_bound`] counts per JSON object: an upper bound of what one object of an
/// OTLP/JSON request becomes once decoded (the largest generated type, the span, is ~250 bytes;
/// vectors grow by doubling; the analysis spans made from them are counted too). The
/// `json_decode_stays_under_its_bound` test measures the real peak against it.
pub const JSON_BYTES_PER_OBJECT: usize = 1024;

/// Estimated heap + inline bytes one decoded [`Span`] occupies, for the assembler's reservations.
///
/// Counts the `Span` struct, the capacity of its attribute and link vectors, and 16 bytes of
/// allocator overhead per heap allocation. Strings are not counted here: names and string
/// values are shared [`Text`]s, and the decoders report the bytes of the strings they allocate
/// per request (`IngestBatch::text_bytes`), which the pipeline reserves with the spans. The
/// service name is shared by all spans of a resource. An infertrace request span with 18 kept
/// attributes comes to about 850 bytes, a phase span with two attributes to about 230 bytes
/// (the `Span` struct alone is 120 bytes).
pub fn span_footprint(span: &Span) -> usize {
    let mut bytes = size_of::<Span>();
    if span.attributes.capacity() > 0 {
        bytes += span.attributes.capacity() * size_of::<(&'static str, AttrValue)>()
            + ALLOCATION_OVERHEAD;
    }
    for (_, value) in &span.attributes {
        bytes += match value {
            AttrValue::Str(_) => 0,
            AttrValue::StrArray(items) if items.capacity() > 0 => {
                items.capacity() * size_of::<Text>() + ALLOCATION_OVERHEAD
            }
            AttrValue::StrArray(_) => 0,
            AttrValue::Int(_) | AttrValue::Double(_) | AttrValue::Bool(_) => 0,
        };
    }
    if span.links.capacity() > 0 {
        bytes += span.links.capacity() * size_of::<SpanLink>() + ALLOCATION_OVERHEAD;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_analysis::trace::{SpanId, SpanKind, StatusCode, TraceId};

    #[test]
    fn reserve_refuses_past_the_limit_and_releases_on_drop() {
        let limiter = MemoryLimiter::new(100);
        let a = limiter.try_reserve(60).unwrap();
        assert_eq!(limiter.used(), 60);
        assert_eq!(limiter.available(), 40);
        assert!(limiter.try_reserve(41).is_none());
        assert_eq!(limiter.refusals(), 1);
        let b = limiter.try_reserve(40).unwrap();
        assert_eq!(limiter.available(), 0);
        drop(a);
        assert_eq!(limiter.used(), 40);
        drop(b);
        assert_eq!(limiter.used(), 0);
        assert!(limiter.try_reserve(usize::MAX).is_none());
    }

    #[test]
    fn split_merge_grow_shrink_keep_the_total_exact() {
        let limiter = MemoryLimiter::new(1_000);
        let mut r = limiter.try_reserve(500).unwrap();
        let part = r.split(200).unwrap();
        assert!(r.split(301).is_none());
        assert_eq!((r.bytes(), part.bytes(), limiter.used()), (300, 200, 500));
        r.merge(part).unwrap();
        assert_eq!((r.bytes(), limiter.used()), (500, 500));
        assert!(r.try_grow(500));
        assert!(!r.try_grow(1));
        assert_eq!(limiter.used(), 1_000);
        r.shrink(400);
        r.shrink(10_000); // clamps to what is held
        assert_eq!((r.bytes(), limiter.used()), (0, 0));
        let mut empty = limiter.empty_reservation();
        assert!(empty.try_grow(10));
        drop(empty);
        assert_eq!(limiter.used(), 0);
    }

    #[test]
    fn merge_across_limiters_is_refused() {
        let one = MemoryLimiter::new(100);
        let two = MemoryLimiter::new(100);
        let mut a = one.try_reserve(10).unwrap();
        let b = two.try_reserve(20).unwrap();
        let b = a.merge(b).unwrap_err();
        assert_eq!((a.bytes(), b.bytes()), (10, 20));
        assert_eq!((one.used(), two.used()), (10, 20));
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let limiter = MemoryLimiter::new(10_000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let limiter = limiter.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for _ in 0..10_000 {
                        if let Some(r) = limiter.try_reserve(7) {
                            held.push(r);
                        }
                        assert!(limiter.used() <= 10_000);
                        if held.len() > 300 {
                            held.clear();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(limiter.used(), 0);
    }

    /// A request span with 20 attributes (16 kept) and three phase spans with two each, as the
    /// middleware emits them: the decoded footprint per wire byte stays under the constant.
    #[test]
    fn decoded_footprint_per_wire_byte_is_covered() {
        use infertrace_semconv as sc;
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as PSpan};
        use prost::Message;

        let kv = |key: &str, value: Value| KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            key_strindex: 0,
        };
        let s = |v: &str| Value::StringValue(v.into());
        let mut spans = Vec::new();
        for i in 0..50u8 {
            let trace_id = vec![i + 1; 16];
            let mut attributes = vec![
                kv(sc::gen_ai::OPERATION_NAME, s("chat")),
                kv(sc::gen_ai::REQUEST_MODEL, s("llama-3.1-8b")),
                kv(sc::gen_ai::RESPONSE_MODEL, s("llama-3.1-8b")),
                kv(sc::gen_ai::USAGE_INPUT_TOKENS, Value::IntValue(812)),
                kv(sc::gen_ai::USAGE_OUTPUT_TOKENS, Value::IntValue(212)),
                kv(sc::net::HTTP_ROUTE, s("/v1/chat/completions")),
                kv(sc::infer::OUTCOME, s("ok")),
                kv("user_agent.original", s("python-httpx/0.27")),
                kv("server.address", s("10.0.0.12")),
                kv("url.path", s("/v1/chat/completions")),
                kv("server.port", Value::IntValue(8000)),
            ];
            for key in [
                sc::latency::TIME_IN_QUEUE,
                sc::latency::TIME_TO_FIRST_TOKEN,
                sc::latency::E2E,
                sc::infer::TIME_PER_OUTPUT_TOKEN,
                sc::infer::INTER_TOKEN_LATENCY_P50,
                sc::infer::INTER_TOKEN_LATENCY_P99,
                sc::infer::INTER_TOKEN_LATENCY_MAX,
                sc::infer::TIME_TO_FIRST_CHUNK,
                sc::infer::STREAM_CHUNKS,
            ] {
                attributes.push(kv(key, Value::DoubleValue(0.123)));
            }
            spans.push(PSpan {
                trace_id: trace_id.clone(),
                span_id: vec![1; 8],
                name: "chat llama-3.1-8b".into(),
                kind: 2,
                start_time_unix_nano: 1_700_000_000_000_000_000,
                end_time_unix_nano: 1_700_000_001_000_000_000,
                attributes,
                ..Default::default()
            });
            for (j, phase) in ["queue", "prefill", "decode"].into_iter().enumerate() {
                spans.push(PSpan {
                    trace_id: trace_id.clone(),
                    span_id: vec![j as u8 + 2; 8],
                    parent_span_id: vec![1; 8],
                    name: phase.into(),
                    kind: 1,
                    start_time_unix_nano: 1_700_000_000_000_000_000,
                    end_time_unix_nano: 1_700_000_000_500_000_000,
                    attributes: vec![
                        kv(sc::infer::PHASE, s(phase)),
                        kv(sc::gpu::UTILIZATION_MEAN, Value::DoubleValue(0.8)),
                    ],
                    ..Default::default()
                });
            }
        }
        let wire = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec();
        let decoded = crate::otlp_decode::decode_protobuf(&wire).unwrap();
        assert_eq!(decoded.spans.len(), 200);
        let footprint: usize = decoded.spans.iter().map(span_footprint).sum();
        let ratio = footprint as f64 / wire.len() as f64;
        assert!(
            ratio > 1.0 && ratio <= DECODED_BYTES_PER_WIRE_BYTE as f64,
            "decoded/wire = {ratio:.2}"
        );
        // Memory per buffered span stays under 1 KiB (the issue's target).
        assert!(footprint / decoded.spans.len() < 1024);
    }

    #[test]
    fn span_footprint_counts_owned_heap_memory() {
        let bare = Span {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([2; 8]),
            parent_span_id: None,
            name: "".into(),
            service: Text::from("svc"),
            kind: SpanKind::Server,
            start_unix_nano: 1,
            end_unix_nano: 2,
            status: StatusCode::Unset,
            attributes: Vec::new(),
            links: Vec::new(),
        };
        assert_eq!(span_footprint(&bare), size_of::<Span>());
        let long = "x".repeat(200);
        let mut span = bare.clone();
        span.name = "strings are reserved per request, not per span".into();
        span.attributes = Vec::with_capacity(2);
        span.attributes
            .push(("a", AttrValue::Str(long.as_str().into())));
        span.attributes.push((
            "b",
            AttrValue::StrArray(vec!["stop".into(), long.as_str().into()]),
        ));
        let expected = size_of::<Span>()
            + (2 * size_of::<(&str, AttrValue)>() + 16)
            + (2 * size_of::<Text>() + 16);
        assert_eq!(span_footprint(&span), expected);
    }
}
