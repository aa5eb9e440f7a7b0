//! [`RequestObserver`]: what the engine tells the outside about one request as it happens.
//!
//! The engine calls the observer at the moment each event happens (after writing its own
//! [`TruthRecord`](crate::TruthRecord), before streaming the token), as a real engine's callbacks
//! would. No method carries a timestamp: an observer that measures time reads its own clock, so
//! what it measures can be checked against the truth instead of copied from it.

use crate::{FinishReason, SimError};

/// Receives the events of one request. Every method defaults to doing nothing; `()` observes
/// nothing.
///
/// Calls come from the engine task, in order: [`admitted`](Self::admitted) once, then per step
/// [`prefilled`](Self::prefilled) (one call per prompt chunk) and [`token`](Self::token), and at
/// most one of [`finished`](Self::finished), [`failed`](Self::failed) or
/// [`cancelled`](Self::cancelled). A request refused by `submit` is never observed.
pub trait RequestObserver: Send + 'static {
    /// The request joined the running batch: its queue wait ends and its prefill starts.
    fn admitted(&self) {}

    /// `tokens` prompt tokens were processed in the step that just ended.
    fn prefilled(&self, tokens: u32) {
        let _ = tokens;
    }

    /// Output token `index` (from 0) was produced; token 0 ends the prefill.
    fn token(&self, index: u32) {
        let _ = index;
    }

    /// The request finished normally.
    fn finished(&self, reason: FinishReason, usage: Usage) {
        let _ = (reason, usage);
    }

    /// The request failed (an injected engine error) after `usage.output_tokens` tokens.
    fn failed(&self, error: &SimError, usage: Usage) {
        let _ = (error, usage);
    }

    /// The request's stream was dropped; the engine freed its slot.
    fn cancelled(&self) {}
}

/// Observes nothing.
impl RequestObserver for () {}

impl<T: RequestObserver + Sync> RequestObserver for std::sync::Arc<T> {
    fn admitted(&self) {
        (**self).admitted();
    }
    fn prefilled(&self, tokens: u32) {
        (**self).prefilled(tokens);
    }
    fn token(&self, index: u32) {
        (**self).token(index);
    }
    fn finished(&self, reason: FinishReason, usage: Usage) {
        (**self).finished(reason, usage);
    }
    fn failed(&self, error: &SimError, usage: Usage) {
        (**self).failed(error, usage);
    }
    fn cancelled(&self) {
        (**self).cancelled();
    }
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens produced.
    pub output_tokens: u32,
}
