//! The real `infertrace collect` process's logs: plain text without colour codes when standard
//! error is a file (as under `docker logs` or journald), one JSON object a line with
//! `INFERTRACE_LOG_FORMAT=json`, the level from `INFERTRACE_LOG`.

mod common;

use common::*;

fn collector(dir: &std::path::Path, format: Option<&str>) -> Process {
    let mut cmd = collect(&Ports::free());
    cmd.arg("--data-dir")
        .arg(dir.join("data"))
        .env("INFERTRACE_LOG", "info");
    match format {
        // With a token, so that SIGHUP has tokens to reload and says so on its own line.
        Some(f) => cmd
            .env("INFERTRACE_LOG_FORMAT", f)
            .env("INFERTRACE_TOKENS", "read logging-test-token-0123456789"),
        None => cmd.env_remove("INFERTRACE_LOG_FORMAT"),
    };
    Process::spawn(cmd, dir.join(format!("{}.log", format.unwrap_or("text"))))
}

#[test]
fn logs_are_plain_text_in_a_file_and_json_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = collector(dir.path(), None);
    let log = text.wait_log("history store open");
    assert!(!log.contains('\x1b'), "colour codes in a file:\n{log}");
    let line = log
        .lines()
        .find(|l| l.contains("history store open"))
        .unwrap();
    assert!(line.contains("INFO"), "{line}");

    let dir = tempfile::tempdir().unwrap();
    let mut json = collector(dir.path(), Some("json"));
    let log = json.wait_log("history store open");
    let line = log
        .lines()
        .find(|l| l.contains("history store open"))
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(v["level"], "INFO", "{v}");
    assert_eq!(v["fields"]["message"], "history store open", "{v}");

    // Every line is JSON, the operator's lines too: where it listens, what SIGHUP did, that it
    // stopped.
    json.wait_log("infertrace collector: OTLP/gRPC");
    json.hangup();
    json.wait_log("SIGHUP: 1 bearer tokens reloaded");
    json.terminate();
    let log = json.log();
    assert!(log.contains("infertrace collector: stopped"), "{log}");
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["fields"]["message"].is_string(), "{line}");
    }
}

/// Spans answered OK and queued for a downstream that is down when SIGTERM comes: the
/// forwarder gives them up at its deadline, and the last lines say how many (a reviewer's
/// collector dropped 741,000 queued spans at exit with no line saying so, and the rate-limited
/// warnings' counts since their last line were never written).
#[test]
fn spans_a_stopped_forwarder_could_not_send_are_said_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!(
            "forward:\n  endpoint: http://127.0.0.1:{}\n  max_batch_spans: 40\n",
            free_port()
        ),
    )
    .unwrap();
    let mut cmd = collect(&ports);
    cmd.arg("--no-store")
        .arg("--config")
        .arg(&config)
        .env("INFERTRACE_LOG", "info");
    let mut p = Process::spawn(cmd, dir.path().join("log"));
    p.wait_log("infertrace collector: OTLP/gRPC");
    let mut spans = 0;
    for k in 0..3u64 {
        let body = serde_json::to_vec(&traces(10, 1 + k * 100)).unwrap();
        let (status, answer) = http(ports.http, "POST", "/v1/traces", "application/json", &body);
        assert_eq!(status, 200, "{answer}");
        spans += 40;
    }
    p.terminate();
    let log = p.log();
    let line = log
        .lines()
        .find(|l| l.contains("forwarder stopped"))
        .unwrap_or_else(|| panic!("no forwarder line:\n{log}"));
    assert!(
        line.contains(&format!("queued={spans}")) && line.contains(&format!("dropped={spans}")),
        "{line}"
    );
    // Batches of 40 are given up one by one: the first says 40, the count of the rest since
    // that line is said before the process exits (not 10 s later, when it is gone).
    let said = log
        .lines()
        .filter(|l| {
            l.contains("spans dropped or refused for this reason")
                && l.contains("reason=\"forward_failed\"")
        })
        .filter_map(|l| {
            let at = l.find("spans=")? + "spans=".len();
            l[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .collect::<Vec<u64>>();
    assert_eq!(said.len(), 2, "{log}");
    assert_eq!(said.iter().sum::<u64>(), spans, "{log}");
}
