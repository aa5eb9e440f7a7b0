//! The collector's configuration: one YAML file, every key optional with a documented default.
//!
//! `otel-config/infertrace.yaml` lists every key with its default and a comment. This module
//! loads the file; its sections are in `schema` (and `network`, `auth`, `forward` for theirs),
//! the checks in `validate`, the runtime configurations built from them in `convert`, and the
//! `file:line:column` of errors in `location`. Durations are human-readable (`2s`, `500ms`, `1m`, `1h30m`), addresses are
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
use std::path::Path;
use std::time::Duration;

use infertrace_analysis::diagnosis::DiagnosisConfig;
use serde::{Deserialize, Serialize};

use crate::duration::human_duration;

mod convert;
mod location;
mod schema;
mod validate;
pub use convert::ListenerTls;
pub use infertrace_analysis::kpi::{Dimension, SloConfig};
use location::{locate, strip_location};
pub use schema::{
    AlertsSection, ApiConfig, AssemblyConfig, CriticalPathSection, DEFAULT_BODY_READ_TIMEOUT,
    KpiSection, LimitsConfig, OtlpGrpcReceiver, OtlpHttpReceiver, ReceiversConfig,
};
pub use validate::Invalid;
use validate::check_http_url;

mod network;
pub use network::{
    Alpn, ConnectionsConfig, DEFAULT_SHUTDOWN_TIMEOUT, TlsConfig, TlsError, crypto_provider,
};
mod auth;
pub use auth::{AuthConfig, DEFAULT_TOKENS_ENV, default_allowed_hosts};
mod forward;

pub use crate::client_tls::TlsClientConfig;
pub use forward::{ForwardConfig, ForwardProtocol, RetryConfig};

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
