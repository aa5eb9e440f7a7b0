//! A disaggregated request whose router, prefill and decode workers each run behind the layer
//! (`infer.disagg.role`), read into one record: retried workers, requests the router sends to
//! a unified worker, tokens only the workers count. Timings in ms, computed by hand.

use infertrace_analysis::dialect::extract_requests;
use infertrace_analysis::record::RequestRecord;
use infertrace_analysis::text::Text;
use infertrace_analysis::trace::{AttrValue, Span, SpanId, SpanKind, StatusCode, TraceId};
use infertrace_semconv as sc;

const T0: u64 = 1_700_000_000_000_000_000;

/// Builds one trace's spans, ids in order of creation.
#[derive(Default)]
struct Trace {
    spans: Vec<Span>,
}

impl Trace {
    /// A span of `service` from `start` to `end` ms; returns its id.
    fn span(
        &mut self,
        service: &str,
        name: &str,
        parent: Option<SpanId>,
        at: (f64, f64),
    ) -> SpanId {
        let id = SpanId([self.spans.len() as u8 + 1; 8]);
        let ns = |ms: f64| T0 + (ms * 1e6).round() as u64;
        self.spans.push(Span {
            trace_id: TraceId([7; 16]),
            span_id: id,
            parent_span_id: parent,
            name: name.into(),
            service: Text::from(service),
            kind: if parent.is_none() {
                SpanKind::Server
            } else {
                SpanKind::Internal
            },
            start_unix_nano: ns(at.0),
            end_unix_nano: ns(at.1),
            status: StatusCode::Unset,
            attributes: Vec::new(),
            links: Vec::new(),
        });
        id
    }

    /// An infertrace request span of `role` (`None`: a unified worker).
    fn request(
        &mut self,
        service: &str,
        role: Option<&str>,
        parent: Option<SpanId>,
        at: (f64, f64),
        outcome: &str,
        tokens: Option<(i64, i64)>,
    ) -> SpanId {
        let id = self.span(service, "chat m", parent, at);
        let s = self.spans.last_mut().expect("just pushed");
        s.attributes
            .push((sc::gen_ai::REQUEST_MODEL, AttrValue::Str("m".into())));
        s.attributes
            .push((sc::infer::OUTCOME, AttrValue::Str(outcome.into())));
        if let Some(role) = role {
            s.attributes
                .push((sc::disagg::ROLE, AttrValue::Str(role.into())));
        }
        if let Some((input, output)) = tokens {
            s.attributes
                .push((sc::gen_ai::USAGE_INPUT_TOKENS, AttrValue::Int(input)));
            s.attributes
                .push((sc::gen_ai::USAGE_OUTPUT_TOKENS, AttrValue::Int(output)));
        }
        id
    }

    fn phase(&mut self, service: &str, phase: &str, parent: SpanId, at: (f64, f64)) {
        self.span(service, phase, Some(parent), at);
        let s = self.spans.last_mut().expect("just pushed");
        s.attributes
            .push((sc::infer::PHASE, AttrValue::Str(phase.into())));
    }

    fn record(&self) -> RequestRecord {
        let mut records = extract_requests(&self.spans);
        assert_eq!(records.len(), 1, "{records:#?}");
        records.remove(0)
    }
}

fn ms(v: Option<f64>) -> f64 {
    (v.expect("a value") * 1e3 * 1e6).round() / 1e6
}

/// The router (0–1001, routing 0–2, first token to the client at 65) with its phase children.
fn router(t: &mut Trace, tokens: Option<(i64, i64)>) -> SpanId {
    let r = t.request("router", Some("router"), None, (0.0, 1001.0), "ok", tokens);
    t.phase("router", "routing", r, (0.0, 2.0));
    t.phase("router", "prefill", r, (2.0, 65.0));
    t.phase("router", "decode", r, (65.0, 1001.0));
    r
}

/// The prefill worker `prefill-0` (2.5–1000.5: prefill 5.5–45.5, then its KV transfer `kv`
/// when given).
fn prefill_worker(
    t: &mut Trace,
    parent: SpanId,
    kv: Option<(f64, f64)>,
    tokens: Option<(i64, i64)>,
) -> SpanId {
    let p = t.request(
        "prefill-0",
        Some("prefill"),
        Some(parent),
        (2.5, 1000.5),
        "ok",
        tokens,
    );
    t.phase("prefill-0", "prefill", p, (5.5, 45.5));
    if let Some(kv) = kv {
        t.phase("prefill-0", "kv_transfer", p, kv);
    }
    p
}

/// A decode worker (53–1000: decode wait 3, first token 8, decode 936).
fn decode_worker(t: &mut Trace, name: &str, parent: SpanId, tokens: Option<(i64, i64)>) {
    let d = t.request(
        name,
        Some("decode"),
        Some(parent),
        (53.0, 1000.0),
        "ok",
        tokens,
    );
    t.phase(name, "decode_wait", d, (53.0, 56.0));
    t.phase(name, "first_token", d, (56.0, 64.0));
    t.phase(name, "decode", d, (64.0, 1000.0));
}

#[test]
fn a_retried_prefill_is_read_from_the_attempt_that_served_the_request() {
    let mut t = Trace::default();
    let r = router(&mut t, Some((400, 101)));
    // The first attempt fails after 3 ms queued and 10 ms of prefill.
    let failed = t.request(
        "prefill-0",
        Some("prefill"),
        Some(r),
        (2.5, 16.0),
        "error",
        None,
    );
    t.phase("prefill-0", "queue", failed, (2.5, 5.5));
    t.phase("prefill-0", "prefill", failed, (5.5, 15.5));
    // The retry on another worker serves it: queue 3, prefill 40, bootstrap 2, transfer 5.
    let p = t.request(
        "prefill-1",
        Some("prefill"),
        Some(r),
        (16.0, 1000.5),
        "ok",
        None,
    );
    t.phase("prefill-1", "queue", p, (16.0, 19.0));
    t.phase("prefill-1", "prefill", p, (19.0, 59.0));
    t.phase("prefill-1", "bootstrap", p, (59.0, 61.0));
    t.phase("prefill-1", "kv_transfer", p, (61.0, 66.0));
    decode_worker(&mut t, "decode-0", p, None);
    let rec = t.record();
    let d = rec.disagg.as_deref().expect("disaggregated");
    assert_eq!(d.prefill_worker.as_deref(), Some("prefill-1"));
    assert_eq!(ms(d.prefill), 40.0);
    assert_eq!(ms(d.prefill_queue), 3.0);
    assert_eq!(ms(d.kv_transfer), 5.0);
    assert_eq!(ms(rec.prefill), 40.0);
    assert_eq!(ms(rec.ttft), 65.0, "the router's, the client's view");
}

#[test]
fn a_retried_decode_is_read_from_the_attempt_that_served_the_request() {
    let mut t = Trace::default();
    let r = router(&mut t, Some((400, 101)));
    let p = prefill_worker(&mut t, r, None, None);
    let failed = t.request(
        "decode-0",
        Some("decode"),
        Some(p),
        (46.0, 52.0),
        "error",
        None,
    );
    t.phase("decode-0", "decode_wait", failed, (46.0, 53.0));
    decode_worker(&mut t, "decode-1", p, None);
    let rec = t.record();
    let d = rec.disagg.as_deref().expect("disaggregated");
    assert_eq!(d.decode_worker.as_deref(), Some("decode-1"));
    assert_eq!(ms(d.decode_wait), 3.0);
    assert_eq!(ms(d.decode), 936.0);
    assert_eq!(ms(rec.tpot), 9.36);
}

#[test]
fn a_request_routed_to_a_unified_worker_is_not_disaggregated() {
    let mut t = Trace::default();
    let r = router(&mut t, Some((400, 101)));
    let w = t.request("unified-0", None, Some(r), (2.5, 1000.0), "ok", None);
    t.phase("unified-0", "prefill", w, (2.5, 64.0));
    t.phase("unified-0", "decode", w, (64.0, 1000.0));
    let mut records = extract_requests(&t.spans);
    records.sort_by(|a, b| a.service.cmp(&b.service));
    assert_eq!(
        records.len(),
        2,
        "one per service, as without a router role"
    );
    assert!(records.iter().all(|r| r.disagg.is_none()), "{records:#?}");
}

#[test]
fn tokens_only_the_workers_count_give_tpot_and_the_transfer_rate() {
    let mut t = Trace::default();
    let r = router(&mut t, None);
    let p = prefill_worker(&mut t, r, Some((47.5, 52.5)), Some((400, 1)));
    decode_worker(&mut t, "decode-0", p, Some((400, 101)));
    let rec = t.record();
    assert_eq!(rec.input_tokens, Some(400));
    assert_eq!(rec.output_tokens, Some(101), "the decode worker's count");
    assert_eq!(ms(rec.tpot), 9.36, "936 ms over 100 tokens after the first");
}

/// The prefill side's transfer span runs on past the moment the decode worker went on (it
/// waits for an acknowledgement): only the part before counts toward TTFT.
#[test]
fn a_transfer_overlapping_the_decode_side_counts_until_the_decode_side_went_on() {
    let mut t = Trace::default();
    let r = router(&mut t, Some((400, 101)));
    let p = prefill_worker(&mut t, r, Some((47.5, 80.0)), None);
    decode_worker(&mut t, "decode-0", p, None);
    let d = t.record().disagg.expect("disaggregated");
    assert_eq!(
        ms(d.kv_transfer),
        5.5,
        "47.5 → 53, where decode_wait starts"
    );
}
