//! [`ClassicHistogram`]: a Prometheus classic histogram recorded with a few relaxed atomic adds.
//!
//! `prometheus-client`'s `Histogram` takes a mutex on every observation and scans its buckets
//! linearly (it also carries native-histogram state infertrace does not use); the pipeline
//! observes six histograms per request, and that was ~3 % of the collector's CPU at full ingest
//! rate. This one finds the bucket with a binary search over shared bounds and adds to atomic
//! counters. It encodes through the same `prometheus-client` encoder, so `/metrics` is the same
//! text: `_sum`, `_count`, then cumulative `_bucket{le=…}` lines ending with `le="+Inf"`.
//!
//! A scrape that runs while a value is being observed may see that value's bucket but not yet
//! its sum (never a `_count` that disagrees with the `+Inf` bucket: the count is the buckets'
//! total). Prometheus reads each scrape as an instant, so this is the usual tolerance.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A classic histogram over fixed bucket bounds; clones share the counts.
#[derive(Clone, Debug)]
pub struct ClassicHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Upper bounds, ascending, ending with `+Inf`.
    bounds: Box<[f64]>,
    /// Observations per bucket (not cumulative), same index as `bounds`.
    counts: Box<[AtomicU64]>,
    /// Sum of observations, as `f64` bits.
    sum: AtomicU64,
}

impl ClassicHistogram {
    /// A histogram with the given upper bounds (ascending; `+Inf` is appended).
    pub fn new(bounds: &[f64]) -> Self {
        let bounds: Box<[f64]> = bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .collect();
        let counts = bounds.iter().map(|_| AtomicU64::new(0)).collect();
        Self {
            inner: Arc::new(Inner {
                bounds,
                counts,
                sum: AtomicU64::new(0f64.to_bits()),
            }),
        }
    }

    /// Records `v`: in the first bucket whose bound is at least `v` (`+Inf` for NaN), and in
    /// the sum.
    pub fn observe(&self, v: f64) {
        let inner = &*self.inner;
        let last = inner.bounds.len() - 1;
        let bucket = if v.is_nan() {
            last
        } else {
            inner.bounds.partition_point(|b| *b < v).min(last)
        };
        inner.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let mut current = inner.sum.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(current) + v).to_bits();
            match inner.sum.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
    }

    /// `(sum, count, per-bucket (bound, count))` now.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.inner;
        let buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .zip(inner.counts.iter())
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        (
            f64::from_bits(inner.sum.load(Ordering::Relaxed)),
            count,
            buckets,
        )
    }
}

impl TypedMetric for ClassicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for ClassicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    fn text(register: impl FnOnce(&mut Registry)) -> String {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn encodes_exactly_as_the_crates_histogram() {
        let bounds = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28];
        // Values on bounds, between them, below the first, above the last, zero, NaN.
        let values = [
            0.0,
            0.005,
            0.01,
            0.0100001,
            0.03,
            0.04,
            0.5,
            1.28,
            1.2800001,
            7.0,
            f64::NAN,
        ];
        let ours = ClassicHistogram::new(&bounds);
        let theirs = Histogram::new(bounds);
        for v in values {
            ours.observe(v);
            theirs.observe(v);
        }
        let a = text(|r| r.register("latency", "help", ours.clone()));
        let b = text(|r| r.register("latency", "help", theirs.clone()));
        assert_eq!(a, b);
        assert!(a.contains("latency_bucket{le=\"+Inf\"} 11"), "{a}");
    }

    #[test]
    fn counts_buckets_and_sum() {
        let h = ClassicHistogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0, 4.0] {
            h.observe(v);
        }
        let (sum, count, buckets) = h.snapshot();
        assert_eq!(sum, 10.0);
        assert_eq!(count, 5);
        assert_eq!(buckets, vec![(1.0, 2), (2.0, 1), (f64::INFINITY, 2)]);
    }

    #[test]
    fn clones_share_counts_across_threads() {
        let h = ClassicHistogram::new(&[1.0]);
        std::thread::scope(|s| {
            for _ in 0..4 {
                let h = h.clone();
                s.spawn(move || {
                    for _ in 0..10_000 {
                        h.observe(0.5);
                    }
                });
            }
        });
        let (sum, count, _) = h.snapshot();
        assert_eq!(count, 40_000);
        assert_eq!(sum, 20_000.0);
    }
}
