//! [`SimConfig`] and the [`CostModel`] that turns one engine step into a duration.
//!
//! # Default cost parameters
//!
//! The defaults model **Llama‑3.1‑8B in BF16 on one NVIDIA H100 80GB SXM** served by a
//! vLLM-like engine. They are round numbers derived from the hardware, not a fit to one benchmark:
//!
//! | parameter | default | where it comes from |
//! |---|---|---|
//! | [`prefill_base`](CostModel::prefill_base) | 5 ms | fixed cost of a forward pass: kernel launches, scheduler, sampling, detokenisation |
//! | [`prefill_per_token`](CostModel::prefill_per_token) | 60 µs | ≈ 2 × 8 B = 16 GFLOP per token; H100 BF16 dense peak ≈ 989 TFLOPS gives 16 µs at 100 % MFU; 60 µs ≈ 27 % MFU including attention, i.e. ≈ 16.7 k prompt tokens/s, in line with published vLLM prefill throughput for 8B models |
//! | [`decode_base`](CostModel::decode_base) | 7 ms | a decode step reads all weights once: 16 GB at 3.35 TB/s ≈ 4.8 ms, plus ≈ 2 ms of launch/sampling overhead (vLLM reports 6–8 ms inter-token latency at batch 1) |
//! | [`decode_per_seq`](CostModel::decode_per_seq) | 100 µs | per-sequence compute, sampling and output processing; a batch of 64 then decodes ≈ 4.8 k tokens/s |
//! | [`context_per_token`](CostModel::context_per_token) | 40 ns | the KV cache of one token is 2 (K,V) × 32 layers × 8 KV heads × 128 dims × 2 bytes = 128 KiB; reading it at 3.35 TB/s takes ≈ 39 ns per token of context per step |
//!
//! A step that only prefills costs `prefill_base + prefill_per_token × prefill tokens`; a step with
//! any decode costs `decode_base + decode_per_seq × decoding sequences + context_per_token ×
//! their context tokens + prefill_per_token × prefill tokens` (a chunked-prefill step). Attention's
//! quadratic term in long prompts is folded into `prefill_per_token`.
//!
//! The batch limits default to [`max_num_seqs`](SimConfig::max_num_seqs) = 64 and
//! [`max_batched_tokens`](SimConfig::max_batched_tokens) = 8192 with chunked prefill **off** (vLLM
//! V0's default behaviour), so a long prompt arriving while others decode stalls their streams for
//! a whole prefill step: exactly the inter-token stall infertrace should be able to diagnose.

use std::time::Duration;

use crate::SimError;

/// Per-step cost parameters of the simulated model and GPU. See the [module docs](self) for the
/// defaults and where they come from.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Fixed cost of a step that only prefills.
    pub prefill_base: Duration,
    /// Cost of each prompt token prefilled in a step.
    pub prefill_per_token: Duration,
    /// Fixed cost of a step that decodes at least one sequence.
    pub decode_base: Duration,
    /// Cost of each sequence decoded in a step.
    pub decode_per_seq: Duration,
    /// Cost of each token of context (prompt + generated so far) of the decoding sequences.
    pub context_per_token: Duration,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            prefill_base: Duration::from_millis(5),
            prefill_per_token: Duration::from_micros(60),
            decode_base: Duration::from_millis(7),
            decode_per_seq: Duration::from_micros(100),
            context_per_token: Duration::from_nanos(40),
        }
    }
}

/// The work of one engine step, as the cost model sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    /// Prompt tokens prefilled in this step (all chunks together).
    pub prefill_tokens: u64,
    /// Sequences producing one decode token in this step.
    pub decode_seqs: u64,
    /// Context tokens (prompt + generated) of the decoding sequences.
    pub decode_context_tokens: u64,
}

impl StepShape {
    /// True when the step does nothing.
    pub fn is_empty(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_seqs == 0
    }
}

impl CostModel {
    /// The unscaled duration of a step of this shape (zero for an empty step).
    ///
    /// ```
    /// use infertrace_sim::{CostModel, StepShape};
    /// use std::time::Duration;
    /// let cost = CostModel::default();
    /// let prefill = StepShape { prefill_tokens: 1000, ..Default::default() };
    /// assert_eq!(cost.step_duration(&prefill), Duration::from_millis(5 + 60));
    /// ```
    pub fn step_duration(&self, shape: &StepShape) -> Duration {
        if shape.is_empty() {
            return Duration::ZERO;
        }
        let base = if shape.decode_seqs > 0 {
            self.decode_base
        } else {
            self.prefill_base
        };
        base + mul(self.prefill_per_token, shape.prefill_tokens)
            + mul(self.decode_per_seq, shape.decode_seqs)
            + mul(self.context_per_token, shape.decode_context_tokens)
    }
}

/// `d × n`, saturating instead of overflowing.
fn mul(d: Duration, n: u64) -> Duration {
    let nanos = d.as_nanos().saturating_mul(u128::from(n));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Output length distribution used when a request does not say how many tokens it will produce:
/// log-normal with the given median and shape σ, capped by the request's `max_output_tokens`.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputLength {
    /// Median output length in tokens.
    pub median: f64,
    /// σ of the underlying normal (0 = always the median).
    pub sigma: f64,
}

impl Default for OutputLength {
    /// Median 128 tokens, σ 0.8 (a chat-like spread: p10 ≈ 46, p90 ≈ 355).
    fn default() -> Self {
        Self {
            median: 128.0,
            sigma: 0.8,
        }
    }
}

/// Configuration of a [`Simulator`](crate::Simulator).
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Model name the engine reports (`gen_ai.response.model`) unless a request names one.
    pub model: String,
    /// Maximum sequences in the running batch (vLLM `max_num_seqs`). Default 64.
    pub max_num_seqs: usize,
    /// Maximum tokens (prefill + decode) processed in one step (vLLM `max_num_batched_tokens`).
    /// Default 8192. Without chunked prefill a prompt longer than this is refused.
    pub max_batched_tokens: u32,
    /// Chunked prefill: prefill chunks share steps with decodes (vLLM `enable_chunked_prefill`).
    /// Default off.
    pub chunked_prefill: bool,
    /// Requests allowed to wait for a batch slot before `submit` fails with
    /// [`SimError::QueueFull`]. Default 4096.
    pub max_waiting: usize,
    /// Per-step costs.
    pub cost: CostModel,
    /// Multiplies every step duration: 1.0 is real time, 0.1 runs ten times faster. Must be
    /// finite and ≥ 0. Default 1.0.
    pub time_scale: f64,
    /// Seed of every random choice (output lengths, injected errors, token text). Default 42.
    pub seed: u64,
    /// Probability that a request fails with an engine error somewhere between its prefill and
    /// its last token. Default 0.
    pub error_rate: f64,
    /// Output length of requests that do not fix it.
    pub output_length: OutputLength,
    /// How many finished requests' ground truth to keep (oldest evicted first). Default 100 000.
    pub truth_capacity: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            model: "llama-3.1-8b".to_owned(),
            max_num_seqs: 64,
            max_batched_tokens: 8192,
            chunked_prefill: false,
            max_waiting: 4096,
            cost: CostModel::default(),
            time_scale: 1.0,
            seed: 42,
            error_rate: 0.0,
            output_length: OutputLength::default(),
            truth_capacity: 100_000,
        }
    }
}

impl SimConfig {
    /// Checks the limits are usable; `Simulator::start` calls this.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |what: &str| Err(SimError::InvalidConfig(what.to_owned()));
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs must be at least 1");
        }
        if (self.max_batched_tokens as usize) < self.max_num_seqs {
            return bad("max_batched_tokens must be at least max_num_seqs (one decode token each)");
        }
        if !self.time_scale.is_finite() || self.time_scale < 0.0 {
            return bad("time_scale must be finite and >= 0");
        }
        if !(0.0..=1.0).contains(&self.error_rate) {
            return bad("error_rate must be within 0..=1");
        }
        if !self.output_length.median.is_finite()
            || self.output_length.median < 1.0
            || !self.output_length.sigma.is_finite()
            || self.output_length.sigma < 0.0
        {
            return bad("output_length needs a finite median >= 1 and sigma >= 0");
        }
        Ok(())
    }

    /// `d` scaled by [`time_scale`](Self::time_scale).
    pub fn scaled(&self, d: Duration) -> Duration {
        Duration::try_from_secs_f64(d.as_secs_f64() * self.time_scale).unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_step_cost_grows_with_batch_and_context() {
        let c = CostModel::default();
        let one = StepShape {
            decode_seqs: 1,
            decode_context_tokens: 1000,
            ..Default::default()
        };
        let many = StepShape {
            decode_seqs: 64,
            decode_context_tokens: 64_000,
            ..Default::default()
        };
        // 7 ms + 0.1 ms + 1000 × 40 ns = 7.14 ms
        assert_eq!(c.step_duration(&one), Duration::from_micros(7_140));
        // 7 ms + 6.4 ms + 64 000 × 40 ns = 15.96 ms
        assert_eq!(c.step_duration(&many), Duration::from_micros(15_960));
    }

    #[test]
    fn mixed_step_uses_decode_base_plus_prefill_tokens() {
        let c = CostModel::default();
        let mixed = StepShape {
            prefill_tokens: 100,
            decode_seqs: 2,
            decode_context_tokens: 0,
        };
        assert_eq!(
            c.step_duration(&mixed),
            Duration::from_micros(7_000 + 6_000 + 200)
        );
        assert_eq!(c.step_duration(&StepShape::default()), Duration::ZERO);
    }

    #[test]
    fn validation_refuses_unusable_limits() {
        assert!(SimConfig::default().validate().is_ok());
        let mut c = SimConfig {
            max_num_seqs: 0,
            ..Default::default()
        };
        assert!(c.validate().is_err());
        c.max_num_seqs = 16;
        c.max_batched_tokens = 8;
        assert!(c.validate().is_err());
        c.max_batched_tokens = 16;
        c.time_scale = f64::NAN;
        assert!(c.validate().is_err());
        c.time_scale = 0.5;
        c.error_rate = 1.5;
        assert!(c.validate().is_err());
        c.error_rate = 1.0;
        assert!(c.validate().is_ok());
        assert_eq!(
            c.scaled(Duration::from_millis(10)),
            Duration::from_millis(5)
        );
    }
}
