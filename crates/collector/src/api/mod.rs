//! The HTTP API on the API address (default `127.0.0.1:9464`), on axum:
//!
//! | route | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus / OpenMetrics text of every metric ([`crate::prom_export`]; 503 when it does not fit in the memory limit, [`metrics_text`]) |
//! | `GET /health` | `{"status":"ok"}` (`"shutting_down"` with 503 while stopping) |
//! | `GET /api/kpis?window=1m` | the [`KpiSnapshot`](infertrace_analysis::kpi::KpiSnapshot) of a configured window |
//! | `GET /api/critical-path?window=1m` | the aggregated critical path of the window |
//! | `GET /api/findings?window=1m` | the diagnosis findings per series of the window; `undiagnosed`: the series with fewer requests than `min_requests`, which the rules did not judge |
//! | `GET /api/traces/{trace_id}` | one recent trace: records, spans, critical paths (404 if unknown) |
//! | `GET /api/alerts` | rules, pending / firing / resolved alerts, anomalies |
//! | `GET /api/history?kpi=ttft.p99&from=-1h&to=now&step=60` | a KPI's history from the store (`history`) |
//! | `GET /api/history/slow-requests`, `/alerts`, `/findings` | stored requests, alert transitions, findings |
//!
//! `window` must be one of `kpi.windows` (humantime: `1m`, `300s`, `1h`); without it the first
//! window is used. Errors of these routes are JSON `{"error": "..."}` — 400 (bad window, bad
//! trace id, a query string that does not parse) or 404 — except the refusals of the layers in
//! front of them (401 / 403 / 421 from authentication and the Host allowlist).

pub mod alerting;
pub(crate) mod history;
mod live;
pub mod metrics_text;
mod state;

use std::sync::Arc;

use axum::Router;
use axum::routing::get;

pub use alerting::{Alerting, AlertsView};
pub use live::{WindowQuery, resolve_window};
pub use metrics_text::MetricsText;
pub use state::ApiState;

/// The API router.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/metrics", get(live::metrics))
        .route("/health", get(live::health))
        .route("/api/kpis", get(live::kpis))
        .route("/api/critical-path", get(live::critical_path))
        .route("/api/findings", get(live::findings))
        .route("/api/traces/{trace_id}", get(live::trace))
        .route("/api/alerts", get(live::alerts))
        .route("/api/history", get(history::history))
        .route("/api/history/slow-requests", get(history::slow_requests))
        .route("/api/history/alerts", get(history::alerts))
        .route("/api/history/findings", get(history::findings))
        .layer(axum::middleware::from_fn(json_errors))
        .with_state(state)
}

/// Longest error text kept when an error answer is turned into JSON.
const MAX_ERROR_TEXT: usize = 4096;

/// Makes every error answer of these routes JSON `{"error": "..."}`, those of axum's own
/// extractors too (a query string that does not parse: `?limit=abc`), which are plain text.
pub(crate) async fn json_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), MAX_ERROR_TEXT)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_owned();
    let text = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    state::error(status, text)
}
