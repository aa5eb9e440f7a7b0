//! KPI windows against ground truth computed independently over the same records.

use infertrace_analysis::text::Text;
use std::sync::Arc;
use std::time::Duration;

use infertrace_analysis::kpi::{
    Dimension, KpiConfig, KpiWindows, LatencyStats, OVERFLOW_LABEL, SeriesKey, SeriesKpis,
    SloConfig, sketch_config,
};
use infertrace_analysis::record::{
    Dialect, GpuRecord, InterTokenStats, Outcome, PerPhase, RequestRecord,
};
use infertrace_analysis::trace::{SpanId, TraceId};
use proptest::prelude::*;

const SEC: u64 = 1_000_000_000;
/// A whole number of hours, so every ring's slots start at T.
const T: u64 = 472_222 * 3600 * SEC;

/// SplitMix64: a small deterministic generator for the tests.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-uniform in [lo, hi).
    fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp()
    }
}

fn record(service: &str, model: &str, e2e: f64) -> RequestRecord {
    let mut r = RequestRecord::new(
        TraceId([1; 16]),
        SpanId([1; 8]),
        Text::from(service),
        Dialect::Infertrace,
        T,
        T + (e2e * 1e9) as u64,
    );
    r.e2e = e2e;
    r.model = model.into();
    r.operation = "chat".into();
    r
}

/// A random `ok` record with every phase: e2e = queue + prefill + decode + a little more.
fn random_full(rng: &mut Rng) -> RequestRecord {
    let queue = rng.log_uniform(1e-4, 2.0);
    let prefill = rng.log_uniform(1e-2, 1.0);
    let decode = rng.log_uniform(0.1, 20.0);
    let tokens = 2 + rng.next() % 500;
    let mut r = record("svc", "m", queue + prefill + decode + rng.unit() * 0.01);
    r.queue = Some(queue);
    r.prefill = Some(prefill);
    r.ttft = Some(queue + prefill);
    r.decode = Some(decode);
    r.output_tokens = Some(tokens);
    r.input_tokens = Some(rng.next() % 2000);
    r.tpot = Some(decode / (tokens - 1) as f64);
    let p50 = rng.log_uniform(0.005, 0.2);
    r.itl = Some(InterTokenStats {
        p50,
        p99: p50 * 3.0,
        max: p50 * (3.0 + rng.unit() * 10.0),
    });
    r
}

/// The exact quantile at the sketch's rank definition: the value at rank ⌊q·(n − 1)⌋.
fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[(q * (sorted.len() as f64 - 1.0)) as usize]
}

fn assert_stats(stats: Option<LatencyStats>, values: &[f64], what: &str) {
    let stats = stats.unwrap_or_else(|| panic!("{what}: no stats"));
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    for (q, got) in [
        (0.5, stats.p50),
        (0.9, stats.p90),
        (0.95, stats.p95),
        (0.99, stats.p99),
    ] {
        let want = exact_quantile(&sorted, q);
        let err = (got - want).abs() / want;
        assert!(err <= 0.01, "{what} p{q}: {got} vs exact {want} ({err:.4})");
    }
    assert_eq!(stats.max, sorted[sorted.len() - 1], "{what} max");
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    assert!((stats.mean - mean).abs() <= 1e-9 * mean, "{what} mean");
}

fn only_series(w: &KpiWindows, window: u64, now: u64) -> SeriesKpis {
    let snap = w.snapshot(Duration::from_secs(window), now);
    assert_eq!(snap.series.len(), 1, "{snap:#?}");
    snap.series.into_iter().next().unwrap()
}

#[test]
fn percentiles_are_within_one_percent_of_exact_over_many_slots() {
    let mut rng = Rng(7);
    let mut w = KpiWindows::new(KpiConfig::default());
    let records: Vec<RequestRecord> = (0..20_000).map(|_| random_full(&mut rng)).collect();
    // Spread over 50 s: 50 one-second slots of the 1m ring, 10 of the 5m ring, 1 of the 1h.
    for (k, r) in records.iter().enumerate() {
        assert!(w.record(r, T + (k as u64 * 50 * SEC) / records.len() as u64));
    }
    for window in [60, 300, 3600] {
        let s = only_series(&w, window, T + 50 * SEC);
        assert_eq!(s.requests, records.len() as u64);
        let col = |f: fn(&RequestRecord) -> Option<f64>| -> Vec<f64> {
            records.iter().filter_map(f).collect()
        };
        assert_stats(s.e2e, &col(|r| Some(r.e2e)), "e2e");
        assert_stats(s.queue, &col(|r| r.queue), "queue");
        assert_stats(s.ttft, &col(|r| r.ttft), "ttft");
        assert_stats(s.prefill, &col(|r| r.prefill), "prefill");
        assert_stats(s.decode, &col(|r| r.decode), "decode");
        assert_stats(s.tpot, &col(|r| r.tpot), "tpot");
        // ITL: percentiles of per-request medians; max of per-request maxima.
        let itl = s.itl.unwrap();
        let medians = col(|r| r.itl.map(|i| i.p50));
        let mut fake = itl;
        fake.max = medians.iter().copied().fold(0.0, f64::max);
        assert_stats(Some(fake), &medians, "itl");
        let max_gap = records
            .iter()
            .filter_map(|r| r.itl.map(|i| i.max))
            .fold(0.0, f64::max);
        assert_eq!(itl.max, max_gap);
        let (input, output) = records.iter().fold((0, 0), |(i, o), r| {
            (i + r.input_tokens.unwrap(), o + r.output_tokens.unwrap())
        });
        assert_eq!((s.tokens.input, s.tokens.output), (input, output));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn e2e_percentiles_within_one_percent(
        exps in prop::collection::vec(-6.0f64..4.0, 1..400),
        spread in 1u64..120,
    ) {
        let values: Vec<f64> = exps.iter().map(|e| 10f64.powf(*e)).collect();
        let mut w = KpiWindows::new(KpiConfig::default());
        for (k, v) in values.iter().enumerate() {
            w.record(&record("s", "m", *v), T + (k as u64 % spread) * SEC);
        }
        let now = T + spread * SEC;
        let s = only_series(&w, 300, now);
        prop_assert_eq!(s.requests, values.len() as u64);
        assert_stats(s.e2e, &values, "e2e");
    }
}

#[test]
fn windows_expire_old_data() {
    let mut w = KpiWindows::new(KpiConfig::default());
    w.record(&record("s", "m", 1.0), T);
    let requests = |window: u64, at: u64| {
        w.snapshot(Duration::from_secs(window), T + at)
            .series
            .first()
            .map_or(0, |s| s.requests)
    };
    assert_eq!(requests(60, 30 * SEC), 1);
    assert_eq!(requests(60, 60 * SEC - 1), 1);
    assert_eq!(requests(60, 60 * SEC), 0); // the 1 s slot at T left the 1m window
    assert_eq!(requests(300, 60 * SEC), 1);
    assert_eq!(requests(300, 300 * SEC - 1), 1);
    assert_eq!(requests(300, 300 * SEC), 0);
    assert_eq!(requests(3600, 3599 * SEC), 1);
    assert_eq!(requests(3600, 3600 * SEC), 0);
    // A window between the configured ones reads the next longer ring as far as it reaches.
    assert_eq!(requests(120, 119 * SEC), 1);
    assert_eq!(requests(120, 120 * SEC), 0);
    let snap = w.snapshot(Duration::from_secs(120), T);
    assert_eq!(snap.window_seconds, 120.0);

    // Slots are reused: a record a full window later replaces the old slot's content.
    w.record(&record("s", "m", 2.0), T + 60 * SEC);
    let s = only_series(&w, 60, T + 60 * SEC);
    assert_eq!(s.requests, 1);
    assert_eq!(s.e2e.unwrap().max, 2.0);
    let s = only_series(&w, 300, T + 60 * SEC);
    assert_eq!(s.requests, 2);
}

#[test]
fn throughput_divides_by_the_time_covered() {
    let mut w = KpiWindows::new(KpiConfig::default());
    w.set_start(T);
    let mut r = record("s", "m", 0.5);
    r.input_tokens = Some(100);
    r.output_tokens = Some(10);
    for k in 0..50 {
        w.record(&r, T + k * SEC / 5); // 50 requests over 10 s
    }
    // Uptime 10 s is shorter than every window: all rates are per second of uptime.
    for window in [60, 300, 3600] {
        let s = only_series(&w, window, T + 10 * SEC);
        assert!((s.throughput.requests_per_second - 5.0).abs() < 1e-9);
        assert!((s.throughput.input_tokens_per_second - 500.0).abs() < 1e-9);
        assert!((s.throughput.output_tokens_per_second - 50.0).abs() < 1e-9);
    }
    // Later, the 5m window still reaches back past the start: 100.5 s of uptime.
    let s = only_series(&w, 300, T + 100 * SEC + SEC / 2);
    assert!((s.throughput.requests_per_second - 50.0 / 100.5).abs() < 1e-9);
}

#[test]
fn overflow_series_and_counter() {
    let config = KpiConfig {
        max_series: 2,
        ..KpiConfig::default()
    };
    let mut w = KpiWindows::new(config);
    assert!(w.record(&record("a", "m", 1.0), T));
    assert!(w.record(&record("b", "m", 1.0), T));
    assert!(!w.record(&record("c", "m", 1.0), T));
    assert!(!w.record(&record("d", "m", 1.0), T));
    assert!(w.record(&record("a", "m", 1.0), T));
    assert_eq!(w.overflowed_records(), 2);
    assert_eq!(w.series_count(), 2);
    let snap = w.snapshot(Duration::from_secs(60), T + SEC);
    let labels: Vec<(&str, u64)> = snap
        .series
        .iter()
        .map(|s| (s.service.as_str(), s.requests))
        .collect();
    assert_eq!(labels, vec![("a", 2), ("b", 1), (OVERFLOW_LABEL, 2)]);
    let overflow = snap.series.last().unwrap();
    assert_eq!(
        (overflow.model.as_str(), overflow.operation.as_str()),
        (OVERFLOW_LABEL, OVERFLOW_LABEL)
    );

    // Series idle for longer than the longest window are dropped, freeing their places.
    assert!(w.record(&record("c", "m", 1.0), T + 3601 * SEC));
    assert_eq!(w.series_count(), 1);
    assert_eq!(w.overflowed_records(), 2);
}

#[test]
fn dimensions_left_out_are_aggregated() {
    let config = KpiConfig {
        dimensions: vec![Dimension::Service],
        ..KpiConfig::default()
    };
    let mut w = KpiWindows::new(config);
    w.record(&record("a", "m1", 1.0), T);
    w.record(&record("a", "m2", 1.0), T);
    let s = only_series(&w, 60, T);
    assert_eq!(
        (s.service.as_str(), s.model.as_str(), s.operation.as_str()),
        ("a", "", "")
    );
    assert_eq!(s.requests, 2);
}

#[test]
fn goodput_matches_brute_force() {
    let mut rng = Rng(11);
    let slo = SloConfig::default();
    let mut w = KpiWindows::new(KpiConfig::default());
    w.set_start(T);
    let mut records = Vec::new();
    for k in 0..5_000u64 {
        let mut r = record("s", "m", rng.log_uniform(0.5, 60.0));
        r.outcome = match rng.next() % 10 {
            0 => Outcome::Error,
            1 => Outcome::Cancelled,
            2 => Outcome::Rejected,
            _ => Outcome::Ok,
        };
        if !rng.next().is_multiple_of(4) {
            r.ttft = Some(rng.log_uniform(0.05, 3.0));
        }
        if !rng.next().is_multiple_of(4) {
            r.tpot = Some(rng.log_uniform(0.01, 0.3));
        }
        w.record(&r, T + k * 20 * SEC / 5_000);
        records.push(r);
    }
    let good = records
        .iter()
        .filter(|r| {
            r.outcome == Outcome::Ok
                && r.ttft.is_none_or(|t| t <= 1.0)
                && r.tpot.is_none_or(|t| t <= 0.1)
                && r.e2e <= 30.0
        })
        .count() as f64;
    let cancelled = records
        .iter()
        .filter(|r| r.outcome == Outcome::Cancelled)
        .count();
    let eligible = (records.len() - cancelled) as f64;
    let s = only_series(&w, 60, T + 20 * SEC);
    assert_eq!(slo, KpiConfig::default().slo);
    assert_eq!(s.cancelled as usize, cancelled);
    assert_eq!(
        s.errors
            + s.rejected
            + s.cancelled
            + (records.iter().filter(|r| r.outcome == Outcome::Ok).count() as u64),
        s.requests
    );
    assert!((s.goodput.ratio.unwrap() - good / eligible).abs() < 1e-12);
    assert!((s.goodput.requests_per_second - good / 20.0).abs() < 1e-9);

    // SLOs can be switched off one by one.
    let mut w = KpiWindows::new(KpiConfig {
        slo: SloConfig {
            ttft_seconds: None,
            tpot_seconds: None,
            e2e_seconds: Some(10.0),
        },
        ..KpiConfig::default()
    });
    for r in &records {
        w.record(r, T);
    }
    let good = records
        .iter()
        .filter(|r| r.outcome == Outcome::Ok && r.e2e <= 10.0)
        .count() as f64;
    let s = only_series(&w, 60, T);
    assert!((s.goodput.ratio.unwrap() - good / eligible).abs() < 1e-12);
}

#[test]
fn phase_shares_match_brute_force() {
    let mut rng = Rng(3);
    let mut w = KpiWindows::new(KpiConfig::default());
    let mut records = Vec::new();
    for k in 0..10_000u64 {
        let mut r = random_full(&mut rng);
        if k % 17 == 0 {
            r.outcome = Outcome::Error; // counted, but not in the shares
        }
        if k % 23 == 0 {
            r.queue = None; // not all three phases: left out of the shares
        }
        w.record(&r, T + (k % 40) * SEC);
        records.push(r);
    }
    let ok: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .collect();
    let mut e2e: Vec<f64> = ok.iter().map(|r| r.e2e).collect();
    e2e.sort_by(f64::total_cmp);
    let config = sketch_config();
    let share = |min_bucket: Option<i32>| {
        let (mut q, mut p, mut d, mut e) = (0.0, 0.0, 0.0, 0.0);
        for r in &ok {
            let (Some(rq), Some(rp), Some(rd)) = (r.queue, r.prefill, r.decode) else {
                continue;
            };
            if min_bucket.is_some_and(|b| config.key(r.e2e) < b) {
                continue;
            }
            (q, p, d, e) = (q + rq, p + rp, d + rd, e + r.e2e);
        }
        (q / e, p / e, d / e)
    };
    let s = only_series(&w, 60, T + 40 * SEC);
    let check = |got: Option<infertrace_analysis::kpi::PhaseShare>, want: (f64, f64, f64)| {
        let got = got.unwrap();
        for (g, w) in [
            (got.queue, want.0),
            (got.prefill, want.1),
            (got.decode, want.2),
        ] {
            assert!((g - w).abs() <= 1e-9 * w.max(1e-3), "{g} vs {w}");
        }
    };
    check(s.phase_share.all, share(None));
    for (q, got) in [(0.9, s.phase_share.p90), (0.99, s.phase_share.p99)] {
        let bucket = config.key(exact_quantile(&e2e, q));
        check(got, share(Some(bucket)));
    }
    // The tail is slower than the whole, so its decode share differs measurably.
    let (all, p99) = (s.phase_share.all.unwrap(), s.phase_share.p99.unwrap());
    assert!((all.decode - p99.decode).abs() > 1e-3);
}

#[test]
fn gpu_kpis_are_duration_weighted() {
    let mut w = KpiWindows::new(KpiConfig::default());
    let gpu = |prefill_util, decode_util, energy| GpuRecord {
        utilization_mean: PerPhase {
            prefill: Some(prefill_util),
            decode: Some(decode_util),
            ..PerPhase::default()
        },
        energy_attributed_joules: Some(energy),
        ..GpuRecord::default()
    };
    let mut a = record("s", "m", 3.0);
    (a.prefill, a.decode, a.output_tokens) = (Some(1.0), Some(2.0), Some(10));
    a.gpu = Some(Box::new(gpu(0.9, 0.3, 50.0)));
    let mut b = record("s", "m", 4.0);
    (b.prefill, b.decode, b.output_tokens) = (Some(3.0), Some(1.0), Some(30));
    b.gpu = Some(Box::new(gpu(0.5, 0.6, 30.0)));
    let c = record("s", "m", 1.0); // no GPU data
    for r in [&a, &b, &c] {
        w.record(r, T);
    }
    let g = only_series(&w, 60, T).gpu.unwrap();
    assert_eq!(g.requests, 2);
    assert!((g.utilization_mean.prefill.unwrap() - (0.9 * 1.0 + 0.5 * 3.0) / 4.0).abs() < 1e-12);
    assert!((g.utilization_mean.decode.unwrap() - (0.3 * 2.0 + 0.6 * 1.0) / 3.0).abs() < 1e-12);
    assert_eq!(g.utilization_mean.queue, None);
    assert_eq!(g.energy_attributed_joules, 80.0);
    assert_eq!(g.energy_per_output_token_joules, Some(2.0));

    let mut w = KpiWindows::new(KpiConfig::default());
    w.record(&c, T);
    assert!(only_series(&w, 60, T).gpu.is_none());
}

#[test]
fn latencies_count_ok_requests_only() {
    let mut w = KpiWindows::new(KpiConfig::default());
    let mut rejected = record("s", "m", 0.001);
    rejected.outcome = Outcome::Rejected;
    rejected.input_tokens = Some(5);
    w.record(&rejected, T);
    let s = only_series(&w, 60, T);
    assert_eq!((s.requests, s.rejected), (1, 1));
    assert!(s.e2e.is_none());
    assert_eq!(s.tokens.input, 5);
    assert_eq!(s.goodput.ratio, Some(0.0));
    w.record(&record("s", "m", 2.0), T);
    let s = only_series(&w, 60, T);
    assert_eq!(s.e2e.unwrap().p50, 2.0f64.min(s.e2e.unwrap().max));
    assert_eq!(s.goodput.ratio, Some(0.5));
}

#[test]
fn history_and_accumulator_access() {
    let mut w = KpiWindows::new(KpiConfig::default());
    for k in 0..5u64 {
        for _ in 0..=k {
            w.record(&record("s", "m", 1.0), T + k * 10 * SEC);
        }
    }
    let key = SeriesKey {
        service: Arc::from("s"),
        model: Arc::from("m"),
        operation: Arc::from("chat"),
    };
    let h = w.series_history(&key, Duration::from_secs(60), T + 45 * SEC);
    let counts: Vec<(u64, u64)> = h
        .iter()
        .map(|s| ((s.start_unix_nano - T) / SEC, s.accumulator.counts.requests))
        .collect();
    assert_eq!(counts, vec![(0, 1), (10, 2), (20, 3), (30, 4), (40, 5)]);
    let acc = w
        .series_accumulator(&key, Duration::from_secs(60), T + 45 * SEC)
        .unwrap();
    assert_eq!(acc.counts.requests, 15);
    assert_eq!(w.series_keys(), vec![key]);
}

#[test]
fn snapshot_json_has_the_api_shape() {
    let mut w = KpiWindows::new(KpiConfig::default());
    let mut rng = Rng(5);
    w.record(&random_full(&mut rng), T);
    let mut generic = record("gw", "unknown", 0.2);
    generic.dialect = Dialect::Generic;
    w.record(&generic, T);
    let json = serde_json::to_value(w.snapshot(Duration::from_secs(60), T + SEC)).unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let sorted = |names: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(keys(&json), sorted(&["window_seconds", "series"]));
    assert_eq!(json["window_seconds"], 60.0);
    let series = json["series"].as_array().unwrap();
    assert_eq!(series.len(), 2);
    let latency = [
        "e2e", "queue", "ttft", "prefill", "decode", "tpot", "itl", "itl_p99",
    ];
    let mut top = vec![
        "service",
        "model",
        "operation",
        "requests",
        "errors",
        "cancelled",
        "rejected",
        "tokens",
        "throughput",
        "goodput",
        "phase_share",
        "gpu",
    ];
    top.extend(latency);
    let full = &series[1];
    assert_eq!(full["service"], "svc");
    assert_eq!(keys(full), sorted(&top));
    for l in latency {
        assert_eq!(
            keys(&full[l]),
            sorted(&["p50", "p90", "p95", "p99", "max", "mean"]),
            "{l}"
        );
    }
    assert_eq!(keys(&full["tokens"]), sorted(&["input", "output"]));
    assert_eq!(
        keys(&full["throughput"]),
        sorted(&[
            "requests_per_second",
            "input_tokens_per_second",
            "output_tokens_per_second"
        ])
    );
    assert_eq!(
        keys(&full["goodput"]),
        sorted(&["ratio", "requests_per_second"])
    );
    assert_eq!(keys(&full["phase_share"]), sorted(&["all", "p90", "p99"]));
    for t in ["all", "p90", "p99"] {
        assert_eq!(
            keys(&full["phase_share"][t]),
            sorted(&["queue", "prefill", "decode"])
        );
    }
    assert!(full["gpu"].is_null());
    let gw = &series[0];
    assert_eq!(gw["service"], "gw");
    assert!(gw["e2e"]["p99"].is_number());
    for l in ["queue", "ttft", "prefill", "decode", "tpot", "itl"] {
        assert!(gw[l].is_null(), "{l}");
    }
    assert!(gw["phase_share"]["all"].is_null());
}

#[test]
fn extreme_inputs_never_panic() {
    let mut w = KpiWindows::new(KpiConfig::default());
    let mut r = record("s", "m", f64::NAN);
    r.input_tokens = Some(u64::MAX);
    r.output_tokens = Some(u64::MAX);
    r.queue = Some(f64::INFINITY);
    r.ttft = Some(-3.0);
    r.tpot = Some(1e300);
    for now in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
        w.record(&r, now);
        w.record(&r, now);
        let snap = w.snapshot(Duration::from_secs(3600), now);
        let s = &snap.series[0];
        assert_eq!(s.tokens.input, u64::MAX);
        assert!(s.e2e.is_none() && s.queue.is_none());
        assert_eq!(s.ttft.unwrap().max, 0.0);
        let _ = serde_json::to_string(&snap).unwrap();
    }
    let _ = w.snapshot(Duration::ZERO, 0);
    let _ = w.snapshot(Duration::MAX, u64::MAX);
}

/// Every number of `a` equals the one at the same place in `b` (relative 1e-9: sums may add
/// up in another order).
fn assert_json_close(a: &serde_json::Value, b: &serde_json::Value, path: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            assert!(
                (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-12),
                "{path}: {x} vs {y}"
            );
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}: lengths");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                assert_json_close(x, y, &format!("{path}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{path}: keys"
            );
            for (k, v) in x {
                assert_json_close(v, &y[k], &format!("{path}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Recording into the finest ring and rolling its slots up gives every window exactly what
    /// recording into each window separately gives — including records that arrive late
    /// (older than slots already rolled up, or older than the finest window).
    #[test]
    fn rolled_up_windows_equal_separately_recorded_ones(
        seed in any::<u64>(),
        steps in proptest::collection::vec((0u64..4_000, 0u8..10), 1..300),
        not_multiple in any::<bool>(),
    ) {
        // The default windows (all rolled up), or with a 90 s window whose 1.5 s slots are not
        // a multiple of the finest 1 s: that one gets every record directly.
        let windows: Vec<u64> = if not_multiple { vec![60, 90, 3600] } else { vec![60, 300, 3600] };
        let mut rng = Rng(seed);
        let mut all = KpiWindows::new(KpiConfig {
            windows: windows.iter().map(|w| Duration::from_secs(*w)).collect(),
            ..KpiConfig::default()
        });
        // The slot tap on: every record must come out of it exactly once.
        prop_assert!(all.enable_slot_tap());
        let mut tapped = 0u64;
        let mut single: Vec<KpiWindows> = windows
            .iter()
            .map(|w| KpiWindows::new(KpiConfig {
                windows: vec![Duration::from_secs(*w)],
                ..KpiConfig::default()
            }))
            .collect();
        let mut now = T;
        for (i, (dt_ms, late)) in steps.iter().enumerate() {
            now += dt_ms * 1_000_000 * (1 + (*late as u64 % 3) * 20);
            let at = match late {
                0 => now.saturating_sub(3 * SEC),
                1 => now.saturating_sub(90 * SEC),
                _ => now,
            };
            if *late == 9 {
                // A pipeline tick: complete the slots that ended.
                all.roll_due(now);
            }
            tapped += all.take_tapped().iter().map(|t| t.accumulator.counts.requests).sum::<u64>();
            let r = random_full(&mut rng);
            all.record(&r, at);
            for s in &mut single {
                s.record(&r, at);
            }
            if i % 17 == 0 || i + 1 == steps.len() {
                for (w, s) in windows.iter().zip(&single) {
                    let got = serde_json::to_value(all.snapshot(Duration::from_secs(*w), now)).unwrap();
                    let want = serde_json::to_value(s.snapshot(Duration::from_secs(*w), now)).unwrap();
                    assert_json_close(&got, &want, &format!("{w}s window, step {i}"));
                    let key = SeriesKey { service: "svc".into(), model: "m".into(), operation: "chat".into() };
                    let got = all.series_history(&key, Duration::from_secs(*w), now);
                    let want = s.series_history(&key, Duration::from_secs(*w), now);
                    prop_assert_eq!(got.len(), want.len());
                    for (g, h) in got.iter().zip(&want) {
                        prop_assert_eq!(g.start_unix_nano, h.start_unix_nano);
                        prop_assert_eq!(g.accumulator.counts, h.accumulator.counts);
                    }
                }
            }
        }
        all.roll_all();
        tapped += all.take_tapped().iter().map(|t| t.accumulator.counts.requests).sum::<u64>();
        prop_assert_eq!(tapped, steps.len() as u64, "every record tapped once");
    }
}
