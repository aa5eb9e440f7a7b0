//! `otlp-blast`: an OTLP load generator for receiver benchmarks.
//!
//! Pre-encodes export requests of realistic inference traces (a request span with 18 GenAI /
//! infer / HTTP attributes, and queue, prefill and decode child spans with a few each; ~276 bytes
//! per span on the wire), then sends them at full speed over N concurrent connections for D
//! seconds, one request in flight per connection (as an OTLP exporter does), over gRPC or
//! HTTP/protobuf, and prints the accepted spans per second. `--rate N` paces the sends to N
//! spans per second in all instead (open loop: a send that falls behind is not made up by a
//! burst), to measure the cost per span at a load the receiver sustains.
//!
//! ```text
//! otlp-blast [--protocol grpc|http] [--addr HOST:PORT] [--connections 16] [--duration 10]
//!            [--batch 1000] [--rate SPANS_PER_SEC] [--interleave] [--pd]
//!            [--grpc-content-length] [--decode-only] [--pipeline-only [--default-limits]]
//! ```
//!
//! Over gRPC a request carries no `Content-Length`, as tonic sends it (the Rust SDK's exporter:
//! its one message, then an empty frame that ends the stream); grpc-go (the Go SDK's and the
//! OpenTelemetry Collector's exporters) sends none either. `--grpc-content-length` declares the
//! length instead, as some exporters do (the Java SDK's OkHttp sender). Every run mixes a nonce
//! of its own into the trace ids, so a run repeated against the same collector sends new
//! traces, not late spans of the previous run's (`--pipeline-only` keeps its ids fixed, to stay
//! repeatable).
//!
//! `--interleave` orders each request's spans as an SDK's batch span processor exports them
//! for concurrent requests — by end time, so the spans of eight requests in flight together
//! alternate — instead of trace by trace (as infertrace's own layer exports them).
//!
//! `--pd` sends disaggregated traces instead, in the structure `infertrace demo --scenario pd`
//! emits: 17 spans across three services — the router's request span (role `router`) with
//! its `routing`, `queue`, `prefill` and `decode` spans; under it a prefill worker's request
//! span (role `prefill`) with `queue`, `prefill`, `decode`, `bootstrap` and `kv_transfer`;
//! under that a decode worker's (role `decode`) with `queue`, `prefill`, `decode`,
//! `decode_wait` and `first_token` — two prefill and two decode workers, each service its
//! own `ResourceSpans` in the body (one body carries what three exporters would send). The
//! collector assembles each into one disaggregated record.
//!
//! `--decode-only` sends nothing: it times decoding the generated requests in this process, with
//! prost into `opentelemetry-proto` types and with infertrace's lean decoder, for `--duration`
//! seconds each, and prints nanoseconds per span.
//!
//! `--pipeline-only` sends nothing either: it runs the collector's whole pipeline in this
//! process, on one thread, for `--duration` seconds — each body decoded and ingested as the
//! receivers do it, the pipeline ticked every 100 ms — against a simulated clock that advances
//! as if spans arrived at 1.5 million per second, so the grace period holds as many traces as
//! at that rate. It then completes every trace and prints the CPU nanoseconds per analysed span
//! (sockets and HTTP left out: the same for any receiver). Being one thread without a network,
//! it varies far less from run to run than the socket benchmark, which makes it the A/B
//! measure for changes to the pipeline's CPU cost. Also left out: the history store (not
//! attached here; on by default in `infertrace collect`). Counted in: copying each body to give
//! it fresh trace ids (~275 bytes a span, as a receiver copies a body off its socket). Analysed
//! spans are the requests recorded × the spans of a generated trace (4, or 17 with `--pd`).
//! Its limits are raised (16 GiB, 10M traces in flight) so that nothing is closed early;
//! `--default-limits` runs it at the collector's default limits instead (traces closed early
//! to make room, memory relief), to compare the two. With raised limits the heap grows for the
//! whole run, so the kernel's zeroing of fresh pages is counted too (on some VMs most of the
//! CPU); `--default-limits` reaches a steady working set within a second or two.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use infertrace_collector::limiter::span_footprint;
use infertrace_collector::otlp_decode::{decode_protobuf, decode_protobuf_for_forwarding};
use infertrace_semconv as sc;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use tokio::net::TcpStream;

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
/// Distinct pre-encoded requests cycled through (different trace ids).
const DISTINCT_REQUESTS: usize = 32;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Protocol {
    Grpc,
    Http,
}

struct Args {
    protocol: Protocol,
    addr: SocketAddr,
    connections: usize,
    duration: Duration,
    batch: usize,
    /// Spans per second over all connections; `None`: full speed.
    rate: Option<f64>,
    interleave: bool,
    /// Whether gRPC requests declare their length (real gRPC exporters do not).
    grpc_content_length: bool,
    /// Disaggregated 17-span traces across three services instead of 4-span ones.
    pd: bool,
    decode_only: bool,
    pipeline_only: bool,
    /// `--pipeline-only` at the collector's default limits instead of raised ones.
    default_limits: bool,
}

impl Args {
    /// Spans of one generated trace.
    fn spans_per_trace(&self) -> usize {
        if self.pd { PD_SPANS } else { 4 }
    }
}

/// `--help`.
const HELP: &str = "\
otlp-blast: sends pre-encoded OTLP export requests of 4-span inference traces (fresh trace ids
in every request) at full speed and prints the spans per second the receiver accepted.

usage: otlp-blast [OPTIONS]

  --protocol grpc|http   OTLP/gRPC or OTLP/HTTP protobuf (default grpc)
  --addr HOST:PORT       the receiver (default 127.0.0.1:4317 for grpc, :4318 for http)
  --connections N        concurrent connections, one request in flight each (default 16)
  --duration SECONDS     how long to send (default 10)
  --batch SPANS          spans per request (default 1000)
  --rate SPANS_PER_SEC   pace the sends to this rate in all instead of full speed
  --interleave           order each request's spans by end time, as an SDK's batch processor
                         exports concurrent requests, instead of trace by trace
  --pd                   send 17-span disaggregated traces (router, prefill and decode workers)
  --grpc-content-length  declare each gRPC request's length (Content-Length); by default none
                         is sent, as tonic's and grpc-go's exporters do
  --decode-only          send nothing: time prost and infertrace's lean decoder (without and
                         with the forwarding check) on the requests and print ns per span
  --pipeline-only        send nothing: run the collector's whole pipeline in this process on one
                         thread and print CPU nanoseconds per analysed span (raised limits)
  --default-limits       with --pipeline-only: the collector's default limits instead (a steady
                         working set; with raised limits the heap grows, and page faults count)
  -h, --help             this text

See docs/PERFORMANCE.md for how the benchmarks use it.
";

fn parse_args() -> Result<Args, String> {
    let mut protocol = Protocol::Grpc;
    let mut addr: Option<SocketAddr> = None;
    let mut connections = 16usize;
    let mut duration = 10.0f64;
    let mut batch = 1000usize;
    let mut decode_only = false;
    let mut pipeline_only = false;
    let mut default_limits = false;
    let mut interleave = false;
    let mut grpc_content_length = false;
    let mut pd = false;
    let mut rate: Option<f64> = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--protocol" => {
                protocol = match value()?.as_str() {
                    "grpc" => Protocol::Grpc,
                    "http" => Protocol::Http,
                    other => return Err(format!("--protocol must be grpc or http, not {other}")),
                }
            }
            "--addr" => {
                addr = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--addr: {e} (expected HOST:PORT)"))?,
                )
            }
            "--connections" => {
                connections = value()?
                    .parse()
                    .map_err(|e| format!("--connections: {e}"))?
            }
            "--duration" => {
                duration = value()?
                    .parse()
                    .map_err(|e| format!("--duration: {e} (seconds)"))?
            }
            "--batch" => batch = value()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--rate" => {
                let r: f64 = value()?
                    .parse()
                    .map_err(|e| format!("--rate: {e} (spans per second)"))?;
                if !(r.is_finite() && r > 0.0) {
                    return Err("--rate must be > 0".into());
                }
                rate = Some(r);
            }
            "--decode-only" => decode_only = true,
            "--pipeline-only" => pipeline_only = true,
            "--default-limits" => default_limits = true,
            "--interleave" => interleave = true,
            "--grpc-content-length" => grpc_content_length = true,
            "--pd" => pd = true,
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}; see --help")),
        }
    }
    let per_trace = if pd { PD_SPANS } else { 4 };
    if connections == 0 || batch < per_trace || duration.is_nan() || duration <= 0.0 {
        return Err(format!(
            "--connections must be > 0, --batch ≥ {per_trace} (one trace), --duration > 0"
        ));
    }
    let default_port = if protocol == Protocol::Grpc {
        4317
    } else {
        4318
    };
    Ok(Args {
        protocol,
        addr: addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], default_port))),
        connections,
        duration: Duration::from_secs_f64(duration),
        batch,
        rate,
        interleave,
        grpc_content_length,
        pd,
        decode_only,
        pipeline_only,
        default_limits,
    })
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        key_strindex: 0,
    }
}

fn s(v: &str) -> Value {
    Value::StringValue(v.into())
}

/// A small deterministic generator (xorshift): every run generates the same requests (the
/// trace ids then differ by the run's nonce, see [`Body::send`]).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One 4-span inference trace: request span + queue, prefill, decode.
fn inference_trace(rng: &mut Rng, start: u64) -> Vec<Span> {
    let mut trace_id = [0u8; 16];
    trace_id[..8].copy_from_slice(&rng.next().to_le_bytes());
    trace_id[8..].copy_from_slice(&rng.next().to_le_bytes());
    let root = rng.next().to_le_bytes().to_vec();
    let queue_ns = 1_000_000 + rng.below(50_000_000);
    let prefill_ns = 20_000_000 + rng.below(200_000_000);
    let output_tokens = 16 + rng.below(512);
    let decode_ns = output_tokens * (15_000_000 + rng.below(10_000_000));
    let e2e = queue_ns + prefill_ns + decode_ns;
    let secs = |ns: u64| Value::DoubleValue(ns as f64 / 1e9);
    let request = Span {
        trace_id: trace_id.to_vec(),
        span_id: root.clone(),
        name: "chat llama-3.1-8b".into(),
        kind: 2,
        start_time_unix_nano: start,
        end_time_unix_nano: start + e2e,
        attributes: vec![
            kv(sc::gen_ai::OPERATION_NAME, s("chat")),
            kv(sc::gen_ai::REQUEST_MODEL, s("llama-3.1-8b")),
            kv(sc::gen_ai::REQUEST_MAX_TOKENS, Value::IntValue(1024)),
            kv(sc::gen_ai::REQUEST_STREAM, Value::BoolValue(true)),
            kv(
                sc::gen_ai::RESPONSE_FINISH_REASONS,
                Value::ArrayValue(ArrayValue {
                    values: vec![AnyValue {
                        value: Some(s("stop")),
                    }],
                }),
            ),
            kv(
                sc::gen_ai::USAGE_INPUT_TOKENS,
                Value::IntValue(64 + rng.below(2000) as i64),
            ),
            kv(
                sc::gen_ai::USAGE_OUTPUT_TOKENS,
                Value::IntValue(output_tokens as i64),
            ),
            kv(sc::net::HTTP_REQUEST_METHOD, s("POST")),
            kv(sc::net::HTTP_ROUTE, s("/v1/chat/completions")),
            kv(sc::net::HTTP_RESPONSE_STATUS_CODE, Value::IntValue(200)),
            kv(sc::latency::TIME_IN_QUEUE, secs(queue_ns)),
            kv(
                sc::latency::TIME_TO_FIRST_TOKEN,
                secs(queue_ns + prefill_ns),
            ),
            kv(sc::latency::E2E, secs(e2e)),
            kv(
                sc::infer::TIME_PER_OUTPUT_TOKEN,
                secs(decode_ns / (output_tokens - 1)),
            ),
            kv(
                sc::infer::STREAM_CHUNKS,
                Value::IntValue(output_tokens as i64),
            ),
            kv(sc::infer::OUTCOME, s("ok")),
            kv(sc::infer::PHASE_SOURCE, s("engine")),
            kv(
                sc::infer::QUEUE_DEPTH,
                Value::IntValue(rng.below(64) as i64),
            ),
        ],
        status: Some(Status {
            message: String::new(),
            code: 1,
        }),
        ..Default::default()
    };
    let mut spans = vec![request];
    let mut at = start;
    for (name, dur) in [
        ("queue", queue_ns),
        ("prefill", prefill_ns),
        ("decode", decode_ns),
    ] {
        spans.push(Span {
            trace_id: trace_id.to_vec(),
            span_id: rng.next().to_le_bytes().to_vec(),
            parent_span_id: root.clone(),
            name: name.into(),
            kind: 1,
            start_time_unix_nano: at,
            end_time_unix_nano: at + dur,
            attributes: vec![
                kv(sc::infer::PHASE, s(name)),
                kv(
                    sc::gpu::UTILIZATION_MEAN,
                    Value::DoubleValue(rng.below(100) as f64 / 100.0),
                ),
            ],
            ..Default::default()
        });
        at += dur;
    }
    spans
}

/// Spans of one `--pd` trace.
const PD_SPANS: usize = 17;

/// The services of `--pd` traces: `[router, prefill workers…, decode workers…]`, each its own
/// resource in a body.
const PD_SERVICES: [&str; 5] = [
    "pd-router",
    "pd-prefill-0",
    "pd-prefill-1",
    "pd-decode-0",
    "pd-decode-1",
];

/// A child span `name` of `parent` from `start` to `end`, with `infer.phase` = `name` (and a
/// GPU utilisation, as the layer's engine phases carry with GPU telemetry, when `gpu`).
fn phase_span(
    rng: &mut Rng,
    trace_id: &[u8],
    parent: &[u8],
    name: &str,
    (start, end): (u64, u64),
    gpu: bool,
) -> Span {
    let mut attributes = vec![kv(sc::infer::PHASE, s(name))];
    if gpu {
        attributes.push(kv(
            sc::gpu::UTILIZATION_MEAN,
            Value::DoubleValue(rng.below(100) as f64 / 100.0),
        ));
    }
    Span {
        trace_id: trace_id.to_vec(),
        span_id: rng.next().to_le_bytes().to_vec(),
        parent_span_id: parent.to_vec(),
        name: name.into(),
        kind: 1,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes,
        ..Default::default()
    }
}

/// One role's request span (SERVER) of a `--pd` trace: what the layer writes on each service,
/// with `infer.disagg.role`.
#[allow(clippy::too_many_arguments)]
fn role_request_span(
    trace_id: &[u8],
    span_id: &[u8],
    parent: &[u8],
    role: &str,
    (start, end): (u64, u64),
    (queue, ttft): (u64, u64),
    (input_tokens, output_tokens): (u64, u64),
) -> Span {
    let secs = |ns: u64| Value::DoubleValue(ns as f64 / 1e9);
    let (operation, route) = match role {
        "router" => ("chat", "/v1/chat/completions"),
        "prefill" => ("generate_content", "/pd/prefill"),
        _ => ("generate_content", "/pd/decode"),
    };
    let e2e = end - start;
    let mut attributes = vec![
        kv(sc::gen_ai::OPERATION_NAME, s(operation)),
        kv(sc::gen_ai::REQUEST_MODEL, s("llama-3.1-8b")),
        kv(sc::gen_ai::REQUEST_STREAM, Value::BoolValue(true)),
        kv(
            sc::gen_ai::RESPONSE_FINISH_REASONS,
            Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(s("length")),
                }],
            }),
        ),
        kv(
            sc::gen_ai::USAGE_INPUT_TOKENS,
            Value::IntValue(input_tokens as i64),
        ),
        kv(
            sc::gen_ai::USAGE_OUTPUT_TOKENS,
            Value::IntValue(output_tokens as i64),
        ),
        kv(sc::net::HTTP_REQUEST_METHOD, s("POST")),
        kv(sc::net::HTTP_ROUTE, s(route)),
        kv(sc::net::HTTP_RESPONSE_STATUS_CODE, Value::IntValue(200)),
        kv(sc::latency::TIME_IN_QUEUE, secs(queue)),
        kv(sc::latency::TIME_TO_FIRST_TOKEN, secs(ttft)),
        kv(sc::latency::E2E, secs(e2e)),
        kv(
            sc::infer::STREAM_CHUNKS,
            Value::IntValue(output_tokens as i64 + 1),
        ),
        kv(sc::infer::OUTCOME, s("ok")),
        kv(sc::infer::PHASE_SOURCE, s("engine")),
        kv(sc::disagg::ROLE, s(role)),
    ];
    if output_tokens >= 2 {
        attributes.push(kv(
            sc::infer::TIME_PER_OUTPUT_TOKEN,
            secs((e2e - ttft) / (output_tokens - 1)),
        ));
    }
    Span {
        trace_id: trace_id.to_vec(),
        span_id: span_id.to_vec(),
        parent_span_id: parent.to_vec(),
        name: format!("{operation} llama-3.1-8b"),
        kind: 2,
        start_time_unix_nano: start,
        end_time_unix_nano: end,
        attributes,
        status: Some(Status {
            message: String::new(),
            code: 1,
        }),
        ..Default::default()
    }
}

/// One `--pd` trace (see the module docs), each span with the index of its service in
/// [`PD_SERVICES`]: the router's, then the prefill worker's, then the decode worker's.
fn pd_trace(rng: &mut Rng, start: u64, index: usize) -> Vec<(usize, Span)> {
    let mut trace_id = [0u8; 16];
    trace_id[..8].copy_from_slice(&rng.next().to_le_bytes());
    trace_id[8..].copy_from_slice(&rng.next().to_le_bytes());
    let ids: [Vec<u8>; 3] = std::array::from_fn(|_| rng.next().to_le_bytes().to_vec());
    let [router, prefill_req, decode_req] = &ids;
    let ms = |v: u64| v * 1_000_000;
    let hop = 300_000 + rng.below(400_000);
    let routing = 200_000 + rng.below(ms(2));
    let prefill_queue = rng.below(ms(2));
    let prefill = ms(10) + rng.below(ms(60));
    let bootstrap = ms(1) + rng.below(ms(3));
    let kv_transfer = ms(1) + rng.below(ms(8));
    let decode_wait = rng.below(ms(8));
    let first_token = ms(7) + rng.below(ms(2));
    let input_tokens = 64 + rng.below(2000);
    let output_tokens = 16 + rng.below(512);
    let decode = output_tokens * (ms(7) + rng.below(ms(2)));
    // Instants along the request (the router's arrival is `start`).
    let p0 = start + routing + hop; // the prefill worker's arrival
    let p_prefilled = p0 + prefill_queue + prefill;
    let kv_start = p_prefilled + bootstrap;
    let d0 = kv_start + kv_transfer + hop; // the decode worker's arrival
    let d_admitted = d0 + decode_wait;
    let d_first = d_admitted + first_token;
    let d_end = d_first + decode;
    let p_end = d_end + hop;
    let end = p_end + hop;
    let ttft = d_first + 2 * hop - start;
    let (pw, dw) = (1 + index % 2, 3 + index % 2);
    let mut out = Vec::with_capacity(PD_SPANS);
    let t = &trace_id[..];
    out.push((
        0,
        role_request_span(
            t,
            router,
            &[],
            "router",
            (start, end),
            (routing, ttft),
            (input_tokens, output_tokens),
        ),
    ));
    for (name, range) in [
        ("routing", (start, start + routing)),
        ("queue", (start, start + routing)),
        ("prefill", (start + routing, start + ttft)),
        ("decode", (start + ttft, end)),
    ] {
        out.push((0, phase_span(rng, t, router, name, range, false)));
    }
    out.push((
        pw,
        role_request_span(
            t,
            prefill_req,
            router,
            "prefill",
            (p0, p_end),
            (prefill_queue, prefill_queue + prefill),
            (input_tokens, 1),
        ),
    ));
    for (name, range, gpu) in [
        ("queue", (p0, p0 + prefill_queue), true),
        ("prefill", (p0 + prefill_queue, p_prefilled), true),
        ("decode", (p_prefilled, p_prefilled), true),
        ("bootstrap", (p_prefilled, kv_start), false),
        ("kv_transfer", (kv_start, kv_start + kv_transfer), false),
    ] {
        out.push((pw, phase_span(rng, t, prefill_req, name, range, gpu)));
    }
    out.push((
        dw,
        role_request_span(
            t,
            decode_req,
            prefill_req,
            "decode",
            (d0, d_end),
            (decode_wait, decode_wait + first_token),
            (input_tokens, output_tokens),
        ),
    ));
    for (name, range, gpu) in [
        ("queue", (d0, d_admitted), true),
        ("prefill", (d_admitted, d_first), true),
        ("decode", (d_first, d_end), true),
        ("decode_wait", (d0, d_admitted), false),
        ("first_token", (d_admitted, d_first), false),
    ] {
        out.push((dw, phase_span(rng, t, decode_req, name, range, gpu)));
    }
    debug_assert_eq!(out.len(), PD_SPANS);
    out
}

/// Requests in flight together when `--interleave` mixes their spans.
const CONCURRENT: usize = 8;

/// An export request of `batch` spans (rounded down to whole traces), trace by trace, or with
/// the spans of every `CONCURRENT` traces alternating (`interleave`); `pd` traces have one
/// `ResourceSpans` per service, each keeping that order among its spans.
fn export_request(
    rng: &mut Rng,
    batch: usize,
    interleave: bool,
    pd: bool,
) -> ExportTraceServiceRequest {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let traces: Vec<Vec<(usize, Span)>> = if pd {
        (0..batch / PD_SPANS)
            .map(|i| pd_trace(rng, now + i as u64 * 1_000_000, i))
            .collect()
    } else {
        (0..batch / 4)
            .map(|i| {
                inference_trace(rng, now + i as u64 * 1_000_000)
                    .into_iter()
                    .map(|s| (0, s))
                    .collect()
            })
            .collect()
    };
    let spans: Vec<(usize, Span)> = if interleave {
        // Per group of concurrent requests: every request's first span, then every second...
        traces
            .chunks(CONCURRENT)
            .flat_map(|group| {
                let longest = group.iter().map(Vec::len).max().unwrap_or(0);
                (0..longest).flat_map(move |k| group.iter().filter_map(move |t| t.get(k).cloned()))
            })
            .collect()
    } else {
        traces.into_iter().flatten().collect()
    };
    let services: &[&str] = if pd {
        &PD_SERVICES
    } else {
        &["inference-gateway"]
    };
    let mut per_service: Vec<Vec<Span>> = vec![Vec::new(); services.len()];
    for (service, span) in spans {
        per_service[service].push(span);
    }
    let resource_spans = services
        .iter()
        .zip(per_service)
        .filter(|(_, spans)| !spans.is_empty())
        .map(|(service, spans)| ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv(sc::resource::SERVICE_NAME, s(service)),
                    kv("service.version", s("1.4.2")),
                    kv("telemetry.sdk.language", s("rust")),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            schema_url: String::new(),
        })
        .collect();
    ExportTraceServiceRequest { resource_spans }
}

/// A pre-encoded request and where its trace ids are, so every send can carry fresh trace ids:
/// a collector that assembles traces must see new traces, not the same 8,000 again (those would
/// count as late spans and skip the analysis).
struct Body {
    bytes: Bytes,
    trace_id_offsets: Vec<usize>,
    /// This run's nonce, mixed into every stamp (see [`Body::send`]).
    run_nonce: u64,
}

impl Body {
    fn new(bytes: Bytes, run_nonce: u64) -> Self {
        // Every span starts with field 1 (trace_id, 16 bytes): tag 0x0a, length 0x10. A span's
        // trace id is random, so matching the tag, the length and the id of the first span of
        // its trace finds exactly the trace-id fields.
        let mut trace_id_offsets = Vec::new();
        let mut i = 0;
        while i + 18 <= bytes.len() {
            if bytes[i] == 0x0a && bytes[i + 1] == 0x10 && is_span_start(&bytes, i) {
                trace_id_offsets.push(i + 2);
                i += 18;
            } else {
                i += 1;
            }
        }
        Self {
            bytes,
            trace_id_offsets,
            run_nonce,
        }
    }

    /// The body with the last 8 bytes of every trace id replaced by a per-send counter, mixed
    /// with the run's nonce (a one-to-one change: ids stay distinct within the run and differ
    /// from another run's).
    fn send(&self, connection: usize, sequence: usize) -> Bytes {
        let mut out = self.bytes.to_vec();
        let stamp = (((connection as u64) << 40 | sequence as u64) ^ self.run_nonce).to_le_bytes();
        for &at in &self.trace_id_offsets {
            out[at + 8..at + 16].copy_from_slice(&stamp);
        }
        Bytes::from(out)
    }
}

/// Whether the bytes at `i` (tag 0x0a, length 16) are followed by a span id field (tag 0x12,
/// length 8), i.e. this is a span's trace_id and not some other 16-byte field.
fn is_span_start(bytes: &[u8], i: usize) -> bool {
    bytes.get(i + 18) == Some(&0x12) && bytes.get(i + 19) == Some(&0x08)
}

/// A number that differs from run to run: the clock's nanoseconds, spread over 64 bits.
fn run_nonce() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Rng(nanos | 1).next()
}

fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// How a connection sends.
#[derive(Clone, Copy)]
struct Sending {
    protocol: Protocol,
    /// Whether gRPC requests declare their length.
    grpc_content_length: bool,
    /// Time between two sends; `None`: full speed.
    pace: Option<Duration>,
}

/// A body of one chunk that does not declare its length, as a gRPC exporter's request body is:
/// the message, then (a stream not knowing it was its last) an empty frame ending the stream.
fn undeclared_length(body: Bytes) -> BoxBody<Bytes, Infallible> {
    let frames = futures_util::stream::iter([Ok(Frame::data(body))]);
    StreamBody::new(frames).boxed()
}

/// Sends bodies over one connection until `deadline`; returns (accepted requests, errors).
async fn blast_connection(
    sending: Sending,
    addr: SocketAddr,
    bodies: Arc<Vec<Body>>,
    offset: usize,
    deadline: Instant,
    errors: Arc<AtomicU64>,
) -> Result<u64, String> {
    let Sending {
        protocol,
        grpc_content_length,
        pace,
    } = sending;
    let mut next = Instant::now();
    let mut wait = async move || {
        if let Some(p) = pace {
            next += p;
            let now = Instant::now();
            if next > now {
                tokio::time::sleep(next - now).await;
            } else {
                next = now; // behind: no burst to catch up
            }
        }
    };
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let io = TokioIo::new(stream);
    let mut ok = 0u64;
    match protocol {
        Protocol::Grpc => {
            let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(4 * 1024 * 1024)
                .initial_connection_window_size(8 * 1024 * 1024)
                .handshake(io)
                .await
                .map_err(|e| format!("HTTP/2 handshake with {addr} failed: {e}"))?;
            tokio::spawn(conn);
            let mut i = offset;
            while Instant::now() < deadline {
                wait().await;
                let body = bodies[i % bodies.len()].send(offset, i);
                let body = if grpc_content_length {
                    Full::new(body).boxed()
                } else {
                    undeclared_length(body)
                };
                let req = Request::post(format!("http://{addr}{EXPORT_PATH}"))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(body)
                    .map_err(|e| e.to_string())?;
                i += 1;
                let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
                let (parts, body) = response.into_parts();
                let collected = body.collect().await.map_err(|e| e.to_string())?;
                let status = collected
                    .trailers()
                    .and_then(|t| t.get("grpc-status"))
                    .or_else(|| parts.headers.get("grpc-status"))
                    .map(|v| v.as_bytes().to_vec());
                if parts.status == StatusCode::OK && status.as_deref() == Some(b"0") {
                    ok += 1;
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Protocol::Http => {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| format!("HTTP/1 handshake with {addr} failed: {e}"))?;
            tokio::spawn(conn);
            let mut i = offset;
            while Instant::now() < deadline {
                wait().await;
                let req = Request::post("/v1/traces")
                    .header("host", addr.to_string())
                    .header("content-type", "application/x-protobuf")
                    .body(Full::new(bodies[i % bodies.len()].send(offset, i)))
                    .map_err(|e| e.to_string())?;
                i += 1;
                let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
                let status = response.status();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?
                    .to_bytes();
                let rejected = ExportTraceServiceResponse::decode(body)
                    .ok()
                    .and_then(|r| r.partial_success)
                    .map_or(0, |p| p.rejected_spans);
                if status == StatusCode::OK && rejected == 0 {
                    ok += 1;
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    Ok(ok)
}

/// Times prost and the lean decoder on the same requests; prints ns per span for each.
fn decode_benchmark(requests: &[Vec<u8>], spans_per_request: u64, duration: Duration) {
    fn time(
        requests: &[Vec<u8>],
        duration: Duration,
        decode: impl Fn(&[u8]) -> usize,
    ) -> (u64, f64) {
        let started = Instant::now();
        let mut decoded = 0u64;
        let mut i = 0;
        while started.elapsed() < duration {
            decoded += decode(&requests[i % requests.len()]) as u64;
            i += 1;
        }
        (decoded, started.elapsed().as_secs_f64())
    }
    let (prost_spans, prost_secs) = time(requests, duration, |r| {
        ExportTraceServiceRequest::decode(r).map_or(0, |req| {
            req.resource_spans
                .iter()
                .flat_map(|rs| &rs.scope_spans)
                .map(|ss| ss.spans.len())
                .sum()
        })
    });
    let (lean_spans, lean_secs) = time(requests, duration, |r| {
        decode_protobuf(r).map_or(0, |d| d.spans.len())
    });
    let (forwarding_spans, forwarding_secs) = time(requests, duration, |r| {
        decode_protobuf_for_forwarding(r).map_or(0, |d| d.spans.len())
    });
    let prost_ns = prost_secs * 1e9 / prost_spans.max(1) as f64;
    let lean_ns = lean_secs * 1e9 / lean_spans.max(1) as f64;
    let forwarding_ns = forwarding_secs * 1e9 / forwarding_spans.max(1) as f64;
    println!(
        "decode batch_spans={spans_per_request} prost_ns_per_span={prost_ns:.0} \
         lean_ns_per_span={lean_ns:.0} speedup={:.2} \
         lean_forwarding_ns_per_span={forwarding_ns:.0}",
        prost_ns / lean_ns
    );
}

/// Simulated arrival rate of `--pipeline-only` (spans per second).
const PIPELINE_SIMULATED_RATE: f64 = 1.5e6;

/// CPU seconds this process has used (user + system).
fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Runs the pipeline in process (see the module docs) and prints CPU ns per analysed span.
fn pipeline_benchmark(
    bodies: &[Body],
    duration: Duration,
    spans_per_trace: usize,
    default_limits: bool,
) {
    use infertrace_collector::config::CollectorConfig;
    use infertrace_collector::ingest::{IngestBatch, IngestError};
    use infertrace_collector::internal_events::InternalEvents;
    use infertrace_collector::limiter::MemoryLimiter;
    use infertrace_collector::otlp_decode::take_fresh_text_bytes;
    use infertrace_collector::pipeline::{Pipeline, unix_nanos_now};
    use infertrace_collector::prom_export::PromMetrics;

    let mut config = CollectorConfig::default();
    if !default_limits {
        config.limits.max_traces_in_flight = 10_000_000;
        config.limits.memory_limit_bytes = 16 << 30;
    }
    let pipeline = Pipeline::new(
        &config,
        InternalEvents::default(),
        PromMetrics::default(),
        MemoryLimiter::with_thresholds(
            config.limits.memory_limit_bytes,
            config.limits.soft_limit_percent,
            config.limits.relief_target_percent,
        ),
        None,
    );
    let (start, start_unix) = (Instant::now(), unix_nanos_now());
    let at = |sim: Duration| (start + sim, start_unix + sim.as_nanos() as u64);
    let tick_every = Duration::from_millis(100);
    let cpu0 = process_cpu_secs();
    let (mut sim, mut next_tick) = (Duration::ZERO, tick_every);
    let (mut sent, mut requests, mut i, mut refused) = (0u64, 0usize, 0usize, 0u64);
    while start.elapsed() < duration {
        let body = bodies[i % bodies.len()].send(0xabc, i);
        i += 1;
        let decoded = match decode_protobuf(&body) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("otlp-blast: a generated request does not decode: {e}");
                return;
            }
        };
        let spans = decoded.spans.len() as u64;
        let batch = IngestBatch {
            spans: decoded.spans,
            raw_protobuf: Some(body),
            span_ranges: decoded.span_ranges,
            raw_json: None,
            text_bytes: take_fresh_text_bytes(),
            rejected: decoded.rejected,
            rejected_ranges: decoded.rejected_ranges,
            hold: None,
        };
        let (now, _) = at(sim);
        match pipeline.ingest_at(batch, now) {
            Ok(_) => {}
            // Memory full (default limits): a tick's time passes and the tick releases what was
            // closed early, as the collector's own would before the sender retries.
            Err(IngestError::Overloaded { .. }) => {
                refused += 1;
                sim += tick_every;
                let (now, unix) = at(sim);
                requests += pipeline.tick_at(now, unix).requests;
                next_tick = sim + tick_every;
                continue;
            }
            Err(e) => {
                eprintln!("otlp-blast: the pipeline refused a batch: {e}");
                return;
            }
        }
        sent += spans;
        sim += Duration::from_secs_f64(spans as f64 / PIPELINE_SIMULATED_RATE);
        if sim >= next_tick {
            let (now, unix) = at(sim);
            requests += pipeline.tick_at(now, unix).requests;
            next_tick += tick_every;
        }
    }
    // Everything completes: the grace and the idle timeout pass.
    let (now, unix) = at(sim + Duration::from_secs(3600));
    requests += pipeline.tick_at(now, unix).requests;
    let cpu = process_cpu_secs() - cpu0;
    let analysed = (requests * spans_per_trace) as u64;
    println!(
        "pipeline sent_spans={sent} analysed_spans={analysed} refused_requests={refused} \
         cpu_s={cpu:.2} cpu_ns_per_span={:.0} simulated_s={:.1}",
        cpu * 1e9 / analysed.max(1) as f64,
        sim.as_secs_f64()
    );
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("otlp-blast: {message}");
            return ExitCode::from(2);
        }
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let requests: Vec<Vec<u8>> = (0..DISTINCT_REQUESTS)
        .map(|_| export_request(&mut rng, args.batch, args.interleave, args.pd).encode_to_vec())
        .collect();
    let per_trace = args.spans_per_trace();
    let spans_per_request = (args.batch / per_trace * per_trace) as u64;
    let wire_bytes: usize = requests.iter().map(Vec::len).sum();
    let bytes_per_span = wire_bytes as f64 / (requests.len() as u64 * spans_per_request) as f64;
    // What one decoded request occupies in the collector (memory per buffered span).
    let footprint_per_span = match decode_protobuf(&requests[0]) {
        Ok(decoded) => {
            decoded.spans.iter().map(span_footprint).sum::<usize>() as f64
                / decoded.spans.len().max(1) as f64
        }
        Err(e) => {
            eprintln!("otlp-blast: the generated request does not decode: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.decode_only {
        decode_benchmark(&requests, spans_per_request, args.duration);
        return ExitCode::SUCCESS;
    }
    // The in-process pipeline benchmark is an A/B measure: the same ids run after run.
    let run_nonce = if args.pipeline_only { 0 } else { run_nonce() };
    let bodies: Arc<Vec<Body>> = Arc::new(
        requests
            .iter()
            .map(|r| {
                let bytes = match args.protocol {
                    Protocol::Grpc => grpc_frame(r),
                    Protocol::Http => Bytes::from(r.clone()),
                };
                Body::new(bytes, run_nonce)
            })
            .collect(),
    );
    if let Some(b) = bodies
        .iter()
        .find(|b| b.trace_id_offsets.len() as u64 != spans_per_request)
    {
        eprintln!(
            "otlp-blast: found {} trace ids in a request of {spans_per_request} spans",
            b.trace_id_offsets.len()
        );
        return ExitCode::FAILURE;
    }
    if args.pipeline_only {
        if args.protocol != Protocol::Http {
            eprintln!(
                "otlp-blast: --pipeline-only takes plain protobuf bodies: use --protocol http"
            );
            return ExitCode::from(2);
        }
        pipeline_benchmark(&bodies, args.duration, per_trace, args.default_limits);
        return ExitCode::SUCCESS;
    }
    let errors = Arc::new(AtomicU64::new(0));
    let pace = args
        .rate
        .map(|r| Duration::from_secs_f64(args.connections as f64 * spans_per_request as f64 / r));
    let started = Instant::now();
    let deadline = started + args.duration;
    let workers: Vec<_> = (0..args.connections)
        .map(|c| {
            tokio::spawn(blast_connection(
                Sending {
                    protocol: args.protocol,
                    grpc_content_length: args.grpc_content_length,
                    pace,
                },
                args.addr,
                bodies.clone(),
                c * 7,
                deadline,
                errors.clone(),
            ))
        })
        .collect();
    let mut accepted_requests = 0u64;
    for worker in workers {
        match worker.await {
            Ok(Ok(n)) => accepted_requests += n,
            Ok(Err(message)) => {
                eprintln!("otlp-blast: {message}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("otlp-blast: a connection task failed: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let spans = accepted_requests * spans_per_request;
    println!(
        "protocol={:?} connections={} seconds={:.2} batch_spans={} bytes_per_span={:.0} \
         decoded_bytes_per_span={:.0} requests={} errors={} accepted_spans={} \
         accepted_spans_per_sec={:.0}",
        args.protocol,
        args.connections,
        elapsed,
        spans_per_request,
        bytes_per_span,
        footprint_per_span,
        accepted_requests,
        errors.load(Ordering::Relaxed),
        spans,
        spans as f64 / elapsed
    );
    ExitCode::SUCCESS
}

/// mimalloc: the decoder and the pipeline allocate many small strings and vectors, which glibc's
/// malloc handles markedly slower (measured in docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use hyper::body::Body as _;

    use super::*;

    /// The trace id of every span of a protobuf body, by span id.
    fn trace_ids(body: &[u8]) -> HashMap<[u8; 8], [u8; 16]> {
        let decoded = decode_protobuf(body).expect("the generated body decodes");
        decoded
            .spans
            .iter()
            .map(|s| (s.span_id.0, s.trace_id.0))
            .collect()
    }

    #[test]
    fn every_send_carries_new_trace_ids_and_keeps_each_trace_whole() {
        let mut rng = Rng(7);
        let request = export_request(&mut rng, 40, false, false).encode_to_vec();
        let body = Body::new(Bytes::from(request.clone()), 0x1234_5678_9abc_def0);
        let first = trace_ids(&body.send(0, 0));
        let second = trace_ids(&body.send(0, 1));
        let other_run = trace_ids(&Body::new(Bytes::from(request), 42).send(0, 0));
        let distinct =
            |ids: &HashMap<[u8; 8], [u8; 16]>| ids.values().copied().collect::<HashSet<_>>();
        // 40 spans: 10 traces of 4, each span keeping its trace's one id.
        assert_eq!(first.len(), 40);
        assert_eq!(distinct(&first).len(), 10);
        for ids in [&second, &other_run] {
            // The same spans, grouped into the same traces, under ids seen in no other send.
            assert_eq!(ids.len(), 40);
            for (span, trace) in ids {
                let mut siblings = first.iter().filter(|(_, t)| *t == &first[span]);
                assert!(siblings.all(|(s, _)| ids[s] == *trace));
            }
            assert!(distinct(ids).is_disjoint(&distinct(&first)));
        }
    }

    #[tokio::test]
    async fn a_grpc_body_without_content_length_declares_no_size_and_ends_after_its_message() {
        let mut body = undeclared_length(Bytes::from_static(b"message"));
        // hyper sets a Content-Length only from an exact size hint.
        assert_eq!(body.size_hint().exact(), None);
        let first = body.frame().await.map(|f| f.map(|f| f.into_data().ok()));
        assert_eq!(first, Some(Ok(Some(Bytes::from_static(b"message")))));
        // Not known to be over after its message (as tonic's body): hyper ends the stream with
        // an empty frame once the next poll says so.
        assert!(!body.is_end_stream());
        assert!(body.frame().await.is_none());
    }
}
