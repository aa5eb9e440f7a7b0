//! `infertrace report`: the latency breakdown, critical path and findings of a running collector.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use crate::http_get::get_json;
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
pub struct ReportArgs {
    /// Base URL of the collector's API (its --listen address).
    #[arg(long, default_value = "http://127.0.0.1:9464")]
    pub url: String,
    /// Window to report on: one of the collector's KPI windows (1m, 5m, 1h by default).
    #[arg(long, default_value = "5m")]
    pub window: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Fetches every part of a report from the collector at `url`.
pub async fn fetch_report(url: &str, window: &str) -> anyhow::Result<Value> {
    let base = url.trim_end_matches('/');
    let kpis = get_json(&format!("{base}/api/kpis?window={window}")).await?;
    // The other parts are optional: an older or differently configured collector may lack them.
    let critical_path = get_json(&format!("{base}/api/critical-path?window={window}")).await.unwrap_or(Value::Null);
    let findings = get_json(&format!("{base}/api/findings?window={window}")).await.unwrap_or(Value::Null);
    let alerts = get_json(&format!("{base}/api/alerts")).await.unwrap_or(Value::Null);
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
    let report = fetch_report(&args.url, &args.window).await?;
    print_report(&report, args.format)?;
    Ok(ExitCode::SUCCESS)
}
