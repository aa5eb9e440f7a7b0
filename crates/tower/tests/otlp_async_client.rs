//! `otlp::init` in an application whose own dependencies turn on opentelemetry-otlp's async
//! HTTP client and gzip (this crate's dev-dependencies do): the exporters pick that client
//! unless given one, and it panics on the export threads, where no Tokio runtime runs — no span
//! and no metric arrived, and `shutdown` failed (a review's finding). With
//! `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` the spans go through the exporter's own encoding.
//!
//! One test in this binary: it sets the environment before any other thread reads it.

mod support_otlp;

use std::io::Read as _;
use std::time::Duration;

use infertrace_tower::otlp::{self, OtlpConfig};
use support_otlp::{alone_with_env, contains, one_traced_request, receiver};

#[test]
fn http_export_with_the_async_client_built_and_gzip_reaches_the_receiver() {
    alone_with_env(("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"), async {
        let (addr, received) = receiver().await;
        let providers = otlp::init(
            OtlpConfig::http(format!("http://{addr}"))
                .service_name("svc-gzip")
                .metrics(true),
        )
        .unwrap();
        one_traced_request(&providers).await;
        let p = providers.clone();
        let shutdown = tokio::task::spawn_blocking(move || p.shutdown())
            .await
            .unwrap();
        assert!(shutdown.is_ok(), "{shutdown:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let got = received.lock().unwrap().clone();
        let body = |path: &str| -> Vec<u8> {
            let mut all = Vec::new();
            for (_, _, gz) in got.iter().filter(|(p, _, _)| p == path) {
                flate2::read::GzDecoder::new(&gz[..])
                    .read_to_end(&mut all)
                    .expect("a gzip body");
            }
            all
        };
        let traces = body("/v1/traces");
        for needle in [&b"svc-gzip"[..], b"chat m", b"prefill", b"infer.outcome"] {
            assert!(
                contains(&traces, needle),
                "{} missing from the trace export",
                String::from_utf8_lossy(needle)
            );
        }
        assert!(
            contains(&body("/v1/metrics"), b"gen_ai.server.request.duration"),
            "metrics export missing"
        );
    });
}
