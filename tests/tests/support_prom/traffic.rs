//! The scale-out test's traffic: infertrace-dialect traces (a SERVER request span with `queue`,
//! `prefill` and `decode` children, back to back) with exactly known timings, sent over
//! OTLP/HTTP protobuf as an SDK's batch processor would; and the ground truth computed from them
//! (histogram buckets, critical-path seconds), independently of the collector.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use infertrace_e2e::{export_request, kv_int, kv_str};
use infertrace_semconv as sc;
use opentelemetry_proto::tonic::trace::v1::{Span, Status, span, status};
use prost::Message;

use super::HttpClient;

/// `service.name` of every trace.
pub const SERVICE: &str = "scale-test-api";
/// The models, alternating.
pub const MODELS: [&str; 2] = ["llama-3.1-8b", "mistral-7b"];
/// Nanoseconds per millisecond.
pub const MS: u64 = 1_000_000;

/// One request with exactly known phase timings (nanoseconds).
#[derive(Clone, Debug)]
pub struct RequestSpec {
    pub trace_id: [u8; 16],
    pub model: &'static str,
    pub error: bool,
    pub start: u64,
    pub queue: u64,
    pub prefill: u64,
    /// 0 for failed requests (no decode span).
    pub decode: u64,
    /// The request span's own time after the last phase (response framing, network).
    pub tail: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl RequestSpec {
    pub fn e2e(&self) -> u64 {
        self.queue + self.prefill + self.decode + self.tail
    }
    pub fn secs(ns: u64) -> f64 {
        ns as f64 / 1e9
    }
    /// Which of `n` collectors the load balancer sends this trace to.
    pub fn shard(&self, n: usize) -> usize {
        // FNV-1a over the trace id: any stable hash partitions traces the same way.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.trace_id {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h % n as u64) as usize
    }
}

/// A small deterministic generator (64-bit LCG, Knuth's constants).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 17
    }
    /// A duration of `lo..hi` whole milliseconds plus 0.3 ms, so no value lands on a bucket
    /// bound (every bound is a whole number of milliseconds, and so are sums of them).
    pub fn ms(&mut self, lo: u64, hi: u64) -> u64 {
        (lo + self.next() % (hi - lo)) * MS + 300_000
    }
}

pub fn requests(n: usize) -> Vec<RequestSpec> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    let base = now - 90 * 1_000 * MS;
    let mut rng = Lcg(0x5eed);
    (0..n)
        .map(|i| {
            let mut trace_id = [0u8; 16];
            for chunk in trace_id.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next().to_be_bytes());
            }
            let error = i % 9 == 4;
            let output_tokens = 2 + rng.next() % 300;
            RequestSpec {
                trace_id,
                model: MODELS[i % 2],
                error,
                start: base + i as u64 * 150 * MS,
                queue: rng.ms(0, 900),
                prefill: rng.ms(5, 450),
                decode: if error { 0 } else { rng.ms(10, 3000) },
                tail: rng.ms(0, 6),
                input_tokens: 16 + rng.next() % 2000,
                output_tokens: if error { 0 } else { output_tokens },
            }
        })
        .collect()
}

fn span_id(trace: &RequestSpec, n: u8) -> Vec<u8> {
    let mut id = trace.trace_id[..8].to_vec();
    id[7] = id[7].wrapping_add(n);
    id[0] |= 1; // never all zero
    id
}

/// The request span: kind SERVER, infertrace's request attributes.
pub fn request_span(r: &RequestSpec) -> Span {
    let mut attributes = vec![
        kv_str(sc::gen_ai::OPERATION_NAME, sc::gen_ai::operation::CHAT),
        kv_str(sc::gen_ai::REQUEST_MODEL, r.model),
        kv_str(sc::gen_ai::RESPONSE_MODEL, r.model),
        kv_int(sc::gen_ai::USAGE_INPUT_TOKENS, r.input_tokens),
        kv_str(sc::infer::PHASE_SOURCE, sc::infer::phase_source::ENGINE),
        kv_str(sc::net::HTTP_REQUEST_METHOD, "POST"),
        kv_str(sc::net::HTTP_ROUTE, "/v1/chat/completions"),
    ];
    let status = if r.error {
        attributes.push(kv_str(sc::infer::OUTCOME, sc::infer::outcome::ERROR));
        attributes.push(kv_str(sc::net::ERROR_TYPE, "EngineError"));
        attributes.push(kv_int(sc::net::HTTP_RESPONSE_STATUS_CODE, 500));
        Status {
            code: status::StatusCode::Error as i32,
            message: "EngineError".to_owned(),
        }
    } else {
        attributes.push(kv_str(sc::infer::OUTCOME, sc::infer::outcome::OK));
        attributes.push(kv_int(sc::gen_ai::USAGE_OUTPUT_TOKENS, r.output_tokens));
        attributes.push(kv_int(sc::net::HTTP_RESPONSE_STATUS_CODE, 200));
        Status::default()
    };
    Span {
        trace_id: r.trace_id.to_vec(),
        span_id: span_id(r, 0),
        name: format!("{} {}", sc::gen_ai::operation::CHAT, r.model),
        kind: span::SpanKind::Server as i32,
        start_time_unix_nano: r.start,
        end_time_unix_nano: r.start + r.e2e(),
        attributes,
        status: Some(status),
        ..Default::default()
    }
}

/// The queue / prefill / decode children, back to back from the request's start.
pub fn phase_spans(r: &RequestSpec) -> Vec<Span> {
    let mut at = r.start;
    let phases = [
        (sc::span::QUEUE, r.queue),
        (sc::span::PREFILL, r.prefill),
        (sc::span::DECODE, r.decode),
    ];
    let mut out = Vec::new();
    for (n, (name, d)) in phases.into_iter().enumerate() {
        if d == 0 {
            continue;
        }
        out.push(Span {
            trace_id: r.trace_id.to_vec(),
            span_id: span_id(r, n as u8 + 1),
            parent_span_id: span_id(r, 0),
            name: name.to_owned(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: at,
            end_time_unix_nano: at + d,
            attributes: vec![kv_str(sc::infer::PHASE, name)],
            ..Default::default()
        });
        at += d;
    }
    out
}

/// Sends `traces` to an OTLP/HTTP receiver the way an SDK's batch processor does: phase spans
/// (which end first) in one batch, the request spans in a later one, 40 traces per batch.
pub async fn send(http: &HttpClient, receiver: SocketAddr, traces: &[&RequestSpec]) {
    let url = format!("http://{receiver}/v1/traces");
    for chunk in traces.chunks(40) {
        let phases: Vec<Span> = chunk.iter().flat_map(|r| phase_spans(r)).collect();
        let reqs: Vec<Span> = chunk.iter().map(|r| request_span(r)).collect();
        for batch in [phases, reqs] {
            let body = export_request(SERVICE, batch).encode_to_vec();
            let (status, resp) = http
                .post(&url, "application/x-protobuf", body)
                .await
                .unwrap_or_else(|e| panic!("POST {url}: {e}"));
            assert_eq!(
                status,
                200,
                "POST {url}: {}",
                String::from_utf8_lossy(&resp)
            );
        }
    }
}

/// Cumulative bucket counts of one histogram by (model, le).
pub type Buckets = BTreeMap<(String, String), f64>;

/// Expected cumulative bucket counts of one histogram over `values` (model, seconds).
pub fn expected_buckets(
    values: impl Iterator<Item = (&'static str, f64)>,
    bounds: &[f64],
) -> Buckets {
    let values: Vec<_> = values.collect();
    let mut out = BTreeMap::new();
    for model in MODELS {
        let mine: Vec<f64> = values
            .iter()
            .filter(|(m, _)| *m == model)
            .map(|(_, v)| *v)
            .collect();
        for &b in bounds.iter().chain([f64::INFINITY].iter()) {
            let n = mine.iter().filter(|v| **v <= b).count();
            out.insert((model.to_owned(), le_key(b)), n as f64);
        }
    }
    out
}

/// A canonical text for a bucket bound, whatever formatting the exposition used.
pub fn le_key(b: f64) -> String {
    if b.is_infinite() {
        "+Inf".to_owned()
    } else {
        format!("{b:.6}")
    }
}

/// The expected buckets of every collector histogram: (family, buckets by (model, le)).
pub fn expected_histograms(specs: &[RequestSpec]) -> Vec<(&'static str, Buckets)> {
    let all = || specs.iter();
    let ok = || specs.iter().filter(|r| !r.error);
    let secs = RequestSpec::secs;
    let phase = &sc::metric::PHASE_DURATION_BUCKETS;
    vec![
        (
            "infertrace_request_duration_seconds",
            expected_buckets(
                all().map(|r| (r.model, secs(r.e2e()))),
                &sc::metric::REQUEST_DURATION_BUCKETS,
            ),
        ),
        (
            "infertrace_queue_duration_seconds",
            expected_buckets(all().map(|r| (r.model, secs(r.queue))), phase),
        ),
        (
            "infertrace_prefill_duration_seconds",
            expected_buckets(all().map(|r| (r.model, secs(r.prefill))), phase),
        ),
        // Failed requests have no decode span, hence no decode or TPOT observation.
        (
            "infertrace_decode_duration_seconds",
            expected_buckets(ok().map(|r| (r.model, secs(r.decode))), phase),
        ),
        (
            "infertrace_time_to_first_token_seconds",
            expected_buckets(
                all().map(|r| (r.model, secs(r.queue + r.prefill))),
                &sc::metric::TTFT_BUCKETS,
            ),
        ),
        // TPOT = decode / (output tokens - 1), the GenAI definition (no attribute on the spans).
        (
            "infertrace_time_per_output_token_seconds",
            expected_buckets(
                ok().map(|r| (r.model, secs(r.decode) / (r.output_tokens - 1) as f64)),
                &sc::metric::TPOT_BUCKETS,
            ),
        ),
    ]
}

/// Expected critical-path seconds by [service, span name]: each phase owns its whole duration
/// (they are back to back, so "at or before" walks through all three) and the request span owns
/// its tail after the last phase.
pub fn expected_critical_path(specs: &[RequestSpec]) -> BTreeMap<Vec<String>, f64> {
    let mut truth: BTreeMap<Vec<String>, f64> = BTreeMap::new();
    for r in specs {
        let own = format!("{} {}", sc::gen_ai::operation::CHAT, r.model);
        for (name, ns) in [
            (sc::span::QUEUE.to_owned(), r.queue),
            (sc::span::PREFILL.to_owned(), r.prefill),
            (sc::span::DECODE.to_owned(), r.decode),
            (own, r.tail),
        ] {
            if ns > 0 {
                *truth.entry(vec![SERVICE.to_owned(), name]).or_default() += RequestSpec::secs(ns);
            }
        }
    }
    truth
}
