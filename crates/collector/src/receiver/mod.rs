//! OTLP receivers: gRPC (`TraceService/Export`) and HTTP (`POST /v1/traces`, protobuf or JSON),
//! both on hyper with TCP_NODELAY set on every accepted socket.
//!
//! Both follow the OTLP specification's rules:
//!
//! | situation | HTTP | gRPC | counted as (`dropped_spans_total{reason}`) |
//! |---|---|---|---|
//! | accepted, some spans invalid (ids, times, attribute values nested over 16 levels: see [`crate::otlp_decode`]) | 200 + `partial_success` | OK + `partial_success` | `invalid_span` × spans |
//! | body not decodable (or bad gzip) | 400 | `INVALID_ARGUMENT` | `decode_error` × 1 (request) |
//! | body over `max_body_bytes`, before or after gunzip | 413 | `RESOURCE_EXHAUSTED` | `too_large` × 1 (request) |
//! | memory limiter or pipeline overloaded | 429 + `Retry-After` | `UNAVAILABLE` | `memory_limit` × spans (× 1 when refused on the declared `Content-Length`, before reading) |
//! | forward queue full (downstream slow or down; see [`crate::forward`]) | 429 + `Retry-After` | `UNAVAILABLE` | `forward_backpressure` × spans |
//! | pipeline shutting down | 503 + `Retry-After` | `UNAVAILABLE` | `shutting_down` × spans |
//! | wrong content type / content encoding | 415 | HTTP 415 / `UNIMPLEMENTED` | `unsupported_content` × 1 (request) |
//! | wrong method on `/v1/traces` | 405 + `Allow: POST` | — | — |
//! | `/v1/metrics`, `/v1/logs` (metrics/logs services) | 501, explained | `UNIMPLEMENTED`, explained | — |
//! | any other path | 404 | `UNIMPLEMENTED` | — |
//!
//! Spans are also counted in `receiver_spans_total{receiver, outcome}` with outcome `accepted`,
//! `rejected` (invalid) or `refused` (the whole request was refused after decoding or counting).
//! Metrics and logs are answered with 501 rather than 404 so that a client pointed at the wrong
//! signal learns that the path is known but the signal is not accepted here.
//!
//! Protobuf bodies are decoded once, by the lean decoder of [`crate::otlp_decode`], and handed on
//! unchanged in [`IngestBatch::raw_protobuf`](crate::IngestBatch) for forwarding.

mod body;
mod export;
mod grpc;
mod http;

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::limiter::MemoryLimiter;

pub use grpc::serve_grpc;
pub use http::serve_http;

/// Default maximum request body, before and after decompression: 16 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The `receiver` label of the gRPC receiver's counters.
pub const GRPC_RECEIVER: &str = "otlp_grpc";
/// The `receiver` label of the HTTP receiver's counters.
pub const HTTP_RECEIVER: &str = "otlp_http";

/// How long a shutdown waits for in-flight requests before returning.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long an HTTP/1 client may take to send a request's headers (slow-loris guard).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// HTTP/2 flow-control windows and frame size: large enough that a 16-connection client sending
/// ~300 KB requests is never stalled on window updates.
const H2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
const H2_CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;
const H2_MAX_FRAME: u32 = 256 * 1024;

/// Limits every receiver applies to a request.
#[derive(Clone, Debug)]
pub struct ReceiverLimits {
    /// Largest accepted body in bytes, checked on the wire and again after gunzip (zip bombs).
    /// Default [`DEFAULT_MAX_BODY_BYTES`] (16 MiB).
    pub max_body_bytes: usize,
    /// The collector's shared memory budget. When set, a receiver first checks a body's declared
    /// length (`Content-Length`) against it without reading the body, then reserves
    /// [`body_reservation_bytes`](crate::limiter::body_reservation_bytes) for the body it read
    /// before decoding it, and refuses the request (429 / `UNAVAILABLE`) when either does not
    /// fit; the reservation is released once the batch has been handed to the pipeline (which
    /// reserves its own bytes for the spans it buffers). Default `None`:
    /// only the pipeline's own [`IngestError::Overloaded`](crate::IngestError) throttles.
    pub memory: Option<MemoryLimiter>,
    /// `Retry-After` (seconds) sent when the memory limiter refuses a request. Default 1.
    pub retry_after_secs: u32,
}

impl Default for ReceiverLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            memory: None,
            retry_after_secs: 1,
        }
    }
}

/// Accepts connections until `shutdown` resolves, serving each with `service`; then lets
/// in-flight requests finish (up to [`SHUTDOWN_GRACE`]).
async fn serve_connections<S, B>(
    listener: TcpListener,
    http2_only: bool,
    service: S,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    S: hyper::service::Service<
            ::http::Request<Incoming>,
            Response = ::http::Response<B>,
            Error = Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: ::http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_frame_size(H2_MAX_FRAME);
    let builder = if http2_only {
        builder.http2_only()
    } else {
        builder
    };
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        let connection = builder
            .serve_connection(TokioIo::new(stream), service.clone())
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "receiver shutdown: connections still open after {:?}",
            SHUTDOWN_GRACE
        );
    }
    Ok(())
}
