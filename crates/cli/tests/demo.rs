//! `infertrace demo` end to end: the report's numbers against the simulator's ground truth, and
//! the diagnosis changing with the workload.

use std::process::Command;

use serde_json::Value;

fn demo(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_infertrace"))
        .arg("demo")
        .args(args)
        .args(["--format", "json"])
        .output()
        .expect("run infertrace demo");
    assert!(
        out.status.success(),
        "demo failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("demo output is not JSON ({e}):\n{}", String::from_utf8_lossy(&out.stdout))
    })
}

fn rule_ids(report: &Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .expect("findings array")
        .iter()
        .map(|f| f["rule_id"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Tolerance of a percentile: the sketch's 1% relative error, plus 2% for the few microseconds
/// between the engine's mark and the truth stamp, plus 1 ms absolute for very short phases.
fn close(measured: f64, truth: f64) -> bool {
    (measured - truth).abs() <= 0.03 * truth + 0.001
}

#[test]
fn balanced_demo_matches_ground_truth_and_finds_nothing() {
    let report = demo(&["--duration", "10s", "--scenario", "balanced"]);
    let series = report["kpis"]["series"].as_array().expect("series");
    assert_eq!(series.len(), 1, "one service/model/operation: {series:?}");
    let s = &series[0];
    let truth = &report["ground_truth"];
    let sent = report["client"]["sent"].as_u64().unwrap();
    assert!(sent >= 30, "10 s at 6 req/s sends ~60 requests, got {sent}");
    assert_eq!(s["requests"].as_u64(), Some(sent), "every request reached the collector");
    assert_eq!(truth["requests"].as_u64(), Some(sent), "every request completed in the engine");
    assert_eq!(s["errors"].as_u64(), Some(0));
    for k in ["queue", "prefill", "ttft", "decode", "tpot", "e2e"] {
        for p in ["p50", "p90"] {
            let m = s[k][p].as_f64().unwrap_or_else(|| panic!("{k}.{p} measured"));
            let t = truth[k][p].as_f64().unwrap_or_else(|| panic!("{k}.{p} truth"));
            assert!(close(m, t), "{k}.{p}: measured {m} vs truth {t}");
        }
    }
    // Phase shares add up to the whole request.
    let share = &s["phase_share"]["all"];
    let total: f64 = ["queue", "prefill", "decode"].iter().map(|k| share[k].as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 0.02, "phase shares sum to {total}");
    let serious: Vec<&Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] != "info")
        .collect();
    assert!(serious.is_empty(), "a balanced workload raised {serious:?}");
    // The critical path is the phases, decode first.
    let entries = report["critical_path"]["entries"].as_array().expect("critical path entries");
    let top = entries
        .iter()
        .max_by(|a, b| a["share"]["all"].as_f64().unwrap().total_cmp(&b["share"]["all"].as_f64().unwrap()))
        .unwrap();
    assert_eq!(top["span"], "decode");
}

#[test]
fn overload_demo_is_diagnosed_as_queueing() {
    let report = demo(&["--duration", "8s", "--scenario", "overload"]);
    let ids = rule_ids(&report);
    assert!(ids.iter().any(|id| id.starts_with("queue-dominated")), "findings: {ids:?}");
    let s = &report["kpis"]["series"][0];
    assert!(s["phase_share"]["p90"]["queue"].as_f64().unwrap() > 0.4, "{s}");
}

#[test]
fn long_prompt_demo_is_diagnosed_as_prefill_bound() {
    let report = demo(&["--duration", "12s", "--scenario", "long-prompts", "--rate", "2.5"]);
    let ids = rule_ids(&report);
    assert!(
        ids.iter().any(|id| id == "prefill-dominated-ttft" || id == "inter-token-stalls"),
        "findings: {ids:?}"
    );
    assert!(!ids.iter().any(|id| id == "queue-dominated-gpu-idle"), "findings: {ids:?}");
}
