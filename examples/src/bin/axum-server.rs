//! `axum-server`: an OpenAI-compatible inference server on the simulated engine, traced by
//! `InferenceTraceLayer`, exporting OTLP configured by the standard `OTEL_*` variables.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use infertrace_demo::openai;
use infertrace_demo::server::{ServerOptions, Telemetry, shutdown_signal};
use infertrace_sim::Simulator;

/// OpenAI-compatible server (POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
/// GET /health) on a simulated continuous-batching engine, traced by InferenceTraceLayer.
///
/// Spans and metrics go out over OTLP as the standard variables say (OTEL_EXPORTER_OTLP_ENDPOINT,
/// OTEL_EXPORTER_OTLP_PROTOCOL=grpc|http/protobuf, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
/// OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG); Ctrl-C finishes open requests and flushes them.
///
/// Try: curl -N localhost:8080/v1/chat/completions -d '{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}'
#[derive(Parser, Debug)]
#[command(name = "axum-server", version)]
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
            eprintln!("axum-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let telemetry = Telemetry::init("axum-server", !cli.opts.no_otlp)?;
    let sim = Simulator::start(cli.opts.sim_config()).context("bad simulator flags")?;
    let layer = telemetry.attach(cli.opts.layer(&sim));
    let app = openai::router(sim, layer, &cli.opts.model);
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
    tracing::info!(listen = %cli.listen, model = %cli.opts.model, mode = ?cli.opts.mode, "axum-server ready");
    let served = openai::serve(listener, app, stop)
        .await
        .context("server failed");
    telemetry.shutdown();
    served
}
