//! KPIs of disaggregated prefill/decode serving: the sub-phases of the series' requests that
//! crossed pools ([`crate::record::DisaggPhases`]), per pool and per worker.
//!
//! A disaggregated request is one record (the router's, or the outermost role's) whose
//! sub-phases ran on two workers: the prefill worker's (`bootstrap`, `prefill_queue`,
//! `prefill`, `kv_transfer`) and the decode worker's (`decode_bootstrap`, `decode_wait`,
//! `first_token`, `decode`). So the series dimensions (one record → one series) cannot split
//! them by worker; instead the series' accumulator keeps, beside its own latencies,
//! - one distribution per sub-phase (the *pool* view: each sub-phase runs in one pool),
//! - per worker (`disagg.prefill_worker` / `disagg.decode_worker`, the worker's `service.name`)
//!   one distribution per sub-phase of its pool, at most [`MAX_WORKERS`] workers per series
//!   and slot (the rest counted under [`OVERFLOW_LABEL`](super::OVERFLOW_LABEL)),
//! - Σ TTFT and Σ each sub-phase over the requests with a TTFT (each sub-phase's share of TTFT),
//! - Σ prompt tokens and Σ transfer seconds over the requests with both (the KV transfer rate a
//!   transfer achieved, in prompt tokens per second; bytes when the KV size per token is known).
//!
//! Like the other latencies, only `ok` requests count. A series without disaggregated requests
//! carries none of this (`disagg: null`).

use std::sync::Arc;

use infertrace_semconv as sc;
use serde::Serialize;
use sketches_ddsketch::Config;

use super::distribution::Distribution;
use super::distribution::LatencyStats;
use super::labelling::OVERFLOW_LABEL;
use crate::codec::{DecodeError, Reader, Writer};
use crate::record::{Outcome, RequestRecord};

/// A pool of a disaggregated deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    /// The router in front of the pools.
    Router,
    /// The prefill workers.
    Prefill,
    /// The decode workers.
    Decode,
}

impl Pool {
    /// Lower-case name (`router`, `prefill`, `decode`), as `infer.disagg.role` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Router => sc::disagg::role::ROUTER,
            Self::Prefill => sc::disagg::role::PREFILL,
            Self::Decode => sc::disagg::role::DECODE,
        }
    }

    fn code(self) -> u8 {
        match self {
            Self::Router => 0,
            Self::Prefill => 1,
            Self::Decode => 2,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        [Self::Router, Self::Prefill, Self::Decode]
            .into_iter()
            .find(|p| p.code() == c)
    }
}

/// Number of sub-phases ([`SUB_PHASES`]).
const N: usize = 9;

/// Every sub-phase in the order the KPIs report them, with the pool it runs in and whether it
/// lies along time to first token (`decode_bootstrap` runs beside the prefill side, `decode`
/// after the first token: neither is a share of TTFT).
pub const SUB_PHASES: [(&str, Pool, bool); N] = [
    (sc::disagg::ROUTING, Pool::Router, true),
    (sc::disagg::BOOTSTRAP, Pool::Prefill, true),
    (sc::disagg::PREFILL_QUEUE, Pool::Prefill, true),
    (sc::disagg::PREFILL, Pool::Prefill, true),
    (sc::disagg::KV_TRANSFER, Pool::Prefill, true),
    (sc::disagg::DECODE_BOOTSTRAP, Pool::Decode, false),
    (sc::disagg::DECODE_WAIT, Pool::Decode, true),
    (sc::disagg::FIRST_TOKEN, Pool::Decode, true),
    (sc::disagg::DECODE, Pool::Decode, false),
];

/// Positions in [`SUB_PHASES`] of a prefill worker's and a decode worker's sub-phases.
const PREFILL_WORKER: [usize; 4] = [1, 2, 3, 4];
const DECODE_WORKER: [usize; 4] = [5, 6, 7, 8];
/// Position of `kv_transfer` in [`SUB_PHASES`].
const KV: usize = 4;

/// Most workers one series' slot keeps apart; further workers are merged under
/// [`OVERFLOW_LABEL`](super::OVERFLOW_LABEL) (worker names come from spans: bounded here).
pub const MAX_WORKERS: usize = 64;

fn positions(pool: Pool) -> &'static [usize] {
    match pool {
        Pool::Router => &[0],
        Pool::Prefill => &PREFILL_WORKER,
        Pool::Decode => &DECODE_WORKER,
    }
}

/// Usable seconds: finite and not negative.
fn usable(v: Option<f64>) -> Option<f64> {
    v.filter(|v| v.is_finite() && *v >= 0.0)
}

/// Σ prompt tokens and Σ seconds of KV transfers having both.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct KvSums {
    tokens: u64,
    seconds: f64,
}

impl KvSums {
    fn add(&mut self, r: &RequestRecord, kv: Option<f64>) {
        if let (Some(t), Some(s)) = (r.input_tokens, usable(kv).filter(|s| *s > 0.0)) {
            self.tokens = self.tokens.saturating_add(t);
            self.seconds += s;
        }
    }

    fn merge(&mut self, o: &Self) {
        self.tokens = self.tokens.saturating_add(o.tokens);
        self.seconds += o.seconds;
    }

    fn rate(&self) -> Option<f64> {
        (self.tokens > 0 && self.seconds > 0.0).then(|| self.tokens as f64 / self.seconds)
    }

    fn encode(&self, w: &mut Writer<'_>) {
        w.varint(self.tokens);
        w.f64(self.seconds);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            tokens: r.varint()?,
            seconds: r.f64()?,
        })
    }
}

/// One worker's part of a series' disaggregated requests.
#[derive(Clone, Debug, PartialEq)]
struct WorkerAcc {
    pool: Pool,
    name: Arc<str>,
    requests: u64,
    /// Its pool's sub-phases ([`PREFILL_WORKER`] or [`DECODE_WORKER`] positions, in order).
    phases: [Distribution; 4],
    kv: KvSums,
}

impl WorkerAcc {
    fn new(pool: Pool, name: Arc<str>) -> Self {
        Self {
            pool,
            name,
            requests: 0,
            phases: Default::default(),
            kv: KvSums::default(),
        }
    }

    fn merge(&mut self, o: &Self) {
        self.requests += o.requests;
        for (a, b) in self.phases.iter_mut().zip(&o.phases) {
            a.merge(b);
        }
        self.kv.merge(&o.kv);
    }
}

/// The mergeable disaggregated part of an [`Accumulator`](super::Accumulator).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DisaggAccumulator {
    requests: u64,
    ttft: Distribution,
    phases: [Distribution; N],
    /// Requests with a TTFT, Σ their TTFT and Σ each of their sub-phases.
    share_count: u64,
    ttft_sum: f64,
    share_sums: [f64; N],
    kv: KvSums,
    /// Sorted by (pool, name).
    workers: Vec<WorkerAcc>,
}

impl DisaggAccumulator {
    /// Adds a record's sub-phases; `false` (nothing added) unless it is an `ok` record with
    /// sub-phases.
    pub fn add(&mut self, config: &Config, r: &RequestRecord) -> bool {
        let Some(d) = r.disagg.as_deref().filter(|_| r.outcome == Outcome::Ok) else {
            return false;
        };
        let v = d.seconds().map(usable);
        self.requests += 1;
        self.ttft.add(config, r.ttft);
        for (dist, value) in self.phases.iter_mut().zip(v) {
            dist.add(config, value);
        }
        if let Some(ttft) = usable(r.ttft) {
            self.share_count += 1;
            self.ttft_sum += ttft;
            for (sum, value) in self.share_sums.iter_mut().zip(v) {
                *sum += value.unwrap_or(0.0);
            }
        }
        self.kv.add(r, v[KV]);
        for (pool, name) in [
            (Pool::Prefill, &d.prefill_worker),
            (Pool::Decode, &d.decode_worker),
        ] {
            let Some(name) = name else { continue };
            let w = self.worker(pool, name);
            w.requests += 1;
            for (dist, &i) in w.phases.iter_mut().zip(positions(pool)) {
                dist.add(config, v[i]);
            }
            if pool == Pool::Prefill {
                w.kv.add(r, v[KV]);
            }
        }
        true
    }

    /// The worker's entry, created if new (under the overflow name past [`MAX_WORKERS`]).
    fn worker(&mut self, pool: Pool, name: &str) -> &mut WorkerAcc {
        let find = |ws: &[WorkerAcc], name: &str| {
            ws.binary_search_by(|w| (w.pool, &*w.name).cmp(&(pool, name)))
        };
        let name = match find(&self.workers, name) {
            Ok(i) => return &mut self.workers[i],
            Err(_) if self.workers.len() >= MAX_WORKERS => OVERFLOW_LABEL,
            Err(_) => name,
        };
        let i = match find(&self.workers, name) {
            Ok(i) => i,
            Err(i) => {
                self.workers
                    .insert(i, WorkerAcc::new(pool, Arc::from(name)));
                i
            }
        };
        &mut self.workers[i]
    }

    /// Merges another into this one.
    pub fn merge(&mut self, o: &Self) {
        self.requests += o.requests;
        self.ttft.merge(&o.ttft);
        for (a, b) in self.phases.iter_mut().zip(&o.phases) {
            a.merge(b);
        }
        self.share_count += o.share_count;
        self.ttft_sum += o.ttft_sum;
        for (a, b) in self.share_sums.iter_mut().zip(&o.share_sums) {
            *a += b;
        }
        self.kv.merge(&o.kv);
        for w in &o.workers {
            match self
                .workers
                .binary_search_by(|x| (x.pool, &*x.name).cmp(&(w.pool, &*w.name)))
            {
                Ok(i) => self.workers[i].merge(w),
                Err(i) => self.workers.insert(i, w.clone()),
            }
        }
    }

    fn distributions_mut(&mut self) -> impl Iterator<Item = &mut Distribution> {
        std::iter::once(&mut self.ttft)
            .chain(self.phases.iter_mut())
            .chain(self.workers.iter_mut().flat_map(|w| w.phases.iter_mut()))
    }

    /// Releases spare capacity.
    pub fn shrink(&mut self) {
        for d in self.distributions_mut() {
            d.shrink();
        }
        self.workers.shrink_to_fit();
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        std::iter::once(&self.ttft)
            .chain(&self.phases)
            .chain(self.workers.iter().flat_map(|w| &w.phases))
            .map(Distribution::heap_bytes)
            .sum::<usize>()
            + self.workers.capacity() * std::mem::size_of::<WorkerAcc>()
            + self
                .workers
                .iter()
                .map(|w| crate::heap_size::arc_str_bytes(w.name.len()))
                .sum::<usize>()
    }

    /// True when no request was added.
    pub fn is_empty(&self) -> bool {
        self.requests == 0
    }

    pub(super) fn encode(&self, w: &mut Writer<'_>) {
        w.varint(self.requests);
        self.ttft.encode(w);
        for d in &self.phases {
            d.encode(w);
        }
        w.varint(self.share_count);
        w.f64(self.ttft_sum);
        for s in self.share_sums {
            w.f64(s);
        }
        self.kv.encode(w);
        w.varint(self.workers.len() as u64);
        for x in &self.workers {
            w.u8(x.pool.code());
            w.text(&x.name);
            w.varint(x.requests);
            for d in &x.phases {
                d.encode(w);
            }
            x.kv.encode(w);
        }
    }

    pub(super) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let requests = r.varint()?;
        let ttft = Distribution::decode(r)?;
        let mut phases: [Distribution; N] = Default::default();
        for d in &mut phases {
            *d = Distribution::decode(r)?;
        }
        let share_count = r.varint()?;
        let ttft_sum = r.f64()?;
        let mut share_sums = [0.0; N];
        for s in &mut share_sums {
            *s = r.f64()?;
        }
        let kv = KvSums::decode(r)?;
        let n = r.len(4)?;
        let mut workers: Vec<WorkerAcc> = Vec::with_capacity(n);
        for _ in 0..n {
            let pool = Pool::from_code(r.u8()?).ok_or_else(|| r.error("unknown pool"))?;
            let name = r.text()?;
            let mut w = WorkerAcc::new(pool, Arc::from(name));
            w.requests = r.varint()?;
            for d in &mut w.phases {
                *d = Distribution::decode(r)?;
            }
            w.kv = KvSums::decode(r)?;
            if workers
                .last()
                .is_some_and(|p| (p.pool, &*p.name) >= (w.pool, &*w.name))
            {
                return Err(r.error("workers not sorted"));
            }
            workers.push(w);
        }
        Ok(Self {
            requests,
            ttft,
            phases,
            share_count,
            ttft_sum,
            share_sums,
            kv,
            workers,
        })
    }

    /// Share of the disaggregated requests' TTFT at most `limit` (see
    /// [`Distribution::fraction_at_most`]).
    pub fn ttft_at_most(&self, config: &Config, limit: f64) -> Option<f64> {
        self.ttft.fraction_at_most(config, limit)
    }

    /// The KPIs; `None` when no disaggregated request was added.
    pub fn kpis(&self, config: &Config) -> Option<DisaggKpis> {
        if self.requests == 0 {
            return None;
        }
        let share = |i: usize| {
            (SUB_PHASES[i].2 && self.share_count > 0 && self.ttft_sum > 0.0)
                .then(|| self.share_sums[i] / self.ttft_sum)
        };
        let sub_phase = |i: usize, d: &Distribution, with_share: bool| {
            d.stats(config).map(|latency| SubPhaseKpis {
                name: SUB_PHASES[i].0,
                latency,
                ttft_share: if with_share { share(i) } else { None },
            })
        };
        let pools = [Pool::Router, Pool::Prefill, Pool::Decode]
            .into_iter()
            .filter_map(|pool| {
                let sub_phases: Vec<SubPhaseKpis> = (0..N)
                    .filter(|i| SUB_PHASES[*i].1 == pool)
                    .filter_map(|i| sub_phase(i, &self.phases[i], true))
                    .collect();
                let workers: Vec<String> = self
                    .workers
                    .iter()
                    .filter(|w| w.pool == pool)
                    .map(|w| w.name.to_string())
                    .collect();
                (!sub_phases.is_empty() || !workers.is_empty()).then_some(PoolKpis {
                    pool,
                    workers,
                    sub_phases,
                })
            })
            .collect();
        let workers = self
            .workers
            .iter()
            .map(|w| WorkerKpis {
                pool: w.pool,
                worker: w.name.to_string(),
                requests: w.requests,
                sub_phases: positions(w.pool)
                    .iter()
                    .zip(&w.phases)
                    .filter_map(|(&i, d)| sub_phase(i, d, false))
                    .collect(),
                kv_transfer_tokens_per_second: w.kv.rate(),
            })
            .collect();
        Some(DisaggKpis {
            requests: self.requests,
            ttft: self.ttft.stats(config),
            kv_transfer_tokens_per_second: self.kv.rate(),
            requests_per_second: 0.0,
            ttft_slo_attainment: None,
            tpot_slo_attainment: None,
            pools,
            workers,
        })
    }
}

/// The disaggregated KPIs of a series over a window (`disagg` in `GET /api/kpis`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DisaggKpis {
    /// `ok` requests that crossed prefill and decode pools.
    pub requests: u64,
    /// Their time to first token.
    pub ttft: Option<LatencyStats>,
    /// Σ prompt tokens / Σ KV transfer seconds over the transfers with both: the rate one
    /// transfer achieved (concurrent transfers on one link each get their share of it).
    pub kv_transfer_tokens_per_second: Option<f64>,
    /// Disaggregated requests per second of the window's covered time: the load both pools
    /// served (every one crossed both).
    pub requests_per_second: f64,
    /// Share of them whose TTFT met the TTFT SLO (the prefill side's objective), at sketch
    /// bucket resolution; `None` without a TTFT SLO.
    pub ttft_slo_attainment: Option<f64>,
    /// Share of the series' `ok` requests whose TPOT met the TPOT SLO (the decode side's
    /// objective; in a disaggregated series those are its requests); `None` without a TPOT
    /// SLO or TPOT.
    pub tpot_slo_attainment: Option<f64>,
    /// Per pool (router, prefill, decode): its workers and its sub-phases.
    pub pools: Vec<PoolKpis>,
    /// Per worker, sorted by pool then name.
    pub workers: Vec<WorkerKpis>,
}

impl DisaggKpis {
    /// A sub-phase's KPIs over the whole series (from its pool), by name.
    pub fn sub_phase(&self, name: &str) -> Option<&SubPhaseKpis> {
        self.pools
            .iter()
            .flat_map(|p| &p.sub_phases)
            .find(|s| s.name == name)
    }

    /// A sub-phase's share of TTFT; zero when the sub-phase was never reported.
    pub fn ttft_share(&self, name: &str) -> f64 {
        self.sub_phase(name)
            .and_then(|s| s.ttft_share)
            .unwrap_or(0.0)
    }
}

/// The sub-phases of one pool.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolKpis {
    /// The pool.
    pub pool: Pool,
    /// Its workers seen in the window (`service.name`), sorted; empty for the router (the
    /// series' own service).
    pub workers: Vec<String>,
    /// Its sub-phases, in time order.
    pub sub_phases: Vec<SubPhaseKpis>,
}

/// One worker's requests.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerKpis {
    /// Its pool.
    pub pool: Pool,
    /// Its `service.name`.
    pub worker: String,
    /// Requests it served a part of.
    pub requests: u64,
    /// Its pool's sub-phases, measured on this worker (`ttft_share` left out).
    pub sub_phases: Vec<SubPhaseKpis>,
    /// KV transfer rate of its transfers (prefill workers), prompt tokens per second.
    pub kv_transfer_tokens_per_second: Option<f64>,
}

/// One sub-phase's latency and share of TTFT.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SubPhaseKpis {
    /// Sub-phase name ([`sc::disagg`]).
    pub name: &'static str,
    /// Its latency over the requests that reported it.
    pub latency: LatencyStats,
    /// Σ sub-phase / Σ TTFT over the requests with a TTFT (a missing sub-phase counting zero);
    /// `null` for `decode_bootstrap` and `decode` (not along TTFT) and per worker.
    pub ttft_share: Option<f64>,
}
