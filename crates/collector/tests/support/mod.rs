//! Shared helpers of the collector's integration tests: OTLP requests with known timings, a
//! collector on port 0, and small HTTP/gRPC clients.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infertrace_collector::config::CollectorConfig;
use infertrace_semconv as sc;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

pub const MS: u64 = 1_000_000;

/// A collector config on port 0 everywhere, with a short grace and a fast tick, and no history
/// store (tests that want one set `store.enabled` and a temporary `store.data_dir`).
pub fn test_config() -> CollectorConfig {
    let mut c = CollectorConfig::default();
    c.store.enabled = false;
    c.receivers.otlp_grpc.endpoint = "127.0.0.1:0".parse().unwrap();
    c.receivers.otlp_http.endpoint = "127.0.0.1:0".parse().unwrap();
    c.api.listen = "127.0.0.1:0".parse().unwrap();
    c.assembly.grace = Duration::from_millis(200);
    c.assembly.tick = Duration::from_millis(20);
    // The resident memory of a test process is every test's, not this collector's.
    c.limits.watch_resident_memory = false;
    c
}

pub fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

pub fn s(v: &str) -> any_value::Value {
    any_value::Value::StringValue(v.to_owned())
}

pub fn i(v: i64) -> any_value::Value {
    any_value::Value::IntValue(v)
}

pub fn d(v: f64) -> any_value::Value {
    any_value::Value::DoubleValue(v)
}

/// One infertrace-dialect request with known phase durations (milliseconds).
#[derive(Clone, Debug)]
pub struct Req {
    pub trace: u32,
    pub model: String,
    pub queue_ms: u64,
    pub prefill_ms: u64,
    pub decode_ms: u64,
    pub output_tokens: i64,
    pub input_tokens: i64,
    pub outcome: &'static str,
}

impl Req {
    pub fn new(trace: u32, model: &str, queue_ms: u64, prefill_ms: u64, decode_ms: u64) -> Self {
        Self {
            trace,
            model: model.to_owned(),
            queue_ms,
            prefill_ms,
            decode_ms,
            output_tokens: 21,
            input_tokens: 100,
            outcome: "ok",
        }
    }
    pub fn e2e(&self) -> f64 {
        (self.queue_ms + self.prefill_ms + self.decode_ms) as f64 / 1e3
    }
    pub fn ttft(&self) -> f64 {
        (self.queue_ms + self.prefill_ms) as f64 / 1e3
    }
    pub fn tpot(&self) -> f64 {
        self.decode_ms as f64 / 1e3 / (self.output_tokens - 1) as f64
    }
    pub fn trace_id(&self) -> Vec<u8> {
        let mut id = vec![0xab; 16];
        id[..4].copy_from_slice(&self.trace.to_be_bytes());
        id
    }
    pub fn trace_hex(&self) -> String {
        hex::encode(self.trace_id())
    }
}

fn span_id(trace: u32, n: u8) -> Vec<u8> {
    let mut id = vec![n; 8];
    id[..4].copy_from_slice(&trace.to_be_bytes());
    id
}

/// The four spans of an infertrace request, starting at `t0` (Unix ns).
pub fn infertrace_spans(r: &Req, t0: u64) -> Vec<Span> {
    let tid = r.trace_id();
    let root_id = span_id(r.trace, 1);
    let a = t0 + r.queue_ms * MS;
    let b = a + r.prefill_ms * MS;
    let c = b + r.decode_ms * MS;
    let phase = |n: u8, name: &str, start: u64, end: u64| Span {
        trace_id: tid.clone(),
        span_id: span_id(r.trace, n),
        parent_span_id: root_id.clone(),
        name: name.to_owned(),
        kind: 1,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes: vec![kv(sc::infer::PHASE, s(name))],
        ..Default::default()
    };
    vec![
        phase(2, sc::span::QUEUE, t0, a),
        phase(3, sc::span::PREFILL, a, b),
        phase(4, sc::span::DECODE, b, c),
        Span {
            trace_id: tid.clone(),
            span_id: root_id.clone(),
            name: format!("chat {}", r.model),
            kind: 2,
            start_time_unix_nano: t0,
            end_time_unix_nano: c,
            attributes: vec![
                kv(sc::gen_ai::OPERATION_NAME, s("chat")),
                kv(sc::gen_ai::REQUEST_MODEL, s(&r.model)),
                kv(sc::gen_ai::USAGE_INPUT_TOKENS, i(r.input_tokens)),
                kv(sc::gen_ai::USAGE_OUTPUT_TOKENS, i(r.output_tokens)),
                kv(sc::infer::OUTCOME, s(r.outcome)),
                kv("http.request.header.x-custom", s("kept downstream")),
            ],
            ..Default::default()
        },
    ]
}

/// A vLLM `llm_request` span (attributes only, no children).
pub fn vllm_span(r: &Req, t0: u64) -> Span {
    let e2e = r.e2e();
    Span {
        trace_id: r.trace_id(),
        span_id: span_id(r.trace, 1),
        name: sc::span::VLLM_REQUEST.to_owned(),
        kind: 2,
        start_time_unix_nano: t0,
        end_time_unix_nano: t0 + (e2e * 1e9) as u64,
        attributes: vec![
            kv(sc::gen_ai::RESPONSE_MODEL, s(&r.model)),
            kv(sc::latency::TIME_IN_QUEUE, d(r.queue_ms as f64 / 1e3)),
            kv(sc::latency::TIME_TO_FIRST_TOKEN, d(r.ttft())),
            kv(
                sc::latency::TIME_IN_MODEL_PREFILL,
                d(r.prefill_ms as f64 / 1e3),
            ),
            kv(
                sc::latency::TIME_IN_MODEL_DECODE,
                d(r.decode_ms as f64 / 1e3),
            ),
            kv(sc::latency::E2E, d(e2e)),
            kv(sc::gen_ai::USAGE_PROMPT_TOKENS, i(r.input_tokens)),
            kv(sc::gen_ai::USAGE_COMPLETION_TOKENS, i(r.output_tokens)),
        ],
        ..Default::default()
    }
}

/// Wraps spans in a request of one resource with `service.name`.
pub fn request(service: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv(sc::resource::SERVICE_NAME, s(service))],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Unix ns now, minus a minute (spans end in the past, as real ones do).
pub fn t0() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        - 60_000 * MS
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// POSTs an OTLP/HTTP body; returns the status and body.
pub async fn post(addr: SocketAddr, content_type: &str, body: Vec<u8>) -> (u16, Bytes) {
    post_with(addr, &[("content-type", content_type)], body).await
}

/// POSTs an OTLP/HTTP body over a plain HTTP/1.1 connection and returns the answer's status,
/// also when the server answers before reading the whole body and closes (a refusal on the
/// declared length): a hyper client reports that as a broken pipe and drops the answer.
pub async fn post_answered_early(addr: SocketAddr, headers: &[(&str, &str)], body: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    // The server may stop reading (and close) before the end: what it answered still counts.
    let _ = stream.write_all(body).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"))
}

/// POSTs an OTLP/HTTP body with these headers; returns the status and body.
pub async fn post_with(addr: SocketAddr, headers: &[(&str, &str)], body: Vec<u8>) -> (u16, Bytes) {
    let mut req = http::Request::post(format!("http://{addr}/v1/traces"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(Bytes::from(body))).unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

pub async fn post_protobuf(addr: SocketAddr, req: &ExportTraceServiceRequest) -> u16 {
    post(addr, "application/x-protobuf", req.encode_to_vec())
        .await
        .0
}

pub async fn post_json(addr: SocketAddr, json: &str) -> u16 {
    post(addr, "application/json", json.as_bytes().to_vec())
        .await
        .0
}

/// Exports over OTLP/gRPC with the generated tonic client.
pub async fn export_grpc(addr: SocketAddr, req: ExportTraceServiceRequest) {
    let mut c = TraceServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    c.export(req).await.unwrap();
}

/// GETs a path; returns status and body text.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let req = http::Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

pub async fn get_json(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    let (status, body) = get(addr, path).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// Waits until `f` holds (polling every 20 ms), panicking after `timeout`.
pub async fn eventually(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of one metric line `name{labels} value` in a text exposition.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Sorted copy.
pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// Whether a sketch quantile `got` agrees with the exact `q` quantile of `values`: within 1%
/// of one of the two order statistics around rank q·(n−1) (rank conventions differ by one).
pub fn quantile_ok(values: &[f64], q: f64, got: f64) -> bool {
    let v = sorted(values);
    let r = q * (v.len() - 1) as f64;
    let (lo, hi) = (v[r.floor() as usize], v[r.ceil() as usize]);
    let near = |x: f64| (got - x).abs() <= 0.01 * x.abs() + 1e-9;
    near(lo) || near(hi) || (got >= lo * 0.99 && got <= hi * 1.01)
}
