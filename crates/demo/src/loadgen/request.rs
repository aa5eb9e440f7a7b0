//! One request of a load run: what to send ([`RequestSpec`]) and what the client saw of it
//! ([`RequestResult`], ending in an [`Outcome`]).

use std::time::{Duration, Instant};

/// One request to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    /// Model to ask for.
    pub model: String,
    /// Prompt length in tokens (the prompt is `"tok "` repeated, so the servers' 4-chars-per-token
    /// estimate gives exactly this).
    pub prompt_tokens: u32,
    /// Output token limit.
    pub max_tokens: u32,
    /// Ask for a streamed answer.
    pub stream: bool,
    /// Ask for exactly `max_tokens` tokens (vLLM's `ignore_eos`).
    pub ignore_eos: bool,
    /// Hang up after receiving this many tokens (streamed requests only).
    pub cancel_after_tokens: Option<u32>,
}

/// What the client saw of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestResult {
    /// Arrival order in the run.
    pub seq: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// HTTP status, or gRPC status code.
    pub status: Option<u16>,
    /// When it was sent.
    pub sent_at: Instant,
    /// Sent → first token received (streamed requests).
    pub ttft: Option<Duration>,
    /// Sent → last token received (streamed requests).
    pub last_token: Option<Duration>,
    /// Sent → answer complete (or failure seen).
    pub e2e: Duration,
    /// Output tokens received (streamed) or reported in `usage` (whole answers).
    pub output_tokens: u32,
    /// The response id the server gave.
    pub response_id: Option<String>,
    /// Error text, if any.
    pub error: Option<String>,
}

impl RequestResult {
    pub(super) fn new(seq: u64, sent_at: Instant) -> Self {
        Self {
            seq,
            outcome: Outcome::Error,
            status: None,
            sent_at,
            ttft: None,
            last_token: None,
            e2e: Duration::ZERO,
            output_tokens: 0,
            response_id: None,
            error: None,
        }
    }

    /// (last token − first token) / (tokens − 1), as the client saw it.
    pub fn tpot(&self) -> Option<Duration> {
        let n = self.output_tokens.checked_sub(1).filter(|n| *n > 0)?;
        Some(self.last_token?.checked_sub(self.ttft?)? / n)
    }

    pub(super) fn token(&mut self) {
        let at = self.sent_at.elapsed();
        self.ttft.get_or_insert(at);
        self.last_token = Some(at);
        self.output_tokens += 1;
    }

    pub(super) fn fail(mut self, outcome: Outcome, error: String) -> Self {
        self.outcome = outcome;
        self.error = Some(error);
        self.e2e = self.sent_at.elapsed();
        self
    }
}

/// How a request ended, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// Complete answer.
    Ok,
    /// Server error (5xx, engine error event, non-OK gRPC status other than the two below).
    Error,
    /// Refused for load: HTTP 429 / 503, gRPC RESOURCE_EXHAUSTED / UNAVAILABLE.
    Rejected,
    /// No complete answer within the client timeout (the client then disconnects).
    Timeout,
    /// The client hung up on purpose mid-stream (`RequestSpec::cancel_after_tokens`).
    Cancelled,
    /// Not sent: the client's concurrency cap was reached at its arrival time.
    Skipped,
}

impl Outcome {
    /// All outcomes, in table order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Rejected,
        Outcome::Timeout,
        Outcome::Cancelled,
        Outcome::Skipped,
    ];

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Rejected => "rejected",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Skipped => "skipped",
        }
    }
}
