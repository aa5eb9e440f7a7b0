//! The pipeline holds the aggregates' memory in the memory limiter as their own estimates say
//! (`approx_memory_bytes` of the KPI windows, the critical-path windows and the Prometheus
//! recorder). This binary counts every allocation (one test only, so nothing else allocates
//! meanwhile) and checks each estimate against the bytes the structure really holds after many
//! series, keys, outcomes, disaggregated workers and e2e buckets: an estimate far below would
//! let the collector pass its memory limit unseen, one far above would refuse data for nothing.

mod support_counting;

use std::time::Duration;

use infertrace_analysis::critical_path::{CriticalPath, CriticalPathWindows, Segment};
use infertrace_analysis::kpi::{Dimension, KpiConfig, KpiWindows, SloConfig};
use infertrace_analysis::record::{Dialect, DisaggPhases, Outcome, RequestRecord};
use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{SpanId, TraceId};
use infertrace_collector::prom_export::{PromMetrics, PromRecorder};

/// Series (service, model, operation) the records fall in.
const SERIES: usize = 300;

/// Records: ten a series.
const RECORDS: usize = 10 * SERIES;

/// Request `i` of series `i % SERIES`: its model (a 40-byte name) on one of seven services,
/// every phase. A series' ten requests take the four outcomes in turn; the first 60 series
/// are disaggregated, each request on its own prefill and decode worker (ten of each pool a
/// series, the Prometheus recorder's costliest label sets).
fn record(i: usize) -> RequestRecord {
    let (series, round) = (i % SERIES, i / SERIES);
    let mut r = RequestRecord::new(
        TraceId([1; 16]),
        SpanId([1; 8]),
        Text::from(format!("inference-service-{}", series % 7).as_str()),
        Dialect::Infertrace,
        0,
        1_000_000_000,
    );
    r.model = format!("organisation/model-{series:020}-instruct")
        .as_str()
        .into();
    r.operation = "chat".into();
    r.outcome = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Cancelled,
        Outcome::Rejected,
    ][round % 4];
    let e2e = 0.05 * (1.0 + (i % 97) as f64);
    (r.e2e, r.queue, r.prefill, r.decode) = (e2e, Some(0.01), Some(0.02), Some(e2e - 0.03));
    (r.ttft, r.tpot) = (Some(0.03), Some(0.01));
    (r.input_tokens, r.output_tokens) = (Some(100), Some(200));
    if series < 60 {
        let worker = |pool: &str| Some(Text::from(format!("{pool}-worker-{round}").as_str()));
        r.disagg = Some(Box::new(DisaggPhases {
            routing: Some(0.001),
            bootstrap: Some(0.002),
            prefill_queue: Some(0.003),
            prefill: Some(0.02),
            kv_transfer: Some(0.004),
            decode_bootstrap: Some(0.002),
            decode_wait: Some(0.001),
            first_token: Some(0.005),
            decode: Some(0.5),
            prefill_worker: worker("prefill"),
            decode_worker: worker("decode"),
        }));
    }
    r
}

/// A critical path of three of 200 (service, span) keys, `e2e` seconds long.
fn path(i: usize, e2e: f64) -> CriticalPath {
    let end = (e2e * 1e9) as u64;
    let segment = |k: usize, start: u64, end: u64| Segment {
        span_id: SpanId([2; 8]),
        name: Text::from(format!("span-name-{k:03}").as_str()),
        service: Text::from(format!("service-{}", k % 5).as_str()),
        start_unix_nano: start,
        end_unix_nano: end,
    };
    CriticalPath {
        trace_id: TraceId([1; 16]),
        root: SpanId([1; 8]),
        segments: vec![
            segment(i % 200, 0, end / 4),
            segment((i + 67) % 200, end / 4, end / 2),
            segment((i + 133) % 200, end / 2, end),
        ],
        adjustments: vec![],
    }
}

/// Bytes `build` leaves held (what the structure it returns owns), and the structure.
fn held_by<T>(build: impl FnOnce() -> T) -> (usize, T) {
    let before = support_counting::held();
    let made = build();
    (support_counting::held().saturating_sub(before), made)
}

fn assert_close(what: &str, estimate: usize, held: usize) {
    let ratio = estimate as f64 / held as f64;
    eprintln!("{what}: estimate {estimate} B, held {held} B ({ratio:.2}×)");
    assert!(
        (0.9..=1.15).contains(&ratio),
        "{what}: the estimate {estimate} B is {ratio:.2}× the {held} B held"
    );
}

#[test]
fn aggregate_estimates_follow_what_is_held() {
    let records: Vec<RequestRecord> = (0..RECORDS).map(record).collect();
    let paths: Vec<(CriticalPath, f64, u64)> = (0..20_000)
        .map(|i| {
            // e2e from 50 ms to ~50 s (over 300 buckets of γ = 1.02), 100 slots of 10 s.
            let e2e = 0.05 * 1.0236f64.powi((i % 293) as i32);
            (path(i, e2e), e2e, (i as u64 / 200) * 10_000_000_000)
        })
        .collect();

    let (held, prom) = held_by(|| {
        let mut prom = PromRecorder::new(
            PromMetrics::default(),
            vec![Dimension::Service, Dimension::Model, Dimension::Operation],
            SloConfig::default(),
            1_000,
        );
        for r in &records {
            prom.record(r);
        }
        for (p, _, _) in &paths {
            prom.record_critical_path(p, &|_, _| true);
        }
        prom
    });
    assert_close("Prometheus recorder", prom.approx_memory_bytes(), held);
    drop(prom);

    let (held, windows) = held_by(|| {
        let mut windows = CriticalPathWindows::default();
        for (p, e2e, at) in &paths {
            windows.record(p, *e2e, *at);
        }
        windows
    });
    assert_close("critical-path windows", windows.approx_memory_bytes(), held);
    drop(windows);

    let (held, kpis) = held_by(|| {
        let mut kpis = KpiWindows::new(KpiConfig {
            windows: vec![Duration::from_secs(60), Duration::from_secs(300)],
            ..KpiConfig::default()
        });
        for (i, r) in records.iter().enumerate() {
            kpis.record(r, 1_000_000_000 * (1 + i as u64 % 60));
        }
        kpis
    });
    assert_close("KPI windows", kpis.approx_memory_bytes(), held);
}
