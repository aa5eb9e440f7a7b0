//! `infertrace demo` end to end: the report's numbers against the simulator's ground truth (kept
//! on its own clock) and the load generator's client-side view, and the diagnosis changing with
//! the workload.

use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;

/// One demo at a time: each runs a collector, a server and a load generator, and GPU
/// utilisation (the simulated engine's busy time) is only meaningful on an uncontended CPU.
static ONE_DEMO_AT_A_TIME: Mutex<()> = Mutex::new(());

fn demo(args: &[&str]) -> Value {
    let _serial = ONE_DEMO_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
        panic!(
            "demo output is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
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

/// The KPI sketches' relative error (docs/kpis.md: ≤ 1 %); the truth's and the client's
/// percentiles are exact, with the same rank rule.
const SKETCH: f64 = 0.01;

fn f(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what}: no number in {v}"))
}

/// Truth, layer and client agree for every phase the report shows, within bounds derived from
/// the run itself. `noise` is the p99 lateness of the engine's step timers in this run: how long
/// a ready task waited for the runtime and the CPU, on this machine, right now.
fn check_truth_layer_client(report: &Value) {
    let truth = &report["ground_truth"];
    let layer = &report["kpis"]["series"][0];
    let client = &report["client"];
    let noise = f(&truth["scheduler_noise"]["p99"], "scheduler noise p99");
    for k in ["queue", "prefill", "ttft", "decode", "tpot", "e2e"] {
        for p in ["p50", "p90"] {
            let what = format!("{k}.{p}");
            let t = f(&truth[k][p], &format!("truth {what}"));
            let m = f(&layer[k][p], &format!("layer {what}"));
            // Each boundary the layer marks is the engine's instant plus at most one wait for the
            // CPU (the engine task calling the recorder after its truth stamp) ≤ noise. Phases
            // between two engine marks differ by at most one noise; those starting at the layer's
            // arrival add the handler's wait before `submit`, another noise at most.
            let waits = if matches!(k, "queue" | "ttft" | "e2e") {
                2.0
            } else {
                1.0
            };
            assert!(
                (m - t).abs() <= SKETCH * t + waits * noise,
                "{what}: layer {m} vs truth {t} (noise {noise})"
            );
            if !matches!(k, "queue" | "ttft" | "e2e") {
                continue;
            }
            // Causality, no noise allowed: the layer's arrival precedes `submit` and its marks
            // follow the engine's, so per request layer ≥ truth, hence every order statistic.
            assert!(m >= t * (1.0 - SKETCH), "{what}: layer {m} < truth {t}");
            if k == "queue" {
                continue;
            }
            // The client sends before the layer's arrival and reads after the layer's marks:
            // client ≥ layer ≥ truth. Its extra time is the loopback network and the server's
            // work: a few task wake-ups on each side (write, read, handler, body), each bounded
            // like the engine's by the run's noise, hence 4 × noise above the truth.
            let c = f(&client[k][p], &format!("client {what}"));
            assert!(
                c >= t && m <= c * (1.0 + SKETCH),
                "{what}: client {c} must be ≥ layer {m} ≥ truth {t}"
            );
            assert!(
                c - t <= 4.0 * noise,
                "{what}: client {c} vs truth {t} (noise {noise})"
            );
        }
    }
}

#[test]
fn balanced_demo_matches_ground_truth_and_finds_nothing() {
    let started = Instant::now();
    let report = demo(&["--duration", "10s", "--scenario", "balanced"]);
    check_gpu_kpis(&report, started.elapsed().as_secs_f64());
    let series = report["kpis"]["series"].as_array().expect("series");
    assert_eq!(series.len(), 1, "one service/model/operation: {series:?}");
    let s = &series[0];
    let truth = &report["ground_truth"];
    let sent = report["client"]["sent"].as_u64().unwrap();
    assert!(sent >= 30, "10 s at 6 req/s sends ~60 requests, got {sent}");
    assert_eq!(
        s["requests"].as_u64(),
        Some(sent),
        "every request reached the collector"
    );
    assert_eq!(
        truth["requests"].as_u64(),
        Some(sent),
        "every request completed in the engine"
    );
    assert_eq!(
        report["client"]["ok"].as_u64(),
        Some(sent),
        "every answer was complete"
    );
    assert_eq!(s["errors"].as_u64(), Some(0));
    check_truth_layer_client(&report);
    // Phase shares add up to the whole request.
    let share = &s["phase_share"]["all"];
    let total: f64 = ["queue", "prefill", "decode"]
        .iter()
        .map(|k| share[k].as_f64().unwrap())
        .sum();
    assert!((total - 1.0).abs() < 0.02, "phase shares sum to {total}");
    // A continuously batching engine runs a step whenever any request is in flight, which
    // NVML-style utilisation (and so the simulated GPU) reports as ~97% busy; with nobody
    // queueing that is an info-level note, so a balanced workload raises no warning at all.
    let serious: Vec<&Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] != "info")
        .collect();
    assert!(serious.is_empty(), "a balanced workload raised {serious:?}");
    // The critical path of every request is its phases: the seconds each phase owns, summed over
    // the window, equal the simulator's true phase times summed over the same requests. Sums are
    // exact (no sketch); per request a phase is off by at most two waits for the runtime, each
    // bounded on average by the engine timers' mean lateness in this run.
    let noise_mean = f(&truth["scheduler_noise"]["mean"], "scheduler noise mean");
    let entries = report["critical_path"]["entries"]
        .as_array()
        .expect("critical path entries");
    for phase in ["queue", "prefill", "decode"] {
        let owned = entries
            .iter()
            .find(|e| e["span"] == phase)
            .and_then(|e| e["seconds"]["all"].as_f64())
            .unwrap_or_else(|| panic!("{phase} on the critical path: {entries:?}"));
        let truth_sum = truth[phase]["sum"].as_f64().expect("truth sum");
        assert!(
            (owned - truth_sum).abs() <= 2.0 * noise_mean * sent as f64,
            "{phase}: critical path {owned} s vs true {truth_sum} s (noise mean {noise_mean})"
        );
    }
    // The critical path is the phases, decode first.
    let top = entries
        .iter()
        .max_by(|a, b| {
            a["share"]["all"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["share"]["all"].as_f64().unwrap())
        })
        .unwrap();
    assert_eq!(top["span"], "decode");
}

/// The simulated GPU's KPIs: utilisation per phase and energy per output token, bounded by
/// the simulated H100's power range (90–700 W) over the wall time of the whole run.
fn check_gpu_kpis(report: &Value, wall_seconds: f64) -> &Value {
    let s = &report["kpis"]["series"][0];
    let gpu = &s["gpu"];
    assert!(!gpu.is_null(), "the demo samples a simulated GPU: {s}");
    assert_eq!(
        gpu["requests"].as_u64(),
        s["requests"].as_u64(),
        "every request has GPU stats"
    );
    for phase in ["queue", "prefill", "decode"] {
        let u = gpu["utilization_mean"][phase]
            .as_f64()
            .unwrap_or_else(|| panic!("{phase}: {gpu}"));
        assert!((0.0..=1.0).contains(&u), "{phase}: {u}");
    }
    let energy = gpu["energy_attributed_joules"].as_f64().unwrap();
    assert!(
        energy > 0.0 && energy <= 700.0 * wall_seconds,
        "{energy} J in {wall_seconds} s"
    );
    let per_token = gpu["energy_per_output_token_joules"]
        .as_f64()
        .expect("energy per output token");
    let tokens = s["tokens"]["output"]
        .as_f64()
        .or_else(|| report["client"]["output_tokens"].as_f64())
        .unwrap();
    assert!(
        per_token > 0.0 && per_token * tokens <= 700.0 * wall_seconds,
        "{per_token} J/token × {tokens}"
    );
    gpu
}

#[test]
fn overload_demo_is_diagnosed_as_queueing_on_a_saturated_gpu() {
    let started = Instant::now();
    let report = demo(&["--duration", "8s", "--scenario", "overload"]);
    let wall = started.elapsed().as_secs_f64();
    let ids = rule_ids(&report);
    // max_num_seqs 8 keeps the engine stepping back to back: the queue is capacity-bound.
    assert!(
        ids.iter().any(|id| id == "queue-dominated-gpu-saturated"),
        "findings: {ids:?}"
    );
    assert!(
        !ids.iter().any(|id| id == "queue-dominated-gpu-idle"),
        "findings: {ids:?}"
    );
    let s = &report["kpis"]["series"][0];
    assert!(
        s["phase_share"]["p90"]["queue"].as_f64().unwrap() > 0.4,
        "{s}"
    );
    let gpu = check_gpu_kpis(&report, wall);
    // Requests wait while the engine is busy with the batch ahead of them.
    assert!(
        gpu["utilization_mean"]["queue"].as_f64().unwrap() > 0.9,
        "{gpu}"
    );
}

#[test]
fn long_prompt_demo_is_diagnosed_as_prefill_bound() {
    // 16 s at the scenario's 1.5 req/s: ~24 requests, past the rules' minimum of 20.
    let report = demo(&["--duration", "16s", "--scenario", "long-prompts"]);
    let ids = rule_ids(&report);
    assert!(
        report["kpis"]["series"][0]["requests"].as_u64() >= Some(20),
        "{report}"
    );
    // The scenario's long prompts prefill for ~1.2 s each on a mostly free engine: TTFT p90 is
    // above 1 s and is their prefill.
    assert!(
        ids.iter().any(|id| id == "prefill-dominated-ttft"),
        "findings: {ids:?}"
    );
    assert!(
        !ids.iter().any(|id| id.starts_with("queue-dominated")),
        "findings: {ids:?}"
    );
}

/// The disaggregated breakdown's rows by sub-phase name.
fn pd_phase<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["pd"]["phases"]
        .as_array()
        .expect("pd phases")
        .iter()
        .find(|p| p["phase"] == name)
        .unwrap_or_else(|| panic!("no {name} in {}", report["pd"]))
}

/// The disaggregated diagnosis rules' ids.
const PD_RULES: [&str; 4] = [
    "kv-transfer-dominates-ttft",
    "pd-ratio-prefill-bound",
    "pd-ratio-decode-bound",
    "decode-kv-memory-wait",
];

fn pd_rule_ids(report: &Value) -> Vec<String> {
    rule_ids(report)
        .into_iter()
        .filter(|id| PD_RULES.contains(&id.as_str()))
        .collect()
}

/// The finding with this rule id, and one of its evidence values by metric.
fn finding<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .expect("findings array")
        .iter()
        .find(|f| f["rule_id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {}", report["findings"]))
}

fn evidence(f: &Value, metric: &str) -> f64 {
    let e = f["evidence"]
        .as_array()
        .expect("evidence")
        .iter()
        .find(|e| e["metric"] == metric)
        .unwrap_or_else(|| panic!("no {metric} in {f}"));
    self::f(&e["value"], metric)
}

/// The collector's per-pool KPIs of the router's series: each pool's workers are the topology's,
/// and each worker's requests add up to every request.
fn check_pool_kpis(report: &Value, sent: u64, prefill: usize, decode: usize) -> &Value {
    let k = &report["kpis"]["series"][0]["disagg"];
    assert_eq!(k["requests"].as_u64(), Some(sent), "{k}");
    for (pool, n) in [("prefill", prefill), ("decode", decode)] {
        let p = k["pools"]
            .as_array()
            .expect("pools")
            .iter()
            .find(|p| p["pool"] == pool)
            .unwrap_or_else(|| panic!("no {pool} pool in {k}"));
        let want: Vec<String> = (0..n).map(|i| format!("pd-{pool}-{i}")).collect();
        let got: Vec<&str> = p["workers"]
            .as_array()
            .expect("workers")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(got, want, "{pool} workers");
        let served: u64 = k["workers"]
            .as_array()
            .expect("workers")
            .iter()
            .filter(|w| w["pool"] == pool)
            .map(|w| w["requests"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(served, sent, "{pool} workers' requests");
    }
    k
}

/// The sub-phases along time to first token, in time order.
const PD_TTFT_PHASES: [&str; 7] = [
    "routing",
    "prefill_queue",
    "prefill",
    "bootstrap",
    "kv_transfer",
    "decode_wait",
    "first_token",
];

#[test]
fn pd_demo_measures_every_sub_phase_across_services_against_the_truth() {
    let report = demo(&["--duration", "6s", "--scenario", "pd"]);
    let sent = report["client"]["sent"].as_u64().unwrap();
    assert!(sent >= 15, "6 s at 6 req/s sends ~36 requests, got {sent}");
    assert_eq!(
        report["client"]["ok"].as_u64(),
        Some(sent),
        "{}",
        report["client"]
    );
    // One record per request, the router's: the workers' request spans are parts of it.
    let series = report["kpis"]["series"].as_array().expect("series");
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0]["service"], "pd-router");
    assert_eq!(series[0]["requests"].as_u64(), Some(sent));
    // Every request was assembled across the five services with every sub-phase, and matched
    // to the simulator's truth of the same request.
    let pd = &report["pd"];
    assert_eq!(pd["topology"]["services"].as_array().map(Vec::len), Some(5));
    assert_eq!(pd["matched"].as_u64(), Some(sent), "{pd}");
    assert_eq!(pd["incomplete"].as_u64(), Some(0), "{pd}");

    // Each measured boundary is the truth's instant plus one wait for the CPU (a handler or
    // observer resuming after the simulator's timer, or a request's arrival before its handler
    // calls the simulator), each bounded by the run's p99 timer lateness: two per sub-phase.
    // TTFT ends after token 0 crosses three services back to the client's side of the router
    // (decode's frame, the prefill worker's relay, the router's relay): four waits.
    let noise = f(
        &report["ground_truth"]["scheduler_noise"]["p99"],
        "scheduler noise p99",
    );
    for name in PD_TTFT_PHASES.iter().chain(&["decode", "ttft"]) {
        let p = pd_phase(&report, name);
        assert_eq!(p["error"]["count"].as_u64(), Some(sent), "{name}: {p}");
        let waits = if *name == "ttft" { 4.0 } else { 2.0 };
        for q in ["p50", "p90"] {
            let err = f(&p["error"][q], &format!("{name} |error| {q}"));
            assert!(
                err <= waits * noise,
                "{name}: |measured − truth| {q} {err} s > {waits} × noise {noise} s: {p}"
            );
        }
        // A phase measured from marks that follow the truth's own never reads much shorter.
        let signed = f(&p["signed_error"]["p50"], &format!("{name} signed error"));
        assert!(
            signed >= -noise,
            "{name}: measured shorter than truth by {signed} s"
        );
    }
    // TTFT decomposes into the sub-phases: what is left is the hand-overs between services
    // (HTTP calls and relays, a handful of task wake-ups), never an overlap.
    let rest = f(&pd["unattributed"]["p50"], "unattributed TTFT p50");
    assert!(
        rest >= -noise && rest <= 8.0 * noise,
        "unattributed {rest} s (noise {noise})"
    );
    let ttft = f(&pd_phase(&report, "ttft")["measured"]["p50"], "ttft p50");
    let parts: f64 = PD_TTFT_PHASES
        .iter()
        .map(|n| f(&pd_phase(&report, n)["measured"]["p50"], n))
        .sum();
    assert!(
        parts <= ttft * 1.5,
        "sub-phase medians {parts} vs TTFT median {ttft}"
    );
    // The collector's KPIs per pool and worker; a balanced deployment: no PD finding.
    check_pool_kpis(&report, sent, 2, 2);
    assert_eq!(pd_rule_ids(&report), Vec::<String>::new());
}

#[test]
fn pd_kv_bound_demo_shows_the_transfer_dominating_ttft() {
    let report = demo(&["--duration", "6s", "--scenario", "pd-kv-bound"]);
    let median = |n: &str| f(&pd_phase(&report, n)["measured"]["p50"], n);
    let truth = |n: &str| f(&pd_phase(&report, n)["truth"]["p50"], n);
    // 5 Gb/s: the KV transfer is the largest sub-phase of TTFT, measured as in truth.
    for other in PD_TTFT_PHASES.iter().filter(|n| **n != "kv_transfer") {
        assert!(
            median("kv_transfer") > median(other) && truth("kv_transfer") > truth(other),
            "kv_transfer {} vs {other} {}",
            median("kv_transfer"),
            median(other)
        );
    }
    // The diagnosis names the link, with the transfer times the truth had.
    let sent = report["client"]["sent"].as_u64().unwrap();
    check_pool_kpis(&report, sent, 1, 2);
    assert_eq!(pd_rule_ids(&report), ["kv-transfer-dominates-ttft"]);
    let kv = finding(&report, "kv-transfer-dominates-ttft");
    let noise = f(
        &report["ground_truth"]["scheduler_noise"]["p99"],
        "scheduler noise p99",
    );
    let got = evidence(kv, "disagg.kv_transfer.p50");
    let want = truth("kv_transfer");
    assert!(
        (got - want).abs() <= SKETCH * want + 2.0 * noise,
        "kv_transfer p50 {got} vs truth {want} (noise {noise})"
    );
    // Half of each transfer saved by a link twice as fast: at p90, half the p90.
    let p90 = evidence(kv, "disagg.kv_transfer.p90");
    let saved = evidence(kv, "disagg.ttft_saved_at_2x_link.p90");
    assert!((saved - p90 / 2.0).abs() < 1e-9, "{saved} vs {p90}");
}

#[test]
fn pd_ratio_demo_shows_the_prefill_pool_queueing() {
    let report = demo(&["--duration", "6s", "--scenario", "pd-ratio"]);
    let median = |n: &str| f(&pd_phase(&report, n)["measured"]["p50"], n);
    let p90 = |n: &str| f(&pd_phase(&report, n)["measured"]["p90"], n);
    // One prefill worker for long prompts: requests queue there while the three decode
    // workers admit theirs at once.
    assert!(
        p90("prefill_queue") > p90("decode_wait") && median("prefill") > median("first_token"),
        "{}",
        report["pd"]
    );
    // The diagnosis names the prefill pool and the split to try.
    let sent = report["client"]["sent"].as_u64().unwrap();
    check_pool_kpis(&report, sent, 1, 3);
    assert_eq!(pd_rule_ids(&report), ["pd-ratio-prefill-bound"]);
    let r = finding(&report, "pd-ratio-prefill-bound");
    assert_eq!(evidence(r, "disagg.pools.prefill.workers"), 1.0);
    assert_eq!(evidence(r, "disagg.pools.decode.workers"), 3.0);
    check_sizing(r, 1, 3);
}

/// The ratio finding's DistServe-style sizing: each pool's goodput per GPU is the load × its SLO
/// attainment ÷ (workers × busy fraction), the GPUs each pool needs are the load ÷ that, and
/// the recommended split is the current GPU count shared in that proportion — recomputed here
/// from the finding's own inputs — and moves GPUs toward the waiting pool.
fn check_sizing(r: &Value, prefill: usize, decode: usize) {
    let e = |m: &str| evidence(r, m);
    let load = e("disagg.load.requests_per_second");
    let total = (prefill + decode) as f64;
    let mut need = [0.0; 2];
    for (i, (pool, n)) in [("prefill", prefill), ("decode", decode)]
        .iter()
        .enumerate()
    {
        let busy = e(&format!("disagg.pools.{pool}.busy"));
        assert!(busy > 0.0 && busy <= 1.0, "{pool} busy {busy}");
        let goodput = load * e(&format!("disagg.pools.{pool}.slo_attainment")) / (*n as f64 * busy);
        let got = e(&format!("disagg.pools.{pool}.goodput_per_gpu"));
        assert!(
            (got - goodput).abs() <= 1e-9 * goodput,
            "{pool}: {got} vs {goodput}"
        );
        need[i] = load / goodput;
    }
    let p = (total * need[0] / (need[0] + need[1]))
        .round()
        .clamp(1.0, total - 1.0);
    assert_eq!(e("disagg.sizing.prefill_workers"), p, "{r}");
    assert_eq!(e("disagg.sizing.decode_workers"), total - p, "{r}");
    let waiting_prefill = r["rule_id"] == "pd-ratio-prefill-bound";
    assert!(
        if waiting_prefill {
            p > prefill as f64
        } else {
            p < prefill as f64
        },
        "the split moves toward the waiting pool: {r}"
    );
    let rec = r["recommendation"].as_str().unwrap_or_default();
    let want = format!("{prefill}:{decode} → {p}:{}", total - p);
    assert!(rec.contains(&want), "{want} not in {rec}");
}

#[test]
fn pd_decode_bound_demo_shows_the_decode_pool_queueing() {
    let report = demo(&["--duration", "6s", "--scenario", "pd-decode-bound"]);
    let p90 = |n: &str| f(&pd_phase(&report, n)["measured"]["p90"], n);
    let truth90 = |n: &str| f(&pd_phase(&report, n)["truth"]["p90"], n);
    // One decode worker with 8 batch slots: requests wait for a slot after their KV arrived,
    // in the truth as in the spans, while the two prefill workers admit at once.
    assert!(
        p90("decode_wait") > p90("prefill_queue")
            && truth90("decode_wait") > truth90("prefill_queue"),
        "{}",
        report["pd"]
    );
    let sent = report["client"]["sent"].as_u64().unwrap();
    check_pool_kpis(&report, sent, 2, 1);
    assert_eq!(pd_rule_ids(&report), ["pd-ratio-decode-bound"]);
    let r = finding(&report, "pd-ratio-decode-bound");
    assert_eq!(evidence(r, "disagg.pools.prefill.workers"), 2.0);
    assert_eq!(evidence(r, "disagg.pools.decode.workers"), 1.0);
    // The decode wait the finding cites is the one the simulator had.
    let noise = f(
        &report["ground_truth"]["scheduler_noise"]["p99"],
        "scheduler noise p99",
    );
    let got = evidence(r, "disagg.decode_wait.p90");
    let want = truth90("decode_wait");
    assert!(
        (got - want).abs() <= SKETCH * want + 2.0 * noise,
        "decode_wait p90 {got} vs truth {want} (noise {noise})"
    );
    check_sizing(r, 2, 1);
}

#[test]
fn pd_kv_memory_demo_shows_requests_waiting_for_decode_kv_memory() {
    let report = demo(&["--duration", "6s", "--scenario", "pd-kv-memory"]);
    // The simulator's own account: requests waited for KV memory at bootstrap.
    let alloc_wait = f(
        &report["ground_truth"]["kv_alloc_wait"]["p90"],
        "kv_alloc_wait p90",
    );
    let median = |n: &str| f(&pd_phase(&report, n)["measured"]["p50"], n);
    let truth = |n: &str| f(&pd_phase(&report, n)["truth"]["p90"], n);
    assert!(
        alloc_wait > 0.0 && median("bootstrap") > median("decode_wait"),
        "{}",
        report["pd"]
    );
    let sent = report["client"]["sent"].as_u64().unwrap();
    check_pool_kpis(&report, sent, 2, 1);
    assert_eq!(pd_rule_ids(&report), ["decode-kv-memory-wait"]);
    let r = finding(&report, "decode-kv-memory-wait");
    let noise = f(
        &report["ground_truth"]["scheduler_noise"]["p99"],
        "scheduler noise p99",
    );
    let got = evidence(r, "disagg.bootstrap.p90");
    let want = truth("bootstrap");
    assert!(
        (got - want).abs() <= SKETCH * want + 2.0 * noise,
        "bootstrap p90 {got} vs truth {want} (noise {noise})"
    );
}
