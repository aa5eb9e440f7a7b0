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
    // The API's refusal reads as its sentence, not its JSON.
    let out = bin()
        .args([
            "report",
            "--url",
            &format!("http://127.0.0.1:{}", c.api),
            "--window",
            "2m",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("400 Bad Request: window") && !err.contains("{\"error\""),
        "{err}"
    );
}

/// A live collector's firing alert is in the table `report` prints (the section read a shape
/// `/api/alerts` never had, and printed nothing).
#[test]
fn report_prints_the_firing_alerts() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "alerts:\n  evaluation_interval: 1s\n  rules:\n    - { name: Busy, expr: \"requests > 10\", severity: critical }\n",
    )
    .unwrap();
    let c = Collector::start(["--no-store", "--config", config.to_str().unwrap()]);
    let body = traces(25, 0x6000).to_string();
    let (status, resp) = http(
        c.otlp_http,
        "POST",
        "/v1/traces",
        "application/json",
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{resp}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = bin()
            .args(["report", "--url", &format!("http://127.0.0.1:{}", c.api)])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("Alerts (1 firing") {
            assert!(
                text.contains("FIRING   Busy [critical] cli-test/m chat: requests > 10, now 25"),
                "{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the alert never showed: {text}");
        std::thread::sleep(Duration::from_millis(500));
    }
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

/// `collect` loads its file as `check-config` checks it, flags first: `--no-store` makes the
/// file's store settings moot for both (a review: `collect --no-store` refused
/// `store.flush_interval: 0s`, which `check-config --no-store` passed), and every problem is
/// given with its line.
#[test]
fn collect_refuses_what_check_config_refuses_with_the_flags_applied() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.yaml");
    std::fs::write(
        &file,
        "store:\n  flush_interval: 0s\nlimits:\n  soft_limit_percent: 0\nassembly:\n  max_age: 0s\n",
    )
    .unwrap();
    for command in ["collect", "check-config"] {
        let mut cmd = bin();
        cmd.args([command, "--no-store"]);
        if command == "collect" {
            cmd.arg("-c");
        }
        let out = cmd.arg(&file).output().unwrap();
        assert!(!out.status.success(), "{command}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("flush_interval"), "{command}: {err}");
        assert!(
            err.contains("c.yaml:4:") && err.contains("limits.soft_limit_percent"),
            "{command}: {err}"
        );
        assert!(err.contains("assembly.max_age"), "{command}: {err}");
    }
}

/// A config with both receivers off is valid (the API and history still serve) but said.
#[test]
fn a_config_without_receivers_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.yaml");
    std::fs::write(
        &file,
        "receivers:\n  otlp_grpc:\n    enabled: false\n  otlp_http:\n    enabled: false\n",
    )
    .unwrap();
    let out = bin()
        .args(["check-config", "--no-store"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: receivers.otlp_grpc and receivers.otlp_http are both disabled"),
        "{err}"
    );
}

/// `--service` and `--model` filter history reports only: without `--since` or `--compare`
/// they are refused rather than silently ignored.
#[test]
fn report_filters_need_a_history_report() {
    let out = bin().args(["report", "--service", "x"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--since") && err.contains("--compare"),
        "{err}"
    );
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
    // A file that parses is checked in full: every problem of three sections (two in one),
    // each named with its line.
    let many = dir.path().join("many.yaml");
    std::fs::write(
        &many,
        "limits:\n  max_series: 0\nassembly:\n  tick: 0s\nkpi:\n  goodput_target: 2\n\
         forward:\n  endpoint: http://127.0.0.1:4318\n  queue_size: 0\n  timeout: 0s\n",
    )
    .unwrap();
    let out = bin().args(["check-config"]).arg(&many).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for (line, key) in [
        (2, "limits.max_series"),
        (4, "assembly.tick"),
        (6, "kpi.goodput_target"),
        (9, "forward.queue_size"),
        (10, "forward.timeout"),
    ] {
        assert!(
            err.contains(&format!("many.yaml:{line}:")) && err.contains(key),
            "{key}: {err}"
        );
    }
    // Not the success line (`<file>: OK`); a bare "OK" could be in the temporary path.
    let said = format!("{err}{}", String::from_utf8_lossy(&out.stdout));
    assert!(!said.lines().any(|l| l.ends_with(": OK")), "{said}");
    // A problem is not said twice: an invalid value is not also compared with another key, a
    // name used three times is said once.
    let once = dir.path().join("once.yaml");
    std::fs::write(
        &once,
        "limits:\n  soft_limit_percent: 0\nassembly:\n  max_age: 0s\ndiagnosis:\n  gpu_idle_max: 1.5\n\
         alerts:\n  rules:\n    - { name: x, expr: \"ttft.p99 > 1\" }\n    - { name: x, expr: \"ttft.p99 > 1\" }\n\
         \x20   - { name: x, expr: \"ttft.p99 > 2\" }\n",
    )
    .unwrap();
    let out = bin()
        .args(["check-config", "--no-store"])
        .arg(&once)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    for (key, times) in [
        ("limits.soft_limit_percent", 1),
        ("relief_target_percent", 0),
        ("assembly.max_age", 1),
        ("diagnosis.gpu_idle_max", 1),
        ("used more than once", 1),
    ] {
        assert_eq!(err.matches(key).count(), times, "{key}: {err}");
    }
    // Keys that cannot be read are each named, and the rest of the file is still checked:
    // unknown keys, values of the wrong type, a value out of range, and every listener's TLS
    // files.
    let unreadable = dir.path().join("unreadable.yaml");
    std::fs::write(
        &unreadable,
        "shutdown_timeout: 15\nreceivers:\n  otlp_grpc:\n    endpoint: localhost:4317\n    \
         tls: { cert_file: /nonexistent/g.pem, key_file: /nonexistent/g.key }\n  otlp_http:\n    \
         conections: { max: 10 }\n    tls: { cert_file: /nonexistent/h.pem, key_file: /nonexistent/h.key }\n\
         limits:\n  max_body_bytes: -1\n  memory_limit_bytes: 1000\nkpi:\n  dimensions: [service, foo]\n\
         forward:\n  protocol: zipkin\n",
    )
    .unwrap();
    let out = bin()
        .args(["check-config", "--no-store"])
        .arg(&unreadable)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for (line, key) in [
        (1, "shutdown_timeout"),
        (4, "receivers.otlp_grpc.endpoint"),
        (7, "receivers.otlp_http.conections"),
        (10, "limits.max_body_bytes"),
        (11, "limits.memory_limit_bytes: must be at least 1048576"),
        (13, "kpi.dimensions[1]"),
        (15, "forward.protocol"),
    ] {
        let place = format!("unreadable.yaml:{line}:");
        assert!(
            err.lines().any(|l| l.contains(&place) && l.contains(key)),
            "{key} at line {line}: {err}"
        );
    }
    for file in ["/nonexistent/g.pem", "/nonexistent/h.pem"] {
        assert!(err.contains(file), "{file}: {err}");
    }
    // No windows is not also a wrong alerts.window.
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

/// `check-config` refuses a `store.data_dir` that `collect` could not open — a file in the way,
/// a directory that cannot be created, a file that is not a database — in the store's section,
/// and creates nothing to find out.
#[test]
fn check_config_refuses_a_data_dir_collect_could_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let not_a_db = dir.path().join("not-a-db");
    std::fs::create_dir(&not_a_db).unwrap();
    std::fs::write(
        not_a_db.join("infertrace.db"),
        "not a database, just some text",
    )
    .unwrap();
    let mut cases = vec![
        (file.clone(), "exists and is not a directory"),
        (file.join("x"), "is not a directory"),
        (not_a_db.clone(), "is not an SQLite database"),
    ];
    if cfg!(target_os = "linux") {
        cases.push(("/proc/nonexistent/x".into(), "cannot be created in /proc"));
    }
    // `check-config` of `yaml`, written to `name`, with `flags`: whether it passed, and stderr.
    let check = |name: &str, yaml: &str, flags: &[&str]| {
        let config = dir.path().join(name);
        std::fs::write(&config, yaml).unwrap();
        let out = bin()
            .arg("check-config")
            .arg(&config)
            .args(flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), err)
    };
    let before = std::fs::read_dir(dir.path()).unwrap().count();
    for (i, (data_dir, why)) in cases.iter().enumerate() {
        let yaml = format!("kpi:\n  goodput_target: 0.9\nstore:\n  data_dir: {data_dir:?}\n");
        let name = format!("store{i}.yaml");
        let (ok, err) = check(&name, &yaml, &[]);
        assert!(!ok, "{}: {err}", data_dir.display());
        assert!(
            err.contains(&format!("{name}:4:"))
                && err.contains("store.data_dir: ")
                && err.contains(why),
            "{why}: {err}"
        );
        // The same with the store off passes: in the file, or as `collect --no-store` runs it.
        let off = format!("store:\n  enabled: false\n  data_dir: {data_dir:?}\n");
        let (ok, err) = check(&format!("off{i}.yaml"), &off, &[]);
        assert!(ok, "{}: {err}", data_dir.display());
        let (ok, err) = check(&name, &yaml, &["--no-store"]);
        assert!(ok, "{}: {err}", data_dir.display());
    }
    // A data directory that can be created passes, and is not created.
    let new = dir.path().join("new/data");
    let (ok, err) = check("new.yaml", &format!("store:\n  data_dir: {new:?}\n"), &[]);
    assert!(ok, "{err}");
    assert!(!dir.path().join("new").exists());
    // Nothing but the configs written here appeared; the file that is not a database is as it was.
    let configs = 2 * cases.len() + 1;
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        before + configs
    );
    assert_eq!(
        std::fs::read_dir(&not_a_db).unwrap().count(),
        1,
        "SQLite left a file beside it"
    );
    assert_eq!(
        std::fs::read_to_string(not_a_db.join("infertrace.db")).unwrap(),
        "not a database, just some text"
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
