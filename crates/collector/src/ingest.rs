//! The boundary between receivers and the pipeline: a decoded batch and the trait that takes it.

use bytes::Bytes;
use infertrace_analysis::trace::Span;

use crate::limiter::MemoryReservation;
use crate::otlp_decode::SpanRange;

/// One accepted OTLP export request, decoded.
#[derive(Debug, Default)]
pub struct IngestBatch {
    /// The valid spans of the request (invalid ones were already rejected and counted).
    pub spans: Vec<Span>,
    /// The request as received, protobuf-encoded (`ExportTraceServiceRequest`), for forwarding
    /// unchanged; `None` when it came as JSON (the forwarder then re-encodes `raw_json`).
    pub raw_protobuf: Option<Bytes>,
    /// Where each of `spans` lies in `raw_protobuf` (same order, from
    /// [`Decoded::span_ranges`](crate::otlp_decode::Decoded)), so that a trace analysed on
    /// arrival can hold its spans as ranges of the body (see `crate::held`); empty when
    /// unknown (a compact copy of the spans is held instead).
    pub span_ranges: Vec<SpanRange>,
    /// The (decompressed) OTLP/JSON body when the request came as JSON, so the forwarder can
    /// transcode it to protobuf (only when forwarding is on); `None` for protobuf requests.
    pub raw_json: Option<Bytes>,
    /// Heap bytes of the strings decoding allocated for these spans (names and values seen for
    /// the first time, and unshared ones), reserved with them; shared strings cost nothing
    /// per span. See [`crate::otlp_decode::take_fresh_text_bytes`].
    pub text_bytes: usize,
    /// Spans of the request that were rejected as invalid (not in `spans`). When forwarding is
    /// on and this is not zero, the forwarder sends the body without them (never a span the
    /// collector refused, which may be one the downstream would refuse with the whole batch).
    pub rejected: u32,
    /// Where the rejected spans lie in `raw_protobuf`
    /// ([`Decoded::rejected_ranges`](crate::otlp_decode::Decoded)); empty for JSON requests.
    pub rejected_ranges: Vec<SpanRange>,
    /// The memory the receiver reserved for this request (its body, and what decoding may
    /// allocate), counted for its sender (see [`crate::limiter`]). The forwarder keeps the
    /// body's part of it while the body waits in its queue, so that a sender's queued requests
    /// count towards its share; the rest is given back once the batch is ingested. `None`
    /// without a memory limiter (and for in-process callers).
    pub hold: Option<MemoryReservation>,
}

/// Why a batch was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    /// Over the memory limit: the client should retry later (HTTP 429/503, gRPC UNAVAILABLE).
    #[error("collector is over its memory limit; retry later")]
    Overloaded {
        /// Suggested wait before retrying, seconds.
        retry_after_secs: u32,
    },
    /// The forward queue is full (the downstream is slow or down): the client should retry
    /// later (HTTP 429, gRPC UNAVAILABLE), rather than have the batch accepted and then dropped.
    #[error("the forward queue is full (the downstream is slow or down); retry later")]
    ForwardBackpressure {
        /// Suggested wait before retrying, seconds.
        retry_after_secs: u32,
    },
    /// The forward queue is nearly full (past `limits.soft_limit_percent` of
    /// `forward.queue_size`) and this request's sender already holds its share of it: the
    /// client should retry later, while other senders' requests are still taken (counted as
    /// `forward_share`).
    #[error(
        "the forward queue is nearly full and this sender's requests already hold their share \
         of it; retry later"
    )]
    ForwardShare {
        /// Suggested wait before retrying, seconds.
        retry_after_secs: u32,
    },
    /// The collector is shutting down.
    #[error("collector is shutting down")]
    ShuttingDown,
}

/// Takes decoded batches from the receivers. Implemented by the pipeline; tests use their own.
pub trait Ingest: Send + Sync + 'static {
    /// Hands a batch to the pipeline. Must not block for long: receivers call it on tokio workers.
    /// The batch's [`hold`](IngestBatch::hold) keeps the request's memory reserved for as long
    /// as it lives: an implementation that keeps batches should drop it (or keep only what it
    /// still holds, as the forwarder does). Returns how many of the batch's spans it did not
    /// keep because of a bound (e.g. `max_spans_per_trace`): the receiver reports them as
    /// rejected in the answer, so that no span is answered OK and then dropped (and the
    /// pipeline does not forward them).
    fn ingest(&self, batch: IngestBatch) -> Result<u64, IngestError>;
}
