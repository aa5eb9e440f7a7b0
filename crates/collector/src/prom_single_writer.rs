//! Prometheus values written by one thread at a time: [`ClassicHistogram`] and
//! [`SingleWriterCounter`], written only through a [`Writer`].
//!
//! The pipeline records every request into a dozen counters and six histograms. With one writer
//! at a time an update need not be an atomic read-modify-write: a relaxed load and a relaxed
//! store do (two plain moves on x86, where `fetch_add` is a `lock`-prefixed instruction and an
//! `f64` sum a compare-exchange loop). Readers (a `/metrics` scrape on another thread) still
//! load whole values: every value is an `AtomicU64`, so a scrape never sees a torn number.
//!
//! **The contract is a type:** every write takes a `&`[`Writer`]. A writer is `Send` (it moves
//! with its recorder) but not `Sync`, so no two threads can write through one at the same time,
//! and each metric set hands out one writer ([`crate::prom_export::PromMetrics`]). The
//! self-metrics that many threads bump stay on the crate's atomic counters.
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

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use infertrace_analysis::heap_size::ARC_HEADER_BYTES;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
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

/// The right to write single-writer values: `Send` but not `Sync` (see the module docs).
#[derive(Debug)]
pub(crate) struct Writer {
    _not_sync: PhantomData<Cell<()>>,
}

impl Writer {
    /// A writer. Only the owner of a metric set makes one (one per set).
    pub(crate) fn new() -> Self {
        Self {
            _not_sync: PhantomData,
        }
    }
}

/// A Prometheus counter of `N` (`u64` or `f64`) written through a [`Writer`] (see the module
/// docs); clones share the value.
#[derive(Debug, Default)]
pub(crate) struct SingleWriterCounter<N> {
    value: Arc<AtomicU64>,
    _n: PhantomData<N>,
}

impl<N> Clone for SingleWriterCounter<N> {
    fn clone(&self) -> Self {
        Self {
            value: self.value.clone(),
            _n: PhantomData,
        }
    }
}

impl<N> SingleWriterCounter<N> {
    /// Bytes a counter's value takes on the heap (one shared `AtomicU64`).
    pub(crate) const HEAP_BYTES: usize = ARC_HEADER_BYTES + std::mem::size_of::<AtomicU64>();
}

impl SingleWriterCounter<u64> {
    /// Adds one.
    pub(crate) fn inc(&self, writer: &Writer) {
        self.inc_by(writer, 1);
    }

    /// Adds `v`.
    pub(crate) fn inc_by(&self, _: &Writer, v: u64) {
        add_single_writer(&self.value, v);
    }

    /// The value now.
    pub(crate) fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

impl SingleWriterCounter<f64> {
    /// Adds `v`.
    pub(crate) fn inc_by(&self, _: &Writer, v: f64) {
        add_f64_single_writer(&self.value, v);
    }

    /// The value now.
    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.value.load(Ordering::Relaxed))
    }
}

impl<N> TypedMetric for SingleWriterCounter<N> {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for SingleWriterCounter<u64> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl EncodeMetric for SingleWriterCounter<f64> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
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

    /// Bytes this histogram's values take on the heap (its shared block: counts, bounds, sum).
    pub(crate) fn heap_bytes(&self) -> usize {
        ARC_HEADER_BYTES
            + std::mem::size_of::<Inner>()
            + self.inner.bounds.len()
                * (std::mem::size_of::<f64>() + std::mem::size_of::<AtomicU64>())
    }

    /// Records `v`: in the first bucket whose bound is at least `v` (`+Inf` for NaN), and in
    /// the sum.
    pub(crate) fn observe(&self, _: &Writer, v: f64) {
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
        let w = Writer::new();
        for v in values {
            ours.observe(&w, v);
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
            h.observe(&Writer::new(), v);
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
            let w = Writer::new();
            for _ in 0..100_000 {
                h.observe(&w, 0.5);
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
        let w = Writer::new();
        let ours: SingleWriterCounter<u64> = SingleWriterCounter::default();
        let theirs: Counter = Counter::default();
        let ours_f: SingleWriterCounter<f64> = SingleWriterCounter::default();
        let theirs_f: Counter<f64, AtomicU64> = Counter::default();
        for i in 0..10u64 {
            ours.inc_by(&w, i);
            theirs.inc_by(i);
            ours_f.inc_by(&w, i as f64 * 0.25);
            theirs_f.inc_by(i as f64 * 0.25);
        }
        ours.inc(&w);
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
