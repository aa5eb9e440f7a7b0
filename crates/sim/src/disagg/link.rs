//! [`Link`]: one KV-transfer link shared by processor sharing.
//!
//! Every transfer in flight on a link gets an equal share of its bandwidth: with `n` transfers
//! each progresses at `bandwidth / n` bytes per second, and when one finishes or another starts
//! the shares change from that instant. A transfer alone takes `bytes / bandwidth`; two equal
//! transfers started together both take twice that. One tokio task per link keeps the bytes
//! left of each transfer and sleeps until the next one would finish.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::lateness::Lateness;
use crate::SimError;
use crate::clock;

/// A transfer waiting for its last byte.
struct Transfer {
    left: f64,
    done: oneshot::Sender<Instant>,
}

/// What the link's task is told: bytes, the instant the transfer started, where to say when
/// it ended.
type Request = (u64, Instant, oneshot::Sender<Instant>);

/// Handle to a link's task.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    /// `None` when transfers are instantaneous (time scale 0).
    tx: Option<mpsc::UnboundedSender<Request>>,
}

impl Link {
    /// Spawns the task of a link moving `bytes_per_sec` bytes per second of real time
    /// (`f64::INFINITY`: transfers take no time).
    pub(crate) fn start(bytes_per_sec: f64, lateness: Arc<Mutex<Lateness>>) -> Self {
        if !bytes_per_sec.is_finite() {
            return Self { tx: None };
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(bytes_per_sec, rx, lateness));
        Self { tx: Some(tx) }
    }

    /// Moves `bytes` over the link from `start` (now or a moment ago); returns the instant the
    /// link's task saw its last byte: where processor sharing puts it, or later when the task's
    /// timer fired late.
    pub(crate) async fn transfer(&self, bytes: u64, start: Instant) -> Result<Instant, SimError> {
        let Some(tx) = &self.tx else {
            return Ok(start);
        };
        let (done, rx) = oneshot::channel();
        tx.send((bytes, start, done))
            .map_err(|_| SimError::Stopped)?;
        rx.await.map_err(|_| SimError::Stopped)
    }
}

/// Bytes left below which a transfer is complete (float rounding of the shares).
const DONE_BYTES: f64 = 1.0;

/// The transfers in flight and the instant their `left` is as of.
struct Flight {
    rate: f64,
    active: Vec<Transfer>,
    at: Instant,
}

impl Flight {
    /// When the transfer closest to its end would finish, shares unchanged (rounded up to the
    /// nanosecond, so it is done by then).
    fn next_done(&self) -> Option<Instant> {
        let left = self.active.iter().map(|t| t.left).min_by(f64::total_cmp)?;
        let nanos = left.max(0.0) * self.active.len() as f64 * 1e9 / self.rate;
        // A thousandth of a nanosecond of float error is not a nanosecond more (the bytes it
        // leaves are far below `DONE_BYTES`).
        let nanos = (nanos - 1e-3).ceil().clamp(0.0, u64::MAX as f64) as u64;
        Some(self.at + Duration::from_nanos(nanos))
    }

    /// Runs the link up to `t`, finishing transfers at their own instants on the way.
    fn advance_to(&mut self, t: Instant) {
        loop {
            let Some(done_at) = self.next_done().filter(|d| *d <= t) else {
                self.progress(t);
                return;
            };
            self.progress(done_at);
            // Seen now, which is later than `done_at` when the timer fired late.
            let seen = done_at.max(clock::now());
            let mut i = 0;
            while i < self.active.len() {
                if self.active[i].left <= DONE_BYTES {
                    let finished = self.active.swap_remove(i);
                    // The receiver may have gone (its request was dropped): nothing to tell.
                    let _ = finished.done.send(seen);
                } else {
                    i += 1;
                }
            }
        }
    }

    fn progress(&mut self, t: Instant) {
        if t <= self.at {
            return;
        }
        if !self.active.is_empty() {
            let share = self.rate * (t - self.at).as_secs_f64() / self.active.len() as f64;
            for a in &mut self.active {
                a.left -= share;
            }
        }
        self.at = t;
    }
}

async fn run(rate: f64, mut rx: mpsc::UnboundedReceiver<Request>, lateness: Arc<Mutex<Lateness>>) {
    let mut flight = Flight {
        rate,
        active: Vec::new(),
        at: clock::now(),
    };
    let mut open = true;
    loop {
        let deadline = flight.next_done();
        // The next event: a new transfer, or the end of the one closest to it.
        let arrival = match (deadline, open) {
            (None, false) => return,
            (None, true) => Some(rx.recv().await),
            (Some(d), true) => tokio::select! {
                biased;
                m = rx.recv() => Some(m),
                () = tokio::time::sleep_until(d.into()) => None,
            },
            (Some(d), false) => {
                tokio::time::sleep_until(d.into()).await;
                None
            }
        };
        match arrival {
            Some(Some((bytes, start, done))) => {
                flight.advance_to(start.max(flight.at));
                flight.active.push(Transfer {
                    left: bytes as f64,
                    done,
                });
            }
            Some(None) => open = false,
            None => {
                let now = clock::now();
                if let Some(d) = deadline {
                    lateness
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(now.saturating_duration_since(d));
                }
                flight.advance_to(now);
            }
        }
    }
}
