//! Prometheus values written by one thread at a time: [`ClassicHistogram`] and the counter value
//! [`SingleWriter`].
//!
//! The pipeline records every request into a dozen counters and six histograms, always from
//! the thread holding its analysis lock ([`crate::prom_export::PromRecorder`] takes `&mut self`
//! and is only reached through that lock). With one writer at a time an update need not be an
//! atomic read-modify-write: a relaxed load and a relaxed store do, and on x86 that is two plain
//! moves where `fetch_add` is a `lock`-prefixed instruction (and an `f64` sum a compare-exchange
//! loop). Those locked instructions were most of the recorder's time, ~3 % of the collector's CPU
//! at full ingest rate. Readers (a `/metrics` scrape on another thread) still load whole values:
//! every value is an `AtomicU64`, so a scrape never sees a torn number.
//!
//! **The contract:** concurrent writers would lose updates (never memory safety). Only the
//! recorder writes these values; the self-metrics that many threads bump stay on the crate's
//! atomic counters.
//!
//! [`ClassicHistogram`] replaces `prometheus-client`'s `Histogram`, which takes a mutex on every
//! observation and scans its buckets linearly (it also carries native-histogram state
//! infertrace does not use). This one finds the bucket with a binary search over shared bounds.
//! It encodes through the same `prometheus-client` encoder, so `/metrics` is the same text:
//! `_sum`, `_count`, then cumulative `_bucket{le=…}` lines ending with `le="+Inf"`.
//!
//! A scrape that runs while a value is being observed may see that value's bucket but not yet
//! its sum (never a `_count` that disagrees with the `+Inf` bucket: the count is the buckets'
//! total). Prometheus reads each scrape as an instant, so this is the usual tolerance.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Atomic;
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Adds `v` to a value with one writer at a time (see the module docs); returns the old value.
fn add_single_writer(cell: &AtomicU64, v: u64) -> u64 {
    let old = cell.load(Ordering::Relaxed);
    cell.store(old.wrapping_add(v), Ordering::Relaxed);
    old
}

/// Adds `v` to an `f64` kept as bits, one writer at a time; returns the old value.
fn add_f64_single_writer(cell: &AtomicU64, v: f64) -> f64 {
    let old = f64::from_bits(cell.load(Ordering::Relaxed));
    cell.store((old + v).to_bits(), Ordering::Relaxed);
    old
}

/// A counter's value for `prometheus_client::metrics::counter::Counter<u64, SingleWriter>` or
/// `Counter<f64, SingleWriter>`, updated by one writer at a time (see the module docs).
#[derive(Debug, Default)]
pub struct SingleWriter(AtomicU64);

impl Atomic<u64> for SingleWriter {
    fn inc(&self) -> u64 {
        add_single_writer(&self.0, 1)
    }

    fn inc_by(&self, v: u64) -> u64 {
        add_single_writer(&self.0, v)
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Atomic<f64> for SingleWriter {
    fn inc(&self) -> f64 {
        add_f64_single_writer(&self.0, 1.0)
    }

    fn inc_by(&self, v: f64) -> f64 {
        add_f64_single_writer(&self.0, v)
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A classic histogram over fixed bucket bounds, observed by one writer at a time (see the
/// module docs); clones share the counts.
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
        add_single_writer(&inner.counts[bucket], 1);
        add_f64_single_writer(&inner.sum, v);
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
    fn clones_share_counts_and_a_reader_on_another_thread_sees_whole_values() {
        let h = ClassicHistogram::new(&[1.0]);
        let reader = h.clone();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Every snapshot is a state the writer passed through or is about to: counts
                // only grow and the sum is always a whole number of halves.
                let mut last = 0;
                while !done.load(Ordering::Relaxed) {
                    let (sum, count, _) = reader.snapshot();
                    assert!(count >= last);
                    assert_eq!(sum.fract() % 0.5, 0.0, "{sum}");
                    last = count;
                }
            });
            for _ in 0..100_000 {
                h.observe(0.5);
            }
            done.store(true, Ordering::Relaxed);
        });
        let (sum, count, _) = h.snapshot();
        assert_eq!(count, 100_000);
        assert_eq!(sum, 50_000.0);
    }

    #[test]
    fn single_writer_counters_count_and_encode_as_the_crates() {
        use prometheus_client::metrics::counter::Counter;
        let ours: Counter<u64, SingleWriter> = Counter::default();
        let theirs: Counter = Counter::default();
        let ours_f: Counter<f64, SingleWriter> = Counter::default();
        let theirs_f: Counter<f64, AtomicU64> = Counter::default();
        for i in 0..10u64 {
            ours.inc_by(i);
            theirs.inc_by(i);
            ours_f.inc_by(i as f64 * 0.25);
            theirs_f.inc_by(i as f64 * 0.25);
        }
        ours.inc();
        theirs.inc();
        assert_eq!(ours.get(), 46);
        assert_eq!(ours_f.get(), 11.25);
        let a = text(|r| {
            r.register("n", "help", ours.clone());
            r.register("f", "help", ours_f.clone());
        });
        let b = text(|r| {
            r.register("n", "help", theirs.clone());
            r.register("f", "help", theirs_f.clone());
        });
        assert_eq!(a, b);
    }
}
