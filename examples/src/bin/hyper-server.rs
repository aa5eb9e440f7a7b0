//! `hyper-server`: the OpenAI-compatible API as a bare hyper service (no framework) behind
//! `InferenceTraceLayer`.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use infertrace_demo::hyper_service::{self, OpenAiHyperService};
use infertrace_demo::openai::{Endpoint, OpenAiService};
use infertrace_demo::server::{ServerOptions, Telemetry, shutdown_signal};
use infertrace_sim::Simulator;

/// OpenAI-compatible server built on a bare hyper service (routing by hand, no framework) on a
/// simulated continuous-batching engine, traced by InferenceTraceLayer (GET /health and
/// /v1/models are skipped). OTLP export is configured by the standard OTEL_* variables.
#[derive(Parser, Debug)]
#[command(name = "hyper-server", version)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    opts: ServerOptions,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hyper-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let telemetry = Telemetry::init("hyper-server", !cli.opts.no_otlp)?;
    let sim = Simulator::start(cli.opts.sim_config()).context("bad simulator flags")?;
    let service = OpenAiHyperService::new(OpenAiService::new(sim.clone(), &cli.opts.model));
    let layer = telemetry.attach(
        cli.opts
            .layer(&sim)
            .skip(|head| Endpoint::from_path(head.uri.path()).is_none()),
    );
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {}; pick another address with --listen",
                cli.listen
            )
        })?;
    // Listening for SIGTERM before saying ready: one sent at once still stops it gracefully.
    let stop = shutdown_signal();
    tracing::info!(listen = %cli.listen, model = %cli.opts.model, mode = ?cli.opts.mode, "hyper-server ready");
    let served = hyper_service::serve(listener, service, layer, stop)
        .await
        .context("server failed");
    telemetry.shutdown();
    served
}
