//! `infertrace analyze FILE…`: offline analysis of exported traces.
//!
//! Accepted formats, detected per file: an OTLP/JSON export request (the OTLP/HTTP body, as the
//! OpenTelemetry Collector's file exporter writes it) as a whole file or one per line, the same
//! under a trace store's envelope (Tempo's and Jaeger v2's APIs, ids in hex or base64:
//! [`otlp_envelopes`]), and Jaeger's JSON export. Every file is read; a bad file or line is reported as one line on stderr
//! and the rest is still analysed. A span read twice (the same trace and span id in
//! overlapping exports) counts once, and is said. The exit status is 0 when everything was
//! read, 1 when some input had problems or no span read is an inference request (the report is
//! still printed), 2 when nothing could be analysed.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use infertrace_analysis::critical_path::{
    CriticalPath, CriticalPathOptions, CriticalPathWindows, CriticalPathWindowsConfig,
    critical_path, windows_paths,
};
use infertrace_analysis::diagnosis::{DiagnosisConfig, diagnose_window};
use infertrace_analysis::dialect::extract_requests;
use infertrace_analysis::kpi::{KpiConfig, KpiWindows};
use infertrace_analysis::record::RequestRecord;
use infertrace_analysis::trace::{Span, TraceId};
use infertrace_collector::otlp_decode::{Decoded, decode_json};
use serde_json::{Value, json};

use crate::jaeger_json::{looks_like_jaeger, spans_from_jaeger};
use crate::otlp_envelopes;
use crate::render;
use crate::report::{Format, print_report};

/// Arguments of `infertrace analyze`.
#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// Trace files: OTLP/JSON (whole file or one export request per line, also as Tempo's and
    /// Jaeger v2's APIs return a trace) or Jaeger JSON.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also print every request's critical path (trace_id, span_id, segments).
    #[arg(long)]
    pub per_trace: bool,
    /// Critical path: tolerate a sibling overlapping its successor by up to 1% of the parent.
    #[arg(long)]
    pub skew_tolerance: bool,
    /// Critical path: centre a child from another service that does not fit its parent.
    #[arg(long)]
    pub shift_remote_children: bool,
}

/// What reading the inputs gave.
#[derive(Default)]
struct Inputs {
    spans: Vec<Span>,
    problems: Vec<String>,
    files_failed: usize,
}

fn read_file(path: &Path, inputs: &mut Inputs) {
    let name = path.display();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            inputs.problems.push(format!("{name}: cannot read: {e}"));
            inputs.files_failed += 1;
            return;
        }
    };
    let before = inputs.spans.len();
    if let Some(decoded) = decode_plain_otlp(&bytes) {
        inputs.spans.extend(decoded.spans);
        return;
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(doc) if looks_like_jaeger(&doc) => match spans_from_jaeger(&doc) {
            Ok((spans, problems)) => {
                inputs.spans.extend(spans);
                inputs
                    .problems
                    .extend(problems.into_iter().map(|p| format!("{name}: {p}")));
            }
            Err(e) => inputs.problems.push(format!("{name}: {e:#}")),
        },
        Ok(doc) => match decode_json(&otlp_body(&bytes, doc)) {
            Ok(decoded) if decoded.spans.is_empty() && decoded.rejected == 0 => {
                inputs.problems.push(format!(
                    "{name}: JSON without a span: expected an OTLP/JSON export request \
                     (resourceSpans[].scopeSpans[].spans), one per line or one per file, a trace \
                     from Tempo's or Jaeger v2's API, or a Jaeger export (data[].spans, as \
                     Jaeger's UI and /api/traces give it)"
                ));
            }
            Ok(decoded) => {
                if decoded.rejected > 0 {
                    inputs.problems.push(format!(
                        "{name}: {} invalid spans left out (first: {})",
                        decoded.rejected,
                        id_hint(decoded.first_error.unwrap_or_default())
                    ));
                }
                inputs.spans.extend(decoded.spans);
            }
            Err(e) => inputs
                .problems
                .push(format!("{name}: not OTLP/JSON or Jaeger JSON: {e}")),
        },
        // Not one JSON document: try one OTLP/JSON export request per line.
        Err(whole) => {
            let mut lines_ok = 0usize;
            let mut line_problems = Vec::new();
            for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if let Some(decoded) = decode_plain_otlp(line) {
                    lines_ok += 1;
                    inputs.spans.extend(decoded.spans);
                    continue;
                }
                let doc = serde_json::from_slice::<Value>(line).ok();
                if let Some(doc) = doc.as_ref().filter(|d| looks_like_jaeger(d)) {
                    // A Jaeger trace per line (its API streamed, or files joined).
                    match spans_from_jaeger(doc) {
                        Ok((spans, problems)) => {
                            lines_ok += 1;
                            inputs.spans.extend(spans);
                            line_problems.extend(
                                problems
                                    .into_iter()
                                    .map(|p| format!("{name}:{}: {p}", i + 1)),
                            );
                        }
                        Err(e) => line_problems.push(format!("{name}:{}: {e:#}", i + 1)),
                    }
                    continue;
                }
                // Jaeger's answer with no trace (`{"data": []}`) is empty, not foreign.
                let empty_jaeger = doc
                    .as_ref()
                    .is_some_and(|d| d.get("data").is_some_and(Value::is_array));
                let line = match doc {
                    Some(doc) => otlp_body(line, doc),
                    None => Cow::Borrowed(line),
                };
                match decode_json(&line) {
                    Ok(decoded)
                        if decoded.spans.is_empty()
                            && decoded.rejected == 0
                            && !empty_jaeger
                            && !line.windows(14).any(|w| w == b"\"resourceSpans") =>
                    {
                        // JSON, but neither an export request nor a trace this reads: said,
                        // not passed over as an empty line.
                        line_problems.push(format!(
                            "{name}:{}: JSON without a span: not an OTLP/JSON export request or \
                             a Jaeger trace",
                            i + 1
                        ));
                    }
                    Ok(decoded) => {
                        lines_ok += 1;
                        if decoded.rejected > 0 {
                            line_problems.push(format!(
                                "{name}:{}: {} invalid spans left out (first: {})",
                                i + 1,
                                decoded.rejected,
                                id_hint(decoded.first_error.unwrap_or_default())
                            ));
                        }
                        inputs.spans.extend(decoded.spans);
                    }
                    Err(e) => line_problems.push(format!("{name}:{}: {e}", i + 1)),
                }
            }
            // A file with no good line is one problem, not one per line.
            if lines_ok == 0 {
                inputs.problems.push(format!("{name}: not JSON: {whole}"));
            } else {
                inputs.problems.extend(line_problems);
            }
        }
    }
    if inputs.spans.len() == before {
        inputs.files_failed += 1;
    }
}

/// `bytes` as an OTLP/JSON export request read in one pass, when that reads all of it: at least
/// one span, none invalid, no field of OTLP before 0.15. Anything else (an envelope, base64
/// ids, Jaeger JSON, one request per line) is parsed into a document first, which costs several
/// times the file's size in memory.
fn decode_plain_otlp(bytes: &[u8]) -> Option<Decoded> {
    if bytes
        .windows(OLD_SCOPE_FIELD.len())
        .any(|w| w == OLD_SCOPE_FIELD)
    {
        return None;
    }
    decode_json(bytes)
        .ok()
        .filter(|decoded| !decoded.spans.is_empty() && decoded.rejected == 0)
}

/// The prefix of OTLP's field names before 0.15 (`instrumentationLibrarySpans`), which the
/// decoder does not read ([`otlp_envelopes`] renames them).
const OLD_SCOPE_FIELD: &[u8] = b"instrumentationLibrary";

/// The OTLP/JSON export request `doc` (parsed from `bytes`) is or holds under a trace store's
/// envelope, with hex ids ([`otlp_envelopes`]): `bytes` when it needs no rewriting.
fn otlp_body(bytes: &[u8], mut doc: Value) -> Cow<'_, [u8]> {
    if !otlp_envelopes::normalise(&mut doc) {
        return Cow::Borrowed(bytes);
    }
    serde_json::to_vec(&doc).map_or(Cow::Borrowed(bytes), Cow::Owned)
}

/// `error` of an invalid span, with a hint when it is an id that is no hex: protobuf's own
/// JSON printer (`MessageToJson`) writes ids in base64, where OTLP/JSON takes hex.
fn id_hint(error: String) -> String {
    if error.contains("invalid character") || error.contains("Invalid character") {
        format!("{error}; OTLP/JSON ids are hex, not base64 as protobuf's JSON printer writes them")
    } else {
        error
    }
}

/// Everything `analyze` computes, as the report JSON (see `render`).
pub fn analyze_spans(spans: Vec<Span>, opts: &CriticalPathOptions, per_trace: bool) -> Value {
    let mut traces: HashMap<TraceId, Vec<Span>> = HashMap::new();
    // A span read twice (overlapping exports, the same trace in two formats) counts once.
    let mut seen = std::collections::HashSet::new();
    let mut duplicates = 0usize;
    for s in spans {
        if seen.insert((s.trace_id, s.span_id)) {
            traces.entry(s.trace_id).or_default().push(s);
        } else {
            duplicates += 1;
        }
    }
    // Each request with its span path and the path the windows aggregate (a trace once).
    let mut done: Vec<(RequestRecord, Option<CriticalPath>, Option<CriticalPath>)> = Vec::new();
    let mut implausible = 0usize;
    for spans in traces.values() {
        let mut records = extract_requests(spans);
        // As the collector does: a duration over a day or a count over a billion cannot be
        // true, and would stretch the report's window over centuries.
        records.retain(|r| {
            let plausible = r.implausible().is_none();
            implausible += usize::from(!plausible);
            plausible
        });
        let paths: Vec<Option<CriticalPath>> = records
            .iter()
            .map(|r| critical_path(spans, r.span_id, opts))
            .collect();
        let windows: Vec<Option<CriticalPath>> = windows_paths(&records, &paths, &[])
            .into_iter()
            .map(|w| w.map(Cow::into_owned))
            .collect();
        done.extend(
            records
                .into_iter()
                .zip(paths)
                .zip(windows)
                .map(|((r, p), w)| (r, p, w)),
        );
    }
    done.sort_by_key(|(r, _, _)| (r.end_unix_nano, r.trace_id));
    let first = done
        .iter()
        .map(|(r, _, _)| r.arrival_unix_nano)
        .min()
        .unwrap_or(0);
    let last = done
        .iter()
        .map(|(r, _, _)| r.end_unix_nano)
        .max()
        .unwrap_or(0);
    // One window holding all the data, whole seconds: a window reads its current slot and the
    // slots before it, so the data must fit in all but one (the first request would fall out
    // of a window of just its length, depending on where the slots start).
    let config = KpiConfig::default();
    let slots = u64::from(config.slots_per_window.max(2));
    let needed = u128::from(last.saturating_sub(first)) * u128::from(slots) / u128::from(slots - 1);
    let window = Duration::from_secs(
        u64::try_from(needed.div_ceil(1_000_000_000))
            .unwrap_or(u64::MAX)
            .max(1)
            + 1,
    );
    let mut kpis = KpiWindows::new(KpiConfig {
        windows: vec![window],
        ..config
    });
    kpis.set_start(first);
    let mut cps = CriticalPathWindows::new(CriticalPathWindowsConfig {
        slot: (window / 60).max(Duration::from_millis(1)),
        retention: window + window / 30 + Duration::from_millis(1),
        ..CriticalPathWindowsConfig::default()
    });
    for (record, _, windows_path) in &done {
        kpis.record(record, record.end_unix_nano);
        // A disaggregated request is aggregated along its sub-phases across services, an engine's
        // attribute phases along those phases, a trace once (`windows_paths`).
        if let Some(p) = windows_path {
            cps.record(p, record.e2e, record.end_unix_nano);
        }
    }
    let snapshot = kpis.snapshot(window, last);
    let mut cp_summary = cps.snapshot(window, last);
    // What the data covers, from the first request's arrival to the last one's end: what the
    // rates divide by (the windows round it up to whole seconds and slots).
    let covered = last.saturating_sub(first) as f64 / 1e9;
    cp_summary.window_seconds = covered;
    let diagnosis = DiagnosisConfig::default().with_slo(&KpiConfig::default().slo);
    let diagnosis = diagnose_window(&snapshot, Some(&cp_summary), &diagnosis);
    let mut report = json!({
        "window_seconds": covered,
        "kpis": snapshot,
        "critical_path": cp_summary,
        "findings": diagnosis.findings,
        "undiagnosed": diagnosis.undiagnosed,
        "diagnosis_min_requests": diagnosis.min_requests,
        "implausible_requests": implausible,
        "duplicate_spans": duplicates,
        "requests": done.len(),
    });
    if per_trace {
        let list: Vec<Value> = done
            .iter()
            .filter_map(|(r, p, _)| {
                let p = p.as_ref()?;
                Some(json!({
                    "trace_id": r.trace_id,
                    "span_id": r.span_id,
                    "service": r.service,
                    "model": r.model,
                    "e2e": r.e2e,
                    "segments": p.segments,
                    "adjustments": p.adjustments,
                }))
            })
            .collect();
        report["traces"] = Value::Array(list);
    }
    report
}

fn per_trace_table(report: &Value) -> String {
    let mut out = String::from("\nCritical path per request\n");
    for t in report
        .get("traces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push_str(&format!(
            "  trace {} span {} ({}, e2e {})\n",
            render::text(t, "trace_id"),
            render::text(t, "span_id"),
            render::text(t, "model"),
            render::secs(t["e2e"].as_f64())
        ));
        for s in t["segments"].as_array().into_iter().flatten() {
            let start = s["start_unix_nano"].as_u64().unwrap_or(0);
            let end = s["end_unix_nano"].as_u64().unwrap_or(0);
            out.push_str(&format!(
                "      {:<24} {:<20} {:>10}\n",
                render::text(s, "name"),
                render::text(s, "service"),
                render::secs(Some(end.saturating_sub(start) as f64 / 1e9))
            ));
        }
    }
    out
}

/// Runs `infertrace analyze`.
pub fn run(args: AnalyzeArgs) -> anyhow::Result<ExitCode> {
    let mut inputs = Inputs::default();
    for f in &args.files {
        read_file(f, &mut inputs);
    }
    // Problems may quote the files' texts (span names, attributes).
    for p in &inputs.problems {
        eprintln!("infertrace: {}", render::terminal_safe(p));
    }
    if inputs.spans.is_empty() {
        eprintln!("infertrace: error: no spans could be read from the given files");
        return Ok(ExitCode::from(2));
    }
    let opts = CriticalPathOptions {
        skew_tolerance: args.skew_tolerance,
        shift_remote_children: args.shift_remote_children,
    };
    let spans_read = inputs.spans.len();
    let mut report = analyze_spans(std::mem::take(&mut inputs.spans), &opts, args.per_trace);
    if let Some(n) = report["implausible_requests"].as_u64().filter(|&n| n > 0) {
        eprintln!(
            "infertrace: {n} requests left out: a duration over a day or a token count over a \
             billion cannot be true (a broken clock or a corrupt exporter)"
        );
    }
    if let Some(n) = report["duplicate_spans"].as_u64().filter(|&n| n > 0) {
        eprintln!(
            "infertrace: {n} spans were read more than once (the same trace and span id: \
             overlapping exports, or one trace in two files) and counted once"
        );
    }
    if report["requests"].as_u64() == Some(0) {
        inputs.problems.push(format!(
            "no inference request among the {spans_read} spans read: a request is a SERVER \
             span, or a span of infertrace's layer, vLLM, SGLang or TGI (docs/reference.md, \
             Dialects)"
        ));
        if let Some(p) = inputs.problems.last() {
            eprintln!("infertrace: {p}");
        }
    }
    let names: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    report["source"] = Value::String(names.join(", "));
    report["problems"] = json!(inputs.problems);
    print_report(&report, args.format).context("printing the report")?;
    if args.per_trace && args.format == Format::Table {
        print!("{}", per_trace_table(&report));
    }
    Ok(if inputs.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
