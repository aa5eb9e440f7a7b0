//! The README's setup exports the handlers' own `tracing` spans through tracing-opentelemetry.
//! The exporter's transport (tonic, h2, hyper) traces every gRPC export at DEBUG and TRACE:
//! without the README's `LevelFilter::INFO` on that layer, those spans are exported in turn,
//! making more at each export, for ever (a review counted 101, 187, 269… spans five seconds
//! apart after one request). One test in this binary: it installs the global subscriber.

mod support_otlp;

use std::time::Duration;

use infertrace_tower::otlp::{self, OtlpConfig};
use opentelemetry::trace::TracerProvider as _;
use support_otlp::{alone_with_env, contains, one_traced_request, receiver};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

#[test]
fn the_readme_subscriber_exports_no_span_of_the_exporters_transport() {
    alone_with_env(("OTEL_BSP_SCHEDULE_DELAY", "100"), async {
        let (addr, received) = receiver().await;
        let providers = otlp::init(
            OtlpConfig::grpc(format!("http://{addr}"))
                .service_name("svc-self")
                .metrics(false),
        )
        .unwrap();
        let tracer = providers.tracer_provider.tracer("svc-self");
        tracing_subscriber::registry()
            .with(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(LevelFilter::INFO),
            )
            .init();
        one_traced_request(&providers).await;
        // Several export periods: each export would trace the next one's spans.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let exports = received.lock().unwrap().len();
        let p = providers.clone();
        tokio::task::spawn_blocking(move || p.shutdown())
            .await
            .unwrap()
            .unwrap();
        let got = received.lock().unwrap().clone();
        let all: Vec<u8> = got.iter().flat_map(|(_, _, b)| b.to_vec()).collect();
        assert!(contains(&all, b"chat m"), "the request's spans arrived");
        for transport in [&b"poll_ready"[..], b"FramedWrite", b"hpack"] {
            assert!(
                !contains(&all, transport),
                "the transport's own span {} was exported",
                String::from_utf8_lossy(transport)
            );
        }
        assert!(exports <= 2, "{exports} exports after one request");
    });
}
