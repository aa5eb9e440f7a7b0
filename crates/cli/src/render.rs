//! Renders a report (the collector API's JSON, or the same shape built offline) as text tables.
//!
//! The report is a JSON object `{"source", "window_seconds", "kpis", "critical_path", "findings",
//! "undiagnosed", "diagnosis_min_requests", "alerts"}` whose members have exactly the shapes of
//! `/api/kpis`, `/api/critical-path`, `/api/findings` (and its `undiagnosed` and
//! `min_requests`) and `/api/alerts`. Working on JSON keeps `report` (remote), `demo` and `analyze`
//! (local) on one renderer, and lets `--format json` print the same object.
//!
//! Every text taken from the report (service, model, operation and span names, findings,
//! alerts) is printed through [`terminal_safe`]: those come from traces, which anyone with the
//! ingest scope writes, and a control character in them could move the cursor, clear the screen
//! or set the terminal's title, or break a table with a newline.

use std::borrow::Cow;
use std::fmt::Write as _;

use infertrace_analysis::alert::KpiPath;
use infertrace_analysis::diagnosis::format_rate;
use infertrace_analysis::kpi::OVERFLOW_LABEL;
use serde_json::Value;

/// Formats seconds for people: `850µs`, `12.3ms`, `1.24s`, `2m05s`; `-` when absent.
pub fn secs(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(s) if !s.is_finite() => "-".into(),
        Some(s) if s < 0.001 => format!("{:.0}µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.1}ms", s * 1e3),
        Some(s) if s < 120.0 => format!("{s:.2}s"),
        Some(s) => format!("{}m{:02.0}s", (s / 60.0).floor(), s % 60.0),
    }
}

/// A ratio as a percentage, one decimal under 10 % as the findings write it (`6.5%`, `42%`).
fn pct(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite()).map_or("-".into(), |x| {
        let p = x * 100.0;
        if p.abs() >= 10.0 || p == 0.0 {
            format!("{p:.0}%")
        } else {
            format!("{p:.1}%")
        }
    })
}

/// A rate to three significant digits (`1234`, `56.7`, `1.23`, `0.0183`): a quiet model's
/// 0.2 tokens a second reads as such, not as `0`.
fn rate(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite()).map_or("-".into(), format_rate)
}

fn num(v: Option<f64>, decimals: usize) -> String {
    v.filter(|x| x.is_finite())
        .map_or("-".into(), |x| format!("{x:.decimals$}"))
}

fn f(v: &Value, path: &[&str]) -> Option<f64> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    cur.as_f64()
}

/// The text at `key` of `v`, made [`terminal_safe`] for printing; `-` when absent.
pub fn text<'a>(v: &'a Value, key: &str) -> Cow<'a, str> {
    terminal_safe(v.get(key).and_then(Value::as_str).unwrap_or("-"))
}

/// `text` with every control character (C0 including ESC, DEL, and C1 U+0080–U+009F: what
/// [`char::is_control`] says) written as Rust writes it in a string literal: `\n`, `\r`, `\t`,
/// `\0`, else `\u{1b}`, `\u{7f}`, `\u{9b}`. Texts from traces pass through it before they reach
/// the terminal, so that none can send it escape sequences or break a table's lines; the result
/// is one line of printable characters, and column widths are counted on it. Backslashes are
/// left as they are: the form is for reading, not for parsing back. Borrowed when there is
/// nothing to escape.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            safe.extend(c.escape_debug());
        } else {
            safe.push(c);
        }
    }
    Cow::Owned(safe)
}

/// A simple left/right aligned text table.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Leading columns aligned left (labels); the rest align right (numbers).
    left: usize,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            left: 3,
        }
    }
    fn left_columns(mut self, n: usize) -> Self {
        self.left = n;
        self
    }
    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }
    fn render(&self, out: &mut String) {
        let cols = self.header.len();
        let mut width = vec![0usize; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |r: &Vec<String>, out: &mut String| {
            let mut l = String::from("  ");
            for (i, c) in r.iter().enumerate().take(cols) {
                let pad = width[i] - c.chars().count();
                if i < self.left {
                    l.push_str(c);
                    l.push_str(&" ".repeat(pad));
                } else {
                    l.push_str(&" ".repeat(pad));
                    l.push_str(c);
                }
                l.push_str("  ");
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(&self.header, out);
        for r in &self.rows {
            line(r, out);
        }
    }
}

fn window_label(seconds: Option<f64>) -> String {
    match seconds {
        Some(s) if s >= 3600.0 && s % 3600.0 == 0.0 => format!("{}h", s / 3600.0),
        Some(s) if s >= 60.0 && s % 60.0 == 0.0 => format!("{}m", s / 60.0),
        Some(s) => format!("{s:.0}s"),
        None => "-".into(),
    }
}

/// Renders the whole report as text.
pub fn report_table(report: &Value) -> String {
    let mut out = String::new();
    let window = window_label(f(report, &["window_seconds"]));
    let _ = writeln!(
        out,
        "infertrace report — window {window} — source {}",
        text(report, "source")
    );
    let empty = Vec::new();
    let series = report
        .pointer("/kpis/series")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    if series.is_empty() {
        out.push_str("\nNo inference requests in this window yet.\n");
    } else {
        render_breakdown(series, &mut out);
        render_percentiles(series, &mut out);
        render_gpu(series, &mut out);
    }
    render_critical_path(report.get("critical_path"), &mut out);
    let requests: f64 = series.iter().filter_map(|s| f(s, &["requests"])).sum();
    let paths = report
        .pointer("/critical_path/requests")
        .and_then(Value::as_f64);
    if requests > 0.0 && paths == Some(0.0) {
        // The KPI windows are refilled from the history store after a restart; the critical
        // path is kept in memory only.
        out.push_str(
            "\nCritical path: none yet in this window. The requests above came before the \
             collector's last start (restored from its history store); the critical path is \
             not kept across a restart.\n",
        );
    }
    if series.is_empty() {
        out.push_str("\nDiagnosis\n  Nothing to diagnose without requests.\n");
    } else {
        render_findings(report, series, &mut out);
    }
    render_alerts(report.get("alerts"), &mut out);
    out
}

/// Each series' name in the tables: `service/model`, with its operation where another series
/// has the same service and model (TGI's chat and text completions).
fn series_labels(series: &[Value]) -> Vec<String> {
    let service_model = |x: &Value| format!("{}/{}", text(x, "service"), text(x, "model"));
    series
        .iter()
        .map(|x| {
            let model = service_model(x);
            let shared = series
                .iter()
                .filter(|y| service_model(y) == model)
                .nth(1)
                .is_some();
            if shared {
                format!("{model} ({})", text(x, "operation"))
            } else {
                model
            }
        })
        .collect()
}

/// Two tables, so that each fits a terminal of 100 columns: what each series served, then where
/// its time went.
fn render_breakdown(series: &[Value], out: &mut String) {
    let labels = series_labels(series);
    out.push_str("\nRequests per model\n");
    let mut t = Table::new(&[
        "model",
        "requests",
        "errors",
        "cancelled",
        "rejected",
        "req/s",
        "out tok/s",
        "goodput",
    ])
    .left_columns(1);
    for (x, label) in series.iter().zip(&labels) {
        t.row(vec![
            label.clone(),
            num(f(x, &["requests"]), 0),
            num(f(x, &["errors"]), 0),
            num(f(x, &["cancelled"]), 0),
            num(f(x, &["rejected"]), 0),
            rate(f(x, &["throughput", "requests_per_second"])),
            rate(f(x, &["throughput", "output_tokens_per_second"])),
            pct(f(x, &["goodput", "ratio"])),
        ]);
    }
    t.render(out);
    out.push_str(
        "\nLatency breakdown per model (share of end-to-end time: all requests | slowest 1%)\n",
    );
    let mut t = Table::new(&[
        "model",
        "queue",
        "prefill",
        "decode",
        "p99 queue",
        "p99 prefill",
        "p99 decode",
    ])
    .left_columns(1);
    for (x, label) in series.iter().zip(&labels) {
        t.row(vec![
            label.clone(),
            pct(f(x, &["phase_share", "all", "queue"])),
            pct(f(x, &["phase_share", "all", "prefill"])),
            pct(f(x, &["phase_share", "all", "decode"])),
            pct(f(x, &["phase_share", "p99", "queue"])),
            pct(f(x, &["phase_share", "p99", "prefill"])),
            pct(f(x, &["phase_share", "p99", "decode"])),
        ]);
    }
    t.render(out);
}

fn render_percentiles(series: &[Value], out: &mut String) {
    out.push_str("\nLatency percentiles\n");
    let mut t =
        Table::new(&["model", "metric", "p50", "p90", "p95", "p99", "max", "mean"]).left_columns(2);
    for (x, model) in series.iter().zip(series_labels(series)) {
        for (key, label) in [
            ("e2e", "e2e"),
            ("ttft", "TTFT"),
            ("tpot", "TPOT"),
            ("itl", "inter-token"),
            ("queue", "queue"),
            ("prefill", "prefill"),
            ("decode", "decode"),
        ] {
            let Some(q) = x.get(key).filter(|q| !q.is_null()) else {
                continue;
            };
            if f(q, &["p50"]).is_none() {
                continue;
            }
            let mut row = vec![model.clone(), label.into()];
            for p in ["p50", "p90", "p95", "p99", "max", "mean"] {
                row.push(secs(f(q, &[p])));
            }
            t.row(row);
        }
    }
    t.render(out);
}

fn render_gpu(series: &[Value], out: &mut String) {
    let with_gpu: Vec<(&Value, String)> = series
        .iter()
        .zip(series_labels(series))
        .filter(|(x, _)| x.get("gpu").is_some_and(|g| !g.is_null()))
        .collect();
    if with_gpu.is_empty() {
        return;
    }
    out.push_str("\nGPU (utilisation while each phase ran; energy attributed by token share)\n");
    let mut t = Table::new(&[
        "model",
        "util queue",
        "util prefill",
        "util decode",
        "energy",
        "J / out token",
    ])
    .left_columns(1);
    for (x, label) in with_gpu {
        let g = &x["gpu"];
        t.row(vec![
            label,
            pct(f(g, &["utilization_mean", "queue"])),
            pct(f(g, &["utilization_mean", "prefill"])),
            pct(f(g, &["utilization_mean", "decode"])),
            f(g, &["energy_attributed_joules"]).map_or("-".into(), |j| format!("{j:.0} J")),
            num(f(g, &["energy_per_output_token_joules"]), 2),
        ]);
    }
    t.render(out);
}

fn render_critical_path(cp: Option<&Value>, out: &mut String) {
    let Some(cp) = cp.filter(|v| !v.is_null()) else {
        return;
    };
    let empty = Vec::new();
    let entries = cp
        .get("entries")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    if entries.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nCritical path (what the requests waited on; every model together, {} requests)",
        num(f(cp, &["requests"]), 0)
    );
    let mut t = Table::new(&[
        "service",
        "span",
        "",
        "share all",
        "share >p90",
        "share >p99",
        "seconds all",
    ]);
    // The largest share of all requests first, as the dashboard orders them.
    // A span that never held the path (under 0.05 % in every tail) is noise here.
    let held = |e: &&Value| {
        ["all", "p90", "p99"]
            .iter()
            .any(|t| f(e, &["share", t]).is_some_and(|v| v >= 0.0005))
    };
    let mut sorted: Vec<&Value> = entries.iter().filter(held).collect();
    sorted.sort_by(|a, b| {
        let k = |v: &Value| f(v, &["share", "all"]).unwrap_or(0.0);
        k(b).total_cmp(&k(a))
    });
    let shown = sorted.len().min(CRITICAL_PATH_ROWS);
    let more = sorted.len() - shown;
    for e in sorted.into_iter().take(shown) {
        t.row(vec![
            text(e, "service").into(),
            text(e, "span").into(),
            String::new(),
            pct(f(e, &["share", "all"])),
            pct(f(e, &["share", "p90"])),
            pct(f(e, &["share", "p99"])),
            num(f(e, &["seconds", "all"]), 2),
        ]);
    }
    t.render(out);
    if more > 0 {
        let _ = writeln!(
            out,
            "({more} more spans with smaller shares: --format json lists them all)"
        );
    }
}

/// Rows of the critical-path table in the text report.
const CRITICAL_PATH_ROWS: usize = 12;

fn findings_list(v: Option<&Value>) -> Vec<&Value> {
    match v {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(Value::Object(o)) => o
            .get("findings")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Series listed by name under "not diagnosed"; more are counted.
const UNDIAGNOSED_ROWS: usize = 8;

/// The findings, and the series the rules did not judge for too few requests (`undiagnosed`):
/// "no problems found" is said only of series that were judged.
fn render_findings(report: &Value, series: &[Value], out: &mut String) {
    let list = findings_list(report.get("findings"));
    let quiet: Vec<&Value> = report
        .get("undiagnosed")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let min = f(report, &["diagnosis_min_requests"]);
    let judged = series
        .iter()
        .filter(|s| text(s, "service") != OVERFLOW_LABEL)
        .filter(|s| f(s, &["requests"]).unwrap_or(0.0) >= min.unwrap_or(0.0))
        .count();
    out.push_str("\nDiagnosis\n");
    if list.is_empty() && (judged > 0 || quiet.is_empty()) {
        out.push_str(if quiet.is_empty() {
            "  No problems found: every rule is within its threshold.\n"
        } else {
            "  No problems found in the series with enough requests: every rule is within its \
             threshold.\n"
        });
    }
    if !quiet.is_empty() {
        let names: Vec<String> = quiet
            .iter()
            .take(UNDIAGNOSED_ROWS)
            // The operation too, where series are split by it (chat and text_completion of one
            // model are two series).
            .map(|q| format!("{} ({})", series_name(q), num(f(q, &["requests"]), 0)))
            .collect();
        let more = quiet.len().saturating_sub(UNDIAGNOSED_ROWS);
        let _ = writeln!(
            out,
            "  Not diagnosed (fewer than {} requests in the window, too few to judge): {}{}",
            num(min, 0),
            names.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    for x in list {
        let _ = writeln!(
            out,
            "  [{}] {} — {} ({}/{})",
            text(x, "severity").to_uppercase(),
            text(x, "rule_id"),
            text(x, "title"),
            text(x, "service"),
            text(x, "model")
        );
        if let Some(ev) = x.get("evidence").and_then(Value::as_array) {
            let parts: Vec<String> = ev
                .iter()
                .map(|e| {
                    let unit = e.get("unit").and_then(Value::as_str).unwrap_or("");
                    let fmt = |v: Option<f64>| match unit {
                        "s" => secs(v),
                        "ratio" => pct(v),
                        "x" => v
                            .filter(|x| x.is_finite())
                            .map_or("-".into(), |x| format!("{x:.1}×")),
                        "1/s" => v
                            .filter(|x| x.is_finite())
                            .map_or("-".into(), |x| format!("{}/s", format_rate(x))),
                        _ => num(v, 3),
                    };
                    let th = f(e, &["threshold"])
                        .map(|t| format!(" (threshold {})", fmt(Some(t))))
                        .unwrap_or_default();
                    format!("{} = {}{}", text(e, "metric"), fmt(f(e, &["value"])), th)
                })
                .collect();
            if !parts.is_empty() {
                let _ = writeln!(out, "      evidence: {}", parts.join("; "));
            }
        }
        let _ = writeln!(out, "      what to change: {}", text(x, "recommendation"));
    }
}

/// `service/model operation` of an alert, anomaly or undiagnosed series, made terminal-safe.
fn series_name(v: &Value) -> String {
    let operation = v.get("operation").and_then(Value::as_str).unwrap_or("");
    format!(
        "{}/{}{}{}",
        text(v, "service"),
        text(v, "model"),
        if operation.is_empty() { "" } else { " " },
        terminal_safe(operation)
    )
}

/// A value of the KPI named by `kpi` (a path such as `e2e.p95`) in its unit.
fn kpi_value(kpi: &str, v: Option<f64>) -> String {
    match (KpiPath::parse(kpi), v.filter(|x| x.is_finite())) {
        (Ok(path), Some(x)) => path.format_value(x),
        (Err(_), Some(x)) => format_rate(x),
        (_, None) => "-".into(),
    }
}

/// The alerts section from `/api/alerts` (`active`: pending and firing; `resolved`;
/// `anomalies`): what someone on call reads first. Nothing when there is nothing to say.
fn render_alerts(v: Option<&Value>, out: &mut String) {
    let Some(view) = v.filter(|v| v.is_object()) else {
        return;
    };
    let list = |key: &str| -> Vec<&Value> {
        view.get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default()
    };
    let (active, resolved, anomalies) = (list("active"), list("resolved"), list("anomalies"));
    if !active.is_empty() || !resolved.is_empty() {
        let firing = active
            .iter()
            .filter(|a| a.get("state").and_then(Value::as_str) == Some("firing"))
            .count();
        let _ = writeln!(
            out,
            "\nAlerts ({firing} firing, {} pending; {} resolved recently)",
            active.len() - firing,
            resolved.len()
        );
        for a in &active {
            let expr = a.get("expr").and_then(Value::as_str).unwrap_or("");
            let kpi = expr.split_whitespace().next().unwrap_or("");
            let _ = writeln!(
                out,
                "  {:<8} {} [{}] {}: {}, now {}",
                text(a, "state").to_uppercase(),
                text(a, "alert"),
                text(a, "severity"),
                series_name(a),
                terminal_safe(expr),
                kpi_value(kpi, f(a, &["value"]))
            );
        }
    }
    if !anomalies.is_empty() {
        out.push_str("\nAnomalies (KPIs out of their usual range)\n");
        for a in &anomalies {
            let kpi = a.get("kpi").and_then(Value::as_str).unwrap_or("");
            let sigmas = f(a, &["deviation_sigmas"])
                .filter(|x| x.is_finite())
                .map_or("far".to_owned(), |x| format!("{:.1}σ", x.abs()));
            let _ = writeln!(
                out,
                "  {}: {} {} to {} against a baseline of {} ({sigmas}, {} evaluations in a row)",
                series_name(a),
                terminal_safe(kpi),
                text(a, "direction"),
                kpi_value(kpi, f(a, &["value"])),
                kpi_value(kpi, f(a, &["baseline"])),
                num(f(a, &["consecutive"]), 0)
            );
        }
    }
}

/// Formats a KPI value of a history report by its unit (`seconds`, `count`, `per_second`,
/// `ratio`).
fn history_value(unit: &str, v: Option<f64>) -> String {
    match unit {
        "seconds" => secs(v),
        "count" => num(v, 0),
        "per_second" => rate(v),
        _ => pct(v),
    }
}

/// Formats a history delta with its sign: seconds as durations, ratios in percentage points.
fn history_delta(unit: &str, v: Option<f64>) -> String {
    let Some(d) = v.filter(|x| x.is_finite()) else {
        return "-".into();
    };
    let sign = if d < 0.0 { "-" } else { "+" };
    let m = d.abs();
    match unit {
        "seconds" => format!("{sign}{}", secs(Some(m))),
        "count" => format!("{sign}{m:.0}"),
        "per_second" => format!("{sign}{}", rate(Some(m))),
        _ => format!("{sign}{:.1}pp", m * 100.0),
    }
}

/// Renders a history report (`infertrace report --since/--compare`): one row per KPI, with the
/// baseline, delta and relative change when comparing.
pub fn history_table(report: &Value) -> String {
    let mut out = String::new();
    let since = window_label(f(report, &["since_seconds"]));
    let compare = f(report, &["compare_seconds"]);
    let _ = write!(out, "infertrace report — last {since} of history");
    // The store keeps minutes: the range starts at the minute `since` falls in (or where the
    // store's data begins, if later); so does the compared range. The rates divide by all of
    // it but the time no collector ran (`seconds` is what they divide by).
    let range = |key: &str| {
        let from = f(report, &[key, "from"])?;
        let to = f(report, &[key, "to"])?;
        let seconds = f(report, &[key, "seconds"])?;
        let start = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(from.max(0.0));
        let start = humantime::format_rfc3339_seconds(start);
        Some(match f(report, &[key, "unseen_seconds"]) {
            Some(_) => format!(
                "{:.0} s from {start}, a collector running {seconds:.0} s of it",
                to - from
            ),
            None => format!("{seconds:.0} s from {start}"),
        })
    };
    if let Some(now) = range("covered") {
        let over = if f(report, &["covered", "unseen_seconds"]).is_some() {
            "rates over the time it ran"
        } else {
            "rates over all of it"
        };
        let _ = write!(out, " (covering {now}, {over})");
    }
    if let Some(before) = range("baseline_covered") {
        let _ = write!(out, " against {before}");
    }
    for key in ["service", "model"] {
        if let Some(v) = report.get(key).and_then(Value::as_str) {
            let _ = write!(out, " — {key} {}", terminal_safe(v));
        }
    }
    let _ = writeln!(out, " — source {}", text(report, "source"));
    let empty = Vec::new();
    let rows = report
        .get("kpis")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let requests = rows
        .iter()
        .find(|r| r["kpi"] == "requests")
        .and_then(|r| r["value"].as_f64());
    if requests.is_none_or(|n| n == 0.0) {
        out.push_str("\nNo requests stored in this range.\n");
    }
    out.push('\n');
    let ago = compare.map(|c| format!("{} ago", window_label(Some(c))));
    let mut header = vec!["kpi", "now"];
    if let Some(a) = &ago {
        header.extend([a.as_str(), "delta", "change"]);
    }
    let mut t = Table::new(&header).left_columns(1);
    for r in rows {
        let unit: &str = &text(r, "unit");
        let mut cells = vec![
            text(r, "kpi").into_owned(),
            history_value(unit, f(r, &["value"])),
        ];
        if compare.is_some() {
            let change = f(r, &["change"]).filter(|x| x.is_finite());
            cells.extend([
                history_value(unit, f(r, &["baseline"])),
                history_delta(unit, f(r, &["delta"])),
                change.map_or("-".into(), |c| format!("{:+.0}%", c * 100.0)),
            ]);
        }
        t.row(cells);
    }
    t.render(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After a restart the KPIs come back from the history store and the critical path does
    /// not: the report says why its section is missing.
    #[test]
    fn a_critical_path_lost_to_a_restart_is_explained() {
        let report = serde_json::json!({
            "source": "test", "window_seconds": 3600,
            "kpis": {"window_seconds": 3600, "series": [{
                "service": "svc", "model": "m", "operation": "chat", "requests": 522}]},
            "critical_path": {"requests": 0, "entries": []},
            "findings": []
        });
        let text = report_table(&report);
        assert!(text.contains("not kept across a restart"), "{text}");
        let mut fresh = report.clone();
        fresh["critical_path"] = serde_json::json!({"requests": 3, "entries": []});
        assert!(!report_table(&fresh).contains("not kept across a restart"));
    }

    /// A series too quiet for the rules is said to be undiagnosed, not healthy; "no problems
    /// found" is said only when a series was judged (a review read it of 19 requests queued
    /// 81 % of their time, where 20 gave two warnings).
    #[test]
    fn series_too_quiet_to_judge_are_not_called_healthy() {
        let report = |requests: &[(&str, u64)], undiagnosed: serde_json::Value| {
            let series: Vec<_> = requests
                .iter()
                .map(|(model, n)| {
                    serde_json::json!({"service": "svc", "model": model,
                    "operation": "chat", "requests": n})
                })
                .collect();
            serde_json::json!({"source": "test", "window_seconds": 60,
                "kpis": {"window_seconds": 60, "series": series},
                "findings": [], "undiagnosed": undiagnosed, "diagnosis_min_requests": 20})
        };
        let quiet = serde_json::json!([{"service": "svc", "model": "a", "operation": "chat",
            "requests": 19}]);
        let text = report_table(&report(&[("a", 19)], quiet.clone()));
        assert!(!text.contains("No problems found"), "{text}");
        assert!(
            text.contains(
                "Not diagnosed (fewer than 20 requests in the window, too few to judge): svc/a chat (19)"
            ),
            "{text}"
        );
        let text = report_table(&report(&[("a", 19), ("b", 20)], quiet));
        assert!(
            text.contains("No problems found in the series with enough requests"),
            "{text}"
        );
        assert!(text.contains("svc/a chat (19)"), "{text}");
        let text = report_table(&report(&[("b", 20)], serde_json::json!([])));
        assert!(
            text.contains("No problems found: every rule is within its threshold."),
            "{text}"
        );
        assert!(!text.contains("Not diagnosed"), "{text}");
    }

    #[test]
    fn percentages_read_as_the_findings_write_them() {
        assert_eq!(pct(Some(0.065)), "6.5%");
        assert_eq!(pct(Some(0.42)), "42%");
        assert_eq!(pct(Some(0.0)), "0%");
        assert_eq!(pct(None), "-");
    }

    #[test]
    fn rates_keep_three_significant_digits() {
        assert_eq!(rate(Some(0.2167)), "0.217");
        assert_eq!(rate(Some(0.00125)), "0.00125");
        assert_eq!(rate(Some(5.0)), "5.00");
        assert_eq!(rate(Some(56.74)), "56.7");
        assert_eq!(rate(Some(1234.4)), "1234");
        assert_eq!(rate(Some(0.0)), "0");
        assert_eq!(rate(Some(-0.5)), "-0.500");
        assert_eq!(rate(None), "-");
    }

    /// The largest share of all requests first, and what is left out said.
    #[test]
    fn the_critical_path_table_orders_by_all_requests_and_says_what_it_cut() {
        let entries: Vec<_> = (0..15)
            .map(|i| {
                let all = f64::from(i) / 100.0;
                serde_json::json!({"service": "svc", "span": format!("s{i}"),
                    "seconds": {"all": all}, "share": {"all": all, "p90": 0.0, "p99": 1.0 - all}})
            })
            .collect();
        let cp = serde_json::json!({"requests": 10, "entries": entries});
        let mut out = String::new();
        render_critical_path(Some(&cp), &mut out);
        let first = out
            .lines()
            .find(|l| l.trim_start().starts_with("svc"))
            .unwrap_or_default();
        assert!(first.contains("s14"), "{out}");
        assert!(!out.contains("s2 ") && out.contains("s3 "), "{out}");
        assert!(out.contains("(3 more spans"), "{out}");
    }

    #[test]
    fn seconds_are_readable() {
        assert_eq!(secs(Some(0.00085)), "850µs");
        assert_eq!(secs(Some(0.0123)), "12.3ms");
        assert_eq!(secs(Some(1.239)), "1.24s");
        assert_eq!(secs(Some(125.0)), "2m05s");
        assert_eq!(secs(None), "-");
    }

    /// Two series of one service and model that differ by operation name it in the
    /// percentiles (a review saw two blocks both labelled `tgi/unknown`).
    #[test]
    fn series_apart_by_operation_alone_say_which() {
        let series = |op: &str| {
            serde_json::json!({"service": "tgi", "model": "unknown", "operation": op,
                "e2e": {"p50": 1.0, "p90": 2.0, "p95": 2.5, "p99": 3.0, "max": 3.1, "mean": 1.2}})
        };
        let mut out = String::new();
        render_percentiles(&[series("chat"), series("text_completion")], &mut out);
        assert!(out.contains("tgi/unknown (chat)"), "{out}");
        assert!(out.contains("tgi/unknown (text_completion)"), "{out}");
        // The requests and breakdown tables name them alike.
        let mut out = String::new();
        render_breakdown(&[series("chat"), series("text_completion")], &mut out);
        assert_eq!(
            out.matches("tgi/unknown (text_completion)").count(),
            2,
            "{out}"
        );
        let mut out = String::new();
        render_percentiles(&[series("chat")], &mut out);
        assert!(
            out.contains("tgi/unknown ") && !out.contains("(chat)"),
            "{out}"
        );
    }

    #[test]
    fn renders_a_report() {
        let report = serde_json::json!({
            "source": "test", "window_seconds": 300,
            "kpis": {"window_seconds": 300, "series": [{
                "service": "svc", "model": "m", "operation": "chat", "requests": 10, "errors": 1,
                "cancelled": 0, "rejected": 0,
                "e2e": {"p50": 1.0, "p90": 2.0, "p95": 2.5, "p99": 3.0, "max": 3.1, "mean": 1.2},
                "ttft": {"p50": 0.1, "p90": 0.2, "p95": 0.25, "p99": 0.3, "max": 0.31, "mean": 0.12},
                "throughput": {"requests_per_second": 2.0, "output_tokens_per_second": 300.0},
                "goodput": {"ratio": 0.9, "requests_per_second": 1.8},
                "phase_share": {"all": {"queue": 0.1, "prefill": 0.2, "decode": 0.7},
                                "p99": {"queue": 0.5, "prefill": 0.1, "decode": 0.4}}
            }]},
            "critical_path": {"requests": 10, "entries": [{"service": "svc", "span": "decode",
                "seconds": {"all": 7.0}, "share": {"all": 0.7, "p90": 0.5, "p99": 0.4}}]},
            "findings": [{"rule_id": "queue_dominated", "severity": "warning", "service": "svc",
                "model": "m", "title": "queue dominates", "recommendation": "add replicas",
                "evidence": [{"metric": "phase_share.p99.queue", "value": 0.5, "threshold": 0.4, "unit": "ratio"},
                             {"metric": "goodput.requests_per_second", "value": 0.26, "unit": "1/s"},
                             {"metric": "itl.p99 / itl.p50", "value": 4.81, "threshold": 5.0, "unit": "x"}]}]
        });
        let text = report_table(&report);
        assert!(text.contains("window 5m"), "{text}");
        assert!(text.contains("90%"), "{text}");
        assert!(text.contains("1.00s"), "{text}");
        assert!(text.contains("[WARNING] queue_dominated"), "{text}");
        assert!(
            text.contains("phase_share.p99.queue = 50% (threshold 40%)"),
            "{text}"
        );
        assert!(
            text.contains("goodput.requests_per_second = 0.260/s"),
            "{text}"
        );
        assert!(
            text.contains("itl.p99 / itl.p50 = 4.8× (threshold 5.0×)"),
            "{text}"
        );
        assert!(text.contains("decode"), "{text}");
    }

    #[test]
    fn control_characters_are_escaped_for_the_terminal() {
        assert!(matches!(terminal_safe("llama-3.1 8b/ü"), Cow::Borrowed(_)));
        assert_eq!(
            terminal_safe("esc\x1b[2J\x1b]0;PWNED\x07x"),
            "esc\\u{1b}[2J\\u{1b}]0;PWNED\\u{7}x"
        );
        assert_eq!(terminal_safe("a\nb\tc\rd\0"), "a\\nb\\tc\\rd\\0");
        assert_eq!(
            terminal_safe("del\x7f c1\u{9b}\u{80}\u{9f}"),
            "del\\u{7f} c1\\u{9b}\\u{80}\\u{9f}"
        );
        // Printable text around them, backslashes and U+00A0 (not a control) are kept.
        assert_eq!(terminal_safe("\\n\u{a0}é"), "\\n\u{a0}é");
    }

    /// The alerts section reads `/api/alerts` as the API writes it (it read a shape the API
    /// never had, so a live collector's firing alerts were never printed).
    #[test]
    fn alerts_and_anomalies_are_printed_for_the_one_on_call() {
        let report = serde_json::json!({
            "window_seconds": 60, "kpis": {"series": []},
            "alerts": {"window_seconds": 60.0, "rules": ["QueueP95High", "TrafficLow"],
                "active": [
                    {"alert": "QueueP95High", "state": "firing", "severity": "critical",
                     "service": "vllm", "model": "m-queue", "operation": "chat",
                     "expr": "queue.p95 > 2 s", "value": 5.78},
                    {"alert": "TrafficLow", "state": "pending", "severity": "warning",
                     "service": "vllm", "model": "m", "operation": "",
                     "expr": "throughput.requests_per_second < 1/s", "value": 0.0}],
                "resolved": [{"alert": "ErrorRateHigh", "state": "resolved"}],
                "anomalies": [{"service": "vllm", "model": "m-regress", "operation": "chat",
                    "kpi": "e2e.p95", "value": 23.4, "baseline": 7.7, "deviation_sigmas": 12.34,
                    "direction": "up", "consecutive": 5}]}
        });
        let text = report_table(&report);
        assert!(
            text.contains("Alerts (1 firing, 1 pending; 1 resolved recently)"),
            "{text}"
        );
        assert!(
            text.contains(
                "FIRING   QueueP95High [critical] vllm/m-queue chat: queue.p95 > 2 s, now 5.78 s"
            ),
            "{text}"
        );
        assert!(
            text.contains("PENDING  TrafficLow [warning] vllm/m: throughput.requests_per_second < 1/s, now 0/s"),
            "{text}"
        );
        assert!(
            text.contains("vllm/m-regress chat: e2e.p95 up to 23.4 s against a baseline of 7.7 s (12.3σ, 5 evaluations in a row)"),
            "{text}"
        );
        // A quiet collector: no section.
        let quiet = serde_json::json!({"window_seconds": 60, "kpis": {"series": []},
            "alerts": {"active": [], "resolved": [], "anomalies": []}});
        let text = report_table(&quiet);
        assert!(
            !text.contains("Alerts") && !text.contains("Anomalies"),
            "{text}"
        );
    }

    #[test]
    fn names_from_traces_reach_the_terminal_escaped_and_aligned() {
        let hostile = "esc\x1b[2J\x1b]0;PWNED\x07x";
        let report = serde_json::json!({
            "source": "test", "window_seconds": 60,
            "kpis": {"series": [
                {"service": "svc\u{9b}31m", "model": hostile, "operation": "chat\nfake row",
                 "requests": 3, "e2e": {"p50": 1.0, "p90": 1.0, "p95": 1.0, "p99": 1.0, "max": 1.0, "mean": 1.0}},
                {"service": "svc\u{9b}31m", "model": hostile, "operation": "chat", "requests": 12345}
            ]},
            "critical_path": {"requests": 3, "entries": [{"service": "svc", "span": "tab\there",
                "seconds": {"all": 1.0}, "share": {"all": 1.0}}]},
            "findings": [{"rule_id": "r", "severity": "warning", "service": "svc", "model": hostile,
                "title": "t\x1b[1m", "recommendation": "r\x07"}],
            "alerts": {"active": [{"alert": "a\x1bc", "state": "firing", "severity": "critical",
                "service": "svc", "model": "m\u{9b}2J", "operation": "chat", "expr": "e2e.p95 > 1 s",
                "value": 2.5}], "resolved": [], "anomalies": []}
        });
        let text = report_table(&report);
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "a control character reached the terminal: {text:?}"
        );
        assert!(
            text.contains("esc\\u{1b}[2J\\u{1b}]0;PWNED\\u{7}x"),
            "{text}"
        );
        assert!(
            text.contains("chat\\nfake row") && text.contains("tab\\there"),
            "{text}"
        );
        assert!(text.contains("\\u{9b}2J"), "{text}");
        // One line per series, and the right-aligned last column ends at the same place on the
        // header and on both rows (widths are counted on the escaped text).
        let table: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Requests per model"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert_eq!(table.len(), 3, "{text}");
        let widths: Vec<usize> = table.iter().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "{widths:?}\n{text}");
        // The right-aligned `requests` column: 3 and 12345 end where its header does.
        let chars: Vec<Vec<char>> = table.iter().map(|l| l.chars().collect()).collect();
        let end = chars[0]
            .windows(8)
            .position(|w| w.iter().collect::<String>() == "requests")
            .map(|i| i + 7);
        assert_eq!(
            end.map(|i| (chars[1][i], chars[2][i])),
            Some(('3', '5')),
            "{text}"
        );
    }

    /// Every table of a report fits a terminal of 100 columns, with names as long as the demo's
    /// and every figure at its widest (a review read 168 columns). Longer names widen the first
    /// column only.
    #[test]
    fn tables_fit_a_terminal_of_100_columns() {
        let q = serde_json::json!({"p50": 999.9, "p90": 999.9, "p95": 999.9, "p99": 999.9,
            "max": 999.9, "mean": 999.9});
        let share = serde_json::json!({"queue": 0.999, "prefill": 0.999, "decode": 0.999});
        let series = |operation: &str| {
            serde_json::json!({"service": "infertrace-demo", "model": "llama-3.1-8b",
                "operation": operation, "requests": 12_345_678, "errors": 1_234_567,
                "cancelled": 1_234_567, "rejected": 1_234_567,
                "throughput": {"requests_per_second": 12_345.67, "output_tokens_per_second": 1_234_567},
                "goodput": {"ratio": 0.999}, "phase_share": {"all": share, "p99": share},
                "e2e": q, "ttft": q, "tpot": q, "itl": q, "queue": q, "prefill": q, "decode": q,
                "gpu": {"utilization_mean": share, "energy_attributed_joules": 12_345_678.0,
                        "energy_per_output_token_joules": 1234.5}})
        };
        let report = serde_json::json!({
            "source": "demo (balanced)", "window_seconds": 300,
            "kpis": {"series": [series("chat")]},
            "critical_path": {"requests": 3, "entries": [{"service": "infertrace-demo",
                "span": "chat llama-3.1-8b", "seconds": {"all": 12345.67, "p90": 1.0, "p99": 1.0},
                "share": {"all": 0.999, "p90": 0.999, "p99": 0.999}}]},
            "findings": []
        });
        let text = report_table(&report);
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        assert!(widest <= 100, "{widest} columns:\n{text}");
        assert!(text.contains("infertrace-demo/llama-3.1-8b"), "{text}");
    }

    #[test]
    fn history_deltas_carry_their_sign_and_unit() {
        assert_eq!(history_delta("seconds", Some(-0.05)), "-50.0ms");
        assert_eq!(history_delta("count", Some(15.0)), "+15");
        assert_eq!(history_delta("ratio", Some(0.031)), "+3.1pp");
        assert_eq!(history_delta("per_second", None), "-");
        let report = serde_json::json!({"source": "x", "since_seconds": 3600, "compare_seconds": 86400,
            "covered": {"from": 1767225600.0, "to": 1767229288.0, "seconds": 3688.0},
            "kpis": [{"kpi": "requests", "unit": "count", "value": 25.0, "baseline": 10.0, "delta": 15.0, "change": 1.5}]});
        let t = history_table(&report);
        assert!(
            t.contains("last 1h of history") && t.contains("24h ago"),
            "{t}"
        );
        assert!(
            t.contains("(covering 3688 s from 2026-01-01T00:00:00Z, rates over all of it)"),
            "{t}"
        );
        let line = t
            .lines()
            .find(|l| l.trim_start().starts_with("requests"))
            .unwrap();
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            ["requests", "25", "10", "+15", "+150%"]
        );
        let mut stopped = report.clone();
        stopped["covered"]["seconds"] = 3658.0.into();
        stopped["covered"]["unseen_seconds"] = 30.0.into();
        let t = history_table(&stopped);
        assert!(
            t.contains("(covering 3688 s from 2026-01-01T00:00:00Z, a collector running 3658 s of it, rates over the time it ran)"),
            "{t}"
        );
    }
}
