//! [`SimError`]: why a submission or a stream failed.

use std::fmt;

/// Why the simulator refused a request, or why its stream ended in error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimError {
    /// The waiting queue holds `max_waiting` requests already.
    QueueFull,
    /// The request cannot be served (e.g. a prompt longer than the step budget without chunked
    /// prefill); the text says why.
    InvalidRequest(String),
    /// The configuration is unusable; the text says which limit.
    InvalidConfig(String),
    /// An injected engine failure (see `SimConfig::error_rate`) after `tokens` output tokens.
    Engine {
        /// Output tokens produced before the failure.
        tokens: u32,
    },
    /// The engine task is no longer running.
    Stopped,
}

impl SimError {
    /// A short stable name for `error.type` and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            SimError::QueueFull => "queue_full",
            SimError::InvalidRequest(_) => "invalid_request",
            SimError::InvalidConfig(_) => "invalid_config",
            SimError::Engine { .. } => "engine_error",
            SimError::Stopped => "engine_stopped",
        }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::QueueFull => f.write_str("engine waiting queue is full; retry later"),
            SimError::InvalidRequest(why) => write!(f, "invalid request: {why}"),
            SimError::InvalidConfig(why) => write!(f, "invalid simulator config: {why}"),
            SimError::Engine { tokens } => {
                write!(f, "engine error after {tokens} output tokens (injected)")
            }
            SimError::Stopped => f.write_str("the simulated engine has stopped"),
        }
    }
}

impl std::error::Error for SimError {}
