//! [`TruthRecord`] and [`TruthLog`]: what really happened to each request, for tests to compare
//! spans against.
//!
//! The engine stamps every instant from its own state and clock: `submitted` when `submit` is
//! called, `scheduled` at the start of the step that admits the request, tokens at the end of the
//! step that produced them. It never reads an observer's clock, so what an observer measures
//! (e.g. the tower layer through a `RequestObserver` adapter) can be checked against it. The log
//! also keeps how late each step's timer woke: the scheduler noise of the machine during the run,
//! a baseline for tolerances.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Why a request left the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruthOutcome {
    /// Finished normally.
    Finished(FinishReason),
    /// Failed with an injected engine error.
    Error,
    /// Its stream was dropped before it finished; the engine freed its slot.
    Cancelled,
}

/// Why a request finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced its natural output length (an end-of-sequence token).
    Stop,
    /// It reached `max_output_tokens`.
    Length,
}

impl FinishReason {
    /// The OpenAI / GenAI name: `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The true phase instants of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct TruthRecord {
    /// Request id (as returned by `TokenStream::id`).
    pub id: u64,
    /// When `submit` was called: the request's arrival at the engine, start of its queue phase.
    pub submitted: Instant,
    /// Admitted to the running batch (start of the step with its first prefill chunk).
    pub scheduled: Option<Instant>,
    /// First output token produced (end of the step finishing its prefill).
    pub first_token: Option<Instant>,
    /// Latest output token produced.
    pub last_token: Option<Instant>,
    /// Left the engine (last token, failure or cancellation noticed).
    pub finished: Option<Instant>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens produced.
    pub output_tokens: u32,
    /// Steps in which it was prefilled (1 without chunked prefill).
    pub prefill_steps: u32,
    /// Longest gap between two consecutive output tokens.
    pub max_inter_token_gap: Duration,
    /// `None` while in flight.
    pub outcome: Option<TruthOutcome>,
}

impl TruthRecord {
    /// A record for a request just submitted.
    pub fn new(id: u64, submitted: Instant, prompt_tokens: u32) -> Self {
        Self {
            id,
            submitted,
            scheduled: None,
            first_token: None,
            last_token: None,
            finished: None,
            prompt_tokens,
            output_tokens: 0,
            prefill_steps: 0,
            max_inter_token_gap: Duration::ZERO,
            outcome: None,
        }
    }

    /// Submitted → scheduled.
    pub fn queue(&self) -> Option<Duration> {
        Some(self.scheduled?.saturating_duration_since(self.submitted))
    }

    /// Scheduled → first token.
    pub fn prefill(&self) -> Option<Duration> {
        Some(self.first_token?.saturating_duration_since(self.scheduled?))
    }

    /// First token → last token.
    pub fn decode(&self) -> Option<Duration> {
        Some(
            self.last_token?
                .saturating_duration_since(self.first_token?),
        )
    }

    /// Submitted → first token.
    pub fn ttft(&self) -> Option<Duration> {
        Some(self.first_token?.saturating_duration_since(self.submitted))
    }

    /// Submitted → left the engine.
    pub fn e2e(&self) -> Option<Duration> {
        Some(self.finished?.saturating_duration_since(self.submitted))
    }

    /// Decode time / (output tokens − 1), the GenAI definition; `None` below two tokens.
    pub fn tpot(&self) -> Option<Duration> {
        let n = self.output_tokens.checked_sub(1).filter(|n| *n > 0)?;
        Some(self.decode()? / n)
    }

    pub(crate) fn token_at(&mut self, at: Instant) {
        if self.first_token.is_none() {
            self.first_token = Some(at);
        }
        if let Some(prev) = self.last_token {
            self.max_inter_token_gap = self
                .max_inter_token_gap
                .max(at.saturating_duration_since(prev));
        }
        self.last_token = Some(at);
        self.output_tokens += 1;
    }
}

/// Bounded map of truth records by request id (the oldest are evicted first), and the lateness of
/// the latest steps' timers.
#[derive(Debug)]
pub struct TruthLog {
    capacity: usize,
    records: HashMap<u64, TruthRecord>,
    order: VecDeque<u64>,
    step_lateness: VecDeque<Duration>,
}

impl TruthLog {
    /// A log keeping at most `capacity` records (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            records: HashMap::new(),
            order: VecDeque::new(),
            step_lateness: VecDeque::new(),
        }
    }

    /// Adds a record, evicting the oldest if full.
    pub fn insert(&mut self, record: TruthRecord) {
        while self.order.len() >= self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.records.remove(&old);
            }
        }
        self.order.push_back(record.id);
        self.records.insert(record.id, record);
    }

    /// The record of `id`, if kept.
    pub fn get(&self, id: u64) -> Option<&TruthRecord> {
        self.records.get(&id)
    }

    /// Mutable access to the record of `id`.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut TruthRecord> {
        self.records.get_mut(&id)
    }

    /// All kept records, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &TruthRecord> {
        self.order.iter().filter_map(|id| self.records.get(id))
    }

    /// Notes that a step ended `late` against the engine's nominal clock (the latest `capacity`
    /// kept).
    pub fn step_late(&mut self, late: Duration) {
        if self.step_lateness.len() >= self.capacity {
            self.step_lateness.pop_front();
        }
        self.step_lateness.push_back(late);
    }

    /// How late the latest steps woke after their deadlines, oldest first: how long a ready task
    /// waited for the runtime and the OS during the run (tokio's 1 ms timer tick included).
    pub fn step_lateness(&self) -> impl Iterator<Item = Duration> + '_ {
        self.step_lateness.iter().copied()
    }

    /// Number of kept records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_and_tpot() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = TruthRecord::new(1, t0, 10);
        r.scheduled = Some(t0 + ms(5));
        r.token_at(t0 + ms(20));
        r.token_at(t0 + ms(30));
        r.token_at(t0 + ms(50));
        assert_eq!(r.queue(), Some(ms(5)));
        assert_eq!(r.prefill(), Some(ms(15)));
        assert_eq!(r.decode(), Some(ms(30)));
        assert_eq!(r.ttft(), Some(ms(20)));
        assert_eq!(r.e2e(), None);
        assert_eq!(r.tpot(), Some(ms(15)));
        assert_eq!(r.max_inter_token_gap, ms(20));
        assert_eq!(r.output_tokens, 3);
    }

    #[test]
    fn log_evicts_oldest() {
        let t0 = Instant::now();
        let mut log = TruthLog::new(2);
        for id in 0..3 {
            log.insert(TruthRecord::new(id, t0, 1));
        }
        assert!(log.get(0).is_none());
        assert_eq!(log.records().map(|r| r.id).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(log.len(), 2);
    }
}
