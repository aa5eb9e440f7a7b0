//! The periodic loop both sampler threads run: tick, sleep until the next interval, stop
//! promptly when asked (the owner sets the flag and unparks the thread).

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Calls `tick(now)` every `interval` (at least 1 ms) until `stop` is set. A tick that runs
/// late skips the missed ticks instead of bursting to catch up.
pub(crate) fn run_every(stop: &AtomicBool, interval: Duration, mut tick: impl FnMut(Instant)) {
    let interval = interval.max(Duration::from_millis(1));
    let mut next = Instant::now();
    while !stop.load(Ordering::Acquire) {
        tick(Instant::now());
        next = next
            .checked_add(interval)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let now = Instant::now();
        if next < now {
            next = now;
        }
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            thread::park_timeout(next - now);
        }
    }
}
