//! `infertrace analyze` on files in each supported format, including broken ones.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

const T0: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;

/// One request in the infertrace dialect: (queue, prefill, decode) in ms, as OTLP/JSON spans.
fn request_spans(i: u64, queue: u64, prefill: u64, decode: u64) -> Vec<Value> {
    let trace = format!("{:032x}", 0xabc0 + i);
    let root = format!("{:016x}", 0x100 + i * 16);
    let start = T0 + i * 1000 * MS;
    let s = start + queue * MS;
    let f = s + prefill * MS;
    let e = f + decode * MS;
    let attr = |k: &str, v: Value| json!({"key": k, "value": v});
    let mut spans = vec![json!({
        "traceId": trace, "spanId": root, "name": "chat m", "kind": 2,
        "startTimeUnixNano": start.to_string(), "endTimeUnixNano": e.to_string(),
        "attributes": [
            attr("gen_ai.operation.name", json!({"stringValue": "chat"})),
            attr("gen_ai.request.model", json!({"stringValue": "m"})),
            attr("gen_ai.usage.input_tokens", json!({"intValue": "100"})),
            attr("gen_ai.usage.output_tokens", json!({"intValue": "11"})),
            attr("infer.outcome", json!({"stringValue": "ok"})),
        ],
        "status": {}
    })];
    for (n, (name, a, b)) in [("queue", start, s), ("prefill", s, f), ("decode", f, e)]
        .into_iter()
        .enumerate()
    {
        spans.push(json!({
            "traceId": trace, "spanId": format!("{:016x}", 0x100 + i * 16 + n as u64 + 1),
            "parentSpanId": root, "name": name, "kind": 1,
            "startTimeUnixNano": a.to_string(), "endTimeUnixNano": b.to_string(),
            "attributes": [attr("infer.phase", json!({"stringValue": name}))]
        }));
    }
    spans
}

fn export_request(spans: Vec<Value>) -> Value {
    json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]
    }]})
}

const PHASES: [(u64, u64, u64); 3] = [(10, 40, 200), (30, 60, 400), (5, 20, 100)];

fn analyze(files: &[&Path], extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infertrace"))
        .arg("analyze")
        .args(files)
        .args(extra)
        .output()
        .expect("run infertrace analyze")
}

fn json_report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn check_report(report: &Value) {
    let s = &report["kpis"]["series"][0];
    assert_eq!(s["requests"], 3, "{s}");
    assert_eq!(
        (s["service"].as_str(), s["model"].as_str()),
        (Some("svc"), Some("m"))
    );
    // e2e are 250, 490 and 125 ms: the max is exact, the median within the sketch's 1%.
    assert!(
        (s["e2e"]["max"].as_f64().unwrap() - 0.490).abs() < 1e-9,
        "{s}"
    );
    assert!(
        (s["e2e"]["p50"].as_f64().unwrap() - 0.250).abs() < 0.0025,
        "{s}"
    );
    assert!(
        (s["tpot"]["max"].as_f64().unwrap() - 0.040).abs() < 1e-9,
        "{s}"
    );
    let traces = report["traces"]
        .as_array()
        .expect("--per-trace lists traces");
    assert_eq!(traces.len(), 3);
    for t in traces {
        let names: Vec<&str> = t["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["queue", "prefill", "decode"], "{t}");
        let seg = &t["segments"][1];
        assert!(seg["span_id"].is_string() && seg["service"] == "svc");
        assert!(seg["end_unix_nano"].as_u64() > seg["start_unix_nano"].as_u64());
    }
    let cp = report["critical_path"]["entries"].as_array().unwrap();
    let decode = cp
        .iter()
        .find(|e| e["span"] == "decode")
        .expect("decode on the critical path");
    assert!(
        (decode["seconds"]["all"].as_f64().unwrap() - 0.7).abs() < 1e-9,
        "{decode}"
    );
}

#[test]
fn otlp_json_whole_file_and_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<Value> = PHASES
        .iter()
        .enumerate()
        .flat_map(|(i, p)| request_spans(i as u64, p.0, p.1, p.2))
        .collect();
    let whole = dir.path().join("whole.json");
    std::fs::write(
        &whole,
        serde_json::to_vec_pretty(&export_request(all)).unwrap(),
    )
    .unwrap();
    let out = analyze(&[&whole], &["--format", "json", "--per-trace"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_report(&json_report(&out));

    let lines: Vec<String> = PHASES
        .iter()
        .enumerate()
        .map(|(i, p)| export_request(request_spans(i as u64, p.0, p.1, p.2)).to_string())
        .collect();
    let jsonl = dir.path().join("lines.jsonl");
    std::fs::write(&jsonl, lines.join("\n") + "\n").unwrap();
    let out = analyze(&[&jsonl], &["--format", "json", "--per-trace"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_report(&json_report(&out));

    // The table format prints the breakdown and every request's critical path.
    let out = analyze(&[&whole], &["--per-trace"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Latency breakdown per model"), "{text}");
    assert!(text.contains("Critical path per request"), "{text}");
}

/// The requests `which` (indices into [`PHASES`]) as one Jaeger export (`data[].spans`).
fn jaeger_doc(which: &[usize]) -> Value {
    let mut spans = Vec::new();
    for &i in which {
        let p = PHASES[i];
        for s in request_spans(i as u64, p.0, p.1, p.2) {
            let start = s["startTimeUnixNano"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                / 1000;
            let end = s["endTimeUnixNano"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                / 1000;
            let mut tags: Vec<Value> = s["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| {
                    let v = &a["value"];
                    match (v.get("stringValue"), v.get("intValue")) {
                        (Some(x), _) => json!({"key": a["key"], "type": "string", "value": x}),
                        (_, Some(x)) => json!({"key": a["key"], "type": "int64", "value": x.as_str().unwrap().parse::<i64>().unwrap()}),
                        _ => unreachable!(),
                    }
                })
                .collect();
            let kind = if s["kind"] == 2 { "server" } else { "internal" };
            tags.push(json!({"key": "span.kind", "type": "string", "value": kind}));
            let refs = match s.get("parentSpanId") {
                Some(p) => json!([{"refType": "CHILD_OF", "traceID": s["traceId"], "spanID": p}]),
                None => json!([]),
            };
            spans.push(json!({
                "traceID": s["traceId"], "spanID": s["spanId"], "operationName": s["name"],
                "references": refs, "startTime": start, "duration": end - start,
                "tags": tags, "processID": "p1"
            }));
        }
    }
    json!({"data": [{"traceID": "x", "spans": spans, "processes": {"p1": {"serviceName": "svc"}}}]})
}

#[test]
fn jaeger_json_export() {
    let dir = tempfile::tempdir().unwrap();
    let doc = jaeger_doc(&[0, 1, 2]);
    let file = dir.path().join("jaeger.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let out = analyze(&[&file], &["--format", "json", "--per-trace"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_report(&json_report(&out));
}

/// JSON lines mixing a Jaeger trace and OTLP/JSON export requests are all read (a review lost
/// a first line in Jaeger's format without a word); a line of other JSON is said, not passed
/// over as empty.
#[test]
fn json_lines_of_jaeger_and_otlp_are_read_and_other_json_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let otlp: Vec<Value> = [1, 2]
        .iter()
        .flat_map(|&i| {
            let p = PHASES[i];
            request_spans(i as u64, p.0, p.1, p.2)
        })
        .collect();
    let lines = [
        jaeger_doc(&[0]).to_string(),
        export_request(otlp).to_string(),
    ];
    let mixed = dir.path().join("mixed.jsonl");
    // Jaeger's answer for a trace it does not have is empty, not foreign.
    std::fs::write(&mixed, lines.join("\n") + "\n{\"data\": []}\n").unwrap();
    let out = analyze(&[&mixed], &["--format", "json", "--per-trace"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_report(&json_report(&out));

    let other = dir.path().join("other.jsonl");
    std::fs::write(&other, lines.join("\n") + "\n{\"foo\": 1}\n").unwrap();
    let out = analyze(&[&other], &["--format", "json", "--per-trace"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("other.jsonl:3: JSON without a span"),
        "{stderr}"
    );
    check_report(&json_report(&out));
}

/// The trace of a request as Tempo's and Jaeger v2's APIs give it back: Tempo's `batches` (ids
/// in base64, OTLP's old `instrumentationLibrarySpans`, enums by name), Tempo v2's `trace`, and
/// Jaeger v2's `result`, one trace per line as its API streams them.
#[test]
fn traces_as_tempo_and_jaeger_v2_return_them() {
    use base64::Engine;
    let b64 = |hex_id: &Value| {
        let bytes: Vec<u8> = (0..hex_id.as_str().unwrap().len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex_id.as_str().unwrap()[i..i + 2], 16).unwrap())
            .collect();
        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let dir = tempfile::tempdir().unwrap();
    let resource =
        json!({"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]});
    let requests: Vec<Vec<Value>> = PHASES
        .iter()
        .enumerate()
        .map(|(i, p)| request_spans(i as u64, p.0, p.1, p.2))
        .collect();
    let tempo_spans: Vec<Value> = requests
        .iter()
        .flatten()
        .map(|s| {
            let mut s = s.clone();
            for key in ["traceId", "spanId", "parentSpanId"] {
                if let Some(id) = s.get(key).cloned() {
                    s[key] = b64(&id);
                }
            }
            s["kind"] = json!(if s["kind"] == 2 {
                "SPAN_KIND_SERVER"
            } else {
                "SPAN_KIND_INTERNAL"
            });
            s
        })
        .collect();
    let tempo = json!({"batches": [{"resource": resource,
        "instrumentationLibrarySpans": [{"instrumentationLibrary": {"name": "t"}, "spans": tempo_spans}]}]});
    let all: Vec<Value> = requests.iter().flatten().cloned().collect();
    let tempo_v2 = json!({"trace": export_request(all), "status": "complete"});
    let jaeger_v2: Vec<String> = requests
        .iter()
        .map(|spans| json!({"result": export_request(spans.clone())}).to_string())
        .collect();
    for (name, text) in [
        ("tempo.json", tempo.to_string()),
        ("tempo-v2.json", tempo_v2.to_string()),
        ("jaeger-v3.jsonl", jaeger_v2.join("\n")),
    ] {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let out = analyze(&[&file], &["--format", "json", "--per-trace"]);
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        check_report(&json_report(&out));
    }
}

/// The same spans in two files (overlapping exports) count once, said on stderr; files with
/// spans but no request say so and exit 1 (a review saw "No problems found" and 0).
#[test]
fn spans_read_twice_count_once_and_no_request_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<Value> = PHASES
        .iter()
        .enumerate()
        .flat_map(|(i, p)| request_spans(i as u64, p.0, p.1, p.2))
        .collect();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let body = export_request(all.clone()).to_string();
    std::fs::write(&a, &body).unwrap();
    std::fs::write(&b, &body).unwrap();
    let out = analyze(&[&a, &b], &["--format", "json", "--per-trace"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{} spans were read more than once", all.len())),
        "{stderr}"
    );
    check_report(&json_report(&out));

    let internal = dir.path().join("internal.json");
    let one: Vec<Value> = all
        .iter()
        .filter(|s| s["name"] == "decode")
        .take(1)
        .cloned()
        .collect();
    std::fs::write(&internal, export_request(one).to_string()).unwrap();
    let out = analyze(&[&internal], &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no inference request among the 1 spans read"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Nothing to diagnose without requests")
            && !stdout.contains("No problems found"),
        "{stdout}"
    );
}

#[test]
fn broken_files_are_reported_and_the_rest_analysed() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    let all: Vec<Value> = PHASES
        .iter()
        .enumerate()
        .flat_map(|(i, p)| request_spans(i as u64, p.0, p.1, p.2))
        .collect();
    std::fs::write(&good, export_request(all).to_string()).unwrap();
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"resourceSpans\": [ {\"oops\"").unwrap();
    let missing = dir.path().join("missing.json");
    let out = analyze(
        &[&broken, &good, &missing],
        &["--format", "json", "--per-trace"],
    );
    assert_eq!(out.status.code(), Some(1), "partial problems exit 1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "one line per problem: {stderr}");
    assert!(lines.iter().any(|l| l.contains("broken.json")), "{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("missing.json") && l.contains("cannot read")),
        "{stderr}"
    );
    check_report(&json_report(&out));

    let out = analyze(&[&broken], &[]);
    assert_eq!(out.status.code(), Some(2), "nothing readable exits 2");

    // JSON that is no trace export says what was expected.
    let other = dir.path().join("other.json");
    std::fs::write(&other, r#"{"metrics": [1, 2, 3]}"#).unwrap();
    let out = analyze(&[&other], &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("other.json: JSON without a span: expected an OTLP/JSON export"),
        "{stderr}"
    );
}

/// One window, one length: every request counted, the rates divided by what the data covers
/// (the first request's arrival to the last one's end), and the critical path over the same.
#[test]
fn the_window_is_what_the_data_covers_and_every_request_counts() {
    // Several alignments of the data against the windows' slots.
    for shift in 0..12 {
        window_of_71_requests(shift);
    }
}

fn window_of_71_requests(shift: u64) {
    let dir = tempfile::tempdir().unwrap();
    // 71 requests a second apart, each 125 ms: 70.125 s from the first arrival to the last end.
    let spans: Vec<Value> = (shift..shift + 71)
        .flat_map(|i| request_spans(i, 5, 20, 100))
        .collect();
    let file = dir.path().join("export.json");
    std::fs::write(&file, export_request(spans).to_string()).unwrap();
    let out = analyze(&[&file], &["--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = json_report(&out);
    let window = report["window_seconds"].as_f64().unwrap();
    assert!((window - 70.125).abs() < 1e-9, "{window}");
    assert_eq!(report["critical_path"]["window_seconds"], window);
    let s = &report["kpis"]["series"][0];
    assert_eq!(s["requests"], 71, "shifted {shift} s: {s}");
    let rate = s["throughput"]["requests_per_second"].as_f64().unwrap();
    assert!(
        (rate * window - 71.0).abs() < 1e-6,
        "shifted {shift} s: {rate} over {window} s"
    );
    let decode = report["critical_path"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["span"] == "decode")
        .unwrap();
    assert!(
        (decode["seconds"]["all"].as_f64().unwrap() - 7.1).abs() < 1e-9,
        "shifted {shift} s: {decode}"
    );
}
