//! `infertrace collect` (run the collector) and `infertrace check-config` (validate a config).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use infertrace_collector::InternalEvents;
use infertrace_collector::auth::{self, Authenticator};
use infertrace_collector::config::{CollectorConfig, ConfigError};
use infertrace_collector::server;
use infertrace_collector::server_tls::ListenersTls;
use infertrace_demo::ShutdownSignals;

use crate::console;

/// Arguments of `infertrace collect`. Flags override the config file.
#[derive(Args, Debug)]
pub struct CollectArgs {
    /// YAML config file (see otel-config/infertrace.yaml for every key and its default).
    #[arg(long, short = 'c', env = "INFERTRACE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen addresses overriding the file's.
    #[command(flatten)]
    pub listeners: ListenerArgs,
    /// Directory of the history store (infertrace.db); overrides store.data_dir (default
    /// ./infertrace-data).
    #[arg(long, value_name = "PATH", conflicts_with = "no_store")]
    pub data_dir: Option<PathBuf>,
    /// Keep no history: everything stays in memory (no /api/history, no report --since).
    #[arg(long)]
    pub no_store: bool,
    /// File of bearer tokens, one `scope[,scope...] token` per line (scopes: ingest, read,
    /// metrics, all); re-read on SIGHUP. Overrides auth.tokens_file. Tokens may also come from
    /// the INFERTRACE_TOKENS variable. Without any token, listening on a non-loopback address
    /// is refused unless the config says auth.insecure: true.
    #[arg(long, value_name = "PATH", env = "INFERTRACE_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
}

/// The listen addresses `collect` takes on its command line (and `check-config`, to check a
/// config as that command line runs it).
#[derive(Args, Debug, Default)]
pub struct ListenerArgs {
    /// OTLP/gRPC listen address; overrides receivers.otlp_grpc.endpoint (default 127.0.0.1:4317).
    #[arg(long, value_name = "ADDR")]
    pub otlp_grpc: Option<SocketAddr>,
    /// OTLP/HTTP listen address; overrides receivers.otlp_http.endpoint (default 127.0.0.1:4318).
    #[arg(long, value_name = "ADDR")]
    pub otlp_http: Option<SocketAddr>,
    /// API, dashboard and Prometheus /metrics listen address; overrides api.listen (default
    /// 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
}

impl ListenerArgs {
    /// Puts the addresses given into `config`.
    pub fn apply(&self, config: &mut CollectorConfig) {
        if let Some(a) = self.otlp_grpc {
            config.receivers.otlp_grpc.endpoint = a;
        }
        if let Some(a) = self.otlp_http {
            config.receivers.otlp_http.endpoint = a;
        }
        if let Some(a) = self.listen {
            config.api.listen = a;
        }
    }
}

/// Arguments of `infertrace check-config`.
#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// The YAML config file to validate (the one `collect` would read from INFERTRACE_CONFIG
    /// when not given).
    #[arg(env = "INFERTRACE_CONFIG")]
    pub file: PathBuf,
    /// The tokens file `collect` would be given (overrides auth.tokens_file, as there).
    #[arg(long, value_name = "PATH", env = "INFERTRACE_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Check the config as `collect --no-store` would run it: store.data_dir is not looked at
    /// (e.g. a container's config, whose data directory is the container's, checked on a host).
    #[arg(long)]
    pub no_store: bool,
    /// The history store's directory `collect` would be given (overrides store.data_dir, as
    /// there).
    #[arg(long, value_name = "PATH", conflicts_with = "no_store")]
    pub data_dir: Option<PathBuf>,
    /// Listen addresses `collect` would be given (e.g. the container image's
    /// `--otlp-grpc 0.0.0.0:4317`), checked as there.
    #[command(flatten)]
    pub listeners: ListenerArgs,
}

/// Applies the listen addresses and store flags of the command line over the file's, as
/// `collect` and `check-config` both do.
fn apply_flags(
    config: &mut CollectorConfig,
    listeners: &ListenerArgs,
    data_dir: Option<&PathBuf>,
    no_store: bool,
) {
    listeners.apply(config);
    if let Some(dir) = data_dir {
        config.store.data_dir = dir.clone();
        config.store.enabled = true;
    }
    if no_store {
        config.store.enabled = false;
    }
}

/// Loads the config file (or the defaults) and applies the command-line overrides.
///
/// A file is checked as `check-config` checks it, with the flags applied first (so that
/// `--no-store` makes the file's store settings moot for both), and every problem is given.
pub fn load_config(args: &CollectArgs) -> anyhow::Result<CollectorConfig> {
    let adjust = |config: &mut CollectorConfig| {
        apply_flags(
            config,
            &args.listeners,
            args.data_dir.as_ref(),
            args.no_store,
        );
        if let Some(file) = &args.tokens_file {
            config.auth.tokens_file = Some(file.clone());
        }
    };
    let joined = |errors: Vec<_>| {
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("{}", lines.join("\n"))
    };
    let config = match &args.config {
        Some(path) => CollectorConfig::from_file_adjusted(path, adjust).map_err(joined)?,
        None => {
            let mut config = CollectorConfig::default();
            adjust(&mut config);
            config
        }
    };
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    Ok(config)
}

/// Runs `infertrace collect` until SIGINT/SIGTERM, then shuts down gracefully: in-flight
/// requests get until `shutdown_timeout` (default 15 s), then every connection is cut. SIGHUP
/// reloads the bearer tokens and every listener's TLS certificate, key and client CA (a reload
/// that fails keeps the previous ones and logs an error).
pub async fn run(args: CollectArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(&args)?;
    check_open_files(&config);
    let (grpc_tls, http_tls, api_tls) = (
        config.receivers.otlp_grpc.tls.is_some(),
        config.receivers.otlp_http.tls.is_some(),
        config.api.tls.is_some(),
    );
    // Installed before the start, so that an early SIGHUP does not end the process and an
    // early SIGTERM or SIGINT stops it gracefully (the default action kills it).
    #[cfg(unix)]
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let signals = ShutdownSignals::install();
    let no_receiver = no_receiver_warning(&config);
    let deadline = config.shutdown_timeout;
    let collector = server::run(config, stop_signal(deadline, signals))
        .await
        .context("starting the collector")?;
    #[cfg(unix)]
    tokio::spawn(reload_on_hangup(
        hangups,
        collector.authenticator().cloned(),
        collector.tls().clone(),
        collector.events().clone(),
    ));
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
    console::say(
        "INFO",
        &format!(
            "infertrace collector: OTLP/gRPC {}  OTLP/HTTP {}  API {api_scheme}://{}  (metrics: /metrics, KPIs: /api/kpis; {history}; Ctrl-C stops)",
            show(collector.grpc_addr, grpc_tls),
            show(collector.http_addr, http_tls),
            collector.api_addr
        ),
    );
    if let Some(warning) = no_receiver {
        console::say("WARN", &format!("infertrace collector: {warning}"));
    }
    let report = collector
        .join()
        .await
        .context("collector stopped with an error")?;
    console::say(
        "INFO",
        &format!(
            "infertrace collector: stopped; {} traces in flight were closed and recorded",
            report.flushed.traces
        ),
    );
    Ok(ExitCode::SUCCESS)
}

/// The first SIGINT or SIGTERM: the graceful stop begins, and the console says so with its
/// deadline. A second one ends the process at once (exit 130), without waiting for open
/// requests or recording the traces in flight. `signals` is installed before the collector
/// starts, so neither a signal sent as soon as the startup line is out nor a second one sent
/// right after the first is lost.
async fn stop_signal(deadline: std::time::Duration, mut signals: ShutdownSignals) {
    signals.recv().await;
    console::say(
        "INFO",
        &format!(
            "infertrace collector: stopping: open requests get up to {} (shutdown_timeout), \
             then the traces in flight are closed and recorded; Ctrl-C again stops at once",
            humantime::format_duration(deadline)
        ),
    );
    tokio::spawn(async move {
        signals.recv().await;
        console::say(
            "WARN",
            "infertrace collector: stopped at once by a second signal: open requests \
             were cut and the traces in flight were not recorded",
        );
        std::process::exit(130);
    });
}

/// A collector with both OTLP receivers off takes no span (it may still serve its history):
/// allowed, but said by `collect` and `check-config`.
fn no_receiver_warning(config: &CollectorConfig) -> Option<&'static str> {
    (!config.receivers.otlp_grpc.enabled && !config.receivers.otlp_http.enabled).then_some(
        "receivers.otlp_grpc and receivers.otlp_http are both disabled: this collector takes \
         no spans (it still serves its API and history)",
    )
}

/// Files the collector may need besides its connections: listeners, the store, the forward
/// and Alertmanager connections, the runtime's own.
const OTHER_FILES: u64 = 64;

/// Raises the open-files limit as far as allowed and warns when it is still below what the
/// listeners' `connections.max` may take: out of descriptors, accepts fail (counted in
/// `infertrace_accept_errors_total`) and clients wait in the kernel's backlog.
fn check_open_files(config: &CollectorConfig) {
    let r = &config.receivers;
    let wanted = [
        (r.otlp_grpc.enabled, &r.otlp_grpc.connections),
        (r.otlp_http.enabled, &r.otlp_http.connections),
        (true, &config.api.connections),
    ]
    .iter()
    .filter(|(enabled, _)| *enabled)
    .map(|(_, c)| c.max as u64)
    .sum::<u64>()
        + OTHER_FILES;
    if let Some(limit) = raise_open_files_limit()
        && limit < wanted
    {
        tracing::warn!(
            open_files_limit = limit,
            wanted,
            "the open-files limit is below the listeners' connections.max (summed) plus {} \
             other files: past it, new connections wait unaccepted; raise it (ulimit -n, \
             systemd LimitNOFILE=, docker --ulimit nofile=) or lower connections.max",
            OTHER_FILES
        );
    }
}

/// Raises the soft limit on open files to the hard limit (as Go's runtime does at start): each
/// connection is a file, and the listeners' defaults allow 3 × 1,024 of them, more than the
/// usual soft limit of 1,024. Returns the soft limit in force afterwards (`None` when it cannot
/// be read).
#[cfg(target_os = "linux")]
fn raise_open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct passed, which lives across the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    // An unlimited hard limit cannot be the soft one: the kernel caps open files at nr_open.
    let ceiling = match limit.rlim_max {
        libc::RLIM_INFINITY => std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(1 << 20),
        hard => hard,
    };
    if limit.rlim_cur < ceiling {
        let raised = libc::rlimit {
            rlim_cur: ceiling,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct passed; on failure the limit is unchanged.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(raised.rlim_cur);
        }
    }
    Some(limit.rlim_cur)
}

/// Other systems: the limit is left as it is and not checked.
#[cfg(not(target_os = "linux"))]
fn raise_open_files_limit() -> Option<u64> {
    None
}

/// Reloads the tokens and the TLS files on every SIGHUP, logging each outcome (never a token).
///
/// The files are read on a thread of their own, not on the runtime's: a read that hangs (a
/// stuck network mount, a FIFO in the file's place) must not stall the listeners or SIGTERM,
/// and the process exits without waiting for it. A SIGHUP during a reload queues one more
/// reload after it; further ones fold into that one (logged).
#[cfg(unix)]
async fn reload_on_hangup(
    mut hangups: tokio::signal::unix::Signal,
    auth: Option<infertrace_collector::auth::Authenticator>,
    tls: ListenersTls,
    events: InternalEvents,
) {
    let (requests, pending) = std::sync::mpsc::sync_channel::<()>(1);
    let reloader = std::thread::Builder::new()
        .name("infertrace-reload".into())
        .spawn(move || {
            while pending.recv().is_ok() {
                reload_files(auth.as_ref(), &tls, &events);
            }
        });
    if let Err(error) = reloader {
        tracing::error!(%error, "cannot start the SIGHUP reload thread; SIGHUP reloads nothing");
        return;
    }
    while hangups.recv().await.is_some() {
        match requests.try_send(()) {
            Ok(()) => {}
            Err(std::sync::mpsc::TrySendError::Full(())) => tracing::warn!(
                "SIGHUP: a reload is still reading its files and another waits; this SIGHUP is \
                 folded into that one"
            ),
            Err(std::sync::mpsc::TrySendError::Disconnected(())) => {
                tracing::error!("SIGHUP: the reload thread is gone; SIGHUP reloads nothing");
                return;
            }
        }
    }
}

/// One SIGHUP's reload. Each part reloads on its own: a bad tokens file does not hold back a
/// certificate rotation, nor one listener's bad files another's.
#[cfg(unix)]
fn reload_files(
    auth: Option<&infertrace_collector::auth::Authenticator>,
    tls: &ListenersTls,
    events: &InternalEvents,
) {
    for reload in tls.reload(events) {
        match reload.result {
            Ok(cert) => console::say(
                "INFO",
                &format!(
                    "infertrace collector: SIGHUP: TLS of {} reloaded ({}); new connections use it",
                    reload.listener,
                    cert.as_deref()
                        .map_or("fixed".into(), |c| c.display().to_string())
                ),
            ),
            Err(error) => tracing::error!(
                listener = reload.listener,
                %error,
                "SIGHUP: reloading the TLS certificate, key or client CA failed; the previous ones stay in force"
            ),
        }
    }
    match auth {
        Some(auth) => match auth.reload() {
            Ok(tokens) => console::say(
                "INFO",
                &format!("infertrace collector: SIGHUP: {tokens} bearer tokens reloaded"),
            ),
            Err(error) => tracing::error!(
                %error,
                tokens = auth.token_count(),
                "SIGHUP: reloading the bearer tokens failed; the previous tokens stay in force"
            ),
        },
        // Said only where nothing at all was reloaded, so a TLS rotation logs no warning.
        None if !tls.any() => tracing::warn!(
            "SIGHUP: no bearer token and no TLS is configured (auth.tokens_file, INFERTRACE_TOKENS, tls:), \
             nothing to reload; authentication cannot be turned on without a restart"
        ),
        None => {}
    }
}

/// Runs `infertrace check-config FILE`: parses and validates the file, finds whether the
/// history store could be opened at `store.data_dir` and reads intact (SQLite's `quick_check`,
/// creating nothing), and reads and parses
/// every TLS certificate, key and CA file it names.
pub fn check_config(args: CheckConfigArgs) -> anyhow::Result<ExitCode> {
    let file = args.file.display();
    // Every problem is printed, not only the file's first: one run shows what to fix
    // everywhere.
    let as_collect_runs_it = |c: &mut CollectorConfig| {
        apply_flags(c, &args.listeners, args.data_dir.as_ref(), args.no_store);
    };
    let (mut config, problems) = match CollectorConfig::check_file(&args.file, as_collect_runs_it) {
        Ok(checked) => checked,
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    for e in &problems {
        eprintln!("{e}");
    }
    let mut failed = !problems.is_empty();
    // The tokens are not read when `auth:` itself is wrong (the same problem, said twice).
    let auth_invalid = config.auth.validate().is_err();
    if let Some(tokens_file) = &args.tokens_file {
        config.auth.tokens_file = Some(tokens_file.clone());
    }
    // The TLS files are read and parsed as the collector would at start, every listener's.
    if let Err(errors) = config.tls_server_configs() {
        for e in errors {
            eprintln!("{}", ConfigError::at_key(&args.file, &e.key, e.to_string()));
        }
        failed = true;
    }
    if let Some(warning) = no_receiver_warning(&config) {
        eprintln!("{file}: warning: {warning}");
    }
    // A certificate out of its validity is served (and so passes), but said.
    for (_, key, tls, _) in config.tls_sections() {
        if let Some(warning) =
            tls.and_then(|tls| tls.validity_warning(key, std::time::SystemTime::now()))
        {
            eprintln!("{file}: warning: {warning}");
        }
    }
    // So are the tokens (file and variable), and a listener beyond loopback without any is
    // refused as `collect` refuses it.
    if !auth_invalid {
        match Authenticator::from_config(&config.auth, InternalEvents::default()) {
            Ok(tokens) => {
                if let Err(e) = auth::check_exposure(&config, tokens.is_some()) {
                    eprintln!("{file}: {e}");
                    failed = true;
                }
            }
            Err(e) => {
                eprintln!("{file}: auth: {e}");
                failed = true;
            }
        }
    }
    if failed {
        return Ok(ExitCode::FAILURE);
    }
    println!("{file}: OK");
    Ok(ExitCode::SUCCESS)
}
