//! [`RequestRecorder`]: the cheap handle an engine uses to mark a request's phases.
//!
//! The layer puts one in every request's extensions. The engine (or handler) clones it into
//! whatever task or thread serves the request and calls [`scheduled`](RequestRecorder::scheduled),
//! [`first_token`](RequestRecorder::first_token), [`tokens`](RequestRecorder::tokens) and
//! [`finish`](RequestRecorder::finish). Each call stores one timestamp or counter in an atomic; the
//! spans are built once, when the request ends.
//!
//! Marks are *first wins* and must be in order (arrival ≤ scheduled ≤ first token ≤ finish): a
//! repeated or out-of-order call is ignored, never a panic or a negative duration.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::counters::RequestEnergy;

use crate::interning::{self, Kind};
use crate::tick_clock::{self, TickSpan};

const UNSET: u64 = u64::MAX;

/// A cheap, cloneable, `Send + Sync` handle marking one request's phases.
///
/// ```
/// use infertrace_tower::RequestRecorder;
/// let rec = RequestRecorder::new();
/// rec.scheduled();
/// rec.tokens(1); // the first token also marks `first_token`
/// rec.tokens(9);
/// rec.usage(120, 10);
/// rec.finish("stop");
/// let snap = rec.snapshot();
/// assert_eq!(snap.output_tokens, Some(10));
/// assert!(snap.scheduled.unwrap() <= snap.first_token.unwrap());
/// ```
#[derive(Clone, Debug)]
pub struct RequestRecorder {
    inner: Arc<RecorderState>,
}

#[derive(Debug)]
struct RecorderState {
    arrival: Instant,
    /// An (instant, ticks) pair taken together: marks are stored as [`tick_clock`] readings
    /// (cheaper than `Instant::now()`) and converted against this pair and a later one.
    anchor: Instant,
    anchor_ticks: u64,
    scheduled: AtomicU64,
    first_token: AtomicU64,
    last_token: AtomicU64,
    finished: AtomicU64,
    tokens_seen: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    cache_read_input_tokens: AtomicU64,
    max_tokens: AtomicU64,
    stream: AtomicU8,
    model: OnceLock<Arc<str>>,
    request_model: OnceLock<Arc<str>>,
    response_id: OnceLock<Arc<str>>,
    finish_reason: OnceLock<Arc<str>>,
    error: OnceLock<Arc<str>>,
    /// The request's GPU energy attribution handle (only under a layer with GPU telemetry).
    energy: Option<RequestEnergy>,
}

const STREAM_UNSET: u8 = 0;
const STREAM_NO: u8 = 1;
const STREAM_YES: u8 = 2;

/// What a recorder holds at one moment. Offsets are from arrival.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecorderSnapshot {
    /// Arrival → scheduled (admitted to a batch).
    pub scheduled: Option<Duration>,
    /// Arrival → first token.
    pub first_token: Option<Duration>,
    /// Arrival → most recent token.
    pub last_token: Option<Duration>,
    /// Arrival → finish.
    pub finished: Option<Duration>,
    /// Tokens reported through [`RequestRecorder::tokens`].
    pub tokens_seen: u64,
    /// Input tokens from [`RequestRecorder::usage`].
    pub input_tokens: Option<u64>,
    /// Output tokens from [`RequestRecorder::usage`], else the tokens seen (if any).
    pub output_tokens: Option<u64>,
    /// Prompt tokens served from the prefix cache, from
    /// [`RequestRecorder::cache_read_input_tokens`].
    pub cache_read_input_tokens: Option<u64>,
    /// Model from [`RequestRecorder::model`] (the model that answered).
    pub model: Option<String>,
    /// Model from [`RequestRecorder::request_model`] (the model the client asked for).
    pub request_model: Option<String>,
    /// Maximum output tokens from [`RequestRecorder::max_tokens`].
    pub max_tokens: Option<u64>,
    /// Whether the client asked for a stream, from [`RequestRecorder::stream`].
    pub stream: Option<bool>,
    /// Response id from [`RequestRecorder::response_id`].
    pub response_id: Option<String>,
    /// Finish reason from [`RequestRecorder::finish`].
    pub finish_reason: Option<String>,
    /// Error kind from [`RequestRecorder::error`].
    pub error: Option<String>,
}

/// Borrowed string marks of a recorder (crate-internal; avoids cloning at the end of a request).
pub(crate) struct RecorderStrings<'a> {
    pub(crate) model: Option<&'a Arc<str>>,
    pub(crate) request_model: Option<&'a Arc<str>>,
    pub(crate) response_id: Option<&'a Arc<str>>,
    pub(crate) finish_reason: Option<&'a Arc<str>>,
    pub(crate) error: Option<&'a Arc<str>>,
}

impl Default for RequestRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestRecorder {
    /// A recorder whose arrival is now.
    pub fn new() -> Self {
        Self::with_arrival(Instant::now())
    }

    /// A recorder with a given arrival instant (the layer uses the instant the request came in).
    pub fn with_arrival(arrival: Instant) -> Self {
        let ticks = tick_clock::ticks();
        Self::with_anchor(arrival, Instant::now(), ticks)
    }

    /// Crate-internal: a recorder whose clock anchor is `(anchor, anchor_ticks)`, read together.
    pub(crate) fn with_anchor(arrival: Instant, anchor: Instant, anchor_ticks: u64) -> Self {
        Self::with_anchor_and_energy(arrival, anchor, anchor_ticks, None)
    }

    /// Crate-internal: like [`with_anchor`](Self::with_anchor), also reporting the tokens the
    /// engine processes to `energy` (GPU energy attribution).
    pub(crate) fn with_anchor_and_energy(
        arrival: Instant,
        anchor: Instant,
        anchor_ticks: u64,
        energy: Option<RequestEnergy>,
    ) -> Self {
        Self {
            inner: Arc::new(RecorderState {
                arrival,
                anchor,
                anchor_ticks,
                scheduled: AtomicU64::new(UNSET),
                first_token: AtomicU64::new(UNSET),
                last_token: AtomicU64::new(UNSET),
                finished: AtomicU64::new(UNSET),
                tokens_seen: AtomicU64::new(0),
                input_tokens: AtomicU64::new(UNSET),
                output_tokens: AtomicU64::new(UNSET),
                cache_read_input_tokens: AtomicU64::new(UNSET),
                max_tokens: AtomicU64::new(UNSET),
                stream: AtomicU8::new(STREAM_UNSET),
                model: OnceLock::new(),
                request_model: OnceLock::new(),
                response_id: OnceLock::new(),
                finish_reason: OnceLock::new(),
                error: OnceLock::new(),
                energy,
            }),
        }
    }

    /// The arrival instant.
    pub fn arrival(&self) -> Instant {
        self.inner.arrival
    }

    /// Now, as a tick-clock reading (never the UNSET sentinel).
    fn now_ticks(&self) -> u64 {
        tick_clock::ticks().min(UNSET - 1)
    }

    /// Sets `slot` to `at` if unset and not earlier than `floor` (the previous phase's mark).
    fn mark(slot: &AtomicU64, at: u64, floor: &AtomicU64) -> bool {
        let prev = floor.load(Ordering::Acquire);
        if prev != UNSET && at < prev {
            return false;
        }
        slot.compare_exchange(UNSET, at, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The engine admitted the request to a batch (end of the queue phase). First call wins.
    pub fn scheduled(&self) {
        let now = self.now_ticks();
        if self.inner.first_token.load(Ordering::Acquire) != UNSET {
            return; // out of order: the first token already came
        }
        let zero = AtomicU64::new(0);
        Self::mark(&self.inner.scheduled, now, &zero);
    }

    /// The first output token was produced (end of prefill). First call wins.
    pub fn first_token(&self) {
        let now = self.now_ticks();
        if self.inner.finished.load(Ordering::Acquire) != UNSET {
            return;
        }
        self.mark_first_token(now);
    }

    fn mark_first_token(&self, now: u64) {
        if Self::mark(&self.inner.first_token, now, &self.inner.scheduled) {
            // The first token is also the latest one until `tokens` says otherwise.
            self.inner.last_token.fetch_min(now, Ordering::AcqRel);
        }
    }

    /// `n` more output tokens were produced now. The first call also marks the first token.
    /// One clock read and a few uncontended atomics: cheap enough to call per token.
    pub fn tokens(&self, n: u64) {
        if n == 0 || self.inner.finished.load(Ordering::Acquire) != UNSET {
            return;
        }
        let now = self.now_ticks();
        if self.inner.first_token.load(Ordering::Acquire) == UNSET {
            self.mark_first_token(now);
        }
        self.inner.tokens_seen.fetch_add(n, Ordering::AcqRel);
        if let Some(energy) = &self.inner.energy {
            energy.tokens(n);
        }
        // Latest token wins, also when several threads report at once (UNSET is u64::MAX).
        let mut prev = self.inner.last_token.load(Ordering::Acquire);
        while prev == UNSET || now > prev {
            match self.inner.last_token.compare_exchange_weak(
                prev,
                now,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => prev = actual,
            }
        }
    }

    /// `n` prompt tokens were prefilled now (one call per prefill chunk, or one for the whole
    /// prompt). Used only to attribute GPU energy — the prefill's work gets its token share of
    /// the sampling intervals it ran in; it marks nothing and changes no span attribute. A no-op
    /// (one branch) unless the layer has GPU telemetry (see
    /// `InferenceTraceLayer::gpu_telemetry`, feature `gpu`).
    ///
    /// Prompt tokens reported later through [`usage`](Self::usage) are *not* attributed: engines
    /// usually report usage at the end, and crediting the whole prompt to the request's last
    /// sampling interval would move prefill energy into decode.
    #[inline]
    pub fn prefilled(&self, n: u64) {
        if let Some(energy) = &self.inner.energy {
            energy.tokens(n);
        }
    }

    /// The request finished with `reason` (e.g. `stop`, `length`). First call wins.
    pub fn finish(&self, reason: &str) {
        let now = self.now_ticks();
        let floor = if self.inner.last_token.load(Ordering::Acquire) != UNSET {
            &self.inner.last_token
        } else {
            &self.inner.scheduled
        };
        if Self::mark(&self.inner.finished, now, floor) {
            let _ = self
                .inner
                .finish_reason
                .set(interning::shared_str(Kind::FinishReason, reason));
        }
    }

    /// Token usage as the engine counts it. The latest call wins: an engine may report the
    /// prompt's length when it schedules the request (`usage(prompt, 0)`) and the whole usage
    /// at the end, or its running usage as it streams. An output of 0 while [`tokens`]
    /// reported some counts those instead.
    ///
    /// [`tokens`]: Self::tokens
    pub fn usage(&self, input: u64, output: u64) {
        self.inner
            .output_tokens
            .store(output.min(UNSET - 1), Ordering::Release);
        self.inner
            .input_tokens
            .store(input.min(UNSET - 1), Ordering::Release);
    }

    /// `n` of the prompt's tokens were served from the engine's prefix cache instead of being
    /// prefilled (`gen_ai.usage.cache_read.input_tokens` on the request span): the cache hit
    /// that explains a short prefill. First call wins; report it when the engine knows it
    /// (after scheduling, or with the usage at the end).
    pub fn cache_read_input_tokens(&self, n: u64) {
        let _ = self.inner.cache_read_input_tokens.compare_exchange(
            UNSET,
            n.min(UNSET - 1),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The model that served the request (`gen_ai.response.model`). First call wins.
    ///
    /// If no request model is known (no `x-infertrace-model` header, no
    /// [`request_model`](Self::request_model) call, no layer default), this also names the span.
    pub fn model(&self, name: &str) {
        let _ = self
            .inner
            .model
            .set(interning::shared_str(Kind::Model, name));
    }

    /// The model the client asked for (`gen_ai.request.model`, part of the span name), when the
    /// handler learns it from the request body. First call wins; it overrides the layer's default
    /// model and the `x-infertrace-model` header.
    pub fn request_model(&self, name: &str) {
        let _ = self
            .inner
            .request_model
            .set(interning::shared_str(Kind::Model, name));
    }

    /// The maximum number of output tokens the client asked for (`gen_ai.request.max_tokens`).
    /// First call wins.
    pub fn max_tokens(&self, n: u64) {
        let _ = self.inner.max_tokens.compare_exchange(
            UNSET,
            n.min(UNSET - 1),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Whether the client asked for a streamed response (`gen_ai.request.stream`). First call
    /// wins. In derived mode this also tells the layer to split prefill from decode at the first
    /// body chunk even when the response is not `text/event-stream`.
    pub fn stream(&self, streamed: bool) {
        let v = if streamed { STREAM_YES } else { STREAM_NO };
        let _ = self.inner.stream.compare_exchange(
            STREAM_UNSET,
            v,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The id the server gave the response (`gen_ai.response.id`). First call wins.
    pub fn response_id(&self, id: &str) {
        let _ = self.inner.response_id.set(Arc::from(id));
    }

    /// The request failed with `kind` (becomes `error.type`). First call wins.
    pub fn error(&self, kind: &str) {
        let _ = self
            .inner
            .error
            .set(interning::shared_str(Kind::Error, kind));
    }

    /// Crate-internal view of the string marks, without cloning them.
    pub(crate) fn strings(&self) -> RecorderStrings<'_> {
        RecorderStrings {
            model: self.inner.model.get(),
            request_model: self.inner.request_model.get(),
            response_id: self.inner.response_id.get(),
            finish_reason: self.inner.finish_reason.get(),
            error: self.inner.error.get(),
        }
    }

    /// Crate-internal: the `stream` flag, if set.
    pub(crate) fn stream_flag(&self) -> Option<bool> {
        match self.inner.stream.load(Ordering::Acquire) {
            STREAM_YES => Some(true),
            STREAM_NO => Some(false),
            _ => None,
        }
    }

    /// Crate-internal: the numeric marks, without cloning any string, converting tick readings
    /// with the anchor pair and `(end, end_ticks)` (read together, after the marks).
    pub(crate) fn marks_at(&self, end: Instant, end_ticks: u64) -> RecorderMarks {
        let get = |a: &AtomicU64| match a.load(Ordering::Acquire) {
            UNSET => None,
            v => Some(v),
        };
        let s = &self.inner;
        let ticks = TickSpan::new(s.anchor, s.anchor_ticks, end, end_ticks);
        let base = s.anchor.saturating_duration_since(s.arrival);
        let dur = |a: &AtomicU64| get(a).map(|t| base + ticks.offset(t));
        let tokens_seen = self.inner.tokens_seen.load(Ordering::Acquire);
        let input_tokens = get(&self.inner.input_tokens);
        let output_tokens = get(&self.inner.output_tokens)
            .filter(|n| input_tokens.is_some() && (*n > 0 || tokens_seen == 0))
            .or((tokens_seen > 0).then_some(tokens_seen));
        RecorderMarks {
            scheduled: dur(&self.inner.scheduled),
            first_token: dur(&self.inner.first_token),
            last_token: dur(&self.inner.last_token),
            finished: dur(&self.inner.finished),
            tokens_seen,
            input_tokens,
            output_tokens,
            cache_read_input_tokens: get(&self.inner.cache_read_input_tokens),
            max_tokens: get(&self.inner.max_tokens),
        }
    }

    /// A consistent-enough copy of what has been marked so far.
    pub fn snapshot(&self) -> RecorderSnapshot {
        let now = Instant::now();
        let m = self.marks_at(now, tick_clock::ticks());
        let s = self.strings();
        let owned = |v: Option<&Arc<str>>| v.map(|s| s.to_string());
        RecorderSnapshot {
            scheduled: m.scheduled,
            first_token: m.first_token,
            last_token: m.last_token,
            finished: m.finished,
            tokens_seen: m.tokens_seen,
            input_tokens: m.input_tokens,
            output_tokens: m.output_tokens,
            cache_read_input_tokens: m.cache_read_input_tokens,
            model: owned(s.model),
            request_model: owned(s.request_model),
            max_tokens: m.max_tokens,
            stream: self.stream_flag(),
            response_id: owned(s.response_id),
            finish_reason: owned(s.finish_reason),
            error: owned(s.error),
        }
    }
}

/// Numeric marks of a recorder (crate-internal).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RecorderMarks {
    pub(crate) scheduled: Option<Duration>,
    pub(crate) first_token: Option<Duration>,
    pub(crate) last_token: Option<Duration>,
    pub(crate) finished: Option<Duration>,
    pub(crate) tokens_seen: u64,
    pub(crate) input_tokens: Option<u64>,
    pub(crate) output_tokens: Option<u64>,
    pub(crate) cache_read_input_tokens: Option<u64>,
    pub(crate) max_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_in_order() {
        let r = RequestRecorder::new();
        r.scheduled();
        r.tokens(1);
        r.tokens(4);
        r.usage(10, 5);
        r.model("m");
        r.finish("stop");
        let s = r.snapshot();
        assert!(s.scheduled.unwrap() <= s.first_token.unwrap());
        assert!(s.first_token.unwrap() <= s.last_token.unwrap());
        assert!(s.last_token.unwrap() <= s.finished.unwrap());
        assert_eq!(s.tokens_seen, 5);
        assert_eq!((s.input_tokens, s.output_tokens), (Some(10), Some(5)));
        assert_eq!(s.model.as_deref(), Some("m"));
        assert_eq!(s.finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn repeated_and_out_of_order_calls_are_ignored() {
        let r = RequestRecorder::new();
        r.first_token();
        let first = r.snapshot().first_token;
        std::thread::sleep(Duration::from_millis(2));
        r.scheduled(); // after first token: ignored
        r.first_token(); // repeated: ignored
        r.finish("stop");
        r.finish("length");
        r.tokens(3); // after finish: ignored
        let s = r.snapshot();
        assert_eq!(s.scheduled, None);
        // The same mark (each snapshot converts ticks with its own end anchor: ns of jitter,
        // where a moved mark would be ≥ 2 ms later).
        let drift = s.first_token.unwrap().abs_diff(first.unwrap());
        assert!(
            drift < Duration::from_micros(100),
            "first token moved by {drift:?}"
        );
        assert!(s.finished.unwrap() >= Duration::from_millis(2));
        assert_eq!(s.finish_reason.as_deref(), Some("stop"));
        assert_eq!(s.tokens_seen, 0);
    }

    #[test]
    fn marks_match_the_monotonic_clock() {
        let arrival = Instant::now();
        let r = RequestRecorder::with_arrival(arrival);
        std::thread::sleep(Duration::from_millis(10));
        r.scheduled();
        let scheduled_truth = arrival.elapsed();
        std::thread::sleep(Duration::from_millis(10));
        r.tokens(1);
        let first_truth = arrival.elapsed();
        let s = r.snapshot();
        let close =
            |mark: Duration, truth: Duration| truth.abs_diff(mark) < Duration::from_micros(500);
        assert!(
            close(s.scheduled.unwrap(), scheduled_truth),
            "{s:?} vs {scheduled_truth:?}"
        );
        assert!(
            close(s.first_token.unwrap(), first_truth),
            "{s:?} vs {first_truth:?}"
        );
        assert!(s.scheduled.unwrap() >= Duration::from_millis(10));
    }

    #[test]
    fn output_tokens_fall_back_to_tokens_seen() {
        let r = RequestRecorder::new();
        r.tokens(7);
        assert_eq!(r.snapshot().output_tokens, Some(7));
        assert_eq!(r.snapshot().input_tokens, None);
    }

    /// An engine that knows the prompt's length when it schedules the request and reports the
    /// whole usage at the end (a review lost the output tokens and TPOT: the first call won).
    #[test]
    fn the_latest_usage_wins_and_an_output_of_0_gives_way_to_tokens_seen() {
        let r = RequestRecorder::new();
        r.scheduled();
        r.usage(17, 0);
        assert_eq!(
            (r.snapshot().input_tokens, r.snapshot().output_tokens),
            (Some(17), Some(0))
        );
        r.tokens(10);
        assert_eq!(
            (r.snapshot().input_tokens, r.snapshot().output_tokens),
            (Some(17), Some(10))
        );
        r.usage(17, 12);
        assert_eq!(
            (r.snapshot().input_tokens, r.snapshot().output_tokens),
            (Some(17), Some(12))
        );
    }

    #[test]
    fn repeated_strings_share_one_copy() {
        let (a, b) = (RequestRecorder::new(), RequestRecorder::new());
        for r in [&a, &b] {
            r.scheduled();
            r.tokens(1);
            r.model("m");
            r.finish("stop");
        }
        let (sa, sb) = (a.strings(), b.strings());
        for (x, y) in [(sa.finish_reason, sb.finish_reason), (sa.model, sb.model)] {
            let (Some(x), Some(y)) = (x, y) else {
                panic!("string not recorded");
            };
            assert!(Arc::ptr_eq(x, y), "{x} allocated twice");
        }
        assert_eq!(a.snapshot().finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn usable_across_threads() {
        let r = RequestRecorder::new();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        r.tokens(1);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(r.snapshot().tokens_seen, 400);
    }
}
