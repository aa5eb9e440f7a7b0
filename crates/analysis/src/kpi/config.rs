//! What the KPI windows are configured with: window lengths, slots per window, the dimensions
//! series are split by, the series cap and its reclaim horizon, and the SLOs goodput is judged
//! against.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::labelling::Dimension;

/// Service-level objectives goodput is judged against; `None` disables one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SloConfig {
    /// Time to first token, seconds. Default 1.0 (interactive chat: the first word within a
    /// second).
    pub ttft_seconds: Option<f64>,
    /// Time per output token, seconds. Default 0.1 (10 tokens/s, faster than people read).
    pub tpot_seconds: Option<f64>,
    /// End-to-end, seconds. Default 30.
    pub e2e_seconds: Option<f64>,
}

impl Default for SloConfig {
    fn default() -> Self {
        Self {
            ttft_seconds: Some(1.0),
            tpot_seconds: Some(0.1),
            e2e_seconds: Some(30.0),
        }
    }
}

/// Configuration of [`KpiWindows`](super::KpiWindows).
#[derive(Clone, Debug, PartialEq)]
pub struct KpiConfig {
    /// Window lengths. Default 1m, 5m, 1h. Zero lengths are ignored; none at all means 1m.
    pub windows: Vec<Duration>,
    /// SLOs for goodput.
    pub slo: SloConfig,
    /// Dimensions series are split by (default all three); a dimension left out is reported as
    /// an empty string.
    pub dimensions: Vec<Dimension>,
    /// Maximum series (default 1000), the overflow series not counted.
    pub max_series: usize,
    /// Slots per window (default 60): the window slides in steps of `window / slots`.
    pub slots_per_window: u32,
    /// How long a series must have had no record before a new series may take its place when
    /// the cap is reached (default 1 min).
    pub series_reclaim_after: Duration,
}

impl Default for KpiConfig {
    fn default() -> Self {
        Self {
            windows: vec![
                Duration::from_secs(60),
                Duration::from_secs(300),
                Duration::from_secs(3600),
            ],
            slo: SloConfig::default(),
            dimensions: vec![Dimension::Service, Dimension::Model, Dimension::Operation],
            max_series: 1000,
            slots_per_window: 60,
            series_reclaim_after: Duration::from_secs(60),
        }
    }
}
