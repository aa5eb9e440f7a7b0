//! The HTTP API on the API address (default `127.0.0.1:9464`), on axum:
//!
//! | route | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus / OpenMetrics text of every metric ([`crate::prom_export`]) |
//! | `GET /health` | `{"status":"ok"}` (`"shutting_down"` with 503 while stopping) |
//! | `GET /api/kpis?window=1m` | the [`KpiSnapshot`](infertrace_analysis::kpi::KpiSnapshot) of a configured window |
//! | `GET /api/critical-path?window=1m` | the aggregated critical path of the window |
//! | `GET /api/findings?window=1m` | the diagnosis findings per series of the window |
//! | `GET /api/traces/{trace_id}` | one recent trace: records, spans, critical paths (404 if unknown) |
//! | `GET /api/alerts` | rules, pending / firing / resolved alerts, anomalies |
//! | `GET /api/history?kpi=ttft.p99&from=-1h&to=now&step=60` | a KPI's history from the store (`history`) |
//! | `GET /api/history/slow-requests`, `/alerts`, `/findings` | stored requests, alert transitions, findings |
//!
//! `window` must be one of `kpi.windows` (humantime: `1m`, `300s`, `1h`); without it the first
//! window is used. Errors are JSON `{"error": "..."}` with 400 (bad window, bad trace id) or 404.

pub mod alerting;
pub(crate) mod history;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use infertrace_analysis::trace::TraceId;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::json;

use crate::duration::parse_duration;
use crate::pipeline::Pipeline;
use crate::prom_export::{CONTENT_TYPE, encode};
use crate::store::Store;

pub use alerting::{Alerting, AlertsView};

/// What the handlers share.
pub struct ApiState {
    /// The pipeline (KPIs, critical paths, traces, findings).
    pub pipeline: Arc<Pipeline>,
    /// Every registered metric.
    pub registry: Arc<Registry>,
    /// Alert rules and results.
    pub alerting: Arc<Mutex<Alerting>>,
    /// The history store (`None` with `--no-store`: the history routes answer 404).
    pub store: Option<Store>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState").finish_non_exhaustive()
    }
}

/// The API router.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/api/kpis", get(kpis))
        .route("/api/critical-path", get(critical_path))
        .route("/api/findings", get(findings))
        .route("/api/traces/{trace_id}", get(trace))
        .route("/api/alerts", get(alerts))
        .route("/api/history", get(history::history))
        .route("/api/history/slow-requests", get(history::slow_requests))
        .route("/api/history/alerts", get(history::alerts))
        .route("/api/history/findings", get(history::findings))
        .with_state(state)
}

/// `?window=` of the window routes.
#[derive(Debug, Deserialize)]
pub struct WindowQuery {
    /// A configured window, e.g. `1m`.
    pub window: Option<String>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// Resolves `?window=` against the configured windows.
pub fn resolve_window(windows: &[Duration], asked: Option<&str>) -> Result<Duration, String> {
    let list = || {
        windows
            .iter()
            .map(|w| humantime::format_duration(*w).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(asked) = asked else {
        return windows
            .first()
            .copied()
            .ok_or_else(|| "no window configured".into());
    };
    let d = parse_duration(asked).map_err(|e| format!("{e}; configured windows: {}", list()))?;
    if windows.contains(&d) {
        Ok(d)
    } else {
        Err(format!(
            "window {asked:?} is not configured; use one of {}",
            list()
        ))
    }
}

async fn metrics(State(s): State<Arc<ApiState>>) -> Response {
    let body = encode(&s.registry);
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}

async fn health(State(s): State<Arc<ApiState>>) -> Response {
    if s.pipeline.is_shutting_down() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        )
            .into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn kpis(State(s): State<Arc<ApiState>>, Query(q): Query<WindowQuery>) -> Response {
    match resolve_window(s.pipeline.windows(), q.window.as_deref()) {
        Ok(w) => Json(s.pipeline.kpis(w)).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

async fn critical_path(State(s): State<Arc<ApiState>>, Query(q): Query<WindowQuery>) -> Response {
    match resolve_window(s.pipeline.windows(), q.window.as_deref()) {
        Ok(w) => Json(s.pipeline.critical_path(w)).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

async fn findings(State(s): State<Arc<ApiState>>, Query(q): Query<WindowQuery>) -> Response {
    match resolve_window(s.pipeline.windows(), q.window.as_deref()) {
        Ok(w) => Json(json!({
            "window_seconds": w.as_secs_f64(),
            "findings": s.pipeline.findings(w),
        }))
        .into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

async fn trace(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Response {
    let Some(trace_id) = TraceId::from_hex(&id.to_ascii_lowercase()) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not a trace id (32 hex characters)"),
        );
    };
    match s.pipeline.trace(&trace_id) {
        Some(t) => Json(t).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("trace {trace_id} is not among the recently completed traces"),
        ),
    }
}

async fn alerts(State(s): State<Arc<ApiState>>) -> Response {
    let view = s.alerting.lock().unwrap_or_else(|p| p.into_inner()).view();
    Json(view).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_resolve() {
        let ws = [Duration::from_secs(60), Duration::from_secs(300)];
        assert_eq!(resolve_window(&ws, None), Ok(ws[0]));
        assert_eq!(resolve_window(&ws, Some("5m")), Ok(ws[1]));
        assert_eq!(resolve_window(&ws, Some("300s")), Ok(ws[1]));
        let e = resolve_window(&ws, Some("2m")).unwrap_err();
        assert!(e.contains("1m, 5m"), "{e}");
        assert!(resolve_window(&ws, Some("soon")).is_err());
    }
}
