//! Optional OTLP trace forwarding downstream (Jaeger, Tempo, another collector).
//!
//! **What is sent.** The receivers keep each request's protobuf body
//! ([`IngestBatch::raw_protobuf`]); the forwarder sends those bytes *unchanged* (no decode, no
//! re-encode: every attribute the lean decoder skipped still reaches the downstream). Requests
//! that came as OTLP/JSON ([`IngestBatch::raw_json`]) are transcoded to protobuf here, with
//! `opentelemetry-proto`'s OTLP/JSON mapping and prost, off the receive path and only when
//! forwarding is on (the reduced spans the pipeline analyses could not be re-encoded: they keep
//! only the attributes infertrace reads). A body is forwarded whole, including any spans this
//! collector rejected as invalid (the downstream applies its own rules); the counters count
//! the valid spans.
//!
//! **Batching.** Protobuf messages concatenate: two encoded `ExportTraceServiceRequest`s back to
//! back are one request holding both `resource_spans` lists. Queued requests are merged this way
//! up to `max_batch_spans` spans or `max_batch_delay`, whichever comes first.
//!
//! **Bounds.** The queue holds at most `queue_size` requests and their bytes are reserved from
//! the memory limiter; a request that does not fit is dropped and its spans counted in
//! `dropped_spans_total{reason="forward_queue_full"}`. Retryable failures (gRPC `UNAVAILABLE`,
//! `RESOURCE_EXHAUSTED`, …; HTTP 429/502/503/504, connection errors) are retried with exponential
//! backoff (honouring `Retry-After`) until `retry.max_elapsed`; then, or on a permanent failure,
//! the spans are counted as `exported_spans_total{exporter="otlp_forward",outcome="failed"}`
//! and `dropped_spans_total{reason="forward_failed"}`. Spans the downstream rejected in a partial
//! success count as `failed` too, and are not retried (OTLP specification).
//!
//! **Shutdown.** [`ForwardTask::close`] stops intake, sends what is queued, and gives up at the
//! deadline it is given.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

use crate::config::{ForwardConfig, ForwardProtocol, RetryConfig};
use crate::ingest::IngestBatch;
use crate::internal_events::InternalEvents;
use crate::limiter::{MemoryLimiter, MemoryReservation};

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
    Protobuf(Bytes),
    Json(Bytes),
}

struct Item {
    body: Body,
    spans: u64,
    hold: Option<MemoryReservation>,
}

/// The cheap handle the pipeline submits batches through.
#[derive(Clone)]
pub struct ForwardHandle {
    tx: mpsc::Sender<Item>,
    events: InternalEvents,
    limiter: Option<MemoryLimiter>,
}

impl std::fmt::Debug for ForwardHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardHandle").finish_non_exhaustive()
    }
}

impl ForwardHandle {
    /// Queues a received request for forwarding; never blocks. A full queue (or no memory for
    /// the body) drops it and counts its spans as `forward_queue_full`.
    pub fn submit(&self, batch: &IngestBatch) {
        let spans = batch.spans.len() as u64;
        let body = match (&batch.raw_protobuf, &batch.raw_json) {
            (Some(p), _) => Body::Protobuf(p.clone()),
            (None, Some(j)) => Body::Json(j.clone()),
            (None, None) => {
                self.events.spans_dropped("forward_no_body", spans);
                return;
            }
        };
        let len = match &body {
            Body::Protobuf(b) | Body::Json(b) => b.len(),
        };
        let hold = match &self.limiter {
            Some(l) => match l.try_reserve(len) {
                Some(r) => Some(r),
                None => {
                    self.events.spans_dropped("forward_queue_full", spans);
                    return;
                }
            },
            None => None,
        };
        let item = Item { body, spans, hold };
        if self.tx.try_send(item).is_err() {
            self.events.spans_dropped("forward_queue_full", spans);
        }
    }
}

/// The running forwarder task.
#[derive(Debug)]
pub struct ForwardTask {
    close: watch::Sender<Option<Instant>>,
    join: JoinHandle<()>,
}

impl ForwardTask {
    /// Stops taking new requests, sends what is queued and returns; gives up (counting the rest
    /// as failed) after `deadline`.
    pub async fn close(self, deadline: Duration) {
        let until = Instant::now() + deadline;
        let _ = self.close.send(Some(until));
        let abort = self.join.abort_handle();
        if tokio::time::timeout_at(until + Duration::from_millis(200), self.join)
            .await
            .is_err()
        {
            abort.abort();
            tracing::warn!("forwarder did not finish before the shutdown deadline");
        }
    }
}

/// Starts the forwarder for `config` (whose `endpoint` must be set). Must run inside a tokio
/// runtime.
pub fn spawn(
    config: &ForwardConfig,
    events: InternalEvents,
    limiter: Option<MemoryLimiter>,
) -> Result<(ForwardHandle, ForwardTask), ForwardError> {
    let endpoint = config
        .endpoint
        .clone()
        .ok_or_else(|| ForwardError::Endpoint(String::new(), "not set".into()))?;
    let exporter = Exporter::new(&endpoint, config.protocol, config.timeout)?;
    let (tx, rx) = mpsc::channel(config.queue_size.max(1));
    let (close_tx, close_rx) = watch::channel(None);
    let worker = Worker {
        rx,
        close: close_rx,
        exporter,
        events: events.clone(),
        max_batch_spans: config.max_batch_spans.max(1) as u64,
        max_batch_delay: config.max_batch_delay,
        timeout: config.timeout,
        retry: config.retry.clone(),
    };
    let join = tokio::spawn(worker.run());
    Ok((
        ForwardHandle {
            tx,
            events,
            limiter,
        },
        ForwardTask {
            close: close_tx,
            join,
        },
    ))
}

struct Worker {
    rx: mpsc::Receiver<Item>,
    close: watch::Receiver<Option<Instant>>,
    exporter: Exporter,
    events: InternalEvents,
    max_batch_spans: u64,
    max_batch_delay: Duration,
    timeout: Duration,
    retry: RetryConfig,
}

impl Worker {
    fn deadline(&self) -> Option<Instant> {
        *self.close.borrow()
    }

    async fn run(mut self) {
        // Closing: asked to (a deadline is set) or the task handle is gone.
        let mut closing = false;
        loop {
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
            let mut batch = Batch::default();
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
            let Batch { body, spans, holds } = batch;
            if spans > 0 || !body.is_empty() {
                self.send_with_retry(body.freeze(), spans).await;
            }
            drop(holds);
        }
    }

    fn add(&self, batch: &mut Batch, item: Item) {
        // The queued bytes stay reserved until the batch holding them is sent.
        batch.holds.extend(item.hold);
        match item.body {
            Body::Protobuf(b) => batch.body.extend_from_slice(&b),
            Body::Json(j) => match serde_json::from_slice::<ExportTraceServiceRequest>(&j) {
                Ok(req) => {
                    batch.body.reserve(req.encoded_len());
                    // Cannot fail: the buffer has room for the whole message.
                    let _ = req.encode(&mut batch.body);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot transcode an OTLP/JSON request for forwarding");
                    self.events.spans_exported(EXPORTER, "failed", item.spans);
                    self.events.spans_dropped("forward_failed", item.spans);
                    return;
                }
            },
        }
        batch.spans += item.spans;
    }

    async fn send_with_retry(&mut self, body: Bytes, spans: u64) {
        let started = Instant::now();
        let mut backoff = self.retry.initial_backoff;
        loop {
            let mut limit = Instant::now() + self.timeout;
            if let Some(d) = self.deadline() {
                limit = limit.min(d);
            }
            let result =
                match tokio::time::timeout_at(limit, self.exporter.export(body.clone())).await {
                    Ok(r) => r,
                    Err(_) => Err(ExportFailure {
                        retryable: true,
                        retry_after: None,
                        message: "timed out".into(),
                    }),
                };
            match result {
                Ok(rejected) => {
                    let rejected = rejected.min(spans);
                    self.events.spans_exported(EXPORTER, "ok", spans - rejected);
                    if rejected > 0 {
                        tracing::warn!(rejected, "downstream rejected forwarded spans");
                        self.events.spans_exported(EXPORTER, "failed", rejected);
                        self.events.spans_dropped("forward_rejected", rejected);
                    }
                    return;
                }
                Err(f) => {
                    let wait = f.retry_after.unwrap_or(backoff).min(self.retry.max_backoff);
                    let resume = Instant::now() + wait;
                    let in_budget = resume.duration_since(started) < self.retry.max_elapsed
                        && self.deadline().is_none_or(|d| resume < d);
                    if f.retryable && in_budget {
                        tracing::debug!(error = %f.message, ?wait, "forwarding failed; retrying");
                        tokio::time::sleep_until(resume).await;
                        backoff = (backoff * 2).min(self.retry.max_backoff);
                        continue;
                    }
                    tracing::warn!(error = %f.message, spans, "forwarding failed; spans dropped");
                    self.events.spans_exported(EXPORTER, "failed", spans);
                    self.events.spans_dropped("forward_failed", spans);
                    return;
                }
            }
        }
    }
}

#[derive(Default)]
struct Batch {
    body: BytesMut,
    spans: u64,
    holds: Vec<MemoryReservation>,
}

struct ExportFailure {
    retryable: bool,
    retry_after: Option<Duration>,
    message: String,
}

enum Exporter {
    Grpc(tonic::client::Grpc<Channel>),
    Http(Box<HttpExporter>),
}

struct HttpExporter {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: http::Uri,
}

impl Exporter {
    fn new(
        endpoint: &str,
        protocol: ForwardProtocol,
        timeout: Duration,
    ) -> Result<Self, ForwardError> {
        let bad = |m: String| ForwardError::Endpoint(endpoint.to_owned(), m);
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|e| bad(format!("not a URL: {e}")))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// endpoints are supported (no TLS in this build)".into(),
            ));
        }
        match protocol {
            ForwardProtocol::Grpc => {
                let channel = Endpoint::from_shared(endpoint.to_owned())
                    .map_err(|e| bad(e.to_string()))?
                    .tcp_nodelay(true)
                    .connect_timeout(timeout)
                    .connect_lazy();
                Ok(Self::Grpc(tonic::client::Grpc::new(channel)))
            }
            ForwardProtocol::Http => {
                let path = uri.path().trim_end_matches('/');
                let full = if path.ends_with(HTTP_TRACES_PATH) {
                    endpoint.to_owned()
                } else {
                    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
                    format!("http://{authority}{path}{HTTP_TRACES_PATH}")
                };
                let uri = full.parse().map_err(|e| bad(format!("not a URL: {e}")))?;
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector.set_connect_timeout(Some(timeout));
                let client = Client::builder(TokioExecutor::new()).build(connector);
                Ok(Self::Http(Box::new(HttpExporter { client, uri })))
            }
        }
    }

    /// Sends one request; `Ok(rejected spans)` on success.
    async fn export(&mut self, body: Bytes) -> Result<u64, ExportFailure> {
        match self {
            Self::Grpc(grpc) => {
                grpc.ready().await.map_err(|e| ExportFailure {
                    retryable: true,
                    retry_after: None,
                    message: format!("connect: {e}"),
                })?;
                let path = PathAndQuery::from_static(GRPC_EXPORT_PATH);
                match grpc.unary(tonic::Request::new(body), path, RawCodec).await {
                    Ok(resp) => Ok(rejected_spans(resp.into_inner())),
                    Err(status) => {
                        use tonic::Code;
                        let retryable = matches!(
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
                            retryable,
                            retry_after: None,
                            message: format!("gRPC {:?}: {}", status.code(), status.message()),
                        })
                    }
                }
            }
            Self::Http(h) => {
                let HttpExporter { client, uri } = &**h;
                let req = http::Request::post(uri.clone())
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf")
                    .body(Full::new(body))
                    .map_err(|e| ExportFailure {
                        retryable: false,
                        retry_after: None,
                        message: e.to_string(),
                    })?;
                let resp = client.request(req).await.map_err(|e| ExportFailure {
                    retryable: true,
                    retry_after: None,
                    message: format!("HTTP: {e}"),
                })?;
                let status = resp.status();
                let retry_after = resp
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .unwrap_or_default();
                if status.is_success() {
                    return Ok(rejected_spans(body));
                }
                let retryable = matches!(status.as_u16(), 429 | 502 | 503 | 504);
                Err(ExportFailure {
                    retryable,
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
        let e = Exporter::new(
            "http://127.0.0.1:4318",
            ForwardProtocol::Http,
            Duration::from_secs(1),
        )
        .ok()
        .unwrap();
        match e {
            Exporter::Http(h) => {
                let uri = &h.uri;
                assert_eq!(uri.to_string(), "http://127.0.0.1:4318/v1/traces")
            }
            Exporter::Grpc(_) => panic!("wrong exporter"),
        }
        assert!(
            Exporter::new("https://x:1", ForwardProtocol::Http, Duration::from_secs(1)).is_err()
        );
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
