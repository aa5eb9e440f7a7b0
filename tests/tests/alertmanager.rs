//! Threshold alerts go pending → firing → resolved in the collector, and the transitions reach a
//! real Alertmanager (Debian's `prometheus-alertmanager`, started here) over its v2 API.

mod support_prom;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use infertrace_analysis::alert::AlertRuleConfig;
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server;
use serde_json::{Value, json};
use support_prom::{HttpClient, TempDir, free_port, require_binary};

struct Alertmanager {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_alertmanager(bin: &std::path::Path) -> Alertmanager {
    let dir = TempDir::new("alertmanager");
    let config = dir.path().join("alertmanager.yml");
    std::fs::write(
        &config,
        "route:\n  receiver: blackhole\n  group_wait: 0s\nreceivers:\n  - name: blackhole\n",
    )
    .unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("alertmanager.log")).unwrap();
    let child = Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start alertmanager");
    let am = Alertmanager {
        child,
        port,
        _dir: dir,
    };
    let http = HttpClient::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(
        http.get(&format!("http://127.0.0.1:{port}/-/ready")).await,
        Ok((200, _))
    ) {
        assert!(Instant::now() < deadline, "alertmanager not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    am
}

/// Five 150 ms requests in the infertrace dialect, ending now, as OTLP/JSON.
fn slow_requests(seed: u64) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let ms = 1_000_000;
    let spans: Vec<Value> = (0..5u64)
        .map(|i| {
            let t0 = now - 150 * ms;
            json!({"traceId": format!("{:032x}", seed * 100 + i + 1), "spanId": format!("{:016x}", i + 1),
                "name": "chat m", "kind": 2,
                "startTimeUnixNano": t0.to_string(), "endTimeUnixNano": (t0 + 150 * ms).to_string(),
                "attributes": [{"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
                               {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                               {"key": "infer.outcome", "value": {"stringValue": "ok"}}]})
        })
        .collect();
    json!({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "am-test"}}]},
        "scopeSpans": [{"spans": spans}]}]})
    .to_string()
    .into_bytes()
}

/// The active `SlowRequests` alert, as `GET /api/alerts` shows it.
async fn active_alert(http: &HttpClient, api: std::net::SocketAddr) -> Option<Value> {
    let (_, body) = http.get(&format!("http://{api}/api/alerts")).await.ok()?;
    let v: Value = serde_json::from_slice(&body).ok()?;
    v["active"]
        .as_array()?
        .iter()
        .find(|a| a.to_string().contains("SlowRequests"))
        .cloned()
}

async fn in_alertmanager(http: &HttpClient, port: u16) -> bool {
    let Ok((_, body)) = http
        .get(&format!(
            "http://127.0.0.1:{port}/api/v2/alerts?active=true"
        ))
        .await
    else {
        return false;
    };
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    v.as_array()
        .is_some_and(|a| a.iter().any(|x| x["labels"]["alertname"] == "SlowRequests"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_fire_resolve_and_reach_alertmanager() {
    let Some(bin) = require_binary(
        "ALERTMANAGER_BIN",
        "prometheus-alertmanager",
        "alerts_fire_resolve_and_reach_alertmanager",
    ) else {
        return;
    };
    let am = start_alertmanager(&bin).await;
    let mut config = CollectorConfig::default();
    config.store.enabled = false; // in memory: no ./infertrace-data left behind
    config.receivers.otlp_grpc.enabled = false;
    config.receivers.otlp_http.endpoint = "127.0.0.1:0".parse().unwrap();
    config.api.listen = "127.0.0.1:0".parse().unwrap();
    config.assembly.grace = Duration::from_millis(100);
    // A short KPI window so the condition clears by itself within the test.
    config.kpi.windows = vec![Duration::from_secs(4)];
    config.alerts.window = Duration::from_secs(4);
    config.alerts.evaluation_interval = Duration::from_millis(250);
    config.alerts.alertmanager_url = Some(format!("http://127.0.0.1:{}", am.port));
    config.alerts.rules = vec![serde_yaml_ng::from_str::<AlertRuleConfig>(
        "name: SlowRequests\nexpr: e2e.p95 > 100ms\nfor: 1s\nseverity: warning\nsummary: requests are slow\n",
    )
    .expect("rule config")];
    let collector = server::run(config, std::future::pending())
        .await
        .expect("collector starts");
    let http = HttpClient::default();
    let otlp = format!("http://{}/v1/traces", collector.http_addr.unwrap());

    // Keep the condition true: send slow requests every half second for a while.
    let mut seen = Vec::<String>::new();
    let started = Instant::now();
    let mut delivered = false;
    let mut firing: Option<Value> = None;
    for round in 0..16u64 {
        let (status, _) = http
            .post(&otlp, "application/json", slow_requests(round))
            .await
            .unwrap();
        assert_eq!(status, 200);
        if let Some(alert) = active_alert(&http, collector.api_addr).await {
            let state = alert["state"].as_str().unwrap_or_default().to_owned();
            if state == "firing" {
                firing = Some(alert);
            }
            if seen.last() != Some(&state) {
                seen.push(state);
            }
        }
        delivered |= in_alertmanager(&http, am.port).await;
        if delivered
            && seen.iter().any(|s| s == "firing")
            && started.elapsed() > Duration::from_secs(3)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The alert's own history, not a poll that a busy machine can make late: it held for
    // the rule's `for: 1s` (pending) before it fired.
    let firing = firing.unwrap_or_else(|| panic!("never firing; states seen: {seen:?}"));
    let since = |k: &str| {
        firing[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k}: {firing}"))
    };
    assert!(
        since("firing_since_unix_nano") >= since("active_since_unix_nano") + 1_000_000_000,
        "fired before it was pending for 1 s: {firing}"
    );
    assert!(delivered, "the firing alert never reached Alertmanager");
    let (_, metrics) = http
        .get(&format!("http://{}/metrics", collector.api_addr))
        .await
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("infertrace_alerts_active{")
                && l.contains("SlowRequests")
                && l.ends_with(" 1")),
        "alerts_active:\n{metrics}"
    );

    // Stop sending: the window empties, the alert resolves, and Alertmanager hears of it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let active = active_alert(&http, collector.api_addr).await;
        let in_am = in_alertmanager(&http, am.port).await;
        if active.is_none() && !in_am {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never resolved: collector {active:?}, in Alertmanager {in_am}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, body) = http
        .get(&format!("http://{}/api/alerts", collector.api_addr))
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        v["resolved"].to_string().contains("SlowRequests"),
        "resolved list: {v}"
    );
    collector.stop().await.expect("clean shutdown");
}
