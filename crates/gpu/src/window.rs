//! Time-weighted window statistics over a [`SeqRing`].
//!
//! Samples are *held*: a sample's value applies from its time until the next sample, but for at
//! most `hold` (so a stopped or lost device does not extend its last value forever). For a window
//! `[start, end]`:
//! - the sample at or just before `start` counts (if it is still held at `start`), and so does
//!   every sample in `(start, end]`;
//! - the mean of a gauge is `Σ value × held time inside the window / Σ held time inside`; for a
//!   zero-length window (or one whose only sample lands exactly on `end`) it is the plain mean of
//!   the counted samples; the max is over the counted samples; `NaN` values (not measured) are
//!   skipped field by field;
//! - the energy is the difference of the cumulative energy counter linearly interpolated at both
//!   edges (so each pair of consecutive readings spreads its difference uniformly over the time
//!   between them); past the last reading the last pair's rate is extended for at most `hold`.
//!   When a reading in the window lacks the counter, or there is no pair to give a rate, the
//!   energy is the held power × time instead.
//!
//! The cost is one binary search plus one pass over the samples in the window, reading only the
//! fields asked for; the energy needs only the readings at the edges.

use crate::ring::{Record, SeqRing};

/// Mean and max of one gauge over a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GaugeAcc {
    weighted: f64,
    weight: f64,
    plain: f64,
    count: u32,
    max: f64,
}

impl Default for GaugeAcc {
    fn default() -> Self {
        Self {
            weighted: 0.0,
            weight: 0.0,
            plain: 0.0,
            count: 0,
            max: f64::NEG_INFINITY,
        }
    }
}

impl GaugeAcc {
    #[inline]
    fn add(&mut self, value: f64, weight: f64) {
        if value.is_nan() {
            return;
        }
        self.weighted += value * weight;
        self.weight += weight;
        self.plain += value;
        self.max = self.max.max(value);
        self.count += 1;
    }

    /// Time-weighted mean (plain mean when no time was covered), `None` without values.
    pub(crate) fn mean(&self) -> Option<f64> {
        if self.count == 0 {
            None
        } else if self.weight > 0.0 {
            Some(self.weighted / self.weight)
        } else {
            Some(self.plain / f64::from(self.count))
        }
    }

    /// Max of the counted values, `None` without values.
    pub(crate) fn max(&self) -> Option<f64> {
        (self.count > 0).then_some(self.max)
    }

    /// `Σ value × held ns`.
    fn integral(&self) -> f64 {
        self.weighted
    }
}

/// Which of the folded fields (positions in the `fields` list given to [`fold`]) are the energy
/// counter and the power gauge.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EnergyFields {
    /// Cumulative energy in joules (monotonic; wrap and reset already removed).
    pub(crate) counter: usize,
    /// Power in watts.
    pub(crate) power: usize,
}

/// The statistics of one ring over one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Folded<const G: usize> {
    /// Per field, in the order asked for.
    pub(crate) gauges: [GaugeAcc; G],
    /// Samples counted.
    pub(crate) samples: u32,
    /// Energy in joules, when a counter or power was available.
    pub(crate) energy: Option<f64>,
}

#[inline]
fn overlap(a0: u64, a1: u64, start: u64, end: u64) -> u64 {
    a1.min(end).saturating_sub(a0.max(start))
}

/// Counter value at `t` on the line through readings `a` and `b` (`t` clamped into `[a.t, b.t]`).
fn interpolate(a: (u64, f64), b: (u64, f64), t: u64) -> f64 {
    let span = b.0.saturating_sub(a.0);
    if span == 0 {
        return b.1;
    }
    let t = t.clamp(a.0, b.0);
    a.1 + (b.1 - a.1) * (t - a.0) as f64 / span as f64
}

/// Counter value at `t >= last.0`, extending `rate` (J/ns) for at most `hold`.
fn extrapolate(last: (u64, f64), rate: f64, t: u64, hold: u64) -> f64 {
    last.1 + rate * t.saturating_sub(last.0).min(hold) as f64
}

fn rate(a: (u64, f64), b: (u64, f64)) -> Option<f64> {
    let span = b.0.saturating_sub(a.0);
    (span > 0).then(|| (b.1 - a.1).max(0.0) / span as f64)
}

/// Folds the fields `fields` of the samples of `ring` over `[start, end]` (ns since the ring's
/// epoch); the result's gauges are in the order of `fields`. `None` when no sample counts.
pub(crate) fn fold<const F: usize, const G: usize>(
    ring: &SeqRing<F>,
    fields: &[usize; G],
    start: u64,
    end: u64,
    hold: u64,
    energy_fields: Option<EnergyFields>,
) -> Option<Folded<G>> {
    if end < start {
        return None;
    }
    let (lo, written) = ring.bounds();
    let first = ring.last_at_or_before(start, lo, written).unwrap_or(lo);
    let mut gauges = [GaugeAcc::default(); G];
    let mut samples = 0u32;

    // Counter readings `(t, joules)` needed at the edges.
    let counter = energy_fields.map(|ef| ef.counter);
    let c = |r: &Record<G>| counter.map(|i| (r.t, r.v[i]));
    let mut counter_ok = counter.is_some();
    let mut r0: Option<(u64, f64)> = None; // first record read
    let mut r1: Option<(u64, f64)> = None; // second record read
    let mut before_last: Option<(u64, f64)> = None;
    let mut after_end: Option<(u64, f64)> = None;
    // A pair just before the first record gives the rate when the window has a single reading.
    let mut pre_rate = None;
    if counter.is_some()
        && first > lo
        && let (Some(a), Some(b)) = (
            ring.read_fields(first - 1, fields),
            ring.read_fields(first, fields),
        )
        && let (Some(a), Some(b)) = (c(&a), c(&b))
        && !a.1.is_nan()
        && !b.1.is_nan()
    {
        pre_rate = rate(a, b);
    }

    let mut prev: Option<Record<G>> = None;
    let mut n = first;
    while n < written {
        let Some(r) = ring.read_fields(n, fields) else {
            // Overwritten while we read: everything before it is gone too.
            prev = None;
            n += 1;
            continue;
        };
        if let Some(p) = prev.take() {
            segment(&p, Some(r.t), start, end, hold, &mut gauges, &mut samples);
            before_last = c(&p);
        }
        if let Some(rc) = c(&r) {
            counter_ok &= !rc.1.is_nan();
            if r0.is_none() {
                r0 = Some(rc);
            } else if r1.is_none() {
                r1 = Some(rc);
            }
        }
        if r.t > end {
            after_end = c(&r);
            break;
        }
        prev = Some(r);
        n += 1;
    }
    let last = prev.as_ref().and_then(c);
    if let Some(p) = &prev {
        segment(p, None, start, end, hold, &mut gauges, &mut samples);
    }
    if samples == 0 {
        return None;
    }

    let energy = energy_fields.and_then(|ef| {
        let by_counter = || -> Option<f64> {
            let a0 = r0?;
            // The rate of the pair ending at the last reading (or the pair before the window).
            let tail_rate = match (before_last, last) {
                (Some(b), Some(l)) => rate(b, l),
                _ => pre_rate,
            };
            let at_start = match r1 {
                _ if a0.0 > start => a0.1,
                Some(a1) => interpolate(a0, a1, start),
                None => extrapolate(a0, tail_rate?, start, hold),
            };
            let at_end = match (after_end, before_last, last) {
                (Some(after), Some(b), None) => interpolate(b, after, end),
                (Some(after), None, None) => interpolate(a0, after, end),
                (_, _, Some(l)) => extrapolate(l, tail_rate?, end, hold),
                _ => return None,
            };
            Some((at_end - at_start).max(0.0))
        };
        if counter_ok && let Some(e) = by_counter() {
            return Some(e);
        }
        let power = &gauges[ef.power];
        (power.count > 0).then(|| power.integral() / 1e9)
    });
    Some(Folded {
        gauges,
        samples,
        energy,
    })
}

/// Accounts for the gauges of sample `a`, whose successor (if any) is at `next_t`.
#[inline]
fn segment<const G: usize>(
    a: &Record<G>,
    next_t: Option<u64>,
    start: u64,
    end: u64,
    hold: u64,
    gauges: &mut [GaugeAcc; G],
    samples: &mut u32,
) {
    let held_until = match next_t {
        Some(t) => t.min(a.t.saturating_add(hold)),
        None => a.t.saturating_add(hold),
    };
    if a.t > end || (a.t <= start && held_until <= start) {
        return;
    }
    let held = overlap(a.t, held_until, start, end) as f64;
    *samples += 1;
    for (acc, value) in gauges.iter_mut().zip(a.v.iter()) {
        acc.add(*value, held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const ALL: [usize; 3] = [0, 1, 2];
    const EF: Option<EnergyFields> = Some(EnergyFields {
        counter: 1,
        power: 2,
    });

    /// Fields: [utilisation, energy counter J, power W].
    fn ring(samples: &[(u64, [f64; 3])]) -> SeqRing<3> {
        let ring = SeqRing::new(64);
        for (t_ms, v) in samples {
            ring.push(&Record {
                t: t_ms * MS,
                v: *v,
            });
        }
        ring
    }

    fn approx(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    fn four() -> SeqRing<3> {
        // Samples every 100 ms; the counter grows 10, 20, 30 J per interval.
        ring(&[
            (0, [0.2, 0.0, 100.0]),
            (100, [0.4, 10.0, 200.0]),
            (200, [0.6, 30.0, 300.0]),
            (300, [0.8, 60.0, 300.0]),
        ])
    }

    #[test]
    fn empty_ring_or_window_before_every_sample_gives_none() {
        assert_eq!(fold(&ring(&[]), &ALL, 0, 100 * MS, 500 * MS, EF), None);
        let r = ring(&[(500, [0.5, 0.0, 1.0])]);
        assert_eq!(fold(&r, &ALL, 100 * MS, 200 * MS, 500 * MS, EF), None);
        // Inverted window.
        assert_eq!(fold(&four(), &ALL, 200 * MS, 100 * MS, 500 * MS, EF), None);
    }

    #[test]
    fn a_stale_sample_does_not_count() {
        let r = ring(&[(0, [0.5, 0.0, 1.0])]);
        // Held for 500 ms only: a window at 600–700 ms has no data.
        assert_eq!(fold(&r, &ALL, 600 * MS, 700 * MS, 500 * MS, EF), None);
    }

    #[test]
    fn one_sample_before_start_is_held_over_the_window() {
        let r = ring(&[(0, [0.5, 7.0, 40.0])]);
        let f = fold(&r, &ALL, 100 * MS, 300 * MS, 500 * MS, EF).unwrap();
        assert_eq!(f.samples, 1);
        approx(f.gauges[0].mean().unwrap(), 0.5);
        approx(f.gauges[0].max().unwrap(), 0.5);
        // One counter reading gives no rate: energy = held power 40 W × 0.2 s.
        approx(f.energy.unwrap(), 8.0);
    }

    #[test]
    fn zero_length_window_takes_the_held_sample() {
        let f = fold(&four(), &ALL, 150 * MS, 150 * MS, 500 * MS, EF).unwrap();
        assert_eq!(f.samples, 1);
        approx(f.gauges[0].mean().unwrap(), 0.4);
        approx(f.energy.unwrap(), 0.0);
    }

    #[test]
    fn samples_straddling_both_edges() {
        // [50, 250]: 0.2 × 50 + 0.4 × 100 + 0.6 × 50 = 80 → mean 0.4 over 200 ms.
        let f = fold(&four(), &ALL, 50 * MS, 250 * MS, 500 * MS, EF).unwrap();
        assert_eq!(f.samples, 3);
        approx(f.gauges[0].mean().unwrap(), 0.4);
        approx(f.gauges[0].max().unwrap(), 0.6);
        // Counter interpolated: E(50) = 5, E(250) = 30 + 30 × 0.5 = 45 → 40 J.
        approx(f.energy.unwrap(), 40.0);
        // Power: (100 × 50 + 200 × 100 + 300 × 50) / 200 = 200 W.
        approx(f.gauges[2].mean().unwrap(), 200.0);
    }

    #[test]
    fn window_on_sample_boundaries() {
        // [100, 200]: sample 100 held 100 ms; sample 200 counts (lands on end) with no time.
        let f = fold(&four(), &ALL, 100 * MS, 200 * MS, 500 * MS, EF).unwrap();
        assert_eq!(f.samples, 2);
        approx(f.gauges[0].mean().unwrap(), 0.4);
        approx(f.gauges[0].max().unwrap(), 0.6);
        approx(f.energy.unwrap(), 20.0);
    }

    #[test]
    fn window_past_the_last_sample_extrapolates_for_at_most_hold() {
        // Last sample at 300 (rate 30 J / 100 ms); window [250, 1000], hold 200 ms:
        // util: 0.6 × 50 + 0.8 × 200 = 190 over 250 → 0.76.
        // energy: 45→60 (15 J) + 0.3 J/ms × 200 ms (60 J) = 75 J.
        let f = fold(&four(), &ALL, 250 * MS, 1000 * MS, 200 * MS, EF).unwrap();
        assert_eq!(f.samples, 2);
        approx(f.gauges[0].mean().unwrap(), 0.76);
        approx(f.energy.unwrap(), 75.0);
    }

    #[test]
    fn a_window_after_all_pairs_still_uses_the_last_rate() {
        // Window [320, 400] starts after the last sample: rate from the pair before it.
        let f = fold(&four(), &ALL, 320 * MS, 400 * MS, 500 * MS, EF).unwrap();
        assert_eq!(f.samples, 1);
        approx(f.energy.unwrap(), 0.3 * 80.0);
    }

    #[test]
    fn nan_fields_are_skipped_and_power_fills_missing_counter_pairs() {
        let r = ring(&[
            (0, [f64::NAN, f64::NAN, 100.0]),
            (100, [0.5, f64::NAN, 200.0]),
        ]);
        let f = fold(&r, &ALL, 0, 200 * MS, 500 * MS, EF).unwrap();
        assert_eq!(f.samples, 2);
        approx(f.gauges[0].mean().unwrap(), 0.5);
        // No counter: 100 W × 0.1 s + 200 W × 0.1 s.
        approx(f.energy.unwrap(), 30.0);
    }

    #[test]
    fn mean_is_time_weighted_not_sample_weighted() {
        // 0.0 held 900 ms, 1.0 held 100 ms → 0.1 (the plain mean would be 0.5).
        let r = ring(&[(0, [0.0, 0.0, 0.0]), (900, [1.0, 0.0, 0.0])]);
        let f = fold(&r, &ALL, 0, 1000 * MS, 2000 * MS, None).unwrap();
        approx(f.gauges[0].mean().unwrap(), 0.1);
        assert_eq!(f.energy, None);
    }

    #[test]
    fn only_the_retained_samples_count_after_wraparound() {
        let r = SeqRing::<3>::new(4);
        for i in 0..10u64 {
            r.push(&Record {
                t: i * 100 * MS,
                v: [i as f64, 0.0, 0.0],
            });
        }
        // Samples 0..=5 are gone; [0, 1000] sees 6, 7, 8, 9.
        let f = fold(&r, &ALL, 0, 1000 * MS, 500 * MS, None).unwrap();
        assert_eq!(f.samples, 4);
        approx(f.gauges[0].max().unwrap(), 9.0);
        // 6, 7, 8 held 100 ms each, 9 held 100 ms (to 1000) → 7.5.
        approx(f.gauges[0].mean().unwrap(), 7.5);
    }
}
