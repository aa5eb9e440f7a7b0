//! [`BatchSettings`]: the batching settings of infertrace's batch processor, from code or from
//! the SDK's `OTEL_BSP_*` environment variables.

use std::time::Duration;

/// The most queue entries a processor holds: the queue is allocated up front, about 900 bytes
/// an entry (about 59 MB at this size).
pub const MAX_QUEUE_ENTRIES: usize = 65_536;

/// Batching settings of infertrace's batch processor ([`SharedSpanProcessor::batch_with`]):
/// the SDK's `BatchConfig`, whose fields are not public.
///
/// [`SharedSpanProcessor::batch_with`]: crate::SharedSpanProcessor::batch_with
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSettings {
    /// Queue entries held before new ones are dropped (default 2,048; at most
    /// [`MAX_QUEUE_ENTRIES`], as the queue is allocated up front). An entry is one span, or one
    /// whole request from the layer (its request span and up to three phase spans).
    pub max_queue_size: usize,
    /// Longest time a queued span waits for its batch to be exported (default 5 s; at least 1 ms).
    pub scheduled_delay: Duration,
    /// Queue entries per export call (default 512; at most `max_queue_size`): spans, or whole
    /// requests of the layer, whose spans are never split between calls (512 of them are
    /// about 2,048 spans, some 700 KB of OTLP protobuf; more with GPU attributes).
    pub max_export_batch_size: usize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            max_queue_size: 2048,
            scheduled_delay: Duration::from_millis(5000),
            max_export_batch_size: 512,
        }
    }
}

impl BatchSettings {
    /// The defaults, overridden by `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_SCHEDULE_DELAY`
    /// (milliseconds) and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` from the process environment.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the variables `env` returns; unparsable or zero
    /// values are ignored, and the batch size is capped at the queue size (as the SDK does).
    pub(crate) fn from_vars(env: impl Fn(&str) -> Option<String>) -> Self {
        let read = |name: &str| {
            env(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|v| *v > 0)
        };
        let mut s = Self::default();
        if let Some(v) = read("OTEL_BSP_MAX_QUEUE_SIZE") {
            s.max_queue_size = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = read("OTEL_BSP_SCHEDULE_DELAY") {
            s.scheduled_delay = Duration::from_millis(v);
        }
        if let Some(v) = read("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            s.max_export_batch_size = usize::try_from(v).unwrap_or(usize::MAX);
        }
        s.normalized()
    }

    /// Both sizes at least 1, the queue at most [`MAX_QUEUE_ENTRIES`], the batch size at most
    /// the queue size, the delay at least 1 ms.
    pub(crate) fn normalized(mut self) -> Self {
        self.max_queue_size = self.max_queue_size.clamp(1, MAX_QUEUE_ENTRIES);
        // A zero delay would make the export thread spin.
        self.scheduled_delay = self.scheduled_delay.max(Duration::from_millis(1));
        self.max_export_batch_size = self.max_export_batch_size.clamp(1, self.max_queue_size);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_follow_the_sdk_variables() {
        let none = BatchSettings::from_vars(|_| None);
        assert_eq!(none, BatchSettings::default());
        let set = BatchSettings::from_vars(|name| {
            match name {
                "OTEL_BSP_MAX_QUEUE_SIZE" => Some("100"),
                "OTEL_BSP_SCHEDULE_DELAY" => Some(" 250 "),
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("512"),
                _ => None,
            }
            .map(String::from)
        });
        assert_eq!(set.max_queue_size, 100);
        assert_eq!(set.scheduled_delay, Duration::from_millis(250));
        assert_eq!(set.max_export_batch_size, 100, "capped at the queue size");
        let junk = BatchSettings::from_vars(|_| Some("zero".into()));
        assert_eq!(junk, BatchSettings::default());
        let zero = BatchSettings::from_vars(|_| Some("0".into()));
        assert_eq!(zero, BatchSettings::default());
        let spin = BatchSettings {
            scheduled_delay: Duration::ZERO,
            ..BatchSettings::default()
        };
        assert_eq!(spin.normalized().scheduled_delay, Duration::from_millis(1));
        let huge = BatchSettings::from_vars(|_| Some("100000000".into()));
        assert_eq!(huge.max_queue_size, MAX_QUEUE_ENTRIES);
        assert_eq!(huge.max_export_batch_size, MAX_QUEUE_ENTRIES);
    }
}
