//! Alert evaluation: threshold rules ([`AlertEngine`]) and anomaly detection
//! ([`AnomalyDetector`]) run periodically on one KPI window, set
//! `infertrace_alerts_active{alert}` (firing instances per rule) and, when an Alertmanager is
//! configured, POST transitions to its `/api/v2/alerts` (firing ones are re-sent every
//! [`RESEND_INTERVAL`] so Alertmanager does not time them out).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::client_tls::{self, HttpsConnector};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infertrace_analysis::alert::{
    ActiveAlert, AlertEngine, AlertEvent, AlertState, Anomaly, AnomalyDetector,
    to_alertmanager_json,
};
use infertrace_analysis::kpi::KpiSnapshot;
use serde::Serialize;

use crate::config::{CollectorConfig, TlsClientConfig};
use crate::internal_events::InternalEvents;
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
    /// No evaluation before this instant (Unix nanoseconds): see
    /// [`Alerting::quiet_after_restore`].
    quiet_until: u64,
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
            quiet_until: 0,
        })
    }

    /// After a restart that restored the KPI windows from history: nothing is evaluated for
    /// one window. The stored minutes refill a window whole at its edge, so a burst that had
    /// already left the window (and whose alert had resolved) would be back in it, and fire
    /// again; one window later only minutes this run has seen are in it.
    pub fn quiet_after_restore(&mut self, now_unix_nano: u64) {
        let window = u64::try_from(self.window.as_nanos()).unwrap_or(u64::MAX);
        self.quiet_until = now_unix_nano.saturating_add(window);
    }

    /// The window evaluated.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Evaluates rules and anomalies on `snapshot` taken at `now_unix_nano`.
    pub fn evaluate(&mut self, snapshot: &KpiSnapshot, now_unix_nano: u64) -> Evaluation {
        if now_unix_nano < self.quiet_until {
            return Evaluation::default();
        }
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

/// This host's name (Kubernetes: the pod's), else `infertrace`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "infertrace".to_owned())
}

/// The labels the collector puts on every alert itself (`alertmanager_labels` cannot set them).
pub const OWN_LABELS: [&str; 5] = ["alertname", "service", "model", "operation", "severity"];

/// Posts alerts to an Alertmanager.
#[derive(Clone, Debug)]
pub struct Alertmanager {
    client: Client<HttpsConnector, Full<Bytes>>,
    uri: http::Uri,
    /// Sent with every post (`alerts.alertmanager_headers`).
    headers: http::HeaderMap,
    /// Added to every alert's labels.
    labels: serde_json::Map<String, serde_json::Value>,
}

impl Alertmanager {
    /// A client for the Alertmanager at `base_url` (`http://host:9093`, or `https://…`
    /// verified as `tls` says: system roots or a CA file, optional client certificate),
    /// sending `headers` (`${NAME}` expanded from the environment) with every post.
    pub fn new(
        base_url: &str,
        tls: &TlsClientConfig,
        headers: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let headers = crate::client_tls::header_map(headers)
            .map_err(|e| format!("alerts.alertmanager_headers: {e}"))?;
        let uri: http::Uri = format!("{}/api/v2/alerts", base_url.trim_end_matches('/'))
            .parse()
            .map_err(|e| format!("alerts.alertmanager_url {base_url:?}: {e}"))?;
        let https = uri.scheme_str() == Some("https");
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let connector = crate::client_tls::https_connector(
            connector,
            tls,
            https,
            crate::client_tls::OptionNames::ALERTMANAGER,
        )?;
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            uri,
            headers,
            labels: serde_json::Map::new(),
        })
    }

    /// Adds `labels` to every alert posted, and `instance` = this host's name unless `labels`
    /// names one (see `alerts.alertmanager_labels`).
    pub fn with_labels(mut self, labels: &std::collections::BTreeMap<String, String>) -> Self {
        for (k, v) in labels {
            self.labels
                .insert(k.clone(), serde_json::Value::String(v.clone()));
        }
        if !self.labels.contains_key("instance") {
            self.labels
                .insert("instance".into(), serde_json::Value::String(host_name()));
        }
        self
    }

    /// POSTs the firing and resolved `events` (pending ones are not sent); logs failures.
    pub async fn post(&self, events: &[AlertEvent]) -> bool {
        let mut body = to_alertmanager_json(events);
        let Some(alerts) = body.as_array_mut().filter(|a| !a.is_empty()) else {
            return true;
        };
        for alert in alerts {
            if let Some(labels) = alert.get_mut("labels").and_then(|l| l.as_object_mut()) {
                labels.extend(self.labels.clone());
            }
        }
        let Ok(mut req) = http::Request::post(self.uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
        else {
            return false;
        };
        req.headers_mut().extend(self.headers.clone());
        // The answer's body is read within the same 10 s, and only its first 64 KiB.
        let sent = tokio::time::timeout(Duration::from_secs(10), async {
            let resp = self.client.request(req).await?;
            let status = resp.status();
            let body = if status.is_success() {
                None
            } else {
                client_tls::read_answer(resp.into_body()).await
            };
            Ok::<_, hyper_util::client::legacy::Error>((status, body))
        })
        .await;
        match sent {
            Ok(Ok((status, _))) if status.is_success() => true,
            Ok(Ok((status, body))) => {
                let text = body.map_or_else(
                    || "(over 64 KiB or broken)".to_owned(),
                    |b| String::from_utf8_lossy(&b[..b.len().min(1024)]).into_owned(),
                );
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

/// Evaluates every `interval` until `stop` resolves; delivers to `alertmanager` when set (on a
/// task of its own, see `deliver`) and stores every transition in the history store when the
/// pipeline has one.
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
    let history = pipeline.store_writer();
    let events = pipeline.events().clone();
    let delivery = alertmanager.map(|am| {
        let (tx, rx) = tokio::sync::mpsc::channel(DELIVERY_QUEUE);
        let task = tokio::spawn(deliver(am, rx, alerting.clone(), events.clone()));
        (tx, task)
    });
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = &mut stop => break,
        }
        let transitions = evaluate_once(&pipeline, &alerting, &metrics);
        if transitions.is_empty() {
            continue;
        }
        if let Some(w) = &history {
            w.write_alert_events(unix_nanos_now(), transitions.clone());
        }
        if let Some((tx, _)) = &delivery
            && tx.try_send(transitions).is_err()
        {
            events.alerts_posted(false);
            tracing::warn!(
                "Alertmanager is behind by {DELIVERY_QUEUE} rounds of alert transitions: these \
                 are not sent (firing alerts are re-sent every {}s)",
                RESEND_INTERVAL.as_secs()
            );
        }
    }
    if let Some((tx, task)) = delivery {
        stop_delivery(tx, task, DELIVERY_DRAIN).await;
    }
}

/// Stops [`deliver`]: the transitions already queued (a last resolve) are still sent, for up
/// to `drain`; what is left then is given up.
async fn stop_delivery(
    transitions: tokio::sync::mpsc::Sender<Vec<AlertEvent>>,
    mut task: tokio::task::JoinHandle<()>,
    drain: Duration,
) {
    drop(transitions);
    if tokio::time::timeout(drain, &mut task).await.is_err() {
        task.abort();
    }
}

/// How long a stopping collector waits for Alertmanager to take the transitions still queued.
const DELIVERY_DRAIN: Duration = Duration::from_secs(2);

/// Rounds of transitions waiting for Alertmanager before new ones are left out.
const DELIVERY_QUEUE: usize = 64;

/// Resolved alerts kept to send again while Alertmanager cannot be reached.
const MAX_UNSENT_RESOLVED: usize = 1_000;

/// Sends alert transitions to Alertmanager, one POST at a time, so that a slow or unreachable
/// Alertmanager (10 s per attempt) never delays evaluation; re-sends the firing alerts every
/// [`RESEND_INTERVAL`]. A resolved alert that could not be delivered is sent again with the
/// next POST until Alertmanager takes it (unless its alert fires again meanwhile; pending
/// again is not enough, since pending alerts are not sent), so that it
/// does not stay firing there until its own timeout.
async fn deliver(
    am: Alertmanager,
    mut transitions: tokio::sync::mpsc::Receiver<Vec<AlertEvent>>,
    alerting: Arc<Mutex<Alerting>>,
    events: InternalEvents,
) {
    let mut resend = tokio::time::interval(RESEND_INTERVAL);
    resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resend.tick().await;
    let mut unsent_resolved: Vec<AlertEvent> = Vec::new();
    loop {
        let mut batch = tokio::select! {
            events = transitions.recv() => match events {
                Some(events) => events,
                None => return,
            },
            _ = resend.tick() => lock(&alerting).firing_events(),
        };
        // Only a firing event replaces a missed resolve: an alert merely pending again is not
        // sent, and Alertmanager would keep the old one firing.
        let firing_again = |r: &AlertEvent| {
            batch.iter().any(|e| {
                e.state == AlertState::Firing
                    && (&e.alert, &e.service, &e.model, &e.operation)
                        == (&r.alert, &r.service, &r.model, &r.operation)
            })
        };
        unsent_resolved.retain(|r| !firing_again(r));
        batch.append(&mut unsent_resolved);
        // Pending alerts are not sent: a batch of them alone makes no POST.
        if batch.iter().all(|e| e.state == AlertState::Pending) {
            continue;
        }
        let posted = am.post(&batch).await;
        events.alerts_posted(posted);
        if !posted {
            unsent_resolved = batch
                .into_iter()
                .filter(|e| e.state == AlertState::Resolved)
                .collect();
            let excess = unsent_resolved.len().saturating_sub(MAX_UNSENT_RESOLVED);
            unsent_resolved.drain(..excess);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_analysis::diagnosis::Severity;
    use std::collections::BTreeMap;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn event(state: AlertState) -> AlertEvent {
        AlertEvent {
            alert: "HighTtft".into(),
            service: "svc".into(),
            model: "m".into(),
            operation: "chat".into(),
            severity: Severity::Critical,
            state,
            value: 1.5,
            threshold: 1.0,
            starts_at_unix_nano: 1,
            ends_at_unix_nano: (state == AlertState::Resolved).then_some(2),
            summary: "TTFT p99 above 1 s".into(),
            description: "ttft.p99 > 1s".into(),
            generator_url: "http://localhost/api/alerts".into(),
        }
    }

    #[test]
    fn a_tls_error_names_its_key_once() {
        let tls = TlsClientConfig {
            ca_file: Some("/nonexistent/am.pem".into()),
            ..TlsClientConfig::default()
        };
        let Err(e) = Alertmanager::new("https://am:9093", &tls, &BTreeMap::new()) else {
            panic!("a missing CA file must be an error");
        };
        assert!(
            e.starts_with("alerts.alertmanager_tls.ca_file /nonexistent/am.pem"),
            "{e}"
        );
        assert_eq!(e.matches("alertmanager_tls").count(), 1, "{e}");
    }

    /// The next body the fake Alertmanager accepted (at most 10 s away).
    async fn next_post(accepted: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
        next_post_and_head(accepted).await.1
    }

    /// The head and the body of the next post the fake Alertmanager accepted.
    async fn next_post_and_head(
        accepted: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    ) -> (String, String) {
        let post = tokio::time::timeout(Duration::from_secs(10), accepted.recv())
            .await
            .unwrap()
            .unwrap();
        let (head, body) = post.split_once("\r\n\r\n").unwrap();
        (head.to_owned(), body.to_owned())
    }

    /// A firing event of an alert other than [`event`]'s.
    fn another_alert_firing() -> AlertEvent {
        let mut other = event(AlertState::Firing);
        other.alert = "ErrorsHigh".into();
        other
    }

    /// The delivery task posting to a fake Alertmanager that refuses its first `refuse` POSTs:
    /// the transitions' sender, the bodies the fake accepted, the task.
    async fn delivering_to_a_fake(
        refuse: usize,
        events: InternalEvents,
    ) -> (
        tokio::sync::mpsc::Sender<Vec<AlertEvent>>,
        tokio::sync::mpsc::UnboundedReceiver<String>,
        tokio::task::JoinHandle<()>,
    ) {
        let (url, accepted) = fake_alertmanager(refuse).await;
        let (tx, task) = delivering_to(&url, events);
        (tx, accepted, task)
    }

    /// The delivery task posting to `url`: the transitions' sender, the task.
    fn delivering_to(
        url: &str,
        events: InternalEvents,
    ) -> (
        tokio::sync::mpsc::Sender<Vec<AlertEvent>>,
        tokio::task::JoinHandle<()>,
    ) {
        let am = Alertmanager::new(url, &TlsClientConfig::default(), &BTreeMap::new()).unwrap();
        let alerting = Arc::new(Mutex::new(
            Alerting::new(&CollectorConfig::default(), "http://localhost").unwrap(),
        ));
        let (tx, rx) = tokio::sync::mpsc::channel(DELIVERY_QUEUE);
        (tx, tokio::spawn(deliver(am, rx, alerting, events)))
    }

    /// A fake Alertmanager: answers 503 to its first `refuse` POSTs, 200 after; hands every
    /// post it accepted (head, blank line, body) to the returned receiver.
    async fn fake_alertmanager(
        refuse: usize,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut posts = 0;
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Head, then the body by its content-length.
                let body = loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break None;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break Some(text);
                        }
                    }
                };
                let Some(body) = body else { continue };
                posts += 1;
                let status = if posts <= refuse {
                    "503 Service Unavailable"
                } else {
                    let _ = tx.send(body);
                    "200 OK"
                };
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        (url, rx)
    }

    /// After a restart that restored the windows, a burst that had left the window (restored
    /// whole with its minute) does not fire again: nothing is evaluated for one window.
    #[test]
    fn nothing_is_evaluated_for_one_window_after_a_restore() {
        use infertrace_analysis::kpi::KpiWindows;
        use infertrace_analysis::record::{Dialect, RequestRecord};
        use infertrace_analysis::trace::{SpanId, TraceId};
        let config = CollectorConfig::from_yaml_str(
            "alerts:\n  rules:\n    - { name: Busy, expr: requests > 0 }\n",
        )
        .unwrap();
        let mut alerting = Alerting::new(&config, "http://localhost").unwrap();
        let now = crate::store::unix_nanos_now();
        let mut windows = KpiWindows::new(config.kpi_config());
        let record = RequestRecord::new(
            TraceId([1; 16]),
            SpanId([1; 8]),
            "svc".into(),
            Dialect::Infertrace,
            now - 2_000_000_000,
            now - 1_000_000_000,
        );
        windows.record(&record, now);
        let snapshot = windows.snapshot(alerting.window(), now);
        alerting.quiet_after_restore(now);
        let minute = 60_000_000_000;
        assert!(alerting.evaluate(&snapshot, now + 1).events.is_empty());
        assert!(
            alerting
                .evaluate(&snapshot, now + minute - 1)
                .events
                .is_empty()
        );
        let events = alerting.evaluate(&snapshot, now + minute).events;
        assert_eq!(
            events.len(),
            1,
            "evaluated again one window later: {events:?}"
        );
    }

    /// Several collectors firing one rule stay apart in Alertmanager: each alert carries the
    /// configured labels, and `instance` (the host name unless configured).
    #[tokio::test]
    async fn every_alert_carries_the_configured_labels_and_an_instance() {
        let (url, mut accepted) = fake_alertmanager(0).await;
        let labels = [("cluster".to_owned(), "eu-1".to_owned())].into();
        // An API key goes with every post (`${NAME}` expansion: client_tls's tests).
        let headers = [("x-api-key".to_owned(), "s3cret".to_owned())].into();
        let am = Alertmanager::new(&url, &TlsClientConfig::default(), &headers)
            .unwrap()
            .with_labels(&labels);
        assert!(am.post(&[event(AlertState::Firing)]).await);
        let (head, body) = next_post_and_head(&mut accepted).await;
        assert!(
            head.to_ascii_lowercase().contains("x-api-key: s3cret"),
            "{head}"
        );
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        let got = &body[0]["labels"];
        assert_eq!(got["cluster"], "eu-1");
        assert_eq!(got["instance"], host_name().as_str());
        assert_eq!(got["alertname"], "HighTtft");
        let named = [("instance".to_owned(), "shard-2".to_owned())].into();
        let am = Alertmanager::new(&url, &TlsClientConfig::default(), &BTreeMap::new())
            .unwrap()
            .with_labels(&named);
        assert!(am.post(&[event(AlertState::Firing)]).await);
        let body: serde_json::Value =
            serde_json::from_str(&next_post(&mut accepted).await).unwrap();
        assert_eq!(body[0]["labels"]["instance"], "shard-2");
    }

    #[tokio::test]
    async fn a_resolve_alertmanager_missed_is_sent_again_with_the_next_post() {
        let events = InternalEvents::default();
        let (tx, mut accepted, task) = delivering_to_a_fake(1, events.clone()).await;
        // The resolve is refused (503); a later transition of another alert carries it along.
        tx.send(vec![event(AlertState::Resolved)]).await.unwrap();
        tx.send(vec![another_alert_firing()]).await.unwrap();
        let body = next_post(&mut accepted).await;
        assert!(
            body.contains("HighTtft") && body.contains("ErrorsHigh"),
            "the missed resolve goes with the next post: {body}"
        );
        // Once delivered it is not sent again; an alert firing again drops its stale resolve.
        tx.send(vec![event(AlertState::Firing)]).await.unwrap();
        let body = next_post(&mut accepted).await;
        assert!(!body.contains("endsAt\":\"1970"), "{body}");
        let posts = |outcome| {
            events
                .alertmanager_posts
                .get_or_create(&crate::internal_events::AttemptLabels { outcome })
                .get()
        };
        // Counted once the answer is read, a moment after the fake saw the body.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while posts("ok") < 2 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!((posts("failed"), posts("ok")), (1, 2), "every POST counted");
        task.abort();
    }

    /// A missed resolve survives its alert going pending again (pending alerts are not sent,
    /// so Alertmanager would keep the alert firing until its own timeout).
    #[tokio::test]
    async fn a_missed_resolve_survives_its_alert_going_pending_again() {
        let (tx, mut accepted, task) = delivering_to_a_fake(1, InternalEvents::default()).await;
        tx.send(vec![event(AlertState::Resolved)]).await.unwrap();
        tx.send(vec![event(AlertState::Pending)]).await.unwrap();
        tx.send(vec![another_alert_firing()]).await.unwrap();
        let body = next_post(&mut accepted).await;
        assert!(
            body.contains("HighTtft") && body.contains("endsAt"),
            "the missed resolve goes with the next post: {body}"
        );
        task.abort();
    }

    /// A stopping collector still sends what is queued for Alertmanager (a last resolve); an
    /// Alertmanager that does not answer holds the stop no longer than the drain.
    #[tokio::test]
    async fn a_stopping_delivery_sends_what_is_queued_within_the_drain() {
        let (tx, mut accepted, task) = delivering_to_a_fake(0, InternalEvents::default()).await;
        tx.send(vec![event(AlertState::Resolved)]).await.unwrap();
        stop_delivery(tx, task, Duration::from_secs(10)).await;
        let body = next_post(&mut accepted).await;
        assert!(
            body.contains("HighTtft") && body.contains("endsAt"),
            "{body}"
        );

        // Accepts and never answers (a post's own timeout is 10 s).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let (tx, task) = delivering_to(&url, InternalEvents::default());
        tx.send(vec![event(AlertState::Firing)]).await.unwrap();
        let started = std::time::Instant::now();
        stop_delivery(tx, task, Duration::from_millis(300)).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        silent.abort();
    }
}
