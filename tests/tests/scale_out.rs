//! Proof of the scale-out story of docs/deploy.md, against a real Prometheus.
//!
//! Two collectors each receive the traces whose trace id hashes to them (as the OpenTelemetry
//! Collector's `loadbalancing` exporter with `routing_key: traceID` would send them); a third
//! receives every trace. Prometheus scrapes all three every second (job `split`: the two
//! shards; job `single`: the one that saw everything) and:
//! - `sum by (le, model) (<histogram>_bucket{job="split"})` equals the single collector's
//!   buckets for every classic histogram, and both equal the buckets computed here from the
//!   traces' known timings;
//! - requests, tokens and goodput counters add up the same way;
//! - the per-instance `infertrace_critical_path_seconds_total` add up to the single
//!   collector's, which equal the phase and own-time seconds computed here;
//! - every PromQL expression of otel-config/alerts.yml (loaded as Prometheus rules and also run
//!   as instant queries) and of the Grafana dashboard evaluates without error, and the
//!   dashboard's infertrace panels return data.
//!
//! A second test runs promtool / amtool on every Prometheus and Alertmanager file we ship and
//! parses the collector configs the compose files mount.
//!
//! Needs `/usr/bin/prometheus` (and promtool, amtool): skipped with a message when absent and
//! `CI` is unset; in CI (.ci/run installs them) a missing binary fails.

mod support_prom;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server::{self, RunningCollector};
use infertrace_semconv as sc;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, status,
};
use prost::Message;
use support_prom::{HttpClient, Prometheus, Sample, require_binary};

const SERVICE: &str = "scale-test-api";
const MODELS: [&str; 2] = ["llama-3.1-8b", "mistral-7b"];
const TRACES: usize = 240;
const MS: u64 = 1_000_000;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// The traffic: infertrace-dialect traces with known timings.

/// One request with exactly known phase timings (nanoseconds).
#[derive(Clone, Debug)]
struct RequestSpec {
    trace_id: [u8; 16],
    model: &'static str,
    error: bool,
    start: u64,
    queue: u64,
    prefill: u64,
    /// 0 for failed requests (no decode span).
    decode: u64,
    /// The request span's own time after the last phase (response framing, network).
    tail: u64,
    input_tokens: u64,
    output_tokens: u64,
}

impl RequestSpec {
    fn e2e(&self) -> u64 {
        self.queue + self.prefill + self.decode + self.tail
    }
    fn secs(ns: u64) -> f64 {
        ns as f64 / 1e9
    }
    /// Which of `n` collectors the load balancer sends this trace to.
    fn shard(&self, n: usize) -> usize {
        // FNV-1a over the trace id: any stable hash partitions traces the same way.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.trace_id {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h % n as u64) as usize
    }
}

/// A small deterministic generator (64-bit LCG, Knuth's constants).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 17
    }
    /// A duration of `lo..hi` whole milliseconds plus 0.3 ms, so no value lands on a bucket
    /// bound (every bound is a whole number of milliseconds, and so are sums of them).
    fn ms(&mut self, lo: u64, hi: u64) -> u64 {
        (lo + self.next() % (hi - lo)) * MS + 300_000
    }
}

fn requests() -> Vec<RequestSpec> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    let base = now - 90 * 1_000 * MS;
    let mut rng = Lcg(0x5eed);
    (0..TRACES)
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

fn kv_str(key: &str, v: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.to_owned())),
        }),
        ..Default::default()
    }
}

fn kv_int(key: &str, v: u64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(v as i64)),
        }),
        ..Default::default()
    }
}

fn span_id(trace: &RequestSpec, n: u8) -> Vec<u8> {
    let mut id = trace.trace_id[..8].to_vec();
    id[7] = id[7].wrapping_add(n);
    id[0] |= 1; // never all zero
    id
}

/// The request span: kind SERVER, infertrace's request attributes.
fn request_span(r: &RequestSpec) -> Span {
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
fn phase_spans(r: &RequestSpec) -> Vec<Span> {
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

fn export_request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv_str(sc::resource::SERVICE_NAME, SERVICE)],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "infertrace-tower".to_owned(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Sends `traces` to an OTLP/HTTP receiver the way an SDK's batch processor does: phase spans
/// (which end first) in one batch, the request spans in a later one, 40 traces per batch.
async fn send(http: &HttpClient, receiver: SocketAddr, traces: &[&RequestSpec]) {
    let url = format!("http://{receiver}/v1/traces");
    for chunk in traces.chunks(40) {
        let phases: Vec<Span> = chunk.iter().flat_map(|r| phase_spans(r)).collect();
        let reqs: Vec<Span> = chunk.iter().map(|r| request_span(r)).collect();
        for batch in [phases, reqs] {
            let body = export_request(batch).encode_to_vec();
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

// ---------------------------------------------------------------------------------------------
// Ground truth computed from the specs.

/// Cumulative bucket counts of one histogram by (model, le).
type Buckets = BTreeMap<(String, String), f64>;

/// Expected cumulative bucket counts of one histogram over `values` (model, seconds).
fn expected_buckets(values: impl Iterator<Item = (&'static str, f64)>, bounds: &[f64]) -> Buckets {
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
fn le_key(b: f64) -> String {
    if b.is_infinite() {
        "+Inf".to_owned()
    } else {
        format!("{b:.6}")
    }
}

fn by_model_le(samples: &[Sample]) -> Buckets {
    samples
        .iter()
        .map(|s| {
            let le = support_prom::parse_value(s.label("le")).expect("numeric le");
            ((s.label("model").to_owned(), le_key(le)), s.value)
        })
        .collect()
}

fn by_labels(samples: &[Sample], labels: &[&str]) -> BTreeMap<Vec<String>, f64> {
    samples
        .iter()
        .map(|s| {
            (
                labels.iter().map(|l| s.label(l).to_owned()).collect(),
                s.value,
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Collectors and Prometheus.

fn collector_config() -> CollectorConfig {
    let mut c = CollectorConfig::default();
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    c.receivers.otlp_grpc.enabled = false;
    c.receivers.otlp_grpc.endpoint = any;
    c.receivers.otlp_http.endpoint = any;
    c.api.listen = any;
    // Close traces soon after their request span arrives: the test does not wait 2 s per trace.
    c.assembly.grace = Duration::from_millis(100);
    c.assembly.tick = Duration::from_millis(20);
    c
}

async fn start_collector() -> RunningCollector {
    server::run(collector_config(), std::future::pending())
        .await
        .expect("collector starts")
}

fn prometheus_config(split: &[SocketAddr], single: SocketAddr) -> String {
    let targets = |addrs: &[SocketAddr]| {
        addrs
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
         rule_files:\n  - alerts.yml\n\
         scrape_configs:\n\
         \x20 - job_name: split\n    static_configs:\n      - targets: [{}]\n\
         \x20 - job_name: single\n    static_configs:\n      - targets: [{}]\n",
        targets(split),
        targets(&[single])
    )
}

/// Polls `expr` until it equals `want` (or panics after `timeout` with the last value).
async fn wait_for_value(prom: &Prometheus, expr: &str, want: f64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut last = Err(String::new());
    while Instant::now() < deadline {
        last = prom.query_sum(expr).await;
        if matches!(last, Ok(v) if v == want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!(
        "{expr} never reached {want}: last {last:?}\nprometheus log:\n{}",
        prom.log()
    );
}

/// Substitutes Grafana's variables for an instant query.
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "5m")
        .replace("${model}", ".*")
        .replace("$model", ".*")
        .replace("${instance}", ".*")
        .replace("$instance", ".*")
}

/// Every PromQL expression of the dashboard: panel targets and `label_values(metric, label)`
/// variable queries (as `count by (label) (metric)`). (title, expr, is a variable).
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<(String, String, bool)>) {
        if let Some(panels) = v["panels"].as_array() {
            for p in panels {
                let title = p["title"].as_str().unwrap_or("").to_owned();
                for t in p["targets"].as_array().into_iter().flatten() {
                    if let Some(e) = t["expr"].as_str() {
                        out.push((title.clone(), e.to_owned(), false));
                    }
                }
                walk(p, out);
            }
        }
    }
    walk(dashboard, &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] != "query" {
            continue;
        }
        let q = var["query"]["query"]
            .as_str()
            .or_else(|| var["query"].as_str())
            .unwrap_or("");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {} is not label_values(...): {q}", var["name"]));
        let (metric, label) = inner
            .rsplit_once(',')
            .unwrap_or_else(|| panic!("label_values without a metric: {q}"));
        out.push((
            format!("variable {}", var["name"]),
            format!("count by ({}) ({})", label.trim(), metric.trim()),
            true,
        ));
    }
    out
}

/// Whether a dashboard expression must return data after this test's traffic: it reads only
/// families every collector exposes once requests flowed (not GPU, alert, drop or forward
/// families, nor the middleware's own metrics, which this test does not produce).
fn must_have_data(expr: &str) -> bool {
    expr.contains("infertrace_")
        && ![
            "DCGM_",
            "hw_",
            "gen_ai_server_",
            "infer_server_",
            "infertrace_alerts_active",
            "infertrace_dropped_spans",
            "infertrace_exported_spans",
        ]
        .iter()
        .any(|f| expr.contains(f))
}

/// The shell command of docker/Dockerfile's HEALTHCHECK (the JSON exec form's last element).
fn dockerfile_healthcheck() -> String {
    let dockerfile =
        std::fs::read_to_string(repo_root().join("docker/Dockerfile")).expect("docker/Dockerfile");
    let start = dockerfile
        .find("\nHEALTHCHECK ")
        .expect("a HEALTHCHECK instruction");
    let cmd = &dockerfile[start..];
    let json = &cmd[cmd.find("CMD [").expect("exec-form CMD") + 4..];
    let json = &json[..=json.find(']').expect("closing ]")];
    let argv: Vec<String> = serde_json::from_str(json).expect("HEALTHCHECK CMD is a JSON array");
    assert_eq!(argv[..2], ["bash", "-c"], "{argv:?}");
    argv[2].clone()
}

/// Runs the healthcheck against `port` instead of 9464: `true` when it reports healthy.
fn healthcheck_passes(script: &str, port: u16) -> bool {
    assert!(script.contains("/9464"), "{script}");
    let script = script.replace("/9464", &format!("/{port}"));
    Command::new("bash")
        .args(["-c", &script])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("bash runs")
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_collectors_add_up_in_prometheus() {
    let Some(prom_bin) = require_binary(
        "PROMETHEUS_BIN",
        "prometheus",
        "sharded_collectors_add_up_in_prometheus",
    ) else {
        return;
    };
    let started = Instant::now();
    let root = repo_root();
    let alerts = std::fs::read_to_string(root.join("otel-config/alerts.yml")).expect("alerts.yml");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            root.join("otel-config/grafana/dashboards/llm-latency-breakdown.json"),
        )
        .expect("dashboard JSON"),
    )
    .expect("dashboard is JSON");

    // Three collectors: two shards and one that sees everything.
    let shards = [start_collector().await, start_collector().await];
    let single = start_collector().await;
    let shard_apis: Vec<SocketAddr> = shards.iter().map(|c| c.api_addr).collect();
    let prom = Prometheus::start(
        &prom_bin,
        &prometheus_config(&shard_apis, single.api_addr),
        &[("alerts.yml", &alerts)],
    )
    .await;

    // The traffic, split by trace id as the loadbalancing exporter would.
    let specs = requests();
    let http = HttpClient::default();
    let mut per_shard: [Vec<&RequestSpec>; 2] = [Vec::new(), Vec::new()];
    for r in &specs {
        per_shard[r.shard(2)].push(r);
    }
    assert!(
        per_shard.iter().all(|s| s.len() > TRACES / 4),
        "both shards get a fair share: {} / {}",
        per_shard[0].len(),
        per_shard[1].len()
    );
    for (collector, traces) in shards.iter().zip(&per_shard) {
        send(
            &http,
            collector.http_addr.expect("HTTP receiver on"),
            traces,
        )
        .await;
    }
    let all: Vec<&RequestSpec> = specs.iter().collect();
    send(&http, single.http_addr.expect("HTTP receiver on"), &all).await;

    // Wait until Prometheus has scraped every request from every collector.
    let n = TRACES as f64;
    let wait = Duration::from_secs(30);
    wait_for_value(
        &prom,
        r#"sum(infertrace_requests_total{job="split"})"#,
        n,
        wait,
    )
    .await;
    wait_for_value(
        &prom,
        r#"sum(infertrace_requests_total{job="single"})"#,
        n,
        wait,
    )
    .await;
    wait_for_value(
        &prom,
        r#"count(count by (instance) (infertrace_requests_total{job="split"}))"#,
        2.0,
        wait,
    )
    .await;

    // 1. Histograms: the shards' sum by (le, model) is the single collector's, exactly, and
    //    matches the buckets computed from the traces.
    let ok = || specs.iter().filter(|r| !r.error);
    let truth_e2e = expected_buckets(
        specs.iter().map(|r| (r.model, RequestSpec::secs(r.e2e()))),
        &sc::metric::REQUEST_DURATION_BUCKETS,
    );
    let truth_queue = expected_buckets(
        specs.iter().map(|r| (r.model, RequestSpec::secs(r.queue))),
        &sc::metric::PHASE_DURATION_BUCKETS,
    );
    let truth_decode = expected_buckets(
        ok().map(|r| (r.model, RequestSpec::secs(r.decode))),
        &sc::metric::PHASE_DURATION_BUCKETS,
    );
    let truth_ttft = expected_buckets(
        specs
            .iter()
            .map(|r| (r.model, RequestSpec::secs(r.queue + r.prefill))),
        &sc::metric::TTFT_BUCKETS,
    );
    let truth_prefill = expected_buckets(
        specs
            .iter()
            .map(|r| (r.model, RequestSpec::secs(r.prefill))),
        &sc::metric::PHASE_DURATION_BUCKETS,
    );
    // TPOT = decode / (output tokens - 1), the GenAI definition (no attribute on these spans).
    let truth_tpot = expected_buckets(
        ok().map(|r| {
            (
                r.model,
                RequestSpec::secs(r.decode) / (r.output_tokens - 1) as f64,
            )
        }),
        &sc::metric::TPOT_BUCKETS,
    );
    let families: [(&str, &Buckets); 6] = [
        ("infertrace_request_duration_seconds", &truth_e2e),
        ("infertrace_queue_duration_seconds", &truth_queue),
        ("infertrace_prefill_duration_seconds", &truth_prefill),
        ("infertrace_decode_duration_seconds", &truth_decode),
        ("infertrace_time_to_first_token_seconds", &truth_ttft),
        ("infertrace_time_per_output_token_seconds", &truth_tpot),
    ];
    for (family, truth) in families {
        let q = |job: &str| format!(r#"sum by (le, model) ({family}_bucket{{job="{job}"}})"#);
        let split = by_model_le(&prom.query(&q("split")).await.expect("split query"));
        let whole = by_model_le(&prom.query(&q("single")).await.expect("single query"));
        assert!(!split.is_empty(), "{family}: no buckets scraped");
        assert_eq!(
            split, whole,
            "{family}: sharded sum differs from the single collector"
        );
        assert_eq!(
            &split, truth,
            "{family}: buckets differ from the traces' timings"
        );
        // _sum and _count aggregate too (sums of floats: equal up to rounding).
        for part in ["sum", "count"] {
            let q = |job: &str| format!(r#"sum by (model) ({family}_{part}{{job="{job}"}})"#);
            let a = by_labels(&prom.query(&q("split")).await.expect("query"), &["model"]);
            let b = by_labels(&prom.query(&q("single")).await.expect("query"), &["model"]);
            assert_eq!(a.len(), b.len(), "{family}_{part}");
            for (k, v) in &a {
                let w = b[k];
                assert!(
                    (v - w).abs() <= 1e-9 * w.abs().max(1.0),
                    "{family}_{part} {k:?}: {v} vs {w}"
                );
            }
        }
    }
    // The e2e sum is the traces' total duration.
    let e2e_sum = prom
        .query_sum(r#"sum(infertrace_request_duration_seconds_sum{job="split"})"#)
        .await
        .expect("query");
    let truth_sum: f64 = specs.iter().map(|r| RequestSpec::secs(r.e2e())).sum();
    assert!(
        (e2e_sum - truth_sum).abs() < 1e-6,
        "e2e sum {e2e_sum} vs {truth_sum}"
    );

    // 2. Counters add up: requests by outcome, tokens by type, goodput.
    for (expr, labels) in [
        (
            "sum by (model, outcome) (infertrace_requests_total{job=\"JOB\"})",
            &["model", "outcome"][..],
        ),
        (
            "sum by (model, type) (infertrace_tokens_total{job=\"JOB\"})",
            &["model", "type"][..],
        ),
        (
            "sum by (model) (infertrace_goodput_requests_total{job=\"JOB\"})",
            &["model"][..],
        ),
    ] {
        let a = by_labels(
            &prom
                .query(&expr.replace("JOB", "split"))
                .await
                .expect("query"),
            labels,
        );
        let b = by_labels(
            &prom
                .query(&expr.replace("JOB", "single"))
                .await
                .expect("query"),
            labels,
        );
        assert_eq!(a, b, "{expr}");
    }
    let errors = specs.iter().filter(|r| r.error).count() as f64;
    let got_errors = prom
        .query_sum(r#"sum(infertrace_requests_total{job="split", outcome="error"})"#)
        .await
        .expect("query");
    assert_eq!(got_errors, errors, "error requests");
    let output_tokens: u64 = specs.iter().map(|r| r.output_tokens).sum();
    let got_output = prom
        .query_sum(r#"sum(infertrace_tokens_total{job="split", type="output"})"#)
        .await
        .expect("query");
    assert_eq!(got_output, output_tokens as f64, "output tokens");

    // 3. Critical-path seconds: per-instance counters add up to the single collector's, and
    //    to the phases' and the request span's own time.
    let cp = |job: &str| {
        format!(r#"sum by (service, span) (infertrace_critical_path_seconds_total{{job="{job}"}})"#)
    };
    let split_cp = by_labels(
        &prom.query(&cp("split")).await.expect("query"),
        &["service", "span"],
    );
    let single_cp = by_labels(
        &prom.query(&cp("single")).await.expect("query"),
        &["service", "span"],
    );
    let mut truth_cp: BTreeMap<Vec<String>, f64> = BTreeMap::new();
    for r in &specs {
        let own = format!("{} {}", sc::gen_ai::operation::CHAT, r.model);
        for (name, ns) in [
            (sc::span::QUEUE.to_owned(), r.queue),
            (sc::span::PREFILL.to_owned(), r.prefill),
            (sc::span::DECODE.to_owned(), r.decode),
            (own, r.tail),
        ] {
            if ns > 0 {
                *truth_cp.entry(vec![SERVICE.to_owned(), name]).or_default() +=
                    RequestSpec::secs(ns);
            }
        }
    }
    let close = |a: &BTreeMap<Vec<String>, f64>, b: &BTreeMap<Vec<String>, f64>| {
        a.len() == b.len()
            && a.iter().all(|(k, v)| {
                b.get(k)
                    .is_some_and(|w| (v - w).abs() <= 1e-6 * w.abs().max(1.0))
            })
    };
    assert!(
        close(&split_cp, &single_cp),
        "critical path: shards {split_cp:?}\nsingle {single_cp:?}"
    );
    assert!(
        close(&split_cp, &truth_cp),
        "critical path: shards {split_cp:?}\ntruth {truth_cp:?}"
    );

    // 4. Every alert rule evaluates in Prometheus without error, and runs as a query.
    let deadline = Instant::now() + Duration::from_secs(20);
    let rules = loop {
        let data = prom.api("rules").await.expect("rules API");
        let rules: Vec<serde_json::Value> = data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = !rules.is_empty()
            && rules.iter().all(|r| {
                r["lastEvaluation"]
                    .as_str()
                    .is_some_and(|t| !t.starts_with("0001-"))
            });
        if evaluated {
            break rules;
        }
        assert!(Instant::now() < deadline, "rules never evaluated: {data}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        rules.len(),
        alerts.matches("- alert:").count(),
        "every rule loaded"
    );
    for r in &rules {
        assert_eq!(
            r["health"], "ok",
            "rule {} failed: {}",
            r["name"], r["lastError"]
        );
        let q = r["query"].as_str().expect("rule query");
        prom.query(q)
            .await
            .unwrap_or_else(|e| panic!("rule {} query fails: {e}\n{q}", r["name"]));
    }

    // 5. Every dashboard expression runs; the infertrace panels show data (once every series
    //    has the two samples `rate` needs).
    wait_for_value(
        &prom,
        "min(count_over_time(infertrace_requests_total[1m])) >= bool 2",
        1.0,
        wait,
    )
    .await;
    let exprs = dashboard_exprs(&dashboard);
    assert!(
        exprs.len() > 20,
        "dashboard has its queries: {}",
        exprs.len()
    );
    let mut empty = Vec::new();
    for (title, expr, _) in &exprs {
        let q = grafana_to_promql(expr);
        assert!(!q.contains('$'), "{title}: unsubstituted variable in {q}");
        let result = prom
            .query(&q)
            .await
            .unwrap_or_else(|e| panic!("dashboard panel {title:?}: {e}\n{q}"));
        if must_have_data(&q) && result.is_empty() {
            empty.push(format!("{title}: {q}"));
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );

    // 6. The Docker image's healthcheck (bash /dev/tcp, no curl in the image) sees a healthy
    //    collector, and fails on a port where nothing listens.
    let script = dockerfile_healthcheck();
    assert!(
        healthcheck_passes(&script, single.api_addr.port()),
        "healthcheck on a live collector"
    );
    let (status, body) = http
        .get(&format!("http://{}/health", single.api_addr))
        .await
        .expect("GET /health");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        !healthcheck_passes(&script, support_prom::free_port()),
        "healthcheck on a closed port"
    );

    drop(prom);
    for c in shards {
        c.stop().await.expect("shard stops");
    }
    single.stop().await.expect("single stops");
    eprintln!(
        "scale-out proof took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// Static checks of the shipped deployment files.

fn run_tool(bin: &Path, args: &[&str], cwd: &Path) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {} failed:\n{}{}",
        bin.display(),
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn deployment_files_pass_promtool_and_amtool() {
    let test = "deployment_files_pass_promtool_and_amtool";
    let Some(promtool) = require_binary("PROMTOOL_BIN", "promtool", test) else {
        return;
    };
    let Some(amtool) = require_binary("AMTOOL_BIN", "amtool", test) else {
        return;
    };
    let root = repo_root();
    let otel = root.join("otel-config");
    run_tool(&promtool, &["check", "config", "prometheus.yml"], &otel);
    run_tool(&promtool, &["check", "rules", "alerts.yml"], &otel);
    run_tool(&promtool, &["test", "rules", "alerts.test.yml"], &otel);
    run_tool(&amtool, &["check-config", "alertmanager.yml"], &otel);
    // docker/prometheus.scale.yml is mounted next to alerts.yml in its container.
    let dir = support_prom::TempDir::new("promtool");
    std::fs::copy(
        root.join("docker/prometheus.scale.yml"),
        dir.path().join("prometheus.yml"),
    )
    .expect("copy prometheus.scale.yml");
    std::fs::copy(otel.join("alerts.yml"), dir.path().join("alerts.yml")).expect("copy alerts.yml");
    run_tool(
        &promtool,
        &["check", "config", "prometheus.yml"],
        dir.path(),
    );
}

#[test]
fn compose_collector_configs_are_valid() {
    let root = repo_root();
    for file in [
        "docker/infertrace.compose.yaml",
        "docker/infertrace.scale.yaml",
    ] {
        let cfg =
            CollectorConfig::from_file(&root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        // Inside a container every listener must be on all interfaces.
        assert!(cfg.api.listen.ip().is_unspecified(), "{file}: api.listen");
        assert!(
            cfg.receivers.otlp_grpc.endpoint.ip().is_unspecified(),
            "{file}: otlp_grpc"
        );
        assert!(
            cfg.receivers.otlp_http.endpoint.ip().is_unspecified(),
            "{file}: otlp_http"
        );
    }
    let scale =
        CollectorConfig::from_file(&root.join("docker/infertrace.scale.yaml")).expect("parses");
    assert_eq!(
        scale.forward.endpoint, None,
        "replicas behind otelcol do not forward (otelcol fans out)"
    );
}

#[test]
fn dashboard_and_shards_are_well_formed() {
    let root = repo_root();
    let text = std::fs::read_to_string(
        root.join("otel-config/grafana/dashboards/llm-latency-breakdown.json"),
    )
    .expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let vars: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        vars.contains(&"model") && vars.contains(&"instance"),
        "{vars:?}"
    );
    let exprs = dashboard_exprs(&dashboard);
    // Percentiles aggregate classic histograms across collectors by (le, model).
    assert!(
        exprs
            .iter()
            .any(|(_, e, _)| e.contains("histogram_quantile(0.95, sum by (le, model)"))
    );
    for (title, e, var) in &exprs {
        if !var
            && e.contains("infertrace_")
            && !e.contains("critical_path")
            && !e.contains("receiver_spans")
            && !e.contains("dropped_spans")
            && !e.contains("traces_in_flight")
            && !e.contains("exported_spans")
            && !e.contains("alerts_active")
            && !e.contains("series_overflow")
            && !e.contains("late_spans")
        {
            assert!(
                e.contains("$model"),
                "{title}: request panels filter by $model: {e}"
            );
        }
        if !var && e.contains("infertrace_") {
            assert!(
                e.contains("$instance"),
                "{title}: collector panels filter by $instance: {e}"
            );
        }
    }
    // The shard function partitions: every trace goes to exactly one of n shards, all used.
    let specs = requests();
    for n in [2usize, 3] {
        let mut counts = vec![0usize; n];
        for r in &specs {
            counts[r.shard(n)] += 1;
        }
        assert!(counts.iter().all(|c| *c > 0), "{n} shards: {counts:?}");
        assert_eq!(counts.iter().sum::<usize>(), specs.len());
    }
}

fn yaml(path: &str) -> serde_yaml_ng::Value {
    let text =
        std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

fn strings(v: &serde_yaml_ng::Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The files of otel-config/ and docker/ name each other (hosts, ports, paths, anchors): check
/// that they agree, since no Docker engine, Grafana, Jaeger, Tempo or otelcol runs here.
#[test]
fn deployment_files_agree_with_each_other() {
    let root = repo_root();

    // The load balancer shards by trace id over exactly the compose replicas, on their gRPC
    // port, and fans the traces out to Jaeger; every pipeline component is defined.
    let otelcol = yaml("otel-config/otelcol-contrib.yaml");
    let lb = &otelcol["exporters"]["loadbalancing/infertrace"];
    assert_eq!(lb["routing_key"].as_str(), Some("traceID"));
    let backends = strings(&lb["resolver"]["static"]["hostnames"]);
    assert_eq!(
        backends,
        [
            "infertrace-1:4317",
            "infertrace-2:4317",
            "infertrace-3:4317"
        ]
    );
    for (kind, pipeline) in otelcol["service"]["pipelines"]
        .as_mapping()
        .expect("pipelines")
    {
        for section in ["receivers", "processors", "exporters"] {
            for name in strings(&pipeline[section]) {
                assert!(
                    otelcol[section].get(name.as_str()).is_some(),
                    "pipeline {kind:?} uses undefined {section} {name}"
                );
            }
        }
    }
    let traces_out = strings(&otelcol["service"]["pipelines"]["traces"]["exporters"]);
    assert!(
        traces_out.contains(&"loadbalancing/infertrace".to_owned())
            && traces_out.contains(&"otlp/jaeger".to_owned())
    );
    assert_eq!(
        otelcol["exporters"]["otlp/jaeger"]["endpoint"].as_str(),
        Some("jaeger:4317")
    );

    // compose.scale.yaml runs those replicas and Prometheus scrapes each one's API.
    let scale = yaml("docker/compose.scale.yaml");
    let mut scrape: Vec<String> = Vec::new();
    let prom_scale = yaml("docker/prometheus.scale.yml");
    for job in prom_scale["scrape_configs"]
        .as_sequence()
        .expect("scrape_configs")
    {
        if job["job_name"].as_str() == Some("infertrace") {
            for sc in job["static_configs"].as_sequence().expect("static_configs") {
                scrape.extend(strings(&sc["targets"]));
            }
        }
    }
    for backend in &backends {
        let host = backend.split(':').next().expect("host");
        assert!(
            !scale["services"][host].is_null(),
            "compose.scale.yaml has no service {host}"
        );
        assert!(
            scrape.contains(&format!("{host}:9464")),
            "prometheus.scale.yml does not scrape {host}"
        );
    }
    assert!(!scale["services"]["otelcol"].is_null() && !scale["services"]["jaeger"].is_null());

    // Jaeger listens where infertrace forwards in compose.yaml.
    let jaeger = yaml("otel-config/jaeger.yaml");
    assert_eq!(
        jaeger["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].as_str(),
        Some("0.0.0.0:4317")
    );
    let single =
        CollectorConfig::from_file(&root.join("docker/infertrace.compose.yaml")).expect("parses");
    assert_eq!(
        single.forward.endpoint.as_deref(),
        Some("http://jaeger:4317")
    );
    let tempo = yaml("otel-config/tempo.yaml");
    assert!(
        !tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"].is_null(),
        "tempo OTLP gRPC"
    );

    // Every file a compose file mounts exists, and Grafana's provider reads the mounted folder.
    let compose = yaml("docker/compose.yaml");
    for file in [&compose, &scale] {
        for (name, service) in file["services"].as_mapping().expect("services") {
            for volume in strings(&service["volumes"]) {
                let source = volume.split(':').next().expect("source");
                if source.starts_with('.') {
                    let path = root.join("docker").join(source);
                    assert!(path.exists(), "{name:?} mounts missing {}", path.display());
                }
            }
        }
    }
    let provider = yaml("otel-config/grafana/provisioning/dashboards/infertrace.yaml");
    let dash_dir = provider["providers"][0]["options"]["path"]
        .as_str()
        .expect("provider path");
    let grafana_mounts = strings(&compose["services"]["grafana"]["volumes"]);
    assert!(
        grafana_mounts
            .iter()
            .any(|v| v.ends_with(&format!("{dash_dir}:ro"))),
        "grafana does not mount the dashboards at {dash_dir}: {grafana_mounts:?}"
    );
    let datasources = yaml("otel-config/grafana/provisioning/datasources/prometheus.yaml");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            root.join("otel-config/grafana/dashboards/llm-latency-breakdown.json"),
        )
        .expect("dashboard"),
    )
    .expect("JSON");
    let default_ds = dashboard["templating"]["list"][0]["current"]["value"]
        .as_str()
        .expect("datasource var");
    assert_eq!(
        datasources["datasources"][0]["uid"].as_str(),
        Some(default_ds)
    );

    // Every alert has for, severity, summary, description and a runbook that exists.
    let alerts = yaml("otel-config/alerts.yml");
    let deploy = std::fs::read_to_string(root.join("docs/deploy.md")).expect("docs/deploy.md");
    let mut n = 0;
    for group in alerts["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("alerting rules only");
            n += 1;
            assert!(rule["for"].as_str().is_some(), "{name}: for");
            assert!(
                matches!(
                    rule["labels"]["severity"].as_str(),
                    Some("warning" | "critical")
                ),
                "{name}: severity"
            );
            for a in ["summary", "description", "runbook_url"] {
                assert!(
                    rule["annotations"][a]
                        .as_str()
                        .is_some_and(|s| !s.is_empty()),
                    "{name}: {a}"
                );
            }
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .expect("runbook_url");
            assert!(
                url.ends_with(&format!("docs/deploy.md#{}", name.to_lowercase())),
                "{name}: {url}"
            );
            assert!(
                deploy.contains(&format!("\n### {name}\n")),
                "docs/deploy.md has no runbook for {name}"
            );
        }
    }
    assert!(n >= 6, "{n} alerts");
}
