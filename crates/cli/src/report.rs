//! `infertrace report`: the latency breakdown, critical path and findings of a running collector.
//!
//! With `--since 1h` the report covers a stretch of the collector's history instead of a live
//! window (from its store, through `GET /api/history`): end-to-end, TTFT and TPOT p50/p99,
//! requests, rates, goodput and phase shares. `--compare 1h` adds the same KPIs over the same
//! length of time one hour earlier, with the deltas. Ranges are whole minutes (the store keeps
//! minute rollups), so `--since 1h` covers the current minute and the 60 before it; the
//! compared range ends before the first of those minutes, so that no minute counts on both
//! sides (with `--compare` equal to `--since`: the 60 whole minutes before).

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
    /// Compare with the same KPIs this long ago (e.g. 1h, 1d), with deltas; over --since
    /// (default 1h) of history.
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

/// The `/api/history` query of `kpi` over the `span` ending `ago` before now, as one step. A
/// range `ago` before (a baseline) ends at the latest where the current range's first minute
/// begins, `into_minute` seconds before its start (`now - span`), so that no minute is in
/// both.
pub fn history_query(
    kpi: &str,
    span: Duration,
    ago: Duration,
    into_minute: u64,
    h: &HistoryRequest,
) -> String {
    let (span, ago) = (span.as_secs(), ago.as_secs());
    let to = if ago == 0 {
        "now".to_owned()
    } else {
        format!("-{}s", ago.max(span + into_minute))
    };
    // One step covering the whole range: the range starts at the minute holding `from`.
    let step = span + 60;
    let mut q = format!(
        "kpi={}&from=-{}s&to={to}&step={step}",
        encode_query(kpi),
        span + ago
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
/// falls in: `{"from", "to", "seconds"}` (Unix seconds), what its rates divide by.
pub fn covered_range(answer: &Value) -> Value {
    let from = answer
        .get("points")
        .and_then(|p| p.get(0))
        .and_then(|p| p.get(0))
        .and_then(Value::as_f64);
    match (from, answer.get("to").and_then(Value::as_f64)) {
        (Some(from), Some(to)) => json!({"from": from, "to": to, "seconds": to - from}),
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
    // How far into its minute the current range starts, by this machine's clock (the
    // collector's minutes are Unix minutes too).
    let into_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| now.saturating_sub(h.since).as_secs() % 60);
    let mut rows = Vec::with_capacity(HISTORY_KPIS.len());
    let mut covered = Value::Null;
    for (kpi, unit) in HISTORY_KPIS {
        let now = api
            .get_json(&format!(
                "{base}/api/history?{}",
                history_query(kpi, h.since, Duration::ZERO, into_minute, h)
            ))
            .await?;
        if covered.is_null() {
            covered = covered_range(&now);
        }
        let baseline = match h.compare {
            Some(ago) => {
                let before = api
                    .get_json(&format!(
                        "{base}/api/history?{}",
                        history_query(kpi, h.since, ago, into_minute, h)
                    ))
                    .await?;
                Some(single_value(&before))
            }
            None => None,
        };
        rows.push(history_row(kpi, unit, single_value(&now), baseline));
    }
    Ok(json!({
        "source": base,
        "since_seconds": h.since.as_secs(),
        "compare_seconds": h.compare.map(|d| d.as_secs()),
        "covered": covered,
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

    #[test]
    fn queries_cover_the_range_in_one_step() {
        let h = HistoryRequest {
            model: Some("llama 3/8b".into()),
            ..req()
        };
        assert_eq!(
            history_query("ttft.p99", h.since, Duration::ZERO, 25, &h),
            "kpi=ttft.p99&from=-3600s&to=now&step=3660&model=llama%203%2F8b"
        );
        // The hour before ends where the current range's first minute begins (25 s before its
        // start): that minute is not counted twice.
        assert_eq!(
            history_query("requests", h.since, Duration::from_secs(3600), 25, &req()),
            "kpi=requests&from=-7200s&to=-3625s&step=3660"
        );
        // A day before is far from it.
        assert_eq!(
            history_query("requests", h.since, Duration::from_secs(86_400), 25, &req()),
            "kpi=requests&from=-90000s&to=-86400s&step=3660"
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
