//! `infertrace collect` (run the collector) and `infertrace check-config` (validate a config).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use infertrace_collector::config::CollectorConfig;
use infertrace_collector::server;

/// Arguments of `infertrace collect`. Flags override the config file.
#[derive(Args, Debug)]
pub struct CollectArgs {
    /// YAML config file (see otel-config/infertrace.yaml for every key and its default).
    #[arg(long, short = 'c', env = "INFERTRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// OTLP/gRPC listen address [default: 127.0.0.1:4317].
    #[arg(long, value_name = "ADDR")]
    pub otlp_grpc: Option<SocketAddr>,
    /// OTLP/HTTP listen address [default: 127.0.0.1:4318].
    #[arg(long, value_name = "ADDR")]
    pub otlp_http: Option<SocketAddr>,
    /// API, dashboard and Prometheus /metrics listen address [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Directory of the history store (infertrace.db) [default: ./infertrace-data].
    #[arg(long, value_name = "PATH", conflicts_with = "no_store")]
    pub data_dir: Option<PathBuf>,
    /// Keep no history: everything stays in memory (no /api/history, no report --since).
    #[arg(long)]
    pub no_store: bool,
}

/// Arguments of `infertrace check-config`.
#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// The YAML config file to validate.
    pub file: PathBuf,
}

/// Loads the config file (or the defaults) and applies the command-line overrides.
pub fn load_config(args: &CollectArgs) -> anyhow::Result<CollectorConfig> {
    let mut config = match &args.config {
        Some(path) => CollectorConfig::from_file(path).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => CollectorConfig::default(),
    };
    if let Some(a) = args.otlp_grpc {
        config.receivers.otlp_grpc.endpoint = a;
    }
    if let Some(a) = args.otlp_http {
        config.receivers.otlp_http.endpoint = a;
    }
    if let Some(a) = args.listen {
        config.api.listen = a;
    }
    if let Some(dir) = &args.data_dir {
        config.store.data_dir = dir.clone();
        config.store.enabled = true;
    }
    if args.no_store {
        config.store.enabled = false;
    }
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    Ok(config)
}

/// Waits for SIGINT or SIGTERM (the example servers' handler: one implementation for both).
pub use infertrace_examples::server::shutdown_signal;

/// Runs `infertrace collect` until SIGINT/SIGTERM, then shuts down gracefully: in-flight
/// requests get until `shutdown_timeout` (default 15 s), then every connection is cut.
pub async fn run(args: CollectArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(&args)?;
    let (grpc_tls, http_tls, api_tls) = (
        config.receivers.otlp_grpc.tls.is_some(),
        config.receivers.otlp_http.tls.is_some(),
        config.api.tls.is_some(),
    );
    let collector = server::run(config, shutdown_signal())
        .await
        .context("starting the collector")?;
    let show = |a: Option<SocketAddr>, tls: bool| {
        a.map_or("disabled".to_owned(), |a| match tls {
            true => format!("{a} (TLS)"),
            false => a.to_string(),
        })
    };
    let api_scheme = if api_tls { "https" } else { "http" };
    let history = collector.store().map_or("history: off".to_owned(), |s| {
        format!("history: {}", s.path().display())
    });
    eprintln!(
        "infertrace collector: OTLP/gRPC {}  OTLP/HTTP {}  API {api_scheme}://{}  (metrics: /metrics, KPIs: /api/kpis; {history}; Ctrl-C stops)",
        show(collector.grpc_addr, grpc_tls),
        show(collector.http_addr, http_tls),
        collector.api_addr
    );
    let report = collector
        .join()
        .await
        .context("collector stopped with an error")?;
    eprintln!(
        "infertrace collector: stopped; {} traces in flight were closed and recorded",
        report.flushed.traces
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs `infertrace check-config FILE`: parses and validates the file, and reads and parses
/// every TLS certificate, key and CA file it names.
pub fn check_config(args: CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let config = match CollectorConfig::from_file(&args.file) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    // The TLS files are read and parsed as the collector would at start.
    if let Err(e) = config.tls_server_configs() {
        eprintln!("{}: TLS: {e}", args.file.display());
        return Ok(ExitCode::FAILURE);
    }
    println!("{}: OK", args.file.display());
    Ok(ExitCode::SUCCESS)
}
