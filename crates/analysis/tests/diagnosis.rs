//! Each diagnosis rule fires on KPIs built to trigger it, cites its numbers, and stays quiet on
//! a balanced workload.

use std::sync::Arc;

use infertrace_analysis::critical_path::{CriticalPathEntry, CriticalPathSummary, TailTriple};
use infertrace_analysis::diagnosis::{
    DiagnosisConfig, Finding, Severity, decode_concurrency, diagnose, diagnose_snapshot,
    diagnose_window, gpu_utilization_mean, undiagnosed,
};
use infertrace_analysis::kpi::{
    Goodput, GpuKpis, GpuPhaseUtilization, KpiSnapshot, LatencyStats, PhaseShare, PhaseShares,
    SeriesKpis, Throughput, TokenTotals,
};

fn lat(p50: f64, p90: f64, p95: f64, p99: f64) -> Option<LatencyStats> {
    Some(LatencyStats {
        p50,
        p90,
        p95,
        p99,
        max: p99 * 1.2,
        mean: p50 * 1.05,
    })
}

fn share(queue: f64, prefill: f64, decode: f64) -> Option<PhaseShare> {
    Some(PhaseShare {
        queue,
        prefill,
        decode,
    })
}

/// A healthy chat service: 600 requests in a minute, short queues, GPU at 75%, TTFT well under
/// a second, 30 ms per token, every SLO met.
fn balanced() -> SeriesKpis {
    SeriesKpis {
        service: "llm".into(),
        model: "llama-3.1-8b".into(),
        operation: "chat".into(),
        requests: 600,
        errors: 1,
        cancelled: 3,
        rejected: 0,
        e2e: lat(4.0, 6.5, 7.2, 9.0),
        queue: lat(0.02, 0.08, 0.1, 0.2),
        ttft: lat(0.15, 0.35, 0.4, 0.6),
        prefill: lat(0.12, 0.25, 0.3, 0.4),
        decode: lat(3.8, 6.0, 6.8, 8.5),
        tpot: lat(0.03, 0.04, 0.045, 0.05),
        itl: lat(0.03, 0.04, 0.045, 0.06),
        itl_p99: None,
        tokens: TokenTotals {
            input: 600 * 800,
            output: 600 * 130,
        },
        throughput: Throughput {
            requests_per_second: 10.0,
            input_tokens_per_second: 8000.0,
            output_tokens_per_second: 1300.0,
        },
        goodput: Goodput {
            ratio: Some(0.98),
            requests_per_second: 9.8,
        },
        phase_share: PhaseShares {
            all: share(0.01, 0.04, 0.94),
            p90: share(0.02, 0.04, 0.93),
            p99: share(0.03, 0.05, 0.91),
        },
        gpu: Some(GpuKpis {
            requests: 600,
            utilization_mean: GpuPhaseUtilization {
                queue: Some(0.75),
                prefill: Some(0.8),
                decode: Some(0.75),
            },
            energy_attributed_joules: 60_000.0,
            energy_per_output_token_joules: Some(0.77),
        }),
        disagg: None,
    }
}

fn set_gpu(s: &mut SeriesKpis, util: Option<f64>) {
    match util {
        Some(u) => {
            let g = s.gpu.as_mut().unwrap();
            g.utilization_mean = GpuPhaseUtilization {
                queue: Some(u),
                prefill: Some(u),
                decode: Some(u),
            };
        }
        None => s.gpu = None,
    }
}

fn run(s: &SeriesKpis) -> Vec<Finding> {
    diagnose(s, None, &DiagnosisConfig::default())
}

fn ids(f: &[Finding]) -> Vec<&'static str> {
    f.iter().map(|f| f.rule_id).collect()
}

fn only<'a>(f: &'a [Finding], id: &str) -> &'a Finding {
    assert_eq!(
        f.iter().filter(|x| x.rule_id == id).count(),
        1,
        "expected one {id}: {:?}",
        ids(f)
    );
    f.iter().find(|x| x.rule_id == id).unwrap()
}

fn evidence(f: &Finding, metric: &str) -> f64 {
    f.evidence
        .iter()
        .find(|e| e.metric == metric)
        .unwrap_or_else(|| panic!("no evidence {metric} in {f:?}"))
        .value
}

#[test]
fn balanced_workload_has_no_findings() {
    let f = run(&balanced());
    assert!(f.is_empty(), "{f:#?}");
    // Also with GPU data missing: nothing to say about the GPU either.
    let mut s = balanced();
    set_gpu(&mut s, None);
    assert!(run(&s).is_empty());
}

#[test]
fn helper_values_match_hand_computation() {
    let s = balanced();
    // (0.75·0.021 + 0.8·0.126 + 0.75·3.99) / (0.021 + 0.126 + 3.99)
    let m = |p50: f64| p50 * 1.05;
    let (q, p, d) = (m(0.02), m(0.12), m(3.8));
    let expect = (0.75 * q + 0.8 * p + 0.75 * d) / (q + p + d);
    assert!((gpu_utilization_mean(&s).unwrap() - expect).abs() < 1e-12);
    assert!((decode_concurrency(&s).unwrap() - 10.0 * d).abs() < 1e-12);
}

/// Without a tail share (too few requests) the rule reads the share over all requests, and
/// its title says so rather than speaking of the slowest 10 %.
#[test]
fn queue_dominated_over_all_requests_says_so() {
    let mut s = balanced();
    s.phase_share.p90 = None;
    s.phase_share.all = share(0.6, 0.03, 0.37);
    let f = run(&s);
    let q = f
        .iter()
        .find(|f| f.rule_id.starts_with("queue-dominated"))
        .expect("a queue finding");
    assert_eq!(evidence(q, "phase_share.all.queue"), 0.6);
    assert!(q.title.starts_with("Requests spend 60%"), "{}", q.title);
}

#[test]
fn queue_dominated_with_saturated_gpu_is_capacity_bound() {
    let mut s = balanced();
    s.phase_share.p90 = share(0.55, 0.03, 0.40);
    set_gpu(&mut s, Some(0.98));
    let f = run(&s);
    let q = only(&f, "queue-dominated-gpu-saturated");
    assert_eq!(q.severity, Severity::Warning);
    assert_eq!(evidence(q, "phase_share.p90.queue"), 0.55);
    assert_eq!(evidence(q, "gpu.utilization.mean"), 0.98);
    assert!(
        q.title.contains("55%") && q.title.contains("98%"),
        "{}",
        q.title
    );
    assert!(q.recommendation.contains("add replicas"));
    assert_eq!(
        (q.service.as_str(), q.model.as_str()),
        ("llm", "llama-3.1-8b")
    );
    // The GPU level is not reported twice.
    assert!(!ids(&f).contains(&"gpu-saturated"));
}

#[test]
fn queue_dominated_with_idle_gpu_is_a_limit_too_low() {
    let mut s = balanced();
    s.phase_share.p90 = share(0.6, 0.03, 0.35);
    set_gpu(&mut s, Some(0.3));
    let f = run(&s);
    let q = only(&f, "queue-dominated-gpu-idle");
    assert!(
        q.title.contains("60%") && q.title.contains("30%"),
        "{}",
        q.title
    );
    assert!(q.recommendation.contains("--max-num-seqs"));
    assert!(!ids(&f).contains(&"gpu-underutilized"));
}

#[test]
fn queue_dominated_without_gpu_data_names_both_causes() {
    let mut s = balanced();
    s.phase_share.p90 = share(0.45, 0.05, 0.48);
    set_gpu(&mut s, None);
    let f = run(&s);
    let q = only(&f, "queue-dominated");
    assert!(q.title.contains("45%") && q.title.contains("no GPU data"));
    assert!(q.recommendation.contains("add replicas"));
    assert!(q.recommendation.contains("--max-num-seqs"));
    assert!(q.recommendation.contains("Measure GPU utilisation"));
    // Just under the threshold: quiet.
    s.phase_share.p90 = share(0.39, 0.05, 0.5);
    assert!(run(&s).is_empty());
}

#[test]
fn queue_evidence_includes_the_critical_path_when_given() {
    let mut s = balanced();
    s.phase_share.p90 = share(0.5, 0.05, 0.44);
    let crit = CriticalPathSummary {
        window_seconds: 60.0,
        requests: 600,
        tail_requests: TailTriple::default(),
        e2e_seconds: TailTriple::default(),
        entries: vec![CriticalPathEntry {
            service: Arc::from("llm"),
            span: Arc::from("queue"),
            seconds: TailTriple::default(),
            share: TailTriple {
                all: 0.2,
                p90: 0.52,
                p99: 0.6,
            },
        }],
    };
    let f = diagnose(&s, Some(&crit), &DiagnosisConfig::default());
    let q = only(&f, "queue-dominated");
    assert_eq!(evidence(q, "critical_path.share.p90.queue"), 0.52);
    // The summary's tails are every series' slowest requests together, and a gateway's request
    // and its engine's are two paths of one trace there: with a gateway in front, the evidence
    // is left out (a review: shares halved, the engine's request span named a hotspot).
    let mut gateway = balanced();
    gateway.service = "app".into();
    let snapshot = |series: Vec<SeriesKpis>| KpiSnapshot {
        window_seconds: 60.0,
        series,
    };
    let has_cp = |f: &[Finding]| {
        let q = only(f, "queue-dominated");
        q.evidence
            .iter()
            .any(|e| e.metric == "critical_path.share.p90.queue")
    };
    let cfg = DiagnosisConfig::default();
    let f = diagnose_snapshot(&snapshot(vec![s.clone(), gateway]), Some(&crit), &cfg);
    assert!(!has_cp(&f), "{f:?}");
    // One engine alone keeps it, whether or not its spans name the operation.
    let f = diagnose_snapshot(&snapshot(vec![s.clone()]), Some(&crit), &cfg);
    assert!(has_cp(&f), "{f:?}");
    let mut unnamed = s.clone();
    unnamed.operation = "unknown".into();
    let f = diagnose_snapshot(&snapshot(vec![unnamed]), Some(&crit), &cfg);
    assert!(has_cp(&f), "{f:?}");
    // Beside another model's requests the tail may be theirs: left out (a reviewer's queued
    // model read 0 % queue on the critical path of a tail of another model's long decodes).
    let mut other = balanced();
    other.model = "other".into();
    let f = diagnose_snapshot(&snapshot(vec![s.clone(), other.clone()]), Some(&crit), &cfg);
    assert!(!has_cp(&f), "{f:?}");
    // …unless that model had no request in the window.
    other.requests = 0;
    let f = diagnose_snapshot(&snapshot(vec![s, other]), Some(&crit), &cfg);
    assert!(has_cp(&f), "{f:?}");
}

#[test]
fn prefill_dominated_ttft_points_at_long_prompts() {
    let mut s = balanced();
    s.ttft = lat(0.9, 2.0, 2.4, 3.0);
    s.prefill = lat(0.8, 1.8, 2.2, 2.8);
    s.tokens.input = 600 * 12_000;
    let f = run(&s);
    let p = only(&f, "prefill-dominated-ttft");
    assert!((evidence(p, "prefill.p90 / ttft.p90") - 0.9).abs() < 1e-12);
    assert_eq!(evidence(p, "tokens.input per request"), 12_000.0);
    assert!(p.title.contains("2.00 s") && p.title.contains("90%") && p.title.contains("12000"));
    assert!(p.recommendation.contains("prefix caching"));
    assert!(p.recommendation.contains("chunked prefill"));
    // Slow TTFT caused by queueing, not prefill: this rule is quiet.
    s.prefill = lat(0.1, 0.3, 0.35, 0.4);
    assert!(!ids(&run(&s)).contains(&"prefill-dominated-ttft"));
}

#[test]
fn high_tpot_at_large_batch_is_bandwidth_bound() {
    let mut s = balanced();
    s.tpot = lat(0.12, 0.16, 0.18, 0.2);
    // Every step is slow, not a few: the typical gap between tokens is as long as the mean.
    s.itl = lat(0.12, 0.15, 0.17, 0.2);
    // 10 req/s × 3.99 s mean decode ≈ 40 requests decoding at once.
    let f = run(&s);
    let t = only(&f, "high-tpot-large-batch");
    assert!((evidence(t, "decode concurrency (Little's law)") - 39.9).abs() < 1e-9);
    assert!(
        t.title.contains("160 ms") && t.title.contains("40 requests"),
        "{}",
        t.title
    );
    assert!(t.recommendation.contains("speculative decoding"));
    assert!(t.recommendation.contains("quantise"));
    // Same TPOT at a small batch: a different diagnosis.
    s.throughput.requests_per_second = 1.0;
    let f = run(&s);
    assert!(!ids(&f).contains(&"high-tpot-large-batch"));
    let t = only(&f, "high-tpot");
    assert!(t.title.contains("4.0 requests"), "{}", t.title);
}

#[test]
fn slow_tpot_from_stalls_is_not_blamed_on_the_batch() {
    // Measured on the long-prompt demo: 17 ms between most tokens, 125 ms per token on average,
    // because 6,000-token prefills pause every running decode.
    let mut s = balanced();
    s.tpot = lat(0.125, 0.239, 0.286, 0.389);
    s.itl = lat(0.017, 0.0186, 0.0202, 0.0202);
    let f = run(&s);
    let i = only(&f, "inter-token-stalls");
    assert!((evidence(i, "tpot.p50 / itl.p50") - 0.125 / 0.017).abs() < 1e-9);
    assert!(
        i.title.contains("17 ms") && i.title.contains("125 ms"),
        "{}",
        i.title
    );
    assert!(!ids(&f).contains(&"high-tpot-large-batch"), "{:?}", ids(&f));
    assert!(!ids(&f).contains(&"high-tpot"), "{:?}", ids(&f));
}

/// A reviewer's case: 1 % of every request's gaps are 1.2 s pauses, so each request's p99 gap
/// is 1.2 s against a 30 ms median, while the requests' medians are alike and the mean per
/// token is only 1.4× the median gap.
#[test]
fn pauses_within_every_request_are_stalls() {
    let mut s = balanced();
    s.itl = lat(0.03, 0.031, 0.032, 0.033);
    s.tpot = lat(0.042, 0.044, 0.045, 0.046);
    s.itl_p99 = lat(0.03, 0.031, 0.032, 0.033);
    assert!(!ids(&run(&s)).contains(&"inter-token-stalls"));
    // The balanced demo's pauses for admitted prefills (60 ms against 8 ms gaps): normal.
    s.itl = lat(0.008, 0.0085, 0.009, 0.0095);
    s.tpot = lat(0.0099, 0.011, 0.012, 0.013);
    s.itl_p99 = lat(0.06, 0.07, 0.08, 0.09);
    assert!(!ids(&run(&s)).contains(&"inter-token-stalls"));
    // A review's case: 114 ms pauses against 15 ms gaps (7.6×) under a tight 50 ms TPOT
    // threshold: not stalls either.
    s.itl = lat(0.015, 0.016, 0.017, 0.018);
    s.tpot = lat(0.019, 0.02, 0.021, 0.022);
    s.itl_p99 = lat(0.114, 0.12, 0.13, 0.14);
    let tight = DiagnosisConfig {
        tpot_p90_max_seconds: 0.05,
        ..DiagnosisConfig::default()
    };
    assert!(!ids(&diagnose(&s, None, &tight)).contains(&"inter-token-stalls"));
    s.itl = lat(0.03, 0.031, 0.032, 0.033);
    s.tpot = lat(0.042, 0.044, 0.045, 0.046);
    s.itl_p99 = lat(1.2, 1.2, 1.2, 1.2);
    let f = run(&s);
    let i = only(&f, "inter-token-stalls");
    assert!((evidence(i, "itl_p99.p50 / itl.p50") - 40.0).abs() < 1e-9);
    assert!(
        i.title.contains("half the requests pause 1.20 s")
            && i.title.contains("30 ms")
            && i.title.contains("40.0×"),
        "{}",
        i.title
    );
}

#[test]
fn inter_token_stalls_fire_on_a_heavy_tail() {
    let mut s = balanced();
    s.itl = lat(0.03, 0.05, 0.08, 0.24);
    let f = run(&s);
    let i = only(&f, "inter-token-stalls");
    assert!((evidence(i, "itl.p99 / itl.p50") - 8.0).abs() < 1e-9);
    assert!(i.title.contains("240 ms") && i.title.contains("30 ms") && i.title.contains("8.0×"));
    assert!(i.recommendation.contains("chunked"));
    assert!(i.recommendation.contains("disaggregated"));
}

#[test]
fn gpu_levels_alone() {
    let mut s = balanced();
    set_gpu(&mut s, Some(0.97));
    let f = run(&s);
    assert_eq!(ids(&f), ["gpu-saturated"]);
    assert!(f[0].title.contains("97%"));
    // Busy but nobody waits: a capacity note, not a warning.
    assert_eq!(f[0].severity, Severity::Info, "{}", f[0].title);
    // Once the slow requests queue, the same level is a warning.
    let mut queued = s.clone();
    if let Some(p) = queued.phase_share.p90.as_mut() {
        p.queue = 0.2;
    }
    let f = run(&queued);
    let g = only(&f, "gpu-saturated");
    assert_eq!(g.severity, Severity::Warning);
    set_gpu(&mut s, Some(0.35));
    let f = run(&s);
    assert_eq!(ids(&f), ["gpu-underutilized"]);
    assert!(f[0].title.contains("35%"));
}

#[test]
fn slo_breach_is_critical_and_ordered_first() {
    let mut s = balanced();
    s.e2e = lat(20.0, 31.0, 36.0, 50.0);
    s.goodput.ratio = Some(0.8);
    let f = run(&s);
    assert_eq!(ids(&f), ["e2e-slo-breach", "goodput-below-target"]);
    assert_eq!(f[0].severity, Severity::Critical);
    assert!(
        f[0].title.contains("36.00 s")
            && f[0].title.contains("30.00 s")
            && f[0].title.contains("20% over")
    );
    assert!(f[1].title.contains("80%") && f[1].title.contains("90%"));
    // The SLO can be switched off.
    let cfg = DiagnosisConfig {
        e2e_p95_slo_seconds: None,
        ..DiagnosisConfig::default()
    };
    assert_eq!(ids(&diagnose(&s, None, &cfg)), ["goodput-below-target"]);
}

/// A reviewer's case: 12.5 % of requests fail with a 500 and every served one is within its
/// SLOs; goodput is low because of the errors, not slowness.
#[test]
fn goodput_lost_to_errors_says_so() {
    let mut s = balanced();
    s.requests = 136;
    s.cancelled = 0;
    s.errors = 17;
    s.goodput.ratio = Some(0.875);
    let f = run(&s);
    let g = only(&f, "goodput-below-target");
    assert!(
        g.recommendation
            .starts_with("Most of the shortfall is requests that failed (12%"),
        "{}",
        g.recommendation
    );
    assert!((evidence(g, "failed (errors + rejected) / requests") - 0.125).abs() < 1e-12);
    // Mostly slow: the slowness advice, with the split.
    s.errors = 2;
    s.goodput.ratio = Some(0.8);
    let f = run(&s);
    let g = only(&f, "goodput-below-target");
    assert!(
        g.recommendation
            .starts_with("Requests are served but too slowly")
    );
    assert!(
        g.recommendation.contains("failed.)"),
        "{}",
        g.recommendation
    );
}

/// A reviewer's case: a slow prefill on ~600-token prompts is not a prompt-length problem.
#[test]
fn slow_prefill_of_short_prompts_points_at_contention() {
    let mut s = balanced();
    s.ttft = lat(0.9, 2.0, 2.4, 3.0);
    s.prefill = lat(0.8, 1.8, 2.2, 2.8);
    s.tokens.input = 600 * 613;
    let f = run(&s);
    let p = only(&f, "prefill-dominated-ttft");
    assert!(
        p.title.contains("prompts average 613 input tokens"),
        "{}",
        p.title
    );
    assert!(
        p.recommendation.starts_with("Prompts are short"),
        "{}",
        p.recommendation
    );
    assert!(!p.recommendation.contains("trim or cap prompt length"));
}

#[test]
fn throughput_floor_is_off_by_default() {
    let mut s = balanced();
    s.throughput.requests_per_second = 0.5;
    assert!(!ids(&run(&s)).contains(&"throughput-below-floor"));
    let cfg = DiagnosisConfig {
        throughput_min_rps: Some(5.0),
        ..DiagnosisConfig::default()
    };
    let f = diagnose(&s, None, &cfg);
    let t = only(&f, "throughput-below-floor");
    assert_eq!(evidence(t, "throughput.requests_per_second"), 0.5);
    assert!(t.title.contains("0.50") && t.title.contains("5.00"));
}

#[test]
fn error_rejection_and_cancel_rates() {
    let mut s = balanced();
    s.errors = 12; // 2%
    s.rejected = 9; // 1.5%
    s.cancelled = 42; // 7%
    let f = run(&s);
    let e = only(&f, "error-rate");
    assert_eq!(e.severity, Severity::Critical);
    assert!((evidence(e, "error_rate") - 0.02).abs() < 1e-12);
    assert!(e.title.contains("2.0%") && e.title.contains("12 of 600"));
    assert!((evidence(only(&f, "rejection-rate"), "rejection_rate") - 0.015).abs() < 1e-12);
    let c = only(&f, "cancel-rate");
    assert_eq!(c.severity, Severity::Warning);
    assert!(c.title.contains("7.0%") && c.title.contains("42 of 600"));
    // Criticals first.
    assert!(f.windows(2).all(|w| w[0].severity >= w[1].severity));
}

#[test]
fn few_requests_get_no_findings_but_the_throughput_floor() {
    let mut s = balanced();
    s.requests = 10;
    s.errors = 5;
    s.phase_share.p90 = share(0.9, 0.05, 0.05);
    s.e2e = lat(40.0, 50.0, 60.0, 70.0);
    assert!(run(&s).is_empty());
    let cfg = DiagnosisConfig {
        throughput_min_rps: Some(20.0),
        ..DiagnosisConfig::default()
    };
    assert_eq!(ids(&diagnose(&s, None, &cfg)), ["throughput-below-floor"]);
    s.requests = 20;
    assert!(ids(&run(&s)).contains(&"error-rate"));
}

#[test]
fn critical_path_hotspot_names_the_span() {
    let s = balanced();
    let entry = |span: &str, p99: f64| CriticalPathEntry {
        service: Arc::from("llm"),
        span: Arc::from(span),
        seconds: TailTriple::default(),
        share: TailTriple {
            all: p99 / 2.0,
            p90: p99,
            p99,
        },
    };
    let crit = CriticalPathSummary {
        window_seconds: 60.0,
        requests: 600,
        tail_requests: TailTriple::default(),
        e2e_seconds: TailTriple::default(),
        entries: vec![
            entry("decode", 0.5),
            entry("tokenize", 0.1),
            entry("retrieve", 0.4),
        ],
    };
    let f = diagnose(&s, Some(&crit), &DiagnosisConfig::default());
    let h = only(&f, "critical-path-hotspot");
    assert!(
        h.title.contains("'retrieve'") && h.title.contains("40%"),
        "{}",
        h.title
    );
    assert_eq!(evidence(h, "critical_path.share.p99.retrieve"), 0.4);
    // Phases dominating is normal.
    let crit = CriticalPathSummary {
        entries: vec![entry("decode", 0.9), entry("tokenize", 0.05)],
        ..crit
    };
    assert!(diagnose(&s, Some(&crit), &DiagnosisConfig::default()).is_empty());
}

#[test]
fn snapshot_diagnosis_covers_every_series_but_overflow() {
    let mut slow = balanced();
    slow.model = "llama-70b".into();
    slow.errors = 60;
    let mut overflow = slow.clone();
    overflow.service = "__overflow__".into();
    let snap = KpiSnapshot {
        window_seconds: 60.0,
        series: vec![balanced(), slow, overflow],
    };
    let f = diagnose_snapshot(&snap, None, &DiagnosisConfig::default());
    assert_eq!(ids(&f), ["error-rate"]);
    assert_eq!(f[0].model, "llama-70b");
    let json = serde_json::to_value(&f[0]).unwrap();
    assert_eq!(json["rule_id"], "error-rate");
    assert_eq!(json["severity"], "critical");
    assert_eq!(json["evidence"][0]["metric"], "error_rate");
}

/// A series under `min_requests` is listed as not judged, whatever its KPIs say; one at the
/// minimum is judged; overflow and idle series are neither.
#[test]
fn series_too_quiet_to_judge_are_listed_as_undiagnosed() {
    let mut quiet = balanced();
    quiet.model = "quiet".into();
    quiet.errors = 19;
    quiet.requests = 19;
    let mut judged = quiet.clone();
    judged.model = "judged".into();
    judged.errors = 20;
    judged.requests = 20;
    let mut idle = balanced();
    idle.model = "idle".into();
    idle.requests = 0;
    let mut overflow = quiet.clone();
    overflow.service = "__overflow__".into();
    let snap = KpiSnapshot {
        window_seconds: 60.0,
        series: vec![quiet, judged, idle, overflow],
    };
    let d = diagnose_window(&snap, None, &DiagnosisConfig::default());
    assert_eq!(d.min_requests, 20);
    assert!(
        d.findings.iter().all(|f| f.model == "judged"),
        "{:?}",
        d.findings
    );
    assert!(ids(&d.findings).contains(&"error-rate"));
    let names: Vec<(&str, u64)> = d
        .undiagnosed
        .iter()
        .map(|u| (u.model.as_str(), u.requests))
        .collect();
    assert_eq!(names, [("quiet", 19)]);
    assert_eq!(
        undiagnosed(&snap, &DiagnosisConfig::default()),
        d.undiagnosed
    );
}
