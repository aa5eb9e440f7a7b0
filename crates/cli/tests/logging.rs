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
    let pid = json.child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = json.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let log = json.log();
    assert!(log.contains("infertrace collector: stopped"), "{log}");
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["fields"]["message"].is_string(), "{line}");
    }
}
