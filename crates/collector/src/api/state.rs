//! [`ApiState`], what every handler shares, and the JSON error answer they all give.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus_client::registry::Registry;
use serde_json::json;

use super::alerting::Alerting;
use super::metrics_text::MetricsText;
use crate::pipeline::Pipeline;
use crate::store::Store;

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
    /// The `/metrics` renderings, shared by overlapping scrapes.
    pub metrics_text: MetricsText,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState").finish_non_exhaustive()
    }
}

/// A JSON `{"error": message}` answer with `status`.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}
