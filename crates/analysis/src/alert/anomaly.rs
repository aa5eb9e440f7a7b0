//! Anomalies: each KPI series keeps an EWMA baseline with variance; a value beyond k·σ of the
//! baseline for N consecutive windows is an anomaly, reported with a least-squares trend that
//! says when an SLO will be crossed at the current slope.
//!
//! Details that keep it quiet on noise and loud on real changes:
//! - **Warm-up**: the first [`AnomalyConfig::warmup`] values build the baseline with exact
//!   (Welford) mean and variance; no anomaly is reported before.
//! - **Frozen baseline while out of band**: a value beyond k·σ does not update the baseline, so
//!   a step change stays visible instead of dragging the baseline along. After
//!   [`AnomalyConfig::rebaseline_after`] consecutive out-of-band values (30 minutes at the
//!   collector's 5 s evaluations: longer than most incidents) the new level is accepted as the
//!   baseline.
//! - **A return is no anomaly**: after such a change the earlier baseline is remembered for as
//!   many values as it took to accept the new level, and a value back within its band is not
//!   reported against the new one; once [`AnomalyConfig::consecutive`] values in a row are back,
//!   the earlier baseline is restored. A return later than that is a change of its own.
//! - **Relative floor**: a deviation must also exceed [`AnomalyConfig::min_relative_change`] of
//!   the baseline, so a near-constant series (σ ≈ 0) does not flag rounding noise.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::expr::{KpiPath, ParseError};
use crate::kpi::{KpiSnapshot, SloConfig};

/// How long [`AnomalyDetector::observe_snapshot`] keeps the baselines of a series missing from
/// its snapshots before forgetting them.
pub const FORGET_QUIET_AFTER: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// Anomaly detection settings; every key optional in YAML.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnomalyConfig {
    /// Deviation, in standard deviations of the baseline, beyond which a value is out of band.
    /// Default 3.
    pub k: f64,
    /// Consecutive out-of-band values that make an anomaly. Default 3.
    pub consecutive: u32,
    /// EWMA weight of a new value (0–1). Default 0.1 (about the last 20 values).
    pub alpha: f64,
    /// Values that build the baseline before anything is reported. Default 10.
    pub warmup: u32,
    /// Smallest deviation, relative to the baseline, that counts. Default 0.05.
    pub min_relative_change: f64,
    /// Recent values the trend is fitted to. Default 10.
    pub trend_points: usize,
    /// Consecutive out-of-band values after which the new level becomes the baseline. Default
    /// 360 (30 minutes of the collector's 5 s evaluations).
    pub rebaseline_after: u32,
    /// The KPI paths watched by [`AnomalyDetector::observe_snapshot`].
    pub kpis: Vec<String>,
}

impl Default for AnomalyConfig {
    fn default() -> Self {
        Self {
            k: 3.0,
            consecutive: 3,
            alpha: 0.1,
            warmup: 10,
            min_relative_change: 0.05,
            trend_points: 10,
            rebaseline_after: 360,
            kpis: [
                "e2e.p95",
                "ttft.p95",
                "tpot.p95",
                "queue.p95",
                "error_rate",
                "gpu.utilization.mean",
                "throughput.requests_per_second",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

/// Which way a value left its baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Above the baseline.
    Up,
    /// Below the baseline.
    Down,
}

/// An SLO bound on a KPI: `bad_above` (latency: bad above the threshold) or below (goodput).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SloBound {
    /// The threshold.
    pub threshold: f64,
    /// Whether values above the threshold break the SLO (else values below do).
    pub bad_above: bool,
}

/// A least-squares line through a series' recent values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Trend {
    /// Change per second.
    pub slope_per_second: f64,
    /// The fitted value at the time asked.
    pub fitted: f64,
    /// Points fitted.
    pub points: usize,
    /// The SLO the projection is against, if one is set for the KPI.
    pub slo: Option<SloBound>,
    /// When the fitted line crosses the SLO at the current slope: `Some(now)` when it already
    /// has, `None` when it never will (slope away from it, or no SLO).
    pub crosses_slo_at_unix_nano: Option<u64>,
}

/// An anomaly on one KPI series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Anomaly {
    /// Series service.
    pub service: String,
    /// Series model.
    pub model: String,
    /// Series operation (empty when series are not split by operation).
    pub operation: String,
    /// The KPI path.
    pub kpi: String,
    /// The latest value.
    pub value: f64,
    /// The baseline mean.
    pub baseline: f64,
    /// The baseline standard deviation.
    pub sigma: f64,
    /// (value − baseline) / σ (signed; infinite when σ is 0).
    pub deviation_sigmas: f64,
    /// Direction.
    pub direction: Direction,
    /// Consecutive out-of-band values so far.
    pub consecutive: u32,
    /// Time of the first of them, Unix nanoseconds.
    pub since_unix_nano: u64,
    /// The trend of recent values.
    pub trend: Option<Trend>,
}

/// What one new value did to a baseline.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Observation {
    /// The baseline mean before the value.
    pub baseline: f64,
    /// The baseline σ before the value.
    pub sigma: f64,
    /// Whether the value was beyond k·σ (and the relative floor).
    pub out_of_band: bool,
    /// Consecutive out-of-band values, this one included.
    pub consecutive: u32,
    /// Whether this makes an anomaly (`consecutive ≥ N` after the warm-up).
    pub anomaly: bool,
}

impl Observation {
    /// A value within the band (or not judged yet).
    fn in_band(baseline: f64, sigma: f64) -> Self {
        Self {
            baseline,
            sigma,
            out_of_band: false,
            consecutive: 0,
            anomaly: false,
        }
    }
}

/// An EWMA baseline with variance and the recent points of one series.
#[derive(Clone, Debug)]
pub struct KpiBaseline {
    count: u32,
    mean: f64,
    /// Welford's M2 during warm-up, the EWMA variance after.
    var: f64,
    streak: u32,
    streak_since: u64,
    /// Mean and M2 (Welford) of the current out-of-band streak: the new level when
    /// re-baselining.
    streak_mean: f64,
    streak_m2: f64,
    /// The baseline (mean, variance) before the last re-baselining and how many more values it
    /// is remembered for (as many as it took to accept the new level: a return after that is a
    /// new change, reported), while the values have not returned to it; and how many values in
    /// a row have.
    earlier: Option<(f64, f64, u32)>,
    returning: u32,
    /// Recent (time, value) pairs: the trend's points.
    recent: VecDeque<(u64, f64)>,
    /// When [`AnomalyDetector::observe_snapshot`] last found the series in a snapshot.
    series_seen_at: u64,
}

impl KpiBaseline {
    /// An empty baseline.
    pub fn new() -> Self {
        Self {
            count: 0,
            mean: 0.0,
            var: 0.0,
            streak: 0,
            streak_since: 0,
            streak_mean: 0.0,
            streak_m2: 0.0,
            earlier: None,
            returning: 0,
            recent: VecDeque::new(),
            series_seen_at: 0,
        }
    }

    /// The baseline mean.
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// The baseline standard deviation.
    pub fn sigma(&self, config: &AnomalyConfig) -> f64 {
        if self.count <= config.warmup {
            if self.count > 1 {
                (self.var / f64::from(self.count - 1)).sqrt()
            } else {
                0.0
            }
        } else {
            self.var.max(0.0).sqrt()
        }
    }

    /// Adds a value observed at `t_unix_nano`. Non-finite values are ignored (`None`).
    pub fn observe(
        &mut self,
        value: f64,
        t_unix_nano: u64,
        config: &AnomalyConfig,
    ) -> Option<Observation> {
        if !value.is_finite() {
            return None;
        }
        let keep = config.trend_points.max(2);
        self.recent.push_back((t_unix_nano, value));
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
        let baseline = self.mean;
        let sigma = self.sigma(config);
        if self.count < config.warmup.max(2) {
            // Welford.
            self.count += 1;
            let d = value - self.mean;
            self.mean += d / f64::from(self.count);
            self.var += d * (value - self.mean);
            return Some(Observation::in_band(baseline, sigma));
        }
        if self.count == config.warmup.max(2) {
            // Switch from Welford's M2 to the EWMA variance.
            self.var /= f64::from(self.count - 1);
            self.count += 1;
        }
        let dev = value - self.mean;
        let out_of_band = beyond(value, self.mean, sigma, config);
        if let Some((_, _, left)) = &mut self.earlier {
            *left = left.saturating_sub(1);
            if *left == 0 {
                self.earlier = None;
            }
        }
        // Back at the level before the last re-baselining: a recovery, not an anomaly.
        if out_of_band
            && let Some((mean, var, _)) = self.earlier
            && !beyond(value, mean, var.max(0.0).sqrt(), config)
        {
            self.streak = 0;
            self.returning += 1;
            if self.returning >= config.consecutive.max(1) {
                (self.mean, self.var) = (mean, var);
                self.earlier = None;
                self.returning = 0;
            }
            return Some(Observation::in_band(baseline, sigma));
        }
        self.returning = 0;
        if out_of_band {
            if self.streak == 0 {
                self.streak_since = t_unix_nano;
                (self.streak_mean, self.streak_m2) = (0.0, 0.0);
            }
            self.streak += 1;
            let d = value - self.streak_mean;
            self.streak_mean += d / f64::from(self.streak);
            self.streak_m2 += d * (value - self.streak_mean);
            if self.streak >= config.rebaseline_after.max(1) {
                self.rebaseline();
            }
        } else {
            self.streak = 0;
            let alpha = config.alpha.clamp(1e-6, 1.0);
            let incr = alpha * dev;
            self.mean += incr;
            self.var = (1.0 - alpha) * (self.var + dev * incr);
        }
        Some(Observation {
            baseline,
            sigma,
            out_of_band,
            consecutive: self.streak,
            anomaly: out_of_band && self.streak >= config.consecutive.max(1),
        })
    }

    /// Accepts the current out-of-band level as the new baseline, remembering the earlier one.
    fn rebaseline(&mut self) {
        self.earlier = Some((self.mean, self.var, self.streak.max(1)));
        self.returning = 0;
        self.mean = self.streak_mean;
        self.var = self.streak_m2 / f64::from(self.streak.max(1));
        self.streak = 0;
    }

    /// The least-squares trend of the last `config.trend_points` values, evaluated at `now`;
    /// `None` with fewer than three points or all at one time.
    pub fn trend(
        &self,
        now_unix_nano: u64,
        slo: Option<SloBound>,
        config: &AnomalyConfig,
    ) -> Option<Trend> {
        let n = config.trend_points.min(self.recent.len());
        if n < 3 {
            return None;
        }
        let pts: Vec<(f64, f64)> = self
            .recent
            .iter()
            .skip(self.recent.len() - n)
            .map(|&(t, v)| (signed_seconds(t, now_unix_nano), v))
            .collect();
        let (slope, intercept) = least_squares(&pts)?;
        // x is seconds relative to now, so the intercept is the fitted value at now.
        let fitted = intercept;
        let crosses_slo_at_unix_nano = slo.and_then(|b| {
            let already = if b.bad_above {
                fitted > b.threshold
            } else {
                fitted < b.threshold
            };
            if already {
                return Some(now_unix_nano);
            }
            let towards = if b.bad_above {
                slope > 0.0
            } else {
                slope < 0.0
            };
            if !towards {
                return None;
            }
            let secs = (b.threshold - fitted) / slope;
            (0.0..1e10)
                .contains(&secs)
                .then(|| now_unix_nano.saturating_add((secs * 1e9) as u64))
        });
        Some(Trend {
            slope_per_second: slope,
            fitted,
            points: n,
            slo,
            crosses_slo_at_unix_nano,
        })
    }
}

impl Default for KpiBaseline {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether `value` is beyond k·σ of `mean` and beyond the relative floor.
fn beyond(value: f64, mean: f64, sigma: f64, config: &AnomalyConfig) -> bool {
    let dev = (value - mean).abs();
    dev > config.k * sigma && dev > config.min_relative_change * mean.abs()
}

/// `t − now` in seconds, signed.
fn signed_seconds(t: u64, now: u64) -> f64 {
    if t >= now {
        (t - now) as f64 / 1e9
    } else {
        -((now - t) as f64 / 1e9)
    }
}

/// Ordinary least squares `y = slope·x + intercept`; `None` when x does not vary.
pub fn least_squares(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some((slope, my - slope * mx))
}

/// Baselines for every (series, KPI) of the snapshots it is fed.
#[derive(Clone, Debug)]
pub struct AnomalyDetector {
    config: AnomalyConfig,
    kpis: Vec<KpiPath>,
    slos: HashMap<KpiPath, SloBound>,
    /// (service, model, operation, KPI) → baseline.
    baselines: HashMap<(String, String, String, KpiPath), KpiBaseline>,
}

impl AnomalyDetector {
    /// A detector; fails on an unknown KPI path in `config.kpis`.
    pub fn new(config: AnomalyConfig) -> Result<Self, ParseError> {
        let kpis = config
            .kpis
            .iter()
            .map(|k| {
                KpiPath::parse(k).map_err(|message| ParseError {
                    input: k.clone(),
                    position: 0,
                    message,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            config,
            kpis,
            slos: HashMap::new(),
            baselines: HashMap::new(),
        })
    }

    /// Sets the SLO trends of `kpi` are projected against.
    pub fn set_slo(&mut self, kpi: KpiPath, bound: SloBound) {
        self.slos.insert(kpi, bound);
    }

    /// Projects `e2e.p95`, `ttft.p95` and `tpot.p95` against the KPI SLOs that are set.
    pub fn with_kpi_slos(mut self, slo: &SloConfig) -> Self {
        use super::expr::{Latency, Stat};
        for (latency, threshold) in [
            (Latency::E2e, slo.e2e_seconds),
            (Latency::Ttft, slo.ttft_seconds),
            (Latency::Tpot, slo.tpot_seconds),
        ] {
            if let Some(threshold) = threshold {
                self.set_slo(
                    KpiPath::Latency(latency, Stat::P95),
                    SloBound {
                        threshold,
                        bad_above: true,
                    },
                );
            }
        }
        self
    }

    /// The configuration.
    pub fn config(&self) -> &AnomalyConfig {
        &self.config
    }

    /// Feeds one value of one series' KPI; returns the anomaly if it is one.
    pub fn observe(
        &mut self,
        service: &str,
        model: &str,
        operation: &str,
        kpi: KpiPath,
        value: f64,
        now_unix_nano: u64,
    ) -> Option<Anomaly> {
        let baseline = self
            .baselines
            .entry((
                service.to_string(),
                model.to_string(),
                operation.to_string(),
                kpi,
            ))
            .or_insert_with(|| KpiBaseline {
                series_seen_at: now_unix_nano,
                ..KpiBaseline::new()
            });
        let obs = baseline.observe(value, now_unix_nano, &self.config)?;
        if !obs.anomaly {
            return None;
        }
        let dev = value - obs.baseline;
        Some(Anomaly {
            service: service.to_string(),
            model: model.to_string(),
            operation: operation.to_string(),
            kpi: kpi.name(),
            value,
            baseline: obs.baseline,
            sigma: obs.sigma,
            deviation_sigmas: if obs.sigma > 0.0 {
                dev / obs.sigma
            } else {
                dev.signum() * f64::INFINITY
            },
            direction: if dev >= 0.0 {
                Direction::Up
            } else {
                Direction::Down
            },
            consecutive: obs.consecutive,
            since_unix_nano: baseline.streak_since,
            trend: baseline.trend(now_unix_nano, self.slos.get(&kpi).copied(), &self.config),
        })
    }

    /// Feeds every watched KPI of every series of a snapshot (one window's values, taken at
    /// `now_unix_nano`); returns the anomalies. A series missing from the snapshot is fed
    /// nothing (its rates fed as 0 would drag its baseline to 0, and make its return an
    /// anomaly); its baselines are forgotten [`FORGET_QUIET_AFTER`] after it was last seen.
    pub fn observe_snapshot(&mut self, snapshot: &KpiSnapshot, now_unix_nano: u64) -> Vec<Anomaly> {
        let mut out = Vec::new();
        let kpis = self.kpis.clone();
        for s in &snapshot.series {
            for kpi in &kpis {
                if let Some(v) = kpi.value(s)
                    && let Some(a) =
                        self.observe(&s.service, &s.model, &s.operation, *kpi, v, now_unix_nano)
                {
                    out.push(a);
                }
            }
        }
        let present: std::collections::HashSet<(&str, &str, &str)> = snapshot
            .series
            .iter()
            .map(|s| (s.service.as_str(), s.model.as_str(), s.operation.as_str()))
            .collect();
        for ((s, m, o, _), b) in &mut self.baselines {
            if present.contains(&(s.as_str(), m.as_str(), o.as_str())) {
                b.series_seen_at = now_unix_nano;
            }
        }
        // Series quiet for longer than FORGET_QUIET_AFTER are forgotten (memory stays bounded).
        let horizon = u64::try_from(FORGET_QUIET_AFTER.as_nanos()).unwrap_or(u64::MAX);
        self.baselines
            .retain(|_, b| now_unix_nano.saturating_sub(b.series_seen_at) <= horizon);
        out
    }

    /// The trend of one series' KPI at `now`, projected against the KPI's SLO if set.
    pub fn trend(
        &self,
        service: &str,
        model: &str,
        operation: &str,
        kpi: KpiPath,
        now_unix_nano: u64,
    ) -> Option<Trend> {
        self.baselines
            .get(&(
                service.to_string(),
                model.to_string(),
                operation.to_string(),
                kpi,
            ))?
            .trend(now_unix_nano, self.slos.get(&kpi).copied(), &self.config)
    }

    /// Forgets series for which `keep(service, model, operation)` is false (call after series
    /// expire, to bound memory).
    pub fn retain_series(&mut self, keep: impl Fn(&str, &str, &str) -> bool) {
        self.baselines.retain(|(s, m, o, _), _| keep(s, m, o));
    }

    /// Baselines kept (one per series and watched KPI).
    pub fn baseline_count(&self) -> usize {
        self.baselines.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_squares_recovers_a_line() {
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 * f64::from(i) + 2.0))
            .collect();
        let (m, b) = least_squares(&pts).unwrap();
        assert!((m - 3.0).abs() < 1e-12 && (b - 2.0).abs() < 1e-12);
        assert!(least_squares(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
    }

    #[test]
    fn warmup_statistics_are_exact() {
        let c = AnomalyConfig::default();
        let mut b = KpiBaseline::new();
        for (i, v) in [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0].iter().enumerate() {
            b.observe(*v, i as u64, &c);
        }
        assert!((b.mean() - 5.0).abs() < 1e-12);
        // Sample variance 32/7.
        assert!((b.sigma(&c) - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
    }
}
