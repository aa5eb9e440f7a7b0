//! What the recorder's Prometheus label sets and values cost on the heap:
//! [`PromRecorder::approx_memory_bytes`], which the pipeline holds in the memory limiter with
//! the KPI series and the critical-path windows. Label sets are bounded by their caps
//! (`max_series`, [`MAX_CRITICAL_PATH_KEYS`](super::MAX_CRITICAL_PATH_KEYS),
//! [`MAX_DISAGG_WORKERS`](super::MAX_DISAGG_WORKERS) a series), but at those caps they can take
//! over a hundred megabytes (a thousand series of disaggregated requests, each with 64 workers'
//! sub-phase histograms): the limit must see them.

use std::mem::size_of;

use super::{
    Counter, CriticalPathKey, CriticalPathLabels, DisaggPhaseLabels, FloatCounter, Histogram,
    PromRecorder, RequestLabels, SeriesHandles, SeriesLabels, TokenLabels,
};
use infertrace_analysis::heap_size::{
    ARC_HEADER_BYTES, arc_str_bytes, list_map_bytes, map_table_bytes,
};

/// Bytes of one entry of `(K, V)` in a Prometheus family's hash map: the pair and its control
/// byte, at two buckets an entry (a table is between 7/16 and 7/8 full, 1/1.58 on average as it
/// grows, and does not shrink when label sets are removed; those maps are `prometheus-client`'s,
/// whose capacity is not visible, so this errs high rather than low). The recorder's own maps are
/// sized from their capacity ([`map_table_bytes`]).
fn family_entry<K, V>() -> usize {
    (size_of::<(K, V)>() + 1) * 2
}

/// Bytes of a string label's own allocation.
fn arc_str(s: &str) -> usize {
    arc_str_bytes(s.len())
}

impl PromRecorder {
    /// Approximate heap bytes of every label set and value this recorder created in its
    /// families (the families' map entries, the label strings, counters and histograms) and
    /// of its own indexes of them. Walks every series (at most `max_series` + 1) and key: call
    /// it seldom (the pipeline does once a second), not per record.
    pub fn approx_memory_bytes(&self) -> usize {
        let series: usize = self
            .series
            .values()
            .flat_map(|list| list.iter())
            .chain(self.overflow.as_ref())
            .map(|s| series_bytes(s))
            .sum();
        let series_index = list_map_bytes(&self.series);
        let disagg: usize = self.disagg.capacity()
            * size_of::<(SeriesLabels, Vec<(DisaggPhaseLabels, Histogram)>)>()
            + self
                .disagg
                .iter()
                .flat_map(|(_, sets)| {
                    let list = sets.capacity() * size_of::<(DisaggPhaseLabels, Histogram)>();
                    sets.iter()
                        .map(|(labels, h)| {
                            family_entry::<DisaggPhaseLabels, Histogram>()
                                + h.heap_bytes()
                                + arc_str(&labels.worker)
                        })
                        .chain(std::iter::once(list))
                })
                .sum::<usize>();
        let critical_path: usize = map_table_bytes(
            self.cp_keys.capacity(),
            size_of::<(u64, Vec<CriticalPathKey>)>(),
        ) + self
            .cp_keys
            .values()
            .map(|list| {
                list.capacity() * size_of::<CriticalPathKey>()
                    + list
                        .iter()
                        .map(|(service, span, _)| {
                            arc_str(service)
                                + arc_str(span)
                                + FloatCounter::HEAP_BYTES
                                + family_entry::<CriticalPathLabels, FloatCounter>()
                        })
                        .sum::<usize>()
            })
            .sum::<usize>();
        series + series_index + disagg + critical_path
    }
}

/// One (service, model, operation) series: its handles, label strings, the seven families it
/// always has a label set in (requests ×4 outcomes, tokens ×2, goodput), energy once it has
/// any, and, per outcome seen, six histograms.
fn series_bytes(s: &SeriesHandles) -> usize {
    let labels = &s.labels;
    let energy = match s.gpu_energy.get() {
        Some(_) => family_entry::<SeriesLabels, FloatCounter>() + FloatCounter::HEAP_BYTES,
        None => 0,
    };
    let always = ARC_HEADER_BYTES
        + size_of::<SeriesHandles>()
        + arc_str(&labels.service)
        + arc_str(&labels.model)
        + arc_str(&labels.operation)
        + 4 * (family_entry::<RequestLabels, Counter>() + Counter::HEAP_BYTES)
        + 2 * (family_entry::<TokenLabels, Counter>() + Counter::HEAP_BYTES)
        + family_entry::<SeriesLabels, Counter>()
        + Counter::HEAP_BYTES
        + energy;
    let outcomes: usize = s
        .outcomes
        .iter()
        .filter_map(|o| o.get())
        .map(|o| {
            [&o.e2e, &o.queue, &o.prefill, &o.decode, &o.ttft, &o.tpot]
                .iter()
                .map(|h| family_entry::<RequestLabels, Histogram>() + h.heap_bytes())
                .sum::<usize>()
        })
        .sum();
    always + outcomes
}
