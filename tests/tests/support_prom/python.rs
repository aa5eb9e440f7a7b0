//! What the tests fed by the OpenTelemetry Python SDK share: whether the SDK is there, a
//! collector on loopback ports, and a trace as the collector stored it.

use std::process::Command;
use std::time::{Duration, Instant};

use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server::RunningCollector;
use serde_json::Value;

use super::HttpClient;

/// The SDK and its gRPC and HTTP exporters are importable (installed by .ci/run from
/// tests/python/requirements.txt); without them a test skips, except in CI where it fails.
pub fn python_sdk() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.grpc, opentelemetry.exporter.otlp.proto.http"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "the OpenTelemetry Python SDK is missing in CI: pip install -r tests/python/requirements.txt"
        );
        eprintln!(
            "SKIPPED: the OpenTelemetry Python SDK is not installed (pip install -r tests/python/requirements.txt)"
        );
    }
    ok
}

/// The default configuration on free loopback ports, history in memory (no ./infertrace-data
/// left behind).
pub fn loopback_config() -> CollectorConfig {
    let mut config = CollectorConfig::default();
    config.store.enabled = false;
    config.receivers.otlp_grpc.endpoint = "127.0.0.1:0".parse().unwrap();
    config.receivers.otlp_http.endpoint = "127.0.0.1:0".parse().unwrap();
    config.api.listen = "127.0.0.1:0".parse().unwrap();
    config
}

/// The stored trace (`/api/traces/{trace_id}`) once the collector completed it.
pub async fn stored_trace(collector: &RunningCollector, trace_id: &str) -> Value {
    let http = HttpClient::default();
    let url = format!("http://{}/api/traces/{trace_id}", collector.api_addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http.get(&url).await.expect("GET /api/traces");
        if status == 200 {
            return serde_json::from_slice(&body).expect("trace JSON");
        }
        assert!(
            Instant::now() < deadline,
            "trace {trace_id} never completed: {status} {}",
            String::from_utf8_lossy(&body)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
