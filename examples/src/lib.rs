//! Example inference servers on the [`infertrace_sim`] engine simulator, each behind
//! [`InferenceTraceLayer`](infertrace_tower::InferenceTraceLayer), and a load generator.
//!
//! - [`openai`]: OpenAI-compatible HTTP API (SSE streaming) as an axum [`Router`](axum::Router);
//! - [`grpc`]: a `Generate` gRPC service (unary and server-streaming) for tonic, with its client;
//! - [`hyper_service`]: the same HTTP API on a bare hyper service, no framework;
//! - [`loadgen`]: open-loop Poisson load over HTTP/SSE or gRPC with client-side TTFT, TPOT and
//!   end-to-end percentiles;
//! - [`server`]: what the server binaries share (command-line options, telemetry, shutdown).
//!
//! The binaries in `src/bin` are thin wrappers: `cargo run --release -p infertrace-examples --bin
//! axum-server -- --help`.

#![warn(missing_docs)]

pub mod grpc;
pub mod hyper_service;
pub mod loadgen;
pub mod openai;
pub mod server;
