//! The runtime configurations the collector's parts are built with, derived from the file's
//! sections: the assembler's, the analysis crate's (KPI windows, diagnosis, critical path) and
//! the listeners' TLS.

use std::time::Duration;

use infertrace_analysis::critical_path::{CriticalPathOptions, CriticalPathWindowsConfig};
use infertrace_analysis::diagnosis::DiagnosisConfig;
use infertrace_analysis::kpi;

use super::network::{Alpn, TlsConfig, TlsError};
use super::schema::CollectorConfig;
use crate::assembler::AssemblerConfig;

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

    /// The SLOs (`kpi.slo`).
    pub fn slo(&self) -> kpi::SloConfig {
        self.kpi.slo
    }

    /// The KPI dimensions (`kpi.dimensions`).
    pub fn kpi_dimensions(&self) -> Vec<kpi::Dimension> {
        self.kpi.dimensions.clone()
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
            reclaim_after: self.limits.series_reclaim_after,
            ..CriticalPathWindowsConfig::default()
        }
    }

    /// Every listener's `tls:` section: (listener, config key, section, ALPN). The gRPC
    /// receiver offers ALPN `h2`, the others `h2` and `http/1.1`. What
    /// [`tls_server_configs`](Self::tls_server_configs) (`check-config`) and the running
    /// collector's reloadable TLS both read.
    pub fn tls_sections(&self) -> [(&'static str, &'static str, Option<&TlsConfig>, Alpn); 3] {
        [
            (
                "otlp_grpc",
                "receivers.otlp_grpc.tls",
                self.receivers.otlp_grpc.tls.as_ref(),
                Alpn::H2Only,
            ),
            (
                "otlp_http",
                "receivers.otlp_http.tls",
                self.receivers.otlp_http.tls.as_ref(),
                Alpn::H2AndHttp1,
            ),
            ("api", "api.tls", self.api.tls.as_ref(), Alpn::H2AndHttp1),
        ]
    }

    /// Reads every listener's TLS files and builds their rustls configurations
    /// ([`tls_sections`](Self::tls_sections)). Each unreadable or invalid file is an error naming
    /// the config key and the file, every listener's given. `check-config` calls this; the collector reads the same
    /// sections at start and on SIGHUP.
    pub fn tls_server_configs(&self) -> Result<ListenerTls, Vec<TlsError>> {
        let mut out = ListenerTls::default();
        let mut errors = Vec::new();
        for (listener, key, tls, alpn) in self.tls_sections() {
            let Some(tls) = tls else { continue };
            let config = match tls.server_config(key, alpn) {
                Ok(config) => Some(config),
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            match listener {
                "otlp_grpc" => out.otlp_grpc = config,
                "otlp_http" => out.otlp_http = config,
                _ => out.api = config,
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(errors)
        }
    }
}
