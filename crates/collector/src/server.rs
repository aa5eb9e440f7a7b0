//! [`run`]: the whole collector from one [`CollectorConfig`] — receivers, pipeline, API,
//! alerts, forwarder — in the current tokio runtime.
//!
//! Every listener is bound before `run` returns, so callers (tests, the `demo` command) can ask
//! for port 0 and read the bound addresses from [`RunningCollector`]. Shutdown, when the given
//! future resolves or [`RunningCollector::shutdown`] is called, runs against one deadline,
//! `shutdown_timeout` (config key, default 15 s) after the signal:
//! 0. `/health` answers 503 from the signal on (load balancers stop sending);
//! 1. the receivers stop accepting and let in-flight requests finish until the deadline, then
//!    cut every connection still open;
//! 2. the pipeline refuses anything later, closes every trace in flight (without waiting for
//!    its grace) and records it into the KPIs;
//! 3. alert evaluation and the stored findings stop (what is queued for Alertmanager still
//!    goes, for up to 2 s); then the history store (when on) receives what the pipeline's feed
//!    holds and commits it, nothing written after;
//! 4. the forwarder sends what it has queued until the deadline (at least 1 s, at most
//!    [`SHUTDOWN_DEADLINE`]) and logs what it could not send (dropped and counted);
//! 5. the API stops last, so a final scrape can still see the flushed KPIs until then: it stops
//!    accepting, lets requests finish until the same deadline (or not at all when the deadline
//!    has passed) and cuts what is left;
//! 6. every rate-limited warning's count not yet logged is logged.
//!
//! Every listener is served by [`crate::listener::serve`] with its `connections:` limits and
//! `tls:` from the config; TLS files are read before anything is bound, and an unreadable or
//! invalid one stops `run` with [`ServerError::Tls`] naming the key and the file.
//! [`RunningCollector::reload_tls`] (SIGHUP in `infertrace collect`) reads them again for new
//! connections ([`crate::server_tls`]).
//!
//! **History store** ([`crate::store`], `store:` in the config): opened before anything is
//! bound; a file that is not infertrace's database stops `run` with [`ServerError::Store`]
//! naming the file (and leaves it untouched). On start the KPI windows are refilled from the
//! stored minutes (so `/api/kpis?window=1h` survives a restart); findings of the last 5 minutes
//! are stored once a minute, alert transitions as they happen.
//!
//! The API address serves the JSON API ([`crate::api`]) and the web dashboard
//! (`dashboard`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use infertrace_collector::{config::CollectorConfig, server};
//! let mut config = CollectorConfig::default();
//! config.api.listen = "127.0.0.1:0".parse()?;
//! let collector = server::run(config, std::future::pending()).await?;
//! println!("metrics at http://{}/metrics", collector.api_addr);
//! let kpis = collector.kpis(std::time::Duration::from_secs(60));
//! # let _ = kpis;
//! let report = collector.stop().await?;
//! println!("{} requests flushed at shutdown", report.flushed.requests);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infertrace_analysis::critical_path::CriticalPathSummary;
use infertrace_analysis::diagnosis::WindowDiagnosis;
use infertrace_analysis::kpi::KpiSnapshot;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::api::{self, Alerting, AlertsView, ApiState};
use crate::auth::{self, ApiGuard, Authenticator, HostAllowlist};
use crate::config::{CollectorConfig, TlsError};
use crate::dashboard;
use crate::forward;
use crate::ingest::Ingest;
use crate::internal_events::InternalEvents;
use crate::limiter::MemoryLimiter;
use crate::listener::{API_LISTENER, ListenerSettings};
use crate::pipeline::{Pipeline, TickStats};
use crate::prom_export::{PromMetrics, build_registry};
use crate::receiver::{
    GRPC_RECEIVER, HTTP_RECEIVER, ReceiverLimits, serve_grpc_with, serve_http_with,
};
use crate::server_tls::{ListenersTls, TlsReload};
use crate::store::{Store, StoreError, unix_nanos_now};

/// Longest the forwarder may take to send its queue at shutdown.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);
/// How often the current findings are stored in the history store.
pub const FINDINGS_INTERVAL: Duration = Duration::from_secs(60);
/// The KPI window whose findings are stored.
pub const FINDINGS_WINDOW: Duration = Duration::from_secs(300);

/// Why the collector could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {error}; pick another address ({hint})")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// Config key or flag that sets it.
        hint: &'static str,
        /// The OS error.
        error: std::io::Error,
    },
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A listener's TLS certificate, key or client CA file is unreadable or invalid. (Not a
    /// `source`: the message already holds it, and a chain would print it twice.)
    #[error("TLS: {0}")]
    Tls(TlsError),
    /// The tokens cannot be loaded, or a non-loopback listener would be open to anyone
    /// (the message says which and what to do).
    #[error("{0}")]
    Auth(String),
    /// The forwarder could not be set up.
    #[error(transparent)]
    Forward(#[from] forward::ForwardError),
    /// The history store could not be opened, started or flushed (the message names the file).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A server task failed.
    #[error("{what} failed: {error}")]
    Serve {
        /// Which server.
        what: &'static str,
        /// The error.
        error: std::io::Error,
    },
}

impl From<TlsError> for ServerError {
    fn from(e: TlsError) -> Self {
        Self::Tls(e)
    }
}

/// What shutdown did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Traces in flight closed and recorded at shutdown.
    pub flushed: TickStats,
}

/// A running collector: its bound addresses and in-process access to its results.
#[derive(Debug)]
pub struct RunningCollector {
    /// Bound OTLP/gRPC address (`None` when disabled).
    pub grpc_addr: Option<SocketAddr>,
    /// Bound OTLP/HTTP address (`None` when disabled).
    pub http_addr: Option<SocketAddr>,
    /// Bound API address.
    pub api_addr: SocketAddr,
    pipeline: Arc<Pipeline>,
    alerting: Arc<Mutex<Alerting>>,
    metrics: PromMetrics,
    store: Option<Store>,
    auth: Option<Authenticator>,
    tls: ListenersTls,
    stop: watch::Sender<bool>,
    join: JoinHandle<Result<ShutdownReport, ServerError>>,
}

impl RunningCollector {
    /// The KPIs of `window` (any duration; see `KpiWindows::snapshot`).
    pub fn kpis(&self, window: Duration) -> KpiSnapshot {
        self.pipeline.kpis(window)
    }

    /// The aggregated critical path of `window`.
    pub fn critical_path(&self, window: Duration) -> CriticalPathSummary {
        self.pipeline.critical_path(window)
    }

    /// The diagnosis of `window`, with the series too quiet in it to judge.
    pub fn diagnosis(&self, window: Duration) -> WindowDiagnosis {
        self.pipeline.diagnosis(window)
    }

    /// The alert state (as `GET /api/alerts`).
    pub fn alerts(&self) -> AlertsView {
        self.alerting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .view()
    }

    /// Evaluates the alert rules now (as the periodic task does), returning the view.
    pub fn evaluate_alerts(&self) -> AlertsView {
        api::alerting::evaluate_once(&self.pipeline, &self.alerting, &self.metrics);
        self.alerts()
    }

    /// The pipeline (ingest directly, tick, look traces up).
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// The self-metrics.
    pub fn events(&self) -> &InternalEvents {
        self.pipeline.events()
    }

    /// The history store (`None` with `store.enabled: false`).
    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// The bearer-token check (`None` when no token is configured); `infertrace collect`
    /// calls its [`reload`](Authenticator::reload) on SIGHUP.
    pub fn authenticator(&self) -> Option<&Authenticator> {
        self.auth.as_ref()
    }

    /// Re-reads every TLS listener's certificate chain, key and client CA (on SIGHUP; see
    /// [`crate::server_tls`]): new handshakes use what loaded, connections already open are
    /// untouched, and a listener whose files fail to load keeps its previous configuration.
    /// Each outcome is counted in `infertrace_reloads_total`; the caller logs them. Empty
    /// when no listener has TLS.
    pub fn reload_tls(&self) -> Vec<TlsReload> {
        self.tls.reload(self.events())
    }

    /// The listeners' reloadable TLS (for a task that reloads it later, as `infertrace
    /// collect`'s SIGHUP handler does: clone it and call [`ListenersTls::reload`]).
    pub fn tls(&self) -> &ListenersTls {
        &self.tls
    }

    /// Starts the shutdown (same as the shutdown future resolving); see [`join`](Self::join).
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits until the collector has stopped.
    pub async fn join(self) -> Result<ShutdownReport, ServerError> {
        match self.join.await {
            Ok(r) => r,
            Err(e) => Err(ServerError::Serve {
                what: "collector",
                error: std::io::Error::other(e.to_string()),
            }),
        }
    }

    /// Shuts down and waits.
    pub async fn stop(self) -> Result<ShutdownReport, ServerError> {
        self.shutdown();
        self.join().await
    }
}

async fn bind(
    what: &'static str,
    addr: SocketAddr,
    hint: &'static str,
) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| ServerError::Bind {
            what,
            addr,
            hint,
            error,
        })
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

fn serve_error(what: &'static str) -> impl FnOnce(std::io::Error) -> ServerError {
    move |error| ServerError::Serve { what, error }
}

/// Starts the collector; it runs until `shutdown` resolves or [`RunningCollector::shutdown`].
///
/// The steps, in order: check what can be checked before binding, bind every listener, build
/// the pipeline and what it feeds, spawn the receivers, the background tasks and the API, and
/// hand the shutdown sequence (module docs) to a task of its own.
pub async fn run(
    config: CollectorConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningCollector, ServerError> {
    let checked = check_before_binding(&config)?;
    let bound = bind_listeners(&config).await?;
    let mut core = build_core(&config, &checked, bound.api_addr)?;
    let (stop_tx, stop_rx) = stop_switch(shutdown);
    let receivers = spawn_receivers(&config, &checked, &core, bound.grpc, bound.http, &stop_rx);
    let (late_stop_tx, late_stop_rx) = watch::channel(false);
    let tick = spawn_tick(&core.pipeline, config.assembly.tick, &stop_rx);
    let alerts = tokio::spawn(api::alerting::run(
        core.pipeline.clone(),
        core.alerting.clone(),
        core.metrics.clone(),
        config.alerts.evaluation_interval,
        core.alertmanager.take(),
        stopped(late_stop_rx.clone()),
    ));
    let findings = spawn_findings(&core.pipeline, &late_stop_rx);
    drop(late_stop_rx);
    let (api, api_deadline) = serve_api(&config, &checked, &core, bound.api, bound.api_addr);
    let shown =
        |a: Option<std::net::SocketAddr>| a.map_or("disabled".to_owned(), |a| a.to_string());
    tracing::info!(
        grpc = %shown(bound.grpc_addr),
        http = %shown(bound.http_addr),
        api = %bound.api_addr,
        "infertrace collector listening"
    );
    let join = tokio::spawn(shut_down(
        stop_rx,
        config.shutdown_timeout,
        core.pipeline.clone(),
        Tasks {
            receivers,
            tick,
            forward: core.forward,
            late_stop: late_stop_tx,
            api_deadline,
            alerts,
            findings,
            api,
        },
    ));
    Ok(RunningCollector {
        grpc_addr: bound.grpc_addr,
        http_addr: bound.http_addr,
        api_addr: bound.api_addr,
        pipeline: core.pipeline,
        alerting: core.alerting,
        metrics: core.metrics,
        store: checked.store,
        auth: checked.auth,
        tls: checked.tls,
        stop: stop_tx,
        join,
    })
}

/// What is read and checked before anything is bound: a refused file or setting stops the
/// start with its name, and nothing is left listening.
struct Checked {
    tls: ListenersTls,
    store: Option<Store>,
    events: InternalEvents,
    auth: Option<Authenticator>,
}

/// The base of the links alerts carry back to the collector (Alertmanager's `generatorURL`):
/// `https` with `api.tls`; the listen address, or `localhost` in its place when it is a
/// wildcard (`0.0.0.0`, `::`), which no browser can open.
fn generator_url(config: &CollectorConfig, api_addr: std::net::SocketAddr) -> String {
    let scheme = if config.api.tls.is_some() {
        "https"
    } else {
        "http"
    };
    if api_addr.ip().is_unspecified() {
        format!("{scheme}://localhost:{}", api_addr.port())
    } else {
        format!("{scheme}://{api_addr}")
    }
}

fn check_before_binding(config: &CollectorConfig) -> Result<Checked, ServerError> {
    config
        .validate()
        .map_err(|e| ServerError::Config(e.to_string()))?;
    let tls = ListenersTls::load(config)?;
    let store = match Store::open_configured(&config.store) {
        // A full or failing disk costs history, not ingest: the collector starts without it.
        Err(e) if e.is_disk_trouble() => {
            tracing::error!(
                error = %e,
                "history store unavailable: running WITHOUT history (no /api/history, no \
                 windows restored); free space on store.data_dir's volume and restart"
            );
            None
        }
        other => other?,
    };
    let events = InternalEvents::default();
    let auth = Authenticator::from_config(&config.auth, events.clone())
        .map_err(|e| ServerError::Auth(e.to_string()))?;
    auth::check_exposure(config, auth.is_some()).map_err(ServerError::Auth)?;
    if let Some(a) = &auth {
        tracing::info!(tokens = a.token_count(), "bearer-token authentication on");
    }
    Ok(Checked {
        tls,
        store,
        events,
        auth,
    })
}

/// The bound listeners and their addresses (port 0 resolved).
struct Bound {
    grpc: Option<TcpListener>,
    http: Option<TcpListener>,
    api: TcpListener,
    grpc_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    api_addr: SocketAddr,
}

async fn bind_listeners(config: &CollectorConfig) -> Result<Bound, ServerError> {
    let r = &config.receivers;
    let grpc = match r.otlp_grpc.enabled {
        true => Some(
            bind(
                "OTLP/gRPC receiver",
                r.otlp_grpc.endpoint,
                "--otlp-grpc or receivers.otlp_grpc.endpoint",
            )
            .await?,
        ),
        false => None,
    };
    let http = match r.otlp_http.enabled {
        true => Some(
            bind(
                "OTLP/HTTP receiver",
                r.otlp_http.endpoint,
                "--otlp-http or receivers.otlp_http.endpoint",
            )
            .await?,
        ),
        false => None,
    };
    let api = bind("API", config.api.listen, "--listen or api.listen").await?;
    let local = |l: &TcpListener, what| l.local_addr().map_err(serve_error(what));
    Ok(Bound {
        grpc_addr: grpc.as_ref().map(|l| local(l, "otlp_grpc")).transpose()?,
        http_addr: http.as_ref().map(|l| local(l, "otlp_http")).transpose()?,
        api_addr: local(&api, "api")?,
        grpc,
        http,
        api,
    })
}

/// The pipeline and what it feeds or is fed by: metrics, the memory limiter, the forwarder,
/// the history store's feed, alerting.
struct Core {
    metrics: PromMetrics,
    registry: Arc<Registry>,
    limiter: MemoryLimiter,
    pipeline: Arc<Pipeline>,
    forward: Option<forward::ForwardTask>,
    alerting: Arc<Mutex<Alerting>>,
    alertmanager: Option<api::alerting::Alertmanager>,
}

fn build_core(
    config: &CollectorConfig,
    checked: &Checked,
    api_addr: SocketAddr,
) -> Result<Core, ServerError> {
    let events = &checked.events;
    let metrics = PromMetrics::default();
    let registry = Arc::new(build_registry(&metrics, events));
    let limits = &config.limits;
    let limiter = MemoryLimiter::with_thresholds(
        limits.memory_limit_bytes,
        limits.soft_limit_percent,
        limits.relief_target_percent,
    );
    let (forward_handle, forward) = match &config.forward.endpoint {
        Some(_) => {
            let (h, t) = forward::spawn(&config.forward, events.clone(), Some(limiter.clone()))?;
            (Some(h), Some(t))
        }
        None => (None, None),
    };
    let pipeline = Arc::new(Pipeline::new(
        config,
        events.clone(),
        metrics.clone(),
        limiter.clone(),
        forward_handle,
    ));
    if config.limits.watch_resident_memory {
        pipeline.watch_resident_memory(crate::resident::resident_bytes);
    }
    let mut alerting =
        Alerting::new(config, &generator_url(config, api_addr)).map_err(ServerError::Config)?;
    if let Some(store) = &checked.store {
        let writer = store.start_writer(events.clone())?;
        let feed = store.feed(writer, &config.kpi_config());
        let restored = pipeline.attach_store(store, feed)?;
        tracing::info!(
            path = %store.path().display(),
            restored_kpi_minutes = restored.kpi_minutes,
            restored_critical_path_slots = restored.critical_path_slots,
            "history store open"
        );
        if restored.kpi_minutes > 0 {
            alerting.quiet_after_restore(crate::store::unix_nanos_now());
        }
    }
    let alerting = Arc::new(Mutex::new(alerting));
    let alertmanager = config
        .alerts
        .alertmanager_url
        .as_deref()
        .map(|url| {
            api::alerting::Alertmanager::new(
                url,
                &config.alerts.alertmanager_tls,
                &config.alerts.alertmanager_headers,
            )
            .map(|am| am.with_labels(&config.alerts.alertmanager_labels))
        })
        .transpose()
        .map_err(ServerError::Config)?;
    Ok(Core {
        metrics,
        registry,
        limiter,
        pipeline,
        forward,
        alerting,
        alertmanager,
    })
}

/// The stop switch: flipped by [`RunningCollector::shutdown`] or when `shutdown` resolves.
fn stop_switch(
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (watch::Sender<bool>, watch::Receiver<bool>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let tx = stop_tx.clone();
    let mut external_rx = stop_rx.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown => { let _ = tx.send(true); }
            _ = external_rx.wait_for(|v| *v) => {}
        }
    });
    (stop_tx, stop_rx)
}

/// A server task: a listener's accept loop.
type ServeTask = JoinHandle<std::io::Result<()>>;

/// Spawns the OTLP receivers (gRPC, HTTP; `None` where disabled). They stop first at shutdown,
/// draining until `shutdown_timeout` after the stop.
fn spawn_receivers(
    config: &CollectorConfig,
    checked: &Checked,
    core: &Core,
    grpc: Option<TcpListener>,
    http: Option<TcpListener>,
    stop_rx: &watch::Receiver<bool>,
) -> [(&'static str, Option<ServeTask>); 2] {
    let r = &config.receivers;
    let limits = ReceiverLimits {
        max_body_bytes: r.max_body_bytes,
        memory: Some(core.limiter.clone()),
        body_read_timeout: r.body_read_timeout,
        retry_after_secs: 1,
        auth: checked.auth.clone(),
        allowed_hosts: None,
        forwarding: config.forward.endpoint.is_some() && config.forward.verify_spans,
    };
    let ingest: Arc<dyn Ingest> = core.pipeline.clone();
    let events = &checked.events;
    let shutdown_timeout = config.shutdown_timeout;
    let deadline = |rx: watch::Receiver<bool>| async move {
        stopped(rx).await;
        Instant::now() + shutdown_timeout
    };
    let grpc = grpc.map(|l| {
        let settings = ListenerSettings::new(GRPC_RECEIVER)
            .with_connections(r.otlp_grpc.connections.clone())
            .with_tls(checked.tls.otlp_grpc.clone())
            .http2_only();
        tokio::spawn(serve_grpc_with(
            l,
            settings,
            ingest.clone(),
            events.clone(),
            limits.clone(),
            deadline(stop_rx.clone()),
        ))
    });
    let http = http.map(|l| {
        let settings = ListenerSettings::new(HTTP_RECEIVER)
            .with_connections(r.otlp_http.connections.clone())
            .with_tls(checked.tls.otlp_http.clone());
        let mut limits = limits.clone();
        if limits.auth.is_none()
            && let Ok(addr) = l.local_addr()
            && addr.ip().is_loopback()
        {
            limits.allowed_hosts = Some(HostAllowlist::new(&config.api.allowed_hosts, addr));
        }
        tokio::spawn(serve_http_with(
            l,
            settings,
            ingest.clone(),
            events.clone(),
            limits,
            deadline(stop_rx.clone()),
        ))
    });
    [("otlp_grpc", grpc), ("otlp_http", http)]
}

/// Spawns the assembly tick: every `tick`, close the traces due and analyse them (on a
/// blocking thread: analysis is CPU work, kept off the workers serving the receivers).
fn spawn_tick(
    pipeline: &Arc<Pipeline>,
    tick: Duration,
    stop_rx: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    let pipeline = pipeline.clone();
    let stop = stopped(stop_rx.clone());
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = pipeline.tick_wanted() => {}
                _ = &mut stop => break,
            }
            let p = pipeline.clone();
            if tokio::task::spawn_blocking(move || p.tick()).await.is_err() {
                tracing::error!("pipeline tick panicked");
            }
        }
    })
}

/// Spawns the storing of the current findings every [`FINDINGS_INTERVAL`] (with a store).
fn spawn_findings(
    pipeline: &Arc<Pipeline>,
    late_stop_rx: &watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let writer = pipeline.store_writer()?;
    let pipeline = pipeline.clone();
    let stop = stopped(late_stop_rx.clone());
    Some(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(FINDINGS_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: there is nothing to diagnose yet.
        ticker.tick().await;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = &mut stop => break,
            }
            let findings = pipeline.findings(FINDINGS_WINDOW);
            if !findings.is_empty() {
                writer.write_findings(unix_nanos_now(), findings);
            }
        }
    }))
}

/// Serves the API and the dashboard behind the host allowlist and bearer tokens. It stops
/// after the flush, against the deadline sent on the returned channel.
fn serve_api(
    config: &CollectorConfig,
    checked: &Checked,
    core: &Core,
    listener: TcpListener,
    api_addr: SocketAddr,
) -> (ServeTask, oneshot::Sender<Instant>) {
    let state = Arc::new(ApiState {
        pipeline: core.pipeline.clone(),
        registry: core.registry.clone(),
        alerting: core.alerting.clone(),
        store: checked.store.clone(),
        metrics_text: api::MetricsText::default(),
    });
    let app = api::router(state).merge(dashboard::routes(
        core.pipeline.clone(),
        dashboard::DashboardSettings::from_config(config).with_history(checked.store.is_some()),
    ));
    let app = app.layer(axum::middleware::from_fn_with_state(
        ApiGuard {
            auth: checked.auth.clone(),
            hosts: HostAllowlist::new(&config.api.allowed_hosts, api_addr),
            events: checked.events.clone(),
        },
        auth::guard_api,
    ));
    let (deadline_tx, deadline_rx) = oneshot::channel::<Instant>();
    let settings = ListenerSettings::new(API_LISTENER)
        .with_connections(config.api.connections.clone())
        .with_tls(checked.tls.api.clone())
        .with_h1_max_buf(crate::listener::API_H1_MAX_BUF);
    let task = tokio::spawn(crate::listener::serve(
        listener,
        settings,
        checked.events.clone(),
        hyper_util::service::TowerToHyperService::new(app),
        async move { deadline_rx.await.unwrap_or_else(|_| Instant::now()) },
    ));
    (task, deadline_tx)
}

/// The tasks the shutdown sequence stops, in its order.
struct Tasks {
    receivers: [(&'static str, Option<ServeTask>); 2],
    tick: JoinHandle<()>,
    forward: Option<forward::ForwardTask>,
    late_stop: watch::Sender<bool>,
    api_deadline: oneshot::Sender<Instant>,
    alerts: JoinHandle<()>,
    findings: Option<JoinHandle<()>>,
    api: ServeTask,
}

/// The shutdown sequence of the module docs, once the stop switch flips.
async fn shut_down(
    mut stop_rx: watch::Receiver<bool>,
    shutdown_timeout: Duration,
    pipeline: Arc<Pipeline>,
    tasks: Tasks,
) -> Result<ShutdownReport, ServerError> {
    let _ = stop_rx.wait_for(|v| *v).await;
    pipeline.begin_stopping();
    let deadline = Instant::now() + shutdown_timeout;
    tracing::info!(
        ?shutdown_timeout,
        "shutting down: draining receivers (connections still open at the deadline are cut)"
    );
    let mut result = Ok(());
    for (what, task) in tasks.receivers {
        if let Some(task) = task {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(ServerError::Serve { what, error: e }),
                Err(e) => {
                    result = Err(ServerError::Serve {
                        what,
                        error: std::io::Error::other(e.to_string()),
                    })
                }
            }
        }
    }
    pipeline.begin_shutdown();
    let _ = tasks.tick.await;
    let flushed = pipeline.flush();
    tracing::info!(
        traces = flushed.traces,
        requests = flushed.requests,
        "flushed traces in flight into the KPIs"
    );
    // The alerts and findings write to the store: they stop before its last flush (they ran
    // until the forwarder closed, and what they wrote then could be lost with the process).
    let _ = tasks.late_stop.send(true);
    let _ = tasks.alerts.await;
    if let Some(t) = tasks.findings {
        let _ = t.await;
    }
    if let Some(writer) = pipeline.hand_over_store(unix_nanos_now()) {
        match tokio::task::spawn_blocking(move || writer.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = Err(ServerError::Store(e)),
            Err(e) => {
                result = Err(ServerError::Serve {
                    what: "history store",
                    error: std::io::Error::other(e.to_string()),
                })
            }
        }
    }
    if let Some(f) = tasks.forward {
        // What is left of `shutdown_timeout`, at least a second, at most SHUTDOWN_DEADLINE.
        let left = deadline.saturating_duration_since(Instant::now());
        f.close(left.clamp(Duration::from_secs(1), SHUTDOWN_DEADLINE))
            .await;
    }
    let _ = tasks.api_deadline.send(deadline);
    match tasks.api.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => result = Err(serve_error("api")(e)),
        Err(e) => result = Err(serve_error("api")(std::io::Error::other(e.to_string()))),
    }
    pipeline.events().flush_logs_at_exit();
    result.map(|()| ShutdownReport { flushed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alert_links_use_the_apis_scheme_and_an_openable_host() {
        let mut config = CollectorConfig::default();
        let at = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
        assert_eq!(
            generator_url(&config, at("127.0.0.1:9464")),
            "http://127.0.0.1:9464"
        );
        assert_eq!(
            generator_url(&config, at("0.0.0.0:9464")),
            "http://localhost:9464"
        );
        config.api.tls = Some(crate::config::TlsConfig {
            cert_file: "c.pem".into(),
            key_file: "k.pem".into(),
            client_ca_file: None,
        });
        assert_eq!(
            generator_url(&config, at("[::]:9464")),
            "https://localhost:9464"
        );
    }
}
