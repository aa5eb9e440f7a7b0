//! Tower middleware that traces LLM inference requests into queue, prefill and decode phases.

mod recorder;

pub use recorder::{RecorderSnapshot, RequestRecorder};
