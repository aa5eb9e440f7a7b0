//! Hot-path costs of the analysis a collector runs per request: extracting the request record
//! of a 4-span infertrace trace, recording it into the KPI windows (1m/5m/1h, 60 slots each),
//! all of the per-request analysis this crate does (`per_request/infertrace_4_spans`: record,
//! critical path, KPI and critical-path windows: a floor under what the collector spends a
//! request, see docs/PERFORMANCE.md), and snapshotting the windows with many series.

use infertrace_analysis::text::Text;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use infertrace_analysis::critical_path::{
    CriticalPathOptions, CriticalPathWindows, aggregation_path, critical_path,
};
use infertrace_analysis::dialect::{extract_requests, extract_requests_into};
use infertrace_analysis::kpi::{KpiConfig, KpiWindows};
use infertrace_analysis::trace::{
    AttrValue, Span, SpanId, SpanKind, StatusCode, TraceId, known_key,
};
use infertrace_semconv as sc;

const T: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;

fn span(name: &str, id: u8, parent: Option<u8>, start_ms: u64, end_ms: u64) -> Span {
    Span {
        trace_id: TraceId([1; 16]),
        span_id: SpanId([id; 8]),
        parent_span_id: parent.map(|p| SpanId([p; 8])),
        name: name.into(),
        service: Text::from("svc"),
        kind: if parent.is_none() {
            SpanKind::Server
        } else {
            SpanKind::Internal
        },
        start_unix_nano: T + start_ms * MS,
        end_unix_nano: T + end_ms * MS,
        status: StatusCode::Unset,
        attributes: Vec::new(),
        links: Vec::new(),
    }
}

fn attr(key: &str, v: AttrValue) -> (&'static str, AttrValue) {
    (known_key(key.as_bytes()).unwrap(), v)
}

fn trace() -> Vec<Span> {
    let mut req = span("chat llama", 1, None, 0, 1300);
    req.attributes = vec![
        attr(sc::gen_ai::OPERATION_NAME, AttrValue::Str("chat".into())),
        attr(sc::gen_ai::REQUEST_MODEL, AttrValue::Str("llama".into())),
        attr(sc::gen_ai::USAGE_INPUT_TOKENS, AttrValue::Int(100)),
        attr(sc::gen_ai::USAGE_OUTPUT_TOKENS, AttrValue::Int(11)),
        attr(sc::infer::OUTCOME, AttrValue::Str("ok".into())),
        attr(sc::infer::INTER_TOKEN_LATENCY_P50, AttrValue::Double(0.09)),
        attr(sc::infer::INTER_TOKEN_LATENCY_P99, AttrValue::Double(0.2)),
        attr(sc::infer::INTER_TOKEN_LATENCY_MAX, AttrValue::Double(0.3)),
    ];
    let phase = |name: &str, id, s, e| {
        let mut p = span(name, id, Some(1), s, e);
        p.attributes = vec![attr(sc::infer::PHASE, AttrValue::Str(name.into()))];
        p
    };
    vec![
        phase("queue", 2, 0, 50),
        phase("prefill", 3, 50, 250),
        phase("decode", 4, 250, 1250),
        req,
    ]
}

fn bench(c: &mut Criterion) {
    let spans = trace();
    c.bench_function("extract_requests/infertrace_4_spans", |b| {
        b.iter(|| black_box(extract_requests(black_box(&spans))))
    });

    let record = extract_requests(&spans).remove(0);
    let mut windows = KpiWindows::new(KpiConfig::default());
    let mut now = T;
    c.bench_function("kpi_record/one_series", |b| {
        b.iter(|| {
            now += MS; // 1,000 requests/s
            black_box(windows.record(black_box(&record), now))
        })
    });

    // Everything the collector's analysis asks of this crate for one request, as the pipeline
    // calls it (records into a reused vector, as `Analysed::of` does).
    let mut windows = KpiWindows::new(KpiConfig::default());
    let mut critical = CriticalPathWindows::default();
    let opts = CriticalPathOptions::default();
    let mut records = Vec::new();
    c.bench_function("per_request/infertrace_4_spans", |b| {
        b.iter(|| {
            now += MS;
            records.clear();
            extract_requests_into(black_box(&spans), &mut records);
            for r in &records {
                let path = critical_path(&spans, r.span_id, &opts);
                windows.record(r, now);
                let across = aggregation_path(r, path.as_ref());
                if let Some(p) = across.as_ref().or(path.as_ref()) {
                    critical.record(p, r.e2e, now);
                }
            }
            black_box(records.len())
        })
    });

    // 100 series, each with an hour of traffic at 2 requests/s, realistic spreads of every
    // latency; memory with the default 60 slots per window and with 12.
    let busy = |slots_per_window| {
        let mut windows = KpiWindows::new(KpiConfig {
            slots_per_window,
            ..KpiConfig::default()
        });
        let mut r = record.clone();
        let mut x = 1u64;
        for k in 0..7_200u64 {
            for s in 0..100 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                r.model = format!("model-{s}").into();
                r.queue = Some(0.001 + u * u * 2.0);
                r.prefill = Some(0.05 + u * 0.4);
                r.ttft = Some(r.queue.unwrap() + r.prefill.unwrap());
                r.decode = Some(1.0 + (1.0 - u) * 9.0);
                r.e2e = r.ttft.unwrap() + r.decode.unwrap() + 0.002;
                r.tpot = Some(r.decode.unwrap() / 200.0);
                windows.record(&r, T + k * 500 * MS);
            }
        }
        windows
    };
    for slots in [60, 12] {
        let w = busy(slots);
        eprintln!(
            "100 series at 2 req/s for 1 h, {slots} slots per window: ~{} KiB per series",
            w.approx_memory_bytes() / 1024 / 100
        );
    }
    let windows = busy(60);
    let end = T + 7_200 * 500 * MS;
    for w in [60, 3600] {
        c.bench_function(&format!("kpi_snapshot/100_series_{w}s"), |b| {
            b.iter(|| black_box(windows.snapshot(Duration::from_secs(w), end)))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
