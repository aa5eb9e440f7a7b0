//! Alert evaluation: threshold rules ([`AlertEngine`]) and anomaly detection
//! ([`AnomalyDetector`]) run periodically on one KPI window, set
//! `infertrace_alerts_active{alert}` (firing instances per rule) and, when an Alertmanager is
//! configured, POST transitions to its `/api/v2/alerts` (firing ones are re-sent every
//! [`RESEND_INTERVAL`] so Alertmanager does not time them out).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::client_tls::HttpsConnector;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infertrace_analysis::alert::{
    ActiveAlert, AlertEngine, AlertEvent, Anomaly, AnomalyDetector, to_alertmanager_json,
};
use infertrace_analysis::kpi::KpiSnapshot;
use serde::Serialize;

use crate::config::{CollectorConfig, TlsClientConfig};
use crate::pipeline::{Pipeline, unix_nanos_now};
use crate::prom_export::PromMetrics;

/// How often firing alerts are re-sent to Alertmanager.
pub const RESEND_INTERVAL: Duration = Duration::from_secs(60);

/// The alert state the API serves.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AlertsView {
    /// The KPI window rules are evaluated on, seconds.
    pub window_seconds: f64,
    /// When the rules were last evaluated, Unix nanoseconds (0: not yet).
    pub evaluated_at_unix_nano: u64,
    /// Configured rule names.
    pub rules: Vec<String>,
    /// Pending and firing alerts.
    pub active: Vec<ActiveAlert>,
    /// Recently resolved alerts.
    pub resolved: Vec<ActiveAlert>,
    /// Anomalies found by the last evaluation.
    pub anomalies: Vec<Anomaly>,
}

/// Rules, anomaly baselines and the last results.
#[derive(Debug)]
pub struct Alerting {
    engine: AlertEngine,
    detector: AnomalyDetector,
    window: Duration,
    anomalies: Vec<Anomaly>,
    evaluated_at: u64,
}

/// What one evaluation produced.
#[derive(Debug, Default)]
pub struct Evaluation {
    /// Transitions (pending, firing, resolved).
    pub events: Vec<AlertEvent>,
    /// Firing instances per rule.
    pub firing: Vec<(String, u64)>,
}

impl Alerting {
    /// Builds the rules and detector of `config` (validated already; errors are reported).
    pub fn new(config: &CollectorConfig, generator_url: &str) -> Result<Self, String> {
        let a = &config.alerts;
        let engine = AlertEngine::from_config(&a.rules)
            .map_err(|e| e.to_string())?
            .with_generator_url(generator_url);
        let detector = AnomalyDetector::new(a.anomaly.clone())
            .map_err(|e| e.to_string())?
            .with_kpi_slos(&config.slo());
        Ok(Self {
            engine,
            detector,
            window: a.window,
            anomalies: Vec::new(),
            evaluated_at: 0,
        })
    }

    /// The window evaluated.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Evaluates rules and anomalies on `snapshot` taken at `now_unix_nano`.
    pub fn evaluate(&mut self, snapshot: &KpiSnapshot, now_unix_nano: u64) -> Evaluation {
        let events = self.engine.evaluate(snapshot, now_unix_nano);
        self.anomalies = self.detector.observe_snapshot(snapshot, now_unix_nano);
        self.evaluated_at = now_unix_nano;
        let firing = self
            .engine
            .firing_counts()
            .into_iter()
            .map(|(n, c)| (n.to_owned(), c))
            .collect();
        Evaluation { events, firing }
    }

    /// Events for every firing alert (for re-sending).
    pub fn firing_events(&self) -> Vec<AlertEvent> {
        self.engine.firing_events()
    }

    /// The state for `GET /api/alerts`.
    pub fn view(&self) -> AlertsView {
        AlertsView {
            window_seconds: self.window.as_secs_f64(),
            evaluated_at_unix_nano: self.evaluated_at,
            rules: self.engine.rules().iter().map(|r| r.name.clone()).collect(),
            active: self.engine.active(),
            resolved: self.engine.resolved(),
            anomalies: self.anomalies.clone(),
        }
    }
}

/// Posts alerts to an Alertmanager.
#[derive(Clone, Debug)]
pub struct Alertmanager {
    client: Client<HttpsConnector, Full<Bytes>>,
    uri: http::Uri,
}

impl Alertmanager {
    /// A client for the Alertmanager at `base_url` (`http://host:9093`, or `https://…`
    /// verified as `tls` says: system roots or a CA file, optional client certificate).
    pub fn new(base_url: &str, tls: &TlsClientConfig) -> Result<Self, String> {
        let uri: http::Uri = format!("{}/api/v2/alerts", base_url.trim_end_matches('/'))
            .parse()
            .map_err(|e| format!("alerts.alertmanager_url {base_url:?}: {e}"))?;
        let https = uri.scheme_str() == Some("https");
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let connector = crate::client_tls::https_connector(connector, tls, https)
            .map_err(|e| format!("alerts.alertmanager_tls: {e}"))?;
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            uri,
        })
    }

    /// POSTs the firing and resolved `events` (pending ones are not sent); logs failures.
    pub async fn post(&self, events: &[AlertEvent]) -> bool {
        let body = to_alertmanager_json(events);
        if body.as_array().is_none_or(|a| a.is_empty()) {
            return true;
        }
        let Ok(req) = http::Request::post(self.uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
        else {
            return false;
        };
        let sent = tokio::time::timeout(Duration::from_secs(10), self.client.request(req)).await;
        match sent {
            Ok(Ok(resp)) if resp.status().is_success() => true,
            Ok(Ok(resp)) => {
                let status = resp.status();
                let text = resp
                    .into_body()
                    .collect()
                    .await
                    .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
                    .unwrap_or_default();
                tracing::warn!(%status, body = %text, "Alertmanager refused alerts");
                false
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, uri = %self.uri, "cannot reach Alertmanager");
                false
            }
            Err(_) => {
                tracing::warn!(uri = %self.uri, "Alertmanager did not answer in 10 s");
                false
            }
        }
    }
}

/// One evaluation round: snapshot, evaluate, set gauges; returns the transitions.
pub fn evaluate_once(
    pipeline: &Pipeline,
    alerting: &Mutex<Alerting>,
    metrics: &PromMetrics,
) -> Vec<AlertEvent> {
    let window = lock(alerting).window();
    let snapshot = pipeline.kpis(window);
    let eval = lock(alerting).evaluate(&snapshot, unix_nanos_now());
    for (name, n) in &eval.firing {
        metrics.set_alert(name, *n);
    }
    eval.events
}

fn lock(m: &Mutex<Alerting>) -> std::sync::MutexGuard<'_, Alerting> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Evaluates every `interval` until `stop` resolves; delivers to `alertmanager` when set and
/// stores every transition in the history store when the pipeline has one.
pub async fn run(
    pipeline: Arc<Pipeline>,
    alerting: Arc<Mutex<Alerting>>,
    metrics: PromMetrics,
    interval: Duration,
    alertmanager: Option<Alertmanager>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_resend = tokio::time::Instant::now();
    let history = pipeline.store_writer();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = &mut stop => break,
        }
        let events = evaluate_once(&pipeline, &alerting, &metrics);
        if let Some(w) = &history
            && !events.is_empty()
        {
            w.write_alert_events(unix_nanos_now(), events.clone());
        }
        if let Some(am) = &alertmanager {
            if !events.is_empty() {
                am.post(&events).await;
            }
            if last_resend.elapsed() >= RESEND_INTERVAL {
                last_resend = tokio::time::Instant::now();
                let firing = lock(&alerting).firing_events();
                am.post(&firing).await;
            }
        }
    }
}
