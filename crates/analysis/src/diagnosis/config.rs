//! The diagnosis rules' thresholds, read from the collector's YAML.

use serde::{Deserialize, Serialize};

use crate::kpi::SloConfig;

/// Thresholds of the diagnosis rules; every key optional in YAML (defaults as documented).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiagnosisConfig {
    /// Fewest requests in a window before any rule but the throughput floor speaks. Default 20.
    pub min_requests: u64,
    /// Queue share of e2e of the p90 requests above which latency is queue-dominated. Default 0.4.
    pub queue_share_max: f64,
    /// GPU utilisation (0–1) above which the GPU is saturated. Default 0.95.
    pub gpu_saturated_min: f64,
    /// GPU utilisation (0–1) below which the GPU is under-used. Default 0.5.
    pub gpu_idle_max: f64,
    /// TTFT p90 (s) above which TTFT is examined. Default 1.0.
    pub ttft_p90_max_seconds: f64,
    /// Share of TTFT p90 spent in prefill (p90) from which TTFT is prefill-dominated. Default 0.6.
    pub prefill_ttft_share_min: f64,
    /// TPOT p90 (s) above which decoding is slow. Default 0.1.
    pub tpot_p90_max_seconds: f64,
    /// Mean requests decoding at once (Little's law) from which a batch is large. Default 16.
    pub large_batch_min: f64,
    /// Inter-token latency p99 / p50 above which decodes stall. Default 5.
    pub itl_p99_p50_ratio_max: f64,
    /// TPOT p50 (a request's mean gap) over inter-token latency p50 (its median gap) above which
    /// a few long gaps dominate decoding, i.e. decodes stall. Default 2.
    pub tpot_itl_ratio_max: f64,
    /// e2e p95 SLO, seconds; `null` disables. Default 30.
    pub e2e_p95_slo_seconds: Option<f64>,
    /// Requests per second below which throughput is too low; `null` (default) disables.
    pub throughput_min_rps: Option<f64>,
    /// Error share of requests above which errors are up. Default 0.01.
    pub error_rate_max: f64,
    /// Rejected share of requests above which admission is refusing too much. Default 0.01.
    pub rejection_rate_max: f64,
    /// Cancelled share of requests above which clients are giving up. Default 0.05.
    pub cancel_rate_max: f64,
    /// Goodput ratio below which too few requests meet their SLOs. Default 0.9.
    pub goodput_min: f64,
    /// Share of the p99 requests' critical path one span other than the phases may own. Default 0.25.
    pub critical_span_share_max: f64,
    /// Share of disaggregated requests' TTFT (Σ kv_transfer / Σ TTFT) above which the KV
    /// transfer dominates it. Default 0.3.
    pub kv_transfer_ttft_share_max: f64,
    /// Share of disaggregated requests' TTFT spent waiting in one pool (`prefill_queue`, or
    /// `decode_wait`) above which that pool is short for the load. Default 0.15.
    pub pool_wait_ttft_share_max: f64,
    /// Share of disaggregated requests' TTFT spent in `bootstrap` (the wait for the decode
    /// side's KV pre-allocation, then the handshake) above which decode KV memory is short.
    /// Default 0.25.
    pub kv_alloc_wait_ttft_share_max: f64,
    /// KV-cache bytes per prompt token of the served model (2 × layers × KV heads × head size
    /// × bytes per value), to state achieved KV transfer rates in bytes/s; `null` (default):
    /// prompt tokens/s only.
    pub kv_bytes_per_token: Option<f64>,
}

impl Default for DiagnosisConfig {
    fn default() -> Self {
        Self {
            min_requests: 20,
            queue_share_max: 0.4,
            gpu_saturated_min: 0.95,
            gpu_idle_max: 0.5,
            ttft_p90_max_seconds: 1.0,
            prefill_ttft_share_min: 0.6,
            tpot_p90_max_seconds: 0.1,
            large_batch_min: 16.0,
            itl_p99_p50_ratio_max: 5.0,
            tpot_itl_ratio_max: 2.0,
            e2e_p95_slo_seconds: Some(30.0),
            throughput_min_rps: None,
            error_rate_max: 0.01,
            rejection_rate_max: 0.01,
            cancel_rate_max: 0.05,
            goodput_min: 0.9,
            critical_span_share_max: 0.25,
            kv_transfer_ttft_share_max: 0.3,
            pool_wait_ttft_share_max: 0.15,
            kv_alloc_wait_ttft_share_max: 0.25,
            kv_bytes_per_token: None,
        }
    }
}

impl DiagnosisConfig {
    /// Takes the TTFT, TPOT and e2e thresholds from the KPI SLOs (those that are set), so
    /// diagnosis and goodput judge by the same numbers.
    pub fn with_slo(mut self, slo: &SloConfig) -> Self {
        if let Some(t) = slo.ttft_seconds {
            self.ttft_p90_max_seconds = t;
        }
        if let Some(t) = slo.tpot_seconds {
            self.tpot_p90_max_seconds = t;
        }
        if slo.e2e_seconds.is_some() {
            self.e2e_p95_slo_seconds = slo.e2e_seconds;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_deserialises_with_defaults_and_takes_slos() {
        let c: DiagnosisConfig =
            serde_json::from_str(r#"{"queue_share_max": 0.5, "throughput_min_rps": 2}"#).unwrap();
        assert_eq!(c.queue_share_max, 0.5);
        assert_eq!(c.throughput_min_rps, Some(2.0));
        assert_eq!(c.gpu_saturated_min, 0.95);
        assert!(serde_json::from_str::<DiagnosisConfig>(r#"{"nope": 1}"#).is_err());
        let slo = SloConfig {
            ttft_seconds: Some(0.5),
            tpot_seconds: None,
            e2e_seconds: Some(10.0),
        };
        let c = DiagnosisConfig::default().with_slo(&slo);
        assert_eq!(c.ttft_p90_max_seconds, 0.5);
        assert_eq!(c.tpot_p90_max_seconds, 0.1);
        assert_eq!(c.e2e_p95_slo_seconds, Some(10.0));
    }
}
