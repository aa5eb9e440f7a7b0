//! [`SeqRing`]: a bounded ring of fixed-size records with one writer and any number of readers.
//!
//! Every slot is a small seqlock made only of atomics: the writer marks the slot odd, stores the
//! record, and marks it even with the record's sequence number; a reader copies the record and
//! keeps it only if the slot's stamp was the expected even value before *and* after the copy.
//! The writer never waits for a reader and a reader never takes a lock; a reader racing the
//! writer on the oldest slot simply sees that record as gone. There is no `unsafe` here: a torn
//! copy is possible in principle, but it is always detected and discarded.

use std::sync::atomic::{AtomicU64, Ordering, fence};

/// One record: a timestamp (ns since the owner's epoch) and `F` values stored as `f64` bits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Record<const F: usize> {
    /// Nanoseconds since the sampler's epoch.
    pub(crate) t: u64,
    /// The values; `NaN` means "not measured in this sample".
    pub(crate) v: [f64; F],
}

struct Slot<const F: usize> {
    /// `2n + 1` while record `n` is being written, `2n + 2` once it is complete.
    stamp: AtomicU64,
    t: AtomicU64,
    v: [AtomicU64; F],
}

impl<const F: usize> Slot<F> {
    fn empty() -> Self {
        Self {
            stamp: AtomicU64::new(0),
            t: AtomicU64::new(0),
            v: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// A bounded single-writer, many-reader ring buffer of [`Record`]s in time order.
pub(crate) struct SeqRing<const F: usize> {
    slots: Box<[Slot<F>]>,
    /// `capacity − 1` (the capacity is a power of two, so a slot index is a mask, not a division).
    mask: u64,
    /// Number of records published so far (record `n` lives in slot `n % capacity`).
    written: AtomicU64,
}

impl<const F: usize> std::fmt::Debug for SeqRing<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqRing")
            .field("capacity", &self.slots.len())
            .field("written", &self.written.load(Ordering::Relaxed))
            .finish()
    }
}

impl<const F: usize> SeqRing<F> {
    /// A ring holding the latest `capacity` records, rounded up to a power of two (at least 2).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(2, 1 << 24).next_power_of_two();
        Self {
            slots: (0..capacity).map(|_| Slot::empty()).collect(),
            mask: capacity as u64 - 1,
            written: AtomicU64::new(0),
        }
    }

    /// How many records the ring keeps.
    pub(crate) fn capacity(&self) -> u64 {
        self.slots.len() as u64
    }

    fn slot(&self, n: u64) -> &Slot<F> {
        // `n & mask` is below the length, which came from a `usize`.
        &self.slots[(n & self.mask) as usize]
    }

    /// Appends a record. Only one thread may push (the sampler); readers may run concurrently.
    pub(crate) fn push(&self, record: &Record<F>) {
        let n = self.written.load(Ordering::Relaxed);
        let slot = self.slot(n);
        slot.stamp.store(2 * n + 1, Ordering::Relaxed);
        // Readers that see any of the stores below also see the odd stamp above.
        fence(Ordering::Release);
        slot.t.store(record.t, Ordering::Relaxed);
        for (cell, value) in slot.v.iter().zip(record.v.iter()) {
            cell.store(value.to_bits(), Ordering::Relaxed);
        }
        slot.stamp.store(2 * n + 2, Ordering::Release);
        self.written.store(n + 1, Ordering::Release);
    }

    /// The range of record numbers that may still be readable: `[oldest, end)`.
    pub(crate) fn bounds(&self) -> (u64, u64) {
        let end = self.written.load(Ordering::Acquire);
        (end.saturating_sub(self.capacity()), end)
    }

    /// Record `n`, or `None` if it is not written yet or was overwritten (even during the read).
    pub(crate) fn read(&self, n: u64) -> Option<Record<F>> {
        let slot = self.slot(n);
        let expected = 2 * n + 2;
        if slot.stamp.load(Ordering::Acquire) != expected {
            return None;
        }
        let t = slot.t.load(Ordering::Relaxed);
        let v: [f64; F] =
            std::array::from_fn(|i| f64::from_bits(slot.v[i].load(Ordering::Relaxed)));
        // The loads above complete before the stamp is checked again.
        fence(Ordering::Acquire);
        (slot.stamp.load(Ordering::Relaxed) == expected).then_some(Record { t, v })
    }

    /// The timestamp and the fields `idx` of record `n` (validated like [`read`](Self::read)).
    #[inline]
    pub(crate) fn read_fields<const G: usize>(
        &self,
        n: u64,
        idx: &[usize; G],
    ) -> Option<Record<G>> {
        let slot = self.slot(n);
        let expected = 2 * n + 2;
        if slot.stamp.load(Ordering::Acquire) != expected {
            return None;
        }
        let t = slot.t.load(Ordering::Relaxed);
        let v: [f64; G] = std::array::from_fn(|i| {
            slot.v
                .get(idx[i])
                .map_or(f64::NAN, |c| f64::from_bits(c.load(Ordering::Relaxed)))
        });
        fence(Ordering::Acquire);
        (slot.stamp.load(Ordering::Relaxed) == expected).then_some(Record { t, v })
    }

    /// Only the timestamp of record `n` (validated like [`read`](Self::read)).
    pub(crate) fn read_time(&self, n: u64) -> Option<u64> {
        let slot = self.slot(n);
        let expected = 2 * n + 2;
        if slot.stamp.load(Ordering::Acquire) != expected {
            return None;
        }
        let t = slot.t.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        (slot.stamp.load(Ordering::Relaxed) == expected).then_some(t)
    }

    /// The most recent record.
    pub(crate) fn latest(&self) -> Option<Record<F>> {
        let (lo, end) = self.bounds();
        (end > lo).then(|| self.read(end - 1)).flatten()
    }

    /// The number of the last readable record with `t <= at`, searching `[lo, end)`.
    /// Records that were overwritten during the search count as older than `at`.
    pub(crate) fn last_at_or_before(&self, at: u64, lo: u64, end: u64) -> Option<u64> {
        let (mut lo, mut hi) = (lo, end);
        let mut found = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.read_time(mid) {
                Some(t) if t > at => hi = mid,
                Some(_) => {
                    found = Some(mid);
                    lo = mid + 1;
                }
                None => lo = mid + 1,
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rec(t: u64, x: f64) -> Record<2> {
        Record { t, v: [x, -x] }
    }

    #[test]
    fn keeps_only_the_latest_capacity_records() {
        let ring = SeqRing::<2>::new(3); // rounded up to 4
        assert_eq!(ring.capacity(), 4);
        assert_eq!(ring.latest(), None);
        for i in 0..10 {
            ring.push(&rec(i * 10, i as f64));
        }
        assert_eq!(ring.bounds(), (6, 10));
        assert_eq!(ring.read(5), None, "overwritten");
        assert_eq!(ring.read(6), Some(rec(60, 6.0)));
        assert_eq!(ring.read(10), None, "not written yet");
        assert_eq!(ring.latest(), Some(rec(90, 9.0)));
    }

    #[test]
    fn binary_search_finds_the_sample_at_or_before() {
        let ring = SeqRing::<2>::new(8);
        for i in 0..6 {
            ring.push(&rec(100 + i * 100, 0.0)); // 100, 200, ..., 600
        }
        let (lo, end) = ring.bounds();
        assert_eq!(ring.last_at_or_before(50, lo, end), None);
        assert_eq!(ring.last_at_or_before(100, lo, end), Some(0));
        assert_eq!(ring.last_at_or_before(250, lo, end), Some(1));
        assert_eq!(ring.last_at_or_before(600, lo, end), Some(5));
        assert_eq!(ring.last_at_or_before(10_000, lo, end), Some(5));
    }

    #[test]
    fn selected_fields_are_read_in_the_order_asked() {
        let ring = SeqRing::<3>::new(4);
        ring.push(&Record {
            t: 5,
            v: [1.0, 2.0, 3.0],
        });
        assert_eq!(
            ring.read_fields(0, &[2, 0]),
            Some(Record {
                t: 5,
                v: [3.0, 1.0]
            })
        );
        assert_eq!(ring.read_fields(1, &[0]), None);
    }

    #[test]
    fn nan_round_trips() {
        let ring = SeqRing::<2>::new(2);
        ring.push(&Record {
            t: 1,
            v: [f64::NAN, 2.5],
        });
        let r = ring.latest().unwrap();
        assert!(r.v[0].is_nan());
        assert_eq!(r.v[1], 2.5);
    }

    #[test]
    fn concurrent_readers_never_see_a_torn_record() {
        // The writer stores (t, t, -t) consistently; a reader must never see a mix.
        let ring = Arc::new(SeqRing::<2>::new(16));
        let writer = {
            let ring = Arc::clone(&ring);
            std::thread::spawn(move || {
                for t in 1..200_000u64 {
                    ring.push(&rec(t, t as f64));
                }
            })
        };
        let mut seen = 0u64;
        while !writer.is_finished() {
            let (lo, end) = ring.bounds();
            for n in lo..end {
                if let Some(r) = ring.read(n) {
                    assert_eq!(r.v[0], r.t as f64);
                    assert_eq!(r.v[1], -(r.t as f64));
                    seen += 1;
                }
            }
        }
        writer.join().unwrap();
        assert!(seen > 0);
    }
}
