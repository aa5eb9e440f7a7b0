//! The running engine: [`Simulator::start`] spawns a tokio task that plans steps with the
//! [`Scheduler`], sleeps for their (scaled) cost, then emits tokens to each request's
//! [`TokenStream`], writes its [`TruthRecord`] and tells its [`RequestObserver`].

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use tokio::sync::mpsc;
use tokio_stream::Stream;

use crate::scheduler::{BatchLimits, SeqEvent, Sequence};
use crate::stats::StatsCell;
use crate::text::TokenText;
use crate::{
    EngineStats, FinishReason, RequestObserver, Scheduler, SimConfig, SimError, TruthLog,
    TruthOutcome, TruthRecord, Usage,
};

/// One generation request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRequest {
    /// Prompt length in tokens (≥ 1).
    pub prompt_tokens: u32,
    /// Most output tokens allowed (≥ 1); reaching it finishes with `length`.
    pub max_output_tokens: u32,
    /// Exact output length (capped by `max_output_tokens`); `None` draws it from the configured
    /// [`OutputLength`](crate::OutputLength) distribution.
    pub output_tokens: Option<u32>,
    /// Model name reported for this request; `None` uses the engine's.
    pub model: Option<String>,
    /// The prompt's KV cache is already on this engine (transferred from a prefill worker in
    /// disaggregated serving): the request is admitted without a prefill and its first decode
    /// step produces token 0.
    pub kv_ready: bool,
}

impl SimRequest {
    /// A request with a drawn output length.
    pub fn new(prompt_tokens: u32, max_output_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            max_output_tokens,
            output_tokens: None,
            model: None,
            kv_ready: false,
        }
    }

    /// Marks the prompt's KV cache as already present (see [`kv_ready`](Self::kv_ready)).
    pub fn with_kv_ready(mut self) -> Self {
        self.kv_ready = true;
        self
    }

    /// Fixes the output length (finish reason `stop` below `max_output_tokens`, else `length`).
    pub fn with_output_tokens(mut self, n: u32) -> Self {
        self.output_tokens = Some(n);
        self
    }
}

/// One generated token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// Index in the output, from 0.
    pub index: u32,
    /// Its text (a word from a fixed vocabulary, with a leading space).
    pub text: &'static str,
}

/// What a [`TokenStream`] yields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimEvent {
    /// A token was produced.
    Token(Token),
    /// The request finished; the stream ends after this.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
}

type EventTx = mpsc::UnboundedSender<Result<SimEvent, SimError>>;

/// The tokens of one request, as they are produced. Ends after [`SimEvent::Finished`] or an
/// error. Dropping it cancels the request: the engine frees its batch slot at the next step.
#[derive(Debug)]
pub struct TokenStream {
    id: u64,
    model: Arc<str>,
    rx: mpsc::UnboundedReceiver<Result<SimEvent, SimError>>,
    done: bool,
}

impl TokenStream {
    /// The request id (key of [`SimHandle::truth`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The model serving it.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The next event; `None` after the terminal one.
    pub async fn recv(&mut self) -> Option<Result<SimEvent, SimError>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<SimEvent, SimError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(ev)) => {
                if matches!(ev, Ok(SimEvent::Finished { .. }) | Err(_)) {
                    self.done = true;
                }
                Poll::Ready(Some(ev))
            }
            // The engine went away without a terminal event.
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(SimError::Stopped)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Stream for TokenStream {
    type Item = Result<SimEvent, SimError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx)
    }
}

/// A request on its way into the engine.
struct Pending {
    id: u64,
    seq: Sequence,
    reason: FinishReason,
    text: TokenText,
    observer: Box<dyn RequestObserver>,
    tx: EventTx,
}

/// Engine-side state of an accepted request.
struct Active {
    prompt_tokens: u32,
    generated: u32,
    reason: FinishReason,
    text: TokenText,
    observer: Box<dyn RequestObserver>,
    tx: EventTx,
}

struct Shared {
    config: SimConfig,
    model: Arc<str>,
    next_id: AtomicU64,
    stats: StatsCell,
    truth: Mutex<TruthLog>,
}

impl Shared {
    fn truth(&self) -> MutexGuard<'_, TruthLog> {
        // A panic while holding the lock cannot leave a record half-written in a harmful way.
        self.truth.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Starts simulated engines.
#[derive(Debug)]
pub struct Simulator;

impl Simulator {
    /// Validates `config` and spawns the engine task on the current tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use infertrace_sim::{SimConfig, SimEvent, SimRequest, Simulator};
    /// let sim = Simulator::start(SimConfig { time_scale: 0.01, ..Default::default() }).unwrap();
    /// let mut stream = sim.submit(SimRequest::new(100, 8).with_output_tokens(3), ()).unwrap();
    /// let mut tokens = 0;
    /// while let Some(ev) = stream.recv().await {
    ///     match ev.unwrap() {
    ///         SimEvent::Token(_) => tokens += 1,
    ///         SimEvent::Finished { reason, .. } => assert_eq!(reason.as_str(), "stop"),
    ///     }
    /// }
    /// assert_eq!(tokens, 3);
    /// let truth = sim.truth(stream.id()).unwrap();
    /// assert!(truth.scheduled.unwrap() <= truth.first_token.unwrap());
    /// # }
    /// ```
    pub fn start(config: SimConfig) -> Result<SimHandle, SimError> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            SimError::InvalidConfig("Simulator::start must run inside a tokio runtime".to_owned())
        })?;
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            model: Arc::from(config.model.as_str()),
            next_id: AtomicU64::new(0),
            stats: StatsCell::new(),
            truth: Mutex::new(TruthLog::new(config.truth_capacity)),
            config,
        });
        runtime.spawn(Engine::new(shared.clone(), rx).run());
        Ok(SimHandle { shared, tx })
    }
}

/// A cloneable handle to a running simulated engine. The engine stops once every handle is
/// dropped and its last request is done.
#[derive(Clone)]
pub struct SimHandle {
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<Pending>,
}

impl std::fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHandle")
            .field("model", &self.shared.model)
            .finish_non_exhaustive()
    }
}

impl SimHandle {
    /// The configuration the engine runs with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// The engine's model name.
    pub fn model(&self) -> &str {
        &self.shared.model
    }

    /// Submits a request: the engine streams its tokens and tells `observer` what happens to it
    /// (admitted, prefilled, tokens, finished / failed / cancelled); `()` observes nothing. Its
    /// truth starts now: the engine's queue phase begins at this call.
    pub fn submit(
        &self,
        request: SimRequest,
        observer: impl RequestObserver,
    ) -> Result<TokenStream, SimError> {
        let cfg = &self.shared.config;
        if request.prompt_tokens == 0 || request.max_output_tokens == 0 {
            return Err(SimError::InvalidRequest(
                "prompt_tokens and max_output_tokens must be at least 1".to_owned(),
            ));
        }
        if !cfg.chunked_prefill
            && !request.kv_ready
            && request.prompt_tokens > cfg.max_batched_tokens
        {
            return Err(SimError::InvalidRequest(format!(
                "prompt of {} tokens exceeds max_batched_tokens {} (enable chunked prefill)",
                request.prompt_tokens, cfg.max_batched_tokens
            )));
        }
        let stats = &self.shared.stats;
        if stats.waiting.fetch_add(1, Ordering::AcqRel) >= cfg.max_waiting as u64 {
            stats.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(SimError::QueueFull);
        }
        let submitted = crate::clock::now();
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let mut rng = StdRng::seed_from_u64(cfg.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let natural = request
            .output_tokens
            .unwrap_or_else(|| draw_length(cfg, &mut rng));
        let output = natural.clamp(1, request.max_output_tokens);
        let reason = if natural >= request.max_output_tokens {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let fails = rng.random::<f64>() < cfg.error_rate;
        let fail_at = fails.then(|| rng.random_range(0..output));
        let text = TokenText::new(rng.random());

        let model: Arc<str> = match &request.model {
            Some(m) => Arc::from(m.as_str()),
            None => self.shared.model.clone(),
        };
        self.shared
            .truth()
            .insert(TruthRecord::new(id, submitted, request.prompt_tokens));
        let (tx, rx) = mpsc::unbounded_channel();
        let pending = Pending {
            id,
            seq: {
                let mut seq = Sequence::new(id, request.prompt_tokens, output, fail_at);
                if request.kv_ready {
                    seq.prefilled = seq.prompt_tokens;
                }
                seq
            },
            reason,
            text,
            observer: Box::new(observer),
            tx,
        };
        if self.tx.send(pending).is_err() {
            stats.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(SimError::Stopped);
        }
        stats.submitted.fetch_add(1, Ordering::Relaxed);
        Ok(TokenStream {
            id,
            model,
            rx,
            done: false,
        })
    }

    /// The true phase instants of request `id` (kept for the last `truth_capacity` requests).
    pub fn truth(&self, id: u64) -> Option<TruthRecord> {
        self.shared.truth().get(id).cloned()
    }

    /// Every kept truth record, oldest first.
    pub fn truth_all(&self) -> Vec<TruthRecord> {
        self.shared.truth().records().cloned().collect()
    }

    /// How late the latest steps ended against the engine's nominal clock — a timer that woke
    /// late, or the engine's task run late between back-to-back steps (see
    /// [`TruthLog::step_lateness`]): the run's scheduler noise, a baseline for tolerances.
    pub fn step_lateness(&self) -> Vec<Duration> {
        self.shared.truth().step_lateness().collect()
    }

    /// A snapshot of the engine's counters (busy fraction, batch size, queue length, …).
    pub fn stats(&self) -> EngineStats {
        self.shared.stats.snapshot()
    }
}

fn draw_length(cfg: &SimConfig, rng: &mut StdRng) -> u32 {
    let dist = &cfg.output_length;
    // Validated: median ≥ 1 finite, sigma ≥ 0 finite, so LogNormal::new cannot fail.
    match LogNormal::new(dist.median.ln(), dist.sigma) {
        Ok(d) => {
            let x: f64 = d.sample(rng);
            x.round().clamp(1.0, f64::from(u32::MAX)) as u32
        }
        Err(_) => dist.median.round().clamp(1.0, f64::from(u32::MAX)) as u32,
    }
}

/// The engine task's state.
struct Engine {
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Pending>,
    scheduler: Scheduler,
    active: HashMap<u64, Active>,
    events: Vec<SeqEvent>,
    cancelled: Vec<u64>,
    /// Prompt chunks of the step in progress, reported to observers when it ends.
    prefilled: Vec<(u64, u32)>,
    /// Nominal end of the previous step, while the engine runs back to back.
    clock: Option<Instant>,
    /// When the previous step actually ended; `None` once the engine has waited for work.
    last_end: Option<Instant>,
}

/// A step starting within this of the previous step's nominal end continues the engine's
/// nominal clock (timer lateness is paid back instead of accumulating).
const CLOCK_SLACK: Duration = Duration::from_millis(5);

impl Engine {
    fn new(shared: Arc<Shared>, rx: mpsc::UnboundedReceiver<Pending>) -> Self {
        let cfg = &shared.config;
        let scheduler = Scheduler::new(BatchLimits {
            max_num_seqs: cfg.max_num_seqs,
            max_batched_tokens: cfg.max_batched_tokens,
            chunked_prefill: cfg.chunked_prefill,
        });
        Self {
            shared,
            rx,
            scheduler,
            active: HashMap::new(),
            events: Vec::new(),
            cancelled: Vec::new(),
            prefilled: Vec::new(),
            clock: None,
            last_end: None,
        }
    }

    async fn run(mut self) {
        loop {
            while let Ok(p) = self.rx.try_recv() {
                self.accept(p);
            }
            self.drop_cancelled();
            if self.scheduler.is_idle() {
                // Idle: the time until the next arrival is the simulated GPU's idle time.
                self.last_end = None;
                match self.rx.recv().await {
                    Some(p) => {
                        self.accept(p);
                        continue;
                    }
                    None => return,
                }
            }
            self.step().await;
        }
    }

    fn accept(&mut self, p: Pending) {
        let prompt_tokens = p.seq.prompt_tokens;
        self.scheduler.enqueue(p.seq);
        self.active.insert(
            p.id,
            Active {
                prompt_tokens,
                generated: 0,
                reason: p.reason,
                text: p.text,
                observer: p.observer,
                tx: p.tx,
            },
        );
    }

    /// Removes requests whose stream was dropped (checked at step boundaries, like a real engine).
    fn drop_cancelled(&mut self) {
        self.cancelled.clear();
        self.cancelled.extend(
            self.active
                .iter()
                .filter(|(_, a)| a.tx.is_closed())
                .map(|(id, _)| *id),
        );
        if self.cancelled.is_empty() {
            return;
        }
        let now = crate::clock::now();
        let mut truth = self.shared.truth();
        for id in self.cancelled.drain(..) {
            if let Some(a) = self.active.remove(&id) {
                a.observer.cancelled();
            }
            if self.scheduler.cancel(id) == Some(false) {
                self.shared.stats.waiting.fetch_sub(1, Ordering::AcqRel);
            }
            self.shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            if let Some(r) = truth.get_mut(id) {
                r.finished = Some(now);
                r.outcome = Some(TruthOutcome::Cancelled);
            }
        }
        drop(truth);
        self.publish_sizes();
    }

    fn publish_sizes(&self) {
        let stats = &self.shared.stats;
        stats
            .running
            .store(self.scheduler.running_len() as u64, Ordering::Release);
        let context: u64 = self
            .scheduler
            .running()
            .iter()
            .map(|s| u64::from(s.prefilled) + u64::from(s.generated))
            .sum();
        stats.context_tokens.store(context, Ordering::Release);
    }

    async fn step(&mut self) {
        let plan = self.scheduler.plan_step();
        let start = crate::clock::now();
        let stats = &self.shared.stats;
        // With work waiting since the previous step, the gap between two steps (the
        // simulator's own CPU time, or a timer that woke late on a busy machine) is busy time
        // to the simulated GPU, as on an engine whose scheduler overlaps the GPU's work: only
        // waiting for an arrival is idle.
        let busy_from = match self.last_end {
            Some(e) if e <= start => e,
            _ => start,
        };
        stats.step_begin(busy_from);
        {
            let mut truth = self.shared.truth();
            for id in &plan.admitted {
                if let Some(r) = truth.get_mut(*id) {
                    r.scheduled = Some(start);
                }
                if let Some(a) = self.active.get(id) {
                    a.observer.admitted();
                }
            }
            for (id, _) in &plan.prefill {
                if let Some(r) = truth.get_mut(*id) {
                    r.prefill_steps += 1;
                }
            }
        }
        self.prefilled.clear();
        self.prefilled.extend_from_slice(&plan.prefill);
        stats
            .waiting
            .fetch_sub(plan.admitted.len() as u64, Ordering::AcqRel);
        stats
            .prompt_tokens
            .fetch_add(plan.shape.prefill_tokens, Ordering::Relaxed);
        let cost = self.shared.config.cost.step_duration(&plan.shape);
        let duration = self.shared.config.scaled(cost);
        self.publish_sizes();

        // Back-to-back steps run on a nominal clock: a step that woke late (tokio timers have
        // 1 ms resolution) makes the next one shorter, so the engine's throughput follows the
        // cost model. After idling, or when far behind, the clock restarts from now.
        let nominal_start = match self.clock {
            Some(c) if c <= start && start - c <= CLOCK_SLACK => c,
            _ => start,
        };
        let deadline = nominal_start + duration;
        // Running back to back, the step should have ended `duration` after the previous
        // step's nominal end; how far past that it ends (a late timer, or the engine's task
        // scheduled late between steps) is the run's scheduler noise.
        let due = match (self.last_end, self.clock) {
            (Some(_), Some(c)) if c <= start => c + duration,
            _ => deadline,
        };
        self.clock = Some(deadline);
        if duration.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep_until(deadline.into()).await;
        }

        let end = crate::clock::now();
        if !duration.is_zero() {
            self.shared
                .truth()
                .step_late(end.saturating_duration_since(due));
        }
        self.events.clear();
        self.scheduler.complete_step(&mut self.events);
        stats.step_end(busy_from, end);
        self.last_end = Some(end);
        for (id, chunk) in &self.prefilled {
            if let Some(a) = self.active.get(id) {
                a.observer.prefilled(*chunk);
            }
        }
        self.emit(end);
        self.publish_sizes();
    }

    /// Delivers the step's events: truth first (stamped with the step's end), then the
    /// observer, then the stream.
    fn emit(&mut self, now: Instant) {
        let stats = &self.shared.stats;
        let mut truth = self.shared.truth();
        for ev in self.events.drain(..) {
            match ev {
                SeqEvent::Token { id, index, last } => {
                    stats.output_tokens.fetch_add(1, Ordering::Relaxed);
                    let Some(a) = self.active.get_mut(&id) else {
                        continue;
                    };
                    let mut rec = truth.get_mut(id);
                    if let Some(r) = rec.as_deref_mut() {
                        r.token_at(now);
                    }
                    a.observer.token(index);
                    a.generated += 1;
                    let token = Token {
                        index,
                        text: a.text.next_word(),
                    };
                    // A closed stream is noticed by `drop_cancelled` before the next step.
                    let _ = a.tx.send(Ok(SimEvent::Token(token)));
                    if !last {
                        continue;
                    }
                    let usage = Usage {
                        prompt_tokens: a.prompt_tokens,
                        output_tokens: index + 1,
                    };
                    if let Some(r) = rec {
                        r.finished = Some(now);
                        r.outcome = Some(TruthOutcome::Finished(a.reason));
                    }
                    a.observer.finished(a.reason, usage);
                    let _ = a.tx.send(Ok(SimEvent::Finished {
                        reason: a.reason,
                        usage,
                    }));
                    self.active.remove(&id);
                    stats.finished.fetch_add(1, Ordering::Relaxed);
                }
                SeqEvent::Failed { id } => {
                    let Some(a) = self.active.remove(&id) else {
                        continue;
                    };
                    let tokens = a.generated;
                    if let Some(r) = truth.get_mut(id) {
                        r.finished = Some(now);
                        r.outcome = Some(TruthOutcome::Error);
                    }
                    let err = SimError::Engine { tokens };
                    a.observer.failed(
                        &err,
                        Usage {
                            prompt_tokens: a.prompt_tokens,
                            output_tokens: tokens,
                        },
                    );
                    let _ = a.tx.send(Err(err));
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::TruthOutcome;

    fn cfg(time_scale: f64) -> SimConfig {
        SimConfig {
            time_scale,
            ..Default::default()
        }
    }

    /// Drains a stream; returns the token texts and the terminal event.
    async fn drain(s: &mut TokenStream) -> (Vec<&'static str>, Option<Result<SimEvent, SimError>>) {
        let mut words = Vec::new();
        let mut last = None;
        while let Some(ev) = s.recv().await {
            match ev {
                Ok(SimEvent::Token(t)) => {
                    assert!(last.is_none(), "token after the terminal event");
                    words.push(t.text);
                }
                other => last = Some(other),
            }
        }
        (words, last)
    }

    /// What an observer saw, each event with the instant it was told (its own clock).
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<(Seen, Instant)>>>);

    #[derive(Clone, Debug, PartialEq)]
    enum Seen {
        Admitted,
        Prefilled(u32),
        Token(u32),
        Finished(FinishReason, Usage),
        Failed(SimError, Usage),
        Cancelled,
    }

    impl Log {
        fn push(&self, e: Seen) {
            self.0.lock().unwrap().push((e, Instant::now()));
        }
        fn events(&self) -> Vec<Seen> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .map(|(e, _)| e.clone())
                .collect()
        }
        fn at(&self, e: &Seen) -> Instant {
            self.0
                .lock()
                .unwrap()
                .iter()
                .find(|(x, _)| x == e)
                .unwrap()
                .1
        }
    }

    impl RequestObserver for Log {
        fn admitted(&self) {
            self.push(Seen::Admitted);
        }
        fn prefilled(&self, tokens: u32) {
            self.push(Seen::Prefilled(tokens));
        }
        fn token(&self, index: u32) {
            self.push(Seen::Token(index));
        }
        fn finished(&self, reason: FinishReason, usage: Usage) {
            self.push(Seen::Finished(reason, usage));
        }
        fn failed(&self, error: &SimError, usage: Usage) {
            self.push(Seen::Failed(error.clone(), usage));
        }
        fn cancelled(&self) {
            self.push(Seen::Cancelled);
        }
    }

    #[tokio::test]
    async fn streams_tokens_and_tells_the_observer_after_the_truth() {
        let sim = Simulator::start(cfg(0.2)).unwrap();
        let log = Log::default();
        let mut s = sim
            .submit(SimRequest::new(500, 16).with_output_tokens(6), log.clone())
            .unwrap();
        let (words, last) = drain(&mut s).await;
        assert_eq!(words.len(), 6);
        let usage = Usage {
            prompt_tokens: 500,
            output_tokens: 6,
        };
        assert_eq!(
            last,
            Some(Ok(SimEvent::Finished {
                reason: FinishReason::Stop,
                usage
            }))
        );
        let t = sim.truth(s.id()).unwrap();
        assert_eq!(t.outcome, Some(TruthOutcome::Finished(FinishReason::Stop)));
        assert_eq!((t.output_tokens, t.prefill_steps), (6, 1));
        let mut want = vec![Seen::Admitted, Seen::Prefilled(500)];
        want.extend((0..6).map(Seen::Token));
        want.push(Seen::Finished(FinishReason::Stop, usage));
        assert_eq!(log.events(), want);
        // The truth is the engine's own: each instant is stamped from the step's state before the
        // observer hears of it, and the observer hears of it before the next step ends.
        let admitted = log.at(&Seen::Admitted);
        assert!(t.submitted <= t.scheduled.unwrap() && t.scheduled.unwrap() <= admitted);
        assert!(admitted < t.first_token.unwrap());
        assert!(t.first_token.unwrap() <= log.at(&Seen::Token(0)));
        assert!(log.at(&Seen::Token(0)) < t.last_token.unwrap());
        assert!(t.last_token.unwrap() <= log.at(&Seen::Token(5)));
        assert_eq!(t.finished, t.last_token);
        // Prefill of 500 tokens = 5 ms + 30 ms, scaled by 0.2 = 7 ms, the engine's first step:
        // it ends that long after it starts, late by the step's measured lateness.
        let prefill = t.prefill().unwrap();
        let late = sim.step_lateness().into_iter().max().unwrap_or_default();
        assert!(
            prefill >= Duration::from_millis(7) && prefill <= Duration::from_millis(8) + late,
            "{prefill:?}, lateness {late:?}"
        );
        // 5 decode steps of ≥ 7.1 ms × 0.2 each, less what the nominal clock may catch up on a
        // late first token (its 5 ms slack).
        assert!(t.decode().unwrap() + Duration::from_millis(5) >= Duration::from_micros(5 * 1_400));
    }

    #[tokio::test]
    async fn timer_lateness_does_not_accumulate_over_steps() {
        // 50 decode steps of (7 ms + 0.1 ms + ≈ 35 context tokens × 40 ns) × 0.2 ≈ 1.4205 ms
        // each: 71.0 ms nominal. Rounding every sleep up to tokio's 1 ms tick would make it
        // ≈ 100–130 ms without the nominal clock; a loaded machine adds a few ms at the end.
        let sim = Simulator::start(cfg(0.2)).unwrap();
        let mut s = sim
            .submit(SimRequest::new(10, 51).with_output_tokens(51), ())
            .unwrap();
        drain(&mut s).await;
        // One prefill step and 50 decode steps, each with its timer's lateness.
        assert_eq!(sim.step_lateness().len(), 51);
        let decode = sim.truth(s.id()).unwrap().decode().unwrap();
        let nominal: Duration = (0..50u64)
            .map(|i| {
                let shape = crate::StepShape {
                    decode_seqs: 1,
                    decode_context_tokens: 11 + i,
                    ..Default::default()
                };
                sim.config().scaled(sim.config().cost.step_duration(&shape))
            })
            .sum();
        // The nominal clock lets a step catch up on a late predecessor (up to CLOCK_SLACK), so
        // a late first token can make the decode phase slightly shorter than nominal. What it
        // cannot pay back is a step later than CLOCK_SLACK (the clock restarts there, on a
        // loaded machine) and the last step's own lateness: the bound is those, measured in
        // this run, plus 2 ms. Without the nominal clock, tokio's 1 ms tick alone adds ~30 ms
        // on a quiet machine (planted: 139 ms against a bound of 76 ms).
        let lateness = sim.step_lateness();
        let unpaid: Duration = lateness.iter().filter(|l| **l > CLOCK_SLACK).sum();
        let last = lateness.iter().max().copied().unwrap_or_default();
        let bound = nominal + unpaid + last + Duration::from_millis(2);
        assert!(
            decode >= nominal.saturating_sub(CLOCK_SLACK) && decode < bound,
            "decode {decode:?} vs nominal {nominal:?} (bound {bound:?}, lateness {lateness:?})"
        );
    }

    #[tokio::test]
    async fn one_slot_queues_the_second_request() {
        let sim = Simulator::start(SimConfig {
            max_num_seqs: 1,
            ..cfg(0.1)
        })
        .unwrap();
        let mut a = sim
            .submit(SimRequest::new(10, 5).with_output_tokens(5), ())
            .unwrap();
        let mut b = sim
            .submit(SimRequest::new(10, 5).with_output_tokens(5), ())
            .unwrap();
        let (ra, rb) = tokio::join!(drain(&mut a), drain(&mut b));
        assert_eq!((ra.0.len(), rb.0.len()), (5, 5));
        let (ta, tb) = (sim.truth(a.id()).unwrap(), sim.truth(b.id()).unwrap());
        assert!(tb.scheduled.unwrap() >= ta.finished.unwrap());
        assert!(tb.queue().unwrap() >= ta.finished.unwrap() - tb.submitted);
        let st = sim.stats();
        assert_eq!(
            (st.submitted, st.finished, st.running, st.waiting),
            (2, 2, 0, 0)
        );
        assert_eq!(st.output_tokens, 10);
        assert_eq!(st.prompt_tokens, 20);
    }

    #[tokio::test]
    async fn dropping_the_stream_cancels_and_frees_the_slot() {
        let sim = Simulator::start(SimConfig {
            max_num_seqs: 1,
            ..cfg(0.1)
        })
        .unwrap();
        let long_log = Log::default();
        let mut long = sim
            .submit(
                SimRequest::new(10, 10_000).with_output_tokens(10_000),
                long_log.clone(),
            )
            .unwrap();
        let mut next = sim
            .submit(SimRequest::new(10, 3).with_output_tokens(3), ())
            .unwrap();
        for _ in 0..3 {
            assert!(matches!(long.recv().await, Some(Ok(SimEvent::Token(_)))));
        }
        let long_id = long.id();
        drop(long);
        let dropped_at = Instant::now();
        let (words, last) = tokio::time::timeout(Duration::from_secs(5), drain(&mut next))
            .await
            .unwrap();
        assert_eq!(words.len(), 3);
        assert!(matches!(last, Some(Ok(SimEvent::Finished { .. }))));
        let t = sim.truth(long_id).unwrap();
        assert_eq!(t.outcome, Some(TruthOutcome::Cancelled));
        assert!(t.output_tokens < 100);
        assert_eq!(long_log.events().last(), Some(&Seen::Cancelled));
        let tn = sim.truth(next.id()).unwrap();
        // The slot is freed at the next step boundary (one decode step ≈ 0.7 ms here), late by
        // at most the run's worst timer lateness.
        let late = sim.step_lateness().into_iter().max().unwrap_or_default();
        let waited = tn.scheduled.unwrap() - dropped_at;
        assert!(
            waited < Duration::from_millis(20) + late,
            "{waited:?}, lateness {late:?}"
        );
        assert_eq!(sim.stats().cancelled, 1);
    }

    #[tokio::test]
    async fn injected_errors_end_the_stream_and_tell_the_observer() {
        let sim = Simulator::start(SimConfig {
            error_rate: 1.0,
            ..cfg(0.05)
        })
        .unwrap();
        for _ in 0..5 {
            let log = Log::default();
            let mut s = sim
                .submit(SimRequest::new(20, 8).with_output_tokens(8), log.clone())
                .unwrap();
            let (words, last) = drain(&mut s).await;
            assert!(words.len() < 8);
            assert_eq!(
                last,
                Some(Err(SimError::Engine {
                    tokens: words.len() as u32
                }))
            );
            let usage = Usage {
                prompt_tokens: 20,
                output_tokens: words.len() as u32,
            };
            assert_eq!(
                log.events().last(),
                Some(&Seen::Failed(
                    SimError::Engine {
                        tokens: words.len() as u32
                    },
                    usage
                ))
            );
            assert_eq!(
                sim.truth(s.id()).unwrap().outcome,
                Some(TruthOutcome::Error)
            );
        }
        assert_eq!(sim.stats().failed, 5);
    }

    #[tokio::test]
    async fn refuses_what_it_cannot_serve() {
        let sim = Simulator::start(SimConfig {
            max_num_seqs: 1,
            max_waiting: 1,
            max_batched_tokens: 100,
            ..cfg(0.05)
        })
        .unwrap();
        let bad = sim.submit(SimRequest::new(101, 5), ());
        assert!(matches!(bad, Err(SimError::InvalidRequest(_))));
        let zero = sim.submit(SimRequest::new(0, 5), ());
        assert!(matches!(zero, Err(SimError::InvalidRequest(_))));
        let _first = sim.submit(SimRequest::new(10, 5), ()).unwrap();
        let full = sim.submit(SimRequest::new(10, 5), ());
        assert_eq!(full.unwrap_err(), SimError::QueueFull);
    }

    #[tokio::test]
    async fn same_seed_same_outputs_different_seed_different() {
        async fn outputs(seed: u64) -> Vec<(Vec<&'static str>, bool)> {
            let sim = Simulator::start(SimConfig {
                seed,
                error_rate: 0.3,
                ..cfg(0.0)
            })
            .unwrap();
            let mut out = Vec::new();
            for _ in 0..20 {
                let mut s = sim.submit(SimRequest::new(10, 64), ()).unwrap();
                let (w, last) = drain(&mut s).await;
                out.push((w, matches!(last, Some(Err(_)))));
            }
            out
        }
        let a = outputs(7).await;
        assert_eq!(a, outputs(7).await);
        assert_ne!(a, outputs(8).await);
        assert!(a.iter().any(|(_, failed)| *failed) && a.iter().any(|(_, failed)| !*failed));
    }

    #[tokio::test]
    async fn drawn_lengths_are_capped_with_reason_length() {
        let sim = Simulator::start(cfg(0.0)).unwrap();
        // Median 128 ≫ cap 4: nearly every request is cut at 4 tokens with `length`.
        let mut lengths = 0;
        for _ in 0..10 {
            let mut s = sim.submit(SimRequest::new(10, 4), ()).unwrap();
            let (w, last) = drain(&mut s).await;
            if let Some(Ok(SimEvent::Finished {
                reason: FinishReason::Length,
                ..
            })) = last
            {
                assert_eq!(w.len(), 4);
                lengths += 1;
            }
        }
        assert!(lengths >= 8, "{lengths}");
    }

    /// Max inter-token gap of a decoding request while a 4000-token prompt is prefilled, the
    /// largest step lateness of the run (its scheduler noise), and the decoding request's tokens
    /// seen between the big prompt's consecutive prefill chunks (from one observer log shared
    /// by both requests, so in the engine's order).
    async fn stall_with(chunked: bool) -> (Duration, Duration, Vec<usize>) {
        let sim = Simulator::start(SimConfig {
            chunked_prefill: chunked,
            max_batched_tokens: if chunked { 512 } else { 8192 },
            ..cfg(0.2)
        })
        .unwrap();
        let log = Log::default();
        let mut decoding = sim
            .submit(SimRequest::new(10, 40).with_output_tokens(40), log.clone())
            .unwrap();
        for _ in 0..3 {
            decoding.recv().await;
        }
        let mut big = sim
            .submit(SimRequest::new(4000, 2).with_output_tokens(2), log.clone())
            .unwrap();
        let _ = tokio::join!(drain(&mut decoding), drain(&mut big));
        let big_truth = sim.truth(big.id()).unwrap();
        assert_eq!(big_truth.prefill_steps, if chunked { 8 } else { 1 });
        // The decoding request's tokens have indices ≥ 3 from here on; the big one's are 0, 1.
        let mut between = Vec::new();
        let mut tokens = None;
        for e in log.events() {
            match e {
                Seen::Prefilled(n) if n > 10 => {
                    between.extend(tokens);
                    tokens = Some(0);
                }
                Seen::Token(i) if i >= 3 => tokens = tokens.map(|t| t + 1),
                _ => {}
            }
        }
        let late = sim.step_lateness().into_iter().max().unwrap_or_default();
        (
            sim.truth(decoding.id()).unwrap().max_inter_token_gap,
            late,
            between,
        )
    }

    #[tokio::test]
    async fn chunked_prefill_removes_the_decode_stall() {
        // In the engine's own order: chunked, the decoding request gets a token between every
        // two of the 4000-token prompt's eight 512-token chunks; whole, there is one chunk.
        let (whole, _, whole_between) = stall_with(false).await;
        let (chunked, late, chunked_between) = stall_with(true).await;
        assert_eq!(chunked_between, vec![1; 7]);
        assert!(whole_between.is_empty(), "{whole_between:?}");
        // In time: whole, one 245 ms prefill step (× 0.2 = 49 ms) stalls the stream; the nominal
        // clock may pay back up to CLOCK_SLACK of the previous step's lateness, so the gap is at
        // least 49 ms minus that. Chunked, steps of ≈ 37.8 ms (× 0.2 ≈ 7.6 ms, decode included
        // ≤ 9 ms): a gap stretches by at most the run's worst lateness.
        assert!(
            whole >= Duration::from_millis(49) - CLOCK_SLACK,
            "{whole:?}"
        );
        let bound = Duration::from_millis(10) + late;
        assert!(chunked <= bound, "chunked {chunked:?}, bound {bound:?}");
    }

    #[tokio::test]
    async fn busy_fraction_reflects_load() {
        let sim = Simulator::start(cfg(0.1)).unwrap();
        let before = sim.stats();
        let mut streams: Vec<_> = (0..8)
            .map(|_| {
                sim.submit(SimRequest::new(200, 30).with_output_tokens(30), ())
                    .unwrap()
            })
            .collect();
        for s in &mut streams {
            drain(s).await;
        }
        let busy = sim.stats().busy_fraction_since(&before);
        assert!(busy > 0.7, "engine busy only {busy}");
        tokio::time::sleep(Duration::from_millis(30)).await;
        let idle_window = sim.stats();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(sim.stats().busy_fraction_since(&idle_window), 0.0);
    }
}
