//! The step both receivers share once they hold a request body: reserve memory, decode, count,
//! hand the batch to the pipeline.

use std::sync::Arc;

use bytes::Bytes;

use crate::ingest::{Ingest, IngestBatch, IngestError};
use crate::internal_events::InternalEvents;
use crate::limiter::body_reservation_bytes;
use crate::otlp_decode::{self, Decoded};

use super::ReceiverLimits;

/// A request body in one of the OTLP encodings.
pub(crate) enum Payload {
    /// Protobuf `ExportTraceServiceRequest` (uncompressed).
    Protobuf(Bytes),
    /// OTLP/JSON `ExportTraceServiceRequest` (uncompressed).
    Json(Bytes),
}

impl Payload {
    fn len(&self) -> usize {
        match self {
            Self::Protobuf(b) | Self::Json(b) => b.len(),
        }
    }
}

const OVER_MEMORY: &str = "collector is over its memory limit; retry later";

/// What became of a request.
#[derive(Debug, PartialEq)]
pub(crate) enum Outcome {
    /// Handed to the pipeline; `rejected` invalid spans were left out, with `message` saying why.
    Accepted {
        /// Spans rejected as invalid.
        rejected: u32,
        /// The partial-success message, when some were.
        message: Option<String>,
    },
    /// The body is not a valid request.
    Undecodable(String),
    /// Over the memory limit, or the forward queue is full: retry later.
    Overloaded {
        /// Suggested wait.
        retry_after_secs: u32,
        /// What the client is told.
        why: &'static str,
    },
    /// The pipeline is shutting down.
    ShuttingDown,
}

/// One receiver's shared state.
pub(crate) struct Receiver {
    pub(crate) name: &'static str,
    pub(crate) ingest: Arc<dyn Ingest>,
    pub(crate) events: InternalEvents,
    pub(crate) limits: ReceiverLimits,
}

impl Receiver {
    /// Counts a request refused before its spans could be counted.
    pub(crate) fn refuse_request(&self, reason: &'static str) {
        self.events.spans_dropped(reason, 1);
    }

    /// The memory limiter's soft check on a body's declared size, made before reading it: `false`
    /// (and the request counted as refused) when even that would pass the limit.
    pub(crate) fn admits_declared_body(&self, declared_bytes: u64) -> bool {
        let Some(limiter) = &self.limits.memory else {
            return true;
        };
        let bytes = usize::try_from(declared_bytes).unwrap_or(usize::MAX);
        let admitted = limiter.admits(body_reservation_bytes(bytes));
        if !admitted {
            self.refuse_request("memory_limit");
        }
        admitted
    }

    /// Reserves memory, decodes, counts and ingests one request body.
    pub(crate) fn export(&self, payload: Payload) -> Outcome {
        let _reservation = match &self.limits.memory {
            Some(limiter) => match limiter.try_reserve(body_reservation_bytes(payload.len())) {
                Some(reservation) => Some(reservation),
                None => {
                    // Count what the refused request held, cheaply, when it is protobuf.
                    let spans = match &payload {
                        Payload::Protobuf(b) => otlp_decode::count_spans(b).unwrap_or(1),
                        Payload::Json(_) => 1,
                    };
                    self.refuse_spans("memory_limit", spans);
                    return Outcome::Overloaded {
                        retry_after_secs: self.limits.retry_after_secs,
                        why: OVER_MEMORY,
                    };
                }
            },
            None => None,
        };
        let (decoded, raw_protobuf, raw_json) = match payload {
            Payload::Protobuf(bytes) => (otlp_decode::decode_protobuf(&bytes), Some(bytes), None),
            Payload::Json(bytes) => (otlp_decode::decode_json(&bytes), None, Some(bytes)),
        };
        // Same thread, right after decoding (nothing awaited in between).
        let text_bytes = otlp_decode::take_fresh_text_bytes();
        let Decoded {
            spans,
            rejected,
            first_error,
            span_ranges,
            rejected_ranges,
        } = match decoded {
            Ok(decoded) => decoded,
            Err(error) => {
                self.refuse_request("decode_error");
                return Outcome::Undecodable(error.to_string());
            }
        };
        let accepted = spans.len() as u64;
        let message = first_error.map(|first| {
            format!(
                "{rejected} of {} spans rejected; first: {first}",
                accepted + u64::from(rejected)
            )
        });
        if rejected > 0 {
            self.events
                .spans_received(self.name, "rejected", u64::from(rejected));
            self.events
                .spans_dropped("invalid_span", u64::from(rejected));
        }
        if accepted > 0 {
            match self.ingest.ingest(IngestBatch {
                spans,
                raw_protobuf,
                span_ranges,
                raw_json,
                text_bytes,
                rejected,
                rejected_ranges,
            }) {
                Ok(()) => self.events.spans_received(self.name, "accepted", accepted),
                Err(IngestError::Overloaded { retry_after_secs }) => {
                    self.refuse_spans("memory_limit", accepted);
                    return Outcome::Overloaded {
                        retry_after_secs,
                        why: OVER_MEMORY,
                    };
                }
                Err(IngestError::ForwardBackpressure { retry_after_secs }) => {
                    self.refuse_spans("forward_backpressure", accepted);
                    return Outcome::Overloaded {
                        retry_after_secs,
                        why: "the collector's forward queue is full (its downstream is slow or \
                              down); retry later",
                    };
                }
                Err(IngestError::ShuttingDown) => {
                    self.refuse_spans("shutting_down", accepted);
                    return Outcome::ShuttingDown;
                }
            }
        }
        Outcome::Accepted { rejected, message }
    }

    fn refuse_spans(&self, reason: &'static str, spans: u64) {
        self.events.spans_received(self.name, "refused", spans);
        self.events.spans_dropped(reason, spans);
    }
}
