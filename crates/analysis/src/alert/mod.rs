//! Alerts: threshold rules with `for` durations and an Alertmanager payload, and anomaly
//! detection on KPI series with SLO-crossing trends.
//!
//! - [`expr`]: `<kpi> <op> <value>` expressions over [`crate::kpi::SeriesKpis`] and `for:`
//!   durations, with parse errors that point at the column.
//! - [`rules`]: [`AlertRuleConfig`] (serde), [`AlertEngine`] (inactive → pending → firing →
//!   resolved per rule per series), [`to_alertmanager_json`].
//! - [`anomaly`]: EWMA baselines, k·σ for N windows, least-squares trends.

pub mod anomaly;
pub mod expr;
pub mod rules;

pub use anomaly::{
    Anomaly, AnomalyConfig, AnomalyDetector, Direction, FORGET_QUIET_AFTER, KpiBaseline,
    Observation, SloBound, Trend, least_squares,
};
pub use expr::{
    Expr, KpiPath, KpiUnit, Latency, Op, ParseError, Phase, Stat, Tail, parse_duration,
};
pub use rules::{
    ActiveAlert, AlertEngine, AlertEvent, AlertRule, AlertRuleConfig, AlertState,
    DEFAULT_GENERATOR_URL, RESOLVED_RETENTION, RuleError, rfc3339, to_alertmanager_json,
};
