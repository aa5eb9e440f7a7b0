//! [`SimulatedGpu`]: a **simulated** GPU whose counters follow the simulated engine, so GPU
//! telemetry (per-phase utilisation, energy per token, the saturated-vs-idle diagnosis) can be
//! seen end to end on a machine without a GPU. Nothing here reads real hardware.
//!
//! The model, for one H100 SXM 80GB (700 W) serving Llama-3.1-8B in BF16:
//! - **utilisation** over a sample period = the engine's busy fraction over that period (the
//!   share of time a step ran — what NVML's "utilization" also means: some kernel was running);
//! - **power** = [`IDLE_WATTS`] + utilisation × ([`MAX_WATTS`] − [`IDLE_WATTS`]), i.e. 90 W idle
//!   to 700 W flat out, constant over the period;
//! - **energy**: a monotonically increasing millijoule counter, the exact integral of that
//!   piecewise-constant power (like NVML's total-energy field);
//! - **memory used** = [`WEIGHTS_BYTES`] (16 GB of weights) + [`KV_BYTES_PER_TOKEN`] (128 KiB:
//!   32 layers × 8 KV heads × 128 dims × 2 (K and V) × 2 bytes) × the tokens the running batch
//!   holds in its KV cache ([`EngineStats::context_tokens`]), capped at [`MEMORY_TOTAL_BYTES`];
//! - SM clock [`SM_CLOCK_MHZ`] and temperature [`TEMPERATURE_CELSIUS`]: plausible constants.
//!
//! Like NVML's utilisation, a sample describes the period *before* it, while the sampler holds a
//! sample's value *forward* until the next one: windows see the engine's activity up to one
//! sample period late, as they would on real hardware.

use std::time::Instant;

use infertrace_gpu::{
    CounterSource, DeviceInfo, DeviceSample, GpuReading, GpuSampler, GpuSamplerConfig,
    GpuTelemetry, HostSampler, HostSamplerConfig,
};

use crate::{EngineStats, SimHandle};

/// Power of the idle simulated GPU, watts.
pub const IDLE_WATTS: f64 = 90.0;
/// Power of the fully busy simulated GPU (an H100 SXM's 700 W TDP), watts.
pub const MAX_WATTS: f64 = 700.0;
/// Model weights resident on the simulated GPU (Llama-3.1-8B in BF16), bytes.
pub const WEIGHTS_BYTES: u64 = 16_000_000_000;
/// KV cache per context token of Llama-3.1-8B in BF16: 32 × 8 × 128 × 2 × 2 bytes = 128 KiB.
pub const KV_BYTES_PER_TOKEN: u64 = 32 * 8 * 128 * 2 * 2;
/// Framebuffer of the simulated GPU (81,559 MiB, as NVML reports for an H100 80GB), bytes.
pub const MEMORY_TOTAL_BYTES: u64 = 81_559 * 1024 * 1024;
/// SM clock of the simulated GPU (H100 SXM boost clock), MHz.
pub const SM_CLOCK_MHZ: u32 = 1980;
/// Die temperature of the simulated GPU, °C.
pub const TEMPERATURE_CELSIUS: u32 = 55;
/// Device name of the simulated GPU (says it is simulated wherever it is shown).
pub const SIMULATED_GPU_NAME: &str = "Simulated H100 80GB (infertrace-sim)";
/// UUID of the simulated GPU (the `sim0` group marks it as not a real device).
pub const SIMULATED_GPU_UUID: &str = "GPU-00000000-sim0-0000-0000-000000000000";

type StatsFn = dyn FnMut() -> EngineStats + Send;

/// A [`CounterSource`] with one simulated GPU driven by [`EngineStats`] (see the module docs for
/// the model). Give it to [`GpuSampler::with_source`], or use [`SimulatedGpu::telemetry`].
///
/// ```
/// use std::time::{Duration, Instant};
/// use infertrace_gpu::{CounterSource, DeviceInfo};
/// use infertrace_sim::{EngineStats, SimulatedGpu, IDLE_WATTS, MAX_WATTS};
///
/// let t0 = Instant::now();
/// let stats = |ms: u64, busy_ms: u64| EngineStats {
///     at: t0 + Duration::from_millis(ms), elapsed: Duration::from_millis(ms),
///     busy: Duration::from_millis(busy_ms), steps: 0, running: 0, waiting: 0, submitted: 0,
///     finished: 0, failed: 0, cancelled: 0, prompt_tokens: 0, output_tokens: 0,
///     context_tokens: 0,
/// };
/// let mut script = vec![stats(100, 50), stats(0, 0)].into_iter();
/// let mut gpu = SimulatedGpu::with_stats(move || script.next_back().unwrap());
/// let mut out = Vec::new();
/// gpu.sample(Instant::now(), &mut out); // 50 ms busy of 100 ms
/// let r = out[0].reading;
/// assert_eq!(r.utilization, Some(0.5));
/// assert_eq!(r.power_watts, Some(IDLE_WATTS + 0.5 * (MAX_WATTS - IDLE_WATTS)));
/// assert_eq!(r.energy_millijoules, Some(39_500)); // 395 W × 0.1 s
/// ```
pub struct SimulatedGpu {
    stats: Box<StatsFn>,
    last: EngineStats,
    /// Energy since the first reading, millijoules (kept fractional; reported truncated).
    energy_mj: f64,
}

impl std::fmt::Debug for SimulatedGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedGpu")
            .field("last", &self.last)
            .field("energy_mj", &self.energy_mj)
            .finish_non_exhaustive()
    }
}

impl SimulatedGpu {
    /// A simulated GPU following `sim`'s engine.
    pub fn new(sim: SimHandle) -> Self {
        Self::with_stats(move || sim.stats())
    }

    /// A simulated GPU following whatever `stats` returns (called once now, then once per
    /// sample; the `at` instants must not go backwards).
    pub fn with_stats(mut stats: impl FnMut() -> EngineStats + Send + 'static) -> Self {
        let last = stats();
        Self {
            stats: Box::new(stats),
            last,
            energy_mj: 0.0,
        }
    }

    /// The one device this source reports.
    pub fn device() -> DeviceInfo {
        DeviceInfo {
            index: 0,
            uuid: SIMULATED_GPU_UUID.into(),
            name: SIMULATED_GPU_NAME.into(),
            memory_total: Some(MEMORY_TOTAL_BYTES),
            mig_enabled: Some(false),
            gpm_supported: false,
            driver_version: Some("simulated".into()),
        }
    }

    /// Power at utilisation `u` (0–1), watts.
    pub fn power_watts(utilization: f64) -> f64 {
        IDLE_WATTS + utilization.clamp(0.0, 1.0) * (MAX_WATTS - IDLE_WATTS)
    }

    /// Memory used with `context_tokens` in the KV cache, bytes.
    pub fn memory_used(context_tokens: u64) -> u64 {
        context_tokens
            .saturating_mul(KV_BYTES_PER_TOKEN)
            .saturating_add(WEIGHTS_BYTES)
            .min(MEMORY_TOTAL_BYTES)
    }

    /// The reading for the period since the previous one, ending at `now.at`.
    fn reading(&mut self, now: EngineStats) -> GpuReading {
        let utilization = now.busy_fraction_since(&self.last);
        let power = Self::power_watts(utilization);
        let dt = now.at.saturating_duration_since(self.last.at).as_secs_f64();
        self.energy_mj += power * dt * 1000.0;
        self.last = now;
        GpuReading {
            utilization: Some(utilization),
            memory_used: Some(Self::memory_used(now.context_tokens)),
            memory_total: Some(MEMORY_TOTAL_BYTES),
            power_watts: Some(power),
            energy_millijoules: Some(self.energy_mj as u64),
            sm_clock_mhz: Some(SM_CLOCK_MHZ),
            temperature_celsius: Some(TEMPERATURE_CELSIUS),
            throttle_reasons: Some(0),
        }
    }

    /// GPU telemetry on a simulated GPU following `sim`, sampled every `interval` on its own
    /// thread, plus (when `host`) the real host and process counters.
    pub fn telemetry(sim: SimHandle, interval: std::time::Duration, host: bool) -> GpuTelemetry {
        let config = GpuSamplerConfig {
            interval,
            ..GpuSamplerConfig::default()
        };
        let gpu = GpuSampler::with_source(config, Box::new(Self::new(sim)));
        let host = host.then(|| {
            HostSampler::start(HostSamplerConfig {
                interval,
                ..HostSamplerConfig::default()
            })
        });
        let host = match host {
            Some(Ok(h)) => Some(h),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "could not start the host sampler thread; host counters are off");
                None
            }
            None => None,
        };
        GpuTelemetry::new(Some(gpu), host)
    }
}

impl CounterSource for SimulatedGpu {
    fn devices(&self) -> Vec<DeviceInfo> {
        vec![Self::device()]
    }

    fn sample(&mut self, _now: Instant, out: &mut Vec<DeviceSample>) {
        let stats = (self.stats)();
        let reading = self.reading(stats);
        out.push(DeviceSample {
            device: 0,
            reading,
            ..DeviceSample::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    fn stats(t0: Instant, ms: u64, busy_ms: u64, context_tokens: u64) -> EngineStats {
        EngineStats {
            at: t0 + Duration::from_millis(ms),
            elapsed: Duration::from_millis(ms),
            busy: Duration::from_millis(busy_ms),
            steps: 0,
            running: 0,
            waiting: 0,
            submitted: 0,
            finished: 0,
            failed: 0,
            cancelled: 0,
            prompt_tokens: 0,
            output_tokens: 0,
            context_tokens,
        }
    }

    /// A source replaying `(ms, busy_ms, context)` snapshots; the first is the baseline.
    fn scripted(points: Vec<(u64, u64, u64)>) -> SimulatedGpu {
        let t0 = Instant::now();
        let points = Arc::new(Mutex::new(points.into_iter()));
        SimulatedGpu::with_stats(move || {
            let (ms, busy, ctx) = points.lock().unwrap().next().unwrap();
            stats(t0, ms, busy, ctx)
        })
    }

    fn readings(gpu: &mut SimulatedGpu, n: usize) -> Vec<GpuReading> {
        (0..n)
            .map(|_| {
                let mut out = Vec::new();
                gpu.sample(Instant::now(), &mut out);
                assert_eq!(out.len(), 1);
                out[0].reading
            })
            .collect()
    }

    #[test]
    fn utilisation_tracks_the_busy_fraction_of_each_period() {
        // Busy 0, 25, 100, 60 ms in four 100 ms periods.
        let mut gpu = scripted(vec![
            (0, 0, 0),
            (100, 0, 0),
            (200, 25, 0),
            (300, 125, 0),
            (400, 185, 0),
        ]);
        let r = readings(&mut gpu, 4);
        let util: Vec<f64> = r.iter().map(|r| r.utilization.unwrap()).collect();
        let expected = [0.0, 0.25, 1.0, 0.6];
        for (u, e) in util.iter().zip(expected) {
            assert!((u - e).abs() < 1e-12, "{util:?}");
        }
        assert_eq!(r[0].power_watts, Some(90.0));
        assert_eq!(r[2].power_watts, Some(700.0));
        assert!((r[1].power_watts.unwrap() - (90.0 + 0.25 * 610.0)).abs() < 1e-9);
    }

    #[test]
    fn energy_counter_is_monotonic_and_the_integral_of_power() {
        // Uneven periods: 100, 50, 250, 10 ms with varying busy time.
        let points = vec![
            (0, 0, 0),
            (100, 40, 0),
            (150, 90, 0),
            (400, 100, 0),
            (410, 110, 0),
        ];
        let mut truth_mj = 0.0;
        for w in points.windows(2) {
            let dt = (w[1].0 - w[0].0) as f64 / 1000.0;
            let u = (w[1].1 - w[0].1) as f64 / 1000.0 / dt;
            truth_mj += (IDLE_WATTS + u * (MAX_WATTS - IDLE_WATTS)) * dt * 1000.0;
        }
        let mut gpu = scripted(points);
        let r = readings(&mut gpu, 4);
        let energy: Vec<u64> = r.iter().map(|r| r.energy_millijoules.unwrap()).collect();
        assert!(energy.windows(2).all(|w| w[0] <= w[1]), "{energy:?}");
        // 40% busy for 100 ms: 90 + 0.4 × 610 = 334 W → 33.4 J.
        assert_eq!(energy[0], 33_400);
        assert!(
            (energy[3] as f64 - truth_mj).abs() < 1.0,
            "{energy:?} vs {truth_mj}"
        );
    }

    #[test]
    fn memory_is_weights_plus_kv_cache_capped_at_the_framebuffer() {
        let mut gpu = scripted(vec![
            (0, 0, 0),
            (100, 0, 0),
            (200, 0, 1000),
            (300, 0, u64::MAX / 2),
        ]);
        let r = readings(&mut gpu, 3);
        assert_eq!(r[0].memory_used, Some(16_000_000_000));
        assert_eq!(r[1].memory_used, Some(16_000_000_000 + 1000 * 131_072));
        assert_eq!(r[2].memory_used, Some(MEMORY_TOTAL_BYTES));
        assert_eq!(KV_BYTES_PER_TOKEN, 128 * 1024);
        assert_eq!(r[0].memory_total, Some(MEMORY_TOTAL_BYTES));
        let d = SimulatedGpu::device();
        assert!(d.name.contains("Simulated") && d.uuid.starts_with("GPU-00000000-sim0"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_engine_reads_as_a_busy_gpu() {
        use crate::{SimConfig, SimRequest, Simulator};
        let sim = Simulator::start(SimConfig::default()).unwrap();
        let mut gpu = SimulatedGpu::new(sim.clone());
        // Idle first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let idle = readings(&mut gpu, 1)[0];
        assert_eq!(idle.utilization, Some(0.0));
        assert_eq!(idle.memory_used, Some(WEIGHTS_BYTES));
        // Keep it busy: long outputs back to back.
        let mut streams = Vec::new();
        for _ in 0..4 {
            let req = SimRequest::new(500, 400).with_output_tokens(400);
            streams.push(sim.submit(req, ()).unwrap());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let busy = readings(&mut gpu, 1)[0];
        assert!(busy.utilization.unwrap() > 0.9, "{busy:?}");
        assert!(busy.power_watts.unwrap() > 600.0, "{busy:?}");
        // Four running sequences hold ≥ their prompts in the KV cache.
        assert!(
            busy.memory_used.unwrap() >= WEIGHTS_BYTES + 4 * 500 * KV_BYTES_PER_TOKEN,
            "{busy:?}"
        );
        drop(streams);
    }
}
