//! Faults a busy or hostile sender brings, against a real collector over loopback: whatever the
//! collector answered OK is analysed (never OK and then dropped), a full in-flight table and a
//! heavy tenant cost the others nothing, junk names cannot lock a real model out of the series
//! for long, and giant strings cannot make `/metrics` giant. (Memory probes live in
//! `memory_limit.rs`, a binary of their own, so that its peak RSS is theirs alone.)

mod support;

use std::time::Duration;

use infertrace_collector::server;
use prost::Message;
use support::*;

const WAIT: Duration = Duration::from_secs(30);

/// Total of `dropped_spans_total` over every reason, as /metrics says.
async fn dropped_total(c: &server::RunningCollector) -> f64 {
    let (_, text) = get(c.api_addr, "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with("infertrace_dropped_spans_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn requests_in(kpis: &serde_json::Value, service: &str) -> u64 {
    kpis["series"]
        .as_array()
        .map(|series| {
            series
                .iter()
                .filter(|s| s["service"] == service)
                .map(|s| s["requests"].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// A full in-flight table at the default settings but for its size: every trace answered OK is
/// analysed — the oldest traces are closed early to make room — and a light tenant sending
/// beside a heavy one keeps every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_table_closes_traces_early_and_drops_nothing_that_was_accepted() {
    let mut config = test_config();
    config.limits.max_traces_in_flight = 100;
    // A grace longer than the test: only early closing (or the final flush) can close traces.
    config.assembly.grace = Duration::from_secs(60);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let t0 = t0();
    let (mut heavy_sent, mut light_sent) = (0u64, 0u64);
    for batch in 0..20u32 {
        // 95 heavy traces and 5 light ones per request, interleaved by request.
        let heavy: Vec<_> = (0..95)
            .flat_map(|k| infertrace_spans(&Req::new(batch * 1000 + k, "m", 1, 2, 3), t0))
            .collect();
        let light: Vec<_> = (0..5)
            .flat_map(|k| infertrace_spans(&Req::new(batch * 1000 + 500 + k, "m", 1, 2, 3), t0))
            .collect();
        assert_eq!(post_protobuf(http, &request("heavy", heavy)).await, 200);
        assert_eq!(post_protobuf(http, &request("light", light)).await, 200);
        heavy_sent += 95;
        light_sent += 5;
    }
    // Everything past the table's 100 traces was closed early and is analysed by the ticks.
    eventually(WAIT, "early-closed traces analysed", || {
        c.pipeline().requests_recorded() >= heavy_sent + light_sent - 100
    })
    .await;
    assert!(c.events().closed_early("max_traces_in_flight") >= 1_900);
    assert_eq!(c.pipeline().traces_in_flight(), 100);
    assert_eq!(dropped_total(&c).await, 0.0);
    let report = c.stop().await.unwrap();
    assert_eq!(
        report.flushed.requests, 100,
        "the rest is flushed at shutdown"
    );
}

/// The same, read through the KPIs: the light tenant's requests are all counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_tenant_beside_a_heavy_one_loses_nothing() {
    let mut config = test_config();
    config.limits.max_traces_in_flight = 50;
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let t0 = t0();
    for batch in 0..10u32 {
        let heavy: Vec<_> = (0..200)
            .flat_map(|k| infertrace_spans(&Req::new(batch * 1000 + k, "m", 1, 2, 3), t0))
            .collect();
        let light = infertrace_spans(&Req::new(batch * 1000 + 900, "m", 1, 2, 3), t0);
        assert_eq!(post_protobuf(http, &request("heavy", heavy)).await, 200);
        assert_eq!(post_protobuf(http, &request("light", light)).await, 200);
    }
    eventually(WAIT, "every request analysed", || {
        c.pipeline().requests_recorded() == 2_010
    })
    .await;
    let kpis = serde_json::to_value(c.kpis(Duration::from_secs(60))).unwrap();
    assert_eq!(requests_in(&kpis, "light"), 10);
    assert_eq!(requests_in(&kpis, "heavy"), 2_000);
    assert_eq!(dropped_total(&c).await, 0.0);
    c.stop().await.unwrap();
}

/// Spans that only an accepted request can lose (`dropped_spans_total` also counts refusals).
async fn dropped_after_ok(c: &server::RunningCollector) -> f64 {
    let (_, text) = get(c.api_addr, "/metrics").await;
    [
        "max_spans_per_trace",
        "max_traces_in_flight",
        "late_span_buffer_full",
        "forward_queue_full",
    ]
    .iter()
    .filter_map(|r| {
        metric(
            &text,
            &format!("infertrace_dropped_spans_total{{reason=\"{r}\"}}"),
        )
    })
    .sum()
}

/// Posts `req` until it is accepted, as an OTLP exporter retries a 429; returns how many
/// times it was refused. Anything but 200 or 429 fails the test, and so does being refused
/// for longer than `WAIT`.
async fn post_until_accepted(
    http: std::net::SocketAddr,
    req: &opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
) -> u32 {
    let start = std::time::Instant::now();
    let mut refused = 0;
    loop {
        match post_protobuf(http, req).await {
            200 => return refused,
            429 if start.elapsed() < WAIT => refused += 1,
            status => panic!(
                "status {status} after {refused} refusals in {:?}",
                start.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Buffered traces fill the memory limit (a grace period longer than the test, no bound on
/// traces in flight that binds): past 3/4 of the limit ingest closes the oldest early and
/// wakes the tick, which releases them, so a heavy sender's buffered traces cannot lock a light
/// one out for the grace period — each request is accepted, at worst after a short retry —
/// and nothing accepted is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_traces_give_way_to_new_data_under_memory_pressure() {
    let mut config = test_config();
    config.assembly.grace = Duration::from_secs(600);
    config.limits.memory_limit_bytes = 4 << 20;
    // A trace index sized for 10,000 ids (256 KiB), not the default 100,000 (4 MiB: the limit).
    config.limits.max_traces_in_flight = 10_000;
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let t0 = t0();
    let (mut heavy_refused, mut light_refused) = (0, 0);
    for batch in 0..40u32 {
        let heavy: Vec<_> = (0..250)
            .flat_map(|k| infertrace_spans(&Req::new(batch * 1000 + k, "m", 1, 2, 3), t0))
            .collect();
        let light = infertrace_spans(&Req::new(batch * 1000 + 900, "m", 1, 2, 3), t0);
        heavy_refused += post_until_accepted(http, &request("heavy", heavy)).await;
        light_refused += post_until_accepted(http, &request("light", light)).await;
    }
    let closed = c.events().closed_early("memory");
    eprintln!(
        "40 × (250 heavy + 1 light) traces into 4 MiB: {closed} closed early for memory; \
         refused before acceptance: heavy {heavy_refused}, light {light_refused}"
    );
    assert!(closed > 0);
    let in_flight = c.pipeline().traces_in_flight() as u64;
    eventually(WAIT, "every trace closed early analysed", || {
        c.pipeline().requests_recorded() + in_flight >= 40 * 251
    })
    .await;
    assert_eq!(dropped_after_ok(&c).await, 0.0);
    let recorded = c.pipeline().requests_recorded();
    let report = c.stop().await.unwrap();
    assert_eq!(
        recorded + report.flushed.requests as u64,
        40 * 251,
        "analysed, then flushed at shutdown"
    );
}

/// 1,100 distinct junk model names fill the series cap; a real model arriving once the junk has
/// been idle for `series_reclaim_after` gets a series of its own in the KPIs and in /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_names_lock_a_real_model_out_only_for_the_reclaim_horizon() {
    let mut config = test_config();
    config.limits.series_reclaim_after = Duration::from_secs(1);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let t0 = t0();
    for chunk in 0..11u32 {
        let spans: Vec<_> = (0..100)
            .flat_map(|k| {
                let n = chunk * 100 + k;
                infertrace_spans(&Req::new(n, &format!("junk-{n}"), 1, 2, 3), t0)
            })
            .collect();
        assert_eq!(post_protobuf(http, &request("svc", spans)).await, 200);
    }
    eventually(WAIT, "junk analysed", || {
        c.pipeline().requests_recorded() == 1_100
    })
    .await;
    // Past the cap of 1,000: overflowed, or (on a slow machine) already reclaimed.
    assert!(c.events().series_overflow.get() + c.events().series_reclaimed.get() >= 100);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let real = infertrace_spans(&Req::new(5_000, "llama-3.1-8b", 1, 2, 3), t0);
    assert_eq!(post_protobuf(http, &request("svc", real)).await, 200);
    eventually(WAIT, "the real model analysed", || {
        c.pipeline().requests_recorded() == 1_101
    })
    .await;
    let kpis = c.kpis(Duration::from_secs(60));
    assert!(
        kpis.series.iter().any(|s| s.model == "llama-3.1-8b"),
        "the real model has its own series"
    );
    assert!(c.events().series_reclaimed.get() >= 1);
    let (_, metrics) = get(c.api_addr, "/metrics").await;
    assert!(
        metrics.contains(r#"model="llama-3.1-8b""#),
        "and its own Prometheus label set"
    );
    let label_sets = metrics
        .lines()
        .filter(|l| l.starts_with("infertrace_requests_total{"))
        .count();
    // Four outcomes a series, each created at 0 with it.
    assert!(
        label_sets <= 4 * 1_001,
        "{label_sets} label sets: the cap holds"
    );
    c.stop().await.unwrap();
}

/// Unique span names fill the critical-path windows' 256 keys; a new service arriving once the
/// junk has been idle for `series_reclaim_after` gets rows of its own in the critical-path
/// windows and in `critical_path_seconds_total` (before, it was `_overflow` for the life of the
/// process), and the cap holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_span_names_lock_a_new_service_out_of_the_critical_path_only_for_the_horizon() {
    let mut config = test_config();
    config.limits.series_reclaim_after = Duration::from_secs(1);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let t0 = t0();
    let spans: Vec<_> = (0..300u32)
        .flat_map(|n| {
            let mut spans = infertrace_spans(&Req::new(n, "m", 1, 2, 3), t0);
            for s in &mut spans[1..] {
                s.name = format!("{}-{n}", s.name);
            }
            spans
        })
        .collect();
    assert_eq!(post_protobuf(http, &request("svc", spans)).await, 200);
    eventually(WAIT, "junk analysed", || {
        c.pipeline().requests_recorded() == 300
    })
    .await;
    let window = Duration::from_secs(60);
    let overflow = |c: &server::RunningCollector| {
        c.pipeline()
            .critical_path(window)
            .entries
            .iter()
            .any(|e| &*e.service == "__overflow__")
    };
    assert!(overflow(&c), "past the cap of 256 keys");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let real = infertrace_spans(&Req::new(5_000, "m", 1, 2, 3), t0);
    assert_eq!(post_protobuf(http, &request("real-svc", real)).await, 200);
    eventually(WAIT, "the new service analysed", || {
        c.pipeline().requests_recorded() == 301
    })
    .await;
    let summary = c.pipeline().critical_path(window);
    assert!(
        summary.entries.iter().any(|e| &*e.service == "real-svc"),
        "the new service has critical-path rows of its own: {:?}",
        summary
            .entries
            .iter()
            .map(|e| (&*e.service, &*e.span))
            .collect::<Vec<_>>()
    );
    assert!(summary.entries.len() <= 257, "the cap holds");
    // The same rows, each a series of its own, on /metrics (the windows and the exporter fold
    // the same keys).
    let mut rows: Vec<String> = summary
        .entries
        .iter()
        .filter(|e| &*e.service == "real-svc")
        .map(|e| format!(r#"{{service="real-svc",span="{}"}}"#, e.span))
        .collect();
    rows.sort();
    let (_, metrics) = get(c.api_addr, "/metrics").await;
    let mut exported: Vec<String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("infertrace_critical_path_seconds_total"))
        .filter(|l| l.contains(r#"service="real-svc""#))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    exported.sort();
    assert!(!rows.is_empty());
    assert_eq!(exported, rows, "its own Prometheus series, one a row");
    let series = metrics
        .lines()
        .filter(|l| l.starts_with("infertrace_critical_path_seconds_total{"))
        .count();
    assert!(series <= 257, "{series} series: the cap holds");
    assert!(c.events().series_reclaimed.get() >= 1);
    c.stop().await.unwrap();
}

/// A 1 MiB model name and a 1 MiB span name are cut to 256 bytes: /metrics stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_giant_name_is_cut_and_metrics_stay_small() {
    let c = server::run(test_config(), std::future::pending())
        .await
        .unwrap();
    let http = c.http_addr.unwrap();
    let giant = "m".repeat(1024 * 1024);
    let mut spans = infertrace_spans(&Req::new(1, &giant, 1, 2, 3), t0());
    spans[3].name = "n".repeat(1024 * 1024);
    let body = request(&"s".repeat(1024 * 1024), spans).encode_to_vec();
    assert!(body.len() > 3 * 1024 * 1024);
    let (status, _) = post(http, "application/x-protobuf", body).await;
    assert_eq!(status, 200);
    eventually(WAIT, "request analysed", || {
        c.pipeline().requests_recorded() == 1
    })
    .await;
    let (_, metrics) = get(c.api_addr, "/metrics").await;
    eprintln!(
        "/metrics after a 1 MiB model, span and service name: {} bytes",
        metrics.len()
    );
    assert!(
        metrics.len() < 256 * 1024,
        "/metrics is {} bytes",
        metrics.len()
    );
    let cut = format!(r#"model="{}""#, "m".repeat(256));
    assert!(
        metrics.contains(&cut),
        "the model label is the first 256 bytes"
    );
    assert!(
        c.events().texts_truncated.get() >= 3,
        "model, span and service names"
    );
    c.stop().await.unwrap();
}

/// A trace past `max_spans_per_trace`: the spans it cannot keep are reported rejected in the
/// answer (partial success), not answered OK and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_past_the_per_trace_bound_are_rejected_in_the_answer() {
    let mut config = test_config();
    config.limits.max_spans_per_trace = 10;
    let c = server::run(config, std::future::pending()).await.unwrap();
    let http = c.http_addr.unwrap();
    let spans: Vec<String> = (1..=15)
        .map(|k| {
            format!(
                r#"{{"traceId":"{:032x}","spanId":"{k:016x}","name":"s{k}","startTimeUnixNano":"1","endTimeUnixNano":"2"}}"#,
                7
            )
        })
        .collect();
    let body = format!(
        r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
        spans.join(",")
    );
    let (status, answer) = post(http, "application/json", body.into_bytes()).await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["partialSuccess"]["rejectedSpans"], 5, "{v}");
    let message = v["partialSuccess"]["errorMessage"].as_str().unwrap();
    assert!(
        message.starts_with("5 of 15 spans rejected") && message.contains("max_spans_per_trace"),
        "{message}"
    );
    let (_, text) = get(c.api_addr, "/metrics").await;
    let count = |line: &str| metric(&text, line).unwrap_or(0.0);
    assert_eq!(
        count(r#"infertrace_dropped_spans_total{reason="max_spans_per_trace"}"#),
        5.0
    );
    assert_eq!(
        count(r#"infertrace_receiver_spans_total{receiver="otlp_http",outcome="rejected"}"#),
        5.0
    );
    assert_eq!(
        count(r#"infertrace_receiver_spans_total{receiver="otlp_http",outcome="accepted"}"#),
        10.0
    );
    c.stop().await.unwrap();
}
