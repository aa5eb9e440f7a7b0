//! A deterministic continuous-batching LLM engine simulator with ground-truth phase times.
//!
//! [`Simulator::start`] spawns an engine on the current tokio runtime. Requests submitted through
//! the [`SimHandle`] wait in a FIFO queue, are admitted to a running batch limited by
//! `max_num_seqs` and `max_batched_tokens`, are prefilled (optionally in chunks that share steps
//! with decodes) and then decode one token per step. Every step lasts what the documented
//! [`CostModel`] says (scaled by [`SimConfig::time_scale`]), in real time.
//!
//! The engine tells each request's [`RequestObserver`] what happens to it (admitted, prefilled,
//! tokens, finished / failed / cancelled) as an engine's callbacks would, streams tokens through
//! a [`TokenStream`], and keeps a [`TruthRecord`] of every request's true phase instants, stamped
//! from its own state and clock, never an observer's, so tests can check what an instrumented
//! server measured against what happened. [`EngineStats`] gives
//! the busy fraction (a simulated GPU utilisation), batch size and queue length.
//! [`SimulatedGpu`] turns those into the counters of a **simulated** H100 (utilisation, power,
//! energy, memory) for GPU telemetry on machines without a GPU.
//!
//! Steps sleep on tokio timers, which have a 1 ms resolution and wake a little late on a busy
//! runtime: a step scaled below a few milliseconds lasts longer than the cost model says. The
//! truth records what actually happened, never the nominal cost, so comparisons stay exact. How
//! late each step ended against the engine's nominal clock is kept too
//! ([`SimHandle::step_lateness`]: a late timer, or the engine's task run late between steps):
//! the run's scheduler noise, a baseline for tolerances derived from the machine the test runs
//! on.
//!
//! [`DisaggSim`] composes engines into a disaggregated deployment (router, prefill and decode
//! pools, KV transfer over shared links, decode KV memory) with ground truth per sub-phase; see
//! [`disagg`].
//!
//! Everything random (output lengths, injected errors, token text) derives from
//! [`SimConfig::seed`] and the request's submission order; the scheduling policy itself
//! ([`Scheduler`]) is pure and deterministic.

#![warn(missing_docs)]

mod clock;
pub mod config;
pub mod disagg;
mod engine;
mod error;
mod observer;
pub mod scheduler;
mod simulated_gpu;
mod stats;
mod text;
mod truth;

pub use config::{CostModel, OutputLength, SimConfig, StepShape};
pub use disagg::{DisaggConfig, DisaggSim, PdTruth, Routed};
pub use engine::{SimEvent, SimHandle, SimRequest, Simulator, Token, TokenStream};
pub use error::SimError;
pub use observer::{RequestObserver, Usage};
pub use scheduler::Scheduler;
pub use simulated_gpu::{
    IDLE_WATTS, KV_BYTES_PER_TOKEN, MAX_WATTS, MEMORY_TOTAL_BYTES, SIMULATED_GPU_NAME,
    SIMULATED_GPU_UUID, SM_CLOCK_MHZ, SimulatedGpu, TEMPERATURE_CELSIUS, WEIGHTS_BYTES,
};
pub use stats::EngineStats;
pub use truth::{FinishReason, TruthLog, TruthOutcome, TruthRecord};
