//! The collector's configuration: one YAML file, every key optional with a documented default.
//!
//! `otel-config/infertrace.yaml` lists every key with its default and a comment; this module is
//! the schema. Durations are human-readable (`2s`, `500ms`, `1m`, `1h30m`), addresses are
//! `IP:port`. Unknown keys are errors (a typo never silently falls back to a default), and every
//! error names the place in the file: `infertrace.yaml:12:5: unknown field ...`.
//!
//! ```
//! use infertrace_collector::config::CollectorConfig;
//! let cfg = CollectorConfig::from_yaml_str("assembly:\n  grace: 500ms\n").unwrap();
//! assert_eq!(cfg.assembly.grace, std::time::Duration::from_millis(500));
//! assert_eq!(cfg.api.listen, CollectorConfig::default().api.listen);
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use infertrace_analysis::alert::{AlertRule, AlertRuleConfig, AnomalyConfig, AnomalyDetector};
use infertrace_analysis::critical_path::{CriticalPathOptions, CriticalPathWindowsConfig};
use infertrace_analysis::diagnosis::DiagnosisConfig;
use infertrace_analysis::kpi;
use serde::{Deserialize, Serialize};

use crate::assembler::AssemblerConfig;

mod network;
pub use network::{
    Alpn, ConnectionsConfig, DEFAULT_SHUTDOWN_TIMEOUT, TlsConfig, TlsError, crypto_provider,
};
mod auth;
pub use auth::{AuthConfig, DEFAULT_TOKENS_ENV, default_allowed_hosts};
mod forward;

pub use forward::{ForwardConfig, ForwardProtocol, RetryConfig, TlsClientConfig};

/// The whole collector configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CollectorConfig {
    /// OTLP receivers.
    pub receivers: ReceiversConfig,
    /// The HTTP API (`/metrics`, `/api/...`, `/health`).
    pub api: ApiConfig,
    /// Resource limits.
    pub limits: LimitsConfig,
    /// Trace assembly timing.
    pub assembly: AssemblyConfig,
    /// KPI windows, dimensions and SLOs.
    pub kpi: KpiSection,
    /// Diagnosis thresholds (the analysis crate's [`DiagnosisConfig`], key by key).
    pub diagnosis: DiagnosisConfig,
    /// Alert rules and delivery.
    pub alerts: AlertsSection,
    /// Optional OTLP trace forwarding downstream.
    pub forward: ForwardConfig,
    /// Critical-path options.
    pub critical_path: CriticalPathSection,
    /// The embedded history store (`--data-dir`, `--no-store`).
    pub store: crate::store::StoreOptions,
    /// How long shutdown (SIGTERM, ctrl-c) lets in-flight requests finish before every open
    /// connection, on every listener, is cut; the flush of traces in flight, the history store
    /// and the forwarder follow. Default 15s.
    #[serde(with = "human_duration")]
    pub shutdown_timeout: Duration,
    /// Bearer tokens of the receivers and the API, and `insecure` ([`AuthConfig`]).
    pub auth: AuthConfig,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        Self {
            receivers: ReceiversConfig::default(),
            api: ApiConfig::default(),
            limits: LimitsConfig::default(),
            assembly: AssemblyConfig::default(),
            kpi: KpiSection::default(),
            diagnosis: DiagnosisConfig::default(),
            alerts: AlertsSection::default(),
            forward: ForwardConfig::default(),
            critical_path: CriticalPathSection::default(),
            store: crate::store::StoreOptions::default(),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            auth: AuthConfig::default(),
        }
    }
}

/// The TLS configurations of the three listeners, read from their files
/// ([`CollectorConfig::tls_server_configs`]); `None` where a listener has no `tls:`.
#[derive(Clone, Debug, Default)]
pub struct ListenerTls {
    /// `receivers.otlp_grpc.tls` (ALPN `h2`).
    pub otlp_grpc: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// `receivers.otlp_http.tls` (ALPN `h2`, `http/1.1`).
    pub otlp_http: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// `api.tls` (ALPN `h2`, `http/1.1`).
    pub api: Option<std::sync::Arc<rustls::ServerConfig>>,
}

/// `receivers:` — where OTLP comes in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReceiversConfig {
    /// OTLP/gRPC (`TraceService/Export`).
    pub otlp_grpc: OtlpGrpcReceiver,
    /// OTLP/HTTP (`POST /v1/traces`, protobuf or JSON).
    pub otlp_http: OtlpHttpReceiver,
    /// Largest accepted request body (after decompression), bytes. Default 16 MiB.
    pub max_body_bytes: usize,
    /// Longest a client may take to send a request body once its headers arrived; past it the
    /// request is refused (HTTP 408, gRPC `DEADLINE_EXCEEDED`) and its memory freed. Default 30s.
    #[serde(with = "human_duration")]
    pub body_read_timeout: Duration,
}

impl Default for ReceiversConfig {
    fn default() -> Self {
        Self {
            otlp_grpc: OtlpGrpcReceiver::default(),
            otlp_http: OtlpHttpReceiver::default(),
            max_body_bytes: 16 * 1024 * 1024,
            body_read_timeout: crate::receiver::DEFAULT_BODY_READ_TIMEOUT,
        }
    }
}

/// `receivers.otlp_grpc:` — the OTLP/gRPC listener, which can be turned off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpGrpcReceiver {
    /// Whether the receiver runs. Default `true`.
    pub enabled: bool,
    /// `IP:port` to listen on (port 0 picks a free port). Default `127.0.0.1:4317`.
    pub endpoint: SocketAddr,
    /// Connection limit and timeouts ([`ConnectionsConfig`]).
    pub connections: ConnectionsConfig,
    /// TLS (and mutual TLS) of this listener ([`TlsConfig`]). Default: none (plain text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

impl Default for OtlpGrpcReceiver {
    fn default() -> Self {
        Self {
            enabled: true,
            endpoint: ([127, 0, 0, 1], 4317).into(),
            connections: ConnectionsConfig::default(),
            tls: None,
        }
    }
}

/// `receivers.otlp_http:` — the OTLP/HTTP listener, which can be turned off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpHttpReceiver {
    /// Whether the receiver runs. Default `true`.
    pub enabled: bool,
    /// `IP:port` to listen on (port 0 picks a free port). Default `127.0.0.1:4318`.
    pub endpoint: SocketAddr,
    /// Connection limit and timeouts ([`ConnectionsConfig`]).
    pub connections: ConnectionsConfig,
    /// TLS (and mutual TLS) of this listener ([`TlsConfig`]). Default: none (plain text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
}

impl Default for OtlpHttpReceiver {
    fn default() -> Self {
        Self {
            enabled: true,
            endpoint: ([127, 0, 0, 1], 4318).into(),
            connections: ConnectionsConfig::default(),
            tls: None,
        }
    }
}

/// `api:` — the HTTP API and Prometheus endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// `IP:port` of `/metrics`, `/health` and `/api/...`. Default `127.0.0.1:9464`.
    pub listen: SocketAddr,
    /// How many recently completed traces `/api/traces/{trace_id}` can return (a ring: the
    /// oldest is forgotten first). Also the admission rate: at most this many traces per second
    /// enter the ring (and as many again with a failed request); beyond, traces are analysed
    /// but not kept (`infertrace_recent_traces_not_kept_total`). Default 1000.
    pub recent_traces: usize,
    /// Most spans those traces may hold in all (the oldest trace is forgotten first).
    /// Default 100000.
    pub recent_trace_spans: usize,
    /// Connection limit and timeouts ([`ConnectionsConfig`]).
    pub connections: ConnectionsConfig,
    /// TLS (and mutual TLS) of the API ([`TlsConfig`]). Default: none (plain text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// Host names the API port answers to; any other name in the `Host` header gets 421 (a DNS
    /// rebinding guard). IP addresses are always allowed (rebinding needs a name); `"*"`
    /// allows any name.
    /// Default `[localhost, 127.0.0.1, "::1"]`.
    pub allowed_hosts: Vec<String>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen: ([127, 0, 0, 1], 9464).into(),
            recent_traces: 1000,
            recent_trace_spans: 100_000,
            connections: ConnectionsConfig::default(),
            tls: None,
            allowed_hosts: default_allowed_hosts(),
        }
    }
}

/// `limits:` — every bound the collector enforces, each with a counter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Memory the buffered spans may hold, bytes; over it receivers answer "retry later"
    /// (HTTP 429/503, gRPC UNAVAILABLE). Default 512 MiB.
    pub memory_limit_bytes: usize,
    /// Spans kept per trace; more are dropped (`dropped_spans_total{reason="max_spans_per_trace"}`).
    /// Default 10000.
    pub max_spans_per_trace: usize,
    /// Traces assembled at once; a new trace past it closes the oldest trace in flight before
    /// its grace period ends (`traces_closed_early_total`) — nothing accepted is dropped.
    /// Default 100000.
    pub max_traces_in_flight: usize,
    /// KPI / Prometheus series (label combinations) kept; a further one takes the place of a
    /// series idle for `series_reclaim_after` (`series_reclaimed_total`), else goes to one
    /// overflow series (`series_overflow_total`). Default 1000.
    pub max_series: usize,
    /// How long a series must have had no request before a new series may take its place
    /// under `max_series`. Default 1m.
    #[serde(with = "human_duration")]
    pub series_reclaim_after: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            memory_limit_bytes: 512 * 1024 * 1024,
            max_spans_per_trace: 10_000,
            max_traces_in_flight: 100_000,
            max_series: 1000,
            series_reclaim_after: Duration::from_secs(60),
        }
    }
}

/// `assembly:` — when a trace is complete.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AssemblyConfig {
    /// Wait after a request span arrives for late children. Default 2s (0 is allowed).
    #[serde(with = "human_duration")]
    pub grace: Duration,
    /// Close a trace without a request span when no span arrived for this long. Default 30s.
    #[serde(with = "human_duration")]
    pub idle_timeout: Duration,
    /// Close any trace this long after its first span, whatever else. Default 10m.
    #[serde(with = "human_duration")]
    pub max_age: Duration,
    /// How often the assembler checks for complete traces. Default 100ms.
    #[serde(with = "human_duration")]
    pub tick: Duration,
}

impl Default for AssemblyConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            max_age: Duration::from_secs(600),
            tick: Duration::from_millis(100),
        }
    }
}

/// `kpi:` — sliding windows, series dimensions, SLOs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KpiSection {
    /// Sliding windows, ascending. Default `[1m, 5m, 1h]`.
    #[serde(with = "human_durations")]
    pub windows: Vec<Duration>,
    /// Which of `service`, `model`, `operation` split the series. Default all three.
    pub dimensions: Vec<Dimension>,
    /// Latency objectives for goodput.
    pub slo: SloConfig,
    /// Goodput ratio below which the `goodput` finding fires. Default 0.9.
    pub goodput_target: f64,
}

impl Default for KpiSection {
    fn default() -> Self {
        Self {
            windows: vec![
                Duration::from_secs(60),
                Duration::from_secs(300),
                Duration::from_secs(3600),
            ],
            dimensions: vec![Dimension::Service, Dimension::Model, Dimension::Operation],
            slo: SloConfig::default(),
            goodput_target: 0.9,
        }
    }
}

/// A KPI series dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// `service.name` of the resource.
    Service,
    /// Response (else request) model.
    Model,
    /// `gen_ai.operation.name`.
    Operation,
}

/// `kpi.slo:` — a request is "good" when it meets every objective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SloConfig {
    /// Time to first token. Default 1s.
    #[serde(with = "human_duration")]
    pub ttft: Duration,
    /// Time per output token. Default 100ms.
    #[serde(with = "human_duration")]
    pub tpot: Duration,
    /// End-to-end latency. Default 30s.
    #[serde(with = "human_duration")]
    pub e2e: Duration,
}

impl Default for SloConfig {
    fn default() -> Self {
        Self {
            ttft: Duration::from_secs(1),
            tpot: Duration::from_millis(100),
            e2e: Duration::from_secs(30),
        }
    }
}

/// `alerts:` — threshold rules, anomaly detection and delivery.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsSection {
    /// How often rules are evaluated. Default 5s.
    #[serde(with = "human_duration")]
    pub evaluation_interval: Duration,
    /// The KPI window rules are evaluated on (one of `kpi.windows`). Default 1m.
    #[serde(with = "human_duration")]
    pub window: Duration,
    /// Threshold rules (`name`, `expr`, `for`, `severity`, `summary`). Default none.
    pub rules: Vec<AlertRuleConfig>,
    /// Anomaly detection on every KPI series (EWMA baseline, k·σ for N evaluations).
    pub anomaly: AnomalyConfig,
    /// Alertmanager base URL (`http://host:9093` or `https://…`); transitions are POSTed to
    /// `{url}/api/v2/alerts`. Unset = no delivery.
    pub alertmanager_url: Option<String>,
    /// TLS of an `https://` Alertmanager URL (CA file, client certificate).
    pub alertmanager_tls: TlsClientConfig,
}

impl Default for AlertsSection {
    fn default() -> Self {
        Self {
            evaluation_interval: Duration::from_secs(5),
            window: Duration::from_secs(60),
            rules: Vec::new(),
            anomaly: AnomalyConfig::default(),
            alertmanager_url: None,
            alertmanager_tls: TlsClientConfig::default(),
        }
    }
}

/// `critical_path:` — options of docs/reference.md#critical-path, off by default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriticalPathSection {
    /// CRISP's skew tolerance: a sibling may overlap its successor by up to 1% of the parent's
    /// duration and still be walked back to. Default false (exact "at or before").
    pub skew_tolerance: bool,
    /// Shift a child from another service that does not fit its parent into the middle of the
    /// parent (Jaeger's old clock-skew adjuster). Default false.
    pub shift_remote_children: bool,
}

/// A configuration error, with the place in the file when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<config>` for a string).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{l}:{c}: {}", self.file, self.message),
            (Some(l), None) => write!(f, "{}:{l}: {}", self.file, self.message),
            _ => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

const STRING_SOURCE: &str = "<config>";

impl CollectorConfig {
    /// Parses and validates YAML text. An empty document gives the defaults.
    pub fn from_yaml_str(text: &str) -> Result<Self, ConfigError> {
        Self::parse_named(text, STRING_SOURCE)
    }

    /// Reads, parses and validates a YAML file; errors name the file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: name.clone(),
            line: None,
            column: None,
            message: format!("cannot read the config file: {e}"),
        })?;
        Self::parse_named(&text, &name)
    }

    fn parse_named(text: &str, file: &str) -> Result<Self, ConfigError> {
        let config: Self = if text.trim().is_empty() {
            Self::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| {
                let loc = e.location();
                ConfigError {
                    file: file.to_owned(),
                    line: loc.as_ref().map(|l| l.line()),
                    column: loc.as_ref().map(|l| l.column()),
                    message: strip_location(&e.to_string()),
                }
            })?
        };
        config.validate().map_err(|v| {
            let pos = locate(text, &v.path);
            ConfigError {
                file: file.to_owned(),
                line: pos.map(|p| p.0),
                column: pos.map(|p| p.1),
                message: format!("{}: {}", v.path.join("."), v.message),
            }
        })?;
        Ok(config)
    }

    /// Checks what the types cannot: positive durations, sorted windows, distinct addresses….
    pub fn validate(&self) -> Result<(), Invalid> {
        let r = &self.receivers;
        if r.max_body_bytes == 0 {
            return Err(Invalid::new(
                &["receivers", "max_body_bytes"],
                "must be > 0",
            ));
        }
        let mut addrs: Vec<(&[&str], SocketAddr)> = vec![(&["api", "listen"], self.api.listen)];
        if r.otlp_grpc.enabled {
            addrs.push((
                &["receivers", "otlp_grpc", "endpoint"],
                r.otlp_grpc.endpoint,
            ));
        }
        if r.otlp_http.enabled {
            addrs.push((
                &["receivers", "otlp_http", "endpoint"],
                r.otlp_http.endpoint,
            ));
        }
        for (i, (path, a)) in addrs.iter().enumerate() {
            if a.port() == 0 {
                continue;
            }
            if let Some((_, b)) = addrs[..i].iter().find(|(_, b)| b == a) {
                return Err(Invalid::new(
                    path,
                    format!("{b} is already used by another listener; pick another port"),
                ));
            }
        }
        if self.api.recent_traces == 0 {
            return Err(Invalid::new(&["api", "recent_traces"], "must be > 0"));
        }
        if self.api.recent_trace_spans == 0 {
            return Err(Invalid::new(&["api", "recent_trace_spans"], "must be > 0"));
        }
        let l = &self.limits;
        for (key, v) in [
            ("memory_limit_bytes", l.memory_limit_bytes),
            ("max_spans_per_trace", l.max_spans_per_trace),
            ("max_traces_in_flight", l.max_traces_in_flight),
            ("max_series", l.max_series),
        ] {
            if v == 0 {
                return Err(Invalid::new(&["limits", key], "must be > 0"));
            }
        }
        if self.receivers.body_read_timeout.is_zero() {
            return Err(Invalid::new(
                &["receivers", "body_read_timeout"],
                "must be a positive duration",
            ));
        }
        let a = &self.assembly;
        for (key, d) in [
            ("idle_timeout", a.idle_timeout),
            ("max_age", a.max_age),
            ("tick", a.tick),
        ] {
            if d.is_zero() {
                return Err(Invalid::new(
                    &["assembly", key],
                    "must be a positive duration",
                ));
            }
        }
        if a.max_age < a.idle_timeout {
            return Err(Invalid::new(
                &["assembly", "max_age"],
                "must be at least assembly.idle_timeout",
            ));
        }
        let k = &self.kpi;
        if k.windows.is_empty() {
            return Err(Invalid::new(
                &["kpi", "windows"],
                "needs at least one window",
            ));
        }
        for w in &k.windows {
            if *w < Duration::from_secs(1) {
                return Err(Invalid::new(
                    &["kpi", "windows"],
                    "each window must be ≥ 1s",
                ));
            }
        }
        if k.windows.windows(2).any(|p| p[0] >= p[1]) {
            return Err(Invalid::new(
                &["kpi", "windows"],
                "windows must be strictly ascending, e.g. [1m, 5m, 1h]",
            ));
        }
        for (i, d) in k.dimensions.iter().enumerate() {
            if k.dimensions[..i].contains(d) {
                return Err(Invalid::new(
                    &["kpi", "dimensions"],
                    "a dimension is listed twice",
                ));
            }
        }
        for (key, d) in [
            ("ttft", k.slo.ttft),
            ("tpot", k.slo.tpot),
            ("e2e", k.slo.e2e),
        ] {
            if d.is_zero() {
                return Err(Invalid::new(
                    &["kpi", "slo", key],
                    "must be a positive duration",
                ));
            }
        }
        if !(k.goodput_target > 0.0 && k.goodput_target <= 1.0) {
            return Err(Invalid::new(
                &["kpi", "goodput_target"],
                "must be in (0, 1]",
            ));
        }
        self.validate_network()?;
        self.validate_diagnosis()?;
        self.validate_alerts()?;
        self.validate_forward()?;
        self.validate_store()?;
        auth::validate_allowed_hosts(&self.api.allowed_hosts)?;
        self.auth.validate()?;
        Ok(())
    }

    fn validate_network(&self) -> Result<(), Invalid> {
        let r = &self.receivers;
        for (path, c) in [
            (
                ["receivers", "otlp_grpc", "connections"],
                &r.otlp_grpc.connections,
            ),
            (
                ["receivers", "otlp_http", "connections"],
                &r.otlp_http.connections,
            ),
            (["api", "connections", ""], &self.api.connections),
        ] {
            if let Err((field, message)) = c.validate() {
                let mut path: Vec<&'static str> =
                    path.into_iter().filter(|p| !p.is_empty()).collect();
                path.push(field);
                return Err(Invalid::new(&path, message));
            }
        }
        if self.shutdown_timeout.is_zero() {
            return Err(Invalid::new(&["shutdown_timeout"], "must be more than 0"));
        }
        Ok(())
    }

    /// Reads every listener's TLS files and builds their rustls configurations (the gRPC
    /// receiver offers ALPN `h2`, the others `h2` and `http/1.1`). An unreadable or invalid
    /// file is an error naming the config key and the file. `check-config` and the start of
    /// the collector both call this.
    pub fn tls_server_configs(&self) -> Result<ListenerTls, TlsError> {
        let load = |tls: &Option<TlsConfig>, key: &str, alpn| {
            tls.as_ref().map(|t| t.server_config(key, alpn)).transpose()
        };
        Ok(ListenerTls {
            otlp_grpc: load(
                &self.receivers.otlp_grpc.tls,
                "receivers.otlp_grpc.tls",
                Alpn::H2Only,
            )?,
            otlp_http: load(
                &self.receivers.otlp_http.tls,
                "receivers.otlp_http.tls",
                Alpn::H2AndHttp1,
            )?,
            api: load(&self.api.tls, "api.tls", Alpn::H2AndHttp1)?,
        })
    }

    fn validate_store(&self) -> Result<(), Invalid> {
        let s = &self.store;
        if !s.enabled {
            return Ok(());
        }
        if s.data_dir.as_os_str().is_empty() {
            return Err(Invalid::new(
                &["store", "data_dir"],
                "must name a directory (or set store.enabled: false)",
            ));
        }
        for (key, d) in [
            ("flush_interval", s.flush_interval),
            ("retention", s.retention),
        ] {
            if d.is_zero() {
                return Err(Invalid::new(&["store", key], "must be a positive duration"));
            }
        }
        if s.queue_capacity == 0 {
            return Err(Invalid::new(&["store", "queue_capacity"], "must be > 0"));
        }
        Ok(())
    }

    fn validate_diagnosis(&self) -> Result<(), Invalid> {
        let d = &self.diagnosis;
        for (key, v) in [
            ("queue_share_max", d.queue_share_max),
            ("gpu_saturated_min", d.gpu_saturated_min),
            ("gpu_idle_max", d.gpu_idle_max),
            ("prefill_ttft_share_min", d.prefill_ttft_share_min),
            ("error_rate_max", d.error_rate_max),
            ("rejection_rate_max", d.rejection_rate_max),
            ("cancel_rate_max", d.cancel_rate_max),
            ("goodput_min", d.goodput_min),
            ("critical_span_share_max", d.critical_span_share_max),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(Invalid::new(
                    &["diagnosis", key],
                    "must be a fraction in [0, 1]",
                ));
            }
        }
        if d.gpu_idle_max >= d.gpu_saturated_min {
            return Err(Invalid::new(
                &["diagnosis", "gpu_idle_max"],
                "must be below diagnosis.gpu_saturated_min",
            ));
        }
        for (key, v) in [
            ("ttft_p90_max_seconds", Some(d.ttft_p90_max_seconds)),
            ("tpot_p90_max_seconds", Some(d.tpot_p90_max_seconds)),
            ("large_batch_min", Some(d.large_batch_min)),
            ("e2e_p95_slo_seconds", d.e2e_p95_slo_seconds),
            ("throughput_min_rps", d.throughput_min_rps),
        ] {
            if let Some(v) = v
                && !(v > 0.0 && v.is_finite())
            {
                return Err(Invalid::new(&["diagnosis", key], "must be > 0"));
            }
        }
        if d.itl_p99_p50_ratio_max.is_nan() || d.itl_p99_p50_ratio_max <= 1.0 {
            return Err(Invalid::new(
                &["diagnosis", "itl_p99_p50_ratio_max"],
                "must be > 1",
            ));
        }
        Ok(())
    }

    fn validate_alerts(&self) -> Result<(), Invalid> {
        let a = &self.alerts;
        if a.evaluation_interval.is_zero() {
            return Err(Invalid::new(
                &["alerts", "evaluation_interval"],
                "must be a positive duration",
            ));
        }
        if !self.kpi.windows.contains(&a.window) {
            return Err(Invalid::new(
                &["alerts", "window"],
                format!(
                    "must be one of kpi.windows ({})",
                    self.kpi
                        .windows
                        .iter()
                        .map(|w| humantime::format_duration(*w).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        for (i, rule) in a.rules.iter().enumerate() {
            if a.rules[..i].iter().any(|r| r.name == rule.name) {
                return Err(Invalid::new(
                    &["alerts", "rules", "name"],
                    format!("rule name {:?} is used twice", rule.name),
                ));
            }
            if let Err(e) = AlertRule::compile(rule) {
                return Err(Invalid::new(&["alerts", "rules", e.field], e.to_string()));
            }
        }
        if let Err(e) = AnomalyDetector::new(a.anomaly.clone()) {
            return Err(Invalid::new(&["alerts", "anomaly", "kpis"], e.to_string()));
        }
        if let Some(url) = &a.alertmanager_url {
            check_http_url(url).map_err(|m| Invalid::new(&["alerts", "alertmanager_url"], m))?;
            a.alertmanager_tls
                .check(url, &["alerts", "alertmanager_tls"])?;
        }
        Ok(())
    }

    fn validate_forward(&self) -> Result<(), Invalid> {
        self.forward.validate()
    }
}

impl CollectorConfig {
    /// The assembler's bounds and timings.
    pub fn assembler_config(&self) -> AssemblerConfig {
        AssemblerConfig {
            grace: self.assembly.grace,
            idle_timeout: self.assembly.idle_timeout,
            max_age: self.assembly.max_age,
            max_spans_per_trace: self.limits.max_spans_per_trace,
            max_traces_in_flight: self.limits.max_traces_in_flight,
        }
    }

    /// The KPI windows' configuration.
    pub fn kpi_config(&self) -> kpi::KpiConfig {
        kpi::KpiConfig {
            windows: self.kpi.windows.clone(),
            slo: self.slo(),
            dimensions: self.kpi_dimensions(),
            max_series: self.limits.max_series,
            series_reclaim_after: self.limits.series_reclaim_after,
            ..kpi::KpiConfig::default()
        }
    }

    /// The SLOs in the analysis crate's terms.
    pub fn slo(&self) -> kpi::SloConfig {
        kpi::SloConfig {
            ttft_seconds: Some(self.kpi.slo.ttft.as_secs_f64()),
            tpot_seconds: Some(self.kpi.slo.tpot.as_secs_f64()),
            e2e_seconds: Some(self.kpi.slo.e2e.as_secs_f64()),
        }
    }

    /// The KPI dimensions in the analysis crate's terms.
    pub fn kpi_dimensions(&self) -> Vec<kpi::Dimension> {
        self.kpi
            .dimensions
            .iter()
            .map(|d| match d {
                Dimension::Service => kpi::Dimension::Service,
                Dimension::Model => kpi::Dimension::Model,
                Dimension::Operation => kpi::Dimension::Operation,
            })
            .collect()
    }

    /// The diagnosis thresholds. Those tied to the SLOs (`ttft_p90_max_seconds`,
    /// `tpot_p90_max_seconds`, `e2e_p95_slo_seconds`, `goodput_min`) follow `kpi.slo` and
    /// `kpi.goodput_target` unless set to something other than their default under
    /// `diagnosis:`.
    pub fn diagnosis_config(&self) -> DiagnosisConfig {
        let base = DiagnosisConfig::default();
        let mut d = self.diagnosis.clone();
        let slo = self.slo();
        if d.ttft_p90_max_seconds == base.ttft_p90_max_seconds
            && let Some(t) = slo.ttft_seconds
        {
            d.ttft_p90_max_seconds = t;
        }
        if d.tpot_p90_max_seconds == base.tpot_p90_max_seconds
            && let Some(t) = slo.tpot_seconds
        {
            d.tpot_p90_max_seconds = t;
        }
        if d.e2e_p95_slo_seconds == base.e2e_p95_slo_seconds {
            d.e2e_p95_slo_seconds = slo.e2e_seconds;
        }
        if d.goodput_min == base.goodput_min {
            d.goodput_min = self.kpi.goodput_target;
        }
        d
    }

    /// The critical-path options.
    pub fn critical_path_options(&self) -> CriticalPathOptions {
        CriticalPathOptions {
            skew_tolerance: self.critical_path.skew_tolerance,
            shift_remote_children: self.critical_path.shift_remote_children,
        }
    }

    /// The critical-path windows' configuration: retention = the longest KPI window.
    pub fn critical_path_windows_config(&self) -> CriticalPathWindowsConfig {
        let retention = self
            .kpi
            .windows
            .iter()
            .copied()
            .max()
            .unwrap_or(Duration::from_secs(3600));
        CriticalPathWindowsConfig {
            retention,
            ..CriticalPathWindowsConfig::default()
        }
    }
}

fn check_http_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(format!("{url:?} must start with http:// or https://")),
    }
    if uri.host().is_none() {
        return Err(format!("{url:?} has no host"));
    }
    Ok(())
}

/// A semantic validation failure: the key path and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Key path, e.g. `["assembly", "grace"]`.
    pub path: Vec<&'static str>,
    /// What is wrong and what to do.
    pub message: String,
}

impl Invalid {
    fn new(path: &[&'static str], message: impl Into<String>) -> Self {
        Self {
            path: path.to_vec(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.join("."), self.message)
    }
}

/// Removes libyaml's " at line L column C" (the location is reported separately).
fn strip_location(msg: &str) -> String {
    if let Some(at) = msg.find(" at line ") {
        let rest = &msg[at + " at line ".len()..];
        let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let l = digits(rest);
        if let Some(after) = rest[l..].strip_prefix(" column ") {
            let c = digits(after);
            return format!("{}{}", &msg[..at], &after[c..]);
        }
    }
    msg.to_owned()
}

/// Best-effort position (1-based line, column) of a key path in YAML text written in block
/// style: each key is searched among the lines indented deeper than its parent's. Returns the
/// deepest key found, so an error still points near the problem.
fn locate(text: &str, path: &[&str]) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut from = 0usize;
    let mut parent_indent: Option<usize> = None;
    let mut found = None;
    for key in path {
        let mut hit = None;
        for (i, line) in lines.iter().enumerate().skip(from) {
            let trimmed = line.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let indent = line.len() - trimmed.len();
            if let Some(p) = parent_indent
                && indent <= p
                && i > from
            {
                break;
            }
            let body = trimmed.trim_start_matches("- ");
            if body
                .strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with(':'))
            {
                hit = Some((i, indent + (trimmed.len() - body.len())));
                break;
            }
        }
        match hit {
            Some((i, col)) => {
                found = Some((i + 1, col + 1));
                from = i + 1;
                parent_indent = Some(col);
            }
            None => break,
        }
    }
    found
}

/// Serde helpers for one human-readable duration (`2s`, `500ms`).
pub mod human_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `2s`, `1m 30s`….
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    /// Reads a humantime duration string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// Serde helpers for a list of human-readable durations.
pub mod human_durations {
    use std::time::Duration;

    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `["1m", "5m"]`.
    pub fn serialize<S: Serializer>(ds: &[Duration], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(ds.len()))?;
        for d in ds {
            seq.serialize_element(&humantime::format_duration(*d).to_string())?;
        }
        seq.end()
    }

    /// Reads a list of humantime duration strings.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        let v = Vec::<String>::deserialize(d)?;
        v.iter()
            .map(|s| super::parse_duration(s).map_err(serde::de::Error::custom))
            .collect()
    }
}

/// Parses `2s`, `500ms`, `1h30m`; a bare `0` is zero. The message says what is accepted.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("invalid duration {s:?} ({e}); write e.g. \"500ms\", \"2s\", \"5m\", \"1h\"")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default() {
        assert_eq!(
            CollectorConfig::from_yaml_str("").unwrap(),
            CollectorConfig::default()
        );
        assert_eq!(
            CollectorConfig::from_yaml_str("# only a comment\n").unwrap(),
            CollectorConfig::default()
        );
    }

    #[test]
    fn default_is_valid() {
        CollectorConfig::default().validate().unwrap();
    }

    #[test]
    fn durations_parse() {
        let c = CollectorConfig::from_yaml_str(
            "assembly:\n  grace: 500ms\n  idle_timeout: 1m\nkpi:\n  windows: [30s, 2m]\n  \
             dimensions: [model]\nalerts:\n  window: 30s\n",
        )
        .unwrap();
        assert_eq!(c.assembly.grace, Duration::from_millis(500));
        assert_eq!(c.assembly.idle_timeout, Duration::from_secs(60));
        assert_eq!(
            c.kpi.windows,
            vec![Duration::from_secs(30), Duration::from_secs(120)]
        );
        assert_eq!(c.kpi.dimensions, vec![Dimension::Model]);
    }

    #[test]
    fn unknown_key_has_line_and_column() {
        let e = CollectorConfig::from_yaml_str("api:\n  listen: 127.0.0.1:1\n  lisen: x\n")
            .unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert_eq!(e.column, Some(3), "{e}");
        assert!(e.message.contains("unknown field `lisen`"), "{e}");
        assert!(!e.message.contains("at line"), "{e}");
        assert!(e.to_string().starts_with("<config>:3:3: "), "{e}");
    }

    #[test]
    fn bad_duration_says_what_to_write() {
        let e =
            CollectorConfig::from_yaml_str("assembly:\n  grace: 2 seconds please\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("500ms"), "{e}");
    }

    #[test]
    fn bad_address_is_an_error() {
        let e = CollectorConfig::from_yaml_str("api:\n  listen: localhost\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn semantic_errors_point_at_the_key() {
        let e = CollectorConfig::from_yaml_str(
            "# c\nkpi:\n  slo:\n    ttft: 1s\n  windows: [5m, 1m]\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.column), (Some(5), Some(3)), "{e}");
        assert!(e.message.starts_with("kpi.windows: "), "{e}");

        let e = CollectorConfig::from_yaml_str("assembly:\n  idle_timeout: 0s\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");

        let e = CollectorConfig::from_yaml_str(
            "receivers:\n  otlp_grpc:\n    endpoint: 127.0.0.1:9464\n",
        )
        .unwrap_err();
        assert!(e.message.contains("already used"), "{e}");

        let e = CollectorConfig::from_yaml_str("forward:\n  endpoint: tempo:4317\n").unwrap_err();
        assert!(e.message.contains("http://"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");

        let e = CollectorConfig::from_yaml_str("kpi:\n  goodput_target: 1.5\n").unwrap_err();
        assert!(e.message.starts_with("kpi.goodput_target"), "{e}");

        let e = CollectorConfig::from_yaml_str("alerts:\n  window: 2m\n").unwrap_err();
        assert!(e.message.contains("kpi.windows"), "{e}");
    }

    #[test]
    fn receivers_can_be_disabled() {
        let c = CollectorConfig::from_yaml_str(
            "receivers:\n  otlp_grpc:\n    enabled: false\n    endpoint: 127.0.0.1:9464\n",
        )
        .unwrap();
        assert!(!c.receivers.otlp_grpc.enabled);
    }

    #[test]
    fn a_receiver_can_be_turned_off_without_repeating_its_address() {
        let c = CollectorConfig::from_yaml_str("receivers:\n  otlp_grpc:\n    enabled: false\n")
            .unwrap();
        assert!(!c.receivers.otlp_grpc.enabled);
        assert_eq!(
            c.receivers.otlp_grpc.endpoint,
            CollectorConfig::default().receivers.otlp_grpc.endpoint
        );
    }

    #[test]
    fn port_zero_may_repeat() {
        let c = CollectorConfig::from_yaml_str(
            "receivers:\n  otlp_grpc: {endpoint: 127.0.0.1:0}\n  otlp_http: {endpoint: \
             127.0.0.1:0}\napi: {listen: 127.0.0.1:0}\n",
        )
        .unwrap();
        assert_eq!(c.api.listen.port(), 0);
    }

    #[test]
    fn round_trips_through_yaml() {
        let mut c = CollectorConfig::default();
        c.forward.endpoint = Some("http://127.0.0.1:4317".into());
        c.assembly.grace = Duration::from_millis(1500);
        let text = serde_yaml_ng::to_string(&c).unwrap();
        assert_eq!(CollectorConfig::from_yaml_str(&text).unwrap(), c);
    }

    #[test]
    fn strip_location_keeps_context() {
        assert_eq!(
            strip_location("did not find expected key at line 3 column 5, while parsing"),
            "did not find expected key, while parsing"
        );
        assert_eq!(strip_location("plain"), "plain");
    }
}
