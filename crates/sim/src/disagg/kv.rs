//! [`KvPool`]: a decode worker's KV-cache memory, in tokens, handed out first come first served.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::SimError;
use crate::clock;

#[derive(Debug, Default)]
struct State {
    used: u64,
    waiting: VecDeque<(u64, oneshot::Sender<Instant>)>,
}

/// KV memory of one decode worker. A reservation that does not fit waits, in arrival order
/// (no overtaking), until releases make room; it is granted at the release's instant.
#[derive(Debug)]
pub(crate) struct KvPool {
    capacity: u64,
    state: Mutex<State>,
}

impl KvPool {
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            capacity,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tokens reserved now.
    pub(crate) fn used(&self) -> u64 {
        self.state().used
    }

    /// Reserves `tokens`; returns the instant they were granted (now, or a release's instant).
    pub(crate) async fn reserve(&self, tokens: u64) -> Result<Instant, SimError> {
        if tokens > self.capacity {
            return Err(SimError::InvalidRequest(format!(
                "{tokens} KV tokens exceed the decode worker's capacity of {}",
                self.capacity
            )));
        }
        let rx = {
            let mut s = self.state();
            if s.waiting.is_empty() && s.used + tokens <= self.capacity {
                s.used += tokens;
                return Ok(clock::now());
            }
            let (tx, rx) = oneshot::channel();
            s.waiting.push_back((tokens, tx));
            rx
        };
        rx.await.map_err(|_| SimError::Stopped)
    }

    /// Gives `tokens` back and grants the waiting reservations that now fit, in order.
    pub(crate) fn release(&self, tokens: u64) {
        let now = clock::now();
        let mut s = self.state();
        s.used = s.used.saturating_sub(tokens);
        while let Some((need, _)) = s.waiting.front() {
            if s.used + need > self.capacity {
                break;
            }
            let Some((need, tx)) = s.waiting.pop_front() else {
                break;
            };
            // A waiter that went away takes nothing.
            if tx.send(now).is_ok() {
                s.used += need;
            }
        }
    }
}
