//! [`EngineMarks`]: the adapter from the simulator's [`RequestObserver`] to the layer's
//! [`RequestRecorder`], so the simulated engine marks a request's phases as an instrumented
//! engine would.
//!
//! The recorder reads its own clock at each call, never the simulator's: the phases the layer
//! reports are its own measurement, and the simulator's [`TruthRecord`](infertrace_sim::TruthRecord)
//! stays an independent check of them.

use infertrace_sim::{FinishReason, RequestObserver, SimError, Usage};
use infertrace_tower::RequestRecorder;

/// Marks a [`RequestRecorder`] from the simulated engine's events: admitted → `scheduled`, each
/// token → `tokens(1)` (the first also marks the first token), prompt chunks → `prefilled`
/// (GPU energy attribution), the end → `usage` and `finish` or `error`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use infertrace_demo::EngineMarks;
/// use infertrace_sim::{SimConfig, SimRequest, Simulator};
/// use infertrace_tower::RequestRecorder;
///
/// let sim = Simulator::start(SimConfig { time_scale: 0.0, ..Default::default() }).unwrap();
/// let recorder = RequestRecorder::new();
/// let mut stream = sim
///     .submit(SimRequest::new(100, 8).with_output_tokens(3), EngineMarks(recorder.clone()))
///     .unwrap();
/// while stream.recv().await.is_some() {}
/// let marks = recorder.snapshot();
/// assert_eq!((marks.output_tokens, marks.finish_reason.as_deref()), (Some(3), Some("stop")));
/// assert!(marks.scheduled <= marks.first_token);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct EngineMarks(pub RequestRecorder);

impl RequestObserver for EngineMarks {
    fn admitted(&self) {
        self.0.scheduled();
    }

    fn prefilled(&self, tokens: u32) {
        self.0.prefilled(u64::from(tokens));
    }

    fn token(&self, _index: u32) {
        self.0.tokens(1);
    }

    fn finished(&self, reason: FinishReason, usage: Usage) {
        self.0.usage(
            u64::from(usage.prompt_tokens),
            u64::from(usage.output_tokens),
        );
        self.0.finish(reason.as_str());
    }

    fn failed(&self, error: &SimError, usage: Usage) {
        self.0.error(error.kind());
        self.0.usage(
            u64::from(usage.prompt_tokens),
            u64::from(usage.output_tokens),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use infertrace_sim::{SimConfig, SimRequest, Simulator, TruthOutcome};

    use super::*;

    async fn drain(sim: &infertrace_sim::SimHandle, req: SimRequest) -> (u64, RequestRecorder) {
        let recorder = RequestRecorder::new();
        let mut s = sim.submit(req, EngineMarks(recorder.clone())).unwrap();
        while s.recv().await.is_some() {}
        (s.id(), recorder)
    }

    /// Every engine boundary the recorder marks lies after the truth's instant (the engine tells
    /// the observer after stamping its truth) and before the next boundary in truth: the
    /// recorder's own clock agrees with the engine's without being given its instants.
    #[tokio::test]
    async fn marks_follow_the_truth_on_the_recorders_own_clock() {
        let sim = Simulator::start(SimConfig {
            time_scale: 0.2,
            ..Default::default()
        })
        .unwrap();
        let before = Instant::now();
        let (id, recorder) = drain(&sim, SimRequest::new(500, 16).with_output_tokens(6)).await;
        let t = sim.truth(id).unwrap();
        let m = recorder.snapshot();
        // Offsets from the recorder's arrival, which precedes `submitted` (created first).
        let arrival = recorder.arrival();
        assert!(arrival >= before && arrival <= t.submitted);
        let off = |i: Option<Instant>| i.unwrap().duration_since(arrival);
        let ordered = |truth: Duration, mark: Option<Duration>, next_truth: Duration| {
            let mark = mark.unwrap();
            assert!(
                truth <= mark && mark <= next_truth,
                "{truth:?} ≤ {mark:?} ≤ {next_truth:?}"
            );
        };
        ordered(off(t.scheduled), m.scheduled, off(t.first_token));
        ordered(off(t.first_token), m.first_token, off(t.last_token));
        assert!(m.last_token.unwrap() >= off(t.last_token));
        assert!(m.finished.unwrap() >= m.last_token.unwrap());
        assert_eq!((m.output_tokens, m.input_tokens), (Some(6), Some(500)));
        assert_eq!(m.finish_reason.as_deref(), Some("stop"));
        assert_eq!(t.outcome, Some(TruthOutcome::Finished(FinishReason::Stop)));
    }

    #[tokio::test]
    async fn an_engine_error_marks_the_error_and_the_usage_so_far() {
        let sim = Simulator::start(SimConfig {
            error_rate: 1.0,
            time_scale: 0.0,
            ..Default::default()
        })
        .unwrap();
        let (id, recorder) = drain(&sim, SimRequest::new(20, 8).with_output_tokens(8)).await;
        let t = sim.truth(id).unwrap();
        let m = recorder.snapshot();
        assert_eq!(t.outcome, Some(TruthOutcome::Error));
        assert_eq!(m.error.as_deref(), Some("engine_error"));
        assert_eq!(m.output_tokens, Some(u64::from(t.output_tokens)));
        assert_eq!(m.input_tokens, Some(20));
    }
}
