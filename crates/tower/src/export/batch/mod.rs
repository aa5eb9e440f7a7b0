//! infertrace's own batch span processor and the sink that hands it whole requests.

mod processor;
mod settings;
mod sink;

pub(crate) use processor::BatchProcessor;
#[cfg(feature = "otlp")]
pub(crate) use processor::RequestExport;
pub use settings::{BatchSettings, MAX_QUEUE_ENTRIES};
pub(crate) use sink::BatchSink;
