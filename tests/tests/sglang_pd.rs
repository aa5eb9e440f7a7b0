//! SGLang's own traces, end to end: the official OpenTelemetry Python SDK emits SGLang request
//! trees exactly as sglang/srt/tracing does (docs/dialects-sglang.md#sglangs-span-model: bootstrap room, per-role request
//! spans in three services, per-TP-rank thread spans, nested stage slices chained by links,
//! 64-bit trace ids) to a real collector over loopback gRPC; each cross-service PD tree is read
//! into ONE request record whose phases and disaggregated sub-phases equal the truth the script
//! computed from its own timestamps, and unified trees into their queue / prefill / decode.
//!
//! `tests/fixtures/sglang-pd.otlp.json` is the analysis tests' PD fixture (two TP ranks, links)
//! as an OTLP/JSON request body, for `infertrace analyze` and other tools; it is checked here to
//! match the builder (`UPDATE_FIXTURES=1` rewrites it) and sent to the collector over OTLP/HTTP
//! JSON.

mod support_prom;
#[path = "../../crates/analysis/tests/support_sglang/mod.rs"]
mod support_sglang;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use infertrace_analysis::critical_path::aggregate_name;
use infertrace_collector::server;
use serde_json::Value;
use support_prom::HttpClient;
use support_prom::python::{loopback_config, python_sdk, stored_trace};

/// Runs the emitter; the ground truth of every request it sent.
fn send(
    endpoint: &str,
    (pd, plain, pd_newer): (usize, usize, usize),
    prefill_lead: Duration,
) -> Vec<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/send_sglang_trace.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--endpoint", endpoint])
        .args(["--pd", &pd.to_string(), "--plain", &plain.to_string()])
        .args(["--pd-newer", &pd_newer.to_string()])
        .args(["--prefill-lead-ms", &prefill_lead.as_millis().to_string()])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "send_sglang_trace.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
    assert_eq!(v["flushed"], true, "the SDK flushed every span");
    v["requests"].as_array().expect("requests").clone()
}

#[track_caller]
fn same(what: &str, measured: &Value, truth: &Value) {
    let (m, t) = (measured.as_f64(), truth.as_f64());
    let (Some(m), Some(t)) = (m, t) else {
        panic!("{what}: measured {measured}, truth {truth}");
    };
    // Times crossed the SDK as integer nanoseconds; the truth was computed from the same.
    assert!((m - t).abs() < 1e-6, "{what}: measured {m}, truth {t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_pd_and_plain_trees_from_the_python_sdk_are_one_record_each() {
    if !python_sdk() {
        return;
    }
    let mut config = loopback_config();
    config.assembly.grace = Duration::from_secs(2);
    let collector = server::run(config, std::future::pending())
        .await
        .expect("collector starts");
    let grpc = format!("http://{}", collector.grpc_addr.unwrap());

    // The prefill server's spans arrive 3 s (more than the grace period) before the rest, as
    // they do when decoding takes a while: the trace must wait for the decode side and room.
    // Older SGLang's PD trees (a room span), unified trees, and newer SGLang's PD trees (no
    // room span: role spans rooted under an untraced gateway, carrying `bootstrap_room`).
    let truth = send(&grpc, (4, 3, 2), Duration::from_millis(3000));
    assert_eq!(truth.len(), 9);
    let mut seen_pd = 0;
    for t in &truth {
        let id = t["trace_id"].as_str().unwrap();
        let trace = stored_trace(&collector, id).await;
        let requests = trace["requests"].as_array().unwrap();
        assert_eq!(requests.len(), 1, "one request per tree: {trace}");
        let r = &requests[0]["record"];
        assert_eq!(r["dialect"], "sglang");
        assert_eq!(
            r["span_id"], t["room_span_id"],
            "the room span (newer SGLang: the decode side's role span) is the request: {} {r}",
            t["mode"]
        );
        assert_eq!(r["service"], t["service"]);
        for key in ["e2e", "ttft", "queue", "prefill", "decode", "tpot"] {
            same(&format!("{id} {key}"), &r[key], &t[key]);
        }
        for key in ["input_tokens", "output_tokens"] {
            assert_eq!(r[key], t[key], "{id} {key}");
        }
        if t["mode"] != "plain" {
            seen_pd += 1;
            assert_eq!(r["cache_read_input_tokens"], t["cache_read_input_tokens"]);
            let (d, want) = (&r["disagg"], &t["disagg"]);
            for key in [
                "routing",
                "bootstrap",
                "prefill_queue",
                "prefill",
                "kv_transfer",
                "decode_bootstrap",
                "decode_wait",
                "first_token",
                "decode",
            ] {
                if want[key].is_null() {
                    assert!(d[key].is_null(), "{id} disagg.{key}: {}", d[key]);
                    continue;
                }
                same(&format!("{id} disagg.{key}"), &d[key], &want[key]);
            }
            assert_eq!(d["prefill_worker"], want["prefill_worker"]);
            assert_eq!(d["decode_worker"], want["decode_worker"]);
            // The spans of all three services are in the trace.
            let services: std::collections::BTreeSet<&str> = trace["spans"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|s| s["service"].as_str())
                .collect();
            let newer = t["mode"] == "pd-newer";
            let want: &[&str] = if newer {
                &["sglang-decode", "sglang-prefill"]
            } else {
                &["sglang-decode", "sglang-prefill", "sglang-router"]
            };
            assert_eq!(services.into_iter().collect::<Vec<_>>(), want);
            // In SGLang's structure: names, TP ranks, links between slices.
            let spans = trace["spans"].as_array().unwrap();
            let named = |p: &str| {
                spans
                    .iter()
                    .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with(p)))
                    .count()
            };
            let (rooms, router_roles) = if newer { (0, 0) } else { (1, 1) };
            assert_eq!(named("Bootstrap Room 0x"), rooms);
            assert_eq!(
                (named("prefill Req "), named("decode Req "), named(" Req ")),
                (1, 1, router_roles)
            );
            assert_eq!(named("Scheduler [TP 1] (host:"), 2);
            let linked = spans
                .iter()
                .filter(|s| s["links"].as_array().is_some_and(|l| !l.is_empty()))
                .count();
            assert!(linked > 10, "slices are chained by links: {linked}");
        } else {
            assert!(r.get("disagg").is_none(), "unified: no sub-phases: {r}");
            assert_eq!(r["preemptions"], t["preemptions"]);
        }
    }
    assert_eq!(seen_pd, 6);

    // The KPIs count each request once, under the service that owns its room.
    let http = HttpClient::default();
    let (_, body) = http
        .get(&format!("http://{}/api/kpis?window=1h", collector.api_addr))
        .await
        .unwrap();
    let kpis: Value = serde_json::from_slice(&body).unwrap();
    let count = |service: &str| -> u64 {
        kpis["series"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["service"] == service)
            .filter_map(|s| s["requests"].as_u64())
            .sum()
    };
    assert_eq!(count("sglang-router"), 4, "{kpis}");
    assert_eq!(count("sglang"), 3, "{kpis}");
    assert_eq!(
        count("sglang-decode"),
        2,
        "newer SGLang: the decode side's: {kpis}"
    );
    assert_eq!(count("sglang-prefill"), 0, "{kpis}");

    // SGLang names its spans per request and process ("decode Req 1a2b3c4d", "Scheduler
    // [TP 1] (host:… | pid:522)"), and its thread spans hide the phases from the span walk:
    // the windows aggregate a unified request along its phases and a disaggregated one along
    // its sub-phases (a request without either keeps its span path), and no per-request or
    // per-process name reaches them or /metrics.
    let (_, body) = http
        .get(&format!(
            "http://{}/api/critical-path?window=1h",
            collector.api_addr
        ))
        .await
        .unwrap();
    let critical: Value = serde_json::from_slice(&body).unwrap();
    let names: Vec<&str> = critical["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["span"].as_str())
        .collect();
    for phase in ["queue", "prefill", "decode", "kv_transfer"] {
        assert!(names.contains(&phase), "{phase}: {names:?}");
    }
    for name in &names {
        assert_eq!(aggregate_name(name), *name, "{names:?}");
    }
    let (_, metrics) = http
        .get(&format!("http://{}/metrics", collector.api_addr))
        .await
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    let per_process = metrics
        .lines()
        .filter(|l| l.starts_with("infertrace_critical_path_seconds_total{"))
        .filter(|l| l.contains("pid:") || l.contains(" Req "))
        .count();
    assert_eq!(per_process, 0, "{metrics}");
    collector.stop().await.expect("clean shutdown");
}

/// `spans` as an OTLP/JSON `ExportTraceServiceRequest`, one resource per service.
fn otlp_json(spans: &[infertrace_analysis::trace::Span]) -> Value {
    use infertrace_analysis::trace::AttrValue;
    let value = |v: &AttrValue| match v {
        AttrValue::Str(s) => serde_json::json!({ "stringValue": s.as_str() }),
        AttrValue::Int(i) => serde_json::json!({ "intValue": i.to_string() }),
        AttrValue::Double(d) => serde_json::json!({ "doubleValue": d }),
        AttrValue::Bool(b) => serde_json::json!({ "boolValue": b }),
        AttrValue::StrArray(a) => serde_json::json!({ "arrayValue": { "values":
            a.iter().map(|s| serde_json::json!({ "stringValue": s.as_str() })).collect::<Vec<_>>() } }),
    };
    let mut services: Vec<&str> = spans.iter().map(|s| s.service.as_str()).collect();
    services.dedup();
    services.sort_unstable();
    services.dedup();
    let resource_spans: Vec<Value> = services
        .iter()
        .map(|service| {
            let spans: Vec<Value> = spans
                .iter()
                .filter(|s| s.service.as_str() == *service)
                .map(|s| {
                    serde_json::json!({
                        "traceId": s.trace_id.to_hex(),
                        "spanId": s.span_id.to_hex(),
                        "parentSpanId": s.parent_span_id.map(|p| p.to_hex()).unwrap_or_default(),
                        "name": s.name.as_str(),
                        "kind": 1,
                        "startTimeUnixNano": s.start_unix_nano.to_string(),
                        "endTimeUnixNano": s.end_unix_nano.to_string(),
                        "attributes": s.attributes.iter().map(|(k, v)| serde_json::json!({ "key": k, "value": value(v) })).collect::<Vec<_>>(),
                        "links": s.links.iter().map(|l| serde_json::json!({ "traceId": l.trace_id.to_hex(), "spanId": l.span_id.to_hex() })).collect::<Vec<_>>(),
                        "status": {},
                    })
                })
                .collect();
            serde_json::json!({
                "resource": { "attributes": [{ "key": "service.name", "value": { "stringValue": service } }] },
                "scopeSpans": [{ "scope": { "name": "sglang server" }, "spans": spans }],
            })
        })
        .collect();
    serde_json::json!({ "resourceSpans": resource_spans })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_otlp_json_fixture_is_the_pd_fixture_and_one_record() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/sglang-pd.otlp.json");
    let built = otlp_json(&support_sglang::pd().build());
    let text = serde_json::to_string_pretty(&built).expect("JSON") + "\n";
    if std::env::var_os("UPDATE_FIXTURES").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
    }
    let committed =
        std::fs::read_to_string(&path).expect("the fixture (UPDATE_FIXTURES=1 writes it)");
    assert!(
        committed == text,
        "{} is out of date: rerun with UPDATE_FIXTURES=1",
        path.display()
    );

    let mut config = loopback_config();
    config.assembly.grace = Duration::from_millis(200);
    let collector = server::run(config, std::future::pending())
        .await
        .expect("collector starts");
    let http = HttpClient::default();
    let url = format!("http://{}/v1/traces", collector.http_addr.unwrap());
    let (status, body) = http
        .post(&url, "application/json", committed.into_bytes())
        .await
        .expect("POST /v1/traces");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let trace = stored_trace(&collector, &support_sglang::TRACE.to_hex()).await;
    let requests = trace["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{trace}");
    let r = &requests[0]["record"];
    assert_eq!(r["span_id"], support_sglang::room_id().to_hex());
    for (key, want) in [
        ("e2e", 1.0),
        ("ttft", 0.212),
        ("queue", 0.02),
        ("prefill", 0.09),
        ("decode", 0.78),
    ] {
        same(key, &r[key], &serde_json::json!(want));
    }
    for (key, want) in [
        ("routing", 0.004),
        ("bootstrap", 0.03),
        ("prefill_queue", 0.02),
        ("prefill", 0.09),
        ("kv_transfer", 0.04),
        ("decode_bootstrap", 0.027),
        ("decode_wait", 0.01),
        ("first_token", 0.007),
        ("decode", 0.78),
    ] {
        same(
            &format!("disagg.{key}"),
            &r["disagg"][key],
            &serde_json::json!(want),
        );
    }
    assert_eq!(r["cache_read_input_tokens"], 512);
    collector.stop().await.expect("clean shutdown");
}
