//! [`Accumulator`]: the mergeable aggregate of a set of request records — what one time slot of
//! one series holds, and what the slots of a window merge into.
//!
//! Exact: counts, token sums, max, mean, phase sums. Approximate: percentiles, from sparse
//! DDSketches ([`Distribution`]) with relative error
//! [`SKETCH_RELATIVE_ACCURACY`](super::SKETCH_RELATIVE_ACCURACY). Tail phase shares are kept as
//! phase sums keyed by the sketch bucket of each request's e2e, so a merged window finds its
//! p90 / p99 bucket from the e2e sketch and sums the buckets at or above it — exact up to bucket
//! resolution, without keeping any record.

use sketches_ddsketch::Config;

use super::config::SloConfig;
use super::disagg::{DisaggAccumulator, DisaggKpis};
use super::distribution::{Distribution, LatencyStats, bucket_of, merge_many_sorted, merge_sorted};
use super::snapshot::{
    Goodput, GpuKpis, GpuPhaseUtilization, PhaseShare, PhaseShares, TokenTotals,
};
use crate::codec::{DecodeError, Reader, Writer};
use crate::record::{Outcome, RequestRecord};

/// Version byte the encoding starts with.
const VERSION: u8 = 3;

/// The version before the per-request p99 inter-token gaps, still decoded.
const VERSION_2: u8 = 2;

/// The version before the disaggregated part, still decoded.
const VERSION_1: u8 = 1;

/// Σ e2e and Σ of each phase over a set of requests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseSums {
    /// Requests summed.
    pub count: u64,
    /// Σ e2e, seconds.
    pub e2e: f64,
    /// Σ queue, seconds.
    pub queue: f64,
    /// Σ prefill, seconds.
    pub prefill: f64,
    /// Σ decode, seconds.
    pub decode: f64,
}

impl PhaseSums {
    fn add(&mut self, o: &Self) {
        self.count += o.count;
        self.e2e += o.e2e;
        self.queue += o.queue;
        self.prefill += o.prefill;
        self.decode += o.decode;
    }

    fn encode(&self, w: &mut Writer<'_>) {
        w.varint(self.count);
        for v in [self.e2e, self.queue, self.prefill, self.decode] {
            w.f64(v);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            count: r.varint()?,
            e2e: r.f64()?,
            queue: r.f64()?,
            prefill: r.f64()?,
            decode: r.f64()?,
        })
    }

    /// The per-bucket tail sums, stored as `f32`: they only ever become shares at bucket
    /// resolution (±α ≈ 1%), so 6·10⁻⁸ relative rounding is invisible, and it halves the
    /// largest part of a stored minute.
    fn encode_f32(&self, w: &mut Writer<'_>) {
        w.varint(self.count);
        for v in [self.e2e, self.queue, self.prefill, self.decode] {
            w.f32(v as f32);
        }
    }

    fn decode_f32(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            count: r.varint()?,
            e2e: f64::from(r.f32()?),
            queue: f64::from(r.f32()?),
            prefill: f64::from(r.f32()?),
            decode: f64::from(r.f32()?),
        })
    }

    /// Σ phase / Σ e2e; `None` when nothing was summed or Σ e2e is zero.
    pub fn share(&self) -> Option<PhaseShare> {
        (self.count > 0 && self.e2e > 0.0).then(|| PhaseShare {
            queue: self.queue / self.e2e,
            prefill: self.prefill / self.e2e,
            decode: self.decode / self.e2e,
        })
    }
}

/// GPU sums: duration-weighted utilisation per phase and attributed energy.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct GpuSums {
    requests: u64,
    /// Σ utilisation × phase seconds, per queue / prefill / decode.
    util_weighted: [f64; 3],
    /// Σ phase seconds where utilisation was known.
    util_seconds: [f64; 3],
    energy_attributed: f64,
    /// Σ attributed energy and Σ output tokens over requests having both.
    per_token_energy: f64,
    per_token_tokens: u64,
}

impl GpuSums {
    fn add_record(&mut self, r: &RequestRecord) {
        let Some(g) = &r.gpu else { return };
        self.requests += 1;
        let phases = [
            (g.utilization_mean.queue, r.queue),
            (g.utilization_mean.prefill, r.prefill),
            (g.utilization_mean.decode, r.decode),
        ];
        for (i, (util, secs)) in phases.into_iter().enumerate() {
            if let (Some(u), Some(s)) = (util, secs)
                && u.is_finite()
                && s.is_finite()
                && s > 0.0
            {
                self.util_weighted[i] += u * s;
                self.util_seconds[i] += s;
            }
        }
        if let Some(e) = g.energy_attributed_joules.filter(|e| e.is_finite()) {
            self.energy_attributed += e;
            if let Some(n) = r.output_tokens.filter(|n| *n > 0) {
                self.per_token_energy += e;
                self.per_token_tokens = self.per_token_tokens.saturating_add(n);
            }
        }
    }

    fn merge(&mut self, o: &Self) {
        self.requests += o.requests;
        for i in 0..3 {
            self.util_weighted[i] += o.util_weighted[i];
            self.util_seconds[i] += o.util_seconds[i];
        }
        self.energy_attributed += o.energy_attributed;
        self.per_token_energy += o.per_token_energy;
        self.per_token_tokens = self.per_token_tokens.saturating_add(o.per_token_tokens);
    }

    fn encode(&self, w: &mut Writer<'_>) {
        w.varint(self.requests);
        if self.requests == 0 {
            return;
        }
        for v in self.util_weighted.iter().chain(&self.util_seconds) {
            w.f64(*v);
        }
        w.f64(self.energy_attributed);
        w.f64(self.per_token_energy);
        w.varint(self.per_token_tokens);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let requests = r.varint()?;
        if requests == 0 {
            return Ok(Self::default());
        }
        let mut g = Self {
            requests,
            ..Self::default()
        };
        for i in 0..3 {
            g.util_weighted[i] = r.f64()?;
        }
        for i in 0..3 {
            g.util_seconds[i] = r.f64()?;
        }
        g.energy_attributed = r.f64()?;
        g.per_token_energy = r.f64()?;
        g.per_token_tokens = r.varint()?;
        Ok(g)
    }

    fn kpis(&self) -> Option<GpuKpis> {
        if self.requests == 0 {
            return None;
        }
        let util = |i: usize| {
            (self.util_seconds[i] > 0.0).then(|| self.util_weighted[i] / self.util_seconds[i])
        };
        Some(GpuKpis {
            requests: self.requests,
            utilization_mean: GpuPhaseUtilization {
                queue: util(0),
                prefill: util(1),
                decode: util(2),
            },
            energy_attributed_joules: self.energy_attributed,
            energy_per_output_token_joules: (self.per_token_tokens > 0)
                .then(|| self.per_token_energy / self.per_token_tokens as f64),
        })
    }
}

/// Exact counters of an accumulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Every record.
    pub requests: u64,
    /// Outcome `error`.
    pub errors: u64,
    /// Outcome `cancelled`.
    pub cancelled: u64,
    /// Outcome `rejected`.
    pub rejected: u64,
    /// `ok` requests meeting every applicable SLO.
    pub good: u64,
    /// Σ input tokens.
    pub input_tokens: u64,
    /// Σ output tokens.
    pub output_tokens: u64,
}

impl Counts {
    fn merge(&mut self, o: &Self) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.cancelled += o.cancelled;
        self.rejected += o.rejected;
        self.good += o.good;
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
    }

    /// Requests goodput is judged on: every outcome but `cancelled`.
    pub fn goodput_eligible(&self) -> u64 {
        self.requests - self.cancelled
    }
}

/// Whether an `ok` record meets every SLO that applies to it (an SLO applies when it is
/// configured and the record has that value; e2e always exists).
pub fn meets_slos(slo: &SloConfig, r: &RequestRecord) -> bool {
    let within = |limit: Option<f64>, v: Option<f64>| match (limit, v) {
        (Some(l), Some(v)) => v <= l,
        _ => true,
    };
    r.outcome == Outcome::Ok
        && within(slo.ttft_seconds, r.ttft)
        && within(slo.tpot_seconds, r.tpot)
        && within(slo.e2e_seconds, Some(r.e2e))
}

/// The mergeable aggregate of a set of records.
#[derive(Clone, Debug, Default)]
pub struct Accumulator {
    /// Exact counters.
    pub counts: Counts,
    /// e2e of `ok` requests.
    pub e2e: Distribution,
    /// Queue of `ok` requests.
    pub queue: Distribution,
    /// TTFT of `ok` requests.
    pub ttft: Distribution,
    /// Prefill of `ok` requests.
    pub prefill: Distribution,
    /// Decode of `ok` requests.
    pub decode: Distribution,
    /// TPOT of `ok` requests.
    pub tpot: Distribution,
    /// Per-request median inter-token gap of `ok` requests.
    pub itl: Distribution,
    /// Largest inter-token gap of any `ok` request.
    itl_max: Option<f64>,
    /// Per-request 99th-percentile inter-token gap of `ok` requests (pauses within a request).
    pub itl_p99: Distribution,
    /// Phase sums of `ok` requests having queue, prefill and decode.
    pub phases: PhaseSums,
    /// The same, per e2e sketch bucket, sorted by bucket.
    phases_by_e2e_bucket: Vec<(i32, PhaseSums)>,
    gpu: GpuSums,
    /// Disaggregated sub-phases of `ok` requests that crossed pools (boxed: most series have
    /// none).
    disagg: Option<Box<DisaggAccumulator>>,
}

impl Accumulator {
    /// Adds one record.
    pub fn add(&mut self, config: &Config, slo: &SloConfig, r: &RequestRecord) {
        let c = &mut self.counts;
        c.requests += 1;
        match r.outcome {
            Outcome::Ok => {}
            Outcome::Error => c.errors += 1,
            Outcome::Cancelled => c.cancelled += 1,
            Outcome::Rejected => c.rejected += 1,
        }
        // Token counts come from span attributes: saturate rather than overflow.
        c.input_tokens = c.input_tokens.saturating_add(r.input_tokens.unwrap_or(0));
        c.output_tokens = c.output_tokens.saturating_add(r.output_tokens.unwrap_or(0));
        self.gpu.add_record(r);
        if r.outcome != Outcome::Ok {
            return;
        }
        if meets_slos(slo, r) {
            self.counts.good += 1;
        }
        if r.disagg.is_some() {
            self.disagg.get_or_insert_with(Box::default).add(config, r);
        }
        let e2e_bucket = self.e2e.add(config, Some(r.e2e));
        self.queue.add(config, r.queue);
        self.ttft.add(config, r.ttft);
        self.prefill.add(config, r.prefill);
        self.decode.add(config, r.decode);
        self.tpot.add(config, r.tpot);
        if let Some(itl) = r.itl {
            self.itl.add(config, Some(itl.p50));
            self.itl_p99.add(config, Some(itl.p99));
            if itl.max.is_finite() {
                self.itl_max = Some(self.itl_max.map_or(itl.max, |m| m.max(itl.max)));
            }
        }
        if let (Some(q), Some(p), Some(d)) = (r.queue, r.prefill, r.decode)
            && r.e2e.is_finite()
            && q.is_finite()
            && p.is_finite()
            && d.is_finite()
        {
            let one = PhaseSums {
                count: 1,
                e2e: r.e2e.max(0.0),
                queue: q.max(0.0),
                prefill: p.max(0.0),
                decode: d.max(0.0),
            };
            self.phases.add(&one);
            // The bucket the e2e distribution just computed (the same clamped value).
            let key = e2e_bucket.unwrap_or_else(|| bucket_of(config, one.e2e));
            match self
                .phases_by_e2e_bucket
                .binary_search_by_key(&key, |b| b.0)
            {
                Ok(i) => self.phases_by_e2e_bucket[i].1.add(&one),
                Err(i) => self.phases_by_e2e_bucket.insert(i, (key, one)),
            }
        }
    }

    /// Merges many accumulators at once (a window's slots): one pass per distribution.
    pub fn merge_many(parts: &[&Self]) -> Self {
        let dist = |f: fn(&Self) -> &Distribution| {
            let refs: Vec<&Distribution> = parts.iter().map(|a| f(a)).collect();
            Distribution::merge_many(&refs)
        };
        let mut out = Self {
            e2e: dist(|a| &a.e2e),
            queue: dist(|a| &a.queue),
            ttft: dist(|a| &a.ttft),
            prefill: dist(|a| &a.prefill),
            decode: dist(|a| &a.decode),
            tpot: dist(|a| &a.tpot),
            itl: dist(|a| &a.itl),
            itl_p99: dist(|a| &a.itl_p99),
            ..Self::default()
        };
        let buckets: Vec<&[(i32, PhaseSums)]> = parts
            .iter()
            .map(|a| a.phases_by_e2e_bucket.as_slice())
            .collect();
        out.phases_by_e2e_bucket = merge_many_sorted(&buckets, PhaseSums::add);
        for a in parts {
            out.counts.merge(&a.counts);
            if let Some(m) = a.itl_max {
                out.itl_max = Some(out.itl_max.map_or(m, |s| s.max(m)));
            }
            out.phases.add(&a.phases);
            out.gpu.merge(&a.gpu);
            if let Some(d) = &a.disagg {
                out.disagg.get_or_insert_with(Box::default).merge(d);
            }
        }
        out
    }

    /// Merges another accumulator into this one.
    pub fn merge(&mut self, o: &Self) {
        self.counts.merge(&o.counts);
        self.e2e.merge(&o.e2e);
        self.queue.merge(&o.queue);
        self.ttft.merge(&o.ttft);
        self.prefill.merge(&o.prefill);
        self.decode.merge(&o.decode);
        self.tpot.merge(&o.tpot);
        self.itl.merge(&o.itl);
        self.itl_p99.merge(&o.itl_p99);
        if let Some(m) = o.itl_max {
            self.itl_max = Some(self.itl_max.map_or(m, |s| s.max(m)));
        }
        self.phases.add(&o.phases);
        merge_sorted(
            &mut self.phases_by_e2e_bucket,
            &o.phases_by_e2e_bucket,
            PhaseSums::add,
        );
        self.gpu.merge(&o.gpu);
        if let Some(d) = &o.disagg {
            self.disagg.get_or_insert_with(Box::default).merge(d);
        }
    }

    fn distributions_mut(&mut self) -> [&mut Distribution; 8] {
        [
            &mut self.e2e,
            &mut self.queue,
            &mut self.ttft,
            &mut self.prefill,
            &mut self.decode,
            &mut self.tpot,
            &mut self.itl,
            &mut self.itl_p99,
        ]
    }

    /// Releases spare capacity: call when no more records will be added.
    pub fn shrink(&mut self) {
        for d in self.distributions_mut() {
            d.shrink();
        }
        self.phases_by_e2e_bucket.shrink_to_fit();
        if let Some(d) = &mut self.disagg {
            d.shrink();
        }
    }

    /// Heap bytes held (sketch bins, tail buckets), for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        [
            &self.e2e,
            &self.queue,
            &self.ttft,
            &self.prefill,
            &self.decode,
            &self.tpot,
            &self.itl,
            &self.itl_p99,
        ]
        .iter()
        .map(|d| d.heap_bytes())
        .sum::<usize>()
            + self.phases_by_e2e_bucket.capacity() * std::mem::size_of::<(i32, PhaseSums)>()
            + self.disagg.as_ref().map_or(0, |d| {
                std::mem::size_of::<DisaggAccumulator>() + d.heap_bytes()
            })
    }

    /// Appends the compact binary encoding of this accumulator to `out` (see
    /// [`Self::decode`]); everything is kept, so decoding gives an equal, mergeable accumulator.
    ///
    /// Layout (version 3, with the crate's `codec` primitives): a version byte, then every field in
    /// declaration order but `itl_p99`, the per-e2e-bucket tail phase sums as 4-byte floats; version 2 adds,
    /// last, a flag byte and the disaggregated part when the flag is 1; version 3 then the
    /// per-request p99 inter-token gaps. Versions 1 and 2 (without them) are still read. A
    /// minute of one series holds about the occupied sketch buckets and
    /// nothing more (measured in docs/PERFORMANCE.md).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        w.u8(VERSION);
        let c = &self.counts;
        for v in [
            c.requests,
            c.errors,
            c.cancelled,
            c.rejected,
            c.good,
            c.input_tokens,
            c.output_tokens,
        ] {
            w.varint(v);
        }
        // The distributions versions 1 and 2 had, in place; `itl_p99` (version 3) goes last.
        for d in &self.distributions()[..7] {
            d.encode(&mut w);
        }
        match self.itl_max {
            Some(m) => {
                w.u8(1);
                w.f64(m);
            }
            None => w.u8(0),
        }
        self.phases.encode(&mut w);
        w.keys(&self.phases_by_e2e_bucket, |w, p| p.encode_f32(w));
        self.gpu.encode(&mut w);
        match &self.disagg {
            Some(d) => {
                w.u8(1);
                d.encode(&mut w);
            }
            None => w.u8(0),
        }
        self.itl_p99.encode(&mut w);
    }

    /// The compact binary encoding as a new vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.heap_bytes() / 2);
        self.encode(&mut out);
        out
    }

    /// Decodes what [`Self::encode`] wrote. Refuses (never panics on) truncated, trailing or
    /// malformed bytes and unknown versions.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.u8()?;
        if ![VERSION, VERSION_2, VERSION_1].contains(&version) {
            return Err(r.error("unknown encoding version"));
        }
        let counts = Counts {
            requests: r.varint()?,
            errors: r.varint()?,
            cancelled: r.varint()?,
            rejected: r.varint()?,
            good: r.varint()?,
            input_tokens: r.varint()?,
            output_tokens: r.varint()?,
        };
        let mut dist = || Distribution::decode(&mut r);
        let (e2e, queue, ttft, prefill, decode, tpot, itl) = (
            dist()?,
            dist()?,
            dist()?,
            dist()?,
            dist()?,
            dist()?,
            dist()?,
        );
        let itl_max = match r.u8()? {
            0 => None,
            1 => Some(r.f64()?),
            _ => return Err(r.error("invalid option flag")),
        };
        let phases = PhaseSums::decode(&mut r)?;
        let phases_by_e2e_bucket = r.keys(17, PhaseSums::decode_f32)?;
        let gpu = GpuSums::decode(&mut r)?;
        let disagg = if version == VERSION_1 {
            None
        } else {
            match r.u8()? {
                0 => None,
                1 => Some(Box::new(DisaggAccumulator::decode(&mut r)?)),
                _ => return Err(r.error("invalid option flag")),
            }
        };
        let itl_p99 = if version == VERSION {
            Distribution::decode(&mut r)?
        } else {
            Distribution::default()
        };
        r.finish()?;
        Ok(Self {
            counts,
            e2e,
            queue,
            ttft,
            prefill,
            decode,
            tpot,
            itl,
            itl_max,
            itl_p99,
            phases,
            phases_by_e2e_bucket,
            gpu,
            disagg,
        })
    }

    fn distributions(&self) -> [&Distribution; 8] {
        [
            &self.e2e,
            &self.queue,
            &self.ttft,
            &self.prefill,
            &self.decode,
            &self.tpot,
            &self.itl,
            &self.itl_p99,
        ]
    }

    /// True when no record was added.
    pub fn is_empty(&self) -> bool {
        self.counts.requests == 0
    }

    /// Inter-token statistics: percentiles of per-request medians, max of per-request maxima.
    pub fn itl_stats(&self, config: &Config) -> Option<LatencyStats> {
        let mut s = self.itl.stats(config)?;
        if let Some(m) = self.itl_max {
            s.max = s.max.max(m);
        }
        Some(s)
    }

    /// Phase sums of the requests whose e2e bucket is at or above the bucket of e2e quantile `q`.
    pub fn tail_phases(&self, q: f64) -> Option<PhaseSums> {
        let threshold = self.e2e.quantile_bucket(q)?;
        let start = self
            .phases_by_e2e_bucket
            .partition_point(|(k, _)| *k < threshold);
        let mut sums = PhaseSums::default();
        for (_, v) in &self.phases_by_e2e_bucket[start..] {
            sums.add(v);
        }
        Some(sums)
    }

    /// Phase shares for all requests and the p90 / p99 tails.
    pub fn phase_shares(&self) -> PhaseShares {
        PhaseShares {
            all: self.phases.share(),
            p90: self.tail_phases(0.9).and_then(|s| s.share()),
            p99: self.tail_phases(0.99).and_then(|s| s.share()),
        }
    }

    /// Token totals.
    pub fn tokens(&self) -> TokenTotals {
        TokenTotals {
            input: self.counts.input_tokens,
            output: self.counts.output_tokens,
        }
    }

    /// Goodput over `seconds` of covered time.
    pub fn goodput(&self, seconds: f64) -> Goodput {
        let eligible = self.counts.goodput_eligible();
        Goodput {
            ratio: (eligible > 0).then(|| self.counts.good as f64 / eligible as f64),
            requests_per_second: per_second(self.counts.good, seconds),
        }
    }

    /// GPU statistics, `None` when no record carried any.
    pub fn gpu(&self) -> Option<GpuKpis> {
        self.gpu.kpis()
    }

    /// Disaggregated sub-phase KPIs, per pool and per worker, with their rate over `seconds`
    /// of covered time and their SLO attainment (TTFT and TPOT against `slo`); `None` when no
    /// `ok` record crossed pools.
    pub fn disagg(&self, config: &Config, slo: &SloConfig, seconds: f64) -> Option<DisaggKpis> {
        let acc = self.disagg.as_ref()?;
        let mut k = acc.kpis(config)?;
        k.requests_per_second = per_second(k.requests, seconds);
        k.ttft_slo_attainment = slo.ttft_seconds.and_then(|t| acc.ttft_at_most(config, t));
        k.tpot_slo_attainment = slo
            .tpot_seconds
            .and_then(|t| self.tpot.fraction_at_most(config, t));
        Some(k)
    }
}

/// `n / seconds`, zero when no time is covered.
pub fn per_second(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kpi::sketch_config;
    use crate::record::Dialect;
    use crate::text::Text;
    use crate::trace::{SpanId, TraceId};

    fn rec(e2e: f64, outcome: Outcome) -> RequestRecord {
        let mut r = RequestRecord::new(
            TraceId([1; 16]),
            SpanId([1; 8]),
            Text::from("s"),
            Dialect::Infertrace,
            0,
            0,
        );
        r.e2e = e2e;
        r.outcome = outcome;
        r.queue = Some(e2e * 0.1);
        r.prefill = Some(e2e * 0.2);
        r.decode = Some(e2e * 0.6);
        r.output_tokens = Some(3);
        r
    }

    #[test]
    fn merging_equals_adding_everything_to_one() {
        let (config, slo) = (sketch_config(), SloConfig::default());
        let records: Vec<RequestRecord> = (1..=300)
            .map(|k| {
                let outcome = if k % 7 == 0 {
                    Outcome::Error
                } else {
                    Outcome::Ok
                };
                rec(k as f64 * 0.137, outcome)
            })
            .collect();
        let mut whole = Accumulator::default();
        let mut parts = [
            Accumulator::default(),
            Accumulator::default(),
            Accumulator::default(),
        ];
        for (k, r) in records.iter().enumerate() {
            whole.add(&config, &slo, r);
            parts[k % 3].add(&config, &slo, r);
        }
        let mut merged = Accumulator::default();
        for p in &parts {
            merged.merge(p);
        }
        let many = Accumulator::merge_many(&parts.iter().collect::<Vec<_>>());
        assert_eq!(many.counts, merged.counts);
        assert_eq!(many.e2e.count(), merged.e2e.count());
        assert_eq!(
            many.phases_by_e2e_bucket.len(),
            merged.phases_by_e2e_bucket.len()
        );
        assert_eq!(
            many.tail_phases(0.99).unwrap().count,
            merged.tail_phases(0.99).unwrap().count
        );
        assert_eq!(merged.counts, whole.counts);
        let (m, w) = (
            merged.e2e.stats(&config).unwrap(),
            whole.e2e.stats(&config).unwrap(),
        );
        assert_eq!(
            (m.p50, m.p90, m.p95, m.p99, m.max),
            (w.p50, w.p90, w.p95, w.p99, w.max)
        );
        assert!((m.mean - w.mean).abs() < 1e-12 * w.mean);
        let keys = |a: &Accumulator| {
            a.phases_by_e2e_bucket
                .iter()
                .map(|b| b.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&merged), keys(&whole));
        let (mt, wt) = (
            merged.tail_phases(0.9).unwrap(),
            whole.tail_phases(0.9).unwrap(),
        );
        assert_eq!(mt.count, wt.count);
        assert!((mt.decode - wt.decode).abs() < 1e-9 * wt.decode);
        let (a, b) = (
            merged.phases.share().unwrap(),
            whole.phases.share().unwrap(),
        );
        assert!((a.decode - b.decode).abs() < 1e-12 && (a.decode - 0.6).abs() < 1e-9);
        assert_eq!(whole.counts.errors, 42);
        assert_eq!(whole.e2e.count(), 258);
    }

    #[test]
    fn slo_judges_only_what_applies() {
        let slo = SloConfig::default();
        let mut r = rec(1.0, Outcome::Ok);
        assert!(meets_slos(&slo, &r));
        r.ttft = Some(1.5);
        assert!(!meets_slos(&slo, &r));
        r.ttft = Some(1.0);
        r.tpot = Some(0.11);
        assert!(!meets_slos(&slo, &r));
        r.tpot = None;
        r.e2e = 31.0;
        assert!(!meets_slos(&slo, &r));
        r.e2e = 1.0;
        r.outcome = Outcome::Cancelled;
        assert!(!meets_slos(&slo, &r));
    }

    #[test]
    fn encoding_round_trips_and_refuses_damage() {
        use crate::record::{GpuRecord, InterTokenStats, PerPhase};
        let (config, slo) = (sketch_config(), SloConfig::default());
        let empty = Accumulator::default();
        let bytes = empty.to_bytes();
        assert!(Accumulator::decode(&bytes).unwrap().is_empty());
        let mut acc = Accumulator::default();
        for k in 0..500u32 {
            let outcome = if k % 11 == 0 {
                Outcome::Error
            } else {
                Outcome::Ok
            };
            let mut r = rec(0.01 + f64::from(k) * 0.013, outcome);
            r.ttft = Some(0.001 * f64::from(k % 37));
            r.tpot = Some(0.02);
            r.itl = Some(InterTokenStats {
                p50: 0.02,
                p99: 0.05,
                max: 0.3 + f64::from(k),
            });
            if k % 3 == 0 {
                r.gpu = Some(Box::new(GpuRecord {
                    utilization_mean: PerPhase {
                        decode: Some(0.8),
                        ..PerPhase::default()
                    },
                    energy_attributed_joules: Some(2.5),
                    ..GpuRecord::default()
                }));
            }
            acc.add(&config, &slo, &r);
        }
        let bytes = acc.to_bytes();
        let back = Accumulator::decode(&bytes).unwrap();
        assert_eq!(back.to_bytes(), bytes);
        assert_eq!(back.counts, acc.counts);
        assert_eq!(back.e2e, acc.e2e);
        assert_eq!(back.phases, acc.phases);
        let (x, y) = (back.phase_shares(), acc.phase_shares());
        assert_eq!(x.all, y.all);
        let (x, y) = (x.p90.unwrap(), y.p90.unwrap());
        assert!((x.queue - y.queue).abs() < 1e-6 && (x.decode - y.decode).abs() < 1e-6);
        assert_eq!(back.gpu(), acc.gpu());
        assert_eq!(back.itl_stats(&config), acc.itl_stats(&config));
        // Compact: well under the in-memory footprint of the sketches.
        assert!(
            bytes.len() < acc.heap_bytes() + 200,
            "{} bytes",
            bytes.len()
        );
        // Every truncation and a trailing byte are refused, never a panic.
        for n in 0..bytes.len() {
            assert!(Accumulator::decode(&bytes[..n]).is_err(), "prefix {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Accumulator::decode(&longer).is_err());
        let mut other_version = bytes;
        other_version[0] = 99;
        assert_eq!(
            Accumulator::decode(&other_version).unwrap_err().reason,
            "unknown encoding version"
        );
    }
}
