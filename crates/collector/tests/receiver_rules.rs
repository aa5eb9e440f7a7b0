//! The receivers' OTLP rules, checked against real loopback sockets: what is accepted (protobuf,
//! JSON, gzip, over HTTP and gRPC), every refusal (400, 413 incl. a gzip bomb, 415, 405, 404, 501,
//! 429 / UNAVAILABLE, partial success), and the counters each one increments.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use infertrace_collector::limiter::MemoryLimiter;
use infertrace_collector::otlp_decode::from_proto;
use infertrace_collector::receiver::{ReceiverLimits, serve_grpc, serve_http};
use infertrace_collector::{Ingest, IngestBatch, IngestError, InternalEvents};
use infertrace_semconv as sc;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// An `Ingest` that keeps every batch, and can be told to say it is overloaded.
#[derive(Default)]
struct CollectingIngest {
    batches: Mutex<Vec<IngestBatch>>,
    overloaded: AtomicBool,
}

impl Ingest for CollectingIngest {
    fn ingest(&self, mut batch: IngestBatch) -> Result<u64, IngestError> {
        if self.overloaded.load(Ordering::SeqCst) {
            return Err(IngestError::Overloaded {
                retry_after_secs: 7,
            });
        }
        // As the pipeline does (without forwarding), the request's memory is given back once
        // it is ingested; the spans are kept.
        batch.hold = None;
        self.batches.lock().unwrap().push(batch);
        Ok(0)
    }
}

impl CollectingIngest {
    fn span_count(&self) -> usize {
        self.batches
            .lock()
            .unwrap()
            .iter()
            .map(|b| b.spans.len())
            .sum()
    }
}

struct Collector {
    grpc: SocketAddr,
    http: SocketAddr,
    ingest: Arc<CollectingIngest>,
    events: InternalEvents,
    stop: Vec<oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Collector {
    async fn start(limits: ReceiverLimits) -> Self {
        let ingest = Arc::new(CollectingIngest::default());
        let events = InternalEvents::default();
        let grpc_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = grpc_listener.local_addr().unwrap();
        let http = http_listener.local_addr().unwrap();
        let (stop_grpc, grpc_stopped) = oneshot::channel::<()>();
        let (stop_http, http_stopped) = oneshot::channel::<()>();
        let tasks = vec![
            tokio::spawn(serve_grpc(
                grpc_listener,
                ingest.clone(),
                events.clone(),
                limits.clone(),
                async move {
                    let _ = grpc_stopped.await;
                },
            )),
            tokio::spawn(serve_http(
                http_listener,
                ingest.clone(),
                events.clone(),
                limits,
                async move {
                    let _ = http_stopped.await;
                },
            )),
        ];
        Self {
            grpc,
            http,
            ingest,
            events,
            stop: vec![stop_grpc, stop_http],
            tasks,
        }
    }

    fn received(&self, receiver: &'static str, outcome: &'static str) -> u64 {
        self.events
            .receiver_spans
            .get_or_create(&infertrace_collector::internal_events::ReceiverLabels {
                receiver,
                outcome,
            })
            .get()
    }

    async fn stop(mut self) {
        for s in self.stop.drain(..) {
            s.send(()).unwrap();
        }
        for t in self.tasks.drain(..) {
            t.await.unwrap().unwrap();
        }
    }
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        key_strindex: 0,
    }
}

fn span(trace: u8, id: u8) -> Span {
    Span {
        trace_id: vec![trace; 16],
        span_id: vec![id; 8],
        name: format!("chat model-{id}"),
        kind: 2,
        start_time_unix_nano: 1_000,
        end_time_unix_nano: 5_000,
        attributes: vec![
            kv(
                sc::gen_ai::REQUEST_MODEL,
                any_value::Value::StringValue("llama".into()),
            ),
            kv(
                "http.user_agent.dropped",
                any_value::Value::StringValue("curl".into()),
            ),
            kv(
                sc::gen_ai::USAGE_OUTPUT_TOKENS,
                any_value::Value::IntValue(i64::from(id)),
            ),
        ],
        ..Default::default()
    }
}

fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv(
                    sc::resource::SERVICE_NAME,
                    any_value::Value::StringValue("svc".into()),
                )],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            schema_url: String::new(),
        }],
    }
}

fn valid_request(n: u8) -> ExportTraceServiceRequest {
    request((1..=n).map(|i| span(7, i)).collect())
}

/// 3 valid spans and 2 invalid ones (bad trace id length, end before start).
fn mixed_request() -> ExportTraceServiceRequest {
    let mut short_trace = span(7, 10);
    short_trace.trace_id = vec![7; 5];
    let mut backwards = span(7, 11);
    backwards.end_time_unix_nano = 10;
    request(vec![
        span(7, 1),
        short_trace,
        span(7, 2),
        backwards,
        span(7, 3),
    ])
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// HTTP's and gRPC's `deflate`: the zlib format, as the OpenTelemetry SDKs send it.
fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Deflate bodies, over HTTP (`Content-Encoding`) and gRPC (`grpc-encoding`), are inflated as
/// gzip ones are: the Python SDK's exporters offer both, and deflate was refused with 415.
#[tokio::test]
async fn deflate_bodies_are_accepted_over_http_and_grpc() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let req = valid_request(2);
    let http = http_call(
        c.http,
        Method::POST,
        "/v1/traces",
        &[
            ("content-type", "application/x-protobuf"),
            ("content-encoding", "deflate"),
        ],
        deflate(&req.encode_to_vec()),
    )
    .await;
    assert_eq!(http.status, StatusCode::OK);
    let (status, code, message) = grpc_raw(
        c.grpc,
        EXPORT_PATH,
        &[
            ("content-type", "application/grpc"),
            ("grpc-encoding", "deflate"),
        ],
        frame(&deflate(&req.encode_to_vec()), true),
    )
    .await;
    assert_eq!(
        (status, code.as_deref()),
        (StatusCode::OK, Some("0")),
        "{message:?}"
    );
    assert_eq!(c.ingest.span_count(), 4);
    let raw = c.ingest.batches.lock().unwrap()[0].raw_protobuf.clone();
    assert_eq!(raw.as_deref(), Some(&req.encode_to_vec()[..]));
    // Not zlib: refused as unreadable, not as an unknown encoding.
    let broken = http_call(
        c.http,
        Method::POST,
        "/v1/traces",
        &[
            ("content-type", "application/x-protobuf"),
            ("content-encoding", "deflate"),
        ],
        b"not deflate".to_vec(),
    )
    .await;
    assert_eq!(broken.status, StatusCode::BAD_REQUEST);
    c.stop().await;
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

async fn http_call(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = sender
        .send_request(req.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

async fn post(addr: SocketAddr, content_type: &str, body: Vec<u8>) -> Reply {
    http_call(
        addr,
        Method::POST,
        "/v1/traces",
        &[("content-type", content_type)],
        body,
    )
    .await
}

/// A gRPC call made by hand over h2c, for bodies a typed client cannot send, without a
/// content-length as gRPC clients send it (the message prefix gives the length).
/// Returns (HTTP status, grpc-status, grpc-message).
async fn grpc_raw(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (StatusCode, Option<String>, Option<String>) {
    grpc_raw_declared(addr, path, headers, body, false).await
}

/// [`grpc_raw`], with the body's content-length declared when `declare_length`.
async fn grpc_raw_declared(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    declare_length: bool,
) -> (StatusCode, Option<String>, Option<String>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}{path}"))
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = Bytes::from(body);
    let request = if declare_length {
        req.body(Full::new(body).boxed())
    } else {
        let frames = futures_util::stream::iter([Ok::<_, Infallible>(Frame::data(body))]);
        req.body(StreamBody::new(frames).boxed())
    };
    let response = sender.send_request(request.unwrap()).await.unwrap();
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let get = |name: &str| {
        trailers
            .get(name)
            .or_else(|| parts.headers.get(name))
            .map(|v| v.to_str().unwrap().to_owned())
    };
    (parts.status, get("grpc-status"), get("grpc-message"))
}

fn frame(message: &[u8], compressed: bool) -> Vec<u8> {
    let mut out = vec![u8::from(compressed)];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

async fn grpc_client(addr: SocketAddr) -> TraceServiceClient<tonic::transport::Channel> {
    TraceServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

// ---------------------------------------------------------------- accepted

#[tokio::test]
async fn http_protobuf_is_accepted_and_forwarded_unchanged() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let req = valid_request(4);
    let bytes = req.encode_to_vec();
    let reply = post(c.http, "application/x-protobuf", bytes.clone()).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "application/x-protobuf");
    let response = ExportTraceServiceResponse::decode(reply.body).unwrap();
    assert_eq!(response.partial_success, None);
    {
        let batches = c.ingest.batches.lock().unwrap();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].spans, from_proto(&req).spans);
        assert_eq!(batches[0].spans.len(), 4);
        // Only the two kept attributes survive.
        assert_eq!(batches[0].spans[0].attributes.len(), 2);
        assert_eq!(batches[0].raw_protobuf.as_deref(), Some(&bytes[..]));
        assert_eq!(batches[0].raw_json, None);
    }
    assert_eq!(c.received("otlp_http", "accepted"), 4);
    c.stop().await;
}

#[tokio::test]
async fn http_json_is_accepted_and_answered_in_json() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let req = valid_request(3);
    let body = serde_json::to_vec(&req).unwrap();
    // The OTLP/JSON encoding: hex ids, not base64.
    assert!(String::from_utf8_lossy(&body).contains(&"07".repeat(16)));
    let reply = post(c.http, "application/json; charset=utf-8", body.clone()).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "application/json");
    assert_eq!(&reply.body[..], b"{}");
    {
        let batches = c.ingest.batches.lock().unwrap();
        assert_eq!(batches[0].spans, from_proto(&req).spans);
        assert_eq!(batches[0].raw_protobuf, None);
        assert_eq!(batches[0].raw_json.as_deref(), Some(&body[..]));
    }
    assert_eq!(c.received("otlp_http", "accepted"), 3);
    c.stop().await;
}

#[tokio::test]
async fn http_gzip_bodies_are_accepted() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let req = valid_request(2);
    let proto = http_call(
        c.http,
        Method::POST,
        "/v1/traces",
        &[
            ("content-type", "application/x-protobuf"),
            ("content-encoding", "gzip"),
        ],
        gzip(&req.encode_to_vec()),
    )
    .await;
    assert_eq!(proto.status, StatusCode::OK);
    let json = http_call(
        c.http,
        Method::POST,
        "/v1/traces",
        &[
            ("content-type", "application/json"),
            ("content-encoding", "GZIP"),
        ],
        gzip(&serde_json::to_vec(&req).unwrap()),
    )
    .await;
    assert_eq!(json.status, StatusCode::OK);
    assert_eq!(c.ingest.span_count(), 4);
    // Forwarded bytes are the inflated request.
    let raw = c.ingest.batches.lock().unwrap()[0].raw_protobuf.clone();
    assert_eq!(raw.as_deref(), Some(&req.encode_to_vec()[..]));
    c.stop().await;
}

#[tokio::test]
async fn grpc_export_plain_and_gzip_is_accepted() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let mut client = grpc_client(c.grpc).await;
    let req = valid_request(5);
    let response = client.export(req.clone()).await.unwrap().into_inner();
    assert_eq!(response.partial_success, None);
    let mut gz = grpc_client(c.grpc)
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip);
    gz.export(req.clone()).await.unwrap();
    {
        let batches = c.ingest.batches.lock().unwrap();
        assert_eq!(batches.len(), 2);
        for b in batches.iter() {
            assert_eq!(b.spans, from_proto(&req).spans);
            assert_eq!(b.raw_protobuf.as_deref(), Some(&req.encode_to_vec()[..]));
        }
    }
    assert_eq!(c.received("otlp_grpc", "accepted"), 10);
    c.stop().await;
}

// ---------------------------------------------------------------- partial success

#[tokio::test]
async fn invalid_spans_get_partial_success_over_http_and_grpc() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let req = mixed_request();
    let reply = post(c.http, "application/x-protobuf", req.encode_to_vec()).await;
    assert_eq!(reply.status, StatusCode::OK);
    let partial = ExportTraceServiceResponse::decode(reply.body)
        .unwrap()
        .partial_success
        .unwrap();
    assert_eq!(partial.rejected_spans, 2);
    assert!(
        partial.error_message.contains("2 of 5 spans rejected")
            && partial.error_message.contains("trace id must be 16 bytes"),
        "{}",
        partial.error_message
    );

    let json = post(
        c.http,
        "application/json",
        serde_json::to_vec(&req).unwrap(),
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&json.body).unwrap();
    assert_eq!(v["partialSuccess"]["rejectedSpans"], 2);

    let grpc = grpc_client(c.grpc)
        .await
        .export(req)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc.partial_success.unwrap().rejected_spans, 2);

    assert_eq!(c.ingest.span_count(), 9);
    assert_eq!(c.received("otlp_http", "accepted"), 6);
    assert_eq!(c.received("otlp_http", "rejected"), 4);
    assert_eq!(c.received("otlp_grpc", "accepted"), 3);
    assert_eq!(c.received("otlp_grpc", "rejected"), 2);
    assert_eq!(c.events.dropped("invalid_span"), 6);
    c.stop().await;
}

// ---------------------------------------------------------------- 400 / INVALID_ARGUMENT

#[tokio::test]
async fn undecodable_bodies_are_400_and_invalid_argument() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let garbage = vec![0x0a, 0xff, 0xff, 0x01, 0x00];
    let reply = post(c.http, "application/x-protobuf", garbage.clone()).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    // A google.rpc.Status: code 3 (INVALID_ARGUMENT), then the message.
    assert_eq!(&reply.body[..2], &[0x08, 3]);
    let json = post(
        c.http,
        "application/json",
        b"{\"resourceSpans\": 12}".to_vec(),
    )
    .await;
    assert_eq!(json.status, StatusCode::BAD_REQUEST);
    let v: serde_json::Value = serde_json::from_slice(&json.body).unwrap();
    assert_eq!(v["code"], 3);
    let bad_gzip = http_call(
        c.http,
        Method::POST,
        "/v1/traces",
        &[
            ("content-type", "application/x-protobuf"),
            ("content-encoding", "gzip"),
        ],
        b"definitely not gzip".to_vec(),
    )
    .await;
    assert_eq!(bad_gzip.status, StatusCode::BAD_REQUEST);

    let (http_status, code, message) = grpc_raw(
        c.grpc,
        EXPORT_PATH,
        &[("content-type", "application/grpc")],
        frame(&garbage, false),
    )
    .await;
    assert_eq!(http_status, StatusCode::OK);
    assert_eq!(code.as_deref(), Some("3"));
    assert!(message.unwrap().contains("undecodable"));
    let (_, code, _) = grpc_raw(
        c.grpc,
        EXPORT_PATH,
        &[("content-type", "application/grpc")],
        vec![0, 0, 0, 0, 9, 1],
    )
    .await;
    assert_eq!(code.as_deref(), Some("3"), "truncated frame");

    assert_eq!(c.events.dropped("decode_error"), 5);
    assert_eq!(c.ingest.span_count(), 0);
    c.stop().await;
}

// ---------------------------------------------------------------- 413 / RESOURCE_EXHAUSTED

#[tokio::test]
async fn bodies_over_the_limit_are_413_and_resource_exhausted_even_when_gzipped() {
    let limits = ReceiverLimits {
        max_body_bytes: 64 * 1024,
        ..ReceiverLimits::default()
    };
    let c = Collector::start(limits).await;
    let mut big_span = span(7, 1);
    big_span.attributes.push(kv(
        sc::gen_ai::RESPONSE_ID,
        any_value::Value::StringValue("x".repeat(200 * 1024)),
    ));
    let big = request(vec![big_span]);
    let reply = post(c.http, "application/x-protobuf", big.encode_to_vec()).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(&reply.body[..2], &[0x08, 8]);

    // A gzip bomb: 32 MiB of zeros in ~32 KiB.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&vec![0u8; 32 * 1024 * 1024]).unwrap();
    let bomb = e.finish().unwrap();
    assert!(bomb.len() < 64 * 1024);
    let reply = http_call(
        c.http,
        Method::POST,
        "/v1/traces",
        &[
            ("content-type", "application/x-protobuf"),
            ("content-encoding", "gzip"),
        ],
        bomb.clone(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);

    let status = grpc_client(c.grpc)
        .await
        .export(big.clone())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    // Compressed it fits the wire limit; inflated it does not.
    let status = grpc_client(c.grpc)
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip)
        .export(big)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    let (_, code, _) = grpc_raw(
        c.grpc,
        EXPORT_PATH,
        &[
            ("content-type", "application/grpc"),
            ("grpc-encoding", "gzip"),
        ],
        frame(&bomb, true),
    )
    .await;
    assert_eq!(code.as_deref(), Some("8"));
    // A message prefix that declares more than the limit is refused on it, whatever follows;
    // one that declares the limit is read (and refused for its missing bytes).
    let declaring = |len: usize| {
        let mut body = frame(b"", false);
        body[1..5].copy_from_slice(&(len as u32).to_be_bytes());
        body
    };
    let grpc_headers = [("content-type", "application/grpc")];
    let (_, code, _) = grpc_raw(c.grpc, EXPORT_PATH, &grpc_headers, declaring(64 * 1024 + 1)).await;
    assert_eq!(code.as_deref(), Some("8"));
    let (_, code, _) = grpc_raw(c.grpc, EXPORT_PATH, &grpc_headers, declaring(64 * 1024)).await;
    assert_eq!(code.as_deref(), Some("3"));
    // A declared content-length over the limit (with its 5-byte prefix) is refused on it.
    let over = frame(&vec![0; 64 * 1024 + 1], false);
    let (_, code, _) = grpc_raw_declared(c.grpc, EXPORT_PATH, &grpc_headers, over, true).await;
    assert_eq!(code.as_deref(), Some("8"));

    assert_eq!(c.events.dropped("too_large"), 7);
    assert_eq!(c.ingest.span_count(), 0);
    c.stop().await;
}

// ---------------------------------------------------------------- 415, 405, 404, 501

#[tokio::test]
async fn wrong_content_type_or_encoding_is_415() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let body = valid_request(1).encode_to_vec();
    let reply = post(c.http, "text/plain", body.clone()).await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(String::from_utf8_lossy(&reply.body).contains("application/x-protobuf"));
    let none = http_call(c.http, Method::POST, "/v1/traces", &[], body.clone()).await;
    assert_eq!(none.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let brotli = http_call(
        c.http,
        Method::POST,
        "/v1/traces",
        &[
            ("content-type", "application/x-protobuf"),
            ("content-encoding", "br"),
        ],
        body.clone(),
    )
    .await;
    assert_eq!(brotli.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _, _) = grpc_raw(
        c.grpc,
        EXPORT_PATH,
        &[("content-type", "application/json")],
        frame(&body, false),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (_, code, _) = grpc_raw(
        c.grpc,
        EXPORT_PATH,
        &[
            ("content-type", "application/grpc"),
            ("grpc-encoding", "snappy"),
        ],
        frame(&body, true),
    )
    .await;
    assert_eq!(code.as_deref(), Some("12"));
    assert_eq!(c.ingest.span_count(), 0);
    assert_eq!(c.events.dropped("unsupported_content"), 5);
    c.stop().await;
}

#[tokio::test]
async fn wrong_method_is_405_unknown_paths_404_metrics_and_logs_501() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let get = http_call(c.http, Method::GET, "/v1/traces", &[], Vec::new()).await;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(get.headers["allow"], "POST");
    let nowhere = post(c.http, "application/x-protobuf", Vec::new()).await;
    assert_eq!(nowhere.status, StatusCode::OK, "an empty request is valid");
    let unknown = http_call(
        c.http,
        Method::POST,
        "/v2/traces",
        &[("content-type", "application/x-protobuf")],
        Vec::new(),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    for path in ["/v1/metrics", "/v1/logs"] {
        let reply = http_call(
            c.http,
            Method::POST,
            path,
            &[("content-type", "application/x-protobuf")],
            Vec::new(),
        )
        .await;
        assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED, "{path}");
        assert!(String::from_utf8_lossy(&reply.body).contains("traces only"));
    }
    let (_, code, message) = grpc_raw(
        c.grpc,
        "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        &[("content-type", "application/grpc")],
        frame(&[], false),
    )
    .await;
    assert_eq!(code.as_deref(), Some("12"));
    assert!(message.unwrap().contains("traces only"));
    let (_, code, _) = grpc_raw(
        c.grpc,
        "/some.Other/Method",
        &[("content-type", "application/grpc")],
        frame(&[], false),
    )
    .await;
    assert_eq!(code.as_deref(), Some("12"));
    c.stop().await;
}

// ---------------------------------------------------------------- 429 / UNAVAILABLE

#[tokio::test]
async fn overloaded_ingest_is_429_with_retry_after_and_unavailable() {
    let c = Collector::start(ReceiverLimits::default()).await;
    c.ingest.overloaded.store(true, Ordering::SeqCst);
    let req = valid_request(3);
    let reply = post(c.http, "application/x-protobuf", req.encode_to_vec()).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.headers["retry-after"], "7");
    let status = grpc_client(c.grpc).await.export(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(c.received("otlp_http", "refused"), 3);
    assert_eq!(c.received("otlp_grpc", "refused"), 3);
    assert_eq!(c.events.dropped("memory_limit"), 6);
    assert_eq!(c.received("otlp_http", "accepted"), 0);
    c.stop().await;
}

#[tokio::test]
async fn memory_limiter_refuses_before_decoding_and_releases_after() {
    let limiter = MemoryLimiter::new(64 * 1024);
    let limits = ReceiverLimits {
        memory: Some(limiter.clone()),
        retry_after_secs: 2,
        ..ReceiverLimits::default()
    };
    let c = Collector::start(limits).await;
    let small = valid_request(2).encode_to_vec();
    let reply = post(c.http, "application/x-protobuf", small).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        limiter.used(),
        0,
        "the reservation is released after ingest"
    );

    // Hold most of the budget, as the assembler would with buffered spans.
    let _held = limiter.try_reserve(60 * 1024).unwrap();
    let req = valid_request(20);
    let reply = post(c.http, "application/x-protobuf", req.encode_to_vec()).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.headers["retry-after"], "2");
    let status = grpc_client(c.grpc).await.export(req).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    // Both bodies fit the budget, what decoding them may allocate does not: each is refused
    // before decoding, its 20 spans counted.
    assert_eq!(c.events.dropped("memory_limit"), 40);
    assert_eq!(
        limiter.used(),
        60 * 1024,
        "the bodies' reservations were given back"
    );
    assert_eq!(c.ingest.span_count(), 2);
    c.stop().await;
}

/// A refusal made before the body was read reaches a client that sends its whole body before
/// it reads (as Python's `http.client`, under the OTel SDK's exporter, does), and the HTTP/1.1
/// connection stays open for the next request: the rest of the body is read and dropped beside
/// the answer. (Without that the collector closed the connection with bytes unread, the kernel
/// reset it, and such a client got a broken connection instead of the 429 and its
/// `Retry-After`; a benchmark client got "connection closed before message completed".)
#[tokio::test]
async fn a_refusal_before_the_body_is_read_keeps_the_http1_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limiter = MemoryLimiter::new(64 << 20);
    let limits = ReceiverLimits {
        memory: Some(limiter.clone()),
        retry_after_secs: 3,
        ..ReceiverLimits::default()
    };
    let c = Collector::start(limits).await;
    let mut s = TcpStream::connect(c.http).await.unwrap();
    let head = |path: &str, len: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/x-protobuf\r\n\
             content-length: {len}\r\n\r\n"
        )
    };
    // Reads one answer: its head, then as many body bytes as it declares.
    async fn answer(s: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut byte).await.expect("the answer arrives");
            assert_eq!(
                n,
                1,
                "connection closed after {:?}",
                String::from_utf8_lossy(&got)
            );
            got.push(byte[0]);
        }
        let head = String::from_utf8(got).unwrap().to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).await.unwrap();
        head
    }
    // Sends a whole request, then reads its answer.
    async fn exchange(s: &mut TcpStream, head: String, body: &[u8]) -> String {
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body).await.expect("the whole body is taken");
        answer(s).await
    }
    // 12 MiB, far more than the socket buffers take: the collector answers while it arrives.
    let large = vec![0u8; 12 << 20];
    let held = limiter.try_reserve(60 << 20).unwrap();
    let refused = exchange(&mut s, head("/v1/traces", large.len()), &large).await;
    assert!(refused.starts_with("http/1.1 429"), "{refused}");
    assert!(refused.contains("retry-after: 3"), "{refused}");
    // An unknown path is answered before its body is read too.
    let not_found = exchange(&mut s, head("/v1/nowhere", large.len()), &large).await;
    assert!(not_found.starts_with("http/1.1 404"), "{not_found}");
    drop(held);
    let body = valid_request(3).encode_to_vec();
    let accepted = exchange(&mut s, head("/v1/traces", body.len()), &body).await;
    assert!(accepted.starts_with("http/1.1 200"), "{accepted}");
    assert_eq!(c.ingest.span_count(), 3);
    c.stop().await;
}

// ---------------------------------------------------------------- shutdown

#[tokio::test]
async fn shutdown_stops_accepting_and_returns() {
    let c = Collector::start(ReceiverLimits::default()).await;
    let (grpc, http) = (c.grpc, c.http);
    let reply = post(
        http,
        "application/x-protobuf",
        valid_request(1).encode_to_vec(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    c.stop().await;
    assert!(TcpStream::connect(http).await.is_err());
    assert!(TcpStream::connect(grpc).await.is_err());
}
