//! The web dashboard, served at `/` on the API address: one HTML page, one script, one style
//! sheet and the vendored chart library ([uPlot](https://github.com/leeoniya/uPlot), MIT,
//! licence at `/assets/vendor/uPlot.LICENSE.txt`), all embedded in the binary, so it needs no
//! build step and works offline. The page reads the JSON API (`/api/kpis`, `/api/critical-path`,
//! `/api/findings`, `/api/alerts`, `/api/traces/{id}`, `/api/history` when the store serves it)
//! and polls it every few seconds. See `docs/dashboard.md`.
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | the page (`text/html`) |
//! | `GET /assets/{path}` | an embedded file ([`assets::ASSETS`]), `ETag` + `no-cache`, or versioned and `immutable` |
//! | `GET /api/dashboard` | the page's settings: SLOs, configured KPI windows, poll interval ([`DashboardSettings`]) |
//! | `GET /api/traces?limit=&sort=&service=&model=&outcome=` | recent requests, slowest first ([`traces`]) |
//!
//! Mounting it on the API router (the pipeline implements [`RecentTraceSource`]):
//!
//! ```ignore
//! let app = api::router(state).merge(dashboard::routes(
//!     pipeline.clone(),
//!     dashboard::DashboardSettings::from_config(&config),
//! ));
//! ```

pub mod assets;
pub mod traces;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;

use crate::config::{CollectorConfig, SloConfig};

pub(crate) use traces::{RecentTraceSource, TraceListQuery, list_traces};

/// How often the page polls the API when the settings do not say otherwise, milliseconds.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 5_000;

/// What the page needs to know about the collector (`GET /api/dashboard`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DashboardSettings {
    /// The SLOs (`kpi.slo`), drawn as lines: `{ttft_seconds, tpot_seconds, e2e_seconds}`.
    pub slo: SloConfig,
    /// The configured KPI windows (`kpi.windows`), seconds, ascending.
    pub windows_seconds: Vec<f64>,
    /// How often the page polls, milliseconds.
    pub poll_interval_ms: u64,
    /// Whether `GET /api/history` is served (the embedded store is on); without it the page
    /// builds its time series from successive `/api/kpis` polls.
    pub history: bool,
    /// The collector's version.
    pub version: &'static str,
}

impl DashboardSettings {
    /// The settings of a collector configuration.
    pub fn from_config(config: &CollectorConfig) -> Self {
        let mut windows_seconds: Vec<f64> =
            config.kpi.windows.iter().map(|w| w.as_secs_f64()).collect();
        windows_seconds.sort_by(f64::total_cmp);
        Self {
            slo: config.kpi.slo,
            windows_seconds,
            poll_interval_ms: DEFAULT_POLL_INTERVAL_MS,
            history: false,
            version: env!("CARGO_PKG_VERSION"),
        }
    }

    /// The same settings, saying whether `GET /api/history` is served.
    pub fn with_history(mut self, served: bool) -> Self {
        self.history = served;
        self
    }

    /// The same settings polling every `interval_ms` (at least 250 ms).
    #[cfg(test)]
    pub fn with_poll_interval_ms(mut self, interval_ms: u64) -> Self {
        self.poll_interval_ms = interval_ms.max(250);
        self
    }
}

struct DashboardState {
    source: Arc<dyn RecentTraceSource>,
    settings: DashboardSettings,
}

/// The dashboard's routes, ready to merge into the API router.
pub fn routes(source: Arc<dyn RecentTraceSource>, settings: DashboardSettings) -> Router {
    let state = Arc::new(DashboardState { source, settings });
    Router::new()
        .route("/", get(page))
        .route("/index.html", get(page))
        .route("/assets/{*path}", get(asset))
        .route("/api/dashboard", get(settings_json))
        .route(
            "/api/traces",
            get(trace_list).layer(axum::middleware::from_fn(crate::api::json_errors)),
        )
        .with_state(state)
}

async fn page(headers: HeaderMap) -> Response {
    assets::respond("index.html", &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    assets::respond(&path, &headers)
}

async fn settings_json(State(s): State<Arc<DashboardState>>) -> Response {
    Json(&s.settings).into_response()
}

async fn trace_list(
    State(s): State<Arc<DashboardState>>,
    Query(q): Query<TraceListQuery>,
) -> Response {
    Json(list_traces(s.source.as_ref(), &q)).into_response()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::pipeline::StoredTrace;

    struct Empty;

    impl RecentTraceSource for Empty {
        fn visit_recent_traces(&self, _: &mut dyn FnMut(&StoredTrace)) {}
    }

    async fn get(app: &Router, uri: &str) -> (StatusCode, HeaderMap, Vec<u8>) {
        let r = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let (parts, body) = r.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes().to_vec();
        (parts.status, parts.headers, bytes)
    }

    fn app() -> Router {
        let mut config = CollectorConfig::default();
        config.kpi.windows = vec![Duration::from_secs(300), Duration::from_secs(60)];
        config.kpi.slo.ttft_seconds = Some(0.5);
        routes(Arc::new(Empty), DashboardSettings::from_config(&config))
    }

    #[tokio::test]
    async fn serves_page_assets_and_settings() {
        let app = app();
        let (status, headers, body) = get(&app, "/").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert!(
            String::from_utf8(body)
                .unwrap()
                .contains("<title>infertrace")
        );
        let (status, headers, _) = get(&app, "/assets/dashboard.css").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], "text/css; charset=utf-8");
        assert_eq!(
            get(&app, "/assets/../Cargo.toml").await.0,
            StatusCode::NOT_FOUND
        );
        let (status, _, body) = get(&app, "/api/dashboard").await;
        assert_eq!(status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["slo"]["ttft_seconds"], 0.5);
        assert_eq!(v["slo"]["tpot_seconds"], 0.1);
        assert_eq!(v["windows_seconds"], serde_json::json!([60.0, 300.0]));
        assert_eq!(v["poll_interval_ms"], DEFAULT_POLL_INTERVAL_MS);
        assert_eq!(v["history"], false);
        let (status, _, body) = get(&app, "/api/traces?limit=5&sort=newest").await;
        assert_eq!(status, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, serde_json::json!({"held": 0, "traces": []}));
        assert_eq!(
            get(&app, "/api/traces?sort=sideways").await.0,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn poll_interval_has_a_floor() {
        let s = DashboardSettings::from_config(&CollectorConfig::default());
        assert_eq!(s.with_poll_interval_ms(10).poll_interval_ms, 250);
    }
}
