//! Cost of the embedded history store:
//! - `write_minute_1000_series`: hand one minute of 1,000 series (each accumulator from 100
//!   requests) to the writer and commit it — what the writer thread pays per minute;
//! - `feed_record`: what the pipeline pays per request to feed the store (under its lock);
//! - `history_7d_step_1h` / `history_24h_step_1m`: `Store::history("ttft.p99", …)` over 7 days
//!   of one series stored at 1-minute resolution.
//!
//! `cargo bench -p infertrace-collector --bench store`

use infertrace_analysis::text::Text;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use infertrace_analysis::kpi::{Accumulator, KpiConfig, SeriesKey, SloConfig, sketch_config};
use infertrace_analysis::record::{Dialect, Outcome, RequestRecord};
use infertrace_analysis::trace::{SpanId, TraceId};
use infertrace_collector::internal_events::InternalEvents;
use infertrace_collector::store::{
    HistoryFilter, MINUTE_NANOS, Store, StoreOptions, minute_of, unix_nanos_now,
};

const SERIES: usize = 1000;
const REQUESTS_PER_SERIES_MINUTE: usize = 100;

/// Deterministic request of latency spread log-uniformly over ~20 ms … 20 s.
fn record(n: u64, model: &str) -> RequestRecord {
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    let u = (x >> 11) as f64 / (1u64 << 53) as f64;
    let e2e = 0.02 * 1000f64.powf(u);
    let mut r = RequestRecord::new(
        TraceId([1; 16]),
        SpanId([1; 8]),
        Text::from("svc"),
        Dialect::Infertrace,
        0,
        0,
    );
    r.model = model.into();
    r.operation = "chat".into();
    r.outcome = Outcome::Ok;
    r.e2e = e2e;
    r.queue = Some(e2e * 0.1);
    r.prefill = Some(e2e * 0.15);
    r.ttft = Some(e2e * 0.25);
    r.decode = Some(e2e * 0.75);
    r.tpot = Some(e2e * 0.75 / 199.0);
    r.input_tokens = Some(500);
    r.output_tokens = Some(200);
    r
}

fn accumulator(seed: u64, n: usize) -> Accumulator {
    let (config, slo) = (sketch_config(), SloConfig::default());
    let mut acc = Accumulator::default();
    for k in 0..n as u64 {
        acc.add(&config, &slo, &record(seed * 1_000_003 + k, "m"));
    }
    acc
}

fn options() -> StoreOptions {
    StoreOptions {
        retention: Duration::from_secs(30 * 24 * 3600),
        queue_capacity: 1 << 16,
        ..StoreOptions::default()
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("store");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));

    // One minute of 1,000 series.
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path(), options()).expect("store");
    let writer = store
        .start_writer(InternalEvents::default())
        .expect("writer");
    let minute_rollups: Vec<(SeriesKey, Accumulator)> = (0..SERIES)
        .map(|i| {
            let key = SeriesKey {
                service: Arc::from(format!("svc-{}", i % 10)),
                model: Arc::from(format!("model-{i}")),
                operation: Arc::from("chat"),
            };
            (key, accumulator(i as u64, REQUESTS_PER_SERIES_MINUTE))
        })
        .collect();
    let bytes: usize = minute_rollups.iter().map(|(_, a)| a.to_bytes().len()).sum();
    let heap: usize = minute_rollups.iter().map(|(_, a)| a.heap_bytes()).sum();
    println!(
        "encoded rollup: {} bytes per series-minute on average ({} requests; in memory {} bytes)",
        bytes / SERIES,
        REQUESTS_PER_SERIES_MINUTE,
        heap / SERIES
    );
    let mut minute = minute_of(unix_nanos_now()) - 20 * 24 * 3600 * 1_000_000_000;
    group.bench_function("write_minute_1000_series", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batch = minute_rollups.clone();
                minute += MINUTE_NANOS;
                let t = Instant::now();
                writer.write_rollups(minute, batch);
                writer.flush().expect("flush");
                total += t.elapsed();
            }
            total
        })
    });
    let db_bytes = std::fs::metadata(store.path()).map_or(0, |m| m.len())
        + std::fs::metadata(store.path().with_extension("db-wal")).map_or(0, |m| m.len());
    let rows = store
        .rollups(0, u64::MAX / 2)
        .expect("rollups")
        .len()
        .max(1);
    println!(
        "database after the write benchmark: {} KiB for {rows} series-minutes, {} bytes each",
        db_bytes / 1024,
        db_bytes / rows as u64
    );

    // The per-request cost of feeding the store (the writer takes the hand-overs).
    let mut feed = store.feed(writer.clone(), &KpiConfig::default());
    let records: Vec<RequestRecord> = (0..10_000u64)
        .map(|k| record(k, if k % 2 == 0 { "a" } else { "b" }))
        .collect();
    let mut now = minute_of(unix_nanos_now()) - 10 * 24 * 3600 * 1_000_000_000;
    group.bench_function("feed_record", |b| {
        let mut k = 0usize;
        b.iter(|| {
            now += 100_000; // 10,000 requests a second
            feed.record(&records[k % records.len()], None, now);
            k += 1;
        })
    });
    writer.flush().expect("flush");

    // Seven days of one series at one-minute resolution.
    let dir7 = tempfile::tempdir().expect("temp dir");
    let store7 = Store::open(dir7.path(), options()).expect("store");
    let writer7 = store7
        .start_writer(InternalEvents::default())
        .expect("writer");
    let end = minute_of(unix_nanos_now());
    let minutes = 7 * 24 * 60u64;
    let start = end - minutes * MINUTE_NANOS;
    let key = SeriesKey {
        service: Arc::from("svc"),
        model: Arc::from("m"),
        operation: Arc::from("chat"),
    };
    for m in 0..minutes {
        let acc = accumulator(m, 60);
        writer7.write_rollups(start + m * MINUTE_NANOS, vec![(key.clone(), acc)]);
        if m % 1000 == 0 {
            writer7.flush().expect("flush");
        }
    }
    writer7.flush().expect("flush");
    let filter = HistoryFilter {
        model: Some("m".into()),
        ..HistoryFilter::default()
    };
    group.bench_function("history_7d_step_1h", |b| {
        b.iter(|| {
            let points = store7
                .history("ttft.p99", &filter, start, end, Duration::from_secs(3600))
                .expect("history");
            assert_eq!(points.len(), 168);
            points
        })
    });
    let day_start = end - 24 * 60 * MINUTE_NANOS;
    group.bench_function("history_24h_step_1m", |b| {
        b.iter(|| {
            let points = store7
                .history("ttft.p99", &filter, day_start, end, Duration::from_secs(60))
                .expect("history");
            assert_eq!(points.len(), 1440);
            points
        })
    });
    group.bench_function("rollups_1h_rebuild", |b| {
        b.iter(|| {
            store7
                .rollups(end - 60 * MINUTE_NANOS, end)
                .expect("rollups")
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
