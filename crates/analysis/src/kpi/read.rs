//! Reading the windows: a window's [`KpiSnapshot`] (the slots it covers merged per series),
//! one series' accumulator, and per-slot history.

use std::time::Duration;

use sketches_ddsketch::Config;

use super::accumulator::{self, Accumulator};
use super::config::SloConfig;
use super::series::{KpiWindows, Series, SeriesKey, SlotHistory};
use super::snapshot::{KpiSnapshot, SeriesKpis, Throughput};

/// Reading the windows: snapshots, one series' accumulator, per-slot history.
impl KpiWindows {
    /// The ring that serves `window`: the configured one of that length, else the shortest
    /// longer one, else the longest. Returns its position and the slots to read.
    pub(super) fn ring_for(&self, window: Duration) -> (usize, u64) {
        let w = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1);
        let pos = self
            .specs
            .iter()
            .position(|s| s.window_nanos >= w)
            .unwrap_or(self.specs.len() - 1);
        let spec = &self.specs[pos];
        let n = w.div_ceil(spec.slot_nanos).clamp(1, spec.slots);
        (pos, n)
    }

    /// Seconds of time the slots `(current − n, current]` of ring `pos` cover up to `now`, from
    /// the KPIs' start if later; from the start of a restored minute counted whole in one of
    /// those slots if earlier, as its requests reach back there; less the unseen times in it.
    pub(super) fn covered_seconds(&self, pos: usize, n: u64, now: u64) -> f64 {
        let spec = &self.specs[pos];
        let current = now / spec.slot_nanos;
        let oldest_start = (current + 1)
            .saturating_sub(n)
            .saturating_mul(spec.slot_nanos);
        let reach = self.restored_reach[pos]
            .iter()
            .filter(|(index, _)| *index <= current && index.saturating_add(n) > current)
            .map(|&(_, start)| start)
            .fold(oldest_start, u64::min);
        let from = self.started_unix_nano.map_or(reach, |s| s.max(reach));
        let unseen: u64 = self
            .unseen
            .iter()
            .map(|&(a, b)| b.min(now).saturating_sub(a.max(from)))
            .sum();
        now.saturating_sub(from).saturating_sub(unseen) as f64 / 1e9
    }

    /// The finest ring's slots not yet rolled up into ring `pos`, as (index in ring `pos`,
    /// accumulator); nothing when `pos` is not filled by roll-up.
    pub(super) fn pending<'a>(
        &'a self,
        series: &'a Series,
        pos: usize,
    ) -> impl Iterator<Item = (u64, &'a Accumulator)> + 'a {
        let ratio = self.specs[pos].slot_nanos / self.specs[0].slot_nanos;
        let on = self.rolled[pos];
        series.rings[0]
            .unrolled()
            .filter(move |_| on)
            .map(move |s| (s.index / ratio.max(1), &s.acc))
    }

    /// Merges one series' slots of the window.
    pub(super) fn merged(&self, series: &Series, pos: usize, n: u64, now: u64) -> Accumulator {
        let current = now / self.specs[pos].slot_nanos;
        let in_window = |i: u64| i <= current && i.saturating_add(n) > current;
        let slots: Vec<&Accumulator> = series.rings[pos]
            .live(current, n)
            .map(|s| &s.acc)
            .chain(
                self.pending(series, pos)
                    .filter(|(i, _)| in_window(*i))
                    .map(|(_, a)| a),
            )
            .collect();
        Accumulator::merge_many(&slots)
    }

    pub(super) fn series_kpis(
        &self,
        key: &SeriesKey,
        acc: &Accumulator,
        seconds: f64,
    ) -> SeriesKpis {
        series_kpis(&self.sketch_config, &self.config.slo, key, acc, seconds)
    }

    /// The KPIs of every series with data in `window` at `now_unix_nano`.
    ///
    /// `window` is served by the configured window of that length, else by the shortest longer
    /// one read only as far back as `window` reaches (at its slot granularity), else by the
    /// longest (and `window_seconds` then says the longest's length).
    pub fn snapshot(&self, window: Duration, now_unix_nano: u64) -> KpiSnapshot {
        let (pos, n) = self.ring_for(window);
        let spec = &self.specs[pos];
        let seconds = self.covered_seconds(pos, n, now_unix_nano);
        let window_seconds = window.as_secs_f64().min(spec.window_nanos as f64 / 1e9);
        let mut series: Vec<SeriesKpis> = Vec::new();
        let mut order: Vec<&Series> = self.series.iter().collect();
        order.sort_by(|a, b| a.key.cmp(&b.key));
        for s in order.into_iter().chain(self.overflow.as_ref()) {
            let acc = self.merged(s, pos, n, now_unix_nano);
            if !acc.is_empty() {
                series.push(self.series_kpis(&s.key, &acc, seconds));
            }
        }
        KpiSnapshot {
            window_seconds,
            series,
        }
    }

    /// The merged accumulator of one series over `window` (e.g. for Prometheus export or
    /// tests); `None` for an unknown series. The overflow series has [`OVERFLOW_LABEL`](super::OVERFLOW_LABEL) labels.
    pub fn series_accumulator(
        &self,
        key: &SeriesKey,
        window: Duration,
        now_unix_nano: u64,
    ) -> Option<Accumulator> {
        let (pos, n) = self.ring_for(window);
        let s = self
            .series
            .iter()
            .chain(self.overflow.as_ref())
            .find(|s| &s.key == key)?;
        Some(self.merged(s, pos, n, now_unix_nano))
    }

    /// The keys of every series kept, overflow series last.
    pub fn series_keys(&self) -> Vec<SeriesKey> {
        self.series
            .iter()
            .chain(self.overflow.as_ref())
            .map(|s| s.key.clone())
            .collect()
    }

    /// Per-slot history of one series over `window`, oldest first (slots without records are
    /// left out). Cheap: clones the slots' accumulators.
    pub fn series_history(
        &self,
        key: &SeriesKey,
        window: Duration,
        now_unix_nano: u64,
    ) -> Vec<SlotHistory> {
        let (pos, n) = self.ring_for(window);
        let spec = &self.specs[pos];
        let current = now_unix_nano / spec.slot_nanos;
        let Some(s) = self
            .series
            .iter()
            .chain(self.overflow.as_ref())
            .find(|s| &s.key == key)
        else {
            return Vec::new();
        };
        let mut out: Vec<SlotHistory> = s.rings[pos]
            .live(current, n)
            .map(|slot| SlotHistory {
                start_unix_nano: slot.index.saturating_mul(spec.slot_nanos),
                length_nanos: spec.slot_nanos,
                accumulator: slot.acc.clone(),
            })
            .collect();
        for (index, acc) in self.pending(s, pos) {
            if index > current || index.saturating_add(n) <= current {
                continue;
            }
            let start = index.saturating_mul(spec.slot_nanos);
            match out.iter_mut().find(|h| h.start_unix_nano == start) {
                Some(h) => h.accumulator.merge(acc),
                None => out.push(SlotHistory {
                    start_unix_nano: start,
                    length_nanos: spec.slot_nanos,
                    accumulator: acc.clone(),
                }),
            }
        }
        out.sort_by_key(|h| h.start_unix_nano);
        out
    }
}

/// The KPIs of series `key` from a merged accumulator covering `seconds` of time (rates divide
/// by it): what a snapshot reports, for accumulators merged elsewhere (e.g. stored minutes).
pub fn series_kpis(
    config: &Config,
    slo: &SloConfig,
    key: &SeriesKey,
    acc: &Accumulator,
    seconds: f64,
) -> SeriesKpis {
    let c = &acc.counts;
    let cfg = config;
    SeriesKpis {
        service: key.service.to_string(),
        model: key.model.to_string(),
        operation: key.operation.to_string(),
        requests: c.requests,
        errors: c.errors,
        cancelled: c.cancelled,
        rejected: c.rejected,
        e2e: acc.e2e.stats(cfg),
        queue: acc.queue.stats(cfg),
        ttft: acc.ttft.stats(cfg),
        prefill: acc.prefill.stats(cfg),
        decode: acc.decode.stats(cfg),
        tpot: acc.tpot.stats(cfg),
        itl: acc.itl_stats(cfg),
        itl_p99: acc.itl_p99.stats(cfg),
        tokens: acc.tokens(),
        throughput: Throughput {
            requests_per_second: accumulator::per_second(c.requests, seconds),
            input_tokens_per_second: accumulator::per_second(c.input_tokens, seconds),
            output_tokens_per_second: accumulator::per_second(c.output_tokens, seconds),
        },
        goodput: acc.goodput(seconds),
        phase_share: acc.phase_shares(),
        gpu: acc.gpu(),
        disagg: acc.disagg(cfg, slo, seconds),
    }
}
