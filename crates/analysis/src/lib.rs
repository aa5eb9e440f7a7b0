//! Pure analysis of inference traces: the trace model, engine dialects, request records, KPI
//! windows, critical path, diagnosis and alerts. No I/O, no async runtime: every function here
//! takes data and returns data, so it is tested against ground truth and reused by the collector,
//! the offline `analyze` command and the benchmarks alike.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod alert;
mod codec;
pub mod critical_path;
mod dense_buckets;
pub mod diagnosis;
pub mod dialect;
pub mod heap_size;
pub mod kpi;
pub mod record;
mod rounding;
pub mod text;
pub mod trace;
