//! The servers and the load generator behind `infertrace demo` and the example binaries:
//! inference servers on the [`infertrace_sim`] engine simulator, each behind
//! [`InferenceTraceLayer`](infertrace_tower::InferenceTraceLayer), and a load generator that
//! measures what a client sees.
//!
//! - [`openai`]: OpenAI-compatible HTTP API (SSE streaming) as an axum [`Router`](axum::Router);
//! - [`grpc`]: a `Generate` gRPC service (unary and server-streaming) for tonic, with its client;
//! - [`pd`]: disaggregated serving (router, prefill and decode workers) over HTTP on the
//!   [`DisaggSim`](infertrace_sim::DisaggSim), each role its own traced service;
//! - [`hyper_service`]: the same HTTP API on a bare hyper service, no framework;
//! - [`loadgen`]: open-loop Poisson load over HTTP/SSE or gRPC with client-side TTFT, TPOT and
//!   end-to-end percentiles;
//! - [`EngineMarks`]: the adapter from the simulator's
//!   [`RequestObserver`](infertrace_sim::RequestObserver) to the layer's
//!   [`RequestRecorder`](infertrace_tower::RequestRecorder), used by every server here;
//! - [`server`]: what the server binaries share (command-line options, telemetry), and
//!   [`shutdown_signal`].
//!
//! The runnable binaries are in `examples/` (package `infertrace-examples`):
//! `cargo run --release -p infertrace-examples --bin axum-server -- --help`.

#![warn(missing_docs)]

mod engine_marks;
pub mod grpc;
pub mod hyper_service;
pub mod loadgen;
pub mod openai;
pub mod pd;
pub mod server;

pub use engine_marks::EngineMarks;
pub use server::{ShutdownSignals, shutdown_signal};
