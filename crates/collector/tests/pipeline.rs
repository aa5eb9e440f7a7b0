//! The whole pipeline over real sockets: OTLP in (HTTP/protobuf, HTTP/JSON, gRPC), KPIs and
//! /metrics out, compared with values computed here from the known span timings.

mod support;

use std::time::Duration;

use infertrace_collector::server;
use prost::Message;
use support::*;

const WAIT: Duration = Duration::from_secs(10);

/// How the exposition writes a bucket bound (`1.0`, `0.25`).
fn le_label(le: f64) -> String {
    if le.fract() == 0.0 {
        format!("{le:.1}")
    } else {
        format!("{le}")
    }
}

fn series<'a>(kpis: &'a serde_json::Value, model: &str) -> &'a serde_json::Value {
    kpis["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["model"] == model)
        .unwrap_or_else(|| panic!("no series for {model}: {kpis:#}"))
}

fn check_latency(block: &serde_json::Value, values: &[f64], what: &str) {
    for (key, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
        let got = block[key].as_f64().unwrap();
        assert!(
            quantile_ok(values, q, got),
            "{what}.{key} = {got}, values {:?}",
            sorted(values)
        );
    }
    let max = sorted(values).last().copied().unwrap();
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let got_max = block["max"].as_f64().unwrap();
    let got_mean = block["mean"].as_f64().unwrap();
    assert!(
        (got_max - max).abs() <= 0.01 * max,
        "{what}.max {got_max} vs {max}"
    );
    assert!(
        (got_mean - mean).abs() <= 0.01 * mean,
        "{what}.mean {got_mean} vs {mean}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kpis_and_metrics_match_known_timings_over_http_and_grpc() {
    let c = server::run(test_config(), std::future::pending())
        .await
        .unwrap();
    let t0 = t0();
    // 20 requests of model "a" over HTTP/protobuf, 20 of model "b" over gRPC, every one with
    // its own queue / prefill / decode.
    let reqs_a: Vec<Req> = (0..20)
        .map(|k| {
            Req::new(
                k + 1,
                "a",
                5 + 3 * k as u64,
                40 + 7 * k as u64,
                300 + 37 * k as u64,
            )
        })
        .collect();
    let reqs_b: Vec<Req> = (0..20)
        .map(|k| {
            Req::new(
                k + 101,
                "b",
                100 + 50 * k as u64,
                20 + k as u64,
                900 + 11 * k as u64,
            )
        })
        .collect();
    // Several requests per HTTP body, one per gRPC call.
    for chunk in reqs_a.chunks(5) {
        let spans = chunk.iter().flat_map(|r| infertrace_spans(r, t0)).collect();
        let status = post_protobuf(c.http_addr.unwrap(), &request("llm", spans)).await;
        assert_eq!(status, 200);
    }
    for r in &reqs_b {
        export_grpc(
            c.grpc_addr.unwrap(),
            request("llm", infertrace_spans(r, t0)),
        )
        .await;
    }
    let p = c.pipeline().clone();
    eventually(WAIT, "40 requests recorded", || p.requests_recorded() == 40).await;

    let api = c.api_addr;
    let (status, kpis) = get_json(api, "/api/kpis?window=1m").await;
    assert_eq!(status, 200);
    assert_eq!(kpis["window_seconds"], 60.0);
    for (model, reqs) in [("a", &reqs_a), ("b", &reqs_b)] {
        let s = series(&kpis, model);
        assert_eq!(s["service"], "llm");
        assert_eq!(s["operation"], "chat");
        assert_eq!(s["requests"], 20);
        assert_eq!(s["errors"], 0);
        let e2e: Vec<f64> = reqs.iter().map(Req::e2e).collect();
        let queue: Vec<f64> = reqs.iter().map(|r| r.queue_ms as f64 / 1e3).collect();
        let ttft: Vec<f64> = reqs.iter().map(Req::ttft).collect();
        let decode: Vec<f64> = reqs.iter().map(|r| r.decode_ms as f64 / 1e3).collect();
        let tpot: Vec<f64> = reqs.iter().map(Req::tpot).collect();
        check_latency(&s["e2e"], &e2e, "e2e");
        check_latency(&s["queue"], &queue, "queue");
        check_latency(&s["ttft"], &ttft, "ttft");
        check_latency(&s["decode"], &decode, "decode");
        check_latency(&s["tpot"], &tpot, "tpot");
        assert_eq!(s["tokens"]["output"], 20 * 21);
        assert_eq!(s["tokens"]["input"], 20 * 100);
        // Queue share of e2e over all requests: Σqueue / Σe2e.
        let share = queue.iter().sum::<f64>() / e2e.iter().sum::<f64>();
        let got = s["phase_share"]["all"]["queue"].as_f64().unwrap();
        assert!((got - share).abs() < 0.01, "queue share {got} vs {share}");
    }

    // /metrics: counts and histogram buckets computed from the known e2e values.
    let (status, text) = get(api, "/metrics").await;
    assert_eq!(status, 200);
    for (model, reqs) in [("a", &reqs_a), ("b", &reqs_b)] {
        let l = format!(r#"service="llm",model="{model}",operation="chat",outcome="ok""#);
        assert_eq!(
            metric(&text, &format!("infertrace_requests_total{{{l}}}")),
            Some(20.0),
            "{text}"
        );
        for le in infertrace_semconv::metric::REQUEST_DURATION_BUCKETS {
            let expected = reqs.iter().filter(|r| r.e2e() <= le).count() as f64;
            let series = format!(
                "infertrace_request_duration_seconds_bucket{{le=\"{}\",{l}}}",
                le_label(le)
            );
            assert_eq!(metric(&text, &series), Some(expected), "{series}");
        }
        for le in infertrace_semconv::metric::TTFT_BUCKETS {
            let expected = reqs.iter().filter(|r| r.ttft() <= le).count() as f64;
            let series = format!(
                "infertrace_time_to_first_token_seconds_bucket{{le=\"{}\",{l}}}",
                le_label(le)
            );
            assert_eq!(metric(&text, &series), Some(expected), "{series}");
        }
        let sum: f64 = reqs.iter().map(Req::e2e).sum();
        let got = metric(
            &text,
            &format!("infertrace_request_duration_seconds_sum{{{l}}}"),
        )
        .unwrap();
        assert!((got - sum).abs() < 1e-6, "sum {got} vs {sum}");
        let decode_sum: f64 = reqs.iter().map(|r| r.decode_ms as f64 / 1e3).sum();
        let cp = metric(
            &text,
            r#"infertrace_critical_path_seconds_total{service="llm",span="decode"}"#,
        )
        .unwrap();
        assert!(
            cp >= decode_sum - 1e-6,
            "critical decode {cp} ≥ {decode_sum}"
        );
    }
    assert_eq!(
        metric(
            &text,
            r#"infertrace_receiver_spans_total{receiver="otlp_http",outcome="accepted"}"#
        ),
        Some(80.0)
    );
    assert_eq!(
        metric(
            &text,
            r#"infertrace_receiver_spans_total{receiver="otlp_grpc",outcome="accepted"}"#
        ),
        Some(80.0)
    );
    assert_eq!(metric(&text, "infertrace_traces_in_flight"), Some(0.0));
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_over_otlp_json_gives_phases_from_attributes() {
    let c = server::run(test_config(), std::future::pending())
        .await
        .unwrap();
    let r = Req::new(7, "llama", 120, 80, 1000);
    let req = request("vllm", vec![vllm_span(&r, t0())]);
    // OTLP/JSON: hex ids, integer enums, int64 as strings.
    let json = serde_json::to_string(&req).unwrap();
    assert_eq!(post_json(c.http_addr.unwrap(), &json).await, 200);
    let p = c.pipeline().clone();
    eventually(WAIT, "1 request", || p.requests_recorded() == 1).await;
    let (_, kpis) = get_json(c.api_addr, "/api/kpis").await;
    let s = series(&kpis, "llama");
    assert_eq!(s["service"], "vllm");
    for (key, v) in [
        ("queue", 0.12),
        ("ttft", 0.2),
        ("prefill", 0.08),
        ("decode", 1.0),
        ("e2e", 1.2),
    ] {
        let got = s[key]["p50"].as_f64().unwrap();
        assert!((got - v).abs() <= 0.01 * v, "{key}: {got} vs {v}");
    }
    assert_eq!(s["tokens"]["output"], 21);
    // The span has no child: its critical path is aggregated along its attribute phases, so
    // no finding blames time outside the engine's phases.
    let (_, cp) = get_json(c.api_addr, "/api/critical-path?window=1m").await;
    let share = |name: &str| {
        cp["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["span"] == name)
            .map(|e| e["share"]["all"].as_f64().unwrap())
    };
    for (name, v) in [("queue", 0.12), ("prefill", 0.08), ("decode", 1.0)] {
        let got = share(name).unwrap_or_default();
        assert!((got - v / 1.2).abs() < 1e-3, "{name}: {got} ({cp})");
    }
    assert_eq!(share("llm_request"), None, "{cp}");
    let (_, findings) = get_json(c.api_addr, "/api/findings?window=1m").await;
    assert!(
        !findings.to_string().contains("critical-path-hotspot"),
        "{findings}"
    );
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_flushes_in_flight_traces_into_the_kpis() {
    let mut config = test_config();
    config.assembly.grace = Duration::from_secs(600);
    let c = server::run(config, std::future::pending()).await.unwrap();
    let reqs: Vec<Req> = (0..3)
        .map(|k| Req::new(k + 1, "m", 10, 20, 30 + k as u64))
        .collect();
    let spans = reqs
        .iter()
        .flat_map(|r| infertrace_spans(r, t0()))
        .collect();
    assert_eq!(
        post_protobuf(c.http_addr.unwrap(), &request("llm", spans)).await,
        200
    );
    let p = c.pipeline().clone();
    eventually(WAIT, "3 traces in flight", || p.traces_in_flight() == 3).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(p.requests_recorded(), 0, "the grace period holds them");
    let http = c.http_addr.unwrap();
    let report = c.stop().await.unwrap();
    assert_eq!(report.flushed.requests, 3);
    let snap = p.kpis(Duration::from_secs(60));
    assert_eq!(snap.series[0].requests, 3);
    // After shutdown the receiver is gone.
    let refused = tokio::net::TcpStream::connect(http).await;
    assert!(refused.is_err(), "receiver still accepting after shutdown");
}

/// A body larger than what the aggregates leave of the memory limit can never be read: 413
/// (`too_large_for_memory`), not a 429 the sender would retry for ever — plain, or gzip whose
/// inflated size passes the room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_larger_than_the_memory_room_is_refused_for_good() {
    let mut config = test_config();
    config.limits.memory_limit_bytes = 1 << 20;
    // A trace index sized for 1,000 ids (32 KiB), not the default's 4 MiB, past this limit.
    config.limits.max_traces_in_flight = 1_000;
    let c = server::run(config, std::future::pending()).await.unwrap();
    // Within max_body_bytes (16 MiB), but the aggregates already hold part of the 1 MiB.
    // Refused on its declared length, possibly before the body is read: a raw client.
    let status = post_answered_early(
        c.http_addr.unwrap(),
        &[("content-type", "application/x-protobuf")],
        &vec![0u8; 1 << 20],
    )
    .await;
    assert_eq!(status, 413);
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gzip, &[0u8; 2 << 20]).unwrap();
    let (status, body) = post_with(
        c.http_addr.unwrap(),
        &[
            ("content-type", "application/x-protobuf"),
            ("content-encoding", "gzip"),
        ],
        gzip.finish().unwrap(),
    )
    .await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    let (_, text) = get(c.api_addr, "/metrics").await;
    assert_eq!(
        metric(
            &text,
            r#"infertrace_requests_refused_total{receiver="otlp_http",reason="too_large_for_memory"}"#
        ),
        Some(2.0),
        "{text}"
    );
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_memory_refusal_answers_429_and_counts_every_span() {
    // Enough spans that 5× the body passes the smallest memory limit (1 MiB).
    let reqs: Vec<Req> = (0..2_000).map(|k| Req::new(k + 1, "m", 1, 1, 1)).collect();
    let spans = reqs
        .iter()
        .flat_map(|r| infertrace_spans(r, t0()))
        .collect();
    let body = request("llm", spans).encode_to_vec();
    assert!(5 * body.len() >= 1 << 20, "{} bytes", body.len());
    // The receiver reserves 4× the body while decoding, which fits; the pipeline then needs the
    // decoded spans' footprint (> 1× the body) on top, which does not: the pipeline refuses.
    let mut config = test_config();
    config.limits.memory_limit_bytes = 5 * body.len();
    // A trace index sized for 1,000 ids (32 KiB) rather than 100,000 (4 MiB, near the limit).
    config.limits.max_traces_in_flight = 1_000;
    let c = server::run(config, std::future::pending()).await.unwrap();
    let (status, _) = post(c.http_addr.unwrap(), "application/x-protobuf", body).await;
    assert_eq!(status, 429);
    let (_, text) = get(c.api_addr, "/metrics").await;
    assert_eq!(
        metric(
            &text,
            r#"infertrace_dropped_spans_total{reason="memory_limit"}"#
        ),
        Some(4.0 * reqs.len() as f64),
        "{text}"
    );
    assert_eq!(c.pipeline().traces_in_flight(), 0);
    assert_eq!(
        c.pipeline().data_memory_bytes(),
        0,
        "every reservation released"
    );
    c.stop().await.unwrap();
}
