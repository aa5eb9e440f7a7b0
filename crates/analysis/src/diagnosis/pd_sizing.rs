//! DistServe-style sizing of a disaggregated deployment's prefill:decode split from what each
//! pool served in a window (docs/disaggregated.md#sizing-the-pd-split).
//!
//! Each pool's **goodput per GPU** is the rate of requests meeting that pool's SLO one of its
//! workers would serve fully busy:
//!
//! ```text
//! goodput per GPU = load × SLO attainment ÷ (workers × busy fraction)
//! ```
//!
//! and the split that balances the two for the observed load is
//!
//! ```text
//! P : D = load ÷ prefill goodput per GPU : load ÷ decode goodput per GPU
//! ```
//!
//! scaled to the deployment's current GPU count (rounded, at least one GPU per pool). The
//! inputs — busy fractions and attainments — come from the caller; this module only does the
//! arithmetic, so it can be checked against numbers computed by hand.

/// What one pool served over the window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolLoad {
    /// Workers (GPUs) in the pool.
    pub workers: usize,
    /// Fraction of its workers' capacity the load kept busy, in (0, 1].
    pub busy: f64,
    /// Share of requests that met the pool's SLO, in [0, 1].
    pub slo_attainment: f64,
}

impl PoolLoad {
    /// Requests per second meeting the SLO that one worker serves when fully busy; `None`
    /// when the inputs cannot say (no workers, no load, a busy fraction outside (0, 1]).
    pub fn goodput_per_gpu(&self, load_rps: f64) -> Option<f64> {
        let usable = self.workers > 0
            && load_rps.is_finite()
            && load_rps > 0.0
            && self.busy > 0.0
            && self.busy <= 1.0
            && (0.0..=1.0).contains(&self.slo_attainment);
        usable.then(|| load_rps * self.slo_attainment / (self.workers as f64 * self.busy))
    }
}

/// The sizing: each pool's goodput per GPU, the GPUs the load needs in each, and the split of
/// the current GPU count that balances them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PdSizing {
    /// Requests per second both pools served.
    pub load_rps: f64,
    /// Prefill goodput per GPU, requests/s.
    pub prefill_goodput_per_gpu: f64,
    /// Decode goodput per GPU, requests/s.
    pub decode_goodput_per_gpu: f64,
    /// load ÷ prefill goodput per GPU.
    pub prefill_gpus_needed: f64,
    /// load ÷ decode goodput per GPU.
    pub decode_gpus_needed: f64,
    /// Recommended prefill workers out of the current total.
    pub prefill_workers: usize,
    /// Recommended decode workers out of the current total.
    pub decode_workers: usize,
}

/// Sizes the split for `load_rps`; `None` when either pool's goodput cannot be estimated, is
/// zero (no request met its SLO), or the deployment has fewer than two GPUs.
pub fn size(load_rps: f64, prefill: PoolLoad, decode: PoolLoad) -> Option<PdSizing> {
    let gp = prefill.goodput_per_gpu(load_rps).filter(|g| *g > 0.0)?;
    let gd = decode.goodput_per_gpu(load_rps).filter(|g| *g > 0.0)?;
    let total = prefill.workers + decode.workers;
    if total < 2 {
        return None;
    }
    let (np, nd) = (load_rps / gp, load_rps / gd);
    let p = ((total as f64 * np / (np + nd)).round() as usize).clamp(1, total - 1);
    Some(PdSizing {
        load_rps,
        prefill_goodput_per_gpu: gp,
        decode_goodput_per_gpu: gd,
        prefill_gpus_needed: np,
        decode_gpus_needed: nd,
        prefill_workers: p,
        decode_workers: total - p,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(workers: usize, busy: f64, slo_attainment: f64) -> PoolLoad {
        PoolLoad {
            workers,
            busy,
            slo_attainment,
        }
    }

    #[test]
    fn goodput_per_gpu_is_the_good_rate_one_fully_busy_worker_serves() {
        // 10 req/s on 2 workers half busy, 90 % within the SLO: each worker serves 5 req/s at
        // half its capacity, 10 at full, 9 of them good.
        let g = pool(2, 0.5, 0.9).goodput_per_gpu(10.0).unwrap();
        assert!((g - 9.0).abs() < 1e-12, "{g}");
        assert_eq!(pool(0, 0.5, 1.0).goodput_per_gpu(10.0), None);
        assert_eq!(pool(2, 0.0, 1.0).goodput_per_gpu(10.0), None);
        assert_eq!(pool(2, 1.5, 1.0).goodput_per_gpu(10.0), None);
        assert_eq!(pool(2, 0.5, 1.0).goodput_per_gpu(0.0), None);
        assert_eq!(pool(2, 0.5, f64::NAN).goodput_per_gpu(10.0), None);
    }

    #[test]
    fn a_saturated_prefill_pool_beside_an_idle_decode_pool_gets_most_gpus() {
        // pd-ratio's shape: 10 req/s, one prefill worker saturated (busy 1, all good: 10 good
        // req/s per GPU), three decode workers using 7.5 % of their TPOT budget (each could
        // serve 10 / 3 / 0.075 = 44.4 req/s).
        let s = size(10.0, pool(1, 1.0, 1.0), pool(3, 0.075, 1.0)).unwrap();
        assert!((s.prefill_goodput_per_gpu - 10.0).abs() < 1e-12);
        assert!((s.decode_goodput_per_gpu - 10.0 / 3.0 / 0.075).abs() < 1e-9);
        assert!((s.prefill_gpus_needed - 1.0).abs() < 1e-12);
        assert!((s.decode_gpus_needed - 0.225).abs() < 1e-9);
        // 4 × 1 / 1.225 = 3.27 → 3 prefill, 1 decode.
        assert_eq!((s.prefill_workers, s.decode_workers), (3, 1));
    }

    #[test]
    fn a_saturated_decode_pool_beside_an_idle_prefill_pool_gets_the_gpu() {
        // pd-decode-bound's shape: 8 req/s; two prefill workers 12 % busy, one decode worker
        // saturated: need 8 / 33.3 = 0.24 prefill and 8 / 8 = 1 decode GPU → 3 × 0.19 = 0.58
        // → 1 prefill, 2 decode.
        let s = size(8.0, pool(2, 0.12, 1.0), pool(1, 1.0, 1.0)).unwrap();
        assert!((s.prefill_gpus_needed - 0.24).abs() < 1e-9);
        assert!((s.decode_gpus_needed - 1.0).abs() < 1e-12);
        assert_eq!((s.prefill_workers, s.decode_workers), (1, 2));
    }

    #[test]
    fn missed_slos_lower_a_pools_goodput_and_every_pool_keeps_a_gpu() {
        // Equal busy fractions; decode meets its SLO for only half the requests: it needs
        // twice the GPUs (4 × 2 / 3 = 2.67 → 3 of 4).
        let s = size(4.0, pool(2, 0.5, 1.0), pool(2, 0.5, 0.5)).unwrap();
        assert!((s.decode_gpus_needed / s.prefill_gpus_needed - 2.0).abs() < 1e-12);
        assert_eq!((s.prefill_workers, s.decode_workers), (1, 3));
        // However lopsided, each pool keeps one GPU.
        let s = size(4.0, pool(1, 1.0, 1.0), pool(1, 0.001, 1.0)).unwrap();
        assert_eq!((s.prefill_workers, s.decode_workers), (1, 1));
        let s = size(4.0, pool(5, 0.001, 1.0), pool(1, 1.0, 1.0)).unwrap();
        assert_eq!((s.prefill_workers, s.decode_workers), (1, 5));
        // Nothing good in a pool, or no GPU to move: no sizing.
        assert_eq!(size(4.0, pool(2, 0.5, 0.0), pool(2, 0.5, 1.0)), None);
    }
}
