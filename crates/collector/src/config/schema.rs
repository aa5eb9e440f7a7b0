//! The configuration's shape, key by key: [`CollectorConfig`] and its sections, what each key
//! means and its default. Loading lives in `load`, checks in `validate`, the runtime
//! configurations built from these in `convert`.

use std::net::SocketAddr;
use std::time::Duration;

use infertrace_analysis::alert::{AlertRuleConfig, AnomalyConfig};
use infertrace_analysis::diagnosis::DiagnosisConfig;
use infertrace_analysis::kpi::{Dimension, KpiConfig, SloConfig};
use serde::{Deserialize, Serialize};

use super::auth::{AuthConfig, default_allowed_hosts};
use super::forward::ForwardConfig;
use super::network::{ConnectionsConfig, DEFAULT_SHUTDOWN_TIMEOUT, TlsConfig};
use crate::client_tls::TlsClientConfig;
use crate::duration::{human_duration, human_durations};

/// Default longest time to receive a request body: 30 s.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

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
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
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
    /// Most spans those traces may hold in all (the oldest trace is forgotten first). Their
    /// memory counts in `limits.memory_limit_bytes`. Default 100000.
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
    /// Memory that requests being read and decoded, buffered spans, the forward queue, the
    /// recent-trace ring and the aggregates (KPI series, critical-path windows, Prometheus
    /// label sets) may hold, bytes; over it receivers answer "retry later" (HTTP 429, gRPC
    /// UNAVAILABLE), and past `soft_limit_percent` of it a sender over its share is refused so
    /// (`crate::limiter`) and the oldest buffered traces are closed early, releasing their
    /// memory (`traces_closed_early_total{reason="memory"}`). Default 512 MiB.
    pub memory_limit_bytes: usize,
    /// The soft limit, percent of `memory_limit_bytes` — of what the aggregates leave of it,
    /// as they are never freed for data: past it a sender over its fair share is refused (also
    /// the forward queue's share threshold, percent of its places), and buffered data gives
    /// way (memory relief). Default 75.
    pub soft_limit_percent: usize,
    /// Memory relief frees what it can until the use would be down to this percent of
    /// `memory_limit_bytes` (of what the aggregates leave of it, as for `soft_limit_percent`);
    /// below `soft_limit_percent`. Default 50.
    pub relief_target_percent: usize,
    /// Spans kept per trace; more are dropped (`dropped_spans_total{reason="max_spans_per_trace"}`),
    /// but a request span has 64 more places (a trace its slices filled still gets its request).
    /// Default 10000.
    pub max_spans_per_trace: usize,
    /// Traces assembled at once; a new trace past it closes the oldest trace in flight before
    /// its grace period ends (`traces_closed_early_total{reason="max_traces_in_flight"}`) —
    /// nothing accepted is dropped.
    /// Default 100000.
    pub max_traces_in_flight: usize,
    /// KPI / Prometheus series (label combinations) kept; a further one takes the place of a
    /// series idle for `series_reclaim_after` (`series_reclaimed_total`), else goes to one
    /// overflow series (`series_overflow_total`). Default 1000.
    pub max_series: usize,
    /// How long a series must have had no request before a new series may take its place
    /// under `max_series` (and a critical-path key, under the 256 (service, span) keys, before
    /// a new one may take its place). Default 1m.
    #[serde(with = "human_duration")]
    pub series_reclaim_after: Duration,
    /// Read the process's resident memory at every tick, and while it is within 32 MiB of
    /// `memory_limit_bytes` plus 64 MiB have the allocator return freed memory at once instead
    /// of keeping it for reuse (`crate::resident`): slower, but the process stays within that
    /// bound under heavy churn with the limit full, or a small limit, too. Off for a collector
    /// embedded in a larger program (whose resident memory is not the collector's). Default
    /// true.
    pub watch_resident_memory: bool,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            memory_limit_bytes: crate::limiter::DEFAULT_MEMORY_LIMIT_BYTES,
            soft_limit_percent: crate::limiter::SENDER_SHARE_FROM_PERCENT,
            relief_target_percent: crate::limiter::MEMORY_RELIEF_TARGET_PERCENT,
            max_spans_per_trace: 10_000,
            max_traces_in_flight: 100_000,
            max_series: KpiConfig::default().max_series,
            series_reclaim_after: KpiConfig::default().series_reclaim_after,
            watch_resident_memory: true,
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
    /// The longest the wait may grow to: while spans of completed traces arrive later than
    /// `grace` (services exporting separately), the wait follows the longest lateness of the
    /// last ten minutes plus a tenth, up to this (`infertrace_assembly_grace_seconds`).
    /// At or below `grace`, the wait stays `grace`. Default 10s.
    #[serde(with = "human_duration")]
    pub max_grace: Duration,
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
            max_grace: Duration::from_secs(10),
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
    #[serde(with = "slo_yaml")]
    pub slo: SloConfig,
    /// Goodput ratio below which the `goodput` finding fires. Default 0.9.
    pub goodput_target: f64,
}

impl Default for KpiSection {
    /// The analysis crate's defaults ([`KpiConfig`]), and a goodput target of 0.9.
    fn default() -> Self {
        let KpiConfig {
            windows,
            dimensions,
            slo,
            ..
        } = KpiConfig::default();
        Self {
            windows,
            dimensions,
            slo,
            goodput_target: 0.9,
        }
    }
}

/// Serde of `kpi.slo:` — `{ttft: 1s, tpot: 100ms, e2e: 30s}`, each a positive duration — into
/// the analysis crate's [`SloConfig`] (seconds). An objective disabled in code (`None`) is
/// written as `0`, which validation refuses: a config file always sets all three.
mod slo_yaml {
    use std::time::Duration;

    use infertrace_analysis::kpi::SloConfig;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::duration::human_duration;

    #[derive(Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Slo {
        #[serde(with = "human_duration")]
        ttft: Duration,
        #[serde(with = "human_duration")]
        tpot: Duration,
        #[serde(with = "human_duration")]
        e2e: Duration,
    }

    impl Default for Slo {
        fn default() -> Self {
            Self::from(&SloConfig::default())
        }
    }

    fn duration(seconds: Option<f64>) -> Duration {
        seconds
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .unwrap_or(Duration::ZERO)
    }

    impl From<&SloConfig> for Slo {
        fn from(c: &SloConfig) -> Self {
            Self {
                ttft: duration(c.ttft_seconds),
                tpot: duration(c.tpot_seconds),
                e2e: duration(c.e2e_seconds),
            }
        }
    }

    pub(super) fn serialize<S: Serializer>(slo: &SloConfig, s: S) -> Result<S::Ok, S::Error> {
        Slo::from(slo).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SloConfig, D::Error> {
        let y = Slo::deserialize(d)?;
        Ok(SloConfig {
            ttft_seconds: Some(y.ttft.as_secs_f64()),
            tpot_seconds: Some(y.tpot.as_secs_f64()),
            e2e_seconds: Some(y.e2e.as_secs_f64()),
        })
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
    /// Headers sent with every post to Alertmanager (an `authorization` header or API key of
    /// an Alertmanager behind a proxy); `${NAME}` in a value is the environment variable
    /// `NAME`, as in `forward.headers`. Default none.
    pub alertmanager_headers: std::collections::BTreeMap<String, String>,
    /// Labels added to every alert posted to Alertmanager. Without `instance` here, `instance`
    /// is the host name: several collectors firing one rule (a sharded fleet) stay apart, where
    /// Alertmanager would take one's resolve for the other's still-firing alert.
    pub alertmanager_labels: std::collections::BTreeMap<String, String>,
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
            alertmanager_headers: std::collections::BTreeMap::new(),
            alertmanager_labels: std::collections::BTreeMap::new(),
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
