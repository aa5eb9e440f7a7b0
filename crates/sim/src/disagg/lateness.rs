//! [`Lateness`]: how late the deployment's own timers fired.

use std::collections::VecDeque;
use std::time::Duration;

/// Bounded record of timer lateness (routing, handshake and link timers).
#[derive(Debug, Default)]
pub(crate) struct Lateness(VecDeque<Duration>);

impl Lateness {
    const KEEP: usize = 100_000;
    pub(crate) fn push(&mut self, d: Duration) {
        if self.0.len() >= Self::KEEP {
            self.0.pop_front();
        }
        self.0.push_back(d);
    }

    /// The kept lateness, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Duration> + '_ {
        self.0.iter().copied()
    }
}
