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
    /// SIGTERM/Ctrl-C: stop accepting, finish in-flight requests until `shutdown_timeout`, flush.
    Collect(collect::CollectArgs),
    /// Run everything in one process on a simulated engine, then print the report.
    Demo(demo::DemoArgs),
    /// Print the latency breakdown, critical path and findings of a running collector.
    Report(report::ReportArgs),
    /// Analyse exported trace files (OTLP JSON or Jaeger JSON) offline.
    Analyze(analyze::AnalyzeArgs),
    /// Validate a collector config file; prints each problem with its line number.
    ///
    /// Checks what `collect` would need as `collect` would: the TLS files of the listeners and
    /// of https:// forward and Alertmanager URLs are read and parsed, and ${NAME} in
    /// forward.headers is looked up in this command's environment.
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
    let result = rt.block_on(fut);
    // Tasks still running (a connection being cut, a blocking read) must not hold the exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    result
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

unsafe extern "C" {
    /// mimalloc's `mi_option_set` (linked in by the `mimalloc` crate).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    /// mimalloc's `mi_option_get`.
    #[cfg(test)]
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
}

/// `mi_option_purge_delay` in the `mi_option_t` enum of the mimalloc (v3) that
/// `libmimalloc-sys` builds (a test checks it against that option's default).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// How long mimalloc keeps freed memory before returning it to the OS, in milliseconds
/// (mimalloc's default is 1,000).
///
/// The collector recycles its memory on the cycle of the assembly grace period (2 s by
/// default): the memory of the traces one tick completes is what the next seconds' traces
/// need. Returned after 1 s, much of it was faulted in again a moment later. Measured at full
/// ingest rate over HTTP, once the collector had reached its working size (40 s of load, then
/// 10 s counted): 27,000 page faults a second with mimalloc's default, 8,000 with 4 s, and
/// 1,984K → 2,095K spans per CPU-second (docs/PERFORMANCE.md). Memory left free for longer
/// than this still goes back to the OS.
const PURGE_DELAY_MS: std::ffi::c_long = 4_000;

/// Tunes mimalloc for the collector, leaving any setting made in the environment as it is:
///
/// - **Transparent huge pages off** for this process (what mimalloc's own
///   `MIMALLOC_ALLOW_THP=0` does), unless `MIMALLOC_ALLOW_THP` is set. mimalloc asks for huge
///   pages, and on kernels with THP `defrag=madvise` (a common default) every fresh 2 MiB region
///   is then compacted and zeroed synchronously on first touch: the collector, which allocates
///   whole traces at the rate it receives them and grows while a backlog builds, spent 22–30 %
///   of its CPU in `clear_page_erms` at full ingest rate (docs/PERFORMANCE.md); 4 KiB pages
///   fault in far more cheaply. The setting is inherited by child processes (infertrace starts
///   none).
/// - **Freed memory kept for [`PURGE_DELAY_MS`]** before it is returned to the OS, unless
///   `MIMALLOC_PURGE_DELAY` is set.
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
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's runtime options (read at each purge), with an option
        // number checked by `purge_delay_is_the_option_it_names` below.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `MI_OPTION_PURGE_DELAY` names mimalloc's `purge_delay`: the option at that number has
    /// its default (1,000 ms in mimalloc v3; no neighbouring option defaults to 1,000), and a
    /// value set there is read back.
    #[test]
    fn purge_delay_is_the_option_it_names() {
        // SAFETY: reads and sets mimalloc runtime options by number.
        unsafe {
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                assert_eq!(mi_option_get(MI_OPTION_PURGE_DELAY), 1_000);
            }
            mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
            assert_eq!(mi_option_get(MI_OPTION_PURGE_DELAY), PURGE_DELAY_MS);
        }
    }
}
