//! The KPI snapshot of one window: the exact shape of `GET /api/kpis` (issue 4).
//!
//! Every latency block is `{"p50","p90","p95","p99","max","mean"}` in seconds, or `null` when the
//! window holds no value for it. Shares are fractions of e2e (0–1).

use serde::Serialize;

use super::distribution::LatencyStats;

/// KPIs of every series over one window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KpiSnapshot {
    /// The window asked for, seconds.
    pub window_seconds: f64,
    /// One entry per series with data in the window, sorted by (service, model, operation);
    /// the overflow series (if any) last.
    pub series: Vec<SeriesKpis>,
}

/// The KPIs of one (service, model, operation) series over a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeriesKpis {
    /// Service (empty when the dimension is not configured; see [`super::OVERFLOW_LABEL`]).
    pub service: String,
    /// Model (empty when the dimension is not configured).
    pub model: String,
    /// Operation (empty when the dimension is not configured).
    pub operation: String,
    /// Requests of every outcome.
    pub requests: u64,
    /// Requests with outcome `error`.
    pub errors: u64,
    /// Requests with outcome `cancelled`.
    pub cancelled: u64,
    /// Requests with outcome `rejected`.
    pub rejected: u64,
    /// End-to-end latency of `ok` requests.
    pub e2e: Option<LatencyStats>,
    /// Queue time of `ok` requests.
    pub queue: Option<LatencyStats>,
    /// Time to first token of `ok` requests.
    pub ttft: Option<LatencyStats>,
    /// Prefill time of `ok` requests.
    pub prefill: Option<LatencyStats>,
    /// Decode time of `ok` requests.
    pub decode: Option<LatencyStats>,
    /// Time per output token of `ok` requests.
    pub tpot: Option<LatencyStats>,
    /// Inter-token latency: the distribution of each `ok` streamed request's median gap; `max`
    /// is the largest gap of any request.
    pub itl: Option<LatencyStats>,
    /// The distribution of each `ok` streamed request's own 99th-percentile gap: pauses within
    /// requests (`itl` spreads across requests).
    pub itl_p99: Option<LatencyStats>,
    /// Token totals.
    pub tokens: TokenTotals,
    /// Rates over the time the window covers.
    pub throughput: Throughput,
    /// Requests meeting every applicable SLO.
    pub goodput: Goodput,
    /// Phase shares of e2e.
    pub phase_share: PhaseShares,
    /// GPU statistics, `null` when no request of the window carried any.
    pub gpu: Option<GpuKpis>,
    /// Disaggregated prefill/decode sub-phases per pool and per worker, `null` when no `ok`
    /// request of the window crossed pools (left out of the JSON then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagg: Option<super::disagg::DisaggKpis>,
}

/// Tokens over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TokenTotals {
    /// Prompt tokens (every outcome).
    pub input: u64,
    /// Generated tokens (every outcome: cancelled requests did generate them).
    pub output: u64,
}

/// Rates over the window, per second of time covered (see [`super::KpiWindows::snapshot`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// Requests (every outcome) per second.
    pub requests_per_second: f64,
    /// Prompt tokens per second.
    pub input_tokens_per_second: f64,
    /// Generated tokens per second.
    pub output_tokens_per_second: f64,
}

/// Goodput: requests meeting every applicable SLO.
///
/// `ratio` = good / (requests − cancelled): errors and rejections count against it, cancelled
/// requests count neither way (the client ended them). `null` when that denominator is zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Goodput {
    /// Share of eligible requests that were good.
    pub ratio: Option<f64>,
    /// Good requests per second.
    pub requests_per_second: f64,
}

/// Phase shares of e2e for all requests and for the slow tail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PhaseShares {
    /// Over every `ok` request that has queue, prefill and decode.
    pub all: Option<PhaseShare>,
    /// Over those at or above the window's p90 e2e (bucket resolution).
    pub p90: Option<PhaseShare>,
    /// Over those at or above the window's p99 e2e (bucket resolution).
    pub p99: Option<PhaseShare>,
}

/// Σ phase / Σ e2e over a set of requests (the remainder is time outside the three phases).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PhaseShare {
    /// Queue share.
    pub queue: f64,
    /// Prefill share.
    pub prefill: f64,
    /// Decode share.
    pub decode: f64,
}

/// GPU statistics of a series over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct GpuKpis {
    /// Requests that carried GPU statistics.
    pub requests: u64,
    /// Mean GPU utilisation per phase, weighted by phase duration (0–1).
    pub utilization_mean: GpuPhaseUtilization,
    /// Σ attributed energy (token-share estimate), joules.
    pub energy_attributed_joules: f64,
    /// Attributed energy per output token over the requests that have both, joules.
    pub energy_per_output_token_joules: Option<f64>,
}

/// Duration-weighted mean utilisation per phase; `null` where no request had it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct GpuPhaseUtilization {
    /// Queue phase.
    pub queue: Option<f64>,
    /// Prefill phase.
    pub prefill: Option<f64>,
    /// Decode phase.
    pub decode: Option<f64>,
}
