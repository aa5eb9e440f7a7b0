//! Checks on a parsed configuration that its types cannot express (positive durations, sorted
//! windows, distinct addresses, loadable TLS files…), each failure naming its key path; for
//! `check-config`, also whether the history store could be opened where `store.data_dir` says.

use std::net::SocketAddr;
use std::time::Duration;

use infertrace_analysis::alert::{AlertRule, AnomalyDetector};

use super::check::{Invalid, Problems, check_headers, check_http_url};
use super::schema::CollectorConfig;
use crate::store::Store;

/// The smallest `limits.memory_limit_bytes` (1 MiB).
const MIN_MEMORY_LIMIT: usize = 1 << 20;

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

/// The checks of one group of keys of the configuration, adding every problem they find.
type Section = fn(&CollectorConfig, Reach, &mut Problems);

/// The groups of checks, in the order of the file's sections.
const SECTIONS: [Section; 12] = [
    |c, _, p| c.check_receivers(p),
    |c, _, p| c.check_api(p),
    |c, _, p| c.check_limits(p),
    |c, _, p| c.check_assembly(p),
    |c, _, p| c.check_kpi(p),
    |c, _, p| c.check_network(p),
    |c, _, p| c.check_diagnosis(p),
    |c, _, p| c.check_alerts(p),
    |c, _, p| c.forward.check(p),
    CollectorConfig::check_store,
    |c, _, p| {
        p.check(super::auth::validate_allowed_hosts(&c.api.allowed_hosts));
    },
    |c, _, p| {
        p.check(c.auth.validate());
    },
];

impl CollectorConfig {
    /// Checks what the types cannot: positive durations, sorted windows, distinct addresses…;
    /// the first problem found (see [`problems`](Self::problems) for all of them).
    pub fn validate(&self) -> Result<(), Invalid> {
        match self.found(Reach::Values).into_iter().next() {
            Some(first) => Err(first),
            None => Ok(()),
        }
    }

    /// Every problem [`validate`](Self::validate) would report, in the order of the file's
    /// sections, and whether the history store could be opened at `store.data_dir` when it is
    /// enabled (a directory `collect` could not create, a database it would refuse; found
    /// without creating anything), which `validate` leaves to `collect`'s start. What
    /// `check-config` shows, so that one run says what to fix everywhere; empty when the
    /// configuration is valid.
    pub fn problems(&self) -> Vec<Invalid> {
        self.found(Reach::Disk)
    }

    /// Every problem [`validate`](Self::validate) would report (no look at the disk).
    pub(super) fn value_problems(&self) -> Vec<Invalid> {
        self.found(Reach::Values)
    }

    fn found(&self, reach: Reach) -> Vec<Invalid> {
        let mut problems = Problems::default();
        for check in SECTIONS {
            check(self, reach, &mut problems);
        }
        problems.0
    }

    fn check_receivers(&self, p: &mut Problems) {
        let r = &self.receivers;
        if r.max_body_bytes == 0 {
            p.add(&["receivers", "max_body_bytes"], "must be > 0");
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
            if let Some((other, b)) = addrs[..i].iter().find(|(_, b)| binds_overlap(*b, *a)) {
                p.add(
                    path,
                    format!(
                        "{a} takes the port of {} ({b}); pick another port",
                        other.join(".")
                    ),
                );
            }
        }
        if r.body_read_timeout.is_zero() {
            p.add(
                &["receivers", "body_read_timeout"],
                "must be a positive duration",
            );
        }
    }

    fn check_api(&self, p: &mut Problems) {
        if self.api.recent_traces == 0 {
            p.add(&["api", "recent_traces"], "must be > 0");
        }
        if self.api.recent_trace_spans == 0 {
            p.add(&["api", "recent_trace_spans"], "must be > 0");
        }
    }

    fn check_limits(&self, p: &mut Problems) {
        let l = &self.limits;
        for (key, v) in [
            ("memory_limit_bytes", l.memory_limit_bytes),
            ("max_spans_per_trace", l.max_spans_per_trace),
            ("max_traces_in_flight", l.max_traces_in_flight),
            ("max_series", l.max_series),
        ] {
            if v == 0 {
                p.add(&["limits", key], "must be > 0");
            }
        }
        if l.memory_limit_bytes > 0 && l.memory_limit_bytes < MIN_MEMORY_LIMIT {
            p.add(
                &["limits", "memory_limit_bytes"],
                format!(
                    "must be at least {MIN_MEMORY_LIMIT} (1 MiB): the collector's own aggregates \
                     take tens of KiB before any request, and below that every request would \
                     be refused"
                ),
            );
        }
        if !(1..=100).contains(&l.soft_limit_percent) {
            p.add(
                &["limits", "soft_limit_percent"],
                "must be a percentage from 1 to 100",
            );
        } else if l.relief_target_percent >= l.soft_limit_percent {
            p.add(
                &["limits", "relief_target_percent"],
                format!(
                    "must be below soft_limit_percent ({}): relief frees memory down to it",
                    l.soft_limit_percent
                ),
            );
        }
    }

    fn check_assembly(&self, p: &mut Problems) {
        let a = &self.assembly;
        for (key, d) in [
            ("idle_timeout", a.idle_timeout),
            ("max_age", a.max_age),
            ("tick", a.tick),
        ] {
            if d.is_zero() {
                p.add(&["assembly", key], "must be a positive duration");
            }
        }
        // Compared only when both are valid (else the one problem would be said twice).
        if !a.max_age.is_zero() && !a.idle_timeout.is_zero() && a.max_age < a.idle_timeout {
            p.add(
                &["assembly", "max_age"],
                "must be at least assembly.idle_timeout",
            );
        }
        // A grace period it may grow to must end before the trace's maximum age (a `grace` of
        // `max_age` or more is allowed: such traces close at their maximum age).
        if !a.max_age.is_zero() && a.max_grace > a.grace && a.max_grace >= a.max_age {
            p.add(
                &["assembly", "max_grace"],
                "must be below assembly.max_age (or at most assembly.grace, to keep the wait fixed)",
            );
        }
    }

    fn check_kpi(&self, p: &mut Problems) {
        let k = &self.kpi;
        if k.windows.is_empty() {
            p.add(&["kpi", "windows"], "needs at least one window");
        }
        if k.windows.iter().any(|w| *w < Duration::from_secs(1)) {
            p.add(&["kpi", "windows"], "each window must be ≥ 1s");
        }
        if k.windows.windows(2).any(|pair| pair[0] >= pair[1]) {
            p.add(
                &["kpi", "windows"],
                "windows must be strictly ascending, e.g. [1m, 5m, 1h]",
            );
        }
        let twice = |(i, d)| k.dimensions[..i].contains(d);
        if k.dimensions.iter().enumerate().any(twice) {
            p.add(&["kpi", "dimensions"], "a dimension is listed twice");
        }
        for (key, seconds) in [
            ("ttft", k.slo.ttft_seconds),
            ("tpot", k.slo.tpot_seconds),
            ("e2e", k.slo.e2e_seconds),
        ] {
            // `None` (an objective disabled in code) is allowed; a file always sets all three.
            if seconds.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
                p.add(&["kpi", "slo", key], "must be a positive duration");
            }
        }
        if !(k.goodput_target > 0.0 && k.goodput_target <= 1.0) {
            p.add(&["kpi", "goodput_target"], "must be in (0, 1]");
        }
    }

    fn check_network(&self, p: &mut Problems) {
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
                    path.into_iter().filter(|part| !part.is_empty()).collect();
                path.push(field);
                p.add(&path, message);
            }
        }
        if self.shutdown_timeout.is_zero() {
            p.add(&["shutdown_timeout"], "must be more than 0");
        }
    }

    fn check_store(&self, reach: Reach, p: &mut Problems) {
        let before = p.0.len();
        self.check_store_values(p);
        // Where the values are wrong, the disk would say the same again.
        if reach == Reach::Disk && self.store.enabled && p.0.len() == before {
            p.check(
                Store::check(&self.store.data_dir)
                    .map_err(|e| Invalid::new(&["store", "data_dir"], e.to_string())),
            );
        }
    }

    fn check_store_values(&self, p: &mut Problems) {
        let s = &self.store;
        if !s.enabled {
            return;
        }
        if s.data_dir.as_os_str().is_empty() {
            p.add(
                &["store", "data_dir"],
                "must name a directory (or set store.enabled: false)",
            );
        }
        for (key, d) in [
            ("flush_interval", s.flush_interval),
            ("retention", s.retention),
        ] {
            if d.is_zero() {
                p.add(&["store", key], "must be a positive duration");
            }
        }
        if s.queue_capacity == 0 {
            p.add(&["store", "queue_capacity"], "must be > 0");
        }
    }

    fn check_diagnosis(&self, p: &mut Problems) {
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
                p.add(&["diagnosis", key], "must be a fraction in [0, 1]");
            }
        }
        let fraction = |v: f64| (0.0..=1.0).contains(&v);
        if fraction(d.gpu_idle_max)
            && fraction(d.gpu_saturated_min)
            && d.gpu_idle_max >= d.gpu_saturated_min
        {
            p.add(
                &["diagnosis", "gpu_idle_max"],
                "must be below diagnosis.gpu_saturated_min",
            );
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
                p.add(&["diagnosis", key], "must be > 0");
            }
        }
        if d.itl_p99_p50_ratio_max.is_nan() || d.itl_p99_p50_ratio_max <= 1.0 {
            p.add(&["diagnosis", "itl_p99_p50_ratio_max"], "must be > 1");
        }
    }

    fn check_alerts(&self, p: &mut Problems) {
        let a = &self.alerts;
        if a.evaluation_interval.is_zero() {
            p.add(
                &["alerts", "evaluation_interval"],
                "must be a positive duration",
            );
        }
        // Judged only against valid windows (else the windows' own problem says it all).
        let mut kpi = Problems::default();
        self.check_kpi(&mut kpi);
        if kpi.0.is_empty() && !self.kpi.windows.contains(&a.window) {
            p.add(
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
            );
        }
        for (i, rule) in a.rules.iter().enumerate() {
            // Said once per name, at its second use.
            if a.rules[..i].iter().filter(|r| r.name == rule.name).count() == 1 {
                p.add_in_item(
                    &["alerts", "rules"],
                    i,
                    "name",
                    format!("rule name {:?} is used more than once", rule.name),
                );
            }
            if let Err(e) = AlertRule::compile(rule) {
                p.add_in_item(&["alerts", "rules"], i, e.field, e.to_string());
            }
        }
        if let Err(e) = AnomalyDetector::new(a.anomaly.clone()) {
            p.add(&["alerts", "anomaly", "kpis"], e.to_string());
        }
        for name in a.alertmanager_labels.keys() {
            if let Err(m) = check_alert_label(name) {
                p.add(&["alerts", "alertmanager_labels"], m);
            }
        }
        if let Some(url) = &a.alertmanager_url
            && p.check(
                check_http_url(url, "alerts.alertmanager_headers")
                    .and_then(|()| check_alertmanager_base(url))
                    .map_err(|m| Invalid::new(&["alerts", "alertmanager_url"], m)),
            )
        {
            p.check(super::forward::check_tls(
                &a.alertmanager_tls,
                url,
                &["alerts", "alertmanager_tls"],
                crate::client_tls::OptionNames::ALERTMANAGER,
            ));
        } else if a.alertmanager_url.is_none() && crate::client_tls::is_set(&a.alertmanager_tls) {
            p.add(
                &["alerts", "alertmanager_tls"],
                "set without alerts.alertmanager_url: set the URL or remove alertmanager_tls",
            );
        }
        if a.alertmanager_url.is_none() && !a.alertmanager_headers.is_empty() {
            p.add(
                &["alerts", "alertmanager_headers"],
                "set without alerts.alertmanager_url: set the URL or remove alertmanager_headers",
            );
        }
        p.check(check_headers(
            &a.alertmanager_headers,
            &["alerts", "alertmanager_headers"],
        ));
    }
}

/// An extra Alertmanager label: a Prometheus label name, not one the collector sets itself.
fn check_alert_label(name: &str) -> Result<(), String> {
    let valid = name
        .chars()
        .enumerate()
        .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
    if name.is_empty() || !valid {
        return Err(format!(
            "{name:?} is not a label name (letters, digits and _, not starting with a digit)"
        ));
    }
    if crate::api::alerting::OWN_LABELS.contains(&name) {
        return Err(format!("{name:?} is set by the collector itself"));
    }
    Ok(())
}

/// The Alertmanager URL is its base: the collector appends `/api/v2/alerts`.
fn check_alertmanager_base(url: &str) -> Result<(), String> {
    let path = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = path
        .find('/')
        .map_or("", |i| &path[i..])
        .trim_end_matches('/');
    if path.ends_with("/api/v2/alerts") || path.ends_with("/api/v2") {
        return Err(format!(
            "give Alertmanager's base URL (e.g. http://alertmanager:9093): the collector appends \
             /api/v2/alerts itself, so {url:?} would post to .../api/v2/alerts/api/v2/alerts"
        ));
    }
    Ok(())
}

/// Whether two listeners' addresses cannot both be bound: the same port, and the same address
/// or a wildcard covering the other (`0.0.0.0` covers IPv4; `[::]`, dual-stack by default on
/// Linux, covers both families).
fn binds_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() {
        return false;
    }
    let covers = |w: SocketAddr, other: SocketAddr| {
        w.ip().is_unspecified() && (w.is_ipv6() || other.is_ipv4())
    };
    a == b || covers(a, b) || covers(b, a)
}
