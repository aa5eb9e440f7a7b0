//! `infertrace`: where did each LLM request's time go, and what do I change?
//!
//! A thin binary over the library crates: `collect` runs the OTLP collector, `demo` runs the whole
//! loop in one process on a simulated engine, `report` prints what a running collector knows,
//! `analyze` does the same offline on exported trace files, and `check-config` validates a config.

mod analyze;
mod collect;
mod console;
mod demo;
mod http_get;
mod jaeger_json;
mod otlp_envelopes;
mod render;
mod report;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// infertrace: LLM inference tracing — queue, prefill and decode, critical paths, diagnoses.
#[derive(Parser, Debug)]
#[command(
    name = "infertrace",
    version,
    about,
    long_about = None,
    after_help = "Logs go to standard error. INFERTRACE_LOG sets the level (default warn; e.g. \
                  info, or warn,infertrace_collector=debug); INFERTRACE_LOG_FORMAT=json writes \
                  one JSON object a line."
)]
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
    /// Validate a collector config file; prints every problem, each with its line.
    ///
    /// Checks what `collect` would need as `collect` would: the TLS files of the listeners and
    /// of https:// forward and Alertmanager URLs are read and parsed, the tokens (auth.tokens_file,
    /// --tokens-file or INFERTRACE_TOKENS_FILE, INFERTRACE_TOKENS) are read, ${NAME} in
    /// forward.headers is looked up in this command's environment, and store.data_dir must be a
    /// directory that exists or can be created, its infertrace.db (if any) a history store this
    /// build opens (read-only here: nothing is created or changed; --no-store skips this).
    /// Every problem is
    /// printed, not only the first (with file:line:column where the file sets the key); exit
    /// status 1 if any.
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
            console::say("ERROR", &format!("infertrace: error: {err:#}"));
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

/// Logs to standard error: level from `INFERTRACE_LOG` (default `warn`), one JSON object a
/// line with `INFERTRACE_LOG_FORMAT=json`, colours only on a terminal (not in `docker logs`).
fn init_logging() {
    use std::io::IsTerminal;
    if let Ok(format) = std::env::var("INFERTRACE_LOG_FORMAT")
        && !matches!(format.to_ascii_lowercase().as_str(), "json" | "text" | "")
    {
        console::say(
            "WARN",
            &format!("INFERTRACE_LOG_FORMAT={format:?} is neither json nor text; writing text"),
        );
    }
    let filter = match std::env::var("INFERTRACE_LOG") {
        Ok(level) => tracing_subscriber::EnvFilter::try_new(&level)
            .inspect(|_| {
                for word in bare_targets(&level) {
                    console::say(
                        "WARN",
                        &format!(
                            "INFERTRACE_LOG: {word:?} is no level (trace, debug, info, warn, \
                             error, off) and no crate of infertrace's: it turns on that target \
                             alone; write e.g. info, or warn,infertrace_collector=debug"
                        ),
                    );
                }
            })
            .unwrap_or_else(|e| {
                console::say(
                    "WARN",
                    &format!("INFERTRACE_LOG={level:?} is not a log filter ({e}); logging at warn"),
                );
                tracing_subscriber::EnvFilter::new("warn")
            }),
        Err(_) => tracing_subscriber::EnvFilter::new("warn"),
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if console::json_logs() {
        logs.json().try_init()
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
}

/// The directives of a log filter that are a bare word naming neither a level nor a crate the
/// binary logs from: valid filters (a target), but far more often a mistyped level (`debu`),
/// which would silence every log.
fn bare_targets(filter: &str) -> Vec<&str> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    const CRATES: [&str; 12] = [
        "infertrace",
        "tower",
        "hyper",
        "h2",
        "tonic",
        "axum",
        "rustls",
        "tokio",
        "opentelemetry",
        "reqwest",
        "rusqlite",
        "nvml",
    ];
    filter
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && !d.contains(['=', ':', '[']))
        .filter(|d| !LEVELS.iter().any(|l| d.eq_ignore_ascii_case(l)))
        .filter(|d| !CRATES.iter().any(|c| d.starts_with(c)))
        .collect()
}

/// mimalloc: the decoder and the pipeline allocate many small strings and vectors, which glibc's
/// malloc handles markedly slower (measured in docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay`: its number in the `mi_option_t` enum of the mimalloc v3
/// that `libmimalloc-sys` builds, which does not name it (checked by
/// `purge_delay_is_the_option_it_names`).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps freed memory before returning it to the OS, in milliseconds
/// (mimalloc's default is 1,000). The collector reuses memory on the cycle of its assembly
/// grace period (2 s by default); returned after 1 s, much of it was faulted in again a moment
/// later (page faults and throughput at 1 s and 4 s: docs/PERFORMANCE.md).
const PURGE_DELAY_MS: std::ffi::c_long = 4_000;

/// Tunes mimalloc for the collector, leaving any setting made in the environment as it is:
///
/// - **Transparent huge pages off** for this process, unless `MIMALLOC_ALLOW_THP` is set: what
///   mimalloc's own `MIMALLOC_ALLOW_THP=0` does, which can only be read from the environment
///   (mimalloc reads it when it starts, before `main`). With THP, fresh 2 MiB regions are
///   compacted and zeroed on first touch, a large share of the collector's CPU at full ingest
///   rate (docs/PERFORMANCE.md). Inherited by child processes (infertrace starts
///   none). The `mimalloc` crate's `no_thp` feature only stops mimalloc's `madvise` and would
///   not cover a kernel with THP `always`.
/// - **Freed memory kept for [`PURGE_DELAY_MS`]**, unless `MIMALLOC_PURGE_DELAY` is set, and
///   returned at once while the collector's resident memory is near the bound its memory
///   limit states ([`return_freed_memory`]).
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        infertrace_collector::resident::set_return_freed_memory(return_freed_memory);
    }
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // The variadic arguments are read as `unsigned long`: passed at that width.
        let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and touches no memory of
        // ours; on failure (an old kernel) THP stays as it was, which is only slower.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, on, unused, unused, unused) };
    }
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mimalloc's runtime options may be set at any time from any thread (the
        // purge delay is read at each purge); the option number is checked by a test.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// Tells mimalloc whether to return the freed memory it keeps to reuse: when `now` first, a
/// forced collection while the purge delay still stands (mimalloc purges, process wide, what
/// waits for the delay only while it is above 0), then no delay, so that memory freed from
/// then on is returned at once; when not, the delay it had before. The collector calls it at
/// each tick while its resident memory is near the bound its memory limit states, and once
/// after (`infertrace_collector::resident`). Not installed when `MIMALLOC_PURGE_DELAY` is set:
/// the operator chose.
fn return_freed_memory(now: bool) {
    use std::sync::OnceLock;
    static KEPT_FOR: OnceLock<std::ffi::c_long> = OnceLock::new();
    // SAFETY: mimalloc's options may be read and set, and `mi_collect` called, from any thread
    // at any time; none takes a pointer.
    unsafe {
        let kept_for =
            *KEPT_FOR.get_or_init(|| libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY));
        let delay = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY);
        if now && delay != 0 {
            libmimalloc_sys::mi_collect(true);
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
        } else if !now {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, kept_for);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mistyped level is said; levels, crate targets and span filters are not.
    #[test]
    fn bare_words_that_are_no_level_nor_crate_are_said() {
        assert_eq!(bare_targets("debu"), ["debu"]);
        assert_eq!(bare_targets("warn, nonsense ,INFO"), ["nonsense"]);
        for fine in [
            "",
            "info",
            "WARN",
            "warn,infertrace_collector=debug",
            "infertrace_collector",
            "hyper::proto=trace",
            "[request]=debug",
            "off",
        ] {
            assert!(bare_targets(fine).is_empty(), "{fine}");
        }
    }

    /// Held by the tests that set mimalloc's options (they run in parallel otherwise).
    static OPTIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    /// Whether a test set them already (the purge delay is no longer mimalloc's default).
    static OPTIONS_SET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    use std::sync::atomic::Ordering::Relaxed;

    /// The hook gives back what mimalloc keeps: 256 MiB written and freed on a thread of its
    /// own, which then ends, waits resident for a purge delay of a minute, until
    /// `return_freed_memory(true)` returns it; `false` restores the delay. (It did nothing
    /// when it set the delay to 0 before collecting: mimalloc purges what waits for the delay
    /// only while the delay is above 0.)
    #[cfg(target_os = "linux")]
    #[test]
    fn returning_freed_memory_gives_it_back() {
        let _options = OPTIONS.lock();
        OPTIONS_SET.store(true, Relaxed);
        const MIB: usize = 1 << 20;
        let resident = || infertrace_collector::resident::resident_bytes().unwrap_or(0);
        // SAFETY: sets a runtime option (see `tune_allocator`).
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 60_000) };
        // Memory freed while a purge is already scheduled is purged at that purge's (earlier)
        // expiry: so what is scheduled is purged first, and a try whose memory still went
        // before it was measured cannot judge the hook and is repeated, three times at most.
        let mut kept = 0;
        for _ in 0..3 {
            // SAFETY: a forced collection (see `return_freed_memory`).
            unsafe { libmimalloc_sys::mi_collect(true) };
            let before = resident();
            std::thread::spawn(|| {
                let blocks: Vec<Vec<u8>> = (0..4096).map(|_| vec![1u8; 64 << 10]).collect();
                drop(std::hint::black_box(blocks));
            })
            .join()
            .unwrap();
            kept = resident();
            if kept.saturating_sub(before) > 192 * MIB {
                break;
            }
            eprintln!(
                "freed memory gone before the hook ran ({} MiB before, {} MiB after): again",
                before / MIB,
                kept / MIB
            );
        }
        return_freed_memory(true);
        let returned = resident();
        return_freed_memory(false);
        eprintln!(
            "resident {} MiB kept, {} MiB after",
            kept / MIB,
            returned / MIB
        );
        assert!(
            kept.saturating_sub(returned) > 128 * MIB,
            "{} MiB kept, {} MiB after",
            kept / MIB,
            returned / MIB
        );
        // SAFETY: reads a runtime option.
        let delay = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(delay, 60_000, "the delay restored");
    }

    /// `MI_OPTION_PURGE_DELAY` names mimalloc's `purge_delay`: the linked mimalloc is v3 (whose
    /// option numbers the constant follows), the option at that number has the purge delay's
    /// default (1,000 ms; no neighbouring option defaults to 1,000) unless another test of this
    /// binary set it first, and a value set there is read back.
    #[test]
    fn purge_delay_is_the_option_it_names() {
        let _options = OPTIONS.lock();
        // `mi_version()` is major * 10,000 + minor * 100 + patch (30302 for v3.3.2).
        assert_eq!(
            GLOBAL.version() / 10_000,
            3,
            "mimalloc {}",
            GLOBAL.version()
        );
        // SAFETY: reads and sets a runtime option (see `tune_allocator`).
        unsafe {
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() && !OPTIONS_SET.load(Relaxed) {
                assert_eq!(libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY), 1_000);
            }
            OPTIONS_SET.store(true, Relaxed);
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
            assert_eq!(
                libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY),
                PURGE_DELAY_MS
            );
        }
    }

    /// After tuning, transparent huge pages are off for the process (unless the environment
    /// chose).
    #[cfg(target_os = "linux")]
    #[test]
    fn tuning_turns_thp_off() {
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            return;
        }
        let _options = OPTIONS.lock();
        OPTIONS_SET.store(true, Relaxed);
        tune_allocator();
        let unused: libc::c_ulong = 0;
        // SAFETY: PR_GET_THP_DISABLE reads a flag; integer arguments only.
        let disabled =
            unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, unused, unused, unused, unused) };
        assert_eq!(disabled, 1);
    }
}
