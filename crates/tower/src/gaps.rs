//! [`GapHistogram`]: inter-chunk gap statistics (p50, p99, max) without storing every gap.
//!
//! Gaps are in ticks of the [`tick_clock`](crate::tick_clock) (TSC cycles, or nanoseconds where
//! there is no invariant TSC) and are counted in fixed log-linear buckets: 8 linear sub-buckets
//! per power of two, from 2^10 to 2^40 ticks (≈ 0.3 µs to ≈ 5 min at 3.5 GHz; 1 µs to 18 min in
//! nanoseconds), plus an underflow and an overflow bucket.
//! A quantile is the midpoint of the bucket holding its rank, clamped to the exact minimum and
//! maximum, so its relative error is at most 1/16 (6.25 %) inside the range, and exact when all
//! gaps fall in one bucket's clamp (e.g. equal gaps) and when its rank is the first or the last
//! (a p99 of fewer than 100 gaps is the largest). Recording is a `leading_zeros`, a shift and
//! an increment; the table (968 bytes) is allocated only once a response has a second chunk.

/// Sub-bucket bits: 2^3 = 8 sub-buckets per octave.
const SUB_BITS: u32 = 3;
const SUBS: u64 = 1 << SUB_BITS;
/// Smallest octave tracked: 2^10 ticks.
const MIN_EXP: u32 = 10;
/// First octave not tracked: 2^40 ticks.
const MAX_EXP: u32 = 40;
/// Underflow + tracked + overflow buckets.
const BUCKETS: usize = 2 + ((MAX_EXP - MIN_EXP) as usize) * (SUBS as usize);

/// Counts of gaps (ticks) in log-linear buckets, plus the exact min and max.
#[derive(Clone, Debug)]
pub(crate) struct GapHistogram {
    counts: [u32; BUCKETS],
    total: u64,
    min: u64,
    max: u64,
}

impl Default for GapHistogram {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
            total: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

fn bucket_of(t: u64) -> usize {
    if t < (1 << MIN_EXP) {
        return 0;
    }
    let exp = 63 - t.leading_zeros();
    if exp >= MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (t >> (exp - SUB_BITS)) & (SUBS - 1);
    1 + ((exp - MIN_EXP) as usize) * (SUBS as usize) + sub as usize
}

/// `[low, high)` of a tracked bucket (1 ..= BUCKETS - 2), in ticks.
fn bounds_of(bucket: usize) -> (u64, u64) {
    let k = (bucket - 1) as u64;
    let exp = MIN_EXP as u64 + k / SUBS;
    let sub = k % SUBS;
    let unit = 1u64 << (exp - SUB_BITS as u64);
    ((SUBS + sub) * unit, (SUBS + sub + 1) * unit)
}

impl GapHistogram {
    /// Adds one gap.
    #[inline]
    pub(crate) fn record(&mut self, t: u64) {
        let b = bucket_of(t);
        self.counts[b] = self.counts[b].saturating_add(1);
        self.total += 1;
        self.min = self.min.min(t);
        self.max = self.max.max(t);
    }

    /// Gaps recorded.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.total
    }

    /// Largest gap, ticks (`None` when empty).
    pub(crate) fn max(&self) -> Option<u64> {
        (self.total > 0).then_some(self.max)
    }

    /// The `q`-quantile (0–1) in ticks, nearest-rank, estimated as described in the module docs.
    pub(crate) fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let q = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        // Nearest rank, 1-based: ceil(q * n), at least 1.
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        // The ends are known exactly: a p99 of fewer than 100 gaps is the largest.
        if rank == self.total {
            return Some(self.max);
        }
        if rank == 1 {
            return Some(self.min);
        }
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                let estimate = if b == 0 {
                    self.min
                } else if b == BUCKETS - 1 {
                    self.max
                } else {
                    let (lo, hi) = bounds_of(b);
                    lo + (hi - lo) / 2
                };
                return Some(estimate.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values() {
        for t in [
            1_024u64,
            1_500,
            2_047,
            2_048,
            999_999,
            1_000_000_000,
            (1 << 40) - 1,
        ] {
            let b = bucket_of(t);
            assert!(b > 0 && b < BUCKETS - 1, "{t} → {b}");
            let (lo, hi) = bounds_of(b);
            assert!(lo <= t && t < hi, "{t} not in [{lo}, {hi})");
        }
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1_023), 0);
        assert_eq!(bucket_of(1 << 40), BUCKETS - 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_within_stated_error_against_sorted_truth() {
        // Deterministic spread of gaps from 10 µs to ~100 ms (a simple LCG, no extra deps).
        let mut x: u64 = 42;
        let mut gaps = Vec::new();
        let mut h = GapHistogram::default();
        for _ in 0..5_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let t = 10_000 + (x >> 33) % 100_000_000;
            gaps.push(t);
            h.record(t);
        }
        gaps.sort_unstable();
        for q in [0.5, 0.9, 0.99] {
            let rank = ((q * gaps.len() as f64).ceil() as usize).max(1);
            let truth = gaps[rank - 1] as f64;
            let est = h.quantile(q).unwrap() as f64;
            let err = (est - truth).abs() / truth;
            assert!(err <= 0.0625, "q={q}: est {est} truth {truth} err {err}");
        }
        assert_eq!(h.max(), gaps.last().copied());
        assert_eq!(h.count(), 5_000);
    }

    #[test]
    fn equal_gaps_are_exact() {
        let mut h = GapHistogram::default();
        for _ in 0..10 {
            h.record(20_000_000);
        }
        assert_eq!(h.quantile(0.5), Some(20_000_000));
        assert_eq!(h.quantile(0.99), Some(20_000_000));
    }

    /// Nine gaps a little apart: the p99's rank is the last, and it reads the largest gap
    /// itself, not a bucket's midpoint below eight of them (a review's case).
    #[test]
    fn a_quantile_at_either_end_is_exact() {
        let mut h = GapHistogram::default();
        let gaps = [50_400_000, 51_400_000, 51_450_000, 51_500_000, 51_520_000];
        for g in gaps
            .iter()
            .chain(&[51_530_000, 51_540_000, 51_560_000, 51_600_000])
        {
            h.record(*g);
        }
        assert_eq!(h.quantile(0.99), Some(51_600_000));
        assert_eq!(h.quantile(0.0), Some(50_400_000));
        let p50 = h.quantile(0.5).unwrap() as f64;
        assert!((p50 / 51_520_000.0 - 1.0).abs() <= 1.0 / 16.0, "{p50}");
    }

    #[test]
    fn empty_has_no_quantile() {
        assert_eq!(GapHistogram::default().quantile(0.5), None);
        assert_eq!(GapHistogram::default().max(), None);
    }
}
