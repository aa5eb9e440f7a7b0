//! The infertrace collector: OTLP in, traces assembled, LLM serving KPIs out.
//!
//! Receivers decode OTLP (gRPC and HTTP) into [`IngestBatch`]es; the pipeline assembles traces,
//! runs the pure analysis of `infertrace-analysis`, and serves the results (Prometheus `/metrics`,
//! the JSON API) and forwards traces downstream.

pub mod ingest;
pub mod internal_events;

pub use ingest::{Ingest, IngestBatch, IngestError};
pub use internal_events::InternalEvents;
