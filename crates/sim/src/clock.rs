//! The simulator's clock: tokio's, as a [`std::time::Instant`].
//!
//! Outside a paused tokio runtime this is `Instant::now()`. Under `tokio::time::pause` (tests
//! with `start_paused`) it is the runtime's virtual clock, which jumps to the next timer when
//! every task waits: the engines, the KV links and the router then follow the cost model to the
//! nanosecond, whatever the machine's load.

use std::time::Instant;

/// Now, on the simulator's clock.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
