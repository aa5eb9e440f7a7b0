//! Disaggregated serving: a router, P prefill workers and D decode workers, each worker its own
//! continuous-batching engine ([`Simulator`]) on its own simulated GPU, with per-request ground
//! truth of every sub-phase.
//!
//! # The model
//!
//! A request goes through these sub-phases, one after the other, on the simulator's clock:
//!
//! | sub-phase | what happens | cost |
//! |---|---|---|
//! | routing | the router picks a prefill and a decode worker | [`DisaggConfig::routing`] |
//! | prefill queue | the prefill worker's waiting queue (its engine's queue) | the engine's scheduler |
//! | prefill | the prompt's forward pass on the prefill worker; it produces token 0 | [`CostModel`](crate::CostModel) |
//! | bootstrap | the decode worker reserves KV memory for the sequence (waiting while it is full), then the handshake | wait + [`DisaggConfig::handshake`] |
//! | KV transfer | the prompt's KV cache crosses the prefill worker's link | prompt tokens × [`kv_bytes_per_token`](DisaggConfig::kv_bytes_per_token) ÷ bandwidth share |
//! | decode wait | KV received → admitted to the decode worker's running batch | the engine's scheduler |
//! | first token | the decode worker's first step emits token 0 (SGLang's prebuilt output) | one decode step |
//! | decode | token 0 → last token | decode steps |
//!
//! - **Router policy: least loaded.** Each worker's load is the number of requests routed to it
//!   whose part there is not over (a prefill worker's ends with its KV transfer, a decode
//!   worker's when the request leaves its engine); the lowest load wins, ties go to the lowest
//!   index. The choice is made at the end of the routing delay.
//! - **Links: processor sharing.** Each prefill worker has one outgoing link of
//!   [`link_bandwidth`](DisaggConfig::link_bandwidth); the transfers in flight on it share it
//!   equally (see `link.rs`): alone a transfer takes `bytes ÷ bandwidth`, two started together
//!   both take twice as long.
//! - **Decode KV memory.** Each decode worker holds [`decode_kv_tokens`](DisaggConfig::decode_kv_tokens)
//!   tokens of KV cache. At bootstrap a request reserves its prompt plus its most output tokens
//!   (its exact output length when fixed); a reservation that does not fit waits, first come
//!   first served, until requests leave the decode engine and release theirs. The wait is part
//!   of the bootstrap (as SGLang's `prefill_bootstrap` includes the decode side's
//!   pre-allocation), and is told apart in [`PdTruth::kv_alloc_wait`].
//! - The bootstrap follows the prefill here (a KV connector that pulls after the prefill, as
//!   vLLM's do); SGLang handshakes before its prefill. The sum along time to first token is the
//!   same.
//!
//! **Truth.** Every instant is what happened on the simulator's clock, as the engines stamp
//! theirs: the routing decision and the end of the handshake when their timers fired, a
//! transfer's end when the link's task saw its last byte (processor sharing computes the
//! shares to the nanosecond; a timer that fires late makes the end that much later, never the
//! shares wrong). How late every timer fired is in [`DisaggSim::step_lateness`], the run's
//! scheduler noise. On a paused tokio clock (tests) with whole-millisecond costs (tokio's
//! timers tick every millisecond), every sub-phase equals the cost model exactly.
//!
//! Every duration is scaled by [`DisaggConfig::time_scale`], engines included. Output lengths
//! and injected errors follow each engine's seed, derived from [`DisaggConfig::seed`] and the
//! worker's role and index.
//!
//! Each role calls its own method, so separate services can play the roles:
//! [`route`](DisaggSim::route) (router), [`prefill`](DisaggSim::prefill),
//! [`bootstrap`](DisaggSim::bootstrap) and [`transfer_kv`](DisaggSim::transfer_kv) (prefill
//! worker), [`decode`](DisaggSim::decode) (decode worker); [`serve`](DisaggSim::serve) runs
//! them all in order. [`truth`](DisaggSim::truth) gives each request's [`PdTruth`].

mod kv;
mod lateness;
mod link;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{
    FinishReason, KV_BYTES_PER_TOKEN, MEMORY_TOTAL_BYTES, RequestObserver, SimConfig, SimError,
    SimHandle, SimRequest, Simulator, TokenStream, TruthOutcome, TruthRecord, Usage, WEIGHTS_BYTES,
    clock,
};
use kv::KvPool;
use lateness::Lateness;
use link::Link;

/// Configuration of a [`DisaggSim`].
#[derive(Clone, Debug, PartialEq)]
pub struct DisaggConfig {
    /// Prefill workers (≥ 1). Default 1.
    pub prefill_workers: usize,
    /// Decode workers (≥ 1). Default 1.
    pub decode_workers: usize,
    /// Engine of every prefill worker (its `time_scale` and `seed` are replaced by this
    /// config's).
    pub prefill: SimConfig,
    /// Engine of every decode worker (same replacements).
    pub decode: SimConfig,
    /// The router's decision time. Default 200 µs.
    pub routing: Duration,
    /// The bootstrap handshake between the prefill and the decode worker, once KV memory is
    /// reserved. Default 1 ms (a round trip and the exchange of KV block addresses).
    pub handshake: Duration,
    /// KV-cache bytes per prompt token. Default [`KV_BYTES_PER_TOKEN`] (128 KiB, Llama-3.1-8B
    /// in BF16).
    pub kv_bytes_per_token: u64,
    /// Bandwidth of each prefill worker's link, bytes per second. Default 50 GB/s (a 400 Gb/s
    /// RDMA NIC).
    pub link_bandwidth: f64,
    /// KV-cache capacity of each decode worker, tokens. Default: 90 % of the simulated H100's
    /// memory left by the weights, ≈ 443 k tokens.
    pub decode_kv_tokens: u64,
    /// Multiplies every duration (1.0 real time). Must be finite and ≥ 0. Default 1.0.
    pub time_scale: f64,
    /// Seed of every engine (mixed with the worker's role and index). Default 42.
    pub seed: u64,
}

impl Default for DisaggConfig {
    fn default() -> Self {
        let free = MEMORY_TOTAL_BYTES.saturating_sub(WEIGHTS_BYTES) as f64 * 0.9;
        Self {
            prefill_workers: 1,
            decode_workers: 1,
            prefill: SimConfig::default(),
            decode: SimConfig::default(),
            routing: Duration::from_micros(200),
            handshake: Duration::from_millis(1),
            kv_bytes_per_token: KV_BYTES_PER_TOKEN,
            link_bandwidth: 50e9,
            decode_kv_tokens: (free / KV_BYTES_PER_TOKEN as f64) as u64,
            time_scale: 1.0,
            seed: 42,
        }
    }
}

impl DisaggConfig {
    /// Checks the topology and the engines; [`DisaggSim::start`] calls this.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |what: &str| Err(SimError::InvalidConfig(what.to_owned()));
        if self.prefill_workers == 0 || self.decode_workers == 0 {
            return bad(
                "a disaggregated deployment needs at least one prefill and one decode worker",
            );
        }
        if !self.link_bandwidth.is_finite() || self.link_bandwidth <= 0.0 {
            return bad("link_bandwidth must be finite and > 0");
        }
        if self.decode_kv_tokens == 0 {
            return bad("decode_kv_tokens must be at least 1");
        }
        if !self.time_scale.is_finite() || self.time_scale < 0.0 {
            return bad("time_scale must be finite and >= 0");
        }
        self.engine(&self.prefill, 0, 0).validate()?;
        self.engine(&self.decode, 1, 0).validate()
    }

    /// The engine config of worker `index` of `role` (0 prefill, 1 decode).
    fn engine(&self, base: &SimConfig, role: u64, index: usize) -> SimConfig {
        let mix = (role << 32 | index as u64).wrapping_add(1);
        SimConfig {
            time_scale: self.time_scale,
            seed: self.seed ^ mix.wrapping_mul(0xD1B5_4A32_D192_ED03),
            ..base.clone()
        }
    }

    /// `d` scaled by [`time_scale`](Self::time_scale).
    pub fn scaled(&self, d: Duration) -> Duration {
        Duration::try_from_secs_f64(d.as_secs_f64() * self.time_scale).unwrap_or(Duration::ZERO)
    }

    /// The nominal (unscaled) time to move `tokens` prompt tokens' KV cache over a link alone.
    pub fn transfer_time(&self, tokens: u32) -> Duration {
        let bytes = u64::from(tokens).saturating_mul(self.kv_bytes_per_token) as f64;
        Duration::try_from_secs_f64(bytes / self.link_bandwidth).unwrap_or(Duration::MAX)
    }
}

/// Where the router sent a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routed {
    /// The request's id in this simulator (key of [`DisaggSim::truth`]).
    pub id: u64,
    /// Index of the chosen prefill worker.
    pub prefill_worker: usize,
    /// Index of the chosen decode worker.
    pub decode_worker: usize,
}

/// The true sub-phase instants of one disaggregated request, on the simulator's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct PdTruth {
    /// Request id.
    pub id: u64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// The prefill worker's index.
    pub prefill_worker: usize,
    /// The decode worker's index.
    pub decode_worker: usize,
    /// The router received it (start of routing).
    pub arrived: Instant,
    /// The router chose the workers.
    pub routed: Instant,
    /// The prefill engine's record (submitted = start of the prefill queue).
    pub prefill: Option<TruthRecord>,
    /// Bootstrap started.
    pub bootstrap_start: Option<Instant>,
    /// The decode worker granted the KV reservation.
    pub kv_allocated: Option<Instant>,
    /// Bootstrap (reservation and handshake) done.
    pub bootstrap_end: Option<Instant>,
    /// KV transfer started.
    pub transfer_start: Option<Instant>,
    /// The KV cache's last byte arrived.
    pub transfer_end: Option<Instant>,
    /// Bytes of KV cache moved.
    pub kv_bytes: u64,
    /// The decode engine's record (submitted = start of the decode wait).
    pub decode: Option<TruthRecord>,
}

fn span(a: Option<Instant>, b: Option<Instant>) -> Option<Duration> {
    Some(b?.saturating_duration_since(a?))
}

impl PdTruth {
    /// Arrival at the router → workers chosen.
    pub fn routing(&self) -> Duration {
        self.routed.saturating_duration_since(self.arrived)
    }
    /// The prefill worker's queue.
    pub fn prefill_queue(&self) -> Option<Duration> {
        self.prefill.as_ref()?.queue()
    }
    /// The prefill forward (scheduled → token 0 on the prefill worker).
    pub fn prefill(&self) -> Option<Duration> {
        self.prefill.as_ref()?.prefill()
    }
    /// Bootstrap: KV reservation (with its wait) and handshake.
    pub fn bootstrap(&self) -> Option<Duration> {
        span(self.bootstrap_start, self.bootstrap_end)
    }
    /// The part of the bootstrap spent waiting for the decode worker's KV memory.
    pub fn kv_alloc_wait(&self) -> Option<Duration> {
        span(self.bootstrap_start, self.kv_allocated)
    }
    /// KV transfer.
    pub fn kv_transfer(&self) -> Option<Duration> {
        span(self.transfer_start, self.transfer_end)
    }
    /// KV received → admitted to the decode batch.
    pub fn decode_wait(&self) -> Option<Duration> {
        self.decode.as_ref()?.queue()
    }
    /// Admitted to the decode batch → token 0 emitted.
    pub fn first_token(&self) -> Option<Duration> {
        self.decode.as_ref()?.prefill()
    }
    /// Token 0 → last token on the decode worker.
    pub fn decode(&self) -> Option<Duration> {
        self.decode.as_ref()?.decode()
    }
    /// Arrival at the router → token 0 emitted by the decode worker.
    pub fn ttft(&self) -> Option<Duration> {
        Some(
            self.decode
                .as_ref()?
                .first_token?
                .saturating_duration_since(self.arrived),
        )
    }
    /// Arrival at the router → the request left the decode worker.
    pub fn e2e(&self) -> Option<Duration> {
        Some(
            self.decode
                .as_ref()?
                .finished?
                .saturating_duration_since(self.arrived),
        )
    }
    /// How the request ended on the decode worker (`None` before it got there or while running).
    pub fn outcome(&self) -> Option<TruthOutcome> {
        self.decode.as_ref()?.outcome
    }
}

/// Progress of one request.
#[derive(Debug)]
struct State {
    request: SimRequest,
    routed: Routed,
    arrived: Instant,
    routed_at: Instant,
    prefill_id: Option<u64>,
    bootstrap_start: Option<Instant>,
    kv_allocated: Option<Instant>,
    bootstrap_end: Option<Instant>,
    transfer_start: Option<Instant>,
    transfer_end: Option<Instant>,
    decode_id: Option<u64>,
    /// KV tokens reserved on the decode worker and not yet handed to its engine.
    reserved: u64,
    /// Still counted in the prefill / decode worker's load.
    prefill_load: bool,
    decode_load: bool,
}

struct Shared {
    config: DisaggConfig,
    prefill: Vec<SimHandle>,
    decode: Vec<SimHandle>,
    links: Vec<Link>,
    kv: Vec<Arc<KvPool>>,
    inner: Mutex<Inner>,
    lateness: Arc<Mutex<Lateness>>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    prefill_load: Vec<u64>,
    decode_load: Vec<u64>,
    requests: HashMap<u64, State>,
    order: VecDeque<u64>,
}

/// A running disaggregated deployment (see the [module docs](self)). Cheap to clone.
#[derive(Clone)]
pub struct DisaggSim {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DisaggSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisaggSim")
            .field("prefill_workers", &self.shared.prefill.len())
            .field("decode_workers", &self.shared.decode.len())
            .finish_non_exhaustive()
    }
}

impl DisaggSim {
    /// Validates `config` and starts every worker's engine and link on the current tokio
    /// runtime.
    pub fn start(config: DisaggConfig) -> Result<Self, SimError> {
        config.validate()?;
        let prefill = (0..config.prefill_workers)
            .map(|i| Simulator::start(config.engine(&config.prefill, 0, i)))
            .collect::<Result<Vec<_>, _>>()?;
        let decode = (0..config.decode_workers)
            .map(|i| Simulator::start(config.engine(&config.decode, 1, i)))
            .collect::<Result<Vec<_>, _>>()?;
        let lateness = Arc::new(Mutex::new(Lateness::default()));
        let rate = if config.time_scale == 0.0 {
            f64::INFINITY
        } else {
            config.link_bandwidth / config.time_scale
        };
        let links = (0..config.prefill_workers)
            .map(|_| Link::start(rate, lateness.clone()))
            .collect();
        let kv = (0..config.decode_workers)
            .map(|_| Arc::new(KvPool::new(config.decode_kv_tokens)))
            .collect();
        let inner = Inner {
            prefill_load: vec![0; config.prefill_workers],
            decode_load: vec![0; config.decode_workers],
            ..Inner::default()
        };
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                prefill,
                decode,
                links,
                kv,
                inner: Mutex::new(inner),
                lateness,
            }),
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration.
    pub fn config(&self) -> &DisaggConfig {
        &self.shared.config
    }

    /// The engines of the prefill workers, by index.
    pub fn prefill_workers(&self) -> &[SimHandle] {
        &self.shared.prefill
    }

    /// The engines of the decode workers, by index.
    pub fn decode_workers(&self) -> &[SimHandle] {
        &self.shared.decode
    }

    /// KV tokens reserved now on decode worker `index`.
    pub fn decode_kv_used(&self, index: usize) -> Option<u64> {
        Some(self.shared.kv.get(index)?.used())
    }

    /// KV tokens a request reserves on its decode worker.
    fn kv_tokens(request: &SimRequest) -> u64 {
        let out = request
            .output_tokens
            .map_or(request.max_output_tokens, |n| {
                n.min(request.max_output_tokens)
            });
        u64::from(request.prompt_tokens) + u64::from(out)
    }

    /// Router: takes `request`, waits the routing delay, then picks the least loaded prefill
    /// and decode workers. Refuses what no worker could serve.
    pub async fn route(&self, request: SimRequest) -> Result<Routed, SimError> {
        let cfg = &self.shared.config;
        if request.prompt_tokens == 0 || request.max_output_tokens == 0 {
            return Err(SimError::InvalidRequest(
                "prompt_tokens and max_output_tokens must be at least 1".to_owned(),
            ));
        }
        if !cfg.prefill.chunked_prefill && request.prompt_tokens > cfg.prefill.max_batched_tokens {
            return Err(SimError::InvalidRequest(format!(
                "prompt of {} tokens exceeds the prefill workers' max_batched_tokens {}",
                request.prompt_tokens, cfg.prefill.max_batched_tokens
            )));
        }
        let kv = Self::kv_tokens(&request);
        if kv > cfg.decode_kv_tokens {
            return Err(SimError::InvalidRequest(format!(
                "{kv} KV tokens exceed a decode worker's capacity of {}",
                cfg.decode_kv_tokens
            )));
        }
        let arrived = clock::now();
        self.sleep_until(arrived + cfg.scaled(cfg.routing)).await;
        let routed_at = clock::now();
        let mut inner = self.inner();
        let least = |load: &[u64]| {
            load.iter()
                .enumerate()
                .min_by_key(|(i, l)| (**l, *i))
                .map_or(0, |(i, _)| i)
        };
        let routed = Routed {
            id: inner.next_id,
            prefill_worker: least(&inner.prefill_load),
            decode_worker: least(&inner.decode_load),
        };
        inner.next_id += 1;
        inner.prefill_load[routed.prefill_worker] += 1;
        inner.decode_load[routed.decode_worker] += 1;
        let capacity = cfg.prefill.truth_capacity.max(1);
        while inner.order.len() >= capacity {
            if let Some(old) = inner.order.pop_front() {
                inner.requests.remove(&old);
            }
        }
        inner.order.push_back(routed.id);
        inner.requests.insert(
            routed.id,
            State {
                request,
                routed,
                arrived,
                routed_at,
                prefill_id: None,
                bootstrap_start: None,
                kv_allocated: None,
                bootstrap_end: None,
                transfer_start: None,
                transfer_end: None,
                decode_id: None,
                reserved: 0,
                prefill_load: true,
                decode_load: true,
            },
        );
        Ok(routed)
    }

    /// Where request `id` was routed.
    pub fn routed(&self, id: u64) -> Option<Routed> {
        Some(self.inner().requests.get(&id)?.routed)
    }

    fn unknown(id: u64) -> SimError {
        SimError::InvalidRequest(format!("no routed request {id}"))
    }

    /// Prefill worker: submits request `id`'s prompt to its prefill engine, which produces
    /// token 0 at the end of the prefill (the stream then finishes).
    pub fn prefill(
        &self,
        id: u64,
        observer: impl RequestObserver,
    ) -> Result<TokenStream, SimError> {
        let (prompt, worker) = {
            let inner = self.inner();
            let s = inner.requests.get(&id).ok_or_else(|| Self::unknown(id))?;
            (s.request.prompt_tokens, s.routed.prefill_worker)
        };
        let engine = &self.shared.prefill[worker];
        let stream = engine.submit(SimRequest::new(prompt, 1).with_output_tokens(1), observer)?;
        if let Some(s) = self.inner().requests.get_mut(&id) {
            s.prefill_id = Some(stream.id());
        }
        Ok(stream)
    }

    /// Prefill worker, after the prefill: the decode worker reserves KV memory for request `id`
    /// (waiting while it is full), then the handshake.
    pub async fn bootstrap(&self, id: u64) -> Result<(), SimError> {
        let (tokens, worker) = {
            let inner = self.inner();
            let s = inner.requests.get(&id).ok_or_else(|| Self::unknown(id))?;
            (Self::kv_tokens(&s.request), s.routed.decode_worker)
        };
        let start = clock::now();
        if let Some(s) = self.inner().requests.get_mut(&id) {
            s.bootstrap_start = Some(start);
        }
        let pool = self.shared.kv[worker].clone();
        let granted = pool.reserve(tokens).await?;
        {
            let mut inner = self.inner();
            match inner.requests.get_mut(&id) {
                Some(s) => {
                    s.kv_allocated = Some(granted);
                    s.reserved = tokens;
                }
                None => {
                    drop(inner);
                    pool.release(tokens);
                    return Err(Self::unknown(id));
                }
            }
        }
        let cfg = &self.shared.config;
        self.sleep_until(granted + cfg.scaled(cfg.handshake)).await;
        let end = clock::now();
        if let Some(s) = self.inner().requests.get_mut(&id) {
            s.bootstrap_end = Some(end);
        }
        Ok(())
    }

    /// Prefill worker, after the bootstrap: moves request `id`'s KV cache over its prefill
    /// worker's link (shared with the transfers in flight there). Ends the request's load on
    /// the prefill worker.
    pub async fn transfer_kv(&self, id: u64) -> Result<(), SimError> {
        let (bytes, worker, start) = {
            let mut inner = self.inner();
            let s = inner
                .requests
                .get_mut(&id)
                .ok_or_else(|| Self::unknown(id))?;
            if s.bootstrap_end.is_none() {
                return Err(SimError::InvalidRequest(format!(
                    "request {id}: KV transfer before the bootstrap"
                )));
            }
            let start = clock::now();
            s.transfer_start = Some(start);
            let bytes = u64::from(s.request.prompt_tokens)
                .saturating_mul(self.shared.config.kv_bytes_per_token);
            (bytes, s.routed.prefill_worker, start)
        };
        let end = self.shared.links[worker].transfer(bytes, start).await?;
        let mut inner = self.inner();
        let Some(s) = inner.requests.get_mut(&id) else {
            return Err(Self::unknown(id));
        };
        s.transfer_end = Some(end);
        let counted = std::mem::take(&mut s.prefill_load);
        if counted {
            inner.prefill_load[worker] = inner.prefill_load[worker].saturating_sub(1);
        }
        Ok(())
    }

    /// Decode worker, after the transfer: submits request `id` with its KV cache in place to its
    /// decode engine, which streams every output token (token 0 first). The KV reservation and
    /// the decode worker's load end when the request leaves the engine.
    pub fn decode(&self, id: u64, observer: impl RequestObserver) -> Result<TokenStream, SimError> {
        let (request, worker, reserved, counted) = {
            let mut inner = self.inner();
            let s = inner
                .requests
                .get_mut(&id)
                .ok_or_else(|| Self::unknown(id))?;
            if s.transfer_end.is_none() {
                return Err(SimError::InvalidRequest(format!(
                    "request {id}: decode before the KV transfer"
                )));
            }
            (
                s.request.clone().with_kv_ready(),
                s.routed.decode_worker,
                std::mem::take(&mut s.reserved),
                std::mem::take(&mut s.decode_load),
            )
        };
        let release = Release {
            inner: observer,
            sim: self.clone(),
            worker,
            kv_tokens: reserved,
            load: counted,
        };
        let stream = self.shared.decode[worker].submit(request, release)?;
        if let Some(s) = self.inner().requests.get_mut(&id) {
            s.decode_id = Some(stream.id());
        }
        Ok(stream)
    }

    /// Gives back what request `id` still holds (KV reservation, worker loads) when its caller
    /// abandons it before the decode (an error or a cancelled client).
    pub fn abandon(&self, id: u64) {
        let mut inner = self.inner();
        let Some(s) = inner.requests.get_mut(&id) else {
            return;
        };
        let (p, d) = (s.routed.prefill_worker, s.routed.decode_worker);
        let reserved = std::mem::take(&mut s.reserved);
        let pl = std::mem::take(&mut s.prefill_load);
        let dl = std::mem::take(&mut s.decode_load);
        if pl {
            inner.prefill_load[p] = inner.prefill_load[p].saturating_sub(1);
        }
        if dl {
            inner.decode_load[d] = inner.decode_load[d].saturating_sub(1);
        }
        drop(inner);
        if reserved > 0 {
            self.shared.kv[d].release(reserved);
        }
    }

    /// The whole request in one call: route, prefill, bootstrap, transfer, then the decode
    /// worker's token stream (token 0 first). Observers see nothing.
    pub async fn serve(&self, request: SimRequest) -> Result<(u64, TokenStream), SimError> {
        let routed = self.route(request).await?;
        let id = routed.id;
        let result = async {
            let mut prefill = self.prefill(id, ())?;
            while let Some(ev) = prefill.recv().await {
                ev?;
            }
            self.bootstrap(id).await?;
            self.transfer_kv(id).await?;
            self.decode(id, ())
        }
        .await;
        if result.is_err() {
            self.abandon(id);
        }
        result.map(|s| (id, s))
    }

    /// The truth of request `id` (kept for the last `prefill.truth_capacity` requests).
    pub fn truth(&self, id: u64) -> Option<PdTruth> {
        let partial = {
            let inner = self.inner();
            self.partial_truth(inner.requests.get(&id)?)
        };
        Some(self.complete_truth(partial))
    }

    /// Every kept request's truth, oldest first.
    pub fn truth_all(&self) -> Vec<PdTruth> {
        // The engines' truth is read without this simulator's lock: an engine dropping a
        // request's observer takes that lock while holding its own.
        let partial: Vec<_> = {
            let inner = self.inner();
            inner
                .order
                .iter()
                .filter_map(|id| inner.requests.get(id))
                .map(|s| self.partial_truth(s))
                .collect()
        };
        partial
            .into_iter()
            .map(|p| self.complete_truth(p))
            .collect()
    }

    fn complete_truth(
        &self,
        (mut t, prefill_id, decode_id): (PdTruth, Option<u64>, Option<u64>),
    ) -> PdTruth {
        t.prefill = prefill_id.and_then(|i| self.shared.prefill[t.prefill_worker].truth(i));
        t.decode = decode_id.and_then(|i| self.shared.decode[t.decode_worker].truth(i));
        t
    }

    fn partial_truth(&self, s: &State) -> (PdTruth, Option<u64>, Option<u64>) {
        let r = s.routed;
        let t = PdTruth {
            id: r.id,
            prompt_tokens: s.request.prompt_tokens,
            prefill_worker: r.prefill_worker,
            decode_worker: r.decode_worker,
            arrived: s.arrived,
            routed: s.routed_at,
            prefill: None,
            bootstrap_start: s.bootstrap_start,
            kv_allocated: s.kv_allocated,
            bootstrap_end: s.bootstrap_end,
            transfer_start: s.transfer_start,
            transfer_end: s.transfer_end,
            kv_bytes: u64::from(s.request.prompt_tokens)
                .saturating_mul(self.shared.config.kv_bytes_per_token),
            decode: None,
        };
        (t, s.prefill_id, s.decode_id)
    }

    /// How late every timer of the deployment woke (engines' steps, routing, handshakes, links):
    /// the run's scheduler noise.
    pub fn step_lateness(&self) -> Vec<Duration> {
        let mut all: Vec<Duration> = self
            .shared
            .prefill
            .iter()
            .chain(&self.shared.decode)
            .flat_map(SimHandle::step_lateness)
            .collect();
        all.extend(
            self.shared
                .lateness
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter(),
        );
        all
    }

    async fn sleep_until(&self, deadline: Instant) {
        if deadline <= clock::now() {
            return;
        }
        tokio::time::sleep_until(deadline.into()).await;
        let late = clock::now().saturating_duration_since(deadline);
        self.shared
            .lateness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(late);
    }
}

/// The decode engine's observer: passes every event on, and when the engine drops it (the
/// request left the engine, or was refused) releases the KV reservation and the load.
struct Release<O> {
    inner: O,
    sim: DisaggSim,
    worker: usize,
    kv_tokens: u64,
    load: bool,
}

impl<O> Drop for Release<O> {
    fn drop(&mut self) {
        if self.load {
            let mut inner = self.sim.inner();
            let l = &mut inner.decode_load[self.worker];
            *l = l.saturating_sub(1);
        }
        if self.kv_tokens > 0 {
            self.sim.shared.kv[self.worker].release(self.kv_tokens);
        }
    }
}

impl<O: RequestObserver> RequestObserver for Release<O> {
    fn admitted(&self) {
        self.inner.admitted();
    }
    fn prefilled(&self, tokens: u32) {
        self.inner.prefilled(tokens);
    }
    fn token(&self, index: u32) {
        self.inner.token(index);
    }
    fn finished(&self, reason: FinishReason, usage: Usage) {
        self.inner.finished(reason, usage);
    }
    fn failed(&self, error: &SimError, usage: Usage) {
        self.inner.failed(error, usage);
    }
    fn cancelled(&self) {
        self.inner.cancelled();
    }
}

#[cfg(test)]
mod tests;
