//! The collector fed by an independent client — the official OpenTelemetry Python SDK over OTLP
//! gRPC and HTTP — in each engine dialect with known timings: the KPIs, `/metrics` and a real
//! Prometheus' `histogram_quantile` agree with values computed here from the ground truth; over
//! TLS and mutual TLS; and with a request's parts exported seconds apart (the grace period
//! learned from them).

mod support_prom;
#[path = "../../crates/collector/tests/support_tls/mod.rs"]
mod support_tls;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use infertrace_collector::server::{self, RunningCollector};
use infertrace_semconv::metric::REQUEST_DURATION_BUCKETS;
use serde_json::Value;
use support_prom::python::{loopback_config, python_sdk, stored_trace};
use support_prom::{HttpClient, Prometheus, require_binary};

struct Sent {
    service: String,
    truth: Vec<Value>,
}

fn send(endpoint: &str, protocol: &str, dialect: &str, count: usize, error_every: usize) -> Sent {
    send_with_env(endpoint, protocol, dialect, count, error_every, &[])
}

/// [`send`] with extra environment variables for the SDK (e.g. its TLS certificate files).
fn send_with_env(
    endpoint: &str,
    protocol: &str,
    dialect: &str,
    count: usize,
    error_every: usize,
    env: &[(&str, &std::path::Path)],
) -> Sent {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/send_traces.py");
    let service = format!("py-{dialect}-{protocol}");
    let mut cmd = Command::new("python3");
    if !env.is_empty() {
        // requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the exporter's
        // certificate_file: without this, a machine that sets them distrusts the test CA.
        cmd.env_remove("REQUESTS_CA_BUNDLE")
            .env_remove("CURL_CA_BUNDLE");
    }
    let out = cmd
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .arg(script)
        .args([
            "--endpoint",
            endpoint,
            "--protocol",
            protocol,
            "--dialect",
            dialect,
        ])
        .args(["--count", &count.to_string(), "--service", &service])
        .args(["--error-every", &error_every.to_string()])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "send_traces.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
    assert_eq!(v["flushed"], true, "the SDK flushed every span");
    Sent {
        service,
        truth: v["requests"].as_array().expect("requests").clone(),
    }
}

/// The value at rank ⌊q·(n−1)⌋ of the sorted values: the KPI sketches' rank rule.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[((q * (v.len() - 1) as f64) as usize).min(v.len() - 1)]
}

/// Prometheus' `histogram_quantile` over classic buckets, computed independently.
fn prom_histogram_quantile(values: &[f64], bounds: &[f64], q: f64) -> f64 {
    let total = values.len() as f64;
    let rank = q * total;
    let mut below = 0.0;
    let mut lower = 0.0;
    for &upper in bounds {
        let in_bucket = values.iter().filter(|v| **v <= upper).count() as f64 - below;
        if below + in_bucket >= rank {
            return lower + (upper - lower) * (rank - below) / in_bucket;
        }
        below += in_bucket;
        lower = upper;
    }
    lower // above the last finite bound Prometheus returns the largest bound
}

fn series_of<'a>(kpis: &'a Value, service: &str) -> Option<&'a Value> {
    kpis["series"]
        .as_array()?
        .iter()
        .find(|s| s["service"] == service)
}

async fn wait_for(collector: &RunningCollector, service: &str, requests: u64) -> Value {
    let http = HttpClient::default();
    let url = format!("http://{}/api/kpis?window=1h", collector.api_addr);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http.get(&url).await.expect("GET /api/kpis");
        assert_eq!(status, 200);
        let kpis: Value = serde_json::from_slice(&body).expect("kpis JSON");
        if let Some(s) = series_of(&kpis, service)
            && s["requests"].as_u64() == Some(requests)
        {
            return s.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{service}: {requests} requests never arrived: {kpis}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn within(measured: &Value, truth: f64, what: &str) {
    let m = measured
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: no value"));
    // The sketch's relative error is 1%; times crossed the SDK as integer nanoseconds.
    assert!(
        (m - truth).abs() <= truth * 0.01 + 1e-6,
        "{what}: measured {m}, truth {truth}"
    );
}

/// `key` of every request, or of the successful ones only: the KPI percentiles, `max` and `mean`
/// count `ok` requests only (docs/kpis.md); token counts and the request-duration histogram count
/// every outcome.
fn column(truth: &[Value], key: &str, ok_only: bool) -> Vec<f64> {
    truth
        .iter()
        .filter(|r| !ok_only || r["error"] == false)
        .map(|r| r[key].as_f64().expect("number"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_dialects_give_the_true_kpis() {
    if !python_sdk() {
        return;
    }
    let mut config = loopback_config();
    config.assembly.grace = Duration::from_millis(200);
    let collector = server::run(config, std::future::pending())
        .await
        .expect("collector starts");
    let grpc = format!("http://{}", collector.grpc_addr.unwrap());
    let http = format!("http://{}", collector.http_addr.unwrap());

    // infertrace dialect over gRPC, every 5th request failing.
    let sent = send(&grpc, "grpc", "infertrace", 40, 5);
    let s = wait_for(&collector, &sent.service, 40).await;
    assert_eq!(s["errors"], 8, "{s}");
    assert_eq!(
        (s["model"].as_str(), s["operation"].as_str()),
        (Some("llama-3.1-8b"), Some("chat"))
    );
    for key in ["e2e", "queue", "prefill", "ttft", "decode", "tpot"] {
        // docs/kpis.md: "Latency percentiles count `ok` requests only".
        let ok = column(&sent.truth, key, true);
        for (q, name) in [(0.5, "p50"), (0.9, "p90")] {
            within(
                &s[key][name],
                quantile(&ok, q),
                &format!("{key}.{name} over ok requests"),
            );
        }
    }
    let input: f64 = column(&sent.truth, "input_tokens", false).iter().sum();
    assert_eq!(s["tokens"]["input"].as_f64(), Some(input), "{s}");

    // vLLM over HTTP: one span per request with gen_ai.latency.* attributes.
    let vllm = send(&http, "http", "vllm", 30, 0);
    let v = wait_for(&collector, &vllm.service, 30).await;
    for key in ["e2e", "queue", "ttft", "prefill", "decode"] {
        within(
            &v[key]["p50"],
            quantile(&column(&vllm.truth, key, true), 0.5),
            &format!("vllm {key}.p50"),
        );
    }
    within(
        &v["tpot"]["p90"],
        quantile(&column(&vllm.truth, "tpot", true), 0.9),
        "vllm tpot.p90",
    );

    // TGI over gRPC: Debug-formatted duration strings.
    let tgi = send(&grpc, "grpc", "tgi", 30, 0);
    let t = wait_for(&collector, &tgi.service, 30).await;
    within(
        &t["e2e"]["p50"],
        quantile(&column(&tgi.truth, "e2e", true), 0.5),
        "tgi e2e.p50",
    );
    within(
        &t["queue"]["p90"],
        quantile(&column(&tgi.truth, "queue", true), 0.9),
        "tgi queue.p90",
    );

    // Any other server span: e2e, rate and errors only.
    let generic = send(&http, "http", "generic", 20, 4);
    let g = wait_for(&collector, &generic.service, 20).await;
    assert_eq!(g["errors"], 5, "{g}");
    within(
        &g["e2e"]["max"],
        quantile(&column(&generic.truth, "e2e", true), 1.0),
        "generic e2e.max",
    );
    assert!(
        g["ttft"].is_null() || g["ttft"]["p50"].is_null(),
        "no TTFT without phases: {g}"
    );

    // /metrics carries the same counts.
    let client = HttpClient::default();
    let (_, body) = client
        .get(&format!("http://{}/metrics", collector.api_addr))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&body);
    let count: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("infertrace_requests_total{")
                && l.contains(&format!("service=\"{}\"", sent.service))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(count, 40.0, "requests_total of {}:\n{text}", sent.service);

    // A real Prometheus scrapes /metrics; histogram_quantile lands where the buckets say.
    let Some(bin) = require_binary(
        "PROMETHEUS_BIN",
        "prometheus",
        "python_sdk_dialects_give_the_true_kpis (Prometheus part)",
    ) else {
        return;
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: infertrace\n    static_configs:\n      - targets: ['{}']\n",
        collector.api_addr
    );
    let prom = Prometheus::start(&bin, &config, &[]).await;
    let e2e = column(&sent.truth, "e2e", false);
    let expr = format!(
        "histogram_quantile(0.9, sum by (le) (infertrace_request_duration_seconds_bucket{{service=\"{}\"}}))",
        sent.service
    );
    let want = prom_histogram_quantile(&e2e, &REQUEST_DURATION_BUCKETS, 0.9);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match prom.query(&expr).await {
            Ok(samples) if samples.len() == 1 && samples[0].value.is_finite() => {
                let got = samples[0].value;
                assert!(
                    (got - want).abs() < 1e-9,
                    "histogram_quantile gave {got}, buckets say {want}"
                );
                break;
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "Prometheus never answered {expr}: {other:?}\n{}",
                    prom.log()
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    collector.stop().await.expect("clean shutdown");
}

/// Waits until the collector has recorded `n` requests (the API is behind mutual TLS here).
async fn recorded(collector: &RunningCollector, n: u64) {
    let start = Instant::now();
    while collector.pipeline().requests_recorded() < n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{n} requests not recorded: {}",
            collector.pipeline().requests_recorded()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// curl over TLS trusting `ca`, optionally with a client certificate: `Some(body)` on success.
fn curl(
    curl_bin: &std::path::Path,
    url: &str,
    ca: &std::path::Path,
    client: Option<(&std::path::Path, &std::path::Path)>,
) -> Option<String> {
    let mut cmd = Command::new(curl_bin);
    cmd.args([
        "--silent",
        "--show-error",
        "--fail",
        "--max-time",
        "20",
        "--cacert",
    ])
    .arg(ca);
    if let Some((cert, key)) = client {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let out = cmd.arg(url).output().expect("run curl");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_and_curl_over_tls_and_mutual_tls() {
    if !python_sdk() {
        return;
    }
    let Some(curl_bin) = require_binary(
        "CURL",
        "curl",
        "python_sdk_and_curl_over_tls_and_mutual_tls",
    ) else {
        return;
    };
    let pki = support_tls::TestPki::generate();
    let mut config = loopback_config();
    config.assembly.grace = Duration::from_millis(200);
    // gRPC: mutual TLS; HTTP: TLS; API: mutual TLS.
    config.receivers.otlp_grpc.tls = Some(pki.server_tls(true));
    config.receivers.otlp_http.tls = Some(pki.server_tls(false));
    config.api.tls = Some(pki.server_tls(true));
    let collector = server::run(config, std::future::pending())
        .await
        .expect("collector starts");
    let grpc = format!("https://127.0.0.1:{}", collector.grpc_addr.unwrap().port());
    let http = format!("https://127.0.0.1:{}", collector.http_addr.unwrap().port());
    let api = format!("https://127.0.0.1:{}", collector.api_addr.port());

    // The SDK over gRPC with a client certificate (mutual TLS), and over HTTP with the CA only.
    let sent = send_with_env(
        &grpc,
        "grpc",
        "infertrace",
        20,
        0,
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &pki.ca),
            (
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                &pki.client_cert,
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", &pki.client_key),
        ],
    );
    assert_eq!(sent.truth.len(), 20);
    recorded(&collector, 20).await;
    let sent = send_with_env(
        &http,
        "http",
        "vllm",
        20,
        0,
        &[("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", &pki.ca)],
    );
    assert_eq!(sent.truth.len(), 20);
    recorded(&collector, 40).await;

    // curl: with a client certificate the API answers; without one, or over plain HTTP, not.
    let client = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    let health =
        curl(&curl_bin, &format!("{api}/health"), &pki.ca, client).expect("/health over mTLS");
    assert!(health.contains("ok"), "{health}");
    let metrics =
        curl(&curl_bin, &format!("{api}/metrics"), &pki.ca, client).expect("/metrics over mTLS");
    assert!(
        metrics.contains(
            "infertrace_receiver_spans_total{receiver=\"otlp_grpc\",outcome=\"accepted\"}"
        ),
        "{metrics}"
    );
    assert!(
        curl(&curl_bin, &format!("{api}/health"), &pki.ca, None).is_none(),
        "no client certificate: refused"
    );
    let other = Some((
        pki.other_client_cert.as_path(),
        pki.other_client_key.as_path(),
    ));
    assert!(
        curl(&curl_bin, &format!("{api}/health"), &pki.ca, other).is_none(),
        "another CA's certificate: refused"
    );
    // curl to the TLS-only OTLP/HTTP receiver, trusting the CA: answered (405 on GET).
    let out = Command::new("curl")
        .args([
            "--silent",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
        ])
        .arg(&pki.ca)
        .arg(format!("{http}/v1/traces"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "405");
    collector.stop().await.unwrap();
}

/// A request whose phase spans reach the collector seconds after its request span (exported
/// by the Python SDK as separate services would: the request span at once, its phases 4 s
/// later): at the default grace period (2 s) the first such trace is read without them — they
/// are late, shown in the stored trace — and the collector learns to wait that long; the next
/// trace alike, its phases 2.5 s after its request span, is read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_late_phase_spans_teach_the_grace_period() {
    if !python_sdk() {
        return;
    }
    let config = loopback_config();
    assert_eq!(config.assembly.grace, Duration::from_secs(2), "the default");
    let collector = server::run(config, std::future::pending())
        .await
        .expect("collector starts");
    let http = format!("http://{}", collector.http_addr.unwrap());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/send_split_trace.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .args(["--endpoint", &http, "--late", "4.0", "--late", "2.5"])
            .output()
            .expect("run python3")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "send_split_trace.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
    let ids: Vec<&str> = sent["trace_ids"]
        .as_array()
        .expect("trace ids")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(ids.len(), 2);
    let first = stored_trace(&collector, ids[0]).await;
    assert_eq!(first["late_spans"], 3, "{first}");
    assert!(
        first["requests"][0]["record"]["decode"].is_null(),
        "read without its late phases: {first}"
    );
    let second = stored_trace(&collector, ids[1]).await;
    assert_eq!(second["late_spans"], 0, "{second}");
    let decode = second["requests"][0]["record"]["decode"].as_f64();
    assert!(
        decode.is_some_and(|d| (d - 0.85).abs() < 1e-6),
        "read whole: {second}"
    );
    let (_, metrics) = HttpClient::default()
        .get(&format!("http://{}/metrics", collector.api_addr))
        .await
        .expect("GET /metrics");
    let metrics = String::from_utf8_lossy(&metrics);
    let grace: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("infertrace_assembly_grace_seconds "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the grace gauge");
    assert!((3.9..6.0).contains(&grace), "grace {grace}");
    collector.stop().await.expect("clean shutdown");
}
