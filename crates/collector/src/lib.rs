//! The infertrace collector: OTLP in, traces assembled, LLM serving KPIs out.
//!
//! Receivers decode OTLP (gRPC and HTTP) into [`IngestBatch`]es; the pipeline assembles traces,
//! runs the pure analysis of `infertrace-analysis`, and serves the results (Prometheus `/metrics`,
//! the JSON API) and forwards traces downstream.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod api;
pub(crate) mod assembler;
pub mod auth;
pub mod client_tls;
pub mod config;
pub(crate) mod dashboard;
pub(crate) mod duration;
pub(crate) mod forward;
pub(crate) mod held;
pub mod ingest;
pub mod internal_events;
pub mod limiter;
pub mod listener;
pub mod otlp_decode;
pub mod pipeline;
pub mod prom_export;
pub(crate) mod prom_single_writer;
pub mod receiver;
pub mod resident;
pub mod server;
pub mod server_tls;
pub mod store;

pub use ingest::{Ingest, IngestBatch, IngestError};
pub use internal_events::InternalEvents;
