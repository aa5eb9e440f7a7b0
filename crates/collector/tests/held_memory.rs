//! The memory limiter holds what the assembler really holds for traces in flight as spans: a
//! disaggregated trace's 17 spans from five services wait as spans (not prepared), each in a
//! vector grown by doubling, in the assembler's map and queues. This binary counts every
//! allocation (one test only, so nothing else allocates meanwhile) and checks the limiter's
//! bytes against the bytes the pipeline holds after ingesting such traces: a figure far below
//! lets the collector pass its memory limit unseen (an independent review measured 667 MiB of
//! RSS against a 512 MiB limit with `otlp-blast --pd` before the tables were counted, and
//! 605-626 MiB while they were measured only once a second).

mod support_counting;

use std::time::{Duration, Instant};

use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{AttrValue, Span, SpanId, SpanKind, StatusCode, TraceId};
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::ingest::IngestBatch;
use infertrace_collector::internal_events::InternalEvents;
use infertrace_collector::limiter::MemoryLimiter;
use infertrace_collector::pipeline::{Pipeline, unix_nanos_now};
use infertrace_collector::prom_export::PromMetrics;

/// Traces ingested, and spans a trace (a PD trace: router, prefill and decode workers).
const TRACES: usize = 20_000;
const SPANS: usize = 17;
/// Traces a request (an exporter's batch of ~1,000 spans).
const TRACES_A_BATCH: usize = 58;

const SERVICES: [&str; 5] = ["router", "prefill-1", "prefill-2", "decode-1", "decode-2"];

/// Span `j` of trace `t`: from one of five services, with six attributes, none of them a
/// request span's (so every trace waits in the assembler as spans).
fn span(t: usize, j: usize, services: &[Text]) -> Span {
    let mut trace_id = [0u8; 16];
    trace_id[..8].copy_from_slice(&(t as u64 + 1).to_le_bytes());
    let attributes = vec![
        ("x.queue_ns", AttrValue::Int(j as i64 * 1000)),
        ("x.tokens", AttrValue::Int(512)),
        ("x.ratio", AttrValue::Double(0.5)),
        ("x.cached", AttrValue::Bool(j.is_multiple_of(2))),
        ("x.phase", AttrValue::Str(Text::from("prefill"))),
        ("x.worker", AttrValue::Str(services[j % 5].clone())),
    ];
    Span {
        trace_id: TraceId(trace_id),
        span_id: SpanId(((t * SPANS + j) as u64 + 1).to_le_bytes()),
        parent_span_id: (j > 0).then(|| SpanId(((t * SPANS) as u64 + 1).to_le_bytes())),
        name: Text::from("phase"),
        service: services[j % SERVICES.len()].clone(),
        kind: SpanKind::Internal,
        start_unix_nano: 1_000,
        end_unix_nano: 2_000,
        status: StatusCode::Unset,
        attributes,
        links: Vec::new(),
    }
}

#[test]
fn the_limiter_holds_what_spans_in_flight_and_their_tables_take() {
    let services: Vec<Text> = SERVICES.iter().map(|s| Text::from(*s)).collect();
    let mut config = CollectorConfig::default();
    config.limits.memory_limit_bytes = 4 << 30;
    config.limits.max_traces_in_flight = 1_000_000;
    let pipeline = Pipeline::new(
        &config,
        InternalEvents::default(),
        PromMetrics::default(),
        MemoryLimiter::new(config.limits.memory_limit_bytes),
        None,
    );
    // From here: what the traces cost (the aggregates exist before any trace; the trace index,
    // allocated zeroed at start for a million ids, is counted whole by the limiter: 32 MiB).
    let before = support_counting::held();
    let now = Instant::now();
    for first in (0..TRACES).step_by(TRACES_A_BATCH) {
        let spans = (first..(first + TRACES_A_BATCH).min(TRACES))
            .flat_map(|t| (0..SPANS).map(move |j| (t, j)))
            .map(|(t, j)| span(t, j, &services))
            .collect();
        let batch = IngestBatch {
            spans,
            ..IngestBatch::default()
        };
        assert_eq!(pipeline.ingest_at(batch, now), Ok(0));
    }
    // Held as the batches grew the tables (the next batch is admitted against them), and
    // still after a tick a second later (which may shrink sparse tables; no trace is due:
    // none has a request span).
    let check = |when: &str| {
        assert_eq!(pipeline.traces_in_flight(), TRACES);
        let held = support_counting::held() - before;
        let limited = pipeline.data_memory_bytes() + pipeline.table_memory_bytes();
        let ratio = limited as f64 / held as f64;
        eprintln!(
            "{TRACES} traces of {SPANS} spans, {when}: {held} bytes held, {limited} in the \
             limiter ({ratio:.2}×)"
        );
        assert!(
            (0.9..1.4).contains(&ratio),
            "{when}: the limiter holds {limited} bytes for {held} allocated ({ratio:.2}×)"
        );
    };
    check("after the batches");
    pipeline.tick_at(now + Duration::from_secs(1), unix_nanos_now());
    check("after a tick");
}
