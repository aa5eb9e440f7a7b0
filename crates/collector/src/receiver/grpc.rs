//! OTLP/gRPC: the unary `opentelemetry.proto.collector.trace.v1.TraceService/Export`, served over
//! HTTP/2 (h2c) by hyper directly. The request message is taken as raw bytes (gRPC framing and
//! `grpc-encoding: gzip` or `deflate` handled here), decoded once by the lean decoder, and kept as is for
//! forwarding.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;
use tokio::net::TcpListener;

use crate::auth::Scope;
use crate::ingest::Ingest;
use crate::internal_events::InternalEvents;
use crate::listener::CloseConnection;

use super::body::{Coding, GrpcBody, grpc_percent_encode};
use super::export::{Outcome, Payload, Receiver};
use super::limits::{GRPC_RECEIVER, ReceiverLimits, SHUTDOWN_GRACE};
use super::status::Code;
use crate::listener::{ListenerSettings, deadline_after, serve};

/// The gRPC path of the trace export method.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const METRICS_SERVICE: &str = "/opentelemetry.proto.collector.metrics.";
const LOGS_SERVICE: &str = "/opentelemetry.proto.collector.logs.";

/// Serves OTLP/gRPC on `listener` (HTTP/2 prior knowledge) until `shutdown` resolves, handing
/// decoded batches to `ingest`. See the [module rules](super) for every answer it gives.
pub async fn serve_grpc(
    listener: TcpListener,
    ingest: Arc<dyn Ingest>,
    events: InternalEvents,
    limits: ReceiverLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let settings = ListenerSettings::new(GRPC_RECEIVER).http2_only();
    serve_grpc_with(
        listener,
        settings,
        ingest,
        events,
        limits,
        deadline_after(shutdown, SHUTDOWN_GRACE),
    )
    .await
}

/// As [`serve_grpc`], with the listener's limits, timeouts and TLS in `settings`; `shutdown`
/// resolves with the deadline after which open connections are cut.
pub async fn serve_grpc_with(
    listener: TcpListener,
    settings: ListenerSettings,
    ingest: Arc<dyn Ingest>,
    events: InternalEvents,
    limits: ReceiverLimits,
    shutdown: impl Future<Output = Instant> + Send,
) -> std::io::Result<()> {
    let events_for_listener = events.clone();
    let receiver = Arc::new(Receiver {
        name: GRPC_RECEIVER,
        ingest,
        events,
        limits,
    });
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let receiver = receiver.clone();
        async move { Ok::<_, Infallible>(handle(&receiver, req).await) }
    });
    serve(listener, settings, events_for_listener, service, shutdown).await
}

async fn handle(receiver: &Receiver, req: Request<Incoming>) -> Response<GrpcBody> {
    let token = match receiver.ingest_token(req.headers().get(AUTHORIZATION)) {
        Ok(token) => token,
        Err(refusal) => {
            let code = Code::of_refusal(refusal);
            let mut response = status_only(code, refusal.http_answer(Scope::Ingest).2);
            response.extensions_mut().insert(CloseConnection);
            return response;
        }
    };
    let path = req.uri().path();
    if path != EXPORT_PATH {
        let message = if path.starts_with(METRICS_SERVICE) || path.starts_with(LOGS_SERVICE) {
            "this collector accepts OTLP traces only; metrics and logs are not accepted".to_owned()
        } else {
            format!("unknown method {path}: this collector serves {EXPORT_PATH}")
        };
        return status_only(Code::Unimplemented, &message);
    }
    let is_grpc = req
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !is_grpc {
        receiver.refuse_request("unsupported_content");
        let mut response = Response::new(GrpcBody::empty());
        *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return response;
    }
    let header = req
        .headers()
        .get("grpc-encoding")
        .map(HeaderValue::as_bytes);
    let Ok(coding) = Coding::of_header(header) else {
        receiver.refuse_request("unsupported_content");
        return status_only(
            Code::Unimplemented,
            "unsupported grpc-encoding: send gzip, deflate or identity",
        );
    };
    let limit = receiver.limits.max_body_bytes;
    let mut hold = receiver.hold(token, req.extensions());
    let body = match receiver
        .read(
            &mut req.into_body(),
            limit.saturating_add(5),
            &mut hold,
            Some(framed_length),
        )
        .await
    {
        Ok(body) => body,
        Err(outcome) => return answer(outcome),
    };
    let message = match unframe(&body) {
        Ok((false, message)) => message,
        Ok((true, message)) => {
            let Some(coding) = coding else {
                receiver.refuse_request("decode_error");
                return status_only(
                    Code::Internal,
                    "compressed message without a grpc-encoding header",
                );
            };
            drop(body);
            match receiver.inflate(message, coding, &mut hold) {
                Ok(inflated) => inflated,
                Err(outcome) => return answer(outcome),
            }
        }
        Err(why) => {
            receiver.refuse_request("decode_error");
            return status_only(Code::InvalidArgument, why);
        }
    };
    answer(receiver.export(Payload::Protobuf(message), hold))
}

/// The gRPC answer to what became of a request.
fn answer(outcome: Outcome) -> Response<GrpcBody> {
    match outcome {
        Outcome::Accepted { rejected, message } => success(rejected, message),
        Outcome::Undecodable(error) => status_only(
            Code::InvalidArgument,
            &format!("undecodable OTLP request: {error}"),
        ),
        Outcome::Unreadable(message) => status_only(Code::InvalidArgument, &message),
        Outcome::TooLarge(message) => status_only(Code::ResourceExhausted, &message),
        Outcome::Overloaded { why, .. } => status_only(Code::Unavailable, why),
        Outcome::TimedOut => status_only(
            Code::DeadlineExceeded,
            "the request message did not arrive within the body read timeout",
        ),
        Outcome::ShuttingDown => status_only(Code::Unavailable, "collector is shutting down"),
    }
}

/// The length of a unary request body — its 5-byte prefix and the message — from the prefix at
/// its start; `None` while fewer than 5 bytes are there.
fn framed_length(start: &[u8]) -> Option<usize> {
    let prefix: [u8; 4] = start.get(1..5)?.try_into().ok()?;
    // Past `usize` (32-bit targets) it saturates: over any limit, and no body's length.
    Some(usize::try_from(u32::from_be_bytes(prefix)).map_or(usize::MAX, |n| n.saturating_add(5)))
}

/// Splits a unary request body into (compressed flag, message).
fn unframe(body: &Bytes) -> Result<(bool, Bytes), &'static str> {
    let Some(framed) = framed_length(body) else {
        return Err("missing or truncated gRPC message frame");
    };
    let compressed = match body[0] {
        0 => false,
        1 => true,
        _ => return Err("invalid gRPC compression flag"),
    };
    if body.len() != framed {
        return Err("a unary call must carry exactly one complete message");
    }
    Ok((compressed, body.slice(5..)))
}

fn success(rejected: u32, message: Option<String>) -> Response<GrpcBody> {
    let reply = ExportTraceServiceResponse {
        partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
            rejected_spans: i64::from(rejected),
            error_message: message.unwrap_or_default(),
        }),
    };
    let len = reply.encoded_len();
    let mut frame = BytesMut::with_capacity(5 + len);
    frame.put_u8(0);
    frame.put_u32(len as u32);
    // Encoding into a buffer with enough capacity cannot fail.
    let _ = reply.encode(&mut frame);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut response = Response::new(GrpcBody::message(frame.freeze(), trailers));
    grpc_headers(response.headers_mut());
    response
}

/// A trailers-only response carrying `code` and `message` in its headers.
fn status_only(code: Code, message: &str) -> Response<GrpcBody> {
    let mut response = Response::new(GrpcBody::empty());
    let headers = response.headers_mut();
    grpc_headers(headers);
    headers.insert("grpc-status", HeaderValue::from(code as u16));
    if code != Code::Ok
        && let Ok(value) = HeaderValue::from_str(&grpc_percent_encode(message))
    {
        headers.insert("grpc-message", value);
    }
    response
}

fn grpc_headers(headers: &mut HeaderMap) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(
        "grpc-accept-encoding",
        HeaderValue::from_static("gzip,deflate,identity"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unframe_checks_flag_and_length() {
        let ok = Bytes::from_static(&[0, 0, 0, 0, 2, 7, 8]);
        assert_eq!(unframe(&ok).unwrap(), (false, Bytes::from_static(&[7, 8])));
        assert!(unframe(&Bytes::from_static(&[1, 0, 0, 0, 0])).unwrap().0);
        assert!(unframe(&Bytes::from_static(&[0, 0, 0])).is_err());
        assert!(unframe(&Bytes::from_static(&[2, 0, 0, 0, 0])).is_err());
        assert!(unframe(&Bytes::from_static(&[0, 0, 0, 0, 3, 7, 8])).is_err());
        assert!(unframe(&Bytes::from_static(&[0, 0, 0, 0, 1, 7, 8])).is_err());
    }

    #[test]
    fn framed_length_reads_the_prefix() {
        assert_eq!(framed_length(&[0, 0, 0, 1, 2, 9]), Some(5 + 258));
        assert_eq!(
            framed_length(&[1, 255, 255, 255, 255]),
            Some((u32::MAX as usize).saturating_add(5))
        );
        assert_eq!(framed_length(&[0, 0, 0, 1]), None);
    }

    #[test]
    fn status_only_sets_code_and_encoded_message() {
        let r = status_only(Code::Unavailable, "retry 100%");
        assert_eq!(r.headers()["grpc-status"], "14");
        assert_eq!(r.headers()["grpc-message"], "retry 100%25");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
    }
}
