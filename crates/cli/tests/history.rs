//! `infertrace collect --data-dir` and `infertrace report --since / --compare` as processes: a
//! refused store file stops the start with one line naming it (and stays byte-identical), and
//! history reports match the traffic sent and a baseline stored an hour earlier.

mod common;

use infertrace_analysis::text::Text;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use infertrace_analysis::kpi::KpiConfig;
use infertrace_analysis::record::{Dialect, Outcome, RequestRecord};
use infertrace_analysis::trace::{SpanId, TraceId};
use infertrace_collector::InternalEvents;
use infertrace_collector::store::{DB_FILE_NAME, Store, StoreOptions, unix_nanos_now};
use serde_json::Value;

use common::{Collector, Ports, bin, collect, http, traces};

const MS: u64 = 1_000_000;

/// Stores `n` requests of 300 ms (TTFT 100 ms) as received 62 minutes ago: the baseline of
/// `--compare 1h`, outside the restored 1h window and the `--since 1h` range.
fn store_baseline(dir: &Path, n: u64) {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    let writer = store.start_writer(InternalEvents::default()).unwrap();
    let mut feed = store.feed(writer.clone(), &KpiConfig::default());
    let at = unix_nanos_now() - 62 * 60 * 1_000 * MS;
    // A collector that has kept this store for three hours, up to now (else the store's data
    // would begin with these requests, and rates before them would not be known; and the
    // time since them would be time no collector saw).
    assert!(writer.write_data_since(at - 3 * 3600 * 1_000 * MS));
    assert!(writer.write_run_start(at - 3 * 3600 * 1_000 * MS));
    for i in 0..n {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&(i + 1).to_be_bytes());
        let mut r = RequestRecord::new(
            TraceId(id),
            SpanId([1; 8]),
            Text::from("cli-test"),
            Dialect::Infertrace,
            0,
            0,
        );
        r.model = "m".into();
        r.operation = "chat".into();
        r.e2e = 0.3;
        r.queue = Some(0.05);
        r.prefill = Some(0.05);
        r.ttft = Some(0.1);
        r.decode = Some(0.2);
        r.tpot = Some(0.02);
        r.output_tokens = Some(11);
        r.outcome = Outcome::Ok;
        feed.record(&r, None, at);
    }
    feed.hand_over(unix_nanos_now());
    writer.flush().unwrap();
}

fn report(api: u16, args: &[&str]) -> Value {
    let out = bin()
        .args([
            "report",
            "--url",
            &format!("http://127.0.0.1:{api}"),
            "--format",
            "json",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn row<'a>(r: &'a Value, kpi: &str) -> &'a Value {
    r["kpis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["kpi"] == kpi)
        .unwrap_or_else(|| panic!("{kpi} in {r:#}"))
}

fn close(got: Option<f64>, want: f64, rel: f64) -> bool {
    got.is_some_and(|g| (g - want).abs() <= rel * want.abs())
}

#[test]
fn report_since_and_compare_read_the_store() {
    let dir = tempfile::tempdir().unwrap();
    store_baseline(dir.path(), 10);
    let c = Collector::start([OsStr::new("--data-dir"), dir.path().as_os_str()]);
    assert!(
        c.startup_line.contains(DB_FILE_NAME),
        "names the store: {}",
        c.startup_line
    );
    let (status, resp) = http(
        c.otlp_http,
        "POST",
        "/v1/traces",
        "application/json",
        traces(25, 0x7000).to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{resp}");

    let url = format!("http://127.0.0.1:{}", c.api);
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = report(c.api, &["--since", "1h"]);
        if row(&r, "requests")["value"] == 25.0 {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "25 requests never reached the store: {r:#}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(r["since_seconds"], 3600);
    // Whole minutes: from the start of the minute an hour ago, and the rate over all of it.
    let covered = &r["covered"];
    let (from, seconds) = (
        covered["from"].as_f64().unwrap(),
        covered["seconds"].as_f64().unwrap(),
    );
    assert!(
        from % 60.0 == 0.0 && (3600.0..3661.0).contains(&seconds),
        "{covered}"
    );
    let rate = row(&r, "throughput.requests_per_second")["value"].as_f64();
    assert!(
        close(rate.map(|x| x * seconds), 25.0, 0.01),
        "{rate:?} over {seconds} s"
    );
    assert!(
        close(row(&r, "e2e.p50")["value"].as_f64(), 0.150, 0.01),
        "{r:#}"
    );
    assert!(
        close(row(&r, "e2e.p99")["value"].as_f64(), 0.150, 0.01),
        "{r:#}"
    );
    assert!(
        close(row(&r, "ttft.p50")["value"].as_f64(), 0.050, 0.01),
        "{r:#}"
    );
    assert!(
        close(row(&r, "tpot.p99")["value"].as_f64(), 0.010, 0.01),
        "{r:#}"
    );
    assert!(
        close(
            row(&r, "phase_share.all.queue")["value"].as_f64(),
            20.0 / 150.0,
            0.01
        ),
        "{r:#}"
    );
    assert!(
        close(
            row(&r, "phase_share.all.decode")["value"].as_f64(),
            100.0 / 150.0,
            0.01
        ),
        "{r:#}"
    );
    assert!(
        row(&r, "e2e.p50").get("delta").is_none(),
        "no comparison asked"
    );

    // An hour ago: the stored baseline (10 requests of 300 ms, TTFT 100 ms).
    let r = report(c.api, &["--since", "1h", "--compare", "1h"]);
    assert_eq!(r["compare_seconds"], 3600);
    let req = row(&r, "requests");
    assert_eq!(
        (req["value"].as_f64(), req["baseline"].as_f64()),
        (Some(25.0), Some(10.0)),
        "{r:#}"
    );
    assert_eq!(req["delta"].as_f64(), Some(15.0));
    assert!(close(req["change"].as_f64(), 1.5, 1e-9), "{req}");
    let ttft = row(&r, "ttft.p50");
    assert!(close(ttft["baseline"].as_f64(), 0.100, 0.01), "{ttft}");
    assert!(close(ttft["delta"].as_f64(), -0.050, 0.03), "{ttft}");
    // The table shows both ranges and the deltas.
    let out = bin()
        .args(["report", "--url", &url, "--since", "1h", "--compare", "1h"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("last 1h of history") && text.contains("1h ago"),
        "{text}"
    );
    // The compared range is whole minutes, 60 of them, before the current range's first.
    assert!(text.contains(" against 3600 s from "), "{text}");
    let r = report(c.api, &["--since", "1h", "--compare", "1h"]);
    let (now, before) = (&r["covered"], &r["baseline_covered"]);
    assert_eq!(before["seconds"], 3600.0, "{r:#}");
    assert_eq!(before["to"], now["from"], "{r:#}");
    // A compared range shorter than --since would overlap the current one: refused.
    let out = bin()
        .args(["report", "--url", &url, "--since", "1h", "--compare", "5m"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--compare 5m is shorter than --since 1h"),
        "{err}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("requests"))
        .unwrap_or_default();
    assert!(
        line.contains("25")
            && line.contains("10")
            && line.contains("+15")
            && line.contains("+150%"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("ttft.p50"))
        .unwrap_or_default();
    assert!(
        line.contains("50.") && line.contains("100.") && line.contains("-50."),
        "{text}"
    );
}

#[test]
fn report_since_without_a_store_says_so() {
    let ports = Ports::free();
    let api = ports.api;
    let mut child = collect(&ports)
        .arg("--no-store")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("history: off"), "{line}");
    let out = bin()
        .args([
            "report",
            "--url",
            &format!("http://127.0.0.1:{api}"),
            "--since",
            "1h",
        ])
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("404") && err.contains("--data-dir"), "{err}");
}

#[test]
fn a_corrupt_store_stops_collect_with_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(DB_FILE_NAME);
    let junk: Vec<u8> = b"not a database\n"
        .iter()
        .copied()
        .cycle()
        .take(8192)
        .collect();
    std::fs::write(&db, &junk).unwrap();
    let out = bin()
        .args([
            "collect",
            "--otlp-grpc",
            "127.0.0.1:0",
            "--otlp-http",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&db.display().to_string()),
        "names the file: {err}"
    );
    assert!(err.contains("not an SQLite database"), "{err}");
    assert_eq!(std::fs::read(&db).unwrap(), junk, "left byte-identical");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "nothing created beside it: {names:?}");
}

#[test]
fn demo_keeps_no_history_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .current_dir(dir.path())
        .args([
            "demo",
            "--duration",
            "1s",
            "--rate",
            "5",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.path().join("infertrace-data").exists());
}

/// Requests (over every series) in `/api/kpis?window=…`.
fn kpi_requests(api: u16, window: &str) -> u64 {
    let (status, body) = http(api, "GET", &format!("/api/kpis?window={window}"), "", b"");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["series"]
        .as_array()
        .map_or(0, |s| s.iter().filter_map(|s| s["requests"].as_u64()).sum())
}

/// Requests in `/api/critical-path?window=…`.
fn critical_path_requests(api: u16, window: &str) -> u64 {
    let (status, body) = http(
        api,
        "GET",
        &format!("/api/critical-path?window={window}"),
        "",
        b"",
    );
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["requests"].as_u64().unwrap_or(0)
}

/// `kill -9` loses at most what arrived within the store's flush interval (5 s), and the
/// restarted collector's 1m, 5m and 1h windows — KPIs and critical paths — are refilled from
/// the stored minutes and slots.
#[test]
fn kill_9_loses_at_most_the_flush_interval_and_the_windows_are_refilled() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let mut c = Collector::start(["--data-dir", data]);
    let body = traces(20, 0x1000).to_string();
    let (status, _) = http(
        c.otlp_http,
        "POST",
        "/v1/traces",
        "application/json",
        body.as_bytes(),
    );
    assert_eq!(status, 200);
    // Committed: the history answers all 20 (hand-over within a second, a flush every 5 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, h) = http(c.api, "GET", "/api/history?kpi=requests&from=-10m", "", b"");
        let v: Value = serde_json::from_str(&h).unwrap_or(Value::Null);
        let stored: f64 = v["points"]
            .as_array()
            .map_or(0.0, |ps| ps.iter().filter_map(|p| p[1].as_f64()).sum());
        if stored == 20.0 {
            break;
        }
        assert!(Instant::now() < deadline, "never committed: {h}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Five more, then kill -9 at once: those may be lost, nothing earlier may.
    let body = traces(5, 0x2000).to_string();
    let (status, _) = http(
        c.otlp_http,
        "POST",
        "/v1/traces",
        "application/json",
        body.as_bytes(),
    );
    assert_eq!(status, 200);
    c.child.kill().unwrap(); // SIGKILL
    c.child.wait().unwrap();

    let c = Collector::start(["--data-dir", data]);
    for window in ["1m", "5m", "1h"] {
        let got = kpi_requests(c.api, window);
        assert!(
            (20..=25).contains(&got),
            "{window}: {got} requests after kill -9 (20 committed, 5 sent just before)"
        );
        // The critical-path slots go to the store with the minutes, so they hold as many.
        let paths = critical_path_requests(c.api, window);
        assert!(
            (20..=25).contains(&paths),
            "{window}: {paths} critical paths after kill -9 (20 committed, 5 sent just before)"
        );
    }
}
