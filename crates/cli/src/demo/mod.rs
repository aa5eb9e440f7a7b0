//! `infertrace demo`: the whole loop in one process, on embedded defaults.
//!
//! 1. starts the collector (OTLP/gRPC on a free port, the API on `--listen`);
//! 2. starts a simulated continuous-batching engine ([`infertrace_sim`]) behind an
//!    OpenAI-compatible axum server wrapped in [`InferenceTraceLayer`], exporting OTLP to (1).
//!    The layer samples a **simulated** GPU ([`SimulatedGpu`]: utilisation = the engine's busy
//!    fraction, power and energy from it, memory from the KV cache) plus the real host and process
//!    counters, so the report shows GPU utilisation per phase and energy per output token, and
//!    the diagnosis can tell a saturated GPU from an idle one;
//! 3. drives it with the Poisson load generator, with a progress bar;
//! 4. flushes the spans, waits for the collector to assemble every trace, and prints the report
//!    — plus what infertrace measured beside the simulator's ground truth (its own clock, from
//!    the moment the handler submitted the request) and what the client saw.
//!
//! `--scenario` picks a workload whose bottleneck is known, so the diagnosis can be seen to change.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use infertrace_demo::loadgen::{self, LoadConfig};
use infertrace_demo::{openai, shutdown_signal};
use infertrace_sim::{SimulatedGpu, Simulator};
use infertrace_tower::InferenceTraceLayer;
use infertrace_tower::otlp::{self, OtlpConfig};
use serde_json::json;

use crate::report::{Format, print_report};

mod args;
mod collector;
mod pd;
mod truth;
mod workload;

pub use args::DemoArgs;
use collector::{local_report, report_window, start_collector, wait_for_requests};
use truth::{client_summary, ground_truth, truth_table};
use workload::{GPU_SAMPLE_INTERVAL, MODEL, workload};

/// Runs `infertrace demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    if args.duration.is_zero() {
        anyhow::bail!("--duration must be longer than zero (e.g. --duration 30s)");
    }
    if args.scenario.is_pd() {
        return pd::run(args).await;
    }
    let wl = workload(args.scenario, args.rate, args.duration, args.seed);
    let interactive = std::io::stderr().is_terminal();

    // 1. The collector.
    let collector = start_collector(&args, Duration::from_millis(500)).await?;
    let grpc = collector
        .grpc_addr
        .context("the demo needs the OTLP/gRPC receiver")?;

    // 2. The instrumented server on the simulated engine.
    let providers = otlp::init(
        OtlpConfig::grpc(format!("http://{grpc}"))
            .service_name("infertrace-demo")
            .metrics(false),
    )
    .context("setting up OTLP export to the collector")?;
    let sim = Simulator::start(wl.sim.clone())
        .map_err(|e| anyhow::anyhow!("starting the simulator: {e}"))?;
    let layer = InferenceTraceLayer::new()
        .with_otlp(&providers)
        .default_model(MODEL)
        .gpu_telemetry(SimulatedGpu::telemetry(
            sim.clone(),
            GPU_SAMPLE_INTERVAL,
            true,
        ));
    let app = openai::router(sim.clone(), layer, MODEL);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the demo server")?;
    let server_addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(openai::serve(listener, app, async move {
        let _ = stop_rx.await;
    }));

    eprintln!(
        "infertrace demo: scenario {} — {}; {:.1} req/s for {}",
        args.scenario.name(),
        wl.description,
        wl.load.rate,
        humantime::format_duration(args.duration)
    );
    eprintln!(
        "  collector API http://{}  ·  server http://{server_addr}",
        collector.api_addr
    );

    // 3. Load.
    let load_cfg = LoadConfig {
        target: format!("http://{server_addr}"),
        ..wl.load.clone()
    };
    let started = Instant::now();
    let load = loadgen::run(&load_cfg, interactive)
        .await
        .context("running the load generator")?;

    // 4. Flush spans and let the collector assemble every trace.
    let p = providers.clone();
    tokio::task::spawn_blocking(move || p.tracer_provider.force_flush())
        .await
        .context("flushing spans")?
        .map_err(|e| anyhow::anyhow!("flushing spans to the collector: {e}"))?;
    let expected = load.sent;
    let window = report_window(started.elapsed());
    let received = wait_for_requests(&collector, window, expected, Duration::from_secs(10)).await;
    if received < expected {
        eprintln!(
            "infertrace demo: note: the collector has {received} of {expected} requests after 10s"
        );
    }

    let mut report = local_report(&collector, window);
    report["source"] = json!(format!("demo ({})", args.scenario.name()));
    report["client"] = client_summary(&load);
    report["ground_truth"] = ground_truth(&sim);
    print_report(&report, args.format)?;
    if args.format == Format::Table {
        print!("{}", truth_table(&report));
    }

    if args.keep {
        // Listening before saying so: a Ctrl-C right after the line still stops it gracefully.
        let stop = shutdown_signal();
        eprintln!(
            "\ninfertrace demo: still running — dashboard http://{0}/ · metrics http://{0}/metrics · KPIs http://{0}/api/kpis?window=5m · report: infertrace report --url http://{0}  (Ctrl-C stops)",
            collector.api_addr
        );
        stop.await;
    }
    let _ = stop_tx.send(());
    let _ = server.await;
    let p = providers.clone();
    let _ = tokio::task::spawn_blocking(move || p.shutdown()).await;
    collector.stop().await.context("stopping the collector")?;
    Ok(ExitCode::SUCCESS)
}
