//! The history store wired into the collector: requests survive a restart in `/api/kpis` and
//! `/api/history`, alert transitions and slow requests are stored, and the history routes
//! answer 400 / 404 as documented.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use infertrace_analysis::alert::AlertRuleConfig;
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server;
use serde_json::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(15);

fn store_config(dir: &Path) -> CollectorConfig {
    let mut c = test_config();
    c.store.enabled = true;
    c.store.data_dir = dir.to_path_buf();
    c.store.flush_interval = Duration::from_millis(200);
    c
}

/// Polls `path` until `ok` holds for its JSON, returning it.
async fn poll(api: std::net::SocketAddr, path: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let (status, v) = get_json(api, path).await;
        if status == 200 && ok(&v) {
            return v;
        }
        assert!(
            start.elapsed() < WAIT,
            "timed out on {path}: {status} {v:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sum of the non-null values of a history answer.
fn total(v: &Value) -> f64 {
    v["points"]
        .as_array()
        .map(|ps| ps.iter().filter_map(|p| p[1].as_f64()).sum())
        .unwrap_or(0.0)
}

/// The only non-null value of a history answer.
fn only_value(v: &Value) -> f64 {
    let values: Vec<f64> = v["points"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p[1].as_f64())
        .collect();
    assert_eq!(values.len(), 1, "one step with data: {v:#}");
    values[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let reqs: Vec<Req> = (0..5)
        .map(|k| Req::new(k + 1, "m", 100, 100, 900 + k as u64 * 10))
        .collect();

    // First run: traffic, an alert, then a graceful stop.
    let mut config = store_config(dir.path());
    config.alerts.evaluation_interval = Duration::from_millis(50);
    config.alerts.rules = vec![AlertRuleConfig {
        name: "SlowE2e".into(),
        expr: "e2e.p95 > 500ms".into(),
        for_duration: None,
        severity: infertrace_analysis::diagnosis::Severity::Critical,
        summary: None,
    }];
    let c = server::run(config, std::future::pending()).await.unwrap();
    let api = c.api_addr;
    let spans = reqs
        .iter()
        .flat_map(|r| infertrace_spans(r, t0()))
        .collect();
    assert_eq!(
        post_protobuf(c.http_addr.unwrap(), &request("llm", spans)).await,
        200
    );
    let p = c.pipeline().clone();
    eventually(WAIT, "requests recorded", || p.requests_recorded() == 5).await;
    // Handed over and committed without a stop (hand-over ≤ 50 ms, flush every 200 ms).
    let h = poll(api, "/api/history?kpi=requests&from=-10m", |v| {
        total(v) == 5.0
    })
    .await;
    assert_eq!(h["kpi"], "requests");
    assert_eq!(h["step_seconds"], 60.0);
    // The store lags the pipeline by a hand-over and a flush (here ~250 ms): the answer says
    // where its data ends, and its rates divide up to there.
    let h = poll(api, "/api/history?kpi=requests&from=-10m", |v| {
        v["data_until"].is_number()
    })
    .await;
    let lag = h["to"].as_f64().unwrap() - h["data_until"].as_f64().unwrap();
    assert!((0.0..10.0).contains(&lag), "{h:#}");
    let alerts = poll(api, "/api/history/alerts?from=-10m", |v| {
        v["events"].as_array().is_some_and(|e| !e.is_empty())
    })
    .await;
    assert_eq!(
        alerts["events"][0]["body"]["alert"], "SlowE2e",
        "{alerts:#}"
    );
    let (_, dash) = get_json(api, "/api/dashboard").await;
    assert_eq!(dash["history"], true, "{dash}");
    let (status, e) = get_json(api, "/api/history?kpi=ttft.p42").await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("p42"), "{e}");
    let (status, e) = get_json(api, "/api/history?kpi=requests&from=yesterday").await;
    assert_eq!(status, 400, "{e}");
    c.stop().await.unwrap();

    // Second run on the same directory: no new traffic.
    let c = server::run(store_config(dir.path()), std::future::pending())
        .await
        .unwrap();
    let api = c.api_addr;
    let (status, k) = get_json(api, "/api/kpis?window=1h").await;
    assert_eq!(status, 200);
    let series = k["series"].as_array().unwrap();
    assert_eq!(series.len(), 1, "{k:#}");
    assert_eq!(series[0]["requests"], 5, "{k:#}");
    assert_eq!(series[0]["model"], "m");
    // The restored sketches still answer percentiles (DDSketch: 1% relative accuracy).
    let ttft = series[0]["ttft"]["p50"].as_f64().unwrap();
    assert!(
        (ttft - reqs[0].ttft()).abs() < 0.01 * reqs[0].ttft(),
        "{ttft}"
    );
    // The short windows are refilled too: the stored minute ends inside them.
    for window in ["1m", "5m"] {
        let (_, k) = get_json(api, &format!("/api/kpis?window={window}")).await;
        assert_eq!(k["series"][0]["requests"], 5, "{window}: {k:#}");
    }

    let h = get_json(api, "/api/history?kpi=requests&from=-10m&to=now&step=60")
        .await
        .1;
    assert_eq!(total(&h), 5.0, "{h:#}");
    let h = get_json(api, "/api/history?kpi=e2e.max&from=-10m&step=15m&model=m")
        .await
        .1;
    assert_eq!(h["step_seconds"], 900.0, "{h:#}");
    let e2e_max = reqs.iter().map(Req::e2e).fold(0.0, f64::max);
    let got = only_value(&h);
    assert!((got - e2e_max).abs() < 0.01 * e2e_max, "{got} vs {e2e_max}");
    let h = get_json(api, "/api/history?kpi=requests&from=-10m&model=other")
        .await
        .1;
    assert_eq!(total(&h), 0.0, "another model has no data: {h:#}");
    let note = h["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("model=other") && note.contains("/m/"),
        "a filter that matches nothing says so and names the series with data: {h:#}"
    );
    let h = get_json(api, "/api/history?kpi=requests&from=-10m&model=m")
        .await
        .1;
    assert!(h.get("note").is_none(), "{h:#}");
    let (_, slow) = get_json(api, "/api/history/slow-requests?from=-10m&limit=3").await;
    let rows = slow["requests"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{slow:#}");
    assert_eq!(rows[0]["trace_id"], reqs[4].trace_hex(), "slowest first");
    let e2e = rows[0]["e2e"].as_f64().unwrap();
    assert!((e2e - reqs[4].e2e()).abs() < 1e-9, "{e2e}");
    c.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_without_a_store_is_a_clear_404() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config();
    // Disabled wins over a data directory: nothing is created there.
    config.store.data_dir = dir.path().join("never");
    let c = server::run(config, std::future::pending()).await.unwrap();
    for path in [
        "/api/history?kpi=requests",
        "/api/history/slow-requests",
        "/api/history/alerts",
        "/api/history/findings",
    ] {
        let (status, e) = get_json(c.api_addr, path).await;
        assert_eq!(status, 404, "{path}: {e}");
        assert!(
            e["error"].as_str().unwrap().contains("--no-store"),
            "{path}: {e}"
        );
    }
    let (_, dash) = get_json(c.api_addr, "/api/dashboard").await;
    assert_eq!(dash["history"], false, "{dash}");
    assert!(c.store().is_none());
    c.stop().await.unwrap();
    assert!(!dir.path().join("never").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_file_stops_the_start_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(infertrace_collector::store::DB_FILE_NAME);
    let junk: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&db, &junk).unwrap();
    let err = server::run(store_config(dir.path()), std::future::pending())
        .await
        .unwrap_err();
    assert!(matches!(err, server::ServerError::Store(_)), "{err:?}");
    assert!(err.to_string().contains(&db.display().to_string()), "{err}");
    assert_eq!(std::fs::read(&db).unwrap(), junk);
}
