//! Diagnosis: findings — what is wrong and what to change — from one series' KPIs of a window.
//!
//! Each rule reads a [`SeriesKpis`] (and, when given, the window's [`CriticalPathSummary`]) and
//! either stays quiet or returns a [`Finding`] with a rule id, a severity, the numbers that made
//! it fire ([`Evidence`]) and a concrete recommendation. Every threshold is a field of
//! [`DiagnosisConfig`], deserialisable (with defaults) from the collector's YAML.
//!
//! Rules (ids are stable; thresholds in parentheses are the defaults):
//!
//! | id | fires when |
//! |---|---|
//! | `queue-dominated-gpu-saturated` | p90 requests spend > 40% of e2e queued and the GPU is > 95% busy |
//! | `queue-dominated-gpu-idle` | … queued > 40% while the GPU is < 50% busy |
//! | `queue-dominated` | … queued > 40% with the GPU between the two, or unmeasured |
//! | `prefill-dominated-ttft` | TTFT p90 > 1 s and prefill is ≥ 60% of it |
//! | `high-tpot-large-batch` | TPOT p90 > 100 ms with ≥ 16 requests decoding at once (Little's law), unless stalls explain it |
//! | `high-tpot` | TPOT p90 > 100 ms at a smaller batch |
//! | `inter-token-stalls` | TPOT p50 > 2 × inter-token p50 (a few long pauses), or inter-token p99 > 5 × p50 |
//! | `gpu-saturated` / `gpu-underutilized` | GPU > 95% / < 50% busy (when no queue rule said so); saturated is a warning only once p90 requests queue ≥ 10% of e2e or goodput is below target, else info |
//! | `e2e-slo-breach` | e2e p95 above the latency SLO (30 s) |
//! | `throughput-below-floor` | requests/s under a configured floor (off by default) |
//! | `error-rate` / `rejection-rate` / `cancel-rate` | > 1% / > 1% / > 5% of requests |
//! | `goodput-below-target` | goodput ratio < 0.9 |
//! | `critical-path-hotspot` | a span other than queue / prefill / decode owns > 25% of the p99 requests' critical path |
//! | `kv-transfer-dominates-ttft` | disaggregated requests spend > 30% of TTFT in the KV transfer |
//! | `pd-ratio-prefill-bound` / `pd-ratio-decode-bound` | > 15% of TTFT waiting in the prefill queue / for a decode batch (beyond one decode step), more than in the other pool |
//! | `decode-kv-memory-wait` | > 25% of TTFT in bootstrap (waiting for the decode side's KV memory) |
//!
//! The disaggregated rules read the series' [`crate::kpi::DisaggKpis`] and need
//! [`DiagnosisConfig::min_requests`] disaggregated requests; see `diagnosis/disagg.rs`.
//!
//! Every rule but the throughput floor needs at least [`DiagnosisConfig::min_requests`] requests
//! in the window (20), so one slow or failed request in a quiet minute is not a diagnosis (a
//! longer window of the same series will still show a persistent problem); [`undiagnosed`]
//! lists the series left unjudged, so that a report does not read their silence as health.
//!
//! "GPU busy" is the duration-weighted mean utilisation across the three phases
//! ([`gpu_utilization_mean`]), the same value alert rules read as `gpu.utilization.mean`.
//!
//! [`SeriesKpis`]: crate::kpi::SeriesKpis
//! [`CriticalPathSummary`]: crate::critical_path::CriticalPathSummary

mod config;
mod diagnoser;
mod disagg;
mod finding;
pub mod pd_sizing;
mod rules;

pub use config::DiagnosisConfig;
pub use disagg::KV_LINK_SPEEDUP;
pub use finding::{Evidence, Finding, Severity, Undiagnosed, format_rate};
pub use rules::{
    WindowDiagnosis, decode_concurrency, diagnose, diagnose_snapshot, diagnose_window,
    gpu_utilization_mean, undiagnosed,
};
