//! What every receiver applies to a request, and the receivers' names and grace period.

use std::time::Duration;

use crate::limiter::MemoryLimiter;

/// Default maximum request body, before and after decompression: 16 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

pub use crate::config::DEFAULT_BODY_READ_TIMEOUT;

/// The `receiver` label of the gRPC receiver's counters.
pub const GRPC_RECEIVER: &str = "otlp_grpc";
/// The `receiver` label of the HTTP receiver's counters.
pub const HTTP_RECEIVER: &str = "otlp_http";

/// How long a shutdown of [`serve_grpc`](super::serve_grpc) / [`serve_http`](super::serve_http) waits for in-flight requests before
/// cutting the connections still open (the collector uses its `shutdown_timeout` instead).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Limits every receiver applies to a request.
#[derive(Clone, Debug)]
pub struct ReceiverLimits {
    /// Largest accepted body in bytes, checked on the wire and again after gunzip (zip bombs).
    /// Default [`DEFAULT_MAX_BODY_BYTES`] (16 MiB).
    pub max_body_bytes: usize,
    /// The collector's shared memory budget. When set, a receiver reserves a body's bytes as
    /// they arrive (its declared `Content-Length` first), the inflated bytes of a gzip body as
    /// they are inflated, and a bound of what decoding allocates before decoding; a request
    /// that does not fit is refused (429 / `UNAVAILABLE`, or 413 / `RESOURCE_EXHAUSTED` when it
    /// could not fit even in an empty collector). The reservation is released once the batch
    /// has been handed to the pipeline (which reserves its own bytes for the spans it buffers).
    /// Default `None`: only the pipeline's own [`IngestError::Overloaded`](crate::IngestError)
    /// throttles.
    pub memory: Option<MemoryLimiter>,
    /// Longest a client may take to send a request's body once its headers arrived (slow-body
    /// guard); past it the request is refused (408 / `DEADLINE_EXCEEDED`) and its memory freed.
    /// Default [`DEFAULT_BODY_READ_TIMEOUT`].
    pub body_read_timeout: Duration,
    /// `Retry-After` (seconds) sent when the memory limiter refuses a request. Default 1.
    pub retry_after_secs: u32,
    /// Bearer-token check of scope `ingest`, made first thing in every request (401/403,
    /// gRPC `UNAUTHENTICATED`/`PERMISSION_DENIED`). Default `None`: no check at all.
    pub auth: Option<crate::auth::Authenticator>,
    /// The `Host` names OTLP/HTTP answers to (421 for others, against DNS rebinding: a web page
    /// posting spans to a collector on the developer's machine). The collector sets it to
    /// `api.allowed_hosts` when the receiver listens on loopback without authentication (a
    /// token is a page's obstacle otherwise, and remote senders use any name). Default `None`.
    pub allowed_hosts: Option<crate::auth::HostAllowlist>,
    /// Whether the spans are forwarded and checked (`forward.verify_spans`): protobuf bodies are
    /// then decoded with
    /// [`decode_protobuf_for_forwarding`](crate::otlp_decode::decode_protobuf_for_forwarding),
    /// which rejects the spans a prost-based forward target would refuse (with the whole batch).
    /// Default `false`.
    pub forwarding: bool,
}

impl Default for ReceiverLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            memory: None,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            retry_after_secs: 1,
            auth: None,
            allowed_hosts: None,
            forwarding: false,
        }
    }
}
