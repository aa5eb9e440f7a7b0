//! Each dialect against spans built by hand with known timings.

use infertrace_analysis::text::Text;

use infertrace_analysis::dialect::{detect, extract_requests};
use infertrace_analysis::record::{Dialect, Outcome, PhaseOrigin, RequestRecord};
use infertrace_analysis::trace::{
    AttrValue, Span, SpanId, SpanKind, SpanLink, StatusCode, TraceId, known_key,
};
use infertrace_semconv as sc;

const T0: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;

fn sid(n: u8) -> SpanId {
    SpanId([n; 8])
}

fn attr(key: &str, v: AttrValue) -> (&'static str, AttrValue) {
    (known_key(key.as_bytes()).expect("a kept key"), v)
}
fn f(key: &str, v: f64) -> (&'static str, AttrValue) {
    attr(key, AttrValue::Double(v))
}
fn i(key: &str, v: i64) -> (&'static str, AttrValue) {
    attr(key, AttrValue::Int(v))
}
fn s(key: &str, v: &str) -> (&'static str, AttrValue) {
    attr(key, AttrValue::Str(v.into()))
}

/// A span of trace 1, service `svc`, from `start_ms` to `end_ms` after T0.
fn span(
    name: &str,
    kind: SpanKind,
    id: u8,
    parent: Option<u8>,
    start_ms: u64,
    end_ms: u64,
) -> Span {
    Span {
        trace_id: TraceId([1; 16]),
        span_id: sid(id),
        parent_span_id: parent.map(sid),
        name: name.into(),
        service: Text::from("svc"),
        kind,
        start_unix_nano: T0 + start_ms * MS,
        end_unix_nano: T0 + end_ms * MS,
        status: StatusCode::Unset,
        attributes: Vec::new(),
        links: Vec::new(),
    }
}

fn with(mut sp: Span, attrs: Vec<(&'static str, AttrValue)>) -> Span {
    sp.attributes.extend(attrs);
    sp
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

fn one(spans: &[Span]) -> RequestRecord {
    let mut recs = extract_requests(spans);
    assert_eq!(recs.len(), 1, "{recs:#?}");
    recs.remove(0)
}

fn infertrace_trace() -> Vec<Span> {
    let request = with(
        span("chat llama-3.1-8b", SpanKind::Server, 1, None, 0, 1300),
        vec![
            s(sc::gen_ai::OPERATION_NAME, "chat"),
            s(sc::gen_ai::REQUEST_MODEL, "llama-3.1-8b"),
            i(sc::gen_ai::USAGE_INPUT_TOKENS, 100),
            i(sc::gen_ai::USAGE_OUTPUT_TOKENS, 11),
            s(sc::infer::OUTCOME, "ok"),
            s(sc::infer::PHASE_SOURCE, "engine"),
            i(sc::infer::STREAM_CHUNKS, 11),
            i(sc::infer::QUEUE_DEPTH, 3),
            f(sc::infer::TIME_TO_FIRST_CHUNK, 0.26),
            f(sc::infer::INTER_TOKEN_LATENCY_P50, 0.09),
            f(sc::infer::INTER_TOKEN_LATENCY_P99, 0.2),
            f(sc::infer::INTER_TOKEN_LATENCY_MAX, 0.3),
            // Deliberately different from the children: child timings win.
            f(sc::latency::TIME_IN_QUEUE, 9.0),
            f(sc::latency::TIME_TO_FIRST_TOKEN, 9.0),
        ],
    );
    let queue = with(
        span("queue", SpanKind::Internal, 2, Some(1), 0, 50),
        vec![s(sc::infer::PHASE, "queue")],
    );
    let prefill = with(
        span("prefill", SpanKind::Internal, 3, Some(1), 50, 250),
        vec![
            s(sc::infer::PHASE, "prefill"),
            f(sc::gpu::UTILIZATION_MEAN, 0.9),
            f(sc::gpu::ENERGY, 100.0),
            f(sc::gpu::ENERGY_ATTRIBUTED, 20.0),
            f(sc::gpu::MEMORY_USED_MAX, 1e9),
        ],
    );
    let decode = with(
        span("decode", SpanKind::Internal, 4, Some(1), 250, 1250),
        vec![
            s(sc::infer::PHASE, "decode"),
            f(sc::gpu::UTILIZATION_MEAN, 0.5),
            f(sc::gpu::ENERGY, 400.0),
            f(sc::gpu::ENERGY_ATTRIBUTED, 30.0),
            f(sc::gpu::MEMORY_USED_MAX, 2e9),
        ],
    );
    vec![queue, prefill, decode, request]
}

#[test]
fn infertrace_prefers_child_span_timings() {
    let spans = infertrace_trace();
    assert_eq!(detect(&spans[3]), Some(Dialect::Infertrace));
    for phase in &spans[..3] {
        assert_eq!(detect(phase), None, "{}", phase.name);
    }
    let r = one(&spans);
    assert_eq!(r.dialect, Dialect::Infertrace);
    assert_eq!(r.span_id, sid(1));
    assert_eq!(
        (r.model.as_str(), r.operation.as_str()),
        ("llama-3.1-8b", "chat")
    );
    assert_eq!(r.outcome, Outcome::Ok);
    assert!(close(Some(r.e2e), 1.3));
    assert!(close(r.queue, 0.05));
    assert!(close(r.prefill, 0.2));
    assert!(close(r.ttft, 0.25));
    assert!(close(r.decode, 1.0));
    assert!(close(r.tpot, 0.1)); // 1.0 s / (11 − 1)
    assert_eq!(r.origins.tpot, Some(PhaseOrigin::Derived));
    for o in [
        r.origins.queue,
        r.origins.prefill,
        r.origins.ttft,
        r.origins.decode,
    ] {
        assert_eq!(o, Some(PhaseOrigin::Measured));
    }
    assert_eq!((r.input_tokens, r.output_tokens), (Some(100), Some(11)));
    assert_eq!((r.stream_chunks, r.queue_depth), (Some(11), Some(3)));
    assert!(close(r.time_to_first_chunk, 0.26));
    let itl = r.itl.unwrap();
    assert_eq!((itl.p50, itl.p99, itl.max), (0.09, 0.2, 0.3));
    assert_eq!(r.arrival_unix_nano, T0);
    assert_eq!(r.end_unix_nano, T0 + 1300 * MS);
    let gpu = r.gpu.unwrap();
    assert_eq!(gpu.utilization_mean.prefill, Some(0.9));
    assert_eq!(gpu.utilization_mean.decode, Some(0.5));
    assert_eq!(gpu.utilization_mean.queue, None);
    assert!(close(gpu.energy_joules, 500.0));
    assert!(close(gpu.energy_attributed_joules, 50.0));
    assert_eq!(gpu.memory_used_max_bytes, Some(2e9));
}

#[test]
fn a_prefill_child_clocked_outside_its_request_keeps_ttft_within_it() {
    // The prefill child's service runs 10 s ahead, then 10 s behind.
    for (shift, ttft) in [(10_000i64, 1.3), (-10_000, 0.0)] {
        let mut spans = infertrace_trace();
        let prefill = &mut spans[1];
        let moved = |t: u64| t.checked_add_signed(shift * 1_000_000).unwrap_or(0);
        prefill.start_unix_nano = moved(prefill.start_unix_nano);
        prefill.end_unix_nano = moved(prefill.end_unix_nano);
        let r = one(&spans);
        assert!(close(r.ttft, ttft), "{shift} ms: {:?}", r.ttft);
        assert!(r.ttft.unwrap() <= r.e2e);
    }
}

#[test]
fn infertrace_without_gpu_attributes_has_no_gpu_record() {
    let mut spans = infertrace_trace();
    for sp in &mut spans {
        sp.attributes.retain(|(k, _)| !k.starts_with("gpu."));
    }
    assert!(one(&spans).gpu.is_none());
}

#[test]
fn infertrace_falls_back_to_attributes_and_marks_derived_mode() {
    let request = with(
        span("chat m", SpanKind::Server, 1, None, 0, 2000),
        vec![
            s(sc::infer::OUTCOME, "ok"),
            s(sc::infer::PHASE_SOURCE, "derived"),
            f(sc::latency::TIME_IN_QUEUE, 0.1),
            f(sc::latency::TIME_IN_MODEL_PREFILL, 0.3),
            f(sc::latency::TIME_IN_MODEL_DECODE, 1.5),
            f(sc::infer::TIME_PER_OUTPUT_TOKEN, 0.05),
            i(sc::gen_ai::USAGE_OUTPUT_TOKENS, 31),
        ],
    );
    let r = one(&[request]);
    assert!(close(r.queue, 0.1) && close(r.prefill, 0.3) && close(r.decode, 1.5));
    assert!(close(r.ttft, 0.4)); // queue + prefill
    assert!(close(r.tpot, 0.05)); // the attribute, not 1.5 / 30
    assert_eq!(r.origins.queue, Some(PhaseOrigin::Measured));
    assert_eq!(r.origins.prefill, Some(PhaseOrigin::Derived));
    assert_eq!(r.origins.decode, Some(PhaseOrigin::Derived));
    assert_eq!(r.origins.ttft, Some(PhaseOrigin::Derived));
    assert_eq!(r.origins.tpot, Some(PhaseOrigin::Derived));
}

#[test]
fn infertrace_request_without_infer_attributes_is_found_by_its_phase_children() {
    let request = with(
        span("chat m", SpanKind::Server, 1, None, 0, 1000),
        vec![s(sc::gen_ai::OPERATION_NAME, "chat")],
    );
    let queue = with(
        span("queue", SpanKind::Internal, 2, Some(1), 0, 100),
        vec![s(sc::infer::PHASE, "queue")],
    );
    let inference = with(
        span("inference", SpanKind::Internal, 3, Some(1), 100, 1000),
        vec![s(sc::infer::PHASE, "inference")],
    );
    assert_eq!(detect(&request), Some(Dialect::Generic));
    let r = one(&[request, queue, inference]);
    assert_eq!(r.dialect, Dialect::Infertrace);
    assert!(close(r.queue, 0.1) && close(r.inference, 0.9));
    assert!(r.prefill.is_none() && r.decode.is_none() && r.ttft.is_none());
}

fn vllm_span(id: u8) -> Span {
    with(
        span("llm_request", SpanKind::Server, id, None, 0, 2600),
        vec![
            f(sc::latency::TIME_IN_QUEUE, 0.1),
            f(sc::latency::TIME_TO_FIRST_TOKEN, 0.4),
            f(sc::latency::TIME_IN_MODEL_PREFILL, 0.3),
            f(sc::latency::TIME_IN_MODEL_DECODE, 2.0),
            f(sc::latency::TIME_IN_MODEL_INFERENCE, 2.3),
            f(sc::latency::E2E, 2.5),
            i(sc::gen_ai::USAGE_PROMPT_TOKENS, 50),
            i(sc::gen_ai::USAGE_COMPLETION_TOKENS, 21),
            s(sc::gen_ai::RESPONSE_MODEL, "meta-llama/Llama-3.1-8B"),
        ],
    )
}

#[test]
fn vllm_reads_latency_attributes_and_old_usage_names() {
    let sp = vllm_span(1);
    assert_eq!(detect(&sp), Some(Dialect::Vllm));
    let r = one(&[sp]);
    assert_eq!(r.dialect, Dialect::Vllm);
    assert_eq!(r.model, "meta-llama/Llama-3.1-8B");
    assert_eq!(r.operation, "unknown");
    assert!(close(Some(r.e2e), 2.5)); // the attribute, not the 2.6 s span
    assert!(close(r.queue, 0.1) && close(r.ttft, 0.4) && close(r.prefill, 0.3));
    assert!(close(r.decode, 2.0) && close(r.inference, 2.3));
    assert!(close(r.tpot, 0.1)); // 2.0 / (21 − 1)
    assert_eq!((r.input_tokens, r.output_tokens), (Some(50), Some(21)));
    assert_eq!(r.origins.ttft, Some(PhaseOrigin::Measured));
    assert_eq!(r.origins.tpot, Some(PhaseOrigin::Derived));
}

#[test]
fn vllm_derives_missing_phases() {
    let mut sp = vllm_span(1);
    sp.attributes.retain(|(k, _)| {
        *k != sc::latency::TIME_IN_MODEL_PREFILL && *k != sc::latency::TIME_IN_MODEL_DECODE
    });
    let r = one(&[sp.clone()]);
    assert!(close(r.prefill, 0.3)); // ttft − queue
    assert!(close(r.decode, 2.0)); // inference − prefill
    assert_eq!(r.origins.prefill, Some(PhaseOrigin::Derived));
    assert_eq!(r.origins.decode, Some(PhaseOrigin::Derived));

    sp.attributes.retain(|(k, _)| {
        *k != sc::latency::TIME_IN_MODEL_INFERENCE && *k != sc::latency::TIME_TO_FIRST_TOKEN
    });
    let r = one(&[sp]);
    assert!(r.ttft.is_none() && r.prefill.is_none() && r.decode.is_none() && r.tpot.is_none());
    assert!(close(r.queue, 0.1));
}

/// With inference told but neither prefill nor queue, decode falls back to e2e − TTFT, as
/// docs/reference.md says, and TPOT follows.
#[test]
fn vllm_decode_falls_back_to_e2e_minus_ttft_without_a_prefill() {
    let mut sp = vllm_span(1);
    sp.attributes.retain(|(k, _)| {
        ![
            sc::latency::TIME_IN_MODEL_PREFILL,
            sc::latency::TIME_IN_MODEL_DECODE,
            sc::latency::TIME_IN_QUEUE,
        ]
        .contains(k)
    });
    let r = one(&[sp]);
    assert!(r.prefill.is_none());
    let (e2e, ttft) = (r.e2e, r.ttft.expect("ttft told"));
    assert!(close(r.decode, e2e - ttft), "{:?}", r.decode);
    assert_eq!(r.origins.decode, Some(PhaseOrigin::Derived));
    assert!(r.tpot.is_some());
}

/// A request that ended before its first token — a stream of no token, an error, a cancel —
/// as the layer emits it: a prefill child running to the end, no decode child, no TTFT
/// attribute. Its prefill end is no first token: no TTFT (not e2e, which would fail the TTFT
/// SLO of a request that produced nothing).
#[test]
fn a_request_without_a_first_token_has_no_ttft() {
    let ended = |outcome: &str, tokens: Option<i64>, prefill_end_ms: u64| {
        let mut attributes = vec![
            s(sc::gen_ai::OPERATION_NAME, "chat"),
            s(sc::gen_ai::REQUEST_MODEL, "m"),
            s(sc::infer::OUTCOME, outcome),
        ];
        if let Some(n) = tokens {
            attributes.push(i(sc::gen_ai::USAGE_OUTPUT_TOKENS, n));
            attributes.push(i(sc::infer::STREAM_CHUNKS, n));
        }
        let request = with(
            span("chat m", SpanKind::Server, 1, None, 0, 2000),
            attributes,
        );
        let queue = with(
            span("queue", SpanKind::Internal, 2, Some(1), 0, 100),
            vec![s(sc::infer::PHASE, "queue")],
        );
        let prefill = with(
            span(
                "prefill",
                SpanKind::Internal,
                3,
                Some(1),
                100,
                prefill_end_ms,
            ),
            vec![s(sc::infer::PHASE, "prefill")],
        );
        one(&[queue, prefill, request])
    };
    // No token, or no count and a prefill that ran to the end of a failed request.
    for (outcome, tokens) in [
        ("ok", Some(0)),
        ("error", Some(0)),
        ("cancelled", Some(0)),
        ("error", None),
        ("cancelled", None),
    ] {
        let r = ended(outcome, tokens, 2000);
        assert_eq!(r.ttft, None, "{outcome}, {tokens:?} tokens");
        assert!(close(r.prefill, 1.9) && close(r.queue, 0.1));
    }
    // A count of tokens, a prefill that stopped early, or an ok whole response: a first token.
    for (outcome, tokens, prefill_end) in [
        ("ok", Some(5), 2000),
        ("error", Some(5), 2000),
        ("error", None, 1500),
        ("ok", None, 2000),
    ] {
        let r = ended(outcome, tokens, prefill_end);
        let want = prefill_end as f64 / 1e3;
        assert!(close(r.ttft, want), "{outcome}, {tokens:?}: {:?}", r.ttft);
    }
    // With a decode child, an error after the first token keeps it.
    let mut spans = infertrace_trace();
    spans[3]
        .attributes
        .retain(|(k, _)| *k != sc::infer::OUTCOME);
    spans[3].attributes.push(s(sc::infer::OUTCOME, "error"));
    assert!(close(one(&spans).ttft, 0.25));
}

#[test]
fn sglang_is_told_from_vllm_by_span_name() {
    let mut sp = vllm_span(1);
    sp.name = "Req 7f3a".into();
    sp.kind = SpanKind::Internal;
    assert_eq!(detect(&sp), Some(Dialect::Sglang));
    let r = one(&[sp]);
    assert_eq!(r.dialect, Dialect::Sglang);
    assert!(close(r.ttft, 0.4) && close(r.tpot, 0.1));
}

#[test]
fn several_requests_in_one_trace() {
    let records = extract_requests(&[vllm_span(1), vllm_span(2)]);
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].span_id, sid(1));
    assert_eq!(records[1].span_id, sid(2));
}

/// TGI: HTTP span → `generate` (fields) → inner `generate` → `generate_stream` → `queued`,
/// `infer` ×3 linked to `batch` spans of another trace holding `prefill` / `decode`.
fn tgi_trace(with_batches: bool, with_fields: bool, http_status: i64) -> Vec<Span> {
    let http = with(
        span("POST /generate", SpanKind::Server, 1, None, 0, 1502),
        vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, http_status)],
    );
    let mut generate = span("generate", SpanKind::Internal, 2, Some(1), 1, 1501);
    if with_fields {
        generate = with(
            generate,
            vec![
                s(sc::tgi::TOTAL_TIME, "1.5s"),
                s(sc::tgi::VALIDATION_TIME, "1.2ms"),
                s(sc::tgi::QUEUE_TIME, "48.8ms"),
                s(sc::tgi::INFERENCE_TIME, "1.45s"),
                s(sc::tgi::TIME_PER_TOKEN, "145ms"),
            ],
        );
    }
    let inner = span("generate", SpanKind::Internal, 3, Some(2), 2, 1500);
    let stream = span("generate_stream", SpanKind::Internal, 4, Some(3), 2, 1500);
    let queued = span("queued", SpanKind::Internal, 5, Some(4), 2, 51);
    let link = |n: u8| SpanLink {
        trace_id: TraceId([9; 16]),
        span_id: sid(n),
    };
    let mut infer1 = span("infer", SpanKind::Internal, 6, Some(4), 51, 251);
    infer1.links.push(link(20));
    let mut infer2 = span("infer", SpanKind::Internal, 7, Some(4), 251, 900);
    infer2.links.push(link(22));
    let mut infer3 = span("infer", SpanKind::Internal, 8, Some(4), 900, 1500);
    infer3.links.push(link(24));
    let mut spans = vec![
        http, generate, inner, stream, queued, infer2, infer1, infer3,
    ];
    if with_batches {
        let batch = |id: u8, start, end| {
            let mut b = with(
                span("batch", SpanKind::Internal, id, None, start, end),
                vec![i(sc::tgi::BATCH_SIZE, 4)],
            );
            b.trace_id = TraceId([9; 16]);
            b
        };
        let step = |name: &str, id: u8, parent: u8, start, end| {
            let mut sp = span(name, SpanKind::Client, id, Some(parent), start, end);
            sp.trace_id = TraceId([9; 16]);
            sp
        };
        spans.extend([
            batch(20, 55, 245),
            step("prefill", 21, 20, 60, 240),
            batch(22, 252, 890),
            step("decode", 23, 22, 255, 885),
        ]);
    }
    spans
}

#[test]
fn tgi_with_linked_batches_reads_prefill_from_the_batch() {
    let spans = tgi_trace(true, true, 200);
    assert_eq!(detect(&spans[0]), Some(Dialect::Generic));
    assert_eq!(detect(&spans[1]), Some(Dialect::Tgi));
    assert_eq!(detect(&spans[2]), None);
    let r = one(&spans);
    assert_eq!(r.dialect, Dialect::Tgi);
    assert_eq!(r.span_id, sid(2));
    assert_eq!(r.operation, "text_completion");
    assert_eq!(r.outcome, Outcome::Ok);
    assert!(close(Some(r.e2e), 1.5));
    assert!(close(r.queue, 0.0488));
    assert!(close(r.inference, 1.45));
    assert!(close(r.prefill, 0.18)); // batch prefill 60 → 240 ms
    assert_eq!(r.origins.prefill, Some(PhaseOrigin::Measured));
    assert!(close(r.ttft, 0.239)); // prefill end (240) − request start (1)
    assert_eq!(r.output_tokens, Some(10)); // 1.45 s / 145 ms
    assert!(close(r.decode, 1.27)); // 1.45 − 0.18
    assert!(close(r.tpot, 1.27 / 9.0)); // GenAI TPOT, not TGI's 145 ms
    assert_eq!(r.origins.tpot, Some(PhaseOrigin::Derived));
}

/// A stream its client dropped during prefill: TGI's `queued` and `infer` spans outlive the
/// handler's, and count up to its end (a review saw prefill 0.999 s, queue + prefill past e2e).
#[test]
fn a_dropped_tgi_streams_steps_count_up_to_its_end() {
    let http = with(
        span("POST /generate_stream", SpanKind::Server, 1, None, 0, 1001),
        vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, 200)],
    );
    let handler = span("generate_stream", SpanKind::Internal, 2, Some(1), 1, 1000);
    let queued = span("queued", SpanKind::Internal, 3, Some(2), 2, 300);
    let infer = span("infer", SpanKind::Internal, 4, Some(2), 300, 1500);
    let r = one(&[http, handler, queued, infer]);
    assert_eq!((r.dialect, r.outcome), (Dialect::Tgi, Outcome::Cancelled));
    assert!(close(r.queue, 0.298), "{:?}", r.queue);
    assert!(close(r.prefill, 0.7), "{:?}", r.prefill);
}

/// TGI refuses a request before it records a timing field or queues it (a 422 validation
/// error, a 429 full queue): the HTTP span is a generic request, in the series of the handler's
/// operation with the requests TGI served (a review saw them alone under `unknown`, leaving the
/// served series' error and rejection rates at 0).
#[test]
fn a_request_tgi_refused_counts_under_its_handlers_operation() {
    for (status, handler, operation, outcome) in [
        (422, "generate", "text_completion", Outcome::Error),
        (429, "chat_completions", "chat", Outcome::Rejected),
    ] {
        let http = with(
            span("POST /x", SpanKind::Server, 1, None, 0, 4),
            vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, status)],
        );
        let handler = span(handler, SpanKind::Internal, 2, Some(1), 1, 3);
        let r = one(&[http, handler]);
        assert_eq!(r.dialect, Dialect::Generic);
        assert_eq!((r.operation.as_str(), r.outcome), (operation, outcome));
    }
    // An unrelated server span keeps its unknown operation.
    let other = span("POST /x", SpanKind::Server, 1, None, 0, 4);
    assert_eq!(one(&[other]).operation, "unknown");
}

#[test]
fn tgi_without_batches_uses_the_first_infer_span() {
    let r = one(&tgi_trace(false, true, 200));
    assert!(close(r.prefill, 0.2)); // first infer span 51 → 251 ms
    assert_eq!(r.origins.prefill, Some(PhaseOrigin::Derived));
    assert!(close(r.ttft, 0.25));
    assert!(close(r.decode, 1.25));
    assert!(close(r.tpot, 1.25 / 9.0));
}

#[test]
fn tgi_failed_request_without_fields_takes_the_http_status() {
    let spans = tgi_trace(false, false, 500);
    assert_eq!(detect(&spans[1]), None);
    let r = one(&spans);
    assert_eq!(r.dialect, Dialect::Tgi);
    assert_eq!(r.span_id, sid(2));
    assert_eq!(r.outcome, Outcome::Error);
    assert!(close(Some(r.e2e), 1.5)); // the span's duration
    assert!(close(r.queue, 0.049)); // the `queued` span
    assert!(r.inference.is_none() && r.decode.is_none() && r.tpot.is_none());
}

/// TGI records its timing fields once it has served a request: a stream its client dropped
/// keeps HTTP 200 and has none.
#[test]
fn tgi_request_without_fields_or_error_is_cancelled() {
    let r = one(&tgi_trace(false, false, 200));
    assert_eq!(r.dialect, Dialect::Tgi);
    assert_eq!(r.outcome, Outcome::Cancelled);
    assert_eq!(one(&tgi_trace(false, true, 200)).outcome, Outcome::Ok);
}

/// A request that failed or was cancelled during its first step (the `infer` span runs to
/// its end) has no TTFT; one that failed after its first step keeps it.
#[test]
fn tgi_request_ended_before_its_first_token_has_no_ttft() {
    for status in [500, 200] {
        let mut spans = tgi_trace(false, false, status);
        spans.retain(|s| s.span_id != sid(7) && s.span_id != sid(8));
        let first = spans.iter_mut().find(|s| s.span_id == sid(6)).unwrap();
        first.end_unix_nano = T0 + 1501 * MS;
        let r = one(&spans);
        assert_ne!(r.outcome, Outcome::Ok);
        assert!(r.ttft.is_none(), "{status}: {:?}", r.ttft);
        assert!(
            close(r.prefill, 1.45),
            "{status}: the step ran, {:?}",
            r.prefill
        );
        // Failed after its first step: the step's end was a first token.
        let r = one(&tgi_trace(false, false, status));
        assert!(close(r.ttft, 0.25), "{status}: {:?}", r.ttft);
    }
}

/// vLLM's first-token latency defaults to 0 for a request that produced no token; SGLang
/// writes its finish reasons as one JSON string.
#[test]
fn a_request_with_no_token_has_no_ttft_and_a_string_abort_is_a_cancel() {
    let mut sp = vllm_span(1);
    sp.attributes.retain(|(k, _)| {
        ![
            sc::gen_ai::USAGE_COMPLETION_TOKENS,
            sc::latency::TIME_TO_FIRST_TOKEN,
        ]
        .contains(k)
    });
    sp.attributes
        .push(i(sc::gen_ai::USAGE_COMPLETION_TOKENS, 0));
    sp.attributes.push(f(sc::latency::TIME_TO_FIRST_TOKEN, 0.0));
    let r = one(&[sp.clone()]);
    assert!(r.ttft.is_none(), "{:?}", r.ttft);
    assert_eq!(r.outcome, Outcome::Ok);
    // Its prefill and decode of 0 are defaults too, not phases that took no time; a prefill
    // that took time (an embedding's) is one.
    let mut defaults = sp.clone();
    defaults.attributes.retain(|(k, _)| {
        ![
            sc::latency::TIME_IN_MODEL_PREFILL,
            sc::latency::TIME_IN_MODEL_DECODE,
        ]
        .contains(k)
    });
    let mut prefilled = defaults.clone();
    defaults
        .attributes
        .push(f(sc::latency::TIME_IN_MODEL_PREFILL, 0.0));
    defaults
        .attributes
        .push(f(sc::latency::TIME_IN_MODEL_DECODE, 0.0));
    let r = one(&[defaults]);
    assert_eq!((r.prefill, r.decode, r.tpot), (None, None, None));
    assert!(r.queue.is_some());
    prefilled
        .attributes
        .push(f(sc::latency::TIME_IN_MODEL_PREFILL, 0.04));
    assert_eq!(one(&[prefilled]).prefill, Some(0.04));
    for (reasons, outcome) in [
        ("[\"abort\"]", Outcome::Cancelled),
        ("abort", Outcome::Cancelled),
        ("[\"stop\"]", Outcome::Ok),
        ("[\"aborted_by_length\"]", Outcome::Ok),
    ] {
        let mut with_reason = sp.clone();
        with_reason
            .attributes
            .push(s(sc::gen_ai::RESPONSE_FINISH_REASONS, reasons));
        assert_eq!(one(&[with_reason]).outcome, outcome, "{reasons}");
    }
}

#[test]
fn tgi_chat_completions_is_chat() {
    let mut spans = tgi_trace(false, true, 200);
    spans[1].name = "chat_completions".into();
    assert_eq!(one(&spans).operation, "chat");
}

#[test]
fn generic_server_span_outcomes() {
    type Attrs = Vec<(&'static str, AttrValue)>;
    let cases: Vec<(Attrs, StatusCode, Outcome)> = vec![
        (vec![], StatusCode::Unset, Outcome::Ok),
        (
            vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, 200)],
            StatusCode::Unset,
            Outcome::Ok,
        ),
        // A request the service did not serve is no ok request (HTTP's semantic conventions
        // leave a server span's status unset for a 4xx; its outcome is still an error).
        (
            vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, 404)],
            StatusCode::Unset,
            Outcome::Error,
        ),
        (
            vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, 400)],
            StatusCode::Unset,
            Outcome::Error,
        ),
        (
            vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, 503)],
            StatusCode::Unset,
            Outcome::Error,
        ),
        (
            vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, 429)],
            StatusCode::Error,
            Outcome::Rejected,
        ),
        (
            vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, 499)],
            StatusCode::Unset,
            Outcome::Cancelled,
        ),
        (
            vec![i(sc::net::HTTP_RESPONSE_STATUS_CODE, 200)],
            StatusCode::Error,
            Outcome::Error,
        ),
        (
            vec![i(sc::net::RPC_GRPC_STATUS_CODE, 1)],
            StatusCode::Error,
            Outcome::Cancelled,
        ),
        (
            vec![i(sc::net::RPC_GRPC_STATUS_CODE, 8)],
            StatusCode::Error,
            Outcome::Rejected,
        ),
        (
            vec![i(sc::net::RPC_GRPC_STATUS_CODE, 13)],
            StatusCode::Error,
            Outcome::Error,
        ),
        (
            vec![i(sc::net::RPC_GRPC_STATUS_CODE, 0)],
            StatusCode::Unset,
            Outcome::Ok,
        ),
        (
            vec![s(sc::net::ERROR_TYPE, "timeout")],
            StatusCode::Unset,
            Outcome::Error,
        ),
        // vLLM's finish reason for a request its client abandoned.
        (
            vec![attr(
                sc::gen_ai::RESPONSE_FINISH_REASONS,
                AttrValue::StrArray(vec!["abort".into()]),
            )],
            StatusCode::Unset,
            Outcome::Cancelled,
        ),
        (
            vec![attr(
                sc::gen_ai::RESPONSE_FINISH_REASONS,
                AttrValue::StrArray(vec!["stop".into()]),
            )],
            StatusCode::Unset,
            Outcome::Ok,
        ),
        (
            vec![
                s(sc::infer::OUTCOME, "cancelled"),
                i(sc::net::HTTP_RESPONSE_STATUS_CODE, 200),
            ],
            StatusCode::Unset,
            Outcome::Cancelled,
        ),
    ];
    for (attrs, status, want) in cases {
        let mut sp = with(span("POST /v1/x", SpanKind::Server, 1, None, 0, 700), attrs);
        sp.status = status;
        let r = one(&[sp.clone()]);
        assert_eq!(r.outcome, want, "{:?} {status:?}", sp.attributes);
        assert!(close(Some(r.e2e), 0.7));
    }
}

#[test]
fn generic_records_only_e2e() {
    let sp = with(
        span("POST /v1/embed", SpanKind::Server, 1, None, 0, 300),
        vec![s(sc::gen_ai::REQUEST_MODEL, "bge")],
    );
    assert_eq!(detect(&sp), Some(Dialect::Generic));
    let r = one(&[sp]);
    assert_eq!((r.dialect, r.model.as_str()), (Dialect::Generic, "bge"));
    assert!(r.queue.is_none() && r.ttft.is_none() && r.tpot.is_none() && r.gpu.is_none());
}

#[test]
fn client_and_internal_spans_are_not_requests() {
    let c = span("GET /x", SpanKind::Client, 1, None, 0, 10);
    let n = span("work", SpanKind::Internal, 2, None, 0, 10);
    assert_eq!(detect(&c), None);
    assert_eq!(detect(&n), None);
    assert!(extract_requests(&[c, n]).is_empty());
}

#[test]
fn a_server_span_around_a_request_span_is_not_a_second_request() {
    let mut spans = infertrace_trace();
    for sp in &mut spans {
        if sp.parent_span_id.is_none() {
            sp.parent_span_id = Some(sid(50));
        }
    }
    spans.push(span("POST /v1/chat", SpanKind::Server, 50, None, 0, 1301));
    let r = one(&spans);
    assert_eq!(r.span_id, sid(1));

    // A gateway of another service is a request of its own.
    let mut gateway = span("POST /gw", SpanKind::Server, 60, None, 0, 1400);
    gateway.service = Text::from("gateway");
    let client = span("POST /v1/chat", SpanKind::Client, 61, Some(60), 0, 1350);
    if let Some(p) = spans.iter_mut().find(|s| s.span_id == sid(50)) {
        p.parent_span_id = Some(sid(61));
    }
    spans.extend([gateway, client]);
    let recs = extract_requests(&spans);
    let ids: Vec<_> = recs.iter().map(|r| (r.span_id, r.dialect)).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&(sid(1), Dialect::Infertrace)));
    assert!(ids.contains(&(sid(60), Dialect::Generic)));
}

/// vLLM under `opentelemetry-instrument`: the framework's server span and vLLM's
/// `llm_request` both continue the client's context, as siblings; one request. A server span
/// of the same service at another time is a request of its own.
#[test]
fn a_framework_server_span_beside_an_engine_span_is_not_a_second_request() {
    let mut engine = vllm_span(1);
    engine.parent_span_id = Some(sid(40));
    let mut framework = span(
        "POST /v1/completions",
        SpanKind::Server,
        2,
        Some(40),
        0,
        2601,
    );
    framework.parent_span_id = Some(sid(40));
    let r = one(&[framework, engine.clone()]);
    assert_eq!(r.dialect, Dialect::Vllm);
    let health = span("GET /health", SpanKind::Server, 3, Some(40), 3000, 3001);
    let recs = extract_requests(&[engine.clone(), health]);
    assert_eq!(recs.len(), 2, "{recs:#?}");
    // A concurrent request that failed (a framework span only, overlapping the first): its own.
    let mine = span(
        "POST /v1/completions",
        SpanKind::Server,
        2,
        Some(40),
        0,
        2601,
    );
    let failed = span(
        "POST /v1/completions",
        SpanKind::Server,
        4,
        Some(40),
        100,
        200,
    );
    let recs = extract_requests(&[failed, engine, mine]);
    let ids: Vec<_> = recs.iter().map(|r| (r.span_id, r.dialect)).collect();
    assert_eq!(
        ids,
        [(sid(4), Dialect::Generic), (sid(1), Dialect::Vllm)],
        "{recs:#?}"
    );
}

#[test]
fn garbage_attributes_never_panic() {
    let sp = with(
        span("llm_request", SpanKind::Server, 1, None, 10, 0), // ends before it starts
        vec![
            s(sc::latency::TIME_IN_QUEUE, "soon"),
            f(sc::latency::TIME_TO_FIRST_TOKEN, f64::NAN),
            f(sc::latency::E2E, -1.0),
            i(sc::gen_ai::USAGE_COMPLETION_TOKENS, -5),
        ],
    );
    let r = one(&[sp]);
    assert_eq!(r.e2e, 0.0);
    assert!(r.queue.is_none() && r.ttft.is_none() && r.output_tokens.is_none());
    let tgi = with(
        span("generate", SpanKind::Internal, 1, None, 0, 10),
        vec![
            s(sc::tgi::TOTAL_TIME, "-3ms"),
            s(sc::tgi::INFERENCE_TIME, "1s"),
            s(sc::tgi::TIME_PER_TOKEN, "0ns"),
        ],
    );
    let r = one(&[tgi]);
    assert!(close(Some(r.e2e), 0.01) && r.output_tokens.is_none());
}

#[test]
fn tgi_trace_with_thousands_of_decode_steps() {
    let mut spans = tgi_trace(false, true, 200);
    spans.retain(|s| s.name != "infer");
    // One `infer` span per batch step: prefill 51 → 251 ms, then 3,000 decode steps.
    let mut first = span("infer", SpanKind::Internal, 6, Some(4), 51, 251);
    first.span_id = SpanId(7_000_000u64.to_le_bytes());
    spans.push(first);
    for k in 0..3_000u64 {
        let mut step = span("infer", SpanKind::Internal, 6, Some(4), 251, 252);
        step.span_id = SpanId((1_000_000 + k).to_le_bytes());
        step.start_unix_nano += k * 400_000;
        step.end_unix_nano = step.start_unix_nano + 400_000;
        spans.push(step);
    }
    // (Its cost per span is the ingest benchmark's business, not a wall-clock bound here.)
    let r = one(&spans);
    assert!(close(r.prefill, 0.2));
}

/// Two layers stacked in one service: the outer request span stands (its e2e, the client's
/// view), and the phases and tokens come from the inner one.
#[test]
fn an_outer_infertrace_request_span_reads_the_phases_of_the_one_nested_in_it() {
    let mut spans = infertrace_trace();
    for sp in &mut spans {
        sp.span_id = sid(sp.span_id.0[0] + 10);
        sp.parent_span_id = Some(sp.parent_span_id.map_or(sid(1), |p| sid(p.0[0] + 10)));
    }
    let outer = with(
        span("POST /v1/chat", SpanKind::Server, 1, None, 0, 1400),
        vec![
            s(sc::gen_ai::OPERATION_NAME, "chat"),
            s(sc::infer::OUTCOME, "ok"),
        ],
    );
    spans.push(outer);
    let r = one(&spans);
    assert_eq!(r.span_id, sid(1));
    assert!(close(Some(r.e2e), 1.4));
    assert!(close(r.queue, 0.05) && close(r.prefill, 0.2) && close(r.decode, 1.0));
    assert!(close(r.ttft, 0.25)); // the inner prefill's end − the outer request's start
    assert_eq!(r.output_tokens, Some(11));
    assert!(close(r.tpot, 0.1)); // 1.0 s / 10
    assert!(r.gpu.is_some());
}

#[test]
fn nested_request_spans_of_one_dialect_are_one_request() {
    let outer = with(
        span("Req 1", SpanKind::Server, 1, None, 0, 1000),
        vec![f(sc::latency::E2E, 1.0)],
    );
    let inner = with(
        span("Req 1 scheduler", SpanKind::Internal, 2, Some(1), 10, 990),
        vec![f(sc::latency::TIME_IN_QUEUE, 0.1)],
    );
    let r = one(&[inner.clone(), outer.clone()]);
    assert_eq!((r.span_id, r.dialect), (sid(1), Dialect::Sglang));
    // Another service's nested span is a request of its own.
    let mut other = inner;
    other.service = Text::from("engine");
    assert_eq!(extract_requests(&[outer, other]).len(), 2);
}
