//! Checks on a parsed configuration that its types cannot express (positive durations, sorted
//! windows, distinct addresses, loadable TLS files…), each failure naming its key path; for
//! `check-config`, also whether the history store could be opened where `store.data_dir` says.

use std::net::SocketAddr;
use std::time::Duration;

use infertrace_analysis::alert::{AlertRule, AnomalyDetector};

use super::check::{Invalid, check_http_url};
use super::schema::CollectorConfig;
use crate::store::Store;

/// How far the checks go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// The values alone: what [`CollectorConfig::validate`] checks (`collect` checks them again
    /// once its `--data-dir` and `--no-store` have changed them, then opens the store itself).
    Values,
    /// Also whether the history store could be opened where the values say
    /// ([`Store::check`], which creates nothing): what `check-config` checks, for which the
    /// file is all there is.
    Disk,
}

/// The check of one group of keys of the configuration: its first problem.
type Section = fn(&CollectorConfig, Reach) -> Result<(), Invalid>;

/// The groups of checks, in the order of the file's sections.
const SECTIONS: [Section; 12] = [
    |c, _| c.validate_receivers(),
    |c, _| c.validate_api(),
    |c, _| c.validate_limits(),
    |c, _| c.validate_assembly(),
    |c, _| c.validate_kpi(),
    |c, _| c.validate_network(),
    |c, _| c.validate_diagnosis(),
    |c, _| c.validate_alerts(),
    |c, _| c.validate_forward(),
    CollectorConfig::validate_store,
    |c, _| super::auth::validate_allowed_hosts(&c.api.allowed_hosts),
    |c, _| c.auth.validate(),
];

impl CollectorConfig {
    /// Checks what the types cannot: positive durations, sorted windows, distinct addresses…;
    /// the first problem found (see [`problems`](Self::problems) for all of them).
    pub fn validate(&self) -> Result<(), Invalid> {
        SECTIONS
            .iter()
            .try_for_each(|check| check(self, Reach::Values))
    }

    /// Every problem [`validate`](Self::validate) would report — the first of each group of
    /// checks (about one group per top-level key of the file) — and, in the store's group,
    /// whether the history store could be opened at `store.data_dir` when it is enabled (a
    /// directory `collect` could not create, a database it would refuse; found without
    /// creating anything), which `validate` leaves to `collect`'s start. What `check-config`
    /// shows, so that one run says what to fix everywhere; empty when the configuration is
    /// valid.
    pub fn problems(&self) -> Vec<Invalid> {
        SECTIONS
            .iter()
            .filter_map(|check| check(self, Reach::Disk).err())
            .collect()
    }

    fn validate_receivers(&self) -> Result<(), Invalid> {
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
        if r.body_read_timeout.is_zero() {
            return Err(Invalid::new(
                &["receivers", "body_read_timeout"],
                "must be a positive duration",
            ));
        }
        Ok(())
    }

    fn validate_api(&self) -> Result<(), Invalid> {
        if self.api.recent_traces == 0 {
            return Err(Invalid::new(&["api", "recent_traces"], "must be > 0"));
        }
        if self.api.recent_trace_spans == 0 {
            return Err(Invalid::new(&["api", "recent_trace_spans"], "must be > 0"));
        }
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), Invalid> {
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
        if !(1..=100).contains(&l.soft_limit_percent) {
            return Err(Invalid::new(
                &["limits", "soft_limit_percent"],
                "must be a percentage from 1 to 100",
            ));
        }
        if l.relief_target_percent >= l.soft_limit_percent {
            return Err(Invalid::new(
                &["limits", "relief_target_percent"],
                format!(
                    "must be below soft_limit_percent ({}): relief frees memory down to it",
                    l.soft_limit_percent
                ),
            ));
        }
        Ok(())
    }

    fn validate_assembly(&self) -> Result<(), Invalid> {
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
        Ok(())
    }

    fn validate_kpi(&self) -> Result<(), Invalid> {
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
        for (key, seconds) in [
            ("ttft", k.slo.ttft_seconds),
            ("tpot", k.slo.tpot_seconds),
            ("e2e", k.slo.e2e_seconds),
        ] {
            // `None` (an objective disabled in code) is allowed; a file always sets all three.
            if seconds.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
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

    fn validate_store(&self, reach: Reach) -> Result<(), Invalid> {
        self.validate_store_values()?;
        if reach == Reach::Disk && self.store.enabled {
            Store::check(&self.store.data_dir)
                .map_err(|e| Invalid::new(&["store", "data_dir"], e.to_string()))?;
        }
        Ok(())
    }

    fn validate_store_values(&self) -> Result<(), Invalid> {
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
            ("kv_transfer_ttft_share_max", d.kv_transfer_ttft_share_max),
            ("pool_wait_ttft_share_max", d.pool_wait_ttft_share_max),
            (
                "kv_alloc_wait_ttft_share_max",
                d.kv_alloc_wait_ttft_share_max,
            ),
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
            ("kv_bytes_per_token", d.kv_bytes_per_token),
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
        // Judged only against valid windows (else the windows' own problem says it all).
        if self.validate_kpi().is_ok() && !self.kpi.windows.contains(&a.window) {
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
            super::forward::check_tls(&a.alertmanager_tls, url, &["alerts", "alertmanager_tls"])?;
        }
        Ok(())
    }

    fn validate_forward(&self) -> Result<(), Invalid> {
        self.forward.validate()
    }
}
