//! The collector's configuration: one YAML file, every key optional with a documented default.
//!
//! `otel-config/infertrace.yaml` lists every key with its default and a comment. This module
//! declares the parts: the shape of the file is in `schema` ([`CollectorConfig`] and its
//! sections; `network`, `auth`, `forward` for theirs), loading in `load`, the checks in
//! `validate` (what a failed one says in `check`), the runtime configurations built from them in
//! `convert`, and the `file:line:column` of errors in `location`. Durations are human-readable (`2s`, `500ms`, `1m`, `1h30m`), addresses are
//! `IP:port`. Unknown keys are errors (a typo never silently falls back to a default), and every
//! error names the place in the file: `infertrace.yaml:12:5: unknown field ...`.
//!
//! ```
//! use infertrace_collector::config::CollectorConfig;
//! let cfg = CollectorConfig::from_yaml_str("assembly:\n  grace: 500ms\n").unwrap();
//! assert_eq!(cfg.assembly.grace, std::time::Duration::from_millis(500));
//! assert_eq!(cfg.api.listen, CollectorConfig::default().api.listen);
//! ```

mod auth;
mod check;
mod convert;
mod forward;
mod load;
mod location;
pub(crate) mod network;
mod schema;
mod validate;

pub use crate::client_tls::TlsClientConfig;
pub use auth::{AuthConfig, DEFAULT_TOKENS_ENV, default_allowed_hosts};
pub use check::Invalid;
pub use convert::ListenerTls;
pub use forward::{ForwardConfig, ForwardProtocol, RetryConfig};
pub use infertrace_analysis::kpi::{Dimension, SloConfig};
pub use load::ConfigError;
pub use network::{
    Alpn, ConnectionsConfig, DEFAULT_SHUTDOWN_TIMEOUT, TlsConfig, TlsError, crypto_provider,
};
pub use schema::{
    AlertsSection, ApiConfig, AssemblyConfig, CollectorConfig, CriticalPathSection,
    DEFAULT_BODY_READ_TIMEOUT, KpiSection, LimitsConfig, OtlpGrpcReceiver, OtlpHttpReceiver,
    ReceiversConfig,
};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::location::strip_location;
    use super::*;

    #[test]
    fn alertmanager_url_is_a_base_and_extra_labels_are_label_names() {
        for (yaml, key) in [
            (
                "alerts:\n  alertmanager_url: http://am:9093/api/v2/alerts\n",
                "alerts.alertmanager_url",
            ),
            (
                "alerts:\n  alertmanager_labels: { 1x: a }\n",
                "alerts.alertmanager_labels",
            ),
            (
                "alerts:\n  alertmanager_labels: { severity: low }\n",
                "alerts.alertmanager_labels",
            ),
        ] {
            let e = CollectorConfig::from_yaml_str(yaml)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{yaml}: {e}");
        }
        let c = CollectorConfig::from_yaml_str(
            "alerts:\n  alertmanager_url: http://gw/alertmanager/\n  alertmanager_labels: { cluster: eu_1 }\n",
        )
        .unwrap();
        assert_eq!(c.alerts.alertmanager_labels["cluster"], "eu_1");
    }

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
            "assembly:\n  idle_timeout: 10s\n  max_age: 20s\n  max_grace: 30s\n",
        )
        .unwrap_err();
        assert!(
            e.message
                .starts_with("assembly.max_grace: must be below assembly.max_age"),
            "{e}"
        );
        CollectorConfig::from_yaml_str("assembly:\n  grace: 15s\n").unwrap();

        let e = CollectorConfig::from_yaml_str(
            "receivers:\n  otlp_grpc:\n    endpoint: 127.0.0.1:9464\n",
        )
        .unwrap_err();
        // The key set, its address, and the listener whose port it takes.
        assert_eq!(
            e.message,
            "receivers.otlp_grpc.endpoint: 127.0.0.1:9464 takes the port of api.listen \
             (127.0.0.1:9464); pick another port"
        );
        // A wildcard covers a specific address on its port (bind would fail), IPv6's both
        // families; other families or ports do not clash.
        for (grpc, http, clash) in [
            ("127.0.0.1:4417", "0.0.0.0:4417", true),
            ("0.0.0.0:4417", "127.0.0.1:4417", true),
            ("127.0.0.1:4417", "'[::]:4417'", true),
            ("'[::1]:4417'", "0.0.0.0:4417", false),
            ("127.0.0.1:4417", "0.0.0.0:4418", false),
        ] {
            let yaml = format!(
                "receivers:\n  otlp_grpc:\n    endpoint: {grpc}\n  \
                 otlp_http:\n    endpoint: {http}\n"
            );
            let result = CollectorConfig::from_yaml_str(&yaml);
            assert_eq!(result.is_err(), clash, "{grpc} {http}: {result:?}");
        }

        // Credentials, a query or a fragment in a URL would not be sent: refused, the secret
        // not repeated.
        for (url, says) in [
            ("http://user:secret@tempo:4318/p", "credentials"),
            ("http://tempo:4318/p?x=1", "query"),
            ("http://tempo:4318/p#f", "fragment"),
        ] {
            for yaml in [
                format!("forward:\n  endpoint: {url}\n"),
                format!("alerts:\n  alertmanager_url: {url}\n"),
            ] {
                let e = CollectorConfig::from_yaml_str(&yaml).unwrap_err();
                assert!(e.message.contains(says), "{yaml}: {e}");
                assert!(!e.message.contains("secret"), "{e}");
            }
        }
        // Each names where its headers go instead.
        let e = CollectorConfig::from_yaml_str("alerts:\n  alertmanager_url: http://u:p@am:9093\n")
            .unwrap_err();
        assert!(e.message.contains("alerts.alertmanager_headers"), "{e}");
        // A port without a host (which `collect` could not connect to) is no URL either.
        for yaml in [
            "forward:\n  endpoint: 'https://:4317'\n",
            "alerts:\n  alertmanager_url: 'https://:9093'\n",
        ] {
            let e = CollectorConfig::from_yaml_str(yaml).unwrap_err();
            assert!(e.message.contains("has no host"), "{yaml}: {e}");
        }
        for yaml in [
            "alerts:\n  alertmanager_tls:\n    ca_file: /nonexistent\n",
            "alerts:\n  alertmanager_headers: { x-api-key: k }\n",
        ] {
            let e = CollectorConfig::from_yaml_str(yaml).unwrap_err();
            assert!(e.message.contains("without alerts.alertmanager_url"), "{e}");
        }
        let e = CollectorConfig::from_yaml_str(
            "alerts:\n  alertmanager_url: http://am:9093\n  alertmanager_headers: { host: x }\n",
        )
        .unwrap_err();
        assert!(e.message.starts_with("alerts.alertmanager_headers"), "{e}");
        CollectorConfig::from_yaml_str(
            "alerts:\n  alertmanager_url: http://am:9093\n  alertmanager_headers: { authorization: Bearer k }\n",
        )
        .unwrap();
        // A problem that names the key below the one it is placed at is not led by both.
        let e = CollectorConfig::from_yaml_str(
            "forward:\n  endpoint: https://tempo:4318/v1/traces\n  tls:\n    ca_file: /nonexistent\n",
        )
        .unwrap_err();
        assert!(
            e.message.starts_with("forward.tls.ca_file /nonexistent: "),
            "{e}"
        );

        let e = CollectorConfig::from_yaml_str("forward:\n  endpoint: tempo:4317\n").unwrap_err();
        assert!(e.message.contains("http://"), "{e}");
        assert_eq!(e.line, Some(2), "{e}");

        let e = CollectorConfig::from_yaml_str("kpi:\n  goodput_target: 1.5\n").unwrap_err();
        assert!(e.message.starts_with("kpi.goodput_target"), "{e}");

        let e = CollectorConfig::from_yaml_str("alerts:\n  window: 2m\n").unwrap_err();
        assert!(e.message.contains("kpi.windows"), "{e}");

        let e = CollectorConfig::from_yaml_str("limits:\n  soft_limit_percent: 101\n").unwrap_err();
        assert!(e.message.starts_with("limits.soft_limit_percent"), "{e}");
        let e = CollectorConfig::from_yaml_str(
            "limits:\n  soft_limit_percent: 60\n  relief_target_percent: 60\n",
        )
        .unwrap_err();
        assert!(e.message.starts_with("limits.relief_target_percent"), "{e}");
        assert!(e.message.contains("below soft_limit_percent (60)"), "{e}");
        CollectorConfig::from_yaml_str(
            "limits:\n  soft_limit_percent: 90\n  relief_target_percent: 80\n",
        )
        .unwrap();
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

    #[test]
    fn parse_errors_name_the_whole_key_path() {
        for (yaml, at, lead) in [
            (
                "assembly:\n  grace: \"2\"\n",
                (2, 3),
                "assembly.grace: invalid duration",
            ),
            (
                "limits:\n  max_series: x\n",
                (2, 15),
                "limits.max_series: invalid type",
            ),
            (
                "receivers:\n  otlp_grpc:\n    endpont: 1.2.3.4:5\n",
                (3, 5),
                "receivers.otlp_grpc.endpont: unknown field `endpont`",
            ),
            (
                "alerts:\n  rules:\n    - name: x\n",
                (3, 7),
                "alerts.rules[0]: missing field `expr`",
            ),
        ] {
            let e = CollectorConfig::from_yaml_str(yaml).unwrap_err();
            assert_eq!((e.line, e.column), (Some(at.0), Some(at.1)), "{yaml}");
            assert!(e.message.starts_with(lead), "{yaml}: {}", e.message);
        }
    }
}
