//! KPI windows: per-series sliding windows of mergeable aggregates, queried as [`KpiSnapshot`]s.
//!
//! # Model
//! A *series* is one (service, model, operation) — or fewer dimensions, see
//! [`KpiConfig::dimensions`]. Each series keeps, for every configured window length `W`, a ring
//! of [`KpiConfig::slots_per_window`] time slots of `W / slots` each (1m → 1 s slots, 5m → 5 s,
//! 1h → 60 s with the default 60). A slot holds an [`Accumulator`]: exact counters, token sums,
//! phase sums, and sparse DDSketches ([`Distribution`], relative error
//! [`SKETCH_RELATIVE_ACCURACY`]) of every latency. Memory grows with the occupied sketch buckets
//! of each slot (8 bytes per bucket and latency, 48 per e2e bucket for tail phase sums), so it
//! follows traffic; fewer slots per window trade sliding granularity for memory.
//! A snapshot merges the slots of the window; slots older than the window are ignored and reused.
//!
//! A record is added to the finest ring only; when that ring moves on to a new slot, the slots
//! it completed are *rolled up* — merged once into the slot of every coarser ring whose slot
//! length is a multiple of the finest one (all of them with the default windows). A snapshot
//! of a coarser window adds the finest ring's slots not yet rolled up. Each record thus costs
//! one sketch update per latency instead of one per window (the windows' contents are exactly
//! what adding to each would give); a coarser ring whose slots are not a multiple of the
//! finest ones gets every record directly instead.
//!
//! # Which time counts
//! A record lands in the slot of `now_unix_nano`, the moment it reached the KPIs (the collector's
//! clock), not its span's end time: remote clocks may be skewed, and the assembler hands each
//! request over within its grace period of the request's end. The clock passed in is expected to
//! be non-decreasing; a record older than a ring's whole window is left out of that ring.
//!
//! # Which window a snapshot reads
//! The window covers the current (partial) slot and the `n − 1` slots before it, where `n` is the
//! number of slots of the window asked for. Rates (`throughput`, `goodput.requests_per_second`)
//! divide by the time covered: from the start of the oldest slot read, or from the start of
//! the KPIs (see [`KpiWindows::set_start`]) if that is later, to `now`. So a collector running
//! for 10 s reports a true per-second rate in its 1h window, not one diluted 360 times.
//!
//! # What counts where
//! - `requests` counts every outcome; `errors`, `cancelled`, `rejected` by outcome.
//! - Latency distributions and phase shares count `ok` requests only (a rejected request's
//!   zero latency or an error's early exit would otherwise make an overloaded service look
//!   fast); tokens and GPU energy count every outcome.
//! - Goodput: an `ok` request is *good* when it meets every SLO that applies — an SLO applies
//!   when it is configured and the request has that value (a generic-dialect request without
//!   TTFT is judged on e2e only). `ratio = good / (requests − cancelled)`: errors and rejections
//!   count as not good; cancelled requests are left out (the client ended them).
//! - Phase shares: Σ queue, Σ prefill, Σ decode over Σ e2e, over `ok` requests that have all
//!   three phases. The p90 / p99 shares cover the requests whose e2e falls in the e2e sketch's
//!   bucket of the window's p90 / p99 or above (exact up to bucket resolution, ±α).
//!
//! # Cardinality
//! At most [`KpiConfig::max_series`] series. A new series that finds the cap reached takes the
//! place of the least recently recorded series if that one has had no record for
//! [`KpiConfig::series_reclaim_after`] (default 1 min; counted in
//! [`KpiWindows::reclaimed_series`]) — so a burst of junk names cannot lock a real model out for
//! longer than that, and series restored from history are reclaimable as soon as they are that
//! old. The reclaimed series' slots fold into the overflow series, so no request leaves a
//! window. Otherwise its records go to one overflow series labelled [`OVERFLOW_LABEL`] and are
//! counted ([`KpiWindows::overflowed_records`]). A restore ([`KpiWindows::restore_slots`]) gives
//! the places to the most recently active stored series and the rest, with stored overflow
//! rows, to the overflow series, which never takes a place and is never reclaimed. A series
//! with no record for longer than the longest window is dropped, freeing its place. Every series removed either way is handed out
//! by [`KpiWindows::take_removed_series`], so that a consumer labelling alike (the Prometheus
//! exporter) can remove it too.

mod accumulator;
mod config;
mod disagg;
mod distribution;
mod labelling;
mod read;
mod ring;
mod series;
mod snapshot;

pub use crate::codec::DecodeError;
pub use accumulator::{Accumulator, Counts, PhaseSums, meets_slos};
pub use config::{KpiConfig, SloConfig};
pub use disagg::{
    DisaggAccumulator, DisaggKpis, MAX_WORKERS, Pool, PoolKpis, SUB_PHASES, SubPhaseKpis,
    WorkerKpis,
};
pub use distribution::{
    Distribution, LatencyStats, SKETCH_RELATIVE_ACCURACY, ZERO_BUCKET, bucket_of, bucket_value,
    sketch_config,
};
#[cfg(test)]
pub(crate) use labelling::OLD_OVERFLOW_LABEL;
pub(crate) use labelling::is_overflow_label;
pub use labelling::{Dimension, Labelling, OVERFLOW_LABEL};
pub use read::series_kpis;
pub use series::{KpiWindows, SeriesKey, SlotHistory, TappedSlot};
pub use snapshot::{
    Goodput, GpuKpis, GpuPhaseUtilization, KpiSnapshot, PhaseShare, PhaseShares, SeriesKpis,
    Throughput, TokenTotals,
};

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::record::{Dialect, RequestRecord};
    use crate::text::Text;
    use crate::trace::{SpanId, TraceId};

    const SEC: u64 = 1_000_000_000;

    fn rec(e2e: f64) -> RequestRecord {
        let mut r = RequestRecord::new(
            TraceId([1; 16]),
            SpanId([1; 8]),
            Text::from("s"),
            Dialect::Generic,
            0,
            0,
        );
        r.e2e = e2e;
        r
    }

    fn model_rec(model: &str) -> RequestRecord {
        let mut r = rec(0.5);
        r.model = Text::from(model);
        r
    }

    #[test]
    fn a_burst_of_junk_series_locks_a_real_one_out_only_until_they_are_reclaimable() {
        let mut w = KpiWindows::new(KpiConfig {
            max_series: 10,
            ..KpiConfig::default()
        });
        let t = 10_000 * SEC;
        for i in 0..11 {
            w.record(&model_rec(&format!("junk-{i}")), t);
        }
        assert_eq!(w.overflowed_records(), 1);
        // Within the reclaim horizon the real model has to wait in the overflow series.
        assert!(!w.record(&model_rec("llama"), t + 30 * SEC));
        assert_eq!(w.reclaimed_series(), 0);
        // One junk series stays busy; the others are idle past the horizon.
        w.record(&model_rec("junk-3"), t + 50 * SEC);
        assert!(
            w.record(&model_rec("llama"), t + 61 * SEC),
            "takes an idle one's place"
        );
        assert!(w.record(&model_rec("llama"), t + 62 * SEC), "and keeps it");
        assert_eq!(w.reclaimed_series(), 1);
        assert_eq!(w.series_count(), 10);
        let removed = w.take_removed_series();
        assert_eq!(removed.len(), 1);
        assert!(removed[0].model.starts_with("junk-") && &*removed[0].model != "junk-3");
        assert!(w.take_removed_series().is_empty());
        // Every series is still found where it is (the index follows the swap).
        for m in ["junk-3", "llama"] {
            let before = w.overflowed_records();
            assert!(w.record(&model_rec(m), t + 63 * SEC));
            assert_eq!(w.overflowed_records(), before);
        }
        let snap = w.snapshot(Duration::from_secs(60), t + 63 * SEC);
        let llama = snap.series.iter().find(|s| s.model == "llama").unwrap();
        assert_eq!(llama.requests, 3);
        // Nine more new series: eight idle junk series are reclaimable, junk-3 is not yet.
        for i in 0..9 {
            w.record(&model_rec(&format!("new-{i}")), t + 64 * SEC);
        }
        assert_eq!(w.reclaimed_series(), 9);
        assert_eq!(w.series_count(), 10);
    }

    #[test]
    fn late_records_reach_the_tap_together_per_series_and_slot() {
        let mut w = KpiWindows::new(KpiConfig::default());
        w.enable_slot_tap();
        let now = 1_000 * 60 * SEC;
        // The slot at `now` is complete and handed on; then a tick that began in it records
        // 1,000 traces there, alternating between two models.
        w.record(&model_rec("a"), now);
        w.record(&model_rec("b"), now);
        w.roll_due(now + SEC);
        assert_eq!(w.take_tapped().len(), 2);
        for i in 0..1_000 {
            w.record(&model_rec(if i % 2 == 0 { "a" } else { "b" }), now);
        }
        let tapped = w.take_tapped();
        let requests: u64 = tapped.iter().map(|t| t.accumulator.counts.requests).sum();
        assert_eq!(requests, 1_000, "every record once");
        assert!(
            tapped.len() <= 4,
            "one accumulator per series and slot, not one per late record: {}",
            tapped.len()
        );
    }

    #[test]
    fn restored_minutes_refill_the_short_windows_once() {
        let minute = 60 * SEC;
        let now = 1_000 * minute + 20 * SEC;
        let mut w = KpiWindows::new(KpiConfig::default());
        w.enable_slot_tap();
        let key = SeriesKey {
            service: Arc::from("s"),
            model: Arc::from(""),
            operation: Arc::from(""),
        };
        let minute_of = |n: u64| {
            let mut acc = Accumulator::default();
            for _ in 0..n {
                acc.add(&sketch_config(), &SloConfig::default(), &rec(0.5));
            }
            acc
        };
        // Minutes 994 and 996..=999 ended before now; minute 1000 was interrupted 20 s in.
        for (m, n) in [(994, 1), (996, 2), (997, 3), (998, 4), (999, 5), (1000, 6)] {
            assert!(w.absorb_restored(&key, m * minute, minute, &minute_of(n), now));
        }
        let requests = |w: &KpiWindows, window: u64, at: u64| -> u64 {
            w.snapshot(Duration::from_secs(window), at)
                .series
                .iter()
                .map(|s| s.requests)
                .sum()
        };
        assert_eq!(
            requests(&w, 60, now),
            5 + 6,
            "minutes ending in the last minute"
        );
        assert_eq!(
            requests(&w, 300, now),
            2 + 3 + 4 + 5 + 6,
            "minute 994 ended 5m20s ago"
        );
        assert_eq!(requests(&w, 3600, now), 21, "the hour, minute by minute");
        // Rates divide by the time the restored minutes' requests cover: from minute 999's
        // start in the 1m window (80 s, not 60). The 5m window's oldest slot starts 295 s ago,
        // in minute 995, which had no request: 295 s.
        let rate = |w: &KpiWindows, window: u64, at: u64| -> f64 {
            w.snapshot(Duration::from_secs(window), at)
                .series
                .iter()
                .map(|s| s.throughput.requests_per_second)
                .sum()
        };
        assert!((rate(&w, 60, now) - 11.0 / 80.0).abs() < 1e-9);
        assert!((rate(&w, 300, now) - 20.0 / 295.0).abs() < 1e-9);
        // Once minute 999's slot has left the 1m window, from minute 1000's start.
        let later = 1_001 * minute + 5 * SEC;
        assert_eq!(requests(&w, 60, later), 6);
        assert!((rate(&w, 60, later) - 6.0 / 65.0).abs() < 1e-9);
        // Live records add to it; the restored slots are never handed on a second time.
        w.record(&rec(0.5), now + SEC);
        w.roll_due(now + 2 * SEC);
        let tapped: u64 = w
            .take_tapped()
            .iter()
            .map(|t| t.accumulator.counts.requests)
            .sum();
        assert_eq!(
            tapped, 1,
            "only the live record reaches the history store again"
        );
        assert_eq!(requests(&w, 60, now + 2 * SEC), 12);
        assert_eq!(requests(&w, 3600, now + 2 * SEC), 22);
    }

    /// The windows' start after a restart is when the store's data begins (the pipeline sets
    /// it): within the first restored minute, which counts whole, or before it, quiet time
    /// counting as time.
    #[test]
    fn rates_after_a_restart_count_from_when_the_stores_data_begins() {
        let minute = 60 * SEC;
        let now = 1_000 * minute + 20 * SEC;
        let restored = || {
            let mut w = KpiWindows::new(KpiConfig::default());
            w.set_start(now);
            let key = SeriesKey {
                service: Arc::from("s"),
                model: Arc::from(""),
                operation: Arc::from(""),
            };
            for (m, n) in [(996, 2), (997, 3), (998, 4), (999, 5), (1000, 6)] {
                let mut acc = Accumulator::default();
                for _ in 0..n {
                    acc.add(&sketch_config(), &SloConfig::default(), &rec(0.5));
                }
                assert!(w.absorb_restored(&key, m * minute, minute, &acc, now));
            }
            w
        };
        let rate = |w: &KpiWindows, window: u64| -> f64 {
            w.snapshot(Duration::from_secs(window), now)
                .series
                .iter()
                .map(|s| s.throughput.requests_per_second)
                .sum()
        };
        // From minute 996's start, as the restored minutes alone say: 260 s.
        assert!((rate(&restored(), 3600) - 20.0 / 260.0).abs() < 1e-9);
        // The store's first collector started 40 s into it: 220 s, in the 1h and 5m windows.
        let mut w = restored();
        w.set_start(996 * minute + 40 * SEC);
        assert!((rate(&w, 3600) - 20.0 / 220.0).abs() < 1e-9);
        assert!((rate(&w, 300) - 20.0 / 220.0).abs() < 1e-9);
        // It started six minutes before the first request: the quiet time counts, in the 1h
        // window 620 s, in the 5m window its whole 295 s.
        let mut w = restored();
        w.set_start(990 * minute);
        assert!((rate(&w, 3600) - 20.0 / 620.0).abs() < 1e-9);
        assert!((rate(&w, 300) - 20.0 / 295.0).abs() < 1e-9);
        // The collector was down from 40 s into minute 997 to 10 s into 998 (30 s): the
        // rates divide by the 590 s and 265 s that were seen; the 1m window holds none of it.
        let one_minute = rate(&w, 60);
        w.set_unseen(vec![(997 * minute + 40 * SEC, 998 * minute + 10 * SEC)]);
        assert!((rate(&w, 3600) - 20.0 / 590.0).abs() < 1e-9);
        assert!((rate(&w, 300) - 20.0 / 265.0).abs() < 1e-9);
        assert_eq!(rate(&w, 60), one_minute);
    }

    #[test]
    fn restored_series_are_reclaimable_once_idle() {
        let mut w = capped(2);
        let minute = 60 * SEC;
        let t = 1_000 * minute;
        for model in ["junk-a", "junk-b"] {
            let key = SeriesKey {
                service: Arc::from("s"),
                model: Arc::from(model),
                operation: Arc::from(""),
            };
            let mut acc = Accumulator::default();
            acc.add(&sketch_config(), &SloConfig::default(), &model_rec(model));
            assert!(w.absorb_slot(&key, t - 5 * minute, minute, &acc));
        }
        assert_eq!(w.series_count(), 2);
        assert!(
            w.record(&model_rec("llama"), t),
            "restored history does not lock it out"
        );
        assert_eq!(w.reclaimed_series(), 1);
    }

    /// The series key the windows give `model_rec(model)`.
    fn model_key(model: &str) -> SeriesKey {
        SeriesKey {
            service: Arc::from("s"),
            model: Arc::from(model),
            operation: Arc::from(crate::record::UNKNOWN),
        }
    }

    /// A stored overflow row's key, under `label`.
    fn overflow_key(label: &str) -> SeriesKey {
        SeriesKey {
            service: Arc::from(label),
            model: Arc::from(label),
            operation: Arc::from(label),
        }
    }

    /// `n` requests of `model`, as one stored slot would hold them.
    fn requests_of(model: &str, n: u64) -> Accumulator {
        let mut acc = Accumulator::default();
        for _ in 0..n {
            acc.add(&sketch_config(), &SloConfig::default(), &model_rec(model));
        }
        acc
    }

    /// Restores `rows` of `(key, minute index, requests)` as the history store does (minute
    /// rollups, in stored order) and returns how many landed.
    fn restore(w: &mut KpiWindows, rows: &[(SeriesKey, u64, u64)], now: u64) -> usize {
        let minute = 60 * SEC;
        let accs: Vec<Accumulator> = rows.iter().map(|r| requests_of(&r.0.model, r.2)).collect();
        w.restore_slots(
            rows.iter()
                .zip(&accs)
                .map(|((key, m, _), acc)| (key, m * minute, minute, acc)),
            now,
        )
    }

    /// Requests per row of the 1h window at `now`, as (model label, requests).
    fn hour_rows(w: &KpiWindows, now: u64) -> Vec<(String, u64)> {
        w.snapshot(Duration::from_secs(3600), now)
            .series
            .iter()
            .map(|s| (s.model.clone(), s.requests))
            .collect()
    }

    fn overflow_rows(rows: &[(String, u64)]) -> Vec<u64> {
        rows.iter()
            .filter(|(m, _)| is_overflow_label(m))
            .map(|r| r.1)
            .collect()
    }

    fn requests_of_row(rows: &[(String, u64)], model: &str) -> Option<u64> {
        rows.iter().find(|(m, _)| m == model).map(|r| r.1)
    }

    fn total_of(rows: &[(String, u64)]) -> u64 {
        rows.iter().map(|r| r.1).sum()
    }

    /// Windows of the default config capped at `max_series`.
    fn capped(max_series: usize) -> KpiWindows {
        KpiWindows::new(KpiConfig {
            max_series,
            ..KpiConfig::default()
        })
    }

    #[test]
    fn stored_overflow_rows_restore_into_the_one_overflow_series_without_taking_a_place() {
        let mut w = capped(2);
        let m = 1_000;
        let now = (m + 1) * 60 * SEC + 20 * SEC;
        // Stored order (by minute, then labels): the overflow row under both labels, then
        // two series that fit the cap exactly.
        let rows = [
            (overflow_key(OVERFLOW_LABEL), m, 3),
            (overflow_key(OLD_OVERFLOW_LABEL), m, 2),
            (model_key("a"), m, 1),
            (model_key("b"), m, 1),
        ];
        let sent: u64 = rows.iter().map(|r| r.2).sum();
        assert_eq!(restore(&mut w, &rows, now), 4);
        let got = hour_rows(&w, now);
        assert_eq!(overflow_rows(&got), [5], "one overflow row: {got:?}");
        assert_eq!(requests_of_row(&got, "a"), Some(1), "{got:?}");
        assert_eq!(requests_of_row(&got, "b"), Some(1), "{got:?}");
        assert_eq!(w.series_count(), 2, "the overflow takes no place");
        assert_eq!(total_of(&got), sent);
        // The restored overflow is no series to reclaim: once a and b are idle past the
        // horizon, a new model takes one of their places and the other's requests stay.
        let later = now + 120 * SEC;
        assert!(w.record(&model_rec("c"), later));
        let got = hour_rows(&w, later);
        assert_eq!(overflow_rows(&got).len(), 1, "{got:?}");
        assert_eq!(requests_of_row(&got, "c"), Some(1));
        assert_eq!(total_of(&got), sent + 1, "{got:?}");
    }

    #[test]
    fn a_reclaimed_series_keeps_its_requests_in_the_windows() {
        // Live: a takes a place, then is reclaimed for c; its two requests stay counted (in
        // the overflow row), and reach the history store once, under a.
        let mut w = capped(2);
        w.enable_slot_tap();
        let t = 10_000 * 60 * SEC;
        for model in ["a", "a", "b"] {
            assert!(w.record(&model_rec(model), t));
        }
        assert!(w.record(&model_rec("c"), t + 61 * SEC));
        assert_eq!(w.reclaimed_series(), 1);
        let now = t + 62 * SEC;
        for window in [300, 3600] {
            let total: u64 = w
                .snapshot(Duration::from_secs(window), now)
                .series
                .iter()
                .map(|s| s.requests)
                .sum();
            assert_eq!(total, 4, "{window}s window");
        }
        w.roll_due(now);
        let tapped = w.take_tapped();
        let of = |model: &str| -> u64 {
            tapped
                .iter()
                .filter(|s| &*s.key.model == model)
                .map(|s| s.accumulator.counts.requests)
                .sum()
        };
        assert_eq!((of("a"), of("b"), of("c")), (2, 1, 1));
        assert_eq!(
            of(OVERFLOW_LABEL),
            0,
            "the folded slots are not handed on again"
        );

        // Restored (the reviewer's reproduction): the stored overflow row (3), j1..j5 and
        // realB (1 each) under a cap of 5; then live requests of realB.
        let mut w = KpiWindows::new(KpiConfig {
            max_series: 5,
            series_reclaim_after: Duration::from_secs(5),
            ..KpiConfig::default()
        });
        let m = 10_000;
        let now = m * 60 * SEC + 30 * SEC;
        let mut rows = vec![(overflow_key(OVERFLOW_LABEL), m, 3)];
        rows.extend((1..=5).map(|i| (model_key(&format!("j{i}")), m, 1)));
        rows.push((model_key("realB"), m, 1));
        let mut sent: u64 = rows.iter().map(|r| r.2).sum();
        restore(&mut w, &rows, now);
        let total = |w: &KpiWindows, at| total_of(&hour_rows(w, at));
        assert_eq!(total(&w, now), sent);
        assert_eq!(overflow_rows(&hour_rows(&w, now)).len(), 1);
        for at in [now + SEC, now + 6 * SEC, now + 7 * SEC] {
            w.record(&model_rec("realB"), at);
            sent += 1;
            let got = hour_rows(&w, at);
            assert_eq!(total(&w, at), sent, "{got:?}");
            assert_eq!(overflow_rows(&got).len(), 1, "{got:?}");
        }
        assert!(w.reclaimed_series() >= 1);
        assert!(
            w.record(&model_rec("realB"), now + 8 * SEC),
            "realB has its place"
        );
    }

    #[test]
    fn restore_gives_the_places_to_the_most_recently_active_series() {
        let mut w = capped(2);
        let m = 1_000;
        let now = (m + 2) * 60 * SEC + 20 * SEC;
        // A burst of junk names in minute m, then a real model alone in minute m + 1 (stored
        // after them).
        let rows = [
            (model_key("junk-1"), m, 1),
            (model_key("junk-2"), m, 1),
            (model_key("junk-3"), m, 1),
            (model_key("real"), m + 1, 1),
        ];
        restore(&mut w, &rows, now);
        let got = hour_rows(&w, now);
        assert_eq!(requests_of_row(&got, "real"), Some(1), "{got:?}");
        assert_eq!(overflow_rows(&got), [2], "two of the junk series: {got:?}");
        assert_eq!(total_of(&got), 4);
        assert!(
            w.record(&model_rec("real"), now),
            "its next request finds its own series"
        );
        assert_eq!(requests_of_row(&hour_rows(&w, now), "real"), Some(2));
    }

    #[test]
    fn ring_geometry_follows_the_config() {
        let w = KpiWindows::new(KpiConfig {
            windows: vec![
                Duration::from_secs(3600),
                Duration::ZERO,
                Duration::from_secs(60),
            ],
            slots_per_window: 12,
            ..KpiConfig::default()
        });
        assert_eq!(
            w.windows(),
            vec![Duration::from_secs(60), Duration::from_secs(3600)]
        );
        assert_eq!(w.specs[0].slot_nanos, 5 * SEC);
        assert_eq!(w.specs[1].slot_nanos, 300 * SEC);
        let none = KpiWindows::new(KpiConfig {
            windows: vec![],
            ..KpiConfig::default()
        });
        assert_eq!(none.windows(), vec![Duration::from_secs(60)]);
    }

    #[test]
    fn a_record_older_than_a_ring_is_left_out_of_it_only() {
        let mut w = KpiWindows::new(KpiConfig::default());
        let t = 10_000 * SEC;
        w.record(&rec(1.0), t);
        w.record(&rec(2.0), t - 120 * SEC); // the clock went back two minutes
        let requests = |window| {
            w.snapshot(Duration::from_secs(window), t)
                .series
                .first()
                .map_or(0, |s| s.requests)
        };
        assert_eq!(requests(60), 1);
        assert_eq!(requests(300), 2);
        assert_eq!(requests(3600), 2);
    }

    #[test]
    fn memory_estimate_grows_with_data() {
        let mut w = KpiWindows::new(KpiConfig::default());
        let empty = w.approx_memory_bytes();
        for k in 0..100u64 {
            w.record(&rec(0.1 + k as f64 * 0.01), 10_000 * SEC + k * SEC);
        }
        assert!(w.approx_memory_bytes() > empty);
    }

    #[test]
    fn records_find_their_series_through_the_recent_cache_and_after_an_expiry() {
        let mut w = KpiWindows::new(KpiConfig::default());
        let (a, b) = (Text::from("svc-a"), Text::from("svc-b"));
        let of = |service: &Text| {
            let mut r = rec(1.0);
            r.service = service.clone();
            r
        };
        let t = 10_000 * SEC;
        // Alternating series, repeats of one, and an equal text in another allocation.
        for service in [&a, &a, &b, &a, &b, &b, &Text::from("svc-a")] {
            w.record(&of(service), t);
        }
        let count = |w: &KpiWindows, name: &str, now| {
            w.snapshot(Duration::from_secs(60), now)
                .series
                .iter()
                .find(|s| s.service == name)
                .map_or(0, |s| s.requests)
        };
        w.record(&of(&b), t);
        assert_eq!((count(&w, "svc-a", t), count(&w, "svc-b", t)), (4, 4));
        assert_eq!(w.series_count(), 2);
        // The last record was b's, the second series. a goes quiet past the longest window
        // (an hour) and the next record's sweep expires it: b moves to the first position, so
        // a cached position would now be wrong.
        let later = t + 5400 * SEC;
        w.record(&of(&b), later);
        assert_eq!(w.series_count(), 1, "a expired");
        w.record(&of(&b), later);
        w.record(&of(&a), later);
        assert_eq!(w.series_count(), 2);
        assert_eq!(
            (count(&w, "svc-a", later), count(&w, "svc-b", later)),
            (1, 2)
        );
    }

    #[test]
    fn minutes_absorbed_into_the_finest_ring_reach_the_rolled_up_ring() {
        // Windows whose finest slots are minutes: restored minutes land in the finest ring,
        // and 119 of them wrap its 60 slots; none may be lost from the two-hour window, which
        // must hold what a two-hour window alone would.
        let config = sketch_config();
        let slo = SloConfig::default();
        let windows = |w: &[u64]| {
            KpiWindows::new(KpiConfig {
                windows: w.iter().map(|s| Duration::from_secs(*s)).collect(),
                ..KpiConfig::default()
            })
        };
        let (mut both, mut hour, mut two_hours) =
            (windows(&[3600, 7200]), windows(&[3600]), windows(&[7200]));
        let now = 1_000_000 * 60 * SEC;
        let key = SeriesKey {
            service: Arc::from("s"),
            model: Arc::from(crate::record::UNKNOWN),
            operation: Arc::from(crate::record::UNKNOWN),
        };
        for m in (1..=119u64).rev() {
            let mut acc = Accumulator::default();
            acc.add(&config, &slo, &rec(1.0));
            for w in [&mut both, &mut hour, &mut two_hours] {
                w.absorb_slot(&key, now - m * 60 * SEC, 60 * SEC, &acc);
            }
        }
        let requests = |w: &KpiWindows, window: u64| {
            w.snapshot(Duration::from_secs(window), now).series[0].requests
        };
        assert_eq!(requests(&both, 7200), requests(&two_hours, 7200));
        assert!(requests(&both, 7200) >= 118);
        assert_eq!(requests(&both, 3600), requests(&hour, 3600));
    }

    #[test]
    fn absorbed_minutes_fill_the_hour_window() {
        let config = sketch_config();
        let slo = SloConfig::default();
        let mut w = KpiWindows::new(KpiConfig::default());
        let now = 100_000 * SEC;
        w.set_start(now - SEC);
        let key = SeriesKey {
            service: Arc::from("s"),
            model: Arc::from(crate::record::UNKNOWN),
            operation: Arc::from(crate::record::UNKNOWN),
        };
        let minute = |m: u64| (now / (60 * SEC) - m) * 60 * SEC;
        for m in 1..=3u64 {
            let mut acc = Accumulator::default();
            for _ in 0..m {
                acc.add(&config, &slo, &rec(m as f64));
            }
            assert!(w.absorb_slot(&key, minute(m), 60 * SEC, &acc));
        }
        // Not aligned to any 1h slot: refused.
        assert!(!w.absorb_slot(&key, minute(5) + SEC, 60 * SEC, &{
            let mut a = Accumulator::default();
            a.add(&config, &slo, &rec(1.0));
            a
        }));
        w.record(&rec(10.0), now);
        let hour = w.snapshot(Duration::from_secs(3600), now);
        assert_eq!(hour.series.len(), 1);
        assert_eq!(hour.series[0].requests, 1 + 2 + 3 + 1);
        // Rates cover the restored minutes, not just the uptime.
        let rps = hour.series[0].throughput.requests_per_second;
        let covered = (now - minute(3)) as f64 / 1e9;
        assert!((rps - 7.0 / covered).abs() < 1e-9, "{rps}");
        // The 1m window holds only the live record.
        assert_eq!(
            w.snapshot(Duration::from_secs(60), now).series[0].requests,
            1
        );
    }
}
