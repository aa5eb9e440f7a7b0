//! [`Scheduler`]: the pure continuous-batching policy (no clock, no I/O, no randomness).
//!
//! Each engine step is planned with [`Scheduler::plan_step`], run for the duration the
//! [`CostModel`](crate::CostModel) gives its [`StepShape`], then applied with
//! [`Scheduler::complete_step`], which says which sequences produced a token, finished or failed.
//!
//! Policy (vLLM-like):
//! - **Waiting queue** is FIFO; a request is admitted to the running batch only when a slot is free
//!   (`max_num_seqs`) and the step's token budget (`max_batched_tokens`) allows. A request that does
//!   not fit blocks those behind it (no overtaking).
//! - **Without chunked prefill** a step either prefills newly admitted prompts whole (and running
//!   sequences do not decode in it: their streams stall) or decodes every running sequence.
//! - **With chunked prefill** every step first decodes every running sequence whose prompt is done
//!   (one token each), then spends the rest of the token budget on prompt chunks: first of running
//!   sequences still prefilling, then of newly admitted ones. A sequence's first token comes at the
//!   end of the step that prefills its last prompt chunk.

use std::collections::VecDeque;

use crate::StepShape;

/// One sequence the scheduler tracks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequence {
    /// Request id.
    pub id: u64,
    /// Prompt length in tokens (≥ 1).
    pub prompt_tokens: u32,
    /// Output tokens it will produce before finishing (≥ 1).
    pub output_tokens: u32,
    /// If set, the request fails instead of producing the token with this index (0 = fails at the
    /// end of its prefill, before any token).
    pub fail_at: Option<u32>,
    /// Prompt tokens prefilled so far.
    pub prefilled: u32,
    /// Output tokens produced so far.
    pub generated: u32,
}

impl Sequence {
    /// A sequence that has done nothing yet.
    pub fn new(id: u64, prompt_tokens: u32, output_tokens: u32, fail_at: Option<u32>) -> Self {
        Self {
            id,
            prompt_tokens: prompt_tokens.max(1),
            output_tokens: output_tokens.max(1),
            fail_at,
            prefilled: 0,
            generated: 0,
        }
    }

    fn prefill_done(&self) -> bool {
        self.prefilled >= self.prompt_tokens
    }

    fn context(&self) -> u64 {
        u64::from(self.prompt_tokens) + u64::from(self.generated)
    }
}

/// Batch limits the scheduler enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Maximum sequences in the running batch.
    pub max_num_seqs: usize,
    /// Maximum tokens processed per step.
    pub max_batched_tokens: u32,
    /// Whether prefill is chunked and shares steps with decodes.
    pub chunked_prefill: bool,
}

/// What one step does. Reused between steps (its vectors keep their capacity).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Requests admitted from the waiting queue at the start of this step (their `scheduled` mark).
    pub admitted: Vec<u64>,
    /// `(id, prompt tokens)` prefilled in this step.
    pub prefill: Vec<(u64, u32)>,
    /// Requests decoding one token in this step.
    pub decode: Vec<u64>,
    /// The step's shape for the cost model.
    pub shape: StepShape,
}

impl StepPlan {
    fn clear(&mut self) {
        self.admitted.clear();
        self.prefill.clear();
        self.decode.clear();
        self.shape = StepShape::default();
    }

    /// Total tokens (prefill + decode) this step processes.
    pub fn tokens(&self) -> u64 {
        self.shape.prefill_tokens + self.shape.decode_seqs
    }
}

/// What happened to one sequence at the end of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqEvent {
    /// The sequence produced the output token with this index (0 = first token).
    Token {
        /// Request id.
        id: u64,
        /// Token index.
        index: u32,
        /// True when this was its last token (it has left the batch).
        last: bool,
    },
    /// The sequence failed (injected engine error) and has left the batch.
    Failed {
        /// Request id.
        id: u64,
    },
}

/// The continuous-batching scheduler. See the [module docs](self) for the policy.
#[derive(Debug)]
pub struct Scheduler {
    limits: BatchLimits,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    plan: StepPlan,
    planned: bool,
}

impl Scheduler {
    /// An empty scheduler with these limits.
    pub fn new(limits: BatchLimits) -> Self {
        Self {
            limits,
            waiting: VecDeque::new(),
            running: Vec::with_capacity(limits.max_num_seqs),
            plan: StepPlan::default(),
            planned: false,
        }
    }

    /// The limits.
    pub fn limits(&self) -> BatchLimits {
        self.limits
    }

    /// Appends a request to the waiting queue.
    pub fn enqueue(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Requests waiting for a slot.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Requests in the running batch.
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// No request waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// The running sequences, in admission order.
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }

    /// Removes a request wherever it is. Returns `Some(true)` if it was running, `Some(false)` if
    /// it was waiting, `None` if unknown. Must not be called between `plan_step` and
    /// `complete_step` (the engine cancels at step boundaries, like a real engine).
    pub fn cancel(&mut self, id: u64) -> Option<bool> {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i);
            return Some(true);
        }
        let i = self.waiting.iter().position(|s| s.id == id)?;
        self.waiting.remove(i);
        Some(false)
    }

    /// Plans the next step: admits waiting requests and decides who prefills and who decodes.
    pub fn plan_step(&mut self) -> &StepPlan {
        self.plan.clear();
        self.planned = true;
        if self.limits.chunked_prefill {
            self.plan_chunked();
        } else {
            self.plan_whole();
        }
        &self.plan
    }

    /// Without chunked prefill: a prefill-only step if anything can be admitted, else decode.
    fn plan_whole(&mut self) {
        let budget = u64::from(self.limits.max_batched_tokens);
        let mut used = 0u64;
        while self.running.len() < self.limits.max_num_seqs {
            let Some(next) = self.waiting.front() else {
                break;
            };
            // A sequence whose KV cache is already here (disaggregated decode) needs no prefill.
            let need = u64::from(next.prompt_tokens - next.prefilled.min(next.prompt_tokens));
            // A prompt longer than the budget is admitted alone (the engine refuses such prompts
            // at submission; this keeps the scheduler total).
            if used > 0 && used + need > budget {
                break;
            }
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            used += need;
            self.plan.admitted.push(seq.id);
            if need > 0 {
                self.plan.prefill.push((seq.id, seq.prompt_tokens));
            }
            self.running.push(seq);
        }
        if used > 0 {
            self.plan.shape.prefill_tokens = used;
            return;
        }
        for s in &self.running {
            self.plan.decode.push(s.id);
            self.plan.shape.decode_seqs += 1;
            self.plan.shape.decode_context_tokens += s.context();
        }
    }

    /// With chunked prefill: decodes first, then prompt chunks within the token budget.
    fn plan_chunked(&mut self) {
        let mut budget = u64::from(self.limits.max_batched_tokens);
        for s in &self.running {
            if s.prefill_done() && budget > 0 {
                budget -= 1;
                self.plan.decode.push(s.id);
                self.plan.shape.decode_seqs += 1;
                self.plan.shape.decode_context_tokens += s.context();
            }
        }
        for s in &self.running {
            if budget == 0 {
                break;
            }
            if !s.prefill_done() {
                let chunk = u64::from(s.prompt_tokens - s.prefilled).min(budget);
                budget -= chunk;
                // chunk ≤ remaining prompt, which fits in u32
                self.plan.prefill.push((s.id, chunk as u32));
                self.plan.shape.prefill_tokens += chunk;
            }
        }
        while budget > 0 && self.running.len() < self.limits.max_num_seqs {
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            self.plan.admitted.push(seq.id);
            if seq.prefill_done() {
                // KV cache already here (disaggregated decode): it decodes in this very step.
                budget -= 1;
                self.plan.decode.push(seq.id);
                self.plan.shape.decode_seqs += 1;
                self.plan.shape.decode_context_tokens += seq.context();
                self.running.push(seq);
                continue;
            }
            let chunk = u64::from(seq.prompt_tokens - seq.prefilled).min(budget);
            budget -= chunk;
            self.plan.prefill.push((seq.id, chunk as u32));
            self.plan.shape.prefill_tokens += chunk;
            self.running.push(seq);
        }
    }

    /// Applies the planned step and appends what happened to `events` (in batch order).
    /// Finished and failed sequences leave the batch. Does nothing if no step was planned.
    pub fn complete_step(&mut self, events: &mut Vec<SeqEvent>) {
        if !std::mem::take(&mut self.planned) {
            return;
        }
        // Both lists are in running order, so one merge-like pass over `running` applies them.
        let (mut pi, mut di) = (0, 0);
        for s in &mut self.running {
            let mut produce = false;
            if let Some(&(id, chunk)) = self.plan.prefill.get(pi)
                && id == s.id
            {
                pi += 1;
                s.prefilled = s.prefilled.saturating_add(chunk).min(s.prompt_tokens);
                produce = s.prefill_done();
            } else if self.plan.decode.get(di) == Some(&s.id) {
                di += 1;
                produce = true;
            }
            if !produce {
                continue;
            }
            if s.fail_at == Some(s.generated) {
                events.push(SeqEvent::Failed { id: s.id });
                s.generated = u32::MAX; // marks it for removal below
                continue;
            }
            let index = s.generated;
            s.generated += 1;
            let last = s.generated >= s.output_tokens;
            events.push(SeqEvent::Token {
                id: s.id,
                index,
                last,
            });
        }
        self.running
            .retain(|s| s.generated != u32::MAX && s.generated < s.output_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(seqs: usize, tokens: u32, chunked: bool) -> BatchLimits {
        BatchLimits {
            max_num_seqs: seqs,
            max_batched_tokens: tokens,
            chunked_prefill: chunked,
        }
    }

    /// Runs steps until idle; returns each step's (admitted, prefill, decode) and all events.
    fn run(s: &mut Scheduler, max_steps: usize) -> (Vec<StepPlan>, Vec<SeqEvent>) {
        let mut plans = Vec::new();
        let mut events = Vec::new();
        for _ in 0..max_steps {
            if s.is_idle() {
                break;
            }
            plans.push(s.plan_step().clone());
            s.complete_step(&mut events);
        }
        (plans, events)
    }

    #[test]
    fn a_sequence_with_its_kv_cache_decodes_in_its_admission_step() {
        for chunked in [false, true] {
            let mut s = Scheduler::new(limits(4, 64, chunked));
            let mut seq = Sequence::new(7, 1000, 3, None);
            seq.prefilled = seq.prompt_tokens;
            s.enqueue(seq);
            let (plans, events) = run(&mut s, 10);
            // Three decode steps and no prefill, though the prompt exceeds the token budget.
            assert_eq!(plans.len(), 3, "chunked {chunked}: {plans:?}");
            assert_eq!(plans[0].admitted, vec![7]);
            assert!(
                plans
                    .iter()
                    .all(|p| p.prefill.is_empty() && p.decode == vec![7])
            );
            assert_eq!(plans[0].shape.decode_context_tokens, 1000);
            assert_eq!(
                events[0],
                SeqEvent::Token {
                    id: 7,
                    index: 0,
                    last: false
                }
            );
        }
    }

    #[test]
    fn batch_size_and_token_limits_are_respected() {
        let mut s = Scheduler::new(limits(3, 100, false));
        for id in 0..10 {
            s.enqueue(Sequence::new(id, 40, 5, None));
        }
        let (plans, _) = run(&mut s, 1000);
        let mut running_max = 0;
        let mut in_batch = std::collections::HashSet::new();
        for p in &plans {
            assert!(
                p.shape.prefill_tokens <= 100,
                "token budget exceeded: {p:?}"
            );
            for id in &p.admitted {
                in_batch.insert(*id);
            }
            running_max = running_max.max(p.decode.len());
            assert!(p.decode.len() <= 3);
            // 40-token prompts: at most 2 fit in a 100-token prefill step
            assert!(p.admitted.len() <= 2);
        }
        assert_eq!(in_batch.len(), 10);
        assert_eq!(running_max, 3);
    }

    #[test]
    fn admission_is_fifo() {
        let mut s = Scheduler::new(limits(2, 1000, false));
        for id in 0..6 {
            s.enqueue(Sequence::new(id, 10, 3 + id as u32, None));
        }
        let (plans, _) = run(&mut s, 1000);
        let order: Vec<u64> = plans.iter().flat_map(|p| p.admitted.clone()).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_big_prompt_blocks_the_ones_behind_it() {
        // Budget 100: 60 admitted, then 60 does not fit this step, and 10 must not overtake it.
        let mut s = Scheduler::new(limits(8, 100, false));
        s.enqueue(Sequence::new(0, 60, 2, None));
        s.enqueue(Sequence::new(1, 60, 2, None));
        s.enqueue(Sequence::new(2, 10, 2, None));
        let p = s.plan_step().clone();
        assert_eq!(p.admitted, vec![0]);
        let mut ev = Vec::new();
        s.complete_step(&mut ev);
        let p = s.plan_step().clone();
        assert_eq!(p.admitted, vec![1, 2]);
        assert_eq!(p.shape.prefill_tokens, 70);
    }

    #[test]
    fn without_chunking_prefill_steps_stall_decodes() {
        let mut s = Scheduler::new(limits(4, 1000, false));
        s.enqueue(Sequence::new(0, 10, 10, None));
        let mut ev = Vec::new();
        s.plan_step();
        s.complete_step(&mut ev); // prefill of 0 → its first token
        s.plan_step();
        s.complete_step(&mut ev); // decode of 0
        s.enqueue(Sequence::new(1, 500, 3, None));
        let p = s.plan_step().clone();
        assert_eq!(p.admitted, vec![1]);
        assert!(p.decode.is_empty(), "0 must stall during 1's prefill");
        assert_eq!(p.shape.prefill_tokens, 500);
        ev.clear();
        s.complete_step(&mut ev);
        assert_eq!(
            ev,
            vec![SeqEvent::Token {
                id: 1,
                index: 0,
                last: false
            }]
        );
    }

    #[test]
    fn chunked_prefill_interleaves_chunks_with_decodes() {
        let mut s = Scheduler::new(limits(4, 64, true));
        s.enqueue(Sequence::new(0, 10, 20, None));
        let mut ev = Vec::new();
        s.plan_step();
        s.complete_step(&mut ev); // 0 prefilled whole, first token
        s.enqueue(Sequence::new(1, 150, 2, None));
        // 150-token prompt in a 64-token budget, with 0 decoding: chunks 63, 63, 24.
        let mut chunks = Vec::new();
        for _ in 0..3 {
            let p = s.plan_step().clone();
            assert_eq!(p.decode, vec![0], "0 keeps decoding every step");
            assert!(p.tokens() <= 64);
            chunks.push(p.prefill[0]);
            ev.clear();
            s.complete_step(&mut ev);
        }
        assert_eq!(chunks, vec![(1, 63), (1, 63), (1, 24)]);
        // 1's first token comes only with its last chunk.
        assert!(ev.contains(&SeqEvent::Token {
            id: 1,
            index: 0,
            last: false
        }));
        let p = s.plan_step().clone();
        assert_eq!(p.decode, vec![0, 1]);
    }

    #[test]
    fn chunked_admission_fills_the_remaining_budget() {
        let mut s = Scheduler::new(limits(8, 32, true));
        s.enqueue(Sequence::new(0, 20, 5, None));
        s.enqueue(Sequence::new(1, 20, 5, None));
        let p = s.plan_step().clone();
        assert_eq!(p.admitted, vec![0, 1]);
        assert_eq!(p.prefill, vec![(0, 20), (1, 12)]);
    }

    #[test]
    fn cancellation_frees_the_slot() {
        let mut s = Scheduler::new(limits(1, 1000, false));
        s.enqueue(Sequence::new(0, 10, 100, None));
        s.enqueue(Sequence::new(1, 10, 2, None));
        let mut ev = Vec::new();
        s.plan_step();
        s.complete_step(&mut ev);
        assert_eq!(s.plan_step().decode, vec![0]); // 1 waits: one slot
        s.complete_step(&mut ev);
        assert_eq!(s.cancel(0), Some(true));
        assert_eq!(s.plan_step().admitted, vec![1]);
        s.complete_step(&mut ev);
        assert_eq!(s.cancel(7), None);
    }

    #[test]
    fn cancelling_a_waiting_request_removes_it() {
        let mut s = Scheduler::new(limits(1, 1000, false));
        s.enqueue(Sequence::new(0, 10, 3, None));
        s.enqueue(Sequence::new(1, 10, 3, None));
        assert_eq!(s.cancel(1), Some(false));
        let (plans, _) = run(&mut s, 100);
        assert!(plans.iter().all(|p| !p.admitted.contains(&1)));
    }

    #[test]
    fn tokens_finish_and_failures() {
        let mut s = Scheduler::new(limits(4, 1000, false));
        s.enqueue(Sequence::new(0, 5, 3, None));
        s.enqueue(Sequence::new(1, 5, 3, Some(1)));
        s.enqueue(Sequence::new(2, 5, 3, Some(0)));
        let (plans, ev) = run(&mut s, 100);
        assert_eq!(plans.len(), 3); // 1 prefill step + 2 decode steps
        let of = |id| {
            ev.iter().filter(move |e| matches!(e, SeqEvent::Token { id: i, .. } | SeqEvent::Failed { id: i } if *i == id)).copied().collect::<Vec<_>>()
        };
        assert_eq!(
            of(0),
            vec![
                SeqEvent::Token {
                    id: 0,
                    index: 0,
                    last: false
                },
                SeqEvent::Token {
                    id: 0,
                    index: 1,
                    last: false
                },
                SeqEvent::Token {
                    id: 0,
                    index: 2,
                    last: true
                },
            ]
        );
        assert_eq!(
            of(1),
            vec![
                SeqEvent::Token {
                    id: 1,
                    index: 0,
                    last: false
                },
                SeqEvent::Failed { id: 1 },
            ]
        );
        assert_eq!(of(2), vec![SeqEvent::Failed { id: 2 }]);
        assert!(s.is_idle());
    }

    #[test]
    fn decode_context_counts_prompt_and_generated_tokens() {
        let mut s = Scheduler::new(limits(4, 1000, false));
        s.enqueue(Sequence::new(0, 100, 10, None));
        s.enqueue(Sequence::new(1, 50, 10, None));
        let mut ev = Vec::new();
        s.plan_step();
        s.complete_step(&mut ev); // both generated 1
        let p = s.plan_step();
        assert_eq!(p.shape.decode_seqs, 2);
        assert_eq!(p.shape.decode_context_tokens, 101 + 51);
    }

    #[test]
    fn plans_are_deterministic() {
        let build = || {
            let mut s = Scheduler::new(limits(3, 64, true));
            for id in 0..12u64 {
                s.enqueue(Sequence::new(
                    id,
                    7 + (id as u32 * 13) % 50,
                    1 + (id as u32 * 7) % 9,
                    None,
                ));
            }
            run(&mut s, 10_000)
        };
        assert_eq!(build(), build());
    }
}
