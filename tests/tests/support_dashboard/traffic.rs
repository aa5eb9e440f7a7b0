//! The dashboard test's traffic: infertrace-dialect traces (a SERVER request span with `queue`,
//! `prefill` and `decode` children carrying GPU window statistics) for two services and two
//! models, sent over OTLP/HTTP protobuf.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use infertrace_e2e::{export_request, kv_f64, kv_int, kv_str};
use infertrace_semconv as sc;
use opentelemetry_proto::tonic::trace::v1::{Span, Status, span, status};
use prost::Message;

use super::HttpClient;

/// Services, models and each model's latency scale (mistral is about 3× slower).
pub const SERVICES: [&str; 2] = ["chat-api", "batch-api"];
/// The models.
pub const MODELS: [(&str, u64); 2] = [("llama-3.1-8b", 1), ("mistral-7b", 3)];
const MS: u64 = 1_000_000;

/// One request with known timings (nanoseconds).
#[derive(Clone, Debug)]
pub struct Request {
    pub trace_id: [u8; 16],
    pub service: &'static str,
    pub model: &'static str,
    pub outcome: &'static str,
    pub start: u64,
    pub queue: u64,
    pub prefill: u64,
    /// 0 for failed requests (no decode span).
    pub decode: u64,
    pub output_tokens: u64,
}

impl Request {
    pub fn e2e(&self) -> u64 {
        self.queue + self.prefill + self.decode + MS
    }
    pub fn trace_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A deterministic generator (64-bit LCG, Knuth's constants).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 17
    }
    fn ms(&mut self, lo: u64, hi: u64) -> u64 {
        (lo + self.next() % (hi - lo)) * MS
    }
}

/// `n` requests that arrived over the last ~20 s, seeded by `seed`.
pub fn requests(n: usize, seed: u64) -> Vec<Request> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    let mut rng = Lcg(seed);
    (0..n)
        .map(|i| {
            let mut trace_id = [0u8; 16];
            for chunk in trace_id.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next().to_be_bytes());
            }
            let (model, scale) = MODELS[i % 2];
            let outcome = match i % 13 {
                5 => sc::infer::outcome::ERROR,
                9 => sc::infer::outcome::CANCELLED,
                _ => sc::infer::outcome::OK,
            };
            let failed = outcome == sc::infer::outcome::ERROR;
            // One slow outlier in 20 queues for long: the p99 phase share differs from all.
            let queue = if i % 20 == 7 {
                rng.ms(800, 1500) * scale
            } else {
                rng.ms(1, 60) * scale
            };
            let output_tokens = 20 + rng.next() % 200;
            Request {
                trace_id,
                service: SERVICES[(i / 2) % 2],
                model,
                outcome,
                start: now - 20_000 * MS + (i as u64 * 20_000 * MS) / n as u64,
                queue,
                prefill: rng.ms(20, 120) * scale,
                decode: if failed {
                    0
                } else {
                    output_tokens * rng.ms(8, 14) * scale
                },
                output_tokens: if failed { 0 } else { output_tokens },
            }
        })
        .collect()
}

fn span_id(r: &Request, n: u8) -> Vec<u8> {
    let mut id = r.trace_id[..8].to_vec();
    id[7] = id[7].wrapping_add(n);
    id[0] |= 1;
    id
}

fn request_span(r: &Request) -> Span {
    let mut attributes = vec![
        kv_str(sc::gen_ai::OPERATION_NAME, sc::gen_ai::operation::CHAT),
        kv_str(sc::gen_ai::REQUEST_MODEL, r.model),
        kv_str(sc::gen_ai::RESPONSE_MODEL, r.model),
        kv_int(sc::gen_ai::USAGE_INPUT_TOKENS, 200),
        kv_str(sc::infer::PHASE_SOURCE, sc::infer::phase_source::ENGINE),
        kv_str(sc::infer::OUTCOME, r.outcome),
        kv_str(sc::net::HTTP_REQUEST_METHOD, "POST"),
        kv_str(sc::net::HTTP_ROUTE, "/v1/chat/completions"),
    ];
    let status = if r.outcome == sc::infer::outcome::ERROR {
        attributes.push(kv_str(sc::net::ERROR_TYPE, "EngineError"));
        Status {
            code: status::StatusCode::Error as i32,
            message: "EngineError".to_owned(),
        }
    } else {
        attributes.push(kv_int(sc::gen_ai::USAGE_OUTPUT_TOKENS, r.output_tokens));
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

fn phase_spans(r: &Request) -> Vec<Span> {
    let mut at = r.start;
    let phases = [
        (sc::span::QUEUE, r.queue, None),
        (sc::span::PREFILL, r.prefill, Some((0.92, 610.0))),
        (sc::span::DECODE, r.decode, Some((0.55, 380.0))),
    ];
    let mut out = Vec::new();
    for (n, (name, d, gpu)) in phases.into_iter().enumerate() {
        if d == 0 {
            continue;
        }
        let mut attributes = vec![kv_str(sc::infer::PHASE, name)];
        if let Some((util, watts)) = gpu {
            let secs = d as f64 / 1e9;
            attributes.push(kv_f64(sc::gpu::UTILIZATION_MEAN, util));
            attributes.push(kv_f64(sc::gpu::POWER_MEAN, watts));
            attributes.push(kv_f64(sc::gpu::ENERGY, watts * secs));
            // Eight requests share the batch: an eighth of the device energy each.
            attributes.push(kv_f64(sc::gpu::ENERGY_ATTRIBUTED, watts * secs / 8.0));
        }
        out.push(Span {
            trace_id: r.trace_id.to_vec(),
            span_id: span_id(r, n as u8 + 1),
            parent_span_id: span_id(r, 0),
            name: name.to_owned(),
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: at,
            end_time_unix_nano: at + d,
            attributes,
            ..Default::default()
        });
        at += d;
    }
    out
}

/// Sends the requests to an OTLP/HTTP receiver, one batch per service.
pub async fn send(http: &HttpClient, receiver: SocketAddr, requests: &[Request]) {
    let url = format!("http://{receiver}/v1/traces");
    for service in SERVICES {
        let spans: Vec<Span> = requests
            .iter()
            .filter(|r| r.service == service)
            .flat_map(|r| {
                let mut s = phase_spans(r);
                s.push(request_span(r));
                s
            })
            .collect();
        let body = export_request(service, spans).encode_to_vec();
        let (status, resp) = http.post(&url, "application/x-protobuf", body).await;
        assert_eq!(
            status,
            200,
            "POST {url}: {}",
            String::from_utf8_lossy(&resp)
        );
    }
}
