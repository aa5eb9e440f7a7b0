//! The routes that read the running collector: `/metrics`, `/health`, the window routes (KPIs,
//! critical path, findings), one recent trace, and the alerts.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use infertrace_analysis::trace::TraceId;
use serde::Deserialize;
use serde_json::json;

use super::metrics_text::{MetricsTextError, accepts_gzip};
use super::state::{ApiState, error};
use crate::duration::parse_duration;
use crate::prom_export::CONTENT_TYPE;

/// `?window=` of the window routes.
#[derive(Debug, Deserialize)]
pub struct WindowQuery {
    /// A configured window, e.g. `1m`.
    pub window: Option<String>,
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

/// `GET /metrics`: the text within the memory limit ([`super::metrics_text`]), gzipped when
/// the scrape accepts it; 503 with `Retry-After` when it does not fit now.
pub(super) async fn metrics(State(s): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    let gzip = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(accepts_gzip);
    match s
        .metrics_text
        .get(&s.registry, s.pipeline.limiter(), gzip)
        .await
    {
        Ok(body) => {
            let gzip = body.is_gzip();
            let mut response = (
                [
                    (header::CONTENT_TYPE, CONTENT_TYPE),
                    (header::VARY, "accept-encoding"),
                ],
                axum::body::Body::new(body),
            )
                .into_response();
            if gzip {
                let gzip = header::HeaderValue::from_static("gzip");
                response
                    .headers_mut()
                    .insert(header::CONTENT_ENCODING, gzip);
            }
            response
        }
        Err(MetricsTextError::OverMemory { rendered }) => {
            if crate::internal_events::warn_allowed("metrics_over_memory") {
                tracing::warn!(
                    rendered,
                    "the /metrics text passed what the memory limit leaves after {rendered} \
                     bytes: scrape refused with 503 (fewer series, limits.max_series, or a \
                     larger limits.memory_limit_bytes)"
                );
            }
            let mut response = error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the /metrics text does not fit in the collector's memory limit now (refused \
                     after {rendered} bytes): retry later"
                ),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
            response
        }
        Err(MetricsTextError::Failed(why)) => error(StatusCode::INTERNAL_SERVER_ERROR, why),
    }
}

pub(super) async fn health(State(s): State<Arc<ApiState>>) -> Response {
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

pub(super) async fn kpis(State(s): State<Arc<ApiState>>, Query(q): Query<WindowQuery>) -> Response {
    match resolve_window(s.pipeline.windows(), q.window.as_deref()) {
        Ok(w) => Json(s.pipeline.kpis(w)).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

pub(super) async fn critical_path(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<WindowQuery>,
) -> Response {
    match resolve_window(s.pipeline.windows(), q.window.as_deref()) {
        Ok(w) => Json(s.pipeline.critical_path(w)).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

pub(super) async fn findings(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<WindowQuery>,
) -> Response {
    match resolve_window(s.pipeline.windows(), q.window.as_deref()) {
        Ok(w) => {
            let d = s.pipeline.diagnosis(w);
            Json(json!({
                "window_seconds": w.as_secs_f64(),
                "findings": d.findings,
                "undiagnosed": d.undiagnosed,
                "min_requests": d.min_requests,
            }))
            .into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

pub(super) async fn trace(State(s): State<Arc<ApiState>>, Path(id): Path<String>) -> Response {
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

pub(super) async fn alerts(State(s): State<Arc<ApiState>>) -> Response {
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
