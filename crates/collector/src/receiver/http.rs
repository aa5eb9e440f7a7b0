//! OTLP/HTTP: `POST /v1/traces` with `application/x-protobuf` or `application/json` bodies,
//! optionally `Content-Encoding: gzip` or `deflate`; answers in the request's content type.

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{
    ALLOW, AUTHORIZATION, CONNECTION, CONTENT_ENCODING, CONTENT_TYPE, EXPECT, RETRY_AFTER,
    WWW_AUTHENTICATE,
};
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::Body as _;
use http_body_util::Full;
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

use super::body::{Coding, drain_body};
use super::export::{Outcome, Payload, Receiver};
use super::limits::{HTTP_RECEIVER, ReceiverLimits, SHUTDOWN_GRACE};
use super::status::Code;
use crate::listener::{ListenerSettings, deadline_after, serve};

/// The traces path.
pub const TRACES_PATH: &str = "/v1/traces";
const METRICS_PATH: &str = "/v1/metrics";
const LOGS_PATH: &str = "/v1/logs";

const PROTOBUF: &str = "application/x-protobuf";
const JSON: &str = "application/json";

/// How much of an unread HTTP/2 request body is read, and for how long, before an early answer
/// goes out (see [`handle`]).
const H2_SETTLE_BYTES: usize = 64 << 10;
const H2_SETTLE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Serves OTLP/HTTP on `listener` (HTTP/1.1 and h2c) until `shutdown` resolves, handing decoded
/// batches to `ingest`. See the [module rules](super) for every answer it gives.
pub async fn serve_http(
    listener: TcpListener,
    ingest: Arc<dyn Ingest>,
    events: InternalEvents,
    limits: ReceiverLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let settings = ListenerSettings::new(HTTP_RECEIVER);
    serve_http_with(
        listener,
        settings,
        ingest,
        events,
        limits,
        deadline_after(shutdown, SHUTDOWN_GRACE),
    )
    .await
}

/// As [`serve_http`], with the listener's limits, timeouts and TLS in `settings`; `shutdown`
/// resolves with the deadline after which open connections are cut.
pub async fn serve_http_with(
    listener: TcpListener,
    settings: ListenerSettings,
    ingest: Arc<dyn Ingest>,
    events: InternalEvents,
    limits: ReceiverLimits,
    shutdown: impl Future<Output = Instant> + Send,
) -> std::io::Result<()> {
    let events_for_listener = events.clone();
    let receiver = Arc::new(Receiver {
        name: HTTP_RECEIVER,
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

/// The body encoding of a request (and of its answer).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Protobuf,
    Json,
}

impl Format {
    fn content_type(self) -> &'static str {
        match self {
            Self::Protobuf => PROTOBUF,
            Self::Json => JSON,
        }
    }
}

type HttpResponse = Response<Full<Bytes>>;

async fn handle(receiver: &Receiver, req: Request<Incoming>) -> HttpResponse {
    let (parts, mut body) = req.into_parts();
    let response = respond(receiver, &parts, &mut body).await;
    if parts.version >= Version::HTTP_2 && !body.is_end_stream() {
        // An answer before the body ends its stream with RST_STREAM(NO_ERROR), which RFC 9113
        // allows but some clients (curl 7.x: "HTTP/2 framing layer") take as an error, losing
        // the answer — a 401 reads as no answer. A small body on its way is read first.
        drain_body(&mut body, H2_SETTLE_BYTES, H2_SETTLE_WAIT).await;
    }
    // HTTP/1 only: HTTP/2 ends a still unread request stream on its own (RST_STREAM NO_ERROR), and
    // a client that asked `Expect: 100-continue` was never told to send its body.
    if parts.version < Version::HTTP_2
        && !body.is_end_stream()
        && response.status() != StatusCode::PAYLOAD_TOO_LARGE
        && !response.headers().contains_key(CONNECTION)
        && !parts.headers.contains_key(EXPECT)
    {
        // Beside the answer, which goes out at once (a sender that stalls mid-body still hears
        // its 429): the connection is kept once the body has passed, closed if the drain
        // gives up.
        let (limit, timeout) = (
            receiver.limits.max_body_bytes,
            receiver.limits.body_read_timeout,
        );
        tokio::spawn(async move { drain_body(&mut body, limit, timeout).await });
    }
    response
}

/// The answer to one request; `body` is read only when the request gets that far.
async fn respond(receiver: &Receiver, req: &Parts, body: &mut Incoming) -> HttpResponse {
    if let Some(hosts) = &receiver.limits.allowed_hosts
        && let Some(refused) = hosts.refused(&req.headers, &req.uri)
    {
        receiver
            .events
            .auth_refused(receiver.name, "host_not_allowed");
        // The receiver checks hosts only while it listens on loopback without authentication.
        let message = refused.message("api.allowed_hosts");
        let mut response = refusal(
            &req.headers,
            refused.status(),
            Code::PermissionDenied,
            message,
        );
        response.extensions_mut().insert(CloseConnection);
        return response;
    }
    let token = match receiver.ingest_token(req.headers.get(AUTHORIZATION)) {
        Ok(token) => token,
        Err(why) => {
            let (status, challenge, message) = why.http_answer(Scope::Ingest);
            let mut response = refusal(&req.headers, status, Code::of_refusal(why), message);
            response.headers_mut().insert(WWW_AUTHENTICATE, challenge);
            response.extensions_mut().insert(CloseConnection);
            return response;
        }
    };
    match req.uri.path() {
        TRACES_PATH => {}
        METRICS_PATH | LOGS_PATH => {
            return refusal(
                &req.headers,
                StatusCode::NOT_IMPLEMENTED,
                Code::Unimplemented,
                "this collector accepts OTLP traces only (POST /v1/traces); \
                 metrics and logs are not accepted: send them to another collector",
            );
        }
        _ => {
            return refusal(
                &req.headers,
                StatusCode::NOT_FOUND,
                Code::NotFound,
                "not found: this collector accepts OTLP traces at POST /v1/traces",
            );
        }
    }
    if req.method != Method::POST {
        let mut response = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: send OTLP traces with POST",
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    let Some(format) = request_format(&req.headers) else {
        receiver.refuse_request("unsupported_content");
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported content type: send application/x-protobuf or application/json",
        );
    };
    let header = req.headers.get(CONTENT_ENCODING).map(HeaderValue::as_bytes);
    let Ok(coding) = Coding::of_header(header) else {
        receiver.refuse_request("unsupported_content");
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported content encoding: send gzip, deflate or identity",
        );
    };
    let mut hold = receiver.hold(token, &req.extensions);
    let body = match receiver
        .read(body, receiver.limits.max_body_bytes, &mut hold, None)
        .await
    {
        Ok(body) => body,
        Err(outcome) => return answer(format, outcome),
    };
    let body = if let Some(coding) = coding {
        match receiver.inflate(body, coding, &mut hold) {
            Ok(inflated) => inflated,
            Err(outcome) => return answer(format, outcome),
        }
    } else {
        body
    };
    let payload = match format {
        Format::Protobuf => Payload::Protobuf(body),
        Format::Json => Payload::Json(body),
    };
    answer(format, receiver.export(payload, hold))
}

/// The HTTP answer to what became of a request.
fn answer(format: Format, outcome: Outcome) -> HttpResponse {
    match outcome {
        Outcome::Accepted { rejected, message } => success(format, rejected, message),
        Outcome::Undecodable(error) => status_response(
            format,
            StatusCode::BAD_REQUEST,
            Code::InvalidArgument,
            &format!("undecodable OTLP request: {error}"),
        ),
        Outcome::Unreadable(message) => status_response(
            format,
            StatusCode::BAD_REQUEST,
            Code::InvalidArgument,
            &message,
        ),
        Outcome::TooLarge(message) => status_response(
            format,
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::ResourceExhausted,
            &message,
        ),
        Outcome::Overloaded {
            retry_after_secs,
            why,
        } => retry_later(format, StatusCode::TOO_MANY_REQUESTS, retry_after_secs, why),
        Outcome::TimedOut => {
            let mut response = status_response(
                format,
                StatusCode::REQUEST_TIMEOUT,
                Code::DeadlineExceeded,
                "the request body did not arrive within the body read timeout",
            );
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            response
        }
        Outcome::ShuttingDown => retry_later(
            format,
            StatusCode::SERVICE_UNAVAILABLE,
            1,
            "collector is shutting down; retry against another instance",
        ),
    }
}

/// The request's body format from `Content-Type` (parameters such as `charset` ignored).
fn request_format(headers: &http::HeaderMap) -> Option<Format> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let media = value.split(';').next()?.trim();
    if media.eq_ignore_ascii_case(PROTOBUF) {
        Some(Format::Protobuf)
    } else if media.eq_ignore_ascii_case(JSON) {
        Some(Format::Json)
    } else {
        None
    }
}

fn success(format: Format, rejected: u32, message: Option<String>) -> HttpResponse {
    let partial = (rejected > 0).then(|| ExportTracePartialSuccess {
        rejected_spans: i64::from(rejected),
        error_message: message.unwrap_or_default(),
    });
    let body = match format {
        Format::Protobuf => Bytes::from(
            ExportTraceServiceResponse {
                partial_success: partial,
            }
            .encode_to_vec(),
        ),
        Format::Json => {
            let value = match partial {
                Some(p) => serde_json::json!({
                    "partialSuccess": {
                        "rejectedSpans": p.rejected_spans,
                        "errorMessage": p.error_message,
                    }
                }),
                None => serde_json::json!({}),
            };
            Bytes::from(value.to_string())
        }
    };
    with_type(StatusCode::OK, format.content_type(), body)
}

/// An error answer carrying a `google.rpc.Status` in the request's format, as OTLP/HTTP asks.
fn status_response(format: Format, status: StatusCode, code: Code, message: &str) -> HttpResponse {
    let code = code as i32;
    let body = match format {
        Format::Protobuf => {
            let mut buf = Vec::with_capacity(message.len() + 8);
            prost::encoding::int32::encode(1, &code, &mut buf);
            prost::encoding::string::encode(2, &message.to_owned(), &mut buf);
            Bytes::from(buf)
        }
        Format::Json => {
            Bytes::from(serde_json::json!({"code": code, "message": message}).to_string())
        }
    };
    with_type(status, format.content_type(), body)
}

fn retry_later(format: Format, status: StatusCode, secs: u32, message: &str) -> HttpResponse {
    let mut response = status_response(format, status, Code::Unavailable, message);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    response
}

/// An answer before the body is read: a `google.rpc.Status` in the format the request declares
/// (as OTLP/HTTP asks of every error), plain text when it declares none this receiver reads.
fn refusal(
    headers: &http::HeaderMap,
    status: StatusCode,
    code: Code,
    message: impl Into<Cow<'static, str>>,
) -> HttpResponse {
    let message = message.into();
    match request_format(headers) {
        Some(format) => status_response(format, status, code, &message),
        None => plain(status, message),
    }
}

fn plain(status: StatusCode, message: impl Into<Cow<'static, str>>) -> HttpResponse {
    let body = match message.into() {
        Cow::Borrowed(text) => Bytes::from_static(text.as_bytes()),
        Cow::Owned(text) => Bytes::from(text),
    };
    with_type(status, "text/plain; charset=utf-8", body)
}

fn with_type(status: StatusCode, content_type: &'static str, body: Bytes) -> HttpResponse {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_type_parameters_and_case_are_ignored() {
        let mut h = http::HeaderMap::new();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("Application/JSON; charset=utf-8"),
        );
        assert_eq!(request_format(&h), Some(Format::Json));
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        assert_eq!(request_format(&h), Some(Format::Protobuf));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(request_format(&h), None);
        assert_eq!(request_format(&http::HeaderMap::new()), None);
    }

    #[test]
    fn protobuf_error_body_is_a_google_rpc_status() {
        let r = status_response(
            Format::Protobuf,
            StatusCode::BAD_REQUEST,
            Code::InvalidArgument,
            "bad",
        );
        let body =
            futures_util::FutureExt::now_or_never(http_body_util::BodyExt::collect(r.into_body()))
                .unwrap()
                .unwrap()
                .to_bytes();
        assert_eq!(&body[..], &[0x08, 3, 0x12, 3, b'b', b'a', b'd']);
    }
}
