//! One slot of [`CriticalPathWindows`] as bytes, for a history store: written while the
//! collector runs, absorbed back after a restart so that the windows cover the time before it,
//! as the KPI windows do.
//!
//! Layout (version 1), with [`crate::codec`]'s primitives: a version byte; the slot's start (Unix
//! nanoseconds) as a varint; γ as 8 bytes; the requests per e2e bucket
//! (sorted bucket keys, each with its request count as a varint and its summed e2e seconds as 8
//! bytes); then the number of (service, span) rows, each its service and span name as texts
//! and its critical seconds per e2e bucket (sorted bucket keys, 8 bytes each).

use super::{BucketRequests, BucketValues, CriticalPathWindows};
use crate::codec::{DecodeError, Reader, Writer};
use crate::kpi::is_overflow_label;
use crate::text::Text;

/// Version byte written first.
const VERSION: u8 = 1;

/// The values of `v` sorted by bucket, as the codec's key lists want them.
fn sorted<T: Copy + Default + PartialEq>(v: &BucketValues<T>) -> Vec<(i32, T)> {
    let mut out: Vec<(i32, T)> = v.iter().map(|(b, x)| (b, *x)).collect();
    out.sort_unstable_by_key(|(b, _)| *b);
    out
}

impl CriticalPathWindows {
    /// Width of one slot, nanoseconds.
    pub fn slot_nanos(&self) -> u64 {
        self.slot_nanos
    }

    /// The start of the oldest slot a snapshot at `now_unix_nano` reads: a slot that started
    /// before it is out of the windows' reach (not restored; a store may forget it).
    pub fn reach_start(&self, now_unix_nano: u64) -> u64 {
        self.oldest_epoch(now_unix_nano / self.slot_nanos) * self.slot_nanos
    }

    /// The slot holding the instant `at_unix_nano`, encoded, with the slot's start: `None`
    /// when the windows hold no request there (nothing recorded, or the slot was reused).
    pub fn encode_slot(&self, at_unix_nano: u64) -> Option<(u64, Vec<u8>)> {
        let epoch = at_unix_nano / self.slot_nanos;
        let slot = &self.slots[self.slot_index(epoch)];
        if slot.epoch != Some(epoch) {
            return None;
        }
        let requests = sorted(&slot.requests);
        if requests.is_empty() {
            return None;
        }
        let start = epoch * self.slot_nanos;
        let mut bytes = Vec::new();
        let mut w = Writer(&mut bytes);
        w.u8(VERSION);
        w.varint(start);
        w.f64(self.ln_gamma.exp());
        w.keys(&requests, |w, r| {
            w.varint(r.count);
            w.f64(r.e2e_seconds);
        });
        let rows: Vec<(usize, Vec<(i32, f64)>)> = slot
            .seconds
            .iter()
            .map(sorted)
            .enumerate()
            .filter(|(_, values)| !values.is_empty())
            .collect();
        w.varint(rows.len() as u64);
        for (key, values) in rows {
            let (service, span, _) = &self.keys[key];
            w.text(service);
            w.text(span);
            w.keys(&values, |w, secs| w.f64(*secs));
        }
        Some((start, bytes))
    }

    /// Every slot recorded into since [`mark_saved`](Self::mark_saved) (or since these windows
    /// were created), encoded, with its start: the slots a history store is missing. The
    /// current slot is among them while it takes records, so it is handed again after each
    /// record, whole.
    pub fn unsaved_slots(&self, now_unix_nano: u64) -> Vec<(u64, Vec<u8>)> {
        let Some(from) = self.unsaved_from else {
            return Vec::new();
        };
        let now_epoch = now_unix_nano / self.slot_nanos;
        (from.max(self.oldest_epoch(now_epoch))..=now_epoch.max(from))
            .filter_map(|epoch| self.encode_slot(epoch * self.slot_nanos))
            .collect()
    }

    /// The slots [`unsaved_slots`](Self::unsaved_slots) returned reached the store: the next
    /// call returns only slots recorded into from now on.
    pub fn mark_saved(&mut self) {
        self.unsaved_from = None;
    }

    /// Adds back a slot that [`encode_slot`](Self::encode_slot) wrote (after a restart:
    /// before any request is recorded into the same slot, or the slot counts twice). Returns
    /// whether it was taken: a slot that started after `now_unix_nano`, or before the
    /// [`reach_start`](Self::reach_start), or whose place a newer slot holds, is left out.
    ///
    /// A slot written with another width lands in the slot holding its start; one written with
    /// another γ has its buckets moved to the buckets of their upper bounds. The cumulative
    /// [`totals`](Self::totals) are left alone: they count since this process started.
    pub fn absorb_slot(&mut self, bytes: &[u8], now_unix_nano: u64) -> Result<bool, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != VERSION {
            return Err(r.error("unknown critical-path slot version"));
        }
        let start = r.varint()?;
        let gamma = r.f64()?;
        if !(gamma.is_finite() && gamma > 1.0) {
            return Err(r.error("gamma not above 1"));
        }
        let requests = r.keys(9, |r| {
            Ok(BucketRequests {
                count: r.varint()?,
                e2e_seconds: seconds(r)?,
            })
        })?;
        let row_count = r.len(3)?;
        let mut rows = Vec::with_capacity(row_count);
        for _ in 0..row_count {
            let service = r.text()?;
            let span = r.text()?;
            rows.push((service, span, r.keys(8, seconds)?));
        }
        r.finish()?;

        let epoch = start / self.slot_nanos;
        let now_epoch = now_unix_nano / self.slot_nanos;
        if epoch > now_epoch || epoch < self.oldest_epoch(now_epoch) {
            return Ok(false);
        }
        let index = self.slot_index(epoch);
        match self.slots[index].epoch {
            Some(e) if e == epoch => {}
            Some(e) if e > epoch => return Ok(false),
            _ => self.slots[index].reset(epoch),
        }
        let ln_gamma = gamma.ln();
        let same_gamma = (ln_gamma - self.ln_gamma).abs() < 1e-12;
        let bucket = |w: &Self, b: i32| {
            if same_gamma || b == i32::MIN {
                b
            } else {
                w.bucket((f64::from(b) * ln_gamma).exp())
            }
        };
        for (b, req) in requests {
            let b = bucket(self, b);
            let cell = self.slots[index].requests.get_mut(b);
            cell.count = cell.count.saturating_add(req.count);
            cell.e2e_seconds += req.e2e_seconds;
        }
        for (service, span, values) in rows {
            // Past the key cap a row joins the overflow, as a segment would (not counted: it is
            // no new segment).
            let key = if is_overflow_label(service) && is_overflow_label(span) {
                None
            } else {
                self.key(&Text::from(service), &Text::from(span), None)
            };
            let key = key.unwrap_or_else(|| self.overflow_key()) as usize;
            // A restored key is as idle as the end of its newest slot.
            self.last_seen[key] = self.last_seen[key].max(start.saturating_add(self.slot_nanos));
            for (b, secs) in values {
                let b = bucket(self, b);
                let seconds = &mut self.slots[index].seconds;
                if seconds.len() <= key {
                    seconds.resize_with(key + 1, BucketValues::default);
                }
                *seconds[key].get_mut(b) += secs;
            }
        }
        Ok(true)
    }
}

/// A stored number of seconds: finite and not negative, or the slot is refused.
fn seconds(r: &mut Reader<'_>) -> Result<f64, DecodeError> {
    let v = r.f64()?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(r.error("seconds negative or not finite"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::OVERFLOW_LABEL;
    use super::*;
    use crate::critical_path::CriticalPath;
    use crate::critical_path::windows::{CriticalPathWindowsConfig, TailTriple};
    use std::time::Duration;

    const SEC: u64 = 1_000_000_000;

    /// A path of `queue`, `prefill` and `decode` (service `llm`) and, one request in three, a
    /// `gateway` segment of service `edge`; lengths from `x`.
    fn path(x: u64) -> (CriticalPath, f64) {
        let parts = [
            ("llm", "queue", 0.001 + (x % 97) as f64 * 0.0007),
            ("llm", "prefill", 0.02 + (x % 13) as f64 * 0.003),
            ("llm", "decode", 0.3 + (x % 31) as f64 * 0.05),
            (
                "edge",
                "gateway",
                if x.is_multiple_of(3) { 0.004 } else { 0.0 },
            ),
        ];
        let path = super::super::tests::path(&parts);
        let e2e: f64 = parts.iter().map(|(_, _, secs)| secs).sum();
        (path, e2e + 0.002)
    }

    /// Windows that saw 2,000 requests over the 40 minutes before `now`.
    fn recorded(config: CriticalPathWindowsConfig, now: u64) -> CriticalPathWindows {
        let mut w = CriticalPathWindows::new(config);
        let mut x = 0x9e37_79b9_u64;
        for i in 0..2000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = now - 2400 * SEC + i * (2400 * SEC / 2000);
            let (p, e2e) = path(x);
            w.record(&p, e2e, at);
        }
        w
    }

    /// Every slot of `w` in its reach, encoded.
    fn stored(w: &CriticalPathWindows, now: u64) -> Vec<Vec<u8>> {
        (w.reach_start(now) / w.slot_nanos()..=now / w.slot_nanos())
            .filter_map(|e| w.encode_slot(e * w.slot_nanos()).map(|(_, b)| b))
            .collect()
    }

    const WINDOWS: [u64; 4] = [60, 300, 1800, 3600];

    #[test]
    fn restored_windows_read_what_the_stored_ones_did() {
        let now = 1_800_000_000 * SEC + 3 * SEC;
        let before = recorded(CriticalPathWindowsConfig::default(), now);
        let slots = stored(&before, now);
        assert!(slots.len() > 200, "{}", slots.len());
        let mut after = CriticalPathWindows::default();
        for s in &slots {
            assert!(after.absorb_slot(s, now).unwrap());
        }
        for secs in WINDOWS {
            let window = Duration::from_secs(secs);
            let (a, b) = (before.snapshot(window, now), after.snapshot(window, now));
            assert!(a.requests > 0);
            // The same values, summed in another order (a bucket's place in a slot may differ).
            let close = |x: f64, y: f64| (x - y).abs() <= 1e-12 * x.abs().max(1.0);
            let triple = |x: TailTriple, y: TailTriple| {
                close(x.all, y.all) && close(x.p90, y.p90) && close(x.p99, y.p99)
            };
            assert_eq!(
                (a.window_seconds, a.requests, a.tail_requests),
                (b.window_seconds, b.requests, b.tail_requests)
            );
            assert!(triple(a.e2e_seconds, b.e2e_seconds), "{secs} s");
            assert_eq!(a.entries.len(), b.entries.len());
            for (x, y) in a.entries.iter().zip(&b.entries) {
                assert_eq!((&x.service, &x.span), (&y.service, &y.span), "{secs} s");
                assert!(triple(x.seconds, y.seconds), "{secs} s: {x:?} {y:?}");
                assert!(triple(x.share, y.share), "{secs} s: {x:?} {y:?}");
            }
        }
        // Totals count this process only.
        assert!(after.totals().all(|t| t.seconds == 0.0));
        assert_eq!(after.overflowed_segments(), 0);
    }

    #[test]
    fn another_slot_width_or_gamma_is_taken_in_at_bucket_resolution() {
        let now = 1_800_000_000 * SEC;
        let before = recorded(CriticalPathWindowsConfig::default(), now);
        let mut after = CriticalPathWindows::new(CriticalPathWindowsConfig {
            slot: Duration::from_secs(60),
            gamma: 1.05,
            ..CriticalPathWindowsConfig::default()
        });
        for s in stored(&before, now) {
            assert!(after.absorb_slot(&s, now).unwrap());
        }
        let window = Duration::from_secs(3600);
        let (a, b) = (before.snapshot(window, now), after.snapshot(window, now));
        assert_eq!(a.requests, b.requests);
        assert!((a.e2e_seconds.all - b.e2e_seconds.all).abs() < 1e-9);
        for (x, y) in a.entries.iter().zip(&b.entries) {
            assert_eq!((&x.service, &x.span), (&y.service, &y.span));
            assert!((x.share.all - y.share.all).abs() < 1e-9);
            // The tails move by at most a bucket of the coarser γ.
            assert!((x.share.p90 - y.share.p90).abs() < 0.05, "{x:?} {y:?}");
        }
    }

    #[test]
    fn buckets_of_another_gamma_rank_among_new_requests_by_their_e2e() {
        let now = 1_800_000_000 * SEC;
        let one = |e2e: f64| super::super::tests::path(&[("llm", "decode", e2e)]);
        let mut old = CriticalPathWindows::default();
        old.record(&one(2.0), 2.0, now - 20 * SEC);
        let (_, bytes) = old.encode_slot(now - 20 * SEC).unwrap();
        let mut new = CriticalPathWindows::new(CriticalPathWindowsConfig {
            gamma: 1.05,
            ..CriticalPathWindowsConfig::default()
        });
        assert!(new.absorb_slot(&bytes, now).unwrap());
        for e2e in [1.0; 9].into_iter().chain([2.5, 3.0]) {
            new.record(&one(e2e), e2e, now);
        }
        // The p99 tail of these 12 is the two slowest: the new 2.5 s and 3 s requests
        // (unconverted, the old 2 s bucket would read as 1.05^36 ≈ 5.8 s and take a place).
        let s = new.snapshot(Duration::from_secs(60), now);
        assert_eq!(s.tail_requests.p99, 2.0);
        assert!((s.e2e_seconds.p99 - 5.5).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn slots_outside_the_retention_or_from_the_future_are_left_out() {
        let now = 1_800_000_000 * SEC;
        let mut w = CriticalPathWindows::default();
        let (p, e2e) = path(1);
        w.record(&p, e2e, now);
        let (_, bytes) = w.encode_slot(now).unwrap();
        let mut later = CriticalPathWindows::default();
        assert!(
            !later.absorb_slot(&bytes, now - 10 * SEC).unwrap(),
            "future"
        );
        assert!(
            !later.absorb_slot(&bytes, now + 3600 * SEC).unwrap(),
            "too old"
        );
        assert!(later.absorb_slot(&bytes, now + 3590 * SEC).unwrap());
        assert_eq!(
            later
                .snapshot(Duration::from_secs(3600), now + 3590 * SEC)
                .requests,
            1
        );
        assert_eq!(w.encode_slot(now + 3600 * SEC), None, "nothing there");
    }

    #[test]
    fn the_overflow_row_comes_back_as_the_overflow() {
        let now = 1_800_000_000 * SEC;
        let keys = |max_keys| {
            CriticalPathWindows::new(CriticalPathWindowsConfig {
                max_keys,
                ..CriticalPathWindowsConfig::default()
            })
        };
        let mut before = keys(1);
        let two = super::super::tests::path(&[("a", "x", 1.0), ("b", "y", 1.0)]);
        before.record(&two, 2.0, now);
        let (_, bytes) = before.encode_slot(now).unwrap();
        // Restored below its cap, the overflow row still takes no key's place.
        let mut after = keys(2);
        assert!(after.absorb_slot(&bytes, now).unwrap());
        after.record(&super::super::tests::path(&[("c", "z", 1.0)]), 1.0, now);
        let labels: Vec<(String, String)> = after
            .snapshot(Duration::from_secs(60), now)
            .entries
            .iter()
            .map(|e| (e.service.to_string(), e.span.to_string()))
            .collect();
        let overflow = (OVERFLOW_LABEL.to_owned(), OVERFLOW_LABEL.to_owned());
        let named = |s: &str, n: &str| (s.to_owned(), n.to_owned());
        assert_eq!(labels, vec![overflow, named("a", "x"), named("c", "z")]);
    }

    /// History written while the overflow row was labelled `_overflow` restores it as the
    /// overflow row, not as a key of that name.
    #[test]
    fn an_overflow_row_stored_under_the_old_label_is_restored_as_the_overflow() {
        let now = 1_800_000_000 * SEC;
        let mut before = CriticalPathWindows::default();
        let old = crate::kpi::OLD_OVERFLOW_LABEL;
        let path = super::super::tests::path(&[(old, old, 1.0), ("a", "x", 1.0)]);
        before.record(&path, 2.0, now);
        let (_, bytes) = before.encode_slot(now).unwrap();
        let mut after = CriticalPathWindows::default();
        assert!(after.absorb_slot(&bytes, now).unwrap());
        let mut labels: Vec<(String, String)> = after
            .snapshot(Duration::from_secs(60), now)
            .entries
            .iter()
            .map(|e| (e.service.to_string(), e.span.to_string()))
            .collect();
        labels.sort();
        let named = |s: &str, n: &str| (s.to_owned(), n.to_owned());
        assert_eq!(
            labels,
            vec![named(OVERFLOW_LABEL, OVERFLOW_LABEL), named("a", "x")]
        );
    }

    #[test]
    fn negative_or_infinite_seconds_are_refused() {
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let mut bytes = Vec::new();
            let mut w = Writer(&mut bytes);
            w.u8(VERSION);
            w.varint(1_800_000_000 * SEC);
            w.f64(1.02);
            w.keys(&[(0, bad)], |w, e2e| {
                w.varint(1);
                w.f64(*e2e);
            });
            w.varint(0);
            let mut windows = CriticalPathWindows::default();
            assert!(
                windows.absorb_slot(&bytes, 1_800_000_000 * SEC).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn damaged_bytes_are_refused_not_taken_in_part() {
        let now = 1_800_000_000 * SEC;
        let w = recorded(CriticalPathWindowsConfig::default(), now);
        let (_, bytes) = w.encode_slot(now - SEC).unwrap();
        let mut fresh = CriticalPathWindows::default();
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
            assert!(fresh.absorb_slot(&bytes[..cut], now).is_err(), "{cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(fresh.absorb_slot(&longer, now).is_err());
        let mut version = bytes;
        version[0] = 9;
        assert!(fresh.absorb_slot(&version, now).is_err());
        assert_eq!(fresh.snapshot(Duration::from_secs(3600), now).requests, 0);
    }
}
