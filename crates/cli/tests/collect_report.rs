//! `infertrace collect` as a process: OTLP/JSON in over HTTP, `report` against it, the config
//! checker, and a graceful SIGTERM that still counts the traces in flight.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Collector, bin, free_port, http, traces};

use serde_json::Value;

/// `n` requests of the infertrace dialect ending just now, with 20 ms queue, 30 ms prefill and
/// 100 ms decode each, as one OTLP/JSON export request.
fn report(api: u16) -> Value {
    let out = bin()
        .args([
            "report",
            "--url",
            &format!("http://127.0.0.1:{api}"),
            "--window",
            "1m",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn collect_then_report() {
    // History has its own tests (history.rs): nothing is written here.
    let c = Collector::start(["--no-store"]);
    let body = traces(25, 0x5000).to_string();
    let (status, resp) = http(
        c.otlp_http,
        "POST",
        "/v1/traces",
        "application/json",
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{resp}");
    let deadline = Instant::now() + Duration::from_secs(15);
    let r = loop {
        let r = report(c.api);
        if r["kpis"]["series"][0]["requests"] == 25 {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "25 requests never showed up: {r}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let s = &r["kpis"]["series"][0];
    assert_eq!(s["service"], "cli-test");
    let ttft = s["ttft"]["p50"]
        .as_f64()
        .unwrap_or_else(|| panic!("ttft in {s}"));
    assert!((ttft - 0.050).abs() < 0.0005, "{s}");
    assert!(
        (s["tpot"]["p50"].as_f64().expect("tpot") - 0.010).abs() < 0.0001,
        "{s}"
    );
    assert!(
        r["critical_path"]["entries"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "{r}"
    );
    // The table format prints the same numbers.
    let out = bin()
        .args([
            "report",
            "--url",
            &format!("http://127.0.0.1:{}", c.api),
            "--window",
            "1m",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("cli-test") && text.contains("50.0ms"),
        "{text}"
    );
}

#[test]
fn report_without_a_collector_says_what_to_do() {
    let out = bin()
        .args([
            "report",
            "--url",
            &format!("http://127.0.0.1:{}", free_port()),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("is the collector running"), "{err}");
}

#[test]
#[cfg(unix)]
fn sigterm_flushes_traces_in_flight() {
    let mut c = Collector::start(["--no-store"]);
    let (status, _) = http(
        c.otlp_http,
        "POST",
        "/v1/traces",
        "application/json",
        traces(3, 0x5000).to_string().as_bytes(),
    );
    assert_eq!(status, 200);
    // Immediately, well inside the 2 s grace period: the traces are still being assembled.
    let pid = c.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = std::mem::replace(
        &mut c.child,
        bin()
            .arg("--version")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
    .wait_with_output()
    .unwrap();
    assert!(out.status.success(), "exit status {}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 traces in flight were closed"), "{err}");
}

#[test]
fn check_config_reports_every_problem_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "assembly:\n  grace: 1s\n").unwrap();
    let out = bin().args(["check-config"]).arg(&good).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "assembly:\n  grace: 1s\n  graec: 2s\n").unwrap();
    let out = bin().args(["check-config"]).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml:3:"), "names file and line: {err}");
    assert!(err.contains("graec"), "{err}");
    // A file that parses is checked in full: a problem in each of three sections, each named
    // with its line.
    let many = dir.path().join("many.yaml");
    std::fs::write(
        &many,
        "limits:\n  max_series: 0\nassembly:\n  tick: 0s\nkpi:\n  goodput_target: 2\n",
    )
    .unwrap();
    let out = bin().args(["check-config"]).arg(&many).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for (line, key) in [
        (2, "limits.max_series"),
        (4, "assembly.tick"),
        (6, "kpi.goodput_target"),
    ] {
        assert!(
            err.contains(&format!("many.yaml:{line}:")) && err.contains(key),
            "{key}: {err}"
        );
    }
    assert!(!err.contains("OK"), "{err}");
    // A problem is not said twice: no windows is not also a wrong alerts.window.
    let windows = dir.path().join("windows.yaml");
    std::fs::write(&windows, "kpi:\n  windows: []\n").unwrap();
    let out = bin().args(["check-config"]).arg(&windows).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kpi.windows") && !err.contains("alerts.window"),
        "{err}"
    );
    // The shipped, documented config is valid.
    let shipped = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../otel-config/infertrace.yaml"
    );
    let out = bin().args(["check-config", shipped]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `infertrace` turns transparent huge pages off for itself (main.rs `tune_allocator`; the
/// `THP_enabled` field of /proc/PID/status exists since Linux 5.0).
#[cfg(target_os = "linux")]
#[test]
fn collect_runs_without_transparent_huge_pages() {
    let c = Collector::start(["--no-store"]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", c.child.id())).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("THP_enabled:"))
        .expect("THP_enabled in /proc/PID/status (Linux ≥ 5.0)");
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}
