use infertrace_analysis::text::Text;
use std::time::{Duration, Instant};

use infertrace_analysis::critical_path::CriticalPathWindows;
use infertrace_analysis::trace::{AttrValue, Span, SpanId, SpanKind, StatusCode, TraceId};
use infertrace_semconv as sc;

use super::*;
use crate::held::prepared::SourceEncoding;
use crate::prom_export::{build_registry, encode};

const MS: u64 = 1_000_000;

/// An infertrace-dialect request: queue `q` ms, prefill `p` ms, decode `d` ms, `out` tokens.
fn request_trace(trace: u8, model: &str, q: u64, p: u64, d: u64, out: i64) -> Vec<Span> {
    let t0 = 1_700_000_000_000 * MS;
    let id = |n: u8| SpanId([trace, n, 0, 0, 0, 0, 0, 1]);
    let span = |n: u8, parent: Option<SpanId>, name: &str, start: u64, end: u64| Span {
        trace_id: TraceId([trace; 16]),
        span_id: id(n),
        parent_span_id: parent,
        name: name.into(),
        service: Text::from("llm"),
        kind: if parent.is_none() {
            SpanKind::Server
        } else {
            SpanKind::Internal
        },
        start_unix_nano: start,
        end_unix_nano: end,
        status: StatusCode::Unset,
        attributes: Vec::new(),
        links: Vec::new(),
    };
    let mut root = span(1, None, &format!("chat {model}"), t0, t0 + (q + p + d) * MS);
    root.attributes = vec![
        (sc::gen_ai::OPERATION_NAME, AttrValue::Str("chat".into())),
        (sc::gen_ai::REQUEST_MODEL, AttrValue::Str(model.into())),
        (sc::gen_ai::USAGE_INPUT_TOKENS, AttrValue::Int(100)),
        (sc::gen_ai::USAGE_OUTPUT_TOKENS, AttrValue::Int(out)),
        (sc::infer::OUTCOME, AttrValue::Str("ok".into())),
    ];
    let phase = |n: u8, name: &str, start: u64, end: u64| {
        let mut s = span(n, Some(id(1)), name, start, end);
        s.attributes = vec![(sc::infer::PHASE, AttrValue::Str(name.into()))];
        s
    };
    let (a, b, c) = (t0 + q * MS, t0 + (q + p) * MS, t0 + (q + p + d) * MS);
    vec![
        phase(2, sc::span::QUEUE, t0, a),
        phase(3, sc::span::PREFILL, a, b),
        phase(4, sc::span::DECODE, b, c),
        root,
    ]
}

fn pipeline(config: &CollectorConfig) -> (Pipeline, prometheus_client::registry::Registry) {
    let events = InternalEvents::default();
    let metrics = PromMetrics::default();
    let registry = build_registry(&metrics, &events);
    let p = Pipeline::new(config, events, metrics, MemoryLimiter::new(1 << 30), None);
    (p, registry)
}

fn batch(spans: Vec<Span>) -> IngestBatch {
    IngestBatch {
        spans,
        ..Default::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 0.01 * b.abs() + 1e-9
}

#[test]
fn completed_trace_feeds_kpis_metrics_and_the_trace_index() {
    let (p, registry) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let unix = unix_nanos_now();
    p.ingest_at(batch(request_trace(1, "m", 20, 80, 900, 11)), t0)
        .unwrap();
    assert_eq!(
        p.tick_at(t0 + Duration::from_millis(1999), unix).requests,
        0
    );
    assert_eq!(p.traces_in_flight(), 1);
    let stats = p.tick_at(t0 + Duration::from_secs(2), unix);
    assert_eq!((stats.traces, stats.requests), (1, 1));

    let snap = p.kpis(Duration::from_secs(60));
    assert_eq!(snap.series.len(), 1);
    let s = &snap.series[0];
    assert_eq!(
        (s.service.as_str(), s.model.as_str(), s.operation.as_str()),
        ("llm", "m", "chat")
    );
    assert_eq!(s.requests, 1);
    assert!(close(s.e2e.unwrap().p50, 1.0), "{:?}", s.e2e);
    assert!(close(s.queue.unwrap().p50, 0.020), "{:?}", s.queue);
    assert!(close(s.ttft.unwrap().p50, 0.100), "{:?}", s.ttft);
    assert!(close(s.decode.unwrap().p50, 0.900), "{:?}", s.decode);
    assert!(close(s.tpot.unwrap().p50, 0.090), "{:?}", s.tpot);
    assert_eq!(s.tokens.output, 11);

    let text = encode(&registry);
    let l = r#"service="llm",model="m",operation="chat",outcome="ok""#;
    assert!(
        text.contains(&format!("infertrace_requests_total{{{l}}} 1")),
        "{text}"
    );
    assert!(text.contains(&format!(
        "infertrace_time_to_first_token_seconds_bucket{{le=\"0.1\",{l}}} 1"
    )));
    assert!(text.contains(&format!(
        "infertrace_time_to_first_token_seconds_bucket{{le=\"0.08\",{l}}} 0"
    )));
    assert!(
        text.contains(r#"infertrace_critical_path_seconds_total{service="llm",span="decode"} 0.9"#),
        "{text}"
    );

    let stored = p.trace(&TraceId([1; 16])).expect("stored");
    assert_eq!(stored.spans.len(), 4);
    let path = stored.requests[0].critical_path.as_ref().unwrap();
    let names: Vec<&str> = path.segments.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["queue", "prefill", "decode"]);
    assert!(p.trace(&TraceId([9; 16])).is_none());

    let cp = p.critical_path(Duration::from_secs(60));
    assert_eq!(cp.requests, 1);
}

/// A request span whose clock is broken (it ends 584 years after 1970) or whose token count is
/// corrupt stays out of the KPIs, the Prometheus histograms and the critical paths, counted by
/// reason; the trace itself is still stored, and a good request beside them is recorded.
#[test]
fn implausible_requests_stay_out_of_the_aggregates_and_are_counted() {
    let (p, registry) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let unix = unix_nanos_now();
    let mut broken_clock = request_trace(1, "m", 20, 80, 900, 11);
    broken_clock[3].start_unix_nano = 1;
    broken_clock[3].end_unix_nano = u64::MAX;
    let mut corrupt_tokens = request_trace(2, "m", 20, 80, 900, 11);
    corrupt_tokens[3].attributes[2] = (sc::gen_ai::USAGE_INPUT_TOKENS, AttrValue::Int(i64::MAX));
    let good = request_trace(3, "m", 20, 80, 900, 11);
    for trace in [broken_clock, corrupt_tokens, good] {
        p.ingest_at(batch(trace), t0).unwrap();
    }
    let stats = p.tick_at(t0 + Duration::from_secs(3), unix);
    assert_eq!(stats.traces, 3);

    let snap = p.kpis(Duration::from_secs(60));
    assert_eq!(snap.series.len(), 1);
    assert_eq!(snap.series[0].requests, 1);
    assert_eq!(snap.series[0].tokens.input, 100);
    assert!(close(snap.series[0].e2e.unwrap().max, 1.0));
    assert_eq!(p.critical_path(Duration::from_secs(60)).requests, 1);
    let text = encode(&registry);
    let l = r#"service="llm",model="m",operation="chat",outcome="ok""#;
    assert!(
        text.contains(&format!(
            "infertrace_request_duration_seconds_sum{{{l}}} 1.0"
        )),
        "{text}"
    );
    for reason in ["duration", "tokens"] {
        assert!(
            text.contains(&format!(
                "infertrace_implausible_requests_total{{reason=\"{reason}\"}} 1"
            )),
            "{text}"
        );
    }
    assert!(
        p.trace(&TraceId([1; 16])).is_some(),
        "the trace is still shown"
    );
}

#[test]
fn a_batch_sent_again_within_the_grace_period_counts_once() {
    // Analysed on arrival (protobuf body) and as plain spans, the retry within the grace
    // period and a retry of part of the trace.
    for (what, first, again) in [
        (
            "prepared",
            proto_batch(&request_trace(1, "m", 20, 80, 900, 11)),
            proto_batch(&request_trace(1, "m", 20, 80, 900, 11)),
        ),
        (
            "spans",
            batch(request_trace(1, "m", 20, 80, 900, 11)),
            batch(request_trace(1, "m", 20, 80, 900, 11)[2..].to_vec()),
        ),
        (
            "twice in one batch",
            proto_batch(
                &[
                    request_trace(1, "m", 20, 80, 900, 11),
                    request_trace(1, "m", 20, 80, 900, 11),
                ]
                .concat(),
            ),
            proto_batch(&[]),
        ),
    ] {
        let (p, registry) = pipeline(&CollectorConfig::default());
        let t0 = Instant::now();
        let unix = unix_nanos_now();
        p.ingest_at(first, t0).unwrap();
        p.ingest_at(again, t0 + Duration::from_millis(500)).unwrap();
        let stats = p.tick_at(t0 + Duration::from_secs(3), unix);
        assert_eq!((stats.traces, stats.requests), (1, 1), "{what}");
        assert_eq!(
            p.kpis(Duration::from_secs(60)).series[0].requests,
            1,
            "{what}"
        );
        assert_eq!(p.trace(&TraceId([1; 16])).unwrap().spans.len(), 4, "{what}");
        let duplicates = if what == "spans" { 2 } else { 4 };
        assert!(
            encode(&registry).contains(&format!("infertrace_duplicate_spans_total {duplicates}")),
            "{what}"
        );
    }
}

#[test]
fn traces_past_the_ring_admission_rate_are_analysed_but_not_kept() {
    let mut config = CollectorConfig::default();
    config.api.recent_traces = 2;
    let (p, _) = pipeline(&config);
    let t0 = Instant::now();
    let spans: Vec<Span> = (1..=10u8)
        .flat_map(|k| request_trace(k, "m", 10, 20, 30, 4))
        .collect();
    p.ingest_at(batch(spans), t0).unwrap();
    let stats = p.tick_at(t0 + Duration::from_secs(3), unix_nanos_now());
    assert_eq!(stats.requests, 10, "every trace is analysed");
    let mut held = 0;
    p.visit_recent_traces(&mut |_| held += 1);
    assert_eq!(held, 2);
    assert_eq!(p.events().recent_traces_not_kept.get(), 8);
}

#[test]
fn memory_limit_refuses_with_overloaded() {
    let events = InternalEvents::default();
    let p = Pipeline::new(
        &CollectorConfig::default(),
        events,
        PromMetrics::default(),
        MemoryLimiter::new(400),
        None,
    );
    let err = p
        .ingest_at(batch(request_trace(1, "m", 1, 1, 1, 2)), Instant::now())
        .unwrap_err();
    assert_eq!(
        err,
        IngestError::Overloaded {
            retry_after_secs: 1
        }
    );
    assert_eq!(p.traces_in_flight(), 0);
    assert_eq!(p.data_memory_bytes(), 0);
}

/// With the resident memory watched, every tick reads it into `resident_memory_bytes`, and
/// the ticks at which it is near the limit's bound (and not yet far enough below it again)
/// count in `memory_returned_ticks_total`.
#[test]
fn the_resident_memory_is_read_at_every_tick() {
    use crate::resident::{OVERHEAD, RETURN_WITHIN};
    use std::sync::atomic::AtomicUsize;
    static RESIDENT: AtomicUsize = AtomicUsize::new(0);
    fn read() -> Option<usize> {
        Some(RESIDENT.load(Ordering::Relaxed))
    }
    let limit = 64 << 20;
    let (p, registry) = {
        let (events, metrics) = (InternalEvents::default(), PromMetrics::default());
        let registry = build_registry(&metrics, &events);
        let config = CollectorConfig::default();
        let p = Pipeline::new(&config, events, metrics, MemoryLimiter::new(limit), None);
        (p, registry)
    };
    // A hook that does nothing (the binary's asks mimalloc): ticks near the bound count only
    // where one is installed. Only this test watches the resident memory.
    crate::resident::set_return_freed_memory(|_| {});
    p.watch_resident_memory(read);
    let near = limit + OVERHEAD - RETURN_WITHIN + 1;
    for resident in [limit / 2, near, near, near - 1, limit] {
        RESIDENT.store(resident, Ordering::Relaxed);
        p.tick();
    }
    let text = encode(&registry);
    assert!(
        text.contains(&format!("infertrace_resident_memory_bytes {}", limit)),
        "{text}"
    );
    assert!(
        text.contains("infertrace_memory_returned_ticks_total 3"),
        "{text}"
    );
}

/// Memory filled by requests in transit (bodies being read and decoded), not by buffered
/// traces: relief closes none of the traces (closing them frees little, and leaves their late
/// spans without them); a request that does not fit is refused, retryably, until it drains.
#[test]
fn requests_in_transit_do_not_make_relief_close_the_buffered_traces() {
    let mut config = CollectorConfig::default();
    config.assembly.grace = Duration::from_secs(600);
    let events = InternalEvents::default();
    let limiter = MemoryLimiter::new(64 << 20);
    let p = Pipeline::new(
        &config,
        events.clone(),
        PromMetrics::default(),
        limiter.clone(),
        None,
    );
    let t0 = Instant::now();
    for i in 0..20 {
        p.ingest_at(batch(request_trace(i, "m", 1, 1, 1, 2)), t0)
            .unwrap();
    }
    // Bodies in transit take the use to the limit, past the soft limit.
    let mut transit = limiter.empty_reservation();
    assert!(transit.try_grow(limiter.limit() - limiter.used() - 1_000));
    for i in 20..30 {
        let _ = p.ingest_at(batch(request_trace(i, "m", 1, 1, 1, 2)), t0);
    }
    assert_eq!(events.closed_early("memory"), 0);
    assert!(p.traces_in_flight() >= 20, "{}", p.traces_in_flight());
    // Once they drain, new traces get in.
    drop(transit);
    p.ingest_at(batch(request_trace(40, "m", 1, 1, 1, 2)), t0)
        .unwrap();
}

/// With a grace period longer than the test, buffered traces fill the memory limit; past its
/// soft limit ingest closes the oldest early and the tick releases them, so new traces keep
/// coming in (a refusal, if the tick has not run yet, is followed by an accepted retry), and
/// every request is analysed. Without the relief, every batch after the limit is refused until
/// the grace period ends.
#[test]
fn buffered_traces_give_way_to_new_ones_under_memory_pressure() {
    let mut config = CollectorConfig::default();
    config.assembly.grace = Duration::from_secs(600);
    config.api.recent_traces = 1;
    let trace_bytes: usize = request_trace(1, "m", 1, 1, 1, 2)
        .iter()
        .map(span_footprint)
        .sum();
    // Room for the aggregates of one model, a ring of one trace and about 20 traces.
    let probe = Pipeline::new(
        &config,
        InternalEvents::default(),
        PromMetrics::default(),
        MemoryLimiter::new(1 << 30),
        None,
    );
    let t0 = Instant::now();
    // The assembler's tables (its trace index is sized at start) with 50 traces in flight.
    for i in 0..50 {
        probe
            .ingest_at(batch(request_trace(i, "m", 1, 1, 1, 2)), t0)
            .unwrap();
    }
    probe.tick_at(t0, unix_nanos_now());
    let tables = probe.table_memory_bytes();
    probe.flush();
    let series = probe.aggregates_memory_bytes() + probe.ring_memory_bytes() + tables;
    let limit = series + 20 * trace_bytes;
    let events = InternalEvents::default();
    let p = Pipeline::new(
        &config,
        events.clone(),
        PromMetrics::default(),
        MemoryLimiter::new(limit),
        None,
    );
    let mut refused = 0;
    let mut fewest_tables = tables;
    for i in 0..200u8 {
        let now = t0 + Duration::from_millis(u64::from(i));
        let trace = || batch(request_trace(i, "m", 1, 1, 1, 2));
        if p.ingest_at(trace(), now).is_err() {
            refused += 1;
            p.tick_at(now, unix_nanos_now());
            p.ingest_at(trace(), now)
                .expect("accepted once the tick released the traces closed early");
        }
        if i % 10 == 9 {
            p.tick_at(now, unix_nanos_now());
        }
        // Reservations stay within the limit; the tables, measured after each batch, may pass
        // it by what they grew since their smallest measure (then ingest is refused).
        fewest_tables = fewest_tables.min(p.table_memory_bytes());
        let grown = p.table_memory_bytes() - fewest_tables;
        assert!(p.limiter().used() <= limit + grown);
    }
    let closed = events.closed_early("memory");
    eprintln!(
        "limit {limit} B ({trace_bytes} B a trace, series {series} B): {closed} traces closed \
         early for memory, {refused} batches refused once"
    );
    assert!(closed >= 150, "{closed} closed early for memory");
    assert_eq!(events.closed_early("max_traces_in_flight"), 0);
    // What stays buffered is under the soft limit of the room the aggregates leave.
    let (limiter, in_flight) = (p.limiter(), p.traces_in_flight());
    assert!(
        in_flight * trace_bytes <= limiter.soft_limit() - limiter.fixed(),
        "{in_flight} traces in flight, soft limit {}, fixed {}, tables {}",
        limiter.soft_limit(),
        limiter.fixed(),
        p.table_memory_bytes()
    );
    p.flush();
    assert_eq!(
        p.requests_recorded(),
        200,
        "every accepted request analysed"
    );
    assert_eq!(p.data_memory_bytes(), 0);
}

#[test]
fn aggregates_memory_is_held_in_the_limiter() {
    let limit = 1 << 30;
    let events = InternalEvents::default();
    let p = Pipeline::new(
        &CollectorConfig::default(),
        events.clone(),
        PromMetrics::default(),
        MemoryLimiter::new(limit),
        None,
    );
    let t0 = Instant::now();
    for i in 0..20u8 {
        p.ingest_at(
            batch(request_trace(i + 1, &format!("model-{i}"), 1, 1, 1, 2)),
            t0,
        )
        .unwrap();
    }
    p.tick_at(t0 + Duration::from_secs(3), unix_nanos_now());
    assert_eq!(p.requests_recorded(), 20);
    // The spans are released; the 20 series' memory is held: KPI windows, critical-path
    // windows (their slots' rows) and Prometheus label sets together.
    let aggregates = p.aggregates_memory_bytes();
    eprintln!("20 series' aggregates hold {aggregates} bytes in the limiter");
    let (kpis, critical, prom) = p.aggregates_memory_parts();
    assert_eq!(kpis + critical + prom, aggregates);
    assert!(kpis > 20 * 1024, "{kpis} bytes for 20 KPI series");
    let empty_windows =
        CriticalPathWindows::new(CollectorConfig::default().critical_path_windows_config());
    assert!(
        critical > empty_windows.approx_memory_bytes() && prom > 20 * 1024,
        "{critical} B, {prom} B"
    );
    // The recent-trace ring keeps the 20 traces: its memory is held too.
    let ring = p.ring_memory_bytes();
    let spans: usize = request_trace(1, "m", 1, 1, 1, 2)
        .iter()
        .map(span_footprint)
        .sum();
    assert!(ring > 20 * spans, "{ring} B for 20 × {spans} B of spans");
    // The assembler's tables too (its trace index, sized at start, its emptied map and queues).
    let tables = p.table_memory_bytes();
    assert!(tables > 0);
    assert_eq!(
        (p.limiter().used(), p.data_memory_bytes()),
        (aggregates + ring + tables, 0)
    );
    // /metrics shows what is held, by part, and the limit.
    let part = |part| {
        events
            .memory_reserved
            .get_or_create(&crate::internal_events::MemoryPartLabels { part })
            .get()
    };
    assert_eq!(
        (
            part("data"),
            part("aggregates"),
            part("recent_traces"),
            part("tables")
        ),
        (0, aggregates as i64, ring as i64, tables as i64)
    );
    assert_eq!(events.memory_limit.get(), limit as i64);
    // With the rest of the limit taken, the aggregates leave no room for a request.
    let rest = p
        .limiter()
        .try_reserve(limit - aggregates - ring - tables)
        .unwrap();
    let refused = p.ingest_at(batch(request_trace(99, "m", 1, 1, 1, 2)), t0);
    assert!(matches!(refused, Err(IngestError::Overloaded { .. })));
    drop(rest);
    // The next measurement follows the aggregates: 20 more models grow the KPI series and the
    // label sets (their critical paths have the same keys, in the same slot).
    let models = |from: u8, at: Instant| {
        for i in from..from + 20 {
            p.ingest_at(
                batch(request_trace(i + 1, &format!("model-{i}"), 1, 1, 1, 2)),
                at,
            )
            .unwrap();
        }
    };
    models(20, t0 + Duration::from_secs(3));
    p.tick_at(t0 + Duration::from_millis(5_500), unix_nanos_now());
    let (kpis2, critical2, prom2) = p.aggregates_memory_parts();
    assert!(kpis2 > kpis && prom2 > prom && critical2 >= critical);
    let measured = p.aggregates_memory_bytes();
    assert_eq!(measured, kpis2 + critical2 + prom2);
    assert_eq!(
        p.limiter().used(),
        measured + p.ring_memory_bytes() + p.table_memory_bytes()
    );
    // Within the interval the reservation stays as measured, though the aggregates grew…
    models(40, t0 + Duration::from_millis(5_500));
    let ready = lock(&p.assembler).flush(t0 + Duration::from_millis(5_600));
    p.analyse(ready, t0 + Duration::from_millis(5_600), unix_nanos_now());
    assert_eq!(p.requests_recorded(), 60);
    let (kpis3, _, prom3) = p.aggregates_memory_parts();
    assert!(kpis3 > kpis2 && prom3 > prom2);
    assert_eq!(p.aggregates_memory_bytes(), measured);
    // …and follows them at the first tick after it.
    p.tick_at(t0 + Duration::from_millis(6_500), unix_nanos_now());
    let (kpis3, critical3, prom3) = p.aggregates_memory_parts();
    assert_eq!(p.aggregates_memory_bytes(), kpis3 + critical3 + prom3);
    assert!(p.aggregates_memory_bytes() > measured);
}

#[test]
fn memory_is_released_when_traces_complete() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    p.ingest_at(batch(request_trace(1, "m", 1, 1, 1, 2)), t0)
        .unwrap();
    assert!(p.data_memory_bytes() > 0);
    p.tick_at(t0 + Duration::from_secs(3), unix_nanos_now());
    assert_eq!(p.data_memory_bytes(), 0);
}

#[test]
fn shutdown_refuses_new_batches_and_flush_records_in_flight_traces() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    p.ingest_at(batch(request_trace(1, "m", 10, 10, 10, 2)), t0)
        .unwrap();
    p.ingest_at(batch(request_trace(2, "m", 10, 10, 10, 2)), t0)
        .unwrap();
    p.begin_shutdown();
    assert_eq!(
        p.ingest_at(batch(request_trace(3, "m", 1, 1, 1, 2)), t0),
        Err(IngestError::ShuttingDown)
    );
    let stats = p.flush();
    assert_eq!(stats.requests, 2, "grace is not waited for");
    assert_eq!(p.kpis(Duration::from_secs(60)).series[0].requests, 2);
    assert_eq!(p.requests_recorded(), 2);
}

#[test]
fn late_phase_child_is_merged_into_the_stored_trace_not_the_kpis() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let mut spans = request_trace(1, "m", 10, 20, 30, 4);
    let decode = spans.remove(2);
    p.ingest_at(batch(spans), t0).unwrap();
    p.tick_at(t0 + Duration::from_secs(2), unix_nanos_now());
    p.ingest_at(batch(vec![decode]), t0 + Duration::from_secs(3))
        .unwrap();
    let stats = p.tick_at(t0 + Duration::from_secs(3), unix_nanos_now());
    assert_eq!(stats.late_merged, 1);
    assert_eq!(p.events().late_spans.get(), 1);
    let stored = p.trace(&TraceId([1; 16])).unwrap();
    assert_eq!(stored.late_spans, 1);
    let last = stored.requests[0]
        .critical_path
        .as_ref()
        .unwrap()
        .segments
        .last()
        .unwrap()
        .name
        .clone();
    assert_eq!(
        last, "decode",
        "critical path recomputed with the late child"
    );
    assert_eq!(
        p.kpis(Duration::from_secs(60)).series[0].requests,
        1,
        "not counted twice"
    );
}

/// An agent's next call in trace `trace` (`request_trace`'s spans with other span ids).
fn next_call(trace: u8) -> Vec<Span> {
    let mut next = request_trace(trace, "m", 10, 20, 30, 4);
    for s in &mut next {
        s.span_id.0[7] = 2;
        if let Some(parent) = &mut s.parent_span_id {
            parent.0[7] = 2;
        }
    }
    next
}

#[test]
fn a_later_request_in_a_completed_trace_is_counted_a_late_worker_span_is_not() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let secs = Duration::from_secs_f64;
    p.ingest_at(batch(request_trace(1, "m", 10, 20, 30, 4)), t0)
        .unwrap();
    assert_eq!(p.tick_at(t0 + secs(2.0), unix_nanos_now()).requests, 1);
    // An agent's next call in the same trace, after the first completed: a request of its own.
    let mut next = next_call(1);
    // And a disaggregated prefill worker's span below the first request: a part of that one.
    let mut worker = next[3].clone();
    worker.span_id.0[7] = 3;
    worker.parent_span_id = Some(next[3].span_id);
    worker
        .attributes
        .push((sc::disagg::ROLE, AttrValue::Str("prefill".into())));
    next.insert(0, worker);
    p.ingest_at(batch(next), t0 + secs(3.0)).unwrap();
    let stats = p.tick_at(t0 + secs(5.1), unix_nanos_now());
    assert_eq!(stats.requests, 1, "the next call, once");
    assert_eq!(p.kpis(Duration::from_secs(60)).series[0].requests, 2);
    let stored = p.trace(&TraceId([1; 16])).unwrap();
    assert_eq!(stored.requests.len(), 2);
    assert_eq!(stored.spans.len(), 9, "both calls and the worker's span");
}

/// Requests of `service` in the 60 s window.
fn requests_of(p: &Pipeline, service: &str) -> u64 {
    p.kpis(Duration::from_secs(60))
        .series
        .iter()
        .filter(|s| &*s.service == service)
        .map(|s| s.requests)
        .sum()
}

/// Trace 1's infertrace request (service `llm`) below a framework's generic server span of
/// `llm`, below a gateway's (service `gateway`), the two 5 ms longer at each end: (the
/// request's spans, the gateway's, the framework's).
fn behind_a_gateway() -> (Vec<Span>, Span, Span) {
    let mut engine = request_trace(1, "m", 10, 20, 30, 4);
    let server = |id: u8, parent: Option<SpanId>, service: &str| {
        let mut s = engine[3].clone();
        s.span_id.0[7] = id;
        s.parent_span_id = parent;
        s.service = Text::from(service);
        s.name = "POST /chat".into();
        s.attributes.clear();
        s.kind = SpanKind::Server;
        s.start_unix_nano -= 5 * MS;
        s.end_unix_nano += 5 * MS;
        s
    };
    let gateway = server(8, None, "gateway");
    let framework = server(9, Some(gateway.span_id), "llm");
    engine[3].parent_span_id = Some(framework.span_id);
    (engine, gateway, framework)
}

/// A gateway's server span exported after its trace completed (the Python SDK exports every
/// 5 s, past the 2 s grace) is the gateway's own request, not counted yet: it counts once, in
/// the gateway's series. The engine's framework span around its request, late the same way,
/// is the engine's request counted already: it counts nothing. Both are late spans, and teach
/// the grace period to wait for them (a review saw it stay at 2 s when they re-opened the
/// trace instead, and the gateway's requests lost once the stored trace was gone).
#[test]
fn a_late_gateway_span_counts_its_request_once() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let secs = Duration::from_secs_f64;
    let (engine, gateway, framework) = behind_a_gateway();
    p.ingest_at(batch(engine), t0).unwrap();
    assert_eq!(p.tick_at(t0 + secs(2.0), unix_nanos_now()).requests, 1);
    p.ingest_at(batch(vec![framework]), t0 + secs(3.0)).unwrap();
    let stats = p.tick_at(t0 + secs(3.1), unix_nanos_now());
    assert_eq!(stats.requests, 0, "the engine's own request");
    assert_eq!(stats.late_merged, 1);
    assert!(stats.grace_changed.is_some(), "learned from a late span");
    p.ingest_at(batch(vec![gateway.clone()]), t0 + secs(6.0))
        .unwrap();
    let stats = p.tick_at(t0 + secs(6.1), unix_nanos_now());
    assert_eq!((stats.requests, stats.late_merged), (1, 1));
    // Sent again: counted once.
    p.ingest_at(batch(vec![gateway.clone()]), t0 + secs(7.0))
        .unwrap();
    assert_eq!(p.tick_at(t0 + secs(7.1), unix_nanos_now()).requests, 0);
    assert_eq!(p.events().late_spans.get(), 3);
    // Twice within one tick, in another trace: counted once (a re-review counted it twice).
    let mut other = gateway;
    other.trace_id = TraceId([2; 16]);
    let mut engine2 = request_trace(2, "m", 10, 20, 30, 4);
    engine2[3].parent_span_id = Some(other.span_id);
    p.ingest_at(batch(engine2), t0 + secs(8.0)).unwrap();
    // The grace period learned above (up to `assembly.max_grace`, 10 s) has passed.
    assert_eq!(p.tick_at(t0 + secs(18.1), unix_nanos_now()).requests, 1);
    p.ingest_at(batch(vec![other.clone(), other]), t0 + secs(19.0))
        .unwrap();
    assert_eq!(p.tick_at(t0 + secs(19.1), unix_nanos_now()).requests, 1);
    assert_eq!((requests_of(&p, "llm"), requests_of(&p, "gateway")), (2, 2));
    assert_eq!(p.trace(&TraceId([1; 16])).unwrap().spans.len(), 6);
}

/// A framework span alone first (counted as its service's request), then in one tick the
/// gateway above it and the engine's request below it: the engine's request is the one the
/// counted framework span stood for, the gateway's is new — one request counted, the
/// gateway's (a re-review saw the gateway's dropped and the engine's counted a second time).
#[test]
fn a_request_taken_into_an_engine_span_is_matched_by_its_service() {
    // In either order within the batch (the records come out in the order of their spans).
    for gateway_first in [true, false] {
        let (p, _) = pipeline(&CollectorConfig::default());
        let t0 = Instant::now();
        let secs = Duration::from_secs_f64;
        let (mut engine, gateway, framework) = behind_a_gateway();
        // vLLM's request span, one span below the framework's.
        engine.truncate(3);
        let mut vllm = engine.remove(0);
        vllm.name = sc::span::VLLM_REQUEST.into();
        vllm.kind = SpanKind::Server;
        vllm.parent_span_id = Some(framework.span_id);
        vllm.start_unix_nano = framework.start_unix_nano + MS;
        vllm.end_unix_nano = framework.end_unix_nano - MS;
        vllm.attributes = vec![(sc::gen_ai::REQUEST_MODEL, AttrValue::Str("m".into()))];
        let engine = vec![vllm];
        p.ingest_at(batch(vec![framework]), t0).unwrap();
        assert_eq!(p.tick_at(t0 + secs(2.1), unix_nanos_now()).requests, 1);
        let rest: Vec<Span> = if gateway_first {
            std::iter::once(gateway).chain(engine).collect()
        } else {
            engine.into_iter().chain(std::iter::once(gateway)).collect()
        };
        p.ingest_at(batch(rest), t0 + secs(3.0)).unwrap();
        assert_eq!(p.tick_at(t0 + secs(5.1), unix_nanos_now()).requests, 1);
        assert_eq!(
            (requests_of(&p, "llm"), requests_of(&p, "gateway")),
            (1, 1),
            "gateway first: {gateway_first}"
        );
    }
}

/// A disaggregated worker's request span below the router's does not complete its trace, on
/// the path of traces analysed on arrival (protobuf) as on the span path: the router's span,
/// exported seconds later, completes it, and the request is counted once.
#[test]
fn a_worker_batch_alone_waits_for_the_router() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let secs = Duration::from_secs_f64;
    let mut router = request_trace(1, "m", 10, 20, 30, 4);
    router[3]
        .attributes
        .push((sc::disagg::ROLE, AttrValue::Str("router".into())));
    let mut worker = request_trace(1, "m", 10, 20, 30, 4);
    for s in &mut worker {
        s.span_id.0[7] = 2;
        if let Some(parent) = &mut s.parent_span_id {
            parent.0[7] = 2;
        }
    }
    worker[3].parent_span_id = Some(router[3].span_id);
    worker[3]
        .attributes
        .push((sc::disagg::ROLE, AttrValue::Str("decode".into())));
    p.ingest_at(proto_batch(&worker), t0).unwrap();
    assert_eq!(p.tick_at(t0 + secs(2.5), unix_nanos_now()).requests, 0);
    p.ingest_at(proto_batch(&router), t0 + secs(3.0)).unwrap();
    assert_eq!(p.tick_at(t0 + secs(5.1), unix_nanos_now()).requests, 1);
    assert_eq!(p.requests_recorded(), 1, "one record, the router's");
}

/// A part of a request exported separately, seconds after the request span (another
/// service's batch processor): the first such trace completes without it (the part is late),
/// and teaches the pipeline to wait that long; the next trace alike completes whole.
#[test]
fn the_grace_period_grows_to_the_lateness_of_late_parts() {
    let (p, registry) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let secs = Duration::from_secs_f64;
    let unix = unix_nanos_now();
    let decode_of = |trace: &TraceId| p.trace(trace).unwrap().requests[0].record.decode;
    // Trace 1: its decode span 5 s after the rest.
    let mut first = request_trace(1, "m", 10, 20, 30, 4);
    let late = first.remove(2);
    p.ingest_at(batch(first), t0).unwrap();
    assert_eq!(p.tick_at(t0 + secs(2.0), unix).requests, 1);
    p.ingest_at(batch(vec![late]), t0 + secs(5.0)).unwrap();
    let stats = p.tick_at(t0 + secs(5.0), unix + 5_000 * MS);
    assert_eq!(stats.late_merged, 1);
    assert_eq!(
        stats.grace_changed,
        Some(secs(5.5)),
        "5 s late, and a tenth"
    );
    assert_eq!(
        decode_of(&TraceId([1; 16])),
        None,
        "read without its late part"
    );
    assert!(
        encode(&registry).contains("infertrace_assembly_grace_seconds 5.5"),
        "{}",
        encode(&registry)
    );
    // Trace 2, alike: now it waits for the part.
    let t1 = t0 + secs(10.0);
    let mut second = request_trace(2, "m", 10, 20, 30, 4);
    let part = second.remove(2);
    // As protobuf: analysed on arrival, waiting in the prepared queue.
    p.ingest_at(proto_batch(&second), t1).unwrap();
    assert_eq!(p.tick_at(t1 + secs(2.0), unix + 12_000 * MS).requests, 0);
    p.ingest_at(proto_batch(&[part]), t1 + secs(5.0)).unwrap();
    assert_eq!(p.tick_at(t1 + secs(5.6), unix + 15_600 * MS).requests, 1);
    let stored = p.trace(&TraceId([2; 16])).unwrap();
    assert_eq!((stored.spans.len(), stored.late_spans), (4, 0));
    assert!(decode_of(&TraceId([2; 16])).is_some(), "read whole");
    // The parts keep coming 5 s after their requests, in time now: the wait is kept, well past
    // the ten minutes a need is remembered (trace 4, 15 minutes after trace 1's late part).
    for (k, minute) in [(3u8, 9u64), (4, 15)] {
        let at = t0 + Duration::from_secs(minute * 60);
        let u = unix + minute * 60_000 * MS;
        let mut spans = request_trace(k, "m", 10, 20, 30, 4);
        let part = spans.remove(2);
        p.ingest_at(proto_batch(&spans), at).unwrap();
        for wait in [2.0, 3.0, 4.0] {
            let tick = p.tick_at(at + secs(wait), u + (wait * 1e3) as u64 * MS);
            assert_eq!(tick.requests, 0, "trace {k} waits at {wait} s");
        }
        p.ingest_at(proto_batch(&[part]), at + secs(5.0)).unwrap();
        assert_eq!(p.tick_at(at + secs(5.6), u + 5_600 * MS).requests, 1, "{k}");
        assert!(
            decode_of(&TraceId([k; 16])).is_some(),
            "trace {k} read whole"
        );
    }
}

/// Spans that come late while memory is short (their senders refused and retrying) teach
/// nothing: a longer wait would hold more.
#[test]
fn nothing_is_learned_from_late_spans_while_memory_is_short() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let secs = Duration::from_secs_f64;
    let unix = unix_nanos_now();
    for (k, refused) in [(1u8, true), (2, false)] {
        let at = t0 + secs(10.0 * f64::from(k));
        let u = unix + u64::from(k) * 10_000 * MS;
        let mut spans = request_trace(k, "m", 10, 20, 30, 4);
        let part = spans.remove(2);
        p.ingest_at(batch(spans), at).unwrap();
        assert_eq!(p.tick_at(at + secs(2.0), u).requests, 1);
        p.ingest_at(batch(vec![part]), at + secs(5.0)).unwrap();
        if refused {
            assert!(p.limiter.try_reserve(usize::MAX).is_none(), "a refusal");
        }
        let stats = p.tick_at(at + secs(5.0), u + 5_000 * MS);
        assert_eq!(stats.late_merged, 1);
        let learned = if refused { None } else { Some(secs(5.5)) };
        assert_eq!(stats.grace_changed, learned, "trace {k}");
    }
}

/// An agent's next call that re-opens a trace whose earlier part left the recent-trace ring
/// (another trace took its one place) is not counted — which of its requests the earlier part
/// counted cannot be told — and that is counted and visible on /metrics, not silent.
#[test]
fn a_reopened_trace_without_its_earlier_part_says_what_it_did_not_count() {
    let mut config = CollectorConfig::default();
    config.api.recent_traces = 1;
    let (p, registry) = pipeline(&config);
    let t0 = Instant::now();
    let secs = Duration::from_secs_f64;
    let unix = unix_nanos_now();
    p.ingest_at(batch(request_trace(1, "m", 10, 20, 30, 4)), t0)
        .unwrap();
    assert_eq!(p.tick_at(t0 + secs(2.0), unix).requests, 1);
    // Another trace, a second later, takes the ring's one place.
    p.ingest_at(batch(request_trace(2, "m", 10, 20, 30, 4)), t0 + secs(1.0))
        .unwrap();
    assert_eq!(p.tick_at(t0 + secs(3.0), unix + 1_100 * MS).requests, 1);
    assert!(p.trace(&TraceId([1; 16])).is_none(), "no longer kept");
    let next = next_call(1);
    p.ingest_at(batch(next), t0 + secs(3.0)).unwrap();
    assert_eq!(p.tick_at(t0 + secs(5.1), unix + 3_200 * MS).requests, 0);
    assert_eq!(p.events().reopened_requests_not_counted.get(), 1);
    let text = encode(&registry);
    assert!(
        text.contains("infertrace_reopened_requests_not_counted_total 1"),
        "{text}"
    );
}

/// A re-opened trace counts only what its earlier part did not: a request span sent again (an
/// exporter's retry), a late part of the counted request, and an engine's span standing for
/// the same request as a framework's span counted before are not counted again.
#[test]
fn a_reopened_trace_counts_no_request_twice() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let secs = Duration::from_secs_f64;
    let first = request_trace(1, "m", 10, 20, 30, 4);
    p.ingest_at(batch(first.clone()), t0).unwrap();
    assert_eq!(p.tick_at(t0 + secs(2.0), unix_nanos_now()).requests, 1);
    // The same request span again, 3 s later.
    p.ingest_at(batch(vec![first[3].clone()]), t0 + secs(3.0))
        .unwrap();
    assert_eq!(p.tick_at(t0 + secs(5.1), unix_nanos_now()).requests, 0);
    // A generic server span of the service counted first; then the engine's own request span
    // beside it (another exporter, seconds later): one request.
    let mut framework = first[3].clone();
    framework.trace_id = TraceId([2; 16]);
    framework.span_id.0[7] = 9;
    framework.parent_span_id = Some(SpanId([7; 8]));
    framework.attributes.clear();
    framework.kind = SpanKind::Server;
    let mut engine: Vec<Span> = first.clone();
    for s in &mut engine {
        s.trace_id = TraceId([2; 16]);
    }
    engine[3].parent_span_id = Some(SpanId([7; 8]));
    p.ingest_at(batch(vec![framework]), t0 + secs(6.0)).unwrap();
    assert_eq!(p.tick_at(t0 + secs(8.1), unix_nanos_now()).requests, 1);
    p.ingest_at(batch(engine), t0 + secs(9.0)).unwrap();
    assert_eq!(p.tick_at(t0 + secs(11.1), unix_nanos_now()).requests, 0);
    assert_eq!(
        p.kpis(Duration::from_secs(60))
            .series
            .iter()
            .map(|s| s.requests)
            .sum::<u64>(),
        2
    );
}

#[test]
fn series_cap_counts_overflow() {
    let mut config = CollectorConfig::default();
    config.limits.max_series = 1;
    let (p, registry) = pipeline(&config);
    let t0 = Instant::now();
    p.ingest_at(batch(request_trace(1, "a", 1, 1, 1, 2)), t0)
        .unwrap();
    p.ingest_at(batch(request_trace(2, "b", 1, 1, 1, 2)), t0)
        .unwrap();
    p.ingest_at(batch(request_trace(3, "c", 1, 1, 1, 2)), t0)
        .unwrap();
    p.flush();
    assert_eq!(p.events().series_overflow.get(), 2);
    let text = encode(&registry);
    assert!(
        text.contains("infertrace_series_overflow_total 2"),
        "{text}"
    );
    assert!(text.contains(r#"model="__overflow__""#));
}

#[test]
fn findings_run_on_the_window() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    // 30 requests whose latency is 90% queue: the queue-dominated rule must speak.
    for i in 0..30u8 {
        p.ingest_at(batch(request_trace(i + 1, "m", 900, 50, 50, 5)), t0)
            .unwrap();
    }
    p.flush();
    let findings = p.findings(Duration::from_secs(60));
    assert!(
        findings.iter().any(|f| f.rule_id.contains("queue")),
        "{findings:#?}"
    );
}

/// A store in a fresh temporary directory, attached to a fresh pipeline.
fn pipeline_with_store(dir: &std::path::Path) -> (Pipeline, Store) {
    let config = CollectorConfig::default();
    let (p, _) = pipeline(&config);
    let store = Store::open(dir, config.store.clone()).unwrap();
    let writer = store.start_writer(p.events().clone()).unwrap();
    let feed = store.feed(writer.clone(), &config.kpi_config());
    let before = unix_nanos_now();
    assert_eq!(
        p.attach_store(&store, feed).unwrap(),
        Restored::default(),
        "an empty store restores nothing"
    );
    // The store keeps when its first collector began.
    writer.flush().unwrap();
    let since = store
        .data_bounds()
        .unwrap()
        .since
        .expect("kept on attaching");
    assert!((before..=unix_nanos_now()).contains(&since));
    (p, store)
}

#[test]
fn an_idle_tick_hands_the_ended_minute_to_the_store() {
    use crate::store::{HistoryFilter, MINUTE_NANOS, minute_of};
    let dir = tempfile::tempdir().unwrap();
    let (p, store) = pipeline_with_store(dir.path());
    let t0 = Instant::now();
    // Well inside a minute, so that the records and the hand-over stay in it.
    let minute = minute_of(unix_nanos_now()) - 2 * MINUTE_NANOS;
    let unix = minute + 10_000 * MS;
    for (k, d) in [(1, 900), (2, 400), (3, 100)] {
        p.ingest_at(batch(request_trace(k, "m", 20, 80, d, 11)), t0)
            .unwrap();
    }
    assert_eq!(p.tick_at(t0 + Duration::from_secs(2), unix).requests, 3);
    // The feed's minute is held with the aggregates.
    let (kpis, critical, prom) = p.aggregates_memory_parts();
    assert!(p.aggregates_memory_bytes() > kpis + critical + prom);
    let count = |store: &Store| {
        store
            .history(
                "requests",
                &HistoryFilter::default(),
                minute,
                minute + 2 * MINUTE_NANOS,
                Duration::from_secs(60),
            )
            .unwrap()[0]
            .value
    };
    p.store_writer().unwrap().flush().unwrap();
    assert_eq!(
        count(&store),
        None,
        "nothing handed over within the hand-over step"
    );
    // No traffic, the next minute: the ended minute is handed over all the same.
    let stats = p.tick_at(t0 + Duration::from_secs(3), minute + MINUTE_NANOS + 1);
    assert_eq!(stats.requests, 0);
    p.store_writer().unwrap().flush().unwrap();
    assert_eq!(count(&store), Some(3.0));
    let slow = store
        .slow_requests(minute, minute + MINUTE_NANOS, 10)
        .unwrap();
    let e2e: Vec<f64> = slow.iter().map(|r| r.e2e).collect();
    assert!(
        e2e.len() == 3 && close(e2e[0], 1.0) && close(e2e[2], 0.2),
        "{e2e:?}"
    );
    assert!(
        !slow[0].critical_path.is_null(),
        "kept with its critical path"
    );
}

#[test]
fn the_shutdown_hand_over_reaches_the_store() {
    use crate::store::{HistoryFilter, minute_of};
    let dir = tempfile::tempdir().unwrap();
    let (p, store) = pipeline_with_store(dir.path());
    p.ingest_at(
        batch(request_trace(1, "m", 20, 80, 900, 11)),
        Instant::now(),
    )
    .unwrap();
    assert_eq!(p.flush().requests, 1);
    let now = unix_nanos_now();
    let before = p.critical_path(Duration::from_secs(60));
    p.hand_over_store(now).unwrap().flush().unwrap();
    let points = store
        .history(
            "ttft.p50",
            &HistoryFilter::default(),
            minute_of(now),
            now + 1,
            Duration::from_secs(60),
        )
        .unwrap();
    assert!(close(points[0].value.unwrap(), 0.100), "{points:?}");
    // A restarted pipeline on the same store starts with that request in its windows.
    let config = CollectorConfig::default();
    let (q, _) = pipeline(&config);
    let writer = store.start_writer(q.events().clone());
    assert!(writer.is_err(), "one writer per store handle");
    assert!(
        matches!(
            Store::open(dir.path(), config.store.clone()),
            Err(crate::store::StoreError::InUse { .. })
        ),
        "one collector per store"
    );
    drop((p, store));
    let reopened = Store::open(dir.path(), config.store.clone()).unwrap();
    let feed = reopened.feed(
        reopened.start_writer(q.events().clone()).unwrap(),
        &config.kpi_config(),
    );
    let bounds = reopened.data_bounds().unwrap();
    let since = bounds.since.expect("kept by the first run");
    let until = bounds.until.expect("committed by the first run");
    let attach_from = unix_nanos_now();
    assert_eq!(
        q.attach_store(&reopened, feed).unwrap(),
        Restored {
            kpi_minutes: 1,
            critical_path_slots: 1
        }
    );
    let attach_to = unix_nanos_now();
    let elapsed = || (unix_nanos_now() - since) as f64 / 1e9;
    let before_snapshot = elapsed();
    let snap = q.kpis(Duration::from_secs(3600));
    let after_snapshot = elapsed();
    assert_eq!(snap.series[0].requests, 1);
    // Its rate divides by the time since the first run began (its request's minute counts
    // whole, from before it), less the time between the first run's last commit and this
    // one's start, when no collector ran.
    let down = |at: u64| at.saturating_sub(until) as f64 / 1e9;
    let seen = (
        before_snapshot - down(attach_to),
        after_snapshot - down(attach_from),
    );
    let rps = snap.series[0].throughput.requests_per_second;
    assert!(
        (1.0 / seen.1..=1.0 / seen.0).contains(&rps),
        "{rps} requests/s, {seen:?} s seen since the store's data began"
    );
    assert_eq!(q.kpis(Duration::from_secs(60)).series[0].requests, 1);
    // And its critical path: the same shares as before the restart.
    let restored = q.critical_path(Duration::from_secs(60));
    assert_eq!(restored.requests, 1);
    assert_eq!(
        restored, before,
        "the critical path of the minute before the restart"
    );
}

/// Three collectors in turn on one store, each recording one request into the same
/// critical-path slot and shutting down: each restart finds every earlier request once (a
/// restored slot handed back with new records replaces its stored version).
#[test]
fn restarts_within_one_slot_count_each_request_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = CollectorConfig::default();
    let hour = Duration::from_secs(3600);
    // The start of the current 10-second slot: the three records stay in it.
    let slot = 10_000 * MS;
    let unix = unix_nanos_now() / slot * slot;
    for round in 0..4u8 {
        let (p, _) = pipeline(&config);
        let store = Store::open(dir.path(), config.store.clone()).unwrap();
        let writer = store.start_writer(p.events().clone()).unwrap();
        let restored = p
            .attach_store(&store, store.feed(writer, &config.kpi_config()))
            .unwrap();
        assert_eq!(restored.critical_path_slots, usize::from(round > 0));
        assert_eq!(
            p.critical_path(hour).requests,
            u64::from(round),
            "round {round}"
        );
        if round == 3 {
            break;
        }
        let t0 = Instant::now();
        p.ingest_at(batch(request_trace(round + 1, "m", 20, 80, 900, 11)), t0)
            .unwrap();
        let at = unix + u64::from(round) * MS;
        assert_eq!(p.tick_at(t0 + Duration::from_secs(2), at).requests, 1);
        p.hand_over_store(at).unwrap().flush().unwrap();
    }
}

/// `spans` as the receiver hands them on from a protobuf body: encoded as one OTLP request of
/// resource `llm`, decoded by the lean decoder, with the body (as kept for forwarding).
fn proto_batch(spans: &[Span]) -> IngestBatch {
    proto_batch_padded(spans, 0)
}

/// [`proto_batch`] with an attribute the decoder drops (`app.padding`, `pad` bytes) on every
/// span when `pad > 0`: a body fatter than its decoded spans.
fn proto_batch_padded(spans: &[Span], pad: usize) -> IngestBatch {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, ArrayValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};
    use prost::Message;
    let string = |t: &str| any_value::Value::StringValue(t.to_owned());
    let kv = |key: &str, value: any_value::Value| KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    };
    let span = |s: &Span| opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: s.trace_id.0.to_vec(),
        span_id: s.span_id.0.to_vec(),
        parent_span_id: s.parent_span_id.map(|p| p.0.to_vec()).unwrap_or_default(),
        name: s.name.to_string(),
        kind: s.kind as i32,
        start_time_unix_nano: s.start_unix_nano,
        end_time_unix_nano: s.end_unix_nano,
        attributes: s
            .attributes
            .iter()
            .map(|(k, v)| {
                kv(
                    k,
                    match v {
                        AttrValue::Str(t) => string(t),
                        AttrValue::Int(i) => any_value::Value::IntValue(*i),
                        AttrValue::Double(d) => any_value::Value::DoubleValue(*d),
                        AttrValue::Bool(b) => any_value::Value::BoolValue(*b),
                        AttrValue::StrArray(a) => any_value::Value::ArrayValue(ArrayValue {
                            values: a
                                .iter()
                                .map(|t| AnyValue {
                                    value: Some(string(t)),
                                })
                                .collect(),
                        }),
                    },
                )
            })
            .chain((pad > 0).then(|| kv("app.padding", string(&"x".repeat(pad)))))
            .collect(),
        status: Some(Status {
            code: match s.status {
                StatusCode::Unset => 0,
                StatusCode::Ok => 1,
                StatusCode::Error => 2,
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv(sc::resource::SERVICE_NAME, string("llm"))],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: spans.iter().map(span).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let body = bytes::Bytes::from(request.encode_to_vec());
    let decoded = crate::otlp_decode::decode_protobuf(&body).unwrap();
    assert_eq!(decoded.spans, spans, "the encoding round-trips");
    IngestBatch {
        spans: decoded.spans,
        raw_protobuf: Some(body),
        span_ranges: decoded.span_ranges,
        ..Default::default()
    }
}

/// A piece of a text: literal text, or a decimal number compared with a relative tolerance.
#[derive(Debug)]
enum Piece {
    Text(String),
    Number(f64),
}

impl PartialEq for Piece {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Text(a), Self::Text(b)) => a == b,
            (Self::Number(a), Self::Number(b)) => {
                (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) || a == b
            }
            _ => false,
        }
    }
}

/// `text` in pieces whose decimal numbers compare equal within 1e-9 relative: float sums that
/// differ in their last bits (added in another order) are the same number.
fn numbers(text: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut literal = String::new();
    let mut token = String::new();
    let flush = |token: &mut String, literal: &mut String, out: &mut Vec<Piece>| {
        match token.parse::<f64>() {
            Ok(v) if token.contains('.') => {
                out.push(Piece::Text(std::mem::take(literal)));
                out.push(Piece::Number(v));
            }
            _ => literal.push_str(token),
        }
        token.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() || c == '.' || c == 'e' && !token.is_empty() || c == '-' {
            token.push(c);
        } else {
            flush(&mut token, &mut literal, &mut out);
            literal.push(c);
        }
    }
    flush(&mut token, &mut literal, &mut out);
    out.push(Piece::Text(literal));
    out
}

/// What a pipeline reports over a minute, for comparing two pipelines fed the same traffic.
#[derive(Debug, PartialEq)]
struct Outputs {
    /// `/api/kpis`, without the rates (they divide by each pipeline's own uptime).
    kpis: Vec<Piece>,
    critical_path: Vec<Piece>,
    /// The Prometheus exposition, lines sorted (series are listed in hash order).
    metrics: Vec<Piece>,
    /// The recent traces, sorted (traces completing at the same tick may come in another order:
    /// one regrouped from interleaved spans completes from its first span's position).
    stored: Vec<String>,
}

/// `p`'s [`Outputs`], with `registry` its metrics. Numbers compare within 1e-9 relative: float
/// sums may differ in their last bits (added in each pipeline's own hash order).
fn outputs(p: &Pipeline, registry: &prometheus_client::registry::Registry) -> Outputs {
    let window = Duration::from_secs(60);
    let mut kpis = serde_json::to_value(p.kpis(window)).unwrap();
    for s in kpis["series"].as_array_mut().unwrap() {
        let s = s.as_object_mut().unwrap();
        s.remove("throughput");
        s["goodput"]
            .as_object_mut()
            .unwrap()
            .remove("requests_per_second");
    }
    let mut lines: Vec<&str> = Vec::new();
    let text = encode(registry);
    // What the pipeline holds depends on how it holds it (a body, a compact copy, spans), not
    // on the results compared here.
    lines.extend(
        text.lines()
            .filter(|l| !l.starts_with("infertrace_memory_reserved_bytes{")),
    );
    lines.sort();
    let mut stored = Vec::new();
    p.visit_recent_traces(&mut |t| stored.push(format!("{t:?}")));
    stored.sort();
    Outputs {
        kpis: numbers(&kpis.to_string()),
        critical_path: numbers(&format!("{:?}", p.critical_path(window))),
        metrics: numbers(&lines.join("\n")),
        stored,
    }
}

/// A span of trace `trace` outside any request (a database call, say).
fn lone_span(trace: u8, n: u8, parent: Option<SpanId>) -> Span {
    let mut s = request_trace(trace, "m", 1, 1, 1, 2).remove(0);
    s.span_id = SpanId([trace, n, 9, 9, 9, 9, 9, 9]);
    s.parent_span_id = parent;
    s.name = "db query".into();
    s.attributes.clear();
    s
}

#[test]
fn traces_analysed_on_arrival_give_the_same_results_as_at_completion() {
    same_results_on_arrival_as_at_completion(0, SourceEncoding::Otlp);
}

#[test]
fn traces_held_as_compact_copies_give_the_same_results_as_at_completion() {
    same_results_on_arrival_as_at_completion(2000, SourceEncoding::Compact);
}

/// Batches of spans padded with `pad` bytes of a dropped attribute each, analysed on arrival,
/// their spans held as `encoding`, give the same results as the same spans analysed at
/// completion.
fn same_results_on_arrival_as_at_completion(pad: usize, encoding: SourceEncoding) {
    let proto_batch = |spans: &[Span]| proto_batch_padded(spans, pad);
    let config = CollectorConfig::default();
    let (eager, eager_registry) = pipeline(&config);
    let (plain, plain_registry) = pipeline(&config);
    let t0 = Instant::now();
    let unix = unix_nanos_now();
    let sec = |s: f64| t0 + Duration::from_secs_f64(s);

    // Batch 1: six whole traces; trace 7 without its request span yet; trace 8 interleaved with
    // trace 10; trace 9 without any request span.
    let mut first = Vec::new();
    for t in 1..=6u8 {
        let model = if t % 2 == 0 { "a" } else { "b" };
        let (q, d, out) = (5 * u64::from(t), 200 + 10 * u64::from(t), 8 + i64::from(t));
        first.extend(request_trace(t, model, q, 30, d, out));
    }
    let t7 = request_trace(7, "a", 3, 40, 300, 20);
    first.extend_from_slice(&t7[..2]);
    let t8 = request_trace(8, "b", 10, 20, 30, 5);
    first.push(t8[0].clone());
    first.extend(request_trace(10, "a", 7, 35, 250, 12));
    first.extend_from_slice(&t8[1..]);
    first.push(lone_span(9, 1, None));

    let mut grouped = proto_batch(&first);
    let runs = prepare_runs(&mut grouped, &config.critical_path_options()).0;
    assert!(
        runs.iter()
            .all(|r| r.prepared.source.encoding() == encoding)
    );
    let prepared: Vec<TraceId> = runs
        .iter()
        .map(|r| grouped.spans[r.start].trace_id)
        .collect();
    // Trace 8's spans, around trace 10's, are regrouped; 7 and 9 have no request span here.
    let expected: Vec<TraceId> = [1, 2, 3, 4, 5, 6, 8, 10].map(|t| TraceId([t; 16])).to_vec();
    assert_eq!(prepared, expected, "traces with a request span");

    // Batch 2, a second later: the rest of trace 7, and one more child of prepared trace 1.
    let t1_root = request_trace(1, "b", 5, 30, 210, 9)[3].span_id;
    let mut second = t7[2..].to_vec();
    second.push(lone_span(1, 7, Some(t1_root)));

    eager.ingest_at(proto_batch(&first), sec(0.0)).unwrap();
    plain.ingest_at(batch(first), sec(0.0)).unwrap();
    eager.ingest_at(proto_batch(&second), sec(1.0)).unwrap();
    plain.ingest_at(batch(second), sec(1.0)).unwrap();

    for at in [1.5, 2.0, 3.0, 31.5] {
        let (e, p) = (eager.tick_at(sec(at), unix), plain.tick_at(sec(at), unix));
        assert_eq!(e, p, "tick at {at} s");
    }
    assert_eq!(eager.requests_recorded(), 9);
    assert_eq!(eager.traces_in_flight(), 0);

    assert_eq!(
        outputs(&eager, &eager_registry),
        outputs(&plain, &plain_registry)
    );
    let kept = outputs(&eager, &eager_registry).stored;
    assert_eq!(
        kept.len(),
        10,
        "every trace is in the ring, prepared ones decoded again"
    );
    let one = eager.trace(&TraceId([1; 16])).unwrap();
    assert_eq!(one.spans.len(), 5, "trace 1 with its late child");
}

#[test]
fn a_prepared_batch_reserves_its_body_and_the_analyses_it_holds() {
    prepared_batch_reserves_what_it_holds(0);
}

#[test]
fn a_prepared_batch_of_a_fat_body_reserves_its_compact_spans_and_analyses() {
    prepared_batch_reserves_what_it_holds(2000);
}

/// A batch of five traces padded with `pad` bytes of a dropped attribute per span reserves the
/// source of its spans (the body when lean, a compact copy when fat) and its analyses.
fn prepared_batch_reserves_what_it_holds(pad: usize) {
    let proto_batch = |spans: &[Span]| proto_batch_padded(spans, pad);
    let spans: Vec<Span> = (1..=5u8)
        .flat_map(|t| request_trace(t, "m", 5, 30, 200, 9))
        .collect();
    let span_estimate: usize = spans.iter().map(span_footprint).sum();
    let mut b = proto_batch(&spans);
    let body = b.raw_protobuf.as_ref().map_or(0, |b| b.len());
    let (runs, source) = prepare_runs(&mut b, &CollectorConfig::default().critical_path_options());
    let analyses: usize = runs.iter().map(|r| r.prepared.footprint()).sum();
    let held = source + analyses + b.text_bytes;
    if hold_the_body(body, spans.len()) {
        assert_eq!(pad, 0, "a lean body ({body} B) is held");
        assert_eq!(source, body);
        assert!(
            runs.iter()
                .all(|r| r.prepared.source.encoding() == SourceEncoding::Otlp)
        );
    } else {
        assert!(pad > 0, "a fat body ({body} B) is not held");
        assert!(
            source < body / 4,
            "the compact spans ({source} B) instead of the body ({body} B)"
        );
        assert!(
            runs.iter()
                .all(|r| r.prepared.source.encoding() == SourceEncoding::Compact)
        );
    }
    // Either way the spans come back as decoded.
    for run in &runs {
        assert_eq!(
            run.prepared.source.spans(),
            b.spans[run.start..run.start + run.len]
        );
    }
    assert!(analyses > 5 * 500, "records, paths, ranges: {analyses}");

    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    p.ingest_at(proto_batch(&spans), t0).unwrap();
    assert_eq!(p.traces_in_flight(), 5);
    assert_eq!(
        p.data_memory_bytes(),
        held,
        "not the estimate of the spans: {span_estimate}"
    );
    p.tick_at(t0 + Duration::from_secs(2), unix_nanos_now());
    assert_eq!(
        p.data_memory_bytes(),
        0,
        "released when the traces complete"
    );

    // A limit between the spans' estimate and what the prepared batch would hold: the batch
    // is held as spans instead. Below the spans' estimate it is refused.
    assert!(held > span_estimate, "{held} vs {span_estimate}");
    let limited = |limit| {
        Pipeline::new(
            &CollectorConfig::default(),
            InternalEvents::default(),
            PromMetrics::default(),
            MemoryLimiter::new(limit),
            None,
        )
    };
    let p = limited(held - 1);
    p.ingest_at(proto_batch(&spans), t0).unwrap();
    assert_eq!(p.traces_in_flight(), 5);
    assert_eq!(p.data_memory_bytes(), span_estimate + b.text_bytes);
    let p = limited(span_estimate - 1);
    let refused = p.ingest_at(proto_batch(&spans), t0);
    assert!(matches!(refused, Err(IngestError::Overloaded { .. })));
    assert_eq!(p.traces_in_flight(), 0);
    assert_eq!(p.data_memory_bytes(), 0);
}

#[test]
fn interleaved_and_returning_traces_are_reserved_for_what_they_hold() {
    let opts = CollectorConfig::default().critical_path_options();
    // Four traces, their spans alternating, as an SDK batch processor sends them.
    let traces: Vec<Vec<Span>> = (1..=4u8)
        .map(|t| request_trace(t, "m", 5, 30, 200 + u64::from(t), 9))
        .collect();
    let spans: Vec<Span> = (0..4)
        .flat_map(|k| traces.iter().map(move |t| t[k].clone()))
        .collect();
    let mut b = proto_batch(&spans);
    let (runs, source) = prepare_runs(&mut b, &opts);
    assert_eq!(runs.len(), 4, "regrouped and prepared");
    let analyses: usize = runs.iter().map(|r| r.prepared.footprint()).sum();
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    p.ingest_at(proto_batch(&spans), t0).unwrap();
    assert_eq!(p.data_memory_bytes(), source + analyses + b.text_bytes);

    // One more span of trace 1 a second later: the trace takes its spans back, reserved with
    // the new batch.
    let before = p.data_memory_bytes();
    let child = lone_span(1, 7, Some(traces[0][3].span_id));
    let extra = span_footprint(&child);
    let trace_1: usize = traces[0].iter().map(span_footprint).sum();
    p.ingest_at(batch(vec![child]), t0 + Duration::from_secs(1))
        .unwrap();
    assert_eq!(p.data_memory_bytes(), before + extra + trace_1);

    // A whole run of a prepared trace (another request span of trace 2, in a protobuf batch
    // of its own): not prepared again, pushed as spans, and the trace's spans are reserved.
    let before = p.data_memory_bytes();
    let mut again = traces[1][3].clone();
    again.span_id = SpanId([2, 9, 0, 0, 0, 0, 0, 1]);
    let extra = span_footprint(&again);
    let trace_2: usize = traces[1].iter().map(span_footprint).sum();
    p.ingest_at(proto_batch(&[again]), t0 + Duration::from_secs(1))
        .unwrap();
    assert_eq!(p.data_memory_bytes(), before + extra + trace_2);
    p.tick_at(t0 + Duration::from_secs(3), unix_nanos_now());
    assert_eq!(p.traces_in_flight(), 0);
    assert_eq!(p.data_memory_bytes(), 0);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 48,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Whatever the batching — whole traces, interleaved traces, a trace's root or a phase in a
    /// later batch, extra children, traces without a request span — and whether the spans are
    /// held as ranges of a lean body or as a compact copy of a fat one, analysing on arrival
    /// gives what analysing every trace at completion gives.
    #[test]
    fn on_arrival_equals_at_completion_for_any_batching(
        shapes in proptest::collection::vec(
            (0u64..50, 1u64..100, 1u64..500, 1i64..40, 0u8..5, proptest::bool::ANY),
            1..24,
        ),
        interleave in proptest::bool::ANY,
        pad in proptest::sample::select(vec![0usize, 2000]),
    ) {
        let config = CollectorConfig::default();
        let (eager, eager_registry) = pipeline(&config);
        let (plain, plain_registry) = pipeline(&config);
        let mut batches: [Vec<Vec<Span>>; 3] = Default::default();
        for (t, &(q, p, d, out, split, extra)) in shapes.iter().enumerate() {
            let id = t as u8 + 1;
            let model = ["a", "b", "c"][t % 3];
            let mut spans = request_trace(id, model, q, p, d, out);
            let root = spans[3].span_id;
            if extra {
                spans.push(lone_span(id, 7, Some(root)));
            }
            match split {
                // The root, or the decode phase, a batch later; or no request span at all.
                1 => batches[1].push(vec![spans.remove(3)]),
                2 => batches[2].push(vec![spans.remove(2)]),
                3 => {
                    spans.remove(3);
                }
                _ => {}
            }
            batches[0].push(spans);
        }
        let t0 = Instant::now();
        let unix = unix_nanos_now();
        for (k, traces) in batches.iter().enumerate() {
            let spans: Vec<Span> = if interleave && k == 0 {
                let longest = traces.iter().map(Vec::len).max().unwrap_or(0);
                (0..longest)
                    .flat_map(|i| traces.iter().filter_map(move |t| t.get(i).cloned()))
                    .collect()
            } else {
                traces.iter().flatten().cloned().collect()
            };
            if spans.is_empty() {
                continue;
            }
            let at = t0 + Duration::from_millis(500 * k as u64);
            eager.ingest_at(proto_batch_padded(&spans, pad), at).unwrap();
            plain.ingest_at(batch(spans), at).unwrap();
        }
        for at in [1.0, 2.0, 2.5, 3.0, 31.5, 32.0] {
            let at = t0 + Duration::from_secs_f64(at);
            let (e, p) = (eager.tick_at(at, unix), plain.tick_at(at, unix));
            proptest::prop_assert_eq!(e.requests, p.requests);
        }
        proptest::prop_assert_eq!(eager.traces_in_flight(), 0);
        proptest::prop_assert_eq!(eager.requests_recorded(), plain.requests_recorded());

        proptest::prop_assert_eq!(
            outputs(&eager, &eager_registry),
            outputs(&plain, &plain_registry)
        );
    }
}

#[test]
fn a_body_mostly_turned_down_gives_its_taken_traces_a_compact_copy() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let first: Vec<Span> = (1..=9u8)
        .flat_map(|t| request_trace(t, "m", 5, 30, 200, 9))
        .collect();
    p.ingest_at(proto_batch(&first), t0).unwrap();
    // The same nine traces again (in flight: their spans are pushed to them) and a new one,
    // the only trace the assembler takes as prepared: the body is not held for its four spans.
    let mut second = first.clone();
    second.extend(request_trace(10, "m", 5, 30, 200, 9));
    let body = proto_batch(&second).raw_protobuf.map_or(0, |b| b.len());
    assert!(!hold_the_body(body, 4) && hold_the_body(body, second.len()));
    p.ingest_at(proto_batch(&second), t0).unwrap();
    assert_eq!(p.traces_in_flight(), 10);
    p.tick_at(t0 + Duration::from_secs(3), unix_nanos_now());
    assert_eq!(p.traces_in_flight(), 0);
    assert_eq!(p.data_memory_bytes(), 0, "everything released");
    let ten = p.trace(&TraceId([10; 16])).unwrap();
    assert_eq!(
        ten.spans,
        request_trace(10, "m", 5, 30, 200, 9),
        "decoded again from its compact copy"
    );
    assert_eq!(ten.requests.len(), 1);

    // The switch itself: runs holding body ranges get their own compact copy instead.
    let mut b = proto_batch(&second);
    let (mut runs, _) = prepare_runs(&mut b, &CollectorConfig::default().critical_path_options());
    assert!(holds_a_body(&runs));
    let compact = compact_copy(&b.spans, &mut runs).unwrap();
    assert!(
        compact < body / 2,
        "{compact} B against the body's {body} B"
    );
    for run in &runs {
        let source = &run.prepared.source;
        assert_eq!(source.encoding(), SourceEncoding::Compact);
        assert_eq!(
            run.prepared.span_count(),
            run.len,
            "one range per span, of the copy only"
        );
        assert_eq!(source.spans(), b.spans[run.start..run.start + run.len]);
    }
}

#[test]
fn idle_ticks_expire_series_and_give_their_memory_back() {
    let p = Pipeline::new(
        &CollectorConfig::default(),
        InternalEvents::default(),
        PromMetrics::default(),
        MemoryLimiter::new(1 << 30),
        None,
    );
    let empty = p.aggregates_memory_parts();
    let (t0, unix0) = (Instant::now(), unix_nanos_now());
    for i in 0..20u8 {
        p.ingest_at(
            batch(request_trace(i + 1, &format!("model-{i}"), 1, 1, 1, 2)),
            t0,
        )
        .unwrap();
    }
    p.tick_at(t0 + Duration::from_secs(3), unix0);
    assert_eq!(p.requests_recorded(), 20);
    let (kpis, _, prom) = p.aggregates_memory_parts();
    assert!(kpis > empty.0 && prom > empty.2, "{kpis} B, {prom} B");
    // No traffic for half an hour: the series stay (the 1h window still holds them).
    p.tick_at(t0 + Duration::from_secs(5), unix0 + 1_800 * 1_000 * MS);
    assert_eq!(p.aggregates_memory_parts().2, prom, "label sets kept");
    // No traffic past the longest window: an idle tick expires them, in the KPI windows and the
    // exporter alike, and the next measurement gives their memory back.
    p.tick_at(t0 + Duration::from_secs(7), unix0 + 3_700 * 1_000 * MS);
    let (kpis_after, critical_after, prom_after) = p.aggregates_memory_parts();
    // What stays: the critical-path counters (model-less, capped) and the tables' capacity.
    assert!(
        kpis_after < kpis / 4 && prom_after < prom / 4,
        "KPI windows {kpis_after} B left of {kpis} B, label sets {prom_after} B of {prom} B"
    );
    assert_eq!(
        p.aggregates_memory_bytes(),
        kpis_after + critical_after + prom_after
    );
}

/// A gateway's `POST /chat` and vLLM's `llm_request` below it (10, 20 and 30 ms of queue,
/// prefill and decode as attributes), in trace `trace`.
fn gateway_over_vllm(trace: TraceId) -> (Span, Span) {
    let (engine, mut gateway, _) = behind_a_gateway();
    let mut vllm = engine[3].clone();
    (vllm.trace_id, gateway.trace_id) = (trace, trace);
    vllm.name = sc::span::VLLM_REQUEST.into();
    vllm.service = Text::from("vllm");
    vllm.parent_span_id = Some(gateway.span_id);
    vllm.attributes = vec![
        (sc::gen_ai::REQUEST_MODEL, AttrValue::Str("m".into())),
        (sc::latency::TIME_IN_QUEUE, AttrValue::Double(0.01)),
        (sc::latency::TIME_IN_MODEL_PREFILL, AttrValue::Double(0.02)),
        (sc::latency::TIME_IN_MODEL_DECODE, AttrValue::Double(0.03)),
    ];
    (gateway, vllm)
}

/// A gateway's `POST /chat` over vLLM's `llm_request` (its phases as attributes) is one path
/// in the critical-path windows: the trace counted once, the engine's span read along its
/// phases (a review saw 120 paths for 60 traces, every share halved, and `llm_request` named
/// a hotspot as "time outside the engine"). Both requests still count in their series.
#[test]
fn a_gateway_over_vllm_is_one_critical_path() {
    let (p, _) = pipeline(&CollectorConfig::default());
    let t0 = Instant::now();
    let (gateway, vllm) = gateway_over_vllm(TraceId([1; 16]));
    p.ingest_at(batch(vec![gateway, vllm]), t0).unwrap();
    let stats = p.tick_at(t0 + Duration::from_secs(3), unix_nanos_now());
    assert_eq!(stats.requests, 2, "the gateway's request and the engine's");
    assert_eq!(
        (requests_of(&p, "gateway"), requests_of(&p, "vllm")),
        (1, 1)
    );
    let cp = p.critical_path(Duration::from_secs(60));
    assert_eq!(cp.requests, 1, "{cp:?}");
    let spans: Vec<(&str, &str)> = cp.entries.iter().map(|e| (&*e.service, &*e.span)).collect();
    for phase in ["queue", "prefill", "decode"] {
        assert!(spans.contains(&("vllm", phase)), "{spans:?}");
    }
    assert!(
        !spans.iter().any(|(_, s)| *s == sc::span::VLLM_REQUEST),
        "{spans:?}"
    );
    assert!(spans.contains(&("gateway", "POST /chat")), "{spans:?}");

    // The gateway's span exported after the engine's request was counted (its exporter sends
    // every 5 s): the trace is in the windows already, by the engine's path (a review saw the
    // double count come back at 5–10 s of delay).
    let (gateway, vllm) = gateway_over_vllm(TraceId([7; 16]));
    let at = |s: f64| t0 + Duration::from_secs_f64(s);
    p.ingest_at(batch(vec![vllm]), at(4.0)).unwrap();
    assert_eq!(p.tick_at(at(7.0), unix_nanos_now()).requests, 1);
    p.ingest_at(batch(vec![gateway]), at(10.0)).unwrap();
    assert_eq!(p.tick_at(at(10.1), unix_nanos_now()).requests, 1);
    assert_eq!(
        (requests_of(&p, "gateway"), requests_of(&p, "vllm")),
        (2, 2)
    );
    let cp = p.critical_path(Duration::from_secs(60));
    assert_eq!(cp.requests, 2, "one path per trace: {cp:?}");
    assert!(
        !cp.entries
            .iter()
            .any(|e| &*e.span == sc::span::VLLM_REQUEST),
        "{cp:?}"
    );
}
