//! Optional OTLP trace forwarding downstream (Jaeger, Tempo, another collector).
//!
//! **What is sent.** The receivers keep each request's protobuf body
//! ([`IngestBatch::raw_protobuf`]); the forwarder sends those bytes *unchanged* (no decode, no
//! re-encode: every attribute the lean decoder skipped still reaches the downstream). Requests
//! that came as OTLP/JSON ([`IngestBatch::raw_json`]) are transcoded to protobuf here, with
//! `opentelemetry-proto`'s OTLP/JSON mapping and prost, off the receive path and only when
//! forwarding is on (the reduced spans the pipeline analyses could not be re-encoded: they keep
//! only the attributes infertrace reads).
//!
//! **Never a span the collector refused.** When some spans of a request were rejected as
//! invalid (see the rules in [`crate::otlp_decode`], e.g. an attribute value nested deeper than
//! 16 levels, which a prost-based downstream refuses together with the whole batch it arrives
//! in), the forwarder sends the request without exactly those spans: a protobuf body is
//! rewritten on the wire ([`without_spans`]: the rejected `Span` messages are cut out, every
//! other byte is kept; a poisoned value need not be decodable by prost), a JSON one is filtered
//! after transcoding ([`retain_accepted`]). Spans the pipeline accepted but did not keep (past
//! a bound such as `max_spans_per_trace`; the client is told they were rejected) are left out
//! the same way ([`ForwardPermit::leave_out`]). Off the receive path, and only for requests
//! with such a span.
//!
//! **Batching.** Protobuf messages concatenate: two encoded `ExportTraceServiceRequest`s back to
//! back are one request holding both `resource_spans` lists. Queued requests are merged this way
//! up to `max_batch_spans` spans or `max_batch_delay`, whichever comes first. A batch (or one
//! request) larger than `max_batch_bytes` is sent in parts of at most that size, split on the
//! wire ([`split_request`]): a downstream refuses a message past its limit (4 MiB by default in
//! grpc-go, tonic and so Jaeger and Tempo) whole, and with it every span merged beside it.
//!
//! **Never OK then drop.** The pipeline reserves a place in the queue (`queue_size` requests)
//! and the memory for the body (from the memory limiter) with [`ForwardHandle::reserve`]
//! *before* it accepts a request, and sends into that place once it has accepted it
//! ([`ForwardPermit::send`]). When the queue is full (the downstream is slow or down) the
//! request is refused with a retryable answer — HTTP 429 + `Retry-After` (`retry.max_backoff`
//! rounded up to whole seconds, 1 to 30), gRPC `UNAVAILABLE`,
//! counted as `dropped_spans_total{reason="forward_backpressure"}` and
//! `receiver_spans_total{outcome="refused"}` — so the client keeps the data and retries. Every
//! span answered OK is then either exported, still pending (`infertrace_forward_pending_spans`,
//! `_bytes`: queued, being batched or being sent), or counted failed below.
//!
//! **Each sender's share.** The body of a queued request stays reserved in the memory limiter
//! for the sender that sent it (its bearer token, else its peer address) until it is sent, so
//! the limiter's per-sender share covers what waits here; and once the queue is more than three
//! quarters full (`limits.soft_limit_percent`), a sender whose requests already hold their fair
//! share of its places is refused with the same retryable answer
//! (`requests_refused_total{reason="forward_share"}`) while others' requests are still taken
//! ([`share`]). A sender alone is stopped there too, so during an outage the refusals of a
//! single sender read `forward_share`, those of a full queue `forward_backpressure`.
//!
//! **Sending.** Up to `max_in_flight` batches are sent at a time; each attempt (connecting
//! included) is bounded by `timeout`, so a downstream that accepts connections and never answers
//! costs one timeout per attempt; of an OTLP/HTTP answer at most 64 KiB is read
//! ([`client_tls::read_answer`]; gRPC answers are bounded by tonic's 4 MiB). Retryable failures (timeouts, connection errors, gRPC
//! `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, …; HTTP 429/502/503/504) are retried with exponential
//! backoff (`retry.initial_backoff` doubling up to `retry.max_backoff`, each wait drawn between
//! half and all of it, a `Retry-After` honoured up to `max_backoff`) while the spans are younger
//! than `retry.max_elapsed`, counted from their ARRIVAL at the collector (time in the queue
//! included; an attempt still running when that budget runs out is cut short, so spans are
//! given up at most `retry.max_elapsed` after they arrived). Every attempt is counted as it ends in `infertrace_forward_attempts_total{outcome}`
//! (`ok`, `timeout`, `retryable`, `permanent`). Spans given up (age budget spent, or a permanent
//! failure) are counted as `exported_spans_total{exporter="otlp_forward",outcome="failed"}` and
//! `dropped_spans_total{reason="forward_failed"}` when they are given up, and logged at warn
//! level (at most one line per 10 s). Spans the downstream rejected in a partial success count
//! as `failed` and `forward_rejected`, and are not retried (OTLP specification).
//!
//! **Shutdown.** [`ForwardTask::close`] stops intake, sends what is queued, and gives up at the
//! deadline it is given.

use std::sync::Arc;
use std::time::Duration;

use crate::client_tls::HttpsConnector;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::client_tls;
use crate::config::{ForwardConfig, ForwardProtocol, RetryConfig, TlsClientConfig};
use crate::ingest::{IngestBatch, IngestError};
use crate::internal_events::{InternalEvents, warn_allowed};
use crate::limiter::{MemoryLimiter, MemoryReservation, SENDER_SHARE_FROM_PERCENT};
use crate::otlp_decode::{
    SpanRange, count_spans, leave_out_spans, retain_accepted, split_request, without_spans,
};

mod share;

use share::{QueueShares, QueueSlot};

/// `exporter` label of the forwarder's counters.
pub const EXPORTER: &str = "otlp_forward";

const GRPC_EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const HTTP_TRACES_PATH: &str = "/v1/traces";

/// Why the forwarder could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The endpoint is not a usable URL.
    #[error("forward.endpoint {0:?}: {1}")]
    Endpoint(String, String),
}

enum Body {
    /// A protobuf body and where its rejected spans lie (to be cut out), in body order.
    Protobuf(Bytes, Vec<SpanRange>),
    /// An OTLP/JSON body; `true` when some of its spans were rejected (to be filtered out);
    /// then the positions, among its accepted spans, of those the pipeline kept out.
    Json(Bytes, bool, Vec<usize>),
}

struct Item {
    body: Body,
    spans: u64,
    bytes: u64,
    arrived: Instant,
    hold: Option<MemoryReservation>,
    /// Its place in its sender's share of the queue, given back when it leaves the queue.
    slot: Option<QueueSlot>,
}

/// The cheap handle the pipeline forwards batches through.
#[derive(Clone)]
pub struct ForwardHandle {
    tx: mpsc::Sender<Item>,
    events: InternalEvents,
    limiter: Option<MemoryLimiter>,
    shares: Arc<QueueShares>,
    retry_after_secs: u32,
}

impl std::fmt::Debug for ForwardHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardHandle").finish_non_exhaustive()
    }
}

/// A place in the forward queue and the memory for one request's body, reserved before the
/// request is accepted ([`ForwardHandle::reserve`]); [`send`](Self::send) once it is. Dropped
/// unsent (the request was refused after all), it gives both back.
pub struct ForwardPermit<'a> {
    reserved: Option<(mpsc::Permit<'a, Item>, Item)>,
    events: &'a InternalEvents,
    spans: u64,
}

impl std::fmt::Debug for ForwardPermit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardPermit")
            .field("spans", &self.spans)
            .finish_non_exhaustive()
    }
}

impl ForwardPermit<'_> {
    /// Leaves out of the forwarded request the spans the pipeline did not keep (a bound such
    /// as `max_spans_per_trace`; the client is told they were rejected): `positions` in the
    /// batch's spans as handed to the pipeline, `ranges` where those spans lie in a protobuf
    /// body (the batch's [`span_ranges`](IngestBatch::span_ranges), in the same order as the
    /// spans). A JSON body's spans are in decode order, so a position is the span's place among
    /// the body's accepted spans.
    pub fn leave_out(&mut self, positions: &[usize], ranges: &[SpanRange]) {
        let left_out = match &mut self.reserved {
            None => positions.len(),
            Some((_, item)) => {
                let left_out = match &mut item.body {
                    Body::Protobuf(_, rejected) => {
                        // Without ranges (a body past 4 GiB) nothing can be cut: all is sent.
                        let before = rejected.len();
                        rejected.extend(positions.iter().filter_map(|&p| ranges.get(p).copied()));
                        rejected.sort_unstable_by_key(|r| r.offset);
                        rejected.len() - before
                    }
                    Body::Json(_, _, kept_out) => {
                        kept_out.extend_from_slice(positions);
                        positions.len()
                    }
                };
                item.spans = item.spans.saturating_sub(left_out as u64);
                left_out
            }
        };
        self.spans = self.spans.saturating_sub(left_out as u64);
    }

    /// Queues the request (never blocks, never drops: its place is reserved). A request with
    /// no span left to forward is not queued: its place and memory are given back.
    pub fn send(self) {
        match self.reserved {
            Some((_, item)) if item.spans == 0 => {}
            Some((permit, item)) => {
                self.events.forward_pending_spans.inc_by(item.spans as i64);
                self.events.forward_pending_bytes.inc_by(item.bytes as i64);
                permit.send(item);
            }
            // Only in-process callers hand over batches without a body (receivers keep it).
            None => self.events.spans_dropped("forward_no_body", self.spans),
        }
    }
}

impl ForwardHandle {
    /// Reserves a place in the queue and the memory for `batch`'s body, before the batch is
    /// accepted: the body's part of the receiver's reservation (`batch.hold`), which keeps
    /// counting for its sender, else a new reservation. Refuses with
    /// [`IngestError::ForwardBackpressure`] when the queue is full,
    /// [`IngestError::ForwardShare`] when it is nearly full and the sender holds its share of
    /// it, and [`IngestError::Overloaded`] when the body does not fit the memory limit; the
    /// receivers answer each with a retryable refusal and count it.
    pub fn reserve(&self, batch: &mut IngestBatch) -> Result<ForwardPermit<'_>, IngestError> {
        let spans = batch.spans.len() as u64;
        let body = match (&batch.raw_protobuf, &batch.raw_json) {
            (Some(p), _) => Body::Protobuf(p.clone(), batch.rejected_ranges.clone()),
            (None, Some(j)) => Body::Json(j.clone(), batch.rejected > 0, Vec::new()),
            (None, None) => {
                return Ok(ForwardPermit {
                    reserved: None,
                    events: &self.events,
                    spans,
                });
            }
        };
        let len = match &body {
            Body::Protobuf(b, _) | Body::Json(b, _, _) => b.len(),
        };
        let slot = match batch.hold.as_ref().and_then(MemoryReservation::sender) {
            Some(sender) => match self.shares.take(sender, self.tx.capacity()) {
                Some(slot) => Some(slot),
                None => {
                    return Err(IngestError::ForwardShare {
                        retry_after_secs: self.retry_after_secs,
                    });
                }
            },
            None => None,
        };
        let Ok(permit) = self.tx.try_reserve() else {
            if warn_allowed("forward_backpressure") {
                tracing::warn!(
                    "forward queue full (downstream slow or down): refusing requests with a \
                     retryable answer; see infertrace_forward_attempts_total"
                );
            }
            return Err(IngestError::ForwardBackpressure {
                retry_after_secs: self.retry_after_secs,
            });
        };
        let from_request = batch.hold.as_mut().and_then(|h| h.split_off(len));
        let hold = match (from_request, &self.limiter) {
            (Some(r), _) => Some(r),
            (None, Some(l)) => match l.try_reserve(len) {
                Some(r) => Some(r),
                None => {
                    return Err(IngestError::Overloaded {
                        retry_after_secs: self.retry_after_secs,
                    });
                }
            },
            (None, None) => None,
        };
        let item = Item {
            body,
            spans,
            bytes: len as u64,
            arrived: Instant::now(),
            hold,
            slot,
        };
        Ok(ForwardPermit {
            reserved: Some((permit, item)),
            events: &self.events,
            spans,
        })
    }
}

/// The running forwarder task.
#[derive(Debug)]
pub struct ForwardTask {
    close: watch::Sender<Option<Instant>>,
    join: JoinHandle<()>,
    events: InternalEvents,
}

impl ForwardTask {
    /// Stops taking new requests, sends what is queued and returns; gives up (counting the rest
    /// as failed) after `deadline`, and says in the log what it sent and what it dropped: the
    /// process exits next, so the counters are not scraped again.
    pub async fn close(self, deadline: Duration) {
        let pending =
            |e: &InternalEvents| u64::try_from(e.forward_pending_spans.get()).unwrap_or(0);
        let queued = pending(&self.events);
        let failed_before = self.events.dropped(FORWARD_FAILED);
        let until = Instant::now() + deadline;
        let _ = self.close.send(Some(until));
        let abort = self.join.abort_handle();
        if tokio::time::timeout_at(until + Duration::from_millis(200), self.join)
            .await
            .is_err()
        {
            abort.abort();
            // What the aborted sends still held is lost: counted here, not silently.
            let lost = pending(&self.events);
            self.events.spans_exported(EXPORTER, "failed", lost);
            self.events.spans_dropped(FORWARD_FAILED, lost);
            self.events.forward_pending_spans.set(0);
            self.events.forward_pending_bytes.set(0);
            tracing::warn!("forwarder did not finish before the shutdown deadline");
        }
        let failed = self.events.dropped(FORWARD_FAILED) - failed_before;
        if failed > 0 {
            tracing::warn!(
                queued,
                dropped = failed,
                ?deadline,
                "forwarder stopped: spans queued for forwarding at shutdown could not be sent \
                 before the deadline and were dropped (counted in \
                 infertrace_dropped_spans_total{{reason=\"forward_failed\"}})"
            );
        } else if queued > 0 {
            tracing::info!(queued, "forwarder stopped: every queued span was sent");
        }
    }
}

/// The drop reason of spans the forwarder gave up on.
const FORWARD_FAILED: &str = "forward_failed";

/// Starts the forwarder for `config` (whose `endpoint` must be set). Must run inside a tokio
/// runtime.
pub fn spawn(
    config: &ForwardConfig,
    events: InternalEvents,
    limiter: Option<MemoryLimiter>,
) -> Result<(ForwardHandle, ForwardTask), ForwardError> {
    if config.endpoint.is_none() {
        return Err(ForwardError::Endpoint(String::new(), "not set".into()));
    }
    let exporter = Exporter::new(config)?;
    let (tx, rx) = mpsc::channel(config.queue_size.max(1));
    let (close_tx, close_rx) = watch::channel(None);
    let sender = Arc::new(Sender {
        close: close_rx.clone(),
        exporter,
        events: events.clone(),
        timeout: config.timeout,
        retry: config.retry.clone(),
        max_batch_bytes: config.max_batch_bytes.max(1),
    });
    let worker = Worker {
        rx,
        close: close_rx,
        sender,
        slots: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
        max_batch_spans: config.max_batch_spans.max(1) as u64,
        max_batch_delay: config.max_batch_delay,
    };
    let join = tokio::spawn(worker.run());
    let shares = QueueShares::new(
        config.queue_size,
        limiter
            .as_ref()
            .map_or(SENDER_SHARE_FROM_PERCENT, MemoryLimiter::soft_percent),
    );
    // A full queue means the downstream is slow or down: suggest the longest backoff.
    let retry_after_secs = config
        .retry
        .max_backoff
        .as_secs_f64()
        .ceil()
        .clamp(1.0, 30.0) as u32;
    Ok((
        ForwardHandle {
            tx,
            events: events.clone(),
            limiter,
            shares,
            retry_after_secs,
        },
        ForwardTask {
            close: close_tx,
            join,
            events,
        },
    ))
}

/// Takes requests off the queue, merges them into batches and hands each to a sending task
/// (at most `max_in_flight` at a time: while they are all busy, the queue fills up and new
/// requests are refused).
struct Worker {
    rx: mpsc::Receiver<Item>,
    close: watch::Receiver<Option<Instant>>,
    sender: Arc<Sender>,
    slots: Arc<Semaphore>,
    max_batch_spans: u64,
    max_batch_delay: Duration,
}

impl Worker {
    fn deadline(&self) -> Option<Instant> {
        *self.close.borrow()
    }

    async fn run(mut self) {
        let mut sending = JoinSet::new();
        // Closing: asked to (a deadline is set) or the task handle is gone.
        let mut closing = false;
        loop {
            while sending.try_join_next().is_some() {}
            // A sending slot first, so that nothing leaves the queue while every slot is busy.
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                break;
            };
            closing |= self.deadline().is_some();
            let first = if closing {
                self.rx.close();
                self.rx.recv().await
            } else {
                tokio::select! {
                    item = self.rx.recv() => item,
                    changed = self.close.changed() => {
                        closing |= changed.is_err();
                        continue;
                    }
                }
            };
            let Some(first) = first else { break };
            let mut batch = Batch::new(first.arrived);
            self.add(&mut batch, first);
            let batch_deadline = Instant::now() + self.max_batch_delay;
            while batch.spans < self.max_batch_spans {
                closing |= self.deadline().is_some();
                if closing {
                    // Take what is queued already, wait for nothing.
                    match self.rx.try_recv() {
                        Ok(item) => self.add(&mut batch, item),
                        Err(_) => break,
                    }
                    continue;
                }
                tokio::select! {
                    r = tokio::time::timeout_at(batch_deadline, self.rx.recv()) => match r {
                        Ok(Some(item)) => self.add(&mut batch, item),
                        _ => break,
                    },
                    changed = self.close.changed() => closing |= changed.is_err(),
                }
            }
            let sender = self.sender.clone();
            sending.spawn(async move {
                sender.send_with_retry(batch).await;
                drop(slot);
            });
        }
        while sending.join_next().await.is_some() {}
    }

    fn add(&self, batch: &mut Batch, item: Item) {
        let Item {
            body,
            spans,
            bytes,
            arrived,
            hold,
            slot,
        } = item;
        // Out of the queue: the place no longer counts in its sender's share.
        drop(slot);
        // The queued bytes stay reserved until the batch holding them is sent.
        batch.holds.extend(hold);
        let encoded = match body {
            Body::Protobuf(b, rejected) if rejected.is_empty() => {
                batch.body.extend_from_slice(&b);
                Ok(())
            }
            Body::Protobuf(b, rejected) => match without_spans(&b, &rejected) {
                Some(kept) => {
                    batch.body.extend_from_slice(&kept);
                    Ok(())
                }
                None => Err("cannot cut the rejected spans out of a request".to_owned()),
            },
            Body::Json(j, filter, kept_out) => {
                match serde_json::from_slice::<ExportTraceServiceRequest>(&j) {
                    Ok(mut req) => {
                        if filter {
                            retain_accepted(&mut req);
                        }
                        if !kept_out.is_empty() {
                            leave_out_spans(&mut req, &kept_out);
                        }
                        batch.body.reserve(req.encoded_len());
                        // Cannot fail: the buffer has room for the whole message.
                        let _ = req.encode(&mut batch.body);
                        Ok(())
                    }
                    Err(e) => Err(format!("cannot transcode an OTLP/JSON request: {e}")),
                }
            }
        };
        match encoded {
            Ok(()) => {
                batch.oldest = batch.oldest.min(arrived);
                batch.spans += spans;
                batch.bytes += bytes;
            }
            Err(why) => self.sender.give_up(&why, spans, bytes),
        }
    }
}

/// What sending tasks share: the exporter, the settings and the close signal.
struct Sender {
    close: watch::Receiver<Option<Instant>>,
    exporter: Exporter,
    events: InternalEvents,
    timeout: Duration,
    retry: RetryConfig,
    max_batch_bytes: usize,
}

impl Sender {
    fn deadline(&self) -> Option<Instant> {
        *self.close.borrow()
    }

    /// Counts spans given up (and no longer pending), and logs it (rate-limited).
    fn give_up(&self, why: &str, spans: u64, bytes: u64) {
        if warn_allowed("forward_failed") {
            tracing::warn!(
                error = %why,
                spans,
                "forwarding failed; spans dropped (counted in \
                 infertrace_dropped_spans_total{{reason=\"forward_failed\"}})"
            );
        }
        self.events.spans_exported(EXPORTER, "failed", spans);
        self.events.spans_dropped(FORWARD_FAILED, spans);
        self.done(spans, bytes);
    }

    fn done(&self, spans: u64, bytes: u64) {
        self.events.forward_pending_spans.dec_by(spans as i64);
        self.events.forward_pending_bytes.dec_by(bytes as i64);
    }

    /// Sends a batch, in parts of at most `forward.max_batch_bytes` when it is larger
    /// ([`split_request`]), one after the other; its memory is held until all are sent.
    async fn send_with_retry(&self, batch: Batch) {
        let Batch {
            body,
            spans,
            bytes,
            oldest,
            holds,
        } = batch;
        if spans == 0 && body.is_empty() {
            self.done(0, bytes);
            return;
        }
        let Some(parts) = split_request(&body, self.max_batch_bytes) else {
            self.send_part(body.freeze(), spans, bytes, oldest).await;
            drop(holds);
            return;
        };
        // Each part's spans, counted on the wire; its share of the pending bytes by its size.
        let (total_len, count) = (body.len().max(1) as u64, parts.len());
        let (mut spans_left, mut bytes_left) = (spans, bytes);
        for (i, part) in parts.into_iter().enumerate() {
            // The last part takes what is left, so the counts add up whatever the rounding.
            let (part_spans, part_bytes) = if i + 1 == count {
                (spans_left, bytes_left)
            } else {
                (
                    count_spans(&part).unwrap_or(0).min(spans_left),
                    (bytes * part.len() as u64 / total_len).min(bytes_left),
                )
            };
            spans_left -= part_spans;
            bytes_left -= part_bytes;
            self.send_part(Bytes::from(part), part_spans, part_bytes, oldest)
                .await;
        }
        drop(holds);
    }

    /// Sends one export request of `spans` spans, retrying while they are within their age
    /// budget (from the arrival of the oldest, `oldest`), and counts how it ended.
    async fn send_part(&self, body: Bytes, spans: u64, bytes: u64, oldest: Instant) {
        // The age budget counts from the oldest request's arrival, queueing included.
        let expires = oldest + self.retry.max_elapsed;
        let mut backoff = self.retry.initial_backoff;
        loop {
            let now = Instant::now();
            // An attempt ends at the timeout, at shutdown's deadline, or when the spans' age
            // budget runs out, whichever comes first.
            let mut limit = (now + self.timeout).min(expires);
            if let Some(d) = self.deadline() {
                limit = limit.min(d);
            }
            if now >= expires || limit <= now {
                let why = if now >= expires {
                    "the spans are older than forward.retry.max_elapsed"
                } else {
                    "shutting down"
                };
                self.give_up(why, spans, bytes);
                break;
            }
            let result =
                match tokio::time::timeout_at(limit, self.exporter.export(body.clone())).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.exporter.reconnect();
                        Err(ExportFailure {
                            outcome: Failed::Timeout,
                            retry_after: None,
                            message: format!(
                                "no answer within forward.timeout ({:?}) or the age budget \
                                 (forward.retry.max_elapsed); the next attempt connects anew",
                                self.timeout
                            ),
                        })
                    }
                };
            match result {
                Ok(rejected) => {
                    self.events.forward_attempt("ok");
                    let rejected = rejected.min(spans);
                    self.events.spans_exported(EXPORTER, "ok", spans - rejected);
                    if rejected > 0 {
                        if warn_allowed("forward_rejected") {
                            tracing::warn!(rejected, "downstream rejected forwarded spans");
                        }
                        self.events.spans_exported(EXPORTER, "failed", rejected);
                        self.events.spans_dropped("forward_rejected", rejected);
                    }
                    self.done(spans, bytes);
                    break;
                }
                Err(f) => {
                    self.events.forward_attempt(f.outcome.label());
                    let wait = f
                        .retry_after
                        .unwrap_or_else(|| jittered(backoff))
                        .min(self.retry.max_backoff);
                    let resume = Instant::now() + wait;
                    let in_budget = resume < expires && self.deadline().is_none_or(|d| resume < d);
                    if f.outcome != Failed::Permanent && in_budget {
                        if warn_allowed("forward_retrying") {
                            tracing::warn!(
                                error = %f.message,
                                ?wait,
                                "forwarding failed; retrying (logged at most every 10 s; see \
                                 infertrace_forward_attempts_total)"
                            );
                        }
                        tokio::time::sleep_until(resume).await;
                        backoff = (backoff * 2).min(self.retry.max_backoff);
                        continue;
                    }
                    self.give_up(&f.message, spans, bytes);
                    break;
                }
            }
        }
    }
}

/// An error and its causes, `: `-separated (hyper's client error says only "client error
/// (Connect)"; the cause says which: refused, a certificate not trusted…).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A wait drawn uniformly between half and all of `backoff` ("equal jitter"), so that batches
/// failing together do not retry together.
fn jittered(backoff: Duration) -> Duration {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let random = std::hash::RandomState::new().hash_one(DRAWS.fetch_add(1, Ordering::Relaxed));
    let fraction = (random >> 11) as f64 / (1u64 << 53) as f64;
    backoff.mul_f64(0.5 + 0.5 * fraction)
}

struct Batch {
    body: BytesMut,
    spans: u64,
    bytes: u64,
    /// Arrival of the oldest request in the batch.
    oldest: Instant,
    holds: Vec<MemoryReservation>,
}

impl Batch {
    fn new(arrived: Instant) -> Self {
        Self {
            body: BytesMut::new(),
            spans: 0,
            bytes: 0,
            oldest: arrived,
            holds: Vec::new(),
        }
    }
}

struct ExportFailure {
    outcome: Failed,
    retry_after: Option<Duration>,
    message: String,
}

/// How an attempt failed: whether it may be tried again, and its label in
/// `infertrace_forward_attempts_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failed {
    /// No answer within `forward.timeout` or the age budget (retried).
    Timeout,
    /// A failure the downstream may get over (retried).
    Retryable,
    /// A refusal that would be repeated (not retried).
    Permanent,
}

impl Failed {
    /// `Retryable` when `retryable`, else `Permanent`.
    fn retryable_if(retryable: bool) -> Self {
        if retryable {
            Self::Retryable
        } else {
            Self::Permanent
        }
    }

    /// The label of `infertrace_forward_attempts_total{outcome}`.
    fn label(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Retryable => "retryable",
            Self::Permanent => "permanent",
        }
    }
}

enum Exporter {
    Grpc(Box<GrpcExporter>),
    Http(Box<HttpExporter>),
}

struct GrpcExporter {
    /// The channel; replaced by a fresh one after an attempt times out ([`Exporter::reconnect`]).
    grpc: std::sync::Mutex<tonic::client::Grpc<Channel>>,
    /// Where a fresh channel connects.
    endpoint: Endpoint,
    /// `forward.headers`, sent with every call.
    metadata: tonic::metadata::MetadataMap,
}

#[derive(Clone)]
struct HttpExporter {
    client: Client<HttpsConnector, Full<Bytes>>,
    uri: http::Uri,
    /// `forward.headers`, sent with every request.
    headers: http::HeaderMap,
}

/// tonic's TLS settings for `tls`: the CA file's certificates, else the system's roots; the
/// client certificate when set. (The files were checked with the rest of the config.)
fn grpc_tls(tls: &TlsClientConfig) -> Result<ClientTlsConfig, String> {
    let read = |p: &std::path::Path, what: &str| {
        std::fs::read(p).map_err(|e| format!("{what} {}: {e}", p.display()))
    };
    // Checked here too, so that an unusable file fails at start, not at the first export.
    let names = client_tls::OptionNames::FORWARD;
    client_tls::rustls_config(tls, names)?;
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca_file {
        Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca, names.ca_file)?)),
        None => config.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        config = config.identity(Identity::from_pem(
            read(cert, names.cert_file)?,
            read(key, names.key_file)?,
        ));
    }
    Ok(config)
}

impl Exporter {
    fn new(config: &ForwardConfig) -> Result<Self, ForwardError> {
        let endpoint = config.endpoint.as_deref().unwrap_or_default();
        let bad = |m: String| ForwardError::Endpoint(endpoint.to_owned(), m);
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e| bad(format!("not a URL: {e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("must start with http:// or https://".into())),
        };
        let headers = client_tls::header_map(&config.headers).map_err(bad)?;
        match config.protocol {
            ForwardProtocol::Grpc => {
                let mut ep = Endpoint::from_shared(endpoint.to_owned())
                    .map_err(|e| bad(e.to_string()))?
                    .tcp_nodelay(true)
                    .connect_timeout(config.timeout);
                if https {
                    ep = ep
                        .tls_config(grpc_tls(&config.tls).map_err(&bad)?)
                        .map_err(|e| bad(format!("TLS: {e}")))?;
                }
                let channel = ep.connect_lazy();
                Ok(Self::Grpc(Box::new(GrpcExporter {
                    grpc: std::sync::Mutex::new(tonic::client::Grpc::new(channel)),
                    endpoint: ep,
                    metadata: tonic::metadata::MetadataMap::from_headers(headers),
                })))
            }
            ForwardProtocol::Http => {
                let path = uri.path().trim_end_matches('/');
                let full = if path.ends_with(HTTP_TRACES_PATH) {
                    endpoint.to_owned()
                } else {
                    let scheme = if https { "https" } else { "http" };
                    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
                    format!("{scheme}://{authority}{path}{HTTP_TRACES_PATH}")
                };
                let uri = full.parse().map_err(|e| bad(format!("not a URL: {e}")))?;
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector.set_connect_timeout(Some(config.timeout));
                let connector = client_tls::https_connector(
                    connector,
                    &config.tls,
                    https,
                    client_tls::OptionNames::FORWARD,
                )
                .map_err(&bad)?;
                let client = Client::builder(TokioExecutor::new()).build(connector);
                Ok(Self::Http(Box::new(HttpExporter {
                    client,
                    uri,
                    headers,
                })))
            }
        }
    }

    /// After an attempt that got no answer in time: a gRPC channel starts over on a fresh
    /// connection. tonic keeps using a connection the downstream stopped answering on (a
    /// half-dead TCP path, a load balancer's stale flow, an HTTP/2 handshake that never
    /// ended) and every later attempt would time out on it, while the HTTP client drops the
    /// connection of a request it abandons.
    fn reconnect(&self) {
        if let Self::Grpc(g) = self {
            let fresh = tonic::client::Grpc::new(g.endpoint.connect_lazy());
            *g.grpc
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
        }
    }

    /// Sends one request; `Ok(rejected spans)` on success.
    async fn export(&self, body: Bytes) -> Result<u64, ExportFailure> {
        match self {
            Self::Grpc(g) => {
                let mut grpc = g
                    .grpc
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                grpc.ready().await.map_err(|e| ExportFailure {
                    outcome: Failed::Retryable,
                    retry_after: None,
                    message: format!("connect: {e}"),
                })?;
                let path = PathAndQuery::from_static(GRPC_EXPORT_PATH);
                let mut request = tonic::Request::new(body);
                *request.metadata_mut() = g.metadata.clone();
                match grpc.unary(request, path, RawCodec).await {
                    Ok(resp) => Ok(rejected_spans(resp.into_inner())),
                    Err(status) => {
                        use tonic::Code;
                        // The OTLP retryable codes; and a transport failure (a connection
                        // closed before the answer, as a load balancer without a healthy
                        // backend does), which tonic reports as `Unknown` with its cause
                        // attached, where a server's own `Unknown` carries none.
                        let transport = status.code() == Code::Unknown
                            && std::error::Error::source(&status).is_some();
                        let retryable = transport
                            || matches!(
                                status.code(),
                                Code::Cancelled
                                    | Code::DeadlineExceeded
                                    | Code::Aborted
                                    | Code::OutOfRange
                                    | Code::Unavailable
                                    | Code::DataLoss
                                    | Code::ResourceExhausted
                            );
                        Err(ExportFailure {
                            outcome: Failed::retryable_if(retryable),
                            retry_after: None,
                            message: format!("gRPC {:?}: {}", status.code(), status.message()),
                        })
                    }
                }
            }
            Self::Http(h) => {
                let HttpExporter {
                    client,
                    uri,
                    headers,
                } = &**h;
                let mut req = http::Request::post(uri.clone())
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf");
                for (name, value) in headers {
                    req = req.header(name, value);
                }
                let req = req.body(Full::new(body)).map_err(|e| ExportFailure {
                    outcome: Failed::Permanent,
                    retry_after: None,
                    message: e.to_string(),
                })?;
                let resp = client.request(req).await.map_err(|e| ExportFailure {
                    outcome: Failed::Retryable,
                    retry_after: None,
                    message: format!("HTTP: {}", with_causes(&e)),
                })?;
                let status = resp.status();
                let retry_after = resp
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let body = client_tls::read_answer(resp.into_body()).await;
                if status.is_success() {
                    return Ok(body.map_or(0, rejected_spans));
                }
                let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
                Err(ExportFailure {
                    outcome: Failed::retryable_if(retryable),
                    retry_after,
                    message: format!("HTTP {status}"),
                })
            }
        }
    }
}

fn rejected_spans(response: Bytes) -> u64 {
    ExportTraceServiceResponse::decode(response)
        .ok()
        .and_then(|r| r.partial_success)
        .map(|p| p.rejected_spans.max(0) as u64)
        .unwrap_or(0)
}

/// A gRPC codec that sends and receives message bytes as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

/// Encoder/decoder of [`RawCodec`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCoder;
    type Decoder = RawCoder;
    fn encoder(&mut self) -> Self::Encoder {
        RawCoder
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCoder
    }
}

impl Encoder for RawCoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    /// hyper's client error alone says "client error (Connect)": the log line carries why.
    #[tokio::test]
    async fn a_failed_http_attempt_says_its_cause() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let uri: http::Uri = format!("http://127.0.0.1:{port}/v1/traces")
            .parse()
            .unwrap();
        let e = client
            .request(
                http::Request::post(uri)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await
            .unwrap_err();
        let message = with_causes(&e);
        assert!(message.starts_with(&e.to_string()), "{message}");
        assert!(message.to_lowercase().contains("refused"), "{message}");
    }

    fn request(names: &[&str]) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: names
                        .iter()
                        .map(|n| Span {
                            name: (*n).to_owned(),
                            trace_id: vec![1; 16],
                            span_id: vec![2; 8],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn concatenated_requests_are_one_request() {
        let a = request(&["a"]).encode_to_vec();
        let b = request(&["b", "c"]).encode_to_vec();
        let joined = [a, b].concat();
        let merged = ExportTraceServiceRequest::decode(joined.as_slice()).unwrap();
        assert_eq!(merged.resource_spans.len(), 2);
        assert_eq!(merged.resource_spans[1].scope_spans[0].spans.len(), 2);
    }

    #[test]
    fn otlp_json_transcodes() {
        let json = r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"x","kind":2,"startTimeUnixNano":"5","endTimeUnixNano":"9"}]}]}]}"#;
        let req: ExportTraceServiceRequest = serde_json::from_str(json).unwrap();
        let span = &req.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.trace_id, (1..=16).collect::<Vec<u8>>());
        assert_eq!(span.kind, 2);
        assert_eq!(span.end_time_unix_nano, 9);
    }

    #[test]
    fn http_endpoint_gets_the_traces_path() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.cert.pem()).unwrap();
        let uri_of = |endpoint: &str, ca: bool| {
            let mut c = ForwardConfig {
                endpoint: Some(endpoint.to_owned()),
                protocol: ForwardProtocol::Http,
                ..ForwardConfig::default()
            };
            if ca {
                c.tls.ca_file = Some(ca_file.clone());
            }
            match Exporter::new(&c) {
                Ok(Exporter::Http(h)) => Ok(h.uri.to_string()),
                Ok(Exporter::Grpc(_)) => panic!("wrong exporter"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(
            uri_of("http://127.0.0.1:4318", false).unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            uri_of("https://tempo.example:443/otlp/", true).unwrap(),
            "https://tempo.example:443/otlp/v1/traces"
        );
        assert!(uri_of("ftp://x:1", false).unwrap_err().contains("https://"));
    }

    #[test]
    fn partial_success_is_read() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess;
        let r = ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess {
                rejected_spans: 3,
                error_message: "bad".into(),
            }),
        };
        assert_eq!(rejected_spans(Bytes::from(r.encode_to_vec())), 3);
        assert_eq!(rejected_spans(Bytes::new()), 0);
    }
}
