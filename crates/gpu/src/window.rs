//! Time-weighted window statistics over a [`SeqRing`], in O(log n) for means and energy.
//!
//! Samples are *held*: a sample's value applies from its time until the next sample, but for at
//! most `hold` (so a stopped or lost device does not extend its last value forever). For a window
//! `[start, end]`:
//! - the sample at or just before `start` counts (if it is still held at `start`), and so does
//!   every sample in `(start, end)`; a sample exactly at `end` is held from `end` on, so it
//!   belongs to what follows (back-to-back phases share no sample);
//! - the mean of a gauge is `Σ value × held time inside the window / Σ held time inside`; for a
//!   zero-length window it is the value of the sample held at `start`. `NaN` values (not
//!   measured) are skipped field by field;
//! - the max is over the counted samples;
//! - the energy is the difference of the cumulative energy counter linearly interpolated at both
//!   edges (so each pair of consecutive readings spreads its difference uniformly over the time
//!   between them); past the last reading the last pair's rate is extended for at most `hold`.
//!   When the readings at the edges lack the counter, or there is no pair to give a rate, the
//!   energy is the held power × time instead.
//!
//! To make this cheap, the writer ([`Integrator`]) stores in every record, for every field with a
//! mean, the running integral `Σ value × held time` and the running covered time of the samples
//! before it. A window then needs two binary searches and a handful of record reads for its
//! means and energy; the maxima read one block summary per 16 samples inside the window plus the
//! samples at its ragged edges.

use crate::ring::{Record, SeqRing};

/// Where things live in a record of `F` fields.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout<const M: usize, const X: usize> {
    /// Raw fields with a time-weighted mean. Mean `j` keeps its running integral at
    /// `integrals_at + 2j` and its running covered time (ns) at `integrals_at + 2j + 1`.
    pub(crate) means: [usize; M],
    /// First integral field.
    pub(crate) integrals_at: usize,
    /// Raw fields whose max is wanted.
    pub(crate) maxes: [usize; X],
    /// The energy counter (a raw field, cumulative joules) and the position in `means` of the
    /// power gauge used when the counter is missing.
    pub(crate) energy: Option<EnergyFields>,
}

/// The energy counter field and the mean that is power (see [`Layout::energy`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct EnergyFields {
    /// Raw field: cumulative energy in joules (monotonic; wrap and reset already removed).
    pub(crate) counter: usize,
    /// Position in [`Layout::means`] of the power gauge, watts.
    pub(crate) power_mean: usize,
}

/// Records summarised by one block maximum.
pub(crate) const BLOCK: u64 = 16;

/// A ring of records and the ring of their block maxima (record `k` of `blocks` holds the maxima
/// of the `maxes` fields over records `16k ..= 16k + 15`), so a window's maxima cost one read per
/// 16 samples inside the window.
#[derive(Debug)]
pub(crate) struct Series<const F: usize, const X: usize> {
    ring: SeqRing<F>,
    blocks: SeqRing<X>,
}

impl<const F: usize, const X: usize> Series<F, X> {
    /// A series keeping at least `capacity` records.
    pub(crate) fn new(capacity: usize) -> Self {
        let ring = SeqRing::new(capacity);
        let blocks = SeqRing::new(usize::try_from(ring.capacity() / BLOCK).unwrap_or(2));
        Self { ring, blocks }
    }

    /// The records.
    pub(crate) fn ring(&self) -> &SeqRing<F> {
        &self.ring
    }
}

/// Completes records with running integrals before they are pushed, and writes the block
/// maxima. Owned by the single writer.
#[derive(Debug)]
pub(crate) struct Integrator<const F: usize, const M: usize, const X: usize> {
    layout: Layout<M, X>,
    hold: u64,
    prev: Option<Record<F>>,
    pushed: u64,
    block_max: [f64; X],
}

impl<const F: usize, const M: usize, const X: usize> Integrator<F, M, X> {
    /// An integrator holding each sample for at most `hold` ns.
    pub(crate) fn new(layout: Layout<M, X>, hold: u64) -> Self {
        Self {
            layout,
            hold,
            prev: None,
            pushed: 0,
            block_max: [f64::NEG_INFINITY; X],
        }
    }

    /// Fills the integral fields of `record` (raw fields set; time not before the previous
    /// record's) and pushes it; closes a block every [`BLOCK`] records.
    pub(crate) fn push(&mut self, series: &Series<F, X>, mut record: Record<F>) {
        if let Some(p) = &self.prev {
            record.t = record.t.max(p.t);
        }
        for (j, &f) in self.layout.means.iter().enumerate() {
            let (i, w) = (
                self.layout.integrals_at + 2 * j,
                self.layout.integrals_at + 2 * j + 1,
            );
            let (integral, covered) = match &self.prev {
                None => (0.0, 0.0),
                Some(p) => {
                    let held = record.t.saturating_sub(p.t).min(self.hold) as f64;
                    let v = p.v[f];
                    if v.is_nan() {
                        (p.v[i], p.v[w])
                    } else {
                        (p.v[i] + v * held, p.v[w] + held)
                    }
                }
            };
            record.v[i] = integral;
            record.v[w] = covered;
        }
        series.ring.push(&record);
        for (m, &f) in self.block_max.iter_mut().zip(self.layout.maxes.iter()) {
            *m = m.max(record.v[f]);
        }
        self.pushed += 1;
        if X > 0 && self.pushed.is_multiple_of(BLOCK) {
            series.blocks.push(&Record {
                t: record.t,
                v: self.block_max,
            });
            self.block_max = [f64::NEG_INFINITY; X];
        }
        self.prev = Some(record);
    }
}

/// The statistics of one ring over one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Folded<const M: usize, const X: usize> {
    /// Time-weighted means, in the order of [`Layout::means`].
    pub(crate) means: [Option<f64>; M],
    /// Maxima, in the order of [`Layout::maxes`].
    pub(crate) maxes: [Option<f64>; X],
    /// Samples counted.
    pub(crate) samples: u32,
    /// Energy in joules, when a counter or power was available.
    pub(crate) energy: Option<f64>,
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

/// A counter reading, if the value is a number.
fn reading<const F: usize>(r: &Record<F>, field: usize) -> Option<(u64, f64)> {
    let v = r.v[field];
    (!v.is_nan()).then_some((r.t, v))
}

/// Folds the samples of `ring` over `[start, end]` (ns since the ring's epoch); `hold` must be
/// the one the ring's [`Integrator`] used. `None` when no sample counts.
pub(crate) fn fold<const F: usize, const M: usize, const X: usize>(
    series: &Series<F, X>,
    layout: &Layout<M, X>,
    start: u64,
    end: u64,
    hold: u64,
) -> Option<Folded<M, X>> {
    if end < start {
        return None;
    }
    let ring = &series.ring;
    let (lo, written) = ring.bounds();
    // The last sample before `end` (at `end` itself only for a zero-length window).
    let last_counted = if end > start { end - 1 } else { end };
    let nb = ring.last_at_or_before(last_counted, lo, written)?;
    let na = ring
        .last_at_or_before(start, lo, nb + 1)
        .unwrap_or(lo)
        .min(nb);
    let a = ring.read(na)?;
    let b = if nb == na { a } else { ring.read(nb)? };
    let next_t = |n: u64| (n + 1 < written).then(|| ring.read_time(n + 1)).flatten();
    let held = |t: u64, next: Option<u64>| next.map_or(hold, |nt| nt.saturating_sub(t).min(hold));
    let a_next = next_t(na);
    let held_a = held(a.t, a_next);
    let b_next = if nb == na { a_next } else { next_t(nb) };
    let held_b = held(b.t, b_next);

    let a_counted = a.t > start || a.t + held_a > start;
    let samples = u32::try_from(nb - na + 1).unwrap_or(u32::MAX) - u32::from(!a_counted);
    if samples == 0 {
        return None;
    }

    // Integral up to time `t` (≥ the record's time) for mean `j`: (∫ value dt, covered ns).
    let upto = |r: &Record<F>, held_r: u64, j: usize, t: u64| -> (f64, f64) {
        let f = layout.means[j];
        let (i, w) = (layout.integrals_at + 2 * j, layout.integrals_at + 2 * j + 1);
        let v = r.v[f];
        if v.is_nan() {
            (r.v[i], r.v[w])
        } else {
            let d = t.saturating_sub(r.t).min(held_r) as f64;
            (r.v[i] + v * d, r.v[w] + d)
        }
    };
    let mut means = [None; M];
    let mut power_integral = None;
    for (j, mean) in means.iter_mut().enumerate() {
        let (ia, wa) = upto(&a, held_a, j, start.max(a.t));
        let (ib, wb) = upto(&b, held_b, j, end);
        let (di, dw) = (ib - ia, wb - wa);
        let f = layout.means[j];
        *mean = if dw > 0.0 {
            Some(di / dw)
        } else {
            (a_counted && !a.v[f].is_nan()).then_some(a.v[f])
        };
        if layout.energy.is_some_and(|e| e.power_mean == j) && (dw > 0.0 || mean.is_some()) {
            power_integral = Some(di);
        }
    }

    let mut maxes = [f64::NEG_INFINITY; X];
    if X > 0 {
        let mut n = if a_counted { na } else { na + 1 };
        while n <= nb {
            // A whole block inside the range: its summary (if not overwritten yet).
            if n.is_multiple_of(BLOCK)
                && n + BLOCK - 1 <= nb
                && let Some(block) = series.blocks.read(n / BLOCK)
            {
                for (m, v) in maxes.iter_mut().zip(block.v) {
                    *m = m.max(v);
                }
                n += BLOCK;
                continue;
            }
            if let Some(r) = ring.read_fields(n, &layout.maxes) {
                for (m, v) in maxes.iter_mut().zip(r.v) {
                    *m = m.max(v); // NaN (not measured) is ignored by `max`
                }
            }
            n += 1;
        }
    }

    let energy = layout.energy.and_then(|ef| {
        let by_counter = || -> Option<f64> {
            let c = ef.counter;
            let ca = reading(&a, c)?;
            let cb = reading(&b, c)?;
            // The rate of the pair ending at `b` (or at `a` when the window has one reading).
            let tail_rate = || -> Option<f64> {
                let before = nb.checked_sub(1).filter(|n| *n >= lo)?;
                rate(reading(&ring.read(before)?, c)?, cb)
            };
            let after = |n: u64| -> Option<(u64, f64)> {
                (n + 1 < written)
                    .then(|| ring.read(n + 1))
                    .flatten()
                    .and_then(|r| reading(&r, c))
            };
            let at_start = if ca.0 >= start {
                ca.1
            } else if na < nb {
                interpolate(ca, after(na)?, start)
            } else {
                match after(na) {
                    Some(next) => interpolate(ca, next, start),
                    None => extrapolate(ca, tail_rate()?, start, hold),
                }
            };
            let at_end = match after(nb) {
                Some(next) => interpolate(cb, next, end),
                None if end <= cb.0 => cb.1,
                None => extrapolate(cb, tail_rate()?, end, hold),
            };
            Some((at_end - at_start).max(0.0))
        };
        by_counter().or(power_integral.map(|i| i / 1e9))
    });

    Some(Folded {
        means,
        maxes: maxes.map(|m| (m != f64::NEG_INFINITY).then_some(m)),
        samples,
        energy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    /// Raw fields: [utilisation, energy counter J, power W]; integrals at 3..7.
    const LAYOUT: Layout<2, 2> = Layout {
        means: [0, 2],
        integrals_at: 3,
        maxes: [0, 2],
        energy: Some(EnergyFields {
            counter: 1,
            power_mean: 1,
        }),
    };

    fn ring(hold_ms: u64, samples: &[(u64, [f64; 3])]) -> Series<7, 2> {
        let ring = Series::new(256);
        let mut w = Integrator::<7, 2, 2>::new(LAYOUT, hold_ms * MS);
        for (t_ms, v) in samples {
            let mut r = Record {
                t: t_ms * MS,
                v: [f64::NAN; 7],
            };
            r.v[..3].copy_from_slice(v);
            w.push(&ring, r);
        }
        ring
    }

    fn fold_ms(r: &Series<7, 2>, s: u64, e: u64, hold_ms: u64) -> Option<Folded<2, 2>> {
        fold(r, &LAYOUT, s * MS, e * MS, hold_ms * MS)
    }

    fn approx(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    fn four(hold_ms: u64) -> Series<7, 2> {
        // Samples every 100 ms; the counter grows 10, 20, 30 J per interval.
        ring(
            hold_ms,
            &[
                (0, [0.2, 0.0, 100.0]),
                (100, [0.4, 10.0, 200.0]),
                (200, [0.6, 30.0, 300.0]),
                (300, [0.8, 60.0, 300.0]),
            ],
        )
    }

    #[test]
    fn empty_ring_or_window_before_every_sample_gives_none() {
        assert_eq!(fold_ms(&ring(500, &[]), 0, 100, 500), None);
        let r = ring(500, &[(500, [0.5, 0.0, 1.0])]);
        assert_eq!(fold_ms(&r, 100, 200, 500), None);
        // Inverted window.
        assert_eq!(fold_ms(&four(500), 200, 100, 500), None);
    }

    #[test]
    fn a_stale_sample_does_not_count() {
        let r = ring(500, &[(0, [0.5, 0.0, 1.0])]);
        // Held for 500 ms only: a window at 600–700 ms has no data.
        assert_eq!(fold_ms(&r, 600, 700, 500), None);
    }

    #[test]
    fn one_sample_before_start_is_held_over_the_window() {
        let r = ring(500, &[(0, [0.5, 7.0, 40.0])]);
        let f = fold_ms(&r, 100, 300, 500).unwrap();
        assert_eq!(f.samples, 1);
        approx(f.means[0].unwrap(), 0.5);
        approx(f.maxes[0].unwrap(), 0.5);
        // One counter reading gives no rate: energy = held power 40 W × 0.2 s.
        approx(f.energy.unwrap(), 8.0);
    }

    #[test]
    fn zero_length_window_takes_the_held_sample() {
        let f = fold_ms(&four(500), 150, 150, 500).unwrap();
        assert_eq!(f.samples, 1);
        approx(f.means[0].unwrap(), 0.4);
        approx(f.energy.unwrap(), 0.0);
    }

    #[test]
    fn samples_straddling_both_edges() {
        // [50, 250]: 0.2 × 50 + 0.4 × 100 + 0.6 × 50 = 80 → mean 0.4 over 200 ms.
        let f = fold_ms(&four(500), 50, 250, 500).unwrap();
        assert_eq!(f.samples, 3);
        approx(f.means[0].unwrap(), 0.4);
        approx(f.maxes[0].unwrap(), 0.6);
        // Counter interpolated: E(50) = 5, E(250) = 30 + 30 × 0.5 = 45 → 40 J.
        approx(f.energy.unwrap(), 40.0);
        // Power: (100 × 50 + 200 × 100 + 300 × 50) / 200 = 200 W.
        approx(f.means[1].unwrap(), 200.0);
        approx(f.maxes[1].unwrap(), 300.0);
    }

    #[test]
    fn window_on_sample_boundaries() {
        // [100, 200]: sample 100 held 100 ms; sample 200 starts at `end`: it belongs to the
        // next window, not this one.
        let f = fold_ms(&four(500), 100, 200, 500).unwrap();
        assert_eq!(f.samples, 1);
        approx(f.means[0].unwrap(), 0.4);
        approx(f.maxes[0].unwrap(), 0.4);
        approx(f.energy.unwrap(), 20.0);
        // Back-to-back windows share no sample and split the energy exactly.
        let g = fold_ms(&four(500), 200, 300, 500).unwrap();
        assert_eq!(g.samples, 1);
        approx(g.maxes[0].unwrap(), 0.6);
        approx(f.energy.unwrap() + g.energy.unwrap(), 50.0);
    }

    #[test]
    fn window_past_the_last_sample_extrapolates_for_at_most_hold() {
        // Last sample at 300 (rate 30 J / 100 ms); window [250, 1000], hold 200 ms:
        // util: 0.6 × 50 + 0.8 × 200 = 190 over 250 → 0.76.
        // energy: 45→60 (15 J) + 0.3 J/ms × 200 ms (60 J) = 75 J.
        let f = fold_ms(&four(200), 250, 1000, 200).unwrap();
        assert_eq!(f.samples, 2);
        approx(f.means[0].unwrap(), 0.76);
        approx(f.energy.unwrap(), 75.0);
    }

    #[test]
    fn a_window_after_all_pairs_still_uses_the_last_rate() {
        // Window [320, 400] starts after the last sample: rate from the pair before it.
        let f = fold_ms(&four(500), 320, 400, 500).unwrap();
        assert_eq!(f.samples, 1);
        approx(f.energy.unwrap(), 0.3 * 80.0);
        approx(f.means[0].unwrap(), 0.8);
    }

    #[test]
    fn nan_fields_are_skipped_and_power_fills_a_missing_counter() {
        let r = ring(
            500,
            &[
                (0, [f64::NAN, f64::NAN, 100.0]),
                (100, [0.5, f64::NAN, 200.0]),
            ],
        );
        let f = fold_ms(&r, 0, 200, 500).unwrap();
        assert_eq!(f.samples, 2);
        approx(f.means[0].unwrap(), 0.5);
        approx(f.maxes[0].unwrap(), 0.5);
        // No counter: 100 W × 0.1 s + 200 W × 0.1 s.
        approx(f.energy.unwrap(), 30.0);
    }

    #[test]
    fn a_missing_counter_inside_the_window_does_not_lose_energy() {
        // The counter is cumulative: a reading skipped in the middle changes nothing.
        let r = ring(
            500,
            &[
                (0, [0.0, 0.0, 1.0]),
                (100, [0.0, f64::NAN, 1.0]),
                (200, [0.0, 20.0, 1.0]),
                (300, [0.0, 30.0, 1.0]),
            ],
        );
        approx(fold_ms(&r, 0, 250, 500).unwrap().energy.unwrap(), 25.0);
    }

    #[test]
    fn mean_is_time_weighted_not_sample_weighted() {
        // 0.0 held 900 ms, 1.0 held 100 ms → 0.1 (the plain mean would be 0.5).
        let r = ring(2000, &[(0, [0.0, 0.0, 0.0]), (900, [1.0, 0.0, 0.0])]);
        let f = fold_ms(&r, 0, 1000, 2000).unwrap();
        approx(f.means[0].unwrap(), 0.1);
    }

    #[test]
    fn only_the_retained_samples_count_after_wraparound() {
        let r = Series::<7, 2>::new(4);
        let mut w = Integrator::<7, 2, 2>::new(LAYOUT, 500 * MS);
        for i in 0..10u64 {
            let mut v = [f64::NAN; 7];
            v[0] = i as f64;
            w.push(&r, Record { t: i * 100 * MS, v });
        }
        // Samples 0..=5 are gone; [0, 1000] sees 6, 7, 8, 9.
        let f = fold_ms(&r, 0, 1000, 500).unwrap();
        assert_eq!(f.samples, 4);
        approx(f.maxes[0].unwrap(), 9.0);
        // 6, 7, 8 held 100 ms each, 9 held 100 ms (to 1000) → 7.5.
        approx(f.means[0].unwrap(), 7.5);
        assert_eq!(f.energy, None);
    }

    #[test]
    fn block_maxima_agree_with_a_scan_for_every_window() {
        // 200 samples (12 full blocks and a partial one), a spike every 37 samples.
        let samples: Vec<(u64, [f64; 3])> = (0..200u64)
            .map(|i| {
                let u = if i % 37 == 5 {
                    0.9 + i as f64 / 1000.0
                } else {
                    0.1
                };
                (i * 10, [u, 0.0, (i % 23) as f64])
            })
            .collect();
        let r = ring(50, &samples);
        for (s, e) in [
            (0, 2000),
            (155, 1605),
            (160, 320),
            (163, 170),
            (1000, 1990),
            (55, 60),
        ] {
            let f = fold_ms(&r, s, e, 50).unwrap();
            let inside = samples
                .iter()
                .filter(|(t, _)| *t < e && (*t >= s || t + 10 > s));
            let (mut u, mut p) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
            for (_, v) in inside {
                u = u.max(v[0]);
                p = p.max(v[2]);
            }
            approx(f.maxes[0].unwrap(), u);
            approx(f.maxes[1].unwrap(), p);
        }
    }

    #[test]
    fn a_gap_longer_than_hold_is_not_covered() {
        // 1.0 at 0 held 200 ms; 0.0 from 1000: [0, 1200] covers 200 + 200 ms → mean 0.5.
        let r = ring(200, &[(0, [1.0, 0.0, 0.0]), (1000, [0.0, 0.0, 0.0])]);
        let f = fold_ms(&r, 0, 1200, 200).unwrap();
        approx(f.means[0].unwrap(), 0.5);
        assert_eq!(f.samples, 2);
    }

    #[test]
    fn matches_a_brute_force_integral_on_irregular_samples() {
        // Irregular times and values; compare with a millisecond-step numerical integral.
        let pts: Vec<(u64, f64)> = (0..40u64)
            .scan(0u64, |t, i| {
                *t += 37 + (i * 53) % 150;
                Some((*t, ((i * 7919) % 101) as f64 / 100.0))
            })
            .collect();
        let hold = 120;
        let samples: Vec<(u64, [f64; 3])> = pts.iter().map(|(t, v)| (*t, [*v, 0.0, 0.0])).collect();
        let r = ring(hold, &samples);
        for (s, e) in [
            (0, 3000),
            (500, 900),
            (1234, 4321),
            (2000, 2001),
            (90, 6000),
        ] {
            let f = fold_ms(&r, s, e, hold);
            // Brute force: value held at each ms step in [s, e).
            let (mut sum, mut covered) = (0.0, 0u64);
            for t in s..e {
                let held = pts.iter().rev().find(|(pt, _)| *pt <= t).filter(|(pt, _)| {
                    let next = pts.iter().find(|(nt, _)| nt > pt).map(|(nt, _)| *nt);
                    t < next.unwrap_or(u64::MAX).min(pt + hold)
                });
                if let Some((_, v)) = held {
                    sum += v;
                    covered += 1;
                }
            }
            if covered == 0 {
                continue;
            }
            let mean = f.unwrap().means[0].unwrap();
            assert!(
                (mean - sum / covered as f64).abs() < 1e-9,
                "[{s}, {e}]: {mean}"
            );
        }
    }
}
