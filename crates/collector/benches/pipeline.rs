//! Cost of the pipeline's two halves on 1,000-span batches of 4-span inference traces:
//! `ingest` (what a receiver thread pays, mostly under the assembler lock) and `analyse`
//! (dialect → KPIs → critical path → Prometheus → trace ring, on the tick task).
//!
//! `cargo bench -p infertrace-collector --bench pipeline`

use infertrace_analysis::text::Text;
use std::time::Instant;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use infertrace_analysis::trace::{AttrValue, Span, SpanId, SpanKind, StatusCode, TraceId};
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::ingest::IngestBatch;
use infertrace_collector::internal_events::InternalEvents;
use infertrace_collector::limiter::MemoryLimiter;
use infertrace_collector::pipeline::{Pipeline, unix_nanos_now};
use infertrace_collector::prom_export::PromMetrics;
use infertrace_semconv as sc;

const MS: u64 = 1_000_000;

fn trace(n: u32, service: &Text) -> Vec<Span> {
    let mut tid = [7u8; 16];
    tid[..4].copy_from_slice(&n.to_le_bytes());
    let id = |k: u8| {
        let mut s = [k; 8];
        s[..4].copy_from_slice(&n.to_le_bytes());
        SpanId(s)
    };
    let t0 = 1_790_000_000_000 * MS + u64::from(n) * MS;
    let (q, p, d) = (
        t0 + 20 * MS,
        t0 + 90 * MS,
        t0 + 900 * MS + u64::from(n % 100) * MS,
    );
    let span = |k: u8, parent: Option<SpanId>, name: &str, s: u64, e: u64| Span {
        trace_id: TraceId(tid),
        span_id: id(k),
        parent_span_id: parent,
        name: name.into(),
        service: service.clone(),
        kind: if parent.is_some() {
            SpanKind::Internal
        } else {
            SpanKind::Server
        },
        start_unix_nano: s,
        end_unix_nano: e,
        status: StatusCode::Unset,
        attributes: vec![(sc::infer::PHASE, AttrValue::Str(name.into()))],
        links: Vec::new(),
    };
    let mut root = span(1, None, "chat llama-3.1-8b", t0, d);
    root.attributes = vec![
        (sc::gen_ai::OPERATION_NAME, AttrValue::Str("chat".into())),
        (
            sc::gen_ai::REQUEST_MODEL,
            AttrValue::Str("llama-3.1-8b".into()),
        ),
        (
            sc::gen_ai::RESPONSE_MODEL,
            AttrValue::Str("llama-3.1-8b".into()),
        ),
        (sc::gen_ai::USAGE_INPUT_TOKENS, AttrValue::Int(512)),
        (sc::gen_ai::USAGE_OUTPUT_TOKENS, AttrValue::Int(128)),
        (sc::infer::OUTCOME, AttrValue::Str("ok".into())),
        (sc::infer::PHASE_SOURCE, AttrValue::Str("engine".into())),
        (sc::infer::TIME_PER_OUTPUT_TOKEN, AttrValue::Double(0.0063)),
        (sc::net::HTTP_RESPONSE_STATUS_CODE, AttrValue::Int(200)),
        (
            sc::net::HTTP_ROUTE,
            AttrValue::Str("/v1/chat/completions".into()),
        ),
    ];
    vec![
        span(2, Some(id(1)), "queue", t0, q),
        span(3, Some(id(1)), "prefill", q, p),
        span(4, Some(id(1)), "decode", p, d),
        root,
    ]
}

fn batch(first: u32) -> IngestBatch {
    let service = Text::from("llm");
    IngestBatch {
        spans: (first..first + 250)
            .flat_map(|n| trace(n, &service))
            .collect(),
        ..Default::default()
    }
}

fn pipeline() -> Pipeline {
    Pipeline::new(
        &CollectorConfig::default(),
        InternalEvents::default(),
        PromMetrics::default(),
        MemoryLimiter::new(1 << 34),
        None,
    )
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("ingest_1000_spans", |b| {
        b.iter_batched(
            || (pipeline(), batch(0)),
            |(p, batch)| {
                p.ingest_at(batch, Instant::now()).ok();
                p
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("analyse_250_traces", |b| {
        b.iter_batched(
            || {
                let p = pipeline();
                p.ingest_at(batch(0), Instant::now()).ok();
                p
            },
            |p| {
                p.tick_at(
                    Instant::now() + std::time::Duration::from_secs(3),
                    unix_nanos_now(),
                );
                p
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
