//! `tonic-server`: the example `Generator` gRPC service (unary `Generate`, server-streaming
//! `GenerateStream`) on the simulated engine, traced by `InferenceTraceLayer`.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use infertrace_demo::grpc::{self, GeneratorServer};
use infertrace_demo::server::{ServerOptions, Telemetry, shutdown_signal};
use infertrace_sim::Simulator;

/// gRPC inference server (infertrace.examples.v1.Generator: Generate and GenerateStream, see
/// crates/demo/proto/generate.proto) on a simulated continuous-batching engine, traced by
/// InferenceTraceLayer. OTLP export is configured by the standard OTEL_* variables.
#[derive(Parser, Debug)]
#[command(name = "tonic-server", version)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
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
            eprintln!("tonic-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let telemetry = Telemetry::init("tonic-server", !cli.opts.no_otlp)?;
    let sim = Simulator::start(cli.opts.sim_config()).context("bad simulator flags")?;
    let layer = telemetry.attach(cli.opts.layer(&sim));
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
    tracing::info!(listen = %cli.listen, model = %cli.opts.model, mode = ?cli.opts.mode, "tonic-server ready");
    let served = grpc::serve(
        listener,
        GeneratorServer::new(sim, &cli.opts.model),
        layer,
        stop,
    )
    .await
    .context("server failed");
    telemetry.shutdown();
    served
}
