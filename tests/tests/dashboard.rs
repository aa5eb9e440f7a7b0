//! The web dashboard in a real headless Chromium (Debian's `chromium` + `chromium-driver`,
//! driven over WebDriver with `fantoccini`).
//!
//! A collector runs in-process and receives infertrace-dialect traces over OTLP/HTTP (two
//! services, two models, errors, cancels, slow outliers, GPU window statistics). The page is
//! loaded and checked as a person would look at it: every chart has data, live updates add
//! points, the model / service / range selectors change what is shown (checked against the
//! collector's own `/api/kpis` numbers and the traffic's ground truth), clicking the slowest
//! request opens its waterfall with the critical segments tiling the request, alerts and
//! findings show, and the console has no error. Screenshots are saved to `target/`:
//! `dashboard-laptop.png` (1366×768, first view), `dashboard-light.png` and `dashboard-dark.png`
//! (the whole page with a waterfall open).
//!
//! Without Chromium the test is skipped with a message, unless `CI` is set (then it fails).

mod support_dashboard;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fantoccini::Locator;
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server;
use serde_json::{Value, json};
use support_dashboard::traffic;
use support_dashboard::{Browser, HttpClient, find_browser};

const CONFIG: &str = r#"
receivers:
  otlp_grpc: { enabled: false }
  otlp_http: { endpoint: "127.0.0.1:0" }
api: { listen: "127.0.0.1:0" }
assembly: { grace: 200ms, tick: 50ms }
store: { enabled: false }
alerts:
  evaluation_interval: 1s
  rules:
    - name: TtftP99High
      expr: "ttft.p99 > 2s"
      severity: critical
"#;

const WAIT: Duration = Duration::from_secs(25);

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
}

/// The page's value for the (model, service) selection from a `/api/kpis` snapshot, computed
/// the way the page documents: the worst p99 of the matching series.
fn worst_e2e_p99(kpis: &Value, model: &str, service: &str) -> f64 {
    kpis["series"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["model"] == model && (service.is_empty() || s["service"] == service))
        .map(|s| s["e2e"]["p99"].as_f64().unwrap())
        .fold(f64::NAN, f64::max)
}

/// Fails on any console error or warning (uncaught exceptions, `console.error`, failed loads).
fn assert_no_console_errors<'a>(entries: impl Iterator<Item = &'a Value>) {
    let mut bad = Vec::new();
    for entry in entries {
        eprintln!("console: {entry}");
        if entry["level"] == "SEVERE" || entry["level"] == "WARNING" {
            bad.push(entry.clone());
        }
    }
    assert!(bad.is_empty(), "console errors: {bad:?}");
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_headless_chromium() {
    let (chromium, driver) = match find_browser() {
        Ok(found) => found,
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED dashboard_in_headless_chromium: {why}");
            return;
        }
        Err(why) => panic!("CI is set but the browser test cannot run: {why}"),
    };

    // ---- collector, traffic
    let config = CollectorConfig::from_yaml_str(CONFIG).unwrap();
    let collector = server::run(config.clone(), std::future::pending())
        .await
        .unwrap();
    let receiver = collector.http_addr.unwrap();
    let http = HttpClient::default();
    let batch1 = traffic::requests(160, 0x5eed);
    traffic::send(&http, receiver, &batch1).await;
    let deadline = Instant::now() + WAIT;
    while collector.pipeline().requests_recorded() < batch1.len() as u64 {
        assert!(
            Instant::now() < deadline,
            "collector did not record batch 1"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // ---- the page, on the collector's API address
    let base = format!("http://{}", collector.api_addr);
    let (status, page) = http.get(&format!("{base}/")).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("uPlot-1.6.32.iife.min.js"));

    // A laptop screen first.
    let browser = Browser::start(&chromium, &driver, 1366, 768).await;
    browser.client.goto(&format!("{base}/")).await.unwrap();
    browser
        .wait_until(
            "the first poll",
            "return document.body.dataset.ready === '1';",
            WAIT,
        )
        .await;

    // ---- every chart and panel has data
    let charts = [
        "chart-e2e",
        "chart-ttft",
        "chart-tpot",
        "chart-throughput",
        "chart-phases-all",
        "chart-phases-slow",
        "chart-errors",
        "chart-gpu",
        "chart-energy",
    ];
    let panels = ["critical", "slow", "findings"];
    let counts_js = format!(
        "return {}.map(id => Number(document.getElementById(id).dataset.points || 0));",
        serde_json::to_string(&charts.iter().chain(panels.iter()).collect::<Vec<_>>()).unwrap()
    );
    let all_have_data = counts_js;
    let counts = browser
        .wait_until(
            "data in every chart and panel",
            &format!(
                "const c = (function() {{ {all_have_data} }})(); return c.every(n => n > 0) ? c : null;"
            ),
            WAIT,
        )
        .await;
    eprintln!("points per chart/panel: {counts}");
    // uPlot drew something: each chart holds a canvas of the container's width.
    let canvases = browser
        .eval(
            "return Array.from(document.querySelectorAll('.chart canvas')).map(c => c.width);",
            vec![],
        )
        .await;
    assert_eq!(
        canvases.as_array().unwrap().len(),
        charts.len(),
        "{canvases}"
    );
    assert!(
        canvases
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w.as_f64().unwrap() > 200.0)
    );

    let dir = target_dir();
    std::fs::create_dir_all(&dir).unwrap();
    browser.screenshot(&dir.join("dashboard-laptop.png")).await;

    // The console check is live: a probe error written now is read back (with anything the
    // page logged so far, which must be nothing serious).
    browser
        .eval("console.error('infertrace-console-probe');", vec![])
        .await;
    let early = browser.console().await;
    let is_probe = |e: &&Value| {
        e["message"]
            .as_str()
            .unwrap_or("")
            .contains("infertrace-console-probe")
    };
    assert!(
        early.iter().any(|e| is_probe(&e)),
        "the browser log does not report console errors: {early:?}"
    );
    assert_no_console_errors(early.iter().filter(|e| !is_probe(e)));

    // ---- live updates: a second batch adds points and requests
    let e2e_points = |v: &Value| v[0].as_u64().unwrap();
    let before = e2e_points(&counts);
    let batch2 = traffic::requests(60, 0xbeef);
    traffic::send(&http, receiver, &batch2).await;
    let total = (batch1.len() + batch2.len()) as u64;
    while collector.pipeline().requests_recorded() < total {
        assert!(
            Instant::now() < deadline + WAIT,
            "collector did not record batch 2"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    browser
        .wait_until(
            "live points",
            &format!(
                "return Number(document.getElementById('chart-e2e').dataset.points) > {before};"
            ),
            WAIT,
        )
        .await;

    // ---- model selector: the default (most requests, then by name) is llama; the tile shows
    // the collector's own e2e p99 for it; choosing mistral changes it to mistral's.
    let kpis_url = format!("http://{}/api/kpis?window=1m", collector.api_addr);
    let tile_e2e = "const v = document.querySelector('#tiles [data-tile=\"3\"] .v'); return v ? v.dataset.value : null;";
    let mut values = Vec::new();
    for model in ["llama-3.1-8b", "mistral-7b"] {
        if model != "llama-3.1-8b" {
            browser
                .client
                .find(Locator::Css(&format!("#model option[value='{model}']")))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let shown = browser.eval(tile_e2e, vec![]).await;
            let shown: f64 = shown.as_str().unwrap_or("").parse().unwrap_or(f64::NAN);
            let expected = worst_e2e_p99(&http.json(&kpis_url).await, model, "");
            if close(shown, expected) {
                values.push(shown);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{model}: tile e2e p99 {shown} never matched /api/kpis {expected}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let selected = browser
            .eval("return document.body.dataset.model;", vec![])
            .await;
        assert_eq!(selected, model);
    }
    assert!(
        values[1] > 2.0 * values[0],
        "mistral is 3× slower by construction: {values:?}"
    );

    // ---- service selector: only batch-api's requests are listed, and the e2e chart's last
    // p50 is that single series' value.
    browser
        .client
        .find(Locator::Css("#service option[value='batch-api']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = browser
            .eval(
                "return Array.from(document.querySelectorAll('#slow tbody tr[data-trace-id]')).map(r => r.children[1].textContent);",
                vec![],
            )
            .await;
        let rows: Vec<String> = serde_json::from_value(rows).unwrap();
        let last = browser
            .eval(
                "return document.getElementById('chart-e2e').dataset.last;",
                vec![],
            )
            .await;
        let last: f64 = last.as_str().unwrap_or("").parse().unwrap_or(f64::NAN);
        let kpis = http.json(&kpis_url).await;
        let series = kpis["series"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["model"] == "mistral-7b" && s["service"] == "batch-api")
            .unwrap();
        let expected = series["e2e"]["p50"].as_f64().unwrap();
        if !rows.is_empty() && rows.iter().all(|s| s == "batch-api") && close(last, expected) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "service filter not applied: rows {rows:?}, e2e p50 {last} vs {expected}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // ---- range selector: the x axis spans the range; panels use the matching KPI window
    for (label, seconds, window) in [("1h", 3600, "1h"), ("15m", 900, "5m")] {
        browser
            .client
            .find(Locator::XPath(&format!(
                "//div[@id='ranges']/button[text()='{label}']"
            )))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let span = browser
            .wait_until(
                &format!("range {label}"),
                &format!(
                    "const d = document.getElementById('chart-e2e').dataset; const s = d.xMax - d.xMin;
                     return Number(d.range) === {seconds} && s > 0 && s <= {seconds} + 1
                       && document.body.dataset.range === '{seconds}'
                       && document.getElementById('critical-window').textContent.includes('last {window}') ? s : null;"
                ),
                WAIT,
            )
            .await;
        eprintln!("range {label}: x axis spans {span} s");
    }

    // ---- history points (as `/api/history` gives them) are drawn before the live ones, and
    // with history over the range the axis spans the whole range
    let merged = browser
        .eval(
            "const d = window.infertraceDashboard; const el = document.getElementById('chart-e2e');
             const before = Number(el.dataset.points);
             const first = d.state.polls.find(p => p.t >= Date.now() / 1000 - 900).t;
             d.state.history = new Map([['e2e.p50', [1, 2, 3, 4, 5, 6, 7, 8, 9].map(i => [first - 60 * (11 - i), 0.25])]]);
             d.render();
             const r = { before, after: Number(el.dataset.points), span: el.dataset.xMax - el.dataset.xMin };
             d.state.history = new Map();
             d.render();
             r.restored = Number(el.dataset.points);
             return r;",
            vec![],
        )
        .await;
    eprintln!("history merge: {merged}");
    assert_eq!(
        merged["after"].as_u64(),
        merged["before"].as_u64().map(|b| b + 9)
    );
    assert!(
        (merged["span"].as_f64().unwrap() - 900.0).abs() < 1.0,
        "{merged}"
    );
    assert_eq!(merged["restored"], merged["before"]);

    // ---- the slowest (batch-api, mistral) request's waterfall, against the ground truth
    let slowest = batch1
        .iter()
        .chain(batch2.iter())
        .filter(|r| r.service == "batch-api" && r.model == "mistral-7b")
        .max_by_key(|r| r.e2e())
        .unwrap();
    let first_row = browser
        .wait_until(
            "the slowest request first",
            "const r = document.querySelector('#slow tbody tr[data-trace-id]'); return r ? r.dataset.traceId : null;",
            WAIT,
        )
        .await;
    assert_eq!(first_row, slowest.trace_hex(), "the list is slowest first");
    browser
        .client
        .find(Locator::Css("#slow tbody tr[data-trace-id]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let wf = browser
        .wait_until(
            "the waterfall",
            "const w = document.getElementById('waterfall'); const r = document.getElementById('waterfall-rows');
             if (w.hidden) return null;
             const crit = Array.from(r.querySelectorAll('.critbar'));
             return {
               trace: r.dataset.traceId,
               spans: Number(r.dataset.spans),
               critical: Number(r.dataset.criticalSegments),
               bars: crit.length,
               width: crit.reduce((a, c) => a + parseFloat(c.style.width), 0),
               attrs: Array.from(r.querySelectorAll('.attrs')).map(a => a.textContent),
               visible: w.getBoundingClientRect().height > 0,
             };",
            WAIT,
        )
        .await;
    eprintln!("waterfall: {wf}");
    assert_eq!(wf["trace"], slowest.trace_hex());
    let phases = if slowest.decode > 0 { 3 } else { 2 };
    assert_eq!(wf["spans"], 1 + phases, "request span + its phases");
    // Back-to-back phases, each on the critical path, plus the request's own tail.
    assert_eq!(wf["critical"], phases + 1);
    assert_eq!(wf["bars"], wf["critical"]);
    let width = wf["width"].as_f64().unwrap();
    assert!(
        (width - 100.0).abs() < 0.05,
        "critical segments tile the request: {width}%"
    );
    let attrs: Vec<String> = serde_json::from_value(wf["attrs"].clone()).unwrap();
    assert!(
        attrs
            .iter()
            .any(|a| a.contains("GPU 92%") && a.contains("610 W")),
        "prefill GPU window shown: {attrs:?}"
    );
    assert!(wf["visible"].as_bool().unwrap());

    // ---- alerts and findings
    eprintln!(
        "/api/alerts: {}",
        http.json(&format!("http://{}/api/alerts", collector.api_addr))
            .await
    );
    let alerts = browser
        .wait_until(
            "a firing alert",
            "const t = document.getElementById('alerts').textContent; return t.includes('TtftP99High') && t.includes('firing') ? t : null;",
            WAIT,
        )
        .await;
    eprintln!("alerts panel: {alerts}");
    let findings = browser
        .eval(
            "return document.getElementById('findings').textContent;",
            vec![],
        )
        .await;
    eprintln!("findings panel: {findings}");
    assert!(
        findings.as_str().unwrap().contains('→'),
        "a finding with its recommendation"
    );

    // ---- screenshots, light and dark, the whole page
    // A viewport as tall as the page (CDP: the window size would include browser chrome).
    browser
        .cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1440, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let height = browser
        .eval(
            "return Math.ceil(document.documentElement.scrollHeight);",
            vec![],
        )
        .await
        .as_u64()
        .unwrap();
    browser
        .cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1440, "height": height.clamp(900, 4000), "deviceScaleFactor": 1, "mobile": false}),
        )
        .await;
    browser.eval("window.scrollTo(0, 0);", vec![]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    browser.screenshot(&dir.join("dashboard-light.png")).await;
    browser
        .cdp(
            "Emulation.setEmulatedMedia",
            json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
        )
        .await;
    let bg = browser
        .wait_until(
            "the dark scheme",
            "const c = getComputedStyle(document.body).backgroundColor; return c === 'rgb(18, 21, 27)' ? c : null;",
            WAIT,
        )
        .await;
    eprintln!("dark background: {bg}");
    // The charts were rebuilt with the dark palette and still hold their data.
    browser
        .wait_until(
            "charts after the scheme change",
            &format!("const c = (function() {{ {all_have_data} }})(); return c.every(n => n > 0);"),
            WAIT,
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    browser.screenshot(&dir.join("dashboard-dark.png")).await;
    eprintln!(
        "screenshots: {}/dashboard-{{laptop,light,dark}}.png",
        dir.display()
    );

    // ---- a model with too few requests for the rules is said to be undiagnosed, not healthy
    let mut rare = traffic::requests(3, 0x7a7e);
    for r in &mut rare {
        r.model = "rare-7b";
        r.service = "batch-api";
    }
    traffic::send(&http, receiver, &rare).await;
    browser
        .wait_until(
            "the rare model in the picker",
            "return document.querySelector(\"#model option[value='rare-7b']\") !== null;",
            WAIT,
        )
        .await;
    browser
        .client
        .find(Locator::Css("#model option[value='rare-7b']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let quiet = browser
        .wait_until(
            "the rare model said to be undiagnosed",
            "const t = document.getElementById('findings').textContent; \
             return t.includes('Not diagnosed (fewer than 20 requests') && t.includes('rare-7b') \
             && t.includes('(3)') && !t.includes('nothing stands out') ? t : null;",
            WAIT,
        )
        .await;
    eprintln!("findings panel for 3 requests: {quiet}");

    // ---- no console errors (uncaught exceptions, console.error, failed loads)
    assert_no_console_errors(browser.console().await.iter());

    // The service picker offers "all services" (a review found it with no option at all when
    // the live window was empty: [] and [''] joined alike).
    let all_services = browser
        .eval(
            "return document.querySelector(\"#service option[value='']\") !== null;",
            vec![],
        )
        .await;
    assert_eq!(all_services, json!(true), "an \"all services\" option");

    // ---- the collector gone: the figures are said to be old and dimmed, not shown as live
    collector.stop().await.unwrap();
    let status = browser
        .wait_until(
            "the page to say it is not updating",
            "const s = document.getElementById('status').textContent; \
             return document.body.classList.contains('stale') && s.startsWith('not updating') \
             && s.includes('the figures below are from') ? s : null;",
            WAIT,
        )
        .await;
    eprintln!("status once the collector stopped: {status}");
    browser.close().await;
}

/// With bearer tokens on, the page asks for a token when the API answers 401, says so when a
/// token is refused, keeps the accepted one in sessionStorage (a reload does not ask again),
/// and the Content-Security-Policy it is served with blocks nothing it needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_asks_for_a_token() {
    let (chromium, driver) = match find_browser() {
        Ok(found) => found,
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED dashboard_asks_for_a_token: {why}");
            return;
        }
        Err(why) => panic!("CI is set but the browser test cannot run: {why}"),
    };
    const READ: &str = "dashboard-read-0123456789abcdef";
    let dir = std::env::temp_dir().join(format!("infertrace-dash-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("read {READ}\n")).unwrap();
    let mut config = CollectorConfig::from_yaml_str(CONFIG).unwrap();
    config.auth.tokens_file = Some(tokens);
    config.auth.tokens_env = None;
    let collector = server::run(config, std::future::pending()).await.unwrap();
    let base = format!("http://{}", collector.api_addr);
    let browser = Browser::start(&chromium, &driver, 1366, 768).await;
    browser.client.goto(&format!("{base}/")).await.unwrap();
    let prompt_says = |what: &'static str| {
        format!(
            "const f = document.getElementById('auth'); const why = document.getElementById('auth-why').textContent; \
             return !f.hidden && why.includes('{what}') && document.activeElement.id === 'auth-token' ? why : null;"
        )
    };
    browser
        .wait_until("the token prompt", &prompt_says("asks for a token"), WAIT)
        .await;
    let enter = |token: &'static str| {
        let client = browser.client.clone();
        async move {
            let input = client.find(Locator::Id("auth-token")).await.unwrap();
            input.send_keys(token).await.unwrap();
            client
                .find(Locator::Id("auth-submit"))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
        }
    };
    enter("not-the-token-0123456789").await;
    browser
        .wait_until(
            "the prompt after a refused token",
            &prompt_says("did not accept"),
            WAIT,
        )
        .await;
    enter(READ).await;
    browser
        .wait_until(
            "the first poll with the token",
            "return document.body.dataset.ready === '1' && document.getElementById('auth').hidden \
             && document.getElementById('status').className.includes('live');",
            WAIT,
        )
        .await;
    let stored = browser
        .eval("return sessionStorage.getItem('infertrace.token');", vec![])
        .await;
    assert_eq!(stored, json!(READ));
    // A reload reuses the stored token: no prompt.
    browser.client.refresh().await.unwrap();
    browser
        .wait_until(
            "the first poll after a reload",
            "return document.body.dataset.ready === '1' ? document.getElementById('auth').hidden : null;",
            WAIT,
        )
        .await;
    let hidden = browser
        .eval("return document.getElementById('auth').hidden;", vec![])
        .await;
    assert_eq!(hidden, json!(true), "the page asked again after a reload");
    let e = collector.events();
    assert!(e.auth_refusals("api", "missing_token") >= 1);
    assert!(e.auth_refusals("api", "unknown_token") >= 1);
    // The only console errors are the refused API calls themselves (Chromium logs every 401):
    // no CSP violation, no exception.
    let console = browser.console().await;
    let bad: Vec<&Value> = console
        .iter()
        .filter(|e| e["level"] == "SEVERE" || e["level"] == "WARNING")
        .filter(|e| {
            !e["message"]
                .as_str()
                .unwrap_or("")
                .contains("status of 401")
        })
        .collect();
    assert!(bad.is_empty(), "console: {bad:?}");
    browser.close().await;
    collector.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
