//! The steps both receivers share: read the body (reserving its memory as it arrives, within
//! the body read timeout), inflate it, reserve what decoding may allocate, decode, count, hand
//! the batch to the pipeline — and say what became of it ([`Outcome`]).

use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;

use crate::ingest::{Ingest, IngestBatch, IngestError};
use crate::internal_events::InternalEvents;
use crate::limiter::{DECODED_BYTES_PER_WIRE_BYTE, MemoryReservation, Refused, Sender};
use crate::listener::PeerAddr;
use crate::otlp_decode::{self, Decoded};

use super::body::{BodyError, Coding, InflateError, LengthFromStart, inflate_limited, read_body};
use super::limits::ReceiverLimits;

/// A request body in one of the OTLP encodings.
pub(crate) enum Payload {
    /// Protobuf `ExportTraceServiceRequest` (uncompressed).
    Protobuf(Bytes),
    /// OTLP/JSON `ExportTraceServiceRequest` (uncompressed).
    Json(Bytes),
}

const OVER_MEMORY: &str = "collector is over its memory limit; retry later";
/// Why spans an ingest bound kept out were rejected (partial success).
const NOT_KEPT: &str = "not kept: the trace holds limits.max_spans_per_trace spans already \
                        (or the collector's table of traces or of late spans is full)";
const OVER_SHARE: &str = "collector is nearly at its memory limit and this sender's requests in \
                          progress hold more than its share; retry later";

/// What became of a request (each receiver answers it in its protocol).
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
    /// The body could not be read (connection broken, client gone, bad gzip).
    Unreadable(String),
    /// Over `max_body_bytes` (before or after gunzip), or more than the whole memory limit could
    /// ever hold: retrying the same request cannot help.
    TooLarge(String),
    /// Over the memory limit now: retry later.
    Overloaded {
        /// Suggested wait.
        retry_after_secs: u32,
        /// What the client is told.
        why: &'static str,
    },
    /// The body did not arrive within the body read timeout.
    TimedOut,
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

/// The memory a request holds while it is read, inflated and decoded (`None` without a limiter).
pub(crate) type Hold = Option<MemoryReservation>;

impl Receiver {
    /// The id of the request's `ingest` token (`None` when this receiver checks no tokens), or
    /// why the request is refused.
    pub(crate) fn ingest_token(
        &self,
        authorization: Option<&http::HeaderValue>,
    ) -> Result<Option<u64>, crate::auth::Refusal> {
        match &self.limits.auth {
            None => Ok(None),
            Some(auth) => auth
                .check_id(self.name, authorization, crate::auth::Scope::Ingest)
                .map(Some),
        }
    }

    /// Counts a request refused before its spans could be counted.
    pub(crate) fn refuse_request(&self, reason: &'static str) {
        self.events.request_refused(self.name, reason);
        self.events.spans_dropped(reason, 1);
    }

    /// An empty reservation to read a request of `sender` into: its token's id when
    /// authentication is on (`token`), else the peer's IP address from the request's
    /// extensions; without either it is held to the limit only.
    pub(crate) fn hold(&self, token: Option<u64>, extensions: &http::Extensions) -> Hold {
        let limiter = self.limits.memory.as_ref()?;
        let sender = token
            .map(Sender::Token)
            .or_else(|| extensions.get::<PeerAddr>().map(|p| Sender::Peer(p.0.ip())));
        Some(match sender {
            Some(sender) => limiter.sender_reservation(sender),
            None => limiter.empty_reservation(),
        })
    }

    /// Counts a request refused for memory (`memory_limit`, or `sender_share` when `hold`'s
    /// last growth was refused for its sender's share) and answers it; `spans` is how many
    /// spans it carried, when known (counted as refused spans).
    fn over_memory(&self, hold: &Hold, spans: Option<u64>) -> Outcome {
        let share = hold
            .as_ref()
            .is_some_and(|h| h.refused() == Some(Refused::SenderShare));
        let reason = if share {
            "sender_share"
        } else {
            "memory_limit"
        };
        match spans {
            None => self.refuse_request(reason),
            Some(spans) => {
                self.events.request_refused(self.name, reason);
                self.refuse_spans(reason, spans);
            }
        }
        Outcome::Overloaded {
            retry_after_secs: self.limits.retry_after_secs,
            why: if share { OVER_SHARE } else { OVER_MEMORY },
        }
    }

    /// Refuses for good (413) a request larger than the memory limiter could ever reserve.
    fn never_fits(&self, hold: &Hold) -> Outcome {
        self.refuse_request("too_large_for_memory");
        let (room, limit) = hold.as_ref().map_or((0, 0), |h| (h.room(), h.limit()));
        Outcome::TooLarge(format!(
            "this request needs more than the {room} bytes the collector's aggregates leave of \
             its memory limit of {limit} bytes: send smaller requests"
        ))
    }

    fn too_large(&self, limit: usize) -> Outcome {
        self.refuse_request("too_large");
        Outcome::TooLarge(format!(
            "request body is larger than the limit of {limit} bytes"
        ))
    }

    /// Reads a request body of at most `limit` bytes within the body read timeout, reserving
    /// its bytes in `hold` before they are allocated, sized by `length_from_start` when it
    /// declares no length ([`read_body`]). (gRPC's `limit` includes its 5-byte frame header; a
    /// refusal names `max_body_bytes`, the limit the user set.)
    pub(crate) async fn read(
        &self,
        body: &mut Incoming,
        limit: usize,
        hold: &mut Hold,
        length_from_start: Option<LengthFromStart>,
    ) -> Result<Bytes, Outcome> {
        let read = read_body(body, limit, hold.as_mut(), length_from_start);
        match tokio::time::timeout(self.limits.body_read_timeout, read).await {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(BodyError::TooLarge)) => Err(self.too_large(self.limits.max_body_bytes)),
            Ok(Err(BodyError::OverMemory)) => Err(self.over_memory(hold, None)),
            Ok(Err(BodyError::NeverFits)) => Err(self.never_fits(hold)),
            Ok(Err(BodyError::Broken(error))) => {
                self.refuse_request("body_broken");
                Err(Outcome::Unreadable(format!(
                    "could not read the request body: {error}"
                )))
            }
            Err(_elapsed) => {
                self.refuse_request("body_timeout");
                Err(Outcome::TimedOut)
            }
        }
    }

    /// Inflates a gzip body to at most `max_body_bytes`, reserving the output in `hold`; the
    /// compressed bytes' share of `hold` is given back once they are dropped.
    pub(crate) fn inflate(
        &self,
        compressed: Bytes,
        coding: Coding,
        hold: &mut Hold,
    ) -> Result<Bytes, Outcome> {
        let limit = self.limits.max_body_bytes;
        let inflated = match inflate_limited(&compressed, coding, limit, hold.as_mut()) {
            Ok(inflated) => inflated,
            Err(InflateError::TooLarge) => return Err(self.too_large(limit)),
            Err(InflateError::OverMemory) => return Err(self.over_memory(hold, None)),
            Err(InflateError::NeverFits) => return Err(self.never_fits(hold)),
            Err(InflateError::Corrupt(error)) => {
                self.refuse_request("decode_error");
                let name = coding.name();
                return Err(Outcome::Unreadable(format!("invalid {name} body: {error}")));
            }
        };
        let len = compressed.len();
        drop(compressed);
        if let Some(h) = hold {
            h.shrink(len);
        }
        Ok(inflated)
    }

    /// Reserves what decoding may allocate (on top of the body `hold` already covers), decodes,
    /// counts and ingests one request body. A request that could not fit even in an empty
    /// collector is [`Outcome::TooLarge`]; one that does not fit now is [`Outcome::Overloaded`].
    pub(crate) fn export(&self, payload: Payload, mut hold: Hold) -> Outcome {
        if let Some(h) = &mut hold {
            let decoded = match &payload {
                Payload::Protobuf(b) => b.len().saturating_mul(DECODED_BYTES_PER_WIRE_BYTE),
                Payload::Json(b) => otlp_decode::json_decode_bound(b),
            };
            if !h.try_grow(decoded) {
                if h.refused() == Some(Refused::NeverFits) {
                    return self.never_fits(&hold);
                }
                // Count what the refused request held, cheaply, when it is protobuf.
                let spans = match &payload {
                    Payload::Protobuf(b) => otlp_decode::count_spans(b).unwrap_or(1),
                    Payload::Json(_) => 1,
                };
                return self.over_memory(&hold, Some(spans));
            }
        }
        let (decoded, raw_protobuf, raw_json) = match payload {
            Payload::Protobuf(bytes) => {
                let decoded = if self.limits.forwarding {
                    otlp_decode::decode_protobuf_for_forwarding(&bytes)
                } else {
                    otlp_decode::decode_protobuf(&bytes)
                };
                (decoded, Some(bytes), None)
            }
            // A body with spans cut out (unreadable on their own) is forwarded as decoded.
            Payload::Json(bytes) => match otlp_decode::decode_json_cutting(&bytes) {
                Ok((decoded, Some(cut))) => (Ok(decoded), None, Some(Bytes::from(cut))),
                Ok((decoded, None)) => (Ok(decoded), None, Some(bytes)),
                Err(e) => (Err(e), None, None),
            },
        };
        // Same thread, right after decoding (nothing awaited in between).
        let text_bytes = otlp_decode::take_fresh_text_bytes();
        self.events
            .texts_truncated(otlp_decode::take_truncated_texts());
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
        let total = accepted + u64::from(rejected);
        if rejected > 0 {
            self.events
                .spans_received(self.name, "rejected", u64::from(rejected));
            self.events
                .spans_dropped("invalid_span", u64::from(rejected));
        }
        // Spans a bound kept out after decoding (counted under its reason where it happened):
        // reported rejected with the invalid ones, never answered OK and dropped.
        let mut not_kept = 0;
        if accepted > 0 {
            match self.ingest.ingest(IngestBatch {
                spans,
                raw_protobuf,
                span_ranges,
                raw_json,
                text_bytes,
                rejected,
                rejected_ranges,
                hold,
            }) {
                Ok(kept_out) => {
                    not_kept = kept_out;
                    self.events
                        .spans_received(self.name, "accepted", accepted - not_kept);
                    if not_kept > 0 {
                        self.events.spans_received(self.name, "rejected", not_kept);
                    }
                }
                Err(IngestError::Overloaded { retry_after_secs }) => {
                    self.events.request_refused(self.name, "memory_limit");
                    self.refuse_spans("memory_limit", accepted);
                    return Outcome::Overloaded {
                        retry_after_secs,
                        why: OVER_MEMORY,
                    };
                }
                Err(IngestError::ForwardBackpressure { retry_after_secs }) => {
                    self.events
                        .request_refused(self.name, "forward_backpressure");
                    self.refuse_spans("forward_backpressure", accepted);
                    return Outcome::Overloaded {
                        retry_after_secs,
                        why: "the collector's forward queue is full (its downstream is slow or \
                              down); retry later",
                    };
                }
                Err(IngestError::ForwardShare { retry_after_secs }) => {
                    self.events.request_refused(self.name, "forward_share");
                    self.refuse_spans("forward_share", accepted);
                    return Outcome::Overloaded {
                        retry_after_secs,
                        why: "the collector's forward queue is nearly full (its downstream is \
                              slow or down) and this sender's requests already hold their share \
                              of it; retry later",
                    };
                }
                Err(IngestError::ShuttingDown) => {
                    self.events.request_refused(self.name, "shutting_down");
                    self.refuse_spans("shutting_down", accepted);
                    return Outcome::ShuttingDown;
                }
            }
        }
        let rejected = u64::from(rejected) + not_kept;
        let first = first_error.or_else(|| (not_kept > 0).then(|| NOT_KEPT.to_owned()));
        Outcome::Accepted {
            rejected: u32::try_from(rejected).unwrap_or(u32::MAX),
            message: first
                .map(|first| format!("{rejected} of {total} spans rejected; first: {first}")),
        }
    }

    fn refuse_spans(&self, reason: &'static str, spans: u64) {
        self.events.spans_received(self.name, "refused", spans);
        self.events.spans_dropped(reason, spans);
    }
}
