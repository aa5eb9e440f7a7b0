//! The memory limiter reserves `json_decode_bound(body)` before an OTLP/JSON body is decoded:
//! this binary counts every allocation (one test only, so nothing else allocates meanwhile) and
//! checks that decoding bodies of every shape stays under that bound — empty spans, spans full of
//! attributes, deep key-value lists (past the parser's limit: cut out), spans with ids that
//! are not hex (cut out), scopes and resources that cannot be read (cut out), spans rewritten to
//! be read (nulls, enum names, NaN), long strings, and the decoded spans kept at the end.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use infertrace_collector::otlp_decode::{decode_json, json_decode_bound};

/// The system allocator, counting the bytes held now and the most held since the last reset.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged to the system allocator.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(held, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated at the peak of decoding `body` (the decoded spans included), above what was
/// held before.
fn decode_peak(body: &[u8]) -> usize {
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let decoded = decode_json(body);
    let peak = PEAK.load(Ordering::Relaxed);
    drop(decoded);
    peak - before
}

fn spans_body(spans: &[String]) -> String {
    format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"svc"}}}}]}},"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
        spans.join(",")
    )
}

fn span(k: usize, attributes: &str) -> String {
    format!(
        r#"{{"traceId":"{:032x}","spanId":"{:016x}","name":"chat m","kind":2,"startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{attributes}]}}"#,
        k + 1,
        k + 1
    )
}

/// 1,000 spans, each with `n` empty objects in its `field` (links or events).
fn spans_with_empty(field: &str, n: usize) -> String {
    let empties = vec!["{}"; n].join(",");
    spans_body(
        &(0..1_000)
            .map(|k| {
                span(k, "").replacen(
                    r#","attributes""#,
                    &format!(r#","{field}":[{empties}],"attributes""#),
                    1,
                )
            })
            .collect::<Vec<_>>(),
    )
}

#[test]
fn json_decode_stays_under_its_bound() {
    let attr = |key: &str, value: &str| format!(r#"{{"key":"{key}","value":{value}}}"#);
    let many_attributes = (0..40)
        .map(|i| {
            attr(
                if i % 2 == 0 {
                    "gen_ai.request.model"
                } else {
                    "other.key"
                },
                r#"{"stringValue":"llama-3.1-8b"}"#,
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    let mut deep = r#"{"stringValue":"x"}"#.to_owned();
    for _ in 0..30 {
        deep = format!(r#"{{"kvlistValue":{{"values":[{{"key":"k","value":{deep}}}]}}}}"#);
    }
    let mut deep25 = r#"{"stringValue":"x"}"#.to_owned();
    for _ in 0..25 {
        deep25 = format!(r#"{{"kvlistValue":{{"values":[{{"key":"k","value":{deep25}}}]}}}}"#);
    }
    let array = format!(
        r#"{{"arrayValue":{{"values":[{}]}}}}"#,
        vec![r#"{"stringValue":"x"}"#; 100].join(",")
    );
    // Escapes spaced so that the parser's scratch buffer has just doubled when the string ends.
    let spaced = format!("{}n", format!("{}\\n", "n".repeat(1000)).repeat(4096));
    let long = format!(r#"{{"stringValue":"{}"}}"#, "y".repeat(100_000));
    let cases: Vec<(&str, String)> = vec![
        ("empty spans", spans_body(&vec!["{}".to_owned(); 20_000])),
        (
            "valid spans without attributes",
            spans_body(&(0..5_000).map(|k| span(k, "")).collect::<Vec<_>>()),
        ),
        (
            "40 attributes each",
            spans_body(
                &(0..1_000)
                    .map(|k| span(k, &many_attributes))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "30-deep key-value lists",
            spans_body(
                &(0..500)
                    .map(|k| span(k, &attr("deep", &deep)))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "spans cut out: every tenth with an id that is not hex",
            spans_body(
                &(0..5_000)
                    .map(|k| {
                        if k % 10 == 9 {
                            span(k, "").replacen(r#""traceId":""#, r#""traceId":"zz"#, 1)
                        } else {
                            span(k, "")
                        }
                    })
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "scopes and resources cut out: a bad attribute after their spans",
            {
                let spans = |from: usize| {
                    (from..from + 2_500)
                        .map(|k| {
                            if k % 10 == 9 {
                                span(k, "").replacen(r#""traceId":""#, r#""traceId":"zz"#, 1)
                            } else {
                                span(k, "")
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let bad = r#"{"key":"n","value":{"intValue":"seven"}}"#;
                format!(
                    r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{}]}},{{"spans":[{}],"scope":{{"attributes":[{bad}]}}}}],"resource":{{"attributes":[{bad}]}}}},{{"scopeSpans":[{{"spans":[{}]}}]}}]}}"#,
                    spans(0),
                    spans(2_500),
                    spans(5_000)
                )
            },
        ),
        (
            "20 integer attributes each",
            spans_body(
                &(0..3_000)
                    .map(|k| {
                        let ints = (0..20)
                            .map(|i| attr(&format!("n{i}"), r#"{"intValue":"7"}"#))
                            .collect::<Vec<_>>()
                            .join(",");
                        span(k, &ints)
                    })
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "25-deep key-value lists (read whole)",
            spans_body(
                &(0..500)
                    .map(|k| span(k, &attr("deep", &deep25)))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "arrays of 100 values",
            spans_body(
                &(0..500)
                    .map(|k| span(k, &attr("a", &array)))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "33 empty links each (a vector at its most wasted)",
            spans_with_empty("links", 33),
        ),
        ("50 empty events each", spans_with_empty("events", 50)),
        (
            "a string of braces",
            spans_body(&[span(
                0,
                &attr(
                    "prompt",
                    &format!(r#"{{"stringValue":"{}"}}"#, "{".repeat(500_000)),
                ),
            )]),
        ),
        (
            "long strings",
            spans_body(
                &(0..20)
                    .map(|k| span(k, &attr("gen_ai.request.model", &long)))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "spans rewritten (nulls, enum names)",
            spans_body(
                &(0..5_000)
                    .map(|k| {
                        span(k, &attr("gen_ai.request.model", r#"{"stringValue":null}"#)).replacen(
                            r#""kind":2"#,
                            r#""kind":"SPAN_KIND_SERVER","parentSpanId":null"#,
                            1,
                        )
                    })
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "empty arrays and keys left out, as Go writes them (rewritten, growing)",
            spans_body(
                &(0..1_000)
                    .map(|k| span(k, &vec![r#"{"value":{"kvlistValue":{}}}"#; 20].join(",")))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "one span rewritten, holding the whole body",
            spans_body(&[span(
                0,
                &(0..20_000)
                    .map(|i| attr(&format!("n{i}"), r#"{"doubleValue":"NaN"}"#))
                    .collect::<Vec<_>>()
                    .join(","),
            )]),
        ),
        (
            "a span with a bad id and an unknown field of 1M nested arrays (scanned, rewritten)",
            spans_body(&[span(0, "").replacen(
                r#""attributes":[]"#,
                &format!(
                    r#""traceId":7,"x":{}{}"#,
                    "[".repeat(1_000_000),
                    "]".repeat(1_000_000)
                ),
                1,
            )]),
        ),
        (
            "1M nested arrays beside a null envelope (the whole body rewritten)",
            format!(
                r#"{{"resourceSpans":null,"x":{}{}}}"#,
                "[".repeat(1_000_000),
                "]".repeat(1_000_000)
            ),
        ),
        (
            "a span with a 4 MB name, rewritten (a null parent)",
            spans_body(&[span(0, "").replacen(
                r#""name":"chat m""#,
                &format!(r#""parentSpanId":null,"name":"{}""#, "n".repeat(4_000_000)),
                1,
            )]),
        ),
        (
            "a span with a 4 MB name of escapes, rewritten (a null parent)",
            spans_body(&[span(0, "").replacen(
                r#""name":"chat m""#,
                &format!(
                    r#""parentSpanId":null,"name":"{}""#,
                    "n\\n".repeat(1_000_000)
                ),
                1,
            )]),
        ),
        (
            "a span with a 4 MB name beside a span cut (an id that is not hex)",
            spans_body(&[
                span(0, "").replacen(
                    r#""name":"chat m""#,
                    &format!(r#""name":"{}""#, "n".repeat(4_000_000)),
                    1,
                ),
                span(1, "").replacen(r#""traceId":""#, r#""traceId":"zz"#, 1),
            ]),
        ),
        (
            "a 4 MB name of spaced escapes beside a span cut, in a scope rewritten",
            spans_body(&[
                span(0, "").replacen(r#""name":"chat m""#, &format!(r#""name":"{spaced}""#), 1),
                span(1, "").replacen(r#""traceId":""#, r#""traceId":"zz"#, 1),
            ])
            .replacen(
                r#""scopeSpans":[{"#,
                r#""scopeSpans":[{"scope":{"name":null},"#,
                1,
            ),
        ),
        (
            "a 4 MB key of spaced escapes in a span rewritten",
            spans_body(&[span(0, "").replacen(
                r#""name":"chat m""#,
                &format!(r#""parentSpanId":null,"{spaced}":1,"name":"chat m""#),
                1,
            )]),
        ),
        (
            "a 4 MB name of spaced escapes, the envelope rewritten (a null duplicate)",
            {
                let body = spans_body(&[span(0, "").replacen(
                    r#""name":"chat m""#,
                    &format!(r#""name":"{spaced}""#),
                    1,
                )]);
                format!(r#"{},"resourceSpans":null}}"#, &body[..body.len() - 1])
            },
        ),
        (
            "empty arrays",
            format!(
                r#"{{"resourceSpans":[{}]}}"#,
                vec![r#"{"scopeSpans":[]}"#; 20_000].join(",")
            ),
        ),
    ];
    for (what, body) in cases {
        let peak = decode_peak(body.as_bytes());
        let bound = json_decode_bound(body.as_bytes());
        let braces = body.bytes().filter(|&b| b == b'{').count();
        eprintln!(
            "{what}: {:.0} B per `{{`; body {} B, decode peak {peak} B, bound {bound} B ({:.0}%)",
            peak as f64 / braces as f64,
            body.len(),
            100.0 * peak as f64 / bound as f64
        );
        assert!(
            peak <= bound,
            "{what}: decoding took {peak} B, over the bound of {bound} B"
        );
    }
}
