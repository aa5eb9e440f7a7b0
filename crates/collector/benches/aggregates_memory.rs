//! Cost of measuring the aggregates' memory, which the pipeline does once a second under the
//! analysis lock: each `approx_memory_bytes` walk at the default configuration's bounds —
//! 1,000 KPI series with every slot of the 1m, 5m and 1h windows filled, 361 critical-path
//! slots × 256 keys, the Prometheus recorder's 1,000 label sets with four outcomes each, and
//! the history store's feed (a minute of 1,000 series) and writer (that minute written and
//! kept merged).
//!
//! `cargo bench -p infertrace-collector --bench aggregates_memory`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use infertrace_analysis::critical_path::{CriticalPath, CriticalPathWindows, Segment};
use infertrace_analysis::kpi::KpiWindows;
use infertrace_analysis::record::{Dialect, Outcome, RequestRecord};
use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{SpanId, TraceId};
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::internal_events::InternalEvents;
use infertrace_collector::prom_export::{PromMetrics, PromRecorder};
use infertrace_collector::store::{Store, StoreOptions, minute_of, unix_nanos_now};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_790_000_000 * SEC;

/// A request of series `series` (one of 1,000 models), with `outcome` and every phase.
fn record(series: usize, outcome: Outcome, at: u64) -> RequestRecord {
    let mut r = RequestRecord::new(
        TraceId([1; 16]),
        SpanId([1; 8]),
        Text::from(format!("service-{}", series % 10).as_str()),
        Dialect::Infertrace,
        at,
        at + SEC,
    );
    r.model = Text::from(format!("model-{series:04}").as_str());
    r.operation = "chat".into();
    r.outcome = outcome;
    (r.e2e, r.queue, r.prefill, r.decode) = (1.0, Some(0.01), Some(0.1), Some(0.89));
    (r.ttft, r.tpot) = (Some(0.11), Some(0.01));
    (r.input_tokens, r.output_tokens) = (Some(100), Some(90));
    r
}

fn bench(c: &mut Criterion) {
    let config = CollectorConfig::default();
    let series = config.limits.max_series;
    let outcomes = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Cancelled,
        Outcome::Rejected,
    ];

    // Every series recorded every 10 s for an hour: each slot of each window holds data.
    let mut kpis = KpiWindows::new(config.kpi_config());
    for step in 0..360u64 {
        let at = T0 + step * 10 * SEC;
        for s in 0..series {
            kpis.record(&record(s, Outcome::Ok, at), at + SEC);
        }
    }

    // 256 keys in each of the 361 slots, e2e spread over ~300 buckets.
    let mut critical = CriticalPathWindows::new(config.critical_path_windows_config());
    for i in 0..361 * 256usize {
        let e2e = 0.05 * 1.0236f64.powi((i % 293) as i32);
        let end = (e2e * 1e9) as u64;
        let path = CriticalPath {
            trace_id: TraceId([1; 16]),
            root: SpanId([1; 8]),
            segments: vec![Segment {
                span_id: SpanId([2; 8]),
                name: Text::from(format!("span-{}", i % 256).as_str()),
                service: Text::from("service"),
                start_unix_nano: 0,
                end_unix_nano: end,
            }],
            adjustments: vec![],
        };
        critical.record(&path, e2e, T0 + (i / 256) as u64 * 10 * SEC);
    }

    let mut prom = PromRecorder::new(
        PromMetrics::default(),
        config.kpi_dimensions(),
        config.slo(),
        series,
    );
    for s in 0..series {
        for outcome in outcomes {
            prom.record(&record(s, outcome, T0));
        }
    }

    // A minute of every series in the history feed; then handed over and written, the writer
    // keeps it merged.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = Store::open(dir.path(), StoreOptions::default()).expect("the store opens");
    let writer = store
        .start_writer(InternalEvents::default())
        .expect("the writer starts");
    let mut feed = store.feed(writer.clone(), &config.kpi_config());
    let minute = minute_of(unix_nanos_now()) - 5 * 60 * SEC;
    for step in 0..10u64 {
        for s in 0..series {
            feed.record(&record(s, Outcome::Ok, minute), None, minute + step * SEC);
        }
    }
    let feed_minute = feed.approx_memory_bytes();
    feed.hand_over(minute + 30 * SEC);
    writer.flush().expect("the minute is written");

    let mut g = c.benchmark_group("aggregates_memory");
    g.bench_function("history_feed_1000_series", |b| {
        b.iter(|| black_box(&feed).approx_memory_bytes() + black_box(&writer).memory_bytes())
    });
    g.bench_function("kpi_windows_1000_series", |b| {
        b.iter(|| black_box(&kpis).approx_memory_bytes())
    });
    g.bench_function("critical_path_windows_361_slots_256_keys", |b| {
        b.iter(|| black_box(&critical).approx_memory_bytes())
    });
    g.bench_function("prometheus_1000_label_sets", |b| {
        b.iter(|| black_box(&prom).approx_memory_bytes())
    });
    g.finish();
    eprintln!(
        "bytes at these bounds: KPI windows {}, critical-path windows {}, Prometheus {}, \
         history feed's minute {feed_minute}, history writer's merged minute {}",
        kpis.approx_memory_bytes(),
        critical.approx_memory_bytes(),
        prom.approx_memory_bytes(),
        writer.memory_bytes()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
