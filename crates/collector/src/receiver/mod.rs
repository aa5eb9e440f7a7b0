//! OTLP receivers: gRPC (`TraceService/Export`) and HTTP (`POST /v1/traces`, protobuf or JSON),
//! both on hyper with TCP_NODELAY set on every accepted socket, served by
//! [`crate::listener::serve`] (connection limit, timeouts, TLS, shutdown deadline).
//!
//! Both follow the OTLP specification's rules:
//!
//! | situation | HTTP | gRPC | counted as (`dropped_spans_total{reason}`) |
//! |---|---|---|---|
//! | accepted, some spans invalid (ids, times, attribute values nested over 16 levels: see [`crate::otlp_decode`]) | 200 + `partial_success` | OK + `partial_success` | `invalid_span` × spans |
//! | body not decodable (or bad gzip) | 400 | `INVALID_ARGUMENT` | `decode_error` × 1 (request) |
//! | connection failed or client gone mid-body (nobody reads the answer) | 400 | `INVALID_ARGUMENT` | `body_broken` × 1 (request) |
//! | body over `max_body_bytes`, before or after gunzip | 413 | `RESOURCE_EXHAUSTED` | `too_large` × 1 (request) |
//! | decoding could need more than the whole memory limit | 413 | `RESOURCE_EXHAUSTED` | `too_large_for_memory` × 1 (request) |
//! | memory limiter or pipeline overloaded | 429 + `Retry-After` | `UNAVAILABLE` | `memory_limit` × spans (× 1 when refused while reading the body) |
//! | over `limits.soft_limit_percent` (75 %) of the memory limit in use and this sender's other requests in progress and bodies waiting in the forward queue hold more than its share (see [`crate::limiter`]) | 429 + `Retry-After` | `UNAVAILABLE` | `sender_share` × spans (× 1 when refused while reading the body) |
//! | forward queue more than `limits.soft_limit_percent` (75 %) full and this sender's requests already hold their share of its places (see `forward`) | 429 + `Retry-After` | `UNAVAILABLE` | `forward_share` × spans |
//! | forward queue full (downstream slow or down; see `forward`) | 429 + `Retry-After` | `UNAVAILABLE` | `forward_backpressure` × spans |
//! | body not received within `body_read_timeout` | 408 | `DEADLINE_EXCEEDED` | `body_timeout` × 1 (request) |
//! | no known bearer token / token without the `ingest` scope (when tokens are configured; see [`crate::auth`]) | 401 + `WWW-Authenticate` / 403 | `UNAUTHENTICATED` / `PERMISSION_DENIED` | `auth_failures_total{listener,reason}` |
//! | pipeline shutting down | 503 + `Retry-After` | `UNAVAILABLE` | `shutting_down` × spans |
//! | wrong content type / content encoding | 415 | HTTP 415 / `UNIMPLEMENTED` | `unsupported_content` × 1 (request) |
//! | wrong method on `/v1/traces` | 405 + `Allow: POST` | — | — |
//! | `/v1/metrics`, `/v1/logs` (metrics/logs services) | 501, explained | `UNIMPLEMENTED`, explained | — |
//! | any other path | 404 | `UNIMPLEMENTED` | — |
//!
//! Spans are also counted in `receiver_spans_total{receiver, outcome}` with outcome `accepted`,
//! `rejected` (invalid) or `refused` (the whole request was refused after decoding or counting),
//! and every refused request in `requests_refused_total{receiver, reason}` (with a warn line,
//! at most one per 10 s). Nothing is refused after an OK: every bound is checked before the
//! answer.
//! Metrics and logs are answered with 501 rather than 404 so that a client pointed at the wrong
//! signal learns that the path is known but the signal is not accepted here.
//! An HTTP/1.1 request answered before its body was read has the rest of the body read and
//! dropped beside the answer (bounded by `max_body_bytes` and `body_read_timeout`), so that a
//! client still sending reads the answer instead of a reset connection, and keeps it.
//!
//! Protobuf bodies are decoded once, by the lean decoder of [`crate::otlp_decode`], and handed on
//! unchanged in [`IngestBatch::raw_protobuf`](crate::IngestBatch) for forwarding.

mod body;
mod export;
mod grpc;
mod http;
mod limits;
mod status;

pub use grpc::{serve_grpc, serve_grpc_with};
pub use http::{serve_http, serve_http_with};
pub use limits::{
    DEFAULT_BODY_READ_TIMEOUT, DEFAULT_MAX_BODY_BYTES, GRPC_RECEIVER, HTTP_RECEIVER,
    ReceiverLimits, SHUTDOWN_GRACE,
};
