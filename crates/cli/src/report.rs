//! `infertrace report`: the latency breakdown, critical path and findings of a running collector.
//!
//! With `--since 1h` the report covers a stretch of the collector's history instead of a live
//! window (from its store, through `GET /api/history`): end-to-end, TTFT and TPOT p50/p99,
//! requests, rates, goodput and phase shares. `--compare 1h` adds the same KPIs over the same
//! length of time one hour earlier, with the deltas. Ranges are whole minutes (the store keeps
//! minute rollups), so `--since 1h` covers the current minute and the 60 before it; the
//! compared range is the same minutes `--compare` earlier (at least `--since`), ending before
//! the first of them, so that no minute counts on both sides (with `--compare` equal to
//! `--since`: the 60 whole minutes before). [`history_ranges`] has the rule.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use infertrace_collector::client_tls::TlsClientConfig;

use crate::http_get::ApiClient;
use crate::render;

/// Output format of `report` and `analyze`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable tables.
    Table,
    /// One JSON object (the API's shapes).
    Json,
}

/// Arguments of `infertrace report`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("history").args(["since", "compare"]).multiple(true)))]
pub struct ReportArgs {
    /// Base URL of the collector's API (its --listen address; https:// when its api.tls is
    /// set). When the collector requires tokens, set INFERTRACE_TOKEN to one with the `read`
    /// scope (sent as a bearer token).
    #[arg(long, default_value = "http://127.0.0.1:9464")]
    pub url: String,
    /// https:// only: PEM file of the CA certificate(s) to check the collector's certificate
    /// with (a private CA). Default: the system's root certificates (SSL_CERT_FILE and
    /// SSL_CERT_DIR are honoured).
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<std::path::PathBuf>,
    /// https:// only: PEM client certificate chain, for a collector whose api.tls asks for
    /// one (mutual TLS); with --key-file.
    #[arg(long, value_name = "PEM", requires = "key_file")]
    pub cert_file: Option<std::path::PathBuf>,
    /// https:// only: PEM private key of --cert-file.
    #[arg(long, value_name = "PEM", requires = "cert_file")]
    pub key_file: Option<std::path::PathBuf>,
    /// Window to report on: one of the collector's KPI windows (1m, 5m, 1h by default).
    #[arg(long, default_value = "5m", conflicts_with_all = ["since", "compare"])]
    pub window: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Report on this much history from the collector's store (e.g. 1h, 30m, 1d) instead of a
    /// live window.
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// Compare with the same KPIs this long ago (e.g. 1h, 1d; at least --since, whole
    /// minutes), with deltas; over --since (default 1h) of history. Compare rates and ratios:
    /// counts cover each range's own length.
    #[arg(long, value_name = "DURATION")]
    pub compare: Option<String>,
    /// History reports (--since or --compare): only this service.
    #[arg(long, requires = "history")]
    pub service: Option<String>,
    /// History reports (--since or --compare): only this model.
    #[arg(long, requires = "history")]
    pub model: Option<String>,
}

/// How a history KPI is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Seconds.
    Seconds,
    /// A count.
    Count,
    /// Per second.
    Rate,
    /// A fraction of 1.
    Ratio,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Seconds => "seconds",
            Unit::Count => "count",
            Unit::Rate => "per_second",
            Unit::Ratio => "ratio",
        }
    }
}

/// The KPIs of a history report, as `/api/history?kpi=` names them.
pub const HISTORY_KPIS: [(&str, Unit); 14] = [
    ("requests", Unit::Count),
    ("throughput.requests_per_second", Unit::Rate),
    ("throughput.output_tokens_per_second", Unit::Rate),
    ("goodput.ratio", Unit::Ratio),
    ("error_rate", Unit::Ratio),
    ("e2e.p50", Unit::Seconds),
    ("e2e.p99", Unit::Seconds),
    ("ttft.p50", Unit::Seconds),
    ("ttft.p99", Unit::Seconds),
    ("tpot.p50", Unit::Seconds),
    ("tpot.p99", Unit::Seconds),
    ("phase_share.all.queue", Unit::Ratio),
    ("phase_share.all.prefill", Unit::Ratio),
    ("phase_share.all.decode", Unit::Ratio),
];

/// What a history report covers.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryRequest {
    /// How far back from now.
    pub since: Duration,
    /// Compare with the same length of time this long before.
    pub compare: Option<Duration>,
    /// Only this service.
    pub service: Option<String>,
    /// Only this model.
    pub model: Option<String>,
}

/// Parses a `--since` / `--compare` duration (at least a second).
pub fn parse_span(flag: &str, s: &str) -> anyhow::Result<Duration> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| anyhow::anyhow!("{flag} {s:?}: {e}; write e.g. 30m, 1h, 1d"))?;
    if d < Duration::from_secs(1) {
        anyhow::bail!("{flag} {s:?} must be at least 1s");
    }
    Ok(d)
}

/// Percent-encodes a query value (everything but RFC 3986's unreserved characters).
fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A stretch of history to query, Unix seconds from a minute's start: to now (`to: None`, the
/// collector's now) or to a minute's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryRange {
    /// The first minute's start.
    pub from: u64,
    /// The end, or `None`: now.
    pub to: Option<u64>,
}

/// The ranges of a history report at `now` (Unix seconds). The current one runs from the
/// start of the minute `since` ago falls in to now. The baseline is the same minutes `compare`
/// earlier (rounded up to whole minutes), ending at the latest where the current range
/// begins. The store keeps whole minutes: a baseline reaching into the current range's first
/// minute would count that minute on both sides, and one ending inside a minute would divide
/// the whole minute's requests by part of it.
pub fn history_ranges(
    now: u64,
    since: Duration,
    compare: Option<Duration>,
) -> (HistoryRange, Option<HistoryRange>) {
    let from = now.saturating_sub(since.as_secs()) / 60 * 60;
    let minutes = (now - from).div_ceil(60).max(1);
    let current = HistoryRange { from, to: None };
    let baseline = compare.map(|c| {
        let shift = c.as_secs().div_ceil(60) * 60;
        let start = from.saturating_sub(shift);
        HistoryRange {
            from: start,
            to: Some((start + minutes * 60).min(from)),
        }
    });
    (current, baseline)
}

/// The `/api/history` query of `kpi` over `range`, as one step.
pub fn history_query(kpi: &str, range: HistoryRange, h: &HistoryRequest) -> String {
    let to = range.to.map_or_else(|| "now".to_owned(), |t| t.to_string());
    // One step covering the whole range: the current one is at most `since` and a minute long.
    let length = range.to.map_or(h.since.as_secs() + 60, |t| t - range.from);
    let step = length + 60;
    let mut q = format!(
        "kpi={}&from={}&to={to}&step={step}",
        encode_query(kpi),
        range.from
    );
    if let Some(s) = &h.service {
        q.push_str(&format!("&service={}", encode_query(s)));
    }
    if let Some(m) = &h.model {
        q.push_str(&format!("&model={}", encode_query(m)));
    }
    q
}

/// The range a one-step `/api/history` answer covers, whole minutes from the one its `from`
/// falls in up to its `to`, within where the store's data begins and ends when the answer
/// says so (`data_since`, `data_until`): `{"from", "to", "seconds"}` (Unix seconds), and the
/// seconds in it no collector ran (`unseen_seconds`, when there were some), which `seconds`,
/// what its rates divide by, leaves out. `null` when the store holds no data in the range.
pub fn covered_range(answer: &Value) -> Value {
    let seconds = |key: &str| answer.get(key).and_then(Value::as_f64);
    let first_minute = answer
        .get("points")
        .and_then(|p| p.get(0))
        .and_then(|p| p.get(0))
        .and_then(Value::as_f64);
    let from = first_minute.map(|m| seconds("data_since").map_or(m, |s| s.max(m)));
    let to = seconds("data_until").or_else(|| seconds("to"));
    let unseen = seconds("unseen_seconds").unwrap_or(0.0);
    match (from, to) {
        (Some(from), Some(to)) if from < to => {
            let mut range = json!({"from": from, "to": to, "seconds": to - from - unseen});
            if unseen > 0.0 {
                range["unseen_seconds"] = json!(unseen);
            }
            range
        }
        _ => Value::Null,
    }
}

/// The value of a one-step `/api/history` answer (`None`: no data in the range).
pub fn single_value(answer: &Value) -> Option<f64> {
    answer
        .get("points")?
        .as_array()?
        .iter()
        .find_map(|p| p.get(1).and_then(Value::as_f64))
}

/// One KPI of a history report: its value, and with `--compare` the baseline and the deltas.
pub fn history_row(
    kpi: &str,
    unit: Unit,
    value: Option<f64>,
    baseline: Option<Option<f64>>,
) -> Value {
    let mut row = json!({"kpi": kpi, "unit": unit.name(), "value": value});
    if let Some(before) = baseline {
        let delta = value.zip(before).map(|(a, b)| a - b);
        let change = value
            .zip(before)
            .and_then(|(a, b)| (b != 0.0).then_some((a - b) / b));
        row["baseline"] = json!(before);
        row["delta"] = json!(delta);
        row["change"] = json!(change);
    }
    row
}

/// Fetches a history report from the collector at `url`.
pub async fn fetch_history(
    api: &ApiClient,
    url: &str,
    h: &HistoryRequest,
) -> anyhow::Result<Value> {
    let base = url.trim_end_matches('/');
    // Minutes by this machine's clock (the collector's minutes are Unix minutes too).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (current, before) = history_ranges(now, h.since, h.compare);
    let mut rows = Vec::with_capacity(HISTORY_KPIS.len());
    let mut covered = Value::Null;
    let mut baseline_covered = Value::Null;
    for (kpi, unit) in HISTORY_KPIS {
        let answer = api
            .get_json(&format!(
                "{base}/api/history?{}",
                history_query(kpi, current, h)
            ))
            .await?;
        if covered.is_null() {
            covered = covered_range(&answer);
        }
        let baseline = match before {
            Some(range) => {
                let answer = api
                    .get_json(&format!(
                        "{base}/api/history?{}",
                        history_query(kpi, range, h)
                    ))
                    .await?;
                if baseline_covered.is_null() {
                    baseline_covered = covered_range(&answer);
                }
                Some(single_value(&answer))
            }
            None => None,
        };
        rows.push(history_row(kpi, unit, single_value(&answer), baseline));
    }
    Ok(json!({
        "source": base,
        "since_seconds": h.since.as_secs(),
        "compare_seconds": h.compare.map(|d| d.as_secs()),
        "covered": covered,
        "baseline_covered": baseline_covered,
        "service": h.service,
        "model": h.model,
        "kpis": rows,
    }))
}

/// Fetches every part of a report from the collector at `url`.
pub async fn fetch_report(api: &ApiClient, url: &str, window: &str) -> anyhow::Result<Value> {
    let base = url.trim_end_matches('/');
    let kpis = api
        .get_json(&format!("{base}/api/kpis?window={window}"))
        .await?;
    // The other parts are optional: an older or differently configured collector may lack them.
    let critical_path = api
        .get_json(&format!("{base}/api/critical-path?window={window}"))
        .await
        .unwrap_or(Value::Null);
    let findings = api
        .get_json(&format!("{base}/api/findings?window={window}"))
        .await
        .unwrap_or(Value::Null);
    let alerts = api
        .get_json(&format!("{base}/api/alerts"))
        .await
        .unwrap_or(Value::Null);
    Ok(json!({
        "source": base,
        "window_seconds": kpis.get("window_seconds").cloned().unwrap_or(Value::Null),
        "kpis": kpis,
        "critical_path": critical_path,
        "undiagnosed": findings.get("undiagnosed").cloned().unwrap_or(Value::Null),
        "diagnosis_min_requests": findings.get("min_requests").cloned().unwrap_or(Value::Null),
        "findings": findings,
        "alerts": alerts,
    }))
}

/// Prints a report in the chosen format.
pub fn print_report(report: &Value, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Table => print!("{}", render::report_table(report)),
        Format::Json => println!("{}", serde_json::to_string_pretty(report)?),
    }
    Ok(())
}

/// Runs `infertrace report`.
pub async fn run(args: ReportArgs) -> anyhow::Result<ExitCode> {
    let tls = TlsClientConfig {
        ca_file: args.ca_file.clone(),
        cert_file: args.cert_file.clone(),
        key_file: args.key_file.clone(),
    };
    let api = ApiClient::new(&args.url, &tls)?;
    if args.since.is_some() || args.compare.is_some() {
        let h = HistoryRequest {
            since: match &args.since {
                Some(s) => parse_span("--since", s)?,
                None => Duration::from_secs(3600),
            },
            compare: args
                .compare
                .as_deref()
                .map(|c| parse_span("--compare", c))
                .transpose()?,
            service: args.service,
            model: args.model,
        };
        if let Some(c) = h.compare.filter(|c| *c < h.since) {
            anyhow::bail!(
                "--compare {} is shorter than --since {}: the compared range is as long as \
                 --since and would overlap it; compare with at least {}",
                humantime::format_duration(c),
                humantime::format_duration(h.since),
                humantime::format_duration(h.since)
            );
        }
        let report = fetch_history(&api, &args.url, &h).await?;
        match args.format {
            Format::Table => print!("{}", render::history_table(&report)),
            Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let report = fetch_report(&api, &args.url, &args.window).await?;
    print_report(&report, args.format)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> HistoryRequest {
        HistoryRequest {
            since: Duration::from_secs(3600),
            compare: None,
            service: None,
            model: None,
        }
    }

    /// The minute `now` falls in (2023-11-14), and `now` 25 s into it.
    const MINUTE: u64 = 28_333_333;
    const NOW: u64 = MINUTE * 60 + 25;

    /// The start of the minute `offset` minutes from [`MINUTE`].
    fn m(offset: i64) -> u64 {
        (MINUTE as i64 + offset) as u64 * 60
    }

    #[test]
    fn queries_cover_the_range_in_one_step() {
        let h = HistoryRequest {
            model: Some("llama 3/8b".into()),
            ..req()
        };
        let (current, before) = history_ranges(NOW, h.since, Some(Duration::from_secs(86_400)));
        assert_eq!(
            history_query("ttft.p99", current, &h),
            format!(
                "kpi=ttft.p99&from={}&to=now&step=3720&model=llama%203%2F8b",
                m(-60)
            )
        );
        // A day before: as many minutes as the current range (61, its last partial).
        assert_eq!(
            history_query("requests", before.expect("a baseline"), &req()),
            format!(
                "kpi=requests&from={}&to={}&step=3720",
                m(-60 - 1440),
                m(1 - 1440)
            )
        );
    }

    /// The review's cases, 25 s into a minute: the baseline is whole minutes, the same number
    /// as the current range's where they fit, never its first minute.
    #[test]
    fn the_baseline_is_whole_minutes_before_the_current_range() {
        let range = |now: u64, since: u64, compare: u64| {
            let (current, before) = history_ranges(
                now,
                Duration::from_secs(since),
                Some(Duration::from_secs(compare)),
            );
            let before = before.expect("a baseline");
            (
                current.from,
                before.from,
                before.to.expect("a baseline ends"),
            )
        };
        // --since 3m --compare 3m: minutes −3 to 0 now (0 partial), −6 to −4 before.
        assert_eq!(range(NOW, 180, 180), (m(-3), m(-6), m(-3)));
        // --since 1h --compare 1h: the 60 whole minutes before the current range's 61.
        assert_eq!(range(NOW, 3600, 3600), (m(-60), m(-120), m(-60)));
        // --since 1m --compare 3m: minutes −1 and 0 now, the same two 3 minutes earlier.
        assert_eq!(range(NOW, 60, 180), (m(-1), m(-4), m(-2)));
        // --compare 90s shifts by whole minutes: 2.
        assert_eq!(range(NOW, 90, 90), (m(-2), m(-4), m(-2)));
        // On a minute's start the current range is whole minutes too.
        assert_eq!(range(m(0), 180, 180), (m(-3), m(-6), m(-3)));
    }

    #[test]
    fn the_covered_range_is_within_the_stores_data() {
        let answer = |extra: Value| {
            let mut a = json!({"from": 1000.5, "to": 1250.0, "points": [[960.0, 3.0]]});
            if let Value::Object(m) = extra {
                a.as_object_mut().unwrap().extend(m);
            }
            a
        };
        assert_eq!(
            covered_range(&answer(json!({}))),
            json!({"from": 960.0, "to": 1250.0, "seconds": 290.0})
        );
        assert_eq!(
            covered_range(&answer(json!({"data_until": 1244.0}))),
            json!({"from": 960.0, "to": 1244.0, "seconds": 284.0})
        );
        assert_eq!(
            covered_range(&answer(json!({"data_since": 1010.0, "data_until": 1244.0}))),
            json!({"from": 1010.0, "to": 1244.0, "seconds": 234.0})
        );
        assert_eq!(
            covered_range(&answer(
                json!({"data_since": 1010.0, "unseen_seconds": 30.0})
            )),
            json!({"from": 1010.0, "to": 1250.0, "seconds": 210.0, "unseen_seconds": 30.0})
        );
        // A range wholly before the store's data covers nothing.
        assert_eq!(
            covered_range(&answer(json!({"data_since": 1300.0}))),
            Value::Null
        );
        assert_eq!(
            covered_range(&json!({"to": 1250.0, "points": []})),
            Value::Null
        );
    }

    #[test]
    fn rows_carry_deltas() {
        let r = history_row("e2e.p99", Unit::Seconds, Some(0.3), Some(Some(0.2)));
        assert!((r["delta"].as_f64().unwrap() - 0.1).abs() < 1e-12);
        assert!((r["change"].as_f64().unwrap() - 0.5).abs() < 1e-12);
        let r = history_row("requests", Unit::Count, Some(5.0), Some(None));
        assert!(r["delta"].is_null() && r["baseline"].is_null());
        let r = history_row("requests", Unit::Count, Some(5.0), None);
        assert!(r.get("delta").is_none());
        assert_eq!(
            single_value(&json!({"points": [[1.0, null], [2.0, 4.5]]})),
            Some(4.5)
        );
        assert_eq!(single_value(&json!({"points": []})), None);
        assert!(parse_span("--since", "0s").is_err());
        assert!(parse_span("--since", "soon").is_err());
    }
}
