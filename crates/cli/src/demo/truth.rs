//! What the demo shows beside infertrace's measurements: the simulator's ground truth, what the
//! load generator saw as a client, and the table comparing the three.

use std::time::Duration;

use infertrace_demo::loadgen::{LoadReport, Outcome};
use infertrace_sim::{SimHandle, TruthOutcome, TruthRecord};
use serde_json::{Value, json};

use crate::render;

/// Percentiles at rank ⌊q·(n − 1)⌋ (the rank rule of the KPI sketches, so the three sides are
/// comparable even on few requests), mean and sum of `values` in seconds.
pub(super) fn stat(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| -> Option<f64> {
        let last = v.len().checked_sub(1)?;
        Some(v[((p * last as f64) as usize).min(last)])
    };
    let sum: f64 = v.iter().sum();
    let mean = (!v.is_empty()).then(|| sum / v.len() as f64);
    json!({"count": v.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": mean, "sum": sum})
}

/// What the load generator saw, over its successful requests: TTFT (sent → first token received)
/// and e2e (sent → stream complete) include the network and the server's own work.
pub(super) fn client_summary(load: &LoadReport) -> Value {
    let ok = || load.results.iter().filter(|r| r.outcome == Outcome::Ok);
    json!({
        "sent": load.sent,
        "ok": ok().count(),
        "output_tokens": load.output_tokens,
        "ttft": stat(ok().filter_map(|r| r.ttft).map(|d| d.as_secs_f64()).collect()),
        "tpot": stat(ok().filter_map(|r| r.tpot()).map(|d| d.as_secs_f64()).collect()),
        "e2e": stat(ok().map(|r| r.e2e.as_secs_f64()).collect()),
    })
}

/// Exact percentiles of the simulator's true phase times (from its own clock, from the moment the
/// handler submitted the request), and how late its step timers woke (the run's scheduler noise).
pub(super) fn ground_truth(sim: &SimHandle) -> Value {
    let records: Vec<TruthRecord> = sim
        .truth_all()
        .into_iter()
        .filter(|r| matches!(r.outcome, Some(TruthOutcome::Finished(_))))
        .collect();
    let of = |f: &dyn Fn(&TruthRecord) -> Option<Duration>| {
        stat(
            records
                .iter()
                .filter_map(|r| f(r).map(|d| d.as_secs_f64()))
                .collect(),
        )
    };
    json!({
        "requests": records.len(),
        "queue": of(&|r| r.queue()),
        "prefill": of(&|r| r.prefill()),
        "ttft": of(&|r| r.ttft()),
        "decode": of(&|r| r.decode()),
        "tpot": of(&|r| r.tpot()),
        "e2e": of(&|r| r.e2e()),
        "scheduler_noise": stat(sim.step_lateness().iter().map(Duration::as_secs_f64).collect()),
    })
}

/// "What infertrace measured vs what really happened" for the completed requests: the
/// simulator's truth, the layer's spans (through the collector) and the client's view.
pub(super) fn truth_table(report: &Value) -> String {
    let truth = &report["ground_truth"];
    let client = &report["client"];
    let Some(series) = report.pointer("/kpis/series").and_then(Value::as_array) else {
        return String::new();
    };
    let Some(s) = series.first() else {
        return String::new();
    };
    let mut out = format!(
        "\nMeasured by infertrace vs the simulator's ground truth vs the client ({} completed requests)\n",
        truth["requests"]
    );
    out.push_str(
        "  metric    truth p50  layer p50  client p50   truth p99  layer p99  client p99\n",
    );
    for k in ["queue", "prefill", "ttft", "decode", "tpot", "e2e"] {
        let c = |p: &str| match k {
            "ttft" | "e2e" => render::secs(client[k][p].as_f64()),
            _ => "·".to_owned(),
        };
        out.push_str(&format!(
            "  {:<8}  {:>9}  {:>9}  {:>10}   {:>9}  {:>9}  {:>10}\n",
            k,
            render::secs(truth[k]["p50"].as_f64()),
            render::secs(s[k]["p50"].as_f64()),
            c("p50"),
            render::secs(truth[k]["p99"].as_f64()),
            render::secs(s[k]["p99"].as_f64()),
            c("p99"),
        ));
    }
    let noise = &truth["scheduler_noise"];
    out.push_str(&format!(
        "  truth: the simulator's own clock, from submit · layer: infertrace's spans, from arrival\n  \
         client: sent → received (network and server work included) · engine timer lateness p50 {} p99 {}\n",
        render::secs(noise["p50"].as_f64()),
        render::secs(noise["p99"].as_f64()),
    ));
    out
}
