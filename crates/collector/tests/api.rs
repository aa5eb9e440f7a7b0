//! The HTTP API: health, window validation, traces, critical path, findings, alerts and the
//! Alertmanager delivery (to an in-process stand-in that records what it is sent).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use infertrace_analysis::alert::AlertRuleConfig;
use infertrace_collector::server;
use support::*;

const WAIT: Duration = Duration::from_secs(10);

async fn collector_with(
    reqs: &[Req],
    config: infertrace_collector::config::CollectorConfig,
) -> server::RunningCollector {
    let c = server::run(config, std::future::pending()).await.unwrap();
    let spans = reqs
        .iter()
        .flat_map(|r| infertrace_spans(r, t0()))
        .collect();
    assert_eq!(
        post_protobuf(c.http_addr.unwrap(), &request("llm", spans)).await,
        200
    );
    let p = c.pipeline().clone();
    let n = reqs.len() as u64;
    eventually(WAIT, "requests recorded", || p.requests_recorded() == n).await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_answer_and_validate() {
    let reqs: Vec<Req> = (0..3)
        .map(|k| Req::new(k + 1, "m", 10, 20 + k as u64, 300))
        .collect();
    let c = collector_with(&reqs, test_config()).await;
    let api = c.api_addr;

    let (status, health) = get_json(api, "/health").await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));

    for path in [
        "/api/kpis?window=2m",
        "/api/critical-path?window=soon",
        "/api/findings?window=7s",
    ] {
        let (status, body) = get_json(api, path).await;
        assert_eq!(status, 400, "{path}");
        assert!(
            body["error"].as_str().unwrap().contains("1m"),
            "{path}: {body}"
        );
    }
    for w in ["1m", "5m", "1h", "300s"] {
        let (status, _) = get_json(api, &format!("/api/kpis?window={w}")).await;
        assert_eq!(status, 200, "{w}");
    }

    // One trace: its record, spans and critical path (queue → prefill → decode).
    let (status, t) = get_json(api, &format!("/api/traces/{}", reqs[1].trace_hex())).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["trace_id"], reqs[1].trace_hex());
    assert_eq!(t["spans"].as_array().unwrap().len(), 4);
    let req = &t["requests"][0];
    assert_eq!(req["record"]["model"], "m");
    let e2e = req["record"]["e2e"].as_f64().unwrap();
    assert!((e2e - reqs[1].e2e()).abs() < 1e-9);
    let segs = req["critical_path"]["segments"].as_array().unwrap();
    let names: Vec<&str> = segs.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["queue", "prefill", "decode"]);
    let covered: u64 = segs
        .iter()
        .map(|s| s["end_unix_nano"].as_u64().unwrap() - s["start_unix_nano"].as_u64().unwrap())
        .sum();
    assert_eq!(
        covered,
        (e2e * 1e9).round() as u64,
        "segments tile the request"
    );

    let (status, _) = get_json(api, "/api/traces/0123456789abcdef0123456789abcdef").await;
    assert_eq!(status, 404);
    let (status, _) = get_json(api, "/api/traces/not-a-trace").await;
    assert_eq!(status, 400);
    // A query string that does not parse is a JSON error too.
    for path in [
        "/api/traces?sort=bogus",
        "/api/traces?limit=abc",
        "/api/history/slow-requests?limit=-1",
    ] {
        let (status, body) = get_json(api, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }

    let (status, cp) = get_json(api, "/api/critical-path?window=1m").await;
    assert_eq!(status, 200);
    assert_eq!(cp["requests"], 3);
    let decode = cp["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["span"] == "decode")
        .expect("decode entry");
    let expected: f64 = reqs.iter().map(|r| r.decode_ms as f64 / 1e3).sum::<f64>()
        / reqs.iter().map(Req::e2e).sum::<f64>();
    let share = decode["share"]["all"].as_f64().unwrap();
    assert!(
        (share - expected).abs() < 0.01,
        "decode share {share} vs {expected}"
    );

    let (status, f) = get_json(api, "/api/findings").await;
    assert_eq!(status, 200);
    assert!(f["findings"].is_array());
    // Three requests are too few for the rules: the series is said to be unjudged.
    assert_eq!(f["min_requests"], 20, "{f:#}");
    let quiet = f["undiagnosed"].as_array().unwrap();
    assert_eq!(quiet.len(), 1, "{f:#}");
    assert_eq!(quiet[0]["model"], "m", "{f:#}");
    assert_eq!(quiet[0]["requests"], 3, "{f:#}");

    // The dashboard is mounted on the same address and lists the pipeline's recent traces.
    let (status, page) = get(api, "/").await;
    assert_eq!(status, 200);
    assert!(page.to_ascii_lowercase().contains("<html"), "{page}");
    let (status, list) = get(api, "/api/traces?limit=10").await;
    assert_eq!(status, 200, "{list}");
    for r in &reqs {
        assert!(list.contains(&r.trace_hex()), "{list}");
    }
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn findings_name_a_queue_dominated_model() {
    // 30 requests spending ~90% of their time queued.
    let reqs: Vec<Req> = (0..30)
        .map(|k| Req::new(k + 1, "busy", 900 + k as u64, 50, 50))
        .collect();
    let c = collector_with(&reqs, test_config()).await;
    let (_, f) = get_json(c.api_addr, "/api/findings?window=1m").await;
    let findings = f["findings"].as_array().unwrap();
    assert!(
        findings
            .iter()
            .any(|x| x["rule_id"].as_str().unwrap().contains("queue") && x["model"] == "busy"),
        "{f:#}"
    );
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_fires_is_exported_and_delivered_to_alertmanager() {
    // A stand-in Alertmanager that records every POST /api/v2/alerts body.
    let received: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let sink = received.clone();
    let app = Router::new().route(
        "/api/v2/alerts",
        post(move |axum::Json(body): axum::Json<serde_json::Value>| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push(body);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let am_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut config = test_config();
    config.alerts.evaluation_interval = Duration::from_millis(50);
    config.alerts.alertmanager_url = Some(format!("http://{am_addr}"));
    config.alerts.rules = vec![AlertRuleConfig {
        name: "SlowE2e".into(),
        expr: "e2e.p95 > 500ms".into(),
        for_duration: None,
        severity: infertrace_analysis::diagnosis::Severity::Critical,
        summary: None,
    }];
    let reqs: Vec<Req> = (0..5)
        .map(|k| Req::new(k + 1, "slow", 100, 100, 900 + k as u64))
        .collect();
    let c = collector_with(&reqs, config).await;

    eventually(WAIT, "alert delivered", || {
        received.lock().unwrap().iter().any(|b| {
            b.as_array().is_some_and(|a| {
                a.iter().any(|x| {
                    x["labels"]["alertname"] == "SlowE2e" && x["labels"]["model"] == "slow"
                })
            })
        })
    })
    .await;
    let (_, alerts) = get_json(c.api_addr, "/api/alerts").await;
    let active = alerts["active"].as_array().unwrap();
    assert_eq!(active.len(), 1, "{alerts:#}");
    assert_eq!(active[0]["state"], "firing");
    assert_eq!(active[0]["alert"], "SlowE2e");
    let (_, text) = get(c.api_addr, "/metrics").await;
    assert_eq!(
        metric(&text, r#"infertrace_alerts_active{alert="SlowE2e"}"#),
        Some(1.0),
        "{text}"
    );
    c.stop().await.unwrap();
}

/// A scrape that accepts gzip (as Prometheus does) gets the same series gzipped; one that does
/// not, or refuses gzip, gets the plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_gzipped_for_a_scrape_that_accepts_gzip() {
    use http_body_util::BodyExt;
    let reqs: Vec<Req> = (0..3).map(|k| Req::new(k + 1, "m", 10, 20, 300)).collect();
    let c = collector_with(&reqs, test_config()).await;
    let scrape = |accept: Option<&'static str>| async move {
        let mut req = http::Request::get(format!("http://{}/metrics", c.api_addr));
        if let Some(accept) = accept {
            req = req.header("accept-encoding", accept);
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let encoding = resp.headers().get("content-encoding").cloned();
        assert_eq!(resp.headers()["vary"], "accept-encoding");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (encoding, body)
    };
    let (encoding, zipped) = scrape(Some("gzip, deflate")).await;
    assert_eq!(encoding.unwrap(), "gzip");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&zipped[..]), &mut text)
        .unwrap();
    let series =
        r#"infertrace_requests_total{service="llm",model="m",operation="chat",outcome="ok"}"#;
    assert_eq!(metric(&text, series), Some(3.0), "{text}");
    assert!(text.ends_with("# EOF\n"));
    for plain in [None, Some("identity"), Some("gzip;q=0")] {
        let (encoding, body) = scrape(plain).await;
        assert_eq!(encoding, None, "{plain:?}");
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert_eq!(metric(&body, series), Some(3.0), "{plain:?}");
    }
    c.stop().await.unwrap();
}
