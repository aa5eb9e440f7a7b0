//! The trace model every analysis works on: spans reduced to what infertrace needs.
//!
//! Spans arrive from OTLP (protobuf or JSON), from Jaeger JSON exports, or are built by hand in
//! tests. Only the attributes in [`KNOWN_KEYS`] are kept: the receiver can then decode without
//! allocating for attributes nobody reads, and every decoder keeps exactly the same set.

use std::fmt;

use infertrace_semconv as sc;
use serde::{Serialize, Serializer};

pub use crate::text::Text;

/// A 16-byte trace id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// Lower-case hex, 32 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
    /// Parses 32 hex characters.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 16];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }
    /// Builds from bytes; `None` unless exactly 16 bytes and not all zero.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let arr: [u8; 16] = b.try_into().ok()?;
        (arr != [0; 16]).then_some(Self(arr))
    }
}

impl SpanId {
    /// Lower-case hex, 16 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
    /// Parses 16 hex characters.
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 8];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }
    /// Builds from bytes; `None` unless exactly 8 bytes and not all zero.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let arr: [u8; 8] = b.try_into().ok()?;
        (arr != [0; 8]).then_some(Self(arr))
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl Serialize for TraceId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}
impl Serialize for SpanId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

/// OTLP span kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// Unspecified (0).
    #[default]
    Unspecified,
    /// Internal (1).
    Internal,
    /// Server (2).
    Server,
    /// Client (3).
    Client,
    /// Producer (4).
    Producer,
    /// Consumer (5).
    Consumer,
}

impl SpanKind {
    /// From the OTLP enum number; unknown numbers are `Unspecified`.
    pub fn from_otlp(n: i32) -> Self {
        match n {
            1 => Self::Internal,
            2 => Self::Server,
            3 => Self::Client,
            4 => Self::Producer,
            5 => Self::Consumer,
            _ => Self::Unspecified,
        }
    }
}

/// OTLP status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusCode {
    /// Unset (0).
    #[default]
    Unset,
    /// Ok (1).
    Ok,
    /// Error (2).
    Error,
}

impl StatusCode {
    /// From the OTLP enum number; unknown numbers are `Unset`.
    pub fn from_otlp(n: i32) -> Self {
        match n {
            1 => Self::Ok,
            2 => Self::Error,
            _ => Self::Unset,
        }
    }
}

/// An attribute value (only the kinds infertrace reads).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AttrValue {
    /// String (shared; decoders intern repeated values).
    Str(Text),
    /// Integer.
    Int(i64),
    /// Double.
    Double(f64),
    /// Boolean.
    Bool(bool),
    /// Array of strings (other array kinds are not kept).
    StrArray(Vec<Text>),
}

impl AttrValue {
    /// As a string slice, if a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }
    /// As a number: doubles, integers, and strings that parse as a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Double(d) => Some(*d),
            Self::Int(i) => Some(*i as f64),
            Self::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
    /// As an integer: integers, integral doubles, and strings that parse as one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            Self::Double(d) if d.fract() == 0.0 && d.is_finite() => Some(*d as i64),
            Self::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }
}

/// The attribute keys infertrace keeps. Decoders look keys up here and drop the rest.
pub const KNOWN_KEYS: &[&str] = &[
    sc::gen_ai::OPERATION_NAME,
    sc::gen_ai::REQUEST_MODEL,
    sc::gen_ai::RESPONSE_MODEL,
    sc::gen_ai::REQUEST_MAX_TOKENS,
    sc::gen_ai::REQUEST_STREAM,
    sc::gen_ai::RESPONSE_FINISH_REASONS,
    sc::gen_ai::USAGE_INPUT_TOKENS,
    sc::gen_ai::USAGE_OUTPUT_TOKENS,
    sc::gen_ai::USAGE_PROMPT_TOKENS,
    sc::gen_ai::USAGE_COMPLETION_TOKENS,
    sc::gen_ai::REQUEST_ID,
    sc::latency::TIME_IN_QUEUE,
    sc::latency::TIME_TO_FIRST_TOKEN,
    sc::latency::TIME_IN_MODEL_PREFILL,
    sc::latency::TIME_IN_MODEL_DECODE,
    sc::latency::TIME_IN_MODEL_INFERENCE,
    sc::latency::E2E,
    sc::latency::TIME_IN_SCHEDULER,
    sc::latency::TIME_IN_MODEL_FORWARD,
    sc::latency::TIME_IN_MODEL_EXECUTE,
    sc::infer::TIME_PER_OUTPUT_TOKEN,
    sc::infer::TIME_TO_FIRST_CHUNK,
    sc::infer::INTER_TOKEN_LATENCY_P50,
    sc::infer::INTER_TOKEN_LATENCY_P99,
    sc::infer::INTER_TOKEN_LATENCY_MAX,
    sc::infer::STREAM_CHUNKS,
    sc::infer::OUTCOME,
    sc::infer::PHASE_SOURCE,
    sc::infer::QUEUE_DEPTH,
    sc::infer::PHASE,
    sc::gpu::UTILIZATION_MEAN,
    sc::gpu::UTILIZATION_MAX,
    sc::gpu::SM_ACTIVITY_MEAN,
    sc::gpu::MEMORY_USED_MAX,
    sc::gpu::POWER_MEAN,
    sc::gpu::ENERGY,
    sc::gpu::ENERGY_ATTRIBUTED,
    sc::gpu::SAMPLE_COUNT,
    sc::gpu::HOST_CPU_UTILIZATION_MEAN,
    sc::gpu::PROCESS_CPU_UTILIZATION_MEAN,
    sc::gpu::PROCESS_MEMORY_USAGE_MAX,
    sc::net::HTTP_REQUEST_METHOD,
    sc::net::HTTP_ROUTE,
    sc::net::HTTP_RESPONSE_STATUS_CODE,
    sc::net::RPC_SYSTEM,
    sc::net::RPC_SERVICE,
    sc::net::RPC_METHOD,
    sc::net::RPC_GRPC_STATUS_CODE,
    sc::net::ERROR_TYPE,
    sc::tgi::TOTAL_TIME,
    sc::tgi::VALIDATION_TIME,
    sc::tgi::QUEUE_TIME,
    sc::tgi::INFERENCE_TIME,
    sc::tgi::TIME_PER_TOKEN,
    sc::tgi::BATCH_SIZE,
    sc::gen_ai::PROVIDER_NAME,
    sc::gen_ai::USAGE_CACHE_READ_INPUT_TOKENS,
    sc::latency::KV_CACHE_TRANSFER_TIME,
    sc::infer::PREEMPTIONS,
    sc::infer::LORA_ADAPTER,
    sc::disagg::ROLE,
    sc::sglang::BOOTSTRAP_ROOM,
    sc::sglang::RID,
    sc::sglang::THREAD_LABEL,
    sc::sglang::TP_RANK,
    sc::sglang::USAGE_CACHED_TOKENS,
];

/// Looks a key up in [`KNOWN_KEYS`], returning the static name if kept.
pub fn known_key(key: &[u8]) -> Option<&'static str> {
    KNOWN_KEYS.iter().copied().find(|k| k.as_bytes() == key)
}

/// The index of `key` in [`KNOWN_KEYS`], if kept: the same answer as [`known_key`], for the
/// decoders' hot path (keys bucketed by length, compared word by word).
#[inline]
pub fn known_key_index(key: &[u8]) -> Option<u8> {
    KNOWN_BY_LEN
        .get(key.len())?
        .iter()
        .find(|(k, _)| crate::text::same_bytes(k.as_bytes(), key))
        .map(|&(_, i)| i)
}

/// [`KNOWN_KEYS`] with their indexes, bucketed by length.
static KNOWN_BY_LEN: std::sync::LazyLock<Vec<Vec<(&'static str, u8)>>> =
    std::sync::LazyLock::new(|| {
        let longest = KNOWN_KEYS.iter().map(|k| k.len()).max().unwrap_or(0);
        let mut buckets = vec![Vec::new(); longest + 1];
        for (i, k) in KNOWN_KEYS.iter().enumerate() {
            if let Ok(i) = u8::try_from(i) {
                buckets[k.len()].push((*k, i));
            }
        }
        buckets
    });

// Key indexes are one byte.
const _: () = assert!(KNOWN_KEYS.len() <= 256);

/// `a == b` for attribute keys, cheaper on the misses that dominate lookups: many known keys
/// share a length, and they differ more often in their last eight bytes than their first.
#[inline]
fn key_eq(a: &str, b: &str) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.len() >= 8 {
        let tail = |s: &str| {
            let bytes = s.as_bytes();
            let mut t = [0u8; 8];
            t.copy_from_slice(&bytes[bytes.len() - 8..]);
            u64::from_ne_bytes(t)
        };
        if tail(a) != tail(b) {
            return false;
        }
    }
    a == b
}

/// A span link (links never make a child in the critical path).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpanLink {
    /// Linked trace.
    pub trace_id: TraceId,
    /// Linked span.
    pub span_id: SpanId,
}

/// One span, reduced to what infertrace analyses.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Span {
    /// Trace id.
    pub trace_id: TraceId,
    /// Span id.
    pub span_id: SpanId,
    /// Parent span id, `None` for a root.
    pub parent_span_id: Option<SpanId>,
    /// Span name (shared; decoders intern repeated names).
    pub name: Text,
    /// `service.name` of the span's resource (`unknown_service` when absent).
    pub service: Text,
    /// Span kind.
    pub kind: SpanKind,
    /// Start, Unix nanoseconds.
    pub start_unix_nano: u64,
    /// End, Unix nanoseconds.
    pub end_unix_nano: u64,
    /// Status code.
    pub status: StatusCode,
    /// Kept attributes (see [`KNOWN_KEYS`]), in arrival order.
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// Links to other spans.
    pub links: Vec<SpanLink>,
}

impl Span {
    /// The value of a kept attribute.
    pub fn attr(&self, key: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find(|(k, _)| key_eq(k, key))
            .map(|(_, v)| v)
    }
    /// A string attribute.
    pub fn attr_str(&self, key: &str) -> Option<&str> {
        self.attr(key).and_then(AttrValue::as_str)
    }
    /// A string attribute as the shared [`Text`] (a clone costs no copy).
    pub fn attr_text(&self, key: &str) -> Option<&Text> {
        match self.attr(key)? {
            AttrValue::Str(t) => Some(t),
            _ => None,
        }
    }
    /// A numeric attribute.
    pub fn attr_f64(&self, key: &str) -> Option<f64> {
        self.attr(key).and_then(AttrValue::as_f64)
    }
    /// An integer attribute.
    pub fn attr_i64(&self, key: &str) -> Option<i64> {
        self.attr(key).and_then(AttrValue::as_i64)
    }
    /// Duration in nanoseconds (0 if the end precedes the start).
    pub fn duration_nanos(&self) -> u64 {
        self.end_unix_nano.saturating_sub(self.start_unix_nano)
    }
    /// Duration in seconds.
    pub fn duration_secs(&self) -> f64 {
        self.duration_nanos() as f64 / 1e9
    }
}

/// The service name used when a resource has none.
pub const UNKNOWN_SERVICE: &str = "unknown_service";
