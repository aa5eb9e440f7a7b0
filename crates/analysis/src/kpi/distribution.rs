//! [`Distribution`]: a DDSketch stored sparsely, with exact count, sum, min and max, and the
//! [`LatencyStats`] it reports.
//!
//! The bucket mapping is `sketches-ddsketch`'s own ([`Config::key`] / [`Config::value`], relative
//! accuracy [`SKETCH_RELATIVE_ACCURACY`]) and quantiles use its rank rule (the value at rank
//! ⌊q·(n − 1)⌋), so answers are exactly those of a `DDSketch` fed the same values (a unit test
//! checks this against the crate). What differs is the store: `sketches-ddsketch` keeps a dense
//! array grown in chunks of 128 bins (1 KiB even for one value), and a KPI window holds
//! thousands of slot sketches that mostly see a handful of values each. Here a sketch is a
//! sorted `(bucket, count)` vector — 8 bytes per occupied bucket — and merging is a sorted
//! merge.

use serde::Serialize;
use sketches_ddsketch::{Config, DDSketch};

use crate::dense_buckets::DenseBuckets;
use crate::rounding::floor_to_i32;

use crate::codec::{DecodeError, Reader, Writer};

/// Relative accuracy α of every percentile. Below 1% with margin for floating-point rounding at
/// bucket edges.
pub const SKETCH_RELATIVE_ACCURACY: f64 = 0.009;
/// Bins limit handed to `sketches-ddsketch` when building a [`DDSketch`] (α = 0.009 spans
/// 1 ns to years well within it).
const SKETCH_MAX_BINS: u32 = 4096;
/// Values at or below this (seconds) fall in the zero bucket.
const SKETCH_MIN_VALUE: f64 = 1e-9;
/// The bucket of values at or below 1 ns (zero, for durations).
pub const ZERO_BUCKET: i32 = i32::MIN;

/// The sketch configuration every distribution uses.
pub fn sketch_config() -> Config {
    Config::new(SKETCH_RELATIVE_ACCURACY, SKETCH_MAX_BINS, SKETCH_MIN_VALUE)
}

/// The bucket a value falls in: the sketch's own key (`Config::key`, its floor rounded
/// without a libm call), [`ZERO_BUCKET`] at or below its minimum.
pub fn bucket_of(config: &Config, v: f64) -> i32 {
    if v > config.min_possible() {
        floor_to_i32(config.log_gamma(v))
    } else {
        ZERO_BUCKET
    }
}

/// The value a bucket reports (within α of every value in it; 0 for the zero bucket).
pub fn bucket_value(config: &Config, bucket: i32) -> f64 {
    if bucket == ZERO_BUCKET {
        0.0
    } else {
        config.value(bucket)
    }
}

/// Merges the sorted `(key, value)` vector `from` into `into`, combining equal keys.
pub(super) fn merge_sorted<V: Copy>(
    into: &mut Vec<(i32, V)>,
    from: &[(i32, V)],
    combine: impl Fn(&mut V, &V),
) {
    if from.is_empty() {
        return;
    }
    if into.is_empty() {
        into.extend_from_slice(from);
        return;
    }
    let mut out = Vec::with_capacity(into.len() + from.len());
    let (mut a, mut b) = (into.iter().peekable(), from.iter().peekable());
    loop {
        match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                let mut v = x.1;
                combine(&mut v, &y.1);
                out.push((x.0, v));
                a.next();
                b.next();
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                out.push(**x);
                a.next();
            }
            (_, Some(y)) => {
                out.push(**y);
                b.next();
            }
            (Some(x), None) => {
                out.push(**x);
                a.next();
            }
            (None, None) => break,
        }
    }
    *into = out;
}

/// Widest key range [`merge_many_sorted`] spreads over a dense scratch array; wider (values
/// spanning dozens of orders of magnitude) falls back to pairwise merges.
const DENSE_MERGE_MAX_RANGE: i64 = 1 << 15;

/// Merges many sorted `(key, value)` vectors at once: one pass over a dense scratch array
/// spanning their key range ([`ZERO_BUCKET`] kept apart), instead of one allocation per pair.
pub(super) fn merge_many_sorted<V: Copy>(
    parts: &[&[(i32, V)]],
    combine: impl Fn(&mut V, &V),
) -> Vec<(i32, V)> {
    let body = |p: &[(i32, V)]| -> (i32, i32) {
        let start = usize::from(p.first().is_some_and(|b| b.0 == ZERO_BUCKET));
        match (p.get(start), p.last()) {
            (Some(f), Some(l)) => (f.0, l.0),
            _ => (i32::MAX, i32::MIN),
        }
    };
    let (lo, hi) = parts.iter().fold((i32::MAX, i32::MIN), |(lo, hi), p| {
        let (f, l) = body(p);
        (lo.min(f), hi.max(l))
    });
    let range = i64::from(hi) - i64::from(lo) + 1;
    if range > DENSE_MERGE_MAX_RANGE {
        let mut out = Vec::new();
        for p in parts {
            merge_sorted(&mut out, p, &combine);
        }
        return out;
    }
    let mut zero: Option<V> = None;
    let mut dense: Vec<Option<V>> = vec![None; usize::try_from(range.max(0)).unwrap_or(0)];
    let put = |slot: &mut Option<V>, v: &V| match slot {
        Some(x) => combine(x, v),
        None => *slot = Some(*v),
    };
    for p in parts {
        for (k, v) in p.iter() {
            if *k == ZERO_BUCKET {
                put(&mut zero, v);
            } else if let Some(slot) = dense.get_mut((i64::from(*k) - i64::from(lo)) as usize) {
                put(slot, v);
            }
        }
    }
    let occupied = dense.iter().filter(|d| d.is_some()).count() + usize::from(zero.is_some());
    let mut out = Vec::with_capacity(occupied);
    out.extend(zero.map(|v| (ZERO_BUCKET, v)));
    out.extend(
        dense
            .iter()
            .zip(lo..)
            .filter_map(|(v, k)| v.map(|v| (k, v))),
    );
    out
}

/// Percentiles, max and mean of one latency, seconds: what [`Distribution::stats`] reports, the
/// latency block of the KPI snapshot.
///
/// Percentiles come from a DDSketch (relative error ≤ [`SKETCH_RELATIVE_ACCURACY`]);
/// `max` and `mean` are exact.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LatencyStats {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// A latency distribution: DDSketch buckets plus exact count, sum, min and max.
///
/// Stored sparsely (sorted `(bucket, count)` pairs) except while it is being written to: past
/// `DENSE_FROM_BINS` buckets, adds go to a dense array of counts over the buckets seen
/// (`Dense`), one indexed increment instead of a binary search (the search was most of the
/// time of recording a request into the KPIs: seven distributions per request, each search a
/// chain of dependent loads). [`Self::shrink`] turns it sparse again; the KPI windows call it
/// when a slot is rolled up or its series moves on to a newer slot (a series that goes quiet
/// keeps its last slot dense, at most 7 × 4 KiB, until the windows roll it up or it expires).
/// Values spread thin over a wide range stay sparse until their buckets fill at least one cell
/// in `dense_buckets::MIN_OCCUPANCY` of it (attempts at twice the buckets each time),
/// and for good past `DENSE_MAX_SPAN`. Both forms hold the same buckets; readers see the
/// sparse view.
#[derive(Clone, Debug, Default)]
pub struct Distribution {
    /// `(bucket, count)`, sorted by bucket; empty while [`Self::dense`] holds the buckets.
    bins: Vec<(i32, u32)>,
    /// The buckets while the distribution is written to (see above).
    dense: Option<Box<Dense>>,
    /// Sparse buckets at which the next attempt to turn dense is made (0: [`DENSE_FROM_BINS`]).
    /// An attempt that fails (the buckets too wide or too thin for an array) doubles it, so
    /// values spread over a wide range turn dense once they fill it, and the attempts cost
    /// O(1) per add amortised.
    dense_attempt_at: u32,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

/// Equal when they hold the same values' summary (whichever form their buckets are in).
impl PartialEq for Distribution {
    fn eq(&self, o: &Self) -> bool {
        self.count == o.count
            && self.sum.to_bits() == o.sum.to_bits()
            && self.min.to_bits() == o.min.to_bits()
            && self.max.to_bits() == o.max.to_bits()
            && self.bins_view() == o.bins_view()
    }
}

/// Occupied buckets at which a distribution being written to turns dense.
const DENSE_FROM_BINS: usize = 24;
/// Widest bucket range held densely (4 bytes each): 1,024 buckets span 8 orders of magnitude
/// at α = 0.009, far more than one KPI's values in one slot. (A series' slot being written
/// holds seven distributions: at most 28 KiB, typically ~1 KiB each.)
const DENSE_MAX_SPAN: usize = 1024;

/// Bucket counts over a contiguous range of buckets ([`DenseBuckets`]: it refuses to grow too
/// wide or too empty, and the distribution is then sparse until its next attempt), and the
/// zero bucket's count apart.
#[derive(Clone, Debug, Default)]
struct Dense {
    counts: DenseBuckets<u32, DENSE_MAX_SPAN>,
    zero: u32,
}

impl Dense {
    /// The buckets of `bins` (sorted, the zero bucket first if there), or `None` when they do
    /// not fit a dense array (see [`DenseBuckets::from_sorted`]).
    fn from_bins(bins: &[(i32, u32)]) -> Option<Self> {
        let (zero, rest) = match bins.split_first() {
            Some((&(ZERO_BUCKET, n), rest)) => (n, rest),
            _ => (0, bins),
        };
        Some(Dense {
            counts: DenseBuckets::from_sorted(rest)?,
            zero,
        })
    }

    /// The count of bucket `key` (see [`DenseBuckets::get_mut`]); the caller adds to it.
    fn slot(&mut self, key: i32) -> Option<&mut u32> {
        if key == ZERO_BUCKET {
            return Some(&mut self.zero);
        }
        self.counts.get_mut(key)
    }

    /// The occupied buckets, sorted (the zero bucket first).
    fn bins(&self) -> Vec<(i32, u32)> {
        let mut out = Vec::with_capacity(self.counts.occupied() + usize::from(self.zero > 0));
        if self.zero > 0 {
            out.push((ZERO_BUCKET, self.zero));
        }
        out.extend(self.counts.iter().map(|(k, n)| (k, *n)));
        out
    }
}

impl Distribution {
    /// Adds a value if it is a usable duration (finite; negative clamps to zero), and returns
    /// the bucket it went in ([`bucket_of`] the clamped value), `None` when it was not usable.
    pub fn add(&mut self, config: &Config, v: Option<f64>) -> Option<i32> {
        let v = v.filter(|v| v.is_finite()).map(|v| v.max(0.0))?;
        let key = bucket_of(config, v);
        self.add_to_bucket(key);
        if self.count == 0 {
            (self.min, self.max) = (v, v);
        } else {
            (self.min, self.max) = (self.min.min(v), self.max.max(v));
        }
        self.count += 1;
        self.sum += v;
        Some(key)
    }

    /// Counts one more value in bucket `key`.
    fn add_to_bucket(&mut self, key: i32) {
        if let Some(dense) = &mut self.dense {
            match dense.slot(key) {
                Some(n) => {
                    *n = n.saturating_add(1);
                    return;
                }
                None => {
                    // A key the array will not stretch to: sparse, until the buckets fill in.
                    self.make_sparse();
                    self.dense_attempt_at = self.next_attempt();
                }
            }
        }
        match self.bins.binary_search_by_key(&key, |b| b.0) {
            Ok(i) => self.bins[i].1 = self.bins[i].1.saturating_add(1),
            Err(i) => {
                self.bins.insert(i, (key, 1));
                if self.bins.len() >= DENSE_FROM_BINS.max(self.dense_attempt_at as usize) {
                    match Dense::from_bins(&self.bins) {
                        Some(d) => {
                            self.dense = Some(Box::new(d));
                            self.bins = Vec::new();
                        }
                        None => self.dense_attempt_at = self.next_attempt(),
                    }
                }
            }
        }
    }

    /// The sparse bucket count of the next attempt to turn dense: twice the current one.
    fn next_attempt(&self) -> u32 {
        u32::try_from(self.bins.len().saturating_mul(2)).unwrap_or(u32::MAX)
    }

    /// Moves dense buckets back to the sparse form.
    fn make_sparse(&mut self) {
        if let Some(d) = self.dense.take() {
            self.bins = d.bins();
        }
    }

    /// The occupied buckets, sorted: the sparse form, or built from the dense one.
    fn bins_view(&self) -> std::borrow::Cow<'_, [(i32, u32)]> {
        match &self.dense {
            Some(d) => std::borrow::Cow::Owned(d.bins()),
            None => std::borrow::Cow::Borrowed(&self.bins),
        }
    }

    /// Merges another distribution into this one.
    pub fn merge(&mut self, o: &Self) {
        if o.count == 0 {
            return;
        }
        self.make_sparse();
        if self.count == 0 {
            (self.min, self.max) = (o.min, o.max);
        } else {
            (self.min, self.max) = (self.min.min(o.min), self.max.max(o.max));
        }
        self.count += o.count;
        self.sum += o.sum;
        merge_sorted(&mut self.bins, &o.bins_view(), |a, b| {
            *a = a.saturating_add(*b)
        });
    }

    /// Merges many distributions at once (what a window snapshot does with its slots).
    pub fn merge_many(parts: &[&Self]) -> Self {
        let mut out = Self::default();
        let views: Vec<std::borrow::Cow<'_, [(i32, u32)]>> =
            parts.iter().map(|p| p.bins_view()).collect();
        let mut bins: Vec<&[(i32, u32)]> = Vec::with_capacity(parts.len());
        for (p, view) in parts.iter().zip(&views).filter(|(p, _)| p.count > 0) {
            if out.count == 0 {
                (out.min, out.max) = (p.min, p.max);
            } else {
                (out.min, out.max) = (out.min.min(p.min), out.max.max(p.max));
            }
            out.count += p.count;
            out.sum += p.sum;
            bins.push(view);
        }
        out.bins = merge_many_sorted(&bins, |a, b| *a = a.saturating_add(*b));
        out
    }

    /// Values added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Releases spare capacity (a slot that will see no more values): the sparse form, exactly
    /// sized.
    pub fn shrink(&mut self) {
        self.make_sparse();
        self.bins.shrink_to_fit();
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.bins.capacity() * std::mem::size_of::<(i32, u32)>()
            + self
                .dense
                .as_ref()
                .map_or(0, |d| std::mem::size_of::<Dense>() + d.counts.heap_bytes())
    }

    /// The bucket holding the value at rank ⌊q·(n − 1)⌋ (`sketches-ddsketch`'s rank rule).
    pub fn quantile_bucket(&self, q: f64) -> Option<i32> {
        if self.count == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = (q * (self.count as f64 - 1.0)) as u64;
        let bins = self.bins_view();
        let mut seen = 0u64;
        for &(key, n) in bins.iter() {
            seen += u64::from(n);
            if seen > rank {
                return Some(key);
            }
        }
        bins.last().map(|b| b.0)
    }

    /// The q-quantile, clamped to the exact min and max; `None` when empty.
    pub fn quantile(&self, config: &Config, q: f64) -> Option<f64> {
        // The ends are exact, as in `sketches-ddsketch`.
        if self.count > 0 && q == 0.0 {
            return Some(self.min);
        }
        if self.count > 0 && q == 1.0 {
            return Some(self.max);
        }
        let v = bucket_value(config, self.quantile_bucket(q)?);
        Some(v.clamp(self.min, self.max))
    }

    /// Share of the values at most `limit` (an SLO attainment), at bucket resolution: values
    /// in `limit`'s own bucket count as within it (relative error ≤ the sketch's α); exact
    /// below the minimum and from the maximum on. `None` when empty.
    pub fn fraction_at_most(&self, config: &Config, limit: f64) -> Option<f64> {
        if self.count == 0 || limit.is_nan() {
            return None;
        }
        if limit >= self.max {
            return Some(1.0);
        }
        if limit < self.min {
            return Some(0.0);
        }
        let key = bucket_of(config, limit.max(0.0));
        let within: u64 = self
            .bins_view()
            .iter()
            .take_while(|(k, _)| *k <= key)
            .map(|(_, n)| u64::from(*n))
            .sum();
        Some(within as f64 / self.count as f64)
    }

    /// Percentiles, exact max and exact mean; `None` when empty.
    pub fn stats(&self, config: &Config) -> Option<LatencyStats> {
        if self.count == 0 {
            return None;
        }
        let q = |p| self.quantile(config, p).unwrap_or(self.max);
        Some(LatencyStats {
            p50: q(0.5),
            p90: q(0.9),
            p95: q(0.95),
            p99: q(0.99),
            max: self.max,
            mean: self.sum / self.count as f64,
        })
    }

    /// Appends the compact encoding (see [`super::codec`]).
    pub(super) fn encode(&self, w: &mut Writer<'_>) {
        w.varint(self.count);
        if self.count == 0 {
            return;
        }
        w.f64(self.sum);
        w.f64(self.min);
        w.f64(self.max);
        w.keys(&self.bins_view(), |w, n| w.varint(u64::from(*n)));
    }

    /// Reads what [`Self::encode`] wrote.
    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let count = r.varint()?;
        if count == 0 {
            return Ok(Self::default());
        }
        let (sum, min, max) = (r.f64()?, r.f64()?, r.f64()?);
        let bins = r.keys(2, |r| r.u32())?;
        if bins.is_empty() {
            return Err(r.error("distribution with values but no buckets"));
        }
        Ok(Self {
            bins,
            dense: None,
            dense_attempt_at: 0,
            count,
            sum,
            min,
            max,
        })
    }

    /// The same distribution as a `sketches-ddsketch` [`DDSketch`] (bucket values stand for
    /// the values, so its min, max and sum are bucket-accurate, not exact).
    pub fn to_ddsketch(&self, config: &Config) -> DDSketch {
        let mut s = DDSketch::new(*config);
        for &(key, n) in self.bins_view().iter() {
            s.add_with_count(bucket_value(config, key), u64::from(n));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fraction_at_most_counts_the_values_within_a_limit_at_bucket_resolution() {
        let config = sketch_config();
        let vals = values(3, 2000);
        let mut d = Distribution::default();
        for v in &vals {
            d.add(&config, Some(*v));
        }
        let n = vals.len() as f64;
        let count = |f: &dyn Fn(f64) -> bool| vals.iter().filter(|v| f(**v)).count() as f64 / n;
        for limit in [1e-5, 1e-3, 0.05, 0.3, 7.0] {
            let got = d.fraction_at_most(&config, limit).unwrap();
            // Every value ≤ limit is counted; a value above it only when it shares the limit's
            // bucket (within 2α of it).
            let exact = count(&|v| v <= limit);
            let widest = count(&|v| v <= limit * (1.0 + 2.0 * SKETCH_RELATIVE_ACCURACY));
            assert!(
                got >= exact && got <= widest,
                "{limit}: {got} not in [{exact}, {widest}]"
            );
        }
        let max = vals.iter().copied().fold(0.0, f64::max);
        assert_eq!(d.fraction_at_most(&config, max), Some(1.0));
        assert_eq!(d.fraction_at_most(&config, -1.0), Some(0.0));
        assert_eq!(Distribution::default().fraction_at_most(&config, 1.0), None);
    }

    /// A small deterministic generator.
    fn values(seed: u64, n: usize) -> Vec<f64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Log-uniform over 1 µs … 100 s, with some exact zeros.
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                if x.is_multiple_of(50) {
                    0.0
                } else {
                    10f64.powf(-6.0 + 8.0 * u)
                }
            })
            .collect()
    }

    #[test]
    fn answers_exactly_as_sketches_ddsketch_does() {
        let config = sketch_config();
        for (seed, n) in [(1, 1), (2, 7), (3, 1000), (4, 20_000)] {
            let vals = values(seed, n);
            let mut d = Distribution::default();
            let mut reference = DDSketch::new(config);
            for v in &vals {
                d.add(&config, Some(*v));
                reference.add(*v);
            }
            let (min, max) = (reference.min().unwrap(), reference.max().unwrap());
            for q in [0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0] {
                let want = reference.quantile(q).unwrap().unwrap().clamp(min, max);
                assert_eq!(d.quantile(&config, q), Some(want), "seed {seed} q {q}");
            }
            let s = d.stats(&config).unwrap();
            assert_eq!((s.max, d.count()), (max, n as u64));
            assert!(
                (s.mean - reference.sum().unwrap() / n as f64).abs() <= 1e-12 * s.mean.max(1.0)
            );
            let rebuilt = d.to_ddsketch(&config);
            assert_eq!(rebuilt.count(), n);
            assert_eq!(
                rebuilt.quantile(0.5).unwrap(),
                reference.quantile(0.5).unwrap()
            );
        }
    }

    #[test]
    fn merge_equals_adding_everything() {
        let config = sketch_config();
        let vals = values(9, 5000);
        let mut whole = Distribution::default();
        let mut parts = vec![Distribution::default(); 7];
        for (i, v) in vals.iter().enumerate() {
            whole.add(&config, Some(*v));
            parts[i % 7].add(&config, Some(*v));
        }
        let mut merged = Distribution::default();
        for p in &parts {
            merged.merge(p);
        }
        assert_eq!(merged.bins_view(), whole.bins_view());
        assert_eq!(
            (merged.count, merged.min, merged.max),
            (whole.count, whole.min, whole.max)
        );
        assert!((merged.sum - whole.sum).abs() <= 1e-9 * whole.sum);
    }

    #[test]
    fn empty_and_bad_values() {
        let config = sketch_config();
        let mut d = Distribution::default();
        assert!(d.stats(&config).is_none());
        assert_eq!(d.quantile_bucket(0.5), None);
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            d.add(&config, Some(v));
        }
        d.add(&config, None);
        assert!(d.stats(&config).is_none());
        d.add(&config, Some(-1.0)); // clamps to zero
        d.add(&config, Some(2.0));
        let s = d.stats(&config).unwrap();
        assert_eq!((s.p50, s.max, s.mean), (0.0, 2.0, 1.0));
        assert_eq!(d.quantile_bucket(0.0), Some(ZERO_BUCKET));
        assert_eq!(d.quantile_bucket(1.5), None);
    }

    #[test]
    fn bucket_values_map_back_to_their_bucket() {
        let config = sketch_config();
        assert_eq!(bucket_of(&config, 0.0), ZERO_BUCKET);
        assert_eq!(bucket_value(&config, ZERO_BUCKET), 0.0);
        for v in [1e-6, 0.0137, 1.0, 42.0, 9_000.0] {
            let k = bucket_of(&config, v);
            assert_eq!(bucket_of(&config, bucket_value(&config, k)), k);
            assert!((bucket_value(&config, k) - v).abs() <= SKETCH_RELATIVE_ACCURACY * v);
        }
    }

    #[test]
    fn merge_many_equals_pairwise_merges() {
        let config = sketch_config();
        let parts: Vec<Distribution> = (0..9)
            .map(|seed| {
                let mut d = Distribution::default();
                for v in values(seed + 100, 50 * seed as usize) {
                    d.add(&config, Some(v));
                }
                d
            })
            .collect();
        let mut pairwise = Distribution::default();
        for p in &parts {
            pairwise.merge(p);
        }
        let refs: Vec<&Distribution> = parts.iter().collect();
        let many = Distribution::merge_many(&refs);
        assert_eq!(many.bins_view(), pairwise.bins_view());
        assert_eq!(
            (many.count, many.min, many.max),
            (pairwise.count, pairwise.min, pairwise.max)
        );
        assert!(Distribution::merge_many(&[]).stats(&config).is_none());
        // Keys far apart take the pairwise path and agree too.
        let mut wide = Distribution::default();
        wide.add(&config, Some(1e-8));
        wide.add(&config, Some(1e300));
        let merged = Distribution::merge_many(&[&wide, &parts[3]]);
        let mut expected = parts[3].clone();
        expected.merge(&wide);
        assert_eq!(merged.bins_view(), expected.bins_view());
    }

    #[test]
    fn merge_sorted_combines_equal_keys() {
        let mut a = vec![(1, 1u32), (3, 1), (5, 1)];
        merge_sorted(&mut a, &[(0, 2), (3, 2), (6, 2)], |x, y| *x += *y);
        assert_eq!(a, vec![(0, 2), (1, 1), (3, 3), (5, 1), (6, 2)]);
        let mut e: Vec<(i32, u32)> = Vec::new();
        merge_sorted(&mut e, &[(4, 1)], |x, y| *x += *y);
        assert_eq!(e, vec![(4, 1)]);
    }

    /// The buckets of `vals` counted independently of either store.
    fn reference_bins(config: &Config, vals: &[f64]) -> Vec<(i32, u32)> {
        let mut m = std::collections::BTreeMap::new();
        for &v in vals {
            *m.entry(bucket_of(config, v.max(0.0))).or_insert(0u32) += 1;
        }
        m.into_iter().collect()
    }

    #[test]
    fn dense_writes_hold_exactly_the_buckets_sparse_ones_would() {
        let config = sketch_config();
        // Narrow (turns dense), log-uniform over 8 decades (dense, grown both ways), and over
        // 40 decades (too wide for the dense array: back to sparse mid-way).
        let narrow: Vec<f64> = (0..500).map(|i| 0.5 + f64::from(i) * 0.01).collect();
        let decades = values(7, 3000);
        let wide: Vec<f64> = (0..400)
            .map(|i| 10f64.powf(-20.0 + f64::from(i) / 10.0))
            .chain(values(9, 200))
            .collect();
        for vals in [&narrow, &decades, &wide] {
            let mut d = Distribution::default();
            for &v in vals.iter() {
                d.add(&config, Some(v));
            }
            let want = reference_bins(&config, vals);
            assert_eq!(&*d.bins_view(), &want[..]);
            // Merging a dense distribution, and one being merged into, keep every bucket.
            let mut twice = d.clone();
            twice.merge(&d);
            let doubled: Vec<(i32, u32)> = want.iter().map(|&(k, n)| (k, 2 * n)).collect();
            assert_eq!(&*twice.bins_view(), &doubled[..]);
            assert_eq!(
                &*Distribution::merge_many(&[&d, &d]).bins_view(),
                &doubled[..]
            );
            let q = d.quantile(&config, 0.9);
            let mut shrunk = d.clone();
            shrunk.shrink();
            assert!(shrunk.dense.is_none());
            assert_eq!(shrunk, d, "the same summary in either form");
            assert_eq!(shrunk.quantile(&config, 0.9), q);
        }
        let mut wide_d = Distribution::default();
        for &v in &wide {
            wide_d.add(&config, Some(v));
        }
        assert!(wide_d.dense.is_none());
        let mut narrow_d = Distribution::default();
        for &v in &narrow {
            narrow_d.add(&config, Some(v));
        }
        assert!(narrow_d.dense.is_some(), "a slot being written is dense");
    }

    proptest::proptest! {
        /// The bucket is the crate's own key, whatever the value (rounded here without libm).
        #[test]
        fn bucket_of_is_the_crates_key(v in 1e-9f64..1e9, bits in proptest::prelude::any::<u64>()) {
            let config = sketch_config();
            let any = f64::from_bits(bits).abs();
            for v in [v, any] {
                if v > config.min_possible() {
                    proptest::prop_assert_eq!(bucket_of(&config, v), config.key(v), "{}", v);
                }
            }
        }
    }

    #[test]
    fn latencies_over_two_decades_turn_dense_once_they_fill_their_range() {
        // What a collector sees in one slot: queue 1-51 ms, decode 0.24-13 s. Their first 24
        // buckets are ~1 in 9 of the range (the array refused them, and these stayed sparse
        // for good, a binary search per add); a few dozen more fill it.
        let config = sketch_config();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut queue, mut decode) = (Vec::new(), Vec::new());
        for _ in 0..5000 {
            queue.push((1_000_000 + next() % 50_000_000) as f64 / 1e9);
            let tokens = 16 + next() % 512;
            decode.push((tokens * (15_000_000 + next() % 10_000_000)) as f64 / 1e9);
        }
        for vals in [&queue, &decode] {
            let mut d = Distribution::default();
            for &v in vals.iter() {
                d.add(&config, Some(v));
            }
            assert!(d.dense.is_some(), "{} buckets", d.bins_view().len());
            assert_eq!(&*d.bins_view(), &reference_bins(&config, vals)[..]);
        }
    }

    #[test]
    fn values_spread_thin_stay_sparse() {
        let config = sketch_config();
        // 30 values ~35 buckets apart (a factor of ~1.9 each): past 24 buckets, but an array
        // over their range would be 1 in 35 occupied.
        let mut d = Distribution::default();
        let vals: Vec<f64> = (0..30).map(|i| 1e-6 * 1.9f64.powi(i)).collect();
        for &v in &vals {
            d.add(&config, Some(v));
        }
        assert!(d.dense.is_none());
        assert_eq!(&*d.bins_view(), &reference_bins(&config, &vals)[..]);
        // Dense buckets at the very end of the key range are reported, not overflowed.
        let dense = Dense::from_bins(&[(i32::MAX - 1, 1), (i32::MAX, 2)]).unwrap();
        assert_eq!(dense.bins(), vec![(i32::MAX - 1, 1), (i32::MAX, 2)]);
    }
}
