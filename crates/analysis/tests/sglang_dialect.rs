//! SGLang's request tree (docs/dialects-sglang.md#sglangs-span-model) read into one record: plain and PD, two TP ranks
//! counted once, every stage → sub-phase mapping checked by changing that one slice; plus
//! TensorRT-LLM's KV-transfer attribute, cache hits, preemptions and LoRA on other dialects, and
//! infertrace's own layer on each role of a PD deployment read into one record.

mod support_sglang;

use infertrace_analysis::dialect::{detect, extract_requests};
use infertrace_analysis::record::{Dialect, PhaseOrigin, RequestRecord};
use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{AttrValue, Span, SpanId, SpanKind, StatusCode, known_key};
use infertrace_semconv as sc;
use sc::sglang::stage as st;
use support_sglang::{DECODE, MS, PREFILL, ROUTER, Tree, pd, plain, role_id, room_id};

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[track_caller]
fn assert_close(what: &str, a: Option<f64>, b: f64) {
    assert!(close(a, b), "{what}: got {a:?}, want {b}");
}

fn one(spans: &[Span]) -> RequestRecord {
    let mut recs = extract_requests(spans);
    assert_eq!(recs.len(), 1, "{recs:#?}");
    recs.remove(0)
}

fn kept(key: &str, v: AttrValue) -> (&'static str, AttrValue) {
    (known_key(key.as_bytes()).expect("a kept key"), v)
}

#[test]
fn pd_tree_is_one_request_with_every_sub_phase() {
    let r = one(&pd().build());
    assert_eq!(r.dialect, Dialect::Sglang);
    assert_eq!(r.span_id, room_id());
    assert_eq!(r.service.as_str(), "sglang-router");
    assert_eq!(r.model.as_str(), "llama-3.1-8b");
    assert_eq!((r.input_tokens, r.output_tokens), (Some(1200), Some(40)));
    assert_eq!(r.cache_read_input_tokens, Some(512));
    assert_close("e2e", Some(r.e2e), 1.0);
    assert_close("ttft", r.ttft, 0.212); // fake_output ends at 212 ms
    assert_close("queue", r.queue, 0.020);
    assert_close("prefill", r.prefill, 0.090);
    assert_close("decode", r.decode, 0.780); // 212 → 992
    assert_close("tpot", r.tpot, 0.020); // 0.78 / 39
    for o in [
        r.origins.queue,
        r.origins.prefill,
        r.origins.ttft,
        r.origins.decode,
    ] {
        assert_eq!(o, Some(PhaseOrigin::Measured));
    }
    assert_eq!(r.origins.tpot, Some(PhaseOrigin::Derived));
    let d = r.disagg.as_deref().expect("sub-phases");
    assert_close("routing", d.routing, 0.004);
    assert_close("bootstrap", d.bootstrap, 0.030);
    assert_close("prefill_queue", d.prefill_queue, 0.020);
    assert_close("prefill", d.prefill, 0.090);
    assert_close("kv_transfer", d.kv_transfer, 0.040);
    assert_close("decode_bootstrap", d.decode_bootstrap, 0.027);
    assert_close("decode_wait", d.decode_wait, 0.010);
    assert_close("first_token", d.first_token, 0.007);
    assert_close("decode", d.decode, 0.780);
    assert_eq!(d.prefill_worker.as_deref(), Some("sglang-prefill"));
    assert_eq!(d.decode_worker.as_deref(), Some("sglang-decode"));

    // TTFT across the sub-phases, in time order; the rest (tokenize, dispatch, prepare,
    // hand-over gaps) is unattributed.
    let b = r.ttft_breakdown().expect("a breakdown");
    let names: Vec<&str> = b.parts.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "routing",
            "bootstrap",
            "prefill_queue",
            "prefill",
            "kv_transfer",
            "decode_wait",
            "first_token"
        ]
    );
    assert_close("unattributed", Some(b.unattributed), 0.011);

    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["disagg"]["kv_transfer"], 0.04);
    assert_eq!(json["cache_read_input_tokens"], 512);
    assert!(
        json.get("lora_adapter").is_none(),
        "absent fields are left out"
    );
}

/// The decode side on a host whose clock runs apart (a review sent the same request with the
/// decode host at +300 ms, −300 ms and +1.5 s: TTFT read 0.631, 0.031 and 1.831 s against a
/// 0.734 s e2e). Its role span then lies outside the request, and its first token is read on
/// the request's clock by moving that span's end to the request's end (998 → 1000 ms here).
#[test]
fn a_decode_host_with_its_own_clock_gives_the_first_token_on_the_requests() {
    for skew_ms in [300i64, -300, 1500] {
        let mut spans = pd().build();
        for s in spans.iter_mut().filter(|s| s.service == "sglang-decode") {
            s.start_unix_nano = s.start_unix_nano.saturating_add_signed(skew_ms * 1_000_000);
            s.end_unix_nano = s.end_unix_nano.saturating_add_signed(skew_ms * 1_000_000);
        }
        let r = one(&spans);
        assert_close(&format!("ttft at {skew_ms} ms"), r.ttft, 0.214);
        assert_close(&format!("decode at {skew_ms} ms"), r.decode, 0.780);
        assert_close(&format!("e2e at {skew_ms} ms"), Some(r.e2e), 1.0);
    }
}

/// The slice a sub-phase comes from, on rank `tp`.
type Locate = fn(&Tree, Option<i64>) -> usize;
/// How the record reads a phase.
type Read = fn(&RequestRecord) -> Option<f64>;

fn last_decode_step(t: &Tree, tp: Option<i64>) -> usize {
    t.slices
        .iter()
        .rposition(|s| {
            let th = &t.threads[s.thread];
            th.role == DECODE && th.tp == tp && s.name == st::DECODE_LOOP
        })
        .expect("a decode step")
}

/// Every sub-phase, with the slice it comes from and how the record reads it.
fn sub_phases() -> Vec<(&'static str, Locate, Read)> {
    fn d(r: &RequestRecord) -> &infertrace_analysis::record::DisaggPhases {
        r.disagg.as_deref().expect("sub-phases")
    }
    vec![
        (
            "routing",
            |t, _| t.find(ROUTER, None, st::MINI_LB_LAUNCH),
            |r| d(r).routing,
        ),
        (
            "bootstrap",
            |t, tp| t.find(PREFILL, tp, st::PREFILL_BOOTSTRAP),
            |r| d(r).bootstrap,
        ),
        (
            "prefill_queue",
            |t, tp| t.find(PREFILL, tp, st::PREFILL_WAITING),
            |r| d(r).prefill_queue,
        ),
        (
            "queue",
            |t, tp| t.find(PREFILL, tp, st::PREFILL_WAITING),
            |r| r.queue,
        ),
        (
            "prefill",
            |t, tp| t.find(PREFILL, tp, st::PREFILL_FORWARD),
            |r| d(r).prefill,
        ),
        (
            "record prefill",
            |t, tp| t.find(PREFILL, tp, st::PREFILL_FORWARD),
            |r| r.prefill,
        ),
        (
            "kv_transfer",
            |t, tp| t.find(PREFILL, tp, st::PREFILL_TRANSFER_KV_CACHE),
            |r| d(r).kv_transfer,
        ),
        (
            "decode_bootstrap",
            |t, tp| t.find(DECODE, tp, st::DECODE_BOOTSTRAP),
            |r| d(r).decode_bootstrap,
        ),
        (
            "decode_wait",
            |t, tp| t.find(DECODE, tp, st::DECODE_WAITING),
            |r| d(r).decode_wait,
        ),
        (
            "first_token",
            |t, tp| t.find(DECODE, tp, st::FAKE_OUTPUT),
            |r| d(r).first_token,
        ),
        (
            "ttft",
            |t, tp| t.find(DECODE, tp, st::FAKE_OUTPUT),
            |r| r.ttft,
        ),
        ("decode", last_decode_step, |r| d(r).decode),
        ("record decode", last_decode_step, |r| r.decode),
    ]
}

#[test]
fn each_sub_phase_follows_its_slice_on_rank_zero_only() {
    let base = one(&pd().build());
    for (name, locate, read) in sub_phases() {
        let before = read(&base).unwrap_or_else(|| panic!("{name}: no value"));
        // Rank 0 (or the router's only thread) stretched by 7 ms: the sub-phase follows.
        let mut t = pd();
        let rank0 = if name == "routing" { None } else { Some(0) };
        let i = locate(&t, rank0);
        t.slices[i].end_us += 7 * MS;
        assert_close(name, read(&one(&t.build())), before + 0.007);
        if name == "routing" {
            continue;
        }
        // Rank 1 stretched: nothing moves (a stage is read once, from the lowest rank).
        let mut t = pd();
        let i = locate(&t, Some(1));
        t.slices[i].end_us += 7 * MS;
        assert_close(&format!("{name} (rank 1)"), read(&one(&t.build())), before);
    }
}

#[test]
fn a_stage_missing_on_rank_zero_is_read_from_rank_one() {
    let mut t = pd();
    let i = t.find(PREFILL, Some(0), st::PREFILL_TRANSFER_KV_CACHE);
    t.slices[i].name = "another_stage";
    let r = one(&t.build());
    // Rank 1's transfer: 150.5 → 190.5 + 3 ms.
    assert_close("kv_transfer", r.disagg.unwrap().kv_transfer, 0.043);
}

#[test]
fn roles_are_told_by_their_stages_when_the_names_do_not_say() {
    let mut t = pd();
    for role in &mut t.roles {
        role.role = "";
    }
    let mut named = one(&pd().build());
    let unnamed = one(&t.build());
    // Same record but for the span names, which the record does not keep.
    named.span_id = unnamed.span_id;
    assert_eq!(named, unnamed);
}

#[test]
fn without_its_room_span_the_role_spans_are_still_one_request() {
    let mut t = pd();
    t.room = None;
    let r = one(&t.build());
    // The decode side's role span stands for it (it answers the client; the router's role span
    // is not named here).
    assert_eq!(r.span_id, role_id(DECODE));
    assert_close("e2e", Some(r.e2e), 1.0); // the router's role span: 0 → 1000 ms
    assert_close("ttft", r.ttft, 0.212);
    assert_close("kv_transfer", r.disagg.unwrap().kv_transfer, 0.040);
}

#[test]
fn the_prefill_side_alone_is_still_one_request() {
    // Only the prefill server's spans arrived (no room, no decode side): recognised with the
    // trace, though no span alone says a request arrived.
    let spans: Vec<Span> = pd()
        .build()
        .into_iter()
        .filter(|s| s.service.as_str() == "sglang-prefill")
        .collect();
    assert!(spans.iter().all(|s| detect(s).is_none()));
    let r = one(&spans);
    assert_eq!(r.span_id, role_id(PREFILL));
    let d = r.disagg.unwrap();
    assert_close("kv_transfer", d.kv_transfer, 0.040);
    assert!(r.ttft.is_none(), "the first token is the decode side's");
}

/// Below trace level 3 the decode side has no `fake_output` or `decode_loop` slices: decode
/// (and TPOT) come from its role span's latency attribute.
#[test]
fn pd_without_decode_slices_reads_decode_from_the_role_span() {
    let mut tree = pd();
    tree.roles[2].attributes.push(kept(
        sc::latency::TIME_IN_MODEL_DECODE,
        AttrValue::Double(0.7),
    ));
    let spans: Vec<Span> = tree
        .build()
        .into_iter()
        .filter(|s| s.name != st::FAKE_OUTPUT && s.name != st::DECODE_LOOP)
        .collect();
    let r = one(&spans);
    assert_close("decode", r.decode, 0.7);
    assert_close(
        "disagg decode",
        r.disagg.as_ref().and_then(|d| d.decode),
        0.7,
    );
    let n = r.output_tokens.expect("counted") as f64;
    assert_close("tpot", r.tpot, 0.7 / (n - 1.0));
}

/// Newer SGLang's KV sender opens a `Sender Req …` span with `rid` and `bootstrap_room` as the
/// root of a trace of its own: a transfer, not a request.
#[test]
fn the_kv_senders_span_is_no_request() {
    let sender = Span {
        trace_id: infertrace_analysis::trace::TraceId([5; 16]),
        span_id: SpanId([5; 8]),
        parent_span_id: None,
        name: "Sender Req 0x1f2e3d".into(),
        service: Text::from("sglang-prefill"),
        kind: SpanKind::Internal,
        start_unix_nano: 1_700_000_000 * 1_000_000_000,
        end_unix_nano: 1_700_000_000 * 1_000_000_000 + 100 * MS,
        status: StatusCode::Unset,
        attributes: vec![
            kept(sc::sglang::RID, AttrValue::Str("0x1f2e3d".into())),
            kept(
                sc::sglang::BOOTSTRAP_ROOM,
                AttrValue::Str("0x1f2e3d".into()),
            ),
        ],
        links: Vec::new(),
    };
    assert_eq!(detect(&sender), None);
    assert!(extract_requests(&[sender]).is_empty());
}

#[test]
fn rooms_each_server_created_for_one_pd_request_are_one_request() {
    // Behind a gateway that passes only W3C context, the prefill and the decode server each
    // create a room with the same bootstrap_room, under the gateway's span.
    let gateway = SpanId([0x99; 8]);
    let mut spans: Vec<Span> = pd()
        .build()
        .into_iter()
        .filter(|s| s.service.as_str() != "sglang-router")
        .collect();
    let room_span = |id: u8, service: &str, start_ms: u64, end_ms: u64| Span {
        trace_id: support_sglang::TRACE,
        span_id: SpanId([id; 8]),
        parent_span_id: Some(gateway),
        name: "Bootstrap Room 0x5a3c9e01f2".into(),
        service: Text::from(service),
        kind: SpanKind::Internal,
        start_unix_nano: support_sglang::T0 + start_ms * 1_000_000,
        end_unix_nano: support_sglang::T0 + end_ms * 1_000_000,
        status: StatusCode::Unset,
        attributes: vec![kept(
            sc::sglang::BOOTSTRAP_ROOM,
            AttrValue::Str("0x5a3c9e01f2".into()),
        )],
        links: Vec::new(),
    };
    for s in &mut spans {
        if s.span_id == role_id(PREFILL) {
            s.parent_span_id = Some(SpanId([0xa1; 8]));
        } else if s.span_id == role_id(DECODE) {
            s.parent_span_id = Some(SpanId([0xa2; 8]));
        }
    }
    spans.push(room_span(0xa1, "sglang-prefill", 5, 191));
    spans.push(room_span(0xa2, "sglang-decode", 6, 998));
    let r = one(&spans);
    assert_eq!(r.span_id, SpanId([0xa1; 8]));
    assert_close("e2e", Some(r.e2e), 0.993); // 5 → 998 ms
    assert_close("ttft", r.ttft, 0.207); // fake_output ends at 212 ms
    let d = r.disagg.as_deref().unwrap();
    assert_close("kv_transfer", d.kv_transfer, 0.040);
    assert_close("decode_wait", d.decode_wait, 0.010);
    assert!(d.routing.is_none(), "no router in this deployment");
}

#[test]
fn newer_sglang_without_room_spans_is_one_request_per_bootstrap_room() {
    // Newer SGLang (observability/trace.py) creates no room span: each server's role span is a
    // root under the caller's W3C context and carries `bootstrap_room`; cache hits are
    // `gen_ai.usage.cached_tokens`.
    let gateway = SpanId([0x99; 8]);
    let mut spans: Vec<Span> = pd()
        .build()
        .into_iter()
        .filter(|s| s.service.as_str() != "sglang-router")
        .collect();
    for s in &mut spans {
        if s.span_id == role_id(PREFILL) || s.span_id == role_id(DECODE) {
            s.parent_span_id = Some(gateway);
            s.attributes.push(kept(
                sc::sglang::BOOTSTRAP_ROOM,
                AttrValue::Str("0x5a3c9e01f2".into()),
            ));
        }
        if s.span_id == role_id(DECODE) {
            s.attributes
                .retain(|(k, _)| *k != sc::gen_ai::USAGE_CACHE_READ_INPUT_TOKENS);
            s.attributes
                .push(kept(sc::sglang::USAGE_CACHED_TOKENS, AttrValue::Int(384)));
        }
    }
    // A unified request of the same caller, in the same trace: a request of its own.
    let mut unified = plain().build();
    for s in &mut unified {
        s.span_id.0[1] = 0xcc;
        s.parent_span_id = match s.parent_span_id {
            Some(mut p) => {
                p.0[1] = 0xcc;
                Some(p)
            }
            None => None,
        };
    }
    unified.retain(|s| !s.name.starts_with("Bootstrap Room"));
    for s in &mut unified {
        if s.parent_span_id.is_some_and(|p| p.0[0] == 0x10) {
            s.parent_span_id = Some(gateway);
        }
    }
    spans.extend(unified);
    let records = extract_requests(&spans);
    assert_eq!(records.len(), 2, "{records:#?}");
    let r = records
        .iter()
        .find(|r| r.span_id == role_id(DECODE))
        .expect("the decode side stands for the PD request");
    assert!(
        detect(
            spans
                .iter()
                .find(|s| s.span_id == role_id(PREFILL))
                .unwrap()
        )
        .is_none()
    );
    assert_close("e2e", Some(r.e2e), 0.993); // 5 → 998 ms
    assert_close("ttft", r.ttft, 0.207);
    assert_eq!(r.cache_read_input_tokens, Some(384));
    let d = r.disagg.as_deref().unwrap();
    assert_close("prefill", d.prefill, 0.090);
    assert_close("first_token", d.first_token, 0.007);
    let u = records
        .iter()
        .find(|r| r.span_id != role_id(DECODE))
        .unwrap();
    assert_close("unified ttft", u.ttft, 0.080);
    assert!(u.disagg.is_none());
}

#[test]
fn the_room_continues_a_callers_context() {
    // The caller's W3C context came in: the room has a parent outside the trace's spans.
    let mut spans = pd().build();
    let room = spans.iter_mut().find(|s| s.span_id == room_id()).unwrap();
    room.parent_span_id = Some(SpanId([0xee; 8]));
    let r = one(&spans);
    assert_eq!(r.span_id, room_id());
    assert_close("ttft", r.ttft, 0.212);
}

#[test]
fn only_the_room_and_role_spans_are_detected() {
    let t = pd();
    let spans = t.build();
    for s in &spans {
        // The prefill side's role span is not, on its own: it ends long before the decode
        // side, and must not start the grace period that completes the trace.
        let expect =
            s.span_id == room_id() || [ROUTER, DECODE].iter().any(|&i| s.span_id == role_id(i));
        assert_eq!(
            detect(s),
            expect.then_some(Dialect::Sglang),
            "{}",
            s.name.as_str()
        );
    }
    // The slices carry the links SGLang adds (first slice of a thread → where it came from).
    let bootstrap = &spans[t.find(PREFILL, Some(0), st::PREFILL_BOOTSTRAP)];
    assert_eq!(bootstrap.links.len(), 1);
    let prepare = &spans[t.find(DECODE, Some(0), st::DECODE_PREPARE)];
    assert_eq!(prepare.links.len(), 1, "handed over from the tokenizer");
}

/// One output token: no decode step, and a decode of 0 as vLLM and TGI read it (it was
/// `None`, leaving such requests out of the decode percentiles).
#[test]
fn one_token_decodes_in_no_time() {
    let mut t = plain();
    t.slices.retain(|s| s.name != st::DECODE_LOOP);
    t.roles[0]
        .attributes
        .retain(|(k, _)| *k != sc::gen_ai::USAGE_COMPLETION_TOKENS);
    t.roles[0]
        .attributes
        .push(kept(sc::gen_ai::USAGE_COMPLETION_TOKENS, AttrValue::Int(1)));
    let r = one(&t.build());
    assert_eq!(r.output_tokens, Some(1));
    assert_close("ttft", r.ttft, 0.080);
    assert_close("decode", r.decode, 0.0);
    assert_eq!(r.tpot, None, "TPOT needs two tokens");
}

#[test]
fn plain_tree_gives_queue_prefill_ttft_and_decode() {
    let r = one(&plain().build());
    assert_eq!((r.dialect, r.span_id), (Dialect::Sglang, room_id()));
    assert_eq!(r.model.as_str(), "qwen-2.5-7b");
    assert_close("e2e", Some(r.e2e), 0.5);
    assert_close("queue", r.queue, 0.026);
    assert_close("prefill", r.prefill, 0.050);
    assert_close("ttft", r.ttft, 0.080);
    assert_close("decode", r.decode, 0.400);
    assert_close("tpot", r.tpot, 0.020);
    assert_eq!(r.preemptions, Some(0));
    assert!(r.disagg.is_none(), "not disaggregated");
    assert!(r.ttft_breakdown().is_none());
}

#[test]
fn plain_phases_follow_their_slices_on_rank_zero_only() {
    let cases: [(&str, &str, Read); 3] = [
        ("queue", st::PREFILL_WAITING, |r| r.queue),
        ("prefill", st::PREFILL_FORWARD, |r| r.prefill),
        ("ttft", st::PREFILL_FORWARD, |r| r.ttft),
    ];
    let base = one(&plain().build());
    for (name, stage, read) in cases {
        let before = read(&base).unwrap();
        let mut t = plain();
        let i = t.find(0, Some(0), stage);
        t.slices[i].end_us += 7 * MS;
        assert_close(name, read(&one(&t.build())), before + 0.007);
        let mut t = plain();
        let i = t.find(0, Some(1), stage);
        t.slices[i].end_us += 7 * MS;
        assert_close(name, read(&one(&t.build())), before);
    }
    // Decode ends with the last decode step of rank 0.
    let mut t = plain();
    let last = t
        .slices
        .iter()
        .rposition(|s| t.threads[s.thread].tp == Some(0) && s.name == st::DECODE_LOOP)
        .unwrap();
    t.slices[last].end_us += 7 * MS;
    assert_close("decode", one(&t.build()).decode, 0.407);
}

#[test]
fn a_retracted_request_prefills_again_and_counts_a_preemption() {
    let mut t = plain();
    // Rank 0 retracted after a few decode steps and prefilled again.
    let step = t
        .slices
        .iter()
        .position(|s| t.threads[s.thread].tp == Some(0) && s.name == st::DECODE_LOOP)
        .unwrap();
    t.slices[step + 5].name = st::PREFILL_FORWARD;
    let r = one(&t.build());
    assert_eq!(r.preemptions, Some(1));
    assert_close("prefill (the first)", r.prefill, 0.050);
}

#[test]
fn a_tree_without_slices_is_read_from_its_role_span_latencies() {
    // A low trace level: the room and the role span, which carries SGLang's finish attributes.
    let mut t = plain();
    t.threads.clear();
    t.slices.clear();
    t.roles[0].attributes.extend([
        kept(sc::latency::TIME_TO_FIRST_TOKEN, AttrValue::Double(0.08)),
        kept(sc::latency::TIME_IN_MODEL_DECODE, AttrValue::Double(0.4)),
        kept(sc::latency::E2E, AttrValue::Double(0.5)),
    ]);
    let r = one(&t.build());
    assert_eq!(r.span_id, room_id());
    assert_close("ttft", r.ttft, 0.08);
    assert_close("decode", r.decode, 0.4);
    assert_eq!(r.origins.ttft, Some(PhaseOrigin::Measured));
}

#[test]
fn a_role_span_error_is_the_request_outcome() {
    let mut spans = pd().build();
    let decode = spans
        .iter_mut()
        .find(|s| s.span_id == role_id(DECODE))
        .unwrap();
    decode.status = StatusCode::Error;
    assert_eq!(
        one(&spans).outcome,
        infertrace_analysis::record::Outcome::Error
    );
    // An aborted request: newer versions set ERROR on the thread span.
    let mut spans = pd().build();
    assert_eq!(
        one(&spans).outcome,
        infertrace_analysis::record::Outcome::Ok
    );
    let thread = spans
        .iter_mut()
        .find(|s| s.span_id == support_sglang::thread_id(0))
        .unwrap();
    thread.status = StatusCode::Error;
    assert_eq!(
        one(&spans).outcome,
        infertrace_analysis::record::Outcome::Error
    );
}

#[test]
fn two_requests_in_one_trace_are_two_records() {
    // Two rooms under one caller span (e.g. a client trace making two calls).
    let first = plain().build();
    let mut second = plain().build();
    for s in &mut second {
        s.span_id.0[1] = 0xbb;
        if let Some(p) = &mut s.parent_span_id {
            p.0[1] = 0xbb;
        }
    }
    let spans: Vec<Span> = first.into_iter().chain(second).collect();
    assert_eq!(extract_requests(&spans).len(), 2);
}

/// A PD trace whose decode side has `steps` decode steps on each of its two ranks.
fn pd_with_decode_steps(steps: u64) -> Vec<Span> {
    let mut t = pd();
    // The request lasts as long as its steps.
    let end = 1_000 * MS + steps * MS + MS;
    if let Some(room) = t.room.as_mut() {
        room.end_us = end;
    }
    for role in t.roles.iter_mut().filter(|r| r.role != "prefill") {
        role.end_us = end;
    }
    for rank in [0, 1] {
        let th = t
            .threads
            .iter()
            .position(|th| th.role == DECODE && th.tp == Some(rank))
            .unwrap();
        for step in 0..steps {
            let s = 1_000 * MS + step * MS;
            t.slices.push(support_sglang::Slice {
                thread: th,
                name: st::DECODE_LOOP,
                start_us: s,
                end_us: s + MS,
                inside: None,
            });
        }
    }
    t.build()
}

/// CPU time this thread has used (time it spends preempted does not count).
fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn a_level_three_trace_is_read_in_linear_time() {
    // Reading 8× the decode steps must cost about 8× the CPU time (64× if it were quadratic).
    // The thread's own CPU time is compared, the least of five reads of each size, so neither
    // preemption nor one slow read counts; the bound (24×) sits between the two growth rates.
    let least = |spans: &[Span]| {
        (0..5)
            .map(|_| {
                let started = thread_cpu_time();
                let r = one(spans);
                (thread_cpu_time() - started, r)
            })
            .min_by_key(|(took, _)| *took)
            .unwrap()
    };
    let (small, _) = least(&pd_with_decode_steps(1_000));
    let (large, r) = least(&pd_with_decode_steps(8_000));
    assert_close("decode", r.decode, 9.0 - 0.212);
    let growth = large.as_secs_f64() / small.as_secs_f64().max(1e-9);
    assert!(
        growth < 24.0,
        "8× the steps took {growth:.1}× the CPU time ({small:?} → {large:?})"
    );
}

fn llm_request(attrs: Vec<(&'static str, AttrValue)>) -> Span {
    Span {
        trace_id: support_sglang::TRACE,
        span_id: SpanId([9; 8]),
        parent_span_id: None,
        name: "llm_request".into(),
        service: Text::from("trtllm"),
        kind: SpanKind::Server,
        start_unix_nano: support_sglang::T0,
        end_unix_nano: support_sglang::T0 + 1_000_000_000,
        status: StatusCode::Unset,
        attributes: attrs,
        links: Vec::new(),
    }
}

#[test]
fn tensorrt_llm_kv_cache_transfer_time_is_the_kv_transfer_sub_phase() {
    let r = one(&[llm_request(vec![
        kept(sc::latency::TIME_IN_QUEUE, AttrValue::Double(0.01)),
        kept(sc::latency::TIME_TO_FIRST_TOKEN, AttrValue::Double(0.3)),
        kept(sc::latency::E2E, AttrValue::Double(1.0)),
        kept(
            sc::latency::KV_CACHE_TRANSFER_TIME,
            AttrValue::Double(0.045),
        ),
    ])]);
    assert_eq!(r.dialect, Dialect::Vllm);
    assert_close(
        "kv_transfer",
        r.disagg.as_deref().unwrap().kv_transfer,
        0.045,
    );
    assert_close("ttft", r.ttft, 0.3);
    let b = r.ttft_breakdown().unwrap();
    assert_eq!(b.parts, vec![("kv_transfer", 0.045)]);
    // Without the attribute, no sub-phases.
    let r = one(&[llm_request(vec![kept(
        sc::latency::E2E,
        AttrValue::Double(1.0),
    )])]);
    assert!(r.disagg.is_none());
}

#[test]
fn cache_hits_preemptions_and_lora_are_read_from_any_request_span() {
    let r = one(&[llm_request(vec![
        kept(sc::latency::E2E, AttrValue::Double(1.0)),
        kept(
            sc::gen_ai::USAGE_CACHE_READ_INPUT_TOKENS,
            AttrValue::Int(96),
        ),
        kept(sc::infer::PREEMPTIONS, AttrValue::Int(2)),
        kept(sc::infer::LORA_ADAPTER, AttrValue::Str("sql-lora".into())),
    ])]);
    assert_eq!(r.cache_read_input_tokens, Some(96));
    assert_eq!(r.preemptions, Some(2));
    assert_eq!(r.lora_adapter.as_deref(), Some("sql-lora"));
    // Negative counts are not counts.
    let r = one(&[llm_request(vec![kept(
        sc::gen_ai::USAGE_CACHE_READ_INPUT_TOKENS,
        AttrValue::Int(-1),
    )])]);
    assert_eq!(r.cache_read_input_tokens, None);
}

#[test]
fn infertrace_sub_phase_children_fill_the_sub_phases() {
    let base = support_sglang::T0;
    let mk = |id: u8, parent: Option<u8>, name: &str, s_ms: u64, e_ms: u64| Span {
        trace_id: support_sglang::TRACE,
        span_id: SpanId([id; 8]),
        parent_span_id: parent.map(|p| SpanId([p; 8])),
        name: name.into(),
        service: Text::from("decode-worker"),
        kind: if parent.is_none() {
            SpanKind::Server
        } else {
            SpanKind::Internal
        },
        start_unix_nano: base + s_ms * 1_000_000,
        end_unix_nano: base + e_ms * 1_000_000,
        status: StatusCode::Unset,
        attributes: if parent.is_none() {
            vec![kept(sc::infer::OUTCOME, AttrValue::Str("ok".into()))]
        } else {
            vec![kept(sc::infer::PHASE, AttrValue::Str(name.into()))]
        },
        links: Vec::new(),
    };
    let spans = [
        mk(1, None, "chat m", 0, 500),
        mk(2, Some(1), "decode_bootstrap", 0, 20),
        mk(3, Some(1), "kv_transfer", 20, 60),
        mk(4, Some(1), "decode_wait", 60, 70),
        mk(5, Some(1), "prefill", 70, 90),
        mk(6, Some(1), "decode", 90, 500),
        mk(7, Some(1), "unheard_of", 0, 1),
    ];
    let r = one(&spans);
    assert_eq!(r.dialect, Dialect::Infertrace);
    let d = r.disagg.as_deref().expect("sub-phases");
    assert_close("decode_bootstrap", d.decode_bootstrap, 0.020);
    assert_close("kv_transfer", d.kv_transfer, 0.040);
    assert_close("decode_wait", d.decode_wait, 0.010);
    assert_close("prefill", d.prefill, 0.020);
    assert_close("decode", d.decode, 0.410);
    assert!(d.routing.is_none() && d.bootstrap.is_none());
    // Phase children of other names only: no sub-phases.
    let r = one(&[spans[0].clone(), spans[6].clone(), spans[5].clone()]);
    assert!(r.disagg.is_none(), "{:?}", r.disagg);
}

/// infertrace's layer on each role of a PD deployment (router, prefill worker, decode worker as
/// three services), each request span marked with `infer.disagg.role`.
fn layer_pd_trace(with_roles: bool) -> Vec<Span> {
    let base = support_sglang::T0;
    let mk = |id: u8, parent: Option<u8>, service: &str, name: &str, s_ms: u64, e_ms: u64| Span {
        trace_id: support_sglang::TRACE,
        span_id: SpanId([id; 8]),
        parent_span_id: parent.map(|p| SpanId([p; 8])),
        name: name.into(),
        service: Text::from(service),
        kind: SpanKind::Internal,
        start_unix_nano: base + s_ms * 1_000_000,
        end_unix_nano: base + e_ms * 1_000_000,
        status: StatusCode::Unset,
        attributes: vec![kept(sc::infer::PHASE, AttrValue::Str(name.into()))],
        links: Vec::new(),
    };
    let request = |id: u8, parent: Option<u8>, service: &str, role: &str, s_ms, e_ms| {
        let mut s = mk(id, parent, service, "chat m", s_ms, e_ms);
        s.kind = SpanKind::Server;
        s.attributes = vec![
            kept(sc::infer::OUTCOME, AttrValue::Str("ok".into())),
            kept(sc::gen_ai::USAGE_OUTPUT_TOKENS, AttrValue::Int(11)),
        ];
        if with_roles {
            s.attributes
                .push(kept(sc::disagg::ROLE, AttrValue::Str(role.into())));
        }
        s
    };
    vec![
        // Router: its own view (derived: split at the first chunk it forwarded).
        request(1, None, "router", "router", 0, 1000),
        mk(2, Some(1), "router", "routing", 0, 3),
        mk(3, Some(1), "router", "prefill", 3, 250),
        mk(4, Some(1), "router", "decode", 250, 1000),
        // Prefill worker.
        request(10, Some(1), "prefill-0", "prefill", 4, 200),
        mk(11, Some(10), "prefill-0", "queue", 4, 20),
        mk(12, Some(10), "prefill-0", "bootstrap", 20, 30),
        mk(13, Some(10), "prefill-0", "prefill", 30, 150),
        mk(14, Some(10), "prefill-0", "kv_transfer", 150, 190),
        // Decode worker.
        request(20, Some(1), "decode-0", "decode", 5, 998),
        mk(21, Some(20), "decode-0", "decode_bootstrap", 5, 25),
        mk(22, Some(20), "decode-0", "decode_wait", 195, 205),
        mk(23, Some(20), "decode-0", "first_token", 205, 210),
        mk(24, Some(20), "decode-0", "decode", 210, 995),
    ]
}

#[test]
fn the_layer_on_each_pd_role_gives_one_record_with_the_sub_phases() {
    let r = one(&layer_pd_trace(true));
    assert_eq!(
        (r.dialect, r.span_id),
        (Dialect::Infertrace, SpanId([1; 8]))
    );
    assert_eq!(r.service.as_str(), "router");
    assert_close("ttft (the router's)", r.ttft, 0.250);
    assert_close("queue (prefill worker's)", r.queue, 0.016);
    assert_close("prefill (prefill worker's)", r.prefill, 0.120);
    assert_close("decode (decode worker's)", r.decode, 0.785);
    assert_close("tpot", r.tpot, 0.0785);
    let d = r.disagg.as_deref().expect("sub-phases");
    assert_close("routing", d.routing, 0.003);
    assert_close("prefill_queue", d.prefill_queue, 0.016);
    assert_close("bootstrap", d.bootstrap, 0.010);
    assert_close("prefill", d.prefill, 0.120);
    assert_close("kv_transfer", d.kv_transfer, 0.040);
    assert_close("decode_bootstrap", d.decode_bootstrap, 0.020);
    assert_close("decode_wait", d.decode_wait, 0.010);
    assert_close("first_token", d.first_token, 0.005);
    assert_close("decode", d.decode, 0.785);
    assert_eq!(d.prefill_worker.as_deref(), Some("prefill-0"));
    assert_eq!(d.decode_worker.as_deref(), Some("decode-0"));
    let b = r.ttft_breakdown().unwrap();
    // 3 + 10 + 16 + 120 + 40 + 10 + 5 = 204 ms of 250.
    assert_close("unattributed", Some(b.unattributed), 0.046);

    // Without the router's span (client → prefill → decode), the prefill worker stands.
    let spans: Vec<Span> = layer_pd_trace(true)
        .into_iter()
        .filter(|s| s.service.as_str() != "router")
        .map(|mut s| {
            if s.span_id == SpanId([20; 8]) {
                s.parent_span_id = Some(SpanId([10; 8]));
            }
            s
        })
        .collect();
    let r = one(&spans);
    assert_eq!(r.span_id, SpanId([10; 8]));
    assert_close("ttft (the decode worker's first token)", r.ttft, 0.206);
    // The request goes on at the decode worker after the prefill worker's span ends.
    assert_close("e2e (to the decode worker's end)", Some(r.e2e), 0.994);
    assert_close("decode", r.disagg.as_deref().unwrap().decode, 0.785);

    // Without the role attribute: one record per service, as before.
    assert_eq!(extract_requests(&layer_pd_trace(false)).len(), 3);
}
