//! The dashboard's disaggregated prefill/decode panel in a real headless Chromium: a collector
//! receives the SGLang PD fixture (`tests/fixtures/sglang-pd.otlp.json`, one request across a
//! router, a prefill and a decode worker with known sub-phases) and the panel shows each
//! sub-phase along TTFT with its share of TTFT, and each worker. The panel is hidden while no
//! series has disaggregated requests.
//!
//! Without Chromium the test is skipped with a message, unless `CI` is set (then it fails).

#[allow(dead_code)]
mod support_dashboard;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server;
use support_dashboard::{Browser, HttpClient, find_browser};

const CONFIG: &str = r#"
receivers:
  otlp_grpc: { enabled: false }
  otlp_http: { endpoint: "127.0.0.1:0" }
api: { listen: "127.0.0.1:0" }
assembly: { grace: 200ms, tick: 50ms }
store: { enabled: false }
"#;

const WAIT: Duration = Duration::from_secs(25);

/// The fixture's request (tests/tests/sglang_pd.rs builds it): TTFT and each sub-phase along
/// it, seconds.
const TTFT: f64 = 0.212;
const ALONG_TTFT: [(&str, f64); 7] = [
    ("routing", 0.004),
    ("bootstrap", 0.03),
    ("prefill_queue", 0.02),
    ("prefill", 0.09),
    ("kv_transfer", 0.04),
    ("decode_wait", 0.01),
    ("first_token", 0.007),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_the_disaggregated_breakdown() {
    let (chromium, driver) = match find_browser() {
        Ok(found) => found,
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED dashboard_shows_the_disaggregated_breakdown: {why}");
            return;
        }
        Err(why) => panic!("CI is set but the browser test cannot run: {why}"),
    };
    let config = CollectorConfig::from_yaml_str(CONFIG).unwrap();
    let collector = server::run(config, std::future::pending()).await.unwrap();
    let base = format!("http://{}", collector.api_addr);
    let http = HttpClient::default();

    // Before any disaggregated request the panel is hidden.
    let browser = Browser::start(&chromium, &driver, 1366, 900).await;
    browser.client.goto(&format!("{base}/")).await.unwrap();
    browser
        .wait_until(
            "the first poll",
            "return Number(document.body.dataset.polls || 0) >= 1;",
            WAIT,
        )
        .await;
    // Hidden as drawn, not only as marked: a stylesheet's `display: grid` once showed the
    // marked section, empty.
    let hidden = browser
        .eval(
            "const s = document.getElementById('pd-section'); \
             return s.hidden && getComputedStyle(s).display === 'none';",
            vec![],
        )
        .await;
    assert_eq!(hidden, true, "the PD panel shows without PD traffic");

    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/sglang-pd.otlp.json");
    let body = std::fs::read(&fixture).expect("the fixture");
    let url = format!("http://{}/v1/traces", collector.http_addr.unwrap());
    let (status, resp) = http.post(&url, "application/json", body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&resp));
    let deadline = Instant::now() + WAIT;
    while collector.pipeline().requests_recorded() < 1 {
        assert!(Instant::now() < deadline, "the PD request was not recorded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The panel appears with one row per sub-phase along TTFT, in time order, each with its
    // share of TTFT as the fixture's numbers give it.
    let rows = browser
        .wait_until(
            "the PD panel",
            "const el = document.getElementById('pd');
             if (document.getElementById('pd-section').hidden || Number(el.dataset.points || 0) === 0) return null;
             return Array.from(el.querySelectorAll('.name')).map(n => [n.dataset.phase, Number(n.dataset.share), n.querySelector('small').textContent]);",
            WAIT,
        )
        .await;
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), ALONG_TTFT.len(), "{rows:?}");
    for (row, (name, secs)) in rows.iter().zip(ALONG_TTFT) {
        assert_eq!(row[0], name, "{rows:?}");
        let share = row[1].as_f64().expect("share");
        let want = secs / TTFT;
        assert!((share - want).abs() < 1e-6, "{name}: {share} vs {want}");
        let pool = match name {
            "routing" => "router",
            "decode_wait" | "first_token" => "decode",
            _ => "prefill",
        };
        assert_eq!(row[2], pool, "{name}");
    }
    // The bars' widths are the shares.
    let widths = browser
        .eval(
            "return Array.from(document.querySelectorAll('#pd .fill')).map(f => f.style.width);",
            vec![],
        )
        .await;
    let widths: Vec<f64> = widths
        .as_array()
        .expect("widths")
        .iter()
        .map(|w| {
            w.as_str()
                .and_then(|w| w.trim_end_matches('%').parse().ok())
                .expect("a width in %")
        })
        .collect();
    for (w, (name, secs)) in widths.iter().zip(ALONG_TTFT) {
        assert!((w - 100.0 * secs / TTFT).abs() < 0.01, "{name}: {w}%");
    }
    // One row per worker (the fixture's prefill and decode services).
    let workers = browser
        .eval(
            "return Array.from(document.querySelectorAll('#pd-workers tbody tr')).map(r => [r.dataset.worker, r.cells[1].textContent, r.cells[2].textContent]);",
            vec![],
        )
        .await;
    let workers = workers.as_array().expect("workers");
    assert_eq!(workers.len(), 2, "{workers:?}");
    assert_eq!(workers[0][1], "prefill");
    assert_eq!(workers[1][1], "decode");
    assert!(workers.iter().all(|w| w[2] == "1"), "{workers:?}");

    let console = browser.console().await;
    let errors: Vec<_> = console.iter().filter(|e| e["level"] == "SEVERE").collect();
    assert!(errors.is_empty(), "console errors: {errors:?}");
    browser.close().await;
    collector.stop().await.expect("clean shutdown");
}
