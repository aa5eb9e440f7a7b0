//! `infertrace`: where did each LLM request's time go, and what do I change?
//!
//! A thin binary over the library crates: `collect` runs the OTLP collector, `demo` runs the whole
//! loop in one process on a simulated engine, `report` prints what a running collector knows,
//! `analyze` does the same offline on exported trace files, and `check-config` validates a config.

mod analyze;
mod collect;
mod demo;
mod http_get;
mod jaeger_json;
mod render;
mod report;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// infertrace: LLM inference tracing — queue, prefill and decode, critical paths, diagnoses.
#[derive(Parser, Debug)]
#[command(name = "infertrace", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the collector: OTLP in (gRPC :4317, HTTP :4318), KPIs, /metrics and the API out (:9464).
    Collect(collect::CollectArgs),
    /// Run everything in one process on a simulated engine, then print the report.
    Demo(demo::DemoArgs),
    /// Print the latency breakdown, critical path and findings of a running collector.
    Report(report::ReportArgs),
    /// Analyse exported trace files (OTLP JSON or Jaeger JSON) offline.
    Analyze(analyze::AnalyzeArgs),
    /// Validate a collector config file; prints each problem with its line number.
    CheckConfig(collect::CheckConfigArgs),
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Collect(args) => run_async(collect::run(args)),
        Command::Demo(args) => run_async(demo::run(args)),
        Command::Report(args) => run_async(report::run(args)),
        Command::Analyze(args) => analyze::run(args),
        Command::CheckConfig(args) => collect::check_config(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("infertrace: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_async<F>(fut: F) -> anyhow::Result<ExitCode>
where
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    rt.block_on(fut)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INFERTRACE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// mimalloc: the decoder and the pipeline allocate many small strings and vectors, which glibc's
/// malloc handles markedly slower (measured in docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(target_os = "linux")]
unsafe extern "C" {
    /// glibc's `prctl(2)`.
    fn prctl(option: std::ffi::c_int, ...) -> std::ffi::c_int;
}

/// Turns transparent huge pages off for this process (what mimalloc's own
/// `MIMALLOC_ALLOW_THP=0` does), unless `MIMALLOC_ALLOW_THP` is set. mimalloc asks for huge
/// pages, and on kernels with THP `defrag=madvise` (a common default) every fresh 2 MiB region
/// is then compacted and zeroed synchronously on first touch: the collector, which allocates
/// whole traces at the rate it receives them and grows while a backlog builds, spent 22–30 % of
/// its CPU in `clear_page_erms` at full ingest rate (docs/PERFORMANCE.md); 4 KiB pages fault in
/// far more cheaply. The setting is inherited by child processes (infertrace starts none).
fn tune_allocator() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        const PR_SET_THP_DISABLE: std::ffi::c_int = 41;
        // SAFETY: prctl with an integer option and integer arguments; failure (an old
        // kernel) leaves THP as it was, which is only slower.
        unsafe {
            prctl(
                PR_SET_THP_DISABLE,
                1 as std::ffi::c_ulong,
                0 as std::ffi::c_ulong,
                0 as std::ffi::c_ulong,
                0 as std::ffi::c_ulong,
            )
        };
    }
}
