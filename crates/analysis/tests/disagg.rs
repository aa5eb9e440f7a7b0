//! Disaggregated prefill/decode serving: the KPIs per pool and per worker against values
//! computed here over the same generated requests, and the disaggregated diagnosis rules on
//! deployments whose bottleneck is known by construction.

use std::time::Duration;

use infertrace_analysis::diagnosis::{DiagnosisConfig, Finding, Severity, diagnose};
use infertrace_analysis::kpi::{
    Accumulator, DisaggKpis, KpiConfig, KpiWindows, LatencyStats, Pool, SeriesKpis, SloConfig,
    sketch_config,
};
use infertrace_analysis::record::{DisaggPhases, Outcome, RequestRecord};
use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{SpanId, TraceId};

const SEC: u64 = 1_000_000_000;
/// A whole number of hours, so every ring's slots start at T.
const T: u64 = 472_222 * 3600 * SEC;

/// SplitMix64: a small deterministic generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
}

/// Medians of each sub-phase of a deployment, seconds; each request draws every sub-phase
/// uniformly in [0.5, 1.5] × its median.
#[derive(Clone, Copy)]
struct Deployment {
    prefill_workers: usize,
    decode_workers: usize,
    routing: f64,
    bootstrap: f64,
    prefill_queue: f64,
    prefill: f64,
    kv_transfer: f64,
    decode_bootstrap: f64,
    decode_wait: f64,
    first_token: f64,
    decode: f64,
}

/// The demo's balanced `pd` scenario, roughly (docs/disaggregated.md).
const BALANCED: Deployment = Deployment {
    prefill_workers: 2,
    decode_workers: 2,
    routing: 0.0012,
    bootstrap: 0.0022,
    prefill_queue: 0.0003,
    prefill: 0.029,
    kv_transfer: 0.0025,
    decode_bootstrap: 0.001,
    decode_wait: 0.0026,
    first_token: 0.0077,
    decode: 0.69,
};

/// What one generated request really spent in each sub-phase, and its hand-over rest.
struct Truth {
    phases: [f64; 9],
    rest: f64,
    prefill_worker: String,
    decode_worker: String,
    input_tokens: u64,
}

impl Truth {
    fn ttft(&self) -> f64 {
        // Along TTFT: every sub-phase but decode_bootstrap (5) and decode (8).
        [0, 1, 2, 3, 4, 6, 7]
            .iter()
            .map(|&i| self.phases[i])
            .sum::<f64>()
            + self.rest
    }
}

const NAMES: [&str; 9] = [
    "routing",
    "bootstrap",
    "prefill_queue",
    "prefill",
    "kv_transfer",
    "decode_bootstrap",
    "decode_wait",
    "first_token",
    "decode",
];

fn generate(d: &Deployment, n: usize, seed: u64) -> Vec<Truth> {
    let mut rng = Rng(seed);
    let medians = [
        d.routing,
        d.bootstrap,
        d.prefill_queue,
        d.prefill,
        d.kv_transfer,
        d.decode_bootstrap,
        d.decode_wait,
        d.first_token,
        d.decode,
    ];
    (0..n)
        .map(|k| Truth {
            phases: medians.map(|m| m * rng.uniform(0.5, 1.5)),
            rest: rng.uniform(0.0, 0.001),
            prefill_worker: format!("pd-prefill-{}", k % d.prefill_workers),
            decode_worker: format!("pd-decode-{}", (k / 2) % d.decode_workers),
            input_tokens: 200 + rng.next() % 600,
        })
        .collect()
}

/// The record the collector builds for a request with this truth (the router's span).
fn record(t: &Truth) -> RequestRecord {
    let ttft = t.ttft();
    let e2e = ttft + t.phases[8];
    let mut r = RequestRecord::new(
        TraceId([7; 16]),
        SpanId([7; 8]),
        Text::from("pd-router"),
        infertrace_analysis::record::Dialect::Infertrace,
        T,
        T + (e2e * 1e9) as u64,
    );
    r.e2e = e2e;
    r.model = "m".into();
    r.operation = "chat".into();
    r.ttft = Some(ttft);
    r.queue = Some(t.phases[2]);
    r.prefill = Some(t.phases[3]);
    r.decode = Some(t.phases[8]);
    r.input_tokens = Some(t.input_tokens);
    r.output_tokens = Some(100);
    let p = t.phases;
    r.disagg = Some(Box::new(DisaggPhases {
        routing: Some(p[0]),
        bootstrap: Some(p[1]),
        prefill_queue: Some(p[2]),
        prefill: Some(p[3]),
        kv_transfer: Some(p[4]),
        decode_bootstrap: Some(p[5]),
        decode_wait: Some(p[6]),
        first_token: Some(p[7]),
        decode: Some(p[8]),
        prefill_worker: Some(Text::from(t.prefill_worker.as_str())),
        decode_worker: Some(Text::from(t.decode_worker.as_str())),
    }));
    r
}

/// The series' KPIs over a minute after recording the requests (plus `extra` records).
fn series(truths: &[Truth], extra: &[RequestRecord]) -> SeriesKpis {
    let mut w = KpiWindows::new(KpiConfig::default());
    for (k, t) in truths.iter().enumerate() {
        w.record(&record(t), T + (k as u64 % 50) * SEC);
    }
    for r in extra {
        w.record(r, T + 50 * SEC);
    }
    let snap = w.snapshot(Duration::from_secs(60), T + 55 * SEC);
    assert_eq!(snap.series.len(), 1, "{snap:#?}");
    snap.series.into_iter().next().unwrap()
}

/// The exact quantile at the sketch's rank definition: the value at rank ⌊q·(n − 1)⌋.
fn exact_quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[(q * (sorted.len() as f64 - 1.0)) as usize]
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

fn assert_stats(stats: &LatencyStats, values: &[f64], what: &str) {
    for (q, got) in [(0.5, stats.p50), (0.9, stats.p90), (0.99, stats.p99)] {
        let want = exact_quantile(values, q);
        let err = (got - want).abs() / want;
        assert!(err <= 0.01, "{what} p{q}: {got} vs exact {want} ({err:.4})");
    }
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    assert_eq!(stats.max, max, "{what} max");
    assert!(
        (stats.mean - mean(values)).abs() <= 1e-9 * mean(values),
        "{what} mean"
    );
}

fn disagg(s: &SeriesKpis) -> &DisaggKpis {
    s.disagg.as_ref().expect("disaggregated KPIs")
}

#[test]
fn sub_phase_kpis_per_pool_and_per_worker_match_the_generated_requests() {
    let d = Deployment {
        prefill_workers: 3,
        decode_workers: 2,
        ..BALANCED
    };
    let truths = generate(&d, 600, 11);
    // A failed request's sub-phases do not count (latencies are `ok` requests'), nor does a
    // plain request's absence of them.
    let mut failed = record(&truths[0]);
    failed.outcome = Outcome::Error;
    let mut plain = record(&truths[1]);
    plain.disagg = None;
    let s = series(&truths, &[failed, plain]);
    let k = disagg(&s);
    assert_eq!(s.requests, 602);
    assert_eq!(k.requests, 600);
    let ttfts: Vec<f64> = truths.iter().map(Truth::ttft).collect();
    assert_stats(k.ttft.as_ref().expect("ttft"), &ttfts, "ttft");

    // The pools: each sub-phase in its pool, its percentiles and its share of TTFT.
    let pools: Vec<Pool> = k.pools.iter().map(|p| p.pool).collect();
    assert_eq!(pools, [Pool::Router, Pool::Prefill, Pool::Decode]);
    let pool_of = |i: usize| match i {
        0 => Pool::Router,
        1..=4 => Pool::Prefill,
        _ => Pool::Decode,
    };
    let total_ttft: f64 = ttfts.iter().sum();
    for (i, name) in NAMES.iter().enumerate() {
        let pool = k.pools.iter().find(|p| p.pool == pool_of(i)).unwrap();
        let sp = pool
            .sub_phases
            .iter()
            .find(|s| s.name == *name)
            .unwrap_or_else(|| panic!("{name} not in {:?}", pool.pool));
        let values: Vec<f64> = truths.iter().map(|t| t.phases[i]).collect();
        assert_stats(&sp.latency, &values, name);
        match sp.ttft_share {
            Some(share) => {
                assert!(![5, 8].contains(&i), "{name} is not along TTFT");
                let want = values.iter().sum::<f64>() / total_ttft;
                assert!(
                    (share - want).abs() < 1e-9,
                    "{name} share {share} vs {want}"
                );
            }
            None => assert!([5, 8].contains(&i), "{name} has no share"),
        }
    }
    let prefill_pool = &k.pools[1];
    assert_eq!(
        prefill_pool.workers,
        ["pd-prefill-0", "pd-prefill-1", "pd-prefill-2"]
    );
    assert_eq!(k.pools[2].workers, ["pd-decode-0", "pd-decode-1"]);
    assert!(k.pools[0].workers.is_empty());

    // KV transfer rate: Σ prompt tokens / Σ transfer seconds.
    let rate = |ts: &[&Truth]| {
        ts.iter().map(|t| t.input_tokens).sum::<u64>() as f64
            / ts.iter().map(|t| t.phases[4]).sum::<f64>()
    };
    let all: Vec<&Truth> = truths.iter().collect();
    let got = k.kv_transfer_tokens_per_second.expect("kv rate");
    assert!(
        (got - rate(&all)).abs() < 1e-6 * got,
        "{got} vs {}",
        rate(&all)
    );

    // Per worker: its requests and its pool's sub-phases over exactly those.
    assert_eq!(k.workers.len(), 5);
    for w in &k.workers {
        let mine: Vec<&Truth> = truths
            .iter()
            .filter(|t| match w.pool {
                Pool::Prefill => t.prefill_worker == w.worker,
                _ => t.decode_worker == w.worker,
            })
            .collect();
        assert_eq!(w.requests, mine.len() as u64, "{}", w.worker);
        let positions: &[usize] = match w.pool {
            Pool::Prefill => &[1, 2, 3, 4],
            _ => &[5, 6, 7, 8],
        };
        let names: Vec<&str> = w.sub_phases.iter().map(|s| s.name).collect();
        let want: Vec<&str> = positions.iter().map(|&i| NAMES[i]).collect();
        assert_eq!(names, want, "{}", w.worker);
        for (sp, &i) in w.sub_phases.iter().zip(positions) {
            let values: Vec<f64> = mine.iter().map(|t| t.phases[i]).collect();
            assert_stats(&sp.latency, &values, &format!("{} {}", w.worker, sp.name));
            assert_eq!(sp.ttft_share, None);
        }
        match w.pool {
            Pool::Prefill => {
                let got = w.kv_transfer_tokens_per_second.expect("worker kv rate");
                assert!((got - rate(&mine)).abs() < 1e-6 * got, "{}", w.worker);
            }
            _ => assert_eq!(w.kv_transfer_tokens_per_second, None),
        }
    }
    // Serialised under the series as `disagg`; a series without PD requests leaves it out.
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["disagg"]["pools"][1]["pool"], "prefill");
    assert_eq!(json["disagg"]["workers"][0]["worker"], "pd-prefill-0");
    assert_eq!(json["disagg"]["workers"][3]["worker"], "pd-decode-0");
    let mut plain = record(&truths[0]);
    plain.disagg = None;
    let mut w = KpiWindows::new(KpiConfig::default());
    w.record(&plain, T);
    let snap = w.snapshot(Duration::from_secs(60), T + SEC);
    assert!(snap.series[0].disagg.is_none());
    assert!(
        serde_json::to_value(&snap).unwrap()["series"][0]
            .get("disagg")
            .is_none()
    );
}

#[test]
fn disaggregated_part_survives_merging_and_the_stored_encoding() {
    let (config, slo) = (sketch_config(), SloConfig::default());
    let truths = generate(&BALANCED, 300, 5);
    let mut whole = Accumulator::default();
    let mut parts = [Accumulator::default(), Accumulator::default()];
    for (k, t) in truths.iter().enumerate() {
        whole.add(&config, &slo, &record(t));
        parts[k % 2].add(&config, &slo, &record(t));
    }
    let mut merged = Accumulator::default();
    for p in &parts {
        merged.merge(p);
    }
    let many = Accumulator::merge_many(&parts.iter().collect::<Vec<_>>());
    let want = whole.disagg(&config, &slo, 60.0).expect("disagg");
    for (what, acc) in [("merge", &merged), ("merge_many", &many)] {
        let got = acc.disagg(&config, &slo, 60.0).expect("disagg");
        assert_eq!(got.requests, want.requests, "{what}");
        assert_eq!(got.workers.len(), want.workers.len(), "{what}");
        for (a, b) in got.pools.iter().zip(&want.pools) {
            assert_eq!(a.workers, b.workers, "{what}");
            for (x, y) in a.sub_phases.iter().zip(&b.sub_phases) {
                assert_eq!(x.latency.p90, y.latency.p90, "{what} {}", x.name);
            }
        }
    }
    let bytes = whole.to_bytes();
    let back = Accumulator::decode(&bytes).expect("decodes");
    assert_eq!(back.to_bytes(), bytes);
    assert_eq!(back.disagg(&config, &slo, 60.0), Some(want));
    for n in 0..bytes.len() {
        assert!(Accumulator::decode(&bytes[..n]).is_err(), "prefix {n}");
    }
    // Versions 2 (before the per-request p99 inter-token gaps) and 1 (before the disaggregated
    // part too) still read: the same bytes without the trailing empty distribution (one 0
    // byte: no streamed request here), then without the "no disaggregated part" flag.
    let mut plain = Accumulator::default();
    let mut r = record(&truths[0]);
    r.disagg = None;
    r.itl = None;
    plain.add(&config, &slo, &r);
    let mut v2 = plain.to_bytes();
    assert_eq!(v2.pop(), Some(0), "the empty distribution is last");
    v2[0] = 2;
    let old = Accumulator::decode(&v2).expect("version 2 decodes");
    assert_eq!(old.counts, plain.counts);
    let mut v1 = v2;
    assert_eq!(v1.pop(), Some(0), "the flag is last");
    v1[0] = 1;
    let old = Accumulator::decode(&v1).expect("version 1 decodes");
    assert_eq!(old.counts, plain.counts);
    assert!(old.disagg(&config, &slo, 60.0).is_none());
}

fn run(s: &SeriesKpis, config: &DiagnosisConfig) -> Vec<Finding> {
    diagnose(s, None, config)
}

fn pd_ids(f: &[Finding]) -> Vec<&'static str> {
    f.iter()
        .map(|f| f.rule_id)
        .filter(|id| {
            [
                "kv-transfer-dominates-ttft",
                "pd-ratio-prefill-bound",
                "pd-ratio-decode-bound",
                "decode-kv-memory-wait",
            ]
            .contains(id)
        })
        .collect()
}

/// The finding of rule `id`.
fn finding<'a>(findings: &'a [Finding], id: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.rule_id == id)
        .unwrap_or_else(|| panic!("no {id} in {findings:?}"))
}

fn evidence(f: &Finding, metric: &str) -> f64 {
    f.evidence
        .iter()
        .find(|e| e.metric == metric)
        .unwrap_or_else(|| panic!("no {metric} in {:?}", f.evidence))
        .value
}

/// Σ sub-phase i / Σ TTFT over the truths.
fn share(truths: &[Truth], i: usize) -> f64 {
    truths.iter().map(|t| t.phases[i]).sum::<f64>() / truths.iter().map(Truth::ttft).sum::<f64>()
}

#[test]
fn a_balanced_deployment_gets_no_disaggregated_finding() {
    let s = series(&generate(&BALANCED, 200, 1), &[]);
    assert_eq!(
        pd_ids(&run(&s, &DiagnosisConfig::default())),
        Vec::<&str>::new()
    );
}

#[test]
fn a_slow_kv_link_is_diagnosed_with_the_rate_achieved_and_what_a_faster_link_saves() {
    // A slow link (the demo's pd-kv-bound had 10 Gb/s, ~40 ms per transfer, before 5 Gb/s).
    let d = Deployment {
        prefill_workers: 1,
        kv_transfer: 0.04,
        ..BALANCED
    };
    let truths = generate(&d, 200, 2);
    let s = series(&truths, &[]);
    let config = DiagnosisConfig {
        kv_bytes_per_token: Some(131_072.0),
        ..DiagnosisConfig::default()
    };
    let findings = run(&s, &config);
    assert_eq!(pd_ids(&findings), ["kv-transfer-dominates-ttft"]);
    let f = &findings[findings
        .iter()
        .position(|f| f.rule_id == "kv-transfer-dominates-ttft")
        .unwrap()];
    // TTFT p90 ≈ 90 ms is within the 1 s objective: a note, not a warning.
    assert_eq!(f.severity, Severity::Info);
    let kv: Vec<f64> = truths.iter().map(|t| t.phases[4]).collect();
    let want_share = share(&truths, 4);
    assert!(want_share > 0.3);
    assert!((evidence(f, "disagg.ttft_share.kv_transfer") - want_share).abs() < 1e-9);
    for (q, metric) in [
        (0.5, "disagg.kv_transfer.p50"),
        (0.9, "disagg.kv_transfer.p90"),
    ] {
        let (got, want) = (evidence(f, metric), exact_quantile(&kv, q));
        assert!(
            (got - want).abs() <= 0.01 * want,
            "{metric} {got} vs {want}"
        );
    }
    // Twice as fast halves each transfer: half the mean transfer off the mean TTFT.
    let saved = evidence(f, "disagg.ttft_saved_at_2x_link.mean");
    assert!((saved - mean(&kv) / 2.0).abs() < 1e-9, "{saved}");
    let tokens: u64 = truths.iter().map(|t| t.input_tokens).sum();
    let tps = tokens as f64 / kv.iter().sum::<f64>();
    let got = evidence(f, "disagg.kv_transfer.tokens_per_second");
    assert!((got - tps).abs() < 1e-6 * tps);
    let bps = evidence(f, "disagg.kv_transfer.bytes_per_second");
    assert!((bps - tps * 131_072.0).abs() < 1e-6 * bps);
    assert!(f.title.contains("Gb/s"), "{}", f.title);
    assert!(
        f.recommendation.contains("twice as fast"),
        "{}",
        f.recommendation
    );

    // Over the TTFT objective it is a warning.
    let strict = DiagnosisConfig {
        ttft_p90_max_seconds: 0.05,
        ..DiagnosisConfig::default()
    };
    let f = run(&s, &strict);
    let kv_finding = f
        .iter()
        .find(|f| f.rule_id == "kv-transfer-dominates-ttft")
        .unwrap();
    assert_eq!(kv_finding.severity, Severity::Warning);
}

#[test]
fn the_kv_rule_fires_above_its_threshold_only() {
    let truths = generate(
        &Deployment {
            kv_transfer: 0.03,
            ..BALANCED
        },
        100,
        3,
    );
    let s = series(&truths, &[]);
    let share = share(&truths, 4);
    for (threshold, fires) in [(share - 0.01, true), (share + 0.01, false)] {
        let config = DiagnosisConfig {
            kv_transfer_ttft_share_max: threshold,
            ..DiagnosisConfig::default()
        };
        let ids = pd_ids(&run(&s, &config));
        assert_eq!(
            ids.contains(&"kv-transfer-dominates-ttft"),
            fires,
            "share {share}, threshold {threshold}: {ids:?}"
        );
    }
}

#[test]
fn a_short_prefill_pool_is_diagnosed_with_the_split_to_try() {
    // The demo's pd-ratio: one prefill worker for long prompts, three decode workers.
    let d = Deployment {
        prefill_workers: 1,
        decode_workers: 3,
        prefill_queue: 0.12,
        prefill: 0.09,
        ..BALANCED
    };
    let truths = generate(&d, 200, 4);
    let findings = run(&series(&truths, &[]), &DiagnosisConfig::default());
    assert_eq!(pd_ids(&findings), ["pd-ratio-prefill-bound"]);
    let f = finding(&findings, "pd-ratio-prefill-bound");
    assert!((evidence(f, "disagg.ttft_share.prefill_queue") - share(&truths, 2)).abs() < 1e-9);
    assert!((evidence(f, "disagg.ttft_share.decode_wait") - share(&truths, 6)).abs() < 1e-9);
    assert_eq!(evidence(f, "disagg.pools.prefill.workers"), 1.0);
    assert_eq!(evidence(f, "disagg.pools.decode.workers"), 3.0);
    assert!(
        f.recommendation.contains("1:3 → 2:2"),
        "{}",
        f.recommendation
    );
}

#[test]
fn a_short_decode_pool_is_diagnosed_the_other_way() {
    let d = Deployment {
        prefill_workers: 3,
        decode_workers: 1,
        decode_wait: 0.08,
        ..BALANCED
    };
    let truths = generate(&d, 200, 6);
    let findings = run(&series(&truths, &[]), &DiagnosisConfig::default());
    assert_eq!(pd_ids(&findings), ["pd-ratio-decode-bound"]);
    let f = finding(&findings, "pd-ratio-decode-bound");
    assert!((evidence(f, "disagg.ttft_share.decode_wait") - share(&truths, 6)).abs() < 1e-9);
    // Sized: the decode pool waits (busy 1), the three prefill workers prefill ≈ 3 % of the
    // time, so the load needs ≈ 0.1 prefill GPU against 1 decode GPU: 4 × 0.1 / 1.1 → 0,
    // and each pool keeps one.
    assert!(
        f.recommendation.contains("3:1 → 1:3"),
        "{}",
        f.recommendation
    );
}

#[test]
fn a_wait_for_decode_kv_memory_is_diagnosed() {
    let d = Deployment {
        bootstrap: 0.06,
        decode_bootstrap: 0.06,
        ..BALANCED
    };
    let truths = generate(&d, 200, 8);
    let findings = run(&series(&truths, &[]), &DiagnosisConfig::default());
    assert_eq!(pd_ids(&findings), ["decode-kv-memory-wait"]);
    let f = finding(&findings, "decode-kv-memory-wait");
    assert!((evidence(f, "disagg.ttft_share.bootstrap") - share(&truths, 1)).abs() < 1e-9);
    let b: Vec<f64> = truths.iter().map(|t| t.phases[1]).collect();
    let p90 = exact_quantile(&b, 0.9);
    assert!((evidence(f, "disagg.bootstrap.p90") - p90).abs() <= 0.01 * p90);
}

#[test]
fn too_few_disaggregated_requests_are_no_diagnosis() {
    let d = Deployment {
        kv_transfer: 0.05,
        ..BALANCED
    };
    let config = DiagnosisConfig::default();
    let few = series(&generate(&d, 19, 9), &[]);
    assert_eq!(pd_ids(&run(&few, &config)), Vec::<&str>::new());
    let enough = series(&generate(&d, 20, 9), &[]);
    assert_eq!(
        pd_ids(&run(&enough, &config)),
        ["kv-transfer-dominates-ttft"]
    );
}

#[test]
fn the_critical_path_runs_across_the_services_and_aggregates_to_the_sub_phases_shares() {
    use infertrace_analysis::critical_path::{
        CriticalPathWindows, CriticalPathWindowsConfig, HANDOVER, disaggregated_path,
    };
    let d = Deployment {
        prefill_workers: 2,
        decode_workers: 2,
        kv_transfer: 0.04,
        ..BALANCED
    };
    let truths = generate(&d, 300, 21);
    let mut windows = CriticalPathWindows::new(CriticalPathWindowsConfig::default());
    for t in &truths {
        let r = record(t);
        let path = disaggregated_path(&r).expect("a path");
        // Each request's path tiles its e2e (to the nanosecond of its span's times).
        assert_eq!(path.total_nanos(), r.end_unix_nano - r.arrival_unix_nano);
        windows.record(&path, r.e2e, T + 5 * SEC);
    }
    let summary = windows.snapshot(Duration::from_secs(60), T + 6 * SEC);
    assert_eq!(summary.requests, 300);
    let e2e: f64 = truths.iter().map(|t| t.ttft() + t.phases[8]).sum();
    // Per sub-phase over every worker: its Σ / Σ e2e, owned by the services that ran it.
    let owned = |name: &str, service_prefix: &str| -> f64 {
        summary
            .entries
            .iter()
            .filter(|e| &*e.span == name)
            .inspect(|e| assert!(e.service.starts_with(service_prefix), "{e:?}"))
            .map(|e| e.share.all)
            .sum()
    };
    for (i, name) in NAMES.iter().enumerate() {
        let prefix = match i {
            0 => "pd-router",
            1..=4 => "pd-prefill-",
            _ => "pd-decode-",
        };
        let want = if i == 5 {
            0.0 // decode_bootstrap runs beside the prefill side: never on the path
        } else {
            truths.iter().map(|t| t.phases[i]).sum::<f64>() / e2e
        };
        let got = owned(name, prefix);
        assert!((got - want).abs() < 1e-6, "{name}: share {got} vs {want}");
    }
    let rest = truths.iter().map(|t| t.rest).sum::<f64>() / e2e;
    let got = owned(HANDOVER, "pd-router");
    assert!((got - rest).abs() < 1e-6, "handover {got} vs {rest}");
    // The kv_transfer entries are the prefill workers', split as the requests were.
    let workers: Vec<&str> = summary
        .entries
        .iter()
        .filter(|e| &*e.span == "kv_transfer")
        .map(|e| &*e.service)
        .collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
}

/// The series' KPIs like [`series`], each request's TPOT set by `tpot(k)`.
fn series_with_tpot(truths: &[Truth], tpot: impl Fn(usize) -> f64) -> SeriesKpis {
    let mut w = KpiWindows::new(KpiConfig::default());
    for (k, t) in truths.iter().enumerate() {
        let mut r = record(t);
        r.tpot = Some(tpot(k));
        w.record(&r, T + (k as u64 % 50) * SEC);
    }
    let snap = w.snapshot(Duration::from_secs(60), T + 55 * SEC);
    snap.series.into_iter().next().expect("one series")
}

fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{what}: {got} vs {want}"
    );
}

#[test]
fn the_pd_split_is_sized_from_each_pools_goodput_per_gpu() {
    // The demo's pd-ratio shape: the one prefill worker's queue is 57 % of TTFT (it is
    // saturated: busy 1); three decode workers at a TPOT of 7.5 ms against the 100 ms
    // objective (busy 0.075). Every TTFT and TPOT within its objective.
    let d = Deployment {
        prefill_workers: 1,
        decode_workers: 3,
        prefill_queue: 0.12,
        prefill: 0.09,
        ..BALANCED
    };
    let truths = generate(&d, 200, 4);
    let s = series_with_tpot(&truths, |_| 0.0075);
    let k = s.disagg.as_ref().expect("disagg");
    assert_eq!(k.ttft_slo_attainment, Some(1.0));
    assert_eq!(k.tpot_slo_attainment, Some(1.0));
    let load = s.throughput.requests_per_second;
    close(k.requests_per_second, load, "disaggregated load");
    let findings = run(&s, &DiagnosisConfig::default());
    let f = finding(&findings, "pd-ratio-prefill-bound");
    // By hand: prefill goodput per GPU = load × 1 / (1 × 1); decode = load × 1 / (3 × 0.075);
    // GPUs needed: 1 and 0.225; 4 × 1 / 1.225 = 3.27 → 3:1.
    close(evidence(f, "disagg.load.requests_per_second"), load, "load");
    close(
        evidence(f, "disagg.pools.prefill.busy"),
        1.0,
        "prefill busy",
    );
    close(
        evidence(f, "disagg.pools.decode.busy"),
        0.075,
        "decode busy",
    );
    close(
        evidence(f, "disagg.pools.prefill.goodput_per_gpu"),
        load,
        "prefill goodput",
    );
    close(
        evidence(f, "disagg.pools.decode.goodput_per_gpu"),
        load / (3.0 * 0.075),
        "decode goodput",
    );
    close(
        evidence(f, "disagg.sizing.prefill_gpus_needed"),
        1.0,
        "P needed",
    );
    close(
        evidence(f, "disagg.sizing.decode_gpus_needed"),
        0.225,
        "D needed",
    );
    assert_eq!(evidence(f, "disagg.sizing.prefill_workers"), 3.0);
    assert_eq!(evidence(f, "disagg.sizing.decode_workers"), 1.0);
    assert!(
        f.recommendation.contains("1:3 → 3:1"),
        "{}",
        f.recommendation
    );
    // Tokens each pool served: the series' rates (every request is disaggregated).
    close(
        evidence(f, "disagg.pools.prefill.input_tokens_per_second"),
        s.throughput.input_tokens_per_second,
        "prefill tokens/s",
    );

    // A quarter of the requests decode at 200 ms per token: decode attainment 0.75 and mean
    // TPOT 0.75 × 7.5 ms + 0.25 × 200 ms = 55.6 ms (busy 0.556): decode goodput per GPU
    // load × 0.75 / (3 × 0.55625), 2.23 decode GPUs needed against 1 prefill → 4 × 1 / 3.22
    // = 1.24 → 1:3, the current split: the finding keeps the one-GPU advice.
    let s = series_with_tpot(&truths, |k| if k % 4 == 0 { 0.2 } else { 0.0075 });
    let k = s.disagg.as_ref().expect("disagg");
    assert_eq!(k.tpot_slo_attainment, Some(0.75));
    let findings = run(&s, &DiagnosisConfig::default());
    let f = finding(&findings, "pd-ratio-prefill-bound");
    let busy = (0.75 * 0.0075 + 0.25 * 0.2) / 0.1;
    close(evidence(f, "disagg.pools.decode.busy"), busy, "decode busy");
    close(
        evidence(f, "disagg.pools.decode.slo_attainment"),
        0.75,
        "decode attainment",
    );
    close(
        evidence(f, "disagg.sizing.decode_gpus_needed"),
        3.0 * busy / 0.75,
        "D needed",
    );
    assert_eq!(evidence(f, "disagg.sizing.prefill_workers"), 1.0);
    assert!(
        f.recommendation.contains("already matches") && f.recommendation.contains("1:3 → 2:2"),
        "{}",
        f.recommendation
    );
}

#[test]
fn a_short_decode_pool_is_sized_from_the_prefill_pools_busy_time() {
    // The demo's pd-decode-bound shape: two prefill workers, one decode worker whose arrivals
    // wait (busy 1). Prefill busy = load × mean prefill / 2.
    let d = Deployment {
        prefill_workers: 2,
        decode_workers: 1,
        decode_wait: 0.08,
        ..BALANCED
    };
    let truths = generate(&d, 200, 6);
    let s = series_with_tpot(&truths, |_| 0.008);
    let findings = run(&s, &DiagnosisConfig::default());
    let f = finding(&findings, "pd-ratio-decode-bound");
    let load = s.throughput.requests_per_second;
    let prefills: Vec<f64> = truths.iter().map(|t| t.phases[3]).collect();
    let busy = load * mean(&prefills) / 2.0;
    close(
        evidence(f, "disagg.pools.prefill.busy"),
        busy,
        "prefill busy",
    );
    close(evidence(f, "disagg.pools.decode.busy"), 1.0, "decode busy");
    let (np, nd) = (busy * 2.0, 1.0);
    let p = ((3.0 * np / (np + nd)).round() as usize).clamp(1, 2);
    assert_eq!(p, 1, "prefill needs {np} GPUs");
    assert_eq!(evidence(f, "disagg.sizing.prefill_workers"), 1.0);
    assert_eq!(evidence(f, "disagg.sizing.decode_workers"), 2.0);
    assert!(
        f.recommendation.contains("2:1 → 1:2"),
        "{}",
        f.recommendation
    );
}

#[test]
fn a_decode_wait_within_one_decode_step_is_not_a_short_decode_pool() {
    // Requests wait ≈ 20 ms for a decode batch, ≈ 30 % of TTFT. At a 20 ms decode step that
    // is the step in progress; at 1 ms it is a queue.
    let d = Deployment {
        decode_wait: 0.02,
        ..BALANCED
    };
    let truths = generate(&d, 200, 12);
    let raw = share(&truths, 6);
    assert!(raw > 0.25, "{raw}");
    let ttft_mean = mean(&truths.iter().map(Truth::ttft).collect::<Vec<_>>());
    let config = DiagnosisConfig::default();
    let slow_steps = series_with_tpot(&truths, |_| 0.02);
    assert_eq!(pd_ids(&run(&slow_steps, &config)), Vec::<&str>::new());
    let fast_steps = series_with_tpot(&truths, |_| 0.001);
    let findings = run(&fast_steps, &config);
    assert_eq!(pd_ids(&findings), ["pd-ratio-decode-bound"]);
    let f = finding(&findings, "pd-ratio-decode-bound");
    close(
        evidence(f, "disagg.ttft_share.decode_wait"),
        raw,
        "raw share",
    );
    // The TTFT mean is the sketch's exact mean; Σ/Σ shares are exact sums.
    let beyond = evidence(f, "disagg.ttft_share.decode_wait_beyond_step");
    assert!(
        (beyond - (raw - 0.001 / ttft_mean)).abs() < 1e-9,
        "{beyond} vs {}",
        raw - 0.001 / ttft_mean
    );
}
