//! The critical path against hand-built traces and, as a property over random trees, against a
//! direct (recursive, quadratic) transcription of docs/reference.md#critical-path.

use infertrace_analysis::text::Text;

use infertrace_analysis::critical_path::{
    Adjustment, CriticalPath, CriticalPathOptions, critical_path,
};
use infertrace_analysis::trace::{Span, SpanId, SpanKind, SpanLink, StatusCode, TraceId};
use proptest::prelude::*;

const TRACE: TraceId = TraceId([7; 16]);

fn id(n: u32) -> SpanId {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&(n + 1).to_be_bytes());
    SpanId(b)
}

fn span(n: u32, parent: Option<u32>, name: &str, start: u64, end: u64) -> Span {
    Span {
        trace_id: TRACE,
        span_id: id(n),
        parent_span_id: parent.map(id),
        name: name.into(),
        service: Text::from("llm"),
        kind: SpanKind::Internal,
        start_unix_nano: start,
        end_unix_nano: end,
        status: StatusCode::Unset,
        attributes: vec![],
        links: vec![],
    }
}

fn with_service(mut s: Span, service: &str) -> Span {
    s.service = Text::from(service);
    s
}

fn with_kind(mut s: Span, kind: SpanKind) -> Span {
    s.kind = kind;
    s
}

fn path(spans: &[Span], opts: CriticalPathOptions) -> CriticalPath {
    critical_path(spans, id(0), &opts).expect("root present")
}

/// `(name, start, end)` of each segment.
fn pieces(p: &CriticalPath) -> Vec<(&str, u64, u64)> {
    p.segments
        .iter()
        .map(|s| (s.name.as_str(), s.start_unix_nano, s.end_unix_nano))
        .collect()
}

fn assert_tiles(p: &CriticalPath, start: u64, end: u64) {
    let mut t = start;
    for s in &p.segments {
        assert_eq!(
            s.start_unix_nano, t,
            "gap or overlap at {t}: {:?}",
            p.segments
        );
        assert!(s.end_unix_nano > s.start_unix_nano, "empty segment {s:?}");
        t = s.end_unix_nano;
    }
    assert_eq!(t, end, "segments do not reach the end");
}

#[test]
fn sequential_children_with_gaps() {
    let spans = [
        span(0, None, "req", 0, 100),
        span(1, Some(0), "a", 10, 30),
        span(2, Some(0), "b", 30, 60),
        span(3, Some(0), "c", 70, 90),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [
            ("req", 0, 10),
            ("a", 10, 30),
            ("b", 30, 60),
            ("req", 60, 70),
            ("c", 70, 90),
            ("req", 90, 100),
        ]
    );
    assert_eq!(p.trace_id, TRACE);
    assert_eq!(p.root, id(0));
    assert!(p.adjustments.is_empty());
    assert_eq!(p.total_nanos(), 100);
}

#[test]
fn parallel_children_only_the_last_to_finish_counts() {
    let spans = [
        span(0, None, "req", 0, 100),
        span(1, Some(0), "a", 0, 80),
        span(2, Some(0), "b", 0, 60),
        span(3, Some(0), "c", 10, 90),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    // a and b end after c starts: neither ends at or before 10.
    assert_eq!(
        pieces(&p),
        [("req", 0, 10), ("c", 10, 90), ("req", 90, 100)]
    );
}

#[test]
fn parallel_fan_out_then_join() {
    // Two parallel workers, then a merge step: the longer worker is on the path.
    let spans = [
        span(0, None, "req", 0, 100),
        span(1, Some(0), "w1", 5, 40),
        span(2, Some(0), "w2", 5, 70),
        span(3, Some(0), "merge", 70, 95),
        span(4, Some(2), "w2.io", 20, 60),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [
            ("req", 0, 5),
            ("w2", 5, 20),
            ("w2.io", 20, 60),
            ("w2", 60, 70),
            ("merge", 70, 95),
            ("req", 95, 100),
        ]
    );
}

#[test]
fn links_and_producer_consumer_children_never_block() {
    let mut linked = span(5, None, "batch", 10, 95);
    linked.links.push(SpanLink {
        trace_id: TRACE,
        span_id: id(0),
    });
    let spans = [
        span(0, None, "req", 0, 100),
        with_kind(span(1, Some(0), "enqueue", 10, 20), SpanKind::Producer),
        // The consumer (and its own child) would otherwise own [30, 99].
        with_kind(span(2, Some(1), "process", 15, 99), SpanKind::Consumer),
        span(3, Some(2), "work", 30, 99),
        // A span that only links to the request is not its child.
        linked,
        // A CONSUMER under a non-producer parent is an ordinary child.
        with_kind(span(4, Some(0), "poll", 40, 60), SpanKind::Consumer),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [
            ("req", 0, 10),
            ("enqueue", 10, 20),
            ("req", 20, 40),
            ("poll", 40, 60),
            ("req", 60, 100),
        ]
    );
}

#[test]
fn async_child_outliving_its_parent_is_clipped() {
    // A fire-and-forget child that ends after the request: clipped at the request's end.
    let spans = [
        span(0, None, "req", 0, 100),
        span(1, Some(0), "log", 50, 200),
        span(2, Some(1), "flush", 90, 180),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [("req", 0, 50), ("log", 50, 90), ("flush", 90, 100)]
    );
}

#[test]
fn overflowing_children_are_clipped_or_dropped_top_down() {
    let spans = [
        span(0, None, "req", 100, 200),
        // Starts before, ends inside: becomes [100, 130].
        span(1, Some(0), "early", 50, 130),
        // Its child lies entirely before the clipped parent window: dropped.
        span(2, Some(1), "early.child", 60, 100),
        // Its child overlapping the window is clipped against [100, 130].
        span(3, Some(1), "early.child2", 90, 120),
        // Ends before the parent starts: dropped.
        span(4, Some(0), "before", 10, 100),
        // Starts at the parent's end: dropped.
        span(5, Some(0), "after", 200, 300),
        // Starts inside, ends after: clipped to 200; its child starting after 200 dropped.
        span(6, Some(0), "late", 150, 250),
        span(7, Some(6), "late.child", 200, 240),
        span(8, Some(6), "late.child2", 160, 170),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [
            ("early.child2", 100, 120),
            ("early", 120, 130),
            ("req", 130, 150),
            ("late", 150, 160),
            ("late.child2", 160, 170),
            ("late", 170, 200),
        ]
    );
}

#[test]
fn back_to_back_phases_leave_no_request_self_time() {
    // Prefill ends exactly when decode starts, queue exactly when prefill starts. With the
    // Jaeger UI's strict "before" the request would own [20, 50] and [0, 20]; at-or-before
    // gives every nanosecond to the phases.
    let spans = [
        span(0, None, "chat m", 0, 100),
        span(1, Some(0), "queue", 0, 20),
        span(2, Some(0), "prefill", 20, 50),
        span(3, Some(0), "decode", 50, 100),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [("queue", 0, 20), ("prefill", 20, 50), ("decode", 50, 100)]
    );
}

#[test]
fn infertrace_request_shape() {
    // request → queue / prefill / decode with the wire-side edges outside the engine.
    let s = 1_000_000_000u64;
    let t0 = 1_780_000_000 * s;
    let spans = [
        span(0, None, "chat llama-3.1-8b", t0, t0 + 2 * s),
        span(1, Some(0), "queue", t0 + 1_000_000, t0 + 300_000_000),
        span(2, Some(0), "prefill", t0 + 300_000_000, t0 + 450_000_000),
        span(3, Some(0), "decode", t0 + 450_000_000, t0 + 1_990_000_000),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [
            ("chat llama-3.1-8b", t0, t0 + 1_000_000),
            ("queue", t0 + 1_000_000, t0 + 300_000_000),
            ("prefill", t0 + 300_000_000, t0 + 450_000_000),
            ("decode", t0 + 450_000_000, t0 + 1_990_000_000),
            ("chat llama-3.1-8b", t0 + 1_990_000_000, t0 + 2 * s),
        ]
    );
    assert_eq!(p.segments[1].span_id, id(1));
    assert_eq!(&*p.segments[1].service, "llm");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["segments"][2]["name"], "prefill");
    assert_eq!(json["segments"][2]["span_id"], id(2).to_hex());
    assert_eq!(json["segments"][2]["start_unix_nano"], t0 + 300_000_000);
}

#[test]
fn ties_go_to_the_first_child_in_start_order_then_arrival() {
    let spans = [
        span(0, None, "req", 0, 100),
        // Arrives first but starts later: second in child order.
        span(1, Some(0), "later", 50, 90),
        span(2, Some(0), "earlier", 40, 90),
        // Same start and end as `earlier`, arrives after it.
        span(3, Some(0), "twin", 40, 90),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [("req", 0, 40), ("earlier", 40, 90), ("req", 90, 100)]
    );
}

#[test]
fn zero_length_children_are_taken_once_and_not_emitted() {
    let spans = [
        span(0, None, "req", 0, 100),
        span(1, Some(0), "a", 0, 50),
        span(2, Some(0), "mark", 50, 50),
        span(3, Some(0), "mark2", 50, 50),
        span(4, Some(0), "b", 50, 100),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(pieces(&p), [("a", 0, 50), ("b", 50, 100)]);
}

#[test]
fn skewed_siblings_with_and_without_tolerance() {
    // `load` ends 5 ns after `run` starts: clock skew between two hosts.
    let spans = [
        span(0, None, "req", 0, 1000),
        span(1, Some(0), "load", 0, 505),
        span(2, Some(0), "run", 500, 1000),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(pieces(&p), [("req", 0, 500), ("run", 500, 1000)]);
    assert!(p.adjustments.is_empty());

    let opts = CriticalPathOptions {
        skew_tolerance: true,
        ..CriticalPathOptions::default()
    };
    let p = path(&spans, opts);
    assert_eq!(pieces(&p), [("load", 0, 500), ("run", 500, 1000)]);
    assert_eq!(
        p.adjustments,
        [Adjustment::SkewTolerated {
            span_id: id(1),
            overlap_nanos: 5
        }]
    );

    // Beyond 1% of the parent (10 ns here) the overlap is real parallelism.
    let spans = [
        span(0, None, "req", 0, 1000),
        span(1, Some(0), "load", 0, 511),
        span(2, Some(0), "run", 500, 1000),
    ];
    let p = path(&spans, opts);
    assert_eq!(pieces(&p), [("req", 0, 500), ("run", 500, 1000)]);
    assert!(p.adjustments.is_empty());
}

#[test]
fn remote_child_shift_recentres_a_skewed_subtree() {
    let spans = [
        with_service(span(0, None, "gateway", 100, 200), "gw"),
        // Its clock runs 80 ns behind: it appears before its parent.
        with_service(span(1, Some(0), "engine", 50, 90), "llm"),
        with_service(span(2, Some(1), "engine.step", 60, 80), "llm"),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(pieces(&p), [("gateway", 100, 200)]);

    let opts = CriticalPathOptions {
        shift_remote_children: true,
        ..CriticalPathOptions::default()
    };
    let p = path(&spans, opts);
    // Centred: parentStart + (100 − 40)/2 − 50 = +80, the step moves with it.
    assert_eq!(
        pieces(&p),
        [
            ("gateway", 100, 130),
            ("engine", 130, 140),
            ("engine.step", 140, 160),
            ("engine", 160, 170),
            ("gateway", 170, 200),
        ]
    );
    assert_eq!(
        p.adjustments,
        [Adjustment::RemoteChildShifted {
            span_id: id(1),
            delta_nanos: 80
        }]
    );
    // A same-service child that does not fit is never shifted.
    let spans = [
        span(0, None, "req", 100, 200),
        span(1, Some(0), "x", 50, 90),
    ];
    assert!(path(&spans, opts).adjustments.is_empty());
}

#[test]
fn deep_chain_of_100000_spans_does_not_overflow_the_stack() {
    const N: u32 = 100_000;
    let spans: Vec<Span> = (0..N)
        .map(|i| {
            let i64_ = u64::from(i);
            span(i, i.checked_sub(1), "hop", i64_, 2 * u64::from(N) - i64_)
        })
        .collect();
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(p.segments.len(), 2 * N as usize - 1);
    assert_tiles(&p, 0, 2 * u64::from(N));
    // The deepest span owns the middle.
    let mid = &p.segments[N as usize - 1];
    assert_eq!(mid.span_id, id(N - 1));
    assert_eq!(
        (mid.start_unix_nano, mid.end_unix_nano),
        (u64::from(N) - 1, u64::from(N) + 1)
    );
}

#[test]
fn analysing_a_subtree_and_missing_roots() {
    // The analysed span has a parent; a parent cycle through it is not followed.
    let spans = [
        span(0, Some(1), "inner", 10, 20),
        span(1, Some(0), "outer", 0, 15),
        span(2, Some(0), "leaf", 12, 18),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [("inner", 10, 12), ("leaf", 12, 18), ("inner", 18, 20)]
    );
    assert!(critical_path(&spans, id(99), &CriticalPathOptions::default()).is_none());
    // A zero-length root has an empty path.
    let spans = [span(0, None, "req", 5, 5), span(1, Some(0), "x", 5, 5)];
    assert!(
        path(&spans, CriticalPathOptions::default())
            .segments
            .is_empty()
    );
    // An end before the start is a zero-length span.
    let spans = [span(0, None, "req", 9, 5)];
    assert!(
        path(&spans, CriticalPathOptions::default())
            .segments
            .is_empty()
    );
}

#[test]
fn spans_of_other_traces_and_duplicate_ids_are_ignored() {
    let mut foreign = span(1, Some(0), "foreign", 10, 90);
    foreign.trace_id = TraceId([9; 16]);
    let spans = [
        span(0, None, "req", 0, 100),
        foreign,
        span(2, Some(0), "mine", 20, 30),
        // Duplicate of the request: ignored (its child too, since it hangs under the first).
        span(0, None, "dup", 0, 1000),
    ];
    let p = path(&spans, CriticalPathOptions::default());
    assert_eq!(
        pieces(&p),
        [("req", 0, 20), ("mine", 20, 30), ("req", 30, 100)]
    );
}

// ---------------------------------------------------------------------------------------------
// docs/reference.md#critical-path transcribed, recursive and quadratic, for the property tests.

struct Reference<'a> {
    spans: &'a [Span],
    out: Vec<(usize, u64, u64)>,
}

impl Reference<'_> {
    fn children(&self, p: usize, root: usize) -> Vec<usize> {
        let mut c: Vec<usize> = (0..self.spans.len())
            .filter(|&i| {
                let s = &self.spans[i];
                i != root
                    && s.parent_span_id == Some(self.spans[p].span_id)
                    && !(s.kind == SpanKind::Consumer && self.spans[p].kind == SpanKind::Producer)
            })
            .collect();
        c.sort_by_key(|&i| self.spans[i].start_unix_nano);
        c
    }

    fn clip(&self, i: usize, ps: u64, pe: u64) -> Option<(u64, u64)> {
        let s = self.spans[i].start_unix_nano;
        let e = self.spans[i].end_unix_nano.max(s);
        if s >= ps {
            if s >= pe { None } else { Some((s, e.min(pe))) }
        } else if e <= ps {
            None
        } else {
            Some((ps, e.min(pe)))
        }
    }

    fn walk(&mut self, node: usize, root: usize, start: u64, end: u64, mut upper: u64) {
        let kids: Vec<(usize, u64, u64)> = self
            .children(node, root)
            .into_iter()
            .filter_map(|c| self.clip(c, start, end).map(|(s, e)| (c, s, e)))
            .collect();
        let mut taken = vec![false; kids.len()];
        loop {
            let mut best: Option<usize> = None;
            for (k, &(_, _, e)) in kids.iter().enumerate() {
                if taken[k] || e > upper {
                    continue;
                }
                if best.is_none_or(|b| e > kids[b].2) {
                    best = Some(k);
                }
            }
            match best {
                Some(k) => {
                    taken[k] = true;
                    let (c, cs, ce) = kids[k];
                    self.out.push((node, ce, upper));
                    self.walk(c, root, cs, ce, ce);
                    upper = cs;
                }
                None => {
                    self.out.push((node, start, upper));
                    return;
                }
            }
        }
    }
}

fn reference(spans: &[Span], root: usize) -> Vec<(SpanId, u64, u64)> {
    let mut r = Reference { spans, out: vec![] };
    let s = spans[root].start_unix_nano;
    let e = spans[root].end_unix_nano.max(s);
    r.walk(root, root, s, e, e);
    let mut merged: Vec<(SpanId, u64, u64)> = vec![];
    for &(i, a, b) in r.out.iter().rev() {
        if a >= b {
            continue;
        }
        let id = spans[i].span_id;
        match merged.last_mut() {
            Some(last) if last.0 == id && last.2 == a => last.2 = b,
            _ => merged.push((id, a, b)),
        }
    }
    merged
}

/// Random trees: span `i > 0` hangs under a span created before it, times on a small grid (so
/// ties, zero-length spans and overflowing children are frequent), arrival order shuffled.
/// `scale` multiplies the grid and adds jitter below half a grid step, so that with a scale of
/// 1,000 the 1% skew tolerance (400 ns of the 40,000 ns request) meets real small overlaps.
fn random_trace_scaled(scale: u64) -> impl Strategy<Value = Vec<Span>> {
    (1usize..40)
        .prop_flat_map(|n| {
            proptest::collection::vec(
                (
                    0u32..1000,
                    0u64..40,
                    0u64..40,
                    0u8..6,
                    0u8..3,
                    0u64..1000,
                    0u64..1000,
                ),
                n,
            )
        })
        .prop_flat_map(move |raw| {
            let jitter = |j: u64| if scale > 1 { j * scale / 2000 } else { 0 };
            let spans: Vec<Span> = raw
                .iter()
                .enumerate()
                .map(|(i, &(p, a, b, kind, svc, ja, jb))| {
                    let i = i as u32;
                    let parent = (i > 0).then(|| p % i);
                    let (start, end) = if i == 0 {
                        (0, 40 * scale)
                    } else {
                        let start = a * scale + jitter(ja);
                        (start, start + b * scale + jitter(jb))
                    };
                    let mut s = span(i, parent, "s", start, end);
                    s.name = format!("s{i}").into();
                    s.kind = match kind {
                        0 => SpanKind::Producer,
                        1 => SpanKind::Consumer,
                        _ => SpanKind::Internal,
                    };
                    s.service = Text::from(["a", "b", "c"][svc as usize]);
                    s
                })
                .collect();
            Just(spans).prop_shuffle()
        })
}

fn random_trace() -> impl Strategy<Value = Vec<Span>> {
    random_trace_scaled(1)
}

fn triples(p: &CriticalPath) -> Vec<(SpanId, u64, u64)> {
    p.segments
        .iter()
        .map(|s| (s.span_id, s.start_unix_nano, s.end_unix_nano))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn matches_the_reference_and_tiles_the_request(spans in random_trace()) {
        let p = path(&spans, CriticalPathOptions::default());
        assert_tiles(&p, 0, 40);
        let root = spans.iter().position(|s| s.span_id == id(0)).unwrap();
        prop_assert_eq!(triples(&p), reference(&spans, root));
        prop_assert!(p.adjustments.is_empty());
    }

    #[test]
    fn options_tile_the_request_and_change_nothing_unreported(
        spans in random_trace_scaled(1000),
        skew in any::<bool>(),
        shift in any::<bool>(),
    ) {
        let opts = CriticalPathOptions { skew_tolerance: skew, shift_remote_children: shift };
        let p = path(&spans, opts);
        assert_tiles(&p, 0, 40_000);
        let plain = path(&spans, CriticalPathOptions::default());
        assert_tiles(&plain, 0, 40_000);
        prop_assert_eq!(triples(&plain), reference(&spans, spans.iter().position(|s| s.span_id == id(0)).unwrap()));
        // An option that reports no adjustment left the path exactly as the default.
        if p.adjustments.is_empty() {
            prop_assert_eq!(triples(&p), triples(&plain));
        }
        for a in &p.adjustments {
            match a {
                Adjustment::SkewTolerated { overlap_nanos, .. } => {
                    prop_assert!(skew);
                    prop_assert!(*overlap_nanos > 0);
                }
                Adjustment::RemoteChildShifted { delta_nanos, .. } => {
                    prop_assert!(shift);
                    prop_assert!(*delta_nanos != 0);
                }
            }
        }
    }

    #[test]
    fn any_span_of_a_random_tree_can_be_analysed(spans in random_trace(), pick in 0usize..40) {
        let target = &spans[pick % spans.len()];
        let p = critical_path(&spans, target.span_id, &CriticalPathOptions::default()).unwrap();
        let end = target.end_unix_nano.max(target.start_unix_nano);
        assert_tiles(&p, target.start_unix_nano, end);
        prop_assert_eq!(triples(&p), reference(&spans, pick % spans.len()));
    }
}

// ---------------------------------------------------------------------------------------------
// Aggregation: paths of many requests into windows, against sums computed from the inputs.

#[test]
fn windows_aggregate_request_paths_against_ground_truth() {
    use infertrace_analysis::critical_path::CriticalPathWindows;
    use std::time::Duration;

    let ms = 1_000_000u64;
    let t0 = 1_780_000_000 * 1_000_000_000u64;
    let mut windows = CriticalPathWindows::default();
    // 200 requests: queue q, prefill p, decode d, 1 ms of request self-time at each end. The
    // 180 fast ones all take 402 ms, the 20 slow ones 2,502 ms (2 s of queue), phases varying:
    // so the p90 (rank 180) is a fast request and its tail is everyone, the p99 (rank 198) a
    // slow one and its tail exactly the 20 slow requests.
    let mut truth_all = [0u64; 4]; // queue, prefill, decode, request self
    let mut truth_tail = [0u64; 4];
    let mut e2e_all = 0u64;
    let mut e2e_tail = 0u64;
    for i in 0..200u64 {
        let slow = i >= 180;
        let q = if slow { 2000 * ms } else { (5 + i % 7) * ms };
        let p = (40 + i % 11) * ms;
        let d = if slow { 500 * ms - p } else { 400 * ms - q - p };
        let start = t0 + i * 100 * ms;
        let end = start + ms + q + p + d + ms;
        let spans = [
            span(0, None, "chat m", start, end),
            span(1, Some(0), "queue", start + ms, start + ms + q),
            span(2, Some(0), "prefill", start + ms + q, start + ms + q + p),
            span(3, Some(0), "decode", start + ms + q + p, end - ms),
        ];
        let path = path(&spans, CriticalPathOptions::default());
        assert_tiles(&path, start, end);
        let e2e = end - start;
        windows.record(&path, e2e as f64 / 1e9, end);
        for (k, v) in [q, p, d, 2 * ms].into_iter().enumerate() {
            truth_all[k] += v;
            if slow {
                truth_tail[k] += v;
            }
        }
        e2e_all += e2e;
        if slow {
            e2e_tail += e2e;
        }
    }
    let now = t0 + 200 * 100 * ms + 3 * 1_000_000_000;
    let summary = windows.snapshot(Duration::from_secs(300), now);
    assert_eq!(summary.requests, 200);
    assert_eq!(summary.tail_requests.p90, 200.0);
    assert_eq!(summary.tail_requests.p99, 20.0);
    assert!((summary.e2e_seconds.p99 - 20.0 * 2.502).abs() < 1e-9);
    for (k, name) in ["queue", "prefill", "decode", "chat m"].iter().enumerate() {
        let e = summary
            .entries
            .iter()
            .find(|e| &*e.span == *name)
            .unwrap_or_else(|| panic!("{name}"));
        assert!(
            (e.seconds.all - truth_all[k] as f64 / 1e9).abs() < 1e-6,
            "{name}"
        );
        assert!(
            (e.seconds.p90 - truth_all[k] as f64 / 1e9).abs() < 1e-6,
            "{name}"
        );
        assert!(
            (e.seconds.p99 - truth_tail[k] as f64 / 1e9).abs() < 1e-6,
            "{name}"
        );
        assert!(
            (e.share.all - truth_all[k] as f64 / e2e_all as f64).abs() < 1e-9,
            "{name}"
        );
        assert!(
            (e.share.p99 - truth_tail[k] as f64 / e2e_tail as f64).abs() < 1e-9,
            "{name}"
        );
    }
    // The slow requests are queue-bound on the critical path.
    assert_eq!(
        summary
            .entries
            .iter()
            .max_by(|a, b| a.share.p99.total_cmp(&b.share.p99))
            .map(|e| &*e.span),
        Some("queue")
    );
    // Cumulative totals match too.
    let total: f64 = windows.totals().map(|t| t.seconds).sum();
    assert!((total - e2e_all as f64 / 1e9).abs() < 1e-6);
    let json = serde_json::to_value(&summary).unwrap();
    assert_eq!(json["window_seconds"], 300.0);
    assert!(json["entries"][0]["seconds"]["p90"].is_number());
    assert!(json["entries"][0]["share"]["all"].is_number());
    assert_eq!(json["entries"][0]["service"], "llm");
}
